// spec_sample for small calls (sm_90, 16-bit logits, one-hot drafts, one wave of clusters):
// the rows kernel's layout (sample_rows.cuh: one cluster per row, CTA rank c holds tiles
// [c * tpc, (c + 1) * tpc) of the row in shared memory) with its chain of dependent steps cut
// down for latency. Included by spec_sample.cu only; spec_sample_chain_pre assembles the blocks.
//
// What is shorter than spec_sample_rows_* (the latency model: docs/patches/README.md):
//  - Rows without min-p / top-k / top-p exchange data ONCE: each CTA sums its tokens relative
//    to its own max (mref = s2 of its largest logit) and races its tiles with keys in that
//    frame; after one cluster barrier every CTA merges (max, flags, sums rescaled by
//    exp2(mref_c - m), keys shifted by mref_c - m, best tiles). The rows kernel needs three
//    (max; kept sums; race). Rows with filters keep the max exchange (min-p and the histogram
//    need the row max; a top-p-only row's base, the row mass, is summed in each CTA's frame
//    and merged in it too: the rows kernel spends an exp per token in the histogram pass and
//    an exchange on it), then the cut (the rows kernel's code), then sums and race in one.
//  - The data-independent draws (the accept uniform, each tile's noise) run while the slice is
//    in flight; the tile race runs in warp 0 (lane t = local tile t, <= 32 tiles): no barrier.
//  - Level 2 (the token race in the winning tile, ~150 instructions per token: Philox, log) is
//    split over the cluster: CTA c races its 1/C of the tile, read from the owner's shared
//    memory (distributed shared memory), CTA 0 merges the per-warp winners after one barrier
//    (the rows kernel: 2048 tokens in the owner alone, 8 Philox per thread). The winner's logit
//    travels with its key: no global load for its log-probability.
//  - Greedy rows: each CTA's lowest id of its own max, merged in the one exchange.
//  - Launched with programmatic serialization (the rows kernel is not), so it is scheduled
//    while the previous launch drains; its shared-memory setup runs before the wait. The exit
//    barrier's arrive is relaxed (lifetime only: no GPU-scope fence after the record store).
// Same random numbers as the other paths (Philox keyed as the reference); the sums of rows
// without filters and the top-p base are formed in another frame (rounding: a draw or a cut
// on a float32 rounding boundary may differ from the rows path); the kept sums and the race of
// rows with filters are the rows kernel's, bit for bit.
#pragma once
#include "sampling/sample_rows.cuh"

using namespace specdec;

namespace {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// The exit barrier's arrive: a CTA may leave once every peer has stopped reading its shared
// memory. Only lifetime is at stake (a peer's reads of this CTA have returned before that
// peer arrives: their values were consumed), so the arrive is relaxed: no MEMBAR.ALL.GPU,
// which after CTA 0's record store would wait for the store to reach L2.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ uint32_t ld_cluster_u16(uint32_t addr) {
  unsigned short v;
  asm volatile("ld.shared::cluster.u16 %0, [%1];" : "=h"(v) : "r"(addr) : "memory");
  return v;
}

// What a CTA publishes for its peers (read through distributed shared memory after a barrier).
struct SmallRec {
  float raw_max;      // this CTA's max raw logit (NaN ignored)
  uint32_t flags;     // NaN / +inf seen
  int arg;            // greedy: lowest id of raw_max here
  float mref;         // frame of z and of the tile keys (s2 of raw_max, or the row's m)
  float z;            // kept mass of this CTA's tiles, the one-hot draft left out (frame mref)
  float zg;           // greedy logprobs: sum exp2(l * log2e - mref) over non-NaN tokens
  float zrow;         // top-p base: this CTA's row mass (frame mloc: s2 of raw_max)
  KeyArg best_r, best_p;   // tile race, keys log2(w) - noise in frame mref
  int any;
  KeyArg tok[kRowWarps];   // level 2: each warp's winner in this CTA's part of the tile
  float tok_l[kRowWarps];  //   and its logit
  double pc, pm;      // threshold (as RowsRec)
  int pnz;
  int cut;
  double mt;
};

