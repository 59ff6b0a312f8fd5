// spec_sample for many rows in two launches (sm_90, 16-bit logits, one-hot drafts, rows
// 16-byte aligned). Included by spec_sample.cu only.
//
// Why: the tiles path reads a filtered row up to three times and launches three kernels; the
// rows path holds a row in a cluster but pays cluster barriers and per-CTA fixed work 8 times
// per row. Here one persistent CTA per SM owns whole rows and streams each row once from DRAM
// (a cp.async ring of SPEC_SAMPLE_STREAM_STAGES x 16 KB, the next row's first stages issued
// before the current row's resolve). Per row: packed max, NaN / +inf flags, a greedy argmax
// candidate per thread, the row mass (an exp per token) and, for top-k / top-p / min-p rows,
// an ABSOLUTE exact-value histogram of the 16-bit keys (65536 u16 counters = 128 KB of shared
// memory, two per word) of the tokens within 2^-kFloorLog2 of the running max's weight. The
// thresholds, p(draft) and the accept decision come from the bins (an exp per bin); a cut
// below the counted range recounts every token of the row (rare on LM rows).
//   spec_sample_stream_<dt>: per row a SpecSampleRowOut record (accept, tau, greedy token).
//   spec_sample_race_<dt>: grid (tile groups, B); every CTA walks its sequence's records
//     (chain_seq) to find the row that samples, sums its tiles' kept weights and races them
//     (level 1); the last CTA of the sequence merges, races the winning tile's tokens (level
//     2), writes the token into the record and assembles the block's outputs (chain_seq).
// A u16 counter would wrap after 65535 equal keys: between segments of the stream (normalize_due)
// counters past 0x7fff are moved into a small table of large counts (rare: a value repeated
// tens of thousands of times), so no counter ever wraps.
// Slower than the tiles path so far (docs/PERF.md, spec_sample session 8): opt-in only.
#pragma once
#include "common/cp_async.cuh"
#include "common/ragged.cuh"
#include "sampling/sample_common.cuh"
#include "sampling/sample_hist.cuh"
#include "sampling/sample_finish.cuh"
#include "sampling/sample_rows.cuh"

using namespace specdec;

namespace {

constexpr int kStreamThreads = SPEC_SAMPLE_STREAM_THREADS;
constexpr int kStreamStages = SPEC_SAMPLE_STREAM_STAGES;
constexpr int kHistWords = 32768;                           // 65536 u16 counters
constexpr int kMaxOwned = 64;                               // rows per CTA in the balanced order
constexpr int kBigCounts = 32;                              // large-count table entries
constexpr uint32_t kNoKey = 0xffffffffu;
constexpr float kFloorLog2 = 16.f;   // tokens counted: within 2^-16 of the running max's weight
constexpr int kStreamVecs = SPEC_SAMPLE_STREAM_VECS;        // 16-byte vectors per thread per stage
// u16 counters never wrap: the first segment of stages counts < 65536 tokens from zero, later
// ones < 32768 after a normalize left every counter <= 0x7fff (+ the V % 8 tail tokens)
constexpr int kFirstSegment = 65528 / (8 * kStreamThreads * kStreamVecs);
constexpr int kSegment = 32760 / (8 * kStreamThreads * kStreamVecs);

// After `done` of `nstages` stages of counting: normalize the counters before the next stage.
__device__ __forceinline__ bool normalize_due(int done, int nstages) {
  return done < nstages &&
         (done == kFirstSegment || (done > kFirstSegment && (done - kFirstSegment) % kSegment == 0));
}
constexpr int kRaceThreads = SPEC_SAMPLE_RACE_THREADS;
constexpr int kRaceWarps = kRaceThreads / 32;               // one tile per warp

// Race partials of one CTA of spec_sample_race (after the records and the done counters).
struct RaceSlot {
  int any;
  KeyArg r, p;
  float wsum;     // kept mass of its tiles, the draft included (z of p)
};

__device__ __forceinline__ uint32_t* ws_race_done(const SpecSampleParams& p) {   // [B]
  return reinterpret_cast<uint32_t*>(ws_row_out(p) + p.num_rows);
}
__device__ __forceinline__ RaceSlot* ws_race_slots(const SpecSampleParams& p) {   // [B, G]
  return reinterpret_cast<RaceSlot*>(ws_race_done(p) + ((p.batch + 3) & ~3));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Key of the largest 16-bit value <= f when f >= 0, of the smallest >= f when f < 0 (rounding
// toward zero): every value >= f has a key >= it.
__device__ __forceinline__ uint32_t floor_key16(float f, const bf16_t*) {
  return f == -INFINITY ? 0u : ord16x2(__float_as_uint(f) >> 16) & 0xffffu;
}
__device__ __forceinline__ uint32_t floor_key16(float f, const __half*) {
  return f == -INFINITY ? 0u : ord16x2(__half_as_ushort(__float2half_rz(f))) & 0xffffu;
}

// Exclusive prefix (in thread order) of two doubles over the CTA, and the totals.
template <int kThreads>
__device__ __forceinline__ void block_excl_scan2(double a, double b, double& ea, double& eb,
                                                 double& ta, double& tb, double* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double ia = a, ib = b;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const double oa = __shfl_up_sync(0xffffffffu, ia, d), ob = __shfl_up_sync(0xffffffffu, ib, d);
    if (lane >= d) { ia += oa; ib += ob; }
  }
  __syncthreads();
  if (lane == 31) { sh[2 * warp] = ia; sh[2 * warp + 1] = ib; }
  __syncthreads();
  double pa = 0.0, pb = 0.0;
  ta = 0.0; tb = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w == warp) { pa = ta; pb = tb; }
    ta += sh[2 * w]; tb += sh[2 * w + 1];
  }
  ea = pa + ia - a;
  eb = pb + ib - b;
  __syncthreads();
}

