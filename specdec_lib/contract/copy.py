"""Contract of the copy family: ``copy`` and ``append_kv`` (``rope_append_kv`` shares
append_kv's)."""
from __future__ import annotations

import numpy as np

from .._args import DeviceArg, check_shape
from ._core import check


@check("copy")
def copy(dst, src, *, arg=DeviceArg, values=None, **_):
    """dst: 1..4-D, no stride-0 dimension; src: same dtype, broadcasts to dst by numpy
    rules. Returns (dst, src, src strides broadcast to dst's shape)."""
    d = arg("dst", dst)
    s = arg("src", src, device=d.device)
    if s.dtype != d.dtype:
        raise TypeError(f"src: dtype {s.dtype} differs from dst's {d.dtype}")
    if not 1 <= len(d.shape) <= 4:
        raise ValueError(f"dst: 1 to 4 dimensions supported, got shape {list(d.shape)}")
    if len(s.shape) > len(d.shape):
        raise ValueError(f"src: shape {list(s.shape)} does not broadcast to dst's {list(d.shape)}")
    pad = len(d.shape) - len(s.shape)
    s_shape = (1,) * pad + tuple(s.shape)
    s_st = (0,) * pad + tuple(s.strides)
    src_st = []
    for ds, ss, st in zip(d.shape, s_shape, s_st):
        if ss == ds:
            src_st.append(st if ds > 1 else 0)
        elif ss == 1:
            src_st.append(0)
        else:
            raise ValueError(f"src: shape {list(s.shape)} does not broadcast to dst's {list(d.shape)}")
    if any(st == 0 for st, n in zip(d.strides, d.shape) if n > 1):
        raise ValueError(f"dst: has a stride-0 dimension (strides {d.strides}); it must not alias")
    return d, s, src_st


def append_kv_indices(page_table, seq_lens, cu_q, finished, num_pages, page_size, num_rows):
    """append_kv's value checks (numpy arrays): cu_q must start at 0, never decrease and
    end at T; lengths must be >= 0; every written position L[b]+i must fall inside the
    page table and on a page id in [0, num_pages). ValueError naming the argument."""
    B = seq_lens.shape[0]
    cu_q = np.asarray(cu_q, dtype=np.int64)
    if cu_q.shape != (B + 1,):
        raise ValueError(f"cu_q: expected shape [{B + 1}], got {list(cu_q.shape)}")
    if B and (cu_q[0] != 0 or np.any(np.diff(cu_q) < 0) or cu_q[-1] != num_rows):
        raise ValueError(f"cu_q: must start at 0, never decrease and end at T={num_rows}; "
                         f"got {cu_q.tolist()[:16]}")
    if B == 0 and num_rows != 0:
        raise ValueError(f"cu_q: empty batch but T={num_rows} rows")
    L = np.asarray(seq_lens, dtype=np.int64)
    if np.any(L < 0):
        b = int(np.argmax(L < 0))
        raise ValueError(f"seq_lens: negative length {int(L[b])} for sequence {b}")
    max_pages = page_table.shape[1]
    for b in range(B):
        q = int(cu_q[b + 1] - cu_q[b])
        if q == 0 or (finished is not None and finished[b]):
            continue
        last = int(L[b]) + q - 1
        need = last // page_size + 1
        if need > max_pages:
            raise ValueError(f"page_table: sequence {b} writes position {last}, which needs "
                             f"{need} pages, but page_table has {max_pages} columns")
        pages = page_table[b, int(L[b]) // page_size: need]
        bad = (pages < 0) | (pages >= num_pages)
        if np.any(bad):
            raise ValueError(f"page_table: sequence {b} uses page id {int(pages[np.argmax(bad)])}, "
                             f"outside [0, {num_pages})")


@check("append_kv")
def append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished=None, *,
              arg=DeviceArg, values=None, **_):
    """k, v: [T, Hkv, D] of the caches' dtype; k_cache, v_cache: [num_pages, page_size,
    Hkv, D], D contiguous; page_table [B, max_pages] int32, rows contiguous; seq_lens [B],
    cu_q [B+1] int32 contiguous; finished optional [B] uint8/bool. With ``values``, the
    index checks of ``append_kv_indices``. Returns the views (k, v, k_cache, v_cache,
    page_table, seq_lens, cu_q, finished)."""
    kc = arg("k_cache", k_cache, ndim=4)
    dev = kc.device
    num_pages, page_size, hkv, dim = kc.shape
    vc = arg("v_cache", v_cache, dtype=kc.dtype, shape=kc.shape, device=dev)
    ka = arg("k", k, dtype=kc.dtype, ndim=3, device=dev)
    T = ka.shape[0]
    check_shape("k", ka.shape, (None, hkv, dim))
    va = arg("v", v, dtype=kc.dtype, shape=ka.shape, device=dev)
    pt = arg("page_table", page_table, dtype="int32", ndim=2, device=dev)
    B = pt.shape[0]
    sl = arg("seq_lens", seq_lens, dtype="int32", shape=(B,), device=dev, contiguous=True)
    cq = arg("cu_q", cu_q, dtype="int32", shape=(B + 1,), device=dev, contiguous=True)
    fin = arg("finished", finished, dtype=("uint8", "bool"), shape=(B,), device=dev,
              contiguous=True, optional=True)
    for a in (ka, va, kc, vc):
        if a.strides[-1] != 1 and dim > 1:
            raise ValueError(f"{a.name}: the head dimension must be contiguous (strides {a.strides})")
    if pt.strides[1] != 1 and pt.shape[1] > 1:
        raise ValueError(f"page_table: rows must be contiguous (strides {pt.strides})")
    # the kernel's grid-stride row loop is int32: keep T + stride below 2^31
    if T >= 2**30 or num_pages >= 2**31:
        raise ValueError("k/k_cache: 2^30 or more rows, or 2^31 or more pages, is not supported")
    if values is not None:
        idx = [values(a) for a in (pt, sl, cq)]
        if all(x is not None for x in idx):
            append_kv_indices(*idx, values(fin), num_pages, page_size, T)
    return ka, va, kc, vc, pt, sl, cq, fin
