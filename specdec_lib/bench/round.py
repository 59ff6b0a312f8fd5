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
            workspace=x["sample_ws"], **s)),
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
