// spec_sample pass 2 for 16-bit logits: the filters' keep threshold from an exact histogram.
// Included by spec_sample.cu only.
#pragma once
#include <type_traits>
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
// first where the cumulative mass (count x exp2(v * scale - m): a few thousand exp2 per row,
// not one per token) reaches top_p x the kept mass. A pass is one shared counter increment per
// token: no exponential, no window, no candidate list, one launch for top-k and top-p together.
// The CTA that resolves a row's threshold then recounts the row's tile sums over the kept set
// (the f32 path's separate recount launch), so finish sees the same records on both paths.
// The bins cover SPEC_SAMPLE_HIST_BINS values below the max (bf16: 64 octaves; fp16: 8);
// tokens farther down go to a lane's scratch word. When the answer depends on them (the
// crossing lies past the last bin: logits spread across zero, or a very wide fp16 row), that
// CTA falls back to the exact radix select over the whole row (the f32 path's rule).

constexpr int kHistBins = SPEC_SAMPLE_HIST_BINS;


// Monotone 16-bit key of both halves of a word of bf16 / fp16 bit patterns (sign-magnitude to
// offset binary: larger value, larger key; -0 one below +0). Halves do not interact. Two
// instructions: a byte permute that replicates each half's sign over the half (s = 0xffff for
// a negative half), then one LOP3 (w ^ (s | 0x80008000)): a negative half is inverted, a
// positive one gets its top bit.
__device__ __forceinline__ uint32_t ord16x2(uint32_t w) {
  uint32_t s, o;
  asm("prmt.b32 %0, %1, %1, 0xBB99;" : "=r"(s) : "r"(w));
  asm("lop3.b32 %0, %1, %2, 0x80008000, 0x1E;" : "=r"(o) : "r"(w), "r"(s));   // w ^ (s | 0x80008000)
  return o;
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

// Smallest bin j < limit with sum_{i <= j} v(i) >= target (-1: none), in every thread, over
// values each thread holds in registers (v[i] = bin t * kPer + i: computed once, not per
// search; r7's profile put a third of the launch's stalls in the resolve). Double sums in a
// fixed order (a warp scan, then the warp totals): two barriers.
template <int kThreads, int kPer>
__device__ __forceinline__ int first_crossing_regs(const float (&v)[kPer], double target, int limit,
                                                   double* sh_warp, int* sh_out) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  double local = 0.0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) local += (t * kPer + i < limit) ? static_cast<double>(v[i]) : 0.0;
  double inc = local;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const double o = __shfl_up_sync(0xffffffffu, inc, d);
    if (lane >= d) inc += o;
  }
  if (lane == 31) sh_warp[warp] = inc;
  if (t == 0) *sh_out = 0x7fffffff;
  __syncthreads();
  double run = inc - local;   // exclusive prefix
  for (int w = 0; w < warp; ++w) run += sh_warp[w];
  if (run < target && run + local >= target) {   // the crossing is in this thread's bins
    int found = -1, last_nz = -1;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {   // constant indices: v stays in registers
      const float vi = (t * kPer + i < limit) ? v[i] : 0.f;
      if (found < 0 && vi > 0.f) {
        last_nz = t * kPer + i;
        run += static_cast<double>(vi);
        if (run >= target) found = t * kPer + i;
      }
    }
    const int last = found >= 0 ? found : last_nz;   // (rounding: its last non-empty bin)
    if (last >= 0) atomicMin(sh_out, last);
  }
  __syncthreads();
  const int out = *sh_out;
  __syncthreads();
  return out == 0x7fffffff ? -1 : out;
}

