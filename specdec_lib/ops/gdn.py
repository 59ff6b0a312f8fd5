"""gdn_verify / gdn_commit on the GPU (kernels: cuda_src/gdn/gdn.cu).

The gated delta rule of a speculative round, split transactionally: ``gdn_verify``
reads each sequence's recurrent state once and writes the outputs of every block row
plus a journal; after sampling, ``gdn_commit`` replays the journal over the accepted
rows, reading and writing the state once. Semantics, precision contract and journal
layout: ``specdec_lib.reference.gdn`` (the numpy twin these are tested against).
"""
from __future__ import annotations

import math
import os

from .. import runtime
from .._validate import DeviceArg, as_scale, as_stream, to_host
from ..reference.gdn import (LAYOUTS, check_accept_len, check_batch, check_gating,
                             check_pending, gdn_journal_width, journal_num_k_heads)

_FLOATS = ("float32", "float16", "bfloat16")
_DT_CODE = {"float32": 0, "float16": 1, "bfloat16": 2}
_STATE_NAME = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_MAX_WARPS = 8
# launch tuning (benchmarks may override): warps per CTA, None = heuristic; l2_prefetch: each
# CTA asks L2 for the state slice of the CTA one wave of resident CTAs later (gdn.cu
# prefetch_slice_l2); None = where it measured faster on the H200 (s6-r4/r5, B=64: 16-bit
# states' verify / commit / fused, 2-3 %, and the f32 fused kernel, 1 %), not f32 gdn_verify /
# gdn_commit (1-4 % slower with it)
# mma16: bf16 / f16 states on the tensor-core kernels (gdn.cu gdn_*_mma_*: each row's S^T k and
# S^T q as tf32 mmas over the exact 16-bit state and split f32 vectors) instead of the CUDA-core
# ones; None = the SPECDEC_GDN_MMA environment variable ("1" on, "0" off), else where each
# measured faster on the H200 (s11-r7, B=64 q=4 Hv=32, best mode): kv states on the tensor
# cores (fused 108 / 106 us bf16 / f16 vs 154), vk states on the CUDA cores (fused 108 / 105 us
# vs 128 / 125). Verify, commit and flush must use one family for a pool: the two differ in the last
# bits of the sums (each is bit-exact against its own one-row decoding). f32 states: no effect.
TUNING = {"warps": None, "l2_prefetch": None, "mma16": None}
_OCCUPANCY = {}


def _use_mma16(state_dtype, layout):
    if state_dtype == "float32":
        return False
    on = TUNING["mma16"]
    if on is None:
        env = os.environ.get("SPECDEC_GDN_MMA", "").strip()
        on = env not in ("", "0") if env else layout == "kv"
    return bool(on)


def _prefetch_ahead(kern, block, device, grid, state_dtype, fused_kernel):
    """Resident CTAs of this launch on the whole GPU (the prefetch distance), 0 when the
    grid fits in one wave (nothing later to prefetch for) or prefetching is off."""
    on = TUNING["l2_prefetch"]
    if on is None:
        on = fused_kernel or state_dtype != "float32"
    if not on:
        return 0
    key = (kern.module, kern.name, device, block)
    per_sm = _OCCUPANCY.get(key)
    if per_sm is None:
        per_sm = _OCCUPANCY[key] = max(1, kern.occupancy(block))
    ahead = per_sm * runtime.sm_count(device)
    return ahead if ahead < grid else 0

__all__ = ["gdn_verify", "gdn_commit", "gdn_flush", "gdn_journal_width"]


def _batch_args(dev, slot_ids, cu_q, status, accept_len=None, *, commit=False):
    """The batch arguments of a verify (or, ``commit=True``, a commit) op of the gdn and
    conv families, checked in this order on device ``dev``: slot_ids [B] int32, cu_q
    [B+1] int32, accept_len [B] int32 (commit only), status [B] int32 or None.
    Returns (B, slot_ids, cu_q, accept_len or None, status) as DeviceArgs."""
    sl = DeviceArg("slot_ids", slot_ids, dtype="int32", ndim=1, device=dev, contiguous=True)
    B = sl.shape[0]
    cq = DeviceArg("cu_q", cu_q, dtype="int32", shape=(B + 1,), device=dev, contiguous=True)
    al = None
    if commit:
        al = DeviceArg("accept_len", accept_len, dtype="int32", shape=(B,), device=dev,
                       contiguous=True)
    sa = DeviceArg("status", status, dtype="int32", shape=(B,), device=dev, contiguous=True,
                   optional=True)
    return B, sl, cq, al, sa


