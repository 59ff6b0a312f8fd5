// spec_sample pass 2: exact top-k / top-p keep threshold of filtered rows.
// Included by spec_sample.cu only.
#pragma once
#include <type_traits>
#include "common/ragged.cuh"
#include "sampling/sample_common.cuh"

using namespace specdec;

namespace {

// ------------------------------------------------------------------ 2. filter threshold
//
// Exact radix select of the keep threshold (the largest key K with mass(keys >= K) >= target,
// mass = count for top-k, floor(min(e, 1) * 2^31) with e = exp2(s2 - m) for top-p: integer
// sums, so the result does not depend on the summation order -- nor on how many CTAs add
// into it). Per filter two passes over the row, each split over the row's gridDim.y CTAs.
// Bucket j of a token = floor(64 * (m - s2)) clamped to 0..2047 (its distance below the row
// max in 1/64 log2 units: monotone in the key). Pass 1 counts tokens per bucket and sums the
// exact mass of the row in registers (one atomic per CTA); a bucket's mass then lies within
// count x [2^-(j+1)/64, 2^-j/64] x 2^31, so the last CTA can bound the cumulative mass from the
// top and pick the window of buckets that must hold the crossing (one bucket for top-k, whose
// masses are exact counts; a few for top-p). Pass 2 sums the exact mass above the window in
// registers and appends the window's keys to the row's list; the last CTA runs the 11/11/10-bit
// radix rounds over that list for what is left of the target. Per token a pass is a bucket
// computation and, for most tokens, one shared counter increment or nothing: no 64-bit shared
// atomics. A window with more than SPEC_SAMPLE_THRESHOLD_CANDIDATES keys (near-constant
// logits) falls back to the radix rounds over the whole row in that last CTA.
// Same K as the plain 3-round radix in every case.

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

// The 64-bit histogram is accumulated as two 32-bit halves (lo at h32[bin], hi at h32[2048 + bin]):
// 64-bit shared atomicAdd is a CAS loop on every arch, 32-bit is native. A wrap of lo (seen in
// the old value) carries into hi, so the total is exact in any order.
__device__ __forceinline__ void hist_add(uint32_t* h32, int bin, unsigned long long add) {
  const uint32_t lo = static_cast<uint32_t>(add);
  uint32_t hi = static_cast<uint32_t>(add >> 32);
  if (lo) {
    const uint32_t old = atomicAdd(h32 + bin, lo);
    hi += old + lo < old ? 1u : 0u;
  }
  if (hi) atomicAdd(h32 + 2048 + bin, hi);
}

// lo/hi halves -> the 64-bit bins, in place (every thread of the CTA calls it).
template <int kThreads>
__device__ __forceinline__ void hist_combine(unsigned long long* hist) {
  constexpr int kPer = 2048 / kThreads;
  const uint32_t* h32 = reinterpret_cast<const uint32_t*>(hist);
  uint32_t lo[kPer], hi[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    lo[j] = h32[threadIdx.x + j * kThreads];
    hi[j] = h32[2048 + threadIdx.x + j * kThreads];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    hist[threadIdx.x + j * kThreads] = (static_cast<unsigned long long>(hi[j]) << 32) | lo[j];
  __syncthreads();
}

// The walk over chunk `chunk` of `nchunks` equal slices of a row of V tokens: fvec(u) for each
// 16-byte vector u of the slice (kU loads per thread in flight, handed over kProc at a time),
// fone(i) for each token i outside whole vectors (the row's tail in the last chunk, every
// token of a misaligned row). The threshold passes and the 16-bit histogram share it.
template <int kThreads, int kU, int kProc, typename T, typename FVec, typename FOne>
__device__ __forceinline__ void for_each_raw(const T* row, int V, int chunk, int nchunks, FVec&& fvec,
                                             FOne&& fone) {
  constexpr int kN = 16 / sizeof(T);
  if (is_aligned16(row)) {
    const int nvec = V / kN;
    const int per = (nvec + nchunks - 1) / nchunks;
    const int v_lo = min(nvec, chunk * per), v_hi = min(nvec, v_lo + per);
    const uint4* src = reinterpret_cast<const uint4*>(row);
    for (int v0 = v_lo; v0 < v_hi; v0 += kThreads * kU) {
      uint4 u[kU];
#pragma unroll
      for (int k = 0; k < kU; ++k) {
        const int vi = v0 + k * kThreads + threadIdx.x;
        if (vi < v_hi) u[k] = __ldg(src + vi);
      }
      // kU vectors in flight, processed kProc at a time by one copy of fvec's code (the rest
      // shifted down between rounds: register moves), so the loop body stays small enough
      // for the instruction cache (r4's profile: 19-24% "no_inst" stalls at kProc = kU = 8).
#pragma unroll 1
      for (int h = 0; h < kU / kProc; ++h) {
#pragma unroll
        for (int k = 0; k < kProc; ++k)
          if (v0 + (h * kProc + k) * kThreads + threadIdx.x < v_hi) fvec(u[k]);
#pragma unroll
        for (int k = 0; k + kProc < kU; ++k) u[k] = u[k + kProc];
      }
    }
    if (chunk == nchunks - 1)
      for (int i = nvec * kN + threadIdx.x; i < V; i += kThreads) fone(i);
  } else {
    const int per = (V + nchunks - 1) / nchunks;
    const int lo = min(V, chunk * per), hi = min(V, lo + per);
    for (int i = lo + threadIdx.x; i < hi; i += kThreads) fone(i);
  }
}

// One 16-byte vector per call: f(x, n) with float x[kN] of which the first n are tokens, so a
// pass can compute a whole vector branch-free and take its rare path once per vector. Tokens
// outside whole vectors come one per call (n = 1); n is a constant at each call, so the
// passes' `e < n` tests fold away.
template <int kThreads, int kU, typename T, typename F, int kProc = 4>
__device__ __forceinline__ void for_each_vec(const T* row, int V, int chunk, int nchunks, F&& f) {
  constexpr int kN = VecN<T>::kN;
  for_each_raw<kThreads, kU, kProc>(row, V, chunk, nchunks,
      [&](const uint4& u) {
        float x[kN];
        unpack16(u, x, static_cast<const T*>(nullptr));
        f(x, kN);
      },
      [&](int i) {
        float x[kN];
#pragma unroll
        for (int e = 0; e < kN; ++e) x[e] = e == 0 ? load_logit(row, i) : -INFINITY;
        f(x, 1);
      });
}

// Calls f(x) for every token of chunk `chunk` of `nchunks` equal slices of the row: for_each_vec's
// walk (4 vectors in flight), one token at a time.
template <int kThreads, typename T, typename F>
__device__ __forceinline__ void for_each_logit(const T* row, int V, int chunk, int nchunks, F&& f) {
  constexpr int kN = VecN<T>::kN;
  for_each_vec<kThreads, 4>(row, V, chunk, nchunks, [&](const float (&x)[kN], int n) {
#pragma unroll
    for (int e = 0; e < kN; ++e)
      if (e < n) f(x[e]);
  });
}

// A shared-memory counter increment with no result (red: nothing to wait for), issued by every
// token so that no branch separates a thread's tokens (ptxas turns a predicated atomic into a
// branch): tokens that count nothing increment a scratch word of their lane instead.
__device__ __forceinline__ void shared_add(uint32_t* p, uint32_t v) {
  asm volatile("red.shared.add.u32 [%0], %1;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))), "r"(v)
               : "memory");
}

// Bucket j's masses are < 2^(31 - j/64) (+ ex2.approx's error), so (mass >> bucket_shift(j))
// keeps their top 12-13 bits: per-bucket sums fit 32 bits for V <= 2^18, and bound the
// bucket's exact mass to within 2^-12 of itself (count x 2^shift), where count alone only
// bounded it to the bucket's width (2^(1/64): 1.1%).
__device__ __forceinline__ int bucket_shift(int j) { return max(0, 19 - (j >> 6)); }

// Last-CTA-done on a per-row counter: true in the CTA that arrives last (gridDim.y CTAs per row),
// after which every global write / atomic of the others is visible to it (read with __ldcg).
__device__ __forceinline__ bool last_cta(uint32_t* counter, int* sh_flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *sh_flag = atomicAdd(counter, 1u) == gridDim.y - 1 ? 1 : 0;
  __syncthreads();
  const bool last = *sh_flag != 0;
  if (last) __threadfence();
  return last;
}

// The exact select's 11/11/10-bit radix rounds: the largest key K with mass(keys >= K) >= tgt
// over the keys that walk(count) hands to count(key, x) (a candidate list, or a whole row).
// Integer sums: the same K whatever the order. Returns K in every thread of the CTA.
template <int kThreads, typename Walk, typename Mass>
__device__ uint32_t radix_rounds(Walk&& walk, Mass&& mass, unsigned long long tgt,
                                 unsigned long long* hist, unsigned long long* scan, int* digit,
                                 unsigned long long* above) {
  uint32_t* h32 = reinterpret_cast<uint32_t*>(hist);
  uint32_t prefix = 0;
  for (int round = 0; round < 3; ++round) {   // digits: bits 31..21, 20..10, 9..0
    const int sh = round == 0 ? 21 : round == 1 ? 10 : 0;
    const int width = round == 2 ? 10 : 11;
    const int hi_shift = sh + width;   // bits above this digit must match prefix
    for (int j = threadIdx.x; j < 2048; j += kThreads) hist[j] = 0ull;
    if (threadIdx.x == 0) { *digit = 0; *above = 0ull; }
    __syncthreads();
    walk([&](uint32_t key, float x) {
      if (hi_shift < 32 && (key >> hi_shift) != (prefix >> hi_shift)) return;
      const unsigned long long add = mass(x);
      if (add) hist_add(h32, static_cast<int>((key >> sh) & ((1u << width) - 1u)), add);
    });
    __syncthreads();
    hist_combine<kThreads>(hist);
    find_digit<kThreads>(hist, tgt, scan, digit, above);
    prefix |= static_cast<uint32_t>(*digit) << sh;
    tgt -= *above;
    __syncthreads();
  }
  return prefix;
}

static_assert(sizeof(SpecSampleFilterHead) == 96, "SpecSampleFilterHead layout");
static_assert(sizeof(SpecSampleFilter) % 16 == 0, "SpecSampleFilter: rows stay 16-byte aligned");

// Grid (T, S), launched SPEC_SAMPLE_THRESHOLD_STEPS times with p.filter_step = 0..3. A row's
// filters are slots j = 0, 1 (top-k then top-p; only those that are on); step 2j + 0: each CTA
// histograms its vocab slice into shared memory and adds the non-zero bins to the row's global
// 64-bit histogram (integer atomics: the sums, hence the bucket, do not depend on the order);
// the last CTA picks the bucket (and the top-p target). Step 2j + 1: each CTA appends the keys
// of that bucket in its slice to the row's global list; the last CTA runs the 11/11/10-bit radix
// rounds over the list (over the whole row if the list overflowed: plateaus of equal logits)
// and writes the threshold. Step 0 also writes the row max (every filtered row, min-p too).
// Same K, same ties, as the single-CTA select it replaces.
// Sum of a thread's 64-bit integer over the CTA, in thread 0 (order-free: integers).
template <int kThreads>
__device__ __forceinline__ unsigned long long block_sum_u64(unsigned long long v, unsigned long long* sh) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned long long all = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) all += sh[w];
  return all;
}

