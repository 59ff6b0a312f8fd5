/* Parameter blocks of the copy family, shared by the kernels (nvcc) and the
 * Cython launcher: one struct per kernel, passed by value as the only argument.
 * Strides and sizes are in elements and 64-bit so > 2^31-element tensors work. */
#pragma once
#include <stdint.h>

#define SPECDEC_COPY_MAX_DIMS 4

typedef struct {
  void* dst;
  const void* src;
  int64_t shape[SPECDEC_COPY_MAX_DIMS];       /* outermost first; unused dims = 1 */
  int64_t dst_stride[SPECDEC_COPY_MAX_DIMS];
  int64_t src_stride[SPECDEC_COPY_MAX_DIMS];  /* 0 = broadcast along that dim */
  int64_t rows;                               /* prod(shape[0..2]) */
  int64_t chunks_per_row;                     /* ceil(shape[3] / chunk) */
  int64_t chunk;                              /* elements per work unit, multiple of 16 bytes */
} CopyParams;

typedef struct {
  const void* k_src;          /* [T, Hkv, D], D contiguous */
  const void* v_src;
  void* k_cache;              /* [num_pages, page_size, Hkv, D], D contiguous */
  void* v_cache;
  const int32_t* page_table;  /* [B, max_pages] */
  const int32_t* seq_lens;    /* [B] committed length L */
  const int32_t* cu_q;        /* [B+1] row offsets of each sequence's block */
  const uint8_t* finished;    /* [B] or NULL: rows of finished sequences are skipped */
  int64_t src_stride_t[2];    /* k, v: stride of T (elements) */
  int64_t src_stride_h[2];    /* k, v: stride of Hkv */
  int64_t cache_stride_page[2];
  int64_t cache_stride_slot[2];
  int64_t cache_stride_h[2];
  int64_t page_table_stride;  /* elements between rows of page_table */
  int32_t num_rows;           /* T */
  int32_t batch;              /* B */
  int32_t num_heads;          /* Hkv */
  int32_t head_dim;           /* D */
  int32_t page_size;
  int32_t num_pages;
  int32_t max_pages;          /* columns of page_table */
  int32_t vectorize;          /* 1: every row start is 16-byte aligned (Python checks) */
} AppendKVParams;

/* append_kv8_<fmt>_<src dtype>: append_kv into an 8-bit cache, quantising on write
 * (specdec_lib/reference/kvquant.py). base: append_kv's block, its cache strides in bytes
 * (= elements of the 8-bit caches), its source strides in source elements. */
typedef struct {
  AppendKVParams base;
  const float* k_scale;       /* fp8: [Hkv] or [1] (scale_stride 1 / 0) */
  const float* v_scale;
  float* k_params;            /* int8: [num_pages, page_size, Hkv, 2] contiguous */
  float* v_params;
  int32_t scale_stride;
  int32_t pad_;
} AppendKV8Params;
