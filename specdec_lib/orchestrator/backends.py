"""Backends: the arrays a round works on and the ops it calls, on one stream.

A backend is a namespace: ``name``; ``xp`` (numpy-style constructors: numpy, cupy, or
``_TorchArrays``); every op of ``_BACKEND_OPS`` under its name, bound to the backend's stream
(``row_linear`` = ``ops.linear``; on cuda ``linear`` is the host models' float64 GEMM);
``kv_dtype``, ``gdn_journal_width``; ``to_host(a)`` (numpy), ``to_host_async(a)`` (a read
handle: calling it returns a numpy copy of ``a`` as the stream had it when the read was
enqueued, waiting only for that point; a pinned buffer and an event on a GPU, so ``serve``
can launch the next round before reading this one's), on a GPU ``to_device_async(words)``
(int32 words to a new device array without waiting for the stream; ``state.upload``),
``synchronize()`` (the round's stream), ``device_synchronize()``, ``stream_scope()`` (a
context the decoder runs in: cupy's current stream on cuda), ``capture(fn) -> replay`` (a
CUDA graph of ``fn``'s work) and ``timer()`` (``start()`` / ``stop()`` record an event on the
stream, ``seconds()`` the GPU time between them once ``stop``'s has completed); the last two
are None on the reference backend. ``make_backend(name)`` builds one; cupy and torch are imported only
by their backends.
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
from types import SimpleNamespace
from typing import Callable

import numpy as np

Backend = SimpleNamespace       # the namespace described above

_OPS = ("append_kv", "rope_append_kv", "verify_attention", "conv1d_verify", "conv1d_commit",
        "conv1d_flush", "gdn_verify", "gdn_commit", "gdn_flush", "spec_sample", "seq_stop",
        "seq_advance", "seq_build_block", "draft_carry", "capture_hidden", "draft_combine",
        "draft_map_tokens", "ngram_propose", "rms_norm", "rope", "silu_mul", "gated_rms_norm")
# (name on a backend, op) for every op a backend carries: the _OPS under their own names, and
# ``row_linear`` = ops.linear (the row-invariant GEMM), kept off ``linear``, which on the cuda
# backend is the host models' float64 GEMM (and absent elsewhere: tiny_hybrid falls back to
# x @ w.T)
_BACKEND_OPS = tuple(zip(_OPS, _OPS)) + (("row_linear", "linear"),)
_F64_WARPS = 8                # linear_f64: warps (output columns) per CTA (kWarps)
_GRID_Y_MAX = 65535           # linear_f64: CTAs over the rows (a grid-stride loop past them)
_REFERENCE_MODULES = ("copy", "attention", "conv", "gdn", "sampling", "sequence", "draft",
                      "layers")


def immediate_read(to_host: Callable) -> Callable:
    """``to_host_async`` where the copy is made at once (numpy, or a backend without
    asynchronous reads): the handle returns that copy."""
    def read(a):
        host = np.array(to_host(a))
        return lambda: host
    return read


class _PinnedReads:
    """``to_host_async`` of a GPU backend: each array shape and dtype has a ring of
    ``RING`` page-locked host buffers, each with an event; ``read(a)`` enqueues the copy of
    ``a`` into the next one and records its event, the handle waits for that event and
    returns a copy (so a buffer is free again once its handle was called, and ``serve``
    keeps at most three reads of one shape unresolved). ``copy(host, a)`` enqueues the
    device-to-host copy, ``event()`` makes an event with ``record()`` / ``synchronize()``,
    ``pinned(a)`` a page-locked buffer of ``a``'s shape and dtype, ``as_numpy(host)`` its
    numpy view."""
    RING = 4

    def __init__(self, pinned, copy, event, as_numpy):
        self._pinned, self._copy, self._event, self._np = pinned, copy, event, as_numpy
        self._rings: dict = {}

    def __call__(self, a):
        key = (tuple(a.shape), str(a.dtype))
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = itertools.cycle(
                [(self._pinned(a), self._event()) for _ in range(self.RING)])
        host, ev = next(ring)
        self._copy(host, a)
        ev.record()

        def wait():
            ev.synchronize()
            return np.array(self._np(host))
        return wait


class _PinnedWrites:
    """``to_device_async`` of a GPU backend: int32 words (1-D numpy) -> a new device array,
    copied from a page-locked staging buffer without waiting for the stream (torch's copy
    from pageable memory waits for it: an admission then waited for the round run ahead).
    A ring of ``RING`` staging buffers, each with an event recorded after the copy that read
    it: a buffer is refilled only once that event has completed, and replaced by a larger one
    (a power of two of words) when a copy needs more. ``pinned(n)`` a page-locked buffer of n
    int32 words, ``as_numpy(buf)`` its numpy view, ``copy(buf, n)`` a new device array of its
    first n words (enqueued), ``event()`` as ``_PinnedReads``'."""
    RING = 4

    def __init__(self, pinned, as_numpy, copy, event):
        self._pinned, self._np, self._copy, self._event = pinned, as_numpy, copy, event
        self._ring = [[None, None] for _ in range(self.RING)]
        self._next = 0

    def __call__(self, words):
        words = np.ascontiguousarray(words, np.int32).reshape(-1)
        n = words.size
        slot = self._ring[self._next]
        self._next = (self._next + 1) % self.RING
        buf, ev = slot
        if ev is None:
            ev = slot[1] = self._event()
        else:
            ev.synchronize()                # the copy that last read this buffer is done
        if buf is None or self._np(buf).size < n:
            buf = slot[0] = self._pinned(max(1024, 1 << max(n - 1, 0).bit_length()))
        self._np(buf)[:n] = words
        dev = self._copy(buf, n)
        ev.record()
        return dev


