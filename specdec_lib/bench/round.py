"""Benchmark of a whole round:

  round_host     host microseconds to launch one speculative round's library ops at B=64
                 (k=3, one attention and one GDN/conv layer; no synchronisation), per op
                 and in total: through DeviceArray arguments, and through cupy arrays and
                 the orchestrator's cuda backend (skipped, with a message, when cupy is
                 missing). Also the device time of the round replayed as a CUDA graph.
"""
from __future__ import annotations

import statistics

import numpy as np

from ._harness import Bench, bench

# one round at B=64, k=3: q=4 rows per sequence; one layer of each kind
_B, _K = 64, 3
_HQ, _HKV, _D, _PAGE, _L = 32, 8, 128, 16, 1024
_HK, _HV, _DK = 16, 32, 128
_VOCAB, _HID = 32000, 4096


def _round_buffers(asarray, zeros, empty):
    """Every buffer one round touches, made with the given array constructors (numpy
    data in, device arrays out)."""
    from ..ops import gdn_journal_width, spec_sample_workspace_size
    B, K = _B, _K
    q = K + 1
    T = B * q
    rng = np.random.default_rng(0)
    max_pages = (_L + 64 * q) // _PAGE + 1
    conv_dim = 2 * _HK * _DK + _HV * _DK
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    x = dict(
        last_token=asarray(rng.integers(0, _VOCAB, B).astype(np.int32)),
        draft_tokens=asarray(rng.integers(0, _VOCAB, (B, K)).astype(np.int32)),
        num_draft=asarray(np.full(B, K, np.int32)),
        seq_lens=asarray(np.full(B, _L, np.int32)),
        cu_q=asarray((np.arange(B + 1) * q).astype(np.int32)),
        block_tokens=zeros((T,), "int32"), positions=zeros((T,), "int32"),
        draft_ids=zeros((B * K,), "int32"),
        k=asarray(f(T, _HKV, _D).astype(np.float16)), v=asarray(f(T, _HKV, _D).astype(np.float16)),
        k_cache=zeros((B * max_pages, _PAGE, _HKV, _D), "float16"),
        v_cache=zeros((B * max_pages, _PAGE, _HKV, _D), "float16"),
        page_table=asarray(np.arange(B * max_pages, dtype=np.int32).reshape(B, max_pages)),
        finished=zeros((B,), "uint8"),
        q=asarray(f(T, _HQ, _D).astype(np.float16)), attn_out=empty((T, _HQ, _D), "float16"),
        conv_x=asarray(f(T, conv_dim)), conv_w=asarray(f(conv_dim, 4)),
        conv_state=zeros((B, conv_dim, 3), "float32"), conv_out=empty((T, conv_dim), "float32"),
        slot_ids=asarray(np.arange(B, dtype=np.int32)),
        gq=asarray(f(T, _HK, _DK)), gk=asarray(f(T, _HK, _DK)), gv=asarray(f(T, _HV, _DK)),
        ga=asarray(f(T, _HV)), gb=asarray(f(T, _HV)),
        A_log=asarray(rng.uniform(-2, 0.5, _HV).astype(np.float32)),
        dt_bias=asarray(rng.uniform(-1, 1, _HV).astype(np.float32)),
        state=zeros((B, _HV, _DK, _DK), "float32"), gdn_out=empty((T, _HV, _DK), "float32"),
        journal=empty((T, gdn_journal_width(_HK, _HV, _DK, _DK)), "float32"),
        logits=asarray(f(T, _VOCAB)),
        temperature=zeros((B,), "float32"), top_k=zeros((B,), "int32"),
        top_p=asarray(np.ones(B, np.float32)), min_p=zeros((B,), "float32"),
        seed=asarray(np.arange(B, dtype=np.int64)), step=zeros((B,), "int64"),
        num_accepted=zeros((B,), "int32"), emitted=zeros((B, q), "int32"),
        status=zeros((B,), "int32"),
        sample_ws=empty((spec_sample_workspace_size(T, _VOCAB),), "uint8"),
        out_tokens=zeros((B, 512), "int32"), out_lens=zeros((B,), "int32"),
        stop_ids=asarray(np.full((B, 4), -1, np.int32)),
        stop_seqs=asarray(np.full((B, 2, 4), -1, np.int32)),
        max_new=asarray(np.full(B, 1 << 30, np.int32)), accept_len=zeros((B,), "int32"),
        hidden=asarray(f(T, _HID).astype(np.float16)), carry=empty((B, _HID), "float16"),
        embed=asarray(f(_VOCAB, _HID).astype(np.float16)),
        norm_e=asarray(f(_HID).astype(np.float16)), norm_h=asarray(f(_HID).astype(np.float16)),
        combined=empty((B, 2 * _HID), "float16"),
    )
    return x


