"""Reference (numpy) of the copy family: the executable spec of ``copy`` and ``append_kv``."""
from __future__ import annotations

import numpy as np


def copy(dst, src):
    """dst[...] = src, with numpy broadcasting of ``src`` (stride-0 source). Returns dst."""
    if dst.dtype != src.dtype:
        raise TypeError(f"src: dtype {src.dtype} differs from dst's {dst.dtype}")
    try:
        b = np.broadcast_to(src, dst.shape)
    except ValueError:
        raise ValueError(f"src: shape {list(src.shape)} does not broadcast to dst's "
                         f"{list(dst.shape)}") from None
    dst[...] = b
    return dst


def check_append_kv_indices(page_table, seq_lens, cu_q, finished, num_pages, page_size, num_rows):
    """Host-side index checks of append_kv (also used by the GPU op before launch).

    Raises ValueError naming the argument: cu_q must start at 0, never decrease and end
    at T; lengths must be >= 0; every written position L[b]+i must fall inside the page
    table and on a page id in [0, num_pages).
    """
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


def append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished=None):
    """Write block rows into paged caches.

    k, v: [T, Hkv, D]; k_cache, v_cache: [num_pages, page_size, Hkv, D];
    page_table: [B, max_pages] int32; seq_lens: [B] committed lengths L; cu_q: [B+1];
    finished: [B] bool or None. Row i of sequence b goes to position L[b] + i, i.e.
    page page_table[b, (L+i) // page_size], slot (L+i) % page_size. Rows of finished
    sequences are skipped. Returns (k_cache, v_cache).
    """
    num_pages, page_size = k_cache.shape[:2]
    check_append_kv_indices(page_table, seq_lens, cu_q, finished, num_pages, page_size, k.shape[0])
    for b in range(seq_lens.shape[0]):
        if finished is not None and finished[b]:
            continue
        for t in range(int(cu_q[b]), int(cu_q[b + 1])):
            pos = int(seq_lens[b]) + t - int(cu_q[b])
            page = page_table[b, pos // page_size]
            k_cache[page, pos % page_size] = k[t]
            v_cache[page, pos % page_size] = v[t]
    return k_cache, v_cache
