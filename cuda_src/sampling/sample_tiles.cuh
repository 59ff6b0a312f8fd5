// spec_sample pass 1: per-(row, 2048-token tile) partials, one warp per tile.
// Included by spec_sample.cu only.
#pragma once
#include "common/ragged.cuh"
#include "sampling/sample_common.cuh"

using namespace specdec;

namespace {

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
  if (!p.filtered_pass && !p.no_filters && (sp.k_on || sp.p_on)) {
    // zero the row's threshold state (head + global histogram) for the threshold launches that
    // follow in stream order: no memset launch, nothing kept between calls, graph-capturable
    constexpr int kZero = static_cast<int>((sizeof(SpecSampleFilterHead) + 2048 * sizeof(unsigned long long)) / 16);
    uint4* z = reinterpret_cast<uint4*>(ws_filters(p) + r);
    for (int i = blockIdx.y * SPEC_SAMPLE_TILE_THREADS + threadIdx.x; i < kZero;
         i += gridDim.y * SPEC_SAMPLE_TILE_THREADS)
      z[i] = make_uint4(0u, 0u, 0u, 0u);
  }
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
    if (p.filtered_pass) {
      // A tile whose largest logit is below the threshold keeps nothing: its recount is the
      // first pass's record with s = 0 (m, raw max, arg and flags come from the same tokens by
      // the same path), so it is not read again. Bit-identical to recounting it.
      SpecSampleTile* rec = ws_tiles(p) + static_cast<int64_t>(r) * p.num_tiles + tile;
      if (order_key(rec->raw_max) < c.tau_key) {
        if (lane == 0) rec->s = 0.f;
        continue;
      }
    }
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

}  // namespace
