// spec_sample in one pass over the logits (16-bit logits, one-hot drafts, sm_90): a cluster of
// CTAs holds one logit row in shared memory and runs every step of that row on chip; a tiny
// chain launch then walks each block's rows. Included by spec_sample.cu only.
//
// Why: the three-launch path (tiles -> hist -> finish) reads a filtered row two to three times
// from memory (the hist count needs the row max first, the recount needs the threshold). Here
// the row is loaded once (cp.async, CTA rank c holds tiles [c * tpc, (c + 1) * tpc)) and each
// step that needs the whole row's result of the previous one waits at a cluster barrier and
// reads its peers' partials through distributed shared memory:
//   A  raw max and NaN / +inf flags (packed 16-bit maxes)            -> cluster max
//      greedy rows: the lowest id holding the max (packed compares)  -> cluster min; done
//   B  sampled rows without top-k / top-p: kept sums per chunk (min-p, the draft left out).
//      With a cut: the exact-value histogram of the 16-bit keys below the max (+ the row mass
//      for a top-p base) -> each CTA sums its part of the bins over the cluster; the parts'
//      totals locate the crossing, the owner CTA finds the bin and broadcasts it (windows
//      further down are counted again from shared memory if the crossing lies past the first
//      kRowBins values)
//   C  (cut rows) kept sums per chunk over {key >= tau, min-p}, the draft left out
//   D  accept decision (u < p(x)); a rejected or bonus row races its tiles (cluster merge)
//      and the CTA holding the winning tile races its tokens: the reference's two-level race.
// Per row the result goes to a SpecSampleRowOut record; spec_sample_chain assembles the blocks.
// Where it wins and loses against the tiles path: docs/PERF.md, spec_sample session 7.
#pragma once
#include <type_traits>
#include "common/cluster.cuh"
#include "common/cp_async.cuh"
#include "common/ragged.cuh"
#include "sampling/sample_common.cuh"
#include "sampling/sample_hist.cuh"
#include "sampling/sample_finish.cuh"

using namespace specdec;

