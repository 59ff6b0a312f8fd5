"""Benchmark of the gdn family:

  gdn_round   gdn_verify + gdn_commit of one speculative round against 3 state passes at
              the copy bandwidth (the issue's bar: within 1.25x), per state dtype/layout,
              and the fused mode's round (one gdn_verify with pending rows: 2 passes);
              flash-linear-attention's fused_recurrent_gated_delta_rule on the same shape
              when ``import fla`` works (one pass writing the final state, and vLLM-style
              one call per block row writing a state each time). 16-bit states run on both
              kernel families (impl "specdec_lib" = CUDA cores, "specdec_lib mma" = the
              tensor-core kernels, ops.gdn.TUNING["mma16"]), side by side. Shapes on the
              small-batch path (ops.gdn._small_batch: B = 1 here) are also timed on the
              default launch shape (rows "default shape", TUNING["small_heads"] = 0).
  gdn_sweep   (only when named) the transactional and the fused round over B in {1, 8, 32,
              64, 128, 256}, Hv in {32, 64} (Hk = Hv / 2), q in {2, 4, 8}, both layouts, all
              three state dtypes and both 16-bit families, each as a ratio to its 3-pass floor.
"""
from __future__ import annotations

import numpy as np

from ._harness import Bench, _rand, bench


def _gdn_inputs(b: Bench, B, q, Hk, Hv, D, in_dtype="bfloat16"):
    from ..arrays import DeviceArray
    T = B * q
    rng = np.random.default_rng(0)
    d = b.device
    inp = dict(q=_rand((T, Hk, D), in_dtype, d, 1), k=_rand((T, Hk, D), in_dtype, d, 2),
               v=_rand((T, Hv, D), in_dtype, d, 3), a=_rand((T, Hv), in_dtype, d, 4),
               b=_rand((T, Hv), in_dtype, d, 5),
               A_log=DeviceArray.from_numpy(rng.uniform(-2, 0.5, Hv).astype(np.float32), device=d),
               dt_bias=DeviceArray.from_numpy(rng.uniform(-1, 1, Hv).astype(np.float32), device=d))
    cu_q = DeviceArray.from_numpy((np.arange(B + 1) * q).astype(np.int32), device=d)
    slot_ids = DeviceArray.from_numpy(rng.permutation(B).astype(np.int32), device=d)
    return T, inp, cu_q, slot_ids


FAMILIES = {"cuda": "specdec_lib", "mma": "specdec_lib mma"}   # TUNING["mma16"] off / on


def _families(sdt):
    return ("cuda",) if sdt == "float32" else ("cuda", "mma")


def _pass_bytes(B, Hv, D, sdt):
    return B * Hv * D * D * {"float32": 4, "bfloat16": 2, "float16": 2}[sdt]


def gdn_round_calls(b: Bench, B, q, Hk, Hv, D, sdt, layout, state=None):
    """(verify, commit, fused) of one round at this shape on fresh inputs (fused gating, L2
    norm, every block accepted), enqueued on ``b.stream``; ``fused`` is the fused mode's
    steady-state round: a verify that first commits the previous round's q accepted rows
    (from a second journal, written once here). Also used by tools/perf/profile_op.py."""
    from ..arrays import DeviceArray
    from ..ops import gdn_commit, gdn_journal_width, gdn_verify
    T, inp, cu_q, slot_ids = _gdn_inputs(b, B, q, Hk, Hv, D)
    if state is None:
        state = _rand((B, Hv, D, D), sdt, b.device, 6)
    out = DeviceArray.empty((T, Hv, D), "bfloat16", b.device)
    journal = DeviceArray.empty((T, gdn_journal_width(Hk, Hv, D, D)), "float32", b.device)
    acc = DeviceArray.from_numpy(np.full(B, q, np.int32), device=b.device)

    def verify():
        gdn_verify(inp["q"], inp["k"], inp["v"], state, slot_ids, cu_q, out, journal,
                   a=inp["a"], b=inp["b"], A_log=inp["A_log"], dt_bias=inp["dt_bias"],
                   qk_l2norm=True, layout=layout, check_indices=False, stream=b.stream)

    def commit():
        gdn_commit(state, slot_ids, cu_q, acc, journal, layout=layout, check_indices=False,
                   stream=b.stream)

    prev = DeviceArray.empty(journal.shape, "float32", b.device)
    row0 = DeviceArray.from_numpy((np.arange(B) * q).astype(np.int32), device=b.device)
    gdn_verify(inp["q"], inp["k"], inp["v"], state, slot_ids, cu_q, out, prev,
               a=inp["a"], b=inp["b"], A_log=inp["A_log"], dt_bias=inp["dt_bias"],
               qk_l2norm=True, layout=layout, check_indices=False, stream=b.stream)

    def fused():
        gdn_verify(inp["q"], inp["k"], inp["v"], state, slot_ids, cu_q, out, journal,
                   a=inp["a"], b=inp["b"], A_log=inp["A_log"], dt_bias=inp["dt_bias"],
                   qk_l2norm=True, layout=layout, check_indices=False, stream=b.stream,
                   pending_journal=prev, pending_row0=row0, pending_len=acc)
    return verify, commit, fused


