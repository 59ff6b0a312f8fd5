// layers family: linear, a small-M GEMM (decode / verify rows) whose row result depends only
// on that row, with the layer's RMSNorm (+ residual add) fused in front and SwiGLU behind.
// Semantics: specdec_lib/reference/layers.py::linear.
//
//   x [M, K] f16/bf16 (+ residual [M, K] -> residual_out), norm_weight [K] (x's dtype or f32),
//   weight [N, K] (nn.Linear layout) -> out [M, N], or [M, N/2] = silu(gate) * up (silu_mul).
//
// Work split. A warp owns two output columns (silu_mul: gate column j and up column I + j, so
// the epilogue needs no exchange between warps); a CTA is 4 warps (8 columns), the grid
// covers the columns (x) and the 16-row chunks (y); neither changes any bits. K is walked in
// units of 8 elements (16 bytes): lane l owns units l, l + 32, l + 64, ... of every row and
// accumulates them in that order with fmaf (elements of a unit in order), then the 32 lane
// partials are added by the xor tree of warp_sum (done as a reduce-scatter: 31 shuffles for
// the 16 rows x 2 columns, same sums). So each output element is one fixed sequence of
// float32 operations set by K alone: not by M, the other rows, the chunk or CTA that
// computed it, or the pointers' alignment (vector and scalar loads fetch the same values;
// the zero tail past K exists iff K % 8).
//
// Rows come in chunks of kRows = 16 (gridDim.y strides over chunks); within a chunk, K in
// slabs of kSlabUnits (96 units = 768 elements, 3 per lane): the slab's h rows are staged in
// shared memory (24 KB, 16-byte aligned whatever x's alignment), each lane reading a row's
// unit with one 16-byte access. Its weight units sit in registers: slab 0's are loaded before
// the staging and slab s + 1's during slab s's FMAs, so the DRAM latency hides behind both;
// between slabs the running sums wait in shared memory (16 KB), not in registers across the
// staging. 44 KB of shared memory and <= 170 registers: 3 CTAs per SM, so SmolLM2's widest
// projection (gate_up, 384 CTAs) runs in one wave on 132 SMs. Every CTA reads the x rows and
// computes their norm; only the CTAs with blockIdx.x == 0 store residual_out (the launcher
// makes sure residual_out overlaps none of the inputs, which other CTAs are still reading).
//
// The norm prologue reproduces common/rms_norm.cuh's arithmetic exactly: the sum of squares
// is split over p.norm_threads "virtual threads" (rms_norm's blockDim for this K): virtual
// thread t adds units t, t + norm_threads, ... in order; virtual warp v's 32 partials are
// added by warp_sum in one real warp, and the virtual warps' totals by a second warp_sum, as
// cta_sum does. Hence h is bit for bit what ops.rms_norm would have stored. A row that fits
// one slab (K <= 768) is staged as s, its norm summed from shared memory, then normalised in
// place; a longer row's norm is a first pass over global memory, and staging normalises.
//
// The build uses --use_fast_math: products that must not fuse are spelled out (fmaf where
// the order is part of the contract), divisions __fdiv_rn, exp accurate_expf (math.cuh).
// CUDA cores only (no mma): the kernel is weight-bandwidth / latency bound at M <= 16, and
// bf16 is storage only (common/dtype.cuh), so the compute_75 path is the same code.
// The K-unit helpers, the s fetch, the per-unit norm emit and the few-row prologue live in
// layers/linear_common.cuh (shared with linear_mma.cu, the tensor-core few-row form).
#include "common/pdl.cuh"
#include "layers/linear_common.cuh"

using namespace specdec;

