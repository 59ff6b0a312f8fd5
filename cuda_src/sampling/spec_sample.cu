// spec_sample: exact speculative (rejection) sampling straight from target logits.
//
// Contract and exact semantics: specdec_lib/reference/sampling.py (the spec). Shapes:
// logits [T, V] (f32/f16/bf16, rows of B ragged verify blocks given by cu_q [B+1]),
// draft_ids [T-B], optional draft_probs [T-B, Vd] (+ d2t [Vd]); outputs num_accepted [B],
// emitted [B, W], status [B], optional logprobs [B, W].
//
// Three kernels, launched in this order on one stream:
//  1. spec_sample_tiles_<dt>     grid (T, ceil(num_tiles / tiles_per_cta)), 4 warps: the vocab
//     is split across CTAs so batch 1 fills the GPU; one warp owns one 2048-token tile at a
//     time (16-byte loads, one shuffle tree per tile, no block barrier). Per (row, tile) it
//     writes max / sum-exp / raw argmax / NaN-inf flags: the logits are read once, in their
//     own dtype. The one-hot draft token of a row is left out of the tile sums, so the tile
//     sums are directly the weights of the rejection residual p - onehot(x).
//  2. spec_sample_threshold_<dt> grid T, 512 threads: only rows whose request uses top-k /
//     top-p: an exact radix select of the keep threshold (count for top-k, fixed-point mass
//     for top-p) in two row passes per filter (bucket histogram, then the bucket's keys to
//     shared memory); then spec_sample_tiles_<dt> runs again with filtered_pass=1 to
//     recompute the tile sums of those rows over the kept set (min-p needs only the row
//     max: it is a per-token test).
//  3. spec_sample_finish_<dt>    grid B: one CTA per sequence; its warps merge the tile
//     partials of its rows (fixed order: deterministic), warp 0 walks the accept chain
//     (Philox uniform per row) and races the tiles, then the CTA samples the token inside
//     the chosen tile: the two-level exponential race (2048 logits re-read).
//     With draft_probs the residual max(0, p - q) is not known per tile from pass 1, so this
//     CTA recomputes it over the rejected row (one row read); a known cost of that mode.
//
// Numbers: s2 = logit * log2(e) / temperature so every exponential is one exp2. Greedy rows
// compare raw logits (bit-exact with the reference: NaN never wins, lowest id on ties).
// Nothing faults on NaN / inf / bad ids / bad cu_q: such rows get a status code.
#include <math.h>
#include "common/dtype.cuh"
#include "common/ragged.cuh"
#include "common/philox.cuh"
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

template <typename T>
__device__ __forceinline__ float load_logit(const T* row, int64_t i) {
  return to_float(row[i]);
}

struct SeqParams {
  bool greedy, filtered;
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
  return s;
}

// Kept by the filters (top-k/top-p via the row threshold key, min-p vs the row max).
// __fsub_rn: never contracted into an FMA, so every pass decides the same for a token.
__device__ __forceinline__ bool kept(float logit, float s2, uint32_t tau_key, float row_m,
                                     float min_p) {
  if (order_key(logit) < tau_key) return false;
  return !(min_p > 0.f) || exp2f(__fsub_rn(s2, row_m)) >= min_p;
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

template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) v += sh[w];
    sh[0] = v;
  }
  __syncthreads();
  const float r = sh[0];
  __syncthreads();
  return r;
}

