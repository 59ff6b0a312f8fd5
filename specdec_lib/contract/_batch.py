"""Pieces the contracts of several families share: the batch arguments of the recurrent-state
ops (gdn, conv: ``slot_ids``, ``cu_q``, ``accept_len``, ``status``) and their value checks,
the float dtypes and the last-dimension rule."""
from __future__ import annotations

import numpy as np

from .._args import DeviceArg

FLOATS = ("float32", "float16", "bfloat16")    # the kernels' activation / state dtypes


def on_cuda(arg, a) -> bool:
    """Whether view ``a`` is launched on by a CUDA kernel: the GPU path, or torch tensors
    on a CUDA device (also fake ones, while torch.compile traces a CUDA graph). The
    kernels' instantiation limits (head dims the reference computes but no kernel was
    built for) apply only then."""
    return arg is DeviceArg or str(a.device).startswith("cuda")


def require_dtype(a, dtype):
    """``a``'s dtype exactly (numpy arrays too, which HostArg checks by kind): for buffers
    whose bits the kernels and the reference both read as that dtype (the gdn journal)."""
    if a.obj is not None and a.dtype != dtype:
        raise TypeError(f"{a.name}: dtype must be {dtype}, got {a.dtype}")


def batch_args(arg, dev, slot_ids, cu_q, status, accept_len=None, *, commit=False):
    """The batch arguments of a verify (or, ``commit=True``, a commit) op of the gdn and
    conv families, checked in this order on device ``dev``: slot_ids [B] int32, cu_q
    [B+1] int32, accept_len [B] int32 (commit only), status [B] int32 or None; all
    contiguous. Returns (B, slot_ids, cu_q, accept_len or None, status) as views."""
    sl = arg("slot_ids", slot_ids, dtype="int32", ndim=1, device=dev, contiguous=True)
    B = sl.shape[0]
    cq = arg("cu_q", cu_q, dtype="int32", shape=(B + 1,), device=dev, contiguous=True)
    al = None
    if commit:
        al = arg("accept_len", accept_len, dtype="int32", shape=(B,), device=dev,
                 contiguous=True)
    sa = arg("status", status, dtype="int32", shape=(B,), device=dev, contiguous=True,
             optional=True)
    return B, sl, cq, al, sa


def batch_values(values, sl, cq, num_rows, num_slots, al=None):
    """With ``values``: ``check_batch`` on slot_ids / cu_q (and ``check_accept_len`` on
    accept_len); nothing where the values cannot be read."""
    if values is None:
        return
    s, c = values(sl), values(cq)
    if s is None or c is None:
        return
    _, cu = check_batch(s, c, num_rows, num_slots)
    if al is not None:
        a = values(al)
        if a is not None:
            check_accept_len(a, cu)


def _check_int(name, a, shape):
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")
    return a.astype(np.int64)


def check_batch(slot_ids, cu_q, num_rows, num_slots):
    """slot_ids [B] (< 0: a padding row; others in range and used once) and cu_q [B+1]
    (starts at 0, never decreases, ends at ``num_rows``): ValueError naming the argument
    otherwise. Returns (slot_ids, cu_q) as int64 numpy arrays."""
    slot_ids = np.asarray(slot_ids)
    if slot_ids.ndim != 1:
        raise ValueError(f"slot_ids: expected shape [B], got {slot_ids.shape}")
    B = slot_ids.shape[0]
    slot_ids = _check_int("slot_ids", slot_ids, (B,))
    cu_q = _check_int("cu_q", cu_q, (B + 1,))
    if cu_q[0] != 0 or np.any(np.diff(cu_q) < 0) or cu_q[-1] != num_rows:
        raise ValueError(f"cu_q: must start at 0, be non-decreasing and end at T={num_rows}; "
                         f"got {cu_q.tolist()[:16]}")
    if np.any(slot_ids >= num_slots):
        raise ValueError(f"slot_ids: id {int(slot_ids.max())} out of range for a pool of "
                         f"{num_slots} slots")
    live = slot_ids[slot_ids >= 0]
    if len(np.unique(live)) != len(live):
        raise ValueError("slot_ids: the same slot is used by two sequences of the batch")
    return slot_ids, cu_q


def check_accept_len(accept_len, cu_q):
    """accept_len [B] in 0..q_b (q_b = cu_q[b+1] - cu_q[b]); returns it as int64."""
    B = len(cu_q) - 1
    acc = _check_int("accept_len", accept_len, (B,))
    q_len = np.diff(np.asarray(cu_q, np.int64))
    bad = np.nonzero((acc < 0) | (acc > q_len))[0]
    if len(bad):
        b = int(bad[0])
        raise ValueError(f"accept_len: sequence {b} accepts {int(acc[b])} rows of a block of "
                         f"{int(q_len[b])} (must be in 0..q)")
    return acc


def last_contiguous(a):
    """The last dimension of view ``a`` contiguous (when it has more than one element);
    returns the strides of the other dimensions."""
    if a.shape and a.shape[-1] > 1 and a.strides[-1] != 1:
        raise ValueError(f"{a.name}: the last dimension must be contiguous (strides {a.strides})")
    return a.strides[:-1]