namespace {

constexpr int kRowThreads = SPEC_SAMPLE_ROWS_THREADS;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kRowBins = SPEC_SAMPLE_ROWS_BINS;
constexpr int kChunk = 512;                       // tokens of one warp work item (64 vectors)
constexpr int kChunksPerTile = kTile / kChunk;
constexpr int kRowMaxChunks = SPEC_SAMPLE_ROWS_MAX_TILES * kChunksPerTile;

__device__ __forceinline__ SpecSampleRowOut* ws_row_out(const SpecSampleParams& p) {
  return reinterpret_cast<SpecSampleRowOut*>(ws_filters(p));   // [T], where the filter state starts
}

// What a CTA publishes for its peers (read through distributed shared memory after a barrier).
struct RowsRec {
  float raw_max;      // A
  int arg;
  uint32_t flags;
  float z;            // B: sum exp2(s2 - m) of this CTA's tokens (top-p base / greedy logsumexp)
  float wsum;         // C: kept mass of this CTA's tiles (one-hot draft left out)
  KeyArg best_r, best_p;   // D: tile race
  int any;
  double pc, pm;      // threshold: count and mass of this CTA's part of the window
  int pnz;            //   its last non-empty bin (-1: none)
  int cut;            //   the crossing (owner CTA)
  double mt;          //   mass through the crossing (owner CTA)
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Packed 16-bit helpers (two logits per 32-bit word; element 0 in the low half).
template <typename T> __device__ __forceinline__ uint32_t ninf2();
template <> __device__ __forceinline__ uint32_t ninf2<bf16_t>() { return 0xFF80FF80u; }
template <> __device__ __forceinline__ uint32_t ninf2<__half>() { return 0xFC00FC00u; }
template <typename T> __device__ __forceinline__ uint32_t hmax2(uint32_t a, uint32_t b);   // NaN ignored
template <typename T> __device__ __forceinline__ uint32_t hmax2_nan(uint32_t a, uint32_t b);   // NaN wins
template <> __device__ __forceinline__ uint32_t hmax2<bf16_t>(uint32_t a, uint32_t b) {
  uint32_t d; asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
template <> __device__ __forceinline__ uint32_t hmax2<__half>(uint32_t a, uint32_t b) {
  uint32_t d; asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
template <> __device__ __forceinline__ uint32_t hmax2_nan<bf16_t>(uint32_t a, uint32_t b) {
  uint32_t d; asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
template <> __device__ __forceinline__ uint32_t hmax2_nan<__half>(uint32_t a, uint32_t b) {
  uint32_t d; asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
template <typename T> __device__ __forceinline__ uint32_t pack2(float f);   // f (a 16-bit value) twice
template <> __device__ __forceinline__ uint32_t pack2<bf16_t>(float f) { return (__float_as_uint(f) >> 16) * 0x10001u; }
template <> __device__ __forceinline__ uint32_t pack2<__half>(float f) {
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(f))) * 0x10001u;
}
template <typename T> __device__ __forceinline__ uint32_t heq2(uint32_t a, uint32_t b);   // per half: 1.0 if equal, else 0
template <> __device__ __forceinline__ uint32_t heq2<bf16_t>(uint32_t a, uint32_t b) {
  uint32_t d; asm("set.eq.bf16x2.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
template <> __device__ __forceinline__ uint32_t heq2<__half>(uint32_t a, uint32_t b) {
  uint32_t d; asm("set.eq.f16x2.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
template <typename T> __device__ __forceinline__ float half_lo(uint32_t w) {
  return bits16_to_float(w & 0xffffu, static_cast<const T*>(nullptr));
}
template <typename T> __device__ __forceinline__ float half_hi(uint32_t w) {
  return bits16_to_float(w >> 16, static_cast<const T*>(nullptr));
}

// Max over the CTA, in every thread (max is order-free: any tree gives the same bits).
template <int kThreads, typename V>
__device__ __forceinline__ V block_max(V v, V* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, d));
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  V r = sh[0];
  for (int w = 1; w < kThreads / 32; ++w) r = max(r, sh[w]);
  __syncthreads();
  return r;
}

template <typename T>
__device__ void rows_kernel(const SpecSampleParams& p) {
  pdl_wait();      // the first launch of the op: whatever ran before it on the stream
  pdl_trigger();   // the chain launch may be scheduled once every CTA is in
  extern __shared__ __align__(16) unsigned char rows_dyn[];
  __shared__ uint32_t bins[kRowBins + 32];   // histogram window (+ a scratch word per lane)
  __shared__ float chunk_sum[kRowMaxChunks];
  __shared__ RowsRec rec;
  __shared__ float sh_f[2 * kRowWarps];
  __shared__ int sh_i[kRowWarps];
  __shared__ double sh_d[kRowWarps];
  __shared__ KeyArg sh_arg[2 * kRowWarps];
  __shared__ int sh_out;
  __shared__ double sh_pc[SPEC_SAMPLE_ROWS_MAX_CLUSTER], sh_pm[SPEC_SAMPLE_ROWS_MAX_CLUSTER];
  __shared__ int sh_pnz[SPEC_SAMPLE_ROWS_MAX_CLUSTER];
  __shared__ RowsRec row_all;     // the cluster-merged record (written by lane 0 of warp 0)
  constexpr int kN = 8;           // tokens per 16-byte vector
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int C = static_cast<int>(cluster_size());
  const int rank = static_cast<int>(cluster_rank());
  const int r = blockIdx.x / C;
  const int V = p.vocab;
  const int tpc = p.tiles_per_cta;
  const int t0 = rank * tpc;                                   // first tile of this CTA
  const int ntl = max(0, min(tpc, p.num_tiles - t0));          // its tiles
  const int tok0 = t0 * kTile;
  const int ntok = max(0, min(ntl * kTile, V - tok0));         // its real tokens
  const int nchunks = ntl * kChunksPerTile;
  uint4* data = reinterpret_cast<uint4*>(rows_dyn);            // ntl * kTile tokens
  const int P = (kRowBins + C - 1) / C;                        // bins per CTA in the reduce-scatter
  uint32_t* part = reinterpret_cast<uint32_t*>(rows_dyn + static_cast<size_t>(tpc) * kTile * 2);
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;

  // ---- load the slice (cp.async, 16-byte, L2 only); tail / misaligned rows token by token,
  // padding past V with -inf (weighs nothing, never the max of a row that has a real token)
  {
    const T* src = row + tok0;
    const int nvec_all = ntl * (kTile / kN);
    if (is_aligned16(row)) {
      const int nvec = ntok / kN;
      for (int v = threadIdx.x; v < nvec; v += kRowThreads)
        cp_async_16(data + v, reinterpret_cast<const uint4*>(src) + v, true);
      cp_async_commit();
      uint16_t* d16 = reinterpret_cast<uint16_t*>(data);
      const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
      const uint16_t ninf = std::is_same<T, bf16_t>::value ? 0xFF80u : 0xFC00u;
      for (int j = nvec * kN + threadIdx.x; j < nvec_all * kN; j += kRowThreads)
        d16[j] = j < ntok ? __ldg(s16 + j) : ninf;
    } else {
      uint16_t* d16 = reinterpret_cast<uint16_t*>(data);
      const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
      const uint16_t ninf = std::is_same<T, bf16_t>::value ? 0xFF80u : 0xFC00u;
      for (int j = threadIdx.x; j < nvec_all * kN; j += kRowThreads)
        d16[j] = j < ntok ? __ldg(s16 + j) : ninf;
    }
  }
  // while the slice is in flight: the row's sequence, its parameters, its draft
  const int b = owner_of_row(p.cu_q, p.batch, r);
  const int r0 = __ldg(p.cu_q + b);
  const int q = __ldg(p.cu_q + b + 1) - r0;
  const int i = r - r0;                      // block row
  const int k = q - 1;
  const SeqParams sp = applied_params(p, b);
  const int dpos = r - b;                    // draft_ids index of this row's draft
  const bool has_draft = i >= 0 && i < k && dpos >= 0 && dpos < p.num_rows - p.batch;
  const int x = has_draft ? __ldg(p.draft_ids + dpos) : -1;
  const bool x_ok = x >= 0 && x < V;
  const float lx = (!sp.greedy && x_ok) ? load_logit(row, x) : -INFINITY;
  const uint64_t seed = __ldg(p.seed + b);
  const int64_t step = __ldg(p.step + b);
  const bool cut_on = sp.k_on || sp.p_on;
  if (!sp.greedy && cut_on)
    for (int j = threadIdx.x; j < kRowBins + 32; j += kRowThreads) bins[j] = 0u;
  cp_async_wait<0>();
  __syncthreads();

  auto chunk_vec = [&](int c, int j) { return data[c * (kChunk / kN) + j * 32 + lane]; };
  auto chunk_tok = [&](int c, int j, int e) { return tok0 + c * kChunk + (j * 32 + lane) * kN + e; };

  // ---- A: raw max (packed 16-bit max, NaN ignored), NaN / +inf flags (a NaN-propagating
  // max); the argmax only for greedy rows, afterwards (packed compares with the row max)
  {
    uint32_t mx2 = ninf2<T>(), nn2 = ninf2<T>();
    for (int c = warp; c < nchunks; c += kRowWarps) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint4 u = chunk_vec(c, j);
        mx2 = hmax2<T>(mx2, hmax2<T>(hmax2<T>(u.x, u.y), hmax2<T>(u.z, u.w)));
        nn2 = hmax2_nan<T>(nn2, hmax2_nan<T>(hmax2_nan<T>(u.x, u.y), hmax2_nan<T>(u.z, u.w)));
      }
    }
    const float nlo = half_lo<T>(nn2), nhi = half_hi<T>(nn2);
    uint32_t fl = (nlo != nlo || nhi != nhi) ? kFlagNaN : 0u;
    const float mx = fmaxf(half_lo<T>(mx2), half_hi<T>(mx2));
    fl |= mx == INFINITY ? kFlagPosInf : 0u;
    const float bm = block_max<kRowThreads>(mx, sh_f);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) fl |= __shfl_xor_sync(0xffffffffu, fl, d);
    if (lane == 0) sh_i[warp] = static_cast<int>(fl);
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t f = 0u;
      for (int w = 0; w < kRowWarps; ++w) f |= static_cast<uint32_t>(sh_i[w]);
      rec.raw_max = bm; rec.flags = f;
    }
  }
  cluster_sync();
  if (warp == 0) {   // lane c reads CTA c (the reads overlap; max and OR are order-free)
    float mx = lane < C ? ld_cluster_f32(cluster_map(&rec.raw_max, lane)) : -INFINITY;
    uint32_t f = lane < C ? ld_cluster_u32(cluster_map(&rec.flags, lane)) : 0u;
    mx = warp_max(mx);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) f |= __shfl_xor_sync(0xffffffffu, f, d);
    if (lane == 0) { row_all.raw_max = mx; row_all.flags = f; }
  }
  __syncthreads();
  const float M = row_all.raw_max;
  const uint32_t flags = row_all.flags;
  int arg = -1;
  if (sp.greedy) {   // lowest id of a token equal to M (-0 == +0; NaN never; -inf if all are)
    int best = 0x7fffffff;
    const uint32_t m2 = pack2<T>(M);
    for (int c = warp; c < nchunks; c += kRowWarps) {
      int found = 0x7fffffff;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint4 u = chunk_vec(c, j);
        const uint32_t eq[4] = {heq2<T>(u.x, m2), heq2<T>(u.y, m2), heq2<T>(u.z, m2),
                                heq2<T>(u.w, m2)};   // per half non-zero where equal (-0 == +0)
        if ((eq[0] | eq[1] | eq[2] | eq[3]) == 0u) continue;   // the common case: no hit
#pragma unroll
        for (int h = 3; h >= 0; --h) {   // highest first: the lowest hit is written last
          if (eq[h] & 0xffff0000u) found = chunk_tok(c, j, 2 * h + 1);
          if (eq[h] & 0x0000ffffu) found = chunk_tok(c, j, 2 * h);
        }
        break;
      }
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) found = min(found, __shfl_xor_sync(0xffffffffu, found, d));
      best = min(best, found);
      if (best != 0x7fffffff) break;   // later chunks of this warp hold higher ids
    }
    best = -block_max<kRowThreads>(-best, sh_i);   // block min
    if (threadIdx.x == 0) rec.arg = best;
    cluster_sync();
    if (warp == 0) {
      int a = lane < C ? static_cast<int>(ld_cluster_u32(cluster_map(&rec.arg, lane))) : 0x7fffffff;
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) a = min(a, __shfl_xor_sync(0xffffffffu, a, d));
      if (lane == 0) row_all.arg = a >= V ? -1 : a;   // none, or only -inf padding: all NaN
    }
    __syncthreads();
    arg = row_all.arg;
  }
  SpecSampleRowOut* out = ws_row_out(p) + r;
  const float scale = sp.scale;
  const float m = __fmul_rn(M, scale);   // max of s2 = logit * scale (rounding is monotone)

  uint32_t tau = 0u;   // sampled rows: kept iff order_key(logit) >= tau (0: no cut)
  auto write_rec = [&](int token, int accept, float lp_draft, float lp_token, int empty) {
    SpecSampleRowOut o;
    o.owner = b; o.token = token; o.accept = accept; o.flags = flags; o.empty = empty;
    o.lp_draft = lp_draft; o.lp_token = lp_token; o.tau = tau;
    *out = o;
  };

  // Sum of a float field of rec over the cluster's CTAs (call after the cluster barrier that
  // follows the writes): warp 0, lane c reads CTA c, a fixed shuffle tree; in every thread.
  auto cluster_sum = [&](const float* field) {
    if (warp == 0) {
      float v = lane < C ? ld_cluster_f32(cluster_map(field, lane)) : 0.f;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) v += __shfl_down_sync(0xffffffffu, v, d);
      if (lane == 0) sh_f[0] = v;
    }
    __syncthreads();
    const float r = sh_f[0];
    __syncthreads();
    return r;
  };
  // ---- sum of exp2(s2 - m) over this CTA's tokens -> the cluster's
  auto cluster_sum_z = [&](float z) {
    z = block_sum<kRowThreads>(z, sh_f);
    if (threadIdx.x == 0) rec.z = z;
    cluster_sync();
    return cluster_sum(&rec.z);
  };

  if (sp.greedy) {
    float lp = 0.f;
    if (p.logprobs != nullptr) {   // log-softmax of the raw logits at the argmax (NaN left out)
      float z = 0.f;
      for (int c = warp; c < nchunks; c += kRowWarps)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float f[kN];
          unpack16(chunk_vec(c, j), f, static_cast<const T*>(nullptr));
#pragma unroll
          for (int e = 0; e < kN; ++e) z += (f[e] == f[e]) ? exp2f(__fsub_rn(__fmul_rn(f[e], kLog2e), m)) : 0.f;
        }
      z = cluster_sum_z(z);
      lp = (M * kLog2e - m - (z > 0.f ? log2f(z) : 0.f)) * kLn2;
    }
    if (rank == 0 && threadIdx.x == 0) write_rec(arg, 0, 0.f, lp, arg < 0);
    cluster_sync();   // peers may still read rec
    return;
  }
  if (flags != 0u || !(M > -INFINITY)) {   // the block is invalid (chain flags it)
    if (rank == 0 && threadIdx.x == 0) write_rec(-1, 0, 0.f, 0.f, !(M > -INFINITY));
    cluster_sync();
    return;
  }
  const float min_p = sp.min_p;
  const int excl = x_ok && i < k ? x : -1;     // left out of the sums: they are p - onehot(x)
  const uint32_t omax = max_key16(M, static_cast<const T*>(nullptr));

  // ---- B: sums (no cut), row mass (top-p base), histogram of the first window
  // one token's count: an index into the static bins (the address needs no add; the clamp
  // to this lane's scratch word is one packed min for both halves)
  auto count2 = [&](uint32_t d2, uint32_t lim2) {
    uint32_t c2;
    asm("min.u16x2 %0, %1, %2;" : "=r"(c2) : "r"(d2), "r"(lim2));
    const uint32_t a2 = c2 << 2;   // both byte offsets at once (a half is < 2^13: no carry)
    atomicAdd(reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(bins) + (a2 & 0xffffu)), 1u);
    atomicAdd(reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(bins) + (a2 >> 16)), 1u);
  };
  // Count every token with distance in [w0, w0 + kRowBins) (+ the row mass for a top-p base).
  // Windows past the first (kWin) subtract w0 per half: a token above the window wraps to
  // >= kRowBins, i.e. into the scratch words.
  auto count_pass = [&](auto kZ, auto kWin, uint32_t w0) {
    constexpr bool Z = decltype(kZ)::value, WIN = decltype(kWin)::value;
    float z = 0.f;
    const uint32_t lim2 = (kRowBins + lane) * 0x10001u;
    const uint32_t omax2 = omax | (omax << 16), w02 = w0 * 0x10001u;
    for (int c = warp; c < nchunks; c += kRowWarps) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint4 u = chunk_vec(c, j);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          const uint32_t d2 = omax2 - ord16x2(w[h]);   // per half >= 0: no borrow (NaN rows never get here)
          count2(WIN ? __vsub2(d2, w02) : d2, lim2);
        }
        if constexpr (Z) {
          float f[kN];
          unpack16(u, f, static_cast<const T*>(nullptr));
#pragma unroll
          for (int e = 0; e < kN; ++e) z += exp2f(fmaf(f[e], scale, -m));
        }
      }
    }
    return z;
  };
  // Kept mass per chunk -> chunk_sum: tokens >= tau_f (kCut), passing min-p, the one-hot draft
  // left out (only the chunk that holds it tests ids).
  // Min-p decides with kept()'s own expression; otherwise a token left out weighs exp2(-inf).
  auto kept_sums = [&](auto kCut, float tau_f) {
    constexpr bool CUT = decltype(kCut)::value;
    auto chunk = [&](int c, auto kMinP, auto kExcl) {
      constexpr bool MP = decltype(kMinP)::value, EX = decltype(kExcl)::value;
      float cs = 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float f[kN];
        unpack16(chunk_vec(c, j), f, static_cast<const T*>(nullptr));
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          bool in = true;
          if constexpr (CUT) in = f[e] >= tau_f;
          if constexpr (EX) in = in && chunk_tok(c, j, e) != excl;
          if constexpr (MP) {
            const float w = exp2f(__fsub_rn(__fmul_rn(f[e], scale), m));
            cs += (in && w >= min_p) ? w : 0.f;
          } else if constexpr (CUT || EX) {
            cs += exp2f(in ? fmaf(f[e], scale, -m) : -INFINITY);
          } else {
            cs += exp2f(fmaf(f[e], scale, -m));
          }
        }
      }
      return warp_sum(cs);
    };
    using yes = std::true_type;
    using no = std::false_type;
    for (int c = warp; c < nchunks; c += kRowWarps) {
      float cs = 0.f;
      {
        const int first = tok0 + c * kChunk;
        const bool ex = excl >= first && excl < first + kChunk;
        if (min_p > 0.f) cs = ex ? chunk(c, yes(), yes()) : chunk(c, yes(), no());
        else cs = ex ? chunk(c, no(), yes()) : chunk(c, no(), no());
      }
      if (lane == 0) chunk_sum[c] = cs;
    }
  };
  using yes = std::true_type;
  using no = std::false_type;
  float z_row = 0.f;
  if (!cut_on) {
    kept_sums(no(), -INFINITY);
  } else {
    const bool need_z = sp.p_on && !sp.k_on && sp.top_p > 0.f;
    const float z = need_z ? count_pass(yes(), no(), 0u) : count_pass(no(), no(), 0u);
    if (need_z) z_row = cluster_sum_z(z);
    // ---- the threshold, split over the cluster: CTA c owns window bins [c * P, (c + 1) * P)
    // (their cluster-wide sums in `part`); the parts' totals locate the crossing, the owning CTA
    // finds the bin and broadcasts it. Windows past the first are counted again (rare).
    uint32_t cur_w0 = 0u;
    const int plo = rank * P, phi = min(kRowBins, plo + P);
    auto reduce_bins = [&]() {
      __syncthreads();
      cluster_sync();
      for (int j = plo + threadIdx.x; j < phi; j += kRowThreads) {
        uint32_t s = 0u;
        for (int c = 0; c < C; ++c) s += ld_cluster_u32(cluster_map(bins + j, c));
        part[j - plo] = s;
      }
      __syncthreads();
    };
    auto recount = [&](uint32_t w0) {
      for (int j = threadIdx.x; j < kRowBins + 32; j += kRowThreads) bins[j] = 0u;
      __syncthreads();
      count_pass(no(), yes(), w0);
      reduce_bins();
      cur_w0 = w0;
    };
    reduce_bins();
    auto value = [&](uint32_t d) { return bits16_to_float(ord16_inverse(omax - d), static_cast<const T*>(nullptr)); };
    auto unit = [&](uint32_t d) { return exp2f(__fsub_rn(__fmul_rn(value(d), scale), m)); };
    constexpr int kPer = kRowBins / kRowThreads;   // a part has at most kRowBins bins
    double mass_through = 0.0;   // search(want_mass): the mass of distances <= its answer
    // First distance d < dlim where the cumulative count (mass) from the max reaches target;
    // none: the last non-empty distance below dlim (rounding near top_p = 1).
    auto search = [&](bool by_mass, double target, uint32_t dlim, bool want_mass) {
      double above_c = 0.0, above_m = 0.0;
      int last_nz = -1;
      const bool need_m = by_mass || want_mass;
      for (uint32_t w0 = 0; w0 < dlim; w0 += kRowBins) {
        if (w0 != cur_w0) recount(w0);
        const int limit = static_cast<int>(min(static_cast<uint32_t>(kRowBins), dlim - w0));
        const int my_hi = min(phi, limit);   // my bins that count: [plo, my_hi)
        auto bin_mass = [&](int j) {          // j: window bin index in my part
          const uint32_t c = part[j - plo];
          return c ? static_cast<float>(c) * unit(w0 + j) : 0.f;
        };
        double sc = 0.0, sm = 0.0;
        int nz = -1;
        for (int j = plo + threadIdx.x; j < my_hi; j += kRowThreads) {
          const uint32_t c = part[j - plo];
          sc += static_cast<double>(c);
          if (need_m) sm += static_cast<double>(bin_mass(j));
          if (c) nz = j;
        }
        sc = block_sum<kRowThreads>(sc, sh_d);
        if (need_m) sm = block_sum<kRowThreads>(sm, sh_d);
        nz = block_max<kRowThreads>(nz, sh_i);
        if (threadIdx.x == 0) { rec.pc = sc; rec.pm = sm; rec.pnz = nz; }
        cluster_sync();
        if (threadIdx.x < C) {
          sh_pc[threadIdx.x] = __longlong_as_double(ld_cluster_u64(cluster_map(&rec.pc, threadIdx.x)));
          sh_pm[threadIdx.x] = __longlong_as_double(ld_cluster_u64(cluster_map(&rec.pm, threadIdx.x)));
          sh_pnz[threadIdx.x] = static_cast<int>(ld_cluster_u32(cluster_map(&rec.pnz, threadIdx.x)));
        }
        __syncthreads();
        int owner = -1;
        double before_c = above_c, before_m = above_m;
        for (int c = 0; c < C; ++c) {
          const double v = by_mass ? before_m + sh_pm[c] : before_c + sh_pc[c];
          if (v >= target) { owner = c; break; }
          before_c += sh_pc[c];
          before_m += sh_pm[c];
          if (sh_pnz[c] >= 0) last_nz = static_cast<int>(w0) + sh_pnz[c];
        }
        if (owner < 0) {   // past this window (before_* now hold its totals)
          above_c = before_c;
          above_m = before_m;
          continue;
        }
        if (owner == rank) {   // the bin, in this CTA's part
          float v[kPer];
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            const int j = plo + static_cast<int>(threadIdx.x) * kPer + e;
            v[e] = j < my_hi ? (by_mass ? bin_mass(j) : static_cast<float>(part[j - plo])) : 0.f;
          }
          int jl = first_crossing_regs<kRowThreads>(v, target - (by_mass ? before_m : before_c),
                                                   my_hi - plo, sh_d, &sh_out);
          if (jl < 0) jl = nz - plo;   // rounding between the two double sums: its last non-empty bin
          double mt = 0.0;
          if (want_mass) {
            double part_m = 0.0;
            for (int j = plo + threadIdx.x; j <= plo + jl; j += kRowThreads) part_m += static_cast<double>(bin_mass(j));
            mt = before_m + block_sum<kRowThreads>(part_m, sh_d);
          }
          if (threadIdx.x == 0) { rec.cut = static_cast<int>(w0) + plo + jl; rec.mt = mt; }
        }
        cluster_sync();
        if (threadIdx.x == 0) {
          sh_i[0] = static_cast<int>(ld_cluster_u32(cluster_map(&rec.cut, owner)));
          sh_d[0] = __longlong_as_double(ld_cluster_u64(cluster_map(&rec.mt, owner)));
        }
        __syncthreads();
        const int cut = sh_i[0];
        if (want_mass) mass_through = sh_d[0];
        __syncthreads();
        return cut;
      }
      if (want_mass) mass_through = above_m;
      return last_nz;
    };
    const uint32_t dall = omax + 1u;   // every distance a token can have
    int cut = static_cast<int>(dall) - 1;
    double base = static_cast<double>(z_row);
    if (sp.k_on) {
      cut = search(false, static_cast<double>(sp.top_k), dall, sp.p_on);
      base = mass_through;
    }
    if (sp.p_on) {
      int jp;
      if (!(sp.top_p > 0.f)) jp = search(false, 1.0, dall, false);   // the max and its ties
      else jp = search(true, static_cast<double>(sp.top_p) * base, static_cast<uint32_t>(cut) + 1u, false);
      if (jp < 0) jp = cut;
      cut = min(cut, jp);
    }
    tau = cut >= 0 ? order_key(value(static_cast<uint32_t>(cut))) : 0u;

    // ---- C: kept sums per chunk over the cut
    kept_sums(yes(), tau == 0u ? -INFINITY : key_to_float(tau));
  }
  __syncthreads();

  // ---- D: accept, then (rejected / bonus row) the two-level race
  float wsum = 0.f;   // this CTA's kept mass, tiles in order, chunks in order
  if (threadIdx.x == 0) {
    for (int c = 0; c < nchunks; ++c) wsum += chunk_sum[c];
    rec.wsum = wsum;
  }
  cluster_sync();
  const float wsum_all = cluster_sum(&rec.wsum);
  const float ex = x_ok ? draft_weight_of(lx, sp, tau, m) : 0.f;   // weight of the draft if kept
  const float z_full = wsum_all + (excl >= 0 ? ex : 0.f);
  const float px = z_full > 0.f ? ex / z_full : 0.f;
  int accept = 0;
  if (i < k && x_ok) accept = philox_uniform24(spec_bits(seed, step, i, kPurposeAccept, 0)) < px;
  if (rank == 0 && threadIdx.x == 0) write_rec(-1, accept, logf(px), 0.f, 0);
  if (accept) { cluster_sync(); return; }

  // level 1: tiles (one noise per tile serves the residual race and its fallback p)
  {
    int any = 0;
    KeyArg best_r, best_p;
    best_r.key = best_p.key = -INFINITY;
    best_r.idx = best_p.idx = -1;
    const int x_tile = excl >= 0 ? excl / kTile : -1;
    for (int t = threadIdx.x; t < ntl; t += kRowThreads) {
      float w = 0.f;
      for (int c = 0; c < kChunksPerTile; ++c) w += chunk_sum[t * kChunksPerTile + c];
      const int tg = t0 + t;
      const float wp = w + (tg == x_tile ? ex : 0.f);
      race_tile(seed, step, i, tg, w, wp, any, best_r, best_p);
    }
    block_race2<kRowThreads>(any, best_r, best_p, sh_arg);
    if (threadIdx.x == 0) { rec.best_r = best_r; rec.best_p = best_p; rec.any = any; }
  }
  cluster_sync();
  if (warp == 0) {   // lane c reads CTA c; better() and OR are order-free
    KeyArg br, bp;
    br.key = bp.key = -INFINITY;
    br.idx = bp.idx = -1;
    int any = 0;
    if (lane < C) {
      br.key = ld_cluster_f32(cluster_map(&rec.best_r.key, lane));
      br.idx = static_cast<int>(ld_cluster_u32(cluster_map(&rec.best_r.idx, lane)));
      bp.key = ld_cluster_f32(cluster_map(&rec.best_p.key, lane));
      bp.idx = static_cast<int>(ld_cluster_u32(cluster_map(&rec.best_p.idx, lane)));
      any = static_cast<int>(ld_cluster_u32(cluster_map(&rec.any, lane)));
    }
    warp_race2(br, bp);
    any = __any_sync(0xffffffffu, any);
    if (lane == 0) {
      row_all.any = any;
      row_all.best_r = any ? br : bp;
    }
  }
  __syncthreads();
  cluster_arrive();   // no more reads of peers: they may leave once the owner's arrival is in
  const bool use_p = !row_all.any;
  const int tile = row_all.best_r.idx < 0 ? 0 : row_all.best_r.idx;
  if (tile >= t0 && tile < t0 + ntl) {   // level 2 in the CTA that holds the tile
    const int lt = tile - t0;
    KeyArg tb;
    tb.key = -INFINITY; tb.idx = -1;
    const int skip = use_p ? -1 : excl;
    for (int j = threadIdx.x; j < kTile / kN; j += kRowThreads) {
      float f[kN];
      unpack16(data[lt * (kTile / kN) + j], f, static_cast<const T*>(nullptr));
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const int tok = tile * kTile + j * kN + e;
        if (tok < V) race_token(tb, f[e], tok, skip, sp, tau, m, seed, step, i);
      }
    }
    tb = block_argmax<kRowThreads>(tb, sh_arg);
    if (threadIdx.x == 0) {
      const int tok = tb.idx;
      float lpt = -INFINITY;
      if (tok >= 0 && z_full > 0.f)
        lpt = (__fsub_rn(__fmul_rn(load_logit(row, tok), scale), m) - log2f(z_full)) * kLn2;
      out->token = tok;
      out->lp_token = lpt;
    }
  }
  cluster_wait();
}

