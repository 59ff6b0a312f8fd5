"""Benchmarks: ``python -m specdec_lib bench [op ...] [--json FILE]``.

Every benchmark reports the bytes the op must move, the achieved GB/s, and the ratio
to the device-to-device copy bandwidth measured in the same run (bytes read +
written), plus a peer on the same shape where one is importable (torch, fla).
Timing: CUDA events around many back-to-back calls on one stream after a warm-up,
median of repeats; small ops are timed as CUDA-graph replays so host launch
overhead is not what gets measured.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from . import runtime

_BENCHES: dict = {}


def bench(name):
    """Register ``fn(b: Bench)`` as the benchmark called ``name``."""
    def deco(fn):
        _BENCHES[name] = fn
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

    def time_graph(self, fn, per_graph: int = 20, repeats: int = 7) -> float:
        """Median ms of one ``fn()`` from replays of a graph holding ``per_graph`` calls."""
        drv = self.drv
        fn()
        drv.stream_synchronize(self.stream)
        drv.graph_capture_begin(self.stream)
        try:
            for _ in range(per_graph):
                fn()
        finally:
            g, ge = drv.graph_capture_end(self.stream)
        try:
            return self.time(lambda: drv.graph_launch(ge, self.stream), iters=5,
                             repeats=repeats) / per_graph
        finally:
            drv.graph_destroy(g, ge)

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
            from .arrays import DeviceArray
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
    from .arrays import DeviceArray
    from .dtypes import to_host_storage
    rng = np.random.default_rng(seed)
    return DeviceArray.from_numpy(to_host_storage(rng.standard_normal(shape).astype(np.float32),
                                                  dtype), dtype=dtype, device=device)


# ------------------------------------------------------------------ copy family

@bench("copy")
def bench_copy(b: Bench):
    from .arrays import DeviceArray
    from .ops import copy
    n = 1 << 28                              # 1 GiB of float32
    src = _rand((n,), "float32", b.device)
    dst = DeviceArray.empty((n,), "float32", b.device)
    ms = b.time(lambda: copy(dst, src, stream=b.stream), iters=5)
    b.report("copy", f"contiguous f32 [{n}]", 2 * n * 4, ms)
    src2 = _rand((8192, 16384), "bfloat16", b.device)
    dst2 = DeviceArray.empty((8192, 8192), "bfloat16", b.device)
    view = {"shape": (8192, 8192), "typestr": "<V2", "strides": (16384 * 2, 2),
            "data": (src2.ptr, True), "version": 3}

    class Strided:
        __cuda_array_interface__ = view
    ms = b.time(lambda: copy(dst2, Strided(), stream=b.stream), iters=5)
    b.report("copy", "bf16 [8192, 8192] from row-strided", 2 * 8192 * 8192 * 2, ms)
    row = _rand((1, 8192), "float32", b.device)
    dst3 = DeviceArray.empty((16384, 8192), "float32", b.device)
    ms = b.time(lambda: copy(dst3, row, stream=b.stream), iters=5)
    b.report("copy", "f32 broadcast [1,8192] -> [16384, 8192]", 16384 * 8192 * 4, ms)


@bench("append_kv")
def bench_append_kv(b: Bench):
    from .arrays import DeviceArray
    from .ops import append_kv
    for B, q, hkv, D, page in ((64, 4, 8, 128, 16), (256, 128, 8, 128, 64), (256, 512, 8, 128, 64),
                              (1, 4, 8, 128, 16)):
        T = B * q
        L = 4096
        max_pages = (L + q) // page + 1
        num_pages = B * max_pages
        k, v = _rand((T, hkv, D), "bfloat16", b.device, 1), _rand((T, hkv, D), "bfloat16", b.device, 2)
        kc = DeviceArray.empty((num_pages, page, hkv, D), "bfloat16", b.device)
        vc = DeviceArray.empty((num_pages, page, hkv, D), "bfloat16", b.device)
        pt = DeviceArray.from_numpy(np.random.default_rng(0).permutation(num_pages)
                                    .reshape(B, max_pages).astype(np.int32), device=b.device)
        sl = DeviceArray.from_numpy(np.full(B, L, np.int32), device=b.device)
        cq = DeviceArray.from_numpy((np.arange(B + 1) * q).astype(np.int32), device=b.device)

        def run():
            append_kv(k, v, kc, vc, pt, sl, cq, check_indices=False, stream=b.stream)
        nbytes = 2 * 2 * T * hkv * D * 2       # K and V, read + write
        large = T * hkv * D >= (1 << 22)
        ms = b.time(run, iters=10) if large else b.time_graph(run)
        b.report("append_kv", f"B={B} q={q} Hkv={hkv} D={D} page={page} bf16", nbytes, ms,
                 host_us=round(b.host_us(run), 1))
        if large and T <= 32768:   # launch-shape sweep: threads per block row x block rows per CTA
            import importlib
            _c = importlib.import_module("specdec_lib.ops.copy")   # (ops.copy is the function)
            for thr, rows in ((32, 8), (32, 4), (32, 2), (64, 4), (128, 2)):
                _c.TUNING.update(append_kv_threads=thr, append_kv_rows=rows)
                try:
                    ms = b.time(run, iters=10)
                finally:
                    _c.TUNING.update(append_kv_threads=None, append_kv_rows=None)
                b.report("append_kv", f"B={B} q={q} page={page} sweep", nbytes, ms,
                         threads=thr, rows=rows)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m specdec_lib bench",
                                description="Benchmark specdec_lib ops on the GPU against the "
                                            "copy bandwidth measured in the same run.")
    p.add_argument("ops", nargs="*", help=f"which benchmarks (default: all): {', '.join(_BENCHES)}")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args(argv)
    _load_plugins()
    reason = runtime.gpu_unavailable_reason()
    if reason:
        print(f"bench: no GPU ({reason})")
        return 2
    names = args.ops or list(_BENCHES)
    unknown = [n for n in names if n not in _BENCHES]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; known: {', '.join(_BENCHES)}")
    b = Bench(args.device)
    print(f"device: {b.props['name']} ({b.props['sm_count']} SMs), family sm_"
          f"{runtime.arch_family(args.device)}; copy bandwidth {b.copy_bw():.0f} GB/s")
    failed = []
    for n in names:
        try:
            _BENCHES[n](b)
        except Exception as e:   # one broken benchmark must not hide the others
            failed.append(n)
            print(f"  {n}: FAILED {type(e).__name__}: {e}", flush=True)
    b.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": b.props, "copy_GBps": b.copy_bw(), "family":
                       runtime.arch_family(args.device), "rows": b.rows}, f, indent=1, default=str)
    return 1 if failed else 0


def _load_plugins():
    """Benchmarks of op families that live in their own modules (bench_<family>.py)."""
    import importlib
    import pkgutil
    from . import __path__ as pkg_path
    for m in pkgutil.iter_modules(pkg_path):
        if m.name.startswith("bench_"):
            importlib.import_module(f"specdec_lib.{m.name}")
