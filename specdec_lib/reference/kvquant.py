"""The 8-bit KV cache formats, bit for bit: the spec the kernels round to (issue 32).

Two cache dtypes beside float16/bfloat16 (``specdec_lib.dtypes.KV_CACHE_DTYPES``):

``fp8_e4m3`` -- OCP E4M3 (the ``float8_e4m3fn`` of torch, CUDA's ``__NV_E4M3``): 1 sign, 4
exponent (bias 7), 3 mantissa bits; no infinity; NaN is ``0x7F`` / ``0xFF``; largest finite
448 (``0x7E``); smallest subnormal 2^-9. On the host a fp8 cache is a ``uint8`` array of bit
patterns (numpy has no fp8; torch ``float8_e4m3fn`` tensors are accepted as the same bits).
Scales: float32 per KV head, given by the caller (the vLLM / FlashInfer convention;
a per-tensor scale is the shape-[1] case)::

    stored = e4m3(x * (1 / scale))        (x: the source element as float32)
    read   = e4m3_value(stored) * scale

with ``1 / scale`` and the product in IEEE float32 round-to-nearest-even (no flush to
zero, no fused multiply-add; the kernels use ``rcp.rn.f32`` / ``mul.rn.f32``: a reciprocal
once per head, then a multiply, instead of one division per element -- it can differ from
``x / scale`` by one float32 ulp before the 3-bit rounding, i.e. only at exact ties).
``e4m3`` is round-to-nearest-even with saturation to +-448 (infinities included) and
NaN -> 0x7F, exactly CUDA's ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)``
(``cvt.rn.satfinite.e4m3x2.f32`` on sm_89+, its software twin elsewhere); magnitudes up to
2^-10 (half the smallest subnormal, the tie rounding to even) give a zero of x's sign.
Scales must be finite, positive and normal (>= 2^-126, so that 1 / scale is finite).

``int8`` -- asymmetric, one (scale, zero) float32 pair per token per KV head, computed at
append from the row's own D values (LMDeploy TurboMind's scheme) and stored beside the page
in a float32 tensor ``k_params`` / ``v_params`` of shape ``[num_pages, page_size, Hkv, 2]``
(contiguous; ``[..., 0]`` = scale, ``[..., 1]`` = zero). All float32 IEEE round-to-nearest
without flush or fusion::

    mn, mx = min(x), max(x)                 NaN elements ignored (NaN only if all are)
    scale  = (mx - mn) / 255                if not a normal finite float32 (all-equal row,
                                            all-NaN row, a range beyond float32): scale = 1
    zero   = mn + 0                         a zero minimum is +0: which zero a min keeps
                                            depends on its order (min.bf16x2 pairs, numpy)
    u      = clamp(rint((x - mn) * (1 / scale)), 0, 255)     rint: half to even; NaN x: u = 0
    stored = int8(u - 128)
    read   = (float(stored + 128) * scale) + zero              (two roundings, no fma)

An all-equal row reads back exactly; ``mn`` always reads back exactly; a NaN element reads
as ``mn`` (int8 has no NaN code), an all-NaN row as NaN.
"""
from __future__ import annotations

import numpy as np

__all__ = ["E4M3_MAX", "E4M3_NAN", "MIN_SCALE", "e4m3_encode", "e4m3_decode", "fp8_quantize",
           "fp8_dequantize", "int8_quantize", "int8_dequantize", "int8_params"]

E4M3_MAX = 448.0
E4M3_NAN = 0x7F
MIN_SCALE = np.float32(2.0 ** -126)   # smallest normal float32: 1 / scale stays finite


def _bits(x):
    return np.array(x, dtype=np.float32, order="C").view(np.uint32)