namespace {

constexpr int kWarps = 4;                   // blockDim = 128: the launcher's only choice
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;                   // rows per chunk
constexpr int kCols = 2;                    // output columns per warp
constexpr int kLaneUnits = 3;               // units per lane per slab
constexpr int kSlabUnits = 32 * kLaneUnits; // a multiple of 32: lane l's units stay l mod 32
constexpr int kBatch = 4;                   // staging: units per thread with loads in flight
static_assert(kThreads >= kSlabUnits, "stage_slab fills sw with one unit per thread");
static_assert(kRows * kCols == 32, "the reduce-scatter hands one (row, column) to each lane");

// inv[m] = rsqrt(mean(s^2) + eps) of the chunk's rows, in rms_norm's order (header comment),
// one warp per row; fetch(m, u) gives unit u of row m's s (from shared or global memory: the
// same values, so the same bits).
template <typename T, typename Fetch>
__device__ __forceinline__ void norm_rows(const LinearParams& p, int mc, float* inv,
                                          Fetch fetch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int K = p.width, units = (K + kUnit - 1) / kUnit;
  const int nt = p.norm_threads, nvw = nt >> 5;
  for (int m = warp; m < mc; m += nwarps) {
    float mine = 0.f;
    for (int vw = 0; vw < nvw; ++vw) {
      float ss = 0.f;
      // unrolled: a multi-slab row's global loads go out together (same order of fmaf)
#pragma unroll 4
      for (int u = vw * 32 + lane; u < units; u += nt) {
        const Unit<T> v = fetch(m, u);
#pragma unroll
        for (int i = 0; i < kUnit; ++i) { const float f = get(v, i); ss = fmaf(f, f, ss); }
      }
      const float total = warp_sum(ss);       // cta_sum's first step, for virtual warp vw
      if (lane == vw) mine = total;
    }
    const float sum = warp_sum(lane < nvw ? mine : 0.f);   // cta_sum's second step
    if (lane == 0) inv[m] = rsqrtf(__fdiv_rn(sum, static_cast<float>(K)) + p.eps);
  }
}

// Units [s0, s0 + su) of the chunk's rows -> sx, kBatch units per thread per pass (all their
// loads issued before the first use): s = x or round(x + residual), stored to residual_out
// by the CTAs with blockIdx.x == 0; then h = normalize(s) when inv is given (the norm of a
// multi-slab row, computed beforehand), else s itself (no norm, or the one-slab norm done
// in shared memory next). sw != nullptr: also the slab's norm weight units -> sw, as float
// (needs blockDim >= su). Units past K are zero.
template <typename T, typename W, bool Vec, int Batch>
__device__ __forceinline__ void stage_slab_impl(const LinearParams& p, int64_t row0, int mc,
                                                int64_t s0, int su, const float* inv,
                                                Pack<float, kUnit>* sw, Unit<T> (*sx)[kSlabUnits]) {
  const int K = p.width;
  constexpr bool vec = Vec;
  const bool fused = p.residual != nullptr;
  const bool store = fused && blockIdx.x == 0, norm_now = inv != nullptr;
  const W* nw = static_cast<const W*>(p.norm_weight);
  const float off = p.unit_offset ? 1.f : 0.f;
  const bool fill = sw != nullptr && static_cast<int>(threadIdx.x) < su;
  Unit<W> wf = zero_unit<W>();
  if (fill) wf = load_u<W>(nw, s0 + threadIdx.x, K, vec);
  const int total = mc * su;
  for (int i0 = threadIdx.x; i0 < total; i0 += Batch * blockDim.x) {
    Unit<T> xv[Batch], rv[Batch];
    Unit<W> wv[Batch];
#pragma unroll
    for (int b = 0; b < Batch; ++b) {         // defined on every path (see Words)
      xv[b] = rv[b] = zero_unit<T>();
      wv[b] = zero_unit<W>();
    }
#pragma unroll
    for (int b = 0; b < Batch; ++b) {
      const int i = i0 + b * blockDim.x;
      if (i < total) {
        const int m = i / su;
        const int64_t gu = s0 + (i - m * su);
        const RowPtrs q = row_ptrs<T>(p, row0 + m);
        xv[b] = load_u<T, false>(static_cast<const T*>(q.x), gu, K, vec);
        if (fused) rv[b] = load_u<T, false>(static_cast<const T*>(q.res), gu, K, vec);
        if (norm_now) wv[b] = load_u<W>(nw, gu, K, vec);
      }
    }
#pragma unroll
    for (int b = 0; b < Batch; ++b) {
      const int i = i0 + b * blockDim.x;
      if (i < total) {
        const int m = i / su, u = i - m * su;
        const int64_t gu = s0 + u;
        Unit<T> h = xv[b];
        if (fused) {
          float f[kUnit];
#pragma unroll
          for (int e = 0; e < kUnit; ++e) f[e] = get(h, e) + get(rv[b], e);
          h = from_floats<T>(f);
          if (store)
            store_u<T>(static_cast<T*>(row_ptrs<T>(p, row0 + m).res_out), gu, K, vec, h);
        }
        if (norm_now) h = normalize<T, W>(h, inv[m], off, wv[b], gu, K);
        sx[m][u] = h;       // (without a norm the tail past K is zero already: load_u)
      }
    }
  }
  if (fill) {
    Pack<float, kUnit> f;
#pragma unroll
    for (int e = 0; e < kUnit; ++e) f.e[e] = get(wf, e);
    sw[threadIdx.x] = f;
  }
}

// The scalar path (unaligned rows or K % 8) loads element by element: one unit at a time
// there, so its addresses do not crowd the registers.
template <typename T, typename W>
__device__ __forceinline__ void stage_slab(const LinearParams& p, int64_t row0, int mc, int64_t s0,
                                           int su, const float* inv, Pack<float, kUnit>* sw,
                                           Unit<T> (*sx)[kSlabUnits]) {
  if (p.vec_x) stage_slab_impl<T, W, true, kBatch>(p, row0, mc, s0, su, inv, sw, sx);
  else stage_slab_impl<T, W, false, 1>(p, row0, mc, s0, su, inv, sw, sx);
}

// This lane's weight units of slab s0 (zero where past the slab or the column is past N).
template <typename T>
__device__ __forceinline__ void load_weights(Unit<T> (&wv)[kCols][kLaneUnits],
                                             const T* const (&wrow)[kCols], const bool (&ok)[kCols],
                                             int64_t s0, int su, int K, bool vec) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < kCols; ++c)
