"""The benchmark harness: the registry (``@bench``), ``Bench`` (CUDA-event and CUDA-graph
timing, the copy bandwidth of the same run, row reporting) and ``_rand``. The benchmarks
themselves live in one module per op family beside this one."""
from __future__ import annotations

import statistics
import time

import numpy as np

from .. import runtime

_BENCHES: dict = {}
_OPTIONAL: set = set()   # run only when named (long sweeps), not by a bare ``bench``


def bench(name, default=True):
    """Register ``fn(b: Bench)`` as the benchmark called ``name``; ``default=False``: run only
    when asked for by name."""
    def deco(fn):
        _BENCHES[name] = fn
        if not default:
            _OPTIONAL.add(name)
        return fn
    return deco


class Bench:
    def __init__(self, device: int = 0):
        self.drv = runtime.driver()
        self.device = device
        self.drv.ensure_context(device)
        self.stream = self.drv.stream_create()
        self.rows: list = []
        self._copy_bw = None
        self.props = runtime.device_props(device)

    # ---------------------------------------------------------------- timing
    def time(self, fn, iters: int = 20, repeats: int = 5, warmup: int = 3) -> float:
        """Median milliseconds of one ``fn()`` (enqueued on self.stream by fn)."""
        drv = self.drv
        for _ in range(warmup):
            fn()
        drv.stream_synchronize(self.stream)
        e0, e1 = drv.event_create(), drv.event_create()
        out = []
        try:
            for _ in range(repeats):
                drv.event_record(e0, self.stream)
                for _ in range(iters):
                    fn()
                drv.event_record(e1, self.stream)
                out.append(drv.event_elapsed_ms(e0, e1) / iters)
        finally:
            drv.event_destroy(e0)
            drv.event_destroy(e1)
        return statistics.median(out)

    def capture_graph(self, fn, per_graph: int = 1):
        """``(graph, exec)`` of ``per_graph`` calls of ``fn()`` captured on self.stream (fn is
        called once uncaptured first: lazy loads, workspaces); the caller frees them with
        ``drv.graph_destroy(graph, exec)``."""
        drv = self.drv
        fn()
        drv.stream_synchronize(self.stream)
        drv.graph_capture_begin(self.stream)
        try:
            for _ in range(per_graph):
                fn()
        finally:
            g, ge = drv.graph_capture_end(self.stream)
        return g, ge

    def time_graph(self, fn, per_graph: int = 20, repeats: int = 7) -> float:
        """Median ms of one ``fn()`` from replays of a graph holding ``per_graph`` calls."""
        drv = self.drv
        g, ge = self.capture_graph(fn, per_graph)
        try:
            return self.time(lambda: drv.graph_launch(ge, self.stream), iters=5,
                             repeats=repeats) / per_graph
        finally:
            drv.graph_destroy(g, ge)

    def time_torch_graph(self, fn, per_graph: int = 20) -> float:
        """Median ms of one ``fn()`` (torch work, or library ops on torch's current stream)
        from replays of a torch CUDA graph holding ``per_graph`` calls, replayed on the
        bench stream."""
        import torch
        for _ in range(3):                       # cuBLAS handles / workspaces before the capture
            fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(per_graph):
                fn()
        torch.cuda.synchronize()
        ext = torch.cuda.ExternalStream(self.stream)

        def replay():
            with torch.cuda.stream(ext):
                g.replay()
        try:
            return self.time(replay, iters=5, repeats=7) / per_graph
        finally:
            del g

    def host_us(self, fn, n: int = 200) -> float:
        """Host microseconds per call (launch path only; the GPU is not waited for)."""
        fn()
        self.drv.stream_synchronize(self.stream)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t0) / n * 1e6
        self.drv.stream_synchronize(self.stream)
        return dt

    def copy_bw(self) -> float:
        """Device-to-device copy bandwidth in GB/s (bytes read + written), 1 GiB buffers."""
        if self._copy_bw is None:
            from ..arrays import DeviceArray
            n = 1 << 30
            a = DeviceArray.empty((n,), "uint8", self.device).fill_bytes(1)
            b = DeviceArray.empty((n,), "uint8", self.device)
            ms = self.time(lambda: self.drv.memcpy_dtod(b.ptr, a.ptr, n, self.stream), iters=5)
            self._copy_bw = 2 * n / ms / 1e6
            del a, b
        return self._copy_bw

    # ---------------------------------------------------------------- reporting
    def report(self, op: str, shape: str, nbytes: float, ms: float, impl: str = "specdec_lib",
               **extra):
        gbs = nbytes / ms / 1e6 if ms > 0 else 0.0
        row = {"op": op, "impl": impl, "shape": shape, "us": round(ms * 1e3, 2),
               "bytes": int(nbytes), "GB/s": round(gbs, 1),
               "of_copy": round(gbs / self.copy_bw(), 3), **extra}
        self.rows.append(row)
        print(f"  {op:<18} {impl:<22} {shape:<48} {row['us']:>10.2f} us "
              f"{row['GB/s']:>8.1f} GB/s  {100 * row['of_copy']:5.1f}% of copy"
              + "".join(f"  {k}={v}" for k, v in extra.items()), flush=True)
        return row

    def close(self):
        self.drv.stream_synchronize(self.stream)
        self.drv.stream_destroy(self.stream)


def _rand(shape, dtype, device=0, seed=0):
    from ..arrays import DeviceArray
    from ..dtypes import to_host_storage
    rng = np.random.default_rng(seed)
    return DeviceArray.from_numpy(to_host_storage(rng.standard_normal(shape).astype(np.float32),
                                                  dtype), dtype=dtype, device=device)


def _strided(base, shape, strides, offset=0):
    """A view of DeviceArray ``base`` (``strides`` and ``offset`` in elements) through the CUDA
    Array Interface: how a host model hands the ops column slices of wider rows."""
    isz = base.itemsize
    cai = {"shape": tuple(shape), "typestr": base.__cuda_array_interface__["typestr"],
           "data": (base.ptr + offset * isz, False), "strides": tuple(s * isz for s in strides),
           "version": 3}
    return type("StridedView", (), {"__cuda_array_interface__": cai, "base": base})()


def _paged_batch(device, B, L, q, num_pages, max_pages):
    """A ragged-free batch over a paged cache: page_table [B, max_pages] (a random permutation
    of the pool's first B * max_pages pages), seq_lens = L, cu_q of q rows per sequence."""
    from ..arrays import DeviceArray
    pt = np.random.default_rng(0).permutation(num_pages)[:B * max_pages].reshape(B, max_pages)
    return (DeviceArray.from_numpy(pt.astype(np.int32), device=device),
            DeviceArray.from_numpy(np.full(B, L, np.int32), device=device),
            DeviceArray.from_numpy((np.arange(B + 1) * q).astype(np.int32), device=device))
