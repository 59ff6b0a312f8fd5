"""seq_stop, seq_advance, seq_build_block on the GPU (kernels: cuda_src/sequence/sequence.cu).

The bookkeeping of a speculative round; semantics, argument order and the FINISH_*
reason codes in ``specdec_lib.reference.sequence``. Every array is int32 (``finished``:
uint8) and C-contiguous, and all live on one device. The kernels read no host value,
so a whole round can be captured in a CUDA graph; values read from device memory are
never trusted (an out-of-range ``num_accepted`` or length flags the row
FINISH_BAD_ROW, an append past the buffer's capacity flags FINISH_CAPACITY).
"""
from __future__ import annotations

from .. import runtime
from .._validate import DeviceArg, as_stream

__all__ = ["seq_stop", "seq_advance", "seq_build_block"]

_ROW_THREADS = 128     # seq_stop / seq_advance: one thread per sequence
_SCAN_THREADS = 256    # seq_build_block: one CTA of exactly this many threads
_INT32_MAX = 2**31 - 1


def _i32(name, obj, shape, dev, optional=False):
    return DeviceArg(name, obj, dtype="int32", shape=shape, device=dev, contiguous=True,
                     optional=optional)


def _out_tokens(out_tokens, B, dev):
    ot = DeviceArg("out_tokens", out_tokens, dtype="int32", ndim=2, device=dev, contiguous=True)
    if ot.shape[0] != B:
        raise ValueError(f"out_tokens: expected shape [{B}, *] (batch from emitted), got "
                         f"{list(ot.shape)}")
    return ot


def _fits_int32(name, *sizes):
    for s in sizes:
        if s > _INT32_MAX:
            raise ValueError(f"{name}: size {s} exceeds the int32 index range")