#pragma unroll
    for (int j = 0; j < kLaneUnits; ++j) {
      const int u = lane + 32 * j;
      if (ok[c] && u < su) {
        wv[c][j] = load_u<T, false>(wrow[c], s0 + u, K, vec);
      } else {
        wv[c][j] = zero_unit<T>();
      }
    }
}

// Warp `group`'s two output columns and whether each exists: columns 2g, 2g + 1, or with
// silu_mul the gate column g and its up column N/2 + g.
__device__ __forceinline__ void warp_columns(const LinearParams& p, int64_t group, bool silu,
                                             int64_t (&col)[kCols], bool (&ok)[kCols]) {
  const int64_t half = p.cols / 2;
  col[0] = silu ? group : 2 * group;
  col[1] = silu ? half + group : 2 * group + 1;
  ok[0] = silu ? group < half : col[0] < p.cols;
  ok[1] = silu ? group < half : col[1] < p.cols;
}

// acc[m][c] += row m's unit . column c's unit (w0, w1) for the rows m < mc: the fmaf chain
// of a lane's unit, elements in order, the one definition both linear forms run.
template <typename T, int R, typename Row>
__device__ __forceinline__ void fma_unit(float (&acc)[R][kCols], const Unit<T>& w0,
                                         const Unit<T>& w1, int mc, Row row) {
  static_assert(kCols == 2, "a warp's two columns");
  float w[kCols][kUnit];
#pragma unroll
  for (int e = 0; e < kUnit; ++e) w[0][e] = get(w0, e), w[1][e] = get(w1, e);
#pragma unroll
  for (int m = 0; m < R; ++m) {
    if (m < mc) {
      const Unit<T> h = row(m);
#pragma unroll
      for (int e = 0; e < kUnit; ++e) {
        const float xe = get(h, e);
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[m][c] = fmaf(xe, w[c][e], acc[m][c]);
      }
    }
  }
}

// One step of a warp reduce-scatter over 2D values per lane (v[0 .. 2D)): the lanes with bit
// D set keep values [D, 2D), the others [0, D), each adding its partner's copy; the kept
// values move to v[0 .. D). Each sum is a + b of the same two partials as warp_sum's step D.
template <int D>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[32], int lane) {
  const bool upper = (lane & D) != 0;
#pragma unroll
  for (int i = 0; i < D; ++i) {
    const float send = upper ? v[i] : v[i + D];
    const float keep = upper ? v[i + D] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, D);
  }
}

