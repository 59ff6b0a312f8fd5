"""Contract of the sampling family: ``spec_sample``.

What a row's data can make wrong (NaN / +inf logits, a draft id outside the vocabulary, a
row with nothing to sample) is never refused here: the kernels and the reference flag the
block in ``status``. What the caller lays out -- dtypes, shapes, strides, the block
offsets ``cu_q`` against T and the width of ``emitted``, the draft vocabulary map -- is
refused before anything is written.
"""
from __future__ import annotations

import numpy as np

from .._args import DeviceArg
from ._core import check

TILE = 2048                 # tokens per tile of the two-level race (reference.sampling.TILE)
MAX_TILES = 1024            # SPEC_SAMPLE_MAX_TILES: the kernels' tile count limit
MAX_VOCAB = TILE * MAX_TILES   # V <= 2^21
LOGIT_DTYPES = ("float32", "float16", "bfloat16")


def check_filters(filters):
    """``filters`` is None, True or False (TypeError naming it otherwise)."""
    if filters is not None and not isinstance(filters, (bool, np.bool_)):
        raise TypeError(f"filters: expected None, True or False, got {filters!r}")


def spec_sample_layout(cu_q, num_rows, width):
    """spec_sample's value checks of the block offsets (numpy values): ``cu_q`` starts at 0,
    grows by at least 1 per block (every block has its bonus row) and ends at T =
    ``num_rows``; ``emitted``'s ``width`` W holds the longest block. ValueError naming the
    argument (the kernels flag what gets past unchecked: status 4, bad layout)."""
    cu = np.asarray(cu_q, dtype=np.int64)
    B = cu.shape[0] - 1
    if B == 0:
        if num_rows != 0:
            raise ValueError(f"cu_q: no blocks, but logits has T={num_rows} rows")
        return
    q = np.diff(cu)
    if cu[0] != 0 or np.any(q < 1) or cu[-1] != num_rows:
        raise ValueError(f"cu_q: must start at 0, grow by at least 1 per block (every block "
                         f"has a row) and end at T={num_rows}; got {cu.tolist()[:16]}")
    longest = int(q.max())
    if longest > width:
        b = int(np.argmax(q > width))
        raise ValueError(f"emitted: {width} columns, but block {b} has {int(q[b])} rows "
                         f"(emitted needs at least the longest block's {longest} columns)")


def d2t_values(d2t, vocab):
    """d2t must be strictly increasing target ids in [0, V) (numpy values)."""
    d = np.asarray(d2t, dtype=np.int64)
    if d.size and (np.any(np.diff(d) <= 0) or d.min() < 0 or d.max() >= vocab):
        raise ValueError(f"d2t: must be strictly increasing target ids in [0, V={vocab})")


def _vec(arg, name, obj, dtype, n, dev):
    return arg(name, obj, dtype=dtype, shape=(n,), device=dev, contiguous=True)


