"""conv1d_verify / conv1d_commit / conv1d_flush on the GPU (kernels: cuda_src/conv/conv.cu).

Depthwise causal conv1d (width W = 2..8, optional bias, SiLU) over a speculative
block with a per-sequence conv state; verify writes outputs only, commit shifts the
accepted rows into the state. Fused mode: verify first shifts in the previous round's
accepted rows (its commit, folded in: one launch a round instead of two), and
conv1d_flush commits what is left pending. Semantics: ``specdec_lib.reference.conv``.
"""
from __future__ import annotations

import os
from typing import Optional

from .. import _kernels, runtime
from .._validate import as_stream
from ..contract import conv as contract
from ..contract import index_values
from ..contract.conv import ACTIVATIONS  # noqa: F401 (public here too)
from ._types import ArrayLike, Stream

_DT_CODE = {"float32": 0, "float16": 1, "bfloat16": 2}
_THREADS = 256
_MAX_BATCH = 65535            # sequences per call: the batch is gridDim.y

__all__ = ["conv1d_verify", "conv1d_commit", "conv1d_flush"]

_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
GENERIC_ENV = "SPECDEC_CONV_GENERIC"
# "w4": the W = 4 kernels (conv.cu "W = 4, compile-time dtypes": the generic kernels' arithmetic
# with the width and dtype codes fixed at compile time, bit-identical outputs, journals and
# states; s19 ncu at B=1 found the generic conv1d_verify ~800 instructions a warp, mostly the
# run-time dtype and width branches) for every call they cover (verify_kernel / commit_kernel).
# None = on unless $SPECDEC_CONV_GENERIC is set to anything but "0"; False / True force the
# generic kernels / the W = 4 ones where they apply (benchmarks, tests).
# "lanes": the W = 4 verify kernel's row lanes (gridDim.z; 1, 2, 4 or 8): each lane walks
# ceil(q / lanes) rows of every sequence from a window it rebuilds from the 3 inputs before its
# first row, so that at small batches a thread's dependent chain is one or two rows instead of
# the whole block (same values: bit-identical). None = _row_lanes's rule.
# "threads": threads a CTA of a fused-mode verify (256, 128 or 64), which runs one row lane
# (other lanes would read the state that lane 0 writes back); None = _fused_threads's rule.
TUNING = {"w4": None, "lanes": None, "threads": None}
_MAX_LANES = 8


def _w4_on() -> bool:
    on = TUNING["w4"]
    if on is None:
        return os.environ.get(GENERIC_ENV, "").strip() in ("", "0")
    return bool(on)


def verify_kernel(W: int, x: str, weight: str, bias: Optional[str], state: str, out: str,
                  journal: Optional[str], pending: Optional[str] = None) -> str:
    """The kernel conv1d_verify launches for width W and these dtypes (numpy-style names; None
    for an absent bias / journal / pending journal): a W = 4 form where weight, bias and out
    share x's dtype and the journal, if any, is in the state's or x's dtype
    (_kernels.CONV_W4_VERIFY), the pending rows (fused mode) in the journal's dtype (the
    kernel's journal dtype is theirs too); else the generic conv1d_verify. Both give
    bit-identical results."""
    if W == 4 and _w4_on() and weight == x and out == x and bias in (None, x):
        j = journal or pending or state
        key = (_SHORT[x], _SHORT[state], _SHORT[j])
        if pending in (None, j) and key in _kernels.CONV_W4_VERIFY:
            return _kernels.conv_w4_verify_kernel(*key)
    return "conv1d_verify"


