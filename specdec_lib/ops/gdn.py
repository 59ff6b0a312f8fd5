"""gdn_verify / gdn_commit on the GPU (kernels: cuda_src/gdn/gdn.cu).

The gated delta rule of a speculative round, split transactionally: ``gdn_verify``
reads each sequence's recurrent state once and writes the outputs of every block row
plus a journal; after sampling, ``gdn_commit`` replays the journal over the accepted
rows, reading and writing the state once. Semantics, precision contract and journal
layout: ``specdec_lib.reference.gdn`` (the numpy twin these are tested against).
"""
from __future__ import annotations

import os
from typing import Optional

from .. import runtime
from .._validate import as_stream
from ..contract import gdn as contract
from ..contract import index_values
from ..contract.gdn import gdn_journal_width  # noqa: F401 (public here too)
from ._types import ArrayLike, Stream

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
# small_heads: a launch of at most this many (sequence, value head) pairs, B * Hv, takes the
# small-batch shape (_small_batch; gdn.cu "small batches"); None = _SMALL_HEADS, 0 = never. There
# the CUDA-core family runs its gdn_*_small_* kernels (8 columns per warp, the state slice
# prefetched into L2 before the PDL wait) with 4 warps a CTA (8 for blocks longer than 4 rows), so
# that the block rows are staged side by side; the tensor-core family keeps its kernels with the
# same warp counts. Outputs and states are bit-identical to the default shape's (the same
# per-column sums), so batches of any size may share a pool.
TUNING = {"warps": None, "l2_prefetch": None, "mma16": None, "small_heads": None}
# B * Hv up to which the small-batch shape is used: 64 is B <= 2 at Hv = 32, 128-256 CTAs of 4
# warps on the H200's 132 SMs; the default shape there is 256-512 one-warp CTAs (B = 1: 8.4 us a
# fused round, 6 us a verify). Not measured above B = 1 (B = 8 fills the GPU either way).
_SMALL_HEADS = 64
_SMALL_WARP_COLS = 8    # gdn.cu kSmallWarpCols (2 x kSmallCj)


def _small_batch(B, Hv):
    """Whether a launch over B sequences x Hv value heads takes the small-batch shape."""
    n = TUNING["small_heads"]
    return B * Hv <= (_SMALL_HEADS if n is None else n)


def _warps_and_slices(Dv, warp_cols, pick, state_dtype=None):
    """(warps per CTA, slices per head): TUNING["warps"] where it divides the head, else
    ``pick(candidates)`` of the warp counts (8, 4, 2, 1: widest first) that do."""
    cands = [w for w in (8, 4, 2, 1) if Dv % (w * warp_cols) == 0 and w * warp_cols <= 128]
    if not cands:
        what = f" for a {state_dtype} state" if state_dtype else ""
        raise ValueError(f"state: head_v_dim Dv={Dv} must be a multiple of {warp_cols}{what}")
    w = TUNING["warps"] if TUNING["warps"] in cands else pick(cands)
    return w, Dv // (w * warp_cols)


def _small_shape(Dv, warp_cols, rows_per_seq):
    """(warps per CTA, slices per head) of the small-batch shape: one warp per block row (4, or 8
    for longer blocks; fewer where Dv has fewer columns), TUNING["warps"] where it fits."""
    want = 8 if rows_per_seq > 4 else 4
    return _warps_and_slices(Dv, warp_cols, lambda cands: next(c for c in cands if c <= want))


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
    ahead = runtime.resident_ctas(kern, block, device)
    return ahead if ahead < grid else 0

__all__ = ["gdn_verify", "gdn_commit", "gdn_flush", "gdn_journal_width"]



def _values(check_indices, stream_h):
    return index_values(stream_h) if check_indices else None