// The warp's sums -> out: a reduce-scatter leaves value m * kCols + c, fully summed, in lane
// m * kCols + c; plain: each lane stores its element; silu_mul: the gate lane (c = 0) takes the
// up value from its neighbour and stores silu(g) * u at column `group`.
template <typename T>
__device__ __forceinline__ void write_out(const LinearParams& p, const float (&acc)[kRows][kCols],
                                          int64_t row0, int mc, int64_t group,
                                          const int64_t (&col)[kCols], const bool (&ok)[kCols]) {
  const int lane = threadIdx.x & 31;
  float v[32];
#pragma unroll
  for (int m = 0; m < kRows; ++m)
#pragma unroll
    for (int c = 0; c < kCols; ++c) v[m * kCols + c] = acc[m][c];
  reduce_scatter_step<16>(v, lane);
  reduce_scatter_step<8>(v, lane);
  reduce_scatter_step<4>(v, lane);
  reduce_scatter_step<2>(v, lane);
  reduce_scatter_step<1>(v, lane);
  const int m = lane / kCols, c = lane % kCols;
  T* orow = static_cast<T*>(p.out) + (row0 + m) * p.out_stride;
  if (p.silu_mul) {
    const float up = __shfl_xor_sync(0xffffffffu, v[0], 1);     // lane m*2 + 1: the up column
    if (c == 0 && m < mc && ok[0]) orow[group] = from_float<T>(accurate_silu(v[0]) * up);
  } else if (m < mc && (c ? ok[1] : ok[0])) {           // selects, not a local array
    orow[c ? col[1] : col[0]] = from_float<T>(v[0]);
  }
}

template <typename T, typename W>
__device__ __forceinline__ void linear(const LinearParams& p) {
  __shared__ Unit<T> sx[kRows][kSlabUnits];
  __shared__ Pack<float, kUnit> sw[kSlabUnits];   // the norm weight (one-slab rows)
  __shared__ float inv[kRows];
  __shared__ float sacc[kWarps][kRows * kCols][32];  // per warp: the sums of a multi-slab row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int K = p.width, units = (K + kUnit - 1) / kUnit;
  const bool vec_w = p.vec_w != 0, silu = p.silu_mul != 0;
  const bool norm = p.norm_weight != nullptr, one_slab = units <= kSlabUnits;
  // this warp's columns (either may be past N: not loaded, not written)
  const int64_t group = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int64_t col[kCols];
  bool ok[kCols];
  warp_columns(p, group, silu, col, ok);
  const T* wrow[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c)
    wrow[c] = static_cast<const T*>(p.weight) + (ok[c] ? col[c] : 0) * static_cast<int64_t>(K);

  // The first chunk's weights are requested before the PDL wait: no launch writes a weight,
  // so they may stream in while the predecessor drains (at decode sizes the weights are
  // nearly all the bytes). Everything else is read after the wait (pdl.cuh). Weights load by
  // plain ld.global everywhere in this file: ptxas 13.0 schedules griddepcontrol.wait (SASS
  // ACQBULK) above ld.global.nc loads on sm_90, so .nc weights never overlapped the previous
  // kernel (s45's SASS; plain loads: 10% off linear_chain at M = 1..8, H100 s46, same bits).
  Unit<T> wv[kCols][kLaneUnits];              // in flight during the wait and the staging
  load_weights<T>(wv, wrow, ok, 0, min(units, kSlabUnits), K, vec_w);
  pdl_begin();
  bool first = true;
  for (int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRows; row0 < p.rows;
       row0 += static_cast<int64_t>(gridDim.y) * kRows) {
    const int mc = static_cast<int>(min(static_cast<int64_t>(kRows), p.rows - row0));
    if (!first) load_weights<T>(wv, wrow, ok, 0, min(units, kSlabUnits), K, vec_w);

    for (int64_t s0 = 0; s0 < units; s0 += kSlabUnits) {
      const int su = static_cast<int>(min(static_cast<int64_t>(kSlabUnits), units - s0));
      if (s0 == 0 && norm && !one_slab)       // a multi-slab row: its norm from global memory
        norm_rows<T>(p, mc, inv, [&](int m, int u) {
          return fetch_s<T>(row_ptrs<T>(p, row0 + m), u, K, p.vec_x != 0);
        });
      __syncthreads();                        // inv written; the previous slab's readers done
      stage_slab<T, W>(p, row0, mc, s0, su, norm && !one_slab ? inv : nullptr,
                       norm && one_slab && first ? sw : nullptr, sx);
      __syncthreads();
      if (norm && one_slab) {                 // the whole row is in sx: its norm from there
        norm_rows<T>(p, mc, inv, [&](int m, int u) { return sx[m][u]; });
        __syncthreads();
        const float off = p.unit_offset ? 1.f : 0.f;
        for (int i = threadIdx.x; i < mc * su; i += blockDim.x) {
          const int m = i / su, u = i - m * su;
          sx[m][u] = normalize<T, float>(sx[m][u], inv[m], off, sw[u], u, K);
        }
        __syncthreads();
      }
      Unit<T> wn[kCols][kLaneUnits];          // the next slab's weights, in flight meanwhile
      const int64_t n0 = s0 + kSlabUnits;
      const bool last = n0 >= units;
      const int nu = last ? 0 : static_cast<int>(min(static_cast<int64_t>(kSlabUnits), units - n0));
      load_weights<T>(wn, wrow, ok, n0, nu, K, vec_w);
      // the running sums wait in shared memory between slabs (not in registers across the
      // staging, which needs them)
      float acc[kRows][kCols];
#pragma unroll
      for (int m = 0; m < kRows; ++m)
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[m][c] = s0 == 0 ? 0.f : sacc[warp][m * kCols + c][lane];
#pragma unroll
      for (int j = 0; j < kLaneUnits; ++j) {
        const int u = lane + 32 * j;
        if (u < su) fma_unit<T>(acc, wv[0][j], wv[1][j], mc, [&](int m) { return sx[m][u]; });
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int j = 0; j < kLaneUnits; ++j) wv[c][j] = wn[c][j];
      if (!last) {
#pragma unroll
        for (int m = 0; m < kRows; ++m)
#pragma unroll
          for (int c = 0; c < kCols; ++c) sacc[warp][m * kCols + c][lane] = acc[m][c];
      } else {
        write_out<T>(p, acc, row0, mc, group, col, ok);
      }
    }
    first = false;
  }
}

