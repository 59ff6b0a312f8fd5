# cython: language_level=3
"""Launchers of the conv family (conv1d_verify, conv1d_commit): pack the parameter
block, launch. No validation here (specdec_lib.ops.conv does it before calling in)."""
from libc.stdint cimport int32_t, int64_t, uintptr_t
from specdec_lib._driver cimport Kernel, launch

cdef extern from "conv/conv_params.h":
    ctypedef struct ConvVerifyParams:
        const void* x
        const void* weight
        const void* bias
        void* conv_state
        const int32_t* slot_ids
        const int32_t* cu_q
        void* out
        void* journal
        int32_t* status
        const void* pending
        const int32_t* pending_row0
        const int32_t* pending_len
        int64_t pending_stride_t
        int64_t x_stride_t
        int64_t out_stride_t
        int64_t journal_stride_t
        int64_t weight_stride_c
        int64_t state_stride_slot
        int64_t state_stride_c
        int32_t num_rows
        int32_t batch
        int32_t dim
        int32_t width
        int32_t num_slots
        int32_t silu
        int32_t x_dtype
        int32_t weight_dtype
        int32_t bias_dtype
        int32_t state_dtype
        int32_t out_dtype
        int32_t journal_dtype
        int32_t pending_rows
        int32_t pending_dtype

    ctypedef struct ConvCommitParams:
        void* conv_state
        const int32_t* slot_ids
        const int32_t* cu_q
        const int32_t* row0
        const int32_t* accept_len
        const void* journal
        int32_t* status
        int64_t journal_stride_t
        int64_t state_stride_slot
        int64_t state_stride_c
        int32_t num_rows
        int32_t batch
        int32_t dim
        int32_t width
        int32_t num_slots
        int32_t journal_dtype
        int32_t state_dtype
        int32_t pad_

PARAM_SIZES = {"ConvVerifyParams": sizeof(ConvVerifyParams),
               "ConvCommitParams": sizeof(ConvCommitParams)}


def launch_conv1d_verify(Kernel kern, unsigned int grid_x, unsigned int grid_y, unsigned int block,
                         size_t stream, uintptr_t x, uintptr_t weight, uintptr_t bias,
                         uintptr_t conv_state, uintptr_t slot_ids, uintptr_t cu_q, uintptr_t out,
                         uintptr_t journal, uintptr_t status, int64_t x_stride_t,
                         int64_t out_stride_t, int64_t journal_stride_t, int64_t weight_stride_c,
                         int64_t state_stride_slot, int64_t state_stride_c, int num_rows,
                         int batch, int dim, int width, int num_slots, bint silu, dtypes,
                         unsigned int grid_z=1, pending=None):
    """dtypes: codes of (x, weight, bias, state, out, journal); grid_z: the W = 4 kernels' row
    lanes (1 for the generic conv1d_verify); pending: the fused mode's (rows, row0, len,
    row stride, number of rows, dtype code) or None."""
    cdef ConvVerifyParams p
    p.x = <const void*>x
    p.weight = <const void*>weight
    p.bias = <const void*>bias
    p.conv_state = <void*>conv_state
    p.slot_ids = <const int32_t*>slot_ids
    p.cu_q = <const int32_t*>cu_q
    p.out = <void*>out
    p.journal = <void*>journal
    p.status = <int32_t*>status
    p.pending = NULL
    p.pending_row0 = NULL
    p.pending_len = NULL
    p.pending_stride_t = p.pending_rows = p.pending_dtype = 0
    if pending is not None:
        p.pending = <const void*><uintptr_t>pending[0]
        p.pending_row0 = <const int32_t*><uintptr_t>pending[1]
        p.pending_len = <const int32_t*><uintptr_t>pending[2]
        p.pending_stride_t, p.pending_rows, p.pending_dtype = pending[3], pending[4], pending[5]
    p.x_stride_t = x_stride_t
    p.out_stride_t = out_stride_t
    p.journal_stride_t = journal_stride_t
    p.weight_stride_c = weight_stride_c
    p.state_stride_slot = state_stride_slot
    p.state_stride_c = state_stride_c
    p.num_rows = num_rows
    p.batch = batch
    p.dim = dim
    p.width = width
    p.num_slots = num_slots
    p.silu = silu
    p.x_dtype, p.weight_dtype, p.bias_dtype = dtypes[0], dtypes[1], dtypes[2]
    p.state_dtype, p.out_dtype, p.journal_dtype = dtypes[3], dtypes[4], dtypes[5]
    launch(kern, grid_x, grid_y, grid_z, block, 1, 1, 0, stream, &p)


def launch_conv1d_commit(Kernel kern, unsigned int grid_x, unsigned int grid_y, unsigned int block,
                         size_t stream, uintptr_t conv_state, uintptr_t slot_ids, uintptr_t cu_q,
                         uintptr_t accept_len, uintptr_t journal, uintptr_t status,
                         int64_t journal_stride_t, int64_t state_stride_slot,
                         int64_t state_stride_c, int num_rows, int batch, int dim, int width,
                         int num_slots, int journal_dtype, int state_dtype, uintptr_t row0=0):
    """row0 (with cu_q 0): conv1d_flush, sequence b's rows start at row0[b]."""
    cdef ConvCommitParams p
    p.conv_state = <void*>conv_state
    p.slot_ids = <const int32_t*>slot_ids
    p.cu_q = <const int32_t*>cu_q
    p.row0 = <const int32_t*>row0
    p.accept_len = <const int32_t*>accept_len
    p.journal = <const void*>journal
    p.status = <int32_t*>status
    p.journal_stride_t = journal_stride_t
    p.state_stride_slot = state_stride_slot
    p.state_stride_c = state_stride_c
    p.num_rows = num_rows
    p.batch = batch
    p.dim = dim
    p.width = width
    p.num_slots = num_slots
    p.journal_dtype = journal_dtype
    p.state_dtype = state_dtype
    p.pad_ = 0
    launch(kern, grid_x, grid_y, 1, block, 1, 1, 0, stream, &p)