def reference_backend() -> Backend:
    """numpy arrays, reference ops (float64 math inside each op)."""
    import importlib
    mods = [importlib.import_module(f"specdec_lib.reference.{m}")   # (the package's
            for m in _REFERENCE_MODULES]                              # `copy` is a function)
    gdn = mods[3]
    ns = SimpleNamespace(name="reference", xp=np, kv_dtype=np.float32,
                         gdn_journal_width=gdn.gdn_journal_width,
                         to_host=np.asarray, to_host_async=immediate_read(np.asarray),
                         synchronize=lambda: None,
                         device_synchronize=lambda: None,
                         stream_scope=contextlib.nullcontext, capture=None, timer=None)
    for name, op in _BACKEND_OPS:
        setattr(ns, name, next(getattr(m, op) for m in mods if hasattr(m, op)))
    return ns


def _bind_ops(ns: Backend, ops, backend: str, stream_of: Callable[[], int],
              alloc_bytes: Callable[[int], object]) -> None:
    """Put every op of ``_BACKEND_OPS`` on ``ns`` (under its backend name) with
    ``stream=stream_of()`` (read at each call) and no host-side index checks; ``spec_sample``
    gets a workspace per (T, V) from ``alloc_bytes(n)``, allocated once and reused (it never
    allocates itself)."""
    missing = [op for _, op in _BACKEND_OPS if not hasattr(ops, op)]
    if missing:
        raise RuntimeError(f"{backend} backend: specdec_lib.ops lacks " + ", ".join(missing))

    def bind(fn):
        # host-side index checks copy to the host and synchronise: never inside a round
        # (the kernels skip or flag bad indices instead of faulting)
        takes_check = "check_indices" in inspect.signature(fn).parameters

        def call(*a, **kw):
            kw.setdefault("stream", stream_of())
            if takes_check:
                kw.setdefault("check_indices", False)
            return fn(*a, **kw)
        return call
    for name, op in _BACKEND_OPS:
        setattr(ns, name, bind(getattr(ops, op)))
    workspaces = {}
    sample = ns.spec_sample

    def spec_sample(logits, *args, **kw):
        T, V = logits.shape
        ws = workspaces.get((T, V))
        if ws is None:
            ws = workspaces[(T, V)] = alloc_bytes(ops.spec_sample_workspace_size(T, V))
        kw.setdefault("workspace", ws)
        return sample(logits, *args, **kw)
    ns.spec_sample = spec_sample


