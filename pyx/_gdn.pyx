# cython: language_level=3
"""Launchers of the gdn family (gdn_verify, gdn_commit): pack the parameter block,
launch. No validation here (specdec_lib.ops.gdn does it before calling in)."""
from libc.stdint cimport int32_t, int64_t, uintptr_t
from specdec_lib._driver cimport Kernel, launch

cdef extern from "gdn/gdn_params.h":
    ctypedef struct GdnVerifyParams:
        const void* q
        const void* k
        const void* v
        const void* gate0
        const void* gate1
        const void* A_log
        const void* dt_bias
        const void* state
        const int32_t* slot_ids
        const int32_t* cu_q
        void* out
        float* journal
        int32_t* status
        int64_t q_stride_t
        int64_t q_stride_h
        int64_t k_stride_t
        int64_t k_stride_h
        int64_t v_stride_t
        int64_t v_stride_h
        int64_t out_stride_t
        int64_t out_stride_h
        int64_t gate_stride_t[2]
        int64_t state_stride_slot
        int64_t journal_stride_t
        int32_t num_rows
        int32_t batch
        int32_t num_k_heads
        int32_t num_v_heads
        int32_t head_v_dim
        int32_t num_slots
        int32_t num_slices
        int32_t qk_l2norm
        int32_t fused_gating
        int32_t qkv_dtype
        int32_t out_dtype
        int32_t gate_dtype[4]
        float scale
        const float* pending_journal
        const int32_t* pending_row0
        const int32_t* pending_len
        int64_t pending_journal_stride_t
        int32_t pending_num_rows
        int32_t prefetch_ahead

    ctypedef struct GdnCommitParams:
        void* state
        const int32_t* slot_ids
        const int32_t* cu_q
        const int32_t* accept_len
        const float* journal
        int32_t* status
        int64_t state_stride_slot
        int64_t journal_stride_t
        int32_t num_rows
        int32_t batch
        int32_t num_k_heads
        int32_t num_v_heads
        int32_t head_v_dim
        int32_t num_slots
        int32_t num_slices
        int32_t prefetch_ahead

PARAM_SIZES = {"GdnVerifyParams": sizeof(GdnVerifyParams),
               "GdnCommitParams": sizeof(GdnCommitParams)}


def launch_gdn_verify(Kernel kern, unsigned int grid, unsigned int block, size_t stream,
                      uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t gate0, uintptr_t gate1,
                      uintptr_t A_log, uintptr_t dt_bias, uintptr_t state, uintptr_t slot_ids,
                      uintptr_t cu_q, uintptr_t out, uintptr_t journal, uintptr_t status,
                      strides, gate_strides, int64_t state_stride_slot, int64_t journal_stride_t,
                      int num_rows, int batch, int num_k_heads, int num_v_heads, int head_v_dim,
                      int num_slots, int num_slices, bint qk_l2norm, bint fused_gating,
                      int qkv_dtype, int out_dtype, gate_dtypes, float scale,
                      uintptr_t pending_journal=0, uintptr_t pending_row0=0,
                      uintptr_t pending_len=0, int64_t pending_journal_stride_t=0,
                      int pending_num_rows=0, int prefetch_ahead=0):
    """strides: (q_t, q_h, k_t, k_h, v_t, v_h, out_t, out_h) in elements. pending_*: the
    gdn_verify_fused kernels' previous-round rows (0 for gdn_verify)."""
    cdef GdnVerifyParams p
    cdef int i
    p.q = <const void*>q
    p.k = <const void*>k
    p.v = <const void*>v
    p.gate0 = <const void*>gate0
    p.gate1 = <const void*>gate1
    p.A_log = <const void*>A_log
    p.dt_bias = <const void*>dt_bias
    p.state = <const void*>state
    p.slot_ids = <const int32_t*>slot_ids
    p.cu_q = <const int32_t*>cu_q
    p.out = <void*>out
    p.journal = <float*>journal
    p.status = <int32_t*>status
    p.q_stride_t, p.q_stride_h = strides[0], strides[1]
    p.k_stride_t, p.k_stride_h = strides[2], strides[3]
    p.v_stride_t, p.v_stride_h = strides[4], strides[5]
    p.out_stride_t, p.out_stride_h = strides[6], strides[7]
    p.gate_stride_t[0] = gate_strides[0]
    p.gate_stride_t[1] = gate_strides[1]
    p.state_stride_slot = state_stride_slot
    p.journal_stride_t = journal_stride_t
    p.num_rows = num_rows
    p.batch = batch
    p.num_k_heads = num_k_heads
    p.num_v_heads = num_v_heads
    p.head_v_dim = head_v_dim
    p.num_slots = num_slots
    p.num_slices = num_slices
    p.qk_l2norm = qk_l2norm
    p.fused_gating = fused_gating
    p.qkv_dtype = qkv_dtype
    p.out_dtype = out_dtype
    for i in range(4):
        p.gate_dtype[i] = gate_dtypes[i]
    p.scale = scale
    p.pending_journal = <const float*>pending_journal
    p.pending_row0 = <const int32_t*>pending_row0
    p.pending_len = <const int32_t*>pending_len
    p.pending_journal_stride_t = pending_journal_stride_t
    p.pending_num_rows = pending_num_rows
    p.prefetch_ahead = prefetch_ahead
    launch(kern, grid, 1, 1, block, 1, 1, 0, stream, &p)


def launch_gdn_commit(Kernel kern, unsigned int grid, unsigned int block, size_t stream,
                      uintptr_t state, uintptr_t slot_ids, uintptr_t cu_q, uintptr_t accept_len,
                      uintptr_t journal, uintptr_t status, int64_t state_stride_slot,
                      int64_t journal_stride_t, int num_rows, int batch, int num_k_heads,
                      int num_v_heads, int head_v_dim, int num_slots, int num_slices,
                      int prefetch_ahead=0):
    cdef GdnCommitParams p
    p.state = <void*>state
    p.slot_ids = <const int32_t*>slot_ids
    p.cu_q = <const int32_t*>cu_q
    p.accept_len = <const int32_t*>accept_len
    p.journal = <const float*>journal
    p.status = <int32_t*>status
    p.state_stride_slot = state_stride_slot
    p.journal_stride_t = journal_stride_t
    p.num_rows = num_rows
    p.batch = batch
    p.num_k_heads = num_k_heads
    p.num_v_heads = num_v_heads
    p.head_v_dim = head_v_dim
    p.num_slots = num_slots
    p.num_slices = num_slices
    p.prefetch_ahead = prefetch_ahead
    launch(kern, grid, 1, 1, block, 1, 1, 0, stream, &p)
