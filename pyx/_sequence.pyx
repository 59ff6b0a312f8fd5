# cython: language_level=3
"""Launchers of the sequence family: pack the parameter block, launch. No validation here
(specdec_lib.ops.sequence does it before calling in)."""
from libc.stdint cimport int32_t, uint8_t, uintptr_t
from specdec_lib._driver cimport Kernel, launch

cdef extern from "sequence/sequence_params.h":
    ctypedef struct SeqStopParams:
        const int32_t* emitted
        const int32_t* num_accepted
        const int32_t* out_tokens
        const int32_t* out_lens
        const int32_t* stop_ids
        const int32_t* stop_seqs
        const int32_t* max_new_tokens
        int32_t* accept_len
        uint8_t* finished
        int32_t batch
        int32_t width
        int32_t capacity
        int32_t num_stop_ids
        int32_t num_stop_seqs
        int32_t stop_seq_len

    ctypedef struct SeqAdvanceParams:
        const int32_t* emitted
        const int32_t* accept_len
        int32_t* seq_lens
        int32_t* out_tokens
        int32_t* out_lens
        int32_t* last_token
        uint8_t* finished
        int32_t batch
        int32_t width
        int32_t capacity
        int32_t pad_

    ctypedef struct SeqBuildBlockParams:
        const int32_t* last_token
        const int32_t* draft_tokens
        const int32_t* num_draft
        const int32_t* seq_lens
        int32_t* cu_q
        int32_t* block_tokens
        int32_t* positions
        int32_t* draft_ids
        int32_t batch
        int32_t max_draft

PARAM_SIZES = {"SeqStopParams": sizeof(SeqStopParams),
               "SeqAdvanceParams": sizeof(SeqAdvanceParams),
               "SeqBuildBlockParams": sizeof(SeqBuildBlockParams)}


def launch_seq_stop(Kernel k, unsigned int grid, unsigned int block, size_t stream,
                    uintptr_t emitted, uintptr_t num_accepted, uintptr_t out_tokens,
                    uintptr_t out_lens, uintptr_t stop_ids, uintptr_t stop_seqs,
                    uintptr_t max_new_tokens, uintptr_t accept_len, uintptr_t finished,
                    int batch, int width, int capacity, int num_stop_ids, int num_stop_seqs,
                    int stop_seq_len):
    cdef SeqStopParams p
    p.emitted = <const int32_t*>emitted
    p.num_accepted = <const int32_t*>num_accepted
    p.out_tokens = <const int32_t*>out_tokens
    p.out_lens = <const int32_t*>out_lens
    p.stop_ids = <const int32_t*>stop_ids
    p.stop_seqs = <const int32_t*>stop_seqs
    p.max_new_tokens = <const int32_t*>max_new_tokens
    p.accept_len = <int32_t*>accept_len
    p.finished = <uint8_t*>finished
    p.batch = batch
    p.width = width
    p.capacity = capacity
    p.num_stop_ids = num_stop_ids
    p.num_stop_seqs = num_stop_seqs
    p.stop_seq_len = stop_seq_len
    launch(k, grid, 1, 1, block, 1, 1, 0, stream, &p)


def launch_seq_advance(Kernel k, unsigned int grid, unsigned int block, size_t stream,
                       uintptr_t emitted, uintptr_t accept_len, uintptr_t seq_lens,
                       uintptr_t out_tokens, uintptr_t out_lens, uintptr_t last_token,
                       uintptr_t finished, int batch, int width, int capacity):
    cdef SeqAdvanceParams p
    p.emitted = <const int32_t*>emitted
    p.accept_len = <const int32_t*>accept_len
    p.seq_lens = <int32_t*>seq_lens
    p.out_tokens = <int32_t*>out_tokens
    p.out_lens = <int32_t*>out_lens
    p.last_token = <int32_t*>last_token
    p.finished = <uint8_t*>finished
    p.batch = batch
    p.width = width
    p.capacity = capacity
    p.pad_ = 0
    launch(k, grid, 1, 1, block, 1, 1, 0, stream, &p)


def launch_seq_build_block(Kernel k, unsigned int block, size_t stream, uintptr_t last_token,
                           uintptr_t draft_tokens, uintptr_t num_draft, uintptr_t seq_lens,
                           uintptr_t cu_q, uintptr_t block_tokens, uintptr_t positions,
                           uintptr_t draft_ids, int batch, int max_draft):
    """One CTA (the prefix sum over the batch); ``block`` must be the kernel's 256."""
    cdef SeqBuildBlockParams p
    p.last_token = <const int32_t*>last_token
    p.draft_tokens = <const int32_t*>draft_tokens
    p.num_draft = <const int32_t*>num_draft
    p.seq_lens = <const int32_t*>seq_lens
    p.cu_q = <int32_t*>cu_q
    p.block_tokens = <int32_t*>block_tokens
    p.positions = <int32_t*>positions
    p.draft_ids = <int32_t*>draft_ids
    p.batch = batch
    p.max_draft = max_draft
    launch(k, 1, 1, 1, block, 1, 1, 0, stream, &p)
