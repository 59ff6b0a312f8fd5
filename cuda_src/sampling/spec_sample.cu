// spec_sample: exact speculative (rejection) sampling straight from target logits.
//
// Contract and exact semantics: specdec_lib/reference/sampling.py (the spec). Shapes:
// logits [T, V] (f32/f16/bf16, rows of B ragged verify blocks given by cu_q [B+1]),
// draft_ids [T-B], optional draft_probs [T-B, Vd] (+ d2t [Vd]); outputs num_accepted [B],
// emitted [B, W], status [B], optional logprobs [B, W].
//
// Three kernels, launched in this order on one stream:
//  1. spec_sample_tiles_<dt>     grid (ceil(num_tiles / tiles_per_cta), T): the vocab is split
//     across CTAs so batch 1 fills the GPU. Per (row, 2048-token tile) it writes max /
//     sum-exp / raw argmax / NaN-inf flags: the logits are read once, in their own dtype.
//     The one-hot draft token of a row is left out of the tile sums, so the tile sums are
//     directly the weights of the rejection residual p - onehot(x).
//  2. spec_sample_threshold_<dt> grid T: only rows whose request uses top-k / top-p: a radix
//     select (11-bit digits, 3 rounds for top-k by count, 3 for top-p by fixed-point mass)
//     over the row's raw-logit keys finds the keep threshold without sorting; then
//     spec_sample_tiles_<dt> runs again with filtered_pass=1 to recompute the tile sums of
//     those rows over the kept set (min-p needs only the row max: it is a per-token test).
//  3. spec_sample_finish_<dt>    grid B: one CTA per sequence merges the tile partials of its
//     rows (fixed order: deterministic), walks the accept chain (Philox uniform per row),
//     and samples the correction / bonus token with the two-level exponential race: pick a
//     tile from the tile weights, then a token inside that one tile (2048 logits re-read).
//     With draft_probs the residual max(0, p - q) is not known per tile from pass 1, so this
//     CTA recomputes it over the rejected row (one row read); a known cost of that mode.
//
// Numbers: s2 = logit * log2(e) / temperature so every exponential is one exp2. Greedy rows
// compare raw logits (bit-exact with the reference: NaN never wins, lowest id on ties).
// Nothing faults on NaN / inf / bad ids / bad cu_q: such rows get a status code.
#include <math.h>
#include "common/dtype.cuh"
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

// Sequence owning row t: the last b with cu_q[b] <= t (clamped; bad cu_q gives some b).
__device__ __forceinline__ int owner_of_row(const int32_t* cu_q, int batch, int t) {
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (__ldg(cu_q + mid) <= t) lo = mid; else hi = mid;
  }
  return lo;
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
__device__ __forceinline__ bool kept(float logit, float s2, uint32_t tau_key, float row_m,
                                     float min_p) {
  if (order_key(logit) < tau_key) return false;
  return !(min_p > 0.f) || exp2f(s2 - row_m) >= min_p;
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

// Block merge in a fixed tree (lane order, then warp order): the float sums are summed in
// the same order on every run (deterministic). Result valid in thread 0.
template <int kThreads>
__device__ __forceinline__ Partial block_merge(Partial v, Partial* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const Partial o = shfl_down(v, d);
    if ((lane & (2 * d - 1)) == 0 && lane + d < 32) v = merge(v, o);
  }
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) v = merge(v, sh[w]);
  }
  return v;
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

// ------------------------------------------------------------------ 1. tile partials