template <typename T>
__device__ void stream_kernel(const SpecSampleParams& p) {
  extern __shared__ __align__(16) unsigned char stream_dyn[];
  uint32_t* hist = reinterpret_cast<uint32_t*>(stream_dyn);                        // [kHistWords]
  uint4* ring = reinterpret_cast<uint4*>(stream_dyn + kHistWords * sizeof(uint32_t));   // [stages][threads]
  __shared__ uint32_t big_key[kBigCounts], big_cnt[kBigCounts];
  __shared__ int any_big;
  __shared__ float sh_f[kStreamThreads / 32];
  __shared__ int sh_i[kStreamThreads / 32];
  __shared__ double sh_d[2 * (kStreamThreads / 32)];
  __shared__ double sh_b[2];
  __shared__ int sh_owner, sh_out;
  __shared__ uint32_t sh_runmax;   // order_key of the block's running max (counted rows)
  __shared__ int owned[kMaxOwned];   // this CTA's rows, in the balanced order
  __shared__ int sh_order;           // 1: owned[] holds them
  const int tid = threadIdx.x;
  const int V = p.vocab;
  const int nvec = V / 8;                                        // full 16-byte vectors
  const int tail = V - nvec * 8;
  constexpr int kStage = kStreamThreads * kStreamVecs;          // vectors per stage
  const int nstages = (nvec + kStage - 1) / kStage;
  if (blockIdx.x == 0)
    for (int j = tid; j < p.batch; j += kStreamThreads) ws_race_done(p)[j] = 0u;

  auto row_ptr = [&](int r) {
    return static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  };
  auto issue = [&](const T* row, int s) {   // stage s of a row into its ring slot (own cells)
#pragma unroll
    for (int v = 0; v < kStreamVecs; ++v) {
      const int j = s * kStage + v * kStreamThreads + tid;
      if (s < nstages && j < nvec)
        cp_async_16(ring + ((s % kStreamStages) * kStreamVecs + v) * kStreamThreads + tid,
                    reinterpret_cast<const uint4*>(row) + j, true);
    }
    cp_async_commit();
  };
  // The rows this CTA takes: with a valid layout and few enough rows per CTA, the sampled rows
  // (the costly ones) dealt round-robin first and the greedy rows after them, so no CTA gets
  // two sampled rows while another has none; else rows blockIdx.x, + gridDim.x, ...
  const int G = gridDim.x, c = blockIdx.x;
  const int n_mine = c < p.num_rows ? (p.num_rows - c + G - 1) / G : 0;
  {
    bool ok = n_mine <= kMaxOwned && __ldg(p.cu_q) == 0 && __ldg(p.cu_q + p.batch) == p.num_rows;
    const int per = (p.batch + kStreamThreads - 1) / kStreamThreads;   // sequences per thread
    const int b0 = min(p.batch, tid * per), b1 = min(p.batch, b0 + per);
    double ns = 0.0, ng = 0.0;
    for (int b = b0; b < b1; ++b) {
      const int q = __ldg(p.cu_q + b + 1) - __ldg(p.cu_q + b);
      ok = ok && q >= 0;
      if (__ldg(p.temperature + b) > 0.f) ns += q; else ng += q;
    }
    ok = __syncthreads_and(ok);
    if (tid == 0) sh_order = ok;
    double es, eg, ts, tg;
    block_excl_scan2<kStreamThreads>(ns, ng, es, eg, ts, tg, sh_d);
    if (ok) {   // virtual index v (sampled rows [0, NS), greedy rows [NS, T)) -> CTA v % G, slot v / G
      int vs = static_cast<int>(es), vg = static_cast<int>(ts + eg);
      for (int b = b0; b < b1; ++b) {
        const int r0 = __ldg(p.cu_q + b), q = __ldg(p.cu_q + b + 1) - r0;
        const bool sampled = __ldg(p.temperature + b) > 0.f;
        const int v0 = sampled ? vs : vg;
        for (int v = v0 + ((c - v0) % G + G) % G; v < v0 + q; v += G) owned[v / G] = r0 + (v - v0);
        if (sampled) vs += q; else vg += q;
      }
    }
    __syncthreads();
  }
  auto mine = [&](int k) { return sh_order ? owned[k] : c + k * G; };
  if (n_mine > 0)
    for (int s = 0; s < kStreamStages - 1; ++s) issue(row_ptr(mine(0)), s);

  for (int kr = 0; kr < n_mine; ++kr) {
    const int r = mine(kr);
    const T* row = row_ptr(r);
    const int b = owner_of_row(p.cu_q, p.batch, r);
    const int r0 = __ldg(p.cu_q + b);
    const int q = __ldg(p.cu_q + b + 1) - r0;
    const int i = r - r0;
    const int k = q - 1;
    const SeqParams sp = applied_params(p, b);
    const int dpos = r - b;
    const bool has_draft = i >= 0 && i < k && dpos >= 0 && dpos < p.num_rows - p.batch;
    const int x = has_draft ? __ldg(p.draft_ids + dpos) : -1;
    const bool x_ok = x >= 0 && x < V;
    const float lx = (!sp.greedy && x_ok) ? load_logit(row, x) : -INFINITY;
    // z: the row mass (sampled rows, greedy logprobs) from an exp per token; bins: exact counts
    // of the tokens within kFloorLog2 of the running max (top-k / top-p / min-p rows only)
    const bool need_z = !sp.greedy || p.logprobs != nullptr;
    const bool need_bins = !sp.greedy && (sp.k_on || sp.p_on || sp.min_p > 0.f);
    const float scale = sp.scale;
    const float span = kFloorLog2 / scale;   // the floor, in logit units below the running max

    auto zero_bins = [&]() {
      uint4* h4 = reinterpret_cast<uint4*>(hist);
      for (int j = tid; j < kHistWords / 4; j += kStreamThreads) h4[j] = make_uint4(0u, 0u, 0u, 0u);
      if (tid < kBigCounts) { big_key[tid] = kNoKey; big_cnt[tid] = 0u; }
      if (tid == 0) { any_big = 0; sh_runmax = order_key(-INFINITY); }
    };
    __syncthreads();   // the previous row's resolve is done with the bins
    if (need_bins) zero_bins();
    __syncthreads();

    // Moves counts past 0x7fff into the large-count table (between barriers: one writer per word).
    auto normalize = [&]() {
      __syncthreads();
      uint4* h4 = reinterpret_cast<uint4*>(hist);
      for (int j = tid; j < kHistWords / 4; j += kStreamThreads) {
        uint4 v = h4[j];
        if (((v.x | v.y | v.z | v.w) & 0x80008000u) == 0u) continue;
        auto fix = [&](uint32_t& w, uint32_t word) {
#pragma unroll
          for (uint32_t h = 0; h < 2; ++h) {
            const uint32_t bit = 0x8000u << (16 * h);
            if (!(w & bit)) continue;
            w -= bit;
            const uint32_t key = 2u * word + h;
            any_big = 1;
            for (int s = 0; s < kBigCounts; ++s) {
              const uint32_t old = atomicCAS(&big_key[s], kNoKey, key);
              if (old == kNoKey || old == key) { atomicAdd(&big_cnt[s], 0x8000u); break; }
            }
          }
        };
        fix(v.x, 4u * j); fix(v.y, 4u * j + 1u); fix(v.z, 4u * j + 2u); fix(v.w, 4u * j + 3u);
        h4[j] = v;
      }
      __syncthreads();
    };
    auto count_key = [&](uint32_t key) { atomicAdd(hist + (key >> 1), 1u << ((key & 1u) << 4)); };

    // ---- the stream: packed max / NaN max, argmax candidate (greedy), z, counts near the max.
    // One loop per row kind (kMode: 0 greedy, 1 greedy + z, 2 sampled, 3 sampled + bins), so
    // no per-vector test of the kind.
    uint32_t mx2 = ninf2<T>(), nn2 = ninf2<T>();
    float best_v = -INFINITY;
    int best_i = -1;   // greedy: the vector holding best_v first
    float zref = -INFINITY, zsum = 0.f;   // this thread's sum of exp2(s2 - zref)
    auto rebase = [&](float s2) {          // zref = max(zref, s2) (rare after the start)
      if (s2 > zref) { zsum = zref == -INFINITY ? 0.f : zsum * exp2f(zref - s2); zref = s2; }
    };
    // the count floor from the block's running max: keys >= it are counted
    auto running_kf = [&]() { return floor_key16(key_to_float(sh_runmax) - span, static_cast<const T*>(nullptr)); };
    float pub = -INFINITY;                 // the running max this thread last published
    auto stream = [&](auto kMode) {
      constexpr int MODE = decltype(kMode)::value;
      constexpr bool GREEDY = MODE <= 1, Z = MODE >= 1, BINS = MODE == 3;
      // one 16-byte vector of 8 tokens (ids 8 j ..); kf2: count the keys >= it (both halves)
      auto vector = [&](const uint4& u, int j, uint32_t kf2) {
        const uint32_t vm = hmax2<T>(hmax2<T>(u.x, u.y), hmax2<T>(u.z, u.w));
        mx2 = hmax2<T>(mx2, vm);
        nn2 = hmax2_nan<T>(nn2, hmax2_nan<T>(hmax2_nan<T>(u.x, u.y), hmax2_nan<T>(u.z, u.w)));
        const float vmf = fmaxf(half_lo<T>(vm), half_hi<T>(vm));
        float f[8];
        if constexpr (GREEDY) {   // the first vector holding this thread's max (no branch)
          const bool take = vmf > best_v || (best_i < 0 && vmf == vmf);
          best_v = take ? vmf : best_v;
          best_i = take ? j : best_i;
        }
        if constexpr (Z) {
          unpack16(u, f, static_cast<const T*>(nullptr));
          rebase(__fmul_rn(vmf, scale));
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float w = exp2f(fmaf(f[e], scale, -zref));
            zsum += (GREEDY && f[e] != f[e]) ? 0.f : w;   // greedy rows may hold NaN
          }
        }
        if constexpr (BINS) {   // tokens with key >= kf2 (both halves): a hit mask, then the hits only
          const uint32_t k0 = ord16x2(u.x), k1 = ord16x2(u.y), k2 = ord16x2(u.z), k3 = ord16x2(u.w);
          const uint32_t c0 = __vcmpgeu2(k0, kf2), c1 = __vcmpgeu2(k1, kf2);
          const uint32_t c2 = __vcmpgeu2(k2, kf2), c3 = __vcmpgeu2(k3, kf2);
          if ((c0 | c1 | c2 | c3) != 0u) {
            // bit h: the low half of word h, bit 16 + h: its high half
            uint32_t hits = (c0 & 0x10001u) | ((c1 & 0x10001u) << 1) | ((c2 & 0x10001u) << 2) | ((c3 & 0x10001u) << 3);
            while (hits) {
              const int bit = __ffs(hits) - 1;
              hits &= hits - 1u;
              const int h = bit & 15;
              const uint32_t kw = h < 2 ? (h == 0 ? k0 : k1) : (h == 2 ? k2 : k3);
              count_key(bit >= 16 ? kw >> 16 : kw & 0xffffu);
            }
            if (vmf > pub) { pub = vmf; atomicMax(&sh_runmax, order_key(vmf)); }
          }
        }
      };
      int s = 0;
      auto stage = [&]() {
        issue(row, s + kStreamStages - 1);
        cp_async_wait<kStreamStages - 1>();
        const uint32_t kf2 = BINS ? running_kf() * 0x10001u : 0u;
        const uint4* slot = ring + (s % kStreamStages) * kStage + tid;
#pragma unroll
        for (int v = 0; v < kStreamVecs; ++v) {
          const int j = s * kStage + v * kStreamThreads + tid;
          if (j < nvec) vector(slot[v * kStreamThreads], j, kf2);
        }
        ++s;
      };
      while (s < nstages) {
        stage();
        if (BINS && normalize_due(s, nstages)) normalize();
      }
    };
    if (sp.greedy) {
      if (need_z) stream(std::integral_constant<int, 1>());
      else stream(std::integral_constant<int, 0>());
    } else {
      if (need_bins) stream(std::integral_constant<int, 3>());
      else stream(std::integral_constant<int, 2>());
    }
    float tail_f = -INFINITY;   // this thread's tail token (greedy: checked against the row max)
    auto tail_tokens = [&](uint32_t kf) {   // the last V % 8 tokens, one per thread
      if (tid < tail) {
        const int id = nvec * 8 + tid;
        const uint32_t h = reinterpret_cast<const uint16_t*>(row)[id];
        const uint32_t w2 = h * 0x10001u;
        const float f = half_lo<T>(w2);
        mx2 = hmax2<T>(mx2, w2);
        nn2 = hmax2_nan<T>(nn2, w2);
        const uint32_t key = ord16x2(w2) & 0xffffu;
        if (need_bins && key >= kf) count_key(key);
        if (need_z && (f == f || !sp.greedy)) {
          rebase(__fmul_rn(f, scale));
          zsum += exp2f(fmaf(f, scale, -zref));
        }
        tail_f = f;
      }
    };
    tail_tokens(need_bins ? running_kf() : 0u);
    // the next row's first stages load under this row's resolve
    if (kr + 1 < n_mine)
      for (int s = 0; s < kStreamStages - 1; ++s) issue(row_ptr(mine(kr + 1)), s);

    // ---- row max, flags; greedy: the lowest id holding the max
    const float nlo = half_lo<T>(nn2), nhi = half_hi<T>(nn2);
    const float M = block_max<kStreamThreads>(fmaxf(half_lo<T>(mx2), half_hi<T>(mx2)), sh_f);
    uint32_t flags = __syncthreads_or(nlo != nlo || nhi != nhi) ? kFlagNaN : 0u;
    if (M == INFINITY) flags |= kFlagPosInf;
    SpecSampleRowOut* out = ws_row_out(p) + r;
    const float m = __fmul_rn(M, scale);
    auto write_rec = [&](int token, int accept, float lp_draft, float lp_token, int empty, uint32_t tau) {
      SpecSampleRowOut o;
      o.owner = b; o.token = token; o.accept = accept; o.flags = flags; o.empty = empty;
      o.lp_draft = lp_draft; o.lp_token = lp_token; o.tau = tau;
      *out = o;
    };
    int arg = -1;
    if (sp.greedy) {   // the lowest id equal to M: in the candidate vector of a thread whose max is M
      int mine = 0x7fffffff;
      if (best_i >= 0 && best_v == M) {
        float f[8];
        unpack16(__ldg(reinterpret_cast<const uint4*>(row) + best_i), f, static_cast<const T*>(nullptr));
#pragma unroll
        for (int e = 7; e >= 0; --e) if (f[e] == M) mine = 8 * best_i + e;
      }
      if (tid < tail && tail_f == M) mine = min(mine, nvec * 8 + tid);
      const int a = -block_max<kStreamThreads>(-mine, sh_i);
      arg = a == 0x7fffffff ? -1 : a;   // none: every token is NaN
    }
    if ((sp.greedy && !need_z) || (!sp.greedy && (flags != 0u || !(M > -INFINITY)))) {
      if (tid == 0) write_rec(sp.greedy ? arg : -1, 0, 0.f, 0.f, sp.greedy ? arg < 0 : !(M > -INFINITY), 0u);
      continue;
    }
    // the row mass sum exp2(s2 - m) (fixed-order block sum)
    const float z_row = block_sum<kStreamThreads>(zref == -INFINITY ? 0.f : zsum * exp2f(zref - m), sh_f);
    if (sp.greedy) {   // logprobs: log-softmax of the raw logits at the argmax (NaN left out)
      if (tid == 0) write_rec(arg, 0, 0.f, (M * kLog2e - m - (z_row > 0.f ? log2f(z_row) : 0.f)) * kLn2, arg < 0, 0u);
      continue;
    }

    // ---- the bins: exact where the value is >= the final floor (every such token was counted)
    const uint32_t omax = max_key16(M, static_cast<const T*>(nullptr));
    const uint32_t kbot = ord16x2(ninf2<T>()) & 0xffffu;   // -inf; keys below it are NaN
    auto value = [&](uint32_t key) { return bits16_to_float(ord16_inverse(key), static_cast<const T*>(nullptr)); };
    auto unit = [&](uint32_t key) { return exp2f(__fsub_rn(__fmul_rn(value(key), scale), m)); };
    auto mass = [&](uint32_t key, uint32_t c) { return c ? static_cast<float>(c) * unit(key) : 0.f; };
    uint32_t tau = 0u;
    double z_kept = z_row;
    for (int attempt = 0; attempt < 2 && need_bins; ++attempt) {
      const float floor_final = attempt == 0 ? M - span : -INFINITY;
      if (attempt == 1) {   // the cut lies below the floor: count every token (from L2 / DRAM)
        __syncthreads();
        zero_bins();
        __syncthreads();
        for (int s = 0; s < nstages; ++s) {
#pragma unroll
          for (int v = 0; v < kStreamVecs; ++v) {
            const int j = s * kStage + v * kStreamThreads + tid;
            if (j >= nvec) continue;
            const uint4 u = __ldg(reinterpret_cast<const uint4*>(row) + j);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int h = 0; h < 4; ++h) {
              const uint32_t k2 = ord16x2(w[h]);
              count_key(k2 & 0xffffu);
              count_key(k2 >> 16);
            }
          }
          if (normalize_due(s + 1, nstages)) normalize();
        }
        if (tid < tail) count_key(ord16x2(reinterpret_cast<const uint16_t*>(row)[nvec * 8 + tid] * 0x10001u) & 0xffffu);
      }
      __syncthreads();   // every count is in
      const bool big = any_big != 0;
      auto cnt = [&](uint32_t key) {
        uint32_t c = (hist[key >> 1] >> ((key & 1u) << 4)) & 0xffffu;
        if (big)
          for (int s = 0; s < kBigCounts; ++s) if (big_key[s] == key) c += big_cnt[s];
        return c;
      };
      auto exact = [&](uint32_t key) { return key >= kbot && key <= omax && value(key) >= floor_final; };
      // the keys that can be exact, [klo, omax], split over the threads highest first: thread t
      // holds [omax - S (t + 1) + 1, omax - S t] (S = 1 for a peaked row's few hundred keys)
      const uint32_t klo = attempt == 0 ? max(kbot, floor_key16(floor_final, static_cast<const T*>(nullptr))) : kbot;
      const uint32_t nkeys = omax >= klo ? omax - klo + 1u : 0u;
      const uint32_t S = (nkeys + kStreamThreads - 1) / kStreamThreads;   // <= 128
      const int64_t khi = static_cast<int64_t>(omax) - static_cast<int64_t>(S) * tid;
      // fn(key, count) over this thread's non-empty exact keys >= lo, highest first
      auto for_keys = [&](uint32_t lo, auto fn) {
        const int64_t bottom = max(static_cast<int64_t>(lo), static_cast<int64_t>(klo));
        for (uint32_t e = 0; e < S; ++e) {
          const int64_t key = khi - e;
          if (key < bottom) break;
          const uint32_t c = cnt(static_cast<uint32_t>(key));
          if (c && exact(static_cast<uint32_t>(key))) fn(static_cast<uint32_t>(key), c);
        }
      };
      double seg_c = 0.0, seg_m = 0.0;
      for_keys(0u, [&](uint32_t key, uint32_t c) {
        seg_c += c;
        seg_m += static_cast<double>(mass(key, c));
      });
      double ex_c, ex_m, tot_c, tot_m;
      block_excl_scan2<kStreamThreads>(seg_c, seg_m, ex_c, ex_m, tot_c, tot_m, sh_d);
      // First key (from the top) where the cumulative count / mass reaches target (-1: not
      // within the exact keys); *through: the mass of the keys from the top down to it.
      auto search = [&](bool by_mass, double target, double* through) {
        const double ex = by_mass ? ex_m : ex_c, seg = by_mass ? seg_m : seg_c;
        if (tid == 0) sh_owner = -1;
        __syncthreads();
        if (ex < target && ex + seg >= target) { sh_owner = tid; sh_b[0] = ex; sh_b[1] = ex_m; }
        __syncthreads();
        const int owner = sh_owner;
        const double before = sh_b[0], before_m = sh_b[1];
        __syncthreads();
        if (owner < 0) return -1;
        const int64_t okhi = static_cast<int64_t>(omax) - static_cast<int64_t>(S) * owner;
        const int64_t skey = okhi - tid;
        const uint32_t key = static_cast<uint32_t>(max(skey, static_cast<int64_t>(0)));
        const uint32_t c = (tid < static_cast<int>(S) && skey >= static_cast<int64_t>(klo) && exact(key)) ? cnt(key) : 0u;
        const float v[1] = {by_mass ? mass(key, c) : static_cast<float>(c)};
        int jl = first_crossing_regs<kStreamThreads, 1>(v, target - before, static_cast<int>(S), sh_d, &sh_out);
        if (jl < 0) jl = block_max<kStreamThreads>(c ? tid : -1, sh_i);   // rounding: its last non-empty key
        if (through != nullptr) {
          const double part = block_dsum<kStreamThreads>(tid <= jl ? static_cast<double>(mass(key, c)) : 0.0, sh_d);
          *through = before_m + part;
        }
        return static_cast<int>(okhi - jl);
      };
      // min-p keeps exp2(s2 - m) >= min_p: within the exact keys unless it reaches below the floor
      bool below = sp.min_p > 0.f && !(log2f(sp.min_p) > -(kFloorLog2 - 1.f)) && attempt == 0;
      int cut = -1;   // keep keys >= cut (-1: no top-k / top-p cut)
      double base = z_row;
      if (sp.k_on) {
        cut = search(false, static_cast<double>(sp.top_k), sp.p_on ? &base : nullptr);
        if (cut < 0) below = below || attempt == 0;   // fewer exact tokens than k
      }
      if (sp.p_on && !(cut < 0 && sp.k_on)) {
        int kp = !(sp.top_p > 0.f) ? search(false, 1.0, nullptr)
                                   : search(true, static_cast<double>(sp.top_p) * base, nullptr);
        if (kp < 0) {
          if (attempt == 0 && !sp.k_on) below = true;   // the mass to reach lies below the floor
          kp = cut;
        }
        cut = max(cut, kp);
      }
      if (below && attempt == 0) continue;
      tau = cut >= 0 ? order_key(value(static_cast<uint32_t>(cut))) : 0u;
      // kept mass (top-k / top-p cut, min-p)
      if (cut >= 0 || sp.min_p > 0.f) {
        double zk = 0.0;
        for_keys(cut >= 0 ? static_cast<uint32_t>(cut) : 0u, [&](uint32_t key, uint32_t c) {
          const float u = unit(key);
          if (!(sp.min_p > 0.f) || u >= sp.min_p) zk += static_cast<double>(static_cast<float>(c) * u);
        });
        z_kept = block_dsum<kStreamThreads>(zk, sh_d);
      }
      break;
    }
    const float z_full = static_cast<float>(z_kept);
    const float ex = x_ok ? draft_weight_of(lx, sp, tau, m) : 0.f;
    const float px = z_full > 0.f ? ex / z_full : 0.f;
    int accept = 0;
    if (i < k && x_ok) {
      const uint64_t seed = __ldg(p.seed + b);
      const int64_t step = __ldg(p.step + b);
      accept = philox_uniform24(spec_bits(seed, step, i, kPurposeAccept, 0)) < px;
    }
    if (tid == 0) {
      write_rec(-1, accept, logf(px), 0.f, 0, tau);
      SpecSampleRow rw;
      rw.tau_key = tau; rw.m = m;
      ws_rows(p)[r] = rw;
    }
  }
  cp_async_wait<0>();
}

