// layers family: linear's few-row form on the tensor cores (linear_mma_k{4,8}_*), first for
// the k + 1 = 2 .. 8 verify rows of batch-1 speculative decoding, whose cost on the CUDA-core
// few-row kernels (linear.cu) grows with the rows (SmolLM2's 30-layer chain, H100 s46: 272 us
// at M = 1, 657 at 8; this form ~300-325 at every M <= 8), then for the 9 .. 256 rows of a
// small batch's decode and verify passes, in groups of 8. Semantics: specdec_lib/reference/
// layers.py::linear, the LinearParams of linear.cu (layers/linear_params.h); taken by
// ops.layers.linear where the call asks (tensor_cores=True) and has <= 256 rows
// (LINEAR_MMA_MAX_ROWS), 16-byte-aligned rows (K % 8 == 0) and K <= 2048.
//
//   x [M, K] f16/bf16 (+ residual -> residual_out), norm_weight [K] (x's dtype or f32),
//   weight [N, K] -> out [M, N], or [M, N/2] = silu(gate) * up (silu_mul).
//
// The product. mma.sync m16n8k16 (f32 accumulate) with the WEIGHTS as A (16 weight rows, the
// CTA's output columns) and a group of 8 rows' h as B (n = 8: row 8 y + m is column m of the
// CTAs of blockIdx.y = y; the columns past M are zero). A CTA owns 16 weight rows -- 16 output
// columns, or with silu_mul 8 gate rows
// (A rows 0-7) and their 8 up rows (A rows 8-15), so a lane's D fragment holds a gate sum
// (d0, d1) and its up sum (d2, d3) for the same (column, row): the epilogue is local. Grid:
// ceil(N / 16) CTAs (silu_mul: ceil(I / 8)) of 8 warps, times ceil(M / 8) row groups (the
// weights come from HBM once, then from L2 for the other groups).
//
// k order. The dot product does not care in which order k is visited as long as A and B use
// the same one, so within each k-block of 32 elements (two k16 steps) fragment position
// (step s, pair 2t, 2t + 1 / 2t + 8, 2t + 9) is memory element 8t + 4s + (0, 1 / 2, 3): a
// lane's A fragments for both steps are its two weight rows' 16-byte unit 4 kb + t (g = lane
// / 4 is the row, t = lane % 4 the unit), and its B fragments are one 16-byte unit of h row
// g. h is staged once per CTA in shared memory as [k-block][row][unit] (512 bytes a block),
// so a lane's B load for block kb is the 16 bytes at kb * 512 + lane * 16: conflict-free.
//
// Split K. Warp w takes the k-blocks w, w + 8, w + 16, ... (at most U of them: K <= 256 U,
// U = 4 or 8 in the name); its 2 U weight units sit in registers, requested before the PDL
// wait (no launch writes a weight: they stream in while the predecessor drains, as in
// linear.cu's few-row kernels; everything else is read after pdl_begin). They are plain
// ld.global, not ld.global.nc: ptxas 13.0 schedules griddepcontrol.wait (SASS ACQBULK) above
// .nc loads, but keeps plain loads in front of it, as written. Then each warp stages one row:
// warp m runs linear_common.cuh's few-row prologue (small_rows_wide) for row 8 y + m -- s = x
// or round(x + residual), residual_out stored by the CTAs of blockIdx.x == 0, the norm in
// rms_norm's order, so h is bit for bit what rms_norm stores -- and writes it to shared memory
// (zeros past M). After one barrier each warp runs two mma per k-block on
// its blocks; the 8 partial 16x8 tiles meet in shared memory and one thread per output adds
// them in warp order 0..7 (fixed), then the epilogue (silu as linear's: accurate_silu) and
// one rounding to out's dtype.
//
// Row invariance (within this form): every row passes through the same instructions
// whatever M and the other rows are -- its own warp's prologue, column m of every mma (a
// column of D depends only on that column of B), the fixed-order reduction -- so a row's
// bits do not depend on M (1..256), its position or its neighbours. The bits differ from
// linear.cu's kernels (the tensor core sums differently); the rows' values are the
// reference's to float32 accumulation.
//
// Architectures. compute_80 / compute_90: one m16n8k16 per step, f16 and bf16. compute_75:
// f16 as two m16n8k8 (mma.cuh, same fragments); bf16 (no Turing tensor-core path) through
// mma_m16n8k16_bf16f32_fma, the same fragments multiplied on the CUDA cores: correct and
// deterministic, its own bits (the forced-compute_75 tests run it), never a trap.
//
// Resources (ptxas 13.0, sm_75 .. sm_90, no stack, no spills): 256 threads; shared memory 512
// bytes a k-block (16 KB at U = 4, 32 at U = 8) + 4 KB of partial tiles. U = 4: 80-108
// registers, bounded to 2 CTAs an SM (SmolLM2's gate_up: 192 CTAs in one wave on 132 SMs);
// U = 8: 152-194 (f32 norm weight the most), one CTA an SM.
#include "common/mma.cuh"
#include "common/pdl.cuh"
#include "layers/linear_common.cuh"