template <typename T>
__device__ void tiles_kernel(const SpecSampleParams& p) {
  constexpr int kThreads = SPEC_SAMPLE_TILE_THREADS;
  constexpr int kPer = kTile / kThreads;
  __shared__ Partial sh[kThreads / 32];
  const int r = blockIdx.x;   // rows on x (up to 2^31-1), vocab chunks on y (<= 1024)
  const int b = owner_of_row(p.cu_q, p.batch, r);
  const SeqParams sp = seq_params(p, b);
  if (p.filtered_pass && !sp.filtered) return;
  const int r0 = __ldg(p.cu_q + b);
  const int q = __ldg(p.cu_q + b + 1) - r0;
  const int i = r - r0;
  const int excl = sp.greedy ? -1 : excluded_draft(p, b, i, q);
  uint32_t tau_key = 0;
  float row_m = 0.f;
  if (p.filtered_pass) {
    const SpecSampleRow rs = ws_rows(p)[r];
    tau_key = rs.tau_key;
    row_m = rs.m;
  }
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  const int t_begin = blockIdx.y * p.tiles_per_cta;
  const int t_end = min(p.num_tiles, t_begin + p.tiles_per_cta);
  for (int tile = t_begin; tile < t_end; ++tile) {
    const int base = tile * kTile;
    float v[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {   // all loads first: kPer in flight per thread
      const int idx = base + j * kThreads + threadIdx.x;
      v[j] = idx < p.vocab ? load_logit(row, idx) : NAN;
    }
    // thread-local: ids base + j*kThreads + tid increase with j, so strict > keeps the lowest
    Partial a = partial_empty();
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int idx = base + j * kThreads + threadIdx.x;
      const float x = v[j];
      if (idx >= p.vocab) continue;
      if (isnan(x)) { a.flags |= kFlagNaN; continue; }
      if (x == INFINITY) a.flags |= kFlagPosInf;
      if (a.arg < 0 || x > a.raw_max) { a.raw_max = x; a.arg = idx; }
      if (x == -INFINITY) continue;   // weight 0, never the max of s2
      const float s2 = x * sp.scale;
      const bool counted = idx != excl &&
          (!p.filtered_pass || kept(x, s2, tau_key, row_m, sp.min_p));
      if (s2 > a.m) {
        a.s = (a.s > 0.f ? a.s * exp2f(a.m - s2) : 0.f) + (counted ? 1.f : 0.f);
        a.m = s2;
      } else if (counted) {
        a.s += exp2f(s2 - a.m);
      }
    }
    a = block_merge<kThreads>(a, sh);
    if (threadIdx.x == 0) {
      SpecSampleTile out;
      out.m = a.m; out.s = a.s; out.raw_max = a.raw_max; out.arg = a.arg; out.flags = a.flags;
      ws_tiles(p)[static_cast<int64_t>(r) * p.num_tiles + tile] = out;
    }
  }
}

// ------------------------------------------------------------------ 2. filter threshold

// Largest digit d with sum(hist[> d]) < target <= sum(hist[>= d]); returns d and the sum
// above it (2048 bins, 2048 / kThreads per thread; digits wider than a round's are empty).
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

