# cython: language_level=3
"""Launchers of the attention family: pack the parameter block, launch. No validation
here (specdec_lib.ops.attention does it before calling in)."""
from libc.stdint cimport int32_t, int64_t, uintptr_t
from specdec_lib._driver cimport Kernel, launch

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

    int VERIFY_ATTN_THREADS
    int VERIFY_ATTN_EPILOGUE_SMEM

PARAM_SIZES = {"VerifyAttentionParams": sizeof(VerifyAttentionParams),
               "VerifyAttentionMergeParams": sizeof(VerifyAttentionMergeParams)}
THREADS = VERIFY_ATTN_THREADS
EPILOGUE_SMEM = VERIFY_ATTN_EPILOGUE_SMEM


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
    cdef VerifyAttentionMergeParams m
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
    launch(k, head_ctas, batch, num_splits, VERIFY_ATTN_THREADS, 1, 1, smem, stream, &p)
    if num_splits > 1:
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
        m.num_tokens = num_tokens
        m.batch = batch
        m.num_qo_heads = num_qo_heads
        m.head_dim = head_dim
        m.max_q = max_q
        m.num_splits = num_splits
        m.kv_chunk = kv_chunk
        m.pad_ = 0
        launch(merge, num_qo_heads, batch, max_q, 128, 1, 1, 0, stream, &m)
