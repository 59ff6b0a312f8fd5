// gdn family: the gated delta rule of a speculative round, split transactionally.
//
//   gdn_verify  q, k [T,Hk,Dk], v [T,Hv,Dv], gates [T,Hv], state pool (read only)
//               -> out [T,Hv,Dv] and journal [T, Hk*Dk + Hv*Dv + 2*Hv] (f32)
//   gdn_commit  journal + accept_len [B] -> state advanced in place over the accepted rows
//
// Traffic per round: verify reads each selected state once, commit reads and writes it
// once (and not at all when accept_len = 0); vLLM-style "a state per draft row" moves
// q+1 states instead.
//
// Grid: one CTA per (sequence, value head, Dv slice), flattened as
// blockIdx.x = (b * Hv + h) * num_slices + z, so the CTAs that share a key head's q/k rows
// run next to each other. The CTA keeps its [Dk x BV] slice of the state in registers
// (gdn_tile.cuh) for the whole block: the rows are applied one after the other with
// warp-local Dk reductions, the state rounded to its dtype after each row exactly as a
// stored state would be, so verify's row-i output equals one-token decoding of row i and
// commit's result equals decoding the accepted rows one by one. Block rows are staged in
// shared memory kRowChunk at a time (normalised k, q*scale, the v slice, decay, beta,
// k.q); a warp normalises one row with shuffles, so no block-wide reduction is needed.
//
// Per token and state element verify does 2 FMAs of reductions (S^T k, S^T q, both from
// the pre-token state: o = decay S^T q + delta (k.q)) and 2 of update; commit 1 + 2.
// bf16 / f16 states also have a tensor-core family (gdn_*_mma_*, near the end of this file: the
// two reductions as tf32 mmas, ops/gdn.py TUNING["mma16"] picks it). Future work, to be
// justified by measurement:
//  * chunked (WY) form: all q rows' S0^T k_t and S0^T q_t in one pass (an
//    [Dv x Dk] x [Dk x 2q] product, mma-able with q <= 8), then the intra-block
//    interactions through q x q scalars: delta_t = beta_t (v_t - e_t (g_{t-1} S0^T k_t +
//    sum_{s<t} (g_{t-1}/g_s)(k_s.k_t) delta_s)), o_t = g_t S0^T q_t + sum_{s<=t}
//    (g_t/g_s)(k_s.q_t) delta_s with g_t the running decay product. No per-row state
//    update in verify at all; exact up to f32 reassociation for an f32 state, but it
//    skips the per-row rounding of a 16-bit state (so keep the sequential path there).
//  * fused mode: verify of round r+1 first replays round r's accepted rows from the
//    previous journal (commit folded in), writes the advanced state once, then computes
//    the new block's outputs: 1 read + 1 write per round instead of 1 + 2. Needs a
//    per-sequence "pending accept_len" and a flush op for sequences that leave the
//    batch; worth it only if the round is bandwidth-bound at ~3 passes (measure first).
#include <type_traits>

#include "common/cp_async.cuh"
#include "common/pdl.cuh"
#include "gdn/gdn_tile.cuh"

using namespace specdec;
using namespace specdec::gdn;

namespace {

template <int DK>
struct RowStage {
  __device__ __forceinline__ static int idx(int i) { return i; }
  // stage_chunk's store of Dk entry i of row rr (normalised k, q * scale)
  __device__ __forceinline__ void put(int rr, int i, float kn, float qn) {
    k[rr][idx(i)] = kn;
    q[rr][idx(i)] = qn;
  }
  float k[kRowChunk][DK];      // normalised k (what the journal holds)
  float q[kRowChunk][DK];      // normalised q * scale
  float v[kRowChunk][kMaxSliceCols];
  float decay[kRowChunk];      // exp(g)
  float beta[kRowChunk];
  float kq[kRowChunk];         // k . (q * scale)
};

struct BlockPos {
  int z, h, b;
};

__device__ __forceinline__ BlockPos block_pos(int num_slices, int num_v_heads) {
  BlockPos p;
  p.z = blockIdx.x % num_slices;
  const int bh = blockIdx.x / num_slices;
  p.h = bh % num_v_heads;
  p.b = bh / num_v_heads;
  return p;
}

// This CTA's work item (sequence, value head, column slice) and the thread's place in it;
// the same for verify (both forms) and commit.
struct CtaSlice {
  BlockPos pos;
  int lane, warp, nwarps, slice_cols, col_base, group, hk, Dv;
};

template <int WARP_COLS, typename P>
__device__ __forceinline__ CtaSlice cta_slice(const P& p) {
  CtaSlice c;
  c.pos = block_pos(p.num_slices, p.num_v_heads);
  c.lane = threadIdx.x & 31;
  c.warp = threadIdx.x >> 5;
  c.nwarps = blockDim.x >> 5;
  c.slice_cols = c.nwarps * WARP_COLS;   // a power of two: ops/gdn.py launches 1, 2, 4 or 8 warps
  c.col_base = c.pos.z * c.slice_cols;
  c.group = p.num_v_heads / p.num_k_heads;
  c.hk = c.pos.h / c.group;
  c.Dv = p.head_v_dim;
  return c;
}

// CtaSlice with unsigned divisions (every operand is >= 0: blockIdx.x, and the host's Hv, Hk,
// slices >= 1: about 12 instructions each instead of 20) and one division for both hk and
// h % group (write_k). gdn_verify and gdn_commit (P: their parameter blocks).
struct VerifySlice {
  CtaSlice c;
  bool hk_first;   // h % group == 0: this head is the first value head of its key head
};

template <int WARP_COLS, typename P>
__device__ __forceinline__ VerifySlice verify_slice(const P& p) {
  VerifySlice v;
  CtaSlice& c = v.c;
  const uint32_t x = blockIdx.x, ns = uint32_t(p.num_slices), hv = uint32_t(p.num_v_heads);
  const uint32_t bh = x / ns;
  const uint32_t b = bh / hv;
  c.pos.z = int(x - bh * ns);
  c.pos.h = int(bh - b * hv);
  c.pos.b = int(b);
  c.lane = threadIdx.x & 31;
  c.warp = threadIdx.x >> 5;
  c.nwarps = blockDim.x >> 5;
  c.slice_cols = c.nwarps * WARP_COLS;
  c.col_base = c.pos.z * c.slice_cols;
  const uint32_t group = hv / uint32_t(p.num_k_heads);
  const uint32_t hk = uint32_t(c.pos.h) / group;
  c.group = int(group);
  c.hk = int(hk);
  c.Dv = p.head_v_dim;
  v.hk_first = uint32_t(c.pos.h) == hk * group;
  return v;
}

// A verify block's rows and slot, checked; the status of the sequence is written here.
// FUSED (gdn_verify_fused): also the previous round's pending rows, committed before the block.
struct VerifyRows {
  int row0, row1, slot;
  bool slot_ok, go;   // go: valid rows and at least one of them (FUSED: or rows to commit)
  int pend_row0, pend_n;   // FUSED: pending journal rows to replay first (pend_n = 0: none)
};

template <bool FUSED = false>
__device__ __forceinline__ VerifyRows verify_rows(const GdnVerifyParams& p, const BlockPos& pos) {
  VerifyRows v;
  if (FUSED && p.cu_q == nullptr) {   // gdn_flush: no block, only the pending rows
    v.row0 = v.row1 = 0;
  } else {
    v.row0 = __ldg(p.cu_q + pos.b);
    v.row1 = __ldg(p.cu_q + pos.b + 1);
  }
  v.slot = __ldg(p.slot_ids + pos.b);
  const bool rows_ok = 0 <= v.row0 && v.row0 <= v.row1 && v.row1 <= p.num_rows;
  v.slot_ok = v.slot >= 0 && v.slot < p.num_slots;
  v.pend_row0 = 0;
  v.pend_n = 0;
  bool pend_ok = true;
  if constexpr (FUSED) {
    const int r = __ldg(p.pending_row0 + pos.b), n = __ldg(p.pending_len + pos.b);
    pend_ok = n == 0 || (n > 0 && r >= 0 && r <= p.pending_num_rows - n);
    if (rows_ok && v.slot_ok && pend_ok) {
      v.pend_row0 = r;
      v.pend_n = n;
    }
  }
  if (p.status != nullptr && pos.z == 0 && pos.h == 0 && threadIdx.x == 0)
    p.status[pos.b] = (rows_ok ? 0 : SPECDEC_GDN_BAD_ROWS) | (v.slot >= p.num_slots ? SPECDEC_GDN_BAD_SLOT : 0) |
                      (pend_ok ? 0 : SPECDEC_GDN_BAD_PENDING);
  v.go = rows_ok && (v.row0 != v.row1 || v.pend_n > 0);
  return v;
}

// L2 prefetch of the next wave's state. A CTA loads its state slice, waits for it, then computes;
// with 4 CTAs per SM the load phases and the compute phases overlap only partly, so each CTA
// pays a DRAM round trip under load before its math. CTA x (x + ahead < grid, ahead = the
// resident CTAs of the launch, host side) asks L2 for the slice CTA x + ahead will load: that CTA
// starts about one wave later and finds its state in L2 (one wave ahead is 17 MB for f32
// B=64 Hv=32 128x128 on 132 SMs x 4 CTAs: well inside the H200's 50 MB L2). No register holds the
// data and nothing waits for it; a wrong guess of the order costs bandwidth, never correctness.
struct NextSlice {
  int slot;      // < 0: nothing to prefetch
  uint32_t h, z;
};

// The slot of CTA blockIdx.x + ahead (issued with the CTA's own index loads).
template <typename P>
__device__ __forceinline__ NextSlice next_slice(const P& p) {
  NextSlice n;
  n.slot = -1;
  n.h = n.z = 0;
  const uint32_t nb = blockIdx.x + uint32_t(p.prefetch_ahead);
  if (p.prefetch_ahead > 0 && nb < gridDim.x) {
    const uint32_t ns = uint32_t(p.num_slices), hv = uint32_t(p.num_v_heads);
    const uint32_t bh = nb / ns, b = bh / hv;
    n.z = nb - bh * ns;
    n.h = bh - b * hv;
    const int slot = __ldg(p.slot_ids + b);
    n.slot = slot < p.num_slots ? slot : -1;
  }
  return n;
}

// One prefetch per 128-byte line of that CTA's [Dk x slice_cols] slice ("kv": Dk row segments of
// slice_cols elements; "vk": slice_cols contiguous columns of Dk elements).
template <typename TS, int DK, bool VK, typename P>
__device__ __forceinline__ void prefetch_slice_l2(const P& p, const NextSlice& n, int slice_cols) {
  if (n.slot < 0) return;
  const int Dv = p.head_v_dim;
  const char* const head = static_cast<const char*>(p.state) +
                           (uint64_t(uint32_t(n.slot)) * uint64_t(p.state_stride_slot) + uint64_t(n.h) * DK * Dv) *
                               sizeof(TS);
  if constexpr (!VK) {
    const uint32_t seg = uint32_t(slice_cols) * sizeof(TS);   // bytes per row segment
    const char* const c0 = head + uint64_t(n.z) * seg;
    for (int r = threadIdx.x; r < DK; r += blockDim.x)
      for (uint32_t o = 0; o < seg; o += 128) prefetch_l2(c0 + uint64_t(r) * Dv * sizeof(TS) + o);
  } else {
    const uint32_t bytes = uint32_t(slice_cols) * DK * sizeof(TS);
    const char* const c0 = head + uint64_t(n.z) * bytes;
    for (uint32_t o = threadIdx.x * 128u; o < bytes; o += blockDim.x * 128u) prefetch_l2(c0 + o);
  }
}

// Run-time dtype codes as the two facts raw_to_float_sel needs (branch-free conversion).
struct RawCvt {
  int shl;    // 16 for bf16 (its bits are the high half of a float), else 0
  bool f16;
  __device__ __forceinline__ explicit RawCvt(int dt) : shl(dt == SPECDEC_DT_BF16 ? 16 : 0), f16(dt == SPECDEC_DT_F16) {}
};

// raw_to_float without branches: the same value bit for bit (f32: the bits; bf16: bits << 16;
// f16: __half2float of the low half), as two candidates and a select.
__device__ __forceinline__ float raw_to_float_sel(uint32_t u, RawCvt c) {
  const float h = __half2float(__ushort_as_half(static_cast<unsigned short>(u)));
  const float f = __uint_as_float(u << c.shl);
  return c.f16 ? h : f;
}

// Element e of a row whose address (this lane's element 0) is `lanep`: 32-bit or 16-bit,
// zero-extended raw bits. Both loads use the same register and an immediate offset.
__device__ __forceinline__ uint32_t load_raw_at(const char* lanep, int e, bool f32) {
  return f32 ? __float_as_uint(__ldg(reinterpret_cast<const float*>(lanep) + e))
             : static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(lanep) + e));
}

