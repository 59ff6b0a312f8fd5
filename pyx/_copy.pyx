# cython: language_level=3
"""Launchers of the copy family: pack the parameter block, launch. No validation here
(specdec_lib.ops.copy does it before calling in)."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uintptr_t
from specdec_lib._driver cimport Kernel, launch

cdef extern from "copy/copy_params.h":
    ctypedef struct CopyParams:
        void* dst
        const void* src
        int64_t shape[4]
        int64_t dst_stride[4]
        int64_t src_stride[4]
        int64_t rows
        int64_t chunks_per_row
        int64_t chunk

    ctypedef struct AppendKVParams:
        const void* k_src
        const void* v_src
        void* k_cache
        void* v_cache
        const int32_t* page_table
        const int32_t* seq_lens
        const int32_t* cu_q
        const uint8_t* finished
        int64_t src_stride_t[2]
        int64_t src_stride_h[2]
        int64_t cache_stride_page[2]
        int64_t cache_stride_slot[2]
        int64_t cache_stride_h[2]
        int64_t page_table_stride
        int32_t num_rows
        int32_t batch
        int32_t num_heads
        int32_t head_dim
        int32_t page_size
        int32_t num_pages
        int32_t max_pages
        int32_t vectorize

    ctypedef struct AppendKV8Params:
        AppendKVParams base
        const float* k_scale
        const float* v_scale
        float* k_params
        float* v_params
        int32_t scale_stride
        int32_t pad_

PARAM_SIZES = {"CopyParams": sizeof(CopyParams), "AppendKVParams": sizeof(AppendKVParams),
               "AppendKV8Params": sizeof(AppendKV8Params)}


def launch_copy_strided(Kernel k, unsigned int grid, unsigned int block, size_t stream,
                        uintptr_t dst, uintptr_t src, shape, dst_stride, src_stride,
                        int64_t chunk):
    """shape/strides: 4 ints each (elements, outermost first)."""
    cdef CopyParams p
    cdef int i
    p.dst = <void*>dst
    p.src = <const void*>src
    for i in range(4):
        p.shape[i] = shape[i]
        p.dst_stride[i] = dst_stride[i]
        p.src_stride[i] = src_stride[i]
    p.rows = p.shape[0] * p.shape[1] * p.shape[2]
    p.chunk = chunk
    p.chunks_per_row = (p.shape[3] + chunk - 1) // chunk
    launch(k, grid, 1, 1, block, 1, 1, 0, stream, &p)


cdef void _fill_append_kv(AppendKVParams* p, uintptr_t k_src, uintptr_t v_src, uintptr_t k_cache,
                          uintptr_t v_cache, uintptr_t page_table, uintptr_t seq_lens,
                          uintptr_t cu_q, uintptr_t finished, src_stride_t, src_stride_h,
                          cache_stride_page, cache_stride_slot, cache_stride_h,
                          int64_t page_table_stride, int num_rows, int batch, int num_heads,
                          int head_dim, int page_size, int num_pages, int max_pages,
                          bint vectorize):
    cdef int i
    p.k_src = <const void*>k_src
    p.v_src = <const void*>v_src
    p.k_cache = <void*>k_cache
    p.v_cache = <void*>v_cache
    p.page_table = <const int32_t*>page_table
    p.seq_lens = <const int32_t*>seq_lens
    p.cu_q = <const int32_t*>cu_q
    p.finished = <const uint8_t*>finished
    for i in range(2):
        p.src_stride_t[i] = src_stride_t[i]
        p.src_stride_h[i] = src_stride_h[i]
        p.cache_stride_page[i] = cache_stride_page[i]
        p.cache_stride_slot[i] = cache_stride_slot[i]
        p.cache_stride_h[i] = cache_stride_h[i]
    p.page_table_stride = page_table_stride
    p.num_rows = num_rows
    p.batch = batch
    p.num_heads = num_heads
    p.head_dim = head_dim
    p.page_size = page_size
    p.num_pages = num_pages
    p.max_pages = max_pages
    p.vectorize = vectorize


def launch_append_kv(Kernel k, unsigned int grid, unsigned int block, unsigned int rows_per_block,
                     size_t stream,
                     uintptr_t k_src, uintptr_t v_src, uintptr_t k_cache, uintptr_t v_cache,
                     uintptr_t page_table, uintptr_t seq_lens, uintptr_t cu_q, uintptr_t finished,
                     src_stride_t, src_stride_h, cache_stride_page, cache_stride_slot,
                     cache_stride_h, int64_t page_table_stride, int num_rows, int batch,
                     int num_heads, int head_dim, int page_size, int num_pages, int max_pages,
                     bint vectorize):
    cdef AppendKVParams p
    _fill_append_kv(&p, k_src, v_src, k_cache, v_cache, page_table, seq_lens, cu_q, finished,
                    src_stride_t, src_stride_h, cache_stride_page, cache_stride_slot,
                    cache_stride_h, page_table_stride, num_rows, batch, num_heads, head_dim,
                    page_size, num_pages, max_pages, vectorize)
    launch(k, grid, 1, 1, block, rows_per_block, 1, 0, stream, &p)


def launch_append_kv8(Kernel k, unsigned int grid, unsigned int block, unsigned int rows_per_block,
                      size_t stream,
                      uintptr_t k_src, uintptr_t v_src, uintptr_t k_cache, uintptr_t v_cache,
                      uintptr_t page_table, uintptr_t seq_lens, uintptr_t cu_q, uintptr_t finished,
                      src_stride_t, src_stride_h, cache_stride_page, cache_stride_slot,
                      cache_stride_h, int64_t page_table_stride, int num_rows, int batch,
                      int num_heads, int head_dim, int page_size, int num_pages, int max_pages,
                      bint vectorize, uintptr_t k_scale, uintptr_t v_scale, uintptr_t k_params,
                      uintptr_t v_params, int scale_stride):
    """append_kv's arguments (cache strides in bytes) + the 8-bit cache's scales (fp8) or
    params (int8), 0 where absent; block = 32 * warps threads per token row."""
    cdef AppendKV8Params p
    _fill_append_kv(&p.base, k_src, v_src, k_cache, v_cache, page_table, seq_lens, cu_q,
                    finished, src_stride_t, src_stride_h, cache_stride_page, cache_stride_slot,
                    cache_stride_h, page_table_stride, num_rows, batch, num_heads, head_dim,
                    page_size, num_pages, max_pages, vectorize)
    p.k_scale = <const float*>k_scale
    p.v_scale = <const float*>v_scale
    p.k_params = <float*>k_params
    p.v_params = <float*>v_params
    p.scale_stride = scale_stride
    p.pad_ = 0
    launch(k, grid, 1, 1, block, rows_per_block, 1, 0, stream, &p)