@bench("gdn_round")
def bench_gdn_round(b: Bench):
    from ..ops import gdn as gdn_ops
    for B, q, Hk, Hv, D, sdt, layout in ((64, 4, 16, 32, 128, "float32", "kv"),
                                        (64, 4, 16, 32, 128, "float32", "vk"),
                                        (64, 4, 16, 32, 128, "bfloat16", "kv"),
                                        (64, 4, 16, 32, 128, "bfloat16", "vk"),
                                        (64, 4, 16, 32, 128, "float16", "kv"),
                                        (64, 4, 16, 32, 128, "float16", "vk"),
                                        (1, 4, 16, 32, 128, "float32", "kv"),
                                        (1, 4, 16, 32, 128, "float32", "vk"),
                                        (1, 4, 16, 32, 128, "bfloat16", "kv"),
                                        (1, 4, 16, 32, 128, "bfloat16", "vk")):
        for fam in _families(sdt):
            gdn_ops.TUNING["mma16"] = fam == "mma"
            try:
                _round_case(b, gdn_ops, B, q, Hk, Hv, D, sdt, layout, fam)
            finally:
                gdn_ops.TUNING["mma16"] = None


def _round_case(b: Bench, gdn_ops, B, q, Hk, Hv, D, sdt, layout, fam):
    """One shape of gdn_round on kernel family ``fam`` (already selected in gdn_ops.TUNING)."""
    impl = FAMILIES[fam]
    verify, commit, fused = gdn_round_calls(b, B, q, Hk, Hv, D, sdt, layout)
    pass_bytes = _pass_bytes(B, Hv, D, sdt)
    shape = f"B={B} q={q} Hk={Hk} Hv={Hv} {D}x{D} {sdt} {layout} state, bf16 in"

    def round_():
        verify()
        commit()
    timer = b.time_graph if B <= 4 else b.time
    ms_v, ms_c, ms_r = timer(verify), timer(commit), timer(round_)
    ideal_ms = 3 * pass_bytes / b.copy_bw() / 1e6
    b.report("gdn_verify", shape, pass_bytes, ms_v, impl=impl)
    b.report("gdn_commit", shape + f" accept={q}", 2 * pass_bytes, ms_c, impl=impl)
    b.report("gdn_round", shape, 3 * pass_bytes, ms_r, impl=impl,
             vs_3_passes=round(ms_r / ideal_ms, 3))
    # fused mode: one call per round (this round's verify + the previous round's commit)
    # moves 2 passes; the bar is stated against 3
    ms_f = timer(fused)
    b.report("gdn_round", shape + " fused mode", 2 * pass_bytes, ms_f, impl=impl,
             vs_3_passes=round(ms_f / ideal_ms, 3), vs_2_passes=round(ms_f / ideal_ms * 1.5, 3))
    if gdn_ops._small_batch(B, Hv):  # the small-batch path above; the default shape for comparison
        gdn_ops.TUNING["small_heads"] = 0
        try:
            b.report("gdn_verify", shape + " default shape", pass_bytes, timer(verify), impl=impl)
            b.report("gdn_commit", shape + f" accept={q} default shape", 2 * pass_bytes, timer(commit),
                     impl=impl)
            b.report("gdn_round", shape + " default shape", 3 * pass_bytes, timer(round_), impl=impl)
            b.report("gdn_round", shape + " fused mode, default shape", 2 * pass_bytes, timer(fused),
                     impl=impl)
        finally:
            gdn_ops.TUNING["small_heads"] = None
    if fam == "mma" or layout == "vk" and sdt != "float32":
        return                       # the sweeps below: as before (CUDA-core kernels)
    if B == 64 and sdt == "float32":
        for w in (1, 2, 4, 8):       # launch-shape sweep (warps per CTA)
            gdn_ops.TUNING["warps"] = w
            try:
                if layout == "kv":
                    b.report("gdn_round", shape + f" warps={w}", 3 * pass_bytes, b.time(round_))
                if w > 1:
                    b.report("gdn_round", shape + f" fused mode warps={w}", 2 * pass_bytes,
                             b.time(fused))
            except Exception as e:   # an invalid shape for this Dv: say so, go on
                print(f"  warps={w}: {e}")
        gdn_ops.TUNING["warps"] = None
    if B == 64:                      # L2 prefetch flipped from its default (gdn.cu)
        gdn_ops.TUNING["l2_prefetch"] = sdt == "float32"
        flip = "with L2 prefetch" if sdt == "float32" else "no L2 prefetch"
        try:
            b.report("gdn_verify", shape + f" {flip}", pass_bytes, b.time(verify))
            b.report("gdn_commit", shape + f" accept={q} {flip}", 2 * pass_bytes,
                     b.time(commit))
            b.report("gdn_round", shape + f" {flip}", 3 * pass_bytes, b.time(round_))
            gdn_ops.TUNING["l2_prefetch"] = False   # (on by default in fused mode)
            b.report("gdn_round", shape + " fused mode, no L2 prefetch", 2 * pass_bytes,
                     b.time(fused))
        finally:
            gdn_ops.TUNING["l2_prefetch"] = None
    if B == 64 and sdt == "float32" and layout == "kv":
        _fla_peer_isolated(b, B, q, Hk, Hv, D, pass_bytes, shape)


