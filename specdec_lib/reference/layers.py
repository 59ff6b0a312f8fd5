"""numpy reference of the dense-layer glue ops: what a Llama-type host model needs between
its matmuls, so one model implementation serves both backends.

- ``rms_norm``          : RMSNorm, optionally fused with the residual add before it
                          (``s = x + residual`` is stored, then normalised).
- ``rope``              : rotary position embedding of q and k in place, rotate-half (NeoX /
                          HF Llama) style, from a cos/sin cache indexed by position.
- ``rope_cos_sin_cache``: that cache, ``[max_position, D]`` float32 (vLLM's layout).
- ``silu_mul``          : the SwiGLU activation ``silu(gate) * up`` of ``x = [gate | up]``.
- ``gated_rms_norm``    : RMSNorm per group of channels times ``weight * silu(z + z_bias)``
                          (Qwen3-Next's RMSNormGated: a gated-delta-net layer's output norm).
- ``linear``            : ``x @ weight.T`` (nn.Linear layout), optionally with rms_norm (and its
                          residual add) in front and silu_mul behind, fused.

Same names and argument order as ``specdec_lib.ops.layers``; outputs are written into the
caller's arrays (in place for rope) and returned. Math in float64, one rounding to the
output dtype. Arrays: float64, float32, float16, or uint16 holding bfloat16 bits. Every op
runs its contract (``specdec_lib.contract.layers``) first: dtypes by kind (uint16 counts
as bfloat16), shapes, strides and limits as on the GPU.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..contract import checked
from .gdn import round_to, store, to_f64


def rms_norm_f64(x, weight, eps, unit_offset):
    """x [..., H] -> x * rsqrt(mean(x^2) + eps) * (weight or 1 + weight), float64."""
    x = to_f64(x)
    w = to_f64(weight)
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * ((1.0 + w) if unit_offset else w)


def silu_f64(g):
    """g / (1 + exp(-g)) in float64, without warnings in the tails (-0 towards -inf)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-g))


@checked("rms_norm")
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
    T, H = x.shape
    eps = float(eps)
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


@checked("rope")
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
    T, _, D = q.shape
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


@checked("silu_mul")
def silu_mul(x, out):
    """out = silu(x[:, :I]) * x[:, I:], silu(g) = g / (1 + exp(-g)) (SwiGLU: x = [gate | up]).

    x    [T, 2I]
    out  [T, I]  x's dtype
    """
    T, W = x.shape
    I = W // 2
    for t in range(T):
        v = to_f64(x[t])
        store(out[t], silu_f64(v[:I]) * v[I:])
    return out


@checked("gated_rms_norm")
def gated_rms_norm(x, z, weight, out, *, group_size, z_bias=None, eps=1e-6):
    """Gated RMSNorm per group of G = group_size channels: for row t and channel c of group
    j = c // G,  out[t, c] = x[t, c] * rsqrt(mean(x[t, jG:(j+1)G]^2) + eps) * w[c'] *
    silu(z[t, c] + b[c']),  c' = c (weight / z_bias of length C) or c % G (length G: one
    vector shared by every group), b = 0 without z_bias.

    x       [T, C]
    z       [T, C]
    weight  [C] or [G]
    out     [T, C]  z's dtype; may be x itself (same dtype and layout)
    z_bias  [C] or [G] (weight's dtype), or None
    (the GPU op: x float32 or z's dtype, weight and z_bias float32 or z's dtype)
    """
    T, C = x.shape
    G = int(group_size)
    eps = float(eps)

    def per_channel(a):
        a = to_f64(a)
        return np.tile(a, C // G) if a.shape[0] != C else a
    if C == 0:
        return out
    w = per_channel(weight)
    b = per_channel(z_bias) if z_bias is not None else 0.0
    for t in range(T):
        v = to_f64(x[t]).reshape(C // G, G)
        r = 1.0 / np.sqrt(np.mean(v * v, axis=1, keepdims=True) + eps)
        store(out[t], (v * r).reshape(C) * w * silu_f64(to_f64(z[t]) + b))
    return out


@checked("linear")
def linear(x, weight, out, *, norm_weight=None, eps=1e-6, residual=None, residual_out=None,
           epilogue=None, unit_offset=False, tensor_cores=False):
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
    tensor_cores  the GPU's choice of kernel for a few rows (its summation order); the exact
                  value is the same.
    """
    M = x.shape[0]
    width = out.shape[1]
    eps = float(eps)
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
            acc = silu_f64(acc[:width]) * acc[width:]
        store(out[t], acc)
    return out