struct SmallAll {     // the merged record: the same bits in every CTA of the cluster
  float raw_max;
  uint32_t flags;
  float z;            // kept mass of the row (draft left out), frame m
  float zrow;         // top-p base: the row mass, frame m (rows with top-p alone)
  KeyArg best;        // the winning tile (residual race, or p's when the residual is empty)
  int any;
};

template <typename T>
__device__ void small_kernel(const SpecSampleParams& p) {
  extern __shared__ __align__(16) unsigned char rows_dyn[];
  __shared__ uint32_t bins[kRowBins + 32];   // histogram window (+ a scratch word per lane)
  __shared__ float chunk_sum[kRowMaxChunks];
  __shared__ SmallRec rec;
  __shared__ SmallAll all;
  __shared__ float sh_f[2 * kRowWarps];
  __shared__ uint32_t sh_u[kRowWarps];
  __shared__ int sh_i[kRowWarps];
  __shared__ double sh_d[kRowWarps];
  __shared__ int sh_out;
  __shared__ double sh_pc[SPEC_SAMPLE_ROWS_MAX_CLUSTER], sh_pm[SPEC_SAMPLE_ROWS_MAX_CLUSTER];
  __shared__ int sh_pnz[SPEC_SAMPLE_ROWS_MAX_CLUSTER];
  constexpr int kN = 8;           // tokens per 16-byte vector
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int C = static_cast<int>(cluster_size());
  const int rank = static_cast<int>(cluster_rank());
  const int r = blockIdx.x / C;
  const int V = p.vocab;
  const int tpc = p.tiles_per_cta;
  const int t0 = rank * tpc;                                   // first tile of this CTA
  const int ntl = max(0, min(tpc, p.num_tiles - t0));          // its tiles (<= 32)
  const int tok0 = t0 * kTile;
  const int ntok = max(0, min(ntl * kTile, V - tok0));         // its real tokens
  const int nchunks = ntl * kChunksPerTile;
  uint4* data = reinterpret_cast<uint4*>(rows_dyn);            // ntl * kTile tokens
  const int P = (kRowBins + C - 1) / C;                        // bins per CTA in the reduce-scatter
  uint32_t* part = reinterpret_cast<uint32_t*>(rows_dyn + static_cast<size_t>(tpc) * kTile * 2);
  const T* row = static_cast<const T*>(p.logits) + static_cast<int64_t>(r) * p.logits_stride;

  // shared memory only, before the wait (overlaps the previous launch's tail under PDL)
  for (int j = threadIdx.x; j < kRowBins + 32; j += kRowThreads) bins[j] = 0u;
  pdl_wait();      // the first launch of the op: whatever ran before it on the stream
  pdl_trigger();   // the chain launch may be scheduled once every CTA is in

  // ---- load the slice (the rows kernel's code)
  {
    const T* src = row + tok0;
    const int nvec_all = ntl * (kTile / kN);
    uint16_t* d16 = reinterpret_cast<uint16_t*>(data);
    const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
    const uint16_t ninf = std::is_same<T, bf16_t>::value ? 0xFF80u : 0xFC00u;
    if (is_aligned16(row)) {
      const int nvec = ntok / kN;
      for (int v = threadIdx.x; v < nvec; v += kRowThreads)
        cp_async_16(data + v, reinterpret_cast<const uint4*>(src) + v, true);
      cp_async_commit();
      for (int j = nvec * kN + threadIdx.x; j < nvec_all * kN; j += kRowThreads)
        d16[j] = j < ntok ? __ldg(s16 + j) : ninf;
    } else {
      for (int j = threadIdx.x; j < nvec_all * kN; j += kRowThreads)
        d16[j] = j < ntok ? __ldg(s16 + j) : ninf;
    }
  }
  // while the slice is in flight: the row's sequence, its parameters, its draft, and the draws
  // that do not depend on the logits
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
  const bool plain = !sp.greedy && !cut_on && !(sp.min_p > 0.f);   // one exchange
  float u_acc = 0.f, le = 0.f;
  if (!sp.greedy) {
    if (i < k && x_ok) u_acc = philox_uniform24(spec_bits(seed, step, i, kPurposeAccept, 0));
    if (warp == 0 && lane < ntl)
      le = log2f(philox_exponential(spec_bits(seed, step, i, kPurposeTile, t0 + lane)));
  }
  cp_async_wait<0>();
  __syncthreads();

  auto chunk_vec = [&](int c, int j) { return data[c * (kChunk / kN) + j * 32 + lane]; };
  auto chunk_tok = [&](int c, int j, int e) { return tok0 + c * kChunk + (j * 32 + lane) * kN + e; };
  SpecSampleRowOut* out = ws_row_out(p) + r;
  auto write_rec = [&](int token, int accept, float lp_draft, float lp_token, int empty,
                       uint32_t flags, uint32_t tau) {
    SpecSampleRowOut o;
    o.owner = b; o.token = token; o.accept = accept; o.flags = flags; o.empty = empty;
    o.lp_draft = lp_draft; o.lp_token = lp_token; o.tau = tau;
    *out = o;
  };
  auto leave = [&]() { cluster_arrive_relaxed(); cluster_wait(); };   // peers may read until they arrive

  // ---- A: this CTA's raw max (packed, NaN ignored) and NaN / +inf flags; one block barrier
  float Mc;
  uint32_t flc;
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
    float mx = fmaxf(half_lo<T>(mx2), half_hi<T>(mx2));
    fl |= mx == INFINITY ? kFlagPosInf : 0u;
    mx = warp_max(mx);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) fl |= __shfl_xor_sync(kAll, fl, d);
    if (lane == 0) { sh_f[warp] = mx; sh_u[warp] = fl; }
    __syncthreads();
    Mc = sh_f[0];
    flc = sh_u[0];
    for (int w = 1; w < kRowWarps; ++w) { Mc = fmaxf(Mc, sh_f[w]); flc |= sh_u[w]; }
  }

  // ---- greedy rows: lowest id of this CTA's max (+ its log-softmax mass), one exchange
  if (sp.greedy) {
    int best = 0x7fffffff;
    const uint32_t m2 = pack2<T>(Mc);
    for (int c = warp; c < nchunks; c += kRowWarps) {
      int found = 0x7fffffff;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint4 u = chunk_vec(c, j);
        const uint32_t eq[4] = {heq2<T>(u.x, m2), heq2<T>(u.y, m2), heq2<T>(u.z, m2),
                                heq2<T>(u.w, m2)};   // per half non-zero where equal (-0 == +0)
        if ((eq[0] | eq[1] | eq[2] | eq[3]) == 0u) continue;
#pragma unroll
        for (int h = 3; h >= 0; --h) {   // highest first: the lowest hit is written last
          if (eq[h] & 0xffff0000u) found = chunk_tok(c, j, 2 * h + 1);
          if (eq[h] & 0x0000ffffu) found = chunk_tok(c, j, 2 * h);
        }
        break;
      }
      found = warp_min(found);
      best = min(best, found);
      if (best != 0x7fffffff) break;   // later chunks of this warp hold higher ids
    }
    const float mg = __fmul_rn(Mc, kLog2e);
    float zg = 0.f;
    if (p.logprobs != nullptr && Mc > -INFINITY) {   // NaN left out, as the rows kernel
      for (int c = warp; c < nchunks; c += kRowWarps)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float f[kN];
          unpack16(chunk_vec(c, j), f, static_cast<const T*>(nullptr));
#pragma unroll
          for (int e = 0; e < kN; ++e) zg += (f[e] == f[e]) ? exp2f(__fsub_rn(__fmul_rn(f[e], kLog2e), mg)) : 0.f;
        }
      zg = warp_sum(zg);
    }
    if (lane == 0) { sh_i[warp] = best; sh_f[kRowWarps + warp] = zg; }
    __syncthreads();
    if (threadIdx.x == 0) {
      int a = sh_i[0];
      float z = sh_f[kRowWarps];
      for (int w = 1; w < kRowWarps; ++w) { a = min(a, sh_i[w]); z += sh_f[kRowWarps + w]; }
      rec.raw_max = Mc; rec.flags = flc; rec.arg = a; rec.mref = mg; rec.zg = z;
    }
    cluster_sync();
    if (rank == 0 && warp == 0) {   // lane c reads CTA c (max, OR, min: order-free)
      float mx = -INFINITY, mr = -INFINITY, z = 0.f;
      uint32_t f = 0u;
      int a = 0x7fffffff;
      if (lane < C) {
        mx = ld_cluster_f32(cluster_map(&rec.raw_max, lane));
        f = ld_cluster_u32(cluster_map(&rec.flags, lane));
        a = static_cast<int>(ld_cluster_u32(cluster_map(&rec.arg, lane)));
        mr = ld_cluster_f32(cluster_map(&rec.mref, lane));
        z = ld_cluster_f32(cluster_map(&rec.zg, lane));
      }
      const float M = warp_max(mx);
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) f |= __shfl_xor_sync(kAll, f, d);
      a = warp_min(lane < C && mx == M ? a : 0x7fffffff);   // CTAs whose max is the row's
      const float m = __fmul_rn(M, kLog2e);
      float v = lane < C ? scaled_sum(mr, z, m) : 0.f;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) v += __shfl_down_sync(kAll, v, d);
      if (lane == 0) {
        const int arg = a >= V ? -1 : a;   // none, or only -inf padding: all NaN
        float lp = 0.f;
        if (p.logprobs != nullptr) lp = (M * kLog2e - m - (v > 0.f ? log2f(v) : 0.f)) * kLn2;
        write_rec(arg, 0, 0.f, lp, arg < 0, f, 0u);
      }
    }
    leave();
    return;
  }

  const float scale = sp.scale;
  const float min_p = sp.min_p;
  const int excl = x_ok && i < k ? x : -1;     // left out of the sums: they are p - onehot(x)
  uint32_t tau = 0u;                           // kept iff order_key(logit) >= tau (0: no cut)
  float M = Mc, m = 0.f, mref;
  uint32_t flags = flc;

  // top-p without top-k: the base is the row mass. Summed here in this CTA's frame (like the
  // sums of rows without filters) and merged in exchange 1, instead of an exp per token in
  // the histogram pass and an exchange of its own (the rows kernel's way).
  const bool need_z = cut_on && sp.p_on && !sp.k_on && sp.top_p > 0.f;
  if (plain) {
    mref = __fmul_rn(Mc, scale);   // this CTA's frame
  } else {
    const float mloc = __fmul_rn(Mc, scale);
    if (need_z) {
      float z = 0.f;
      if (Mc > -INFINITY) {
        for (int c = warp; c < nchunks; c += kRowWarps)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            float f[kN];
            unpack16(chunk_vec(c, j), f, static_cast<const T*>(nullptr));
#pragma unroll
            for (int e = 0; e < kN; ++e) z += exp2f(fmaf(f[e], scale, -mloc));
          }
      }
      z = warp_sum(z);
      if (lane == 0) sh_f[kRowWarps + warp] = z;
      __syncthreads();
    }
    // ---- exchange 1: the row max (min-p and the histogram are relative to it)
    if (threadIdx.x == 0) {
      rec.raw_max = Mc; rec.flags = flc;
      if (need_z) {
        rec.mref = mloc;
        float z = sh_f[kRowWarps];
        for (int w = 1; w < kRowWarps; ++w) z += sh_f[kRowWarps + w];
        rec.zrow = z;
      }
    }
    cluster_sync();
    if (warp == 0) {
      float mx = lane < C ? ld_cluster_f32(cluster_map(&rec.raw_max, lane)) : -INFINITY;
      uint32_t f = lane < C ? ld_cluster_u32(cluster_map(&rec.flags, lane)) : 0u;
      float ml = -INFINITY, zl = 0.f;
      if (need_z && lane < C) {
        ml = ld_cluster_f32(cluster_map(&rec.mref, lane));
        zl = ld_cluster_f32(cluster_map(&rec.zrow, lane));
      }
      mx = warp_max(mx);
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) f |= __shfl_xor_sync(kAll, f, d);
      float v = need_z && lane < C ? scaled_sum(ml, zl, __fmul_rn(mx, scale)) : 0.f;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) v += __shfl_down_sync(kAll, v, d);
      if (lane == 0) { all.raw_max = mx; all.flags = f; all.zrow = v; }
    }
    __syncthreads();
    M = all.raw_max;
    flags = all.flags;
    m = __fmul_rn(M, scale);
    mref = m;
    if (flags != 0u || !(M > -INFINITY)) {   // the block is invalid (chain flags it)
      if (rank == 0 && threadIdx.x == 0) write_rec(-1, 0, 0.f, 0.f, !(M > -INFINITY), flags, 0u);
      leave();
      return;
    }
  }

  // Kept mass per chunk -> chunk_sum, frame mref (the rows kernel's kept_sums).
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
            const float w = exp2f(__fsub_rn(__fmul_rn(f[e], scale), mref));
            cs += (in && w >= min_p) ? w : 0.f;
          } else if constexpr (CUT || EX) {
            cs += exp2f(in ? fmaf(f[e], scale, -mref) : -INFINITY);
          } else {
            cs += exp2f(fmaf(f[e], scale, -mref));
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

  if (plain) {
    if (mref > -INFINITY) {
      kept_sums(no(), -INFINITY);
    } else {   // nothing finite here: weighs nothing (exp2(-inf + inf) would be NaN)
      for (int c = threadIdx.x; c < nchunks; c += kRowThreads) chunk_sum[c] = 0.f;
    }
  } else if (!cut_on) {
    kept_sums(no(), -INFINITY);   // min-p only
  } else {
    // ---- the cut: the rows kernel's histogram, reduce-scatter and search, unchanged
    const uint32_t omax = max_key16(M, static_cast<const T*>(nullptr));
    auto count2 = [&](uint32_t d2, uint32_t lim2) {
      uint32_t c2;
      asm("min.u16x2 %0, %1, %2;" : "=r"(c2) : "r"(d2), "r"(lim2));
      const uint32_t a2 = c2 << 2;
      atomicAdd(reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(bins) + (a2 & 0xffffu)), 1u);
      atomicAdd(reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(bins) + (a2 >> 16)), 1u);
    };
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
            const uint32_t d2 = omax2 - ord16x2(w[h]);
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
    const float z_row = need_z ? all.zrow : 0.f;   // merged in exchange 1
    count_pass(no(), no(), 0u);
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
    constexpr int kPer = kRowBins / kRowThreads;
    double mass_through = 0.0;
    auto search = [&](bool by_mass, double target, uint32_t dlim, bool want_mass) {
      double above_c = 0.0, above_m = 0.0;
      int last_nz = -1;
      const bool need_m = by_mass || want_mass;
      for (uint32_t w0 = 0; w0 < dlim; w0 += kRowBins) {
        if (w0 != cur_w0) recount(w0);
        const int limit = static_cast<int>(min(static_cast<uint32_t>(kRowBins), dlim - w0));
        const int my_hi = min(phi, limit);
        auto bin_mass = [&](int j) {
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
        if (owner < 0) {
          above_c = before_c;
          above_m = before_m;
          continue;
        }
        if (owner == rank) {
          float v[kPer];
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            const int j = plo + static_cast<int>(threadIdx.x) * kPer + e;
            v[e] = j < my_hi ? (by_mass ? bin_mass(j) : static_cast<float>(part[j - plo])) : 0.f;
          }
          int jl = first_crossing_regs<kRowThreads>(v, target - (by_mass ? before_m : before_c),
                                                   my_hi - plo, sh_d, &sh_out);
          if (jl < 0) jl = nz - plo;
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
    const uint32_t dall = omax + 1u;
    int cut = static_cast<int>(dall) - 1;
    double base = static_cast<double>(z_row);
    if (sp.k_on) {
      cut = search(false, static_cast<double>(sp.top_k), dall, sp.p_on);
      base = mass_through;
    }
    if (sp.p_on) {
      int jp;
      if (!(sp.top_p > 0.f)) jp = search(false, 1.0, dall, false);
      else jp = search(true, static_cast<double>(sp.top_p) * base, static_cast<uint32_t>(cut) + 1u, false);
      if (jp < 0) jp = cut;
      cut = min(cut, jp);
    }
    tau = cut >= 0 ? order_key(value(static_cast<uint32_t>(cut))) : 0u;
    kept_sums(yes(), tau == 0u ? -INFINITY : key_to_float(tau));
  }
  __syncthreads();

  // ---- this CTA's tiles: mass and race in warp 0 (lane t = tile t0 + t)
  const float ex_ref = x_ok ? draft_weight_of(lx, sp, tau, mref) : 0.f;   // the draft, frame mref
  if (warp == 0) {
    float w = 0.f;
    if (lane < ntl)
      for (int c = 0; c < kChunksPerTile; ++c) w += chunk_sum[lane * kChunksPerTile + c];
    const int x_tile = excl >= 0 ? excl / kTile : -1;
    const float wp = w + (t0 + lane == x_tile ? ex_ref : 0.f);
    int any = 0;
    KeyArg br, bp;
    br.key = bp.key = -INFINITY;
    br.idx = bp.idx = -1;
    if (lane < ntl) {   // race_tile with the noise drawn during the load
      any = w > 0.f;
      KeyArg c;
      c.idx = t0 + lane;
      if (w > 0.f) { c.key = log2f(w) - le; br = c; }
      if (wp > 0.f) { c.key = log2f(wp) - le; bp = c; }
    }
    warp_race2(br, bp);
    any = __any_sync(kAll, any);
    if (lane == 0) {
      float z = 0.f;   // chunks in order: the rows kernel's CTA sum
      for (int c = 0; c < nchunks; ++c) z += chunk_sum[c];
      rec.z = z; rec.mref = mref; rec.best_r = br; rec.best_p = bp; rec.any = any;
      if (plain) { rec.raw_max = Mc; rec.flags = flc; }
    }
  }
  // ---- the exchange: max and flags (rows without filters), mass, best tiles
  cluster_sync();
  if (warp == 0) {   // every CTA merges the same values in the same order: the same bits
    float mx = -INFINITY, mr = -INFINITY, z = 0.f;
    uint32_t f = 0u;
    int any = 0;
    KeyArg br, bp;
    br.key = bp.key = -INFINITY;
    br.idx = bp.idx = -1;
    if (lane < C) {
      mr = ld_cluster_f32(cluster_map(&rec.mref, lane));
      z = ld_cluster_f32(cluster_map(&rec.z, lane));
      br.key = ld_cluster_f32(cluster_map(&rec.best_r.key, lane));
      br.idx = static_cast<int>(ld_cluster_u32(cluster_map(&rec.best_r.idx, lane)));
      bp.key = ld_cluster_f32(cluster_map(&rec.best_p.key, lane));
      bp.idx = static_cast<int>(ld_cluster_u32(cluster_map(&rec.best_p.idx, lane)));
      any = static_cast<int>(ld_cluster_u32(cluster_map(&rec.any, lane)));
      if (plain) {
        mx = ld_cluster_f32(cluster_map(&rec.raw_max, lane));
        f = ld_cluster_u32(cluster_map(&rec.flags, lane));
      }
    }
    float v = z;
    if (plain) {
      const float Mrow = warp_max(mx);
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) f |= __shfl_xor_sync(kAll, f, d);
      const float mrow = __fmul_rn(Mrow, scale);
      v = lane < C ? scaled_sum(mr, z, mrow) : 0.f;   // into the row's frame
      const float shift = mr - mrow;                  // 0 for the CTA holding the max
      if (br.idx >= 0) br.key += shift;
      if (bp.idx >= 0) bp.key += shift;
      if (lane == 0) { all.raw_max = Mrow; all.flags = f; }
    }
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) v += __shfl_down_sync(kAll, v, d);   // cluster_sum's tree
    warp_race2(br, bp);
    any = __any_sync(kAll, any);
    if (lane == 0) {
      if (!plain) { all.raw_max = M; all.flags = flags; }
      all.z = v;
      all.any = any;
      all.best = any ? br : bp;
    }
  }
  __syncthreads();
  M = all.raw_max;
  flags = all.flags;
  m = __fmul_rn(M, scale);
  if (plain && (flags != 0u || !(M > -INFINITY))) {   // the block is invalid (chain flags it)
    if (rank == 0 && threadIdx.x == 0) write_rec(-1, 0, 0.f, 0.f, !(M > -INFINITY), flags, 0u);
    leave();
    return;
  }
  const float ex = x_ok ? draft_weight_of(lx, sp, tau, m) : 0.f;   // weight of the draft if kept
  const float z_full = all.z + (excl >= 0 ? ex : 0.f);
  const float px = z_full > 0.f ? ex / z_full : 0.f;
  const int accept = (i < k && x_ok) ? (u_acc < px) : 0;
  if (accept) {
    if (rank == 0 && threadIdx.x == 0) write_rec(-1, 1, logf(px), 0.f, 0, flags, tau);
    leave();
    return;
  }

  // ---- level 2, split over the cluster: CTA c races tokens [c * S, (c + 1) * S) of the tile
  {
    const bool use_p = !all.any;
    const int tile = all.best.idx < 0 ? 0 : all.best.idx;
    const int owner = min(tile / max(tpc, 1), C - 1);
    const uint32_t src = cluster_map(rows_dyn, static_cast<uint32_t>(owner)) +
                         static_cast<uint32_t>(tile - owner * tpc) * (kTile * 2u);
    const int S = (kTile + C - 1) / C;
    const int j1 = min(kTile, (rank + 1) * S);
    const int skip = use_p ? -1 : excl;
    KeyArg tb;
    tb.key = -INFINITY; tb.idx = -1;
    float tl = 0.f;
    for (int j = rank * S + static_cast<int>(threadIdx.x); j < j1; j += kRowThreads) {
      const int tok = tile * kTile + j;
      if (tok >= V) break;
      const float l = bits16_to_float(ld_cluster_u16(src + 2u * static_cast<uint32_t>(j)),
                                      static_cast<const T*>(nullptr));
      if (l == -INFINITY || tok == skip) continue;   // race_token's rules
      const float s2 = __fmul_rn(l, scale);
      if (sp.filtered && !kept(l, s2, tau, m, min_p)) continue;
      KeyArg c;
      c.key = __fsub_rn(s2, m) - log2f(philox_exponential(spec_bits(seed, step, i, kPurposeToken, tok)));
      c.idx = tok;
      const KeyArg nb = better(tb, c);
      if (nb.idx == tok) tl = l;
      tb = nb;
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      KeyArg o;
      o.key = __shfl_xor_sync(kAll, tb.key, d);
      o.idx = __shfl_xor_sync(kAll, tb.idx, d);
      const float ol = __shfl_xor_sync(kAll, tl, d);
      const KeyArg nb = better(tb, o);
      if (nb.idx != tb.idx) tl = ol;
      tb = nb;
    }
    if (lane == 0) { rec.tok[warp] = tb; rec.tok_l[warp] = tl; }
  }
  cluster_sync();
  if (rank == 0 && warp == 0) {   // C x kRowWarps candidates, a few per lane; better() is order-free
    KeyArg tb;
    tb.key = -INFINITY; tb.idx = -1;
    float tl = 0.f;
    for (int e = lane; e < C * kRowWarps; e += 32) {
      const int c = e / kRowWarps, w = e % kRowWarps;
      KeyArg o;
      o.key = ld_cluster_f32(cluster_map(&rec.tok[w].key, c));
      o.idx = static_cast<int>(ld_cluster_u32(cluster_map(&rec.tok[w].idx, c)));
      const float ol = ld_cluster_f32(cluster_map(&rec.tok_l[w], c));
      const KeyArg nb = better(tb, o);
      if (nb.idx != tb.idx) tl = ol;
      tb = nb;
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      KeyArg o;
      o.key = __shfl_xor_sync(kAll, tb.key, d);
      o.idx = __shfl_xor_sync(kAll, tb.idx, d);
      const float ol = __shfl_xor_sync(kAll, tl, d);
      const KeyArg nb = better(tb, o);
      if (nb.idx != tb.idx) tl = ol;
      tb = nb;
    }
    if (lane == 0) {
      const int tok = tb.idx;
      float lpt = -INFINITY;
      if (tok >= 0 && z_full > 0.f) lpt = (__fsub_rn(__fmul_rn(tl, scale), m) - log2f(z_full)) * kLn2;
      write_rec(tok, 0, logf(px), lpt, 0, flags, tau);
    }
  }
  leave();
}

