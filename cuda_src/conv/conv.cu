// conv family: depthwise causal conv1d (+ optional bias, SiLU) of a speculative round.
//
//   conv1d_verify  x [T, dim], weight [dim, W], conv state [slots, dim, W-1] (read only)
//                  -> out [T, dim] (+ optional journal = copy of x)
//                  fused mode (pending rows given): the state first takes the previous
//                  round's accepted rows, written back, then the block is verified over it
//   conv1d_commit  journal [T, dim] + accept_len [B] -> conv state shifted in place
//                  (with row0 instead of cu_q: conv1d_flush of the pending rows)
//
// One thread per (sequence, channel); grid (ceil(dim / 256), B). The work is tiny
// (W multiply-adds per element) so this is pure data movement: consecutive threads touch
// consecutive channels of x/out, and the per-channel state (W-1 contiguous elements)
// of consecutive channels is contiguous, so every access pattern is coalesced.
// The window lives right-aligned in a fixed 8-entry register array (newest input at
// index 7), so W (2..8) can be a run-time value without local-memory indexing.
// An input enters the window of later rows rounded to the state dtype, as one-token
// decoding would have stored it; the current row uses it unrounded.
#include "conv/conv_params.h"
#include "common/pdl.cuh"
#include "gdn/gdn_tile.cuh"   // load_dt / store_dt (run-time dtype codes)

using specdec::gdn::load_raw;
using specdec::gdn::raw_to_float;
using specdec::gdn::store_dt;

