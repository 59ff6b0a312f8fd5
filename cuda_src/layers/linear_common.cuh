// The pieces linear's kernels share (linear.cu: the CUDA-core forms; linear_mma.cu: the
// tensor-core few-row form): 16-byte K units and their helpers, the row pointers, the s fetch
// (x or round(x + residual)), rms_norm's per-unit emit, and the few-row prologue a warp runs
// for its rows. Moved here unchanged from linear.cu (its PTX is the same, s45). Inside an
// anonymous namespace: each translation unit has its own copy.
#pragma once
#include "common/dtype.cuh"
#include "common/math.cuh"
#include "common/pack.cuh"
#include "common/warp.cuh"
#include "layers/linear_params.h"

namespace {

using namespace specdec;

constexpr int kUnit = 8;                    // elements per K unit (16 bytes)

// A unit of 8 16-bit elements is held as 4 words (element 2i in the low half of word i, as
// in memory) and read / built a word at a time: 16-bit elements zeroed or written one by one
// write register halves, and the other half of an uninitialised register then counts as
// live from the kernel's entry (that had doubled the register count). A float32 norm
// weight's unit is a plain Pack. get(u, e) is to_float of element e either way.
template <typename T>
struct alignas(16) Words {
  uint32_t w[4];
};
template <typename T> struct UnitOf { using type = Words<T>; };
template <> struct UnitOf<float> { using type = Pack<float, kUnit>; };
template <typename T> using Unit = typename UnitOf<T>::type;

__device__ __forceinline__ uint32_t bits16(bf16_t x) { return x.bits; }
__device__ __forceinline__ uint32_t bits16(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ float half_to_float(bf16_t*, uint32_t h) {
  return __uint_as_float(h << 16);
}
__device__ __forceinline__ float half_to_float(__half*, uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

template <typename T>
__device__ __forceinline__ float get(const Words<T>& u, int e) {
  const uint32_t w = u.w[e >> 1];
  return half_to_float(static_cast<T*>(nullptr), (e & 1) ? w >> 16 : w & 0xffffu);
}
__device__ __forceinline__ float get(const Pack<float, kUnit>& u, int e) { return u.e[e]; }

// round each of 8 floats to T (from_float), two to a word
template <typename T>
__device__ __forceinline__ Words<T> from_floats(const float (&f)[kUnit]) {
  Words<T> r;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    r.w[i] = bits16(from_float<T>(f[2 * i])) | (bits16(from_float<T>(f[2 * i + 1])) << 16);
  return r;
}

template <typename T>
__device__ __forceinline__ Unit<T> zero_unit() {
  Unit<T> r;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < kUnit; ++i) r.e[i] = 0.f;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) r.w[i] = 0u;
  }
  return r;
}

// Unit u (elements 8u .. 8u + 7) of a row of n elements: one 16-byte access (ld.global.nc
// when ReadOnly) when vec (the caller checked alignment and n % 8 == 0), else element by
// element with the elements at or past n read as zero (common/pack.cuh's load_unit).
template <typename T, bool ReadOnly = true>
__device__ __forceinline__ Unit<T> load_u(const T* row, int64_t u, int64_t n, bool vec) {
  if constexpr (sizeof(T) == 4) {
    if (vec) return load_pack<float, kUnit, ReadOnly>(row + u * kUnit);
    Unit<T> r;
#pragma unroll
    for (int i = 0; i < kUnit; ++i) r.e[i] = u * kUnit + i < n ? row[u * kUnit + i] : 0.f;
    return r;
  } else {
    Unit<T> r;
    if (vec) {
      const uint4* src = reinterpret_cast<const uint4*>(row + u * kUnit);
      uint4 q;
      if constexpr (ReadOnly) q = __ldg(src);
      else q = *src;
      r.w[0] = q.x, r.w[1] = q.y, r.w[2] = q.z, r.w[3] = q.w;
      return r;
    }
    const uint16_t* h = reinterpret_cast<const uint16_t*>(row) + u * kUnit;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = u * kUnit + 2 * i < n ? h[2 * i] : 0u;
      const uint32_t hi = u * kUnit + 2 * i + 1 < n ? h[2 * i + 1] : 0u;
      r.w[i] = lo | (hi << 16);
    }
    return r;
  }
}

// The inverse (16-bit T): elements at or past n are not written.
template <typename T>
__device__ __forceinline__ void store_u(T* row, int64_t u, int64_t n, bool vec, const Words<T>& v) {
  if (vec) {
    *reinterpret_cast<uint4*>(row + u * kUnit) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
    return;
  }
  uint16_t* h = reinterpret_cast<uint16_t*>(row) + u * kUnit;
#pragma unroll
  for (int e = 0; e < kUnit; ++e)
    if (u * kUnit + e < n) h[e] = static_cast<uint16_t>((e & 1) ? v.w[e >> 1] >> 16 : v.w[e >> 1]);
}

struct RowPtrs {
  const void* x;
  const void* res;
  void* res_out;
};

