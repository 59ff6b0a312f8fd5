"""Contract of the copy family: ``copy`` and ``append_kv`` (``rope_append_kv`` shares
append_kv's)."""
from __future__ import annotations

import numpy as np

from .._args import DeviceArg, check_shape
from ._batch import FLOATS, require_dtype
from ._core import check

# the 8-bit KV cache formats (reference/kvquant.py is their spec)
FP8_CACHE_DTYPES = ("uint8", "fp8_e4m3")   # fp8 bits: numpy/torch uint8, torch float8_e4m3fn
INT8_CACHE_DTYPES = ("int8",)
KV8_MAX_HEAD_DIM = 256
_MIN_SCALE = 2.0 ** -126                   # 1 / scale must stay finite


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


def kv_format(k_scale, v_scale, k_params, v_params):
    """The cache format the quantisation arguments ask for: "fp8" (k_scale and v_scale),
    "int8" (k_params and v_params) or None (neither: a 16-bit cache). Mixing them, or giving
    one of a pair without the other, is refused naming the argument."""
    fp8 = k_scale is not None or v_scale is not None
    int8 = k_params is not None or v_params is not None
    if fp8 and int8:
        raise TypeError("k_scale/v_scale (fp8 cache) and k_params/v_params (int8 cache) "
                        "exclude each other")
    if fp8:
        for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
            if x is None:
                raise TypeError(f"{name}: required with an fp8 cache (both k_scale and v_scale)")
        return "fp8"
    if int8:
        for name, x in (("k_params", k_params), ("v_params", v_params)):
            if x is None:
                raise TypeError(f"{name}: required with an int8 cache (both k_params and "
                                "v_params)")
        return "int8"
    return None


def kv8_cache_args(fmt, kc, vc, k_scale, v_scale, k_params, v_params, *, arg, values):
    """The 8-bit cache arguments beside the caches' views ``kc`` / ``vc`` (already checked
    for shape [num_pages, page_size, Hkv, D]): the caches' dtype (fp8: uint8 bits or
    torch.float8_e4m3fn; int8: int8), D <= 256; fp8: k_scale / v_scale float32 [Hkv] or [1],
    contiguous, on the caches' device, with ``values`` finite and >= 2^-126 (<= 0 and NaN
    refused); int8: k_params / v_params float32 [num_pages, page_size, Hkv, 2], contiguous.
    Returns the views (k_scale, v_scale, k_params, v_params), None where absent."""
    num_pages, page_size, hkv, dim = kc.shape
    want = FP8_CACHE_DTYPES if fmt == "fp8" else INT8_CACHE_DTYPES
    for a in (kc, vc):
        if a.dtype not in want:
            raise TypeError(f"{a.name}: a{'n' if fmt == 'int8' else ''} {fmt} cache is "
                            f"{' or '.join(want)}, got {a.dtype}")
    if kc.dtype != vc.dtype:
        raise TypeError(f"v_cache: dtype {vc.dtype} differs from k_cache's {kc.dtype}")
    if dim > KV8_MAX_HEAD_DIM:
        raise ValueError(f"k_cache: head dim {dim} exceeds {KV8_MAX_HEAD_DIM} (8-bit caches)")
    dev = kc.device
    if fmt == "fp8":
        out = []
        for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
            a = arg(name, x, dtype="float32", ndim=1, device=dev, contiguous=True)
            require_dtype(a, "float32")     # numpy too: the kernels read float32 bits
            if a.shape[0] not in (1, hkv):
                raise ValueError(f"{name}: expected shape [{hkv}] (one scale per KV head) or "
                                 f"[1], got {list(a.shape)}")
            if values is not None:
                s = values(a)
                if s is not None:
                    s = np.asarray(s, dtype=np.float64)
                    bad = ~(np.isfinite(s) & (s >= _MIN_SCALE))
                    if bad.any():
                        h = int(np.argmax(bad))
                        raise ValueError(f"{name}: scale {s[h]} of KV head {h} must be finite "
                                         f"and >= 2^-126 (positive)")
            out.append(a)
        return out[0], out[1], None, None
    out = []
    for name, x in (("k_params", k_params), ("v_params", v_params)):
        a = arg(name, x, dtype="float32", shape=(num_pages, page_size, hkv, 2), device=dev,
                contiguous=True)
        require_dtype(a, "float32")
        out.append(a)
    return None, None, out[0], out[1]


@check("append_kv")
def append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished=None, *,
              k_scale=None, v_scale=None, k_params=None, v_params=None, kv8=False,
              arg=DeviceArg, values=None, **_):
    """k, v: [T, Hkv, D] of the caches' dtype; k_cache, v_cache: [num_pages, page_size,
    Hkv, D], D contiguous; page_table [B, max_pages] int32, rows contiguous; seq_lens [B],
    cu_q [B+1] int32 contiguous; finished optional [B] uint8/bool. With ``values``, the
    index checks of ``append_kv_indices``. 8-bit caches (quantise on write,
    reference/kvquant.py): k_scale + v_scale (fp8) or k_params + v_params (int8) as
    ``kv8_cache_args`` checks them, k / v then float32/float16/bfloat16 (one dtype).
    Returns the views (k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished),
    plus (k_scale, v_scale, k_params, v_params) when ``kv8=True`` is passed."""
    fmt = kv_format(k_scale, v_scale, k_params, v_params)
    kc = arg("k_cache", k_cache, ndim=4)
    dev = kc.device
    num_pages, page_size, hkv, dim = kc.shape
    if fmt is None:
        vc = arg("v_cache", v_cache, dtype=kc.dtype, shape=kc.shape, device=dev)
        ka = arg("k", k, dtype=kc.dtype, ndim=3, device=dev)
        T = ka.shape[0]
        check_shape("k", ka.shape, (None, hkv, dim))
        va = arg("v", v, dtype=kc.dtype, shape=ka.shape, device=dev)
        q8 = (None, None, None, None)
    else:
        vc = arg("v_cache", v_cache, shape=kc.shape, device=dev)
        q8 = kv8_cache_args(fmt, kc, vc, k_scale, v_scale, k_params, v_params, arg=arg,
                            values=values)
        ka = arg("k", k, dtype=FLOATS, ndim=3, device=dev)
        T = ka.shape[0]
        check_shape("k", ka.shape, (None, hkv, dim))
        va = arg("v", v, dtype=ka.dtype, shape=ka.shape, device=dev)
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
    if kv8:
        return (ka, va, kc, vc, pt, sl, cq, fin) + tuple(q8)
    return ka, va, kc, vc, pt, sl, cq, fin