// The window [lo, hi] of buckets that must hold the crossing: with C(j) the exact mass of
// buckets 0..j and Clo(j) <= C(j) <= Chi(j) its bounds, the crossing bucket
// j* = min{j : C(j) >= target} lies in [min{j : Chi(j) >= target}, min{j : Clo(j) >= target}].
// Top-p: a token of mass w adds v = w >> s (s = bucket_shift(j)) to msum[j], and
// v 2^s <= w < (v + 1) 2^s, so bucket j's mass lies in [msum 2^s, (msum + count) 2^s]: integer
// bounds of the same masses pass 2 sums exactly (no tolerance), exact in double (< 2^53).
// Top-k: counts, Clo = Chi = C. Bucket 2047 (everything farther) is not counted, so neither
// bound is known there: both ends default to 2047, where a crossing no bound places earlier lies.
template <int kThreads>
__device__ __forceinline__ void find_window(const uint32_t* cnt, const uint32_t* msum, bool by_count,
                                            unsigned long long target,
                                            double* scan_lo, double* scan_hi, int* sh_lo, int* sh_hi) {
  constexpr int kPer = 2048 / kThreads;
  const int t = threadIdx.x;
  double blo[kPer], bhi[kPer], slo = 0.0, shi = 0.0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = t * kPer + i;
    const double c = static_cast<double>(cnt[j]);
    if (by_count) {
      blo[i] = bhi[i] = c;
    } else {
      const double scale = static_cast<double>(1u << bucket_shift(j));
      blo[i] = static_cast<double>(msum[j]) * scale;
      bhi[i] = (static_cast<double>(msum[j]) + c) * scale;
    }
    slo += blo[i];
    shi += bhi[i];
  }
  scan_lo[t] = slo;
  scan_hi[t] = shi;
  if (t == 0) { *sh_lo = 2047; *sh_hi = 2047; }
  __syncthreads();
  for (int d = 1; d < kThreads; d <<= 1) {   // inclusive scans (fixed order: deterministic)
    const double alo = t >= d ? scan_lo[t - d] : 0.0, ahi = t >= d ? scan_hi[t - d] : 0.0;
    __syncthreads();
    scan_lo[t] += alo;
    scan_hi[t] += ahi;
    __syncthreads();
  }
  double clo = scan_lo[t] - slo, chi = scan_hi[t] - shi;   // exclusive
  const double tg = static_cast<double>(target);
  bool found_lo = false, found_hi = false;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    clo += blo[i];
    chi += bhi[i];
    if (!found_lo && chi >= tg) { atomicMin(sh_lo, t * kPer + i); found_lo = true; }
    if (!found_hi && clo >= tg) { atomicMin(sh_hi, t * kPer + i); found_hi = true; }
  }
  __syncthreads();
}

