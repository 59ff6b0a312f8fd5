// spec_sample building blocks: constants, Philox keying, the online (max, sum-exp,
// argmax) partial and its merges, block reductions, workspace views, 16-byte unpacking.
// Included by spec_sample.cu only (one translation unit; internal linkage).
#pragma once
#include <math.h>
#include "common/dtype.cuh"
#include "common/pdl.cuh"
#include "common/philox.cuh"
#include "common/warp.cuh"
#include "sampling/sampling_params.h"

using namespace specdec;

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kTile = SPEC_SAMPLE_TILE;
constexpr uint32_t kPurposeAccept = 0, kPurposeTile = 1, kPurposeToken = 2;
constexpr uint32_t kFlagNaN = 1u, kFlagPosInf = 2u;

// ------------------------------------------------------------------ small helpers

// Random bits of (seed, step, block row, purpose, index): the reference's philox_bits.
__device__ __forceinline__ uint32_t spec_bits(uint64_t seed, int64_t step, int row,
                                              uint32_t purpose, uint32_t index) {
  const uint64_t st = static_cast<uint64_t>(step);
  const uint4 ctr = make_uint4(index, static_cast<uint32_t>(row) | (purpose << 24),
                               static_cast<uint32_t>(st), static_cast<uint32_t>(st >> 32));
  return philox4x32_10(ctr, make_uint2(static_cast<uint32_t>(seed),
                                       static_cast<uint32_t>(seed >> 32))).x;
}

// Monotone float -> uint32 map (-0 folded into +0, as the reference compares values).
__device__ __forceinline__ uint32_t order_key(float f) {
  f = f + 0.0f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_to_float(uint32_t key) {   // inverse of order_key
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

template <typename T>
__device__ __forceinline__ float load_logit(const T* row, int64_t i) {
  return to_float(row[i]);
}

struct SeqParams {
  bool greedy, filtered;
  bool k_on, p_on;    // sampled row with top-k / top-p active (the threshold's filters)
  float scale;        // log2(e) / temperature (log2(e) for greedy rows)
  int top_k;
  float top_p, min_p; // min_p: 0 = off, else clamped to 1
};

__device__ __forceinline__ SeqParams seq_params(const SpecSampleParams& p, int b) {
  SeqParams s;
  const float t = __ldg(p.temperature + b);
  s.greedy = !(t > 0.f);
  s.scale = s.greedy ? kLog2e : kLog2e / t;
  s.top_k = __ldg(p.top_k + b);
  s.top_p = __ldg(p.top_p + b);
  const float mp = __ldg(p.min_p + b);
  s.min_p = mp > 0.f ? fminf(mp, 1.f) : 0.f;
  const bool k_on = s.top_k > 0 && s.top_k < p.vocab;
  const bool p_on = s.top_p < 1.f;   // NaN: off
  s.filtered = !s.greedy && (k_on || p_on || s.min_p > 0.f);
  s.k_on = !s.greedy && k_on;
  s.p_on = !s.greedy && p_on;
  return s;
}

// Kept by the filters (top-k/top-p via the row threshold key, min-p vs the row max).
// __fsub_rn: never contracted into an FMA, so every pass decides the same for a token.
__device__ __forceinline__ bool kept(float logit, float s2, uint32_t tau_key, float row_m,
                                     float min_p) {
  if (order_key(logit) < tau_key) return false;
  return !(min_p > 0.f) || exp2f(__fsub_rn(s2, row_m)) >= min_p;
}

// The request's parameters as the one-pass kernel (rows) applies them: filters off when
// the caller promised none (no_filters; chain_seq flags a request that filters anyway).
__device__ __forceinline__ SeqParams applied_params(const SpecSampleParams& p, int b) {
  SeqParams sp = seq_params(p, b);
  if (p.no_filters) { sp.filtered = sp.k_on = sp.p_on = false; sp.min_p = 0.f; }
  return sp;
}

// Weight exp2(s2 - m) of the draft's logit lx if the filters keep it, else 0.
__device__ __forceinline__ float draft_weight_of(float lx, const SeqParams& sp, uint32_t tau, float m) {
  if (!(lx > -INFINITY)) return 0.f;
  const float sx = __fmul_rn(lx, sp.scale);
  if (sp.filtered && !kept(lx, sx, tau, m, sp.min_p)) return 0.f;
  return exp2f(__fsub_rn(sx, m));
}

// Block b of cu_q is usable: 1 <= q <= width rows inside [0, T), its drafts inside [0, T-B).
__device__ __forceinline__ bool block_layout_ok(const SpecSampleParams& p, int b, int r0, int r1) {
  const int q = r1 - r0;
  return !(q < 1 || q > p.width || r0 < 0 || r1 > p.num_rows || r0 - b < 0 ||
           r1 - b - 1 > p.num_rows - p.batch);
}

// Status of a block with a valid layout (precedence NONFINITE > EMPTY > BAD_DRAFT) and whether
// it is invalid (no tokens): sampled blocks on NaN / +inf or an empty row, greedy blocks only
// on an all-NaN row.
__device__ __forceinline__ int block_status(uint32_t flags, bool empty, bool bad_draft,
                                            bool greedy, bool& invalid) {
  const int st = flags ? SPEC_SAMPLE_NONFINITE : empty ? SPEC_SAMPLE_EMPTY
               : bad_draft ? SPEC_SAMPLE_BAD_DRAFT : SPEC_SAMPLE_OK;
  invalid = greedy ? empty : (st == SPEC_SAMPLE_NONFINITE || st == SPEC_SAMPLE_EMPTY);
  return st;
}

// Online (max, sum-exp2) with a separate raw-logit argmax.
struct Partial {
  float m, s, raw_max;
  int arg;
  uint32_t flags;
};

__device__ __forceinline__ Partial partial_empty() {
  Partial r;
  r.m = -INFINITY; r.s = 0.f; r.raw_max = -INFINITY; r.arg = -1; r.flags = 0;
  return r;
}

__device__ __forceinline__ float scaled_sum(float m, float s, float to) {
  return s > 0.f ? s * exp2f(m - to) : 0.f;
}

// Merge two partials. Raw-argmax ties go to the lower token id whatever the merge order.
__device__ __forceinline__ Partial merge(const Partial& a, const Partial& b) {
  Partial r;
  r.m = fmaxf(a.m, b.m);
  r.s = (r.m == -INFINITY) ? 0.f : scaled_sum(a.m, a.s, r.m) + scaled_sum(b.m, b.s, r.m);
  const bool take_b = b.arg >= 0 && (a.arg < 0 || b.raw_max > a.raw_max ||
                                     (b.raw_max == a.raw_max && b.arg < a.arg));
  r.raw_max = take_b ? b.raw_max : a.raw_max;
  r.arg = take_b ? b.arg : a.arg;
  r.flags = a.flags | b.flags;
  return r;
}

__device__ __forceinline__ Partial shfl_down(const Partial& v, int d) {
  Partial r;
  r.m = __shfl_down_sync(0xffffffffu, v.m, d);
  r.s = __shfl_down_sync(0xffffffffu, v.s, d);
  r.raw_max = __shfl_down_sync(0xffffffffu, v.raw_max, d);
  r.arg = __shfl_down_sync(0xffffffffu, v.arg, d);
  r.flags = __shfl_down_sync(0xffffffffu, v.flags, d);
  return r;
}

// Argmax of a float key with ties to the lowest index (index -1 = none), block-wide.
struct KeyArg {
  float key;
  int idx;
};
__device__ __forceinline__ KeyArg better(KeyArg a, KeyArg b) {
  if (b.idx < 0) return a;
  if (a.idx < 0) return b;
  if (b.key > a.key || (b.key == a.key && b.idx < a.idx)) return b;
  return a;
}
template <int kThreads>
__device__ __forceinline__ KeyArg block_argmax(KeyArg v, KeyArg* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    KeyArg o;
    o.key = __shfl_down_sync(0xffffffffu, v.key, d);
    o.idx = __shfl_down_sync(0xffffffffu, v.idx, d);
    v = better(v, o);
  }
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) v = better(v, sh[w]);
    sh[0] = v;
  }
  __syncthreads();
  const KeyArg r = sh[0];
  __syncthreads();
  return r;
}

