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
#endif

}  // namespace specdec