def e4m3_encode(x) -> np.ndarray:
    """float32 array -> E4M3 bit patterns (uint8): round to nearest even, saturate to +-448,
    NaN -> 0x7F (the integer formulation the software kernel path uses)."""
    u = _bits(x).astype(np.int64)
    sign = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    out = np.zeros(a.shape, np.int64)
    # normal range [2^-6, 464]: round the float32 significand to 3 bits (RNE on bit 20)
    r = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
    normal = a >= 0x3C800000
    out = np.where(normal, r, out)
    # subnormal range (2^-10, 2^-6): m = rne(|x| * 2^9), m in 1..8 (8 is the smallest normal)
    E = (a >> 23) - 127
    s = (a & 0x7FFFFF) | 0x800000
    shift = np.clip(14 - E, 1, 62)
    m = s >> shift
    rem = s & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    m = m + ((rem > half) | ((rem == half) & ((m & 1) == 1)))
    sub = (~normal) & (a > 0x3A800000)
    out = np.where(sub, m, out)
    out = np.where(a > 0x43E80000, 0x7E, out)           # beyond 448 + half an ulp: saturate
    out = out | sign
    out = np.where(a > 0x7F800000, E4M3_NAN, out)       # NaN (either sign) -> 0x7F
    return out.astype(np.uint8)


def e4m3_decode(b) -> np.ndarray:
    """E4M3 bit patterns (uint8) -> float32 values (exact; 0x7F / 0xFF -> NaN)."""
    b = np.asarray(b, dtype=np.uint8).astype(np.int64)
    e = (b >> 3) & 0xF
    m = b & 7
    mag = np.where(e == 0, m * 2.0 ** -9, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    v = np.where(b & 0x80, -mag, mag)
    v = np.where((b & 0x7F) == 0x7F, np.nan, v)
    return v.astype(np.float32)


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def fp8_quantize(x, scale) -> np.ndarray:
    """x [..., D] (float, any dtype exactly representable in float32), scale broadcastable
    float32 -> fp8 codes (uint8): e4m3(x * (1 / scale)) in float32."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        inv = np.float32(1.0) / _f32(scale)
        return e4m3_encode(_f32(x) * inv)


def fp8_dequantize(codes, scale) -> np.ndarray:
    """fp8 codes -> float64 e4m3_value(code) * scale (exact: what the attention reference
    reads; the kernels apply the scales to the scores and the output in float32)."""
    return e4m3_decode(codes).astype(np.float64) * np.asarray(scale, dtype=np.float64)


def int8_params(x) -> np.ndarray:
    """x [..., D] -> float32 [..., 2] (scale, zero) per row (see the module docstring)."""
    x = _f32(x)
    with np.errstate(all="ignore"):
        allnan = np.all(np.isnan(x), axis=-1)
        mn = np.where(allnan, np.float32(np.nan), np.nanmin(np.where(np.isnan(x), np.inf, x), axis=-1)
                      ).astype(np.float32)
        mx = np.where(allnan, np.float32(np.nan), np.nanmax(np.where(np.isnan(x), -np.inf, x), axis=-1)
                      ).astype(np.float32)
        scale = ((mx - mn) / np.float32(255.0)).astype(np.float32)
        good = (scale >= MIN_SCALE) & (scale < np.float32(np.inf))
        zero = (mn + np.float32(0.0)).astype(np.float32)
    scale = np.where(good, scale, np.float32(1.0)).astype(np.float32)
    return np.stack([scale, zero], axis=-1).astype(np.float32)


def int8_quantize(x, params=None):
    """x [..., D] -> (codes int8 [..., D], params float32 [..., 2]); ``params`` default:
    ``int8_params(x)``."""
    x = _f32(x)
    if params is None:
        params = int8_params(x)
    scale = params[..., 0:1].astype(np.float32)
    mn = params[..., 1:2].astype(np.float32)
    with np.errstate(all="ignore"):
        inv = (np.float32(1.0) / scale).astype(np.float32)
        t = ((x - mn).astype(np.float32) * inv).astype(np.float32)
        r = np.rint(t)
        r = np.where(np.isnan(r), 0.0, r)
    u = np.clip(r, 0, 255).astype(np.int64)
    return (u - 128).astype(np.int8), params


def int8_dequantize(codes, params) -> np.ndarray:
    """int8 codes [..., D], params [..., 2] -> float32 (float(c + 128) * scale) + zero."""
    u = (np.asarray(codes, dtype=np.int8).astype(np.int64) + 128).astype(np.float32)
    scale = np.asarray(params[..., 0:1], dtype=np.float32)
    zero = np.asarray(params[..., 1:2], dtype=np.float32)
    with np.errstate(all="ignore"):
        return ((u * scale).astype(np.float32) + zero).astype(np.float32)