__device__ __forceinline__ SpecSampleTile* ws_tiles(const SpecSampleParams& p) {
  return static_cast<SpecSampleTile*>(p.workspace);
}
__device__ __forceinline__ SpecSampleRow* ws_rows(const SpecSampleParams& p) {
  return reinterpret_cast<SpecSampleRow*>(ws_tiles(p) + static_cast<int64_t>(p.num_rows) * p.num_tiles);
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

// ------------------------------------------------------------------ 1. tile partials
//
// One warp owns one 2048-token tile at a time (a CTA's 8 warps walk its tiles with stride 8),
// so a tile costs one warp shuffle tree and no block barrier. Fast path (full tile, 16-byte
// aligned row, no NaN, finite tile max): 16-byte loads, lane max first, then one FFMA + EX2
// + FADD per token relative to that max; greedy rows without logprobs skip the exponentials.
// Anything else (tail tile, misaligned row, a NaN or +inf in the tile) takes the per-token
// path below, which keeps every edge rule of the spec.

struct TileCtx {
  float scale;          // log2(e) / temperature
  int excl;             // one-hot draft left out of the sums (-1: none)
  uint32_t tau_key;     // filtered pass: kept iff order_key >= tau_key
  float row_m, min_p;   // filtered pass: row max of s2, min-p
  bool need_sum, need_arg;
};

// Per-token path (the reference rules verbatim); lane partial, not yet merged.
template <typename T>
__device__ __forceinline__ Partial tile_slow(const T* row, int base, int vocab, bool filtered_pass,
                                             const TileCtx& c, float min_p) {
  constexpr int kUnroll = 8;
  const int lane = threadIdx.x & 31;
  Partial a = partial_empty();
  for (int j0 = 0; j0 < kTile / 32; j0 += kUnroll) {
    if (base + j0 * 32 >= vocab) break;   // tail tile: stop at the vocabulary's end
    float v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {   // all loads first
      const int idx = base + (j0 + j) * 32 + lane;
      v[j] = idx < vocab ? load_logit(row, idx) : NAN;
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {   // ids increase with j: strict > keeps the lowest
      const int idx = base + (j0 + j) * 32 + lane;
      const float x = v[j];
      if (idx >= vocab) continue;
      if (isnan(x)) { a.flags |= kFlagNaN; continue; }
      if (x == INFINITY) a.flags |= kFlagPosInf;
      if (a.arg < 0 || x > a.raw_max) { a.raw_max = x; a.arg = idx; }
      if (x == -INFINITY) continue;   // weight 0, never the max of s2
      const float s2 = x * c.scale;
      const bool counted = idx != c.excl &&
          (!filtered_pass || kept(x, s2, c.tau_key, c.row_m, min_p));
      if (s2 > a.m) {
        a.s = (a.s > 0.f ? a.s * exp2f(a.m - s2) : 0.f) + (counted ? 1.f : 0.f);
        a.m = s2;
      } else if (counted) {
        a.s += exp2f(s2 - a.m);
      }
    }
  }
  return a;
}

// Fast path. kMode 0: plain; 1: the one-hot draft lies in this tile; 2: filtered recount.
// Returns false (warp-uniform) when the tile needs the per-token path.
template <typename T, int kMode>
__device__ __forceinline__ bool tile_fast(const T* row, int base, uint4 (&u)[8], const TileCtx& c,
                                          Partial& out) {
  constexpr int kN = VecN<T>::kN;
  constexpr int kSlab = 8;                          // vectors per lane in flight at once
  constexpr int kSlabs = kTile / kN / 32 / kSlab;   // 1 (16-bit) or 2 (f32)
  constexpr int kSub = 16 / kN;                     // vectors unpacked at once: 16 floats
  const int lane = threadIdx.x & 31;
  const uint4* src = reinterpret_cast<const uint4*>(row + base);
  float lmax = -INFINITY, lsum = 0.f;
  int larg = -1;
  bool nan = false;
#pragma unroll
  for (int slab = 0; slab < kSlabs; ++slab) {
    if (slab) {
#pragma unroll
      for (int j = 0; j < kSlab; ++j) u[j] = __ldg(src + (slab * kSlab + j) * 32 + lane);
    }
#pragma unroll
    for (int j0 = 0; j0 < kSlab; j0 += kSub) {
      float x[kSub * kN];
#pragma unroll
      for (int j = 0; j < kSub; ++j) unpack16(u[j0 + j], x + j * kN, static_cast<const T*>(nullptr));
      // token id of x[j*kN+e] = base + ((slab*kSlab + j0 + j)*32 + lane)*kN + e: increasing
      auto id_of = [&](int e) { return base + ((slab * kSlab + j0 + e / kN) * 32 + lane) * kN + e % kN; };
      float sm = -INFINITY;
#pragma unroll
      for (int e = 0; e < kSub * kN; ++e) { sm = fmaxf(sm, x[e]); nan |= isnan(x[e]); }
      if (c.need_arg) {
        int sa = -1;
#pragma unroll
        for (int e = kSub * kN - 1; e >= 0; --e) sa = x[e] == sm ? id_of(e) : sa;
        if (larg < 0 || sm > lmax) larg = sa;   // an equal earlier max has the lower id
      }
      const float nm = fmaxf(lmax, sm);
      if (c.need_sum && nm > -INFINITY && nm < INFINITY) {
        const float ms = nm * c.scale;
        if (lsum > 0.f) lsum *= exp2f(lmax * c.scale - ms);
#pragma unroll
        for (int e = 0; e < kSub * kN; ++e) {
          float w = exp2f(fmaf(x[e], c.scale, -ms));   // -inf logits give 0
          if (kMode != 0) {
            bool counted = id_of(e) != c.excl;
            if (kMode == 2) counted = counted && kept(x[e], __fmul_rn(x[e], c.scale), c.tau_key, c.row_m, c.min_p);
            w = counted ? w : 0.f;
          }
          lsum += w;
        }
      }
      lmax = nm;
    }
  }
  if (__any_sync(0xffffffffu, nan || lmax == INFINITY)) return false;
  out.raw_max = lmax;
  out.m = lmax * c.scale;   // = max of s2 (x -> x * scale is monotone); -inf if all -inf
  out.s = lsum;
  out.arg = c.need_arg ? larg : base;   // sampled rows never read the raw argmax
  out.flags = 0;
  return true;
}

template <typename T>
__device__ void tiles_kernel(const SpecSampleParams& p) {
  constexpr int kWarps = SPEC_SAMPLE_TILE_THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = blockIdx.x;   // rows on x (up to 2^31-1), vocab chunks on y (<= 1024)
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  const int t_begin = blockIdx.y * p.tiles_per_cta;
  const int t_end = min(p.num_tiles, t_begin + p.tiles_per_cta);
  const bool aligned = is_aligned16(row);
  // the first tile's loads go out before the per-row parameter loads (a dependent chain)
  uint4 u[8];
  int tile = t_begin + warp;
  bool have = false;
  if (!p.filtered_pass && aligned && tile < t_end && (tile + 1) * kTile <= p.vocab) {
    const uint4* src = reinterpret_cast<const uint4*>(row + tile * kTile);
#pragma unroll
    for (int j = 0; j < 8; ++j) u[j] = __ldg(src + j * 32 + lane);
    have = true;
  }
  const int b = owner_of_row(p.cu_q, p.batch, r);
  const SeqParams sp = seq_params(p, b);
  if (p.filtered_pass && !sp.filtered) return;
  const int r0 = __ldg(p.cu_q + b);
  const int q = __ldg(p.cu_q + b + 1) - r0;
  TileCtx c;
  c.scale = sp.scale;
  c.excl = sp.greedy ? -1 : excluded_draft(p, b, r - r0, q);
  c.tau_key = 0;
  c.row_m = 0.f;
  c.min_p = sp.min_p;
  c.need_sum = !sp.greedy || p.logprobs != nullptr;
  c.need_arg = sp.greedy;
  if (p.filtered_pass) {
    const SpecSampleRow rs = ws_rows(p)[r];
    c.tau_key = rs.tau_key;
    c.row_m = rs.m;
  }
  for (; tile < t_end; tile += kWarps) {
    const int base = tile * kTile;
    Partial a;
    bool ok = false;
    if (aligned && base + kTile <= p.vocab) {
      if (!have) {
        const uint4* src = reinterpret_cast<const uint4*>(row + base);
#pragma unroll
        for (int j = 0; j < 8; ++j) u[j] = __ldg(src + j * 32 + lane);
      }
      if (p.filtered_pass) ok = tile_fast<T, 2>(row, base, u, c, a);
      else if (c.excl >= base && c.excl < base + kTile) ok = tile_fast<T, 1>(row, base, u, c, a);
      else ok = tile_fast<T, 0>(row, base, u, c, a);
    }
    have = false;
    if (!ok) a = tile_slow(row, base, p.vocab, p.filtered_pass != 0, c, sp.min_p);
    a = warp_merge(a);
    if (lane == 0) {
      SpecSampleTile out;
      out.m = a.m; out.s = a.s; out.raw_max = a.raw_max; out.arg = a.arg; out.flags = a.flags;
      ws_tiles(p)[static_cast<int64_t>(r) * p.num_tiles + tile] = out;
    }
  }
}

// ------------------------------------------------------------------ 2. filter threshold
//
// Exact radix select of the keep threshold (the largest key K with mass(keys >= K) >= target,
// mass = count for top-k, floor(min(e, 1) * 2^32) with e = exp2(s2 - m) for top-p: integer
// sums, so the result does not depend on the summation order). Two passes over the row per
// filter instead of three: pass A histograms the tokens by b = floor(64 * (m - s2)) (2048
// buckets of 1/64 log2 unit below the row max: monotone in the key, and spread out, so the
// shared atomics rarely collide), pass B copies the keys of the selected bucket to shared
// memory; the three 11/11/10-bit radix rounds then run over that list. A bucket with more
// than SPEC_SAMPLE_THRESHOLD_CANDIDATES keys (near-constant logits) falls back to the radix
// rounds over the whole row. Same K as the plain 3-round radix in every case.

// Largest digit d with sum(hist[> d]) < target <= sum(hist[>= d]); returns d and the sum
// above it (2048 bins, 2048 / kThreads per thread).
template <int kThreads>
__device__ __forceinline__ void find_digit(const unsigned long long* hist, unsigned long long target,
                                           unsigned long long* sh_scan, int* out_digit,
                                           unsigned long long* out_above) {
  constexpr int kBins = 2048, kPer = kBins / kThreads;
  const int t = threadIdx.x;
  // thread t owns bins (descending) j = t*kPer .. t*kPer+kPer-1, bin = 2047 - j
  unsigned long long local = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) local += hist[kBins - 1 - (t * kPer + j)];
  sh_scan[t] = local;
  __syncthreads();
  // Hillis-Steele inclusive scan over kThreads entries (integers: order-free)
  for (int d = 1; d < kThreads; d <<= 1) {
    const unsigned long long add = t >= d ? sh_scan[t - d] : 0ull;
    __syncthreads();
    sh_scan[t] += add;
    __syncthreads();
  }
  unsigned long long run = sh_scan[t] - local;   // exclusive
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int bin = kBins - 1 - (t * kPer + j);
    const unsigned long long h = hist[bin];
    if (run < target && run + h >= target) { *out_digit = bin; *out_above = run; }
    run += h;
  }
  __syncthreads();
}

