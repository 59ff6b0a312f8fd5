// layers family: the elementwise glue of a dense (Llama-type) layer, so a host model's
// layer is a few library launches (what a round captured as one CUDA graph wants).
// Semantics: specdec_lib/reference/layers.py. All math in float32, one rounding to the
// output dtype; bf16 is storage only (common/dtype.cuh), so the compute_75 path runs too.
//
//   rms_norm  x [T, H] (+ residual [T, H] -> residual_out), weight [H] -> out [T, H]
//             one CTA per row, blockDim from H alone (common/rms_norm.cuh): a row's bits
//             do not depend on T, the other rows or the alignment. rms_norm_unit_*: the
//             same where each thread owns one aligned 16-byte unit (batch 1's latency).
//   rope      q [T, Hq, D], k [T, Hk, D] in place, positions [T], cos_sin_cache [P, D]
//             one thread per (token, head, V-element chunk of the first half) and its
//             partner chunk D/2 further on; a position outside [0, P) writes NaN over
//             that token's heads (the flag: no read of the cache row).
//   silu_mul  x [T, 2I] -> out [T, I]; one thread per V-element chunk of out.
//   gated_rms_norm  x [T, C], z [T, C], weight and z_bias [C] or [G] -> out [T, C]: per row
//             and group of G channels out = x * rsqrt(mean(x^2) + eps) * w * silu(z + z_bias)
//             (Qwen3-Next's RMSNormGated, a GDN layer's output norm). gated_rms_norm_<out>_x<x>
//             _w<weight>: z is out's dtype, x float32 or out's, weight and z_bias float32 or
//             out's. A group is `lanes` lanes (the launcher: the power of two that gives each
//             lane one unit of 4 elements, at most 32), 32 / lanes groups a warp, 4 warps a
//             CTA, gridDim = (groups / CTA, rows): no block barrier, a segment shuffle sums a
//             group; every load of a lane's first two units (G <= 256) is issued before the
//             sum, and their gates w * silu(z + b) are computed before its shuffles (after
//             them only x * inv * gate is left); units past them (G > 256) are read again
//             for the output. A row's bits depend on its values and G only (not on T, other
//             rows or the alignment: scalar and vector units do the same arithmetic). x is
//             read with plain loads (out may be x).
//
// Activations are read with plain loads (not ld.global.nc): rms_norm and rope run in place.
// The build uses --use_fast_math, so the rounding-sensitive steps are spelled out: products
// that must not fuse into an FMA use __fmul_rn, divisions __fdiv_rn, exp accurate_expf
// (silu: accurate_silu).
// rope's arithmetic is common/rope.cuh's rope_pair (rope_append_kv uses the same one).
#include "common/dtype.cuh"
#include "common/pdl.cuh"
#include "common/math.cuh"
#include "common/pack.cuh"
#include "common/rms_norm.cuh"
#include "common/rope.cuh"
#include "common/warp.cuh"
#include "layers/layers_params.h"

using namespace specdec;

namespace {

constexpr int kThreads = 256;          // rope, silu_mul
constexpr int kNormMaxThreads = 512;   // rms_norm: the launcher picks <= this from H (128 registers)
constexpr int kGatedThreads = 128;     // gated_rms_norm: at most 4 warps a CTA
constexpr int kGatedUnit = 4;          // gated_rms_norm: elements a unit (one access a tensor)
constexpr int kGatedCache = 2;         // ... units a lane keeps in registers (G <= 2 * 32 * 4)
constexpr int kGatedMinBlocks = 8;     // ... CTAs an SM: <= 64 registers (76 unbounded), no spill

template <typename T, typename W>
__device__ __forceinline__ void rms_norm(const RmsNormParams& p) {
  __shared__ float smem[32];
  const bool fused = p.residual != nullptr;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* res = fused ? static_cast<const T*>(p.residual) + r * p.residual_stride : nullptr;
    T* res_out = fused ? static_cast<T*>(p.residual_out) + r * p.residual_out_stride : nullptr;
    rms_norm_row<T, W, 16 / sizeof(T)>(static_cast<const T*>(p.x) + r * p.x_stride, res, res_out,
                                       static_cast<const W*>(p.weight),
                                       static_cast<T*>(p.out) + r * p.out_stride, p.width, p.eps,
                                       p.unit_offset, p.vectorize, smem);
  }
}