// Grid (T, S), launched SPEC_SAMPLE_THRESHOLD_STEPS times with p.filter_step = 0..3. A row's
// filters are slots j = 0, 1 (top-k then top-p; only those that are on); step 2j + 0: bucket
// counts and the exact total, the last CTA picks the target and the window; step 2j + 1: the
// exact mass above the window and the window's keys, the last CTA runs the radix rounds over
// the keys (over the whole row if the list overflowed: plateaus of equal logits) and writes the
// threshold. Step 0 also writes the row max (every filtered row, min-p too).
template <typename T>
__device__ void threshold_kernel(const SpecSampleParams& p) {
  constexpr int kThreads = SPEC_SAMPLE_THRESHOLD_THREADS;
  constexpr int kCand = SPEC_SAMPLE_THRESHOLD_CANDIDATES;
  constexpr int kFar = 2047;   // the clamped bucket: not counted (it can be most tokens)
  __shared__ unsigned long long hist[2048];   // radix rounds; pass 1 uses its first 8 KB as counts
  __shared__ unsigned long long scan[kThreads];
  __shared__ double scan_hi[kThreads];
  __shared__ uint32_t cand[kCand];
  __shared__ uint32_t scratch[32];   // pass 1: the counter of tokens that count nothing (per lane)
  __shared__ int digit, n_cand, sh_base, sh_last, win_lo, win_hi;
  __shared__ unsigned long long above;
  __shared__ float sh_m[kThreads / 32];
  uint32_t* h32 = reinterpret_cast<uint32_t*>(hist);
  const int r = blockIdx.x, chunk = blockIdx.y, nchunks = gridDim.y;
  const int step = p.filter_step;
  const int b = owner_of_row(p.cu_q, p.batch, r);
  const SeqParams sp = seq_params(p, b);
  if (!sp.filtered) return;
  const int nslots = (sp.k_on ? 1 : 0) + (sp.p_on ? 1 : 0);
  const int slot = step >> 1;
  SpecSampleRow* rows = ws_rows(p);
  float m;
  if (step == 0) {
    if (nslots == 0 && chunk != 0) return;   // min-p only: one CTA writes the row max
    // row max of s2 from the tile partials
    m = -INFINITY;
    for (int t = threadIdx.x; t < p.num_tiles; t += kThreads)
      m = fmaxf(m, ws_tiles(p)[static_cast<int64_t>(r) * p.num_tiles + t].m);
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) sh_m[threadIdx.x >> 5] = m;
    __syncthreads();
    m = sh_m[0];
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, sh_m[w]);
    if (chunk == 0 && threadIdx.x == 0) {
      SpecSampleRow rs;
      rs.tau_key = 0u;   // no top-k / top-p cut until the last slot's step writes it
      rs.m = m;
      rows[r] = rs;
    }
  } else {
    if (slot >= nslots) return;
    m = rows[r].m;   // written by step 0 (an earlier launch)
  }
  if (slot >= nslots) return;
  if (!(m > -INFINITY)) return;   // no finite logit: status EMPTY, nothing to select (tau stays 0)
  SpecSampleFilter* f = ws_filters(p) + r;
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  const int V = p.vocab;
  const float scale = sp.scale;
  const bool by_count = slot == 0 && sp.k_on;   // top-k: mass = count; top-p: fixed-point mass
  const uint32_t key_floor = (!by_count && sp.k_on) ? f->head.tau_k : 0u;
  // u = m - s2 >= 0, with explicit roundings (no FMA contraction), so that every pass and the
  // list rounds see the same u for a token; the bucket is floor(64 u) (exact scaling) and the
  // top-p mass floor(min(2^-u, 1) * 2^31) (fits 32 bits; 0 for -inf: u = +inf, m is finite).
  // The two bulk passes do not test for NaN: a NaN row's block is invalid (status 1) whatever
  // its threshold, and the formulas give a NaN a defined bucket (0) and mass (2^31).
  auto dist = [&](float x) { return __fsub_rn(m, __fmul_rn(x, scale)); };
  auto bucket_of = [&](float u) { return static_cast<int>(fminf(fmaxf(u * 64.f, 0.f), 2047.f)); };
  auto mass_of_dist = [](float u) { return static_cast<uint32_t>(fminf(exp2f(-u), 1.f) * 2147483648.0f); };
  auto mass = [&](float x) { return by_count ? 1ull : static_cast<unsigned long long>(mass_of_dist(dist(x))); };
  // NaN never counts; below the top-k floor never counts (top-p after top-k)
  auto excluded = [&](float x) { return isnan(x) | (key_floor != 0u && order_key(x) < key_floor); };
  using yes = std::true_type;
  using no = std::false_type;
  constexpr int kN = VecN<T>::kN;

  if ((step & 1) == 0) {
    // --- pass 1: tokens and truncated masses per bucket (shared u32 counters, h32[0, 2048) and
    // h32[2048, 4096): hist's 16 KB) and the exact total (registers)
    for (int j = threadIdx.x; j < 4096; j += kThreads) h32[j] = 0u;
    __syncthreads();
    unsigned long long tot = 0;
    // Branch-free per token (the filter kind is a template argument), so that a thread's 8
    // tokens of a vector interleave. The far bucket (2047: everything 32 log2 units or more
    // below the max, often most of the vocabulary) is not counted: find_window's default end.
    auto count_pass = [&](auto by_count_c, auto floor_c) {
      constexpr bool kByCount = decltype(by_count_c)::value, kFloor = decltype(floor_c)::value;
      for_each_vec<kThreads, 8>(row, V, chunk, nchunks, [&](const float (&x)[kN], int n) {
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          const float u = dist(x[e]);
          const int j = bucket_of(u);
          const bool in = e < n && (kFloor ? order_key(x[e]) >= key_floor : true);
          const bool counted = in & (j != kFar);
          shared_add(counted ? h32 + j : scratch + (threadIdx.x & 31), 1u);
          if constexpr (!kByCount) {   // top-k: the count is k, the counts are exact
            const uint32_t w = mass_of_dist(u);
            tot += in ? w : 0u;
            shared_add(counted ? h32 + 2048 + j : scratch + (threadIdx.x & 31), w >> bucket_shift(j));
          }
        }
      });
    };
    if (by_count) count_pass(yes(), no());
    else if (key_floor != 0u) count_pass(no(), yes());
    else count_pass(no(), no());
    const unsigned long long cta_tot = block_sum_u64<kThreads>(tot, scan);   // syncs first
    for (int j = threadIdx.x; j < 2048; j += kThreads) {
      if (h32[j]) atomicAdd(f->count + j, h32[j]);
      if (h32[2048 + j]) atomicAdd(f->msum + j, h32[2048 + j]);
    }
    if (threadIdx.x == 0 && cta_tot) atomicAdd(f->head.total + slot, cta_tot);
    if (!last_cta(f->head.done + step, &sh_last)) return;
    // --- last CTA: the row's counts and total -> target, window
    const bool reuse = slot + 1 < nslots;   // slot 1 counts into the same global bins
    for (int j = threadIdx.x; j < 2048; j += kThreads) {
      h32[j] = __ldcg(f->count + j);
      h32[2048 + j] = by_count ? 0u : __ldcg(f->msum + j);
      if (reuse) f->count[j] = 0u;   // every other CTA of this step is done with them
      if (reuse) f->msum[j] = 0u;
    }
    unsigned long long target;
    if (by_count) {
      target = static_cast<unsigned long long>(sp.top_k);   // 0 < top_k < V
    } else {
      // target = ceil(top_p * mass of the kept set so far)
      const unsigned long long all = __ldcg(f->head.total + slot);
      const double want = ceil(static_cast<double>(fmaxf(sp.top_p, 0.f)) * static_cast<double>(all));
      target = static_cast<unsigned long long>(want);
      target = target < 1ull ? 1ull : (target > all ? all : target);
    }
    __syncthreads();
    find_window<kThreads>(h32, h32 + 2048, by_count, target, reinterpret_cast<double*>(scan), scan_hi, &win_lo, &win_hi);
    if (threadIdx.x == 0) {
      f->head.win_lo[slot] = win_lo;
      f->head.win_hi[slot] = max(win_lo, win_hi);
      f->head.target[slot] = target;
    }
    return;
  }

  // --- pass 2: the exact mass above the window (registers), the window's keys into the list
  const int lo = f->head.win_lo[slot], hi = f->head.win_hi[slot];
  if (threadIdx.x == 0) n_cand = 0;
  __syncthreads();
  unsigned long long abv = 0;
  // Branch-free per token as pass 1: the mass above the window is summed for every token
  // (a nucleus can be thousands of tokens: the bench's N(0, 3) rows put ~28% of 8-token
  // vectors above the window), only a window token takes the branch to the list.
  auto window_pass = [&](auto by_count_c, auto floor_c) {
    constexpr bool kByCount = decltype(by_count_c)::value, kFloor = decltype(floor_c)::value;
    for_each_vec<kThreads, 8>(row, V, chunk, nchunks, [&](const float (&x)[kN], int n) {
      int jv[kN];
      bool any = false;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const float u = dist(x[e]);
        int j = e < n ? bucket_of(u) : 4096;
        if constexpr (kFloor) j = order_key(x[e]) >= key_floor ? j : 4096;
        const uint32_t w = kByCount ? 1u : mass_of_dist(u);   // = mass(x[e])
        abv += j < lo ? w : 0u;
        jv[e] = j;
        any |= (j >= lo) & (j <= hi);
      }
      if (!any) return;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        if (jv[e] < lo || jv[e] > hi) continue;
        if (mass(x[e]) == 0ull || isnan(x[e])) continue;   // zero-mass tokens are in no bucket's mass
        const int s = atomicAdd(&n_cand, 1);
        if (s < kCand) cand[s] = order_key(x[e]);
      }
    });
  };
  if (by_count) window_pass(yes(), no());
  else if (key_floor != 0u) window_pass(no(), yes());
  else window_pass(no(), no());
  const unsigned long long cta_abv = block_sum_u64<kThreads>(abv, scan);   // syncs first
  const int n_local = n_cand;
  if (threadIdx.x == 0) {
    if (cta_abv) atomicAdd(f->head.above + slot, cta_abv);
    sh_base = static_cast<int>(atomicAdd(f->head.n_cand + slot, static_cast<uint32_t>(n_local)));
  }
  __syncthreads();
  const int base = sh_base;
  for (int j = threadIdx.x; j < min(n_local, kCand) && base + j < kCand; j += kThreads)
    f->cand[base + j] = cand[j];
  if (!last_cta(f->head.done + step, &sh_last)) return;
  // --- last CTA: radix rounds over the list (or, on overflow, over the whole row)
  const uint32_t nc_all = __ldcg(f->head.n_cand + slot);
  const bool from_list = nc_all <= static_cast<uint32_t>(kCand);
  const int nc = from_list ? static_cast<int>(nc_all) : 0;
  for (int j = threadIdx.x; j < nc; j += kThreads) cand[j] = __ldcg(f->cand + j);
  const unsigned long long target = __ldcg(f->head.target + slot);
  const unsigned long long tgt = from_list ? target - __ldcg(f->head.above + slot) : target;
  const uint32_t prefix = radix_rounds<kThreads>(
      [&](auto&& count) {
        if (from_list) {
          for (int j = threadIdx.x; j < nc; j += kThreads) count(cand[j], key_to_float(cand[j]));
        } else {
          for_each_logit<kThreads>(row, V, 0, 1, [&](float x) {
            if (!excluded(x)) count(order_key(x), x);
          });
        }
      },
      mass, tgt, hist, scan, &digit, &above);
  if (threadIdx.x == 0) {
    if (slot + 1 < nslots) f->head.tau_k = prefix;          // the key floor of slot 1
    else rows[r].tau_key = max(prefix, key_floor);           // the row's threshold
  }
}

}  // namespace
