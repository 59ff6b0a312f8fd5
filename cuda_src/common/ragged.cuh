// Ragged batches: T block rows split into B sequences by offsets cu_q[0..B].
#pragma once
#include <stdint.h>

namespace specdec {

// Sequence owning block row t: the last b with cu_q[b] <= t, by binary search.
// Empty sequences share their offset with the next one, which is the owner; a corrupt
// (non-monotonic) cu_q still yields some b in [0, batch), never an out-of-range index.
__device__ __forceinline__ int owner_of_row(const int32_t* cu_q, int batch, int t) {
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (__ldg(cu_q + mid) <= t) lo = mid; else hi = mid;
  }
  return lo;
}

}  // namespace specdec
