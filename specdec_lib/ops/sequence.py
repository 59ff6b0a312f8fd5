"""seq_stop, seq_advance, seq_build_block on the GPU (kernels: cuda_src/sequence/sequence.cu).

The bookkeeping of a speculative round; semantics, argument order and the FINISH_*
reason codes in ``specdec_lib.reference.sequence``; the argument contract in
``specdec_lib.contract.sequence``. Every array is int32 (``finished``: uint8) and
C-contiguous, and all live on one device. The kernels read no host value, so a whole
round can be captured in a CUDA graph; values read from device memory are never trusted
(an out-of-range ``num_accepted`` or length flags the row FINISH_BAD_ROW, an append past
the buffer's capacity flags FINISH_CAPACITY).
"""
from __future__ import annotations

from typing import Optional, Tuple

from .. import runtime
from .._validate import as_stream
from ..contract import sequence as contract
from ._types import ArrayLike, Stream

__all__ = ["seq_stop", "seq_advance", "seq_build_block"]


_ROW_THREADS = 128     # seq_stop / seq_advance: one thread per sequence
_SCAN_THREADS = 256    # seq_build_block: one CTA of exactly this many threads


def seq_stop(emitted: ArrayLike, num_accepted: ArrayLike, out_tokens: ArrayLike,
             out_lens: ArrayLike, stop_ids: Optional[ArrayLike], stop_seqs: Optional[ArrayLike],
             max_new_tokens: ArrayLike, accept_len: ArrayLike, finished: ArrayLike, *,
             stream: Stream = None) -> Tuple[ArrayLike, ArrayLike]:
    """Apply stop conditions to one round's emitted tokens (in place on the device).

    emitted [B, W] int32 (d1..dn then the correction/bonus token), num_accepted [B],
    out_tokens [B, C] (tokens generated before this round: stop sequences may start
    there), out_lens [B], stop_ids [B, S] or None (-1 = unused), stop_seqs [B, NS, M] or
    None (rows left-padded with -1), max_new_tokens [B] -> accept_len [B] (rows to
    commit, 0..n+1) and finished [B] uint8 (in/out: 0 running, else a FINISH_* reason).
    A row finished on entry commits nothing. Returns ``(accept_len, finished)``.
    """
    em, na, ot, ol, si, ss, mn, al, fin = contract.seq_stop(
        emitted, num_accepted, out_tokens, out_lens, stop_ids, stop_seqs, max_new_tokens,
        accept_len, finished)
    B, W = em.shape
    S = si.shape[1] if stop_ids is not None else 0
    NS, M = (ss.shape[1], ss.shape[2]) if stop_seqs is not None else (0, 0)
    stream_h = as_stream(stream)
    if B == 0:
        return accept_len, finished
    k = runtime.kernel("sequence", "seq_stop", em.device)
    from .. import _sequence
    _sequence.launch_seq_stop(k, -(-B // _ROW_THREADS), _ROW_THREADS, stream_h, em.ptr, na.ptr,
                              ot.ptr, ol.ptr, si.ptr, ss.ptr, mn.ptr, al.ptr, fin.ptr, B, W,
                              ot.shape[1], S, NS, M)
    return accept_len, finished


def seq_advance(emitted: ArrayLike, accept_len: ArrayLike, seq_lens: ArrayLike,
                out_tokens: ArrayLike, out_lens: ArrayLike, last_token: ArrayLike,
                finished: ArrayLike, *, stream: Stream = None) -> Tuple[ArrayLike, ...]:
    """Commit the kept tokens (in place on the device).

    emitted [B, W] int32, accept_len [B] (from seq_stop) -> seq_lens [B] (L +=
    accept_len), out_tokens [B, C] (emitted[b, :accept_len] appended at out_lens[b]),
    out_lens [B], last_token [B] (the last kept token: the next block's first row),
    finished [B] uint8 (FINISH_CAPACITY when the append overflows C). accept_len is
    clamped to W. Returns ``(seq_lens, out_tokens, out_lens, last_token, finished)``.
    """
    em, al, sl, ot, ol, lt, fin = contract.seq_advance(
        emitted, accept_len, seq_lens, out_tokens, out_lens, last_token, finished)
    B, W = em.shape
    stream_h = as_stream(stream)
    if B == 0:
        return seq_lens, out_tokens, out_lens, last_token, finished
    k = runtime.kernel("sequence", "seq_advance", em.device)
    from .. import _sequence
    _sequence.launch_seq_advance(k, -(-B // _ROW_THREADS), _ROW_THREADS, stream_h, em.ptr,
                                 al.ptr, sl.ptr, ot.ptr, ol.ptr, lt.ptr, fin.ptr, B, W,
                                 ot.shape[1])
    return seq_lens, out_tokens, out_lens, last_token, finished


def seq_build_block(last_token: ArrayLike, draft_tokens: ArrayLike, num_draft: ArrayLike,
                    seq_lens: ArrayLike, cu_q: ArrayLike, block_tokens: ArrayLike,
                    positions: ArrayLike, draft_ids: Optional[ArrayLike] = None, *,
                    stream: Stream = None) -> Tuple[ArrayLike, ...]:
    """The next round's verify block ``[t0, d1..d_kb]`` at positions ``L .. L + k_b``.

    last_token [B] int32, draft_tokens [B, K], num_draft [B] (clamped to 0..K on the
    device), seq_lens [B] -> cu_q [B+1], block_tokens and positions (1-D, at least
    B*(K+1) elements: the worst case, since T is only known on the device), draft_ids
    (1-D, at least B*K elements, or None): the drafts alone, block b's at
    ``cu_q[b] - b`` (spec_sample's layout). Returns ``(cu_q, block_tokens, positions,
    draft_ids)``.
    """
    lt, dt, nd, sl, cq, bt, ps, di = contract.seq_build_block(
        last_token, draft_tokens, num_draft, seq_lens, cu_q, block_tokens, positions, draft_ids)
    B, K = dt.shape
    stream_h = as_stream(stream)
    k = runtime.kernel("sequence", "seq_build_block", lt.device)
    from .. import _sequence
    # launched even for B == 0: cu_q[0] = 0 is still written
    _sequence.launch_seq_build_block(k, _SCAN_THREADS, stream_h, lt.ptr, dt.ptr, nd.ptr, sl.ptr,
                                     cq.ptr, bt.ptr, ps.ptr, di.ptr, B, K)
    return cu_q, block_tokens, positions, draft_ids
