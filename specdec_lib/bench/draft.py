"""Benchmark of the draft family: ``draft_combine`` (RMSNorm(embed) ++ RMSNorm(hidden)) against
the copy bandwidth (bytes: the two input rows, the two weights, the output row), with the fused
token lookup; torch's rms_norm + cat on the same shape when torch imports."""
from __future__ import annotations

import numpy as np

from ._harness import Bench, _rand, bench

_ISZ = {"float32": 4, "float16": 2, "bfloat16": 2}


@bench("draft_combine")
def bench_draft_combine(b: Bench):
    from ..arrays import DeviceArray
    from ..ops import draft_combine
    V = 32000
    for rows, H, dt, wdt, gather in ((64, 4096, "bfloat16", "bfloat16", True),
                                     (64, 7168, "bfloat16", "float32", True),
                                     (1, 4096, "bfloat16", "bfloat16", True),
                                     (4096, 4096, "bfloat16", "bfloat16", False),
                                     (4096, 4096, "float32", "float32", False),
                                     (256, 20000, "float16", "float32", False)):
        d = b.device
        hidden = _rand((rows, H), dt, d, 1)
        table = _rand((V if gather else rows, H), dt, d, 2)
        we, wh = _rand((H,), wdt, d, 3), _rand((H,), wdt, d, 4)
        ids = DeviceArray.from_numpy(np.random.default_rng(0).integers(0, V, rows)
                                     .astype(np.int32), device=d) if gather else None
        out = DeviceArray.empty((rows, 2 * H), dt, d)

        def run():
            draft_combine(table, hidden, we, wh, out, token_ids=ids, eps=1e-6, unit_offset=True,
                          stream=b.stream)
        nbytes = 4 * rows * H * _ISZ[dt] + 2 * H * _ISZ[wdt]
        shape = f"rows={rows} H={H} {dt} w {wdt}" + (" gather" if gather else "")
        small = rows * H < (1 << 22)
        ms = b.time_graph(run) if small else b.time(run, iters=10)
        b.report("draft_combine", shape + (" (graph)" if small else ""), nbytes, ms,
                 host_us=round(b.host_us(run), 1))
        if small:
            b.report("draft_combine", shape + " (stream)", nbytes, b.time(run))
        _torch_combine_peer(b, rows, H, dt, nbytes, shape)


def _torch_combine_peer(b: Bench, rows, H, dt, nbytes, shape):
    try:
        import torch
        rms_norm = torch.nn.functional.rms_norm
    except Exception as e:   # not installed here (or too old for rms_norm): say so
        print(f"  torch peer skipped: {type(e).__name__}: {e}")
        return
    dev = torch.device("cuda", b.device)
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dt]
    e = torch.randn(rows, H, device=dev, dtype=tdt)
    h = torch.randn(rows, H, device=dev, dtype=tdt)
    we = torch.randn(H, device=dev, dtype=tdt)
    wh = torch.randn(H, device=dev, dtype=tdt)
    s = torch.cuda.ExternalStream(b.stream)

    def peer():
        with torch.cuda.stream(s):
            torch.cat([rms_norm(e, (H,), 1 + we, 1e-6), rms_norm(h, (H,), 1 + wh, 1e-6)], dim=-1)
    try:
        b.report("draft_combine", shape.replace(" gather", ""), nbytes, b.time(peer),
                 impl="torch rms_norm+cat")
    except Exception as ex:
        print(f"  torch peer failed: {type(ex).__name__}: {ex}")
