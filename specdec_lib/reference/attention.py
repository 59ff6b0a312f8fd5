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

from ..contract import checked
from ..contract.attention import MAX_Q_PER_SEQ


def dequantize_cache(cache, k_scale=None, k_params=None):
    """A cache as float64 values: a 16-bit one as is (numpy uint16 = bfloat16 bits), an fp8
    one (uint8 bits, ``k_scale`` [Hkv] or [1]) as e4m3_value * scale, an int8 one
    (``k_params`` [num_pages, page_size, Hkv, 2]) as (c + 128) * scale + zero in float32
    (reference/kvquant.py)."""
    from . import kvquant as kq
    if k_scale is not None:
        c = cache.view(np.uint8) if cache.dtype != np.uint8 else cache
        return kq.fp8_dequantize(c, np.asarray(k_scale, np.float64).reshape(-1, 1))
    if k_params is not None:
        return kq.int8_dequantize(cache, np.asarray(k_params)).astype(np.float64)
    if cache.dtype == np.uint16:
        from ..dtypes import bf16_bits_to_f32
        return bf16_bits_to_f32(cache).astype(np.float64)
    return np.asarray(cache, dtype=np.float64)


@checked("verify_attention")
def verify_attention(q, k_cache, v_cache, page_table, seq_lens, cu_q, out, scale=None,
                     lse_out=None, *, workspace=None, num_splits=None, max_kv_len=None,
                     max_q=None, row_invariant=False, stream=None, k_scale=None, v_scale=None,
                     k_params=None, v_params=None):
    """Paged block-verification attention (see the module docstring); float64 math.

    ``q [T, Hq, D]``, ``k_cache``/``v_cache [num_pages, page_size, Hkv, D]`` (any float
    dtype; bf16 callers pass float32 copies), ``page_table [B, max_pages]``,
    ``seq_lens [B]``, ``cu_q [B+1]``; writes ``out [T, Hq, D]`` (cast to its dtype) and
    ``lse_out [T, Hq]`` when given. ``workspace``/``num_splits``/``max_kv_len``/
    ``row_invariant``/``stream`` exist for signature parity with the CUDA op and are ignored
    (every row is computed on its own here); as there, a sequence whose block has more
    rows than ``max_q`` (default min(T, 16)) is left unwritten. The argument contract
    (``specdec_lib.contract.attention.verify_attention``: dtypes by kind, shapes, strides,
    index values) runs first. Returns ``out``.

    8-bit caches: ``k_scale``/``v_scale`` (fp8, uint8 bits) or ``k_params``/``v_params``
    (int8): the caches are dequantised first (``dequantize_cache``), then the same float64
    attention.
    """
    if k_scale is not None or k_params is not None:
        k_cache = dequantize_cache(k_cache, k_scale, k_params)
        v_cache = dequantize_cache(v_cache, v_scale, v_params)
    T, Hq, D = q.shape
    ps, Hkv = k_cache.shape[1], k_cache.shape[2]
    B = page_table.shape[0]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    group = Hq // Hkv
    max_q = min(T, MAX_Q_PER_SEQ) if max_q is None else int(max_q)
    for b in range(B):
        L = int(seq_lens[b])
        t0, t1 = int(cu_q[b]), int(cu_q[b + 1])
        n_ctx = L + (t1 - t0)
        if t1 == t0 or t1 - t0 > max_q:   # as the kernels: a longer block is left unwritten
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


@checked("rope_append_kv")
def rope_append_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, page_table, seq_lens,
                   cu_q, finished=None, *, check_indices=True, stream=None, k_scale=None,
                   v_scale=None, k_params=None, v_params=None):
    """``rope(q, k, positions, cos_sin_cache)`` then ``append_kv(k, v, k_cache, v_cache,
    page_table, seq_lens, cu_q, finished)``: the spec of the fused op is the two reference
    ops in sequence (see each for shapes and rules). q and k are rotated in place (every
    row); the rotated k rows and the v rows go into the caches (rows of finished sequences
    skipped). The contract of both (``specdec_lib.contract.attention.rope_append_kv``) runs
    before anything is written. ``check_indices`` / ``stream`` exist for signature parity
    with the CUDA op (indices are always checked here). Returns (q, k, k_cache, v_cache).
    """
    from .copy import append_kv
    from .layers import rope
    getattr(rope, "unchecked", rope)(q, k, positions, cos_sin_cache)
    append_kv.unchecked(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished,
                        k_scale=k_scale, v_scale=v_scale, k_params=k_params, v_params=v_params)
    return q, k, k_cache, v_cache