def _fused_threads(B: int, dim: int, sms: int) -> int:
    """Threads a CTA of a fused-mode verify: halved from 256 (to 64 at least) while the grid
    still fits one CTA an SM, so that a small batch spreads over the SMs that the row lanes
    would have filled (B=1 dim 8192 on 132 SMs: 64 threads, 128 CTAs); TUNING["threads"]
    where set."""
    want = TUNING["threads"]
    if want is not None:
        if want not in (64, 128, 256):
            raise ValueError(f"TUNING['threads']={want}: expected 64, 128 or 256")
        return int(want)
    threads = _THREADS
    while threads > 64 and B * -(-dim // (threads // 2)) <= sms:
        threads //= 2
    return threads


def _row_lanes(B: int, T: int, ctas: int, sms: int, x, out, journal) -> int:
    """Row lanes of a W = 4 verify launch of ``ctas`` CTAs a sequence: doubled while each lane
    still has a row at the mean block length ceil(T / B) and the grid stays within one CTA an
    SM (B=1 q=4 dim 8192 on 132 SMs: 4 lanes, 128 CTAs; B >= 5 there: 1). 1 where out or the
    journal overlaps x (a lane reads the x rows before its own, which another lane's stores
    would have overwritten), and TUNING["lanes"] where set."""
    if _overlap(x, out) or (journal.ptr and _overlap(x, journal)):
        return 1
    want = TUNING["lanes"]
    if want is not None:
        if want not in (1, 2, 4, 8):
            raise ValueError(f"TUNING['lanes']={want}: expected 1, 2, 4 or 8")
        return int(want)
    mean_q = -(-T // B) if B else 0
    lanes = 1
    while 2 * lanes <= min(mean_q, _MAX_LANES) and 2 * lanes * ctas * B <= sms:
        lanes *= 2
    return lanes


def _extent(a):
    """[first, last) byte addresses of a 2-D view (strides in elements)."""
    if not a.ptr or not all(a.shape):
        return a.ptr, a.ptr
    span = sum((n - 1) * abs(s) for n, s in zip(a.shape, a.strides)) + 1
    return a.ptr, a.ptr + span * a.itemsize


def _overlap(a, b) -> bool:
    a0, a1 = _extent(a)
    b0, b1 = _extent(b)
    return a0 < b1 and b0 < a1


def commit_kernel(W: int, journal: str, state: str) -> str:
    """The kernel conv1d_commit launches: its W = 4 form for any (journal, state) dtypes at
    W = 4, else the generic conv1d_commit (bit-identical states)."""
    if W == 4 and _w4_on():
        return _kernels.conv_w4_commit_kernel(_SHORT[journal], _SHORT[state])
    return "conv1d_commit"



def _check_batch_size(B):
    if B > _MAX_BATCH:
        raise ValueError(f"slot_ids: batch {B} too large (at most {_MAX_BATCH} sequences per call)")


def conv1d_verify(x: ArrayLike, weight: ArrayLike, conv_state: ArrayLike, slot_ids: ArrayLike,
                  cu_q: ArrayLike, out: ArrayLike, *, bias: Optional[ArrayLike] = None,
                  activation: Optional[str] = "silu", journal: Optional[ArrayLike] = None,
                  status: Optional[ArrayLike] = None, check_indices: bool = True,
                  stream: Stream = None, pending_journal: Optional[ArrayLike] = None,
                  pending_row0: Optional[ArrayLike] = None,
                  pending_len: Optional[ArrayLike] = None):
    """out[t] = act(bias + sum_w weight[:, w] * window_t[w]) for every block row; the
    conv state is only read.

    x: [T, dim]; weight: [dim, W] (or torch's [dim, 1, W]); conv_state: pool
    [slots, dim, W-1] (the last W-1 inputs, oldest first); slot_ids [B] int32 (< 0:
    padding row, outputs zero); cu_q [B+1] int32; out [T, dim]; bias [dim] or None;
    activation "silu" or None; journal: optional [T, dim] that receives a copy of x
    (pass it, or x itself, to conv1d_commit). Any float dtypes (float32/float16/
    bfloat16), each array its own; last dimensions contiguous. ``check_indices``: as in
    gdn_verify.

    Fused mode (one launch a round instead of verify + commit): pass ``pending_journal``
    (the previous round's x or journal, [Tp, dim], any float dtype; not overlapping out or
    the journal), ``pending_row0`` and ``pending_len`` (int32 [B]: sequence b's accepted
    rows of it, 0 = nothing pending, e.g. a sequence that joins the batch). Each state first
    shifts in its pending rows exactly as conv1d_commit would (bit for bit) and is written
    back, then the block is verified over it. Call ``conv1d_flush`` for sequences that leave
    (or before reading their state). A bad pending range raises with ``check_indices``, else
    sets status bit 8 (``ConvStatus.BAD_PENDING``) and commits nothing for that sequence.
    """
    stream_h = as_stream(stream)
    cs, xa, wa, ba, oa, ja, sl, cq, sa, pending = contract.conv1d_verify(
        x, weight, conv_state, slot_ids, cu_q, out, bias=bias, activation=activation,
        journal=journal, status=status, pending_journal=pending_journal,
        pending_row0=pending_row0, pending_len=pending_len,
        values=index_values(stream_h) if check_indices else None)
    slots, dim, wm1 = cs.shape
    W = wm1 + 1
    T, B = xa.shape[0], sl.shape[0]
    _check_batch_size(B)
    dev = cs.device
    x_st, o_st = xa.strides[0], oa.strides[0]
    j_st = ja.strides[0] if journal is not None else 0
    fused = pending is not None
    if B == 0 or ((T == 0 or dim == 0) and status is None and not fused):
        return out   # (with a status the kernel still runs: every status[b] gets written)
    name = verify_kernel(W, xa.dtype, wa.dtype, ba.dtype, cs.dtype, oa.dtype, ja.dtype,
                         pending[0].dtype if fused else None)
    kern = runtime.kernel("conv", name, dev)
    sms = runtime.sm_count(dev)
    threads = _fused_threads(B, dim, sms) if fused else _THREADS
    ctas = max(1, (dim + threads - 1) // threads)
    lanes = 1 if name == "conv1d_verify" or fused else _row_lanes(B, T, ctas, sms, xa, oa, ja)
    pend = None
    if fused:
        pj, pr, pn = pending
        pend = (pj.ptr, pr.ptr, pn.ptr, pj.strides[0], pj.shape[0], _DT_CODE[pj.dtype])
    from .. import _conv
    _conv.launch_conv1d_verify(
        kern, ctas, B, threads, stream_h, xa.ptr, wa.ptr, ba.ptr,
        cs.ptr, sl.ptr, cq.ptr, oa.ptr, ja.ptr, sa.ptr, x_st, o_st, j_st, wa.strides[0],
        cs.strides[0], cs.strides[1], T, B, dim, W, slots, activation == "silu",
        [_DT_CODE[xa.dtype], _DT_CODE[wa.dtype], _DT_CODE.get(ba.dtype, 0), _DT_CODE[cs.dtype],
         _DT_CODE[oa.dtype], _DT_CODE.get(ja.dtype, 0)], lanes, pend)
    return out


def conv1d_commit(conv_state: ArrayLike, slot_ids: ArrayLike, cu_q: ArrayLike,
                  accept_len: ArrayLike, journal: ArrayLike, *, status: Optional[ArrayLike] = None,
                  check_indices: bool = True, stream: Stream = None):
    """Shift block rows 0..accept_len[b]-1 of ``journal`` [T, dim] (x itself, or the
    copy conv1d_verify wrote) into each sequence's conv state, in place; rows enter the
    state rounded to its dtype. accept_len [B] int32 in 0..q_b (0: untouched)."""
    stream_h = as_stream(stream)
    cs, ja, sl, cq, al, sa = contract.conv1d_commit(
        conv_state, slot_ids, cu_q, accept_len, journal, status=status,
        values=index_values(stream_h) if check_indices else None)
    dim = cs.shape[1]
    T, B = ja.shape[0], sl.shape[0]
    _check_batch_size(B)
    if B == 0 or ((T == 0 or dim == 0) and status is None):
        return conv_state
    _launch_commit(cs, sl, cq.ptr, 0, al, ja, sa, stream_h)
    return conv_state


def _launch_commit(cs, sl, cu_q_ptr, row0_ptr, n, rows, sa, stream_h):
    """The commit kernel over the views: sequence b shifts in n[b] rows of ``rows`` from
    cu_q[b] (conv1d_commit) or, cu_q_ptr 0, from row0[b] (conv1d_flush: conv.cu commit_range)."""
    slots, dim, wm1 = cs.shape
    kern = runtime.kernel("conv", commit_kernel(wm1 + 1, rows.dtype, cs.dtype), cs.device)
    from .. import _conv
    _conv.launch_conv1d_commit(kern, max(1, (dim + _THREADS - 1) // _THREADS), sl.shape[0], _THREADS,
                               stream_h, cs.ptr, sl.ptr, cu_q_ptr, n.ptr, rows.ptr, sa.ptr,
                               rows.strides[0], cs.strides[0], cs.strides[1], rows.shape[0],
                               sl.shape[0], dim, wm1 + 1, slots, _DT_CODE[rows.dtype],
                               _DT_CODE[cs.dtype], row0_ptr)


def conv1d_flush(conv_state: ArrayLike, slot_ids: ArrayLike, pending_journal: ArrayLike,
                 pending_row0: ArrayLike, pending_len: ArrayLike, *,
                 status: Optional[ArrayLike] = None, check_indices: bool = True,
                 stream: Stream = None):
    """Commits the rows a fused-mode conv1d_verify left pending, in place:
    conv_state[slot_ids[b]] shifts in rows pending_row0[b] .. + pending_len[b] - 1 of
    ``pending_journal`` (rounded to the state dtype, as conv1d_commit does). For sequences
    that leave the batch (pending_len 0 for the others) or before reading a state.
    Arguments as in conv1d_verify's fused mode."""
    stream_h = as_stream(stream)
    cs, sl, pj, pr, pn, sa = contract.conv1d_flush(
        conv_state, slot_ids, pending_journal, pending_row0, pending_len, status=status,
        values=index_values(stream_h) if check_indices else None)
    dim = cs.shape[1]
    B = sl.shape[0]
    _check_batch_size(B)
    if B == 0 or (dim == 0 and status is None):
        return conv_state
    _launch_commit(cs, sl, 0, pr.ptr, pn, pj, sa, stream_h)
    return conv_state
