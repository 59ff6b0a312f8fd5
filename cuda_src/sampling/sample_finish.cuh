// spec_sample pass 3: merge tile partials, walk the accept chain, race the tiles,
// sample the token. Included by spec_sample.cu only.
#pragma once
#include "sampling/sample_common.cuh"

using namespace specdec;

namespace {

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

// Everything the accept chain needs from block row i. One warp computes it (all lanes equal),
// so finish evaluates all rows of a block at once and the chain itself is a scan.
struct RowEval {
  RowStats s;
  int x;              // the row's draft (-1 on the last row)
  int accept;         // greedy: x == argmax; sampled: u * q(x) < p(x). 0 on the last row
  float ex;           // sampled: weight exp2(s2_x - m) of x if kept, else 0
  float px;           // sampled: p(x)
  float z_full;       // sampled: kept mass of the row (x included)
  uint32_t tau_key;
};

template <typename T>
__device__ __forceinline__ RowEval row_eval(const SpecSampleParams& p, const SeqParams& sp, int r0,
                                            int dbase, int k, int i, uint64_t seed, int64_t step) {
  const int r = r0 + i;
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  const bool onehot = p.draft_probs == nullptr;
  RowEval e;
  // the draft's logit is loaded before the tile merge (independent loads in flight together)
  e.x = i < k ? __ldg(p.draft_ids + dbase + i) : -1;
  const bool in_range = e.x >= 0 && e.x < p.vocab;
  const float lx = (!sp.greedy && in_range) ? load_logit(row, e.x) : -INFINITY;
  e.tau_key = (sp.filtered && !p.no_filters) ? ws_rows(p)[r].tau_key : 0u;
  e.s = warp_row_stats(p, r);
  e.ex = 0.f; e.px = 0.f; e.z_full = e.s.z; e.accept = 0;
  if (sp.greedy) {
    e.accept = i < k && e.x == e.s.arg;
    return e;
  }
  if (i >= k) return e;
  const int jd = onehot ? (in_range ? e.x : -1) : draft_index(p, e.x);
  if (in_range) {
    const float sx = lx * sp.scale;
    if (lx != -INFINITY && (!sp.filtered || kept(lx, sx, e.tau_key, e.s.m, sp.min_p)))
      e.ex = exp2f(sx - e.s.m);
  }
  e.z_full = onehot ? e.s.z + e.ex : e.s.z;   // one-hot rows left x out of the tile sums
  e.px = e.z_full > 0.f ? e.ex / e.z_full : 0.f;
  if (jd >= 0) {
    const float qx = onehot ? 1.f
        : p.draft_probs[static_cast<int64_t>(dbase + i) * p.draft_probs_stride + jd];
    const float u = philox_uniform24(spec_bits(seed, step, i, kPurposeAccept, 0));
    e.accept = u * qx < e.px;
  }
  return e;
}

// Level 1 of the race, one tile: residual weight w and p's weight wp share one noise.
__device__ __forceinline__ void race_tile(uint64_t seed, int64_t step, int row, int t, float w,
                                          float wp, int& any, KeyArg& best_r, KeyArg& best_p) {
  any |= w > 0.f;
  if (w > 0.f || wp > 0.f) {
    const float le = log2f(philox_exponential(spec_bits(seed, step, row, kPurposeTile, t)));
    KeyArg c;
    c.idx = t;
    if (w > 0.f) { c.key = log2f(w) - le; best_r = better(best_r, c); }
    if (wp > 0.f) { c.key = log2f(wp) - le; best_p = better(best_p, c); }
  }
}

// Level 2 of the race, one token of logit l: its key joins best if the filters keep it and it
// is not `skip` (the one-hot draft of a residual race). -inf weighs nothing.
__device__ __forceinline__ void race_token(KeyArg& best, float l, int tok, int skip, const SeqParams& sp,
                                           uint32_t tau, float m, uint64_t seed, int64_t step, int row) {
  if (l == -INFINITY || tok == skip) return;
  const float s2 = __fmul_rn(l, sp.scale);
  if (sp.filtered && !kept(l, s2, tau, m, sp.min_p)) return;
  KeyArg c;
  c.key = __fsub_rn(s2, m) - log2f(philox_exponential(spec_bits(seed, step, row, kPurposeToken, tok)));
  c.idx = tok;
  best = better(best, c);
}

// Warp-wide argmax a and argmax b, in every lane (better() picks the same winner in any order).
__device__ __forceinline__ void warp_race2(KeyArg& a, KeyArg& b) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    KeyArg o;
    o.key = __shfl_xor_sync(0xffffffffu, a.key, d);
    o.idx = __shfl_xor_sync(0xffffffffu, a.idx, d);
    a = better(a, o);
    o.key = __shfl_xor_sync(0xffffffffu, b.key, d);
    o.idx = __shfl_xor_sync(0xffffffffu, b.idx, d);
    b = better(b, o);
  }
}

// Block-wide (any, argmax a, argmax b): one barrier round for the level-1 tile race.
template <int kThreads>
__device__ __forceinline__ void block_race2(int& any, KeyArg& a, KeyArg& b, KeyArg* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  any = __syncthreads_or(any);
  warp_race2(a, b);
  if (lane == 0) { sh[2 * warp] = a; sh[2 * warp + 1] = b; }
  __syncthreads();
  a = sh[0]; b = sh[1];
  for (int w = 1; w < kThreads / 32; ++w) { a = better(a, sh[2 * w]); b = better(b, sh[2 * w + 1]); }
  __syncthreads();
}

