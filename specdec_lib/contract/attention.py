"""Contract of the attention family: ``verify_attention`` and ``rope_append_kv`` (whose
rope part is layers' ``rope`` contract)."""
from __future__ import annotations

import math

import numpy as np

from .._args import DeviceArg, check_int
from .._validate import as_scale
from . import copy as copy_contract
from . import layers as layers_contract
from ._core import check

HEAD_DIMS = (64, 128, 256)      # verify_attention's head dims
MAX_Q_PER_SEQ = 16              # block rows per sequence
MAX_GROUP = 16                  # query heads per KV head
MAX_SPLITS = 1024               # KV splits (gridDim.z) we allow
# L + q and key indices are int32 in the kernel: keep a margin below 2^31 for a tile
MAX_CONTEXT = 2**31 - 2**20
_INT32_MAX = 2**31 - 1


def verify_attention_shapes(q_shape, k_shape, v_shape, pt_shape, sl_shape, cu_shape, out_shape,
                            lse_shape=None):
    """verify_attention's shape rules; returns (T, Hq, Hkv, D, B, page_size)."""
    if len(q_shape) != 3:
        raise ValueError(f"q: expected [T, Hq, D], got shape {tuple(q_shape)}")
    T, Hq, D = q_shape
    if len(k_shape) != 4:
        raise ValueError(f"k_cache: expected [num_pages, page_size, Hkv, D], got shape {tuple(k_shape)}")
    if tuple(v_shape) != tuple(k_shape):
        raise ValueError(f"v_cache: shape {tuple(v_shape)} != k_cache shape {tuple(k_shape)}")
    _, ps, Hkv, Dk = k_shape
    if D not in HEAD_DIMS:
        raise ValueError(f"q: head dim {D} not supported (supported: {HEAD_DIMS})")
    if Dk != D:
        raise ValueError(f"k_cache: head dim {Dk} != q head dim {D}")
    if ps < 1 or ps > 256 or (ps & (ps - 1)) != 0:
        raise ValueError(f"k_cache: page size {ps} must be a power of two in 1..256")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"q: {Hq} query heads is not a multiple of k_cache's {Hkv} KV heads")
    if Hq // Hkv > MAX_GROUP:
        raise ValueError(f"q: group size Hq/Hkv = {Hq // Hkv} exceeds {MAX_GROUP}")
    if len(pt_shape) != 2:
        raise ValueError(f"page_table: expected [B, max_pages], got shape {tuple(pt_shape)}")
    B = pt_shape[0]
    if tuple(sl_shape) != (B,):
        raise ValueError(f"seq_lens: expected shape ({B},), got {tuple(sl_shape)}")
    if tuple(cu_shape) != (B + 1,):
        raise ValueError(f"cu_q: expected shape ({B + 1},), got {tuple(cu_shape)}")
    if tuple(out_shape) != (T, Hq, D):
        raise ValueError(f"out: expected shape {(T, Hq, D)}, got {tuple(out_shape)}")
    if lse_shape is not None and tuple(lse_shape) != (T, Hq):
        raise ValueError(f"lse_out: expected shape {(T, Hq)}, got {tuple(lse_shape)}")
    return T, Hq, Hkv, D, B, ps


