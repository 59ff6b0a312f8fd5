// spec_sample pass 2 for 16-bit logits: the filters' keep threshold from an exact histogram.
// Included by spec_sample.cu only.
#pragma once
#include "common/ragged.cuh"
#include "sampling/sample_common.cuh"
#include "sampling/sample_threshold.cuh"

using namespace specdec;

namespace {

// ------------------------------------------------------------------ 2'. exact-value histogram
//
// A bf16 / fp16 logit has only 2^16 values, and tokens of equal value have equal weight. So
// one pass that counts tokens per *value* holds everything the filters need: bin i counts the
// tokens whose value is the i-th representable value below the row max (i = distance in the
// monotone 16-bit key). Top-k is the first bin where the cumulative count reaches k; top-p the
// first where the cumulative mass (count x exp2(v * scale - m), a few thousand exp2 per row,
// not one per token) reaches top_p x the kept mass; min-p a per-value test; and the kept mass
// Z_N falls out for the accept step, so no recount of the tile sums is needed. A pass is a
// shared counter increment per token: no exponential, no window, no candidate list.
// The bins cover SPEC_SAMPLE_HIST_BINS values below the max (bf16: 64 octaves; fp16: 8);
// tokens farther down go to a lane's scratch word. When the answer depends on them (the
// crossing lies past the last bin: logits spread across zero, or a very wide fp16 row), the
// last CTA falls back to the exact radix select over the whole row, as the f32 path does.

constexpr int kHistBins = SPEC_SAMPLE_HIST_BINS;

// Monotone 16-bit key of both halves of a word of bf16 / fp16 bit patterns (sign-magnitude to
// offset binary: larger value, larger key; -0 one below +0). Halves do not interact.
__device__ __forceinline__ uint32_t ord16x2(uint32_t w) {
  const uint32_t neg = (w >> 15) & 0x00010001u;
  return w ^ (neg * 0x7fffu) ^ 0x80008000u;
}
__device__ __forceinline__ uint32_t ord16_inverse(uint32_t o) {   // key -> bit pattern
  return (o & 0x8000u) ? (o ^ 0x8000u) : (~o & 0xffffu);
}
__device__ __forceinline__ float bits16_to_float(uint32_t h, const bf16_t*) { return __uint_as_float(h << 16); }
__device__ __forceinline__ float bits16_to_float(uint32_t h, const __half*) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}
// The row max as a 16-bit key. Its float came from a 16-bit value, except that the tile pass's
// ftz max flushes a bf16 subnormal max to zero: then the true max lies up to 127 keys higher,
// so the bins start there (empty top bins change nothing).
__device__ __forceinline__ uint32_t max_key16(float f, const bf16_t*) {
  const uint32_t o = ord16x2(__float_as_uint(f) >> 16) & 0xffffu;
  return f == 0.f ? o + 127u : o;
}
__device__ __forceinline__ uint32_t max_key16(float f, const __half*) {
  return ord16x2(__half_as_ushort(__float2half_rn(f))) & 0xffffu;
}

// Calls f(w, n) for the 32-bit words of chunk `chunk` of `nchunks` slices of the row: two
// tokens per word (n = 2), 8 words of 16-byte loads per thread in flight; tokens outside whole
// vectors (tail, misaligned rows) one per call in the low half (n = 1).
template <int kThreads, typename T, typename F>
__device__ __forceinline__ void for_each_word(const T* row, int V, int chunk, int nchunks, F&& f) {
  constexpr int kU = 8;
  const uint16_t* r16 = reinterpret_cast<const uint16_t*>(row);
  if (is_aligned16(row)) {
    const int nvec = V / 8;
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
        if (v0 + k * kThreads + threadIdx.x < v_hi) {
          f(u[k].x, 2); f(u[k].y, 2); f(u[k].z, 2); f(u[k].w, 2);
        }
      }
    }
    if (chunk == nchunks - 1)
      for (int i = nvec * 8 + threadIdx.x; i < V; i += kThreads) f(static_cast<uint32_t>(__ldg(r16 + i)), 1);
  } else {
    const int per = (V + nchunks - 1) / nchunks;
    const int lo = min(V, chunk * per), hi = min(V, lo + per);
    for (int i = lo + threadIdx.x; i < hi; i += kThreads) f(static_cast<uint32_t>(__ldg(r16 + i)), 1);
  }
}