// rms_norm where the launcher found every row one 16-byte unit a thread (vectorize and
// H <= blockDim * 16 / sizeof(T)): rms_norm_unit, the same bits as rms_norm_row.
template <typename T, typename W>
__device__ __forceinline__ void rms_norm_units(const RmsNormParams& p) {
  __shared__ float smem[32];
  const bool fused = p.residual != nullptr;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x)
    rms_norm_unit<T, W, 16 / sizeof(T)>(
        static_cast<const T*>(p.x) + r * p.x_stride,
        fused ? static_cast<const T*>(p.residual) + r * p.residual_stride : nullptr,
        fused ? static_cast<T*>(p.residual_out) + r * p.residual_out_stride : nullptr,
        static_cast<const W*>(p.weight), static_cast<T*>(p.out) + r * p.out_stride, p.width,
        p.eps, p.unit_offset, smem);
}

template <typename T, int V>
__device__ __forceinline__ void rope_items(const RopeParams& p) {
  const int half = p.head_dim >> 1;
  const int chunks = half / V;         // V = 1 unless the launcher checked half % V == 0
  const int64_t per_token = static_cast<int64_t>(p.q_heads + p.k_heads) * chunks;
  const int64_t items = p.tokens * per_token;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int rem = static_cast<int>(i - t * per_token);
    const int h = rem / chunks, c = rem - h * chunks;
    T* x = (h < p.q_heads ? static_cast<T*>(p.q) + t * p.q_stride_t + h * p.q_stride_h
                          : static_cast<T*>(p.k) + t * p.k_stride_t +
                                static_cast<int64_t>(h - p.q_heads) * p.k_stride_h) + c * V;
    Pack<T, V> lo, hi;
    rope_pair<T, V>(x, p.cos_sin_cache, __ldg(p.positions + t), p.max_position, p.head_dim, c,
                    lo, hi);
    store_pack<T, V>(x, lo);
    store_pack<T, V>(x + half, hi);
  }
}

template <typename T, int V>
__device__ __forceinline__ void silu_mul_items(const SiluMulParams& p) {
  const int64_t chunks = p.width / V;  // V = 1 unless the launcher checked width % V == 0
  const int64_t items = p.rows * chunks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks, c = i - r * chunks;
    const T* g = static_cast<const T*>(p.x) + r * p.x_stride + c * V;
    const Pack<T, V> a = load_pack<T, V, false>(g), b = load_pack<T, V, false>(g + p.width);
    Pack<T, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.e[j] = from_float<T>(accurate_silu(to_float(a.e[j])) * to_float(b.e[j]));
    store_pack<T, V>(static_cast<T*>(p.out) + r * p.out_stride + c * V, o);
  }
}

// Unit u of a group's slice of a row (n = G elements): one access where the launcher found
// every unit of that tensor aligned (vec), else element by element; the same values either way.
template <typename T, bool ReadOnly>
__device__ __forceinline__ Pack<T, kGatedUnit> gated_load(const T* row, int u, int n, bool vec) {
  return vec ? load_vec<T, kGatedUnit, ReadOnly>(row + u * kGatedUnit)
             : load_unit<T, kGatedUnit, ReadOnly>(row, u, n, false);
}

template <typename T>
__device__ __forceinline__ void gated_store(T* row, int u, int n, bool vec,
                                            const Pack<T, kGatedUnit>& v) {
  if (vec) store_vec<T, kGatedUnit>(row + u * kGatedUnit, v);
  else store_unit<T, kGatedUnit>(row, u, n, false, v);
}

