// Programmatic dependent launch (sm_90): the host launches every kernel with the
// programmatic-serialization attribute, so it is scheduled while its predecessor drains
// instead of after it (a kernel that follows another kernel of the same op, ops.sampling's
// hist / finish / chain launches, overlaps its own prologue too). Such a kernel calls pdl_wait() before it reads anything its predecessor wrote
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

// The first statement of every kernel that is the first launch of an op: on sm_90 every
// library launch goes out with programmatic serialization (runtime: Kernel.pdl), so the
// kernel may be scheduled while the previous launch on the stream (any op's, or the host's
// own kernel) drains. It waits for that launch to complete and its writes to be visible
// before it reads or writes anything, then lets its own successor be scheduled (once every
// CTA of it has passed this point). Waiting first keeps the chain transitive: a kernel that
// has passed pdl_begin() knows every earlier launch on the stream has completed.
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}

}  // namespace specdec
