// layers family: linear_f64, y [M, N] = x [M, K] @ w [N, K]^T in float64, the dense math of
// the host models (tiny_hybrid, the float64 Llama) on the orchestrator's cuda backend. It is
// a plain kernel rather than a cuBLAS call because cupy refuses cuBLAS while a stream is
// being captured, and the round (host model math included) must become one CUDA graph.
//
// One warp per output (m, n), 8 warps per CTA over n (gridDim.x), rows over gridDim.y (a
// grid-stride loop past 65535 rows). Lane l accumulates k = l, l + 32, ... with fma in that
// order (coalesced reads of the x and w rows), then a fixed xor butterfly (16, 8, 4, 2, 1)
// adds the 32 partials: every output is one fixed sequence of float64 operations set by K
// alone, the same bits every run, eagerly and in every graph replay. (The kernel the
// backend compiled through cupy before had exactly this order: same bits.) Not tuned: the
// host models it serves are test and demo models.
#include "layers/linear_f64_params.h"
#include "common/pdl.cuh"

namespace {

constexpr int kWarps = 8;                   // blockDim = 256: the launcher's only choice

}  // namespace

extern "C" __global__ void __launch_bounds__(32 * kWarps) linear_f64(const LinearF64Params p) {
  specdec::pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= p.cols) return;                  // whole warps leave: the shuffles stay full
  const int64_t K = p.width;
  const double* x = static_cast<const double*>(p.x);
  const double* wr = static_cast<const double*>(p.w) + n * K;
  double* y = static_cast<double*>(p.y);
  for (int64_t m = blockIdx.y; m < p.rows; m += gridDim.y) {
    const double* xr = x + m * K;
    double acc = 0.0;
    for (int64_t k = lane; k < K; k += 32) acc = fma(__ldg(xr + k), __ldg(wr + k), acc);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
    if (lane == 0) y[m * p.cols + n] = acc;
  }
}