// The gate input this lane loads for every row: lane & 3 = 0 gate0[t], 1 gate1[t], and
// with fused gating 2 A_log, 3 dt_bias (lanes >= 4 repeat lanes 0..3: same addresses, no
// extra traffic, no lane test). Byte address at row 0 and bytes per row.
static_assert(offsetof(GdnVerifyParams, gate1) == offsetof(GdnVerifyParams, gate0) + sizeof(void*) &&
                  offsetof(GdnVerifyParams, A_log) == offsetof(GdnVerifyParams, gate0) + 2 * sizeof(void*) &&
                  offsetof(GdnVerifyParams, dt_bias) == offsetof(GdnVerifyParams, gate0) + 3 * sizeof(void*),
              "GateLane indexes gate0, gate1, A_log, dt_bias as one array");
struct GateLane {
  const char* base;
  uint64_t stride;   // bytes per row (0 for A_log / dt_bias)
  bool on, f32;
  RawCvt cvt;
  __device__ __forceinline__ GateLane(const GdnVerifyParams& p, int h, int lane) : cvt(p.gate_dtype[lane & 3]) {
    const int gi = lane & 3;
    on = gi < 2 || p.fused_gating;
    // An unused lane (2, 3 without fused gating: A_log / dt_bias may be null) loads gate0's
    // element, a valid address, and drops it (load): the load is unconditional. As `on ? load :
    // 0` ptxas made it a branch and scheduled it after the waits for the q/k loads (a second
    // memory round trip per row; sm_90 SASS, seen once v staging was shortened).
    const int gs = on ? gi : 0;
    const int dt = p.gate_dtype[gs];
    const void* ptr = (&p.gate0)[gs];   // gate0, gate1, A_log, dt_bias are consecutive fields
    const int sh = dt == SPECDEC_DT_F32 ? 2 : 1;
    f32 = dt == SPECDEC_DT_F32;
    base = static_cast<const char*>(ptr) + (uint64_t(uint32_t(h)) << sh);
    stride = gs < 2 ? uint64_t(p.gate_stride_t[gs & 1]) << sh : 0;
  }
  // this lane's raw gate input of row t (0 for an unused lane)
  __device__ __forceinline__ uint32_t load(uint32_t t) const {
    const uint32_t raw = load_raw_at(base + uint64_t(t) * stride, 0, f32);
    return on ? raw : 0u;
  }
};

// The four gate inputs of a row (GateLane::load, converted, in lanes 0..3) -> (g, beta), the
// same in every lane; fused: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b).
// Same float operations on the same values as before (only the conversion moved before the
// shuffle: it is exact either way).
__device__ __forceinline__ void gates_of_row(const GdnVerifyParams& p, float gx, float& g, float& beta) {
  const float x0 = __shfl_sync(0xffffffffu, gx, 0);
  const float x1 = __shfl_sync(0xffffffffu, gx, 1);
  const float x2 = __shfl_sync(0xffffffffu, gx, 2), x3 = __shfl_sync(0xffffffffu, gx, 3);
  if (p.fused_gating) {
    const float x = x0 + x3;
    const float softplus = fmaxf(x, 0.f) + log1pf(__expf(-fabsf(x)));
    g = -__expf(x2) * softplus;
    beta = 1.f / (1.f + __expf(-x1));
  } else {
    g = x0;
    beta = x1;
  }
}

// warp_sum of a and of b at once, bit-identical to two warp_sum calls: the first step (xor 16)
// hands b to the upper half-warp and a to the lower one, so the remaining steps reduce one value
// per lane (a in lanes 0..15, b in 16..31), each step adding the same two partial sums as
// warp_sum's butterfly (x + y == y + x); the result is f(total) of this lane's half, and
// f(the other total) arrives by one more shuffle. 6 shuffles and 6 adds instead of 10 + 10.
// Returns f(sum a) in fa, f(sum b) in fb (f: the per-total function, evaluated once per lane).
template <class F>
__device__ __forceinline__ void warp_sum2(float a, float b, int lane, F f, float& fa, float& fb) {
  const bool up = lane & 16;
  float x = (up ? b : a) + __shfl_xor_sync(0xffffffffu, up ? a : b, 16);
#pragma unroll
  for (int d = 8; d > 0; d >>= 1) x += __shfl_xor_sync(0xffffffffu, x, d);
  const float mine = f(x);
  const float other = __shfl_xor_sync(0xffffffffu, mine, 16);
  fa = up ? other : mine;
  fb = up ? mine : other;
}

// ------------------------------------------------------------------------ journal replay
// (gdn_commit, and the commit half of gdn_verify_fused)

// Journal rows staged for a replay (gdn_commit, and the commit half of gdn_verify_fused).
template <int DK>
struct JournalStage {
  __device__ __forceinline__ static int kpos(int i) { return i; }   // where k_hat entry i is staged
  float k[kRowChunk][DK];             // k_hat rows
  float v[kRowChunk][kMaxSliceCols];  // the CTA's v slice
  float g[kRowChunk], beta[kRowChunk];   // decay = exp(g) where it is used
};

// Where a replay reads its journal: the journal and its row stride, Hk, Hv (column offsets).
struct JournalRef {
  const float* journal;
  int64_t stride_t;
  int num_k_heads, num_v_heads;
};

// Stages journal rows t0 .. t0+nrows-1 (k_hat rows, the slice's v entries, decay, beta) into
// shared memory. All journal loads of the chunk are in flight before the first is used (as in
// verify), none of them behind a wait on the state loads: the caller stages chunk 0 before its
// chunk loop, because at the head of a loop that issues loads ptxas waits for the scoreboard of
// the loads before it (sm_90 SASS: with chunk 0 inside the chunk loop the first v-entry load
// waited on the state loads' scoreboard, two memory round trips per CTA, the d24c791 regression
// again; session 4's commit still had it on sm_86/89). The row loop needs no peeling here (no
// wait at its head in the SASS of sm_75-90; peeled, it cost up to 8 registers).
// Thread x's v entries, as in stage_chunk: entry j is row x / slice_cols + j * VROWS, column
// x % slice_cols (one address and a constant row step instead of a division per entry).
// The addresses are computed in each call from the arguments and opaque copies of the CTA's
// indices, as in stage_chunk, so that two calls share no address math kept live through the
// token loop.
// Stages journal rows t0 .. t0+nrows-1 (k_hat rows, the slice's v entries, g, beta) into shared
// memory with 4-byte cp.async: nothing passes through registers and nothing waits here, so the
// copies overlap whatever the caller issues next (gdn_verify_fused: the block's first chunk); the
// reader waits (cp_async_wait<0> + barrier, replay_journal). Loaded into registers and stored, the
// v entries' shared stores waited on the state loads' scoreboard (ptxas shares scoreboards among
// loads; sm_90 SASS), which put the block's staging loads a round trip later; register staging
// also spilled the fused "vk" kernel at its 128-register cap. sm_75: synchronous copies.
// Thread x's v entries, as in stage_chunk: entry j is row x / slice_cols + j * VROWS, column
// x % slice_cols (one address and a constant row step instead of a division per entry).
template <int DK, int WC, class JS>
__device__ __forceinline__ void stage_journal(const JournalRef& jr, JS& js, int h, int hk,
                                              int col_base, int slice_cols, int Dv, int t0_arg, int nrows) {
  constexpr int PER_LANE = DK / 32;
  static_assert(WC <= 32 && 32 % WC == 0, "warp columns divide 32");
  constexpr int VROWS = 32 / WC;
  constexpr int VPT = (kRowChunk * WC + 31) / 32;   // v entries per thread, at most
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int h_v = h, cb_v = col_base, x_v = threadIdx.x, hk_r = hk, r0 = t0_arg;
  asm volatile("" : "+r"(h_v), "+r"(cb_v), "+r"(x_v), "+r"(hk_r), "+r"(r0));
  const uint64_t jst = uint64_t(jr.stride_t);   // journal columns: k_hat | v | g | beta
  const int64_t jv = int64_t(jr.num_k_heads) * DK;
  const int64_t jg = jv + int64_t(jr.num_v_heads) * Dv;
  const int64_t jb = jg + jr.num_v_heads;
  const uint32_t t0 = uint32_t(r0);   // the chunk's first row (0 <= t0 < T < 2^31)
  const int cols_log2 = __ffs(slice_cols) - 1;      // slice_cols: a power of two (see CtaSlice)
  const int vr0 = x_v >> cols_log2, vc = x_v & (slice_cols - 1);
  const float* const vp = jr.journal + uint64_t(t0 + uint32_t(vr0)) * jst + (jv + int64_t(h_v) * Dv + cb_v + vc);
  const uint64_t vstep = uint64_t(VROWS) * jst;   // floats between a thread's v entries
#pragma unroll
  for (int j = 0; j < VPT; ++j)
    if (vr0 + j * VROWS < nrows) cp_async_4(&js.v[vr0 + j * VROWS][vc], vp + j * vstep);
  // k row, g, beta of row rr, one row per warp (lane 0: g, lane 1: beta)
  for (int rr = warp; rr < nrows; rr += nwarps) {
    const float* const jrow = jr.journal + uint64_t(t0 + uint32_t(rr)) * jst;
    const float* const jk = jrow + (hk_r * DK + (x_v & 31));
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) cp_async_4(&js.k[rr][JS::kpos(lane + 32 * e)], jk + 32 * e);
    if (lane < 2) cp_async_4(lane == 0 ? &js.g[rr] : &js.beta[rr], jrow + (lane == 0 ? jg : jb) + h_v);
  }
  cp_async_commit();
}

