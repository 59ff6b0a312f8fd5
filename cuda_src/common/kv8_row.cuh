// Warp-collective write of one (token, KV head) row of an 8-bit KV cache (issue 32): the
// row's D values sit in the registers of W aligned lanes (W = 32: the whole warp; 4 / 8 / 16: a
// warp holds 32 / W rows side by side) as chunks of V consecutive elements; the lane holding
// chunk c writes cache bytes c*V .. c*V+V-1. FP8: codes e4m3(x * (1/scale)); INT8: the W
// lanes reduce the row's NaN-ignoring min / max (exact, so the lane count changes no bit),
// every lane derives the same (scale, zero) (common/kv8.cuh), the row's first lane stores
// the pair. Used by append_kv8 (copy.cu). Every lane of the warp must call it.
#pragma once
#include <stdint.h>
#include <string.h>
#include "common/kv8.cuh"

namespace specdec {

enum { KV8_FP8 = 0, KV8_INT8 = 1 };

template <int V>
__device__ __forceinline__ void kv8_store_bytes(uint8_t* dst, const uint8_t (&b)[V]) {
  if constexpr (V == 8) {
    uint2 w;
    memcpy(&w, b, 8);
    *reinterpret_cast<uint2*>(dst) = w;
  } else if constexpr (V == 4) {
    uint32_t w;
    memcpy(&w, b, 4);
    *reinterpret_cast<uint32_t*>(dst) = w;
  } else if constexpr (V == 2) {
    uint16_t w;
    memcpy(&w, b, 2);
    *reinterpret_cast<uint16_t*>(dst) = w;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) dst[i] = b[i];
  }
}

// x(j, i): element chunk[j]*V + i of the row (chunk[j] < 0: slot unused), a callable so the
// caller can widen its loaded words where they are used (int8 reads each element twice:
// holding 64 floats of a D=256 row spilled). fp8_scale: the head's scale (FP8); params: where
// (scale, zero) go (INT8, written by the row's first lane; nullptr for a lane group holding
// no row).
// local_range(chunk, mn, mx): the lane's NaN-ignoring min / max over its valid chunks, or
// false to have them taken element by element from x.
template <int FMT, int NC, int V, int W = 32, typename X, typename LocalRange>
__device__ __forceinline__ void kv8_write_row(const X& x, const int (&chunk)[NC],
                                              uint8_t* dst, float fp8_scale, float* params,
                                              const LocalRange& local_range) {
  static_assert(W == 4 || W == 8 || W == 16 || W == 32, "lanes per row: 4, 8, 16 or 32");
  if constexpr (FMT == KV8_FP8) {
    const float inv = kv8::rcp_rn(fp8_scale);
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      if (chunk[j] < 0) continue;
      if constexpr (V == 4 || V == 8) {   // codes two at a time, stored as 4-byte words
        uint32_t w[V / 4];
#pragma unroll
        for (int i = 0; i < V / 4; ++i) {
          w[i] = kv8::e4m3x2_encode(kv8::mul_rn(x(j, 4 * i), inv),
                                    kv8::mul_rn(x(j, 4 * i + 1), inv)) |
                 static_cast<uint32_t>(
                     kv8::e4m3x2_encode(kv8::mul_rn(x(j, 4 * i + 2), inv),
                                        kv8::mul_rn(x(j, 4 * i + 3), inv))) << 16;
        }
        if constexpr (V == 8)
          *reinterpret_cast<uint2*>(dst + chunk[j] * V) = make_uint2(w[0], w[1]);
        else
          *reinterpret_cast<uint32_t*>(dst + chunk[j] * V) = w[0];
      } else {
        uint8_t b[V];
#pragma unroll
        for (int i = 0; i < V; ++i) b[i] = kv8::e4m3_encode(kv8::mul_rn(x(j, i), inv));
        kv8_store_bytes<V>(dst + chunk[j] * V, b);
      }
    }
  } else {
    float mn = __int_as_float(0x7fffffff), mx = mn;   // NaN: ignored by min/max
    if (!local_range(chunk, mn, mx)) {
#pragma unroll
      for (int j = 0; j < NC; ++j) {
        if (chunk[j] < 0) continue;
#pragma unroll
        for (int i = 0; i < V; ++i) {
          mn = kv8::fmin_nan(mn, x(j, i));
          mx = kv8::fmax_nan(mx, x(j, i));
        }
      }
    }
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
      mn = kv8::fmin_nan(mn, __shfl_xor_sync(0xffffffffu, mn, o));
      mx = kv8::fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    const kv8::Int8Row r = kv8::int8_row(mn, mx);
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      if (chunk[j] < 0) continue;
      if constexpr (V == 4 || V == 8) {   // codes four at a time, stored as 4-byte words
        uint32_t w[V / 4];
#pragma unroll
        for (int i = 0; i < V / 4; ++i)
          w[i] = kv8::int8x4_encode(x(j, 4 * i), x(j, 4 * i + 1), x(j, 4 * i + 2),
                                    x(j, 4 * i + 3), r);
        if constexpr (V == 8)
          *reinterpret_cast<uint2*>(dst + chunk[j] * V) = make_uint2(w[0], w[1]);
        else
          *reinterpret_cast<uint32_t*>(dst + chunk[j] * V) = w[0];
      } else {
        uint8_t b[V];
#pragma unroll
        for (int i = 0; i < V; ++i) b[i] = static_cast<uint8_t>(kv8::int8_encode(x(j, i), r));
        kv8_store_bytes<V>(dst + chunk[j] * V, b);
      }
    }
    if constexpr (W == 32) {
      if ((threadIdx.x & 31) == 0) {
        params[0] = r.scale;
        params[1] = r.zero;
      }
    } else {
      if ((threadIdx.x & (W - 1)) == 0 && params != nullptr) {
        params[0] = r.scale;
        params[1] = r.zero;
      }
    }
  }
}

}  // namespace specdec