// w * silu(z + b), the gate of one element
template <typename T, typename W>
__device__ __forceinline__ float gated_gate(T z, W w, W b) {
  return to_float(w) * accurate_silu(to_float(z) + to_float(b));
}

template <typename T, typename X, typename W>
__device__ __forceinline__ void gated_rms_norm_groups(const GatedRmsNormParams& p) {
  constexpr int N = kGatedUnit;
  // no integer division: L is a power of two, and group j exists where j * G < C
  const int G = p.group_size, L = p.lanes, shift = __ffs(L) - 1, units = (G - 1) / N + 1;
  const int lane = threadIdx.x & 31, sub = lane & (L - 1);
  const int first = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) << (5 - shift);
  if (static_cast<int64_t>(first) * G >= p.width) return;  // the whole warp: none shuffles
  const int j = first + (lane >> shift);       // this lane's group
  const bool live = static_cast<int64_t>(j) * G < p.width;
  const int64_t c0 = static_cast<int64_t>(live ? j : 0) * G;
  const W* w = static_cast<const W*>(p.weight) + (p.weight_shared ? 0 : c0);
  const W* b = p.z_bias == nullptr ? nullptr
                                   : static_cast<const W*>(p.z_bias) + (p.bias_shared ? 0 : c0);
  Pack<W, N> wc[kGatedCache] = {}, bc[kGatedCache] = {};
#pragma unroll
  for (int k = 0; k < kGatedCache; ++k) {
    const int u = sub + k * L;
    if (live && u < units) {
      wc[k] = gated_load<W, true>(w, u, G, p.vec_w);
      if (b != nullptr) bc[k] = gated_load<W, true>(b, u, G, p.vec_w);
    }
  }
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const X* x = static_cast<const X*>(p.x) + r * p.x_stride + c0;
    const T* z = static_cast<const T*>(p.z) + r * p.z_stride + c0;
    T* y = static_cast<T*>(p.out) + r * p.out_stride + c0;
    Pack<X, N> xc[kGatedCache] = {};
    Pack<T, N> zc[kGatedCache] = {};
#pragma unroll
    for (int k = 0; k < kGatedCache; ++k) {
      const int u = sub + k * L;
      if (live && u < units) {
        xc[k] = gated_load<X, false>(x, u, G, p.vec_x);
        zc[k] = gated_load<T, true>(z, u, G, p.vec_z);
      }
    }
    float ss = 0.f;
    auto accumulate = [&](const Pack<X, N>& v) {
#pragma unroll
      for (int i = 0; i < N; ++i) { const float f = to_float(v.e[i]); ss = fmaf(f, f, ss); }
    };
#pragma unroll
    for (int k = 0; k < kGatedCache; ++k) accumulate(xc[k]);     // zeros past the group
    for (int u = sub + kGatedCache * L; live && u < units; u += L)
      accumulate(gated_load<X, false>(x, u, G, p.vec_x));
    // the cached units' gates need no sum: before its shuffles (G <= 128: one unit a lane)
    float gc[kGatedCache][N] = {};
#pragma unroll
    for (int k = 0; k < kGatedCache; ++k)
      if (live && sub + k * L < units)
#pragma unroll
        for (int i = 0; i < N; ++i) gc[k][i] = gated_gate(zc[k].e[i], wc[k].e[i], bc[k].e[i]);
    // explicit IEEE division: the build uses --use_fast_math
    const float inv = rsqrtf(__fdiv_rn(segment_sum(ss, L), static_cast<float>(G)) + p.eps);
