"""Contract of the layers family: ``rms_norm``, ``rope``, ``silu_mul``, ``gated_rms_norm``,
``linear`` (``rope_cos_sin_cache`` builds an argument, it is no op). Also the checks the draft
family shares: ``FLOATS``, ``last_contiguous``, ``rows_disjoint``."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .._args import DeviceArg
from ._batch import FLOATS, extent, last_contiguous, overlaps  # noqa: F401 (public here too)
from ._core import check

ROPE_MAX_HEAD_DIM = 256
LINEAR_EPILOGUES = (None, "silu_mul")
_INT32_MAX = 2**31 - 1


def rows_disjoint(a, width):
    """An output's rows must not overlap (a row stride of at least its width)."""
    if a.shape[0] > 1 and abs(a.strides[0]) < width:
        raise ValueError(f"{a.name}: rows overlap (row stride {a.strides[0]} < width {width})")


def check_eps(eps):
    """eps as a float: a finite real > 0, else ValueError naming ``eps``."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) \
            or eps <= 0:
        raise ValueError(f"eps: expected a finite float > 0, got {eps!r}")
    return float(eps)


# ---------------------------------------------------------------------------- rms_norm
@check("rms_norm")
def rms_norm(x, weight, out, *, eps=1e-6, residual=None, residual_out=None, unit_offset=False,
             arg=DeviceArg, values=None, **_):
    """x [T, H] float32/float16/bfloat16; weight [H] contiguous, x's dtype or float32; out
    [T, H] x's dtype; residual [T, H] x's dtype or None, residual_out [T, H] x's dtype,
    required with residual and only with it; last dimensions contiguous, output rows
    disjoint; eps a finite float > 0; H < 2^30. Returns (x, weight, out, residual,
    residual_out, eps) (views; eps a float)."""
    xa = arg("x", x, dtype=FLOATS, ndim=2)
    dev = xa.device
    T, H = xa.shape
    dt = xa.dtype
    o = arg("out", out, dtype=dt, shape=(T, H), device=dev)
    w = arg("weight", weight, dtype=(dt, "float32") if dt != "float32" else dt,
             shape=(H,), device=dev, contiguous=True)
    eps = check_eps(eps)
    r = arg("residual", residual, dtype=dt, shape=(T, H), device=dev, optional=True)
    ro = arg("residual_out", residual_out, dtype=dt, shape=(T, H), device=dev, optional=True)
    fused = residual is not None
    if fused and residual_out is None:
        raise ValueError("residual_out: required with residual (it receives x + residual; "
                         "pass residual itself to update it in place)")
    if not fused and residual_out is not None:
        raise ValueError("residual_out: given without residual")
    for a in (xa, o, r, ro):
        if a.obj is not None:
            last_contiguous(a)
    rows_disjoint(o, H)
    if fused:
        rows_disjoint(ro, H)
    if H >= 2**30:
        raise ValueError(f"x: width {H} is too wide (at most 2^30 - 1)")
    return xa, w, o, r, ro, eps


# ---------------------------------------------------------------------------- rope
def rope_shapes(q_shape, k_shape, positions_shape, cache_shape):
    """(T, Hq, Hk, D) from the shapes of rope's arguments (k_shape None: no k): q [T, Hq, D]
    with D even in 2..ROPE_MAX_HEAD_DIM, k [T, Hk, D], positions [T], cos_sin_cache
    [max_position, D]; ValueError naming the argument otherwise."""
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


@check("rope")
def rope(q, k, positions, cos_sin_cache, *, arg=DeviceArg, values=None, **_):
    """q [T, Hq, D] float32/float16/bfloat16, k [T, Hk, D] q's dtype or None, last
    dimensions contiguous, D even in 2..256; positions int32 [T] contiguous; cos_sin_cache
    float32 [max_position, D] contiguous; (Hq + Hk) D < 2^31 - 1. Positions are device
    data: one outside [0, max_position) is the kernel's NaN flag, never an error.
    Returns (q, k, positions, cos_sin_cache, T, Hq, Hk, D) (views, then ints)."""
    qa = arg("q", q, dtype=FLOATS, ndim=3)
    dev = qa.device
    ka = arg("k", k, dtype=qa.dtype, ndim=3, device=dev, optional=True)
    pa = arg("positions", positions, dtype="int32", ndim=1, device=dev, contiguous=True)
    ca = arg("cos_sin_cache", cos_sin_cache, dtype="float32", ndim=2, device=dev,
             contiguous=True)
    T, Hq, Hk, D = rope_shapes(qa.shape, ka.shape if k is not None else None, pa.shape,
                               ca.shape)
    last_contiguous(qa)
    if k is not None:
        last_contiguous(ka)
    if (Hq + Hk) * D >= _INT32_MAX:
        raise ValueError(f"q: {Hq} + {Hk} heads of {D} are too many (the kernel's per-token "
                         "index is int32)")
    return qa, ka, pa, ca, T, Hq, Hk, D


# ---------------------------------------------------------------------------- silu_mul
@check("silu_mul")
def silu_mul(x, out, *, arg=DeviceArg, values=None, **_):
    """x [T, 2I] float32/float16/bfloat16, out [T, I] x's dtype; last dimensions
    contiguous, out's rows disjoint; I < 2^31. Returns (x, out, T, I)."""
    xa = arg("x", x, dtype=FLOATS, ndim=2)
    dev = xa.device
    T, W = xa.shape
    if W % 2:
        raise ValueError(f"x: width {W} must be even ([gate | up])")
    I = W // 2
    o = arg("out", out, dtype=xa.dtype, shape=(T, I), device=dev)
    last_contiguous(xa)
    last_contiguous(o)
    rows_disjoint(o, I)
    if I > _INT32_MAX:
        raise ValueError(f"x: width {W} exceeds the kernel's int32 range")
    return xa, o, T, I