// Sum of a float or double over the CTA, in every thread, the same bits in every thread and
// run: a butterfly within each warp (lane 0's bits are a shfl_down tree's), then the warps'
// totals in warp order. sh: kThreads / 32 values; free again on return (three barriers).
template <int kThreads, typename T>
__device__ __forceinline__ T block_sum(T v, T* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T all = sh[0];
  for (int w = 1; w < kThreads / 32; ++w) all += sh[w];
  __syncthreads();
  return all;
}

__device__ __forceinline__ SpecSampleTile* ws_tiles(const SpecSampleParams& p) {
  return static_cast<SpecSampleTile*>(p.workspace);
}
__device__ __forceinline__ SpecSampleRow* ws_rows(const SpecSampleParams& p) {
  return reinterpret_cast<SpecSampleRow*>(ws_tiles(p) + static_cast<int64_t>(p.num_rows) * p.num_tiles);
}

// Per-row threshold state, after the rows (16-byte aligned).
__device__ __forceinline__ SpecSampleFilter* ws_filters(const SpecSampleParams& p) {
  const int64_t off = static_cast<int64_t>(p.num_rows) *
      (static_cast<int64_t>(p.num_tiles) * sizeof(SpecSampleTile) + sizeof(SpecSampleRow));
  return reinterpret_cast<SpecSampleFilter*>(static_cast<char*>(p.workspace) + ((off + 15) & ~int64_t(15)));
}

// One-hot draft excluded from row r's sums (-1: none): sampled rows that verify a draft.
__device__ __forceinline__ int excluded_draft(const SpecSampleParams& p, int b, int i, int q) {
  if (p.draft_probs != nullptr || i >= q - 1) return -1;
  const int d = __ldg(p.cu_q + b) - b + i;
  if (d < 0 || d >= p.num_rows - p.batch) return -1;
  return __ldg(p.draft_ids + d);
}

// ------------------------------------------------------------------ 16-byte vectors

// Elements of T in one 16-byte load.
template <typename T> struct VecN;
template <> struct VecN<float> { static constexpr int kN = 4; };
template <> struct VecN<__half> { static constexpr int kN = 8; };
template <> struct VecN<bf16_t> { static constexpr int kN = 8; };

__device__ __forceinline__ void unpack16(const uint4& u, float* f, const float*) {
  f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y);
  f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void unpack16(const uint4& u, float* f, const bf16_t*) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {   // element 2k is the low half of word k
    f[2 * k] = __uint_as_float(w[k] << 16);
    f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack16(const uint4& u, float* f, const __half*) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    f[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] & 0xffffu)));
    f[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] >> 16)));
  }
}

// Warp merge of partials in a fixed tree (lane order): deterministic; result in lane 0.
__device__ __forceinline__ Partial warp_merge(Partial v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const Partial o = shfl_down(v, d);
    if ((lane & (2 * d - 1)) == 0 && lane + d < 32) v = merge(v, o);
  }
  return v;
}

}  // namespace