// ---------------------------------------------------------------- a few rows (decode, verify)
// linear_m{1,2,4}_*: the outputs of linear, bit for bit, for MR rows a CTA (rows MR * y ..,
// y = blockIdx.y: the launcher's gridDim.y covers M) when every access is 16 bytes (vec_x,
// vec_w) and K <= 32 * kSmallUnits * kUnit (2048). A warp holds its two
// columns' whole weight rows (requested before the PDL wait: one memory trip that overlaps
// the predecessor) and its rows' x in registers (the second trip), then does linear's fmaf
// chains and the warp_sum tree (linear's reduce-scatter adds the same pairs). A norm is
// computed by every warp for its rows from those registers, in rms_norm's order (each of
// rms_norm's norm_threads threads owns one unit at these K: virtual warp v = lane unit v).
// No shared memory, no barrier: at batch 1 linear's staging, 16-row chunks and barriers were
// most of its time (1.5x cuBLAS, s32).
template <typename T, typename W, int MR, int kSmallUnits>   // K <= 256 * kSmallUnits
__device__ __forceinline__ void linear_small(const LinearParams& p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int K = p.width, units = K / kUnit;    // vec: K % 8 == 0
  const bool silu = p.silu_mul != 0, norm = p.norm_weight != nullptr;
  const bool fused = p.residual != nullptr;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  int64_t col[kCols];
  bool ok[kCols];
  warp_columns(p, group, silu, col, ok);
  Unit<T> wv[kCols][kSmallUnits];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const T* wrow = static_cast<const T*>(p.weight) + (ok[c] ? col[c] : 0) * static_cast<int64_t>(K);
#pragma unroll
    for (int j = 0; j < kSmallUnits; ++j) {
      const int u = lane + 32 * j;
      wv[c][j] = ok[c] && u < units ? load_u<T, false>(wrow, u, K, true) : zero_unit<T>();
    }
  }
  pdl_begin();                               // everything below reads what a launch may write
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * MR;    // this CTA row's first row
  const int mc = static_cast<int>(min(static_cast<int64_t>(MR), p.rows - row0));
  Unit<T> h[MR][kSmallUnits];
