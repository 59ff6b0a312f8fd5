// Full-warp butterfly reductions (xor 16, 8, 4, 2, 1): every lane gets the result, the same
// bits in every lane (each step adds / compares the same two values in both partners);
// segment_sum, warp_sum over aligned groups of lanes; and cta_sum, the same over a whole CTA.
#pragma once

namespace specdec {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// warp_sum within aligned segments of `lanes` lanes (a power of two <= 32): every lane gets
// its segment's total (xor 16 .. 1, the steps below `lanes`; warp_sum's order at 32). Every
// lane of the warp must call it with the same `lanes`.
__device__ __forceinline__ float segment_sum(float v, int lanes) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1)
    if (d < lanes) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}

__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, v, d);
    v = o > v ? o : v;
  }
  return v;
}

__device__ __forceinline__ int warp_min(int v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_min_sync(0xffffffffu, v);
#else
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
#endif
}

// Sum over the whole CTA (blockDim.x a multiple of 32, at most 1024): every thread gets the
// total, the same bits in every thread and on every run (a fixed butterfly within warps,
// then the warps' partials in warp order). smem: 32 floats; safe to call repeatedly.
__device__ __forceinline__ float cta_sum(float v, float* smem) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();            // smem may still be read from the previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  return warp_sum(lane < (blockDim.x >> 5) ? smem[lane] : 0.f);
}

}  // namespace specdec
