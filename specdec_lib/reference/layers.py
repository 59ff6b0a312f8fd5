"""numpy reference of the dense-layer glue ops: what a Llama-type host model needs between
its matmuls, so one model implementation serves both backends.

- ``rms_norm``          : RMSNorm, optionally fused with the residual add before it
                          (``s = x + residual`` is stored, then normalised).
- ``rope``              : rotary position embedding of q and k in place, rotate-half (NeoX /
                          HF Llama) style, from a cos/sin cache indexed by position.
- ``rope_cos_sin_cache``: that cache, ``[max_position, D]`` float32 (vLLM's layout).
- ``silu_mul``          : the SwiGLU activation ``silu(gate) * up`` of ``x = [gate | up]``.

Same names and argument order as ``specdec_lib.ops.layers``; outputs are written into the
caller's arrays (in place for rope) and returned. Math in float64, one rounding to the
output dtype. Arrays: float64, float32, float16, or uint16 holding bfloat16 bits.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ._checks import np_array
from .gdn import round_to, store, to_f64

_FLOATS = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint16))
ROPE_MAX_HEAD_DIM = 256


def _float_array(name, a, ndim):
    np_array(name, a, ndim)
    if a.dtype not in _FLOATS:
        raise TypeError(f"{name}: dtype {a.dtype} not supported (float64, float32, float16, "
                        "or uint16 holding bfloat16 bits)")
    return a


def _same(name, a, shape, dtype):
    _float_array(name, a, len(shape))
    if a.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")
    if a.dtype != dtype:
        raise TypeError(f"{name}: dtype {a.dtype} != x's {dtype}")
    return a


def check_eps(eps):
    """eps as a float: a finite real > 0, else ValueError naming ``eps``."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) \
            or eps <= 0:
        raise ValueError(f"eps: expected a finite float > 0, got {eps!r}")
    return float(eps)


def rms_norm_f64(x, weight, eps, unit_offset):
    """x [..., H] -> x * rsqrt(mean(x^2) + eps) * (weight or 1 + weight), float64."""
    x = to_f64(x)
    w = to_f64(weight)
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * ((1.0 + w) if unit_offset else w)


def rms_norm(x, weight, out, *, eps=1e-6, residual=None, residual_out=None, unit_offset=False):
    """out = RMSNorm(s) * (weight, or 1 + weight with unit_offset), s = x or x + residual.

    x             [T, H]
    weight        [H]            (any float dtype here; the GPU op takes x's dtype or float32)
    out           [T, H]  x's dtype; may be x itself
    residual      [T, H]  x's dtype, or None
    residual_out  [T, H]  x's dtype, required with residual (may be residual itself):
                  receives s = round(x + residual), and out is the norm of that rounded s,
                  which is what the unfused ``h = x + r; rms_norm(h)`` gives in that dtype.
    eps           > 0; unit_offset: Qwen3-Next/Gemma-style zero-centred weights.
    """
    _float_array("x", x, 2)
    T, H = x.shape
    _same("out", out, (T, H), x.dtype)
    _float_array("weight", weight, 1)
    if weight.shape != (H,):
        raise ValueError(f"weight: expected shape ({H},), got {weight.shape}")
    eps = check_eps(eps)
    if residual is not None:
        _same("residual", residual, (T, H), x.dtype)
        if residual_out is None:
            raise ValueError("residual_out: required with residual (it receives x + residual)")
        _same("residual_out", residual_out, (T, H), x.dtype)
    elif residual_out is not None:
        raise ValueError("residual_out: given without residual")
    if H == 0:
        return out
    for t in range(T):
        s = to_f64(x[t])
        if residual is not None:
            s = round_to(s + to_f64(residual[t]), x.dtype)
            store(residual_out[t], s)
        store(out[t], rms_norm_f64(s, weight, eps, unit_offset))
    return out