#pragma unroll
  for (int m = 0; m < MR; ++m) {
    const RowPtrs q = row_ptrs<T>(p, row0 + (m < mc ? m : 0));
#pragma unroll
    for (int j = 0; j < kSmallUnits; ++j) {
      const int u = lane + 32 * j;
      h[m][j] = m < mc && u < units ? fetch_s<T>(q, u, K, true) : zero_unit<T>();
    }
  }
  if (norm) {
    Unit<W> nw[kSmallUnits];
#pragma unroll
    for (int j = 0; j < kSmallUnits; ++j) {
      const int u = lane + 32 * j;
      nw[j] = u < units ? load_u<W>(static_cast<const W*>(p.norm_weight), u, K, true) : zero_unit<W>();
    }
    if (fused && blockIdx.x == 0 && warp == 0) {   // s -> residual_out, once
#pragma unroll
      for (int m = 0; m < MR; ++m)
#pragma unroll
        for (int j = 0; j < kSmallUnits; ++j) {
          const int u = lane + 32 * j;
          if (m < mc && u < units)
            store_u<T>(static_cast<T*>(row_ptrs<T>(p, row0 + m).res_out), u, K, true, h[m][j]);
        }
    }
    const int nvw = p.norm_threads >> 5;      // rms_norm's warps: one unit a thread here
    const float off = p.unit_offset ? 1.f : 0.f;
    // Every row and every j unconditionally (rows past mc and units past K hold zeros, and
    // lanes past nvw are masked below): no branch between the independent shuffle trees, so
    // they interleave instead of running one after another.
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      float total[kSmallUnits];
#pragma unroll
      for (int j = 0; j < kSmallUnits; ++j) {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < kUnit; ++e) { const float f = get(h[m][j], e); ss = fmaf(f, f, ss); }
        total[j] = warp_sum(ss);              // cta_sum's first step, for rms_norm's warp j
      }
      float mine = 0.f;
#pragma unroll
      for (int j = 0; j < kSmallUnits; ++j)
        if (lane == j) mine = total[j];
      const float sum = warp_sum(lane < nvw ? mine : 0.f);   // cta_sum's second step
      const float inv = rsqrtf(__fdiv_rn(sum, static_cast<float>(K)) + p.eps);
#pragma unroll
      for (int j = 0; j < kSmallUnits; ++j) {
        const int u = lane + 32 * j;
        if (u < units) h[m][j] = normalize<T, W>(h[m][j], inv, off, nw[j], u, K);
      }
    }
  }
  float acc[MR][kCols];
#pragma unroll
  for (int m = 0; m < MR; ++m)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[m][c] = 0.f;
#pragma unroll
  for (int j = 0; j < kSmallUnits; ++j) {
    if (lane + 32 * j < units)                // linear's order: units, elements, columns
      fma_unit<T>(acc, wv[0][j], wv[1][j], mc, [&](int m) { return h[m][j]; });
  }
  // every lane gets every sum; lane 2m + c stores row m's column c (silu: c = 0 stores)
  float v = 0.f, up = 0.f;
#pragma unroll
  for (int m = 0; m < MR; ++m) {
    float s[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) s[c] = warp_sum(acc[m][c]);
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (lane == m * kCols + c) v = s[c], up = s[1];
  }
  const int m = lane / kCols, c = lane % kCols;
  if (m >= mc) return;
  T* orow = static_cast<T*>(p.out) + (row0 + m) * p.out_stride;
  if (silu) {
    if (c == 0 && ok[0]) orow[group] = from_float<T>(accurate_silu(v) * up);
  } else if (c ? ok[1] : ok[0]) {
    orow[c ? col[1] : col[0]] = from_float<T>(v);
  }
}

// ------------------------------------------------- a few rows, four columns a warp (wide)
// linear_w4_m{1,2}_k4_*: linear_small's outputs, bit for bit, with a warp owning FOUR output
// columns (a CTA 16), so the per-row work each warp repeats (x fetch, the norm's shuffle
// trees, unpack) is spread over twice the columns and a row takes half the CTAs. Columns of
// warp g: 4g .. 4g + 3; silu_mul: gate columns 2g, 2g + 1 and their up columns I + 2g,
// I + 2g + 1, held in the order (gate 2g, up, gate 2g + 1, up) so a gate's up value is one
// shuffle away in the same warp (no exchange between warps). A column past N (gate past I)
// is neither loaded nor written. Each sum is the same fmaf chain per lane as linear's and
// the same xor tree (16, 8, 4, 2, 1) over the lanes, done as a reduce-scatter of the MR x 4
// sums: the first log2(4 MR) levels halve the values a lane holds, the rest are warp_sum's
// butterfly; every addition is a + b of the same two partials as warp_sum's (a + b and
// b + a are the same bits), so the result is warp_sum's.
// The prologue (x fetch, residual_out, norm: small_rows_wide, in linear_common.cuh since s45,
// where linear_mma.cu runs it too) is linear_small's, copied rather than shared:
// moving linear_small's into a helper changed its SASS (ptxas scheduled it differently), and
// its timings are the baseline this form is measured against (s43: a fold reorders the
// two-column kernels' PTX, 16-1466 lines each: fold it with a GPU run to check their bits and
// speed). Registers (ptxas 13.0, sm_75 .. sm_90, no spills): m1 117-123 with a 16-bit norm
// weight, 128-140 with a float32 one; m2 128-163. A k8 form (K <= 2048) needs 213-248.
constexpr int kWideCols = 4;