// Replays the first n rows from journal row t0 on the tile (the state in registers): the same
// S^T k sums (dot_all == reduce_scatter bit for bit), delta and rounded update as gdn_verify, so
// the state equals one-token decoding of those rows. vj: the thread's first column in the slice.
// Chunk 0 must already be staged (stage_journal) and not yet synchronised.
// SCATTER: verify's reduce_scatter + one delta per lane + all_gather (about 35 fewer
// instructions per row and warp with 8 columns: the fused kernel, which is issue bound) instead
// of dot_all's per-column butterflies (gdn_commit, latency bound: the shorter chain wins there).
template <typename TS, class Tile, int DK, bool SCATTER = false>
__device__ __forceinline__ void replay_journal(Tile& tile, const JournalRef& jr, JournalStage<DK>& js, int h, int hk,
                                               int col_base, int slice_cols, int Dv, int t0, int n, int vj) {
  constexpr int RI = Tile::RI, CJ = Tile::CJ;
  const int vr = vj + Tile::piece_off(tile.red_col());   // SCATTER: the column this lane reduces
  for (int c0 = 0; c0 < n; c0 += kRowChunk) {
    const int nrows = min(kRowChunk, n - c0);
    if (c0 > 0) {
      __syncthreads();   // the previous chunk's rows have been consumed
      stage_journal<DK, Tile::WARP_COLS>(jr, js, h, hk, col_base, slice_cols, Dv, t0 + c0, nrows);
    }
    cp_async_wait<0>();   // this thread's copies have landed ...
    __syncthreads();      // ... and everyone's
    for (int rr = 0; rr < nrows; ++rr) {
      float kr[RI], sk[CJ], delta[CJ];
      tile.gather(js.k[rr], kr);
      const float decay = __expf(js.g[rr]), beta = js.beta[rr];
      if constexpr (SCATTER) {
        tile.partial_dot(kr, sk);
        const float d = delta_of(beta, js.v[rr][vr], decay, tile.reduce_scatter(sk));
        tile.all_gather(d, delta);
      } else {
        tile.dot_all(kr, sk);
#pragma unroll
        for (int c = 0; c < CJ; ++c)
          delta[c] = delta_of(beta, js.v[rr][vj + Tile::piece_off(c)], decay, sk[c]);
      }
      tile.template update<TS>(decay, kr, delta);
    }
  }
}

// ------------------------------------------------------------------------ gdn_verify

// Stages block rows c0 .. c0+nrows-1 of the sequence into shared memory (normalised k,
// q * scale at Stage::idx positions, the CTA's v slice, decay, beta, k.q) and writes the
// journal. Every global load of the chunk is issued before the first value is used (raw
// bits, converted afterwards), so staging costs about one memory latency, not one per element.
// Addresses: every input's byte address at the chunk's first row (head, column and lane
// folded in) plus row * bytes-per-row, one 32 x 64-bit multiply-add per row and tensor; the
// elements of a row are immediate offsets. Row and element offsets stay 64-bit where a tensor
// can exceed 2^31 elements (row * stride, head * stride); offsets inside a row are 32-bit.
template <int DK, int WC, int ROWS, class Stage, bool FIRST_ROW_OUTSIDE = false>
__device__ __forceinline__ void stage_chunk(const GdnVerifyParams& p, Stage& st, const BlockPos& pos,
                                            int row0, int c0, int nrows, int hk, int slice_cols,
                                            int col_base, bool write_k) {
  constexpr int PER_LANE = DK / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int Dv = p.head_v_dim;
  const bool f32 = p.qkv_dtype == SPECDEC_DT_F32;
  const int sh = f32 ? 2 : 1;   // log2 bytes per q/k/v element
  const RawCvt cvt(p.qkv_dtype);
  const uint32_t t0 = uint32_t(row0 + c0);   // the chunk's first row (0 <= t0 < T < 2^31)
  const uint64_t jst = uint64_t(p.journal_stride_t);   // journal columns: k_hat | v | g | beta
  constexpr int VPT = (ROWS * WC + 31) / 32;   // v entries per thread, at most (ROWS: rows per chunk)
  // Thread x's v entries: e = x + j * blockDim.x of the chunk's nrows x slice_cols. blockDim.x =
  // 32 nwarps and slice_cols = WC nwarps, so entry j is row x / slice_cols + j * (32 / WC) and
  // column x % slice_cols: one address per thread and a constant row step, not a split of e per
  // entry (e < nrows * slice_cols <=> its row < nrows).
  static_assert(WC <= 32 && 32 % WC == 0, "warp columns divide 32");
  constexpr int VROWS = 32 / WC;   // rows between a thread's v entries
  const int cols_log2 = __ffs(slice_cols) - 1;   // slice_cols: a power of two (see CtaSlice)
  // Opaque copies (as in stage_row): the v addresses are computed here, not hoisted out of the
  // chunk loop and kept live (or spilled, f32 Dk 128 on sm_90) through the token loop.
  int h_v = pos.h, cb_v = col_base, x_v = threadIdx.x;
  asm volatile("" : "+r"(h_v), "+r"(cb_v), "+r"(x_v));
  const int vr0 = x_v >> cols_log2, vc = x_v & (slice_cols - 1);   // row and column of entry 0
  const uint64_t v_st = uint64_t(p.v_stride_t) << sh;
  const char* const vp = static_cast<const char*>(p.v) + (uint64_t(int64_t(h_v) * p.v_stride_h + cb_v) << sh) +
                         uint64_t(t0 + uint32_t(vr0)) * v_st + (uint32_t(vc) << sh);
  uint32_t vraw[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    vraw[j] = 0u;
    if (vr0 + j * VROWS < nrows) vraw[j] = load_raw_at(vp + uint64_t(j * VROWS) * v_st, 0, f32);
  }
  // FIRST_ROW_OUTSIDE: the warp's first row straight-line, further rows (more rows than
  // warps) in a loop. At the head of a loop that issues loads ptxas waits for the scoreboard of
  // the loads before it: with the first row inside the loop, an f32 verify's q/k loads waited
  // for its state loads (sm_75/80; sm_90 waited at the chunk loop, see gdn_verify_impl).
  auto stage_row = [&](int rr) {
    // The row's addresses are computed here from the parameters (constant bank), not hoisted
    // out of the loop: a warp stages one or two rows, and hoisted 64-bit bases stay live
    // through the loop (d64 16-bit kernels: 96 -> 107 registers on sm_80, one CTA less per
    // SM). The opaque copies keep the compiler from hoisting them.
    int lane_r = lane, hk_r = hk, h_r = pos.h;
    asm volatile("" : "+r"(lane_r), "+r"(hk_r), "+r"(h_r));
    const uint32_t t = t0 + uint32_t(rr);
    const char* const qp = static_cast<const char*>(p.q) +
                           (uint64_t(int64_t(hk_r) * p.q_stride_h + lane_r) << sh) + uint64_t(t) * (uint64_t(p.q_stride_t) << sh);
    const char* const kp = static_cast<const char*>(p.k) +
                           (uint64_t(int64_t(hk_r) * p.k_stride_h + lane_r) << sh) + uint64_t(t) * (uint64_t(p.k_stride_t) << sh);
    const GateLane gl(p, h_r, lane_r);
    uint32_t qraw[PER_LANE], kraw[PER_LANE];
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
      qraw[e] = load_raw_at(qp, 32 * e, f32);
      kraw[e] = load_raw_at(kp, 32 * e, f32);
    }
    const uint32_t graw = gl.load(t);
    float qx[PER_LANE], kx[PER_LANE];
    float ssq = 0.f, ssk = 0.f;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
      qx[e] = raw_to_float_sel(qraw[e], cvt);
      kx[e] = raw_to_float_sel(kraw[e], cvt);
      ssq = fmaf(qx[e], qx[e], ssq);
      ssk = fmaf(kx[e], kx[e], ssk);
    }
    float rq = p.scale, rk = 1.f;
    if (p.qk_l2norm) {
      // rq = scale * rsqrt(sum q^2 + eps), rk = rsqrt(sum k^2 + eps): the same sums as
      // warp_sum (warp_sum2), the same rsqrt and multiply
      float iq, ik;
      warp_sum2(ssq, ssk, lane, [](float x) { return rsqrtf(x + 1e-6f); }, iq, ik);
      rq *= iq;
      rk = ik;
    }
    float* const jrow = p.journal + uint64_t(t) * jst;
    float* const jk = jrow + (hk_r * DK + lane_r);
    float kq = 0.f;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
      const int i = lane + 32 * e;
      const float kn = kx[e] * rk, qn = qx[e] * rq;
      st.put(rr, i, kn, qn);
      kq = fmaf(kn, qn, kq);
      if (write_k) jk[32 * e] = kn;
    }
    kq = warp_sum(kq);
    float g, beta;
    gates_of_row(p, raw_to_float_sel(graw, gl.cvt), g, beta);
    if (lane == 0) {
      st.decay[rr] = __expf(g);
      st.beta[rr] = beta;
      st.kq[rr] = kq;
      if (pos.z == 0) {
        float* const jg = jrow + (int64_t(p.num_k_heads) * DK + int64_t(p.num_v_heads) * Dv + h_r);
        jg[0] = g;
        jg[p.num_v_heads] = beta;
      }
    }
  };
  if constexpr (FIRST_ROW_OUTSIDE) {
    if (warp < nrows) stage_row(warp);
    for (int rr = warp + nwarps; rr < nrows; rr += nwarps) stage_row(rr);
  } else {
    for (int rr = warp; rr < nrows; rr += nwarps) stage_row(rr);
  }
  asm volatile("" : "+r"(h_v), "+r"(cb_v), "+r"(x_v));   // (as above: computed here, not kept live through the row loop)
  const int vr1 = x_v >> cols_log2, vc1 = x_v & (slice_cols - 1);
  // this thread's journal v entry of row vr1 (journal columns: k_hat | v | g | beta)
  float* const jv = p.journal + uint64_t(t0 + uint32_t(vr1)) * jst +
                    (int64_t(p.num_k_heads) * DK + int64_t(h_v) * Dv + cb_v + vc1);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int rr = vr1 + j * VROWS;
    if (rr < nrows) {
      const float x = raw_to_float_sel(vraw[j], cvt);
      st.v[rr][vc1] = x;
      jv[uint64_t(j * VROWS) * jst] = x;
    }
  }
}


