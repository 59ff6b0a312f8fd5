"""Benchmark of the conv family: ``conv1d`` (conv1d_verify + conv1d_commit of one round,
dim 8192, W = 4, as a CUDA graph)."""
from __future__ import annotations

import numpy as np

from ._harness import Bench, _rand, bench


@bench("conv1d")
def bench_conv1d(b: Bench):
    from ..arrays import DeviceArray
    from ..ops import conv1d_commit, conv1d_verify
    for B, q, dim, W in ((64, 4, 8192, 4), (1, 4, 8192, 4)):
        T = B * q
        x = _rand((T, dim), "bfloat16", b.device, 1)
        w = _rand((dim, W), "bfloat16", b.device, 2)
        bias = _rand((dim,), "bfloat16", b.device, 3)
        st = _rand((B, dim, W - 1), "bfloat16", b.device, 4)
        out = DeviceArray.empty((T, dim), "bfloat16", b.device)
        cu_q = DeviceArray.from_numpy((np.arange(B + 1) * q).astype(np.int32), device=b.device)
        slot_ids = DeviceArray.from_numpy(np.arange(B, dtype=np.int32), device=b.device)
        acc = DeviceArray.from_numpy(np.full(B, q, np.int32), device=b.device)

        def round_():
            conv1d_verify(x, w, st, slot_ids, cu_q, out, bias=bias, check_indices=False,
                          stream=b.stream)
            conv1d_commit(st, slot_ids, cu_q, acc, x, check_indices=False, stream=b.stream)
        nbytes = 2 * (2 * T * dim + 3 * B * dim * (W - 1) + dim * (W + 1))
        b.report("conv1d", f"B={B} q={q} dim={dim} W={W} bf16 verify+commit", nbytes,
                 b.time_graph(round_))