def seq_stop(emitted, num_accepted, out_tokens, out_lens, stop_ids, stop_seqs,
             max_new_tokens, accept_len, finished, *, stream=None):
    """Apply stop conditions to one round's emitted tokens (in place on the device).

    emitted [B, W] int32 (d1..dn then the correction/bonus token), num_accepted [B],
    out_tokens [B, C] (tokens generated before this round: stop sequences may start
    there), out_lens [B], stop_ids [B, S] or None (-1 = unused), stop_seqs [B, NS, M] or
    None (rows left-padded with -1), max_new_tokens [B] -> accept_len [B] (rows to
    commit, 0..n+1) and finished [B] uint8 (in/out: 0 running, else a FINISH_* reason).
    A row finished on entry commits nothing. Returns ``(accept_len, finished)``.
    """
    em = DeviceArg("emitted", emitted, dtype="int32", ndim=2, contiguous=True)
    dev = em.device
    B, W = em.shape
    na = _i32("num_accepted", num_accepted, (B,), dev)
    ot = _out_tokens(out_tokens, B, dev)
    ol = _i32("out_lens", out_lens, (B,), dev)
    si = DeviceArg("stop_ids", stop_ids, dtype="int32", ndim=2, device=dev, contiguous=True,
                   optional=True)
    ss = DeviceArg("stop_seqs", stop_seqs, dtype="int32", ndim=3, device=dev, contiguous=True,
                   optional=True)
    if stop_ids is not None and si.shape[0] != B:
        raise ValueError(f"stop_ids: expected shape [{B}, S], got {list(si.shape)}")
    if stop_seqs is not None and ss.shape[0] != B:
        raise ValueError(f"stop_seqs: expected shape [{B}, NS, M], got {list(ss.shape)}")
    mn = _i32("max_new_tokens", max_new_tokens, (B,), dev)
    al = _i32("accept_len", accept_len, (B,), dev)
    fin = DeviceArg("finished", finished, dtype="uint8", shape=(B,), device=dev, contiguous=True)
    S = si.shape[1] if stop_ids is not None else 0
    NS, M = (ss.shape[1], ss.shape[2]) if stop_seqs is not None else (0, 0)
    _fits_int32("emitted", B, W)
    _fits_int32("out_tokens", ot.shape[1])
    _fits_int32("stop_seqs", S, NS, M)
    stream_h = as_stream(stream)
    if B == 0:
        return accept_len, finished
    k = runtime.kernel("sequence", "seq_stop", dev)
    from .. import _sequence
    _sequence.launch_seq_stop(k, -(-B // _ROW_THREADS), _ROW_THREADS, stream_h, em.ptr, na.ptr,
                              ot.ptr, ol.ptr, si.ptr, ss.ptr, mn.ptr, al.ptr, fin.ptr, B, W,
                              ot.shape[1], S, NS, M)
    return accept_len, finished


def seq_advance(emitted, accept_len, seq_lens, out_tokens, out_lens, last_token, finished, *,
                stream=None):
    """Commit the kept tokens (in place on the device).

    emitted [B, W] int32, accept_len [B] (from seq_stop) -> seq_lens [B] (L +=
    accept_len), out_tokens [B, C] (emitted[b, :accept_len] appended at out_lens[b]),
    out_lens [B], last_token [B] (the last kept token: the next block's first row),
    finished [B] uint8 (FINISH_CAPACITY when the append overflows C). accept_len is
    clamped to W. Returns ``(seq_lens, out_tokens, out_lens, last_token, finished)``.
    """
    em = DeviceArg("emitted", emitted, dtype="int32", ndim=2, contiguous=True)
    dev = em.device
    B, W = em.shape
    al = _i32("accept_len", accept_len, (B,), dev)
    sl = _i32("seq_lens", seq_lens, (B,), dev)
    ot = _out_tokens(out_tokens, B, dev)
    ol = _i32("out_lens", out_lens, (B,), dev)
    lt = _i32("last_token", last_token, (B,), dev)
    fin = DeviceArg("finished", finished, dtype="uint8", shape=(B,), device=dev, contiguous=True)
    _fits_int32("emitted", B, W)
    _fits_int32("out_tokens", ot.shape[1])
    stream_h = as_stream(stream)
    if B == 0:
        return seq_lens, out_tokens, out_lens, last_token, finished
    k = runtime.kernel("sequence", "seq_advance", dev)
    from .. import _sequence
    _sequence.launch_seq_advance(k, -(-B // _ROW_THREADS), _ROW_THREADS, stream_h, em.ptr,
                                 al.ptr, sl.ptr, ot.ptr, ol.ptr, lt.ptr, fin.ptr, B, W,
                                 ot.shape[1])
    return seq_lens, out_tokens, out_lens, last_token, finished


def seq_build_block(last_token, draft_tokens, num_draft, seq_lens, cu_q, block_tokens,
                    positions, draft_ids=None, *, stream=None):
    """The next round's verify block ``[t0, d1..d_kb]`` at positions ``L .. L + k_b``.

    last_token [B] int32, draft_tokens [B, K], num_draft [B] (clamped to 0..K on the
    device), seq_lens [B] -> cu_q [B+1], block_tokens and positions (1-D, at least
    B*(K+1) elements: the worst case, since T is only known on the device), draft_ids
    (1-D, at least B*K elements, or None): the drafts alone, block b's at
    ``cu_q[b] - b`` (spec_sample's layout). Returns ``(cu_q, block_tokens, positions,
    draft_ids)``.
    """
    lt = DeviceArg("last_token", last_token, dtype="int32", ndim=1, contiguous=True)
    dev = lt.device
    B = lt.shape[0]
    dt = DeviceArg("draft_tokens", draft_tokens, dtype="int32", ndim=2, device=dev,
                   contiguous=True)
    if dt.shape[0] != B:
        raise ValueError(f"draft_tokens: expected shape [{B}, K] (batch from last_token), got "
                         f"{list(dt.shape)}")
    K = dt.shape[1]
    nd = _i32("num_draft", num_draft, (B,), dev)
    sl = _i32("seq_lens", seq_lens, (B,), dev)
    cq = _i32("cu_q", cu_q, (B + 1,), dev)
    _fits_int32("draft_tokens", B * (K + 1))
    bt = DeviceArg("block_tokens", block_tokens, dtype="int32", ndim=1, device=dev, contiguous=True)
    ps = DeviceArg("positions", positions, dtype="int32", ndim=1, device=dev, contiguous=True)
    di = DeviceArg("draft_ids", draft_ids, dtype="int32", ndim=1, device=dev, contiguous=True,
                   optional=True)
    for a, need in ((bt, B * (K + 1)), (ps, B * (K + 1)), (di, B * K)):
        if a.obj is not None and a.shape[0] < need:
            raise ValueError(f"{a.name}: needs at least {need} elements (B={B} blocks of up to "
                             f"K+1={K + 1} rows), has {a.shape[0]}")
    stream_h = as_stream(stream)
    k = runtime.kernel("sequence", "seq_build_block", dev)
    from .. import _sequence
    # launched even for B == 0: cu_q[0] = 0 is still written
    _sequence.launch_seq_build_block(k, _SCAN_THREADS, stream_h, lt.ptr, dt.ptr, nd.ptr, sl.ptr,
                                     cq.ptr, bt.ptr, ps.ptr, di.ptr, B, K)
    return cu_q, block_tokens, positions, draft_ids