def _round_steps(ops, x, stream):
    """[(name, fn)] of one round in the orchestrator's order; index checks off (no host
    copies: the graph-capturable configuration)."""
    s = dict(stream=stream)
    nc = dict(check_indices=False, **s)
    return [
        ("seq_build_block", lambda: ops.seq_build_block(
            x["last_token"], x["draft_tokens"], x["num_draft"], x["seq_lens"], x["cu_q"],
            x["block_tokens"], x["positions"], x["draft_ids"], **s)),
        ("append_kv", lambda: ops.append_kv(
            x["k"], x["v"], x["k_cache"], x["v_cache"], x["page_table"], x["seq_lens"], x["cu_q"],
            x["finished"], **nc)),
        ("verify_attention", lambda: ops.verify_attention(
            x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["seq_lens"], x["cu_q"],
            x["attn_out"], **nc)),
        ("conv1d_verify", lambda: ops.conv1d_verify(
            x["conv_x"], x["conv_w"], x["conv_state"], x["slot_ids"], x["cu_q"], x["conv_out"],
            **nc)),
        ("gdn_verify", lambda: ops.gdn_verify(
            x["gq"], x["gk"], x["gv"], x["state"], x["slot_ids"], x["cu_q"], x["gdn_out"],
            x["journal"], a=x["ga"], b=x["gb"], A_log=x["A_log"], dt_bias=x["dt_bias"],
            qk_l2norm=True, **nc)),
        ("spec_sample", lambda: ops.spec_sample(
            x["logits"], x["cu_q"], x["draft_ids"], x["temperature"], x["top_k"], x["top_p"],
            x["min_p"], x["seed"], x["step"], x["num_accepted"], x["emitted"], x["status"],
            workspace=x["sample_ws"], **nc)),
        ("seq_stop", lambda: ops.seq_stop(
            x["emitted"], x["num_accepted"], x["out_tokens"], x["out_lens"], x["stop_ids"],
            x["stop_seqs"], x["max_new"], x["accept_len"], x["finished"], **s)),
        ("gdn_commit", lambda: ops.gdn_commit(
            x["state"], x["slot_ids"], x["cu_q"], x["accept_len"], x["journal"], **nc)),
        ("conv1d_commit", lambda: ops.conv1d_commit(
            x["conv_state"], x["slot_ids"], x["cu_q"], x["accept_len"], x["conv_x"], **nc)),
        ("seq_advance", lambda: ops.seq_advance(
            x["emitted"], x["accept_len"], x["seq_lens"], x["out_tokens"], x["out_lens"],
            x["last_token"], x["finished"], **s)),
        ("draft_carry", lambda: ops.draft_carry(x["hidden"], x["cu_q"], x["accept_len"],
                                                x["carry"], **s)),
        ("draft_combine", lambda: ops.draft_combine(
            x["embed"], x["carry"], x["norm_e"], x["norm_h"], x["combined"],
            token_ids=x["last_token"], unit_offset=True, **s)),
    ]


