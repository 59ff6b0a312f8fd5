"""Pieces the contracts of several families share: the batch arguments of the recurrent-state
ops (gdn, conv: ``slot_ids``, ``cu_q``, ``accept_len``, ``status``, and the fused mode's
pending rows) and their value checks, the float dtypes and the last-dimension rule."""
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


def check_pending(pending_row0, pending_len, pending_rows, batch):
    """A fused verify's / flush's pending rows: int [B] each, rows row0[b] ..
    row0[b]+len[b]-1 inside the pending journal's ``pending_rows`` rows (any row0 where
    len = 0). Returns (row0, len) as int64."""
    r0 = _check_int("pending_row0", pending_row0, (batch,))
    n = _check_int("pending_len", pending_len, (batch,))
    bad = np.nonzero((n < 0) | ((n > 0) & ((r0 < 0) | (r0 + n > pending_rows))))[0]
    if len(bad):
        b = int(bad[0])
        raise ValueError(f"pending_row0 / pending_len: sequence {b} has pending rows "
                         f"{int(r0[b])}..{int(r0[b]) + int(n[b]) - 1}, outside the pending "
                         f"journal's {pending_rows} rows (len must be >= 0)")
    return r0, n


def _host_address(obj):
    """Where a host array's element 0 lives: a numpy array's or a CPU tensor's address;
    None where there is no memory to compare (fake / meta tensors while torch.compile
    traces)."""
    if not hasattr(obj, "stride"):
        return obj.__array_interface__["data"][0]                  # numpy
    if type(obj).__name__ in ("Tensor", "Parameter") and obj.device.type == "cpu":
        return obj.data_ptr()
    return None


def extent(a, host):
    """[first byte, one past the last byte) that view ``a`` spans (``host``: of the host
    array behind it); (base, base) when empty, None when unknown."""
    base = _host_address(a.obj) if host else a.ptr
    if base is None:
        return None
    if not a.shape or 0 in a.shape:
        return base, base
    lo = hi = 0
    for d, st in zip(a.shape, a.strides):
        if st < 0:
            lo += (d - 1) * st
        else:
            hi += (d - 1) * st
    return base + lo * a.itemsize, base + (hi + 1) * a.itemsize


def overlaps(arg, a, b):
    """Whether views a and b share memory: their byte extents meet (the same object where
    the host cannot tell, fake tensors)."""
    if not all(a.shape) or not all(b.shape):
        return False
    host = arg is not DeviceArg
    sa, sb = extent(a, host), extent(b, host)
    if sa is None or sb is None:
        return a.obj is b.obj
    return sa[0] < sb[1] and sb[0] < sa[1]


def pending_args(arg, dev, B, pending_journal, pending_row0, pending_len, *, dtype, width,
                 writes=()):
    """The fused mode's pending rows (gdn_verify / gdn_flush / conv1d_verify / conv1d_flush):
    (journal view, row0, len) on ``dev``. The pending journal [Tp, width] (width None: any)
    of ``dtype`` (a name or a tuple of names), last dimension contiguous, overlapping none of
    ``writes`` (the views the kernel writes while it reads the pending rows); row0 and len
    int32 [B]."""
    pj = arg("pending_journal", pending_journal, dtype=dtype, ndim=2, device=dev)
    if pj.by_kind and isinstance(dtype, str):
        require_dtype(pj, dtype)
    if width is not None and pj.shape[1] != width:
        raise ValueError(f"pending_journal: expected [Tp, {width}] (the journal width of this "
                         f"state), got {list(pj.shape)}")
    last_contiguous(pj)
    for w in writes:
        if w is not None and w.obj is not None and overlaps(arg, pj, w):
            raise ValueError(f"pending_journal: overlaps {w.name} (the kernel reads the previous "
                             f"round's rows while it writes {w.name}: use two buffers)")
    r0 = arg("pending_row0", pending_row0, dtype="int32", shape=(B,), device=dev,
             contiguous=True)
    n = arg("pending_len", pending_len, dtype="int32", shape=(B,), device=dev,
            contiguous=True)
    return pj, r0, n


def no_pending(pending_row0, pending_len):
    """pending_row0 / pending_len only with pending_journal."""
    if pending_row0 is not None or pending_len is not None:
        raise ValueError("pending_row0 / pending_len: given without pending_journal")


def pending_values(values, r0, n, pending_rows):
    """With ``values``: ``check_pending``; nothing where the values cannot be read."""
    if values is None:
        return
    a, b = values(r0), values(n)
    if a is not None and b is not None:
        check_pending(a, b, pending_rows, r0.shape[0])


def flush_args(arg, dev, slots, slot_ids, pending_journal, pending_row0, pending_len, status,
               values, *, dtype, width):
    """A flush's arguments (gdn_flush, conv1d_flush): slot_ids [B] int32 (values: in range,
    used once), the pending rows (``pending_args``; values: ``check_pending``), status [B]
    int32 or None. Returns (slot_ids, pending_journal, row0, len, status) views."""
    sl = arg("slot_ids", slot_ids, dtype="int32", ndim=1, device=dev, contiguous=True)
    B = sl.shape[0]
    pj, pr, pn = pending_args(arg, dev, B, pending_journal, pending_row0, pending_len,
                              dtype=dtype, width=width)
    if pj.shape[0] >= 2**31:
        raise ValueError(f"pending_journal: {pj.shape[0]} rows; at most 2^31-1")
    sa = arg("status", status, dtype="int32", shape=(B,), device=dev, contiguous=True,
             optional=True)
    if values is not None:
        s = values(sl)
        if s is not None:
            check_batch(s, np.zeros(B + 1, np.int64), 0, slots)
    pending_values(values, pr, pn, pj.shape[0])
    return sl, pj, pr, pn, sa
