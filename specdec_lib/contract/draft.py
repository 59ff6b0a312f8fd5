"""Contract of the draft family: ``draft_carry``, ``capture_hidden``, ``draft_combine``,
``draft_map_tokens``, ``ngram_propose``.

Device data the kernels never trust, and so no contract refuses: a draft id outside the
draft vocabulary, a token id outside the embedding table (a zero embedding half), an
``accept_len`` <= 0 (a zero carry row)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .._args import DeviceArg, check_int
from ._core import check
from .layers import FLOATS, last_contiguous

NGRAM_MAX_N = 32        # longest n-gram matched (the kernel keeps the pattern in shared memory)
NGRAM_MAX_DRAFT = 64    # K: draft tokens per sequence
_INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------- draft_carry
def carry_offsets(cu_q):
    """draft_carry's value check (numpy): the global block offsets cu_q start at 0 and
    never decrease (they need not end at the local rows: shards and padded buckets)."""
    cu_q = np.asarray(cu_q, dtype=np.int64)
    if cu_q.shape[0] and (cu_q[0] != 0 or np.any(np.diff(cu_q) < 0)):
        raise ValueError(f"cu_q: must start at 0 and never decrease; got {cu_q.tolist()[:16]}")


@check("draft_carry")
def draft_carry(hidden, cu_q, accept_len, out, *, row_begin=0, col_begin=0, arg=DeviceArg,
                values=None, **_):
    """hidden [T, H] any dtype; out [B, H_out] hidden's dtype (exactly: the rows move bit
    for bit); accept_len int32 [B], cu_q int32 [B+1], contiguous; last dimensions
    contiguous; row_begin, col_begin ints >= 0 with col_begin + H <= H_out. With
    ``values`` (the host paths), ``carry_offsets``. Returns (hidden, cu_q, accept_len,
    out, row_begin, col_begin)."""
    h = arg("hidden", hidden, ndim=2)
    dev = h.device
    o = arg("out", out, ndim=2, device=dev)
    if o.dtype != h.dtype:
        raise TypeError(f"out: dtype {o.dtype} differs from hidden's {h.dtype}")
    al = arg("accept_len", accept_len, dtype="int32", ndim=1, device=dev, contiguous=True)
    B = al.shape[0]
    cq = arg("cu_q", cu_q, dtype="int32", shape=(B + 1,), device=dev, contiguous=True)
    if o.shape[0] != B:
        raise ValueError(f"out: expected shape [{B}, *] (batch from accept_len), got "
                         f"{list(o.shape)}")
    H = h.shape[1]
    H_out = o.shape[1]
    row_begin = check_int("row_begin", row_begin, 0)
    col_begin = check_int("col_begin", col_begin, 0)
    if col_begin + H > H_out:
        raise ValueError(f"col_begin: columns {col_begin}..{col_begin + H} of hidden do not fit "
                         f"out's {H_out} columns")
    last_contiguous(h)
    last_contiguous(o)
    if B > _INT32_MAX:
        raise ValueError(f"accept_len: batch {B} exceeds the int32 range")
    if values is not None:
        cqv = values(cq)
        if cqv is not None:
            carry_offsets(cqv)
    return h, cq, al, o, row_begin, col_begin


# ---------------------------------------------------------------------------- capture_hidden
@check("capture_hidden")
def capture_hidden(hidden, out, tap, *, residual=None, arg=DeviceArg, values=None, **_):
    """hidden [T, H] float32/float16/bfloat16 (H >= 1, H < 2^30), out [T, taps*H] and
    residual [T, H] or None in hidden's dtype, last dimensions contiguous; tap an int in
    0..taps-1. Returns (hidden, out, residual, tap)."""
    h = arg("hidden", hidden, dtype=FLOATS, ndim=2)
    dev = h.device
    T, H = h.shape
    o = arg("out", out, dtype=h.dtype, ndim=2, device=dev)
    if o.shape[0] != T:
        raise ValueError(f"out: {o.shape[0]} rows != hidden's {T}")
    if H == 0 or o.shape[1] % H:
        raise ValueError(f"out: {o.shape[1]} columns is not a multiple of H={H}")
    taps = o.shape[1] // H
    tap = check_int("tap", tap, 0, taps - 1)
    r = arg("residual", residual, dtype=h.dtype, shape=(T, H), device=dev, optional=True)
    for a in (h, o, r):
        if a.obj is not None:
            last_contiguous(a)
    if H >= 2**30:   # the kernel's column index (block * unroll * threads + thread) is int32
        raise ValueError(f"hidden: width {H} is too wide (at most 2^30 - 1)")
    return h, o, r, tap


# ---------------------------------------------------------------------------- draft_combine
@check("draft_combine")
def draft_combine(embed, hidden, embed_norm_weight, hidden_norm_weight, out, *, token_ids=None,
                  eps=1e-6, unit_offset=False, arg=DeviceArg, values=None, **_):
    """hidden [rows, H] float32/float16/bfloat16; embed [rows, H] (or a table [V, H] with
    token_ids int32/int64 [rows] contiguous) and out [rows, 2H] in hidden's dtype; last
    dimensions contiguous; the two norm weights [H] contiguous, one dtype: hidden's or
    float32; eps a finite float >= 0. Returns (embed, hidden, embed_norm_weight,
    hidden_norm_weight, out, token_ids, eps)."""
    hd = arg("hidden", hidden, dtype=FLOATS, ndim=2)
    dev = hd.device
    rows, H = hd.shape
    dt = hd.dtype
    em = arg("embed", embed, dtype=dt, ndim=2, device=dev)
    if em.shape[1] != H:
        raise ValueError(f"embed: width {em.shape[1]} != hidden width {H}")
    o = arg("out", out, dtype=dt, shape=(rows, 2 * H), device=dev)
    wdt = (dt, "float32") if dt != "float32" else "float32"
    we = arg("embed_norm_weight", embed_norm_weight, dtype=wdt, shape=(H,), device=dev,
             contiguous=True)
    wh = arg("hidden_norm_weight", hidden_norm_weight, dtype=we.dtype, shape=(H,),
             device=dev, contiguous=True)
    ids = arg("token_ids", token_ids, dtype=("int32", "int64"), shape=(rows,), device=dev,
              contiguous=True, optional=True)
    if token_ids is None and em.shape[0] != rows:
        raise ValueError(f"embed: {em.shape[0]} rows != hidden's {rows} (pass token_ids to "
                         f"gather from an embedding table)")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) \
            or eps < 0:
        raise ValueError(f"eps: expected a finite float >= 0, got {eps!r}")
    for a in (em, hd, o):
        last_contiguous(a)
    if H > _INT32_MAX // 2 or rows > _INT32_MAX:
        raise ValueError(f"hidden: shape {list(hd.shape)} exceeds the int32 range")
    return em, hd, we, wh, o, ids, float(eps)


# ---------------------------------------------------------------------------- draft_map_tokens
@check("draft_map_tokens")
def draft_map_tokens(draft_ids, d2t, out, *, offsets=True, arg=DeviceArg, values=None, **_):
    """draft_ids [N] and d2t [Vd] int32/int64, out int32 [N]; all contiguous. Returns
    (draft_ids, d2t, out)."""
    di = arg("draft_ids", draft_ids, dtype=("int32", "int64"), ndim=1, contiguous=True)
    dev = di.device
    N = di.shape[0]
    m = arg("d2t", d2t, dtype=("int32", "int64"), ndim=1, device=dev, contiguous=True)
    o = arg("out", out, dtype="int32", shape=(N,), device=dev, contiguous=True)
    return di, m, o


# ---------------------------------------------------------------------------- ngram_propose
def _plain_int(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    return int(v)


def ngram_args(min_n, max_n, num_slots):
    """``1 <= min_n <= max_n <= NGRAM_MAX_N`` and ``1 <= K <= NGRAM_MAX_DRAFT`` (K: the
    width of draft_tokens); TypeError/ValueError naming the argument. Returns
    ``(min_n, max_n)`` as ints."""
    min_n = _plain_int("min_n", min_n)
    max_n = _plain_int("max_n", max_n)
    if min_n < 1:
        raise ValueError(f"min_n: must be >= 1, got {min_n}")
    if max_n > NGRAM_MAX_N:
        raise ValueError(f"max_n: must be <= {NGRAM_MAX_N}, got {max_n}")
    if max_n < min_n:
        raise ValueError(f"max_n: must be >= min_n = {min_n}, got {max_n}")
    if not 1 <= num_slots <= NGRAM_MAX_DRAFT:
        raise ValueError(f"draft_tokens: K = {num_slots} draft slots per sequence, expected "
                         f"1..{NGRAM_MAX_DRAFT}")
    return min_n, max_n


def ngram_lengths(prompt_lens, output_lens, P, O):
    """ngram_propose's value check (numpy): ValueError naming the array and row when a
    length lies outside 0..P / 0..O."""
    for name, lens, cap in (("prompt_lens", prompt_lens, P), ("output_lens", output_lens, O)):
        lens = np.asarray(lens)
        bad = np.flatnonzero((lens < 0) | (lens > cap))
        if bad.size:
            b = int(bad[0])
            raise ValueError(f"{name}: {int(lens[b])} at row {b} is outside 0..{cap}")


def _token_rows(arg, name, obj, B, dev, width):
    """An int32 [B, width] token array of ngram_propose (rows strided, last dim contiguous)."""
    a = arg(name, obj, dtype="int32", ndim=2, device=dev)
    if a.shape[0] != B:
        raise ValueError(f"{name}: expected shape [{B}, {width}] (batch from prompt), got "
                         f"{list(a.shape)}")
    last_contiguous(a)
    return a


@check("ngram_propose")
def ngram_propose(prompt, prompt_lens, output, output_lens, draft_tokens, num_draft, *,
                  min_n=1, max_n=3, check_indices=True, arg=DeviceArg, values=None, **_):
    """prompt [B, P], output [B, O], draft_tokens [B, K] int32, last dimensions contiguous
    (rows strided); prompt_lens, output_lens, num_draft int32 [B] contiguous; 1 <= K <= 64;
    ``ngram_args`` for min_n / max_n; P + O and B below 2^31. With ``values`` and
    ``check_indices``, ``ngram_lengths``. Returns (prompt, prompt_lens, output, output_lens,
    draft_tokens, num_draft, min_n, max_n)."""
    pr = arg("prompt", prompt, dtype="int32", ndim=2)
    last_contiguous(pr)
    dev = pr.device
    B, P = pr.shape
    pl = arg("prompt_lens", prompt_lens, dtype="int32", shape=(B,), device=dev, contiguous=True)
    ou = _token_rows(arg, "output", output, B, dev, "O")
    ol = arg("output_lens", output_lens, dtype="int32", shape=(B,), device=dev, contiguous=True)
    dt = _token_rows(arg, "draft_tokens", draft_tokens, B, dev, "K")
    nd = arg("num_draft", num_draft, dtype="int32", shape=(B,), device=dev, contiguous=True)
    O, K = ou.shape[1], dt.shape[1]
    min_n, max_n = ngram_args(min_n, max_n, K)
    if P + O > _INT32_MAX:
        raise ValueError(f"prompt/output: P + O = {P + O} tokens exceeds the int32 range")
    if B > _INT32_MAX:
        raise ValueError(f"prompt: batch {B} exceeds the int32 range")
    if values is not None and check_indices and B:
        lens = values(pl), values(ol)
        if lens[0] is not None and lens[1] is not None:
            ngram_lengths(*lens, P, O)
    return pr, pl, ou, ol, dt, nd, min_n, max_n