def _check_batch_on_host(check_indices, stream_h, sl, cq, num_rows, num_slots, al=None):
    """``check_indices``: copy slot_ids / cu_q (/ accept_len) to the host and raise
    ValueError on bad ones before the launch; skipped while ``stream_h`` is capturing."""
    if check_indices and not runtime.driver().stream_is_capturing(stream_h):
        _, cu = check_batch(to_host(sl, stream_h), to_host(cq, stream_h), num_rows, num_slots)
        if al is not None:
            check_accept_len(to_host(al, stream_h), cu)


def _state_arg(state, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    st = DeviceArg("state", state, dtype=_FLOATS, ndim=4)
    slots, Hv, d1, d2 = st.shape
    Dk, Dv = (d1, d2) if layout == "kv" else (d2, d1)
    if Dk not in (64, 128):
        raise ValueError(f"state: head_k_dim Dk={Dk} not supported (64 or 128; layout {layout!r}, "
                         f"shape {list(st.shape)})")
    if Dv % 16 or not 16 <= Dv <= 1024:
        raise ValueError(f"state: head_v_dim Dv={Dv} not supported (a multiple of 16 up to 1024)")
    if tuple(st.strides[1:]) != (d1 * d2, d2, 1):
        raise ValueError(f"state: each slot's [Hv, {d1}, {d2}] block must be contiguous "
                         f"(strides {st.strides})")
    if st.ptr % 16 or (st.strides[0] * st.itemsize) % 16:
        raise ValueError("state: the pool and its slot stride must be 16-byte aligned")
    return st, slots, Hv, Dk, Dv


def _warp_cols(state_dtype, Dk, verify, layout="kv"):
    """State columns (Dv entries) per warp: 2 x the kernel's columns per thread (gdn_tile.cuh
    StateTile CJ). verify (gdn.cu verify_cj): 8 per thread for every state but f32 with Dk = 64;
    commit (commit_cj): the same, except 4 for f32 states in the "vk" layout. The 16-bit _mma
    kernels (MmaTile, TUNING["mma16"]) also own 16 columns per warp."""
    if state_dtype != "float32" or (Dk == 128 and (verify or layout == "kv")):
        return 16
    return 8


def _launch_shape(B, Hv, Dv, state_dtype, device, warp_cols):
    """(warps per CTA, slices per head): enough CTAs to fill the GPU, <= 8 warps."""
    cands = [w for w in (8, 4, 2, 1) if Dv % (w * warp_cols) == 0 and w * warp_cols <= 128]
    if not cands:
        raise ValueError(f"state: head_v_dim Dv={Dv} must be a multiple of {warp_cols} for "
                         f"a {state_dtype} state")
    if TUNING["warps"] in cands:
        w = TUNING["warps"]
    else:
        want = 4 * runtime.sm_count(device)          # CTAs for a few waves
        w = cands[-1]
        for c in cands:                               # widest CTA that still fills the GPU
            if c <= 4 and B * Hv * (Dv // (c * warp_cols)) >= want:
                w = c
                break
    return w, Dv // (w * warp_cols)


def _gdn_launch(op, layout, st, Dk, Dv, Hv, B, dev, warp_cols):
    """(kernel, grid, block, slices, prefetch distance) of gdn kernel ``op`` ("verify",
    "commit", "verify_fused") for this state and batch."""
    warps, slices = _launch_shape(B, Hv, Dv, st.dtype, dev, warp_cols)
    grid = B * Hv * slices
    if grid >= 2**31:   # grid.x
        raise ValueError(f"slot_ids: {B} sequences x {Hv} heads x {slices} slices exceed one launch")
    mma = "_mma" if _use_mma16(st.dtype, layout) else ""
    kern = runtime.kernel("gdn", f"gdn_{op}{mma}_{layout}_d{Dk}_{_STATE_NAME[st.dtype]}", dev)
    ahead = _prefetch_ahead(kern, 32 * warps, dev, grid, st.dtype, op == "verify_fused")
    return kern, grid, 32 * warps, slices, ahead


def _row_strides(name, a, ndim):
    if a.shape[-1] > 1 and a.strides[-1] != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (strides {a.strides})")
    return a.strides[:ndim - 1]


def _pending_args(dev, B, W, journal_arg, pending_journal, pending_row0, pending_len):
    """The fused mode's pending rows: (journal DeviceArg, row0, len) checked on ``dev``; the
    pending journal [Tp, W] float32 (W None: any width) must not overlap the journal being
    written (``journal_arg``, None for gdn_flush)."""
    pj = DeviceArg("pending_journal", pending_journal, dtype="float32", ndim=2, device=dev)
    if W is not None and pj.shape[1] != W:
        raise ValueError(f"pending_journal: expected [Tp, {W}] (the journal width of this "
                         f"state and these heads), got {list(pj.shape)}")
    _row_strides("pending_journal", pj, 2)
    if journal_arg is not None and pj.shape[0] and journal_arg.shape[0]:
        lo, hi = _extent(pj), _extent(journal_arg)
        if lo[0] < hi[1] and hi[0] < lo[1]:
            raise ValueError("pending_journal: overlaps journal (the kernel reads the previous "
                             "round's rows while it writes this round's: use two buffers)")
    r0 = DeviceArg("pending_row0", pending_row0, dtype="int32", shape=(B,), device=dev,
                   contiguous=True)
    n = DeviceArg("pending_len", pending_len, dtype="int32", shape=(B,), device=dev,
                  contiguous=True)
    return pj, r0, n


def _extent(a):
    """[first byte, last byte + 1) of a 2-D float32 DeviceArg (non-negative strides)."""
    last = sum((d - 1) * st for d, st in zip(a.shape, a.strides))
    return a.ptr, a.ptr + 4 * (last + 1)


def _check_pending_on_host(check_indices, stream_h, r0, n, pending_rows):
    if check_indices and not runtime.driver().stream_is_capturing(stream_h):
        check_pending(to_host(r0, stream_h), to_host(n, stream_h), pending_rows, r0.shape[0])


def gdn_verify(q, k, v, state, slot_ids, cu_q, out, journal, *, g=None, beta=None, a=None,
               b=None, A_log=None, dt_bias=None, scale=None, qk_l2norm=False, layout="kv",
               status=None, check_indices=True, stream=None, pending_journal=None,
               pending_row0=None, pending_len=None):
    """Outputs of every block row of a speculative round; the state is only read.

    q, k: [T, Hk, Dk]; v: [T, Hv, Dv] (one float dtype: float32/float16/bfloat16; the
    last dimension contiguous, other strides free, so views into a fused projection
    work). Gating: ``g``, ``beta`` [T, Hv] (any float dtype), or raw ``a``, ``b`` [T, Hv]
    with ``A_log``, ``dt_bias`` [Hv] for g = -exp(A_log) softplus(a + dt_bias),
    beta = sigmoid(b). ``qk_l2norm``: q, k <- x / sqrt(sum x^2 + 1e-6) in the kernel.
    ``scale`` defaults to 1/sqrt(Dk). state: pool [slots, Hv, Dk, Dv] (``layout="kv"``)
    or [slots, Hv, Dv, Dk] (``"vk"``), float32/float16/bfloat16, Dk in {64, 128}, Dv a
    multiple of 16; slot_ids [B] int32 (< 0: padding row, outputs zero); cu_q [B+1]
    int32. Writes out [T, Hv, Dv] (any float dtype) and journal float32
    [T, gdn_journal_width(Hk, Hv, Dk, Dv)] (what gdn_commit replays); status, optional
    int32 [B]: 0, or SPECDEC_GDN_* bits for a row the kernel skipped.

    ``check_indices`` (default) copies slot_ids/cu_q to the host and raises ValueError
    on out-of-range or shared slots and bad offsets before launch; pass False in a
    captured graph or hot loop (skipped automatically while the stream is capturing):
    the kernel then flags such rows in ``status`` and never faults.

    Fused mode (the commit of round r folded into the verify of round r+1: one state read
    and one write per round instead of three passes): pass ``pending_journal`` (the
    previous round's journal, a different buffer from ``journal``), ``pending_row0`` and
    ``pending_len`` (int32 [B]: sequence b's accepted rows of that journal, 0 = nothing
    pending, e.g. a sequence that joins the batch). Each state is first advanced over its
    pending rows exactly as gdn_commit would (bit for bit) and written back, then the block
    is verified from it. The state then lags the accepted tokens by one round: call
    ``gdn_flush`` for sequences that leave (or before reading their state). A bad pending
    range raises with ``check_indices``; without, the kernel skips that commit and sets
    SPECDEC_GDN_BAD_PENDING (8) in ``status``.

    Example::

        W = gdn_journal_width(Hk, Hv, 128, 128)
        gdn_verify(q, k, v, pool, slot_ids, cu_q, o, journal, a=a, b=b, A_log=A_log,
                   dt_bias=dt_bias, qk_l2norm=True)
        ...  # sample -> accept_len
        gdn_commit(pool, slot_ids, cu_q, accept_len, journal)
    """
    st, slots, Hv, Dk, Dv = _state_arg(state, layout)
    dev = st.device
    qa = DeviceArg("q", q, dtype=_FLOATS, ndim=3, device=dev)
    T, Hk = qa.shape[0], qa.shape[1]
    if qa.shape[2] != Dk:
        raise ValueError(f"q: expected [T, Hk, Dk={Dk}] (Dk from state, layout {layout!r}), "
                         f"got {list(qa.shape)}")
    ka = DeviceArg("k", k, dtype=qa.dtype, shape=qa.shape, device=dev)
    va = DeviceArg("v", v, dtype=qa.dtype, shape=(T, Hv, Dv), device=dev)
    if Hk == 0 or Hv % Hk:
        raise ValueError(f"q / state: value heads Hv={Hv} must be a multiple of key heads Hk={Hk}")
    oa = DeviceArg("out", out, dtype=_FLOATS, shape=(T, Hv, Dv), device=dev)
    W = gdn_journal_width(Hk, Hv, Dk, Dv)
    ja = DeviceArg("journal", journal, dtype="float32", shape=(T, W), device=dev)
    fused = check_gating(g, beta, a, b, A_log, dt_bias)
    if fused:
        g0 = DeviceArg("a", a, dtype=_FLOATS, shape=(T, Hv), device=dev)
        g1 = DeviceArg("b", b, dtype=_FLOATS, shape=(T, Hv), device=dev)
        al = DeviceArg("A_log", A_log, dtype=_FLOATS, shape=(Hv,), device=dev, contiguous=True)
        db = DeviceArg("dt_bias", dt_bias, dtype=_FLOATS, shape=(Hv,), device=dev, contiguous=True)
    else:
        g0 = DeviceArg("g", g, dtype=_FLOATS, shape=(T, Hv), device=dev)
        g1 = DeviceArg("beta", beta, dtype=_FLOATS, shape=(T, Hv), device=dev)
        al = db = DeviceArg("A_log", None, optional=True)
    B, sl, cq, _, sa = _batch_args(dev, slot_ids, cu_q, status)
    fused_mode = pending_journal is not None
    if fused_mode:
        pj, pr, pn = _pending_args(dev, B, W, ja, pending_journal, pending_row0, pending_len)
    elif pending_row0 is not None or pending_len is not None:
        raise ValueError("pending_row0 / pending_len: given without pending_journal")
    strides = []
    for name, arg in (("q", qa), ("k", ka), ("v", va), ("out", oa)):
        strides += list(_row_strides(name, arg, 3))
    gate_strides = [_row_strides(n, x, 2)[0] for n, x in ((g0.name, g0), (g1.name, g1))]
    _row_strides("journal", ja, 2)
    if max(T, slots, B) >= 2**31:
        raise ValueError("q/state/slot_ids: more than 2^31-1 rows, slots or sequences")
    scale = as_scale(scale, 1.0 / math.sqrt(Dk))
    stream_h = as_stream(stream)
    _check_batch_on_host(check_indices, stream_h, sl, cq, T, slots)
    if fused_mode:
        _check_pending_on_host(check_indices, stream_h, pr, pn, pj.shape[0])
        if B == 0:
            return out, journal
    elif B == 0 or (T == 0 and status is None):
        return out, journal   # (with a status the kernel still runs: every status[b] is written)
    kern, grid, block, slices, ahead = _gdn_launch(
        "verify_fused" if fused_mode else "verify", layout, st, Dk, Dv, Hv, B, dev,
        _warp_cols(st.dtype, Dk, verify=True))
    pending = (pj.ptr, pr.ptr, pn.ptr, pj.strides[0], pj.shape[0]) if fused_mode else (0, 0, 0, 0, 0)
    from .. import _gdn
    _gdn.launch_gdn_verify(
        kern, grid, block, stream_h, qa.ptr, ka.ptr, va.ptr, g0.ptr, g1.ptr,
        al.ptr, db.ptr, st.ptr, sl.ptr, cq.ptr, oa.ptr, ja.ptr, sa.ptr, strides, gate_strides,
        st.strides[0], ja.strides[0], T, B, Hk, Hv, Dv, slots, slices, bool(qk_l2norm), fused,
        _DT_CODE[qa.dtype], _DT_CODE[oa.dtype],
        [_DT_CODE[g0.dtype], _DT_CODE[g1.dtype], _DT_CODE.get(al.dtype, 0), _DT_CODE.get(db.dtype, 0)],
        scale, *pending, ahead)
    return out, journal


def gdn_flush(state, slot_ids, pending_journal, pending_row0, pending_len, *, layout="kv",
              status=None, check_indices=True, stream=None):
    """Commits the rows a fused-mode gdn_verify left pending, in place: state[slot_ids[b]]
    advances over rows pending_row0[b] .. + pending_len[b] - 1 of ``pending_journal`` (the
    last verify's journal), bit for bit as gdn_commit would. For sequences that leave the
    batch (pending_len 0 for the others) or before reading a state. Arguments as in
    gdn_verify's fused mode; slot_ids < 0 are skipped."""
    st, slots, Hv, Dk, Dv = _state_arg(state, layout)
    dev = st.device
    sl = DeviceArg("slot_ids", slot_ids, dtype="int32", ndim=1, device=dev, contiguous=True)
    B = sl.shape[0]
    pj, pr, pn = _pending_args(dev, B, None, None, pending_journal, pending_row0, pending_len)
    Hk = journal_num_k_heads(pj.shape[1], Hv, Dk, Dv, hint=" (was it written for this state?)")
    sa = DeviceArg("status", status, dtype="int32", shape=(B,), device=dev, contiguous=True,
                   optional=True)
    stream_h = as_stream(stream)
    if check_indices and not runtime.driver().stream_is_capturing(stream_h):
        check_batch(to_host(sl, stream_h), [0] * (B + 1), 0, slots)
    _check_pending_on_host(check_indices, stream_h, pr, pn, pj.shape[0])
    if B == 0:
        return state
    kern, grid, block, slices, ahead = _gdn_launch("verify_fused", layout, st, Dk, Dv, Hv, B, dev,
                                                   _warp_cols(st.dtype, Dk, verify=True))
    from .. import _gdn
    # the fused verify with no block (cu_q NULL): only the pending rows are replayed
    _gdn.launch_gdn_verify(
        kern, grid, block, stream_h, 0, 0, 0, 0, 0, 0, 0, st.ptr, sl.ptr, 0, 0,
        0, sa.ptr, [0] * 8, [0, 0], st.strides[0], 0, 0, B, Hk, Hv, Dv, slots, slices, False,
        False, 0, 0, [0, 0, 0, 0], 1.0, pj.ptr, pr.ptr, pn.ptr, pj.strides[0], pj.shape[0], ahead)
    return state


def gdn_commit(state, slot_ids, cu_q, accept_len, journal, *, layout="kv", status=None,
               check_indices=True, stream=None):
    """Advance each sequence's state over its first accept_len[b] block rows, in place.

    state / slot_ids / cu_q / layout: as given to gdn_verify; accept_len [B] int32 in
    0..q_b (0 leaves the state untouched, not even read); journal: the float32
    [T, Hk*Dk + Hv*Dv + 2*Hv] gdn_verify wrote (Hk is read from its width). The state
    is rounded to its dtype after every row, so the result equals one-token decoding of
    the accepted rows. ``check_indices``: as in gdn_verify, plus accept_len > q_b raises;
    without it the kernel leaves such a state untouched and flags ``status``.
    """
    st, slots, Hv, Dk, Dv = _state_arg(state, layout)
    dev = st.device
    ja = DeviceArg("journal", journal, dtype="float32", ndim=2, device=dev)
    T, W = ja.shape
    Hk = journal_num_k_heads(W, Hv, Dk, Dv, hint=" (was it written for this state?)")
    _row_strides("journal", ja, 2)
    B, sl, cq, al, sa = _batch_args(dev, slot_ids, cu_q, status, accept_len, commit=True)
    stream_h = as_stream(stream)
    _check_batch_on_host(check_indices, stream_h, sl, cq, T, slots, al)
    if B == 0 or (T == 0 and status is None):
        return state
    kern, grid, block, slices, ahead = _gdn_launch(
        "commit", layout, st, Dk, Dv, Hv, B, dev, _warp_cols(st.dtype, Dk, verify=False, layout=layout))
    from .. import _gdn
    _gdn.launch_gdn_commit(kern, grid, block, stream_h, st.ptr, sl.ptr, cq.ptr,
                           al.ptr, ja.ptr, sa.ptr, st.strides[0], ja.strides[0], T, B, Hk, Hv,
                           Dv, slots, slices, ahead)
    return state