// Row r's tile records [t_lo, t_hi) recounted over the kept set (the recount of the f32 path:
// the tile pass's filtered_pass): s = sum of exp2(s2 - m) over the tokens with key >= tau_key
// that pass min-p, the one-hot draft left out; m = the row max (so finish merges them as it
// merges any partials). One warp per tile; a tile whose largest logit is below the threshold
// keeps nothing and is not read.
template <int kThreads, typename T>
__device__ void recount_tiles(const SpecSampleParams& p, const T* row, int r, float m, float scale,
                              uint32_t tau_key, float min_p, int excl, int t_lo, int t_hi) {
  constexpr int kN = VecN<T>::kN, kV = kTile / kN / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float tau_f = tau_key == 0u ? -INFINITY : key_to_float(tau_key);   // x >= tau_f: the key test
  const bool aligned = is_aligned16(row);
  SpecSampleTile* tl = ws_tiles(p) + static_cast<int64_t>(r) * p.num_tiles;
  auto sum_tile = [&](int base, auto minp_c, auto excl_c) {
    constexpr bool kMinP = decltype(minp_c)::value, kExcl = decltype(excl_c)::value;
    auto weight = [&](float x, int tok) {   // NaN fails x >= tau_f; -inf weighs 0
      if constexpr (kMinP) {   // min-p decides with kept()'s own expression
        const float w = exp2f(__fsub_rn(__fmul_rn(x, scale), m));
        bool in = x >= tau_f && w >= min_p;
        if constexpr (kExcl) in = in && tok != excl;
        return in ? w : 0.f;
      } else {                 // a token left out weighs exp2(-inf) = 0: FFMA, FSEL, MUFU
        bool in = x >= tau_f;
        if constexpr (kExcl) in = in && tok != excl;
        return exp2f(in ? fmaf(x, scale, -m) : -INFINITY);
      }
    };
    float acc = 0.f;
    if (aligned && base + kTile <= p.vocab) {
      const uint4* src = reinterpret_cast<const uint4*>(row + base);
      uint4 u[kV];
#pragma unroll
      for (int j = 0; j < kV; ++j) u[j] = __ldg(src + j * 32 + lane);
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        float x[kN];
        unpack16(u[j], x, static_cast<const T*>(nullptr));
#pragma unroll
        for (int e = 0; e < kN; ++e) acc += weight(x[e], base + (j * 32 + lane) * kN + e);
      }
    } else {
      for (int j = lane; j < kTile && base + j < p.vocab; j += 32) acc += weight(load_logit(row, base + j), base + j);
    }
    return warp_sum(acc);
  };
  using yes = std::true_type;
  using no = std::false_type;
  for (int t = t_lo + warp; t < t_hi; t += kThreads / 32) {
    const int base = t * kTile;
    float s = 0.f;
    if (order_key(tl[t].raw_max) >= tau_key) {
      const bool has_excl = excl >= base && excl < base + kTile;
      if (min_p > 0.f) s = has_excl ? sum_tile(base, yes(), yes()) : sum_tile(base, yes(), no());
      else s = has_excl ? sum_tile(base, no(), yes()) : sum_tile(base, no(), no());
    }
    if (lane == 0) { tl[t].m = m; tl[t].s = s; }
  }
}

