"""copy and append_kv on the GPU (kernels: cuda_src/copy/copy.cu)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .. import runtime
from .._validate import as_stream
from ..contract import copy as contract
from ..contract import index_values
from ._types import ArrayLike, Stream

_THREADS = 256
_CHUNK_BYTES = 16384      # one work unit: 256 threads x 4 x 16 B in flight
# append_kv launch shape, overridable by the benchmark's sweep: threads per block row
# (None: ~8 16-byte vectors per thread) and block rows per CTA (None: fill 256 threads); the
# 8-bit append's warps per token, tokens per CTA and CTAs (None: the resident CTAs; the tests
# force small grids so each warp walks a run of tokens)
TUNING = {"append_kv_threads": None, "append_kv_rows": None, "append_kv8_warps": None,
          "append_kv8_rows": None, "append_kv8_grid": None}


def _collapse(shape, dst_st, src_st):
    """Drop size-1 dims and merge dims that are contiguous in both tensors."""
    dims = [(s, d, r) for s, d, r in zip(shape, dst_st, src_st) if s != 1]
    out = []
    for s, d, r in dims:
        if out:
            ps, pd, pr = out[-1]
            if pd == d * s and pr == r * s:
                out[-1] = (ps * s, d, r)
                continue
        out.append((s, d, r))
    return out or [(1, 1, 1)]


def copy(dst: ArrayLike, src: ArrayLike, *, stream: Stream = None) -> ArrayLike:
    """dst[...] = src on the GPU: any 1..4-D strides, int64 indexing, element size 1/2/4/8.

    ``src`` broadcasts to ``dst``'s shape by numpy rules (missing or size-1 dims, or
    stride 0, are read repeatedly). dtypes must match (no conversion). Overlapping
    src/dst gives unspecified results. Returns ``dst``.
    """
    d, s, src_st = contract.copy(dst, src)
    stream_h = as_stream(stream)
    n = int(np.prod(d.shape, dtype=np.int64))
    if n == 0:
        return dst
    dims = _collapse(d.shape, d.strides, src_st)
    if len(dims) > 4:
        raise ValueError("dst/src: layout needs more than 4 dimensions after merging")
    dims = [(1, 0, 0)] * (4 - len(dims)) + dims
    shape = [x[0] for x in dims]
    chunk = max(_CHUNK_BYTES // d.itemsize, 1)
    units = shape[0] * shape[1] * shape[2] * -(-shape[3] // chunk)
    grid = int(min(units, runtime.sm_count(d.device) * 16))
    k = runtime.kernel("copy", f"copy_strided_e{d.itemsize}", d.device)
    from .. import _copy
    _copy.launch_copy_strided(k, grid, _THREADS, stream_h, d.ptr, s.ptr, shape,
                              [x[1] for x in dims], [x[2] for x in dims], chunk)
    return dst


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def _kv8_scale_stride(ks):
    return 0 if ks is None or ks.shape[0] == 1 else 1


def append_kv(k: ArrayLike, v: ArrayLike, k_cache: ArrayLike, v_cache: ArrayLike,
              page_table: ArrayLike, seq_lens: ArrayLike, cu_q: ArrayLike,
              finished: Optional[ArrayLike] = None, *, check_indices: bool = True,
              stream: Stream = None, k_scale: Optional[ArrayLike] = None,
              v_scale: Optional[ArrayLike] = None, k_params: Optional[ArrayLike] = None,
              v_params: Optional[ArrayLike] = None) -> Tuple[ArrayLike, ArrayLike]:
    """Write a round's block K/V rows into paged caches.

    k, v: [T, Hkv, D]; k_cache, v_cache: [num_pages, page_size, Hkv, D] (same dtype, any
    element size, D contiguous, other strides free); page_table: [B, max_pages] int32;
    seq_lens: [B] int32 committed lengths L; cu_q: [B+1] int32 block offsets;
    finished: optional [B] uint8/bool, rows of finished sequences are skipped.
    Row i of sequence b goes to position L[b] + i.

    ``check_indices=True`` (default) copies cu_q / seq_lens / page_table to the host and
    raises ValueError before launch on bad offsets, negative lengths, a page table too
    narrow for L+q, or page ids outside the pool. Pass False inside a captured graph or a
    hot loop: the kernel then skips (never writes, never faults on) rows whose target is
    outside the page table or the pool.

    8-bit caches (quantise on write; the formats: ``specdec_lib.reference.kvquant``):
    ``k_scale`` / ``v_scale`` float32 ``[Hkv]`` or ``[1]`` with fp8 caches (uint8 bits or
    torch.float8_e4m3fn), or ``k_params`` / ``v_params`` float32 ``[num_pages, page_size,
    Hkv, 2]`` with int8 caches (each written row's (scale, zero) goes there); k / v are then
    float32/float16/bfloat16 and D <= 256. With ``check_indices`` the scales' values are
    checked too (finite, >= 2^-126).
    """
    stream_h = as_stream(stream)
    ka, va, kc, vc, pt, sl, cq, fin, ks, vs, kp, vp = contract.append_kv(
        k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished, k_scale=k_scale,
        v_scale=v_scale, k_params=k_params, v_params=v_params, kv8=True,
        values=index_values(stream_h) if check_indices else None)
    T, B = ka.shape[0], pt.shape[0]
    num_pages, page_size, hkv, dim = kc.shape
    dev = kc.device
    if T == 0 or B == 0:
        return k_cache, v_cache
    if ks is not None or kp is not None:
        _append_kv8(ka, va, kc, vc, pt, sl, cq, fin, ks, vs, kp, vp, stream_h)
        return k_cache, v_cache
    isz = kc.itemsize
    # 16-byte vectors need every row start aligned: OR-ing the byte offsets tests all at once
    bits = (ka.ptr | va.ptr | kc.ptr | vc.ptr | (dim * isz) |
            (ka.strides[0] | ka.strides[1] | va.strides[0] | va.strides[1] | kc.strides[0] |
             kc.strides[1] | kc.strides[2] | vc.strides[0] | vc.strides[1] | vc.strides[2]) * isz)
    vectorize = bits % 16 == 0
    kern = runtime.kernel("copy", f"append_kv_e{isz}", dev)
    # ~4 units (16-byte vectors) per thread: small CTAs keep many rows' index chains in flight
    units = 2 * hkv * (dim * isz // 16 if vectorize else dim)
    # ~8 vectors per thread (the kernel issues 8 loads before its stores); measured on the
    # H200: 32-thread rows beat 64 (82% vs 78% of copy), 128/256 much worse
    threads = TUNING["append_kv_threads"] or min(_THREADS, max(32, -(-units // 256) * 32))
    rows_per_cta = TUNING["append_kv_rows"] or max(1, _THREADS // threads)
    grid = int(min(-(-T // rows_per_cta), 2**31 - 1))
    from .. import _copy
    _copy.launch_append_kv(
        kern, grid, threads, rows_per_cta, stream_h, ka.ptr, va.ptr, kc.ptr, vc.ptr, pt.ptr, sl.ptr,
        cq.ptr, fin.ptr, (ka.strides[0], va.strides[0]), (ka.strides[1], va.strides[1]),
        (kc.strides[0], vc.strides[0]), (kc.strides[1], vc.strides[1]),
        (kc.strides[2], vc.strides[2]), pt.strides[0], T, B, hkv, dim, page_size, num_pages,
        pt.shape[1], vectorize)
    return k_cache, v_cache


def _append_kv8(ka, va, kc, vc, pt, sl, cq, fin, ks, vs, kp, vp, stream_h):
    """The 8-bit append: 8, 16 or 32 lanes per (token, K/V, head) row (copy.cu append_kv8)."""
    T, B = ka.shape[0], pt.shape[0]
    num_pages, page_size, hkv, dim = kc.shape
    E = ka.itemsize
    V = 16 // E
    # V-element chunks: 16-byte source loads, V-byte cache stores
    src_bits = ka.ptr | va.ptr
    for a in (ka, va):
        for st, n in zip(a.strides[:-1], a.shape[:-1]):
            if n > 1:
                src_bits |= st * E
    dst_bits = kc.ptr | vc.ptr
    for a in (kc, vc):
        for st, n in zip(a.strides[:-1], a.shape[:-1]):
            if n > 1:
                dst_bits |= st
    vectorize = dim % V == 0 and src_bits % 16 == 0 and dst_bits % V == 0
    fmt = "fp8" if ks is not None else "int8"
    kern = runtime.kernel("copy", f"append_kv8_{fmt}_{_SHORT[ka.dtype]}", kc.device)
    # The kernel puts 4 lanes on a row (8 past 32 chunks, 32 unvectorised), a warp holding
    # 32 / 4 rows at once. One warp per token, up to 8 tokens a CTA (small batches keep
    # fewer to spread over the SMs). Each warp loads its next token while it quantises the
    # current one, so the grid stops at the CTAs that fit at once: a warp then walks a run
    # of tokens with a load always in flight.
    threads = 32 * (TUNING["append_kv8_warps"] or 1)
    rows_per_cta = TUNING["append_kv8_rows"] or max(1, min(_THREADS // threads, T // 128))
    grid = int(min(-(-T // rows_per_cta), TUNING["append_kv8_grid"]
                   or runtime.resident_ctas(kern, threads * rows_per_cta, kc.device)))
    from .. import _copy
    _copy.launch_append_kv8(
        kern, grid, threads, rows_per_cta, stream_h, ka.ptr, va.ptr, kc.ptr, vc.ptr, pt.ptr,
        sl.ptr, cq.ptr, fin.ptr, (ka.strides[0], va.strides[0]), (ka.strides[1], va.strides[1]),
        (kc.strides[0], vc.strides[0]), (kc.strides[1], vc.strides[1]),
        (kc.strides[2], vc.strides[2]), pt.strides[0], T, B, hkv, dim, page_size, num_pages,
        pt.shape[1], vectorize, ks.ptr if ks is not None else 0, vs.ptr if vs is not None else 0,
        kp.ptr if kp is not None else 0, vp.ptr if vp is not None else 0, _kv8_scale_stride(ks))
