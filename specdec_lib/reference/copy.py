"""Reference (numpy) of the copy family: the executable spec of ``copy`` and ``append_kv``."""
from __future__ import annotations

import numpy as np

from ..contract import checked
from ..contract.copy import append_kv_indices as check_append_kv_indices  # noqa: F401 (old name)


@checked("copy")
def copy(dst, src):
    """dst[...] = src, with numpy broadcasting of ``src`` (stride-0 source). Returns dst."""
    dst[...] = np.broadcast_to(src, dst.shape)
    return dst


@checked("append_kv")
def append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished=None):
    """Write block rows into paged caches.

    k, v: [T, Hkv, D]; k_cache, v_cache: [num_pages, page_size, Hkv, D];
    page_table: [B, max_pages] int32; seq_lens: [B] committed lengths L; cu_q: [B+1];
    finished: [B] bool or None. Row i of sequence b goes to position L[b] + i, i.e.
    page page_table[b, (L+i) // page_size], slot (L+i) % page_size. Rows of finished
    sequences are skipped. Returns (k_cache, v_cache).
    """
    num_pages, page_size = k_cache.shape[:2]
    for b in range(seq_lens.shape[0]):
        if finished is not None and finished[b]:
            continue
        for t in range(int(cu_q[b]), int(cu_q[b + 1])):
            pos = int(seq_lens[b]) + t - int(cu_q[b])
            page = page_table[b, pos // page_size]
            k_cache[page, pos % page_size] = k[t]
            v_cache[page, pos % page_size] = v[t]
    return k_cache, v_cache