#pragma unroll
    for (int k = 0; k < kGatedCache; ++k) {
      const int u = sub + k * L;
      if (live && u < units) {
        Pack<T, N> o;
#pragma unroll
        for (int i = 0; i < N; ++i) o.e[i] = from_float<T>(to_float(xc[k].e[i]) * inv * gc[k][i]);
        gated_store<T>(y, u, G, p.vec_out, o);
      }
    }
    for (int u = sub + kGatedCache * L; live && u < units; u += L) {   // G > 256: read again
      const Pack<X, N> xv = gated_load<X, false>(x, u, G, p.vec_x);
      const Pack<T, N> zv = gated_load<T, true>(z, u, G, p.vec_z);
      const Pack<W, N> wv = gated_load<W, true>(w, u, G, p.vec_w);
      Pack<W, N> bv = {};
      if (b != nullptr) bv = gated_load<W, true>(b, u, G, p.vec_w);
      Pack<T, N> o;
#pragma unroll
      for (int i = 0; i < N; ++i)
        o.e[i] = from_float<T>(to_float(xv.e[i]) * inv * gated_gate(zv.e[i], wv.e[i], bv.e[i]));
      gated_store<T>(y, u, G, p.vec_out, o);
    }
  }
}

}  // namespace

#define SPECDEC_RMS_NORM(NAME, T, W)                                                     \
  extern "C" __global__ void __launch_bounds__(kNormMaxThreads) rms_norm_##NAME(const RmsNormParams p) { specdec::pdl_begin(); \
    rms_norm<T, W>(p);                                                                   \
  }
SPECDEC_FOR_NORM_DTYPES(SPECDEC_RMS_NORM)

#define SPECDEC_RMS_NORM_UNIT(NAME, T, W)                                                \
  extern "C" __global__ void __launch_bounds__(kNormMaxThreads) rms_norm_unit_##NAME(    \
      const RmsNormParams p) { specdec::pdl_begin();                                     \
    rms_norm_units<T, W>(p);                                                             \
  }
SPECDEC_FOR_NORM_DTYPES(SPECDEC_RMS_NORM_UNIT)

#define SPECDEC_LAYERS_ELEMENTWISE(NAME, T)                                              \
  extern "C" __global__ void __launch_bounds__(kThreads) rope_##NAME(const RopeParams p) { specdec::pdl_begin(); \
    if (p.vectorize) rope_items<T, 16 / sizeof(T)>(p);                                   \
    else rope_items<T, 1>(p);                                                            \
  }                                                                                      \
  extern "C" __global__ void __launch_bounds__(kThreads) silu_mul_##NAME(const SiluMulParams p) { specdec::pdl_begin(); \
    if (p.vectorize) silu_mul_items<T, 16 / sizeof(T)>(p);                               \
    else silu_mul_items<T, 1>(p);                                                        \
  }
SPECDEC_LAYERS_ELEMENTWISE(f32, float)
SPECDEC_LAYERS_ELEMENTWISE(f16, __half)
SPECDEC_LAYERS_ELEMENTWISE(bf16, bf16_t)

// The (out, x, weight) dtypes of gated_rms_norm, as X(name suffix, T, X, W): z and out are T,
// x is float32 or T, weight and z_bias float32 or T (specdec_lib/_kernels.py GATED_NORM_DTYPES).
#define SPECDEC_FOR_GATED_NORM_DTYPES(X)      \
  X(f32_xf32_wf32, float, float, float)       \
  X(f16_xf16_wf16, __half, __half, __half)    \
  X(f16_xf16_wf32, __half, __half, float)     \
  X(f16_xf32_wf16, __half, float, __half)     \
  X(f16_xf32_wf32, __half, float, float)      \
  X(bf16_xbf16_wbf16, bf16_t, bf16_t, bf16_t) \
  X(bf16_xbf16_wf32, bf16_t, bf16_t, float)   \
  X(bf16_xf32_wbf16, bf16_t, float, bf16_t)   \
  X(bf16_xf32_wf32, bf16_t, float, float)

#define SPECDEC_GATED_RMS_NORM(NAME, T, X, W)                                            \
  extern "C" __global__ void __launch_bounds__(kGatedThreads, kGatedMinBlocks)           \
      gated_rms_norm_##NAME(const GatedRmsNormParams p) { specdec::pdl_begin();          \
    gated_rms_norm_groups<T, X, W>(p);                                                   \
  }
SPECDEC_FOR_GATED_NORM_DTYPES(SPECDEC_GATED_RMS_NORM)
