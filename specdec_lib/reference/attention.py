"""numpy float64 reference of the attention family: the executable spec of ``verify_attention``.

The verify block of sequence ``b`` is ``q_b = cu_q[b+1] - cu_q[b]`` rows (0..16) at
positions ``L[b] .. L[b]+q_b-1`` where ``L[b] = seq_lens[b]`` tokens are committed.
``append_kv`` has already written the block's own K/V into the pages, so the cache
holds ``L[b] + q_b`` keys for the sequence, key ``j`` living at
``page_table[b, j // page_size]``, slot ``j % page_size``.

Row ``i`` of the block attends keys ``0 .. L[b]+i`` (bottom-right causal mask: the
last row sees everything, the first row everything but the block's later rows).
Query head ``h`` reads KV head ``h // (Hq // Hkv)`` (GQA/MQA). ``scale`` defaults to
``1/sqrt(D)``. ``lse_out[t, h]`` is the natural-log log-sum-exp of the row's scaled
scores, ``out`` the softmax-weighted sum of V. Sequences with ``q_b = 0`` write
nothing. Plain per-row loop in float64; this is what the kernels are tested against.
"""
from __future__ import annotations

import math

import numpy as np

from ._checks import np_array

HEAD_DIMS = (64, 128, 256)
MAX_Q_PER_SEQ = 16
MAX_GROUP = 16


def check_verify_attention_shapes(q_shape, k_shape, v_shape, pt_shape, sl_shape, cu_shape,
                                  out_shape, lse_shape=None):
    """Shape rules shared by the reference and the CUDA op; returns (T, Hq, Hkv, D, B, ps)."""
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


def check_verify_attention_values(page_table, seq_lens, cu_q, num_tokens, num_pages, page_size):
    """Host-side checks of the index arrays (the reference always runs them; the CUDA op in
    debug mode). Raises ValueError naming the argument and the first bad sequence."""
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


def verify_attention(q, k_cache, v_cache, page_table, seq_lens, cu_q, out, scale=None,
                     lse_out=None, *, workspace=None, num_splits=None, max_kv_len=None,
                     row_invariant=False, stream=None):
    """Paged block-verification attention (see the module docstring); float64 math.

    ``q [T, Hq, D]``, ``k_cache``/``v_cache [num_pages, page_size, Hkv, D]`` (any float
    dtype; bf16 callers pass float32 copies), ``page_table [B, max_pages]``,
    ``seq_lens [B]``, ``cu_q [B+1]``; writes ``out [T, Hq, D]`` (cast to its dtype) and
    ``lse_out [T, Hq]`` when given. ``workspace``/``num_splits``/``max_kv_len``/
    ``row_invariant``/``stream`` exist for signature parity with the CUDA op and are ignored
    (every row is computed on its own here). Returns ``out``.
    """
    for name, a, nd in (("q", q, 3), ("k_cache", k_cache, 4), ("v_cache", v_cache, 4),
                        ("out", out, 3)):
        np_array(name, a, nd, "f")
    for name, a, nd in (("page_table", page_table, 2), ("seq_lens", seq_lens, 1), ("cu_q", cu_q, 1)):
        np_array(name, a, nd, "iu")
    if lse_out is not None:
        np_array("lse_out", lse_out, 2, "f")
    T, Hq, Hkv, D, B, ps = check_verify_attention_shapes(
        q.shape, k_cache.shape, v_cache.shape, page_table.shape, seq_lens.shape, cu_q.shape,
        out.shape, None if lse_out is None else lse_out.shape)
    check_verify_attention_values(page_table, seq_lens, cu_q, T, k_cache.shape[0], ps)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    group = Hq // Hkv
    for b in range(B):
        L = int(seq_lens[b])
        t0, t1 = int(cu_q[b]), int(cu_q[b + 1])
        n_ctx = L + (t1 - t0)
        if t1 == t0:
            continue
        keys = np.arange(n_ctx)
        pages = np.asarray(page_table[b], dtype=np.int64)[keys // ps]
        slots = keys % ps
        K = np.asarray(k_cache[pages, slots], dtype=np.float64).transpose(1, 0, 2)  # [Hkv, n_ctx, D]
        V = np.asarray(v_cache[pages, slots], dtype=np.float64).transpose(1, 0, 2)
        for i in range(t1 - t0):
            t = t0 + i
            n_vis = L + i + 1
            qt = np.asarray(q[t], dtype=np.float64).reshape(Hkv, group, D)   # head h = kh*group + g
            s = np.matmul(qt, K[:, :n_vis].transpose(0, 2, 1)) * scale     # [Hkv, group, n_vis]
            m = s.max(axis=2, keepdims=True)
            p = np.exp(s - m)
            l = p.sum(axis=2, keepdims=True)
            o = np.matmul(p, V[:, :n_vis]) / l                              # [Hkv, group, D]
            out[t] = o.reshape(Hq, D).astype(out.dtype)
            if lse_out is not None:
                lse_out[t] = (m + np.log(l)).reshape(Hq).astype(lse_out.dtype)
    return out


def rope_append_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, page_table, seq_lens,
                   cu_q, finished=None, *, check_indices=True, stream=None):
    """``rope(q, k, positions, cos_sin_cache)`` then ``append_kv(k, v, k_cache, v_cache,
    page_table, seq_lens, cu_q, finished)``: the spec of the fused op is the two reference
    ops in sequence (see each for shapes and rules). q and k are rotated in place (every
    row); the rotated k rows and the v rows go into the caches (rows of finished sequences
    skipped). Every check of both runs before anything is written. ``check_indices`` /
    ``stream`` exist for signature parity with the CUDA op (indices are always checked
    here). Returns (q, k, k_cache, v_cache).
    """
    from .copy import append_kv, check_append_kv_indices
    from .layers import check_rope_shapes, rope
    for name, a, nd in (("q", q, 3), ("k", k, 3), ("v", v, 3), ("k_cache", k_cache, 4),
                        ("v_cache", v_cache, 4)):
        np_array(name, a, nd)          # dtypes: rope's rules (bfloat16 as uint16 bits too)
    for name, a, nd in (("page_table", page_table, 2), ("seq_lens", seq_lens, 1),
                        ("cu_q", cu_q, 1)):
        np_array(name, a, nd, "iu")
    check_rope_shapes(q.shape, k.shape, positions.shape, cos_sin_cache.shape)
    if k_cache.shape[2:] != k.shape[1:] or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache/v_cache: shapes {list(k_cache.shape)}, {list(v_cache.shape)} "
                         f"do not hold k's [*, *, {k.shape[1]}, {k.shape[2]}] rows")
    if v.shape != k.shape:
        raise ValueError(f"v: expected shape {list(k.shape)}, got {list(v.shape)}")
    check_append_kv_indices(page_table, seq_lens, cu_q, finished, k_cache.shape[0],
                            k_cache.shape[1], k.shape[0])
    rope(q, k, positions, cos_sin_cache)
    append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished)
    return q, k, k_cache, v_cache