def verify_attention_values(page_table, seq_lens, cu_q, num_tokens, num_pages, page_size):
    """The index arrays' values (numpy): cu_q starts at 0, never decreases, at most 16
    rows per sequence and at most T in all (rows past cu_q[B] belong to no sequence and
    are left unwritten); lengths >= 0; the page table wide enough for L+q keys, its page
    ids inside the pool. ValueError naming the argument and the first bad sequence."""
    B, max_pages = page_table.shape
    cu = np.asarray(cu_q, dtype=np.int64)
    L = np.asarray(seq_lens, dtype=np.int64)
    if B and cu[0] != 0:
        raise ValueError(f"cu_q: must start at 0, got {cu[0]}")
    qn = np.diff(cu)
    if (qn < 0).any():
        b = int(np.argmax(qn < 0))
        raise ValueError(f"cu_q: decreasing at sequence {b} ({cu[b]} -> {cu[b + 1]})")
    if (qn > MAX_Q_PER_SEQ).any():
        b = int(np.argmax(qn > MAX_Q_PER_SEQ))
        raise ValueError(f"cu_q: sequence {b} has {qn[b]} block rows (at most {MAX_Q_PER_SEQ})")
    if B and cu[-1] > num_tokens:
        raise ValueError(f"cu_q: last offset {cu[-1]} exceeds q's {num_tokens} rows")
    if (L < 0).any():
        b = int(np.argmax(L < 0))
        raise ValueError(f"seq_lens: negative length {L[b]} at sequence {b}")
    need = -(-(L + qn) // page_size)
    if (need > max_pages).any():
        b = int(np.argmax(need > max_pages))
        raise ValueError(f"page_table: sequence {b} needs {need[b]} pages for L+q = {L[b] + qn[b]} "
                         f"keys but the table has {max_pages} columns")
    for b in range(B):
        ids = np.asarray(page_table[b, :need[b]], dtype=np.int64)
        bad = (ids < 0) | (ids >= num_pages)
        if bad.any():
            j = int(np.argmax(bad))
            raise ValueError(f"page_table: sequence {b} page {j} is {ids[j]}, "
                             f"outside the pool of {num_pages} pages")


def _head_dim_contiguous(a):
    if a.strides[-1] != 1:
        raise ValueError(f"{a.name}: the head dimension must be contiguous (strides {a.strides})")


@check("verify_attention")
def verify_attention(q, k_cache, v_cache, page_table, seq_lens, cu_q, out, scale=None,
                     lse_out=None, *, workspace=None, num_splits=None, max_kv_len=None,
                     max_q=None, k_scale=None, v_scale=None, k_params=None, v_params=None,
                     kv8=False, arg=DeviceArg, values=None, **_):
    """q [T, Hq, D] float16/bfloat16; k_cache, v_cache [num_pages, page_size, Hkv, D] and
    out [T, Hq, D] in q's dtype; page_table [B, max_pages] int32, rows contiguous;
    seq_lens [B], cu_q [B+1] int32 contiguous; lse_out [T, Hq] float32 or None; the
    shape rules of ``verify_attention_shapes``; head dimensions contiguous; sizes below
    2^31. scale finite, non-zero (default 1/sqrt(D)); max_q in 1..16 (default min(T, 16));
    max_kv_len in 1..MAX_CONTEXT-1 (default max_pages * page_size, which must stay below
    MAX_CONTEXT); num_splits in 1..MAX_SPLITS, more than one only with a workspace
    (contiguous bytes on q's device). With ``values``: ``verify_attention_values``.
    8-bit caches (dequantised on read, reference/kvquant.py): k_scale + v_scale (fp8) or
    k_params + v_params (int8), checked by ``contract.copy.kv8_cache_args`` (the caches
    then uint8 / float8_e4m3fn or int8 instead of q's dtype).
    Returns the views (q, k_cache, v_cache, page_table, seq_lens, cu_q, out, lse_out,
    workspace) and (scale, max_q, max_kv_len, num_splits) with the defaults filled in;
    with ``kv8=True`` also the views (k_scale, v_scale, k_params, v_params)."""
    fmt = copy_contract.kv_format(k_scale, v_scale, k_params, v_params)
    qa = arg("q", q, dtype=("float16", "bfloat16"), ndim=3)
    dev = qa.device
    cdt = qa.dtype if fmt is None else None
    kc = arg("k_cache", k_cache, dtype=cdt, ndim=4, device=dev)
    vc = arg("v_cache", v_cache, dtype=cdt, ndim=4, device=dev)
    pt = arg("page_table", page_table, dtype="int32", ndim=2, device=dev)
    sl = arg("seq_lens", seq_lens, dtype="int32", ndim=1, device=dev, contiguous=True)
    cq = arg("cu_q", cu_q, dtype="int32", ndim=1, device=dev, contiguous=True)
    oa = arg("out", out, dtype=qa.dtype, ndim=3, device=dev)
    la = arg("lse_out", lse_out, dtype="float32", ndim=2, device=dev, optional=True)
    T, Hq, Hkv, D, B, page_size = verify_attention_shapes(
        qa.shape, kc.shape, vc.shape, pt.shape, sl.shape, cq.shape, oa.shape,
        None if lse_out is None else la.shape)
    q8 = (None, None, None, None)
    if fmt is not None:
        q8 = copy_contract.kv8_cache_args(fmt, kc, vc, k_scale, v_scale, k_params, v_params,
                                          arg=arg, values=values)
    num_pages, max_pages = kc.shape[0], pt.shape[1]
    for a in (qa, kc, vc, oa):
        _head_dim_contiguous(a)
    if max_pages > 1 and pt.strides[1] != 1:
        raise ValueError(f"page_table: rows must be contiguous (strides {pt.strides})")
    if num_pages >= 2**31 or T >= 2**31 or max_pages >= 2**31:
        raise ValueError("k_cache/q/page_table: sizes of 2^31 or more are not supported")
    scale = as_scale(scale, 1.0 / math.sqrt(D))
    if max_q is None:
        max_q = min(T, MAX_Q_PER_SEQ)
    else:
        max_q = check_int("max_q", max_q, 1, MAX_Q_PER_SEQ)
    if max_kv_len is None:
        max_kv_len = max_pages * page_size
        if max_kv_len >= MAX_CONTEXT:
            raise ValueError(f"page_table: {max_pages} pages of {page_size} rows exceed the "
                             f"{MAX_CONTEXT}-position context limit (positions are int32 in "
                             "the kernel); pass max_kv_len")
    else:
        max_kv_len = check_int("max_kv_len", max_kv_len, 1, MAX_CONTEXT - 1)
    if num_splits is not None:
        num_splits = check_int("num_splits", num_splits, 1, MAX_SPLITS)
    ws = arg("workspace", workspace, device=dev, contiguous=True, optional=True)
    if workspace is None and num_splits is not None and num_splits > 1:
        raise ValueError(f"workspace: num_splits={num_splits} needs a workspace of "
                         "verify_attention_workspace_size(...) bytes")
    if values is not None:
        idx = [values(a) for a in (pt, sl, cq)]
        if all(x is not None for x in idx):
            verify_attention_values(*idx, T, num_pages, page_size)
    if kv8:
        return (qa, kc, vc, pt, sl, cq, oa, la, ws, scale, max_q, max_kv_len, num_splits) + q8
    return qa, kc, vc, pt, sl, cq, oa, la, ws, scale, max_q, max_kv_len, num_splits


@check("rope_append_kv")
def rope_append_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, page_table, seq_lens,
                   cu_q, finished=None, *, k_scale=None, v_scale=None, k_params=None,
                   v_params=None, kv8=False, arg=DeviceArg, values=None, **_):
    """rope's contract (``contract.layers.rope``) with k required, then append_kv's
    contract (``contract.copy.append_kv``, values included); k_cache in q's dtype;
    (Hq + 2 Hk) * D below 2^31. Returns the views (q, k, v,
    k_cache, v_cache, positions, cos_sin_cache, page_table, seq_lens, cu_q, finished);
    8-bit caches as append_kv's (k_scale/v_scale or k_params/v_params; the cache is then
    not tied to q's dtype), their views appended with ``kv8=True``."""
    if k is None:
        raise TypeError("k: required (rope_append_kv appends the rotated k)")
    qa, ka, pa, ca, T, Hq, Hk, D = layers_contract.rope(q, k, positions, cos_sin_cache, arg=arg)
    # append_kv's checks take k_cache as their anchor: tie it to q first, so that a cache of
    # another dtype or device is reported as k_cache's fault, not v_cache's (its shape is
    # append_kv's anchor: k of other heads than the cache's is k's fault)
    fmt = copy_contract.kv_format(k_scale, v_scale, k_params, v_params)
    arg("k_cache", k_cache, dtype=qa.dtype if fmt is None else None, ndim=4, device=qa.device)
    if fmt is not None:
        arg("v", v, dtype=qa.dtype, ndim=3, device=qa.device)
    if (Hq + 2 * Hk) * D >= _INT32_MAX:
        raise ValueError(f"q: {Hq} + 2 x {Hk} heads of {D} are too many (the kernel's "
                         "per-token index is int32)")
    r = copy_contract.append_kv(
        k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished, k_scale=k_scale,
        v_scale=v_scale, k_params=k_params, v_params=v_params, kv8=True, arg=arg, values=values)
    ka, va, kc, vc, pt, sl, cq, fin = r[:8]
    if kv8:
        return (qa, ka, va, kc, vc, pa, ca, pt, sl, cq, fin) + tuple(r[8:])
    return qa, ka, va, kc, vc, pa, ca, pt, sl, cq, fin
