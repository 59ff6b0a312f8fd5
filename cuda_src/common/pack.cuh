// Packs of N elements moved as one access: 16-byte vector loads/stores where the caller
// has checked the alignment, element by element (with a bound) where it has not.
//
// A row kernel that always walks its row in units of N elements, whichever way a unit is
// loaded, does the same arithmetic in the same order on both paths: its bits do not
// depend on the pointers' alignment (row invariance across differently aligned calls).
#pragma once
#include <string.h>
#include "common/dtype.cuh"

namespace specdec {

template <typename T, int N> struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) Pack {
  T e[N];
};

// ReadOnly: the data is not written by this kernel (ld.global.nc); otherwise plain loads,
// which see this thread's own earlier stores (in-place ops, re-reading what it wrote).
template <typename T, int N, bool ReadOnly = true>
__device__ __forceinline__ Pack<T, N> load_pack(const T* ptr) {
  Pack<T, N> r;
  if constexpr (sizeof(T) * N % 16 == 0) {
    constexpr int Q = sizeof(T) * N / 16;
    uint4 u[Q];
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const uint4* src = reinterpret_cast<const uint4*>(ptr) + q;
      if constexpr (ReadOnly) u[q] = __ldg(src);
      else u[q] = *src;
    }
    memcpy(&r, u, sizeof(r));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) r.e[i] = ptr[i];
  }
  return r;
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(T* ptr, const Pack<T, N>& r) {
  if constexpr (sizeof(T) * N % 16 == 0) {
    constexpr int Q = sizeof(T) * N / 16;
    uint4 u[Q];
    memcpy(u, &r, sizeof(r));
#pragma unroll
    for (int q = 0; q < Q; ++q) reinterpret_cast<uint4*>(ptr)[q] = u[q];
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) ptr[i] = r.e[i];
  }
}

// A pack of 4, 8 or 16 bytes as one access (load_pack moves a pack under 16 bytes element
// by element): the caller has checked that ptr is aligned to the pack's size.
template <typename T, int N, bool ReadOnly = true>
__device__ __forceinline__ Pack<T, N> load_vec(const T* ptr) {
  using Word = typename storage<sizeof(T) * N>::type;   // 4, 8 or 16 bytes
  const Word* src = reinterpret_cast<const Word*>(ptr);
  Word u;
  if constexpr (ReadOnly) u = __ldg(src);
  else u = *src;
  Pack<T, N> r;
  memcpy(&r, &u, sizeof(r));
  return r;
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* ptr, const Pack<T, N>& r) {
  using Word = typename storage<sizeof(T) * N>::type;   // 4, 8 or 16 bytes
  Word u;
  memcpy(&u, &r, sizeof(r));
  *reinterpret_cast<Word*>(ptr) = u;
}

// Unit u (elements u*N .. u*N+N-1) of a row of n elements: one vector access when vec
// (the caller guarantees alignment and n % N == 0), else element by element, the elements
// at or past n read as zero and not written.
template <typename T, int N, bool ReadOnly = true>
__device__ __forceinline__ Pack<T, N> load_unit(const T* row, int64_t u, int64_t n, bool vec) {
  if (vec) return load_pack<T, N, ReadOnly>(row + u * N);
  Pack<T, N> r;
#pragma unroll
  for (int i = 0; i < N; ++i) r.e[i] = u * N + i < n ? row[u * N + i] : from_float<T>(0.f);
  return r;
}

template <typename T, int N>
__device__ __forceinline__ void store_unit(T* row, int64_t u, int64_t n, bool vec, const Pack<T, N>& r) {
  if (vec) {
    store_pack<T, N>(row + u * N, r);
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (u * N + i < n) row[u * N + i] = r.e[i];
}

}  // namespace specdec
