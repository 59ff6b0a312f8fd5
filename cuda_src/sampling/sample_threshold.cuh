// spec_sample pass 2: exact top-k / top-p keep threshold of filtered rows.
// Included by spec_sample.cu only.
#pragma once
#include "common/ragged.cuh"
#include "sampling/sample_common.cuh"

using namespace specdec;

namespace {

// ------------------------------------------------------------------ 2. filter threshold
//
// Exact radix select of the keep threshold (the largest key K with mass(keys >= K) >= target,
// mass = count for top-k, floor(min(e, 1) * 2^32) with e = exp2(s2 - m) for top-p: integer
// sums, so the result does not depend on the summation order -- nor on how many CTAs add
// into it). Per filter two passes over the row, each split over the row's gridDim.y CTAs:
// a histogram by b = floor(64 * (m - s2)) (2048 buckets of 1/64 log2 unit below the row max:
// monotone in the key, spread out) into the row's global histogram; then the keys of the
// selected bucket into the row's global list, and the last CTA runs the three 11/11/10-bit
// radix rounds over that list. A bucket with more than SPEC_SAMPLE_THRESHOLD_CANDIDATES keys
// (near-constant logits) falls back to the radix rounds over the whole row in that last CTA.
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

__device__ __forceinline__ float key_to_float(uint32_t key) {   // inverse of order_key
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Calls f(x) for every token of chunk `chunk` of `nchunks` equal slices of the row (16-byte
// loads when the row is aligned; the last chunk also takes the tail that is not a whole vector).
template <int kThreads, typename T, typename F>
__device__ __forceinline__ void for_each_logit(const T* row, int V, int chunk, int nchunks, F&& f) {
  constexpr int kN = VecN<T>::kN, kU = 4;
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
#pragma unroll
      for (int k = 0; k < kU; ++k) {
        const int vi = v0 + k * kThreads + threadIdx.x;
        if (vi < v_hi) {
          float x[kN];
          unpack16(u[k], x, static_cast<const T*>(nullptr));
#pragma unroll
          for (int e = 0; e < kN; ++e) f(x[e]);
        }
      }
    }
    if (chunk == nchunks - 1)
      for (int i = nvec * kN + threadIdx.x; i < V; i += kThreads) f(load_logit(row, i));
  } else {
    const int per = (V + nchunks - 1) / nchunks;
    const int lo = min(V, chunk * per), hi = min(V, lo + per);
    for (int i = lo + threadIdx.x; i < hi; i += kThreads) f(load_logit(row, i));
  }
}

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

static_assert(sizeof(SpecSampleFilterHead) == 80, "SpecSampleFilterHead layout");
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
template <typename T>
__device__ void threshold_kernel(const SpecSampleParams& p) {
  constexpr int kThreads = SPEC_SAMPLE_THRESHOLD_THREADS;
  constexpr int kCand = SPEC_SAMPLE_THRESHOLD_CANDIDATES;
  __shared__ unsigned long long hist[2048];
  __shared__ unsigned long long scan[kThreads];
  __shared__ uint32_t cand[kCand];
  __shared__ int digit, n_cand, sh_base, sh_last;
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
  SpecSampleFilter* f = ws_filters(p) + r;
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  const int V = p.vocab;
  const float scale = sp.scale;
  const int phase = (slot == 0 && sp.k_on) ? 0 : 1;   // 0: top-k by count; 1: top-p by mass
  const uint32_t key_floor = (phase == 1 && sp.k_on) ? f->head.tau_k : 0u;
  // mass of one token (0 for NaN and keys below key_floor)
  auto mass = [&](float x) -> unsigned long long {
    if (phase == 0) return 1ull;
    // explicit roundings (no FMA contraction): every pass and the list rounds agree bit for bit
    const float e = fminf(x == -INFINITY ? 0.f : exp2f(__fsub_rn(__fmul_rn(x, scale), m)), 1.f);
    // floor(e * 2^32): e < 1 fits 32 bits (a 32-bit conversion is cheaper than a 64-bit one)
    return e >= 1.f ? (1ull << 32) : static_cast<unsigned long long>(static_cast<uint32_t>(e * 4294967296.0f));
  };
  auto bucket_digit = [&](float x) -> int {   // 2047 = the bucket of the row max
    const float d = fminf(fmaxf(__fsub_rn(m, __fmul_rn(x, scale)) * 64.f, 0.f), 2047.f);
    return 2047 - static_cast<int>(d);
  };

  if ((step & 1) == 0) {
    // --- bucket histogram of this CTA's slice, added to the row's global histogram
    for (int j = threadIdx.x; j < 2048; j += kThreads) hist[j] = 0ull;
    __syncthreads();
    for_each_logit<kThreads>(row, V, chunk, nchunks, [&](float x) {
      if (isnan(x) || order_key(x) < key_floor) return;
      const unsigned long long add = mass(x);
      if (add) hist_add(h32, bucket_digit(x), add);
    });
    __syncthreads();
    hist_combine<kThreads>(hist);
    for (int j = threadIdx.x; j < 2048; j += kThreads)
      if (hist[j]) atomicAdd(f->hist + j, hist[j]);
    if (!last_cta(f->head.done + step, &sh_last)) return;
    // --- last CTA: the row's histogram -> target, bucket
    const bool reuse = slot + 1 < nslots;   // slot 1 accumulates into the same global bins
    for (int j = threadIdx.x; j < 2048; j += kThreads) {
      hist[j] = __ldcg(f->hist + j);
      if (reuse) f->hist[j] = 0ull;   // every other CTA of this step is done with it
    }
    __syncthreads();
    unsigned long long target = phase == 0 ? static_cast<unsigned long long>(sp.top_k) : 0ull;
    if (phase == 1) {   // target = ceil(top_p * mass of the top-k set)
      unsigned long long tot = 0;
      for (int j = threadIdx.x; j < 2048; j += kThreads) tot += hist[j];
      for (int d = 16; d > 0; d >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, d);
      if ((threadIdx.x & 31) == 0) scan[threadIdx.x >> 5] = tot;
      __syncthreads();
      if (threadIdx.x == 0) {
        unsigned long long all = 0;
        for (int j = 0; j < kThreads / 32; ++j) all += scan[j];
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
    if (threadIdx.x == 0) {
      f->head.bucket[slot] = digit;
      f->head.target[slot] = target;
      f->head.target_in[slot] = target - above;
    }
    return;
  }

  // --- the selected bucket's keys of this CTA's slice, appended to the row's list
  const int bucket = f->head.bucket[slot];
  if (threadIdx.x == 0) n_cand = 0;
  __syncthreads();
  for_each_logit<kThreads>(row, V, chunk, nchunks, [&](float x) {
    if (isnan(x) || order_key(x) < key_floor || bucket_digit(x) != bucket) return;
    if (mass(x) == 0ull) return;   // as the histogram: zero-mass tokens are not in it
    const int s = atomicAdd(&n_cand, 1);
    if (s < kCand) cand[s] = order_key(x);
  });
  __syncthreads();
  const int n_local = n_cand;
  if (threadIdx.x == 0) sh_base = static_cast<int>(atomicAdd(f->head.n_cand + slot, static_cast<uint32_t>(n_local)));
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
  uint32_t prefix = 0;
  unsigned long long tgt = from_list ? __ldcg(f->head.target_in + slot) : __ldcg(f->head.target + slot);
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
      if (add) hist_add(h32, static_cast<int>((key >> sh) & ((1u << width) - 1u)), add);
    };
    if (from_list) {
      for (int j = threadIdx.x; j < nc; j += kThreads) {
        const uint32_t key = cand[j];
        count(key, key_to_float(key));
      }
    } else {
      for_each_logit<kThreads>(row, V, 0, 1, [&](float x) {
        if (isnan(x)) return;
        const uint32_t key = order_key(x);
        if (key < key_floor) return;
        count(key, x);
      });
    }
    __syncthreads();
    hist_combine<kThreads>(hist);
    find_digit<kThreads>(hist, tgt, scan, &digit, &above);
    prefix |= static_cast<uint32_t>(digit) << sh;
    tgt -= above;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (slot + 1 < nslots) f->head.tau_k = prefix;          // the key floor of slot 1
    else rows[r].tau_key = max(prefix, key_floor);           // the row's threshold
  }
}

}  // namespace