def rope_cos_sin_cache(max_position, head_dim, theta):
    """[max_position, head_dim] float32: row p = cos(p f_i) for i < D/2, then sin(p f_i),
    f_i = theta^(-2i/D); computed in float64, rounded once."""
    if isinstance(max_position, bool) or not isinstance(max_position, numbers.Integral) \
            or max_position < 0:
        raise ValueError(f"max_position: expected an int >= 0, got {max_position!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) \
            or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim: expected an even int >= 2, got {head_dim!r}")
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real) \
            or not math.isfinite(theta) or theta <= 0:
        raise ValueError(f"theta: expected a finite float > 0, got {theta!r}")
    half = int(head_dim) // 2
    freq = float(theta) ** (-2.0 * np.arange(half, dtype=np.float64) / head_dim)
    angle = np.arange(int(max_position), dtype=np.float64)[:, None] * freq[None, :]
    return np.concatenate([np.cos(angle), np.sin(angle)], axis=1).astype(np.float32)


def check_rope_shapes(q_shape, k_shape, positions_shape, cache_shape):
    """(T, Hq, Hk, D) from the shapes of rope's arguments (k_shape None: no k);
    ValueError naming the argument otherwise."""
    if len(q_shape) != 3:
        raise ValueError(f"q: expected shape [T, Hq, D], got {list(q_shape)}")
    T, Hq, D = q_shape
    if D < 2 or D % 2 or D > ROPE_MAX_HEAD_DIM:
        raise ValueError(f"q: head dim {D} must be even and in 2..{ROPE_MAX_HEAD_DIM}")
    Hk = 0
    if k_shape is not None:
        if len(k_shape) != 3 or k_shape[0] != T or k_shape[2] != D:
            raise ValueError(f"k: expected shape [{T}, Hk, {D}] (q is {list(q_shape)}), got "
                             f"{list(k_shape)}")
        Hk = k_shape[1]
    if tuple(positions_shape) != (T,):
        raise ValueError(f"positions: expected shape [{T}], got {list(positions_shape)}")
    if len(cache_shape) != 2 or cache_shape[1] != D:
        raise ValueError(f"cos_sin_cache: expected shape [max_position, {D}] (D from q), got "
                         f"{list(cache_shape)}")
    return T, Hq, Hk, D


def rope(q, k, positions, cos_sin_cache):
    """Rotary embedding of q and k in place, rotate-half style: for each head vector x and
    i < D/2, with c, s = cos_sin_cache[pos, i], cos_sin_cache[pos, D/2 + i]:
    x[i] <- x[i] c - x[i + D/2] s,  x[i + D/2] <- x[i + D/2] c + x[i] s.

    q              [T, Hq, D]
    k              [T, Hk, D] (same dtype) or None
    positions      int [T]
    cos_sin_cache  float32 [max_position, D] (rope_cos_sin_cache)
    A position outside [0, max_position) makes that token's q and k heads NaN (the flag).
    Returns (q, k).
    """
    _float_array("q", q, 3)
    if k is not None:
        _float_array("k", k, 3)
        if k.dtype != q.dtype:
            raise TypeError(f"k: dtype {k.dtype} != q's {q.dtype}")
    np_array("positions", positions, 1, "iu")
    np_array("cos_sin_cache", cos_sin_cache, 2, "f")
    T, _, _, D = check_rope_shapes(q.shape, None if k is None else k.shape, positions.shape,
                                   cos_sin_cache.shape)
    half = D // 2
    P = cos_sin_cache.shape[0]
    for t in range(T):
        pos = int(positions[t])
        for x in (q, k) if k is not None else (q,):
            if not 0 <= pos < P:
                store(x[t], np.full(x[t].shape, np.nan))
                continue
            c = cos_sin_cache[pos, :half].astype(np.float64)
            s = cos_sin_cache[pos, half:].astype(np.float64)
            v = to_f64(x[t])
            a, b = v[:, :half], v[:, half:]
            store(x[t], np.concatenate([a * c - b * s, b * c + a * s], axis=1))
    return q, k


def silu_mul(x, out):
    """out = silu(x[:, :I]) * x[:, I:], silu(g) = g / (1 + exp(-g)) (SwiGLU: x = [gate | up]).

    x    [T, 2I]
    out  [T, I]  x's dtype
    """
    _float_array("x", x, 2)
    T, W = x.shape
    if W % 2:
        raise ValueError(f"x: width {W} must be even ([gate | up])")
    I = W // 2
    _same("out", out, (T, I), x.dtype)
    for t in range(T):
        v = to_f64(x[t])
        g, u = v[:I], v[I:]
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            store(out[t], g / (1.0 + np.exp(-g)) * u)
    return out
