// Rotate-half (NeoX / HF Llama) rotary embedding of one chunk pair of a head vector:
// elements x[c*V .. c*V+V-1] and their partners D/2 further on. The one definition of the
// arithmetic, shared by rope (layers.cu) and rope_append_kv (attention/rope_append_kv.cu),
// so the fused op is bit for bit the unfused one. The build uses --use_fast_math: the
// products that must not fuse into an FMA are spelled __fmul_rn.
#pragma once
#include <stdint.h>
#include "common/dtype.cuh"
#include "common/pack.cuh"

namespace specdec {

// lo, hi <- the rotated chunk pair (a, b) = (x[c*V ..], x[D/2 + c*V ..]) of a head vector,
// with cos/sin from row ``pos`` of cos_sin_cache [max_position, D]. A position outside
// [0, max_position) gives NaN (the flag; the cache row is not read). The caller loads a and b
// (with whatever else its row needs: one memory trip, then the cache row's).
template <typename T, int V>
__device__ __forceinline__ void rope_rotate(const Pack<T, V>& a, const Pack<T, V>& b,
                                            const float* cos_sin_cache, int64_t pos,
                                            int64_t max_position, int head_dim, int c,
                                            Pack<T, V>& lo, Pack<T, V>& hi) {
  const int half = head_dim >> 1;
  if (pos >= 0 && pos < max_position) {
    const float* row = cos_sin_cache + pos * head_dim + c * V;
    const Pack<float, V> cs = load_pack<float, V>(row), sn = load_pack<float, V>(row + half);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float xa = to_float(a.e[j]), xb = to_float(b.e[j]);
      lo.e[j] = from_float<T>(fmaf(xa, cs.e[j], -__fmul_rn(xb, sn.e[j])));
      hi.e[j] = from_float<T>(fmaf(xb, cs.e[j], __fmul_rn(xa, sn.e[j])));
    }
  } else {
    const float nan = __int_as_float(0x7fc00000);
#pragma unroll
    for (int j = 0; j < V; ++j) lo.e[j] = hi.e[j] = from_float<T>(nan);
  }
}

// rope_rotate of the chunk pair at x (x already offset by c*V). Plain loads of x: the
// callers write the result back in place.
template <typename T, int V>
__device__ __forceinline__ void rope_pair(const T* x, const float* cos_sin_cache, int64_t pos,
                                          int64_t max_position, int head_dim, int c,
                                          Pack<T, V>& lo, Pack<T, V>& hi) {
  const Pack<T, V> a = load_pack<T, V, false>(x), b = load_pack<T, V, false>(x + (head_dim >> 1));
  rope_rotate<T, V>(a, b, cos_sin_cache, pos, max_position, head_dim, c, lo, hi);
}

}  // namespace specdec
