"""What runs per round with graphs at B=1: a fixed k and ``num_speculative_tokens="auto"``
that chooses the same k make the same backend calls, event for event (``round_trace``).

Both decoders are set up as ``tools/perf/e2e_smollm2.py``'s ``decoder`` / ``one_at_a_time``
(a warm-up call per prompt of 4 new tokens, ``calibrate`` on the first request,
``capture_first``, then one ``serve`` call per request over one slot), on the reference
backend with a fake ``capture`` (``round_trace.TracingBackend``) and ``serve``'s clock ticking
a fixed step per read (``round_trace.fake_clock``: every clean round of any k measures the same
time, so the calibrated ``AutoK`` keeps to k_max). Per call: the same events before the first
round (admission, prefill), per round exactly ``before_round``, one replay of the
(k, k) graph (no timer: a calibrated auto times no round), the one read of ``control``
(``num_accepted``, ``out_lens``, ``finished``) and ``after_round`` for the round before (learnt
while this one runs; none in the first round) (the last round adds the output reads), then the last round's ``after_round`` and one stream synchronisation: no
host->device copy, no capture, no other graph, no sweep at another k inside the timed calls.
(AutoK's live-cost probes, which replay the neighbouring k's graph, do not come in these calls:
the warm-up probed k_max - 1 and doubled the interval past the calls' length.)
Also which ops an eager round of the demo hybrid calls, in fused and plain mode.
"""
import numpy as np
import pytest

from round_trace import TracingBackend, fake_clock, trace_calls
from specdec_lib.models import TinyHybridTarget, TinyMTPDraft
from specdec_lib.orchestrator import AutoK, Request, SpeculativeDecoder

K = 4


class _ReusedTarget(TinyHybridTarget):
    """The demo target with a ``cache_epoch``: a call's state (and its graphs) is kept for
    the next call of the same shape, as SmolLM2's LlamaTarget does."""
    cache_epoch = 0

    def reset(self, batch, max_len):
        super().reset(batch, max_len)
        self.cache_epoch += 1


def _requests(n_new=64):
    rng = np.random.default_rng(1)
    return [Request(prompt=rng.integers(0, 256, n).tolist(), max_new_tokens=n_new)
            for n in (6, 19, 9, 12)]


def _warm(dec, be, reqs, calib):
    """e2e_smollm2.decoder: warm-up calls, calibration, capture_first, metrics reset."""
    with be.quiet():
        for r in reqs:
            dec.generate([Request(prompt=r.prompt, max_new_tokens=4)])
        calibrated = dec.calibrate(calib, slots=1)
    dec.capture_first = True
    dec.reset_metrics()
    return calibrated


def _traces(make_models, reqs, calib, be=None):
    """{spec: (results, trace, decoder)} of a fixed k and of "auto" (each on a backend of its
    own, or both on ``be``)."""
    out = {}
    with fake_clock():
        for spec in (K, "auto"):
            be = be or TracingBackend()
            target, draft = make_models(be)
            dec = SpeculativeDecoder(target, draft, num_speculative_tokens=spec, backend=be,
                                     cuda_graph=True,
                                     max_len=SpeculativeDecoder.positions_needed(reqs + calib, K))
            assert _warm(dec, be, reqs, calib)
            out[spec] = trace_calls(dec, reqs, be) + (dec,)
    return out


def _backend(events):
    return [e for e in events if e[0] != "policy"]


def _check_same_calls(out, reqs):
    (res_f, fixed, dec_f), (res_a, auto, dec_a) = out[K], out["auto"]
    assert [r.tokens for r in res_f] == [r.tokens for r in res_a]
    assert dec_f.metrics.k_rounds == {K: dec_f.metrics.rounds}
    assert dec_a.metrics.k_rounds == dec_f.metrics.k_rounds          # every round at k
    assert dec_a.metrics.capture_s == 0 and not dec_a.spec.sweep
    assert all(p.key == (K, K, None) for p in dec_a.spec.choices[-dec_a.metrics.rounds:])
    assert len(fixed) == len(auto) == len(reqs)
    # the policy learns from a round while the next one runs: after the next replay and the
    # read it enqueues (the first round has nothing to learn from yet; the last round's
    # lesson comes after the loop)
    first = [("policy", "before_round"), ("replay", (K, K, None)), ("read", (3,))]
    plain = first + [("policy", "after_round")]
    for (s_f, r_f, t_f), (s_a, r_a, t_a) in zip(fixed, auto):
        assert _backend(s_f) == _backend(s_a)                 # admission, prefill
        assert len(r_f) == len(r_a)
        for i, (a, b) in enumerate(zip(r_f, r_a)):
            assert _backend(a) == _backend(b), i
            # a fixed k times nothing, nor does a calibrated auto
            assert not any(e[0] == "timer" for e in a + b)
            ev = [e[:2] for e in b]
            want = first if i == 0 else plain
            if i < len(r_a) - 1:
                assert ev == want, (i, b)
            else:           # the request finished: its outputs are read
                assert ev[:len(want)] == want and {e[0] for e in ev[len(want):]} == {"read"}, b
        assert [e[:2] for e in t_f] == [e[:2] for e in t_a] == [("policy", "after_round"),
                                                                ("sync", "stream")]
        assert not any(e[0] in ("capture", "sync", "asarray") for r in r_a for e in r)


def test_auto_at_k_max_makes_the_fixed_k_calls(demo):
    """The demo target (GDN + attention) and its MTP draft (fed the carry)."""
    cfg, tensors, dw = demo
    reqs = _requests()

    def models(be):
        return _ReusedTarget(cfg, tensors, be), TinyMTPDraft(cfg, dw, tensors, be)
    _check_same_calls(_traces(models, reqs, reqs[:1]), reqs)