// Grid (T, S), one launch (16-bit logits only), every row whose request filters. Top-k / top-p
// rows: each CTA counts its vocab slice into shared bins; with S > 1 it adds the non-zero ones
// to the row's global bins (integer atomics: order-free) and the last CTA goes on. That CTA
// (the only one when S = 1, the rows >= SMs case: no global traffic) resolves the threshold,
// writes the row's record and recounts the row's tile sums over the kept set. Min-p-only rows
// (no threshold) recount their tiles at once, split over the S CTAs.
template <typename T>
__device__ void hist_kernel(const SpecSampleParams& p) {
  constexpr int kThreads = SPEC_SAMPLE_HIST_THREADS;
  constexpr int kWarps = kThreads / 32;
  __shared__ uint32_t bins[kHistBins + 32];   // + one scratch word per lane (tokens past the bins)
  __shared__ unsigned long long scan64[kThreads];   // the fallback's radix
  __shared__ double sh_d[kWarps];
  __shared__ int sh_last, sh_out, digit;
  __shared__ unsigned long long above;
  __shared__ float sh_red[2 * kWarps];
  constexpr int kU = 8;   // 16-byte vectors per thread in flight
  pdl_trigger();   // finish may be scheduled once every CTA is in
  const int r = blockIdx.x, chunk = blockIdx.y, nchunks = gridDim.y;
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  const int V = p.vocab;
  // This CTA's slice in 16-byte vectors needs no parameter, so its first loads go out before
  // owner_of_row's dependent loads, the request's parameters and the tile records (r7: ~15%
  // of the stall samples waited there before any logit was requested).
  const bool aligned = is_aligned16(row);
  const int nvec = aligned ? V / 8 : 0;
  const int vper = (nvec + nchunks - 1) / nchunks;
  const int v_lo = min(nvec, chunk * vper), v_hi = min(nvec, v_lo + vper);
  const uint4* src = reinterpret_cast<const uint4*>(row);
  constexpr int kPre = 4;   // loaded before the parameter chain (all 8: spills at 64 registers)
  uint4 u[kU];
  if (v_lo < v_hi) {   // unpredicated loads of clamped indices: predicated ones were sunk below
#pragma unroll         // owner_of_row's loop by ptxas
    for (int k = 0; k < kPre; ++k) u[k] = __ldg(src + min(v_lo + k * kThreads + static_cast<int>(threadIdx.x), v_hi - 1));
  }
  // launched right after the tile pass: the logits above are the caller's (complete before
  // the tile pass began), the tile records below are the tile pass's
  pdl_wait();
  // row max of s2 and raw max, from the tile partials (they need only the row: their loads
  // go out with the logits', ahead of owner_of_row's chain too)
  float m = -INFINITY, raw_max = -INFINITY;
  for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
    const SpecSampleTile tr = ws_tiles(p)[static_cast<int64_t>(r) * p.num_tiles + t];
    m = fmaxf(m, tr.m);
    raw_max = fmaxf(raw_max, tr.raw_max);
  }
  const int b = owner_of_row(p.cu_q, p.batch, r);
  const SeqParams sp = seq_params(p, b);
  if (!sp.filtered) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool cut_on = sp.k_on || sp.p_on;
  m = warp_max(m);
  raw_max = warp_max(raw_max);
  if (lane == 0) { sh_red[warp] = m; sh_red[kWarps + warp] = raw_max; }
  if (cut_on)
    for (int j = threadIdx.x; j < kHistBins + 32; j += kThreads) bins[j] = 0u;
  __syncthreads();
  m = sh_red[0];
  raw_max = sh_red[kWarps];
  for (int w = 1; w < kWarps; ++w) {
    m = fmaxf(m, sh_red[w]);
    raw_max = fmaxf(raw_max, sh_red[kWarps + w]);
  }
  SpecSampleRow* rows = ws_rows(p);
  auto write_row = [&](uint32_t tau) {
    SpecSampleRow rs;
    rs.tau_key = tau; rs.m = m;
    rows[r] = rs;
  };
  // nothing finite, or a +inf: the block is invalid (finish flags it), nothing to filter
  if (!(m > -INFINITY) || !(raw_max < INFINITY)) {
    if (chunk == 0 && threadIdx.x == 0) write_row(0u);
    return;
  }
  const float scale = sp.scale;
  const float min_p = sp.min_p;
  const int r0 = __ldg(p.cu_q + b);
  const int excl = excluded_draft(p, b, r - r0, __ldg(p.cu_q + b + 1) - r0);
  // top-p without top-k: its base is the whole row's mass, the tile sums (they leave the
  // one-hot draft out) + the draft; read here, while the first logits are in flight
  float z_row = 0.f;
  if (sp.p_on && !sp.k_on && sp.top_p > 0.f) {
    float z = 0.f;
    for (int t = threadIdx.x; t < p.num_tiles; t += kThreads) {
      const SpecSampleTile tr = ws_tiles(p)[static_cast<int64_t>(r) * p.num_tiles + t];
      z += scaled_sum(tr.m, tr.s, m);
    }
    z = block_sum<kThreads>(z, sh_red);
    if (excl >= 0 && excl < V) {
      const float lx = load_logit(row, excl);
      if (lx > -INFINITY) z += exp2f(__fsub_rn(__fmul_rn(lx, scale), m));
    }
    z_row = z;
  }
  if (!cut_on) {   // min-p only: no threshold, each CTA recounts its share of the tiles
    if (chunk == 0 && threadIdx.x == 0) write_row(0u);
    const int per = (p.num_tiles + nchunks - 1) / nchunks;
    recount_tiles<kThreads>(p, row, r, m, scale, 0u, min_p, excl, min(p.num_tiles, chunk * per),
                            min(p.num_tiles, (chunk + 1) * per));
    return;
  }
  uint32_t omax = max_key16(raw_max, static_cast<const T*>(nullptr));
  uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(bins));
  asm("" : "+r"(sbase));   // computed once, not per vector
  const uint32_t omax2 = omax | (omax << 16);
  const uint32_t lim = kHistBins + lane;   // farther tokens: this lane's scratch word

  // --- the pass: per token a key difference and one shared increment (no branch). A NaN (its
  // block is invalid anyway) may borrow across the halves: its bins are wrong, none out of range.
  auto count_word = [&](uint32_t w, auto two) {
    const uint32_t d = omax2 - ord16x2(w);
    const uint32_t i0 = min(d & 0xffffu, lim);
    const uint32_t i1 = decltype(two)::value ? min(d >> 16, lim) : lim;
    asm volatile("red.shared.add.u32 [%0], 1;" ::"r"(sbase + 4u * i0) : "memory");
    asm volatile("red.shared.add.u32 [%0], 1;" ::"r"(sbase + 4u * i1) : "memory");
  };
  for (int v0 = v_lo; v0 < v_hi; v0 += kThreads * kU) {
#pragma unroll
    for (int k = 0; k < kU; ++k) {   // (the first batch's first kPre were loaded at the top)
      const int vi = v0 + k * kThreads + threadIdx.x;
      if ((v0 != v_lo || k >= kPre) && vi < v_hi) u[k] = __ldg(src + vi);
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      if (v0 + k * kThreads + threadIdx.x < v_hi) {
        count_word(u[k].x, std::true_type()); count_word(u[k].y, std::true_type());
        count_word(u[k].z, std::true_type()); count_word(u[k].w, std::true_type());
      }
    }
  }
  {   // tokens outside whole vectors (the tail, every token of a misaligned row), one at a time
    const uint16_t* r16 = reinterpret_cast<const uint16_t*>(row);
    const int lo = aligned ? (chunk == nchunks - 1 ? nvec * 8 : V) : min(V, chunk * ((V + nchunks - 1) / nchunks));
    const int hi = aligned ? V : min(V, lo + (V + nchunks - 1) / nchunks);
    for (int i = lo + threadIdx.x; i < hi; i += kThreads)
      count_word(static_cast<uint32_t>(__ldg(r16 + i)), std::false_type());
  }
  __syncthreads();
  if (nchunks > 1) {
    SpecSampleFilter* f = ws_filters(p) + r;
    uint32_t* gbins = f->count;   // count, msum and cand: 8192 contiguous words (see the header)
    for (int j = threadIdx.x; j < kHistBins; j += kThreads)
      if (bins[j]) atomicAdd(gbins + j, bins[j]);
    if (!last_cta(f->head.done, &sh_last)) return;
    for (int j = threadIdx.x; j < kHistBins; j += kThreads) bins[j] = __ldcg(gbins + j);
    __syncthreads();
  }

  // --- resolve: the row's bins -> the threshold
  auto value = [&](int j) { return bits16_to_float(ord16_inverse(omax - j), static_cast<const T*>(nullptr)); };
  // weight of one token of bin j (the expression kept() uses)
  auto unit = [&](int j) { return exp2f(__fsub_rn(__fmul_rn(value(j), scale), m)); };
  // this thread's bins in registers: counts, and (top-p) masses with one exp2 per non-empty bin
  constexpr int kPer = kHistBins / kThreads;
  float cnt[kPer], wgt[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = threadIdx.x * kPer + i;
    const uint32_t c = bins[j];
    cnt[i] = static_cast<float>(c);   // exact: c <= V < 2^24
    wgt[i] = (sp.p_on && c) ? static_cast<float>(c) * unit(j) : 0.f;
  }
  bool ok = true;
  int cut = kHistBins;   // the last kept bin
  if (sp.k_on) {
    cut = first_crossing_regs<kThreads>(cnt, static_cast<double>(sp.top_k), kHistBins, sh_d, &sh_out);
    ok = cut >= 0;
  }
  if (ok && sp.p_on) {
    int jp;
    if (!(sp.top_p > 0.f)) {
      jp = first_crossing_regs<kThreads>(cnt, 1.0, kHistBins, sh_d, &sh_out);   // the max and its ties
    } else {
      double base = static_cast<double>(z_row);
      if (sp.k_on) {   // top-p on the top-k-renormalised distribution
        double part = 0.0;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
          part += (static_cast<int>(threadIdx.x) * kPer + i <= cut) ? static_cast<double>(wgt[i]) : 0.0;
        base = block_sum<kThreads>(part, sh_d);
      }
      jp = first_crossing_regs<kThreads>(wgt, static_cast<double>(sp.top_p) * base,
                                         sp.k_on ? cut + 1 : kHistBins, sh_d, &sh_out);
      if (jp < 0 && sp.k_on) jp = cut;   // rounding: the reference keeps the whole top-k set
    }
    ok = jp >= 0;
    cut = min(cut, jp);
  }
  uint32_t tau = ok ? order_key(value(cut)) : 0u;

  if (!ok) {
    // --- fallback (the crossing lies past the bins): the exact radix select over the whole row
    // in this CTA, the f32 path's rule (integer masses)
    unsigned long long* hist = reinterpret_cast<unsigned long long*>(bins);   // 16 KB of the 32
    auto qmass = [&](float x) {
      return static_cast<unsigned long long>(
          static_cast<uint32_t>(fminf(exp2f(__fsub_rn(__fmul_rn(x, scale), m)), 1.f) * 2147483648.0f));
    };
    auto one = [](float) { return 1ull; };
    auto walk = [&](auto&& cnt) {
      for_each_logit<kThreads>(row, V, 0, 1, [&](float x) {
        if (!isnan(x) && order_key(x) >= tau) cnt(order_key(x), x);
      });
    };
    if (sp.k_on)
      tau = radix_rounds<kThreads>(walk, one, static_cast<unsigned long long>(sp.top_k), hist, scan64,
                                   &digit, &above);
    if (sp.p_on) {
      unsigned long long tot = 0;
      walk([&](uint32_t, float x) { tot += qmass(x); });
      const unsigned long long all = block_sum_u64<kThreads>(tot, scan64);
      if (threadIdx.x == 0) above = all;
      __syncthreads();
      const unsigned long long total = above;
      __syncthreads();
      unsigned long long target = static_cast<unsigned long long>(
          ceil(static_cast<double>(fmaxf(sp.top_p, 0.f)) * static_cast<double>(total)));
      target = target < 1ull ? 1ull : (target > total ? total : target);
      tau = max(tau, radix_rounds<kThreads>(walk, qmass, target, hist, scan64, &digit, &above));
    }
  }
  if (threadIdx.x == 0) write_row(tau);
  // --- the row's tile sums over the kept set, in place (this CTA is the row's only one left)
  recount_tiles<kThreads>(p, row, r, m, scale, tau, min_p, excl, 0, p.num_tiles);
}

}  // namespace
