// Math that stays accurate under the build's --use_fast_math (which turns expf into
// __expf: ex2.approx of x * log2(e), whose relative error grows like |x| * 2^-24 from the
// rounded product, and makes '/' approximate).
#pragma once
#include <stdint.h>

namespace specdec {

// exp(x), relative error a few ulp over the whole range (inf above ~88.7, 0 below ~-87.3
// with flush-to-zero, NaN kept). Cody-Waite: x = n ln2 + r with |r| <= ln2/2, ln2 split
// so that n * ln2_hi is exact; 2^(r log2e) by ex2.approx (its argument is now small, so the
// rounding of r * log2e costs < 2^-25 relative); 2^n applied as two exact power-of-two
// factors so n = 128 or -126 needs no special case.
__device__ __forceinline__ float accurate_expf(float x) {
  const float n = fminf(fmaxf(rintf(x * 1.442695041f), -150.f), 150.f);   // NaN x: r is NaN
  float r = fmaf(n, -0.693145751953125f, x);          // ln2_hi: 0x3f317200, 9 low bits zero
  r = fmaf(n, -1.428606765330187e-06f, r);            // ln2_lo: 0x35bfbe8e
  float p;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p) : "f"(r * 1.442695041f));
  const int k = static_cast<int>(n);
  const int k1 = k / 2, k2 = k - k1;                  // each in [-75, 75]: normal floats
  return p * __int_as_float((k1 + 127) << 23) * __int_as_float((k2 + 127) << 23);
}

// silu(g) = g / (1 + exp(-g)) with an IEEE division: -0 for g -> -inf, g for g -> +inf.
__device__ __forceinline__ float accurate_silu(float g) {
  return __fdiv_rn(g, 1.f + accurate_expf(-g));
}

}  // namespace specdec