def _host_row(b: Bench, impl, what, us):
    row = {"op": "round_host", "impl": impl, "shape": what, "host_us": round(us, 2)}
    b.rows.append(row)
    print(f"  {'round_host':<18} {impl:<22} {what:<48} {us:>10.2f} us host", flush=True)


def _time_round(b: Bench, impl, steps, seq_lens_reset):
    """Per-op and whole-round host time (median of 5 x 20 calls, no sync between calls)."""
    label = f"B={_B} k={_K}"
    for name, fn in steps:
        us = statistics.median(b.host_us(fn, n=20) for _ in range(5))
        _host_row(b, impl, f"{name} {label}", us)
        seq_lens_reset()

    def round_():
        for _, fn in steps:
            fn()
    us = statistics.median(b.host_us(round_, n=20) for _ in range(5))
    seq_lens_reset()
    _host_row(b, impl, f"whole round ({len(steps)} ops) {label}", us)
    return round_


@bench("round_host")
def bench_round_host(b: Bench):
    from .. import ops
    from ..arrays import DeviceArray
    d = b.device
    # 1) DeviceArray arguments on the bench stream
    x = _round_buffers(lambda a: DeviceArray.from_numpy(a, device=d),
                       lambda s, t: DeviceArray.empty(s, t, d).fill_bytes(0),
                       lambda s, t: DeviceArray.empty(s, t, d))
    b.drv.stream_synchronize(0)   # fill_bytes ran on the legacy stream; b.stream is non-blocking
    L0 = np.full(_B, _L, np.int32)

    def reset():   # keep L (advanced by seq_advance) inside the page table
        b.drv.stream_synchronize(b.stream)
        x["seq_lens"].copy_from_numpy(L0)
        x["out_lens"].copy_from_numpy(np.zeros(_B, np.int32))
        x["finished"].copy_from_numpy(np.zeros(_B, np.uint8))
    steps = _round_steps(ops, x, b.stream)
    round_ = _time_round(b, "DeviceArray", steps, reset)
    try:   # device time of the round replayed from a CUDA graph (no host work at all)
        ms = b.time_graph(round_, per_graph=1)
        reset()
        _host_row(b, "DeviceArray", f"round as CUDA graph: device time B={_B} k={_K}", ms * 1e3)
        # host time of a replayed round: what SpeculativeDecoder(cuda_graph=True) pays
        b.drv.graph_capture_begin(b.stream)
        try:
            round_()
        finally:
            g, ge = b.drv.graph_capture_end(b.stream)
        try:
            us = statistics.median(b.host_us(lambda: b.drv.graph_launch(ge, b.stream), n=20)
                                   for _ in range(5))
        finally:
            b.drv.stream_synchronize(b.stream)
            b.drv.graph_destroy(g, ge)
        reset()
        _host_row(b, "DeviceArray", f"round as CUDA graph: host time of one launch B={_B} k={_K}",
                  us)
    except Exception as e:
        print(f"  round_host: graph capture of the round failed: {type(e).__name__}: {e}")
    reset()
    # 2) cupy arrays through the orchestrator's cuda backend (what SpeculativeDecoder pays)
    try:
        import cupy
    except Exception as e:
        print(f"  round_host (cupy / orchestrator cuda backend) skipped: cupy does not import "
              f"({type(e).__name__}: {e})")
        return
    from ..orchestrator import cuda_backend
    with cupy.cuda.Device(d):
        be = cuda_backend(d)
        cx = _round_buffers(cupy.asarray, lambda s, t: cupy.zeros(s, dtype=t),
                            lambda s, t: cupy.empty(s, dtype=t))

        def creset():
            be.synchronize()
            cx["seq_lens"][...] = int(_L)
            cx["out_lens"][...] = 0
            cx["finished"][...] = 0
            be.synchronize()
        _time_round(b, "cupy+cuda_backend", _round_steps_backend(be, cx), creset)


