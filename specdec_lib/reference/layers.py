"""numpy reference of the dense-layer glue ops: what a Llama-type host model needs between
its matmuls, so one model implementation serves both backends.

- ``rms_norm``          : RMSNorm, optionally fused with the residual add before it
                          (``s = x + residual`` is stored, then normalised).
- ``rope``              : rotary position embedding of q and k in place, rotate-half (NeoX /
                          HF Llama) style, from a cos/sin cache indexed by position.
- ``rope_cos_sin_cache``: that cache, ``[max_position, D]`` float32 (vLLM's layout).
- ``silu_mul``          : the SwiGLU activation ``silu(gate) * up`` of ``x = [gate | up]``.
- ``linear``            : ``x @ weight.T`` (nn.Linear layout), optionally with rms_norm (and its
                          residual add) in front and silu_mul behind, fused.

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


LINEAR_EPILOGUES = (None, "silu_mul")


def check_linear_args(x_shape, weight_shape, out_shape, *, norm_shape=None, residual_shape=None,
                      residual_out_shape=None, epilogue=None, unit_offset=False):
    """The shape rules of ``linear`` (both backends): returns (M, K, N, output width); the
    ``*_shape`` of an argument that is None is None. ValueError naming the argument."""
    if epilogue not in LINEAR_EPILOGUES:
        raise ValueError(f"epilogue: expected None or 'silu_mul', got {epilogue!r}")
    M, K = x_shape
    if K < 1:
        raise ValueError("x: K (the last dimension) must be >= 1")
    if len(weight_shape) != 2 or weight_shape[1] != K:
        raise ValueError(f"weight: expected shape [N, {K}] (K from x), got {list(weight_shape)}")
    N = weight_shape[0]
    if epilogue == "silu_mul" and N % 2:
        raise ValueError(f"weight: {N} rows must be even for epilogue='silu_mul' "
                         "([gate rows; up rows])")
    width = N // 2 if epilogue == "silu_mul" else N
    if tuple(out_shape) != (M, width):
        raise ValueError(f"out: expected shape [{M}, {width}], got {list(out_shape)}")
    if norm_shape is not None and tuple(norm_shape) != (K,):
        raise ValueError(f"norm_weight: expected shape [{K}], got {list(norm_shape)}")
    if unit_offset and norm_shape is None:
        raise ValueError("unit_offset: only with norm_weight")
    if residual_shape is not None:
        if norm_shape is None:
            raise ValueError("residual: only with norm_weight (the residual add is the norm's "
                             "prologue)")
        if tuple(residual_shape) != (M, K):
            raise ValueError(f"residual: expected shape [{M}, {K}], got {list(residual_shape)}")
        if residual_out_shape is None:
            raise ValueError("residual_out: required with residual (it receives x + residual)")
        if tuple(residual_out_shape) != (M, K):
            raise ValueError(f"residual_out: expected shape [{M}, {K}], got "
                             f"{list(residual_out_shape)}")
    elif residual_out_shape is not None:
        raise ValueError("residual_out: given without residual")
    return M, K, N, width


def linear(x, weight, out, *, norm_weight=None, eps=1e-6, residual=None, residual_out=None,
           epilogue=None, unit_offset=False):
    """out = h @ weight.T (nn.Linear layout), h = x or the fused rms_norm of x; optionally the
    SwiGLU epilogue. One rounding to x's dtype on the output.

    x             [M, K]
    weight        [N, K]  x's dtype
    out           [M, N], or [M, N/2] with epilogue='silu_mul'; x's dtype
    norm_weight   [K] or None: h = round(rms_norm(s)) exactly as ``rms_norm(s, norm_weight,
                  h, eps=eps, unit_offset=unit_offset)`` stores it, s = x, or
    residual      [M, K] (needs norm_weight): s = round(x + residual), stored to
    residual_out  [M, K], required with residual; it must not share memory with x, residual
                  (the GPU's CTAs still read those while one of them writes residual_out).
    epilogue      None, or 'silu_mul': weight = [gate rows; up rows] (N = 2I) and out =
                  silu(g) * u of the unrounded products g = h @ gate.T, u = h @ up.T.
    """
    _float_array("x", x, 2)
    _float_array("weight", weight, 2)
    if weight.dtype != x.dtype:
        raise TypeError(f"weight: dtype {weight.dtype} != x's {x.dtype}")
    _float_array("out", out, 2)
    if out.dtype != x.dtype:
        raise TypeError(f"out: dtype {out.dtype} != x's {x.dtype}")
    if norm_weight is not None:
        _float_array("norm_weight", norm_weight, 1)
    for name, a in (("residual", residual), ("residual_out", residual_out)):
        if a is not None:
            _float_array(name, a, 2)
            if a.dtype != x.dtype:
                raise TypeError(f"{name}: dtype {a.dtype} != x's {x.dtype}")
    M, K, N, width = check_linear_args(
        x.shape, weight.shape, out.shape, epilogue=epilogue, unit_offset=unit_offset,
        norm_shape=None if norm_weight is None else norm_weight.shape,
        residual_shape=None if residual is None else residual.shape,
        residual_out_shape=None if residual_out is None else residual_out.shape)
    eps = check_eps(eps)
    inputs = (("x", x), ("weight", weight), ("norm_weight", norm_weight), ("residual", residual))
    for name, a, others in (("out", out, inputs),
                            ("residual_out", residual_out, inputs + (("out", out),))):
        for other, b in others:
            if a is not None and b is not None and np.may_share_memory(a, b):
                raise ValueError(f"{name}: shares memory with {other} (the GPU kernel reads "
                                 f"the inputs while it writes {name})")
    w = to_f64(weight)
    for t in range(M):
        h = to_f64(x[t])
        if norm_weight is not None:
            if residual is not None:
                h = round_to(h + to_f64(residual[t]), x.dtype)
                store(residual_out[t], h)
            h = round_to(rms_norm_f64(h, norm_weight, eps, unit_offset), x.dtype)
        acc = w @ h
        if epilogue == "silu_mul":
            g, u = acc[:width], acc[width:]
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                acc = g / (1.0 + np.exp(-g)) * u
        store(out[t], acc)
    return out