template <typename T>
__device__ void threshold_kernel(const SpecSampleParams& p) {
  constexpr int kThreads = SPEC_SAMPLE_THRESHOLD_THREADS;
  constexpr int kUnroll = 8;
  __shared__ unsigned long long hist[2048];
  __shared__ unsigned long long scan[kThreads];
  __shared__ int digit;
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
  const bool k_on = sp.top_k > 0 && sp.top_k < V;
  const bool p_on = sp.top_p < 1.f;
  uint32_t tau_k = 0, tau_p = 0;
  // phase 0: top-k by count over all tokens; phase 1: top-p by mass over keys >= tau_k
  for (int phase = 0; phase < 2; ++phase) {
    if (phase == 0 ? !k_on : !p_on) continue;
    uint32_t prefix = 0;
    unsigned long long target = phase == 0 ? static_cast<unsigned long long>(sp.top_k) : 0ull;
    for (int round = 0; round < 3; ++round) {   // digits: bits 31..21, 20..10, 9..0
      const int sh = round == 0 ? 21 : round == 1 ? 10 : 0;
      const int width = round == 2 ? 10 : 11;
      const int hi_shift = sh + width;   // bits above this digit must match prefix
      for (int j = threadIdx.x; j < 2048; j += kThreads) hist[j] = 0ull;
      __syncthreads();
      for (int base = 0; base < V; base += kThreads * kUnroll) {
        float v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int idx = base + u * kThreads + threadIdx.x;
          v[u] = idx < V ? load_logit(row, idx) : NAN;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int idx = base + u * kThreads + threadIdx.x;
          if (idx >= V || isnan(v[u])) continue;
          const uint32_t key = order_key(v[u]);
          if (hi_shift < 32 && (key >> hi_shift) != (prefix >> hi_shift)) continue;
          if (phase == 1 && key < tau_k) continue;
          unsigned long long add = 1ull;
          if (phase == 1) {
            const float e = v[u] == -INFINITY ? 0.f : exp2f(v[u] * sp.scale - m);
            add = static_cast<unsigned long long>(fminf(e, 1.f) * 4294967296.0f);
          }
          atomicAdd(&hist[(key >> sh) & ((1u << width) - 1u)], add);
        }
      }
      __syncthreads();
      if (phase == 1 && round == 0) {   // target = ceil(top_p * mass of the top-k set)
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
      if (threadIdx.x == 0) { digit = 0; above = 0ull; }
      __syncthreads();
      find_digit<kThreads>(hist, target, scan, &digit, &above);
      prefix |= static_cast<uint32_t>(digit) << sh;
      target -= above;
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

template <int kThreads>
__device__ RowStats merge_row(const SpecSampleParams& p, int r, Partial* sh, RowStats* out) {
  // each thread merges tiles tid, tid + kThreads, ... in order, then a fixed block tree
  Partial a = partial_empty();
  const SpecSampleTile* tl = ws_tiles(p) + static_cast<int64_t>(r) * p.num_tiles;
  for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
    const SpecSampleTile x = tl[t];
    Partial o;
    o.m = x.m; o.s = x.s; o.raw_max = x.raw_max; o.arg = x.arg; o.flags = x.flags;
    a = merge(a, o);
  }
  a = block_merge<kThreads>(a, sh);
  if (threadIdx.x == 0) {
    RowStats s;
    s.m = a.m; s.z = a.s; s.raw_max = a.raw_max; s.arg = a.arg; s.flags = a.flags;
    *out = s;
  }
  __syncthreads();
  const RowStats s = *out;
  __syncthreads();
  return s;
}

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
  __shared__ Partial sh[kThreads / 32];
  __shared__ RowStats sh_row;
  __shared__ KeyArg sh_arg[kThreads / 32];
  __shared__ float sh_sum[kThreads / 32];
  __shared__ float w_tile[SPEC_SAMPLE_MAX_TILES];
  __shared__ float q_sh[kTile];
  __shared__ int sh_range[2];
  __shared__ int sh_flag;
  const int b = blockIdx.x;
  const int W = p.width;
  int32_t* em = p.emitted + static_cast<int64_t>(b) * p.emitted_stride;
  float* lp = p.logprobs ? p.logprobs + static_cast<int64_t>(b) * p.logprobs_stride : nullptr;
  for (int j = threadIdx.x; j < W; j += kThreads) {   // padding first; tokens overwrite below
    em[j] = -1;
    if (lp) lp[j] = 0.f;
  }
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

  // --- phase A: flags and emptiness of every row, draft ids in range
  uint32_t flags = 0;
  bool empty = false;
  for (int i = 0; i < q; ++i) {
    const RowStats s = merge_row<kThreads>(p, r0 + i, sh, &sh_row);
    flags |= s.flags;
    empty |= sp.greedy ? (s.arg < 0) : !(s.m > -INFINITY);
  }
  if (threadIdx.x == 0) sh_flag = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < k; j += kThreads) {
    const int x = __ldg(p.draft_ids + dbase + j);
    const bool ok = p.draft_probs ? draft_index(p, x) >= 0 : (x >= 0 && x < p.vocab);
    if (!ok) atomicOr(&sh_flag, 1);
  }
  __syncthreads();
  const bool bad_draft = sh_flag != 0;
  const int st = flags ? SPEC_SAMPLE_NONFINITE : empty ? SPEC_SAMPLE_EMPTY
               : bad_draft ? SPEC_SAMPLE_BAD_DRAFT : SPEC_SAMPLE_OK;
  const bool invalid = sp.greedy ? empty : (st == SPEC_SAMPLE_NONFINITE || st == SPEC_SAMPLE_EMPTY);
  if (invalid) {
    if (threadIdx.x == 0) { p.num_accepted[b] = 0; p.status[b] = st; }
    return;
  }

  // --- greedy: accept while draft == argmax, then emit the argmax
  if (sp.greedy) {
    int n = 0;
    for (int i = 0; i < q; ++i) {
      const RowStats s = merge_row<kThreads>(p, r0 + i, sh, &sh_row);
      const float lz = s.z > 0.f ? log2f(s.z) : 0.f;   // log2 of sum exp2(s2 - m)
      const float lpv = (s.raw_max * kLog2e - s.m - lz) * kLn2;
      if (threadIdx.x == 0) {
        em[i] = s.arg;
        if (lp) lp[i] = lpv;
      }
      n = i;
      if (i == k || __ldg(p.draft_ids + dbase + i) != s.arg) break;
    }
    if (threadIdx.x == 0) { p.num_accepted[b] = n; p.status[b] = st; }
    return;
  }

  // --- sampled: accept chain
  const T* logits = static_cast<const T*>(p.logits);
  const bool onehot = p.draft_probs == nullptr;
  int n = k;
  RowStats s;
  float z_full = 0.f;
  uint32_t tau_key = 0;
  int x = -1;
  for (int i = 0; i < q; ++i) {
    const int r = r0 + i;
    s = merge_row<kThreads>(p, r, sh, &sh_row);
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
    if (threadIdx.x == 0 && accept) {
      em[i] = x;
      if (lp) lp[i] = logf(px);
    }
    if (!accept) { n = i; break; }
  }
  const int i = n;                         // the sampling row
  const int r = r0 + i;
  const T* row = logits + static_cast<int64_t>(r) * p.logits_stride;
  const float* qrow = (!onehot && i < k)
      ? p.draft_probs + static_cast<int64_t>(dbase + i) * p.draft_probs_stride : nullptr;
  const int excl = (onehot && i < k) ? x : -1;   // one-hot residual: p without x
  const SpecSampleTile* tl = ws_tiles(p) + static_cast<int64_t>(r) * p.num_tiles;
  const float inv_z = z_full > 0.f ? 1.f / z_full : 0.f;

  // tile weights (relative units: exp2(s2 - m))
  bool use_p = false;   // the residual has no mass: sample p itself
  if (qrow == nullptr) {
    for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
      const SpecSampleTile x_t = tl[t];
      w_tile[t] = scaled_sum(x_t.m, x_t.s, s.m);
    }
    __syncthreads();
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
      __syncthreads();
    }
  }
  float tot = 0.f;
  for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) tot += w_tile[t];
  tot = block_sum<kThreads>(tot, sh_sum);
  if (!(tot > 0.f)) {   // e.g. p == q: fall back to p (its tile sums incl. x: recompute cheaply)
    use_p = true;
    for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
      const SpecSampleTile x_t = tl[t];
      w_tile[t] = scaled_sum(x_t.m, x_t.s, s.m);
    }
    __syncthreads();
  }
  // level 1: the tile
  KeyArg best;
  best.key = -INFINITY; best.idx = -1;
  for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
    const float w = w_tile[t];
    if (w > 0.f) {
      KeyArg c;
      c.key = log2f(w) - log2f(philox_exponential(spec_bits(seed, step, i, kPurposeTile, t)));
      c.idx = t;
      best = better(best, c);
    }
  }
  best = block_argmax<kThreads>(best, sh_arg);
  const int tile = best.idx < 0 ? 0 : best.idx;
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
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_TILE_THREADS)                     \
  spec_sample_tiles_##NAME(const SpecSampleParams p) { tiles_kernel<T>(p); }                 \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_THRESHOLD_THREADS)                \
  spec_sample_threshold_##NAME(const SpecSampleParams p) { threshold_kernel<T>(p); }         \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_FINISH_THREADS)                   \
  spec_sample_finish_##NAME(const SpecSampleParams p) { finish_kernel<T>(p); }

SPEC_SAMPLE_KERNELS(f32, float)
SPEC_SAMPLE_KERNELS(f16, __half)
SPEC_SAMPLE_KERNELS(bf16, bf16_t)