# ---------------------------------------------------------------------------- gated_rms_norm
def _is_input(arg, out, x):
    """Whether ``out`` is ``x`` itself: the same dtype, first element and row stride (what an
    in-place gated_rms_norm needs: each lane reads its elements before it writes them)."""
    if out.dtype != x.dtype:
        return False
    host = arg is not DeviceArg
    a, b = extent(out, host), extent(x, host)
    if a is None or b is None:                  # fake tensors: only the same tensor
        return out.obj is x.obj
    return a == b and (out.shape[0] <= 1 or out.strides[0] == x.strides[0])


@check("gated_rms_norm")
def gated_rms_norm(x, z, weight, out, *, group_size, z_bias=None, eps=1e-6, arg=DeviceArg,
                   values=None, **_):
    """x [T, C] float32 or z's dtype; z [T, C] float32/float16/bfloat16; out [T, C] z's
    dtype; weight [C] or [G] contiguous, float32 or z's dtype; z_bias None or [C] or [G]
    contiguous, weight's dtype; last dimensions contiguous, out's rows disjoint; group_size
    G an int >= 1 dividing C; eps a finite float > 0; C < 2^31. out is x itself (x's dtype,
    address and row stride: in place) or overlaps none of x, z, weight, z_bias. Returns (x, z,
    weight, out, z_bias, G, eps) (views, then an int and a float)."""
    xa = arg("x", x, dtype=FLOATS, ndim=2)
    dev = xa.device
    T, C = xa.shape
    za = arg("z", z, dtype=FLOATS, shape=(T, C), device=dev)
    dt = za.dtype
    narrow = tuple(dict.fromkeys(("float32", dt)))          # float32 or z's dtype
    if not xa.by_kind and xa.dtype not in narrow:
        raise TypeError(f"x: dtype must be {' or '.join(narrow)} (z is {dt}), got {xa.dtype}")
    o = arg("out", out, dtype=dt, shape=(T, C), device=dev)
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral):
        raise TypeError(f"group_size: expected an int, got {group_size!r}")
    G = int(group_size)
    if G < 1 or C % G:
        raise ValueError(f"group_size: {G} must be >= 1 and divide the width {C} of x")
    lengths = (C,) if G == C else (C, G)        # (no hashing: symbolic under torch.compile)
    want = " or ".join(f"[{n}]" for n in lengths)
    w = arg("weight", weight, dtype=narrow, ndim=1, device=dev, contiguous=True)
    b = arg("z_bias", z_bias, dtype=w.dtype, ndim=1, device=dev, contiguous=True,
            optional=True)
    for a in (w, b):
        if a.obj is not None and a.shape[0] not in lengths:
            raise ValueError(f"{a.name}: expected shape {want} (C, or the group size shared "
                             f"by every group), got {list(a.shape)}")
    eps = check_eps(eps)
    for a in (xa, za, o):
        last_contiguous(a)
    rows_disjoint(o, C)
    if C > _INT32_MAX:
        raise ValueError(f"x: width {C} exceeds the kernel's int32 range")
    # a lane reads each of its elements before it writes it: out may be x itself, nothing else
    if overlaps(arg, o, xa) and not _is_input(arg, o, xa):
        raise ValueError("out: overlaps x (in place, out must be x itself: its dtype, address "
                         "and row stride)")
    for a in (za, w, b):
        if a.obj is not None and overlaps(arg, o, a):
            raise ValueError(f"out: overlaps {a.name} (only x may be written in place)")
    return xa, za, w, o, b, G, eps