__device__ __forceinline__ float key_to_float(uint32_t key) {   // inverse of order_key
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Calls f(x, idx) for every token of the row (16-byte loads when the row is aligned).
template <int kThreads, typename T, typename F>
__device__ __forceinline__ void for_each_logit(const T* row, int V, F&& f) {
  constexpr int kN = VecN<T>::kN, kU = 4;
  int tail = 0;
  if (is_aligned16(row)) {
    const int nvec = V / kN;
    const uint4* src = reinterpret_cast<const uint4*>(row);
    for (int v0 = 0; v0 < nvec; v0 += kThreads * kU) {
      uint4 u[kU];
#pragma unroll
      for (int k = 0; k < kU; ++k) {
        const int vi = v0 + k * kThreads + threadIdx.x;
        if (vi < nvec) u[k] = __ldg(src + vi);
      }
#pragma unroll
      for (int k = 0; k < kU; ++k) {
        const int vi = v0 + k * kThreads + threadIdx.x;
        if (vi < nvec) {
          float x[kN];
          unpack16(u[k], x, static_cast<const T*>(nullptr));
#pragma unroll
          for (int e = 0; e < kN; ++e) f(x[e], vi * kN + e);
        }
      }
    }
    tail = nvec * kN;
  }
  for (int i = tail + threadIdx.x; i < V; i += kThreads) f(load_logit(row, i), i);
}

template <typename T>
__device__ void threshold_kernel(const SpecSampleParams& p) {
  constexpr int kThreads = SPEC_SAMPLE_THRESHOLD_THREADS;
  constexpr int kCand = SPEC_SAMPLE_THRESHOLD_CANDIDATES;
  __shared__ unsigned long long hist[2048];
  __shared__ unsigned long long scan[kThreads];
  __shared__ uint32_t cand[kCand];
  __shared__ int digit, n_cand;
  __shared__ unsigned long long above;
  __shared__ float sh_m[kThreads / 32];
  const int r = blockIdx.x;
  const int b = owner_of_row(p.cu_q, p.batch, r);
  const SeqParams sp = seq_params(p, b);
  if (!sp.filtered) return;
  // row max of s2 from the tile partials
  float m = -INFINITY;
  for (int t = threadIdx.x; t < p.num_tiles; t += kThreads)
    m = fmaxf(m, ws_tiles(p)[static_cast<int64_t>(r) * p.num_tiles + t].m);
  for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  if ((threadIdx.x & 31) == 0) sh_m[threadIdx.x >> 5] = m;
  __syncthreads();
  m = sh_m[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, sh_m[w]);
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  const int V = p.vocab;
  const float scale = sp.scale;
  const bool k_on = sp.top_k > 0 && sp.top_k < V;
  const bool p_on = sp.top_p < 1.f;
  uint32_t tau_k = 0, tau_p = 0;
  // phase 0: top-k by count over all tokens; phase 1: top-p by mass over keys >= tau_k
  for (int phase = 0; phase < 2; ++phase) {
    if (phase == 0 ? !k_on : !p_on) continue;
    const uint32_t key_floor = phase == 1 ? tau_k : 0u;
    // mass of one token (0 for NaN and keys below key_floor)
    auto mass = [&](float x) -> unsigned long long {
      if (phase == 0) return 1ull;
      // explicit roundings (no FMA contraction): passes A, B and the list rounds agree bit for bit
      const float e = x == -INFINITY ? 0.f : exp2f(__fsub_rn(__fmul_rn(x, scale), m));
      return static_cast<unsigned long long>(fminf(e, 1.f) * 4294967296.0f);
    };
    auto bucket_digit = [&](float x) -> int {   // 2047 = the bucket of the row max
      const float d = fminf(fmaxf(__fsub_rn(m, __fmul_rn(x, scale)) * 64.f, 0.f), 2047.f);
      return 2047 - static_cast<int>(d);
    };
    // --- pass A: bucket histogram
    for (int j = threadIdx.x; j < 2048; j += kThreads) hist[j] = 0ull;
    if (threadIdx.x == 0) { n_cand = 0; digit = 0; above = 0ull; }
    __syncthreads();
    for_each_logit<kThreads>(row, V, [&](float x, int) {
      if (isnan(x) || order_key(x) < key_floor) return;
      const unsigned long long add = mass(x);
      if (add) atomicAdd(&hist[bucket_digit(x)], add);
    });
    __syncthreads();
    unsigned long long target = phase == 0 ? static_cast<unsigned long long>(sp.top_k) : 0ull;
    if (phase == 1) {   // target = ceil(top_p * mass of the top-k set)
      unsigned long long tot = 0;
      for (int j = threadIdx.x; j < 2048; j += kThreads) tot += hist[j];
      scan[threadIdx.x] = tot;
      __syncthreads();
      if (threadIdx.x == 0) {
        unsigned long long all = 0;
        for (int j = 0; j < kThreads; ++j) all += scan[j];
        const double want = ceil(static_cast<double>(fmaxf(sp.top_p, 0.f)) * static_cast<double>(all));
        unsigned long long tg = static_cast<unsigned long long>(want);
        tg = tg < 1ull ? 1ull : (tg > all ? all : tg);
        scan[0] = tg;
      }
      __syncthreads();
      target = scan[0];
      __syncthreads();
    }
    find_digit<kThreads>(hist, target, scan, &digit, &above);
    const int bucket = digit;
    const unsigned long long target_in = target - above;
    // --- pass B: the keys of that bucket
    for_each_logit<kThreads>(row, V, [&](float x, int) {
      if (isnan(x) || order_key(x) < key_floor || bucket_digit(x) != bucket) return;
      if (mass(x) == 0ull) return;   // as pass A: zero-mass tokens are not in the histogram
      const int slot = atomicAdd(&n_cand, 1);
      if (slot < kCand) cand[slot] = order_key(x);
    });
    __syncthreads();
    const int nc = n_cand;
    const bool from_list = nc <= kCand;
    // --- radix rounds over the list (or, on overflow, over the row from scratch)
    uint32_t prefix = 0;
    unsigned long long tgt = from_list ? target_in : target;
    for (int round = 0; round < 3; ++round) {   // digits: bits 31..21, 20..10, 9..0
      const int sh = round == 0 ? 21 : round == 1 ? 10 : 0;
      const int width = round == 2 ? 10 : 11;
      const int hi_shift = sh + width;   // bits above this digit must match prefix
      for (int j = threadIdx.x; j < 2048; j += kThreads) hist[j] = 0ull;
      if (threadIdx.x == 0) { digit = 0; above = 0ull; }
      __syncthreads();
      auto count = [&](uint32_t key, float x) {
        if (hi_shift < 32 && (key >> hi_shift) != (prefix >> hi_shift)) return;
        const unsigned long long add = mass(x);
        if (add) atomicAdd(&hist[(key >> sh) & ((1u << width) - 1u)], add);
      };
      if (from_list) {
        for (int j = threadIdx.x; j < nc; j += kThreads) {
          const uint32_t key = cand[j];
          count(key, key_to_float(key));
        }
      } else {
        for_each_logit<kThreads>(row, V, [&](float x, int) {
          if (isnan(x)) return;
          const uint32_t key = order_key(x);
          if (key < key_floor) return;
          count(key, x);
        });
      }
      __syncthreads();
      find_digit<kThreads>(hist, tgt, scan, &digit, &above);
      prefix |= static_cast<uint32_t>(digit) << sh;
      tgt -= above;
      __syncthreads();
    }
    if (phase == 0) tau_k = prefix; else tau_p = prefix;
  }
  if (threadIdx.x == 0) {
    SpecSampleRow rs;
    rs.tau_key = max(tau_k, tau_p);
    rs.m = m;
    ws_rows(p)[r] = rs;
  }
}

// ------------------------------------------------------------------ 3. finish

struct RowStats {
  float m;        // row max of s2
  float z;        // sum of exp2(s2 - m) over counted tokens (one-hot draft excluded)
  float raw_max;
  int arg;
  uint32_t flags;
};

// One warp merges row r's tile partials (lane-strided in tile order, then the fixed shuffle
// tree): every warp that calls it gets the same bits, in every lane. No block barrier.
__device__ __forceinline__ RowStats warp_row_stats(const SpecSampleParams& p, int r) {
  const int lane = threadIdx.x & 31;
  Partial a = partial_empty();
  const SpecSampleTile* tl = ws_tiles(p) + static_cast<int64_t>(r) * p.num_tiles;
  for (int t = lane; t < p.num_tiles; t += 32) {
    const SpecSampleTile x = tl[t];
    Partial o;
    o.m = x.m; o.s = x.s; o.raw_max = x.raw_max; o.arg = x.arg; o.flags = x.flags;
    a = merge(a, o);
  }
  a = warp_merge(a);
  RowStats s;
  s.m = __shfl_sync(0xffffffffu, a.m, 0);
  s.z = __shfl_sync(0xffffffffu, a.s, 0);
  s.raw_max = __shfl_sync(0xffffffffu, a.raw_max, 0);
  s.arg = __shfl_sync(0xffffffffu, a.arg, 0);
  s.flags = __shfl_sync(0xffffffffu, a.flags, 0);
  return s;
}

// What the accept chain (warp 0) hands to the sampling step.
struct ChainResult {
  int n;              // accepted drafts = the sampling row
  int x;              // draft of the sampling row (-1 for the bonus row)
  float ex;           // its weight exp2(s2_x - m) if kept (0 otherwise)
  float m, z_full;    // row max of s2, sum of kept weights (x included)
  uint32_t tau_key;
};

// Index of target token x in the draft vocabulary (-1: not there).
__device__ __forceinline__ int draft_index(const SpecSampleParams& p, int x) {
  if (x < 0 || x >= p.vocab) return -1;
  if (p.d2t == nullptr) return x < p.draft_vocab ? x : -1;
  int lo = 0, hi = p.draft_vocab;   // lower_bound
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (__ldg(p.d2t + mid) < x) lo = mid + 1; else hi = mid;
  }
  return (lo < p.draft_vocab && __ldg(p.d2t + lo) == x) ? lo : -1;
}