template <typename T>
__device__ __forceinline__ RowPtrs row_ptrs(const LinearParams& p, int64_t r) {
  RowPtrs q;
  q.x = static_cast<const T*>(p.x) + r * p.x_stride;
  q.res = p.residual ? static_cast<const T*>(p.residual) + r * p.residual_stride : nullptr;
  q.res_out = p.residual ? static_cast<T*>(p.residual_out) + r * p.residual_out_stride : nullptr;
  return q;
}

// s for unit u of a row: x, or round(x + residual) (rms_norm_row's fetch).
template <typename T>
__device__ __forceinline__ Unit<T> fetch_s(const RowPtrs& q, int64_t u, int K, bool vec) {
  Unit<T> v = load_u<T, false>(static_cast<const T*>(q.x), u, K, vec);
  if (q.res != nullptr) {
    const Unit<T> r = load_u<T, false>(static_cast<const T*>(q.res), u, K, vec);
    float f[kUnit];
#pragma unroll
    for (int i = 0; i < kUnit; ++i) f[i] = get(v, i) + get(r, i);
    v = from_floats<T>(f);
  }
  return v;
}

// rms_norm_row's emit for one unit: round(s * inv * (off + w)); elements past K become zero.
template <typename T, typename W>
__device__ __forceinline__ Unit<T> normalize(const Unit<T>& s, float inv, float off,
                                             const Unit<W>& w, int64_t gu, int K) {
  float f[kUnit];
#pragma unroll
  for (int e = 0; e < kUnit; ++e)
    f[e] = gu * kUnit + e < K ? get(s, e) * inv * (off + get(w, e)) : 0.f;
  return from_floats<T>(f);
}

// A warp's few-row prologue: h[m][j] = unit lane + 32 j of row row0 + m for m < mc (zero
// past mc and past K): s = x or round(x + residual), stored to residual_out when blockIdx.x
// == 0 and `warp` == 0 (the caller's index decides which warp stores), then with a norm
// weight rms_norm's h, summed in its order (one unit a virtual thread: K <= 256 *
// kSmallUnits). Rows past mc are normalised too (zeros, never stored), so a row runs the
// same instructions whatever mc is.
template <typename T, typename W, int MR, int kSmallUnits>
__device__ __forceinline__ void small_rows_wide(const LinearParams& p, int lane, int warp,
                                                int64_t row0, int mc,
                                                Unit<T> (&h)[MR][kSmallUnits]) {
  const int K = p.width, units = K / kUnit;    // vec: K % 8 == 0
  const bool norm = p.norm_weight != nullptr, fused = p.residual != nullptr;
#pragma unroll
  for (int m = 0; m < MR; ++m) {
    const RowPtrs q = row_ptrs<T>(p, row0 + (m < mc ? m : 0));
#pragma unroll
    for (int j = 0; j < kSmallUnits; ++j) {
      const int u = lane + 32 * j;
      h[m][j] = m < mc && u < units ? fetch_s<T>(q, u, K, true) : zero_unit<T>();
    }
  }
  if (norm) {
    Unit<W> nw[kSmallUnits];
#pragma unroll
    for (int j = 0; j < kSmallUnits; ++j) {
      const int u = lane + 32 * j;
      nw[j] = u < units ? load_u<W>(static_cast<const W*>(p.norm_weight), u, K, true) : zero_unit<W>();
    }
    if (fused && blockIdx.x == 0 && warp == 0) {   // s -> residual_out, once
#pragma unroll
      for (int m = 0; m < MR; ++m)
#pragma unroll
        for (int j = 0; j < kSmallUnits; ++j) {
          const int u = lane + 32 * j;
          if (m < mc && u < units)
            store_u<T>(static_cast<T*>(row_ptrs<T>(p, row0 + m).res_out), u, K, true, h[m][j]);
        }
    }
    const int nvw = p.norm_threads >> 5;      // rms_norm's warps: one unit a thread here
    const float off = p.unit_offset ? 1.f : 0.f;
    // Every row and every j unconditionally (rows past mc and units past K hold zeros, and
    // lanes past nvw are masked below): no branch between the independent shuffle trees, so
    // they interleave instead of running one after another.
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      float total[kSmallUnits];
#pragma unroll
      for (int j = 0; j < kSmallUnits; ++j) {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < kUnit; ++e) { const float f = get(h[m][j], e); ss = fmaf(f, f, ss); }
        total[j] = warp_sum(ss);              // cta_sum's first step, for rms_norm's warp j
      }
      float mine = 0.f;
#pragma unroll
      for (int j = 0; j < kSmallUnits; ++j)
        if (lane == j) mine = total[j];
      const float sum = warp_sum(lane < nvw ? mine : 0.f);   // cta_sum's second step
      const float inv = rsqrtf(__fdiv_rn(sum, static_cast<float>(K)) + p.eps);
#pragma unroll
      for (int j = 0; j < kSmallUnits; ++j) {
        const int u = lane + 32 * j;
        if (u < units) h[m][j] = normalize<T, W>(h[m][j], inv, off, nw[j], u, K);
      }
    }
  }
}

}  // namespace
