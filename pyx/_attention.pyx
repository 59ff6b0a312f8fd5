# cython: language_level=3
"""Launchers of the attention family: pack the parameter block, launch. No validation
here (specdec_lib.ops.attention does it before calling in)."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uintptr_t
from specdec_lib._driver cimport Kernel, launch, launch_cluster_grid

cdef extern from "attention/attention_params.h":
    ctypedef struct VerifyAttentionParams:
        const void* q
        const void* k_cache
        const void* v_cache
        const int32_t* page_table
        const int32_t* seq_lens
        const int32_t* cu_q
        void* out
        float* lse_out
        float* partial_o
        float* partial_lse
        int64_t q_stride_t
        int64_t q_stride_h
        int64_t k_stride_page
        int64_t k_stride_slot
        int64_t k_stride_h
        int64_t v_stride_page
        int64_t v_stride_slot
        int64_t v_stride_h
        int64_t out_stride_t
        int64_t out_stride_h
        int64_t lse_stride_t
        int64_t lse_stride_h
        int64_t page_table_stride
        float scale_log2
        int32_t num_tokens
        int32_t batch
        int32_t num_qo_heads
        int32_t num_kv_heads
        int32_t group
        int32_t page_size_log2
        int32_t num_pages
        int32_t max_pages
        int32_t max_q
        int32_t warps_m
        int32_t num_splits
        int32_t kv_chunk

    ctypedef struct VerifyAttentionMergeParams:
        const float* partial_o
        const float* partial_lse
        void* out
        float* lse_out
        const int32_t* seq_lens
        const int32_t* cu_q
        int64_t out_stride_t
        int64_t out_stride_h
        int64_t lse_stride_t
        int64_t lse_stride_h
        int32_t num_tokens
        int32_t batch
        int32_t num_qo_heads
        int32_t head_dim
        int32_t max_q
        int32_t num_splits
        int32_t kv_chunk
        int32_t pad_

    ctypedef struct RopeAppendKVParams:
        void* q
        void* k
        const void* v
        void* k_cache
        void* v_cache
        const int32_t* positions
        const float* cos_sin_cache
        const int32_t* page_table
        const int32_t* seq_lens
        const int32_t* cu_q
        const uint8_t* finished
        int64_t q_stride_t
        int64_t q_stride_h
        int64_t k_stride_t
        int64_t k_stride_h
        int64_t v_stride_t
        int64_t v_stride_h
        int64_t k_cache_stride_page
        int64_t k_cache_stride_slot
        int64_t k_cache_stride_h
        int64_t v_cache_stride_page
        int64_t v_cache_stride_slot
        int64_t v_cache_stride_h
        int64_t page_table_stride
        int64_t max_position
        int32_t num_rows
        int32_t batch
        int32_t q_heads
        int32_t kv_heads
        int32_t head_dim
        int32_t page_size
        int32_t num_pages
        int32_t max_pages
        int32_t vectorize
        int32_t pad_

    ctypedef struct VerifyAttentionKV8Params:
        VerifyAttentionParams base
        const float* k_scale
        const float* v_scale
        const float* k_params
        const float* v_params
        int32_t scale_stride
        int32_t pad_

    int VERIFY_ATTN_THREADS
    int VERIFY_ATTN_EPILOGUE_SMEM

PARAM_SIZES = {"VerifyAttentionParams": sizeof(VerifyAttentionParams),
               "VerifyAttentionMergeParams": sizeof(VerifyAttentionMergeParams),
               "RopeAppendKVParams": sizeof(RopeAppendKVParams),
               "VerifyAttentionKV8Params": sizeof(VerifyAttentionKV8Params)}
THREADS = VERIFY_ATTN_THREADS
EPILOGUE_SMEM = VERIFY_ATTN_EPILOGUE_SMEM


cdef void _fill_verify_attention(VerifyAttentionParams* p, ptrs, q_strides, k_strides, v_strides,
                                 out_strides, lse_strides, int64_t page_table_stride,
                                 float scale_log2, int num_tokens, int batch, int num_qo_heads,
                                 int num_kv_heads, int page_size_log2, int num_pages,
                                 int max_pages, int max_q, int warps_m, int num_splits,
                                 int kv_chunk):
    p.q = <const void*><uintptr_t>ptrs[0]
    p.k_cache = <const void*><uintptr_t>ptrs[1]
    p.v_cache = <const void*><uintptr_t>ptrs[2]
    p.page_table = <const int32_t*><uintptr_t>ptrs[3]
    p.seq_lens = <const int32_t*><uintptr_t>ptrs[4]
    p.cu_q = <const int32_t*><uintptr_t>ptrs[5]
    p.out = <void*><uintptr_t>ptrs[6]
    p.lse_out = <float*><uintptr_t>ptrs[7]
    p.partial_o = <float*><uintptr_t>ptrs[8]
    p.partial_lse = <float*><uintptr_t>ptrs[9]
    p.q_stride_t, p.q_stride_h = q_strides
    p.k_stride_page, p.k_stride_slot, p.k_stride_h = k_strides
    p.v_stride_page, p.v_stride_slot, p.v_stride_h = v_strides
    p.out_stride_t, p.out_stride_h = out_strides
    p.lse_stride_t, p.lse_stride_h = lse_strides
    p.page_table_stride = page_table_stride
    p.scale_log2 = scale_log2
    p.num_tokens = num_tokens
    p.batch = batch
    p.num_qo_heads = num_qo_heads
    p.num_kv_heads = num_kv_heads
    p.group = num_qo_heads // num_kv_heads
    p.page_size_log2 = page_size_log2
    p.num_pages = num_pages
    p.max_pages = max_pages
    p.max_q = max_q
    p.warps_m = warps_m
    p.num_splits = num_splits
    p.kv_chunk = kv_chunk


cdef void _launch_merge(Kernel merge, VerifyAttentionParams* p, int head_dim, size_t stream):
    cdef VerifyAttentionMergeParams m
    m.partial_o = p.partial_o
    m.partial_lse = p.partial_lse
    m.out = p.out
    m.lse_out = p.lse_out
    m.seq_lens = p.seq_lens
    m.cu_q = p.cu_q
    m.out_stride_t = p.out_stride_t
    m.out_stride_h = p.out_stride_h
    m.lse_stride_t = p.lse_stride_t
    m.lse_stride_h = p.lse_stride_h
    m.num_tokens = p.num_tokens
    m.batch = p.batch
    m.num_qo_heads = p.num_qo_heads
    m.head_dim = head_dim
    m.max_q = p.max_q
    m.num_splits = p.num_splits
    m.kv_chunk = p.kv_chunk
    m.pad_ = 0
    launch(merge, p.num_qo_heads, p.batch, p.max_q, 128, 1, 1, 0, stream, &m)


def launch_verify_attention(Kernel k, Kernel merge, unsigned int head_ctas, unsigned int smem,
                            size_t stream, ptrs, q_strides, k_strides, v_strides, out_strides,
                            lse_strides, int64_t page_table_stride, float scale_log2,
                            int num_tokens, int batch, int num_qo_heads, int num_kv_heads,
                            int head_dim, int page_size_log2, int num_pages, int max_pages,
                            int max_q, int warps_m, int num_splits, int kv_chunk):
    """ptrs = (q, k_cache, v_cache, page_table, seq_lens, cu_q, out, lse_out, partial_o,
    partial_lse); strides are (t, h) / (page, slot, h) tuples in elements. Launches the
    attention kernel on grid (head_ctas, batch, num_splits) (head_ctas = KV heads x row
    groups, fastest so one sequence's heads run together) and, when num_splits > 1, the
    merge kernel on grid (num_qo_heads, batch, max_q)."""
    cdef VerifyAttentionParams p
    _fill_verify_attention(&p, ptrs, q_strides, k_strides, v_strides, out_strides, lse_strides,
                           page_table_stride, scale_log2, num_tokens, batch, num_qo_heads,
                           num_kv_heads, page_size_log2, num_pages, max_pages, max_q, warps_m,
                           num_splits, kv_chunk)
    launch(k, head_ctas, batch, num_splits, VERIFY_ATTN_THREADS, 1, 1, smem, stream, &p)
    if num_splits > 1:
        _launch_merge(merge, &p, head_dim, stream)


def launch_verify_attention_cluster(Kernel k, unsigned int head_ctas, unsigned int smem,
                                    size_t stream, ptrs, q_strides, k_strides, v_strides,
                                    out_strides, lse_strides, int64_t page_table_stride,
                                    float scale_log2, int num_tokens, int batch,
                                    int num_qo_heads, int num_kv_heads, int head_dim,
                                    int page_size_log2, int num_pages, int max_pages, int max_q,
                                    int warps_m, int num_splits, int kv_chunk):
    """sm_90 small-batch path (verify_attention_cluster_*): launch_verify_attention's
    arguments (partial_o / partial_lse unused, 0) on grid (head_ctas * num_splits, batch, 1)
    in clusters of num_splits CTAs along x; one launch, no merge."""
    cdef VerifyAttentionParams p
    _fill_verify_attention(&p, ptrs, q_strides, k_strides, v_strides, out_strides, lse_strides,
                           page_table_stride, scale_log2, num_tokens, batch, num_qo_heads,
                           num_kv_heads, page_size_log2, num_pages, max_pages, max_q, warps_m,
                           num_splits, kv_chunk)
    launch_cluster_grid(k, head_ctas * num_splits, batch, 1, VERIFY_ATTN_THREADS, smem, stream,
                        &p, num_splits, True)


def launch_verify_attention_kv8(Kernel k, Kernel merge, unsigned int head_ctas, unsigned int smem,
                                size_t stream, ptrs, q_strides, k_strides, v_strides,
                                out_strides, lse_strides, int64_t page_table_stride,
                                float scale_log2, int num_tokens, int batch, int num_qo_heads,
                                int num_kv_heads, int head_dim, int page_size_log2,
                                int num_pages, int max_pages, int max_q, int warps_m,
                                int num_splits, int kv_chunk, q8_ptrs, int scale_stride):
    """launch_verify_attention's arguments (cache strides in bytes) + q8_ptrs = (k_scale,
    v_scale, k_params, v_params), 0 where absent."""
    cdef VerifyAttentionKV8Params p
    _fill_verify_attention(&p.base, ptrs, q_strides, k_strides, v_strides, out_strides,
                           lse_strides, page_table_stride, scale_log2, num_tokens, batch,
                           num_qo_heads, num_kv_heads, page_size_log2, num_pages, max_pages,
                           max_q, warps_m, num_splits, kv_chunk)
    p.k_scale = <const float*><uintptr_t>q8_ptrs[0]
    p.v_scale = <const float*><uintptr_t>q8_ptrs[1]
    p.k_params = <const float*><uintptr_t>q8_ptrs[2]
    p.v_params = <const float*><uintptr_t>q8_ptrs[3]
    p.scale_stride = scale_stride
    p.pad_ = 0
    launch(k, head_ctas, batch, num_splits, VERIFY_ATTN_THREADS, 1, 1, smem, stream, &p)
    if num_splits > 1:
        _launch_merge(merge, &p.base, head_dim, stream)


def launch_rope_append_kv(Kernel k, unsigned int grid, unsigned int block,
                          unsigned int rows_per_block, size_t stream, ptrs, q_strides, k_strides,
                          v_strides, k_cache_strides, v_cache_strides, int64_t page_table_stride,
                          int64_t max_position, int num_rows, int batch, int q_heads,
                          int kv_heads, int head_dim, int page_size, int num_pages,
                          int max_pages, bint vectorize):
    """ptrs: (q, k, v, k_cache, v_cache, positions, cos_sin_cache, page_table, seq_lens, cu_q,
    finished or 0); strides in elements: (token, head) for q/k/v, (page, slot, head) for the
    caches. A block is ``block`` x ``rows_per_block`` threads, one token per thread row."""
    cdef RopeAppendKVParams p
    p.q = <void*><uintptr_t>ptrs[0]
    p.k = <void*><uintptr_t>ptrs[1]
    p.v = <const void*><uintptr_t>ptrs[2]
    p.k_cache = <void*><uintptr_t>ptrs[3]
    p.v_cache = <void*><uintptr_t>ptrs[4]
    p.positions = <const int32_t*><uintptr_t>ptrs[5]
    p.cos_sin_cache = <const float*><uintptr_t>ptrs[6]
    p.page_table = <const int32_t*><uintptr_t>ptrs[7]
    p.seq_lens = <const int32_t*><uintptr_t>ptrs[8]
    p.cu_q = <const int32_t*><uintptr_t>ptrs[9]
    p.finished = <const uint8_t*><uintptr_t>ptrs[10]
    p.q_stride_t, p.q_stride_h = q_strides
    p.k_stride_t, p.k_stride_h = k_strides
    p.v_stride_t, p.v_stride_h = v_strides
    p.k_cache_stride_page, p.k_cache_stride_slot, p.k_cache_stride_h = k_cache_strides
    p.v_cache_stride_page, p.v_cache_stride_slot, p.v_cache_stride_h = v_cache_strides
    p.page_table_stride = page_table_stride
    p.max_position = max_position
    p.num_rows = num_rows
    p.batch = batch
    p.q_heads = q_heads
    p.kv_heads = kv_heads
    p.head_dim = head_dim
    p.page_size = page_size
    p.num_pages = num_pages
    p.max_pages = max_pages
    p.vectorize = vectorize
    p.pad_ = 0
    launch(k, grid, 1, 1, block, rows_per_block, 1, 0, stream, &p)