// Level 1 and 2 of the race on the row that samples; the last CTA of a sequence assembles it.
template <typename T>
__device__ void race_kernel(const SpecSampleParams& p) {
  __shared__ KeyArg sh_arg[2 * kRaceWarps];
  __shared__ float sh_wp[kRaceWarps];
  __shared__ int sh_n, sh_last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = blockIdx.x, G = gridDim.x, b = blockIdx.y;
  if (warp == 0) {
    const int n = chain_seq<false>(p, b);
    if (lane == 0) sh_n = n;
  }
  __syncthreads();
  const int n = sh_n;
  if (n < 0) {   // invalid or greedy block: nothing to draw
    if (g == 0 && warp == 0) chain_seq<true>(p, b);
    return;
  }
  const int V = p.vocab;
  const int r0 = __ldg(p.cu_q + b);
  const int k = __ldg(p.cu_q + b + 1) - r0 - 1;
  const int i = n, r = r0 + n;
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;
  const SeqParams sp = applied_params(p, b);
  const int x = i < k ? __ldg(p.draft_ids + r0 - b + i) : -1;
  const bool x_ok = x >= 0 && x < V;
  const int excl = x_ok ? x : -1;   // the residual p - onehot(x) leaves it out
  const SpecSampleRow rw = ws_rows(p)[r];
  const uint32_t tau = rw.tau_key;
  const float m = rw.m, scale = sp.scale, min_p = sp.min_p;
  const float tau_f = tau == 0u ? -INFINITY : key_to_float(tau);
  const uint64_t seed = __ldg(p.seed + b);
  const int64_t step = __ldg(p.step + b);
  const float ex = x_ok ? draft_weight_of(load_logit(row, x), sp, tau, m) : 0.f;
  // weight of a token if the filters keep it (kept()'s decision; -inf weighs 0)
  auto weight = [&](float f) {
    const float w = exp2f(__fsub_rn(__fmul_rn(f, scale), m));
    return (f >= tau_f && (!(min_p > 0.f) || w >= min_p)) ? w : 0.f;
  };

  // ---- level 1: warp w sums tile g * kRaceWarps + w
  const int num_tiles = p.num_tiles;
  const int nvec = V / 8;
  int any = 0;
  KeyArg best_r, best_p;
  best_r.key = best_p.key = -INFINITY;
  best_r.idx = best_p.idx = -1;
  float wp = 0.f;
  const int t = g * kRaceWarps + warp;
  if (t < num_tiles) {
    float w = 0.f;
    const int v0 = t * (kTile / 8), v1 = min(nvec, v0 + kTile / 8);
    constexpr int kPer = kTile / 8 / 32;   // vectors per lane: all loads in flight at once
    uint4 u[kPer];
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      const int j = v0 + lane + 32 * it;
      u[it] = j < v1 ? __ldg(reinterpret_cast<const uint4*>(row) + j) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      const int j = v0 + lane + 32 * it;
      if (j >= v1) continue;
      float f[8];
      unpack16(u[it], f, static_cast<const T*>(nullptr));
#pragma unroll
      for (int e = 0; e < 8; ++e) w += (8 * j + e == excl) ? 0.f : weight(f[e]);
    }
    if (v1 == nvec)
      for (int id = nvec * 8 + lane; id < min(V, (t + 1) * kTile); id += 32)
        w += id == excl ? 0.f : weight(load_logit(row, id));
    w = warp_sum(w);
    wp = w + ((excl >= 0 && excl / kTile == t) ? ex : 0.f);
    if (lane == 0) race_tile(seed, step, i, t, w, wp, any, best_r, best_p);
  }
  if (lane == 0) sh_wp[warp] = wp;
  block_race2<kRaceThreads>(any, best_r, best_p, sh_arg);   // (its barriers order sh_wp too)
  RaceSlot* slots = ws_race_slots(p) + static_cast<int64_t>(b) * G;
  if (tid == 0) {
    float ws = 0.f;
    for (int w = 0; w < kRaceWarps; ++w) ws += sh_wp[w];
    RaceSlot s;
    s.any = any; s.r = best_r; s.p = best_p; s.wsum = ws;
    slots[g] = s;
    __threadfence();
    sh_last = atomicAdd(ws_race_done(p) + b, 1u) == static_cast<uint32_t>(G - 1);
  }
  __syncthreads();
  if (!sh_last) return;
  __threadfence();

  // ---- the last CTA: merge the slots (lanes in g order, a fixed tree), level 2, assemble
  if (warp == 0) {
    KeyArg br, bp;
    br.key = bp.key = -INFINITY;
    br.idx = bp.idx = -1;
    int a = 0;
    float z = 0.f;
    for (int gg = lane; gg < G; gg += 32) {
      const RaceSlot* s = slots + gg;
      KeyArg c;
      c.key = __ldcg(&s->r.key); c.idx = __ldcg(&s->r.idx);
      br = better(br, c);
      c.key = __ldcg(&s->p.key); c.idx = __ldcg(&s->p.idx);
      bp = better(bp, c);
      a |= __ldcg(&s->any);
      z += __ldcg(&s->wsum);
    }
    warp_race2(br, bp);
    a = __any_sync(0xffffffffu, a);
    z = warp_sum(z);
    if (lane == 0) { sh_arg[0] = a ? br : bp; sh_arg[1].key = z; sh_arg[1].idx = a; }
  }
  __syncthreads();
  const bool use_p = sh_arg[1].idx == 0;
  const float z_full = sh_arg[1].key;
  const int tile = sh_arg[0].idx < 0 ? 0 : sh_arg[0].idx;
  __syncthreads();
  KeyArg tb;
  tb.key = -INFINITY; tb.idx = -1;
  const int skip = use_p ? -1 : excl;
  {   // 8 consecutive tokens per thread: one 16-byte load (the row's tail token by token)
    static_assert(kTile == 8 * kRaceThreads, "level 2: one vector per thread");
    const int tok0 = tile * kTile + 8 * tid;
    float f[8];
    if (tok0 / 8 < nvec) {
      unpack16(__ldg(reinterpret_cast<const uint4*>(row) + tok0 / 8), f, static_cast<const T*>(nullptr));
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = tok0 + e < V ? load_logit(row, tok0 + e) : -INFINITY;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) race_token(tb, f[e], tok0 + e, skip, sp, tau, m, seed, step, i);
  }
  tb = block_argmax<kRaceThreads>(tb, sh_arg);
  if (tid == 0) {
    const int tok = tb.idx;
    float lpt = -INFINITY;
    if (tok >= 0 && z_full > 0.f)
      lpt = (__fsub_rn(__fmul_rn(load_logit(row, tok), scale), m) - log2f(z_full)) * kLn2;
    SpecSampleRowOut* o = ws_row_out(p) + r;
    o->token = tok;
    o->lp_token = lpt;
  }
  __syncthreads();
  if (warp == 0) chain_seq<true>(p, b);
}

#else
template <typename T>
__device__ void stream_kernel(const SpecSampleParams&) { __trap(); }   // never launched below sm_90
template <typename T>
__device__ void race_kernel(const SpecSampleParams&) { __trap(); }
#endif

}  // namespace