// acc[m][c] += row m's unit j . column c's unit j for the rows m < mc: fma_unit's chain
// (elements in order; the columns' chains are independent, interleaved as there).
template <typename T, int R, int NC, int U, typename Row>
__device__ __forceinline__ void fma_unit_cols(float (&acc)[R][NC], const Unit<T> (&wv)[NC][U],
                                              int j, int mc, Row row) {
  float w[NC][kUnit];
#pragma unroll
  for (int e = 0; e < kUnit; ++e)
#pragma unroll
    for (int c = 0; c < NC; ++c) w[c][e] = get(wv[c][j], e);
#pragma unroll
  for (int m = 0; m < R; ++m) {
    if (m < mc) {
      const Unit<T> h = row(m);
#pragma unroll
      for (int e = 0; e < kUnit; ++e) {
        const float xe = get(h, e);
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[m][c] = fmaf(xe, w[c][e], acc[m][c]);
      }
    }
  }
}

// warp_sum of each of V values (V a power of 2, <= 32) as a reduce-scatter: at xor level x
// (16, 8, .., 1) a lane holding 2h values (h = V x / 32 >= 1) keeps h of them, the upper half
// where its bit x is set, else the lower, each plus its partner's copy; once h = 0, warp_sum's
// butterfly on the one value left. Returns value lane >> (5 - log2 V), summed over all lanes
// (4 + 2 + 1 + 3 = 10 shuffles for 8 sums instead of 40).
template <int V>
__device__ __forceinline__ float reduce_scatter_sum(float (&v)[V], int lane) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "a power of 2 values, at most 32");
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) {
    const int h = V * x / 32;
    if (h == 0) {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], x);
    } else {
      const bool upper = (lane & x) != 0;
#pragma unroll
      for (int i = 0; i < h; ++i) {
        const float send = upper ? v[i] : v[i + h];
        const float keep = upper ? v[i + h] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, x);
      }
    }
  }
  return v[0];
}

template <int V> struct Log2 { static constexpr int value = 1 + Log2<V / 2>::value; };
template <> struct Log2<1> { static constexpr int value = 0; };

template <typename T, typename W, int MR, int kSmallUnits>   // K <= 256 * kSmallUnits
__device__ __forceinline__ void linear_small_wide(const LinearParams& p) {
  constexpr int NC = kWideCols, V = MR * NC;
  constexpr int kShift = 5 - Log2<V>::value;  // lane >> kShift: the value a lane ends with
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int K = p.width, units = K / kUnit;    // vec: K % 8 == 0
  const bool silu = p.silu_mul != 0;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  const int64_t half = p.cols / 2;
  Unit<T> wv[NC][kSmallUnits];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    // column c: plain 4g + c; silu_mul (c >> 1)'s gate (c even) or up (c odd) of 2g + (c >> 1)
    const int64_t gate = 2 * group + (c >> 1);
    const int64_t col = silu ? ((c & 1) ? half + gate : gate) : NC * group + c;
    const bool ok = silu ? gate < half : col < p.cols;
    const T* wrow = static_cast<const T*>(p.weight) + (ok ? col : 0) * static_cast<int64_t>(K);
#pragma unroll
    for (int j = 0; j < kSmallUnits; ++j) {
      const int u = lane + 32 * j;
      wv[c][j] = ok && u < units ? load_u<T, false>(wrow, u, K, true) : zero_unit<T>();
    }
  }
  pdl_begin();                               // everything below reads what a launch may write
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * MR;    // this CTA row's first row
  const int mc = static_cast<int>(min(static_cast<int64_t>(MR), p.rows - row0));
  Unit<T> h[MR][kSmallUnits];
  small_rows_wide<T, W, MR, kSmallUnits>(p, lane, warp, row0, mc, h);
  float acc[MR][NC];
#pragma unroll
  for (int m = 0; m < MR; ++m)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[m][c] = 0.f;
#pragma unroll
  for (int j = 0; j < kSmallUnits; ++j) {
    if (lane + 32 * j < units)                // linear's order: units, elements, columns
      fma_unit_cols<T>(acc, wv, j, mc, [&](int m) { return h[m][j]; });
  }
  float v[V];
#pragma unroll
  for (int m = 0; m < MR; ++m)
