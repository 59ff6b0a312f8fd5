"""conv1d_verify / conv1d_commit on the GPU (kernels: cuda_src/conv/conv.cu).

Depthwise causal conv1d (width W = 2..8, optional bias, SiLU) over a speculative
block with a per-sequence conv state; verify writes outputs only, commit shifts the
accepted rows into the state. Semantics: ``specdec_lib.reference.conv``.
"""
from __future__ import annotations

from .. import runtime
from .._validate import DeviceArg, as_stream
from ..reference.conv import ACTIVATIONS
from .gdn import _batch_args, _check_batch_on_host

_FLOATS = ("float32", "float16", "bfloat16")
_DT_CODE = {"float32": 0, "float16": 1, "bfloat16": 2}
_THREADS = 256

__all__ = ["conv1d_verify", "conv1d_commit"]


def _state_arg(conv_state):
    cs = DeviceArg("conv_state", conv_state, dtype=_FLOATS, ndim=3)
    slots, dim, wm1 = cs.shape
    if not 2 <= wm1 + 1 <= 8:
        raise ValueError(f"conv_state: width W = {wm1 + 1} (from shape {list(cs.shape)}) not "
                         f"supported: 2..8")
    if wm1 > 1 and cs.strides[2] != 1:
        raise ValueError(f"conv_state: the last (W-1) dimension must be contiguous "
                         f"(strides {cs.strides})")
    # the launch parameters are int32, and so is the channel index c = block * 256 + thread
    if slots >= 2**31 or dim >= 2**31 - 256:
        raise ValueError(f"conv_state: sizes of 2^31 or more are not supported "
                         f"(shape {list(cs.shape)})")
    return cs, slots, dim, wm1 + 1


def _block_rows(name, arr, dim, dev):
    """A block's rows [T, dim] (x, or the journal), any float dtype; returns (arg, T)."""
    a = DeviceArg(name, arr, dtype=_FLOATS, ndim=2, device=dev)
    T = a.shape[0]
    if T >= 2**31:
        raise ValueError(f"{name}: {T} rows; at most 2^31-1 per call")
    if a.shape[1] != dim:
        raise ValueError(f"{name}: expected [T, dim={dim}] (dim from conv_state), got {list(a.shape)}")
    return a, T


def _rows(name, a):
    if a.shape[-1] > 1 and a.strides[-1] != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (strides {a.strides})")
    return a.strides[0]


def conv1d_verify(x, weight, conv_state, slot_ids, cu_q, out, *, bias=None, activation="silu",
                  journal=None, status=None, check_indices=True, stream=None):
    """out[t] = act(bias + sum_w weight[:, w] * window_t[w]) for every block row; the
    conv state is only read.

    x: [T, dim]; weight: [dim, W] (or torch's [dim, 1, W]); conv_state: pool
    [slots, dim, W-1] (the last W-1 inputs, oldest first); slot_ids [B] int32 (< 0:
    padding row, outputs zero); cu_q [B+1] int32; out [T, dim]; bias [dim] or None;
    activation "silu" or None; journal: optional [T, dim] that receives a copy of x
    (pass it, or x itself, to conv1d_commit). Any float dtypes (float32/float16/
    bfloat16), each array its own; last dimensions contiguous. ``check_indices``: as in
    gdn_verify.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    cs, slots, dim, W = _state_arg(conv_state)
    dev = cs.device
    xa, T = _block_rows("x", x, dim, dev)
    wa = DeviceArg("weight", weight, dtype=_FLOATS, device=dev)
    if wa.shape not in ((dim, W), (dim, 1, W)):
        raise ValueError(f"weight: expected [dim, W] = [{dim}, {W}] (or [{dim}, 1, {W}]), "
                         f"got {list(wa.shape)}")
    if W > 1 and wa.strides[-1] != 1:
        raise ValueError(f"weight: the width dimension must be contiguous (strides {wa.strides})")
    ba = DeviceArg("bias", bias, dtype=_FLOATS, shape=(dim,), device=dev, contiguous=True,
                   optional=True)
    oa = DeviceArg("out", out, dtype=_FLOATS, shape=(T, dim), device=dev)
    ja = DeviceArg("journal", journal, dtype=_FLOATS, shape=(T, dim), device=dev, optional=True)
    B, sl, cq, _, sa = _batch_args(dev, slot_ids, cu_q, status)
    x_st, o_st = _rows("x", xa), _rows("out", oa)
    j_st = _rows("journal", ja) if journal is not None else 0
    if B >= 65536:
        raise ValueError(f"slot_ids: batch {B} too large (at most 65535 sequences per call)")
    stream_h = as_stream(stream)
    _check_batch_on_host(check_indices, stream_h, sl, cq, T, slots)
    if B == 0 or ((T == 0 or dim == 0) and status is None):
        return out   # (with a status the kernel still runs: every status[b] gets written)
    kern = runtime.kernel("conv", "conv1d_verify", dev)
    from .. import _conv
    _conv.launch_conv1d_verify(
        kern, max(1, (dim + _THREADS - 1) // _THREADS), B, _THREADS, stream_h, xa.ptr, wa.ptr, ba.ptr,
        cs.ptr, sl.ptr, cq.ptr, oa.ptr, ja.ptr, sa.ptr, x_st, o_st, j_st, wa.strides[0],
        cs.strides[0], cs.strides[1], T, B, dim, W, slots, activation == "silu",
        [_DT_CODE[xa.dtype], _DT_CODE[wa.dtype], _DT_CODE.get(ba.dtype, 0), _DT_CODE[cs.dtype],
         _DT_CODE[oa.dtype], _DT_CODE.get(ja.dtype, 0)])
    return out


def conv1d_commit(conv_state, slot_ids, cu_q, accept_len, journal, *, status=None,
                  check_indices=True, stream=None):
    """Shift block rows 0..accept_len[b]-1 of ``journal`` [T, dim] (x itself, or the
    copy conv1d_verify wrote) into each sequence's conv state, in place; rows enter the
    state rounded to its dtype. accept_len [B] int32 in 0..q_b (0: untouched)."""
    cs, slots, dim, W = _state_arg(conv_state)
    dev = cs.device
    ja, T = _block_rows("journal", journal, dim, dev)
    j_st = _rows("journal", ja)
    B, sl, cq, al, sa = _batch_args(dev, slot_ids, cu_q, status, accept_len, commit=True)
    if B >= 65536:
        raise ValueError(f"slot_ids: batch {B} too large (at most 65535 sequences per call)")
    stream_h = as_stream(stream)
    _check_batch_on_host(check_indices, stream_h, sl, cq, T, slots, al)
    if B == 0 or ((T == 0 or dim == 0) and status is None):
        return conv_state
    kern = runtime.kernel("conv", "conv1d_commit", dev)
    from .. import _conv
    _conv.launch_conv1d_commit(kern, max(1, (dim + _THREADS - 1) // _THREADS), B, _THREADS, stream_h,
                               cs.ptr, sl.ptr, cq.ptr, al.ptr, ja.ptr, sa.ptr, j_st,
                               cs.strides[0], cs.strides[1], T, B, dim, W, slots,
                               _DT_CODE[ja.dtype], _DT_CODE[cs.dtype])
    return conv_state
