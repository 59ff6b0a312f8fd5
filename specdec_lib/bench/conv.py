"""Benchmark of the conv family: ``conv1d`` (conv1d_verify + conv1d_commit of one round,
dim 8192, W = 4, as a CUDA graph), then each op alone, with the kernel the call takes by
default (W = 4: conv1d_verify_w4_* / conv1d_commit_w4_*, row lanes by ops.conv._row_lanes)
against the generic kernels (ops.conv.TUNING["w4"] = False, what SPECDEC_CONV_GENERIC=1 does)
and the W = 4 kernels with one row lane; then the fused round (one conv1d_verify that first
commits the previous round's accepted rows: "fused round", CTAs by ops.conv._fused_threads,
and with 256 threads a CTA)."""
from __future__ import annotations

import numpy as np

from ._harness import Bench, _rand, bench

# (impl label, ops.conv.TUNING for it)
_PATHS = (("specdec_lib", {"w4": None, "lanes": None}),
          ("specdec_lib(generic kernels)", {"w4": False, "lanes": None}),
          ("specdec_lib(w4, 1 row lane)", {"w4": True, "lanes": 1}))


@bench("conv1d")
def bench_conv1d(b: Bench):
    from ..arrays import DeviceArray
    from ..ops import conv as ops_conv
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

        def verify():
            conv1d_verify(x, w, st, slot_ids, cu_q, out, bias=bias, check_indices=False,
                          stream=b.stream)

        def commit():
            conv1d_commit(st, slot_ids, cu_q, acc, x, check_indices=False, stream=b.stream)

        def round_():
            verify()
            commit()
        shape = f"B={B} q={q} dim={dim} W={W} bf16"
        nbytes = 2 * (2 * T * dim + 3 * B * dim * (W - 1) + dim * (W + 1))
        v_bytes = 2 * (2 * T * dim + B * dim * (W - 1) + dim * (W + 1))
        c_bytes = 2 * (T * dim + 2 * B * dim * (W - 1))
        old = dict(ops_conv.TUNING)
        try:
            for impl, tuning in _PATHS:
                ops_conv.TUNING.update(tuning)
                kern = ops_conv.verify_kernel(W, "bfloat16", "bfloat16", "bfloat16", "bfloat16",
                                              "bfloat16", None)
                b.report("conv1d", f"{shape} verify+commit", nbytes, b.time_graph(round_),
                         impl=impl, kernel=kern)
                b.report("conv1d", f"{shape} verify", v_bytes, b.time_graph(verify), impl=impl)
                b.report("conv1d", f"{shape} commit", c_bytes, b.time_graph(commit), impl=impl)
            # the fused round: verify with the previous round's whole block pending (x itself:
            # the bench's x never changes), the state written back every replay
            pend = dict(pending_journal=x, pending_row0=DeviceArray.from_numpy(
                (np.arange(B) * q).astype(np.int32), device=b.device), pending_len=acc)
            f_bytes = v_bytes + 2 * (2 * B * dim * (W - 1))

            def fused():
                conv1d_verify(x, w, st, slot_ids, cu_q, out, bias=bias, check_indices=False,
                              stream=b.stream, **pend)
            for impl, tuning in (("specdec_lib", {"w4": None, "threads": None}),
                                 ("specdec_lib(256 threads a CTA)", {"w4": None, "threads": 256}),
                                 ("specdec_lib(generic kernels)", {"w4": False, "threads": None})):
                ops_conv.TUNING.update(tuning)
                b.report("conv1d", f"{shape} fused round", f_bytes, b.time_graph(fused), impl=impl)
        finally:
            ops_conv.TUNING.clear()
            ops_conv.TUNING.update(old)
