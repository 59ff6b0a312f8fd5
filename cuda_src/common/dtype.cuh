// Element types and conversions shared by every kernel.
//
// bf16 is handled as raw 16-bit storage plus shifts so the compute_75 path (which has
// no bf16 arithmetic) can still read and write it; fp16 uses the hardware conversions.
#pragma once
#include <stdint.h>
#include <cuda_fp16.h>

namespace specdec {

struct bf16_t { uint16_t bits; };   // storage only; math is done in float

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(bf16_t x) {
  return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
}

// The element of T at byte offset `byte` (0, or 2 for 16-bit T) of a loaded 32-bit word:
// kernels that hold rows in flight as raw words widen them only where they compute.
template <typename T> __device__ __forceinline__ float word_element_to_float(uint32_t w, int byte);
template <> __device__ __forceinline__ float word_element_to_float<float>(uint32_t w, int) {
  return __uint_as_float(w);
}
template <> __device__ __forceinline__ float word_element_to_float<bf16_t>(uint32_t w, int byte) {
  return __uint_as_float(byte ? w & 0xffff0000u : w << 16);
}
template <> __device__ __forceinline__ float word_element_to_float<__half>(uint32_t w, int byte) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(byte ? w >> 16 : w)));
}

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
// Round-to-nearest-even, NaN kept quiet: the same rounding numpy/ml_dtypes and torch use.
// sm_80+ has the conversion (one instruction where the bit arithmetic is ~6 dependent ones:
// at batch 1 a kernel's time is its dependent chain); it gives the same bits for every
// non-NaN value, and a NaN comes out as the canonical 0x7fff (the bit arithmetic keeps the
// sign and payload): still a NaN, which is all a flagged row promises.
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float x) {
  bf16_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
#else
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) { r.bits = static_cast<uint16_t>((u >> 16) | 0x40u); return r; }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.bits = static_cast<uint16_t>(u >> 16);
#endif
  return r;
}

// Same-size unsigned storage type, for dtype-agnostic data movement.
template <int Bytes> struct storage;
template <> struct storage<1> { using type = uint8_t; };
template <> struct storage<2> { using type = uint16_t; };
template <> struct storage<4> { using type = uint32_t; };
template <> struct storage<8> { using type = unsigned long long; };
template <> struct storage<16> { using type = uint4; };

__device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace specdec