# ---------------------------------------------------------------------------- linear
def linear_shapes(x_shape, weight_shape, out_shape, *, norm_shape=None, residual_shape=None,
                  residual_out_shape=None, epilogue=None, unit_offset=False):
    """The shape rules of ``linear``: returns (M, K, N, output width); the ``*_shape`` of an
    argument that is None is None. ValueError naming the argument."""
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


@check("linear")
def linear(x, weight, out, *, norm_weight=None, eps=1e-6, residual=None, residual_out=None,
           epilogue=None, unit_offset=False, tensor_cores=False, arg=DeviceArg, values=None,
           **_):
    """x [M, K] float16/bfloat16 (K >= 1); weight [N, K] x's dtype, contiguous; out
    [M, N] (or [M, N/2] with epilogue='silu_mul', N even) x's dtype; norm_weight [K]
    x's dtype or float32, contiguous, or None; residual / residual_out [M, K] x's dtype,
    only with norm_weight and together; unit_offset only with norm_weight; eps a finite
    float > 0; last dimensions contiguous, output rows disjoint; out overlaps no input,
    residual_out neither an input nor out; K < 2^30, N < 2^31; tensor_cores a bool. Returns
    (x, weight, out, norm_weight, residual, residual_out, M, K, N, width, eps)."""
    if not isinstance(tensor_cores, (bool, np.bool_)):
        raise TypeError(f"tensor_cores: expected a bool, got {type(tensor_cores).__name__}")
    xa = arg("x", x, dtype=("float16", "bfloat16"), ndim=2)
    dev = xa.device
    dt = xa.dtype
    wa = arg("weight", weight, dtype=dt, ndim=2, device=dev, contiguous=True)
    o = arg("out", out, dtype=dt, ndim=2, device=dev)
    nw = arg("norm_weight", norm_weight, dtype=(dt, "float32"), ndim=1, device=dev,
              contiguous=True, optional=True)
    r = arg("residual", residual, dtype=dt, ndim=2, device=dev, optional=True)
    ro = arg("residual_out", residual_out, dtype=dt, ndim=2, device=dev, optional=True)
    norm, fused = norm_weight is not None, residual is not None
    M, K, N, width = linear_shapes(
        xa.shape, wa.shape, o.shape, epilogue=epilogue, unit_offset=unit_offset,
        norm_shape=nw.shape if norm else None, residual_shape=r.shape if fused else None,
        residual_out_shape=ro.shape if residual_out is not None else None)
    eps = check_eps(eps)
    for a in (xa, o, r, ro):
        if a.obj is not None:
            last_contiguous(a)
    rows_disjoint(o, width)
    if fused:
        rows_disjoint(ro, K)
    if K >= 2**30 or N > _INT32_MAX:
        raise ValueError(f"weight: [{N}, {K}] is too large (N < 2^31, K < 2^30)")
    # other CTAs still read the inputs while one writes an output: no output may share memory
    host = arg is not DeviceArg
    inputs = [a for a in (xa, wa, nw, r) if a.obj is not None]
    for a, others in ((o, inputs), (ro, inputs + [o])):
        if a.obj is None:
            continue
        span = extent(a, host)
        if span is None:
            continue
        for b in others:
            bspan = extent(b, host)
            if bspan is not None and span[0] < bspan[1] and bspan[0] < span[1]:
                raise ValueError(f"{a.name}: overlaps {b.name} (other CTAs read the inputs "
                                 f"while the kernel writes {a.name})")
    return xa, wa, o, nw, r, ro, M, K, N, width, eps
