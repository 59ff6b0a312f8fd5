/* Parameter blocks of the attention family, shared by the kernels (nvcc) and the Cython
 * launcher: one struct per kernel, passed by value as the only argument. Strides are in
 * elements and 64-bit; every tensor's last (head-dim) axis is contiguous. */
#pragma once
#include <stdint.h>

/* Tiling constants the host must agree with (specdec_lib/ops/attention.py mirrors them and
 * the kernel re-checks the dynamic shared-memory size it was given):
 *   keys per KV tile  = 64 for D <= 128, 32 for D = 256
 *   pipeline stages   = 3 on compute_80/90 (cp.async), 1 on compute_75
 *   dynamic smem      = max(stages * 2 * tile * D * 2, VERIFY_ATTN_EPILOGUE_SMEM) bytes
 *   static smem       = stages * tile * 4 (page-id ring) + 16 <= 1 KiB
 *   grids             = attention (Hkv * m-groups, B, num_splits); merge (Hq, B, max_q) */
#define VERIFY_ATTN_THREADS 128
#define VERIFY_ATTN_MAX_Q 16
#define VERIFY_ATTN_EPILOGUE_SMEM (4 * 16 * 72 * 4 + 2 * 4 * 16 * 4)
/* verify_attention_cluster_* (sm_90): page-table entries of the sequence staged in shared
 * memory (more are read from global). Dynamic smem = max(ring, all-columns epilogue)
 * + receive buffer + 4 * this (specdec_lib/ops/attention.py::cluster_smem_bytes). */
#define VERIFY_ATTN_CLUSTER_PT_STAGE 1024

typedef struct {
  const void* q;               /* [T, Hq, D] f16/bf16 */
  const void* k_cache;         /* [num_pages, page_size, Hkv, D] */
  const void* v_cache;         /* [num_pages, page_size, Hkv, D] */
  const int32_t* page_table;   /* [B, max_pages] */
  const int32_t* seq_lens;     /* [B] committed length L */
  const int32_t* cu_q;         /* [B+1] block row offsets */
  void* out;                   /* [T, Hq, D], same dtype as q */
  float* lse_out;              /* [T, Hq] natural-log LSE, or NULL */
  float* partial_o;            /* [num_splits, T, Hq, D] normalised per-split output (num_splits > 1) */
  float* partial_lse;          /* [num_splits, T, Hq] per-split LSE, log2 domain */
  int64_t q_stride_t, q_stride_h;
  int64_t k_stride_page, k_stride_slot, k_stride_h;
  int64_t v_stride_page, v_stride_slot, v_stride_h;
  int64_t out_stride_t, out_stride_h;
  int64_t lse_stride_t, lse_stride_h;
  int64_t page_table_stride;   /* elements between rows of page_table */
  float scale_log2;            /* softmax scale * log2(e) */
  int32_t num_tokens;          /* T */
  int32_t batch;               /* B */
  int32_t num_qo_heads;        /* Hq */
  int32_t num_kv_heads;        /* Hkv */
  int32_t group;               /* Hq / Hkv */
  int32_t page_size_log2;
  int32_t num_pages;
  int32_t max_pages;           /* columns of page_table */
  int32_t max_q;               /* block rows per sequence the grid covers (<= 16) */
  int32_t warps_m;             /* 1, 2 or 4 m-tiles (16 packed rows each) per CTA */
  int32_t num_splits;          /* gridDim.z: KV splits */
  int32_t kv_chunk;            /* keys per split (multiple of the KV tile) */
} VerifyAttentionParams;

typedef struct {
  const float* partial_o;      /* [num_splits, T, Hq, D] */
  const float* partial_lse;    /* [num_splits, T, Hq] log2 domain */
  void* out;                   /* [T, Hq, D] */
  float* lse_out;              /* [T, Hq] or NULL */
  const int32_t* seq_lens;     /* [B] */
  const int32_t* cu_q;         /* [B+1] */
  int64_t out_stride_t, out_stride_h;
  int64_t lse_stride_t, lse_stride_h;
  int32_t num_tokens;
  int32_t batch;
  int32_t num_qo_heads;
  int32_t head_dim;
  int32_t max_q;
  int32_t num_splits;
  int32_t kv_chunk;
  int32_t pad_;
} VerifyAttentionMergeParams;

/* rope_append_kv_<dtype>: rope(q, k, positions, cos_sin_cache) then append_kv(k, v, ...) in one
 * launch (specdec_lib/reference/attention.py::rope_append_kv). q and k are rotated in place
 * (every row, as rope does); the rotated k row and the v row go to position
 * L[b] + (t - cu_q[b]) of sequence b unless b is finished or the target lies outside the
 * page table or the pool (as append_kv does). */
typedef struct {
  void* q;                     /* [T, Hq, D], rotated in place */
  void* k;                     /* [T, Hkv, D], rotated in place, then appended */
  const void* v;               /* [T, Hkv, D] */
  void* k_cache;               /* [num_pages, page_size, Hkv, D], k's dtype */
  void* v_cache;
  const int32_t* positions;    /* [T] rope positions */
  const float* cos_sin_cache;  /* [max_position, D], contiguous */
  const int32_t* page_table;   /* [B, max_pages] */
  const int32_t* seq_lens;     /* [B] committed length L */
  const int32_t* cu_q;         /* [B+1] block row offsets */
  const uint8_t* finished;     /* [B] or NULL: rows of finished sequences are not appended */
  int64_t q_stride_t, q_stride_h;
  int64_t k_stride_t, k_stride_h;
  int64_t v_stride_t, v_stride_h;
  int64_t k_cache_stride_page, k_cache_stride_slot, k_cache_stride_h;
  int64_t v_cache_stride_page, v_cache_stride_slot, v_cache_stride_h;
  int64_t page_table_stride;   /* elements between rows of page_table */
  int64_t max_position;        /* rows of cos_sin_cache */
  int32_t num_rows;            /* T */
  int32_t batch;               /* B */
  int32_t q_heads;             /* Hq */
  int32_t kv_heads;            /* Hkv */
  int32_t head_dim;            /* D: even, <= 256 */
  int32_t page_size;
  int32_t num_pages;
  int32_t max_pages;           /* columns of page_table */
  int32_t vectorize;           /* 1: 16-byte accesses of every tensor row are valid (Python checks) */
  int32_t pad_;
} RopeAppendKVParams;

/* verify_attention_kv8_d<D>_<q dtype>_<fmt>: verify_attention over an 8-bit cache
 * (issue 32; specdec_lib/reference/kvquant.py). base: verify_attention's block with the
 * caches' strides in bytes (= elements). fp8: k_scale / v_scale [Hkv] or [1] (scale_stride
 * 1 / 0), folded into the score scale and the output; int8: k_params / v_params
 * [num_pages, page_size, Hkv, 2] contiguous (scale, zero) per (token, head).
 * Dynamic smem: stages * 2 * tile * D (8-bit ring) + stages * 2 * tile * 8 (int8 only: the
 * params ring) + warps_m * 16 * D * 2 (D = 128, compute_80/90 only: Q in shared memory; int8
 * there runs two stages, fp8 three),
 * at least VERIFY_ATTN_EPILOGUE_SMEM (the tiles are dequantised in registers). */
typedef struct {
  VerifyAttentionParams base;
  const float* k_scale;
  const float* v_scale;
  const float* k_params;
  const float* v_params;
  int32_t scale_stride;
  int32_t pad_;
} VerifyAttentionKV8Params;