def test_uncalibrated_auto_sweeps_inside_calls(demo):
    """What the check above rules out: an AutoK not calibrated before the timed calls sweeps
    k inside them, and the rounds show it (other graphs, captured inside the calls, and a
    host->device copy of num_draft where k changes). (Calls too short to hold k_max for
    ``hold`` rounds never get past it: each call's sweep starts again at k_max, so the
    warm-up's 4-token calls measure k_max alone.)"""
    cfg, tensors, dw = demo
    reqs = _requests(40)
    with fake_clock():
        be = TracingBackend()
        target, draft = _ReusedTarget(cfg, tensors, be), TinyMTPDraft(cfg, dw, tensors, be)
        dec = SpeculativeDecoder(target, draft, num_speculative_tokens=AutoK(K), backend=be,
                                 cuda_graph=True,
                                 max_len=SpeculativeDecoder.positions_needed(reqs, K))
        with be.quiet():
            for r in reqs:
                dec.generate([Request(prompt=r.prompt, max_new_tokens=4)])
        assert {k for _, k in dec.spec.measured} == {K}
        dec.capture_first = True
        _, trace = trace_calls(dec, reqs, be)
    events = [e for _, rounds, _ in trace for r in rounds for e in r]
    assert {e[1] for e in events if e[0] == "replay"} > {(K, K, None)}
    assert any(e[0] == "capture" for e in events)
    assert any(e[:2] == ("asarray", (1,)) and e[2].endswith("_set_num_draft") for e in events)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["mtp", "eagle3"])
def test_auto_at_k_max_makes_the_fixed_k_calls_smollm2(method):
    """SmolLM2-135M and a shipped head (its own KV cache, the bucketed prefill replayed), as
    in the H200 benchmark."""
    from toy_models import skip_unless_smollm2
    skip_unless_smollm2()
    from specdec_lib.models import load_smollm2_target, smollm2
    from specdec_lib.models.heads import smollm2_head
    from specdec_lib.models.llama_draft import LlamaDraftHead
    from specdec_lib.models.prompts import stdlib_prompts
    be = TracingBackend()
    with be.quiet():
        target, tok = load_smollm2_target(be, progress=False)
        head = LlamaDraftHead.load(target, smollm2_head(method), method)
    reqs = [Request(prompt=smollm2.chat_prompt(tok, t), max_new_tokens=32)
            for t in stdlib_prompts("heldout")[:2]]
    calib = [Request(prompt=reqs[0].prompt, max_new_tokens=100)]
    try:
        out = _traces(lambda be: (target, head), reqs, calib, be)
    finally:
        target.capture_aux(())
    _check_same_calls(out, reqs)


def test_calibrated_auto_records_its_plans_before_decoding(demo):
    """A calibrated AutoK (given costs) records every plan it may switch to (each (k, k)
    and (k, k +- 1), and their live-rows plans) before a call's first round, so a call that
    moves k records nothing inside its rounds; a FixedK records its one plan at the first
    round, as before."""
    cfg, tensors, dw = demo
    reqs = _requests(40)
    be = TracingBackend()
    target, draft = _ReusedTarget(cfg, tensors, be), TinyMTPDraft(cfg, dw, tensors, be)
    costs = {k: 1.0 + 0.1 * k for k in range(K + 1)}
    dec = SpeculativeDecoder(target, draft, num_speculative_tokens=AutoK(K, costs=costs),
                             backend=be, cuda_graph=True, capture_first=True,
                             max_len=SpeculativeDecoder.positions_needed(reqs, K))
    be.events.clear()
    dec.serve(reqs[:2], slots=2)
    kinds = [e[0] for e in be.events]
    first = kinds.index("replay")
    assert "capture" not in kinds[first:]
    want = {(v, p, None) for v in range(K + 1) for p in (v - 1, v, v + 1) if 0 <= p <= K}
    # and, live rows on (serve.LIVE_ROWS), each verifying plan's live-rows one (2 slots: 1)
    want |= {(v, p, ("live", 1)) for v, p, _ in want if v > 0}
    assert want <= set(dec._state.replays)
    assert kinds[:first].count("capture") >= len(want)
    assert len(set(dec.spec.choices)) > 1            # k moved: every plan was there


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
def test_hybrid_round_ops(demo, fused):
    """The ops an eager round of the demo hybrid calls (2 GDN layers, 2 slots, k=3): a
    conv1d_verify and a gdn_verify a GDN layer; gdn_commit / conv1d_commit a layer only in
    plain mode (fused mode's verifies commit the last round's rows, its commit is copies);
    no flush, and no host read or copy inside a round (graph-capturable) either way."""
    from collections import Counter
    cfg, tensors, dw = demo
    be = TracingBackend()
    target = TinyHybridTarget(cfg, tensors, be, fused_state=fused)
    dec = SpeculativeDecoder(target, TinyMTPDraft(cfg, dw, tensors, be),
                             num_speculative_tokens=3, backend=be, run_ahead=False)
    dec.generate(_requests(12)[:2])
    rounds = dec.metrics.rounds
    in_round = [e for e in be.events if e[2] == "round.py:run_round"]
    ops = Counter(e[1] for e in in_round if e[0] == "op")
    assert ops["gdn_verify"] == ops["conv1d_verify"] == 2 * rounds > 0
    assert ops["gdn_commit"] == ops["conv1d_commit"] == (0 if fused else 2 * rounds)
    assert ops["gdn_flush"] == ops["conv1d_flush"] == 0
    assert {e[0] for e in in_round} == {"op"}
