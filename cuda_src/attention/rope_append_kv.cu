// rope_append_kv: the rotary embedding of q and k and the paged append of k and v, in one
// launch (a decoder layer's rope + append_kv pair, one launch fewer per layer).
//
//   q [T, Hq, D], k/v [T, Hkv, D] (k's head dim contiguous, token/head strides free),
//   positions [T], cos_sin_cache [P, D] -> q, k rotated in place;
//   k_cache/v_cache [num_pages, page_size, Hkv, D] <- rotated k, v at L[b] + i.
//
// Semantics are exactly rope followed by append_kv (reference/attention.py::rope_append_kv):
// the rotation is common/rope.cuh's rope_pair, the one rope uses, so q, k and the cache hold
// the same bits as the unfused pair; the write target is common/ragged.cuh's
// kv_append_row + kv_append_resolve, i.e. kv_append_target, the one append_kv uses (finished
// sequences and targets outside the page table or the pool are skipped). Every row is rotated, appended or not, and a bad position
// gives NaN heads that are appended like any other k (as the unfused pair does).
//
// Layout of the work: a row of blockDim.x threads owns one token t (blockDim.y tokens per
// CTA, grid-stride over T). Its items are the (Hq + Hkv) x D/(2V) rope chunk pairs, then the
// Hkv x D/V chunks of v; a thread that rotates a chunk of k stores it both in place and in
// the cache, so no thread reads another's result and the kernel needs no barrier. The index
// chain's first links (cu_q search, L) are loaded once per token row, beside the position and
// the item's elements; the page id after them (two memory trips, not five, at batch 1).
#include "common/dtype.cuh"
#include "common/pdl.cuh"
#include "common/pack.cuh"
#include "common/ragged.cuh"
#include "common/rope.cuh"
#include "attention/attention_params.h"

using namespace specdec;

namespace {

constexpr int kThreads = 512;   // the launcher's cap: one item a thread up to 512

template <typename T, int V>
__device__ __forceinline__ void rope_append_kv(const RopeAppendKVParams& p) {
  const int half = p.head_dim >> 1;
  const int chunks = half / V;       // V = 1 unless the launcher checked half % V == 0
  const int v_units = p.head_dim / V;
  const int rope_items = (p.q_heads + p.kv_heads) * chunks;
  const int items = rope_items + p.kv_heads * v_units;
  for (int t = blockIdx.x * blockDim.y + threadIdx.y; t < p.num_rows; t += gridDim.x * blockDim.y) {
    // two memory trips a row at batch 1: first the position, the target's first links and
    // the item's own elements, all issued before any is used; then the cos/sin row and the
    // page id (kv_append_resolve), each needing one of the first; then the stores
    const int64_t pos = __ldg(p.positions + t);
    const KvAppendRow row = kv_append_row(p.cu_q, p.seq_lens, p.finished, p.batch, t);
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
      int32_t page = 0;
      int64_t slot = 0;
      if (i < rope_items) {
        const int h = i / chunks, c = i - h * chunks;
        const bool is_k = h >= p.q_heads;
        const int hk = h - p.q_heads;
        T* x = (is_k ? static_cast<T*>(p.k) + t * p.k_stride_t + hk * p.k_stride_h
                     : static_cast<T*>(p.q) + t * p.q_stride_t + h * p.q_stride_h) + c * V;
        const Pack<T, V> a = load_pack<T, V, false>(x), b = load_pack<T, V, false>(x + half);
        Pack<T, V> lo, hi;
        rope_rotate<T, V>(a, b, p.cos_sin_cache, pos, p.max_position, p.head_dim, c, lo, hi);
        const bool append = is_k && kv_append_resolve(row, p.page_table, p.page_table_stride,
                                                      p.page_size, p.num_pages, p.max_pages, t,
                                                      page, slot);
        store_pack<T, V>(x, lo);
        store_pack<T, V>(x + half, hi);
        if (append) {
          T* d = static_cast<T*>(p.k_cache) + page * p.k_cache_stride_page +
                 slot * p.k_cache_stride_slot + hk * p.k_cache_stride_h + c * V;
          store_pack<T, V>(d, lo);
          store_pack<T, V>(d + half, hi);
        }
      } else {
        const int j = i - rope_items;
        const int h = j / v_units, u = j - h * v_units;
        // plain load: v often shares its rows (and cache lines) with the q and k written here
        const Pack<T, V> val = load_pack<T, V, false>(
            static_cast<const T*>(p.v) + t * p.v_stride_t + h * p.v_stride_h + u * V);
        if (kv_append_resolve(row, p.page_table, p.page_table_stride, p.page_size, p.num_pages,
                              p.max_pages, t, page, slot))
          store_pack<T, V>(static_cast<T*>(p.v_cache) + page * p.v_cache_stride_page +
                               slot * p.v_cache_stride_slot + h * p.v_cache_stride_h + u * V,
                           val);
      }
    }
  }
}

}  // namespace

#define SPECDEC_ROPE_APPEND_KV(NAME, T)                                                  \
  extern "C" __global__ void __launch_bounds__(kThreads) rope_append_kv_##NAME(          \
      const RopeAppendKVParams p) { specdec::pdl_begin();                                                      \
    if (p.vectorize) rope_append_kv<T, 16 / sizeof(T)>(p);                               \
    else rope_append_kv<T, 1>(p);                                                        \
  }
SPECDEC_ROPE_APPEND_KV(f32, float)
SPECDEC_ROPE_APPEND_KV(f16, __half)
SPECDEC_ROPE_APPEND_KV(bf16, bf16_t)