// Verify's tile: 8 columns per thread for 16-bit states and for f32 with Dk = 128 (16 columns per
// warp: half as many CTAs as with commit's 4 for the same state, so the per-CTA work that does
// not scale with columns -- block/head divisions, addresses, q/k loads and normalisation, gates,
// journal -- is paid once per 16 columns of a warp instead of 8). f32 Dk = 64 keeps 4: there 8
// would cost 4 of its 7 CTAs per SM on sm_75-89 (70 -> 104+ registers). ops/gdn.py
// (_launch_shape) launches with 2 * verify_cj columns per warp.
template <typename TS, int DK>
__host__ __device__ constexpr int verify_cj() { return sizeof(TS) == 4 && DK == 64 ? 4 : 8; }
template <typename TS, int DK, bool VK>
using VerifyTile = StateTile<TS, DK, VK, verify_cj<TS, DK>()>;

// FUSED (gdn_verify_fused): the state is first advanced over the sequence's pending rows (the
// previous round's accepted ones, replayed from its journal exactly as gdn_commit does) and
// written back, then the block is verified from the advanced registers: one state read and one
// write per round instead of verify's read plus commit's read and write. The pending journal
// rows are staged next to the block's first chunk, before any math, so both round trips overlap
// the state loads.
struct NoStage {};
template <bool B, class T, class F> struct Pick { using type = T; };
template <class T, class F> struct Pick<false, T, F> { using type = F; };

// CJX: columns per thread (default verify_cj; the small-batch kernels pass 4: every column's sums
// are the same FMA chain and butterfly tree for any CJ, so outputs and states are the same bits).
// DOTALL (the small-batch kernels): each row's S^T k and S^T q as dot_all's per-column butterflies
// (every lane gets all CJ totals, bit-identical to reduce_scatter's) and every lane computing the
// CJ deltas, instead of reduce_scatter + one delta per lane + all_gather: 2 shuffle levels less on
// a row's dependent chain (of 6) for 2 x 11 more shuffles, which a latency-bound launch can
// afford; the fused replay likewise (replay_journal without SCATTER, as gdn_commit).
template <typename TS, int DK, bool VK, bool FUSED = false, int CJX = verify_cj<TS, DK>(), bool DOTALL = false>
__device__ __forceinline__ void gdn_verify_impl(const GdnVerifyParams& p) {
  using Tile = StateTile<TS, DK, VK, CJX>;
  constexpr int RI = Tile::RI, CJ = Tile::CJ;
  __shared__ __align__(16) RowStage<DK> st;
  __shared__ __align__(16) typename Pick<FUSED, JournalStage<DK>, NoStage>::type js;

  const VerifySlice vs = verify_slice<Tile::WARP_COLS>(p);
  const CtaSlice& cs = vs.c;
  const BlockPos pos = cs.pos;
  const int lane = cs.lane, warp = cs.warp, slice_cols = cs.slice_cols;
  const int col_base = cs.col_base, hk = cs.hk, Dv = cs.Dv;

  const VerifyRows vr = verify_rows<FUSED>(p, pos);
  const NextSlice next = next_slice(p);
  if (!vr.go) return;
  const int row0 = vr.row0, row1 = vr.row1, slot = vr.slot;
  const bool slot_ok = vr.slot_ok;
  const int qlen = row1 - row0;

  Tile tile(lane);
  // this thread's first column; its column c is col + Tile::piece_off(c)
  const int col = col_base + warp * Tile::WARP_COLS + tile.lc * Tile::SPAN;
  // (fused: written back after the replay; slot >= 0 wherever it is used)
  TS* const head = const_cast<TS*>(static_cast<const TS*>(p.state)) +
                   uint64_t(uint32_t(slot)) * uint64_t(p.state_stride_slot) + int64_t(pos.h) * DK * Dv;
  if (slot_ok) {
    // all loads in flight before any math; fused: coherent loads (this kernel writes the state)
    tile.template load_head<!FUSED>(head, col, Dv);
  }
  // fused: the pending rows' first chunk is copied (cp.async) before the block's first chunk is
  // staged; both are in flight at once (stage_journal)
  const JournalRef pj{p.pending_journal, p.pending_journal_stride_t, p.num_k_heads, p.num_v_heads};
  if constexpr (FUSED) {
    if (vr.pend_n > 0)
      stage_journal<DK, Tile::WARP_COLS>(pj, js, pos.h, hk, col_base, slice_cols, Dv, vr.pend_row0,
                                         min(kRowChunk, vr.pend_n));
  }
  const bool write_k = pos.z == 0 && vs.hk_first;   // one CTA journals each k row
  const int jc = Tile::piece_off(tile.red_col());   // (offset of) the column whose sums and output this lane holds
  // Per-thread constants of the token loop, computed once: without the opaque copies ptxas
  // rematerialises them from the lane id in every token (about 5 instructions per token).
  // Not for f32 Dk=64: there the two registers cost occupancy (sm_86/89: 72 -> 78 registers,
  // 7 -> 6 CTAs of 4 warps per SM), and ptxas's rematerialisation is the better choice.
  constexpr bool kPin = !(sizeof(TS) == 4 && DK == 64);
  int vj = col - col_base + jc, ocol = col + jc;   // this lane's v slot and output column
  if constexpr (kPin) asm volatile("" : "+r"(vj), "+r"(ocol));

  // f32 states: chunk 0 is staged before the chunk loop, its first row per warp outside the
  // row loop (stage_chunk<..., true>). With the staging loads inside those loops, ptxas put a
  // wait on the state loads' scoreboard (no register dependency: the loop heads) before the q/k
  // loads (sm_75/80/90 SASS, also before this change), so a warp paid two memory round trips,
  // state then q/k, before its first row; now all of the first row's loads issue right behind
  // the state loads. 16-bit states unpack their state loads at once (that wait comes first
  // anyway) and keep the single loop: the copies cost them registers for nothing.
  constexpr bool kPeel = sizeof(TS) == 4;
  if constexpr (kPeel)
    if (!FUSED || qlen > 0)
      stage_chunk<DK, Tile::WARP_COLS, kRowChunk, RowStage<DK>, true>(p, st, pos, row0, 0, min(kRowChunk, qlen), hk,
                                                                      slice_cols, col_base, write_k);
  // after the staging loads (its address waits for the next slot id: placed earlier, that wait
  // delayed the staging loads by a round trip, sm_90 SASS)
  prefetch_slice_l2<TS, DK, VK>(p, next, slice_cols);
  if constexpr (FUSED) {
    if (vr.pend_n > 0) {   // uniform over the CTA (its barriers)
      replay_journal<TS, Tile, DK, !DOTALL>(tile, pj, js, pos.h, hk, col_base, slice_cols, Dv, vr.pend_row0,
                                            vr.pend_n, col - col_base);
      tile.store_head(head, col, Dv);
    }
  }
  for (int c0 = 0; c0 < qlen; c0 += kRowChunk) {
    const int nrows = min(kRowChunk, qlen - c0);
    if (!kPeel || c0 > 0) {
      __syncthreads();   // the previous chunk's rows have been consumed
      stage_chunk<DK, Tile::WARP_COLS, kRowChunk>(p, st, pos, row0, c0, nrows, hk, slice_cols, col_base,
                                                  write_k);
    }
    __syncthreads();

    for (int rr = 0; rr < nrows; ++rr) {
      const int64_t t = row0 + c0 + rr;
      if constexpr (DOTALL) {
        // lane lr < CJ writes column lr of its CJ (one lane per column, 8 adjacent columns a warp)
        float kr[RI], delta[CJ], o = 0.f;
        if (slot_ok) {
          float qr[RI], sk[CJ], sq[CJ];
          tile.gather(st.k[rr], kr);
          tile.gather(st.q[rr], qr);
          tile.dot_all(kr, sk);
          tile.dot_all(qr, sq);
          const float decay = st.decay[rr], beta = st.beta[rr], kq = st.kq[rr];
#pragma unroll
          for (int c = 0; c < CJ; ++c) {
            delta[c] = delta_of(beta, st.v[rr][col - col_base + Tile::piece_off(c)], decay, sk[c]);
            const float oc = fmaf(decay, sq[c], delta[c] * kq);   // as below: S_new^T q
            if (c == tile.lr) o = oc;
          }
        }
        int ocol = 0;
#pragma unroll
        for (int c = 0; c < CJ; ++c)
          if (c == tile.lr) ocol = Tile::piece_off(c);
        if (tile.lr < CJ)
          store_dt(p.out, t * p.out_stride_t + pos.h * p.out_stride_h + (col + ocol), p.out_dtype, o);
        if (slot_ok && c0 + rr + 1 < qlen) tile.template update<TS>(st.decay[rr], kr, delta);
        continue;
      }
      float o = 0.f, delta1 = 0.f;
      float kr[RI];
      if (slot_ok) {
        float qr[RI], ak[CJ], aq[CJ];
        tile.gather(st.k[rr], kr);
        tile.gather(st.q[rr], qr);
        tile.partial_dot(kr, ak);
        tile.partial_dot(qr, aq);
        const float sk = tile.reduce_scatter(ak), sq = tile.reduce_scatter(aq);
        const float decay = st.decay[rr], beta = st.beta[rr], kq = st.kq[rr];
        // this lane's column jc only: the other lanes hold the others
        delta1 = delta_of(beta, st.v[rr][kPin ? vj : col - col_base + jc], decay, sk);
        o = fmaf(decay, sq, delta1 * kq);   // S_new^T q from the pre-token state
      }
      if (tile.red_writer())
        store_dt(p.out, t * p.out_stride_t + pos.h * p.out_stride_h + (kPin ? ocol : col + jc), p.out_dtype, o);
      if (slot_ok && c0 + rr + 1 < qlen) {
        float delta[CJ];
        tile.all_gather(delta1, delta);
        tile.template update<TS>(st.decay[rr], kr, delta);
      }
    }
  }
}

