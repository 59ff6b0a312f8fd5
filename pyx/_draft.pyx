# cython: language_level=3
"""Launchers of the draft family: pack the parameter block, launch. No validation here
(specdec_lib.ops.draft does it before calling in)."""
from libc.stdint cimport int32_t, int64_t, uintptr_t
from specdec_lib._driver cimport Kernel, launch

cdef extern from "draft/draft_params.h":
    ctypedef struct DraftCarryParams:
        const void* hidden
        const int32_t* cu_q
        const int32_t* accept_len
        void* out
        int64_t hidden_stride
        int64_t out_stride
        int64_t row_begin
        int64_t num_rows
        int64_t col_begin
        int64_t hidden_units
        int64_t out_units
        int32_t batch
        int32_t pad_

    ctypedef struct CaptureHiddenParams:
        const void* hidden
        const void* residual
        void* out
        int64_t hidden_stride
        int64_t residual_stride
        int64_t out_stride
        int64_t rows
        int32_t width
        int32_t vectorize

    ctypedef struct DraftCombineParams:
        const void* embed
        const void* hidden
        const void* embed_weight
        const void* hidden_weight
        const void* token_ids
        void* out
        int64_t embed_stride
        int64_t hidden_stride
        int64_t out_stride
        int64_t rows
        int64_t vocab
        int32_t width
        int32_t ids_64
        int32_t unit_offset
        int32_t vectorize
        float eps
        int32_t pad_

    ctypedef struct DraftMapTokensParams:
        const void* draft_ids
        const void* d2t
        int32_t* out
        int64_t count
        int64_t vocab
        int32_t ids_64
        int32_t d2t_64
        int32_t offsets
        int32_t pad_

    ctypedef struct NgramProposeParams:
        const int32_t* prompt
        const int32_t* prompt_lens
        const int32_t* output
        const int32_t* output_lens
        int32_t* draft_tokens
        int32_t* num_draft
        int64_t prompt_stride
        int64_t output_stride
        int64_t draft_stride
        int32_t batch
        int32_t prompt_cap
        int32_t output_cap
        int32_t num_slots
        int32_t min_n
        int32_t max_n
        int32_t vec_prompt
        int32_t vec_output

PARAM_SIZES = {"DraftCarryParams": sizeof(DraftCarryParams),
               "CaptureHiddenParams": sizeof(CaptureHiddenParams),
               "DraftCombineParams": sizeof(DraftCombineParams),
               "DraftMapTokensParams": sizeof(DraftMapTokensParams),
               "NgramProposeParams": sizeof(NgramProposeParams)}


def launch_draft_carry(Kernel k, unsigned int gx, unsigned int gy, unsigned int block,
                       size_t stream, uintptr_t hidden, uintptr_t cu_q, uintptr_t accept_len,
                       uintptr_t out, int64_t hidden_stride, int64_t out_stride,
                       int64_t row_begin, int64_t num_rows, int64_t col_begin,
                       int64_t hidden_units, int64_t out_units, int batch):
    """Strides in bytes; col_begin / *_units in the kernel's unit size."""
    cdef DraftCarryParams p
    p.hidden = <const void*>hidden
    p.cu_q = <const int32_t*>cu_q
    p.accept_len = <const int32_t*>accept_len
    p.out = <void*>out
    p.hidden_stride = hidden_stride
    p.out_stride = out_stride
    p.row_begin = row_begin
    p.num_rows = num_rows
    p.col_begin = col_begin
    p.hidden_units = hidden_units
    p.out_units = out_units
    p.batch = batch
    p.pad_ = 0
    launch(k, gx, gy, 1, block, 1, 1, 0, stream, &p)