// Smallest bin j < limit with sum_{i <= j} val(i) >= target (-1: none), in every thread. Thread
// t owns bins [t * kPer, (t + 1) * kPer); sums in double, scanned in a fixed order.
template <int kThreads, typename F>
__device__ __forceinline__ int first_crossing(F&& val, double target, int limit, double* sh_scan,
                                              int* sh_out) {
  constexpr int kPer = kHistBins / kThreads;
  const int t = threadIdx.x;
  double local = 0.0;
  for (int i = 0; i < kPer; ++i) {
    const int j = t * kPer + i;
    if (j < limit) local += val(j);
  }
  if (t == 0) *sh_out = -1;
  sh_scan[t] = local;
  __syncthreads();
  for (int d = 1; d < kThreads; d <<= 1) {   // Hillis-Steele inclusive scan
    const double add = t >= d ? sh_scan[t - d] : 0.0;
    __syncthreads();
    sh_scan[t] += add;
    __syncthreads();
  }
  double run = sh_scan[t] - local;   // exclusive
  if (run < target && run + local >= target) {   // the crossing is in this thread's bins
    for (int i = 0; i < kPer; ++i) {
      const int j = t * kPer + i;
      if (j >= limit) break;
      run += val(j);
      if (run >= target) { *sh_out = j; break; }
    }
  }
  __syncthreads();
  const int out = *sh_out;
  __syncthreads();
  return out;
}