@check("spec_sample")
def spec_sample(logits, cu_q, draft_ids, temperature, top_k, top_p, min_p, seed, step,
                num_accepted, emitted, status, draft_probs=None, d2t=None,
                accepted_logprobs=None, *, filters=None, arg=DeviceArg, values=None, **_):
    """logits [T, V] float32/float16/bfloat16, V contiguous, 1 <= V <= 2^21; cu_q [B+1]
    int32; draft_ids [T-B] int32; temperature, top_p, min_p [B] float32; top_k [B] int32;
    seed [B] uint64/int64; step [B] int64; num_accepted, status [B] int32; emitted [B, W]
    int32, W >= 1, last dim contiguous; accepted_logprobs optional [B, W] float32, last dim
    contiguous; draft_probs optional [T-B, Vd] float32, last dim contiguous, Vd = V unless
    d2t [Vd] int32 is given (only with draft_probs). [B] vectors, cu_q, draft_ids and d2t
    contiguous. ``filters`` None/True/False. With ``values``: ``spec_sample_layout`` on
    cu_q and ``d2t_values``. Returns the views (logits, cu_q, draft_ids, temperature, top_k,
    top_p, min_p, seed, step, num_accepted, emitted, status, draft_probs, d2t,
    accepted_logprobs)."""
    check_filters(filters)
    lg = arg("logits", logits, dtype=LOGIT_DTYPES, ndim=2)
    dev = lg.device
    T, V = lg.shape
    if V < 1:
        raise ValueError("logits: vocabulary size V must be >= 1")
    if V > MAX_VOCAB:
        raise ValueError(f"logits: V = {V} exceeds the supported {MAX_VOCAB}")
    if lg.strides[1] != 1 and V > 1:
        raise ValueError(f"logits: the vocabulary dimension must be contiguous (strides {lg.strides})")
    if T >= 2 ** 31:
        raise ValueError("logits: more than 2^31-1 rows")
    cq = arg("cu_q", cu_q, dtype="int32", ndim=1, device=dev, contiguous=True)
    B = cq.shape[0] - 1
    if B < 0:
        raise ValueError("cu_q: needs B+1 >= 1 entries")
    if T < B:
        raise ValueError(f"logits: {T} rows for {B} sequences (every block has >= 1 row)")
    di = _vec(arg, "draft_ids", draft_ids, "int32", T - B, dev)
    tp = _vec(arg, "temperature", temperature, "float32", B, dev)
    tk = _vec(arg, "top_k", top_k, "int32", B, dev)
    pp = _vec(arg, "top_p", top_p, "float32", B, dev)
    mp = _vec(arg, "min_p", min_p, "float32", B, dev)
    sd = _vec(arg, "seed", seed, ("uint64", "int64"), B, dev)
    st = _vec(arg, "step", step, "int64", B, dev)
    na = _vec(arg, "num_accepted", num_accepted, "int32", B, dev)
    ss = _vec(arg, "status", status, "int32", B, dev)
    em = arg("emitted", emitted, dtype="int32", ndim=2, device=dev)
    if em.shape[0] != B or em.shape[1] < 1:
        raise ValueError(f"emitted: expected shape [{B}, kmax+1 >= 1], got {list(em.shape)}")
    W = em.shape[1]
    if em.strides[1] != 1 and W > 1:
        raise ValueError(f"emitted: last dimension must be contiguous (strides {em.strides})")
    lp = arg("accepted_logprobs", accepted_logprobs, dtype="float32", shape=(B, W),
             device=dev, optional=True)
    if accepted_logprobs is not None and lp.strides[1] != 1 and W > 1:
        raise ValueError(f"accepted_logprobs: last dimension must be contiguous (strides {lp.strides})")
    if d2t is not None and draft_probs is None:
        raise ValueError("d2t: only meaningful with draft_probs")
    dp = arg("draft_probs", draft_probs, dtype="float32", ndim=2, device=dev, optional=True)
    Vd = 0
    if draft_probs is not None:
        if dp.shape[0] != T - B:
            raise ValueError(f"draft_probs: expected T-B = {T - B} rows, got {dp.shape[0]}")
        Vd = dp.shape[1]
        if dp.strides[1] != 1 and Vd > 1:
            raise ValueError(f"draft_probs: last dimension must be contiguous (strides {dp.strides})")
        if d2t is None and Vd != V:
            raise ValueError(f"draft_probs: {Vd} columns but V = {V} and no d2t map")
    dm = arg("d2t", d2t, dtype="int32", device=dev, contiguous=True, optional=True)
    if d2t is not None and dm.shape != (Vd,):
        raise ValueError(f"d2t: expected shape [{Vd}] (draft vocab), got {list(dm.shape)}")
    if values is not None:
        cu = values(cq)
        if cu is not None:
            spec_sample_layout(cu, T, W)
        if d2t is not None:
            m = values(dm)
            if m is not None:
                d2t_values(m, V)
    return lg, cq, di, tp, tk, pp, mp, sd, st, na, em, ss, dp, dm, lp