// ------------------------------------------------------------------------ gdn_verify, f32 state: chunked (WY) form
//
// For an f32 state nothing is rounded between rows, so the block can be unrolled. With
// e_t = exp(g_t), G_t = e_0..e_t, P(s,t) = e_{s+1}..e_t (P(t,t) = 1), a_t = S0^T k_t and
// b_t = S0^T q_t (S0 the stored state; rows t = 0..n-1 of a chunk):
//   delta_t = beta_t v_t - beta_t G_t a_t - sum_{s<t} beta_t P(s,t) (k_s.k_t) delta_s
//   o_t     = G_t b_t + sum_{s<=t} P(s,t) (k_s.q_t) delta_s
// (the reference's S_t = e_t S_{t-1} + k_t delta_t^T, delta_t = beta_t (v_t - e_t S_{t-1}^T k_t),
// o_t = S_t^T q_t, unrolled). The state is touched only by the 2n products S0^T k_t, S0^T q_t:
// 2n FMAs per element (8 for q = 4) instead of 4n - 2 (2 dots, a decay multiply and an update
// FMA per row), and no state rewrites. The q x q scalars (decay products times k_s.k_t,
// k_s.q_t) are computed once per CTA (wy_coefs, one warp per pair s < t); the per-column
// recurrence runs in every lane of the quad that owns the column, after a 2-shuffle quad sum.
// Outputs differ from row-by-row stepping only by float32 reassociation. A block longer than
// kRowChunk rows advances the registers by S <- G_{n-1} S + sum_t P(t,n-1) k_t delta_t^T
// between chunks. 16-bit states keep the row-by-row path (their outputs depend on the state
// rounded after every row, which this form does not reproduce).

// Rows per WY chunk: 4 keeps the 2 x 4 products, the recurrence and the state in 128
// registers (8 spilled); a longer block pays 1 + 4 FMAs per element to advance the
// registers every 4 rows (q = 8: 16 + 5 instead of 30 row by row).
constexpr int kWyRows = 4;
static_assert(kWyRows <= kRowChunk, "a WY chunk is staged at once");

template <int DK>
struct WyStage {
  static constexpr int R = DK / 4;
  static constexpr int STRIDE = DK + 16;
  __device__ __forceinline__ static int idx(int i) { return i + 4 * (i / R); }   // = WyTile::pad
  __device__ __forceinline__ void put(int rr, int i, float kn, float qn) {
    k[rr][idx(i)] = kn;
    q[rr][idx(i)] = qn;
  }
  float k[kWyRows][STRIDE];    // normalised k, padded (WyTile::gather)
  float q[kWyRows][STRIDE];    // normalised q * scale, padded
  float v[kWyRows][kMaxSliceCols];
  float decay[kWyRows];        // exp(g)
  float beta[kWyRows];
  float kq[kWyRows];           // k_t . q_t
  float cd[kWyRows][kWyRows];  // [t][s], s < t: -beta_t P(s,t) (k_s . k_t) (a row: one LDS.128)
  float co[kWyRows][kWyRows];  // [t][s], s <= t: P(s,t) (k_s . q_t)
  float4 cr[kWyRows];          // [t]: beta_t, -beta_t G_t, G_t, P(t, n-1)
};

// The chunk's q x q coefficients, from the staged rows (after the staging barrier).
template <int DK>
__device__ __forceinline__ void wy_coefs(WyStage<DK>& st, int nrows) {
  constexpr int PER_LANE = DK / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int npairs = nrows * (nrows - 1) / 2;   // (s, t), s < t: pi = t (t-1)/2 + s
  for (int pi = warp; pi < npairs; pi += nwarps) {
    int t = 1;
    while (t * (t + 1) / 2 <= pi) ++t;
    const int s = pi - t * (t - 1) / 2;
    float kk = 0.f, kq = 0.f;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
      const int i = WyStage<DK>::idx(lane + 32 * e);
      const float ks = st.k[s][i];
      kk = fmaf(ks, st.k[t][i], kk);
      kq = fmaf(ks, st.q[t][i], kq);
    }
    kk = warp_sum(kk);
    kq = warp_sum(kq);
    if (lane == 0) {
      float P = 1.f;
      for (int i = s + 1; i <= t; ++i) P *= st.decay[i];
      st.cd[t][s] = -st.beta[t] * (P * kk);
      st.co[t][s] = P * kq;
    }
  }
  // per row: one lane each, in the warp that got the fewest pairs
  if (warp == nwarps - 1 && lane < nrows) {
    const int t = lane;
    float G = 1.f, Pn = 1.f;
    for (int i = 0; i <= t; ++i) G *= st.decay[i];
    for (int i = t + 1; i < nrows; ++i) Pn *= st.decay[i];
    const float beta = st.beta[t];
    st.cr[t] = make_float4(beta, -beta * G, G, Pn);
    st.co[t][t] = st.kq[t];
  }
}

// The NR (= nrows) rows of one chunk: the 2 NR state products, then (after the
// coefficient barrier) the per-column recurrence and the outputs; with `more`, the state
// registers advanced over the chunk for the next one.
template <int NR, int DK, bool VK>
__device__ __forceinline__ void wy_chunk(const GdnVerifyParams& p, WyTile<DK, VK>& tile, WyStage<DK>& st,
                                         bool slot_ok, bool more, int64_t ob, int vj) {
  using Tile = WyTile<DK, VK>;
  constexpr int R = Tile::R;
  float a[NR], b[NR];
  if (slot_ok) {
#pragma unroll
    for (int t = 0; t < NR; ++t) {
      float x[R];
      tile.gather(st.k[t], x);
      a[t] = tile.partial_dot(x);
      tile.gather(st.q[t], x);
      b[t] = tile.partial_dot(x);
    }
#pragma unroll
    for (int t = 0; t < NR; ++t) {
      a[t] = Tile::quad_sum(a[t]);
      b[t] = Tile::quad_sum(b[t]);
    }
  }
  __syncthreads();   // wy_coefs' results are visible
  float d[NR];
#pragma unroll
  for (int t = 0; t < NR; ++t) {
    float o = 0.f;
    if (slot_ok) {
      const float4 cr = st.cr[t];
      const float4 cd4 = *reinterpret_cast<const float4*>(st.cd[t]);
      const float4 co4 = *reinterpret_cast<const float4*>(st.co[t]);
      const float cd[4] = {cd4.x, cd4.y, cd4.z, cd4.w}, co[4] = {co4.x, co4.y, co4.z, co4.w};
      float x = fmaf(cr.y, a[t], cr.x * st.v[t][vj]);
#pragma unroll
      for (int s = 0; s < t; ++s) x = fmaf(cd[s], d[s], x);
      d[t] = x;
      o = cr.z * b[t];
#pragma unroll
      for (int s = 0; s <= t; ++s) o = fmaf(co[s], d[s], o);
    }
    if (tile.lr == 0) store_dt(p.out, ob + t * p.out_stride_t, p.out_dtype, o);
  }
  if (slot_ok && more) {
    float w[NR];
#pragma unroll
    for (int t = 0; t < NR; ++t) w[t] = st.cr[t].w * d[t];
    const float G = st.cr[NR - 1].z;
#pragma unroll
    for (int r = 0; r < R; ++r) tile.s[r] *= G;
#pragma unroll
    for (int t = 0; t < NR; ++t) {
      float x[R];
      tile.gather(st.k[t], x);
#pragma unroll
      for (int r = 0; r < R; ++r) tile.s[r] = fmaf(x[r], w[t], tile.s[r]);
    }
  }
}

template <int DK, bool VK>
__device__ __forceinline__ void gdn_verify_wy_impl(const GdnVerifyParams& p) {
  using Tile = WyTile<DK, VK>;
  __shared__ __align__(16) WyStage<DK> st;

  const VerifySlice vs = verify_slice<Tile::WARP_COLS>(p);
  const CtaSlice& cs = vs.c;
  const BlockPos pos = cs.pos;
  const int lane = cs.lane, warp = cs.warp, slice_cols = cs.slice_cols;
  const int col_base = cs.col_base, hk = cs.hk, Dv = cs.Dv;

  const VerifyRows vr = verify_rows(p, pos);
  if (!vr.go) return;
  const int row0 = vr.row0, row1 = vr.row1, slot = vr.slot;
  const bool slot_ok = vr.slot_ok;
  const int qlen = row1 - row0;

  Tile tile(lane);
  const int col = col_base + warp * Tile::WARP_COLS + tile.lc;   // this thread's column
  if (slot_ok) {
    const float* head = static_cast<const float*>(p.state) + slot * p.state_stride_slot +
                        int64_t(pos.h) * DK * Dv;
    tile.template load<true>(head, col, Dv);   // all loads in flight before any math
  }
  const bool write_k = pos.z == 0 && vs.hk_first;   // one CTA journals each k row
  const int64_t ob = int64_t(pos.h) * p.out_stride_h + col;   // out index of row 0, this column

  for (int c0 = 0; c0 < qlen; c0 += kWyRows) {
    const int nrows = min(kWyRows, qlen - c0);
    __syncthreads();   // the previous chunk's rows have been consumed
    stage_chunk<DK, Tile::WARP_COLS, kWyRows>(p, st, pos, row0, c0, nrows, hk, slice_cols, col_base,
                                              write_k);
    __syncthreads();
    wy_coefs<DK>(st, nrows);
    const bool more = c0 + nrows < qlen;
    const int64_t ob_c = (row0 + c0) * p.out_stride_t + ob;   // out index of the chunk's row 0
    const int vj = col - col_base;
    static_assert(kWyRows == 4, "the dispatch below and wy_chunk's float4 rows assume 4 rows");
    switch (nrows) {   // uniform over the CTA; every case has the same barriers
      case 1: wy_chunk<1>(p, tile, st, slot_ok, more, ob_c, vj); break;
      case 2: wy_chunk<2>(p, tile, st, slot_ok, more, ob_c, vj); break;
      case 3: wy_chunk<3>(p, tile, st, slot_ok, more, ob_c, vj); break;
      default: wy_chunk<4>(p, tile, st, slot_ok, more, ob_c, vj); break;
    }
  }
}

