// Asynchronous global -> shared copies (cp.async, sm_80+) with a synchronous fallback.
//
// On sm_80+ `cp_async_16` issues a 16-byte cp.async.cg (L2 only: streamed data such as a
// KV cache gains nothing from L1) that zero-fills the destination when `valid` is false,
// so tails and masked rows never read memory and never leave stale data behind.
// On sm_75 the same call is a plain 16-byte load + shared store and commit/wait are
// no-ops: a multi-stage pipeline written against these wrappers stays correct (it
// just loses the overlap), so one kernel source serves every architecture.
#pragma once
#include <stdint.h>

namespace specdec {

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
#else
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (valid) v = __ldg(reinterpret_cast<const uint4*>(gmem_src));
  *reinterpret_cast<uint4*>(smem_dst) = v;
#endif
}

// 4-byte cp.async (.ca; any 4-byte aligned address: scattered scalars such as a journal's entries
// go to shared memory without passing through registers). sm_75: a plain load + shared store.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem_src) : "memory");
#else
  *reinterpret_cast<uint32_t*>(smem_dst) = __ldg(reinterpret_cast<const uint32_t*>(gmem_src));
#endif
}

// Close the group of cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until at most N committed groups are still in flight (this thread's copies only:
// follow with __syncthreads() before reading what other threads copied).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Ask L2 for the 128-byte line holding `p` (no register written, nothing waits for it): data a
// later CTA will load then comes from L2 instead of DRAM. PTX prefetch.global.L2, every target.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

}  // namespace specdec
