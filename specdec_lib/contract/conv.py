"""Contract of the conv family: ``conv1d_verify`` (with its fused mode's pending rows),
``conv1d_commit`` and ``conv1d_flush``."""
from __future__ import annotations

from .._args import DeviceArg
from ._batch import (FLOATS, batch_args, batch_values, flush_args, last_contiguous, no_pending,
                     pending_args, pending_values)
from ._core import check

ACTIVATIONS = (None, "silu")
MIN_WIDTH, MAX_WIDTH = 2, 8


def state_arg(arg, conv_state):
    """The conv state pool [slots, dim, W-1], float, W in 2..8, the last dimension
    contiguous. Returns (view, slots, dim, W)."""
    cs = arg("conv_state", conv_state, dtype=FLOATS, ndim=3)
    slots, dim, wm1 = cs.shape
    if not MIN_WIDTH <= wm1 + 1 <= MAX_WIDTH:
        raise ValueError(f"conv_state: width W = {wm1 + 1} (from shape {list(cs.shape)}) not "
                         f"supported: {MIN_WIDTH}..{MAX_WIDTH}")
    if wm1 > 1 and cs.strides[2] != 1:
        raise ValueError(f"conv_state: the last (W-1) dimension must be contiguous "
                         f"(strides {cs.strides})")
    # the kernels' sizes are int32, and so is the channel index c = block * 256 + thread
    if slots >= 2**31 or dim >= 2**31 - 256:
        raise ValueError(f"conv_state: sizes of 2^31 or more are not supported "
                         f"(shape {list(cs.shape)})")
    return cs, slots, dim, wm1 + 1


def _block_rows(arg, name, arr, dim, dev):
    """A block's rows [T, dim] (x, or the journal), any float dtype, the last dimension
    contiguous; returns (view, T)."""
    a = arg(name, arr, dtype=FLOATS, ndim=2, device=dev)
    T = a.shape[0]
    if T >= 2**31:
        raise ValueError(f"{name}: {T} rows; at most 2^31-1 per call")
    if a.shape[1] != dim:
        raise ValueError(f"{name}: expected [T, dim={dim}] (dim from conv_state), got {list(a.shape)}")
    return a, T


@check("conv1d_verify")
def conv1d_verify(x, weight, conv_state, slot_ids, cu_q, out, *, bias=None, activation="silu",
                  journal=None, status=None, pending_journal=None, pending_row0=None,
                  pending_len=None, arg=DeviceArg, values=None, **_):
    """activation "silu" or None; conv_state: ``state_arg``; x [T, dim]; weight [dim, W]
    (or [dim, 1, W]), W contiguous; bias [dim] contiguous or None; out [T, dim]; journal
    [T, dim] or None; any float dtypes, last dimensions contiguous; the batch
    (``batch_args``; values: ``check_batch``); the fused mode's pending rows
    (``pending_args``: [Tp, dim], any float dtype, overlapping neither out nor the journal;
    values: ``check_pending``), only with pending_journal. Returns (conv_state, x, weight,
    bias, out, journal, slot_ids, cu_q, status) views and (pending_journal, row0, len) views
    or None."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    cs, slots, dim, W = state_arg(arg, conv_state)
    dev = cs.device
    xa, T = _block_rows(arg, "x", x, dim, dev)
    wa = arg("weight", weight, dtype=FLOATS, device=dev)
    if wa.shape not in ((dim, W), (dim, 1, W)):
        raise ValueError(f"weight: expected [dim, W] = [{dim}, {W}] (or [{dim}, 1, {W}]), "
                         f"got {list(wa.shape)}")
    if W > 1 and wa.strides[-1] != 1:
        raise ValueError(f"weight: the width dimension must be contiguous (strides {wa.strides})")
    ba = arg("bias", bias, dtype=FLOATS, shape=(dim,), device=dev, contiguous=True,
             optional=True)
    oa = arg("out", out, dtype=FLOATS, shape=(T, dim), device=dev)
    ja = arg("journal", journal, dtype=FLOATS, shape=(T, dim), device=dev, optional=True)
    B, sl, cq, _, sa = batch_args(arg, dev, slot_ids, cu_q, status)
    for a in (xa, oa, ja):
        last_contiguous(a)
    pending = None
    if pending_journal is not None:
        pending = pending_args(arg, dev, B, pending_journal, pending_row0, pending_len,
                               dtype=FLOATS, width=dim, writes=(oa, ja))
    else:
        no_pending(pending_row0, pending_len)
    if values is not None:
        batch_values(values, sl, cq, T, slots)
    if pending is not None:
        pending_values(values, pending[1], pending[2], pending[0].shape[0])
    return cs, xa, wa, ba, oa, ja, sl, cq, sa, pending


@check("conv1d_commit")
def conv1d_commit(conv_state, slot_ids, cu_q, accept_len, journal, *, status=None,
                  arg=DeviceArg, values=None, **_):
    """conv_state: ``state_arg``; journal [T, dim] any float, last dimension contiguous;
    the batch with accept_len (``batch_args``; values: ``check_batch``, accept_len in
    0..q_b). Returns (conv_state, journal, slot_ids, cu_q, accept_len, status) views."""
    cs, slots, dim, W = state_arg(arg, conv_state)
    dev = cs.device
    ja, T = _block_rows(arg, "journal", journal, dim, dev)
    last_contiguous(ja)
    B, sl, cq, al, sa = batch_args(arg, dev, slot_ids, cu_q, status, accept_len, commit=True)
    if values is not None:
        batch_values(values, sl, cq, T, slots, al)
    return cs, ja, sl, cq, al, sa


@check("conv1d_flush")
def conv1d_flush(conv_state, slot_ids, pending_journal, pending_row0, pending_len, *,
                 status=None, arg=DeviceArg, values=None, **_):
    """conv_state: ``state_arg``; slot_ids [B] int32 (values: in range, used once); the
    pending rows as in conv1d_verify's fused mode. Returns (conv_state, slot_ids,
    pending_journal, row0, len, status) views."""
    cs, slots, dim, W = state_arg(arg, conv_state)
    sl, pj, pr, pn, sa = flush_args(arg, cs.device, slots, slot_ids, pending_journal,
                                    pending_row0, pending_len, status, values, dtype=FLOATS,
                                    width=dim)
    return cs, sl, pj, pr, pn, sa