// SPECDEC_GDN_F32_WY 1 selects the chunked (WY) verify for f32 states. Off by default for
// now: capped at 128 registers (4 CTAs of 4 warps per SM) ptxas spills 16-56 bytes around
// the chunk barriers of the Dk=128 kernels (sm_90; not in the FMA loops), and the path has
// not run on a GPU yet (docs/PERF.md, gdn, pass 2026-12). 0: row-by-row verify for every dtype.
#ifndef SPECDEC_GDN_F32_WY
#define SPECDEC_GDN_F32_WY 0
#endif
#if SPECDEC_GDN_F32_WY
// WyTile owns 8 columns per warp; ops/gdn.py (_launch_shape) now launches f32 verify with
// VerifyTile's 16. Both would have to agree before this path can be switched on again.
#error "SPECDEC_GDN_F32_WY needs ops/gdn.py to launch f32 verify with 8 columns per warp"
#endif

template <typename TS, int DK, bool VK>
__device__ __forceinline__ void gdn_verify_dispatch(const GdnVerifyParams& p) {
  if constexpr (sizeof(TS) == 4 && SPECDEC_GDN_F32_WY) {
    gdn_verify_wy_impl<DK, VK>(p);
  } else {
    gdn_verify_impl<TS, DK, VK>(p);
  }
}

// ------------------------------------------------------------------------ gdn_commit

// Commit's tile: the same columns per thread as verify's (verify_cj: 8 for f32 Dk = 128, which
// halves the CTAs and with them the per-CTA prologue, index math and journal staging per column)
// except f32 "vk" Dk = 128, which keeps 4 (8 takes 127 registers there: 5 -> 4 CTAs of 4 warps
// per SM on sm_75-90; "kv" stays at 4 CTAs), and verify's column placement (StateTile::piece_off,
// load_head / store_head: each kv load and store instruction covers 32 contiguous bytes per lane
// pair). Each column's S^T k is dot_all's
// per-column FMA chain over the same rows and the same butterfly for any CJ, and the delta and
// update are per column / element, so the state is bit-identical to the 4-column commit's.
template <typename TS, int DK, bool VK>
__host__ __device__ constexpr int commit_cj() { return sizeof(TS) == 4 && VK ? 4 : verify_cj<TS, DK>(); }
template <typename TS, int DK, bool VK>
using CommitTile = StateTile<TS, DK, VK, commit_cj<TS, DK, VK>()>;

// A commit's rows, slot and accept length, checked; the status of the sequence is written here
// (gdn_commit, both state widths). go: valid and at least one row to replay.
struct CommitRows {
  int row0, slot, n;
  bool go;
};

__device__ __forceinline__ CommitRows commit_rows(const GdnCommitParams& p, const BlockPos& pos) {
  CommitRows c;
  c.row0 = __ldg(p.cu_q + pos.b);
  const int row1 = __ldg(p.cu_q + pos.b + 1);
  c.slot = __ldg(p.slot_ids + pos.b);
  c.n = __ldg(p.accept_len + pos.b);
  const bool rows_ok = 0 <= c.row0 && c.row0 <= row1 && row1 <= p.num_rows;
  const bool acc_ok = 0 <= c.n && c.n <= row1 - c.row0;
  const bool slot_ok = c.slot >= 0 && c.slot < p.num_slots;
  if (p.status != nullptr && pos.z == 0 && pos.h == 0 && threadIdx.x == 0)
    p.status[pos.b] = (rows_ok ? 0 : SPECDEC_GDN_BAD_ROWS) |
                      (rows_ok && !acc_ok ? SPECDEC_GDN_BAD_ACCEPT : 0) |
                      (c.slot >= p.num_slots ? SPECDEC_GDN_BAD_SLOT : 0);
  c.go = rows_ok && acc_ok && slot_ok && c.n != 0;
  return c;
}

// One CTA's commit of its state slice, for either tile family (defined below, after MmaTile's
// staging): gdn_commit_impl is its CUDA-core instance, gdn_commit_mma_impl its tensor-core one.
// CJX: the CUDA-core tile's columns per thread (default commit_cj; the small-batch kernels: 4).
template <typename TS, int DK, bool VK, bool MMA, int CJX = commit_cj<TS, DK, VK>()>
__device__ __forceinline__ void gdn_commit_slice(const GdnCommitParams& p);

template <typename TS, int DK, bool VK>
__device__ __forceinline__ void gdn_commit_impl(const GdnCommitParams& p) {
  gdn_commit_slice<TS, DK, VK, false>(p);
}

// 16-bit states keep session 4's commit (SASS byte-identical to it): the staging above takes up
// to 10 more registers with them (sm_75 vk d64 bf16: 79 -> 89, 6 -> 5 CTAs of 4 warps per SM)
// and they wait for their state loads (unpacking) before staging anyway.
template <typename TS, int DK, bool VK>
__device__ __forceinline__ void gdn_commit_packed_impl(const GdnCommitParams& p) {
  using Tile = StateTile<TS, DK, VK>;
  constexpr int RI = Tile::RI, CJ = Tile::CJ;
  constexpr int PER_LANE = DK / 32;
  __shared__ __align__(16) float sk_rows[kRowChunk][DK];
  __shared__ float sv_rows[kRowChunk][kMaxSliceCols];
  __shared__ float sdecay[kRowChunk], sbeta[kRowChunk];

  const CtaSlice cs = cta_slice<Tile::WARP_COLS>(p);
  const BlockPos pos = cs.pos;
  const int lane = cs.lane, warp = cs.warp, nwarps = cs.nwarps, slice_cols = cs.slice_cols;
  const int col_base = cs.col_base, group = cs.group, hk = cs.hk, Dv = cs.Dv;

  const CommitRows cr = commit_rows(p, pos);
  const int row0 = cr.row0, slot = cr.slot, n = cr.n;
  const NextSlice next = next_slice(p);
  if (!cr.go) return;   // state untouched, not even read

  Tile tile(lane);
  const int col = col_base + warp * Tile::WARP_COLS + tile.lc * CJ;
  TS* head = static_cast<TS*>(p.state) + slot * p.state_stride_slot + int64_t(pos.h) * DK * Dv;
  tile.template load<false>(head, col, Dv);
  prefetch_slice_l2<TS, DK, VK>(p, next, slice_cols);
  const int64_t jv = int64_t(p.num_k_heads) * DK;
  const int64_t jg = jv + int64_t(p.num_v_heads) * Dv;
  const int64_t jb = jg + p.num_v_heads;

  for (int c0 = 0; c0 < n; c0 += kRowChunk) {
    const int nrows = min(kRowChunk, n - c0);
    __syncthreads();
    // All journal loads of the chunk in flight before the first is used (as in verify).
    // Keep the division here (not verify's shift/mask): with e >> log2, e & (cols - 1) ptxas
    // if-converts the loads and makes the first one wait on the state loads' scoreboard (SASS
    // LDG wait mask), so the journal round trip came after the state's: commit f32 kv 91 ->
    // 102 us, vk 78 -> 87 (H200, d24c791). The division keeps them in flight together.
    constexpr int VPT = kRowChunk * Tile::WARP_COLS / 32;   // v entries per thread, at most
    float vrow[VPT];
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int e = threadIdx.x + j * blockDim.x;
      vrow[j] = 0.f;
      if (e < nrows * slice_cols) {
        const int rr = e / slice_cols, jj = e - rr * slice_cols;
        vrow[j] = __ldg(p.journal + (row0 + c0 + rr) * p.journal_stride_t + jv + int64_t(pos.h) * Dv +
                        col_base + jj);
      }
    }
    for (int rr = warp; rr < nrows; rr += nwarps) {
      const float* jrow = p.journal + (row0 + c0 + rr) * p.journal_stride_t;
      float kx[PER_LANE];
#pragma unroll
      for (int e = 0; e < PER_LANE; ++e) kx[e] = __ldg(jrow + hk * DK + lane + 32 * e);
      const float gb = __ldg(jrow + ((lane & 1) ? jb : jg) + pos.h);   // lane 0: g, lane 1: beta
#pragma unroll
      for (int e = 0; e < PER_LANE; ++e) sk_rows[rr][lane + 32 * e] = kx[e];
      if (lane == 0) sdecay[rr] = __expf(gb);
      if (lane == 1) sbeta[rr] = gb;
    }
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int e = threadIdx.x + j * blockDim.x;
      if (e < nrows * slice_cols) {
        const int rr = e / slice_cols, jj = e - rr * slice_cols;
        sv_rows[rr][jj] = vrow[j];
      }
    }
    __syncthreads();
    for (int rr = 0; rr < nrows; ++rr) {
      // the same S^T k sums (dot_all == reduce_scatter bit for bit) and delta as gdn_verify
      float kr[RI], sk[CJ], delta[CJ];
      tile.gather(sk_rows[rr], kr);
      tile.dot_all(kr, sk);
      const float decay = sdecay[rr], beta = sbeta[rr];
#pragma unroll
      for (int c = 0; c < CJ; ++c) delta[c] = delta_of(beta, sv_rows[rr][col - col_base + c], decay, sk[c]);
      tile.template update<TS>(decay, kr, delta);
    }
  }
  tile.store(head, col, Dv);
}

template <typename TS, int DK, bool VK>
__device__ __forceinline__ void gdn_commit_dispatch(const GdnCommitParams& p) {
  if constexpr (sizeof(TS) == 4) {
    gdn_commit_impl<TS, DK, VK>(p);
  } else {
    gdn_commit_packed_impl<TS, DK, VK>(p);
  }
}

// ------------------------------------------------------------------------ 16-bit states on the tensor cores
//
// gdn_{verify,commit,verify_fused}_mma_*: the same ops for bf16 / f16 states with MmaTile
// (gdn_tile.cuh): each row's S^T k and S^T q as 16 (Dk 128) m16n8k8 tf32 mmas per warp over the
// exact 16-bit state and split f32 vectors, instead of 128 FFMAs plus reduce_scatter's shuffle
// trees; the update and its per-row rounding are unchanged in kind (one FMUL + FFMA per element,
// rounded in pairs). The three kernels share the row step (dots, delta, update), so verify's
// outputs, commit's states and the fused kernel's are bit-identical to one-row decoding with the
// same kernels, as for the CUDA-core kernels (the two families differ in the last bits of the
// sums: pick one per pool; ops/gdn.py's switch picks one for every call). sm_80+; the compute_75
// build of these names runs the CUDA-core implementation.

