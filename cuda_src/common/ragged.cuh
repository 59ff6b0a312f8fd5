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

// The target's first links, loaded together: one memory trip, not one a link. A caller
// that has other independent loads (the row's data, its position) issues them beside these
// and resolves the target after (kv_append_resolve: the page id, the second trip).
struct KvAppendRow {
  int b = 0;                 // the owner sequence
  int32_t row0 = 0;          // cu_q[b]
  int32_t len = 0;           // seq_lens[b]
  bool finished = true;      // finished[b], or an empty batch (nothing to write)
};

__device__ __forceinline__ KvAppendRow kv_append_row(const int32_t* cu_q, const int32_t* seq_lens,
                                                     const uint8_t* finished, int batch, int t) {
  KvAppendRow r;
  if (batch <= 0) return r;
  r.b = owner_of_row(cu_q, batch, t);
  r.row0 = __ldg(cu_q + r.b);
  r.len = __ldg(seq_lens + r.b);
  r.finished = finished != nullptr && finished[r.b] != 0;
  return r;
}

// The (page, slot) of row i of r's sequence (position len + i): false for a finished
// sequence or a target outside the page table or the pool.
__device__ __forceinline__ bool kv_append_page(bool finished, int64_t pos,
                                               const int32_t* page_table,
                                               int64_t page_table_stride, int page_size,
                                               int num_pages, int max_pages, int b,
                                               int32_t& page, int64_t& slot) {
  if (finished || pos < 0) return false;
  const int64_t page_idx = pos / page_size;
  if (page_idx >= max_pages) return false;
  page = __ldg(page_table + b * page_table_stride + page_idx);
  if (page < 0 || page >= num_pages) return false;
  slot = pos - page_idx * page_size;
  return true;
}

// Where append_kv writes block row t's K/V: sequence b = owner of t, position
// L[b] + (t - cu_q[b]), page page_table[b, pos / page_size], slot pos % page_size.
// False (nothing to write) for an empty batch, a finished sequence, or a target outside
// the page table or the pool: bad indices are skipped, never faulted on.
__device__ __forceinline__ bool kv_append_resolve(const KvAppendRow& r, const int32_t* page_table,
                                                  int64_t page_table_stride, int page_size,
                                                  int num_pages, int max_pages, int t,
                                                  int32_t& page, int64_t& slot) {
  return kv_append_page(r.finished, static_cast<int64_t>(r.len) + (t - r.row0), page_table,
                        page_table_stride, page_size, num_pages, max_pages, r.b, page, slot);
}

// The same for row i of sequence b's block, the owner already known (append_kv8 keeps it
// across a warp's run of tokens): finished[b] and L[b] loaded together.
__device__ __forceinline__ bool kv_append_slot(const int32_t* seq_lens, const uint8_t* finished,
                                               const int32_t* page_table,
                                               int64_t page_table_stride, int page_size,
                                               int num_pages, int max_pages, int b, int i,
                                               int32_t& page, int64_t& slot) {
  const bool fin = finished != nullptr && finished[b] != 0;
  const int64_t pos = static_cast<int64_t>(__ldg(seq_lens + b)) + i;
  return kv_append_page(fin, pos, page_table, page_table_stride, page_size, num_pages,
                        max_pages, b, page, slot);
}

__device__ __forceinline__ bool kv_append_target(const int32_t* cu_q, const int32_t* seq_lens,
                                                 const uint8_t* finished,
                                                 const int32_t* page_table,
                                                 int64_t page_table_stride, int batch,
                                                 int page_size, int num_pages, int max_pages,
                                                 int t, int32_t& page, int64_t& slot) {
  return kv_append_resolve(kv_append_row(cu_q, seq_lens, finished, batch, t), page_table,
                           page_table_stride, page_size, num_pages, max_pages, t, page, slot);
}

}  // namespace specdec
