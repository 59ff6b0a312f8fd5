"""Contract of the sequence family: ``seq_stop``, ``seq_advance``, ``seq_build_block``.

Every array is int32 (``finished``: uint8), C-contiguous, on one device. No value is
checked here: the values these ops read (num_accepted, lengths, num_draft) are round state
in device memory that a captured round never shows the host, and the kernels (and the
reference) handle every value -- an out-of-range one flags the row FINISH_BAD_ROW, an
append past the buffer FINISH_CAPACITY, num_draft is clamped to 0..K.
"""
from __future__ import annotations

from .._args import DeviceArg
from ._core import check

_INT32_MAX = 2**31 - 1


def _i32(arg, name, obj, shape, dev, optional=False):
    return arg(name, obj, dtype="int32", shape=shape, device=dev, contiguous=True,
               optional=optional)


def _out_tokens(arg, out_tokens, B, dev):
    ot = arg("out_tokens", out_tokens, dtype="int32", ndim=2, device=dev, contiguous=True)
    if ot.shape[0] != B:
        raise ValueError(f"out_tokens: expected shape [{B}, *] (batch from emitted), got "
                         f"{list(ot.shape)}")
    return ot


def _finished(arg, finished, B, dev):
    return arg("finished", finished, dtype="uint8", shape=(B,), device=dev, contiguous=True)


def _fits_int32(name, *sizes):
    for s in sizes:
        if s > _INT32_MAX:
            raise ValueError(f"{name}: size {s} exceeds the int32 index range")


@check("seq_stop")
def seq_stop(emitted, num_accepted, out_tokens, out_lens, stop_ids, stop_seqs,
             max_new_tokens, accept_len, finished, *, arg=DeviceArg, values=None, **_):
    """emitted [B, W]; num_accepted, out_lens, max_new_tokens, accept_len [B];
    out_tokens [B, C]; stop_ids [B, S] or None; stop_seqs [B, NS, M] or None; finished [B]
    uint8. Returns the views (emitted, num_accepted, out_tokens, out_lens, stop_ids,
    stop_seqs, max_new_tokens, accept_len, finished)."""
    em = arg("emitted", emitted, dtype="int32", ndim=2, contiguous=True)
    dev = em.device
    B, W = em.shape
    na = _i32(arg, "num_accepted", num_accepted, (B,), dev)
    ot = _out_tokens(arg, out_tokens, B, dev)
    ol = _i32(arg, "out_lens", out_lens, (B,), dev)
    si = arg("stop_ids", stop_ids, dtype="int32", ndim=2, device=dev, contiguous=True,
             optional=True)
    ss = arg("stop_seqs", stop_seqs, dtype="int32", ndim=3, device=dev, contiguous=True,
             optional=True)
    if stop_ids is not None and si.shape[0] != B:
        raise ValueError(f"stop_ids: expected shape [{B}, S], got {list(si.shape)}")
    if stop_seqs is not None and ss.shape[0] != B:
        raise ValueError(f"stop_seqs: expected shape [{B}, NS, M], got {list(ss.shape)}")
    mn = _i32(arg, "max_new_tokens", max_new_tokens, (B,), dev)
    al = _i32(arg, "accept_len", accept_len, (B,), dev)
    fin = _finished(arg, finished, B, dev)
    S = si.shape[1] if stop_ids is not None else 0
    NS, M = (ss.shape[1], ss.shape[2]) if stop_seqs is not None else (0, 0)
    _fits_int32("emitted", B, W)
    _fits_int32("out_tokens", ot.shape[1])
    _fits_int32("stop_seqs", S, NS, M)
    return em, na, ot, ol, si, ss, mn, al, fin


@check("seq_advance")
def seq_advance(emitted, accept_len, seq_lens, out_tokens, out_lens, last_token, finished, *,
                arg=DeviceArg, values=None, **_):
    """emitted [B, W]; accept_len, seq_lens, out_lens, last_token [B]; out_tokens [B, C];
    finished [B] uint8. Returns the views (emitted, accept_len, seq_lens, out_tokens,
    out_lens, last_token, finished)."""
    em = arg("emitted", emitted, dtype="int32", ndim=2, contiguous=True)
    dev = em.device
    B, W = em.shape
    al = _i32(arg, "accept_len", accept_len, (B,), dev)
    sl = _i32(arg, "seq_lens", seq_lens, (B,), dev)
    ot = _out_tokens(arg, out_tokens, B, dev)
    ol = _i32(arg, "out_lens", out_lens, (B,), dev)
    lt = _i32(arg, "last_token", last_token, (B,), dev)
    fin = _finished(arg, finished, B, dev)
    _fits_int32("emitted", B, W)
    _fits_int32("out_tokens", ot.shape[1])
    return em, al, sl, ot, ol, lt, fin


@check("seq_build_block")
def seq_build_block(last_token, draft_tokens, num_draft, seq_lens, cu_q, block_tokens,
                    positions, draft_ids=None, *, arg=DeviceArg, values=None, **_):
    """last_token, num_draft, seq_lens [B]; draft_tokens [B, K]; cu_q [B+1]; block_tokens
    and positions 1-D with at least B*(K+1) elements, draft_ids 1-D with at least B*K or
    None (the worst case: T is only known where num_draft lives). Returns the views
    (last_token, draft_tokens, num_draft, seq_lens, cu_q, block_tokens, positions,
    draft_ids)."""
    lt = arg("last_token", last_token, dtype="int32", ndim=1, contiguous=True)
    dev = lt.device
    B = lt.shape[0]
    dt = arg("draft_tokens", draft_tokens, dtype="int32", ndim=2, device=dev, contiguous=True)
    if dt.shape[0] != B:
        raise ValueError(f"draft_tokens: expected shape [{B}, K] (batch from last_token), got "
                         f"{list(dt.shape)}")
    K = dt.shape[1]
    nd = _i32(arg, "num_draft", num_draft, (B,), dev)
    sl = _i32(arg, "seq_lens", seq_lens, (B,), dev)
    cq = _i32(arg, "cu_q", cu_q, (B + 1,), dev)
    _fits_int32("draft_tokens", B * (K + 1))
    bt = arg("block_tokens", block_tokens, dtype="int32", ndim=1, device=dev, contiguous=True)
    ps = arg("positions", positions, dtype="int32", ndim=1, device=dev, contiguous=True)
    di = arg("draft_ids", draft_ids, dtype="int32", ndim=1, device=dev, contiguous=True,
             optional=True)
    for a, need in ((bt, B * (K + 1)), (ps, B * (K + 1)), (di, B * K)):
        if a.obj is not None and a.shape[0] < need:
            raise ValueError(f"{a.name}: needs at least {need} elements (B={B} blocks of up to "
                             f"K+1={K + 1} rows), has {a.shape[0]}")
    return lt, dt, nd, sl, cq, bt, ps, di
