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
//
// Activations are read with plain loads (not ld.global.nc): rms_norm and rope run in place.
// The build uses --use_fast_math, so the rounding-sensitive steps are spelled out: products
// that must not fuse into an FMA use __fmul_rn, divisions __fdiv_rn, exp accurate_expf.
// rope's arithmetic is common/rope.cuh's rope_pair (rope_append_kv uses the same one).
#include "common/dtype.cuh"
#include "common/pdl.cuh"
#include "common/math.cuh"
#include "common/pack.cuh"
#include "common/rms_norm.cuh"
#include "common/rope.cuh"
#include "layers/layers_params.h"

using namespace specdec;

namespace {

constexpr int kThreads = 256;          // rope, silu_mul
constexpr int kNormMaxThreads = 512;   // rms_norm: the launcher picks <= this from H (128 registers)

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
