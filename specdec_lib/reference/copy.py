"""Reference (numpy) of the copy family: the executable spec of ``copy`` and ``append_kv``."""
from __future__ import annotations

import numpy as np

from ..contract import checked


@checked("copy")
def copy(dst, src):
    """dst[...] = src, with numpy broadcasting of ``src`` (stride-0 source). Returns dst."""
    dst[...] = np.broadcast_to(src, dst.shape)
    return dst


def _as_f32(x):
    """Source rows as float32 (numpy uint16 = bfloat16 bits, the reference's bf16)."""
    x = np.asarray(x)
    if x.dtype == np.uint16:
        from ..dtypes import bf16_bits_to_f32
        return bf16_bits_to_f32(x)
    return x.astype(np.float32)


def _u8(a):
    """An fp8 cache's bytes as a uint8 numpy view (torch.float8_e4m3fn arrives as uint8)."""
    return a.view(np.uint8) if isinstance(a, np.ndarray) and a.dtype != np.uint8 else a


@checked("append_kv")
def append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished=None, *,
              k_scale=None, v_scale=None, k_params=None, v_params=None):
    """Write block rows into paged caches.

    k, v: [T, Hkv, D]; k_cache, v_cache: [num_pages, page_size, Hkv, D];
    page_table: [B, max_pages] int32; seq_lens: [B] committed lengths L; cu_q: [B+1];
    finished: [B] bool or None. Row i of sequence b goes to position L[b] + i, i.e.
    page page_table[b, (L+i) // page_size], slot (L+i) % page_size. Rows of finished
    sequences are skipped. Returns (k_cache, v_cache).

    8-bit caches (quantise on write, reference/kvquant.py is the bit-level spec): with
    ``k_scale`` / ``v_scale`` (float32 [Hkv] or [1]) the caches hold E4M3 bits (uint8) of
    ``k / scale``; with ``k_params`` / ``v_params`` (float32 [num_pages, page_size, Hkv, 2])
    the caches hold int8 codes and the params the (scale, zero) pair of each written
    (token, head) row.
    """
    from . import kvquant as kq
    num_pages, page_size = k_cache.shape[:2]
    fp8 = k_scale is not None
    int8 = k_params is not None
    if fp8:
        ks = np.asarray(k_scale, np.float32).reshape(-1, 1)
        vs = np.asarray(v_scale, np.float32).reshape(-1, 1)
    for b in range(seq_lens.shape[0]):
        if finished is not None and finished[b]:
            continue
        for t in range(int(cu_q[b]), int(cu_q[b + 1])):
            pos = int(seq_lens[b]) + t - int(cu_q[b])
            page = page_table[b, pos // page_size]
            slot = pos % page_size
            if fp8:
                _u8(k_cache)[page, slot] = kq.fp8_quantize(_as_f32(k[t]), ks)
                _u8(v_cache)[page, slot] = kq.fp8_quantize(_as_f32(v[t]), vs)
            elif int8:
                k_cache[page, slot], k_params[page, slot] = kq.int8_quantize(_as_f32(k[t]))
                v_cache[page, slot], v_params[page, slot] = kq.int8_quantize(_as_f32(v[t]))
            else:
                k_cache[page, slot] = k[t]
                v_cache[page, slot] = v[t]
    return k_cache, v_cache
