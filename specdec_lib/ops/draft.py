"""draft_carry, capture_hidden, draft_combine, draft_map_tokens, ngram_propose on the GPU
(kernels: cuda_src/draft/draft.cu, cuda_src/draft/ngram.cuh).

What the drafter needs from the target each round; semantics and argument order in
``specdec_lib.reference.draft``. Indices read from device memory (cu_q, accept_len,
token ids, draft ids) are never trusted: a bad one gives a zero row or -1, not a fault.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .. import runtime
from .._validate import as_stream
from ..contract import draft as contract
from ..contract import index_values
from ._types import ArrayLike, Stream

__all__ = ["draft_carry", "capture_hidden", "draft_combine", "draft_map_tokens",
           "ngram_propose"]


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_THREADS = 256
_UNROLL = 4                   # vector units per thread in the kernels (kUnroll / kCache)
_COMBINE_MAX_THREADS = 512
_NGRAM_THREADS = 256          # ngram.cuh kThreads: the kernel's reduction assumes exactly this
_INT32_MAX = 2**31 - 1


def _row_bytes(a):
    """Byte stride between rows of a 2-D argument; 0 when there is at most one row (its
    stride is then meaningless and must not limit the vector width)."""
    return a.strides[0] * a.itemsize if a.shape[0] > 1 else 0


def _threads_for(units, cap=_THREADS):
    """~_UNROLL units per thread, a multiple of 32, at most cap."""
    return int(min(cap, max(32, -(-units // (_UNROLL * 32)) * 32)))


def draft_carry(hidden: ArrayLike, cu_q: ArrayLike, accept_len: ArrayLike, out: ArrayLike, *,
                row_begin: int = 0, col_begin: int = 0, stream: Stream = None) -> ArrayLike:
    """out[b] = hidden row ``cu_q[b] + accept_len[b] - 1`` (the last committed block row),
    owner-or-zero for tensor/sequence-parallel shards.

    hidden [T_local, H_local] any dtype (moved bit for bit), cu_q [B+1] int32 (global
    block offsets), accept_len [B] int32, out [B, H_out] same dtype as hidden; last
    dimensions contiguous. ``row_begin``: global row of hidden's row 0; ``col_begin``:
    out column where hidden's columns go. Every element of out is written: the gathered
    value where this shard owns the row and column, zero elsewhere (so the shards'
    outputs sum to the full carry); rows with accept_len <= 0 are zero. Returns out.
    """
    h, cq, al, o, row_begin, col_begin = contract.draft_carry(
        hidden, cu_q, accept_len, out, row_begin=row_begin, col_begin=col_begin)
    dev = h.device
    B = al.shape[0]
    T, H = h.shape
    H_out = o.shape[1]
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


def capture_hidden(hidden: ArrayLike, out: ArrayLike, tap: int, *,
                   residual: Optional[ArrayLike] = None, stream: Stream = None) -> ArrayLike:
    """out[:, tap*H:(tap+1)*H] = hidden (+ residual): one EAGLE3 auxiliary tap.

    hidden [T, H] float32/float16/bfloat16, residual [T, H] or None (added first, in
    float32, rounded once), out [T, taps*H]; one dtype for all, last dimensions
    contiguous; 0 <= tap < taps. Returns out.
    """
    h, o, r, tap = contract.capture_hidden(hidden, out, tap, residual=residual)
    dev = h.device
    T, H = h.shape
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


def draft_combine(embed: ArrayLike, hidden: ArrayLike, embed_norm_weight: ArrayLike,
                  hidden_norm_weight: ArrayLike, out: ArrayLike, *,
                  token_ids: Optional[ArrayLike] = None, eps: float = 1e-6,
                  unit_offset: bool = False, stream: Stream = None) -> ArrayLike:
    """out = RMSNorm(embed) * w_e ++ RMSNorm(hidden) * w_h -> [rows, 2H] (the input of
    MTP's fc / eh_proj and of EAGLE3's midlayer).

    embed [rows, H] (or the embedding table [V, H] when token_ids [rows] int32/int64 is
    given: a fused lookup; an id outside 0..V-1 gives a zero embedding half), hidden
    [rows, H], out [rows, 2H]: one dtype, float32/float16/bfloat16, last dimensions
    contiguous. Weights [H] contiguous, in that dtype or float32. ``unit_offset``: scale
    by (1 + w) (Qwen3-Next/3.5 zero-centred norms) instead of w. Sum of squares in
    float32, one rounding on output. Returns out.
    """
    em, hd, we, wh, o, ids, eps = contract.draft_combine(
        embed, hidden, embed_norm_weight, hidden_norm_weight, out, token_ids=token_ids, eps=eps,
        unit_offset=unit_offset)
    dev = hd.device
    rows, H = hd.shape
    dt = hd.dtype
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
                                vectorize, eps)
    return out


def draft_map_tokens(draft_ids: ArrayLike, d2t: ArrayLike, out: ArrayLike, *,
                     offsets: bool = True, stream: Stream = None) -> ArrayLike:
    """EAGLE3 draft-vocabulary ids -> target ids.

    draft_ids [N] int32/int64, d2t [Vd] int32/int64 (offsets, the HF EAGLE3 convention:
    target = id + d2t[id]; or absolute target ids with ``offsets=False``), out [N] int32;
    all contiguous. Ids outside 0..Vd-1 map to -1. Returns out.
    """
    di, m, o = contract.draft_map_tokens(draft_ids, d2t, out)
    dev = di.device
    N = di.shape[0]
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


def ngram_propose(prompt: ArrayLike, prompt_lens: ArrayLike, output: ArrayLike,
                  output_lens: ArrayLike, draft_tokens: ArrayLike, num_draft: ArrayLike, *,
                  min_n: int = 1, max_n: int = 3, check_indices: bool = True,
                  stream: Stream = None) -> Tuple[ArrayLike, ArrayLike]:
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
    pr, pl, ou, ol, dt, nd, min_n, max_n = contract.ngram_propose(
        prompt, prompt_lens, output, output_lens, draft_tokens, num_draft, min_n=min_n,
        max_n=max_n)
    dev = pr.device
    B, P = pr.shape
    O, K = ou.shape[1], dt.shape[1]
    stream_h = as_stream(stream)
    if B == 0:
        return draft_tokens, num_draft
    if check_indices:
        # the lengths' values only now, past B == 0 (which needs no driver): copied to the host
        # on the op's stream, skipped while it captures a graph
        values = index_values(stream_h)
        pv = values(pl)
        if pv is not None:      # None while the stream captures
            contract.ngram_lengths(pv, values(ol), P, O)
    vec_prompt = (pr.ptr | _row_bytes(pr)) % 16 == 0
    vec_output = (ou.ptr | _row_bytes(ou)) % 16 == 0
    grid = int(min(B, 65535))
    k = runtime.kernel("draft", "ngram_propose", dev)
    from .. import _draft
    _draft.launch_ngram_propose(k, grid, _NGRAM_THREADS, stream_h, pr.ptr, pl.ptr, ou.ptr,
                                ol.ptr, dt.ptr, nd.ptr, pr.strides[0], ou.strides[0],
                                dt.strides[0], B, P, O, K, min_n, max_n, vec_prompt, vec_output)
    return draft_tokens, num_draft