#pragma unroll
    for (int c = 0; c < NC; ++c) v[m * NC + c] = acc[m][c];
  const float sum = reduce_scatter_sum<V>(v, lane);
  // lanes i << kShift .. hold value i = m * 4 + c (row m, column c); the first of them stores
  const int i = lane >> kShift, m = i / NC, c = i % NC;
  const bool first = (lane & ((1 << kShift) - 1)) == 0;
  // silu_mul (uniform over the warp): the up value, held by the lanes of value i ^ 1
  const float up = silu ? __shfl_xor_sync(0xffffffffu, sum, 1 << kShift) : 0.f;
  if (m >= mc || !first) return;
  T* orow = static_cast<T*>(p.out) + (row0 + m) * p.out_stride;
  if (silu) {
    const int64_t gate = 2 * group + (c >> 1);
    if ((c & 1) == 0 && gate < half) orow[gate] = from_float<T>(accurate_silu(sum) * up);
  } else {
    const int64_t col = NC * group + c;
    if (col < p.cols) orow[col] = from_float<T>(sum);
  }
}

}  // namespace

#define SPECDEC_LINEAR(NAME, T, W)                                                          \
  extern "C" __global__ void __launch_bounds__(kThreads, 3) linear_##NAME(const LinearParams p) {        \
    linear<T, W>(p);                                                                        \
  }
SPECDEC_LINEAR(f16_wf16, __half, __half)
SPECDEC_LINEAR(f16_wf32, __half, float)
SPECDEC_LINEAR(bf16_wbf16, bf16_t, bf16_t)
SPECDEC_LINEAR(bf16_wf32, bf16_t, float)

#define SPECDEC_LINEAR_SMALL_MK(NAME, T, W, M, U)                                           \
  extern "C" __global__ void __launch_bounds__(kThreads) linear_m##M##_k##U##_##NAME(       \
      const LinearParams p) {                                                               \
    linear_small<T, W, M, U>(p);                                                            \
  }
// units per lane 4 (K <= 1024) for 1, 2, 4 rows; 8 (K <= 2048) for 1, 2 rows, and for 4 rows
// with a 16-bit norm weight (a float32 one spills there: ops.linear keeps linear_*)
#define SPECDEC_LINEAR_SMALL(NAME, T, W)                                                    \
  SPECDEC_LINEAR_SMALL_MK(NAME, T, W, 1, 4) SPECDEC_LINEAR_SMALL_MK(NAME, T, W, 2, 4)      \
  SPECDEC_LINEAR_SMALL_MK(NAME, T, W, 4, 4) SPECDEC_LINEAR_SMALL_MK(NAME, T, W, 1, 8)      \
  SPECDEC_LINEAR_SMALL_MK(NAME, T, W, 2, 8)
SPECDEC_LINEAR_SMALL(f16_wf16, __half, __half)
SPECDEC_LINEAR_SMALL(f16_wf32, __half, float)
SPECDEC_LINEAR_SMALL(bf16_wbf16, bf16_t, bf16_t)
SPECDEC_LINEAR_SMALL(bf16_wf32, bf16_t, float)
SPECDEC_LINEAR_SMALL_MK(f16_wf16, __half, __half, 4, 8)
SPECDEC_LINEAR_SMALL_MK(bf16_wbf16, bf16_t, bf16_t, 4, 8)

#define SPECDEC_LINEAR_WIDE_MK(NAME, T, W, M, U)                                            \
  extern "C" __global__ void __launch_bounds__(kThreads) linear_w4_m##M##_k##U##_##NAME(    \
      const LinearParams p) {                                                               \
    linear_small_wide<T, W, M, U>(p);                                                       \
  }
// four columns a warp (ops.layers.TUNING["linear_cols_per_warp"] = 4): units per lane 4
// (K <= 1024) for 1 and 2 rows a CTA
#define SPECDEC_LINEAR_WIDE(NAME, T, W)                                                     \
  SPECDEC_LINEAR_WIDE_MK(NAME, T, W, 1, 4) SPECDEC_LINEAR_WIDE_MK(NAME, T, W, 2, 4)
SPECDEC_LINEAR_WIDE(f16_wf16, __half, __half)
SPECDEC_LINEAR_WIDE(f16_wf32, __half, float)
SPECDEC_LINEAR_WIDE(bf16_wbf16, bf16_t, bf16_t)
SPECDEC_LINEAR_WIDE(bf16_wf32, bf16_t, float)