namespace {

constexpr int kMmaWarps = 8;                 // blockDim = 256 (ops.layers: _LINEAR_MMA_THREADS)
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaRows = 8;                  // the n of m16n8k16: rows a row group, one a warp
constexpr int kTileRows = 16;                // weight rows a CTA (the m of m16n8k16)
constexpr int kBlockUnits = 4;               // units of a k-block (32 elements, two k16 steps)
static_assert(kMmaWarps == kMmaRows, "warp m stages row m");

// Weight row of tile row r (0 .. 15) of this CTA: column 16 b + r, or with silu_mul gate
// 8 b + r (r < 8) / its up row I + 8 b + r - 8; ok: it exists (N, I tails).
__device__ __forceinline__ int64_t tile_row(const LinearParams& p, int r, bool& ok) {
  const int64_t b = blockIdx.x;
  if (p.silu_mul) {
    const int64_t half = p.cols / 2, gate = 8 * b + (r & 7);
    ok = gate < half;
    return r < 8 ? gate : half + gate;
  }
  const int64_t col = kTileRows * b + r;
  ok = col < p.cols;
  return col;
}

// D += A * B for 16-bit T (f32 accumulate), the fragments of mma.cuh.
template <typename T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    mma_m16n8k16_f16f32(d, a, b0, b1);
  }
};
template <> struct Mma<bf16_t> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    mma_m16n8k16_bf16f32(d, a, b0, b1);
#else
    mma_m16n8k16_bf16f32_fma(d, a, b0, b1);
#endif
  }
};