// Verify's staging for MmaTile: per row the padded normalised k (the update's operand) and the B
// columns k_hi, k_lo, q_hi, q_lo (split_tf32), a zero vector for the mma's unused columns.
template <int DK>
struct MmaRowStage {
  using Tile = MmaTile<__half, DK, false>;   // (only its staging constants)
  static constexpr int VLEN = Tile::VLEN;
  __device__ __forceinline__ void put(int rr, int i, float kn, float qn) {
    const int j = Tile::pad(i);
    k[rr][j] = kn;
    split_tf32(kn, b[rr][0][j], b[rr][1][j]);
    split_tf32(qn, b[rr][2][j], b[rr][3][j]);
  }
  float k[kRowChunk][VLEN];
  float b[kRowChunk][4][VLEN];
  float zero[VLEN];
  float v[kRowChunk][kMaxSliceCols];
  float decay[kRowChunk];
  float beta[kRowChunk];
  float kq[kRowChunk];
};

// The replay's staging: k_hat padded (cp.async lands it there: kpos), then split into B columns.
template <int DK>
struct MmaJournalStage {
  using Tile = MmaTile<__half, DK, false>;
  static constexpr int VLEN = Tile::VLEN;
  __device__ __forceinline__ static int kpos(int i) { return Tile::pad(i); }
  float k[kRowChunk][VLEN];
  float b[kRowChunk][2][VLEN];
  float zero[VLEN];
  float v[kRowChunk][kMaxSliceCols];
  float g[kRowChunk], beta[kRowChunk];
};

template <int VLEN>
__device__ __forceinline__ void zero_fill(float (&z)[VLEN]) {
  for (int i = threadIdx.x; i < VLEN; i += blockDim.x) z[i] = 0.f;
}

// delta of the lane pair's two columns, computed in the t = 0 lanes (which hold S^T k) and sent to
// the other 3 lanes of the quad: the update's operands in every lane.
__device__ __forceinline__ void quad_delta(float beta, float decay, float v0, float v1, float x0, float x1,
                                           float& d0, float& d1) {
  const int src = (threadIdx.x & 31) & ~3;
  d0 = __shfl_sync(0xffffffffu, delta_of(beta, v0, decay, x0), src);
  d1 = __shfl_sync(0xffffffffu, delta_of(beta, v1, decay, x1), src);
}

// gdn_commit's replay (and the fused kernel's) on MmaTile: rows t0 .. t0+n-1, chunk 0 staged by
// stage_journal and not yet synchronised; js.zero filled. vj: the lane's first column in the slice.
template <typename TS, int DK, bool VK>
__device__ __forceinline__ void mma_replay(MmaTile<TS, DK, VK>& tile, const JournalRef& jr, MmaJournalStage<DK>& js,
                                           int h, int hk, int col_base, int slice_cols, int Dv, int t0, int n,
                                           int vj) {
  using Tile = MmaTile<TS, DK, VK>;
  for (int c0 = 0; c0 < n; c0 += kRowChunk) {
    const int nrows = min(kRowChunk, n - c0);
    if (c0 > 0) {
      __syncthreads();   // the previous chunk's rows have been consumed
      stage_journal<DK, Tile::WARP_COLS>(jr, js, h, hk, col_base, slice_cols, Dv, t0 + c0, nrows);
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int e = threadIdx.x; e < nrows * DK; e += blockDim.x) {   // the B columns of the staged rows
      const int rr = e / DK, j = Tile::pad(e % DK);
      split_tf32(js.k[rr][j], js.b[rr][0][j], js.b[rr][1][j]);
    }
    __syncthreads();
    for (int rr = 0; rr < nrows; ++rr) {
      float x0, x1, d0, d1, kr[Tile::RI];
      tile.template dots<2>(js.b[rr][0], js.zero, x0, x1);
      const float decay = __expf(js.g[rr]), beta = js.beta[rr];
      quad_delta(beta, decay, js.v[rr][vj], js.v[rr][vj + 1], x0, x1, d0, d1);
      tile.gather(js.k[rr], kr);
      tile.template update<TS>(decay, kr, d0, d1);
    }
  }
}

template <typename TS, int DK, bool VK, bool FUSED>
__device__ __forceinline__ void gdn_verify_mma_impl(const GdnVerifyParams& p) {
  using Tile = MmaTile<TS, DK, VK>;
  __shared__ __align__(16) MmaRowStage<DK> st;
  __shared__ __align__(16) typename Pick<FUSED, MmaJournalStage<DK>, NoStage>::type js;

  const VerifySlice vs = verify_slice<Tile::WARP_COLS>(p);
  const CtaSlice& cs = vs.c;
  const BlockPos pos = cs.pos;
  const int lane = cs.lane, warp = cs.warp, slice_cols = cs.slice_cols;
  const int col_base = cs.col_base, hk = cs.hk, Dv = cs.Dv;

  const VerifyRows vr = verify_rows<FUSED>(p, pos);
  const NextSlice next = next_slice(p);
  if (!vr.go) return;
  const int row0 = vr.row0, row1 = vr.row1, slot = vr.slot;
  const bool slot_ok = vr.slot_ok;
  const int qlen = row1 - row0;

  Tile tile(lane);
  const int vj = warp * Tile::WARP_COLS + 2 * tile.g;   // the lane's first column in the slice
  const int colw = col_base + warp * Tile::WARP_COLS;   // the warp's first column in the head
  TS* const head = const_cast<TS*>(static_cast<const TS*>(p.state)) +
                   uint64_t(uint32_t(slot)) * uint64_t(p.state_stride_slot) + int64_t(pos.h) * DK * Dv;
  if (slot_ok) tile.template load_head<!FUSED>(head, colw, Dv);
  const JournalRef pj{p.pending_journal, p.pending_journal_stride_t, p.num_k_heads, p.num_v_heads};
  if constexpr (FUSED) {
    if (vr.pend_n > 0)
      stage_journal<DK, Tile::WARP_COLS>(pj, js, pos.h, hk, col_base, slice_cols, Dv, vr.pend_row0,
                                         min(kRowChunk, vr.pend_n));
    zero_fill(js.zero);
  }
  zero_fill(st.zero);   // (visible after the first barrier: the replay's or the chunk loop's)
  const bool write_k = pos.z == 0 && vs.hk_first;
  prefetch_slice_l2<TS, DK, VK>(p, next, slice_cols);
  if constexpr (FUSED) {
    if (vr.pend_n > 0) {   // uniform over the CTA (its barriers)
      mma_replay(tile, pj, js, pos.h, hk, col_base, slice_cols, Dv, vr.pend_row0, vr.pend_n, vj);
      tile.store_head(head, colw, Dv);
    }
  }
  const int64_t ob = int64_t(pos.h) * p.out_stride_h + col_base + vj;   // out index of row 0, column vj
  for (int c0 = 0; c0 < qlen; c0 += kRowChunk) {
    const int nrows = min(kRowChunk, qlen - c0);
    __syncthreads();   // the previous chunk's rows have been consumed
    stage_chunk<DK, Tile::WARP_COLS, kRowChunk>(p, st, pos, row0, c0, nrows, hk, slice_cols, col_base, write_k);
    __syncthreads();
    for (int rr = 0; rr < nrows; ++rr) {
      const int64_t t = row0 + c0 + rr;
      float x0 = 0.f, x1 = 0.f;
      if (slot_ok) tile.template dots<4>(st.b[rr][0], st.zero, x0, x1);   // t = 0 lanes: S^T k; t = 1: S^T q
      const float decay = st.decay[rr], beta = st.beta[rr], kq = st.kq[rr];
      float d0, d1;
      quad_delta(beta, decay, st.v[rr][vj], st.v[rr][vj + 1], x0, x1, d0, d1);
      if (tile.t == 1) {   // o = S_new^T q from the pre-token state, as gdn_verify_impl
        const float o0 = slot_ok ? fmaf(decay, x0, d0 * kq) : 0.f, o1 = slot_ok ? fmaf(decay, x1, d1 * kq) : 0.f;
        store_dt(p.out, t * p.out_stride_t + ob, p.out_dtype, o0);
        store_dt(p.out, t * p.out_stride_t + ob + 1, p.out_dtype, o1);
      }
      if (slot_ok && c0 + rr + 1 < qlen) {
        float kr[Tile::RI];
        tile.gather(st.k[rr], kr);
        tile.template update<TS>(decay, kr, d0, d1);
      }
    }
  }
}

// One CTA's commit of its state slice, for either tile family: the CUDA-core CommitTile (a
// thread's columns SPAN apart) or, MMA, the tensor-core MmaTile (a warp's columns as one mma
// tile, whose replay also reads the stage's zero rows). Only the column bookkeeping and the
// replay differ; the prologue, the staging and the L2 prefetch of the next slice are shared.
template <typename TS, int DK, bool VK, bool MMA, int CJX>
__device__ __forceinline__ void gdn_commit_slice(const GdnCommitParams& p) {
  using Tile = std::conditional_t<MMA, MmaTile<TS, DK, VK>, StateTile<TS, DK, VK, CJX>>;
  using Stage = std::conditional_t<MMA, MmaJournalStage<DK>, JournalStage<DK>>;
  constexpr int WC = Tile::WARP_COLS;
  __shared__ __align__(16) Stage js;

  const VerifySlice vs = verify_slice<WC>(p);
  const CtaSlice& cs = vs.c;
  const BlockPos pos = cs.pos;
  const int lane = cs.lane, warp = cs.warp, slice_cols = cs.slice_cols;
  const int col_base = cs.col_base, hk = cs.hk, Dv = cs.Dv;

  const CommitRows cr = commit_rows(p, pos);
  const int row0 = cr.row0, slot = cr.slot, n = cr.n;
  const NextSlice next = next_slice(p);
  if (!cr.go) return;   // state untouched, not even read

  Tile tile(lane);
  // vj: the thread's first column in the slice; col: where the tile's columns start in the head
  // (CommitTile: column c at col + piece_off(c); MmaTile: the warp's first column)
  int vj, col;
  if constexpr (MMA) {
    vj = warp * WC + 2 * tile.g;
    col = col_base + warp * WC;
  } else {
    vj = warp * WC + tile.lc * Tile::SPAN;
    col = col_base + vj;
  }
  TS* const head = static_cast<TS*>(p.state) + uint64_t(uint32_t(slot)) * uint64_t(p.state_stride_slot) +
                   int64_t(pos.h) * DK * Dv;
  tile.template load_head<false>(head, col, Dv);
  const JournalRef jr{p.journal, p.journal_stride_t, p.num_k_heads, p.num_v_heads};
  stage_journal<DK, WC>(jr, js, pos.h, hk, col_base, slice_cols, Dv, row0, min(kRowChunk, n));
  if constexpr (MMA) zero_fill(js.zero);
  prefetch_slice_l2<TS, DK, VK>(p, next, slice_cols);   // (after the staging loads, as in verify)
  if constexpr (MMA) mma_replay(tile, jr, js, pos.h, hk, col_base, slice_cols, Dv, row0, n, vj);
  else replay_journal<TS, Tile, DK>(tile, jr, js, pos.h, hk, col_base, slice_cols, Dv, row0, n, vj);
  tile.store_head(head, col, Dv);
}

