// spec_sample pass 1: per-(row, 2048-token tile) partials, one warp per tile.
// Included by spec_sample.cu only.
#pragma once
#include "common/ragged.cuh"
#include "sampling/sample_common.cuh"

using namespace specdec;

namespace {

// ------------------------------------------------------------------ 1. tile partials
//
// One warp owns one 2048-token tile at a time (a CTA's 4 warps walk its tiles with stride 4),
// so a tile costs a few warp shuffles and no block barrier. Fast path (full tile, 16-byte
// aligned row, no NaN or +inf in the tile): 16-byte loads, the tile max first (packed max.NaN
// on sm_80+), then one FFMA + EX2 + FADD per token relative to it; greedy rows find the
// argmax from per-vector maxima and skip the exponentials unless logprobs are asked for.
// Anything else (tail tile, misaligned row, a NaN or +inf in the tile) takes the per-token
// path below, which keeps every edge rule of the spec.

struct TileCtx {
  float scale;          // log2(e) / temperature
  int excl;             // one-hot draft left out of the sums (-1: none)
  uint32_t tau_key;     // filtered pass: kept iff order_key >= tau_key
  float tau_f;          // the same test for non-NaN x as x >= tau_f (order_key is monotone and maps
                        // -0 to +0; tau_key is a token's key, or 0: no cut, tau_f = -inf)
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

// ---- fast-path building blocks

// fmaxf with NaN propagation (+0 > -0; .ftz because the build's --use_fast_math makes fmaxf
// ftz, and the fast path must flush exactly as the per-token path). sm_75 has no max.NaN.
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float r;
#if __CUDA_ARCH__ >= 800
  asm("max.ftz.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
#else
  asm("{ .reg .pred p; setp.nan.f32 p, %1, %2; max.ftz.f32 %0, %1, %2; selp.f32 %0, 0f7FFFFFFF, %0, p; }"
      : "=f"(r) : "f"(a), "f"(b));
#endif
  return r;
}

// Partial maxima of 16-byte vectors, NaN-propagating. On sm_80+ a 16-bit one stays packed
// (max.NaN.bf16x2 / f16x2: one instruction per two elements, nothing unpacked); otherwise it
// is a float. fold() gives what fmaxf over the unpacked elements gives (ftz, +0 > -0), NaN if
// any is NaN (ftz is monotone: flushing the packed max = maxing the flushed values).
#if __CUDA_ARCH__ >= 800
constexpr bool kMaxNaN = true;   // max.NaN exists (f32, bf16x2, f16x2)
#else
constexpr bool kMaxNaN = false;
#endif
__device__ __forceinline__ uint32_t pmax(uint32_t a, uint32_t b, const void*) {
  return __float_as_uint(fmax_nan(__uint_as_float(a), __uint_as_float(b)));
}
__device__ __forceinline__ float fold(uint32_t p, const void*) { return __uint_as_float(p); }
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint32_t pmax(uint32_t a, uint32_t b, const bf16_t*) {
  uint32_t r;
  asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t pmax(uint32_t a, uint32_t b, const __half*) {
  uint32_t r;
  asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ float fold(uint32_t p, const bf16_t*) {
  return fmax_nan(__uint_as_float(p << 16), __uint_as_float(p & 0xffff0000u));
}
__device__ __forceinline__ float fold(uint32_t p, const __half*) {
  return fmax_nan(__half2float(__ushort_as_half(static_cast<unsigned short>(p & 0xffffu))),
                  __half2float(__ushort_as_half(static_cast<unsigned short>(p >> 16))));
}
#endif
template <typename T>
__device__ __forceinline__ uint32_t vec_max(const uint4& u) {
  constexpr const T* tag = nullptr;
  if constexpr (kMaxNaN) {
    return pmax(pmax(u.x, u.y, tag), pmax(u.z, u.w, tag), tag);
  } else {   // sm_75 (no max.NaN): fmaxf and an isnan per element
    float x[VecN<T>::kN];
    unpack16(u, x, tag);
    float m = x[0];
    bool nan = isnan(x[0]);
#pragma unroll
    for (int e = 1; e < VecN<T>::kN; ++e) {
      m = fmaxf(m, x[e]);
      nan |= isnan(x[e]);
    }
    return __float_as_uint(nan ? __int_as_float(0x7fffffff) : m);
  }
}

// Fast path: the whole tile's partial in every lane (no warp_merge). kMode 0: plain; 1: the
// one-hot draft lies in this tile; 2: filtered recount. Returns false (warp-uniform) when the
// tile needs the per-token path (a NaN or +inf in it).
//
// Max first, then one exp2 pass: each 16-byte slab's lane max (packed, NaN-propagating: one
// test finds NaN and +inf), the warp max M, then w = exp2(x * scale - M * scale) summed with no
// rescaling (16-bit: one slab; f32: two, one rescale). Greedy rows find the argmax lazily: the
// first 16-byte vector (in token order: vector j of lane l holds ids (j*32 + l)*kN + e) whose
// max equals M, then one ballot over its kN elements. m, raw_max, arg and flags come out bit
// for bit as the per-lane partials merged by warp_merge would (raw_max: the lmax of the lane
// that wins the merge); only the float order of s changed.
template <typename T, int kMode>
__device__ __forceinline__ bool tile_fast(const T* row, int base, uint4 (&u)[8], const TileCtx& c,
                                          Partial& out) {
  constexpr int kN = VecN<T>::kN;
  constexpr int kSlab = 8;                   // vectors per lane in registers at once
  constexpr int kV = kTile / kN / 32;        // vectors per lane: 8 (16-bit) or 16 (f32)
  constexpr int kSlabs = kV / kSlab;
  constexpr const T* tag = nullptr;
  const int lane = threadIdx.x & 31;
  const uint4* src = reinterpret_cast<const uint4*>(row + base);
  const int rel = c.excl - base - lane * kN;   // kMode 1/2: excl is element j*32*kN + e of this lane
  float vm[kV];                                // greedy: each vector's max (as fold gives it)
  int jl = kV;                                 // greedy: this lane's first vector holding M
  float lmax = -INFINITY, M = -INFINITY, s = 0.f;
#pragma unroll
  for (int slab = 0; slab < kSlabs; ++slab) {
    if (slab) {
#pragma unroll
      for (int j = 0; j < kSlab; ++j) u[j] = __ldg(src + (slab * kSlab + j) * 32 + lane);
    }
    uint32_t vp[kSlab];
#pragma unroll
    for (int j = 0; j < kSlab; ++j) vp[j] = vec_max<T>(u[j]);
    if (c.need_arg) {
#pragma unroll
      for (int j = 0; j < kSlab; ++j) vm[slab * kSlab + j] = fold(vp[j], tag);
    }
#pragma unroll
    for (int d = 1; d < kSlab; d <<= 1) {   // tree over the slab's vectors
#pragma unroll
      for (int j = 0; j < kSlab; j += 2 * d) vp[j] = pmax(vp[j], vp[j + d], tag);
    }
    const float sm = fold(vp[0], tag);
    if (__any_sync(0xffffffffu, !(sm < INFINITY))) return false;   // NaN or +inf
    const float wm = warp_max(sm);
    const float mn = slab ? fmaxf(M, wm) : wm;
    lmax = slab ? fmaxf(lmax, sm) : sm;
    if (c.need_arg && slab == kSlabs - 1) {   // M is final: the first vector holding it, per lane
#pragma unroll
      for (int j = kV - 1; j >= 0; --j) jl = vm[j] == mn ? j : jl;
    }
    if (c.need_sum && mn > -INFINITY) {
      const float ms = mn * c.scale;
      if (s > 0.f) s *= exp2f(M * c.scale - ms);   // f32's second slab raised the max
#pragma unroll
      for (int j = 0; j < kSlab; ++j) {
        float x[kN];
        unpack16(u[j], x, tag);
        float sv = 0.f;
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          float w = exp2f(fmaf(x[e], c.scale, -ms));   // -inf logits give 0
          if (kMode != 0) {
            bool counted = (slab * kSlab + j) * 32 * kN + e != rel;
            if (kMode == 2) {   // kept(): the key test as a float compare (same decision, see tau_f)
              counted = counted && x[e] >= c.tau_f;
              if (c.min_p > 0.f) counted = counted && exp2f(__fsub_rn(__fmul_rn(x[e], c.scale), c.row_m)) >= c.min_p;
            }
            w = counted ? w : 0.f;
          }
          sv = e ? sv + w : w;
        }
        s += sv;
      }
    }
    M = mn;
  }
  // The lane whose partial warp_merge would keep: greedy, the lowest (vector, lane) holding M
  // (= the lowest id); sampled rows (arg = base everywhere), the lowest lane with lmax == M.
  // (jl * 32 + lane is that vector's offset in the tile, in 16-byte units.)
  const int key = warp_min(c.need_arg ? jl * 32 + lane : lmax == M ? lane : 32);
  out.raw_max = __shfl_sync(0xffffffffu, lmax, key & 31);
  out.arg = base;   // sampled rows never read the raw argmax
  if (c.need_arg) {
    // one element of that vector per lane (from L1: no dynamic register index), lowest id wins
    const float x = load_logit(row, base + key * kN + lane % kN);
    out.arg = base + key * kN + __ffs(__ballot_sync(0xffffffffu, x == M)) - 1;
  }
  out.m = M * c.scale;   // = max of s2 (x -> x * scale is monotone); -inf if all -inf
  out.s = c.need_sum ? warp_sum(s) : 0.f;
  out.flags = 0;
  return true;
}

template <typename T>
__device__ void tiles_kernel(const SpecSampleParams& p) {
  pdl_wait();      // the first launch of the op: whatever ran before it on the stream
  pdl_trigger();   // the next launch (hist / finish) may be scheduled once every CTA is in
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
  const int r0 = __ldg(p.cu_q + b);
  const int q = __ldg(p.cu_q + b + 1) - r0;
  TileCtx c;
  c.scale = sp.scale;
  c.excl = sp.greedy ? -1 : excluded_draft(p, b, r - r0, q);
  c.tau_key = 0;
  c.tau_f = -INFINITY;
  c.row_m = 0.f;
  c.min_p = sp.min_p;
  c.need_sum = !sp.greedy || p.logprobs != nullptr;
  c.need_arg = sp.greedy;
  if (p.filtered_pass) {
    const SpecSampleRow rs = ws_rows(p)[r];
    c.tau_key = rs.tau_key;
    c.tau_f = rs.tau_key == 0u ? -INFINITY : key_to_float(rs.tau_key);
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
    if (!ok) a = warp_merge(tile_slow(row, base, p.vocab, p.filtered_pass != 0, c, sp.min_p));
    if (lane == 0) {
      SpecSampleTile out;
      out.m = a.m; out.s = a.s; out.raw_max = a.raw_max; out.arg = a.arg; out.flags = a.flags;
      ws_tiles(p)[static_cast<int64_t>(r) * p.num_tiles + tile] = out;
    }
  }
  if (!p.filtered_pass && !p.no_filters && (sp.k_on || sp.p_on)) {
    // zero the row's filter state (the f32 path: head, bucket counts and mass sums; 16-bit
    // logits: head and all 8192 value bins; the whole record either way) for the filter
    // launches that follow in stream order: no memset launch, nothing kept between calls,
    // graph-capturable. Last in the kernel, where it costs no registers.
    constexpr int kZero = static_cast<int>(sizeof(SpecSampleFilter) / 16);
    uint4* z = reinterpret_cast<uint4*>(ws_filters(p) + r);
    for (int i = blockIdx.y * SPEC_SAMPLE_TILE_THREADS + threadIdx.x; i < kZero;
         i += gridDim.y * SPEC_SAMPLE_TILE_THREADS)
      z[i] = make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace
