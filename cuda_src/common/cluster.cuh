// Thread-block clusters (sm_90+): rank, barrier, distributed shared memory reads.
//
// A cluster's CTAs run at the same time on one GPC, so they can wait for each other and read
// each other's shared memory: a row split over a cluster can stay on chip through several
// passes that each need the whole row's result of the previous one (row max -> histogram ->
// threshold -> sums). Every CTA of the cluster must reach each cluster_sync(), and a CTA must
// not exit while a peer may still read its shared memory (end with a cluster_sync()).
// Only compiled for __CUDA_ARCH__ >= 900 (older families never launch with a cluster).
#pragma once
#include <stdint.h>

namespace specdec {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
// All threads of all CTAs of the cluster; shared-memory writes before it are visible to every
// CTA's reads after it (release / acquire).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The two halves of cluster_sync(): work between them overlaps the other CTAs' arrival (e.g.
// arrive once this CTA has stopped reading its peers, wait just before exiting).
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Address of this CTA's shared variable `p` in CTA `rank`'s shared memory (shared::cluster window).
__device__ __forceinline__ uint32_t cluster_map(const void* p, uint32_t rank) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t o;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(o) : "r"(a), "r"(rank));
  return o;
}
__device__ __forceinline__ uint32_t ld_cluster_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ld_cluster_u64(uint32_t addr) {
  unsigned long long v;
  asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) { return __uint_as_float(ld_cluster_u32(addr)); }

// ---- one-way pushes into a peer's shared memory, counted by the peer's mbarrier (no fence)
// barrier.cluster.arrive.release and fence.acq_rel.cluster both assemble to MEMBAR.ALL.GPU on
// sm_90 (ptxas 13.0), which waits for every memory operation the thread has in flight. A
// st.async instead completes on the receiver's mbarrier with its byte count (complete_tx):
// the receiver's acquire wait on that mbarrier makes the data visible, and the sender needs
// no fence at all. Pattern: the receiver initialises its mbarrier (mbar_init + fence_mbar_init)
// and arms it with the bytes it will receive (mbar_arrive_expect_tx; pushes may land before
// it: the tx-count may go negative within a phase); every CTA does cluster_arrive_relaxed()
// after its init and cluster_wait() before its first push (so no push reaches an
// uninitialised mbarrier); the receiver spins on mbar_try_wait(parity 0) and then reads its
// buffer. A CTA may exit once it has received everything it expects: nothing else touches
// its shared memory.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(count) : "memory");
}
// Make this thread's mbarrier inits visible to the cluster's other CTAs (before their pushes).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival on the local mbarrier that also expects `bytes` more transaction bytes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(bytes) : "memory");
}
// True once phase `parity` of the local mbarrier has completed (acquire, cluster scope: the
// st.async data counted by it is visible to this thread).
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile("{\n\t.reg .pred p;\n\t"
               "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
               "selp.u32 %0, 1, 0, p;\n\t}"
               : "=r"(ok) : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(parity) : "memory");
  return ok != 0;
}
// 16 / 4 bytes into shared::cluster address `addr` (cluster_map), completing on the mbarrier
// at shared::cluster address `bar` of the same CTA.
__device__ __forceinline__ void st_async_v4(uint32_t addr, float4 v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar) : "memory");
}
__device__ __forceinline__ void st_async_f32(uint32_t addr, float v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
               ::"r"(addr), "f"(v), "r"(bar) : "memory");
}
#endif

}  // namespace specdec
