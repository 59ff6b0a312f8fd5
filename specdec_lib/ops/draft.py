"""draft_carry, capture_hidden, draft_combine, draft_map_tokens, ngram_propose on the GPU
(kernels: cuda_src/draft/draft.cu, cuda_src/draft/ngram.cuh).

What the drafter needs from the target each round; semantics and argument order in
``specdec_lib.reference.draft``. Indices read from device memory (cu_q, accept_len,
token ids, draft ids) are never trusted: a bad one gives a zero row or -1, not a fault.
"""
from __future__ import annotations

import math
import numbers

from .. import runtime
from .._validate import DeviceArg, as_stream, check_int, to_host
from ..reference.draft import check_ngram_args, check_ngram_lengths

__all__ = ["draft_carry", "capture_hidden", "draft_combine", "draft_map_tokens",
           "ngram_propose"]

_FLOATS = ("float32", "float16", "bfloat16")
_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_THREADS = 256
_UNROLL = 4                   # vector units per thread in the kernels (kUnroll / kCache)
_COMBINE_MAX_THREADS = 512
_NGRAM_THREADS = 256          # ngram.cuh kThreads: the kernel's reduction assumes exactly this
_INT32_MAX = 2**31 - 1


def _last_contiguous(a):
    if len(a.shape) and a.shape[-1] > 1 and a.strides[-1] != 1:
        raise ValueError(f"{a.name}: the last dimension must be contiguous (strides {a.strides})")


def _row_bytes(a):
    """Byte stride between rows of a 2-D argument; 0 when there is at most one row (its
    stride is then meaningless and must not limit the vector width)."""
    return a.strides[0] * a.itemsize if a.shape[0] > 1 else 0