#else
template <typename T>
__device__ void rows_kernel(const SpecSampleParams&) { __trap(); }   // never launched below sm_90
#endif

// One warp, sequence b: the block's layout and status, the accept chain over its rows'
// records; writes emitted / num_accepted / status / logprobs (what finish_kernel writes).
// Lane i reads row i's record and draft (32 rows at a time), so the records' loads overlap.
__device__ void chain_seq(const SpecSampleParams& p, int b) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const int W = p.width;
  int32_t* em = p.emitted + static_cast<int64_t>(b) * p.emitted_stride;
  float* lp = p.logprobs ? p.logprobs + static_cast<int64_t>(b) * p.logprobs_stride : nullptr;
  const int r0 = __ldg(p.cu_q + b), r1 = __ldg(p.cu_q + b + 1);
  const int q = r1 - r0;
  const int k = q - 1;
  const int dbase = r0 - b;
  int st = SPEC_SAMPLE_OK;
  if (!block_layout_ok(p, b, r0, r1)) st = SPEC_SAMPLE_BAD_LAYOUT;
  const SpecSampleRowOut* rows = ws_row_out(p) + (st == SPEC_SAMPLE_OK ? r0 : 0);
  const SeqParams sp = seq_params(p, b);
  uint32_t flags = 0u;
  bool empty = false, bad = false, foreign = false;
  if (st == SPEC_SAMPLE_OK) {
    for (int i = lane; i < q; i += 32) {
      const SpecSampleRowOut o = rows[i];
      flags |= o.flags;
      empty |= o.empty != 0;
      foreign |= o.owner != b;   // records another sequence wrote: cu_q is not increasing
      if (i < k) {
        const int x = __ldg(p.draft_ids + dbase + i);
        bad |= !(x >= 0 && x < p.vocab);
      }
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) flags |= __shfl_xor_sync(kAll, flags, d);
    empty = __any_sync(kAll, empty);
    bad = __any_sync(kAll, bad);
    if (__any_sync(kAll, foreign)) st = SPEC_SAMPLE_BAD_LAYOUT;
  }
  if (st == SPEC_SAMPLE_OK && p.no_filters && sp.filtered) st = SPEC_SAMPLE_FILTER_SKIPPED;
  bool invalid = st != SPEC_SAMPLE_OK;
  if (!invalid) st = block_status(flags, empty, bad, sp.greedy, invalid);
  int n = -1;   // accepted drafts = the row that emits the correction / bonus token
  if (!invalid) {
    for (int base = 0; base < q && n < 0; base += 32) {
      const int i = base + lane;
      SpecSampleRowOut o;
      o.token = -1; o.accept = 0; o.lp_draft = 0.f; o.lp_token = 0.f;
      int x = -1;
      if (i < q) {
        o = rows[i];
        if (i < k) x = __ldg(p.draft_ids + dbase + i);
      }
      const bool acc = i < k && (sp.greedy ? x == o.token : o.accept != 0);
      const unsigned rej = __ballot_sync(kAll, i < q && !acc);   // the last row never accepts
      const int first = rej ? base + __ffs(rej) - 1 : -1;
      if (i < q && (first < 0 || i <= first)) {
        const bool emits_draft = !sp.greedy && i != first;
        em[i] = emits_draft ? x : o.token;
        if (lp) lp[i] = emits_draft ? o.lp_draft : o.lp_token;
      }
      if (first >= 0) {
        n = first;
        const int tok = __shfl_sync(kAll, o.token, first - base);
        if (!sp.greedy && tok < 0) st = SPEC_SAMPLE_EMPTY;
      }
    }
  }
  for (int j = n + 1 + lane; j < W; j += 32) {   // padding (everything for an invalid block)
    em[j] = -1;
    if (lp) lp[j] = 0.f;
  }
  if (lane == 0) {
    p.num_accepted[b] = invalid ? 0 : n;
    p.status[b] = st;
  }
}

// One warp per sequence (the rows path's second launch).
__device__ void chain_kernel(const SpecSampleParams& p) {
  pdl_wait();   // launched right after the rows kernel: its records must be in
  const int b = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (b < p.batch) chain_seq(p, b);   // warp-uniform
}

}  // namespace
