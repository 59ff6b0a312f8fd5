"""Contract of the gdn family: ``gdn_verify`` (with its fused mode's pending rows),
``gdn_commit`` and ``gdn_flush``."""
from __future__ import annotations

import math

from .._args import DeviceArg
from .._validate import as_scale
from ._batch import (FLOATS, batch_args, batch_values, flush_args, last_contiguous, no_pending,
                     on_cuda, pending_args, pending_values, require_dtype)
from ._core import check

LAYOUTS = ("kv", "vk")
KERNEL_HEAD_K_DIMS = (64, 128)      # Dk the CUDA kernels are built for
KERNEL_MAX_HEAD_V_DIM = 1024        # Dv: a multiple of 16 up to this


def gdn_journal_width(num_k_heads, num_v_heads, head_k_dim, head_v_dim):
    """float32 elements per block row of the journal: Hk*Dk + Hv*Dv + 2*Hv."""
    return int(num_k_heads * head_k_dim + num_v_heads * head_v_dim + 2 * num_v_heads)


def journal_num_k_heads(width, Hv, Dk, Dv, hint=""):
    """Hk from a journal's width W = Hk*Dk + Hv*Dv + 2*Hv (Hk dividing Hv); ValueError
    naming the journal when no Hk fits (``hint`` ends the message)."""
    rest = width - Hv * Dv - 2 * Hv
    if rest <= 0 or rest % Dk or Hv % (rest // Dk):
        raise ValueError(f"journal: width {width} is not Hk*Dk + Hv*Dv + 2*Hv for Hv={Hv}, "
                         f"Dk={Dk}, Dv={Dv} and any Hk dividing Hv{hint}")
    return rest // Dk


def check_gating(g, beta, a, b, A_log, dt_bias):
    """Which gating a gdn_verify caller gave: True for fused (a, b, A_log, dt_bias),
    False for g and beta. ValueError naming the argument for a mix or a missing one."""
    fused = a is not None or b is not None
    if fused:
        if g is not None or beta is not None:
            raise ValueError("g/beta: give either g and beta, or a, b, A_log and dt_bias, not both")
        for name, x in (("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias)):
            if x is None:
                raise ValueError(f"{name}: required for fused gating (a, b, A_log, dt_bias)")
    elif g is None or beta is None:
        raise ValueError("g/beta: both required (or pass a, b, A_log, dt_bias for fused gating)")
    return fused


def state_arg(arg, state, layout):
    """The state pool [slots, Hv, Dk, Dv] ("kv") or [slots, Hv, Dv, Dk] ("vk"), float,
    each slot's block contiguous (size-1 dimensions' strides free); on a CUDA device Dk in {64, 128} and Dv a multiple of
    16 up to 1024 (the kernels built; the reference computes any). Returns (view, slots,
    Hv, Dk, Dv)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    st = arg("state", state, dtype=FLOATS, ndim=4)
    slots, Hv, d1, d2 = st.shape
    Dk, Dv = (d1, d2) if layout == "kv" else (d2, d1)
    if arg is DeviceArg or on_cuda(arg, st):
        if Dk not in KERNEL_HEAD_K_DIMS:
            raise ValueError(f"state: head_k_dim Dk={Dk} not supported (64 or 128; layout "
                             f"{layout!r}, shape {list(st.shape)})")
        if Dv % 16 or not 16 <= Dv <= KERNEL_MAX_HEAD_V_DIM:
            raise ValueError(f"state: head_v_dim Dv={Dv} not supported (a multiple of 16 up "
                             f"to {KERNEL_MAX_HEAD_V_DIM})")
    want = (d1 * d2, d2, 1)
    if st.strides[1:] != want and any(n > 1 and s != w for n, s, w in
                                      zip(st.shape[1:], st.strides[1:], want)):
        raise ValueError(f"state: each slot's [Hv, {d1}, {d2}] block must be contiguous "
                         f"(strides {st.strides})")
    return st, slots, Hv, Dk, Dv


@check("gdn_verify")
def gdn_verify(q, k, v, state, slot_ids, cu_q, out, journal, *, g=None, beta=None, a=None,
               b=None, A_log=None, dt_bias=None, scale=None, layout="kv", status=None,
               pending_journal=None, pending_row0=None, pending_len=None, arg=DeviceArg,
               values=None, **_):
    """state: ``state_arg``; q, k [T, Hk, Dk] and v [T, Hv, Dv] of one float dtype, Hv a
    multiple of Hk; out [T, Hv, Dv] any float; journal float32 [T, gdn_journal_width];
    gating g, beta [T, Hv] or a, b [T, Hv] with A_log, dt_bias [Hv] (contiguous), any
    floats; the batch (``batch_args``); the fused mode's pending rows (``pending_args``,
    only with pending_journal); last dimensions contiguous; scale finite, non-zero. With
    ``values``: ``check_batch`` and ``check_pending``. Returns (state, q, k, v, out,
    journal, gate0, gate1, A_log, dt_bias, slot_ids, cu_q, status) views, (pending_journal,
    row0, len) views or None, fused gating (bool) and the scale."""
    st, slots, Hv, Dk, Dv = state_arg(arg, state, layout)
    dev = st.device
    qa = arg("q", q, dtype=FLOATS, ndim=3, device=dev)
    T, Hk = qa.shape[0], qa.shape[1]
    if qa.shape[2] != Dk:
        raise ValueError(f"q: expected [T, Hk, Dk={Dk}] (Dk from state, layout {layout!r}), "
                         f"got {list(qa.shape)}")
    ka = arg("k", k, dtype=qa.dtype, shape=qa.shape, device=dev)
    va = arg("v", v, dtype=qa.dtype, shape=(T, Hv, Dv), device=dev)
    if Hk == 0 or Hv % Hk:
        raise ValueError(f"q / state: value heads Hv={Hv} must be a multiple of key heads Hk={Hk}")
    oa = arg("out", out, dtype=FLOATS, shape=(T, Hv, Dv), device=dev)
    W = gdn_journal_width(Hk, Hv, Dk, Dv)
    ja = arg("journal", journal, dtype="float32", shape=(T, W), device=dev)
    if ja.by_kind:
        require_dtype(ja, "float32")
    fused = check_gating(g, beta, a, b, A_log, dt_bias)
    if fused:
        g0 = arg("a", a, dtype=FLOATS, shape=(T, Hv), device=dev)
        g1 = arg("b", b, dtype=FLOATS, shape=(T, Hv), device=dev)
        al = arg("A_log", A_log, dtype=FLOATS, shape=(Hv,), device=dev, contiguous=True)
        db = arg("dt_bias", dt_bias, dtype=FLOATS, shape=(Hv,), device=dev, contiguous=True)
    else:
        g0 = arg("g", g, dtype=FLOATS, shape=(T, Hv), device=dev)
        g1 = arg("beta", beta, dtype=FLOATS, shape=(T, Hv), device=dev)
        al = db = arg("A_log", None, optional=True)
    B, sl, cq, _, sa = batch_args(arg, dev, slot_ids, cu_q, status)
    pending = None
    if pending_journal is not None:
        pending = pending_args(arg, dev, B, pending_journal, pending_row0, pending_len,
                               dtype="float32", width=W, writes=(ja,))
    else:
        no_pending(pending_row0, pending_len)
    for x in (qa, ka, va, oa, g0, g1, ja):
        last_contiguous(x)
    if max(T, slots, B) >= 2**31:
        raise ValueError("q/state/slot_ids: more than 2^31-1 rows, slots or sequences")
    scale = as_scale(scale, 1.0 / math.sqrt(Dk))
    if values is not None:
        batch_values(values, sl, cq, T, slots)
    if pending is not None:
        pending_values(values, pending[1], pending[2], pending[0].shape[0])
    return st, qa, ka, va, oa, ja, g0, g1, al, db, sl, cq, sa, pending, fused, scale


@check("gdn_commit")
def gdn_commit(state, slot_ids, cu_q, accept_len, journal, *, layout="kv", status=None,
               arg=DeviceArg, values=None, **_):
    """state / slot_ids / cu_q / layout as for gdn_verify; accept_len [B] int32 (values:
    0..q_b); journal float32 [T, Hk*Dk + Hv*Dv + 2*Hv] (Hk, dividing Hv, read from its
    width), last dimension contiguous. Returns (state, journal, Hk, slot_ids, cu_q,
    accept_len, status)."""
    st, slots, Hv, Dk, Dv = state_arg(arg, state, layout)
    dev = st.device
    ja = arg("journal", journal, dtype="float32", ndim=2, device=dev)
    if ja.by_kind:
        require_dtype(ja, "float32")
    T, W = ja.shape
    Hk = journal_num_k_heads(W, Hv, Dk, Dv, hint=" (was it written for this state?)")
    last_contiguous(ja)
    B, sl, cq, al, sa = batch_args(arg, dev, slot_ids, cu_q, status, accept_len, commit=True)
    if values is not None:
        batch_values(values, sl, cq, T, slots, al)
    return st, ja, Hk, sl, cq, al, sa


@check("gdn_flush")
def gdn_flush(state, slot_ids, pending_journal, pending_row0, pending_len, *, layout="kv",
              status=None, arg=DeviceArg, values=None, **_):
    """state / layout as for gdn_verify; slot_ids [B] int32 (values: in range, used once);
    the pending rows as in gdn_verify's fused mode (any journal width that fits the
    state). Returns (state, slot_ids, pending_journal, row0, len, Hk, status)."""
    st, slots, Hv, Dk, Dv = state_arg(arg, state, layout)
    sl, pj, pr, pn, sa = flush_args(arg, st.device, slots, slot_ids, pending_journal,
                                    pending_row0, pending_len, status, values,
                                    dtype="float32", width=None)
    Hk = journal_num_k_heads(pj.shape[1], Hv, Dk, Dv, hint=" (was it written for this state?)")
    return st, sl, pj, pr, pn, Hk, sa