def _round_steps_backend(be, x):
    """The same round through the orchestrator backend's partials (stream bound there)."""
    class _Ops:
        def __getattr__(self, name):
            fn = getattr(be, name)

            def call(*a, stream=None, **kw):   # drop our stream: the partial has cupy's
                return fn(*a, **kw)
            return call
    return _round_steps(_Ops(), x, None)


# ---------------------------------------------------------------- batch 1, a whole hybrid round
# Qwen3-Next-80B-A3B's shapes: 48 layers, three GDN to one attention; hidden 2048; GDN Hk=16
# Hv=32 Dk=Dv=128 (f32 state); attention 16/2 heads of 256; vocabulary 151936; MoE experts of
# 512 (10 routed + 1 shared: silu_mul over 11 rows of 512 per block row). One sequence, k=3.
_B1 = dict(layers=48, attn_every=4, H=2048, HK=16, HV=32, DK=128, HQ=16, HKV=2, D=256,
           V=151936, experts=11, I=512, L=1000, page=16, k=3)


def _b1_round(d, fused=False):
    """(buffers, [(name, fn(stream))]) of one B=1 round of library ops: per layer the input
    rms_norm (residual fused), GDN (conv1d_verify, gdn_verify) or attention (rope_append_kv,
    verify_attention), the post rms_norm, the experts' silu_mul; then the final norm,
    spec_sample, seq_stop, every GDN layer's gdn_commit + conv1d_commit, seq_advance,
    draft_carry and draft_combine (the MTP head's input; the head's own layer is left out).
    The host model's GEMMs, MoE routing and GDN output gate are not library ops: not here.
    ``fused``: the GDN layers' verifies in fused mode (each first commits the previous
    round's accepted rows: its x / a second journal, accept_len rows) and no commits."""
    from .. import ops
    from ..arrays import DeviceArray
    from ..reference.layers import rope_cos_sin_cache
    c = _B1
    q = c["k"] + 1
    rng = np.random.default_rng(1)
    put = lambda a, dt=None: DeviceArray.from_numpy(a, dtype=dt, device=d)  # noqa: E731
    zeros = lambda s, t: DeviceArray.empty(s, t, d).fill_bytes(0)           # noqa: E731
    f = lambda *s: rng.standard_normal(s).astype(np.float32)                 # noqa: E731
    bf = lambda *s: put(f(*s), "bfloat16")                                   # noqa: E731
    H, HK, HV, DK = c["H"], c["HK"], c["HV"], c["DK"]
    conv_dim = 2 * HK * DK + HV * DK
    pages = (c["L"] + 1024) // c["page"] + 1     # room for the replays' seq_advance
    x = dict(seq_lens=put(np.array([c["L"]], np.int32)), cu_q=put(np.array([0, q], np.int32)),
             slot=put(np.zeros(1, np.int32)), finished=zeros((1,), "uint8"),
             page_table=put(np.arange(pages, dtype=np.int32).reshape(1, pages)),
             positions=put(np.arange(c["L"], c["L"] + q, dtype=np.int32)),
             last_token=put(np.array([7], np.int32)), draft_tokens=put(np.array([[1, 2, 3]], np.int32)),
             num_draft=put(np.array([c["k"]], np.int32)), block_tokens=zeros((q,), "int32"),
             draft_ids=zeros((c["k"],), "int32"),
             h=bf(q, H), res=bf(q, H), hn=zeros((q, H), "bfloat16"), norm_w=bf(H),
             mlp_x=bf(q * c["experts"], 2 * c["I"]), mlp_out=zeros((q * c["experts"], c["I"]), "bfloat16"),
             cos_sin=put(np.asarray(rope_cos_sin_cache(c["L"] + 1024, c["D"], 1e7), np.float32)),
             logits=bf(q, c["V"]), temperature=zeros((1,), "float32"), top_k=zeros((1,), "int32"),
             top_p=put(np.ones(1, np.float32)), min_p=zeros((1,), "float32"),
             seed=put(np.array([5], np.int64)), step=zeros((1,), "int64"),
             num_accepted=zeros((1,), "int32"), emitted=zeros((1, q), "int32"), status=zeros((1,), "int32"),
             sample_ws=zeros((ops.spec_sample_workspace_size(q, c["V"]),), "uint8"),
             out_tokens=zeros((1, 4096), "int32"), out_lens=zeros((1,), "int32"),
             stop_ids=put(np.full((1, 2), -1, np.int32)), stop_seqs=put(np.full((1, 1, 2), -1, np.int32)),
             max_new=put(np.array([1 << 30], np.int32)), accept_len=zeros((1,), "int32"),
             carry=zeros((1, H), "bfloat16"), combined=zeros((1, 2 * H), "bfloat16"),
             embed=bf(1024, H),   # (one row of the embedding is read)
             # the split-KV workspace a B=1 caller gives (without it the op runs unsplit)
             attn_ws=zeros((ops.verify_attention_workspace_size(
                 q, c["HQ"], c["HKV"], c["D"], 1, pages * c["page"], device=d),), "uint8"))
    gdn_layers, attn_layers = [], []
    for i in range(c["layers"]):
        if (i + 1) % c["attn_every"]:
            gdn_layers.append(dict(
                conv_x=bf(q, conv_dim), conv_w=bf(conv_dim, 4), conv_out=zeros((q, conv_dim), "bfloat16"),
                conv_state=zeros((1, conv_dim, 3), "bfloat16"),
                gq=bf(q, HK, DK), gk=bf(q, HK, DK), gv=bf(q, HV, DK), ga=bf(q, HV), gb=bf(q, HV),
                A_log=put(rng.uniform(-2, 0.5, HV).astype(np.float32)),
                dt_bias=put(rng.uniform(-1, 1, HV).astype(np.float32)),
                state=zeros((1, HV, DK, DK), "float32"), out=zeros((q, HV, DK), "bfloat16"),
                journal=zeros((q, ops.gdn_journal_width(HK, HV, DK, DK)), "float32"),
                # the previous round's journal (fused mode: a second buffer)
                journal_prev=zeros((q, ops.gdn_journal_width(HK, HV, DK, DK)), "float32")))
        else:
            attn_layers.append(dict(
                q=bf(q, c["HQ"], c["D"]), k=bf(q, c["HKV"], c["D"]), v=bf(q, c["HKV"], c["D"]),
                k_cache=zeros((pages, c["page"], c["HKV"], c["D"]), "bfloat16"),
                v_cache=zeros((pages, c["page"], c["HKV"], c["D"]), "bfloat16"),
                out=zeros((q, c["HQ"], c["D"]), "bfloat16")))
    nc = dict(check_indices=False)
    row0 = zeros((1,), "int32")

    def pend(journal):   # fused mode's pending rows: accept_len rows of the previous round
        return dict(pending_journal=journal, pending_row0=row0, pending_len=x["accept_len"]) \
            if fused else {}
    steps = [("seq_build_block", lambda s: ops.seq_build_block(
        x["last_token"], x["draft_tokens"], x["num_draft"], x["seq_lens"], x["cu_q"],
        x["block_tokens"], x["positions"], x["draft_ids"], stream=s))]
    norm = ("rms_norm", lambda s: ops.rms_norm(x["h"], x["norm_w"], x["hn"], residual=x["res"],
                                               residual_out=x["res"], stream=s))
    mlp = ("silu_mul", lambda s: ops.silu_mul(x["mlp_x"], x["mlp_out"], stream=s))
    gi = ai = 0
    for i in range(c["layers"]):
        steps.append(norm)
        if (i + 1) % c["attn_every"]:
            g = gdn_layers[gi]
            gi += 1
            steps += [("conv1d_verify", lambda s, g=g: ops.conv1d_verify(
                          g["conv_x"], g["conv_w"], g["conv_state"], x["slot"], x["cu_q"],
                          g["conv_out"], stream=s, **nc, **pend(g["conv_x"]))),
                      ("gdn_verify", lambda s, g=g: ops.gdn_verify(
                          g["gq"], g["gk"], g["gv"], g["state"], x["slot"], x["cu_q"], g["out"],
                          g["journal"], a=g["ga"], b=g["gb"], A_log=g["A_log"],
                          dt_bias=g["dt_bias"], qk_l2norm=True, stream=s, **nc,
                          **pend(g["journal_prev"])))]
        else:
            a = attn_layers[ai]
            ai += 1
            steps += [("rope_append_kv", lambda s, a=a: ops.rope_append_kv(
                          a["q"], a["k"], a["v"], x["positions"], x["cos_sin"], a["k_cache"],
                          a["v_cache"], x["page_table"], x["seq_lens"], x["cu_q"], x["finished"],
                          stream=s, **nc)),
                      ("verify_attention", lambda s, a=a: ops.verify_attention(
                          a["q"], a["k_cache"], a["v_cache"], x["page_table"], x["seq_lens"],
                          x["cu_q"], a["out"], workspace=x["attn_ws"], max_q=q, stream=s, **nc))]
        steps += [norm, mlp]
    steps += [norm, ("spec_sample", lambda s: ops.spec_sample(
        x["logits"], x["cu_q"], x["draft_ids"], x["temperature"], x["top_k"], x["top_p"],
        x["min_p"], x["seed"], x["step"], x["num_accepted"], x["emitted"], x["status"],
        workspace=x["sample_ws"], stream=s, **nc)),
        ("seq_stop", lambda s: ops.seq_stop(
            x["emitted"], x["num_accepted"], x["out_tokens"], x["out_lens"], x["stop_ids"],
            x["stop_seqs"], x["max_new"], x["accept_len"], x["finished"], stream=s))]
    for g in gdn_layers if not fused else ():
        steps += [("gdn_commit", lambda s, g=g: ops.gdn_commit(
                      g["state"], x["slot"], x["cu_q"], x["accept_len"], g["journal"], stream=s, **nc)),
                  ("conv1d_commit", lambda s, g=g: ops.conv1d_commit(
                      g["conv_state"], x["slot"], x["cu_q"], x["accept_len"], g["conv_x"], stream=s, **nc))]
    steps += [("seq_advance", lambda s: ops.seq_advance(
                  x["emitted"], x["accept_len"], x["seq_lens"], x["out_tokens"], x["out_lens"],
                  x["last_token"], x["finished"], stream=s)),
              ("draft_carry", lambda s: ops.draft_carry(x["h"], x["cu_q"], x["accept_len"], x["carry"],
                                                        stream=s)),
              ("draft_combine", lambda s: ops.draft_combine(
                  x["embed"], x["carry"], x["norm_w"], x["norm_w"], x["combined"],
                  token_ids=x["last_token"], stream=s))]
    return x, steps