def cuda_backend(device: int = 0) -> Backend:
    """cupy arrays, library kernels and cupy math on one non-blocking stream of the
    backend's own (``ns.stream``; the decoder makes it cupy's current stream while it
    runs). ``ns.capture(fn)`` records ``fn``'s work as a CUDA graph and returns a replay
    function. Raises if cupy or the compiled ops are unavailable."""
    import cupy  # noqa: F401  (the host model's dense math)
    from .. import ops
    from ..reference.gdn import gdn_journal_width
    cupy.cuda.Device(device).use()
    # a stream of our own: capture is impossible on the legacy stream, and a non-blocking
    # stream keeps other libraries' legacy-stream work from serialising with the round
    stream = cupy.cuda.Stream(non_blocking=True)
    ns = SimpleNamespace(name="cuda", xp=cupy, kv_dtype=cupy.float16,
                         gdn_journal_width=gdn_journal_width, device=device, stream=stream,
                         to_host=lambda a: cupy.asnumpy(a, stream=stream),
                         synchronize=stream.synchronize, stream_scope=lambda: stream,
                         device_synchronize=lambda: cupy.cuda.Device().synchronize())
    _bind_ops(ns, ops, "cuda", lambda: stream.ptr, lambda n: cupy.empty(n, cupy.uint8))

    def capture(fn):
        """Run nothing; record ``fn()``'s work on the stream as a graph. Memory that
        ``fn`` allocates comes from a pool private to the graph and lives as long as
        the returned replay function, so later allocations can never alias it."""
        pool = cupy.cuda.MemoryPool()
        with stream, cupy.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            try:
                fn()
            finally:
                graph = stream.end_capture()

        def replay(_keep=(graph, pool)):
            graph.launch(stream)
        return replay
    ns.capture = capture

    def timer():
        """Two events on the stream: the GPU time between ``start()`` and ``stop()``."""
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        return SimpleNamespace(start=lambda: e0.record(stream), stop=lambda: e1.record(stream),
                               seconds=lambda: 1e-3 * cupy.cuda.get_elapsed_time(e0, e1))
    ns.timer = timer
    ns.linear = _f64_linear(cupy, device)

    def pinned(a):
        mem = cupy.cuda.alloc_pinned_memory(max(a.nbytes, 1))
        return np.frombuffer(mem, a.dtype, a.size).reshape(a.shape)

    def copy(host, a):
        a = cupy.ascontiguousarray(a)
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, a.data.ptr, a.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)

    def event():
        ev = cupy.cuda.Event(disable_timing=True)
        return SimpleNamespace(record=lambda: ev.record(stream), synchronize=ev.synchronize)
    ns.to_host_async = _PinnedReads(pinned, copy, event, lambda h: h)

    def write(buf, n):
        d = cupy.empty(n, cupy.int32)
        if n:
            cupy.cuda.runtime.memcpyAsync(d.data.ptr, buf.ctypes.data, 4 * n,
                                          cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
        return d
    ns.to_device_async = _PinnedWrites(lambda n: pinned(np.zeros(n, np.int32)), lambda b: b,
                                       write, event)
    return ns


def _f64_linear(cupy, device: int):
    """float64 x [M, K] @ w [N, K].T for host models on the cuda backend: the library's
    ``linear_f64`` kernel (cuda_src/layers/linear_f64.cu) on cupy's current stream (the
    backend's stream while the decoder runs: ``stream_scope``), like the cupy math around
    it. cupy refuses to call cuBLAS while a stream is being captured, so a round holding
    cupy matmuls could not become a CUDA graph; this plain kernel can (and gives the same
    bits eagerly and in every replay)."""
    from .. import _layers, runtime

    def linear(x, w):
        x = cupy.ascontiguousarray(x, dtype=cupy.float64)
        w = cupy.ascontiguousarray(w, dtype=cupy.float64)
        if x.ndim != 2 or w.ndim != 2 or w.shape[1] != x.shape[1]:
            raise ValueError(f"linear: x {tuple(x.shape)} and w {tuple(w.shape)}: expected "
                             "x [M, K] and w [N, K]")
        (M, K), N = x.shape, w.shape[0]
        y = cupy.empty((M, N), dtype=cupy.float64)
        if M and N:
            k = runtime.kernel("linear_f64", "linear_f64", device)
            _layers.launch_linear_f64(k, (N + _F64_WARPS - 1) // _F64_WARPS, min(M, _GRID_Y_MAX),
                                      32 * _F64_WARPS, cupy.cuda.get_current_stream().ptr,
                                      x.data.ptr, w.data.ptr, y.data.ptr, M, N, K)
        return y
    return linear


class _TorchArrays:
    """The few numpy-style constructors the decoder uses (``xp.zeros``, ``xp.asarray``, ...),
    on torch tensors of one device, so the round code is the same on every backend."""

    def __init__(self, torch, device):
        self.torch, self.device = torch, device
        for name in ("int32", "int64", "uint8", "float32", "float64", "bfloat16", "float16"):
            setattr(self, name, getattr(torch, name))

    def _dt(self, dtype):
        return self.torch.float32 if dtype is None else dtype

    def zeros(self, shape, dtype=None):
        return self.torch.zeros(shape, dtype=self._dt(dtype), device=self.device)

    def ones(self, shape, dtype=None):
        return self.torch.ones(shape, dtype=self._dt(dtype), device=self.device)

    def full(self, shape, value, dtype=None):
        return self.torch.full(shape if isinstance(shape, tuple) else (shape,), value,
                               dtype=self._dt(dtype), device=self.device)

    def empty(self, shape, dtype=None):
        return self.torch.empty(shape, dtype=self._dt(dtype), device=self.device)

    def empty_like(self, a):
        return self.torch.empty_like(a)

    def arange(self, n, dtype=None):
        return self.torch.arange(n, dtype=dtype or self.torch.int64, device=self.device)

    def asarray(self, a, dtype=None):
        t = a if isinstance(a, self.torch.Tensor) else self.torch.as_tensor(np.asarray(a))
        return t.to(self.device, dtype) if dtype is not None else t.to(self.device)

    def where(self, cond, a, b):
        return self.torch.where(cond, a, b)


def torch_backend(device: int = 0) -> Backend:
    """torch tensors on one GPU; library ops on torch's *current* stream (read at each call,
    so inside ``torch.cuda.graph`` they go to the capture stream); ``ns.capture(fn)`` records
    ``fn``'s work with ``torch.cuda.CUDAGraph`` and returns its replay. The host model's dense
    math is torch (cuBLAS, SDPA), which captures fine."""
    import torch
    from .. import ops
    from ..reference.gdn import gdn_journal_width
    if not torch.cuda.is_available():
        raise RuntimeError("torch backend: torch sees no CUDA GPU")
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    ns = SimpleNamespace(name="torch", xp=_TorchArrays(torch, dev), kv_dtype=torch.bfloat16,
                         device=dev, gdn_journal_width=gdn_journal_width,
                         to_host=lambda a: a.cpu().numpy(),
                         synchronize=torch.cuda.synchronize,
                         device_synchronize=torch.cuda.synchronize,
                         stream_scope=contextlib.nullcontext)

    _bind_ops(ns, ops, "torch", lambda: torch.cuda.current_stream().cuda_stream,
              lambda n: torch.empty(n, dtype=torch.uint8, device=dev))

    def capture(fn):
        """Record ``fn()`` as a CUDA graph (its allocations come from the graph's private
        pool, alive as long as the replay function)."""
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            fn()

        def replay(_keep=graph):
            graph.replay()
        return replay
    ns.capture = capture

    def timer():
        """Two events on torch's current stream: the GPU time between ``start()`` and
        ``stop()``."""
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return SimpleNamespace(start=e0.record, stop=e1.record,
                               seconds=lambda: 1e-3 * e0.elapsed_time(e1))
    ns.timer = timer
    ns.to_host_async = _PinnedReads(
        lambda a: torch.empty(tuple(a.shape), dtype=a.dtype, pin_memory=True),
        lambda host, a: host.copy_(a, non_blocking=True),
        lambda: torch.cuda.Event(), lambda h: h.numpy())
    ns.to_device_async = _PinnedWrites(
        lambda n: torch.empty(n, dtype=torch.int32, pin_memory=True), lambda b: b.numpy(),
        lambda b, n: torch.empty(n, dtype=torch.int32, device=dev).copy_(b[:n], non_blocking=True),
        lambda: torch.cuda.Event())
    return ns


BACKENDS = ("reference", "cuda", "torch")


def make_backend(name: str = "reference", device: int = 0) -> Backend:
    """The backend called ``name`` (one of ``BACKENDS``) on GPU ``device``."""
    if name == "reference":
        return reference_backend()
    if name == "cuda":
        return cuda_backend(device)
    if name == "torch":
        return torch_backend(device)
    raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {name!r}")