template <typename TS, int DK, bool VK>
__device__ __forceinline__ void gdn_commit_mma_impl(const GdnCommitParams& p) {
  gdn_commit_slice<TS, DK, VK, true>(p);
}

template <typename TS, int DK, bool VK, bool FUSED>
__device__ __forceinline__ void gdn_verify_mma_dispatch(const GdnVerifyParams& p) {
#if __CUDA_ARCH__ >= 800
  gdn_verify_mma_impl<TS, DK, VK, FUSED>(p);
#else
  if constexpr (FUSED) gdn_verify_impl<TS, DK, VK, true>(p);
  else gdn_verify_dispatch<TS, DK, VK>(p);
#endif
}

template <typename TS, int DK, bool VK>
__device__ __forceinline__ void gdn_commit_mma_dispatch(const GdnCommitParams& p) {
#if __CUDA_ARCH__ >= 800
  gdn_commit_mma_impl<TS, DK, VK>(p);
#else
  gdn_commit_dispatch<TS, DK, VK>(p);
#endif
}

// ------------------------------------------------------------------------ small batches
//
// gdn_{verify,commit,verify_fused}_small_*: the CUDA-core kernels above for launches that do not
// fill the GPU (ops/gdn.py _small_batch: B * Hv <= TUNING["small_heads"]; at B = 1, Hv = 32 the
// default shape is 256 one-warp CTAs, each a serial latency chain). Nothing in the math differs;
//  * 4 columns per thread (8 per warp, kSmallCj) for every state: a row step's FMA/shuffle chain
//    per warp is about half as long (f32 Dk 128 verify: 2 x 32 + 32 + 32 FMA-pipe instructions and
//    10 shuffles per row instead of 2 x 64 + 64 + 64 and 16). Each column's S^T k / S^T q is the
//    same FMA chain over the same rows and the same butterfly tree for any CJ (StateTile), and the
//    delta and the rounded update are per column / element, so outputs, journals and states are
//    bit-identical to the default kernels' (a pool may mix both, round by round);
//  * the host launches them with 4 warps (8 for blocks longer than 4 rows): stage_chunk gives each
//    warp one block row, so the rows' loads and norm / gate reductions run side by side instead of
//    one after the other in a one-warp CTA;
//  * on sm_90, before griddepcontrol.wait (the previous launch may still be running): the CTA's own
//    state slice is prefetched into L2 (prefetch_slice_l2). Only a prefetch: the state may be
//    written by that very launch (a gdn_commit or fused verify on the same pool), and L2 is where
//    global memory is coherent, so a prefetch can never make a later load stale; register loads of
//    the state before the wait could. The slot id is read L2-only (ld.global.cg) so that no line of
//    slot_ids fetched before the wait is left in L1 for the reads after it; a stale id only
//    prefetches the wrong slice (bounds-checked: an address inside the pool).
constexpr int kSmallCj = 4;
constexpr int kSmallWarpCols = 2 * kSmallCj;

template <typename TS, int DK, bool VK, typename P>
__device__ __forceinline__ void small_prologue(const P& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t x = blockIdx.x, ns = uint32_t(p.num_slices), hv = uint32_t(p.num_v_heads);
  const uint32_t bh = x / ns, b = bh / hv;
  NextSlice n;
  n.z = x - bh * ns;
  n.h = bh - b * hv;
  const int slot = __ldcg(p.slot_ids + b);
  n.slot = slot >= 0 && slot < p.num_slots ? slot : -1;
  prefetch_slice_l2<TS, DK, VK>(p, n, int(blockDim.x >> 5) * kSmallWarpCols);
#endif
  specdec::pdl_begin();
}

}  // namespace

// Kernel names: gdn_{verify,commit,verify_fused}_{kv,vk}_d{64,128}_{f32,f16,bf16} (state layout, Dk,
// state dtype); input dtypes are run-time codes (they only touch the staging code).
// VMINB: the minimum CTAs of kMaxThreads per SM of both kernels. f32 Dk = 128 gets 2, i.e. at
// most 128 registers (4 CTAs of 4 warps per SM) for their 8 columns per thread.
#define SPECDEC_GDN_KERNELS(TS, TNAME, DK, VK, LNAME, VMINB)                                   \
  extern "C" __global__ void __launch_bounds__(kMaxThreads, VMINB)                                \
      gdn_verify_##LNAME##_d##DK##_##TNAME(const GdnVerifyParams p) { specdec::pdl_begin();                          \
    gdn_verify_dispatch<TS, DK, VK>(p);                                                        \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(kMaxThreads, VMINB)                                \
      gdn_commit_##LNAME##_d##DK##_##TNAME(const GdnCommitParams p) { specdec::pdl_begin();                          \
    gdn_commit_dispatch<TS, DK, VK>(p);                                                        \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(kMaxThreads, VMINB)                                \
      gdn_verify_fused_##LNAME##_d##DK##_##TNAME(const GdnVerifyParams p) { specdec::pdl_begin();                    \
    gdn_verify_impl<TS, DK, VK, true>(p);                                                      \
  }

#define SPECDEC_GDN_LAYOUTS(TS, TNAME, DK, VMINB)        \
  SPECDEC_GDN_KERNELS(TS, TNAME, DK, false, kv, VMINB)   \
  SPECDEC_GDN_KERNELS(TS, TNAME, DK, true, vk, VMINB)

// 16-bit states only: the tensor-core kernels (gdn_*_mma_*, see gdn_verify_mma_impl). VMINB:
// verify and commit; FMINB: the fused kernel. Dk = 128 gets 2 for all three (at most 128
// registers: 4 CTAs of 4 warps per SM; uncapped sm_90 took 136 for verify and 155 for the fused
// kernel, 3 CTAs; capped, no stack or spills on sm_75/80/86/90).
#define SPECDEC_GDN_MMA_KERNELS(TS, TNAME, DK, VK, LNAME, VMINB, FMINB)                        \
  extern "C" __global__ void __launch_bounds__(kMaxThreads, VMINB)                                \
      gdn_verify_mma_##LNAME##_d##DK##_##TNAME(const GdnVerifyParams p) { specdec::pdl_begin();                      \
    gdn_verify_mma_dispatch<TS, DK, VK, false>(p);                                             \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(kMaxThreads, VMINB)                                \
      gdn_commit_mma_##LNAME##_d##DK##_##TNAME(const GdnCommitParams p) { specdec::pdl_begin();                      \
    gdn_commit_mma_dispatch<TS, DK, VK>(p);                                                    \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(kMaxThreads, FMINB)                                \
      gdn_verify_fused_mma_##LNAME##_d##DK##_##TNAME(const GdnVerifyParams p) { specdec::pdl_begin();                \
    gdn_verify_mma_dispatch<TS, DK, VK, true>(p);                                              \
  }

#define SPECDEC_GDN_DIMS(TS, TNAME, VMINB)                             \
  SPECDEC_GDN_LAYOUTS(TS, TNAME, 64, VMINB)                            \
  SPECDEC_GDN_LAYOUTS(TS, TNAME, 128, VMINB)                           \
  SPECDEC_GDN_MMA_KERNELS(TS, TNAME, 64, false, kv, 1, 1)              \
  SPECDEC_GDN_MMA_KERNELS(TS, TNAME, 64, true, vk, 1, 1)               \
  SPECDEC_GDN_MMA_KERNELS(TS, TNAME, 128, false, kv, 2, 2)             \
  SPECDEC_GDN_MMA_KERNELS(TS, TNAME, 128, true, vk, 2, 2)

SPECDEC_GDN_LAYOUTS(float, f32, 64, 1)
// f32 Dk = 128, 8 columns per thread (verify and commit): capped at 128 registers (4 CTAs of 4
// warps per SM, as with 4 columns); uncapped ptxas takes 141-166 for verify (3 CTAs).
SPECDEC_GDN_LAYOUTS(float, f32, 128, 2)
SPECDEC_GDN_DIMS(__half, f16, 1)
SPECDEC_GDN_DIMS(bf16_t, bf16, 1)

// The small-batch kernels (see small_prologue), every CUDA-core state / layout / Dk: one CTA per SM
// or two at the sizes they are launched for, so no register cap.
#define SPECDEC_GDN_SMALL_KERNELS(TS, TNAME, DK, VK, LNAME)                                        \
  extern "C" __global__ void __launch_bounds__(kMaxThreads, 1)                                     \
      gdn_verify_small_##LNAME##_d##DK##_##TNAME(const GdnVerifyParams p) {                        \
    small_prologue<TS, DK, VK>(p);                                                                \
    gdn_verify_impl<TS, DK, VK, false, kSmallCj, true>(p);                                              \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(kMaxThreads, 1)                                     \
      gdn_commit_small_##LNAME##_d##DK##_##TNAME(const GdnCommitParams p) {                        \
    small_prologue<TS, DK, VK>(p);                                                                \
    gdn_commit_slice<TS, DK, VK, false, kSmallCj>(p);                                             \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(kMaxThreads, 1)                                     \
      gdn_verify_fused_small_##LNAME##_d##DK##_##TNAME(const GdnVerifyParams p) {                  \
    small_prologue<TS, DK, VK>(p);                                                                \
    gdn_verify_impl<TS, DK, VK, true, kSmallCj, true>(p);                                               \
  }

#define SPECDEC_GDN_SMALL_ALL(TS, TNAME)                     \
  SPECDEC_GDN_SMALL_KERNELS(TS, TNAME, 64, false, kv)        \
  SPECDEC_GDN_SMALL_KERNELS(TS, TNAME, 64, true, vk)         \
  SPECDEC_GDN_SMALL_KERNELS(TS, TNAME, 128, false, kv)       \
  SPECDEC_GDN_SMALL_KERNELS(TS, TNAME, 128, true, vk)

SPECDEC_GDN_SMALL_ALL(float, f32)
SPECDEC_GDN_SMALL_ALL(__half, f16)
SPECDEC_GDN_SMALL_ALL(bf16_t, bf16)
