"""rms_norm, rope, silu_mul, gated_rms_norm, linear on the GPU (kernels:
cuda_src/layers/layers.cu and, for linear, cuda_src/layers/linear.cu and linear_mma.cu).

The elementwise glue of a dense (Llama-type) layer, so that a host model's layer is a few
library launches; semantics and argument order in ``specdec_lib.reference.layers`` (whose
functions are also the CPU backend's host math). Activations float32, float16 or bfloat16,
last dimension contiguous, other strides free (views into a fused projection work); math
in float32, one rounding to the output dtype. ``T = 0`` is a no-op.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .. import _kernels, runtime
from .._validate import as_stream
from ..contract import layers as contract
from ..reference.layers import rope_cos_sin_cache  # noqa: F401  (re-exported)
from ._types import ArrayLike, Stream

__all__ = ["gated_rms_norm", "linear", "rms_norm", "rope", "rope_cos_sin_cache", "silu_mul"]


_THREADS = 256                # rope, silu_mul (kThreads)
_NORM_MAX_THREADS = 512       # rms_norm (kNormMaxThreads: 128 registers a thread)
_GRID_PER_SM = 16             # rope, silu_mul: grid-stride past this many CTAs per SM
_SMALL_ITEMS = 16384          # silu_mul: below this many 16-byte units, one element a thread
_INT32_MAX = 2**31 - 1
_LINEAR_ROWS = 16             # linear: rows per chunk (kRows); gridDim.y strides over chunks
_LINEAR_THREADS = 128         # linear: blockDim (kThreads: 4 warps of two columns each)
_GRID_Y_MAX = 65535
_LINEAR_CARVEOUT = set()      # linear kernel handles whose shared-memory carveout was raised
_UNROLL = 4                   # 16-byte units per thread that blockDim is sized for
_GATED_UNIT = 4               # gated_rms_norm: elements a unit (kGatedUnit)
_GATED_WARPS = 4              # ... warps a CTA at most (kGatedThreads / 32)
_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}   # kernel name suffixes


def _row_bytes(a):
    """Byte stride between rows of a 2-D argument; 0 when there is at most one row (its
    stride is then meaningless and must not limit the vector width)."""
    return a.strides[0] * a.itemsize if a.shape[0] > 1 else 0


def _threads_for(units, cap):
    """~_UNROLL units per thread, a multiple of 32, at most cap."""
    return int(min(cap, max(32, -(-units // (_UNROLL * 32)) * 32)))


_NORM_UNITS = 1               # rms_norm: 16-byte units per thread that blockDim is sized for


def _norm_threads(H, itemsize):
    """rms_norm's blockDim for width H: from H alone (row invariance); linear's fused norm
    reproduces the sum order it implies. One 16-byte unit a thread up to the cap: at batch 1
    a row is latency, and ncu (s19, round_b1's T=4 rows of H=2048 bf16) counted ~1,280
    dependent instructions a warp with 4 units a thread (64 threads, 6.9 cycles an
    instruction: the whole kernel); one unit a thread cuts each warp's chain about 4x."""
    units = -(-H // (16 // itemsize))
    return int(min(_NORM_MAX_THREADS, max(32, -(-units // (_NORM_UNITS * 32)) * 32)))


def _flat_grid(items, device):
    return int(min(-(-items // _THREADS), runtime.sm_count(device) * _GRID_PER_SM))


def rms_norm(x: ArrayLike, weight: ArrayLike, out: ArrayLike, *, eps: float = 1e-6,
             residual: Optional[ArrayLike] = None, residual_out: Optional[ArrayLike] = None,
             unit_offset: bool = False, stream: Stream = None) -> ArrayLike:
    """out = RMSNorm(s) * w, s = x, or s = x + residual (fused residual add).

    x [T, H] float32/float16/bfloat16; weight [H] contiguous, x's dtype or float32; out
    [T, H] x's dtype (may be x itself). w = weight, or 1 + weight with ``unit_offset``
    (zero-centred norms). eps > 0. With ``residual`` [T, H] (x's dtype), ``residual_out``
    [T, H] is required (it may be residual itself): it receives s = round(x + residual),
    and out is the norm of that rounded s — bit for bit what the unfused
    ``residual_out = x + residual; rms_norm(residual_out, ...)`` gives. One CTA per row;
    a row's bits do not depend on T or on the other rows. Returns out.

    Example (a Llama decoder layer's pre-MLP norm, residual stream updated in place)::

        rms_norm(attn_out, ln2_weight, h, residual=resid, residual_out=resid, eps=1e-5)
    """
    xa, w, o, r, ro, eps = contract.rms_norm(x, weight, out, eps=eps, residual=residual,
                                             residual_out=residual_out)
    dev = xa.device
    T, H = xa.shape
    dt = xa.dtype
    fused = residual is not None
    stream_h = as_stream(stream)
    if T == 0 or H == 0:
        return out
    E = xa.itemsize
    bits = xa.ptr | o.ptr | w.ptr | H * E | _row_bytes(xa) | _row_bytes(o)
    if fused:
        bits |= r.ptr | ro.ptr | _row_bytes(r) | _row_bytes(ro)
    # the kernel walks a row in 16-byte units either way: blockDim from H alone (row invariance)
    threads = _norm_threads(H, E)
    vec = bits % 16 == 0
    # one aligned 16-byte unit a thread: the loop-free form, the same bits (rms_norm_unit)
    unit = "_unit" if vec and H * E <= 16 * threads else ""
    k = runtime.kernel("layers", f"rms_norm{unit}_{_SHORT[dt]}_w{_SHORT[w.dtype]}", dev)
    from .. import _layers
    _layers.launch_rms_norm(k, min(T, _INT32_MAX), threads, stream_h, xa.ptr, r.ptr, ro.ptr,
                            w.ptr, o.ptr, xa.strides[0], r.strides[0] if fused else 0,
                            ro.strides[0] if fused else 0, o.strides[0], T, H,
                            bool(unit_offset), vec, eps)
    return out


def rope(q: ArrayLike, k: Optional[ArrayLike], positions: ArrayLike, cos_sin_cache: ArrayLike,
         *, stream: Stream = None) -> Tuple[ArrayLike, Optional[ArrayLike]]:
    """Rotary position embedding of q and k, in place, rotate-half (NeoX / HF Llama) style.

    q [T, Hq, D], k [T, Hk, D] (q's dtype) or None: float32/float16/bfloat16, last dim
    contiguous, token and head strides free (e.g. ``qkv[:, :Hq*D].view(T, Hq, D)``); D even,
    at most 256. positions int32 [T] contiguous. cos_sin_cache float32 [max_position, D]
    contiguous: cos in the first D/2 columns, sin in the last D/2 (vLLM's layout; build it
    with ``rope_cos_sin_cache(max_position, D, theta)``). For i < D/2, with c, s from row
    ``positions[t]``: x[i] <- x[i] c - x[i+D/2] s, x[i+D/2] <- x[i+D/2] c + x[i] s.
    A position outside [0, max_position) never faults: that token's q and k heads become
    NaN (a visible flag). Returns (q, k).
    """
    qa, ka, pa, ca, T, Hq, Hk, D = contract.rope(q, k, positions, cos_sin_cache)
    dev = qa.device
    stream_h = as_stream(stream)
    if T == 0 or Hq + Hk == 0:
        return q, k
    E = qa.itemsize
    V = 16 // E
    half = D // 2

    def strides_bits(a, heads):
        return ((a.strides[0] * E if T > 1 else 0) | (a.strides[1] * E if heads > 1 else 0)
                | a.ptr)
    bits = strides_bits(qa, Hq) | ca.ptr
    if k is not None and Hk:
        bits |= strides_bits(ka, Hk)
    vectorize = half % V == 0 and bits % 16 == 0
    items = T * (Hq + Hk) * (half // V if vectorize else half)
    kern = runtime.kernel("layers", f"rope_{_SHORT[qa.dtype]}", dev)
    from .. import _layers
    _layers.launch_rope(kern, _flat_grid(items, dev), _THREADS, stream_h, qa.ptr,
                        ka.ptr if k is not None else 0, pa.ptr, ca.ptr, qa.strides[0],
                        qa.strides[1], ka.strides[0] if k is not None else 0,
                        ka.strides[1] if k is not None else 0, T, ca.shape[0], Hq, Hk, D,
                        vectorize)
    return q, k


def silu_mul(x: ArrayLike, out: ArrayLike, *, stream: Stream = None) -> ArrayLike:
    """out = silu(x[:, :I]) * x[:, I:] (SwiGLU, x = [gate | up]), silu(g) = g / (1 + exp(-g))
    with an accurate exp (float32 matches the float64 reference to ~1e-6).

    x [T, 2I] float32/float16/bfloat16, out [T, I] x's dtype; last dimensions contiguous,
    row strides free. Returns out.
    """
    xa, o, T, I = contract.silu_mul(x, out)
    dev = xa.device
    stream_h = as_stream(stream)
    if T == 0 or I == 0:
        return out
    E = xa.itemsize
    V = 16 // E
    vectorize = I % V == 0 and (xa.ptr | o.ptr | _row_bytes(xa) | _row_bytes(o)) % 16 == 0
    # few items (batch 1): one element a thread instead of V spreads the silu chain (an
    # accurate exp per element) over V times the threads; the bits are the same either way
    if vectorize and T * (I // V) < _SMALL_ITEMS:
        vectorize = False
    items = T * (I // V if vectorize else I)
    kern = runtime.kernel("layers", f"silu_mul_{_SHORT[xa.dtype]}", dev)
    from .. import _layers
    _layers.launch_silu_mul(kern, _flat_grid(items, dev), _THREADS, stream_h, xa.ptr, o.ptr,
                            xa.strides[0], o.strides[0], T, I, vectorize)
    return out


def _gated_lanes(G):
    """Lanes a group of G channels takes in gated_rms_norm: the power of two that gives each
    lane one unit of _GATED_UNIT elements, at most 32 (G > 128: two units a lane in registers,
    G > 256: more, read twice). From G alone: a row's bits do not depend on T or on other rows."""
    units = -(-G // _GATED_UNIT)
    return min(32, 1 << (units - 1).bit_length())


def gated_rms_norm(x: ArrayLike, z: ArrayLike, weight: ArrayLike, out: ArrayLike, *,
                   group_size: int, z_bias: Optional[ArrayLike] = None, eps: float = 1e-6,
                   stream: Stream = None) -> ArrayLike:
    """out = RMSNorm(x per group of ``group_size`` channels) * weight * silu(z + z_bias): the
    gated norm of a gated-delta-net layer's output (Qwen3-Next's RMSNormGated), one launch.

    x [T, C] float32 or z's dtype; z [T, C] float32/float16/bfloat16; out [T, C] z's dtype;
    last dimensions contiguous, row strides free (z may be a column slice of a projection's
    rows). G = group_size divides C (a GDN layer: G = Dv, C = Hv * Dv). weight [C], or [G]
    shared by every group; z_bias None, [C] or [G] (weight's dtype); weight and z_bias
    contiguous, float32 or z's dtype. For row t and channel c of group j:
    out = x * rsqrt(mean(x[t, group j]^2) + eps) * weight * silu(z + z_bias), in float32
    (silu with an accurate exp, the mean by an IEEE division), one rounding to out's dtype.
    out may be x itself (same dtype, address and row stride: in place); otherwise it must
    overlap none of the inputs. A group is one to 32 lanes of a warp, groups of up to 256
    channels held in registers (past that read twice), no block barrier; a row's bits depend
    only on its values and G. T = 0 is a no-op. Returns out.

    Example (Qwen3-Next: o float32 [T, 32, 128] from gdn_verify, z a bf16 column slice)::

        gated_rms_norm(o.view(T, 4096), z, norm_w, y, group_size=128, eps=1e-6)
    """
    xa, za, w, o, b, G, eps = contract.gated_rms_norm(x, z, weight, out, group_size=group_size,
                                                      z_bias=z_bias, eps=eps)
    dev = za.device
    T, C = za.shape
    stream_h = as_stream(stream)
    if T == 0 or C == 0:
        return out
    lanes = _gated_lanes(G)
    per_warp = 32 // lanes
    groups = C // G
    warps = min(_GATED_WARPS, -(-groups // per_warp))
    gx = -(-groups // (warps * per_warp))

    def vec(*arrays):           # every unit of 4 elements of these arrays one aligned access
        return G % _GATED_UNIT == 0 and all(
            (a.ptr | (_row_bytes(a) if len(a.shape) == 2 else 0)) % (_GATED_UNIT * a.itemsize)
            == 0 for a in arrays if a.obj is not None)
    k = runtime.kernel("layers", f"gated_rms_norm_{_SHORT[za.dtype]}_x{_SHORT[xa.dtype]}"
                       f"_w{_SHORT[w.dtype]}", dev)
    from .. import _layers
    _layers.launch_gated_rms_norm(k, gx, min(T, _GRID_Y_MAX), 32 * warps, stream_h, xa.ptr,
                                  za.ptr, w.ptr, b.ptr, o.ptr, xa.strides[0], za.strides[0],
                                  o.strides[0], T, C, G, lanes, w.shape[0] != C,
                                  b.obj is not None and b.shape[0] != C, vec(xa), vec(za),
                                  vec(o), vec(w, b), eps)
    return out


LINEAR_FAST_MAX_ROWS = 8       # linear's few-row kernels (linear_m*_k*): rows ...
LINEAR_FAST_MAX_K = 2048       # ... and K they take (16-byte aligned rows, K % 8 == 0)
LINEAR_MMA_MAX_ROWS = 256      # rows the tensor-core form takes (tensor_cores=True; 8 a row group)
# Rows a CTA of the few-row kernels takes (MR: 1, 2 or 4; gridDim.y = ceil(M / MR) CTA rows
# over the same columns). A warp normalises and multiplies each of its rows in one dependent
# chain, so more CTA rows of fewer rows each run faster at these sizes; the weights come
# once from HBM, then from L2 for the other CTA rows. None: 1 (H100, s42, SmolLM2's 30
# layers in one graph, us: M=2 411 against 478 at MR 2; M=4 558 / 606 / 803 at MR 1 / 2 / 4;
# cuBLAS ~620 at every M, which MR 1 beats up to M=5); an int forces one (benchmarks).
# Output columns a warp of the few-row kernels owns: 4 (None: the default) takes
# linear_w4_m*_k4_* (16 columns a CTA: the per-row work a warp repeats -- x fetch, the
# norm's shuffle trees, unpack -- over twice the columns, half the CTAs a row) where
# instantiated: K <= 1024 (4 units a lane; a k8 form needs 213-248 registers) at 1 or 2 rows a
# CTA; other shapes, or 2, the two-column linear_m*_k*. The same bits either way. H100, s43,
# SmolLM2's 30 layers in one graph (`bench linear_chain`, down's K 1536 on two columns), us
# at M = 1 / 2 / 4 / 5 / 6 / 8: 317.9 / 371.6 / 494.7 / 536.6 / 623.8 / 706.2 against two
# columns' 321.5 / 413.8 / 557.2 / 597.9 / 722.8 / 874.5 (cuBLAS ~620).
# linear_mma: None (default) leaves the few-row calls' form to each call's ``tensor_cores``;
# True / False forces the tensor-core (linear_mma_k*, cuda_src/layers/linear_mma.cu) / CUDA-core
# few-row kernels on every call (benchmarks, tests). The tensor-core form: mma m16n8k16 with
# the weights as A and each group of 8 rows as the n = 8 columns, so a row's work is nearly
# free up to 8 rows; a row's bits depend on that row alone among its calls (up to
# LINEAR_MMA_MAX_ROWS rows), but are not the CUDA-core or chunked kernels' (the tensor core
# sums in its own order). H100 s46, SmolLM2's 30
# layers in one graph, us at M = 1 / 2 / 4 / 5 / 8: 310 / 304 / 303 / 304 / 328 against the
# CUDA-core kernels' 272-293 / 332 / 439-450 / 482 / 647-663 (cuBLAS ~620); a SmolLM2 k=3 B=1
# round 667 us against 873 (target-only 547 / 571).
TUNING = {"linear_cta_rows": None, "linear_cols_per_warp": None, "linear_mma": None}
_LINEAR_MMA_THREADS = 256     # linear_mma: blockDim (kMmaWarps = 8: warp m stages row m)
_LINEAR_MMA_COLS = 16         # ... output columns a CTA (silu_mul: 8 gates and their 8 ups)
_LINEAR_MMA_ROWS = 8          # ... rows a CTA (gridDim.y: the row groups)


def _linear_small(M, K, vec, norm_weight_16bit):
    """(rows a CTA, units a lane, columns a warp) of the linear_m*_k* / linear_w4_m*_k4_*
    kernels for M rows of width K (units a lane 4: K <= 1024, 8: K <= 2048), or None
    (linear_*): at most LINEAR_FAST_MAX_ROWS rows, every access 16 bytes; 4 rows a CTA at
    K > 1024 only with a 16-bit norm weight (the float32 one's form spills), else 2;
    4 columns a warp where TUNING asks and the shape has them, else 2."""
    if not vec or M > LINEAR_FAST_MAX_ROWS or K > LINEAR_FAST_MAX_K:
        return None
    mr = TUNING["linear_cta_rows"] or 1
    k = 4 if K <= 1024 else 8
    if k == 8 and mr == 4 and not norm_weight_16bit:
        mr = 2
    wide = (TUNING["linear_cols_per_warp"] or 4) == 4 and (mr, k) in _kernels.LINEAR_WIDE_SHAPES
    return mr, k, 4 if wide else 2


def _linear_mma(M, K, vec, tensor_cores):
    """Units a lane (4: K <= 1024, 8: K <= 2048) of the linear_mma_k* kernel for M rows of
    width K, or None: only where the call's tensor_cores asks (TUNING["linear_mma"], unless
    None, overrides it), at most LINEAR_MMA_MAX_ROWS rows (in groups of 8, the n of the mma)
    and every access 16 bytes (K % 8 == 0; a K past a multiple of 32
    is zero-padded in the kernel). f16 and bf16 on every code family (compute_75's bf16
    multiplies the same fragments on the CUDA cores)."""
    on = tensor_cores if TUNING["linear_mma"] is None else TUNING["linear_mma"]
    if not on or not vec or M > LINEAR_MMA_MAX_ROWS or K > LINEAR_FAST_MAX_K:
        return None
    return next(u for u in _kernels.LINEAR_MMA_UNITS if K <= 256 * u)


def linear(x: ArrayLike, weight: ArrayLike, out: ArrayLike, *,
           norm_weight: Optional[ArrayLike] = None, eps: float = 1e-6,
           residual: Optional[ArrayLike] = None, residual_out: Optional[ArrayLike] = None,
           epilogue: Optional[str] = None, unit_offset: bool = False,
           tensor_cores: bool = False, stream: Stream = None) -> ArrayLike:
    """out = h @ weight.T for a few rows (decode / verify, M <= 16 is the fast case), with
    rms_norm fused in front and silu_mul behind when asked; a row's bits depend only on that
    row (and the weights, N, K): never on M, the other rows, or the pointers' alignment.
    ``LlamaTarget`` decodes through it at <= 8 rows (and always with ``row_invariant=True``),
    norms and silu_mul fused. At most 8 16-byte-aligned rows of K <= 2048 take the few-row
    kernels (everything in registers, a CTA row per row, four output columns a warp at
    K <= 1024): in a chain of SmolLM2's layers 272 / 439 / 657 us at M = 1 / 4 / 8, cuBLAS ~620
    (H100, docs/PERF.md s46); other calls take the chunked kernel (the same bits), which serves
    row invariance, not speed (2-18x cuBLAS at M=16-128).

    ``tensor_cores=True`` sends calls of at most LINEAR_MMA_MAX_ROWS = 256 such rows to
    tensor-core kernels instead (``linear_mma_k*``: mma with the weights as A, each group of 8
    rows as its 8 columns): 310 / 303 / 328 us at M = 1 / 4 / 8 there, nearly flat in M. A
    row's bits then depend on that row alone among calls of at most 256 rows, but differ from
    the CUDA-core and chunked kernels' (same float32 accuracy): for a caller whose passes never
    mix the two forms (``LlamaTarget``'s few-row decode, whose bigger passes take cuBLAS), not
    for one that needs every M to agree.

    x [M, K] float16/bfloat16, last dimension contiguous (row stride free); weight [N, K]
    x's dtype, contiguous (nn.Linear layout); out [M, N] x's dtype (row stride free).
    float32 accumulation in a fixed order over K, one rounding to the output.

    ``norm_weight`` [K] (x's dtype or float32, contiguous): h = the rms_norm of s, bit for
    bit what ``rms_norm(s, norm_weight, h, eps=eps, unit_offset=unit_offset)`` stores, with
    s = x, or s = round(x + residual) when ``residual`` [M, K] is given; ``residual_out``
    [M, K] is then required and receives s (it must not overlap x or residual: other CTAs
    are still reading them). Without norm_weight, residual is not allowed.

    ``epilogue='silu_mul'``: weight holds [gate rows; up rows] (N = 2I) and out [M, I] =
    silu(g) * u from the float32 accumulators (silu as ``silu_mul``: accurate exp).

    out must overlap none of the inputs. M = 0 is a no-op. Returns out.

    Example (a Llama MLP on the residual stream x, ping-ponged with x2)::

        linear(attn_out, gate_up_w, act, norm_weight=ln2_w, residual=x, residual_out=x2,
               epilogue="silu_mul", eps=1e-5)
        linear(act, down_w, d)
    """
    xa, wa, o, nw, r, ro, M, K, N, width, eps = contract.linear(
        x, weight, out, norm_weight=norm_weight, eps=eps, residual=residual,
        residual_out=residual_out, epilogue=epilogue, unit_offset=unit_offset,
        tensor_cores=tensor_cores)
    dev = xa.device
    dt = xa.dtype
    norm, fused = norm_weight is not None, residual is not None
    stream_h = as_stream(stream)
    if M == 0 or width == 0:
        return out
    silu = epilogue == "silu_mul"
    vec_x = K % 8 == 0 and (xa.ptr | _row_bytes(xa) | nw.ptr | r.ptr | ro.ptr
                            | (_row_bytes(r) | _row_bytes(ro) if fused else 0)) % 16 == 0
    vec_w = K % 8 == 0 and wa.ptr % 16 == 0
    wdt = _SHORT[nw.dtype if norm else dt]
    k, gx, gy, block = _linear_plan(M, K, N, width, silu, vec_x and vec_w, _SHORT[dt], wdt, dev,
                                    tensor_cores)
    from .. import _layers
    _layers.launch_linear(k, gx, gy, block, stream_h, xa.ptr, r.ptr, ro.ptr, nw.ptr,
                          wa.ptr, o.ptr, xa.strides[0], r.strides[0] if fused else 0,
                          ro.strides[0] if fused else 0, o.strides[0], M, K, N,
                          _norm_threads(K, xa.itemsize), bool(unit_offset), silu, vec_x, vec_w,
                          eps)
    return out


def _linear_plan(M, K, N, width, silu, vec, t, wdt, dev, tensor_cores=False):
    """(kernel, gridDim.x, gridDim.y, blockDim) of a linear call: M rows of width K, N weight
    rows (width output columns), x's dtype t and the norm weight's wdt as kernel suffixes,
    vec: every access 16 bytes, tensor_cores: the call's."""
    mma = _linear_mma(M, K, vec, tensor_cores)
    if mma is not None:             # a CTA per 16 weight rows (silu_mul: 8 gates + their ups)
        k = runtime.kernel("linear_mma", _kernels.linear_mma_kernel(mma, t, wdt), dev)
        cols = _LINEAR_MMA_COLS // 2 if silu else _LINEAR_MMA_COLS
        return k, -(-width // cols), -(-M // _LINEAR_MMA_ROWS), _LINEAR_MMA_THREADS
    small = _linear_small(M, K, vec, wdt == t)
    cols = 2 if small is None else small[2]
    # a warp per column pair (silu_mul: a gate column and its up), or per four columns (two
    # gates and their ups)
    groups = -(-width // (cols // 2)) if silu else -(-N // cols)
    gx = -(-groups // (_LINEAR_THREADS // 32))
    gy = min(-(-M // _LINEAR_ROWS), _GRID_Y_MAX)
    if small is not None:                       # the same bits: weights and x in registers
        mr, ku, _ = small
        wide = "w4_" if cols == 4 else ""
        k = runtime.kernel("linear", f"linear_{wide}m{mr}_k{ku}_{t}_w{wdt}", dev)
        gy = -(-M // mr)
    else:
        k = runtime.kernel("linear", f"linear_{t}_w{wdt}", dev)
        if k not in _LINEAR_CARVEOUT:           # 44 KB of static smem: 3 CTAs per SM want it
            k.prefer_max_shared()
            _LINEAR_CARVEOUT.add(k)
    return k, gx, gy, _LINEAR_THREADS
