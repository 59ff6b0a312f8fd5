/* Parameter block of linear_f64, the float64 GEMM of the host models on the orchestrator's
 * cuda backend, shared by the kernel (nvcc, cuda_src/layers/linear_f64.cu) and the Cython
 * launcher (pyx/_layers.pyx). Every array is contiguous. */
#pragma once
#include <stdint.h>

/* linear_f64: y = x @ w^T in float64, each element in one fixed order over K. */
typedef struct {
  const void* x;              /* [rows, K] float64 */
  const void* w;              /* [cols, K] float64 (nn.Linear layout) */
  void* y;                    /* [rows, cols] float64 */
  int64_t rows;               /* M */
  int64_t cols;               /* N */
  int64_t width;              /* K */
} LinearF64Params;
