// Philox4x32-10 counter-based RNG (Salmon, Moraes, Dror, Shaw: "Parallel random numbers:
// as easy as 1, 2, 3", SC'11), the Random123 definition: 10 rounds, the key bumped by the
// Weyl constants before rounds 2..10. Stateless: the same (counter, key) gives the same 4
// words on every thread, launch, stream and GPU, which is what makes sampling reproducible
// and graph-capturable. specdec_lib/reference/sampling.py holds the bit-identical numpy
// twin (tested against the Random123 known-answer vectors).
//
// Generic on purpose: how an op lays out its counter (which word carries what) is the op's
// business; this header only provides the cipher and two bit -> number conversions.
#pragma once
#include <stdint.h>

namespace specdec {

__device__ __forceinline__ uint4 philox4x32_10(uint4 ctr, uint2 key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r) { key.x += kW0; key.y += kW1; }
    const uint32_t hi0 = __umulhi(kM0, ctr.x), lo0 = kM0 * ctr.x;
    const uint32_t hi1 = __umulhi(kM1, ctr.z), lo1 = kM1 * ctr.z;
    ctr = make_uint4(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
  }
  return ctr;
}

// [0, 1) on a 2^-24 grid: exactly representable in float, identical to the reference.
__device__ __forceinline__ float philox_uniform24(uint32_t bits) {
  return static_cast<float>(bits >> 8) * 5.9604644775390625e-8f;   // 2^-24
}

// Exp(1) from 32 bits with full relative precision at both ends: u = (x + 0.5) / 2^32;
// -log(u) for u < 1/2, and -log1p(-(1 - u)) with 1 - u formed from the integer complement
// for u >= 1/2 (so u near 1 never rounds to 1 and gives E = 0).
__device__ __forceinline__ float philox_exponential(uint32_t bits) {
  if (bits < 0x80000000u) {
    const float u = (static_cast<float>(bits) + 0.5f) * 2.3283064365386963e-10f;   // 2^-32
    return -logf(u);
  }
  const float c = (static_cast<float>(0xFFFFFFFFu - bits) + 0.5f) * 2.3283064365386963e-10f;
  return -log1pf(-c);
}

}  // namespace specdec