@bench("gdn_sweep", default=False)
def bench_gdn_sweep(b: Bench):
    """The transactional round (verify + commit, accept q) and the fused round over the issue-20
    grid, each against 3 state passes at the copy bandwidth (the fused one also against its own
    2); B <= 8 as CUDA-graph replays. One state buffer per (dtype, Hv, B), shared by the layouts,
    q and kernel families (one random slot repeated: the timing does not depend on the values)."""
    from ..arrays import DeviceArray
    from ..dtypes import to_host_storage
    from ..ops import gdn as gdn_ops
    D = 128
    rng = np.random.default_rng(6)
    for sdt in ("float32", "bfloat16", "float16"):
        for Hv in (32, 64):
            Hk = Hv // 2
            one = to_host_storage((0.5 * rng.standard_normal((1, Hv, D, D))).astype(np.float32), sdt)
            for B in (1, 8, 32, 64, 128, 256):
                state = DeviceArray.from_numpy(np.ascontiguousarray(np.broadcast_to(one, (B, Hv, D, D))),
                                               dtype=sdt, device=b.device)
                pass_bytes = _pass_bytes(B, Hv, D, sdt)
                ideal_ms = 3 * pass_bytes / b.copy_bw() / 1e6
                for layout in ("kv", "vk"):
                    for q in (2, 4, 8):
                        for fam in _families(sdt):
                            gdn_ops.TUNING["mma16"] = fam == "mma"
                            try:
                                ms_r, ms_f = _sweep_times(b, B, q, Hk, Hv, D, sdt, layout, state)
                            finally:
                                gdn_ops.TUNING["mma16"] = None
                            shape = f"B={B} q={q} Hk={Hk} Hv={Hv} {D}x{D} {sdt} {layout}"
                            b.report("gdn_sweep", shape, 3 * pass_bytes, ms_r, impl=FAMILIES[fam],
                                     mode="verify+commit", vs_3_passes=round(ms_r / ideal_ms, 3))
                            b.report("gdn_sweep", shape + " fused", 2 * pass_bytes, ms_f,
                                     impl=FAMILIES[fam], mode="fused",
                                     vs_3_passes=round(ms_f / ideal_ms, 3),
                                     vs_2_passes=round(ms_f / ideal_ms * 1.5, 3))
                del state


def _sweep_times(b: Bench, B, q, Hk, Hv, D, sdt, layout, state):
    """(transactional round ms, fused round ms) of one sweep point."""
    verify, commit, fused = gdn_round_calls(b, B, q, Hk, Hv, D, sdt, layout, state=state)

    def round_():
        verify()
        commit()
    if B <= 8:
        return b.time_graph(round_, repeats=3), b.time_graph(fused, repeats=3)
    return (b.time(round_, iters=10, repeats=3, warmup=2),
            b.time(fused, iters=10, repeats=3, warmup=2))