namespace {

constexpr int kThreads = 256;
constexpr int kMaxW = SPECDEC_CONV_MAX_WIDTH;
// conv1d_verify: block rows whose x is loaded before the first of them is stored. The stores
// (out, journal) may alias x as far as the compiler knows, so with one load per row in the row
// loop each row's x load waited behind the previous row's stores: one memory trip per row.
constexpr int kXBatch = 8;
constexpr int kXBatchW4 = 4;   // the W = 4 kernels' batch (conv1d_verify_w4_impl)

__device__ __forceinline__ float round_dt(float x, int dt) {
  if (dt == SPECDEC_DT_F32) return x;
  if (dt == SPECDEC_DT_F16) return __half2float(__float2half_rn(x));
  return specdec::to_float(specdec::from_float<specdec::bf16_t>(x));
}

// load_raw through the coherent path (load_dt_rw's loads, split like load_raw): for the
// conv state, which conv1d_commit writes after reading it.
__device__ __forceinline__ uint32_t load_raw_rw(const void* p, int64_t i, int dt) {
  if (dt == SPECDEC_DT_F32) return __float_as_uint(static_cast<const float*>(p)[i]);
  return static_cast<const unsigned short*>(p)[i];
}

__host__ __device__ constexpr int dt_size(int dt) { return dt == SPECDEC_DT_F32 ? 4 : 2; }

__device__ __forceinline__ bool rows_valid(const int32_t* cu_q, int b, int num_rows, int& r0, int& r1) {
  r0 = __ldg(cu_q + b);
  r1 = __ldg(cu_q + b + 1);
  return 0 <= r0 && r0 <= r1 && r1 <= num_rows;
}

// Pending rows row0 .. row0 + n - 1 inside a journal of `rows` rows (any row0 where n = 0).
__device__ __forceinline__ bool pending_ok(int row0, int n, int rows) {
  return n == 0 || (n > 0 && row0 >= 0 && row0 <= rows - n);
}

// The conv state after n more inputs: entry m (0 <= m < keep, oldest first) is (state ++
// rows)[m + n], where rows[i] is element rb + i * rs of `rows` (rb: channel c of the first
// row). Raw bits first, so that every entry's load is in flight at once, values after; a row
// enters rounded to the state dtype. The commits and the fused verify gather with these (the
// generic verify through shift_in, before its own state loads: gathering in its window's
// loop made ptxas spill).
__device__ __forceinline__ uint32_t shifted_raw(int m, int n, int keep, const void* state, int64_t sb,
                                                int sdt, const void* rows, int64_t rb, int64_t rs, int rdt) {
  return m + n < keep ? load_raw_rw(state, sb + m + n, sdt) : load_raw(rows, rb + (m + n - keep) * rs, rdt);
}

__device__ __forceinline__ float shifted_value(uint32_t raw, int m, int n, int keep, int sdt, int rdt) {
  return m + n < keep ? raw_to_float(raw, sdt) : round_dt(raw_to_float(raw, rdt), sdt);
}

// Channel c's state (keep entries at sb) advanced over n rows, in place: (state ++ rows)
// [-keep:], gathered before any write (run-time width and dtypes: the generic kernels).
__device__ __forceinline__ void shift_in(void* state, int64_t sb, int sdt, int keep, int n, const void* rows,
                                         int64_t rb, int64_t rs, int rdt) {
  uint32_t raw[kMaxW - 1];
#pragma unroll
  for (int m = 0; m < kMaxW - 1; ++m)
    if (m < keep) raw[m] = shifted_raw(m, n, keep, state, sb, sdt, rows, rb, rs, rdt);
  float nw[kMaxW - 1];
#pragma unroll
  for (int m = 0; m < kMaxW - 1; ++m)
    if (m < keep) nw[m] = shifted_value(raw[m], m, n, keep, sdt, rdt);
#pragma unroll
  for (int m = 0; m < kMaxW - 1; ++m)
    if (m < keep) store_dt(state, sb + m, sdt, nw[m]);
}

// Fused mode: sequence b's pending rows (n, and rb = channel c of the first of them); n = 0
// outside fused mode, for a padding or bad slot, or a bad range (*bad set).
__device__ __forceinline__ int pending_of(const ConvVerifyParams& p, int b, int c, bool slot_ok,
                                          int64_t& rb, bool& bad) {
  rb = 0;
  bad = false;
  if (p.pending == nullptr) return 0;
  const int row0 = __ldg(p.pending_row0 + b);
  const int n = __ldg(p.pending_len + b);
  bad = !pending_ok(row0, n, p.pending_rows);
  if (bad || !slot_ok) return 0;
  rb = row0 * p.pending_stride_t + c;
  return n;
}

// The rows a commit shifts in: cu_q's block start and accept_len, or (flush) row0[b] and
// accept_len = the pending length. False with the status bits set where they are bad.
__device__ __forceinline__ bool commit_range(const ConvCommitParams& p, int b, int& row0, int& n, int& bits) {
  n = __ldg(p.accept_len + b);
  if (p.row0 != nullptr) {
    row0 = __ldg(p.row0 + b);
    const bool ok = pending_ok(row0, n, p.num_rows);
    bits = ok ? 0 : SPECDEC_CONV_BAD_PENDING;
    return ok;
  }
  int row1;
  const bool rows_ok = rows_valid(p.cu_q, b, p.num_rows, row0, row1);
  const bool acc_ok = 0 <= n && n <= row1 - row0;
  bits = (rows_ok ? 0 : SPECDEC_CONV_BAD_ROWS) | (rows_ok && !acc_ok ? SPECDEC_CONV_BAD_ACCEPT : 0);
  return rows_ok && acc_ok;
}

__device__ void conv1d_verify_impl(const ConvVerifyParams& p) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  int row0, row1;
  const bool rows_ok = rows_valid(p.cu_q, b, p.num_rows, row0, row1);
  const int slot = __ldg(p.slot_ids + b);
  const bool slot_ok = slot >= 0 && slot < p.num_slots;
  int64_t pb;
  bool pending_bad;
  const int n = pending_of(p, b, c, slot_ok, pb, pending_bad);
  if (p.status != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    p.status[b] = (rows_ok ? 0 : SPECDEC_CONV_BAD_ROWS) | (slot >= p.num_slots ? SPECDEC_CONV_BAD_SLOT : 0) |
                  (pending_bad ? SPECDEC_CONV_BAD_PENDING : 0);
  if (!rows_ok || c >= p.dim) return;
  const int W = p.width;
  const int keep = W - 1;
  const int first = kMaxW - W;   // window entries [first, 8) are live

  float win[kMaxW], wt[kMaxW];
#pragma unroll
  for (int j = 0; j < kMaxW; ++j) {
    win[j] = 0.f;
    wt[j] = 0.f;
  }
  // The first kXBatch rows' x, raw, issued with the weight and state loads below (and the
  // bias: raw too, load_dt waited for it inside its dtype branch): one memory trip for all of
  // them after the index loads, not one for the bias, one for the weights and state and one per
  // row. Loading x before a row's out / journal store is what the row loop always did; all rows
  // of a batch before the batch's stores is the same for out == x or journal == x (each row
  // reads its own x, rows never read another row's x), which is the only aliasing the op allows.
  // fused mode: the n pending rows enter the state first (the loads below read back what this
  // thread wrote: the generic kernel spends a memory trip there, the W = 4 ones do not)
  if (n > 0)
    shift_in(p.conv_state, slot * p.state_stride_slot + c * p.state_stride_c, p.state_dtype, keep, n,
             p.pending, pb, p.pending_stride_t, p.pending_dtype);
  uint32_t xraw[kXBatch];
  auto load_x = [&](int t0) {
#pragma unroll
    for (int k = 0; k < kXBatch; ++k)
      if (t0 + k < row1) xraw[k] = load_raw(p.x, (t0 + k) * p.x_stride_t + c, p.x_dtype);
  };
  load_x(row0);
  const uint32_t braw = p.bias != nullptr ? load_raw(p.bias, c, p.bias_dtype) : 0u;
  if (slot_ok) {
    const int64_t sb = slot * p.state_stride_slot + c * p.state_stride_c;
    // raw loads first, conversions after: all 2W-1 loads in flight at once (load_dt would
    // wait for each one inside its dtype branch)
    uint32_t wraw[kMaxW], sraw[kMaxW];
#pragma unroll
    for (int j = 0; j < kMaxW; ++j) {
      wraw[j] = sraw[j] = 0u;
      if (j >= first) wraw[j] = load_raw(p.weight, c * p.weight_stride_c + (j - first), p.weight_dtype);
      if (j >= first && j < kMaxW - 1) sraw[j] = load_raw_rw(p.conv_state, sb + (j - first), p.state_dtype);
    }
#pragma unroll
    for (int j = 0; j < kMaxW; ++j) {
      if (j >= first) wt[j] = raw_to_float(wraw[j], p.weight_dtype);
      if (j >= first && j < kMaxW - 1) win[j] = raw_to_float(sraw[j], p.state_dtype);
    }
  }
  const float bias = p.bias != nullptr ? raw_to_float(braw, p.bias_dtype) : 0.f;
  for (int t0 = row0; t0 < row1; t0 += kXBatch) {
    if (t0 != row0) load_x(t0);
#pragma unroll
    for (int k = 0; k < kXBatch; ++k) {
      const int t = t0 + k;
      if (t >= row1) break;
      const float x = raw_to_float(xraw[k], p.x_dtype);
      if (p.journal != nullptr) store_dt(p.journal, t * p.journal_stride_t + c, p.journal_dtype, x);
      float y = 0.f;
      if (slot_ok) {
        win[kMaxW - 1] = x;
        y = bias;
#pragma unroll
        for (int j = 0; j < kMaxW; ++j)
          if (j >= first) y = fmaf(wt[j], win[j], y);
        if (p.silu) y = y / (1.f + __expf(-y));
        win[kMaxW - 1] = round_dt(x, p.state_dtype);   // as later rows see it
#pragma unroll
        for (int j = 0; j < kMaxW - 1; ++j) win[j] = win[j + 1];
      }
      store_dt(p.out, t * p.out_stride_t + c, p.out_dtype, y);
    }
  }
}

__device__ void conv1d_commit_impl(const ConvCommitParams& p) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  int row0, n, bits;
  const bool ok = commit_range(p, b, row0, n, bits);
  const int slot = __ldg(p.slot_ids + b);
  if (p.status != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    p.status[b] = bits | (slot >= p.num_slots ? SPECDEC_CONV_BAD_SLOT : 0);
  if (!ok || n == 0 || slot < 0 || slot >= p.num_slots || c >= p.dim) return;
  shift_in(p.conv_state, slot * p.state_stride_slot + c * p.state_stride_c, p.state_dtype, p.width - 1, n,
           p.journal, row0 * p.journal_stride_t + c, p.journal_stride_t, p.journal_dtype);
}


// ---------------------------------------------------------------- W = 4, compile-time dtypes
// The same kernels with W = 4 and the dtype codes as template constants (XD: x, weight, bias
// and out; SD: the conv state; JD: the journal), chosen by ops/conv.py where a call matches
// (_kernels.CONV_W4_*). The arithmetic is the generic kernels', op for op (the same helpers with
// constant codes, the same fma order bias + w0 s0 + w1 s1 + w2 s2 + w3 x, the same SiLU and
// rounding), so outputs, journals and states are bit-identical to conv1d_verify /
// conv1d_commit's; what goes is the run-time dtype branches (each load, store and rounding was
// a branch on a code), the window's 8-entry register shift and the per-row 64-bit index
// products (row addresses advance by a stride instead). verify also splits a block's rows over
// gridDim.z row lanes (small batches: one or two rows a thread instead of the whole block).
// PDL as the generic kernels: wait first.
template <int XD, int SD, int JD>
__device__ __forceinline__ void conv1d_verify_w4_impl(const ConvVerifyParams& p) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  int row0, row1;
  const bool rows_ok = rows_valid(p.cu_q, b, p.num_rows, row0, row1);
  const int slot = __ldg(p.slot_ids + b);
  const bool slot_ok = slot >= 0 && slot < p.num_slots;
  // fused mode: n pending rows (JD, the journal's dtype, is theirs too: verify_kernel's rule)
  int64_t pb;
  bool pending_bad;
  const int n = pending_of(p, b, c, slot_ok, pb, pending_bad);
  if (p.status != nullptr && blockIdx.x == 0 && blockIdx.z == 0 && threadIdx.x == 0)
    p.status[b] = (rows_ok ? 0 : SPECDEC_CONV_BAD_ROWS) | (slot >= p.num_slots ? SPECDEC_CONV_BAD_SLOT : 0) |
                  (pending_bad ? SPECDEC_CONV_BAD_PENDING : 0);
  if (!rows_ok || c >= p.dim) return;
  // Row lanes (gridDim.z, a power of two; ops/conv.py _row_lanes): lane z owns rows [r, r_end)
  // of the sequence's block, ceil(q / lanes) rows a lane, and starts its window from the 3 inputs
  // before r (the state's entries, or earlier block rows rounded to the state dtype, exactly what
  // the sliding window would hold there). One lane (gridDim.z = 1): the generic kernel's walk.
  const int lanes = gridDim.z;
  const int per = (row1 - row0 + lanes - 1) >> (__ffs(lanes) - 1);
  const int r = row0 + static_cast<int>(blockIdx.z) * per;
  const int r_end = min(r + per, row1);
  const int d = r - row0;           // block rows before this lane's first
  // lane 0 writes the state back in fused mode (ops/conv.py launches one lane then: the others
  // would read the state it writes), rows or none
  const bool commit = n > 0 && d == 0;
  if (r >= r_end && !commit) return;
  // x's values are the state dtype's already (the same dtype, or a float32 state): rounding them
  // to it is the identity for every non-NaN value (a NaN stays a NaN, and any fma with it gives
  // the same canonical NaN), so the window takes them as they are
  constexpr bool kExact = XD == SD || SD == SPECDEC_DT_F32;
  // row r's x / out / journal elements, then one stride a row (byte pointers: the row loop adds
  // a stride instead of forming t * stride + c)
  const int64_t xs = p.x_stride_t * dt_size(XD), os = p.out_stride_t * dt_size(XD);
  const int64_t js = p.journal_stride_t * dt_size(JD);
  const char* xp = static_cast<const char*>(p.x) + (r * p.x_stride_t + c) * dt_size(XD);
  char* op = static_cast<char*>(p.out) + (r * p.out_stride_t + c) * dt_size(XD);
  char* jp = static_cast<char*>(p.journal) + (r * p.journal_stride_t + c) * dt_size(JD);
  // the first kXBatchW4 rows' x before any store, with the bias, weights and window (the generic
  // kernel's load order: one memory trip for all of them after the index loads; 4 rows, not 8:
  // a lane holds 1-4 rows at the shapes this form is for, and each unused slot of the batch
  // cost ~5 instructions of address and predicate)
  uint32_t xraw[kXBatchW4];
  auto load_x = [&](int t0) {
    const char* q = xp;
#pragma unroll
    for (int k = 0; k < kXBatchW4; ++k) {
      if (t0 + k < r_end) xraw[k] = load_raw(q, 0, XD);
      q += xs;
    }
  };
  load_x(r);
  const uint32_t braw = p.bias != nullptr ? load_raw(p.bias, c, XD) : 0u;
  float w0 = 0.f, w1 = 0.f, w2 = 0.f, w3 = 0.f, s0 = 0.f, s1 = 0.f, s2 = 0.f;
  if (slot_ok) {
    const int64_t wb = c * p.weight_stride_c;
    const int64_t sb = slot * p.state_stride_slot + c * p.state_stride_c;
    const uint32_t rw0 = load_raw(p.weight, wb, XD), rw1 = load_raw(p.weight, wb + 1, XD);
    const uint32_t rw2 = load_raw(p.weight, wb + 2, XD), rw3 = load_raw(p.weight, wb + 3, XD);
    // window entry j (j = 0..2, oldest first) before row r: entry j + d of the state after the
    // n pending rows while j + d < 3, else block row r - 3 + j (x, rounded to the state dtype
    // below)
    // (two copies of the gather: with n = 0, no pending rows, the state is read only, as it
    // always was; the fused form's selects cost the plain call ~35% more instructions)
    uint32_t rs[3];
    float sw[3];
    auto from_x = [](uint32_t raw) { return kExact ? raw_to_float(raw, XD) : round_dt(raw_to_float(raw, XD), SD); };
    if (n == 0) {
#pragma unroll
      for (int j = 0; j < 3; ++j)
        rs[j] = j + d < 3 ? load_raw(p.conv_state, sb + j + d, SD) : load_raw(xp - (3 - j) * xs, 0, XD);
#pragma unroll
      for (int j = 0; j < 3; ++j) sw[j] = j + d < 3 ? raw_to_float(rs[j], SD) : from_x(rs[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 3; ++j)
        rs[j] = j + d < 3 ? shifted_raw(j + d, n, 3, p.conv_state, sb, SD, p.pending, pb, p.pending_stride_t, JD)
                          : load_raw(xp - (3 - j) * xs, 0, XD);
#pragma unroll
      for (int j = 0; j < 3; ++j) sw[j] = j + d < 3 ? shifted_value(rs[j], j + d, n, 3, SD, JD) : from_x(rs[j]);
    }
    w0 = raw_to_float(rw0, XD);
    w1 = raw_to_float(rw1, XD);
    w2 = raw_to_float(rw2, XD);
    w3 = raw_to_float(rw3, XD);
    s0 = sw[0];
    s1 = sw[1];
    s2 = sw[2];
    if (commit) {
      store_dt(p.conv_state, sb, SD, s0);
      store_dt(p.conv_state, sb + 1, SD, s1);
      store_dt(p.conv_state, sb + 2, SD, s2);
    }
  }
  const float bias = p.bias != nullptr ? raw_to_float(braw, XD) : 0.f;
  for (int t0 = r; t0 < r_end; t0 += kXBatchW4) {
    if (t0 != r) load_x(t0);
#pragma unroll
    for (int k = 0; k < kXBatchW4; ++k) {
      if (t0 + k >= r_end) break;
      const float x = raw_to_float(xraw[k], XD);
      if (p.journal != nullptr) store_dt(jp, 0, JD, x);
      float y = 0.f;
      if (slot_ok) {
        y = bias;
        y = fmaf(w0, s0, y);
        y = fmaf(w1, s1, y);
        y = fmaf(w2, s2, y);
        y = fmaf(w3, x, y);
        if (p.silu) y = y / (1.f + __expf(-y));
        s0 = s1;
        s1 = s2;
        s2 = kExact ? x : round_dt(x, SD);   // as later rows see it
      }
      store_dt(op, 0, XD, y);
      xp += xs;
      op += os;
      jp += js;
    }
  }
}

// conv1d_commit, W = 4 (3 state entries), compile-time journal / state dtypes
template <int JD, int SD>
__device__ __forceinline__ void conv1d_commit_w4_impl(const ConvCommitParams& p) {
  constexpr int keep = 3;
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  int row0, n, bits;
  const bool ok = commit_range(p, b, row0, n, bits);
  const int slot = __ldg(p.slot_ids + b);
  if (p.status != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    p.status[b] = bits | (slot >= p.num_slots ? SPECDEC_CONV_BAD_SLOT : 0);
  if (!ok || n == 0 || slot < 0 || slot >= p.num_slots || c >= p.dim) return;
  const int64_t sb = slot * p.state_stride_slot + c * p.state_stride_c;
  // new state = (old state ++ accepted rows)[-3:], all loads before any store
  const int64_t rb = row0 * p.journal_stride_t + c;
  uint32_t raw[keep];
#pragma unroll
  for (int m = 0; m < keep; ++m)
    raw[m] = shifted_raw(m, n, keep, p.conv_state, sb, SD, p.journal, rb, p.journal_stride_t, JD);
  // (shifted_value rounds a journal row to the state dtype before store_dt rounds it again;
  // both roundings are round-to-nearest-even and idempotent, NaNs included, so one is the same)
  float nw[keep];
#pragma unroll
  for (int m = 0; m < keep; ++m) nw[m] = m + n < keep ? raw_to_float(raw[m], SD) : raw_to_float(raw[m], JD);
#pragma unroll
  for (int m = 0; m < keep; ++m) store_dt(p.conv_state, sb + m, SD, nw[m]);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) conv1d_verify(const ConvVerifyParams p) {
  specdec::pdl_begin();
  conv1d_verify_impl(p);
}

extern "C" __global__ void __launch_bounds__(kThreads) conv1d_commit(const ConvCommitParams p) {
  specdec::pdl_begin();
  conv1d_commit_impl(p);
}

// W = 4 forms: conv1d_verify_w4_<x>_<state>_j<journal>, conv1d_commit_w4_<journal>_<state>
// (names and the dispatch rule: specdec_lib/_kernels.py conv_w4_kernels, ops/conv.py)
#define SPECDEC_CONV_VERIFY_W4(XN, XD, SN, SD, JN, JD)                                           \
  extern "C" __global__ void __launch_bounds__(kThreads)                                        \
      conv1d_verify_w4_##XN##_##SN##_j##JN(const ConvVerifyParams p) {                          \
    specdec::pdl_begin();                                                                       \
    conv1d_verify_w4_impl<XD, SD, JD>(p);                                                       \
  }
#define SPECDEC_CONV_VERIFY_W4_X(XN, XD)                                                        \
  SPECDEC_CONV_VERIFY_W4(XN, XD, f32, SPECDEC_DT_F32, f32, SPECDEC_DT_F32)                      \
  SPECDEC_CONV_VERIFY_W4(XN, XD, f16, SPECDEC_DT_F16, f16, SPECDEC_DT_F16)                      \
  SPECDEC_CONV_VERIFY_W4(XN, XD, bf16, SPECDEC_DT_BF16, bf16, SPECDEC_DT_BF16)
// journal in the state's dtype (any x), or in x's where that differs from the state's
SPECDEC_CONV_VERIFY_W4_X(f32, SPECDEC_DT_F32)
SPECDEC_CONV_VERIFY_W4_X(f16, SPECDEC_DT_F16)
SPECDEC_CONV_VERIFY_W4_X(bf16, SPECDEC_DT_BF16)
SPECDEC_CONV_VERIFY_W4(f32, SPECDEC_DT_F32, f16, SPECDEC_DT_F16, f32, SPECDEC_DT_F32)
SPECDEC_CONV_VERIFY_W4(f32, SPECDEC_DT_F32, bf16, SPECDEC_DT_BF16, f32, SPECDEC_DT_F32)
SPECDEC_CONV_VERIFY_W4(f16, SPECDEC_DT_F16, f32, SPECDEC_DT_F32, f16, SPECDEC_DT_F16)
SPECDEC_CONV_VERIFY_W4(f16, SPECDEC_DT_F16, bf16, SPECDEC_DT_BF16, f16, SPECDEC_DT_F16)
SPECDEC_CONV_VERIFY_W4(bf16, SPECDEC_DT_BF16, f32, SPECDEC_DT_F32, bf16, SPECDEC_DT_BF16)
SPECDEC_CONV_VERIFY_W4(bf16, SPECDEC_DT_BF16, f16, SPECDEC_DT_F16, bf16, SPECDEC_DT_BF16)

#define SPECDEC_CONV_COMMIT_W4(JN, JD, SN, SD)                                                  \
  extern "C" __global__ void __launch_bounds__(kThreads)                                        \
      conv1d_commit_w4_##JN##_##SN(const ConvCommitParams p) {                                  \
    specdec::pdl_begin();                                                                       \
    conv1d_commit_w4_impl<JD, SD>(p);                                                           \
  }
#define SPECDEC_CONV_COMMIT_W4_J(JN, JD)                                                        \
  SPECDEC_CONV_COMMIT_W4(JN, JD, f32, SPECDEC_DT_F32)                                           \
  SPECDEC_CONV_COMMIT_W4(JN, JD, f16, SPECDEC_DT_F16)                                           \
  SPECDEC_CONV_COMMIT_W4(JN, JD, bf16, SPECDEC_DT_BF16)
SPECDEC_CONV_COMMIT_W4_J(f32, SPECDEC_DT_F32)
SPECDEC_CONV_COMMIT_W4_J(f16, SPECDEC_DT_F16)
SPECDEC_CONV_COMMIT_W4_J(bf16, SPECDEC_DT_BF16)
