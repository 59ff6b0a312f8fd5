# cython: language_level=3
"""Launchers of the layers family (rms_norm, rope, silu_mul, gated_rms_norm, linear,
linear_f64): pack the parameter block, launch. No validation here (specdec_lib.ops.layers
does it before calling in; for linear_f64, the orchestrator's cuda backend)."""
from libc.stdint cimport int32_t, int64_t, uintptr_t
from specdec_lib._driver cimport Kernel, launch

cdef extern from "layers/layers_params.h":
    ctypedef struct RmsNormParams:
        const void* x
        const void* residual
        void* residual_out
        const void* weight
        void* out
        int64_t x_stride
        int64_t residual_stride
        int64_t residual_out_stride
        int64_t out_stride
        int64_t rows
        int32_t width
        int32_t unit_offset
        int32_t vectorize
        float eps

    ctypedef struct RopeParams:
        void* q
        void* k
        const int32_t* positions
        const float* cos_sin_cache
        int64_t q_stride_t
        int64_t q_stride_h
        int64_t k_stride_t
        int64_t k_stride_h
        int64_t tokens
        int64_t max_position
        int32_t q_heads
        int32_t k_heads
        int32_t head_dim
        int32_t vectorize

    ctypedef struct SiluMulParams:
        const void* x
        void* out
        int64_t x_stride
        int64_t out_stride
        int64_t rows
        int32_t width
        int32_t vectorize

    ctypedef struct GatedRmsNormParams:
        const void* x
        const void* z
        const void* weight
        const void* z_bias
        void* out
        int64_t x_stride
        int64_t z_stride
        int64_t out_stride
        int64_t rows
        int32_t width
        int32_t group_size
        int32_t lanes
        int32_t weight_shared
        int32_t bias_shared
        int32_t vec_x
        int32_t vec_z
        int32_t vec_out
        int32_t vec_w
        float eps

cdef extern from "layers/linear_params.h":
    ctypedef struct LinearParams:
        const void* x
        const void* residual
        void* residual_out
        const void* norm_weight
        const void* weight
        void* out
        int64_t x_stride
        int64_t residual_stride
        int64_t residual_out_stride
        int64_t out_stride
        int64_t rows
        int32_t width
        int32_t cols
        int32_t norm_threads
        int32_t unit_offset
        int32_t silu_mul
        int32_t vec_x
        int32_t vec_w
        float eps

cdef extern from "layers/linear_f64_params.h":
    ctypedef struct LinearF64Params:
        const void* x
        const void* w
        void* y
        int64_t rows
        int64_t cols
        int64_t width

PARAM_SIZES = {"RmsNormParams": sizeof(RmsNormParams),
               "RopeParams": sizeof(RopeParams),
               "SiluMulParams": sizeof(SiluMulParams),
               "GatedRmsNormParams": sizeof(GatedRmsNormParams),
               "LinearParams": sizeof(LinearParams),
               "LinearF64Params": sizeof(LinearF64Params)}


def launch_rms_norm(Kernel k, unsigned int grid, unsigned int block, size_t stream,
                    uintptr_t x, uintptr_t residual, uintptr_t residual_out, uintptr_t weight,
                    uintptr_t out, int64_t x_stride, int64_t residual_stride,
                    int64_t residual_out_stride, int64_t out_stride, int64_t rows, int width,
                    bint unit_offset, bint vectorize, float eps):
    """One CTA per row (grid-stride over rows past ``grid``); strides in elements."""
    cdef RmsNormParams p
    p.x = <const void*>x
    p.residual = <const void*>residual
    p.residual_out = <void*>residual_out
    p.weight = <const void*>weight
    p.out = <void*>out
    p.x_stride = x_stride
    p.residual_stride = residual_stride
    p.residual_out_stride = residual_out_stride
    p.out_stride = out_stride
    p.rows = rows
    p.width = width
    p.unit_offset = unit_offset
    p.vectorize = vectorize
    p.eps = eps
    launch(k, grid, 1, 1, block, 1, 1, 0, stream, &p)