def _threads_for(units, cap=_THREADS):
    """~_UNROLL units per thread, a multiple of 32, at most cap."""
    return int(min(cap, max(32, -(-units // (_UNROLL * 32)) * 32)))


def draft_carry(hidden, cu_q, accept_len, out, *, row_begin=0, col_begin=0, stream=None):
    """out[b] = hidden row ``cu_q[b] + accept_len[b] - 1`` (the last committed block row),
    owner-or-zero for tensor/sequence-parallel shards.

    hidden [T_local, H_local] any dtype (moved bit for bit), cu_q [B+1] int32 (global
    block offsets), accept_len [B] int32, out [B, H_out] same dtype as hidden; last
    dimensions contiguous. ``row_begin``: global row of hidden's row 0; ``col_begin``:
    out column where hidden's columns go. Every element of out is written: the gathered
    value where this shard owns the row and column, zero elsewhere (so the shards'
    outputs sum to the full carry); rows with accept_len <= 0 are zero. Returns out.
    """
    h = DeviceArg("hidden", hidden, ndim=2)
    dev = h.device
    o = DeviceArg("out", out, ndim=2, device=dev)
    if o.dtype != h.dtype:
        raise TypeError(f"out: dtype {o.dtype} differs from hidden's {h.dtype}")
    al = DeviceArg("accept_len", accept_len, dtype="int32", ndim=1, device=dev, contiguous=True)
    B = al.shape[0]
    cq = DeviceArg("cu_q", cu_q, dtype="int32", shape=(B + 1,), device=dev, contiguous=True)
    if o.shape[0] != B:
        raise ValueError(f"out: expected shape [{B}, *] (batch from accept_len), got "
                         f"{list(o.shape)}")
    T, H = h.shape
    H_out = o.shape[1]
    row_begin = check_int("row_begin", row_begin, 0)
    col_begin = check_int("col_begin", col_begin, 0)
    if col_begin + H > H_out:
        raise ValueError(f"col_begin: columns {col_begin}..{col_begin + H} of hidden do not fit "
                         f"out's {H_out} columns")
    _last_contiguous(h)
    _last_contiguous(o)
    if B > _INT32_MAX:
        raise ValueError(f"accept_len: batch {B} exceeds the int32 range")
    stream_h = as_stream(stream)
    if B == 0 or H_out == 0:
        return out
    E = h.itemsize
    # the widest unit (16..1 bytes) dividing every address, stride and width it touches
    bits = h.ptr | o.ptr | _row_bytes(h) | _row_bytes(o) | col_begin * E | H * E | H_out * E
    unit = 16
    while bits % unit:
        unit >>= 1
    out_units = H_out * E // unit
    threads = _threads_for(out_units)
    gx = -(-out_units // (_UNROLL * threads))
    if gx > _INT32_MAX:
        raise ValueError(f"out: rows of {H_out} elements are too wide")
    k = runtime.kernel("draft", f"draft_carry_v{unit}", dev)
    from .. import _draft
    _draft.launch_draft_carry(k, gx, min(B, 65535), threads, stream_h, h.ptr, cq.ptr, al.ptr,
                              o.ptr, h.strides[0] * E, o.strides[0] * E, row_begin, T,
                              col_begin * E // unit, H * E // unit, out_units, B)
    return out


def capture_hidden(hidden, out, tap, *, residual=None, stream=None):
    """out[:, tap*H:(tap+1)*H] = hidden (+ residual): one EAGLE3 auxiliary tap.

    hidden [T, H] float32/float16/bfloat16, residual [T, H] or None (added first, in
    float32, rounded once), out [T, taps*H]; one dtype for all, last dimensions
    contiguous; 0 <= tap < taps. Returns out.
    """
    h = DeviceArg("hidden", hidden, dtype=_FLOATS, ndim=2)
    dev = h.device
    T, H = h.shape
    o = DeviceArg("out", out, dtype=h.dtype, ndim=2, device=dev)
    if o.shape[0] != T:
        raise ValueError(f"out: {o.shape[0]} rows != hidden's {T}")
    if H == 0 or o.shape[1] % H:
        raise ValueError(f"out: {o.shape[1]} columns is not a multiple of H={H}")
    taps = o.shape[1] // H
    tap = check_int("tap", tap, 0, taps - 1)
    r = DeviceArg("residual", residual, dtype=h.dtype, shape=(T, H), device=dev, optional=True)
    for a in (h, o, r):
        if a.obj is not None:
            _last_contiguous(a)
    if H >= 2**30:   # the kernel's column index (block * unroll * threads + thread) is int32
        raise ValueError(f"hidden: width {H} is too wide (at most 2^30 - 1)")
    stream_h = as_stream(stream)
    if T == 0:
        return out
    E = h.itemsize
    dst = o.ptr + tap * H * E
    bits = h.ptr | dst | _row_bytes(h) | _row_bytes(o) | H * E
    if residual is not None:
        bits |= r.ptr | _row_bytes(r)
    vectorize = bits % 16 == 0
    units = H // (16 // E) if vectorize else H
    threads = _threads_for(units)
    gy = -(-units // (_UNROLL * threads))
    k = runtime.kernel("draft", f"capture_hidden_{_SHORT[h.dtype]}", dev)
    from .. import _draft
    _draft.launch_capture_hidden(k, min(T, _INT32_MAX), gy, threads, stream_h, h.ptr, r.ptr, dst,
                                 h.strides[0], r.strides[0] if residual is not None else 0,
                                 o.strides[0], T, H, vectorize)
    return out


def draft_combine(embed, hidden, embed_norm_weight, hidden_norm_weight, out, *, token_ids=None,
                  eps=1e-6, unit_offset=False, stream=None):
    """out = RMSNorm(embed) * w_e ++ RMSNorm(hidden) * w_h -> [rows, 2H] (the input of
    MTP's fc / eh_proj and of EAGLE3's midlayer).

    embed [rows, H] (or the embedding table [V, H] when token_ids [rows] int32/int64 is
    given: a fused lookup; an id outside 0..V-1 gives a zero embedding half), hidden
    [rows, H], out [rows, 2H]: one dtype, float32/float16/bfloat16, last dimensions
    contiguous. Weights [H] contiguous, in that dtype or float32. ``unit_offset``: scale
    by (1 + w) (Qwen3-Next/3.5 zero-centred norms) instead of w. Sum of squares in
    float32, one rounding on output. Returns out.
    """
    hd = DeviceArg("hidden", hidden, dtype=_FLOATS, ndim=2)
    dev = hd.device
    rows, H = hd.shape
    dt = hd.dtype
    em = DeviceArg("embed", embed, dtype=dt, ndim=2, device=dev)
    if em.shape[1] != H:
        raise ValueError(f"embed: width {em.shape[1]} != hidden width {H}")
    o = DeviceArg("out", out, dtype=dt, shape=(rows, 2 * H), device=dev)
    wdt = (dt, "float32") if dt != "float32" else "float32"
    we = DeviceArg("embed_norm_weight", embed_norm_weight, dtype=wdt, shape=(H,), device=dev,
                   contiguous=True)
    wh = DeviceArg("hidden_norm_weight", hidden_norm_weight, dtype=we.dtype, shape=(H,),
                   device=dev, contiguous=True)
    ids = DeviceArg("token_ids", token_ids, dtype=("int32", "int64"), shape=(rows,), device=dev,
                    contiguous=True, optional=True)
    if token_ids is None and em.shape[0] != rows:
        raise ValueError(f"embed: {em.shape[0]} rows != hidden's {rows} (pass token_ids to "
                         f"gather from an embedding table)")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) \
            or eps < 0:
        raise ValueError(f"eps: expected a finite float >= 0, got {eps!r}")
    for a in (em, hd, o):
        _last_contiguous(a)
    if H > _INT32_MAX // 2 or rows > _INT32_MAX:
        raise ValueError(f"hidden: shape {list(hd.shape)} exceeds the int32 range")
    stream_h = as_stream(stream)
    if rows == 0 or H == 0:
        return out
    E = hd.itemsize
    bits = (em.ptr | hd.ptr | o.ptr | we.ptr | wh.ptr | H * E | _row_bytes(hd) | _row_bytes(o)
            | (em.strides[0] * E if em.shape[0] > 1 else 0))
    vectorize = bits % 16 == 0
    # the kernel walks a row in 16-byte units either way (vectorize picks the access)
    threads = _threads_for(-(-H // (16 // E)), _COMBINE_MAX_THREADS)
    k = runtime.kernel("draft", f"draft_combine_{_SHORT[dt]}_w{_SHORT[we.dtype]}", dev)
    from .. import _draft
    _draft.launch_draft_combine(k, rows, threads, stream_h, em.ptr, hd.ptr, we.ptr, wh.ptr,
                                ids.ptr, o.ptr, em.strides[0], hd.strides[0], o.strides[0], rows,
                                em.shape[0], H, ids.dtype == "int64", bool(unit_offset),
                                vectorize, float(eps))
    return out


def draft_map_tokens(draft_ids, d2t, out, *, offsets=True, stream=None):
    """EAGLE3 draft-vocabulary ids -> target ids.

    draft_ids [N] int32/int64, d2t [Vd] int32/int64 (offsets, the HF EAGLE3 convention:
    target = id + d2t[id]; or absolute target ids with ``offsets=False``), out [N] int32;
    all contiguous. Ids outside 0..Vd-1 map to -1. Returns out.
    """
    di = DeviceArg("draft_ids", draft_ids, dtype=("int32", "int64"), ndim=1, contiguous=True)
    dev = di.device
    N = di.shape[0]
    m = DeviceArg("d2t", d2t, dtype=("int32", "int64"), ndim=1, device=dev, contiguous=True)
    o = DeviceArg("out", out, dtype="int32", shape=(N,), device=dev, contiguous=True)
    stream_h = as_stream(stream)
    if N == 0:
        return out
    grid = int(min(-(-N // _THREADS), runtime.sm_count(dev) * 8))
    k = runtime.kernel("draft", "draft_map_tokens", dev)
    from .. import _draft
    _draft.launch_draft_map_tokens(k, grid, _THREADS, stream_h, di.ptr, m.ptr, o.ptr, N,
                                   m.shape[0], di.dtype == "int64", m.dtype == "int64",
                                   bool(offsets))
    return out


def _token_rows(name, obj, B, dev, width):
    """An int32 [B, width] token array of ngram_propose (rows strided, last dim contiguous)."""
    a = DeviceArg(name, obj, dtype="int32", ndim=2, device=dev)
    if a.shape[0] != B:
        raise ValueError(f"{name}: expected shape [{B}, {width}] (batch from prompt), got "
                         f"{list(a.shape)}")
    _last_contiguous(a)
    return a


def _lengths(name, obj, B, dev):
    return DeviceArg(name, obj, dtype="int32", shape=(B,), device=dev, contiguous=True)


def ngram_propose(prompt, prompt_lens, output, output_lens, draft_tokens, num_draft, *,
                  min_n=1, max_n=3, check_indices=True, stream=None):
    """Prompt-lookup (n-gram) drafting, weight-free: propose the tokens that followed the
    latest earlier occurrence of the context's last n tokens (longest n first).

    prompt [B, P] int32 with prompt_lens [B] int32 valid tokens per row, output [B, O]
    int32 with output_lens [B] int32 (the context is ``prompt[b, :prompt_lens[b]] ++
    output[b, :output_lens[b]]``; a caller with one token buffer passes output_lens = 0 and
    any [B, >= 1] output) -> draft_tokens [B, K] int32 (1 <= K <= 64; -1 after the
    proposals) and num_draft [B] int32, ready for ``seq_build_block``. ``1 <= min_n <=
    max_n <= 32``. Rows of prompt / output / draft_tokens may be strided (last dimension
    contiguous); the length vectors are contiguous. P + O < 2^31.

    ``check_indices=True`` (default) copies the two length vectors to the host and raises
    ValueError when one lies outside 0..P / 0..O; it is skipped while ``stream`` is being
    captured into a CUDA graph. The kernel itself clamps lengths into range and never
    faults; it reads no host value, so it can run inside a captured graph. Exact and
    deterministic (integer comparisons, an order-free max-reduction). Semantics:
    ``specdec_lib.reference.draft.ngram_propose``. Returns ``(draft_tokens, num_draft)``.

    Example: context ``[5, 1, 2, 7, 8, 1, 2]``, max_n=3, K=3: n=3 ``[8, 1, 2]`` never
    occurred before, n=2 ``[1, 2]`` did at 1 -> draft ``[7, 8, 1]``, num_draft 3.
    """
    pr = DeviceArg("prompt", prompt, dtype="int32", ndim=2)
    _last_contiguous(pr)
    dev = pr.device
    B, P = pr.shape
    pl = _lengths("prompt_lens", prompt_lens, B, dev)
    ou = _token_rows("output", output, B, dev, "O")
    ol = _lengths("output_lens", output_lens, B, dev)
    dt = _token_rows("draft_tokens", draft_tokens, B, dev, "K")
    nd = _lengths("num_draft", num_draft, B, dev)
    O, K = ou.shape[1], dt.shape[1]
    min_n, max_n = check_ngram_args(min_n, max_n, K)
    if P + O > _INT32_MAX:
        raise ValueError(f"prompt/output: P + O = {P + O} tokens exceeds the int32 range")
    if B > _INT32_MAX:
        raise ValueError(f"prompt: batch {B} exceeds the int32 range")
    stream_h = as_stream(stream)
    if B == 0:
        return draft_tokens, num_draft
    if check_indices and not runtime.driver().stream_is_capturing(stream_h):
        check_ngram_lengths(to_host(pl, stream_h), to_host(ol, stream_h), P, O)
    vec_prompt = (pr.ptr | _row_bytes(pr)) % 16 == 0
    vec_output = (ou.ptr | _row_bytes(ou)) % 16 == 0
    grid = int(min(B, 65535))
    k = runtime.kernel("draft", "ngram_propose", dev)
    from .. import _draft
    _draft.launch_ngram_propose(k, grid, _NGRAM_THREADS, stream_h, pr.ptr, pl.ptr, ou.ptr,
                                ol.ptr, dt.ptr, nd.ptr, pr.strides[0], ou.strides[0],
                                dt.strides[0], B, P, O, K, min_n, max_n, vec_prompt, vec_output)
    return draft_tokens, num_draft
