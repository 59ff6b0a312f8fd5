// 8-bit KV cache bytes -> 16-bit mma.sync B-fragment registers (issue 32), for kernels that
// `ldmatrix` an 8-bit tile straight out of shared memory (verify_attention_kv8.cu): each
// 32-bit word a lane receives holds four cache bytes; these helpers turn it into two 16-bit
// pairs in registers, with no 16-bit copy of the tile anywhere.
//
// Which bytes pair up depends on how the word was loaded:
//   ldmatrix (no .trans) of 8-bit rows: the word is 4 consecutive bytes of one row
//     (K[key][d..d+3]); the kernel pairs (b0, b1) / (b2, b3), or (b0, b2) / (b1, b3) when the
//     software E4M3 decoder makes that cheaper, and permutes q's columns to match (a dot
//     product over d does not care about d's order);
//   ldmatrix .trans of 8-bit rows: the word is [row r: b0 b1][row r+1: b2 b3] (a 2 x 2 byte
//     block, V[key..key+1][d..d+1]); (b0, b2) is column d, (b1, b3) column d+1.
//
// Values (all exact):
//   e4m3 -> f16: the code's value (every E4M3 value is a float16). compute_90: the native
//     cvt.rn.f16x2.e4m3x2; compute_75 / compute_80: the branch-free integer decoder of
//     kv8::e4m3x2_to_f16x2 (same bits, NaN codes included).
//   int8 -> f16: 1152 + c (c = -128..127), by the "magic exponent" byte shuffle (no
//     integer-to-float conversion instruction and no subtraction).
#pragma once
#include <stdint.h>
#include <string.h>

#include <cuda_fp16.h>

#include "common/kv8.cuh"

namespace specdec {
namespace kv8 {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
constexpr bool kNativeE4m3 = true;
#else
constexpr bool kNativeE4m3 = false;
#endif

__device__ __forceinline__ uint32_t h2_bits(__half2 v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
__device__ __forceinline__ __half2 bits_h2(uint32_t u) {
  __half2 v;
  memcpy(&v, &u, 4);
  return v;
}

// Software E4M3 pair decode: codes in bytes 1 and 3 of r (bytes 0 and 2 are ignored) ->
// float16 pair, byte 1's value in the low half. kv8::e4m3x2_to_f16x2's integer path after
// its byte shuffle (see there for why it is exact), with a cheaper NaN step: bit 15 / 31 of
// (magnitude + 1) is set exactly for the NaN codes (magnitude 0x7F), and prmt's sign mode
// spreads it over the half, whose all-ones bits are a float16 NaN.
__device__ __forceinline__ uint32_t e4m3_b13_to_f16x2_sw(uint32_t r) {
  const uint32_t h = ((r >> 1) & 0x3F803F80u) | (r & 0x80008000u);
  const uint32_t out = h2_bits(__hmul2(bits_h2(h), __half2half2(__ushort_as_half(0x5C00))));   // x 256
  const uint32_t t = (r & 0x7F007F00u) + 0x01000100u;
  uint32_t nan;
  asm("prmt.b32 %0, %1, 0, 0xBB99;" : "=r"(nan) : "r"(t));   // bytes: sign of byte 1 x2, of byte 3 x2
  return out | nan;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// native: the two 16-bit halves of w, each a code pair (low byte -> low half)
__device__ __forceinline__ void e4m3x2x2_cvt(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}
#endif

// K word (4 bytes of one row). Native: lo = (b0, b1), hi = (b2, b3). Software
// (kKStrided): lo = (b0, b2), hi = (b1, b3) (one shift instead of two byte shuffles).
constexpr bool kKStrided = !kNativeE4m3;
__device__ __forceinline__ void e4m3x4_row_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  e4m3x2x2_cvt(w, lo, hi);
#else
  lo = e4m3_b13_to_f16x2_sw(w << 8);
  hi = e4m3_b13_to_f16x2_sw(w);
#endif
}

// V word from ldmatrix .trans (2 x 2 byte block): lo = (b0, b2) (column d), hi = (b1, b3).
__device__ __forceinline__ void e4m3x4_trans_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  e4m3x2x2_cvt(__byte_perm(w, 0u, 0x3120), lo, hi);
#else
  lo = e4m3_b13_to_f16x2_sw(w << 8);
  hi = e4m3_b13_to_f16x2_sw(w);
#endif
}

// int8 codes -> f16 pairs of 1152 + c (1024 .. 1279, exact): byte b of x = c ^ 0x80 = c + 128
// (unsigned) and f16 bits 0x64uu are 1024 + uu, so one byte shuffle per pair; the caller
// takes the bias out where it is cheaper than a subtraction per pair (a per-row sum(q) for
// K, one MMA against 1024 for V). SEL_*: __byte_perm selectors placing the pair's bytes at 0
// and 2 with 0x64 above each (0x4j4i: bytes i, j).
template <uint32_t SEL_LO, uint32_t SEL_HI>
__device__ __forceinline__ void int8x4_to_f16_biased(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t x = w ^ 0x80808080u;
  lo = __byte_perm(x, 0x64646464u, SEL_LO);
  hi = __byte_perm(x, 0x64646464u, SEL_HI);
}

}  // namespace kv8
}  // namespace specdec