def launch_rope(Kernel k, unsigned int grid, unsigned int block, size_t stream, uintptr_t q,
                uintptr_t kk, uintptr_t positions, uintptr_t cos_sin_cache, int64_t q_stride_t,
                int64_t q_stride_h, int64_t k_stride_t, int64_t k_stride_h, int64_t tokens,
                int64_t max_position, int q_heads, int k_heads, int head_dim, bint vectorize):
    """``kk``: the k array (0 with k_heads = 0); strides in elements."""
    cdef RopeParams p
    p.q = <void*>q
    p.k = <void*>kk
    p.positions = <const int32_t*>positions
    p.cos_sin_cache = <const float*>cos_sin_cache
    p.q_stride_t = q_stride_t
    p.q_stride_h = q_stride_h
    p.k_stride_t = k_stride_t
    p.k_stride_h = k_stride_h
    p.tokens = tokens
    p.max_position = max_position
    p.q_heads = q_heads
    p.k_heads = k_heads
    p.head_dim = head_dim
    p.vectorize = vectorize
    launch(k, grid, 1, 1, block, 1, 1, 0, stream, &p)


def launch_silu_mul(Kernel k, unsigned int grid, unsigned int block, size_t stream,
                    uintptr_t x, uintptr_t out, int64_t x_stride, int64_t out_stride,
                    int64_t rows, int width, bint vectorize):
    cdef SiluMulParams p
    p.x = <const void*>x
    p.out = <void*>out
    p.x_stride = x_stride
    p.out_stride = out_stride
    p.rows = rows
    p.width = width
    p.vectorize = vectorize
    launch(k, grid, 1, 1, block, 1, 1, 0, stream, &p)


def launch_gated_rms_norm(Kernel k, unsigned int gx, unsigned int gy, unsigned int block,
                          size_t stream, uintptr_t x, uintptr_t z, uintptr_t weight,
                          uintptr_t z_bias, uintptr_t out, int64_t x_stride, int64_t z_stride,
                          int64_t out_stride, int64_t rows, int width, int group_size, int lanes,
                          bint weight_shared, bint bias_shared, bint vec_x, bint vec_z,
                          bint vec_out, bint vec_w, float eps):
    """gx CTAs over a row's groups, gy over the rows (grid-stride past gy); strides in elements."""
    cdef GatedRmsNormParams p
    p.x = <const void*>x
    p.z = <const void*>z
    p.weight = <const void*>weight
    p.z_bias = <const void*>z_bias
    p.out = <void*>out
    p.x_stride = x_stride
    p.z_stride = z_stride
    p.out_stride = out_stride
    p.rows = rows
    p.width = width
    p.group_size = group_size
    p.lanes = lanes
    p.weight_shared = weight_shared
    p.bias_shared = bias_shared
    p.vec_x = vec_x
    p.vec_z = vec_z
    p.vec_out = vec_out
    p.vec_w = vec_w
    p.eps = eps
    launch(k, gx, gy, 1, block, 1, 1, 0, stream, &p)


def launch_linear(Kernel k, unsigned int gx, unsigned int gy, unsigned int block, size_t stream,
                  uintptr_t x, uintptr_t residual, uintptr_t residual_out, uintptr_t norm_weight,
                  uintptr_t weight, uintptr_t out, int64_t x_stride, int64_t residual_stride,
                  int64_t residual_out_stride, int64_t out_stride, int64_t rows, int width,
                  int cols, int norm_threads, bint unit_offset, bint silu_mul, bint vec_x,
                  bint vec_w, float eps):
    """gx CTAs over the column groups, gy over 16-row chunks; strides in elements."""
    cdef LinearParams p
    p.x = <const void*>x
    p.residual = <const void*>residual
    p.residual_out = <void*>residual_out
    p.norm_weight = <const void*>norm_weight
    p.weight = <const void*>weight
    p.out = <void*>out
    p.x_stride = x_stride
    p.residual_stride = residual_stride
    p.residual_out_stride = residual_out_stride
    p.out_stride = out_stride
    p.rows = rows
    p.width = width
    p.cols = cols
    p.norm_threads = norm_threads
    p.unit_offset = unit_offset
    p.silu_mul = silu_mul
    p.vec_x = vec_x
    p.vec_w = vec_w
    p.eps = eps
    launch(k, gx, gy, 1, block, 1, 1, 0, stream, &p)


def launch_linear_f64(Kernel k, unsigned int gx, unsigned int gy, unsigned int block,
                      size_t stream, uintptr_t x, uintptr_t w, uintptr_t y, int64_t rows,
                      int64_t cols, int64_t width):
    """gx CTAs over the columns (8 per CTA), gy over the rows (grid-stride); contiguous."""
    cdef LinearF64Params p
    p.x = <const void*>x
    p.w = <const void*>w
    p.y = <void*>y
    p.rows = rows
    p.cols = cols
    p.width = width
    launch(k, gx, gy, 1, block, 1, 1, 0, stream, &p)