def _b1_setup(b: Bench, fused=False):
    """The round's ``steps`` (``_b1_round`` on b.device) and ``reset()``: it waits for
    b.stream, then puts back what the round's replays advance (seq_lens, out_lens, finished),
    so the next replays stay inside the page table."""
    x, steps = _b1_round(b.device, fused)
    b.drv.stream_synchronize(0)
    L0 = np.array([_B1["L"]], np.int32)

    def reset():
        b.drv.stream_synchronize(b.stream)
        x["seq_lens"].copy_from_numpy(L0)
        x["out_lens"].copy_from_numpy(np.zeros(1, np.int32))
        x["finished"].copy_from_numpy(np.zeros(1, np.uint8))
    return steps, reset


def _b1_label():
    from .. import runtime
    c = _B1
    off = runtime.pdl_off_prefixes()   # the label names an A/B's plain-launch set
    return (f"B=1 k={c['k']} {c['layers']} layers (3 GDN : 1 attn) H={c['H']} V={c['V']}"
            + (f" PDL off: {','.join(off)}" if off else ""))


def _floor_copy(b: Bench):
    """``fn()``: one one-element ``copy`` kernel on b.stream (the launch floor's kernel)."""
    from .. import ops
    from ..arrays import DeviceArray
    one_a = DeviceArray.empty((1,), "int32", b.device).fill_bytes(0)
    one_b = DeviceArray.empty((1,), "int32", b.device).fill_bytes(0)
    b.drv.stream_synchronize(0)
    return lambda: ops.copy(one_a, one_b, stream=b.stream)


