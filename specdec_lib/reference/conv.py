"""Depthwise causal conv1d (+ SiLU) for a speculative round: numpy reference.

Per channel c of one sequence, with the committed conv state ``s`` ([W-1] previous
inputs, oldest first) and block inputs x_0..x_{q-1}::

    ext = s[0..W-2] ++ x_0 ++ x_1 ++ ...
    y_i = act(bias[c] + sum_w weight[c, w] * ext[i + w])      # weight[c, W-1] hits x_i

Precision contract: an input enters the state rounded to the state dtype, so in the
window of row i the earlier block rows x_0..x_{i-1} are used rounded to the state dtype
(what one-token decoding would have stored) and x_i itself as given; math in float64
here, float32 in the kernels; outputs rounded to out's dtype.

``conv1d_verify`` writes the outputs (and optionally a copy of x, the journal) and never
the state. ``conv1d_commit`` shifts the first accept_len[b] block rows into the state:
``s = (s ++ x_0..x_{n-1})[-(W-1):]``. The journal it reads is x itself or verify's copy.
A negative slot id is a padding row: zero outputs, state untouched.

Fused mode (``conv1d_verify`` with ``pending_journal``, ``pending_row0``, ``pending_len``):
the previous round's commit folded into this round's verify. Each state first shifts in
its pending rows (rows row0[b] .. row0[b]+len[b]-1 of the pending journal) exactly as
``conv1d_commit`` would, and is written; then the block is verified over it.
``conv1d_flush`` commits pending rows alone.
"""
from __future__ import annotations

import numpy as np

from ..contract import checked
from .gdn import check_batch, round_to, store, to_f64


def _conv_dims(conv_state):
    slots, dim, wm1 = conv_state.shape
    return slots, dim, wm1 + 1


@checked("conv1d_verify")
def conv1d_verify(x, weight, conv_state, slot_ids, cu_q, out, *, bias=None, activation="silu",
                  journal=None, pending_journal=None, pending_row0=None, pending_len=None):
    """x [T, dim]; weight [dim, W] (or [dim, 1, W]); conv_state [slots, dim, W-1]; slot_ids
    [B]; cu_q [B+1]; out [T, dim] written; bias [dim] or None; activation "silu" or None;
    journal [T, dim] or None (written: x in the journal's dtype); the fused mode's pending
    rows (the state is written then). The argument contract
    (``specdec_lib.contract.conv.conv1d_verify``) runs first. Returns out."""
    slots, dim, W = _conv_dims(conv_state)
    slot_ids, cu_q = np.asarray(slot_ids).astype(np.int64), np.asarray(cu_q).astype(np.int64)
    if pending_journal is not None:
        _shift_in(conv_state, slot_ids, pending_journal, pending_row0, pending_len)
    w64 = to_f64(weight).reshape(dim, W)
    b64 = np.zeros(dim) if bias is None else to_f64(bias)
    x64 = to_f64(x)
    xs = round_to(x64, conv_state.dtype)          # x as it would be stored in the state
    for bi, slot in enumerate(slot_ids):
        r0, r1 = int(cu_q[bi]), int(cu_q[bi + 1])
        if slot < 0:
            store(out[r0:r1], np.zeros((r1 - r0, dim)))
            continue
        ext = np.concatenate([to_f64(conv_state[slot]).T, xs[r0:r1]], axis=0)   # [W-1+q, dim]
        for i in range(r1 - r0):
            win = ext[i:i + W].copy()
            win[W - 1] = x64[r0 + i]
            y = b64 + np.sum(w64.T * win, axis=0)
            if activation == "silu":
                y = y / (1.0 + np.exp(-y))
            store(out[r0 + i], y)
    if journal is not None:
        store(journal, x64)
    return out


def _shift_in(conv_state, slot_ids, rows, row0, n):
    """state[slot_ids[b]] = (state ++ rows[row0[b] : row0[b] + n[b]])[-(W-1):], rows rounded
    to the state dtype; padding slots and n[b] = 0 untouched."""
    W = conv_state.shape[2] + 1
    row0, n = np.asarray(row0).astype(np.int64), np.asarray(n).astype(np.int64)
    for bi, slot in enumerate(np.asarray(slot_ids).astype(np.int64)):
        if slot < 0 or n[bi] == 0:
            continue
        r0 = int(row0[bi])
        ext = np.concatenate([to_f64(conv_state[slot]).T,
                              round_to(to_f64(rows[r0:r0 + n[bi]]), conv_state.dtype)], axis=0)
        store(conv_state[slot], ext[-(W - 1):].T)


@checked("conv1d_commit")
def conv1d_commit(conv_state, slot_ids, cu_q, accept_len, journal):
    """Shifts block rows 0..accept_len[b]-1 of ``journal`` [T, dim] (x itself or the copy
    conv1d_verify wrote) into each sequence's conv state, in place. Returns conv_state."""
    _shift_in(conv_state, slot_ids, journal, np.asarray(cu_q)[:-1], accept_len)
    return conv_state


@checked("conv1d_flush")
def conv1d_flush(conv_state, slot_ids, pending_journal, pending_row0, pending_len):
    """Commits pending rows (fused mode): state[slot_ids[b]] shifts in rows pending_row0[b]
    .. + pending_len[b] - 1 of ``pending_journal`` (a previous round's x or journal), in
    place. For sequences that leave the batch, or before reading a state that a fused
    verify has not caught up yet. Returns conv_state."""
    _shift_in(conv_state, slot_ids, pending_journal, pending_row0, pending_len)
    return conv_state


def conv1d_decode_reference(x, weight, conv_state, slot_ids, cu_q, out, *, bias=None,
                            activation="silu"):
    """Sequential one-token decoding over every row (state committed after each): the
    oracle of verify + commit. Returns (out, conv_state)."""
    slots, dim, W = _conv_dims(conv_state)
    T = x.shape[0]
    slot_ids, cu_q = check_batch(slot_ids, cu_q, T, slots)
    for bi, slot in enumerate(slot_ids):
        r0, r1 = int(cu_q[bi]), int(cu_q[bi + 1])
        for t in range(r0, r1):
            one = np.array([0, 1])
            conv1d_verify(x[t:t + 1], weight, conv_state, slot_ids[bi:bi + 1], one,
                          out[t:t + 1], bias=bias, activation=activation)
            if slot >= 0:
                conv1d_commit(conv_state, slot_ids[bi:bi + 1], one, np.array([1]), x[t:t + 1])
    return out, conv_state