def launch_capture_hidden(Kernel k, unsigned int gx, unsigned int gy, unsigned int block,
                          size_t stream, uintptr_t hidden, uintptr_t residual, uintptr_t out,
                          int64_t hidden_stride, int64_t residual_stride, int64_t out_stride,
                          int64_t rows, int width, bint vectorize):
    cdef CaptureHiddenParams p
    p.hidden = <const void*>hidden
    p.residual = <const void*>residual
    p.out = <void*>out
    p.hidden_stride = hidden_stride
    p.residual_stride = residual_stride
    p.out_stride = out_stride
    p.rows = rows
    p.width = width
    p.vectorize = vectorize
    launch(k, gx, gy, 1, block, 1, 1, 0, stream, &p)


def launch_draft_combine(Kernel k, unsigned int gx, unsigned int block, size_t stream,
                         uintptr_t embed, uintptr_t hidden, uintptr_t embed_weight,
                         uintptr_t hidden_weight, uintptr_t token_ids, uintptr_t out,
                         int64_t embed_stride, int64_t hidden_stride, int64_t out_stride,
                         int64_t rows, int64_t vocab, int width, bint ids_64, bint unit_offset,
                         bint vectorize, float eps):
    """Grid (gx, 2): one CTA per row and half (embedding, hidden)."""
    cdef DraftCombineParams p
    p.embed = <const void*>embed
    p.hidden = <const void*>hidden
    p.embed_weight = <const void*>embed_weight
    p.hidden_weight = <const void*>hidden_weight
    p.token_ids = <const void*>token_ids
    p.out = <void*>out
    p.embed_stride = embed_stride
    p.hidden_stride = hidden_stride
    p.out_stride = out_stride
    p.rows = rows
    p.vocab = vocab
    p.width = width
    p.ids_64 = ids_64
    p.unit_offset = unit_offset
    p.vectorize = vectorize
    p.eps = eps
    p.pad_ = 0
    launch(k, gx, 2, 1, block, 1, 1, 0, stream, &p)


def launch_draft_map_tokens(Kernel k, unsigned int grid, unsigned int block, size_t stream,
                            uintptr_t draft_ids, uintptr_t d2t, uintptr_t out, int64_t count,
                            int64_t vocab, bint ids_64, bint d2t_64, bint offsets):
    cdef DraftMapTokensParams p
    p.draft_ids = <const void*>draft_ids
    p.d2t = <const void*>d2t
    p.out = <int32_t*>out
    p.count = count
    p.vocab = vocab
    p.ids_64 = ids_64
    p.d2t_64 = d2t_64
    p.offsets = offsets
    p.pad_ = 0
    launch(k, grid, 1, 1, block, 1, 1, 0, stream, &p)


def launch_ngram_propose(Kernel k, unsigned int grid, unsigned int block, size_t stream,
                         uintptr_t prompt, uintptr_t prompt_lens, uintptr_t output,
                         uintptr_t output_lens, uintptr_t draft_tokens, uintptr_t num_draft,
                         int64_t prompt_stride, int64_t output_stride, int64_t draft_stride,
                         int batch, int prompt_cap, int output_cap, int num_slots, int min_n,
                         int max_n, bint vec_prompt, bint vec_output):
    """Strides in elements; one CTA of exactly ``block`` (the kernel's kThreads) per sequence."""
    cdef NgramProposeParams p
    p.prompt = <const int32_t*>prompt
    p.prompt_lens = <const int32_t*>prompt_lens
    p.output = <const int32_t*>output
    p.output_lens = <const int32_t*>output_lens
    p.draft_tokens = <int32_t*>draft_tokens
    p.num_draft = <int32_t*>num_draft
    p.prompt_stride = prompt_stride
    p.output_stride = output_stride
    p.draft_stride = draft_stride
    p.batch = batch
    p.prompt_cap = prompt_cap
    p.output_cap = output_cap
    p.num_slots = num_slots
    p.min_n = min_n
    p.max_n = max_n
    p.vec_prompt = vec_prompt
    p.vec_output = vec_output
    launch(k, grid, 1, 1, block, 1, 1, 0, stream, &p)
