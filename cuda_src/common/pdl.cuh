// Programmatic dependent launch (sm_90): the host launches a kernel that follows another
// kernel of the same op with the programmatic-serialization attribute, so it is scheduled
// while its predecessor drains instead of after it (ops.sampling: the hist / finish / chain
// launches). Such a kernel calls pdl_wait() before it reads anything its predecessor wrote
// or writes anything its predecessor reads; a predecessor calls pdl_trigger() once all its
// CTAs are resident. Both are no-ops below sm_90 and for a kernel launched the plain way (the
// host only sets the attribute when the loaded code is the sm_90 family).
#pragma once

namespace specdec {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace specdec