def _fla_peer_isolated(b: Bench, *args):
    """_fla_peer in a spawned child process with its own CUDA context (and its own copy
    bandwidth measurement); its rows are added to ``b``'s. fla-core 0.6.0's state-per-row mode
    hit an illegal address inside its own Triton kernel on the H200 (session 3: on the 4th
    chained one-token call, with CUDA_LAUNCH_BLOCKING=1 and no specdec kernel in that
    process), which kills the context it runs in: the benchmarks after it must not die too."""
    import multiprocessing as mp
    import queue
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_fla_peer_child, args=(b.device, out, args), daemon=True)
    child.start()
    try:
        rows = out.get(timeout=900)
    except queue.Empty:
        rows = []
        print("  fla peer: no answer from the child process")
    child.join(timeout=60)
    for r in rows:
        r["process"] = "child"
        b.rows.append(r)


def _fla_peer_child(device, out, args):
    rows = []
    try:
        b = Bench(device)
        rows = b.rows
        _fla_peer(b, *args)
    except Exception as e:   # reported, never raised: the parent waits for the rows
        print(f"  fla peer failed: {type(e).__name__}: {e}", flush=True)
    finally:
        out.put(rows)


def _fla_peer(b: Bench, B, q, Hk, Hv, D, pass_bytes, shape):
    try:
        import torch
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as e:   # not installed here: say so and move on
        print(f"  fla peer skipped: {type(e).__name__}: {e}")
        return
    dev = torch.device("cuda", b.device)
    T = B * q
    g = torch.Generator(device=dev).manual_seed(0)
    qt = torch.randn(1, T, Hk, D, device=dev, dtype=torch.bfloat16, generator=g)
    kt = torch.nn.functional.normalize(torch.randn(1, T, Hk, D, device=dev, dtype=torch.bfloat16,
                                                   generator=g), dim=-1)
    vt = torch.randn(1, T, Hv, D, device=dev, dtype=torch.bfloat16, generator=g)
    gt = -torch.rand(1, T, Hv, device=dev, dtype=torch.float32, generator=g)
    bt = torch.rand(1, T, Hv, device=dev, dtype=torch.bfloat16, generator=g)
    h0 = torch.randn(B, Hv, D, D, device=dev, dtype=torch.float32, generator=g)
    cu = torch.arange(B + 1, device=dev, dtype=torch.int32) * q
    if Hk != Hv:   # fla versions without GVA: give it per-value-head q/k (its reads grow)
        try:
            fused_recurrent_gated_delta_rule(qt[:, :q], kt[:, :q], vt[:, :q], gt[:, :q], bt[:, :q],
                                             initial_state=h0[:1], output_final_state=True,
                                             cu_seqlens=cu[:2])
        except Exception:
            qt = qt.repeat_interleave(Hv // Hk, dim=2)
            kt = kt.repeat_interleave(Hv // Hk, dim=2)
    s = torch.cuda.ExternalStream(b.stream)

    def one_pass():
        with torch.cuda.stream(s):
            fused_recurrent_gated_delta_rule(qt, kt, vt, gt, bt, initial_state=h0,
                                             output_final_state=True, cu_seqlens=cu)

    rows = [cu[:-1] + i for i in range(q)]
    qs = [(qt[:, r], kt[:, r], vt[:, r], gt[:, r], bt[:, r]) for r in rows]
    one = torch.arange(B + 1, device=dev, dtype=torch.int32)

    def per_row():   # vLLM-style: a state written for every block row
        with torch.cuda.stream(s):
            h = h0
            for a in qs:
                _, h = fused_recurrent_gated_delta_rule(*a, initial_state=h, output_final_state=True,
                                                        cu_seqlens=one)
    try:
        b.report("gdn_round", shape + " final state", 2 * pass_bytes, b.time(one_pass),
                 impl="fla fused_recurrent")
        b.report("gdn_round", shape + " state per row", 2 * q * pass_bytes, b.time(per_row),
                 impl="fla fused_recurrent")
    except Exception as e:
        print(f"  fla peer failed: {type(e).__name__}: {e}")
