/* Parameter blocks of the layers family (rms_norm, rope, silu_mul, gated_rms_norm), shared by
 * the kernels (nvcc) and the Cython launcher (pyx/_layers.pyx). Semantics:
 * specdec_lib/reference/layers.py.
 * Strides are in elements; every last dimension is contiguous. */
#pragma once
#include <stdint.h>

/* rms_norm_<dtype>_w<weight dtype>: s = x (or round(x + residual), stored to residual_out);
 * out = round(s * rsqrt(mean(s^2) + eps) * (weight or 1 + weight)). One CTA per row. */
typedef struct {
  const void* x;              /* [rows, H] */
  const void* residual;       /* [rows, H] or NULL */
  void* residual_out;         /* [rows, H] (may be residual) when residual != NULL */
  const void* weight;         /* [H] */
  void* out;                  /* [rows, H] (may be x) */
  int64_t x_stride;
  int64_t residual_stride;
  int64_t residual_out_stride;
  int64_t out_stride;
  int64_t rows;
  int32_t width;              /* H */
  int32_t unit_offset;        /* 1: scale by (1 + weight) */
  int32_t vectorize;          /* 1: 16-byte accesses are valid for every row and the weight */
  float eps;
} RmsNormParams;

/* rope_<dtype>: in place, rotate-half (NeoX): for i < D/2, with c, s = cache[pos, i],
 * cache[pos, D/2 + i]: x[i] <- x[i] c - x[i + D/2] s, x[i + D/2] <- x[i + D/2] c + x[i] s.
 * pos outside [0, max_position): the token's q and k heads become NaN. */
typedef struct {
  void* q;                    /* [tokens, q_heads, D] */
  void* k;                    /* [tokens, k_heads, D] or NULL (k_heads = 0) */
  const int32_t* positions;   /* [tokens] */
  const float* cos_sin_cache; /* [max_position, D], contiguous */
  int64_t q_stride_t;         /* between tokens */
  int64_t q_stride_h;         /* between heads */
  int64_t k_stride_t;
  int64_t k_stride_h;
  int64_t tokens;
  int64_t max_position;
  int32_t q_heads;
  int32_t k_heads;
  int32_t head_dim;           /* D: even, <= 256 */
  int32_t vectorize;          /* 1: 16-byte accesses of q, k and the cache are valid */
} RopeParams;

/* silu_mul_<dtype>: out[r, j] = silu(x[r, j]) * x[r, I + j], j < I. */
typedef struct {
  const void* x;              /* [rows, 2I] */
  void* out;                  /* [rows, I] */
  int64_t x_stride;
  int64_t out_stride;
  int64_t rows;
  int32_t width;              /* I */
  int32_t vectorize;          /* 1: 16-byte accesses are valid for every row */
} SiluMulParams;

/* gated_rms_norm_<out>_x<x>_w<weight>: per row and group j of G channels,
 * out = round(x * rsqrt(mean_group(x^2) + eps) * w * silu(z + z_bias)), w / z_bias indexed by
 * the channel c ([C]) or by c % G ([G]: shared by every group); z_bias NULL: 0. */
typedef struct {
  const void* x;              /* [rows, C] */
  const void* z;              /* [rows, C], out's dtype */
  const void* weight;         /* [C] or [G] */
  const void* z_bias;         /* [C] or [G] (weight's dtype), or NULL */
  void* out;                  /* [rows, C] (may be x when their dtypes and strides agree) */
  int64_t x_stride;
  int64_t z_stride;
  int64_t out_stride;
  int64_t rows;
  int32_t width;              /* C */
  int32_t group_size;         /* G: divides C */
  int32_t lanes;              /* lanes a group: a power of two <= 32 */
  int32_t weight_shared;      /* 1: weight is [G] */
  int32_t bias_shared;        /* 1: z_bias is [G] */
  int32_t vec_x;              /* 1: x's 4-element units are single accesses (G % 4 == 0) */
  int32_t vec_z;              /* ... z's */
  int32_t vec_out;            /* ... out's */
  int32_t vec_w;              /* ... weight's and z_bias's */
  float eps;
} GatedRmsNormParams;