// Draft probabilities of one target tile gathered into shared memory (0 outside the draft vocab).
template <int kThreads>
__device__ void gather_q_tile(const SpecSampleParams& p, const float* qrow, int base, float* q_sh,
                              int* sh_range) {
  for (int j = threadIdx.x; j < kTile; j += kThreads) q_sh[j] = 0.f;
  __syncthreads();
  if (p.d2t == nullptr) {
    for (int j = threadIdx.x; j < kTile; j += kThreads) {
      const int t = base + j;
      if (t < p.vocab && t < p.draft_vocab) q_sh[j] = qrow[t];
    }
  } else {
    if (threadIdx.x < 2) {   // [lo, hi): draft ids whose target lies in this tile
      const int want = base + threadIdx.x * kTile;
      int lo = 0, hi = p.draft_vocab;
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (__ldg(p.d2t + mid) < want) lo = mid + 1; else hi = mid;
      }
      sh_range[threadIdx.x] = lo;
    }
    __syncthreads();
    for (int j = sh_range[0] + threadIdx.x; j < sh_range[1]; j += kThreads) {
      const int t = __ldg(p.d2t + j) - base;
      if (t >= 0 && t < kTile) q_sh[t] = qrow[j];
    }
  }
  __syncthreads();
}

template <typename T>
__device__ void finish_kernel(const SpecSampleParams& p) {
  constexpr int kThreads = SPEC_SAMPLE_FINISH_THREADS;
  constexpr int kWarps = kThreads / 32;
  __shared__ KeyArg sh_arg[kWarps];
  __shared__ float sh_sum[kWarps];
  __shared__ float w_tile[SPEC_SAMPLE_MAX_TILES];
  __shared__ float q_sh[kTile];
  __shared__ int sh_range[2];
  __shared__ uint32_t sh_flags;
  __shared__ int sh_empty, sh_bad, sh_tile, sh_use_p;
  __shared__ ChainResult sh_chain;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.x;
  const int W = p.width;
  int32_t* em = p.emitted + static_cast<int64_t>(b) * p.emitted_stride;
  float* lp = p.logprobs ? p.logprobs + static_cast<int64_t>(b) * p.logprobs_stride : nullptr;
  for (int j = threadIdx.x; j < W; j += kThreads) {   // padding first; tokens overwrite below
    em[j] = -1;
    if (lp) lp[j] = 0.f;
  }
  if (threadIdx.x == 0) { sh_flags = 0u; sh_empty = 0; sh_bad = 0; }
  __syncthreads();
  const int r0 = __ldg(p.cu_q + b), r1 = __ldg(p.cu_q + b + 1);
  const int q = r1 - r0;
  if (q < 1 || q > W || r0 < 0 || r1 > p.num_rows || r0 - b < 0 || r1 - b - 1 > p.num_rows - p.batch) {
    if (threadIdx.x == 0) { p.num_accepted[b] = 0; p.status[b] = SPEC_SAMPLE_BAD_LAYOUT; }
    return;
  }
  const int k = q - 1;
  const int dbase = r0 - b;
  const SeqParams sp = seq_params(p, b);
  const uint64_t seed = __ldg(p.seed + b);
  const int64_t step = __ldg(p.step + b);

  // --- phase A: flags and emptiness of every row (warp w: rows w, w + 8, ...), draft ids
  for (int i = warp; i < q; i += kWarps) {
    const RowStats s = warp_row_stats(p, r0 + i);
    if (lane == 0) {
      if (s.flags) atomicOr(&sh_flags, s.flags);
      if (sp.greedy ? (s.arg < 0) : !(s.m > -INFINITY)) atomicOr(&sh_empty, 1);
    }
  }
  for (int j = threadIdx.x; j < k; j += kThreads) {
    const int x = __ldg(p.draft_ids + dbase + j);
    const bool ok = p.draft_probs ? draft_index(p, x) >= 0 : (x >= 0 && x < p.vocab);
    if (!ok) atomicOr(&sh_bad, 1);
  }
  __syncthreads();
  const uint32_t flags = sh_flags;
  const bool empty = sh_empty != 0;
  const bool bad_draft = sh_bad != 0;
  const int st = flags ? SPEC_SAMPLE_NONFINITE : empty ? SPEC_SAMPLE_EMPTY
               : bad_draft ? SPEC_SAMPLE_BAD_DRAFT : SPEC_SAMPLE_OK;
  const bool invalid = sp.greedy ? empty : (st == SPEC_SAMPLE_NONFINITE || st == SPEC_SAMPLE_EMPTY);
  if (invalid) {
    if (threadIdx.x == 0) { p.num_accepted[b] = 0; p.status[b] = st; }
    return;
  }

  // --- greedy (warp 0 alone): accept while draft == argmax, then emit the argmax
  if (sp.greedy) {
    if (warp != 0) return;
    int n = 0;
    for (int i = 0; i < q; ++i) {
      const RowStats s = warp_row_stats(p, r0 + i);
      const float lz = s.z > 0.f ? log2f(s.z) : 0.f;   // log2 of sum exp2(s2 - m)
      const float lpv = (s.raw_max * kLog2e - s.m - lz) * kLn2;
      if (lane == 0) {
        em[i] = s.arg;
        if (lp) lp[i] = lpv;
      }
      n = i;
      if (i == k || __ldg(p.draft_ids + dbase + i) != s.arg) break;
    }
    if (lane == 0) { p.num_accepted[b] = n; p.status[b] = st; }
    return;
  }

  // --- sampled: accept chain (warp 0; every lane computes the same values)
  const T* logits = static_cast<const T*>(p.logits);
  const bool onehot = p.draft_probs == nullptr;
  if (warp == 0) {
    int n = k;
    RowStats s;
    float z_full = 0.f, ex_rej = 0.f;
    uint32_t tau_key = 0;
    int x = -1;
    for (int i = 0; i < q; ++i) {
      const int r = r0 + i;
      s = warp_row_stats(p, r);
      tau_key = sp.filtered ? ws_rows(p)[r].tau_key : 0u;
      const T* row = logits + static_cast<int64_t>(r) * p.logits_stride;
      if (i == k) { z_full = s.z; x = -1; break; }
      x = __ldg(p.draft_ids + dbase + i);
      const int jd = onehot ? ((x >= 0 && x < p.vocab) ? x : -1) : draft_index(p, x);
      float px = 0.f, ex = 0.f;
      if (x >= 0 && x < p.vocab) {
        const float lx = load_logit(row, x);
        const float sx = lx * sp.scale;
        if (lx != -INFINITY && (!sp.filtered || kept(lx, sx, tau_key, s.m, sp.min_p))) ex = exp2f(sx - s.m);
      }
      z_full = onehot ? s.z + ex : s.z;    // one-hot rows left x out of the tile sums
      px = z_full > 0.f ? ex / z_full : 0.f;
      bool accept = false;
      if (jd >= 0) {
        const float qx = onehot ? 1.f
            : p.draft_probs[static_cast<int64_t>(dbase + i) * p.draft_probs_stride + jd];
        const float u = philox_uniform24(spec_bits(seed, step, i, kPurposeAccept, 0));
        accept = u * qx < px;
      }
      if (lane == 0 && accept) {
        em[i] = x;
        if (lp) lp[i] = logf(px);
      }
      if (!accept) { n = i; ex_rej = ex; break; }
    }
    if (lane == 0) {
      ChainResult c;
      c.n = n; c.x = x; c.ex = ex_rej; c.m = s.m; c.z_full = z_full; c.tau_key = tau_key;
      sh_chain = c;
    }
  }
  __syncthreads();
  const ChainResult ch = sh_chain;
  const int n = ch.n;
  const int x = ch.x;
  const float z_full = ch.z_full;
  const uint32_t tau_key = ch.tau_key;
  RowStats s;
  s.m = ch.m;
  const int i = n;                         // the sampling row
  const int r = r0 + i;
  const T* row = logits + static_cast<int64_t>(r) * p.logits_stride;
  const float* qrow = (!onehot && i < k)
      ? p.draft_probs + static_cast<int64_t>(dbase + i) * p.draft_probs_stride : nullptr;
  const int excl = (onehot && i < k) ? x : -1;   // one-hot residual: p without x
  const SpecSampleTile* tl = ws_tiles(p) + static_cast<int64_t>(r) * p.num_tiles;
  const float inv_z = z_full > 0.f ? 1.f / z_full : 0.f;

  // tile weights (relative units: exp2(s2 - m))
  if (qrow == nullptr) {
    for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
      const SpecSampleTile x_t = tl[t];
      w_tile[t] = scaled_sum(x_t.m, x_t.s, s.m);
    }
  } else {
    // residual max(0, p - q) per tile: one pass over this row and its draft probabilities
    for (int t = 0; t < p.num_tiles; ++t) {
      gather_q_tile<kThreads>(p, qrow, t * kTile, q_sh, sh_range);
      float acc = 0.f;
      for (int j = threadIdx.x; j < kTile; j += kThreads) {
        const int tok = t * kTile + j;
        if (tok >= p.vocab) break;
        const float l = load_logit(row, tok);
        const float s2 = l * sp.scale;
        float pt = 0.f;
        if (l != -INFINITY && (!sp.filtered || kept(l, s2, tau_key, s.m, sp.min_p)))
          pt = exp2f(s2 - s.m) * inv_z;
        acc += fmaxf(0.f, pt - q_sh[j]);
      }
      const float wsum = block_sum<kThreads>(acc, sh_sum);
      if (threadIdx.x == 0) w_tile[t] = wsum;
    }
  }
  __syncthreads();
  // level 1 (warp 0): total mass, the fallback to p, the tile race
  if (warp == 0) {
    float tot = 0.f;
    for (int t = lane; t < p.num_tiles; t += 32) tot += w_tile[t];
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, d);
    const bool use_p = !(tot > 0.f);   // e.g. p == q: sample p itself
    const int x_tile = (excl >= 0 && excl < p.vocab) ? excl / kTile : -1;
    KeyArg best;
    best.key = -INFINITY; best.idx = -1;
    for (int t = lane; t < p.num_tiles; t += 32) {
      float w = w_tile[t];
      if (use_p) {   // p's tile sums: one-hot rows add back the draft they left out
        const SpecSampleTile x_t = tl[t];
        w = scaled_sum(x_t.m, x_t.s, s.m) + (t == x_tile ? ch.ex : 0.f);
      }
      if (w > 0.f) {
        KeyArg c;
        c.key = log2f(w) - log2f(philox_exponential(spec_bits(seed, step, i, kPurposeTile, t)));
        c.idx = t;
        best = better(best, c);
      }
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      KeyArg o;
      o.key = __shfl_down_sync(0xffffffffu, best.key, d);
      o.idx = __shfl_down_sync(0xffffffffu, best.idx, d);
      best = better(best, o);
    }
    if (lane == 0) { sh_tile = best.idx < 0 ? 0 : best.idx; sh_use_p = use_p; }
  }
  __syncthreads();
  const int tile = sh_tile;
  const bool use_p = sh_use_p != 0;
  // level 2: the token inside the tile
  if (qrow != nullptr && !use_p) gather_q_tile<kThreads>(p, qrow, tile * kTile, q_sh, sh_range);
  KeyArg tb;
  tb.key = -INFINITY; tb.idx = -1;
  for (int j = threadIdx.x; j < kTile; j += kThreads) {
    const int tok = tile * kTile + j;
    if (tok >= p.vocab) break;
    const float l = load_logit(row, tok);
    const float s2 = l * sp.scale;
    if (l == -INFINITY || isnan(l)) continue;
    if (sp.filtered && !kept(l, s2, tau_key, s.m, sp.min_p)) continue;
    float lw;   // log2 of the weight
    if (qrow != nullptr && !use_p) {
      const float w = exp2f(s2 - s.m) * inv_z - q_sh[j];
      if (!(w > 0.f)) continue;
      lw = log2f(w);
    } else {
      if (tok == excl && !use_p) continue;
      lw = s2 - s.m;
    }
    KeyArg c;
    c.key = lw - log2f(philox_exponential(spec_bits(seed, step, i, kPurposeToken, tok)));
    c.idx = tok;
    tb = better(tb, c);
  }
  tb = block_argmax<kThreads>(tb, sh_arg);
  if (threadIdx.x == 0) {
    const int tok = tb.idx;
    em[i] = tok;
    if (lp) {
      float v = -INFINITY;
      if (tok >= 0 && z_full > 0.f) v = (load_logit(row, tok) * sp.scale - s.m - log2f(z_full)) * kLn2;
      lp[i] = v;
    }
    p.num_accepted[b] = n;
    p.status[b] = tok < 0 ? SPEC_SAMPLE_EMPTY : st;
  }
}

}  // namespace

#define SPEC_SAMPLE_KERNELS(NAME, T)                                                          \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_TILE_THREADS, SPEC_SAMPLE_TILE_CTAS_PER_SM)               \
  spec_sample_tiles_##NAME(const SpecSampleParams p) { tiles_kernel<T>(p); }                 \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_THRESHOLD_THREADS, 1)             \
  spec_sample_threshold_##NAME(const SpecSampleParams p) { threshold_kernel<T>(p); }         \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_FINISH_THREADS, 1)                \
  spec_sample_finish_##NAME(const SpecSampleParams p) { finish_kernel<T>(p); }

SPEC_SAMPLE_KERNELS(f32, float)
SPEC_SAMPLE_KERNELS(f16, __half)
SPEC_SAMPLE_KERNELS(bf16, bf16_t)