#else
template <typename T>
__device__ void small_kernel(const SpecSampleParams&) { __trap(); }   // never launched below sm_90
#endif

// spec_sample_chain with the op's inputs read before the wait: the layout, parameters and
// drafts of the sequence (written before the op began, not by the rows launch), then only the
// row records after it (one dependent global round trip instead of two). The rest is chain_seq.
__device__ void chain_pre_seq(const SpecSampleParams& p, int b) {
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
  // the first 32 rows' drafts (lane i: row i), before the wait
  const int x0 = (st == SPEC_SAMPLE_OK && lane < k) ? __ldg(p.draft_ids + dbase + lane) : -1;
  pdl_wait();   // the rows' records must be in
  uint32_t flags = 0u;
  bool empty = false, bad = false, foreign = false;
  if (st == SPEC_SAMPLE_OK) {
    for (int i = lane; i < q; i += 32) {
      const SpecSampleRowOut o = rows[i];
      flags |= o.flags;
      empty |= o.empty != 0;
      foreign |= o.owner != b;
      if (i < k) {
        const int x = i < 32 ? x0 : __ldg(p.draft_ids + dbase + i);
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
  int n = -1;
  if (!invalid) {
    for (int base = 0; base < q && n < 0; base += 32) {
      const int i = base + lane;
      SpecSampleRowOut o;
      o.token = -1; o.accept = 0; o.lp_draft = 0.f; o.lp_token = 0.f;
      int x = -1;
      if (i < q) {
        o = rows[i];
        if (i < k) x = base == 0 ? x0 : __ldg(p.draft_ids + dbase + i);
      }
      const bool acc = i < k && (sp.greedy ? x == o.token : o.accept != 0);
      const unsigned rej = __ballot_sync(kAll, i < q && !acc);
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
  for (int j = n + 1 + lane; j < W; j += 32) {
    em[j] = -1;
    if (lp) lp[j] = 0.f;
  }
  if (lane == 0) {
    p.num_accepted[b] = invalid ? 0 : n;
    p.status[b] = st;
  }
}

__device__ void chain_pre_kernel(const SpecSampleParams& p) {
  const int b = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (b < p.batch) chain_pre_seq(p, b);   // warp-uniform
}

}  // namespace
