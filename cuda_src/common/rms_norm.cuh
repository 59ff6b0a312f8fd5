// RMSNorm of one row by a whole CTA (layers' rms_norm, draft's draft_combine).
//
//   s = x                          (res == nullptr)
//   s = round_T(x + res) -> res_out (the fused residual add: what an unfused add would store)
//   y = round_T(s * rsqrt(mean(s^2) + eps) * (w or 1 + w))
//
// The row is walked in units of N = 16 / sizeof(T) elements: thread t owns units t,
// t + blockDim, ... whether a unit is one 16-byte access (vec) or N scalar ones, so the
// sum of squares is added in the same order on both paths: per thread in unit order,
// then cta_sum. A row's bits depend only on its values, H and blockDim (which the launcher
// derives from H alone): not on the other rows, the row count or the pointers' alignment.
//
// The first kCache units of each thread stay in registers between the two passes; units
// past them (H > kCache * N * blockDim) are read again, from res_out when the row was
// fused (plain loads: this thread wrote them), else from x. Every unit is read and written
// by the same thread, read first, so out may be x and res_out may be res (in place).
#pragma once
#include "common/dtype.cuh"
#include "common/pack.cuh"
#include "common/warp.cuh"

// The (activation, weight) dtype pairs an RMSNorm kernel is instantiated for, as
// X(name suffix, T, W): the weight is the activation dtype or float32.
#define SPECDEC_FOR_NORM_DTYPES(X)  \
  X(f32_wf32, float, float)         \
  X(f16_wf16, __half, __half)       \
  X(f16_wf32, __half, float)        \
  X(bf16_wbf16, bf16_t, bf16_t)     \
  X(bf16_wf32, bf16_t, float)

namespace specdec {

// One 16-byte unit a thread (vec, H <= N * blockDim: what the launcher picks for H up to
// 512 units): rms_norm_row's arithmetic in its order, so the same bits, without its loops.
// Every load (weight, x, res) is issued before the first store, the row's one memory trip;
// at batch 1 the generic form's per-unit guards were most of a warp's dependent chain.
template <typename T, typename W, int N>
__device__ __forceinline__ void rms_norm_unit(const T* x, const T* res, T* res_out, const W* w,
                                              T* y, int H, float eps, bool unit_offset,
                                              float* smem /* [32] */) {
  const int64_t e = static_cast<int64_t>(threadIdx.x) * N;
  const bool mine = e < H;            // vec: H % N == 0
  Pack<T, N> v;
  Pack<W, N> wv;
  float ss = 0.f;
  if (mine) {
    wv = load_pack<W, N>(w + e);
    v = load_pack<T, N, false>(x + e);
    if (res != nullptr) {
      const Pack<T, N> r = load_pack<T, N, false>(res + e);
#pragma unroll
      for (int i = 0; i < N; ++i) v.e[i] = from_float<T>(to_float(v.e[i]) + to_float(r.e[i]));
      store_pack<T, N>(res_out + e, v);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) { const float f = to_float(v.e[i]); ss = fmaf(f, f, ss); }
  }
  const float inv = rsqrtf(__fdiv_rn(cta_sum(ss, smem), static_cast<float>(H)) + eps);
  if (mine) {
    const float off = unit_offset ? 1.f : 0.f;
    Pack<T, N> o;
#pragma unroll
    for (int i = 0; i < N; ++i)
      o.e[i] = from_float<T>(to_float(v.e[i]) * inv * (off + to_float(wv.e[i])));
    store_pack<T, N>(y + e, o);
  }
}

template <typename T, typename W, int N>
__device__ __forceinline__ void rms_norm_row(const T* x, const T* res, T* res_out, const W* w,
                                             T* y, int H, float eps, bool unit_offset, bool vec,
                                             float* smem /* [32] */) {
  constexpr int kCache = 4;
  const int units = (H + N - 1) / N;
  const int step = blockDim.x;
  auto fetch = [&](int u) {           // s for unit u (written to res_out when fused)
    Pack<T, N> v = load_unit<T, N, false>(x, u, H, vec);
    if (res != nullptr) {
      const Pack<T, N> r = load_unit<T, N, false>(res, u, H, vec);
#pragma unroll
      for (int i = 0; i < N; ++i) v.e[i] = from_float<T>(to_float(v.e[i]) + to_float(r.e[i]));
      store_unit<T, N>(res_out, u, H, vec, v);
    }
    return v;
  };
  float ss = 0.f;
  auto accumulate = [&](const Pack<T, N>& v) {
#pragma unroll
    for (int i = 0; i < N; ++i) { const float f = to_float(v.e[i]); ss = fmaf(f, f, ss); }
  };
  Pack<T, N> cache[kCache];
  // the weights of the cached units are loaded now, not after the sum: their latency hides
  // behind the reduction's, and after it each would wait for the y store before it (y may
  // alias w as far as the compiler knows), one memory trip per unit (H=2048 bf16 takes 64
  // threads of 4 units: 3 trips after the barrier)
  Pack<W, N> wc[kCache];
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int u = threadIdx.x + j * step;
    if (u < units) wc[j] = load_unit<W, N>(w, u, H, vec);
  }
  // every cached unit's x and res are loaded before the first res_out store: res_out may
  // alias x or res (in place), so a store between them would order the next unit's loads
  // after it, one memory trip per unit (H=2048 bf16: 4 trips, ~5 us a row at B=1)
  if (res == nullptr) {
#pragma unroll
    for (int j = 0; j < kCache; ++j) {
      const int u = threadIdx.x + j * step;
      if (u < units) cache[j] = load_unit<T, N, false>(x, u, H, vec);
    }
  } else {
    Pack<T, N> r[kCache];
#pragma unroll
    for (int j = 0; j < kCache; ++j) {
      const int u = threadIdx.x + j * step;
      if (u < units) {
        cache[j] = load_unit<T, N, false>(x, u, H, vec);
        r[j] = load_unit<T, N, false>(res, u, H, vec);
      }
    }
#pragma unroll
    for (int j = 0; j < kCache; ++j) {
      const int u = threadIdx.x + j * step;
      if (u < units) {
#pragma unroll
        for (int i = 0; i < N; ++i)
          cache[j].e[i] = from_float<T>(to_float(cache[j].e[i]) + to_float(r[j].e[i]));
        store_unit<T, N>(res_out, u, H, vec, cache[j]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kCache; ++j)
    if (threadIdx.x + j * step < units) accumulate(cache[j]);
  for (int u = threadIdx.x + kCache * step; u < units; u += step) accumulate(fetch(u));
  // explicit IEEE division: the build uses --use_fast_math
  const float inv = rsqrtf(__fdiv_rn(cta_sum(ss, smem), static_cast<float>(H)) + eps);
  const float off = unit_offset ? 1.f : 0.f;
  auto emit = [&](int u, const Pack<T, N>& v, const Pack<W, N>& wv) {
    Pack<T, N> o;
#pragma unroll
    for (int i = 0; i < N; ++i)
      o.e[i] = from_float<T>(to_float(v.e[i]) * inv * (off + to_float(wv.e[i])));
    store_unit<T, N>(y, u, H, vec, o);
  };
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int u = threadIdx.x + j * step;
    if (u < units) emit(u, cache[j], wc[j]);
  }
  const T* again = res != nullptr ? res_out : x;
  for (int u = threadIdx.x + kCache * step; u < units; u += step)
    emit(u, load_unit<T, N, false>(again, u, H, vec), load_unit<W, N>(w, u, H, vec));
}

}  // namespace specdec
