"""Benchmark of the sampling family: ``python -m specdec_lib bench spec_sample``.

Bytes counted: the logits the op must read once (T * V * itemsize); the filter and finish
passes re-read parts of rows (per top-k / top-p filter: a bucket pass and a candidate pass
over the row, each split over several CTAs per row, then one recount pass that skips tiles
whose max is below the threshold; the finish re-reads one 2048-token tile),
so rows with filters cost more than the number printed assumes -- that is the point of
printing both the no-filter and the top-p mixes. Peers on the same shapes: a plain torch
softmax + rejection (when torch is importable) and FlashInfer's chain sampler turned into
its time floor: it reads fp32 target probabilities [B, k+1, V] and draft probabilities
[B, k, V] (after a softmax we do not count), at the copy bandwidth measured here.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np

from ._harness import Bench, bench


def _inputs(B, k, V, device, greedy_frac, top_p, seed=0, top_k=0):
    from ..arrays import DeviceArray
    from ..dtypes import f32_to_bf16_bits
    rng = np.random.default_rng(seed)
    q = k + 1
    T = B * q
    logits = f32_to_bf16_bits((rng.standard_normal((T, V)) * 3).astype(np.float32))
    temp = np.where(rng.random(B) < greedy_frac, 0.0, 0.8).astype(np.float32)
    host = dict(
        logits=DeviceArray.from_numpy(logits, dtype="bfloat16", device=device),
        cu_q=DeviceArray.from_numpy((np.arange(B + 1) * q).astype(np.int32), device=device),
        draft_ids=DeviceArray.from_numpy(rng.integers(0, V, T - B).astype(np.int32), device=device),
        temperature=DeviceArray.from_numpy(temp, device=device),
        top_k=DeviceArray.from_numpy(np.full(B, top_k, np.int32), device=device),
        top_p=DeviceArray.from_numpy(np.full(B, top_p, np.float32), device=device),
        min_p=DeviceArray.from_numpy(np.zeros(B, np.float32), device=device),
        seed=DeviceArray.from_numpy(np.arange(B, dtype=np.uint64), device=device),
        step=DeviceArray.from_numpy(np.zeros(B, np.int64), device=device),
        num_accepted=DeviceArray.empty((B,), "int32", device),
        emitted=DeviceArray.empty((B, q), "int32", device),
        status=DeviceArray.empty((B,), "int32", device),
    )
    return host, T


def spec_sample_call(b: Bench, B, k, V, greedy_frac, top_p, filters, top_k=0):
    """(run, T): one spec_sample call on fresh inputs of this mix, enqueued on ``b.stream``
    with its own workspace; also used by tools/perf/profile_op.py."""
    from ..arrays import DeviceArray
    from ..ops import spec_sample, spec_sample_workspace_size
    a, T = _inputs(B, k, V, b.device, greedy_frac, top_p, top_k=top_k)
    ws = DeviceArray.empty((spec_sample_workspace_size(T, V),), "uint8", b.device)

    def run():
        spec_sample(a["logits"], a["cu_q"], a["draft_ids"], a["temperature"], a["top_k"],
                    a["top_p"], a["min_p"], a["seed"], a["step"], a["num_accepted"],
                    a["emitted"], a["status"], workspace=ws, stream=b.stream, filters=filters,
                    check_indices=False)
    return run, T


@contextlib.contextmanager
def _env(**values):
    """Set environment variables for the calls inside (the kernel path and cluster size are
    read per call), then restore what was there."""
    old = {key: os.environ.get(key) for key in values}
    os.environ.update({key: str(v) for key, v in values.items()})
    try:
        yield
    finally:
        for key, v in old.items():
            if v is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = v


def _timed(b: Bench, B, k, V, greedy_frac, top_p, filters, top_k, label, host=False, **report):
    """One spec_sample call of this mix timed (graph replays for B <= 4) and reported (with
    its host time per call when ``host``); returns the call (its inputs stay alive with it)."""
    run, T = spec_sample_call(b, B, k, V, greedy_frac, top_p, filters, top_k)
    ms = b.time_graph(run) if B <= 4 else b.time(run, iters=20)
    if host:
        report["host_us"] = round(b.host_us(run), 1)
    b.report("spec_sample", f"B={B} k={k} V={V} bf16 {label}", T * V * 2, ms, **report)
    return run


@bench("spec_sample")
def bench_spec_sample(b: Bench):
    V, k = 151936, 3
    # filters=False: the caller's promise that no request filters (the two filter launches skipped)
    for B, greedy_frac, top_p, filters, label, top_k in (
            (64, 0.5, 1.0, None, "half greedy, no filter", 0),
            (64, 0.5, 1.0, False, "half greedy, no filter, filters=False", 0),
            (64, 0.5, 0.9, None, "half greedy, top-p 0.9", 0),
            (64, 0.5, 0.9, None, "half greedy, top-k 50 + top-p 0.9", 50),
            # a wide nucleus (f32 logits: a wide top-p window)
            (64, 0.5, 0.99, None, "half greedy, top-p 0.99", 0),
            # every row filters: 256 rows for the hist launch's one CTA per row
            (64, 0.0, 0.9, None, "all sampled, top-p 0.9", 0),
            (64, 0.0, 1.0, None, "all sampled, no filter", 0),
            (64, 0.0, 1.0, False, "all sampled, no filter, filters=False", 0),
            (1, 0.0, 1.0, None, "sampled, no filter", 0),
            (1, 0.0, 1.0, False, "sampled, no filter, filters=False", 0),
            (1, 0.0, 0.9, None, "sampled, top-p 0.9", 0),
            (1, 0.0, 0.9, None, "sampled, top-k 50 + top-p 0.9", 50)):
        run = _timed(b, B, k, V, greedy_frac, top_p, filters, top_k, label, host=True)
        if B == 64 and top_p == 1.0 and greedy_frac == 0.5 and filters is None and top_k == 0:
            fi_bytes = (B * (k + 1) * V + B * k * V) * 4
            floor_ms = fi_bytes / (b.copy_bw() * 1e6)
            b.report("spec_sample", f"B={B} k={k} V={V} fp32 probs read floor", fi_bytes,
                     floor_ms, impl="flashinfer-chain(floor)")
            _torch_peer(b, B, k, V)
        del run   # its inputs and workspace
    # the same shapes through the tiles -> hist -> finish launches (what sm_75 / sm_80 run;
    # on sm_90 the default for 16-bit logits, one-hot drafts is the small path for calls that
    # fit one wave of clusters, then the rows path up to 64 rows)
    from .. import runtime
    from .._sampling import ROWS_THREADS
    from ..ops.sampling import CLUSTER_ENV, PATH_ENV, TILE, rows_plan, rows_unsupported
    if rows_unsupported("bfloat16", True, V, b.device) is not None:
        return
    tpc, cluster, smem = rows_plan(-(-V // TILE))
    k_rows = runtime.kernel("sampling", "spec_sample_rows_bf16", b.device)
    print(f"  rows path: {tpc} tiles x {cluster} CTAs per row, {smem} B dynamic smem, "
          f"{k_rows.max_active_clusters(ROWS_THREADS * cluster, ROWS_THREADS, smem, cluster)} "
          f"clusters resident, attrs {k_rows.attributes()}")
    for cl in (4, 16):   # CTAs per row other than the default 8
        with _env(**{CLUSTER_ENV: cl, PATH_ENV: "rows"}):
            for B, greedy_frac, top_p, label in ((64, 0.5, 0.9, "half greedy, top-p 0.9"),
                                                 (64, 0.5, 1.0, "half greedy, no filter"),
                                                 (1, 0.0, 0.9, "sampled, top-p 0.9"),
                                                 (1, 0.0, 1.0, "sampled, no filter")):
                _timed(b, B, k, V, greedy_frac, top_p, None, 0, label,
                       impl=f"specdec_lib(rows, {cl} CTAs/row)")
    with _env(**{PATH_ENV: "tiles"}):
        for B, greedy_frac, top_p, filters, label, top_k in (
                (64, 0.5, 1.0, None, "half greedy, no filter", 0),
                (64, 0.5, 0.9, None, "half greedy, top-p 0.9", 0),
                (64, 0.5, 0.9, None, "half greedy, top-k 50 + top-p 0.9", 50),
                (1, 0.0, 1.0, None, "sampled, no filter", 0),
                (1, 0.0, 0.9, None, "sampled, top-p 0.9", 0)):
            _timed(b, B, k, V, greedy_frac, top_p, filters, top_k, label,
                   impl="specdec_lib(tiles path)")
    # the small path against the rows path at B=1 (the automatic choice there is small), its
    # CTAs per row and a one-CTA-per-SM placement (ops.sampling.TUNING)
    from ..ops import sampling as ops
    for B, top_p, top_k, label in ((1, 1.0, 0, "sampled, no filter"), (1, 0.9, 0, "sampled, top-p 0.9"),
                                   (1, 0.9, 50, "sampled, top-k 50 + top-p 0.9")):
        with _env(**{PATH_ENV: "rows"}):
            _timed(b, B, k, V, 0.0, top_p, None, top_k, label, impl="specdec_lib(rows path)")
        for cl, smem_min in ((8, 0), (16, 120_000)):
            old = dict(ops.TUNING)
            ops.TUNING.update(small_cluster=cl, small_smem_min=smem_min)
            try:
                with _env(**{PATH_ENV: "small"}):
                    _timed(b, B, k, V, 0.0, top_p, None, top_k, label,
                           impl=f"specdec_lib(small, {cl} CTAs/row{', 1 CTA/SM' if smem_min else ''})")
            finally:
                ops.TUNING.update(old)
    # where the paths cross over (the automatic choice: ops.sampling.sample_path)
    for B in (4, 8, 16, 32):
        for top_p, label in ((1.0, "half greedy, no filter"), (0.9, "half greedy, top-p 0.9")):
            for path in ("small", "rows", "tiles"):
                with _env(**{PATH_ENV: path}):
                    _timed(b, B, k, V, 0.5, top_p, None, 0, label, impl=f"specdec_lib({path} path)")


def _torch_peer(b: Bench, B, k, V):
    """softmax(logits / T) in fp32 + one-hot rejection + residual multinomial, in torch."""
    try:
        import torch
    except ImportError:
        return
    dev = torch.device("cuda", b.device)
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(B * (k + 1), V, device=dev, dtype=torch.bfloat16) * 3
    drafts = torch.randint(0, V, (B, k), device=dev, generator=g)
    temp = torch.full((B * (k + 1), 1), 0.8, device=dev)

    def run():
        p = torch.softmax(logits.float() / temp, -1).view(B, k + 1, V)
        px = p[:, :k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        u = torch.rand(B, k, device=dev, generator=g)
        acc = (u < px).int().cumprod(-1)
        n = acc.sum(-1)
        rows = p[torch.arange(B, device=dev), n]
        res = rows.scatter(-1, drafts.gather(-1, n.clamp(max=k - 1).unsqueeze(-1)), 0.0)
        res = torch.where((n < k).unsqueeze(-1), res, rows)
        return torch.multinomial(res, 1, generator=g)

    s = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(s):
        run()
        s.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            run()
        end.record()
        end.synchronize()
    ms = start.elapsed_time(end) / 20
    b.report("spec_sample", f"B={B} k={k} V={V} bf16 softmax+rejection", B * (k + 1) * V * 2, ms,
             impl="torch")