template <typename T, typename W, int U>     // K <= 256 * U
__device__ __forceinline__ void linear_mma(const LinearParams& p) {
  constexpr int kBlocks = kMmaWarps * U;     // k-blocks of the widest K
  __shared__ uint4 sh[kBlocks * kMmaRows * kBlockUnits];   // h: [k-block][row][unit]
  __shared__ float4 part[kMmaWarps][32];     // each warp's D fragments, by lane
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int K = p.width, units = K / kUnit;  // vec: K % 8 == 0
  const int nkb = (units + kBlockUnits - 1) / kBlockUnits;

  // this lane's weight units: tile rows g and g + 8, unit 4 kb + t of blocks kb = warp + 8 i
  // (plain loads, so they stay in front of the wait: header comment)
  Unit<T> wa[U][2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    bool ok;
    const int64_t row = tile_row(p, g + 8 * r, ok);
    const T* wrow = static_cast<const T*>(p.weight) + (ok ? row : 0) * static_cast<int64_t>(K);
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int u = kBlockUnits * (warp + kMmaWarps * i) + t;
      wa[i][r] = ok && u < units ? load_u<T, false>(wrow, u, K, true) : zero_unit<T>();
    }
  }
  pdl_begin();                               // everything below reads what a launch may write

  const int64_t row0 = static_cast<int64_t>(kMmaRows) * blockIdx.y;   // this row group's first
  {  // warp m stages row row0 + m (zeros past M): linear's few-row prologue, one row, so the
     // CTAs of blockIdx.x == 0 store every row's residual_out (each warp its own: `warp` 0 below)
    const int m = warp;
    Unit<T> h[1][U];
    small_rows_wide<T, W, 1, U>(p, lane, 0, row0 + m, row0 + m < p.rows ? 1 : 0, h);
#pragma unroll
    for (int j = 0; j < U; ++j) {            // unit u: block u / 4, unit u % 4 of it
      const int u = lane + 32 * j;
      sh[((u / kBlockUnits) * kMmaRows + m) * kBlockUnits + u % kBlockUnits] =
          make_uint4(h[0][j].w[0], h[0][j].w[1], h[0][j].w[2], h[0][j].w[3]);
    }
  }
  __syncthreads();

  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < U; ++i) {
    const int kb = warp + kMmaWarps * i;
    if (kb < nkb) {                          // set by K alone
      const uint4 b = sh[kb * 32 + lane];    // h row g, unit 4 kb + t
      // step 0: pairs (8t, 8t+1) / (8t+2, 8t+3) of the block; step 1: (8t+4, ..) / (8t+6, ..)
      const uint32_t a0[4] = {wa[i][0].w[0], wa[i][1].w[0], wa[i][0].w[1], wa[i][1].w[1]};
      Mma<T>::run(d, a0, b.x, b.y);
      const uint32_t a1[4] = {wa[i][0].w[2], wa[i][1].w[2], wa[i][0].w[3], wa[i][1].w[3]};
      Mma<T>::run(d, a1, b.z, b.w);
    }
  }
  part[warp][lane] = make_float4(d[0], d[1], d[2], d[3]);
  __syncthreads();

  // one thread per output: the 8 warps' partials added in warp order. Fragment element e of
  // lane L (g = L / 4, t = L % 4) is D[g + 8 (e / 2)][2t + e % 2]: tile row, then data row.
  const float* pf = reinterpret_cast<const float*>(part);
  const int i = threadIdx.x;
  if (p.silu_mul) {                          // 64 outputs: gate e = j, up e = 2 + j
    if (i >= 32 * 2) return;
    const int L = i >> 1, j = i & 1, n = 2 * (L & 3) + j;
    const int64_t gate = 8 * static_cast<int64_t>(blockIdx.x) + (L >> 2);
    float gs = pf[L * 4 + j], us = pf[L * 4 + 2 + j];
#pragma unroll
    for (int w = 1; w < kMmaWarps; ++w) {
      gs += pf[(w * 32 + L) * 4 + j];
      us += pf[(w * 32 + L) * 4 + 2 + j];
    }
    if (row0 + n < p.rows && gate < p.cols / 2)
      static_cast<T*>(p.out)[(row0 + n) * p.out_stride + gate] =
          from_float<T>(accurate_silu(gs) * us);
  } else {                                   // 128 outputs
    if (i >= 32 * 4) return;
    const int L = i >> 2, e = i & 3, n = 2 * (L & 3) + (e & 1);
    const int64_t col = kTileRows * static_cast<int64_t>(blockIdx.x) + (L >> 2) + 8 * (e >> 1);
    float s = pf[i];
#pragma unroll
    for (int w = 1; w < kMmaWarps; ++w) s += pf[w * 128 + i];
    if (row0 + n < p.rows && col < p.cols)
      static_cast<T*>(p.out)[(row0 + n) * p.out_stride + col] = from_float<T>(s);
  }
}

}  // namespace

#define SPECDEC_LINEAR_MMA_U(NAME, T, W, U, MIN_CTAS)                                        \
  extern "C" __global__ void __launch_bounds__(kMmaThreads, MIN_CTAS)                         \
      linear_mma_k##U##_##NAME(const LinearParams p) {                                        \
    linear_mma<T, W, U>(p);                                                                   \
  }
// units a lane 4 (K <= 1024; 2 CTAs an SM) and 8 (K <= 2048)
#define SPECDEC_LINEAR_MMA(NAME, T, W)                                                        \
  SPECDEC_LINEAR_MMA_U(NAME, T, W, 4, 2) SPECDEC_LINEAR_MMA_U(NAME, T, W, 8, 1)
SPECDEC_LINEAR_MMA(f16_wf16, __half, __half)
SPECDEC_LINEAR_MMA(f16_wf32, __half, float)
SPECDEC_LINEAR_MMA(bf16_wbf16, bf16_t, bf16_t)
SPECDEC_LINEAR_MMA(bf16_wf32, bf16_t, float)