// Grid (T, S), one launch (16-bit logits only), every row whose request filters (top-k, top-p
// or min-p). Each CTA counts its vocab slice into shared bins and adds the non-zero ones to the
// row's global bins (integer atomics: order-free); the last CTA resolves the thresholds and
// writes the row's record (tau_key, m, z = kept mass).
template <typename T>
__device__ void hist_kernel(const SpecSampleParams& p) {
  constexpr int kThreads = SPEC_SAMPLE_HIST_THREADS;
  constexpr int kPer = kHistBins / kThreads;
  __shared__ uint32_t bins[kHistBins + 32];   // + one scratch word per lane (tokens past the bins)
  __shared__ double scan[kThreads];
  __shared__ int sh_last, sh_out;
  __shared__ float sh_red[2 * (kThreads / 32)];
  const int r = blockIdx.x, chunk = blockIdx.y, nchunks = gridDim.y;
  const int b = owner_of_row(p.cu_q, p.batch, r);
  const SeqParams sp = seq_params(p, b);
  if (!sp.filtered) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  const int V = p.vocab;
  // row max of s2 and raw max, from the tile partials
  float m = -INFINITY, raw_max = -INFINITY;
  for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
    const SpecSampleTile tr = ws_tiles(p)[static_cast<int64_t>(r) * p.num_tiles + t];
    m = fmaxf(m, tr.m);
    raw_max = fmaxf(raw_max, tr.raw_max);
  }
  m = warp_max(m);
  raw_max = warp_max(raw_max);
  if (lane == 0) { sh_red[warp] = m; sh_red[kThreads / 32 + warp] = raw_max; }
  for (int j = threadIdx.x; j < kHistBins + 32; j += kThreads) bins[j] = 0u;
  __syncthreads();
  m = sh_red[0];
  raw_max = sh_red[kThreads / 32];
  for (int w = 1; w < kThreads / 32; ++w) {
    m = fmaxf(m, sh_red[w]);
    raw_max = fmaxf(raw_max, sh_red[kThreads / 32 + w]);
  }
  SpecSampleRow* rows = ws_rows(p);
  if (!(m > -INFINITY) || !(raw_max < INFINITY)) {   // nothing finite / +inf: the block is invalid
    if (chunk == 0 && threadIdx.x == 0) {
      SpecSampleRow rs;
      rs.tau_key = 0u; rs.m = m; rs.z = 0.f; rs.pad = 0u;
      rows[r] = rs;
    }
    return;
  }
  const uint32_t omax = max_key16(raw_max, static_cast<const T*>(nullptr));
  const uint32_t omax2 = omax | (omax << 16);
  const uint32_t lim = kHistBins + lane;   // farther tokens: this lane's scratch word
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(bins));

  // --- the pass: per token a key difference and one shared increment (no branch). A NaN (its
  // block is invalid anyway) may borrow across the halves: its bins are wrong, none out of range.
  for_each_word<kThreads>(row, V, chunk, nchunks, [&](uint32_t w, int n) {
    const uint32_t d = omax2 - ord16x2(w);
    const uint32_t i0 = min(d & 0xffffu, lim);
    const uint32_t i1 = n == 2 ? min(d >> 16, lim) : lim;
    asm volatile("red.shared.add.u32 [%0], 1;" ::"r"(sbase + 4u * i0) : "memory");
    asm volatile("red.shared.add.u32 [%0], 1;" ::"r"(sbase + 4u * i1) : "memory");
  });
  __syncthreads();
  SpecSampleFilter* f = ws_filters(p) + r;
  uint32_t* gbins = f->count;   // count, msum and cand: 8192 contiguous words (see the header)
  for (int j = threadIdx.x; j < kHistBins; j += kThreads)
    if (bins[j]) atomicAdd(gbins + j, bins[j]);
  if (!last_cta(f->head.done, &sh_last)) return;

  // --- last CTA: the row's bins -> thresholds and kept mass
  for (int j = threadIdx.x; j < kHistBins; j += kThreads) bins[j] = __ldcg(gbins + j);
  __syncthreads();
  const float scale = sp.scale;
  const float min_p = sp.min_p;
  // covers_all: the bins reach the lowest key, so no token lies past them
  const bool covers_all = omax < static_cast<uint32_t>(kHistBins);
  auto value = [&](int j) { return bits16_to_float(ord16_inverse(omax - j), static_cast<const T*>(nullptr)); };
  // weight of one token of bin j (the expression kept() and the recount use)
  auto unit = [&](int j) { return exp2f(__fsub_rn(__fmul_rn(value(j), scale), m)); };
  auto mass = [&](int j) { return bins[j] ? static_cast<double>(bins[j]) * unit(j) : 0.0; };
  auto count = [&](int j) { return static_cast<double>(bins[j]); };
  bool ok = true;
  int cut = -1;   // the last kept bin (-1: no top-k / top-p cut)
  if (sp.k_on) {
    cut = first_crossing<kThreads>(count, static_cast<double>(sp.top_k), kHistBins, scan, &sh_out);
    ok = cut >= 0;
  }
  if (ok && sp.p_on) {
    int jp;
    if (!(sp.top_p > 0.f)) {
      jp = first_crossing<kThreads>(count, 1.0, kHistBins, scan, &sh_out);   // the max and its ties
    } else {
      double base;
      if (sp.k_on) {   // top-p on the top-k-renormalised distribution
        base = 0.0;
        for (int j = threadIdx.x; j <= cut; j += kThreads) base += mass(j);
        base = static_cast<double>(block_sum<kThreads>(static_cast<float>(base), sh_red));
      } else {         // the whole row: the tile sums (they leave the one-hot draft out)
        float z = 0.f;
        for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
          const SpecSampleTile tr = ws_tiles(p)[static_cast<int64_t>(r) * p.num_tiles + t];
          z += scaled_sum(tr.m, tr.s, m);
        }
        z = block_sum<kThreads>(z, sh_red);
        const int r0 = __ldg(p.cu_q + b);
        const int x = excluded_draft(p, b, r - r0, __ldg(p.cu_q + b + 1) - r0);
        if (x >= 0 && x < V) {
          const float lx = load_logit(row, x);
          if (lx > -INFINITY) z += exp2f(__fsub_rn(__fmul_rn(lx, scale), m));
        }
        base = static_cast<double>(z);
      }
      jp = first_crossing<kThreads>(mass, static_cast<double>(sp.top_p) * base,
                                    sp.k_on ? cut + 1 : kHistBins, scan, &sh_out);
      if (jp < 0 && sp.k_on) jp = cut;   // rounding: the reference keeps the whole top-k set
    }
    ok = jp >= 0;
    cut = (cut < 0 || (jp >= 0 && jp < cut)) ? jp : cut;
  }
  // min-p only: no cut, but the kept mass must not include tokens past the bins
  if (ok && cut < 0 && !covers_all) ok = !(min_p > 0.f) ? false : unit(kHistBins - 1) < min_p;
  if (ok) {
    const int last = cut < 0 ? kHistBins - 1 : cut;
    float z = 0.f;
    for (int i = 0; i < kPer; ++i) {   // fixed order: deterministic
      const int j = threadIdx.x * kPer + i;
      if (j <= last && bins[j] && (!(min_p > 0.f) || unit(j) >= min_p)) z += static_cast<float>(mass(j));
    }
    z = block_sum<kThreads>(z, sh_red);
    if (threadIdx.x == 0) {
      SpecSampleRow rs;
      rs.tau_key = cut < 0 ? 0u : order_key(value(cut));
      rs.m = m; rs.z = z; rs.pad = 0u;
      rows[r] = rs;
    }
    return;
  }

  // --- fallback (the crossing lies past the bins): the exact radix select over the whole row in
  // this CTA, the f32 path's rule (integer masses), then the kept mass in one more pass
  __syncthreads();
  unsigned long long* hist = reinterpret_cast<unsigned long long*>(bins);   // 16 KB of the 32
  unsigned long long* scan64 = reinterpret_cast<unsigned long long*>(scan);
  __shared__ int digit;
  __shared__ unsigned long long above;
  auto dist = [&](float x) { return __fsub_rn(m, __fmul_rn(x, scale)); };
  auto qmass = [&](float x) {
    return static_cast<unsigned long long>(static_cast<uint32_t>(fminf(exp2f(-dist(x)), 1.f) * 2147483648.0f));
  };
  auto one = [](float) { return 1ull; };
  uint32_t floor_key = 0u;
  auto walk = [&](auto&& cnt) {
    for_each_logit<kThreads>(row, V, 0, 1, [&](float x) {
      if (!isnan(x) && order_key(x) >= floor_key) cnt(order_key(x), x);
    });
  };
  if (sp.k_on)
    floor_key = radix_rounds<kThreads>(walk, one, static_cast<unsigned long long>(sp.top_k), hist, scan64,
                                       &digit, &above);
  if (sp.p_on) {
    unsigned long long tot = 0;
    walk([&](uint32_t, float x) { tot += qmass(x); });
    const unsigned long long all = block_sum_u64<kThreads>(tot, scan64);
    if (threadIdx.x == 0) above = all;
    __syncthreads();
    const unsigned long long total = above;
    __syncthreads();
    unsigned long long target =
        static_cast<unsigned long long>(ceil(static_cast<double>(fmaxf(sp.top_p, 0.f)) * static_cast<double>(total)));
    target = target < 1ull ? 1ull : (target > total ? total : target);
    floor_key = max(floor_key, radix_rounds<kThreads>(walk, qmass, target, hist, scan64, &digit, &above));
  }
  float z = 0.f;
  for_each_logit<kThreads>(row, V, 0, 1, [&](float x) {
    const float s2 = x * scale;
    if (!isnan(x) && x > -INFINITY && kept(x, s2, floor_key, m, min_p)) z += exp2f(__fsub_rn(s2, m));
  });
  z = block_sum<kThreads>(z, sh_red);
  if (threadIdx.x == 0) {
    SpecSampleRow rs;
    rs.tau_key = floor_key;
    rs.m = m; rs.z = z; rs.pad = 0u;
    rows[r] = rs;
  }
}

}  // namespace
