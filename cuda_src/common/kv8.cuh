// 8-bit KV cache element formats (issue 32): E4M3 encode/decode and the asymmetric int8
// row quantiser, bit for bit as specdec_lib/reference/kvquant.py specifies them.
//
// The library builds with --use_fast_math (flush-to-zero, fused multiply-add contraction,
// approximate division), so every float32 step whose rounding is part of the spec goes
// through the IEEE helpers below (inline PTX without .ftz: never contracted, never
// flushed). The E4M3 software paths are integer code on the float32 bits and are
// __host__ __device__, so tests/test_kvquant_host.py compiles this header for the host and
// checks it against the numpy reference on the CPU.
//
// Code families: compute_90 uses the native conversions (cvt.rn.satfinite.e4m3x2.f32,
// cvt.rn.f16x2.e4m3x2); compute_75 / compute_80 the software ones. sm_86 and sm_89 run the
// compute_80 PTX (the build has no compute_89 family), so sm_89 takes the software path too:
// the results are the same bits, only slower.
#pragma once
#include <stdint.h>
#include <string.h>

#include <type_traits>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#ifndef __CUDACC__
#define SPECDEC_HD inline
#else
#define SPECDEC_HD __host__ __device__ __forceinline__
#endif

namespace specdec {
namespace kv8 {

SPECDEC_HD uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
SPECDEC_HD float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// ---- IEEE float32 round-to-nearest-even, no flush, no contraction
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float sub_rn(float a, float b) {
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float div_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float rcp_rn(float a) {
  float r;
  asm("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
// NaN-ignoring (PTX min/max return the other operand when one is NaN), no flush
__device__ __forceinline__ float fmin_nan(float a, float b) {
  float r;
  asm("min.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float r;
  asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// round half to even to int32; NaN -> 0, out of range saturates (PTX cvt.rni.s32.f32)
__device__ __forceinline__ int rint_s32(float a) {
  int r;
  asm("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(a));
  return r;
}
#else
inline float sub_rn(float a, float b) { return a - b; }
inline float mul_rn(float a, float b) { return a * b; }
inline float add_rn(float a, float b) { return a + b; }
inline float div_rn(float a, float b) { return a / b; }
inline float rcp_rn(float a) { return 1.0f / a; }
inline float fmin_nan(float a, float b) { return a != a ? b : b != b ? a : (b < a ? b : a); }
inline float fmax_nan(float a, float b) { return a != a ? b : b != b ? a : (b > a ? b : a); }
inline int rint_s32(float a) {
  if (a != a) return 0;
  if (a >= 2147483648.0f) return 2147483647;
  if (a <= -2147483648.0f) return (-2147483647 - 1);
  float t = (float)(long long)a;                 // truncation
  float d = a - t;                               // exact
  long long i = (long long)t;
  if (d > 0.5f || (d == 0.5f && (i & 1))) ++i;
  if (d < -0.5f || (d == -0.5f && (i & 1))) --i;
  return (int)i;
}
#endif

// ---- E4M3
// Software encode: round to nearest even, saturate to +-448 (infinities too), NaN -> 0x7F,
// |x| <= 2^-10 -> zero of x's sign. Same bits as __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
// __NV_E4M3).
SPECDEC_HD uint8_t e4m3_encode_sw(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7F;                       // NaN
  if (a > 0x43E80000u) return static_cast<uint8_t>(sign | 0x7Eu);   // > 464: saturate
  if (a >= 0x3C800000u)                                   // normal: RNE on bit 20, rebias
    return static_cast<uint8_t>(sign | (((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - (120u << 3)));
  if (a <= 0x3A800000u) return static_cast<uint8_t>(sign);  // <= 2^-10: zero
  // subnormal: m = rne(|x| * 2^9); |x| in (2^-10, 2^-6) so the exponent E is -10..-7
  const int E = static_cast<int>(a >> 23) - 127;
  const uint32_t s = (a & 0x7FFFFFu) | 0x800000u;
  const int shift = 14 - E;                               // 21..24
  uint32_t m = s >> shift;
  const uint32_t rem = s & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  m += (rem > half || (rem == half && (m & 1u))) ? 1u : 0u;
  return static_cast<uint8_t>(sign | m);
}

__device__ __forceinline__ uint8_t e4m3_encode(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return static_cast<uint8_t>(r & 0xFFu);
#else
  return e4m3_encode_sw(x);
#endif
}

// Two codes (lo in the low byte), the bits of two e4m3_encode calls: one conversion on
// compute_90.
__device__ __forceinline__ uint16_t e4m3x2_encode(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint16_t>(e4m3_encode_sw(lo) | (e4m3_encode_sw(hi) << 8));
#endif
}

// Exact decode to float32 (0x7F / 0xFF -> NaN). Integer code except one exact multiply of
// a small integer by 2^-9 for subnormals (never a float32 subnormal: safe under ftz).
SPECDEC_HD float e4m3_decode_f32(uint32_t b) {
  const uint32_t mag = b & 0x7Fu;
  const uint32_t sign = (b & 0x80u) << 24;
  if (mag == 0x7Fu) return bits_f32(0x7FC00000u | sign);
  if (mag < 8u) return bits_f32(f32_bits(static_cast<float>(mag) * 0.001953125f) | sign);
  return bits_f32(sign | ((mag + (120u << 3)) << 20));
}

// Two codes (low byte first) -> two float16 bit patterns (low half first), exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t r;
  const uint16_t in = static_cast<uint16_t>(two);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(in));
  return r;
#else
  // Branch-free (a per-element decode with branches made the 8-bit attention kernel
  // decode-bound): each code moves to the top byte of its half and one bit right,
  // s eeee mmm -> s 0eeee mmm 0..., which as float16 is the code's value times 2^-8
  // (subnormal codes included: they land on float16 subnormals); one exact multiply by
  // 256; the NaN codes (magnitude 0x7F, 480 after the multiply) then get an all-ones
  // exponent.
  const uint32_t r = __byte_perm(two, 0u, 0x1404);          // [0, b0, 0, b1]
  const uint32_t h = ((r >> 1) & 0x3F803F80u) | (r & 0x80008000u);
  __half2 v;
  memcpy(&v, &h, 4);
  v = __hmul2(v, __half2half2(__ushort_as_half(0x5C00)));  // 256
  uint32_t out;
  memcpy(&out, &v, 4);
  const uint32_t nan = ((r & 0x7F007F00u) + 0x01000100u) & 0x80008000u;
  return out | ((nan >> 15) * 0x7E00u);
#endif
}

// NaN-ignoring min (kMax false) or max of 16-bit pairs (sm_80+): bf16x2 or f16x2 by T
// (bf16_t / __half, the dtype header's storage types).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
template <typename T, bool kMax>
__device__ __forceinline__ uint32_t minmax2(uint32_t a, uint32_t b) {
  constexpr bool kHalf = std::is_same<T, __half>::value;
  uint32_t r;
  if constexpr (kMax && kHalf) asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else if constexpr (kMax) asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else if constexpr (kHalf) asm("min.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else asm("min.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
#endif

// ---- int8 rows: (scale, zero) from the row's NaN-ignoring min / max (kvquant.py)
struct Int8Row {
  float scale, zero, inv;
};

__device__ __forceinline__ Int8Row int8_row(float mn, float mx) {
  Int8Row r;
  float s = div_rn(sub_rn(mx, mn), 255.0f);
  // not a normal finite float32 (0, subnormal, inf, NaN): 1
  if (!(s >= 1.17549435e-38f && s <= 3.40282347e38f)) s = 1.0f;
  r.scale = s;
  // + 0: a zero minimum is stored as +0 whichever zero the min kept (kvquant.py)
  r.zero = add_rn(mn, 0.0f);
  r.inv = rcp_rn(s);
  return r;
}

// int8 code of x: int8(clamp(rint((x - zero) * inv), 0, 255) - 128)
__device__ __forceinline__ int8_t int8_encode(float x, const Int8Row& r) {
  int u = rint_s32(mul_rn(sub_rn(x, r.zero), r.inv));
  u = u < 0 ? 0 : (u > 255 ? 255 : u);
  return static_cast<int8_t>(u - 128);
}

// Four codes as one word (x0's in the low byte), the bytes of four int8_encode calls. On
// the device the rint, the clamp and the -128 cost no conversion: y clamped to [0, 255]
// (max.f32 turns NaN into 0, as cvt.rni does) plus 1.5 * 2^23 - 128 lands where float32's
// spacing is 1, so the add rounds y to nearest even and the low byte of the sum's bits is
// rint(y) - 128 (the constant is even and its low byte zero after the -128 borrow).
__device__ __forceinline__ uint32_t int8x4_encode(float x0, float x1, float x2, float x3,
                                                  const Int8Row& r) {
  const float x[4] = {x0, x1, x2, x3};
  uint32_t b[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float y = fmin_nan(fmax_nan(mul_rn(sub_rn(x[i], r.zero), r.inv), 0.0f), 255.0f);
    b[i] = f32_bits(add_rn(y, 12582784.0f));
  }
  return __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040), 0x5410);
}

// (float(c + 128) * scale) + zero
__device__ __forceinline__ float int8_decode(int c, float scale, float zero) {
  return add_rn(mul_rn(static_cast<float>(c + 128), scale), zero);
}

}  // namespace kv8
}  // namespace specdec