def _state_alignment(st):
    if st.ptr % 16 or (st.strides[0] * st.itemsize) % 16:
        raise ValueError("state: the pool and its slot stride must be 16-byte aligned")


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
    def widest_that_fills(cands):
        want = 4 * runtime.sm_count(device)          # CTAs for a few waves
        return next((c for c in cands if c <= 4 and B * Hv * (Dv // (c * warp_cols)) >= want),
                    cands[-1])
    return _warps_and_slices(Dv, warp_cols, widest_that_fills, state_dtype)


def _gdn_launch(op, layout, st, Dk, Dv, Hv, B, dev, warp_cols, rows):
    """(kernel, grid, block, slices, prefetch distance) of gdn kernel ``op`` ("verify",
    "commit", "verify_fused") for this state and batch; ``rows``: the block (or pending
    journal) rows of the launch, for the small-batch shape's warp count. The one place where
    the small-batch path is chosen (_small_batch)."""
    mma = _use_mma16(st.dtype, layout)
    if _small_batch(B, Hv):
        wc = warp_cols if mma else _SMALL_WARP_COLS
        warps, slices = _small_shape(Dv, wc, -(-rows // B))
        variant = "_mma" if mma else "_small"
    else:
        warps, slices = _launch_shape(B, Hv, Dv, st.dtype, dev, warp_cols)
        variant = "_mma" if mma else ""
    grid = B * Hv * slices
    if grid >= 2**31:   # grid.x
        raise ValueError(f"slot_ids: {B} sequences x {Hv} heads x {slices} slices exceed one launch")
    kern = runtime.kernel("gdn", f"gdn_{op}{variant}_{layout}_d{Dk}_{_STATE_NAME[st.dtype]}", dev)
    ahead = _prefetch_ahead(kern, 32 * warps, dev, grid, st.dtype, op == "verify_fused")
    return kern, grid, 32 * warps, slices, ahead


def gdn_verify(q: ArrayLike, k: ArrayLike, v: ArrayLike, state: ArrayLike, slot_ids: ArrayLike,
               cu_q: ArrayLike, out: ArrayLike, journal: ArrayLike, *, g: Optional[ArrayLike] = None,
               beta: Optional[ArrayLike] = None, a: Optional[ArrayLike] = None,
               b: Optional[ArrayLike] = None, A_log: Optional[ArrayLike] = None,
               dt_bias: Optional[ArrayLike] = None, scale: Optional[float] = None,
               qk_l2norm: bool = False, layout: str = "kv", status: Optional[ArrayLike] = None,
               check_indices: bool = True, stream: Stream = None,
               pending_journal: Optional[ArrayLike] = None, pending_row0: Optional[ArrayLike] = None,
               pending_len: Optional[ArrayLike] = None):
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
    stream_h = as_stream(stream)
    st, qa, ka, va, oa, ja, g0, g1, al, db, sl, cq, sa, pending, fused, scale = contract.gdn_verify(
        q, k, v, state, slot_ids, cu_q, out, journal, g=g, beta=beta, a=a, b=b, A_log=A_log,
        dt_bias=dt_bias, scale=scale, layout=layout, status=status, pending_journal=pending_journal,
        pending_row0=pending_row0, pending_len=pending_len,
        values=_values(check_indices, stream_h))
    _state_alignment(st)
    dev = st.device
    slots, Hv = st.shape[0], st.shape[1]
    T, Hk, Dk = qa.shape
    Dv = va.shape[2]
    B = sl.shape[0]
    fused_mode = pending is not None
    if fused_mode:
        pj, pr, pn = pending
        if B == 0:
            return out, journal
    elif B == 0 or (T == 0 and status is None):
        return out, journal   # (with a status the kernel still runs: every status[b] is written)
    strides = [*qa.strides[:2], *ka.strides[:2], *va.strides[:2], *oa.strides[:2]]
    gate_strides = [g0.strides[0], g1.strides[0]]
    kern, grid, block, slices, ahead = _gdn_launch(
        "verify_fused" if fused_mode else "verify", layout, st, Dk, Dv, Hv, B, dev,
        _warp_cols(st.dtype, Dk, verify=True), max(T, pj.shape[0] if fused_mode else 0))
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


def gdn_flush(state: ArrayLike, slot_ids: ArrayLike, pending_journal: ArrayLike,
              pending_row0: ArrayLike, pending_len: ArrayLike, *, layout: str = "kv",
              status: Optional[ArrayLike] = None, check_indices: bool = True,
              stream: Stream = None):
    """Commits the rows a fused-mode gdn_verify left pending, in place: state[slot_ids[b]]
    advances over rows pending_row0[b] .. + pending_len[b] - 1 of ``pending_journal`` (the
    last verify's journal), bit for bit as gdn_commit would. For sequences that leave the
    batch (pending_len 0 for the others) or before reading a state. Arguments as in
    gdn_verify's fused mode; slot_ids < 0 are skipped."""
    stream_h = as_stream(stream)
    st, sl, pj, pr, pn, Hk, sa = contract.gdn_flush(
        state, slot_ids, pending_journal, pending_row0, pending_len, layout=layout, status=status,
        values=_values(check_indices, stream_h))
    _state_alignment(st)
    dev = st.device
    slots, Hv, d1, d2 = st.shape
    Dk, Dv = (d1, d2) if layout == "kv" else (d2, d1)
    B = sl.shape[0]
    if B == 0:
        return state
    kern, grid, block, slices, ahead = _gdn_launch("verify_fused", layout, st, Dk, Dv, Hv, B, dev,
                                                   _warp_cols(st.dtype, Dk, verify=True), pj.shape[0])
    from .. import _gdn
    # the fused verify with no block (cu_q NULL): only the pending rows are replayed
    _gdn.launch_gdn_verify(
        kern, grid, block, stream_h, 0, 0, 0, 0, 0, 0, 0, st.ptr, sl.ptr, 0, 0,
        0, sa.ptr, [0] * 8, [0, 0], st.strides[0], 0, 0, B, Hk, Hv, Dv, slots, slices, False,
        False, 0, 0, [0, 0, 0, 0], 1.0, pj.ptr, pr.ptr, pn.ptr, pj.strides[0], pj.shape[0], ahead)
    return state


def gdn_commit(state: ArrayLike, slot_ids: ArrayLike, cu_q: ArrayLike, accept_len: ArrayLike,
               journal: ArrayLike, *, layout: str = "kv", status: Optional[ArrayLike] = None,
               check_indices: bool = True, stream: Stream = None):
    """Advance each sequence's state over its first accept_len[b] block rows, in place.

    state / slot_ids / cu_q / layout: as given to gdn_verify; accept_len [B] int32 in
    0..q_b (0 leaves the state untouched, not even read); journal: the float32
    [T, Hk*Dk + Hv*Dv + 2*Hv] gdn_verify wrote (Hk is read from its width). The state
    is rounded to its dtype after every row, so the result equals one-token decoding of
    the accepted rows. ``check_indices``: as in gdn_verify, plus accept_len > q_b raises;
    without it the kernel leaves such a state untouched and flags ``status``.
    """
    stream_h = as_stream(stream)
    st, ja, Hk, sl, cq, al, sa = contract.gdn_commit(
        state, slot_ids, cu_q, accept_len, journal, layout=layout, status=status,
        values=_values(check_indices, stream_h))
    _state_alignment(st)
    dev = st.device
    slots, Hv, d1, d2 = st.shape
    Dk, Dv = (d1, d2) if layout == "kv" else (d2, d1)
    T, B = ja.shape[0], sl.shape[0]
    if B == 0 or (T == 0 and status is None):
        return state
    kern, grid, block, slices, ahead = _gdn_launch(
        "commit", layout, st, Dk, Dv, Hv, B, dev, _warp_cols(st.dtype, Dk, verify=False, layout=layout), T)
    from .. import _gdn
    _gdn.launch_gdn_commit(kern, grid, block, stream_h, st.ptr, sl.ptr, cq.ptr,
                           al.ptr, ja.ptr, sa.ptr, st.strides[0], ja.strides[0], T, B, Hk, Hv,
                           Dv, slots, slices, ahead)
    return state

