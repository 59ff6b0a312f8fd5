"""Benchmarks of the copy family: ``copy`` (contiguous, row-strided, broadcast) and
``append_kv`` (with its launch-shape sweep)."""
from __future__ import annotations

from ._harness import Bench, _paged_batch, _rand, bench


@bench("copy")
def bench_copy(b: Bench):
    from ..arrays import DeviceArray
    from ..ops import copy
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
    from ..arrays import DeviceArray
    from ..ops import append_kv
    for B, q, hkv, D, page in ((64, 4, 8, 128, 16), (256, 128, 8, 128, 64), (256, 512, 8, 128, 64),
                              (1, 4, 8, 128, 16)):
        T = B * q
        L = 4096
        max_pages = (L + q) // page + 1
        num_pages = B * max_pages
        k, v = _rand((T, hkv, D), "bfloat16", b.device, 1), _rand((T, hkv, D), "bfloat16", b.device, 2)
        kc = DeviceArray.empty((num_pages, page, hkv, D), "bfloat16", b.device)
        vc = DeviceArray.empty((num_pages, page, hkv, D), "bfloat16", b.device)
        pt, sl, cq = _paged_batch(b.device, B, L, q, num_pages, max_pages)

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
    _bench_append_kv8(b)


def append_kv8_call(b: Bench, B: int, q: int, hkv: int, D: int, page: int, fmt: str, L: int = 4096):
    """append_kv of a B x q block of bf16 K/V into fresh fp8 / int8 caches (sequences at
    length L): the call and the bytes it moves (bf16 K and V read, 1-byte codes written,
    plus the int8 rows' (scale, zero) pairs, 8 bytes per token per head)."""
    import numpy as np
    from ..arrays import DeviceArray
    from ..ops import append_kv
    T = B * q
    max_pages = (L + q) // page + 1
    num_pages = B * max_pages
    k = _rand((T, hkv, D), "bfloat16", b.device, 1)
    v = _rand((T, hkv, D), "bfloat16", b.device, 2)
    pt, sl, cq = _paged_batch(b.device, B, L, q, num_pages, max_pages)
    cdt = "uint8" if fmt == "fp8" else "int8"
    kc = DeviceArray.empty((num_pages, page, hkv, D), cdt, b.device)
    vc = DeviceArray.empty((num_pages, page, hkv, D), cdt, b.device)
    if fmt == "fp8":
        s = DeviceArray.from_numpy(np.full((hkv,), 0.05, np.float32), device=b.device)
        kw = dict(k_scale=s, v_scale=s)
    else:
        kw = dict(k_params=DeviceArray.empty((num_pages, page, hkv, 2), "float32", b.device),
                  v_params=DeviceArray.empty((num_pages, page, hkv, 2), "float32", b.device))

    def run():
        append_kv(k, v, kc, vc, pt, sl, cq, check_indices=False, stream=b.stream, **kw)
    return run, 2 * T * hkv * (D * 2 + D + (8 if fmt == "int8" else 0))


def _bench_append_kv8(b: Bench):
    """append_kv quantising bf16 K/V into fp8_e4m3 / int8 caches (issue 32), at the decode
    shape and the issue's B=256 q=128. Bytes as actually moved (append_kv8_call)."""
    for B, q, hkv, D, page in ((64, 4, 8, 128, 16), (256, 128, 8, 128, 64)):
        for fmt in ("fp8", "int8"):
            run, nbytes = append_kv8_call(b, B, q, hkv, D, page, fmt)
            large = B * q * hkv * D >= (1 << 22)
            ms = b.time(run, iters=10) if large else b.time_graph(run)
            b.report("append_kv", f"B={B} q={q} Hkv={hkv} D={D} page={page} bf16 -> {fmt}",
                     nbytes, ms, host_us=round(b.host_us(run), 1))
            if large:   # launch-shape sweep: warps per token x tokens per CTA
                import importlib
                _c = importlib.import_module("specdec_lib.ops.copy")
                for warps, rows in ((1, 8), (1, 4), (1, 2), (2, 4)):
                    _c.TUNING.update(append_kv8_warps=warps, append_kv8_rows=rows)
                    try:
                        ms = b.time(run, iters=10)
                    finally:
                        _c.TUNING.update(append_kv8_warps=None, append_kv8_rows=None)
                    b.report("append_kv", f"B={B} q={q} page={page} -> {fmt} sweep", nbytes, ms,
                             warps=warps, rows=rows)
            del run
