/* Parameter block of the layers family's linear (a small-M GEMM with a fused RMSNorm prologue
 * and SwiGLU epilogue), shared by the kernel (nvcc, cuda_src/layers/linear.cu) and the Cython
 * launcher (pyx/_layers.pyx). Semantics: specdec_lib/reference/layers.py::linear. Strides are
 * in elements; every last dimension is contiguous. */
#pragma once
#include <stdint.h>

/* linear_<dtype>_w<norm weight dtype>:
 *   h   = x, or the RMSNorm of s = x (or round(x + residual), stored to residual_out) exactly
 *         as rms_norm computes it: round(s * rsqrt(mean(s^2) + eps) * (w or 1 + w))
 *   acc = h @ weight^T in float32 (fixed order over K: a row's bits depend only on that row)
 *   out = round(acc), or round(silu(acc[:, :I]) * acc[:, I:]) with silu_mul (N = 2I). */
typedef struct {
  const void* x;              /* [rows, K] */
  const void* residual;       /* [rows, K] or NULL (only with norm_weight) */
  void* residual_out;         /* [rows, K] with residual; written by the CTAs of blockIdx.x 0 */
  const void* norm_weight;    /* [K] or NULL: no norm prologue */
  const void* weight;         /* [N, K], contiguous */
  void* out;                  /* [rows, N], or [rows, N / 2] with silu_mul */
  int64_t x_stride;
  int64_t residual_stride;
  int64_t residual_out_stride;
  int64_t out_stride;
  int64_t rows;
  int32_t width;              /* K */
  int32_t cols;               /* N (weight rows) */
  int32_t norm_threads;       /* the blockDim rms_norm uses for this K: fixes the sum order */
  int32_t unit_offset;        /* 1: the norm scales by (1 + norm_weight) */
  int32_t silu_mul;           /* 1: the SwiGLU epilogue */
  int32_t vec_x;              /* 1: 16-byte accesses valid for x, residual(_out), norm_weight */
  int32_t vec_w;              /* 1: 16-byte accesses valid for every weight row */
  float eps;
} LinearParams;