def _graph_round(b: Bench, steps, reset) -> float:
    """Median ms of the round's ``steps`` replayed as one graph (``reset`` before and after)."""
    def round_():
        for _, fn in steps:
            fn(b.stream)
    reset()
    ms = b.time_graph(round_, per_graph=1, repeats=9)
    reset()
    return ms


@bench("round_b1")
def bench_round_b1(b: Bench):
    """One B=1 round of a Qwen3-Next-like hybrid (``_b1_round``), replayed as one CUDA graph;
    each op alone (a graph of 20 calls of it: us per call, times its count in the round);
    the launch floor beside it (a graph of one-element ``copy`` kernels)."""
    steps, reset = _b1_setup(b)
    label = _b1_label()
    floor = b.time_graph(_floor_copy(b), per_graph=100)
    ms = _graph_round(b, steps, reset)
    n = len(steps)
    b.rows.append({"op": "round_b1", "impl": "specdec_lib", "shape": label, "us": round(ms * 1e3, 1),
                   "launches": n, "floor_us": round(floor * 1e3, 3),
                   "floor_x_launches_us": round(floor * 1e3 * n, 1)})
    print(f"  round_b1 {label}: {ms * 1e3:.1f} us per round as one graph, {n} launches; "
          f"launch floor {floor * 1e3:.2f} us per kernel ({floor * 1e3 * n:.1f} us for {n})", flush=True)
    counts, first = {}, {}
    for name, fn in steps:
        counts[name] = counts.get(name, 0) + 1
        first.setdefault(name, fn)
    total = 0.0
    for name, fn in first.items():
        us = b.time_graph(lambda: fn(b.stream), per_graph=20) * 1e3
        reset()
        total += us * counts[name]
        b.rows.append({"op": "round_b1_op", "impl": "specdec_lib", "shape": f"{name} {label}",
                       "us": round(us, 2), "count": counts[name],
                       "us_in_round": round(us * counts[name], 1)})
        print(f"    {name:<18} {us:7.2f} us x {counts[name]:3d} = {us * counts[name]:8.1f} us", flush=True)
    print(f"    {'sum of ops alone':<18} {total:8.1f} us (the graph: {ms * 1e3:.1f} us)", flush=True)
    # the same round with the GDN layers' verifies in fused mode (no commits: 72 launches fewer)
    steps_f, reset_f = _b1_setup(b, fused=True)
    ms_f = _graph_round(b, steps_f, reset_f)
    b.rows.append({"op": "round_b1", "impl": "specdec_lib(fused gdn / conv)", "shape": label,
                   "us": round(ms_f * 1e3, 1), "launches": len(steps_f)})
    print(f"  round_b1 fused gdn / conv: {ms_f * 1e3:.1f} us per round as one graph, "
          f"{len(steps_f)} launches", flush=True)
    for name in ("conv1d_verify", "gdn_verify"):
        fn = next(f for n, f in steps_f if n == name)
        us = b.time_graph(lambda: fn(b.stream), per_graph=20) * 1e3
        reset_f()
        b.rows.append({"op": "round_b1_op", "impl": "specdec_lib(fused)", "shape": f"{name} {label}",
                       "us": round(us, 2), "count": counts[name]})
        print(f"    {name + ' fused':<18} {us:7.2f} us x {counts[name]:3d}", flush=True)