template <typename T>
__device__ void finish_kernel(const SpecSampleParams& p) {
  constexpr int kThreads = SPEC_SAMPLE_FINISH_THREADS;
  constexpr int kWarps = kThreads / 32;
  constexpr int kRows = SPEC_SAMPLE_FINISH_ROWS;
  constexpr int kPer = kTile / kThreads;
  __shared__ KeyArg sh_arg[2 * kWarps];
  __shared__ float sh_sum[kWarps];
  __shared__ float w_tile[SPEC_SAMPLE_MAX_TILES];
  __shared__ float q_sh[kTile];
  __shared__ RowEval sh_eval[kRows];
  __shared__ int sh_range[2];
  __shared__ uint32_t sh_flags;
  __shared__ int sh_empty, sh_bad;
  __shared__ ChainResult sh_chain;
  pdl_wait();   // launched right after the tile pass / hist: their records must be in
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
  if (!block_layout_ok(p, b, r0, r1)) {
    if (threadIdx.x == 0) { p.num_accepted[b] = 0; p.status[b] = SPEC_SAMPLE_BAD_LAYOUT; }
    return;
  }
  const int k = q - 1;
  const int dbase = r0 - b;
  const SeqParams sp = seq_params(p, b);
  if (p.no_filters && sp.filtered) {   // the threshold was never computed: flag, never guess
    if (threadIdx.x == 0) { p.num_accepted[b] = 0; p.status[b] = SPEC_SAMPLE_FILTER_SKIPPED; }
    return;
  }
  const uint64_t seed = __ldg(p.seed + b);
  const int64_t step = __ldg(p.step + b);

  // --- phase A: every row in parallel (warp w: rows w, w + 16, ...): stats, flags, the accept
  // decision of its draft; the draft ids' range check
  for (int i = warp; i < q; i += kWarps) {
    const RowEval e = row_eval<T>(p, sp, r0, dbase, k, i, seed, step);
    if (lane == 0) {
      if (e.s.flags) atomicOr(&sh_flags, e.s.flags);
      if (sp.greedy ? (e.s.arg < 0) : !(e.s.m > -INFINITY)) atomicOr(&sh_empty, 1);
      if (i < kRows) sh_eval[i] = e;
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
  bool invalid;
  const int st = block_status(flags, empty, bad_draft, sp.greedy, invalid);
  if (invalid) {
    if (threadIdx.x == 0) { p.num_accepted[b] = 0; p.status[b] = st; }
    return;
  }

  // --- the accept chain (warp 0): a scan of the rows' decisions (rows past kRows: evaluated here)
  if (warp == 0) {
    int n = k;
    RowEval e;
    for (int i = 0; i < q; ++i) {
      e = i < kRows ? sh_eval[i] : row_eval<T>(p, sp, r0, dbase, k, i, seed, step);
      if (sp.greedy && lane == 0) {   // greedy rows emit their argmax up to and including n
        const float lz = e.s.z > 0.f ? log2f(e.s.z) : 0.f;   // log2 of sum exp2(s2 - m)
        em[i] = e.s.arg;
        if (lp) lp[i] = (e.s.raw_max * kLog2e - e.s.m - lz) * kLn2;
      }
      if (!e.accept) { n = i; break; }
      if (!sp.greedy && lane == 0) {
        em[i] = e.x;
        if (lp) lp[i] = logf(e.px);
      }
    }
    if (sp.greedy) {
      if (lane == 0) { p.num_accepted[b] = n; p.status[b] = st; }
    } else if (lane == 0) {
      ChainResult c;
      c.n = n; c.x = e.x; c.ex = e.ex; c.m = e.s.m; c.z_full = e.z_full; c.tau_key = e.tau_key;
      sh_chain = c;
    }
  }
  if (sp.greedy) return;
  __syncthreads();
  const T* logits = static_cast<const T*>(p.logits);
  const bool onehot = p.draft_probs == nullptr;
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
  // level 1, all threads: one noise per tile serves both the residual race and the race over
  // p (the fallback when the residual has no mass, e.g. p == q); both are reduced at once
  int any = 0;
  KeyArg best_r, best_p;
  best_r.key = best_p.key = -INFINITY;
  best_r.idx = best_p.idx = -1;
  {
    const int x_tile = (excl >= 0 && excl < p.vocab) ? excl / kTile : -1;
    for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
      const float w = w_tile[t];
      const SpecSampleTile x_t = tl[t];   // p's tile sums: one-hot rows add back the draft
      const float wp = scaled_sum(x_t.m, x_t.s, s.m) + (t == x_tile ? ch.ex : 0.f);
      race_tile(seed, step, i, t, w, wp, any, best_r, best_p);
    }
  }
  block_race2<kThreads>(any, best_r, best_p, sh_arg);
  const bool use_p = !any;
  const KeyArg best = use_p ? best_p : best_r;
  const int tile = best.idx < 0 ? 0 : best.idx;
  // level 2: the token inside the tile (this thread's logits loaded first)
  float lv[kPer];
#pragma unroll
  for (int jj = 0; jj < kPer; ++jj) {
    const int tok = tile * kTile + jj * kThreads + threadIdx.x;
    lv[jj] = tok < p.vocab ? load_logit(row, tok) : -INFINITY;
  }
  if (qrow != nullptr && !use_p) gather_q_tile<kThreads>(p, qrow, tile * kTile, q_sh, sh_range);
  KeyArg tb;
  tb.key = -INFINITY; tb.idx = -1;
#pragma unroll
  for (int jj = 0; jj < kPer; ++jj) {
    const int j = jj * kThreads + threadIdx.x;
    const int tok = tile * kTile + j;
    const float l = lv[jj];
    if (tok >= p.vocab) continue;
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
