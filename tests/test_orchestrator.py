"""SpeculativeDecoder end to end on the demo model: lossless greedy decoding, stops,
sampled determinism and distribution (reference backend on CPU; cuda on a GPU)."""
import numpy as np
import pytest

from conftest import needs_gpu, switched
from specdec_lib.models import TinyHybridTarget, TinyMTPDraft
from specdec_lib.orchestrator import Request, SpeculativeDecoder, reference_backend


def _models(demo, be):
    cfg, tensors, dw = demo
    return TinyHybridTarget(cfg, tensors, be), TinyMTPDraft(cfg, dw, tensors, be)


def _prompts(seed, lens, V=256):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, V, n).tolist() for n in lens]


def _decoder(demo, k, run_ahead=True, be=None, cuda_graph=False):
    be = be or reference_backend()
    target, draft = _models(demo, be)
    return SpeculativeDecoder(target, draft if k else None, num_speculative_tokens=k,
                              backend=be, cuda_graph=cuda_graph, run_ahead=run_ahead)


def _run(demo, reqs, k, be=None, cuda_graph=False):
    dec = _decoder(demo, k, be=be, cuda_graph=cuda_graph)
    return dec.generate(reqs), dec.metrics


@pytest.fixture(scope="module")
def baseline(demo):
    reqs = [Request(prompt=p, max_new_tokens=20) for p in _prompts(1, [1, 6, 19, 3])]
    res, _ = _run(demo, reqs, 0)
    return reqs, [r.tokens for r in res]


@pytest.mark.parametrize("k", range(1, 8))
def test_lossless_greedy(demo, baseline, k):
    reqs, want = baseline
    res, m = _run(demo, reqs, k)
    assert [r.tokens for r in res] == want
    assert all(r.finish_reason == "max_length" for r in res)
    assert 0 < m.acceptance_rate < 1          # both acceptance and rejection happened
    assert m.mean_accepted_length > 1


def test_stops_mid_block_and_different_rounds(demo, baseline):
    reqs, want = baseline
    # request 0: stop id = its 7th token; request 1: stop sequence = its tokens 4..5 with the
    # first one before a block boundary (any split works: it is matched against history);
    # request 2: max length 9; request 3: untouched.
    stop_tok = want[0][6]
    first = want[0].index(stop_tok)
    seq = want[1][4:6]
    j = next(i for i in range(1, len(want[1])) if want[1][i - 1:i + 1] == seq)
    new = [Request(prompt=reqs[0].prompt, max_new_tokens=20, stop_token_ids=[stop_tok]),
           Request(prompt=reqs[1].prompt, max_new_tokens=20, stop_sequences=[seq]),
           Request(prompt=reqs[2].prompt, max_new_tokens=9),
           reqs[3]]
    for k in (1, 3, 5):
        res, _ = _run(demo, new, k)
        assert res[0].tokens == want[0][:first + 1] and res[0].finish_reason == "stop_id"
        assert res[1].tokens == want[1][:j + 1] and res[1].finish_reason == "stop_sequence"
        assert res[2].tokens == want[2][:9] and res[2].finish_reason == "max_length"
        assert res[3].tokens == want[3]


def test_ragged_batch_matches_single_requests(demo, baseline):
    reqs, want = baseline
    for b in (0, 2):
        res, _ = _run(demo, [reqs[b]], 4)
        assert res[0].tokens == want[b]


def test_sampled_is_deterministic(demo):
    reqs = [Request(prompt=p, max_new_tokens=12, temperature=1.5, top_k=50, top_p=0.95, seed=s)
            for s, p in enumerate(_prompts(2, [4, 7, 2]))]
    a, _ = _run(demo, reqs, 3)
    b, _ = _run(demo, reqs, 3)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    c, _ = _run(demo, [Request(**{**reqs[0].__dict__, "seed": 99})] + reqs[1:], 3)
    assert c[1:] == a[1:]


def test_first_sampled_token_follows_target_distribution(demo):
    """Chi-square: the first emitted token of N seeds vs softmax(target logits / T)."""
    cfg = demo[0]
    prompt = _prompts(3, [5])[0]
    temp = 3.0
    be = reference_backend()
    target, _ = _models(demo, be)
    target.reset(1, 16)
    T = len(prompt)
    logits, _ = target.forward(np.array(prompt, np.int32), np.arange(T, dtype=np.int32),
                               np.array([0, T], np.int32), np.zeros(1, np.int32),
                               np.zeros(1, np.uint8))
    x = logits[-1].astype(np.float64) / temp
    p = np.exp(x - x.max())
    p /= p.sum()
    N = 600
    reqs = [Request(prompt=prompt, max_new_tokens=1, temperature=temp, seed=s) for s in range(N)]
    res, m = _run(demo, reqs, 2)
    first = np.array([r.tokens[0] for r in res])
    counts = np.bincount(first, minlength=cfg["vocab_size"])
    order = np.argsort(-p)
    exp_, obs = [], []
    acc_e = acc_o = 0.0
    for t in order:                       # merge the tail into bins of expectation >= 5
        acc_e += p[t] * N
        acc_o += counts[t]
        if acc_e >= 5:
            exp_.append(acc_e), obs.append(acc_o)
            acc_e = acc_o = 0.0
    if acc_e:
        exp_[-1] += acc_e
        obs[-1] += acc_o
    exp_, obs = np.array(exp_), np.array(obs)
    chi2 = float(((obs - exp_) ** 2 / exp_).sum())
    dof = len(exp_) - 1
    # chi-square 99.9% quantile, Wilson-Hilferty approximation
    z = 3.09
    crit = dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < crit, (chi2, crit, dof)


def test_serve_continuous_batching_matches_single_runs(demo):
    """Requests arriving over time into 2 slots (slots reused, idle gaps, more requests
    than slots) emit exactly what each request emits when decoded alone."""
    reqs = _mixed_requests(8)
    be = reference_backend()
    target, draft = _models(demo, be)
    dec = SpeculativeDecoder(target, draft, num_speculative_tokens=3, backend=be)
    got = dec.serve(reqs, slots=2, arrivals=[0, 0, 1, 9, 9, 60])
    # (held_rounds: free slots waiting for a second one, PrefillPolicy.hold_rounds)
    assert dec.slot_stats == {"admitted": 6, "released": 6, "max_busy": 2,
                              "held_rounds": 9}
    for r, g in zip(reqs, got):
        alone, _ = _run(demo, [r], 3)
        assert (g.tokens, g.finish_reason) == (alone[0].tokens, alone[0].finish_reason)


@pytest.mark.parametrize("k", [0, 3, "auto"])
def test_run_ahead_changes_no_output(demo, k):
    """A round launched before the last one's outcome is read (run_ahead, the default)
    emits what reading every round first emits: greedy and sampled requests, stops, more
    requests than slots, arrivals over time; at B=1 the metrics' counts are the same too
    (a round run past a reply's end is not counted as a round)."""
    reqs = _mixed_requests(8)
    got = {}
    for ahead in (True, False):
        dec = _decoder(demo, k, ahead)
        served = dec.serve(reqs, slots=2, arrivals=[0, 0, 1, 9, 9, 60])
        stats = dict(dec.slot_stats)
        dec.reset_metrics()
        alone = [dec.generate([r])[0] for r in reqs]
        m = dec.metrics
        got[ahead] = ([(r.tokens, r.finish_reason) for r in served], stats,
                      [(r.tokens, r.finish_reason) for r in alone],
                      (m.rounds, m.accepted, m.proposed, m.accept_counts, m.emitted),
                      m.overrun_rounds)
    if k == "auto":
        # auto's choices follow its measured round times (not reproducible here), and a
        # sampled reply's tokens follow the drafts verified: greedy replies only
        greedy = [i for i, r in enumerate(reqs) if r.temperature == 0]
        for ahead in got:
            got[ahead] = ([got[ahead][0][i] for i in greedy], got[ahead][1],
                          [got[ahead][2][i] for i in greedy]) + got[ahead][3:]
    assert got[True][:3] == got[False][:3]
    assert got[True][2] == got[True][0]
    if k != "auto":
        assert got[True][3] == got[False][3]
    assert got[False][4] == 0


def test_run_ahead_overruns_only_unforeseen_ends(demo):
    """At B=1 a reply that ends by max_new_tokens is read before the next launch (no round
    past its end); one that ends by a stop id mid-reply costs one round run past it, which
    is computed, thrown away and not counted; the policy learns nothing from it."""
    prompt = _prompts(3, [7])[0]
    free = _decoder(demo, 3, True).generate([Request(prompt=prompt, max_new_tokens=40)])[0]
    assert len(free.tokens) == 40 and free.finish_reason == "max_length"
    stop = free.tokens[12]
    n_stop = free.tokens.index(stop) + 1
    for ahead in (True, False):
        dec = _decoder(demo, 3, ahead)
        lessons = []
        told = dec.spec.after_round
        object.__setattr__(dec.spec, "after_round",
                           lambda n, busy, *a: (lessons.append(busy.copy()), told(n, busy, *a)))
        by_length = dec.generate([Request(prompt=prompt, max_new_tokens=40)])[0]
        assert dec.metrics.overrun_rounds == 0
        dec.reset_metrics()
        lessons.clear()
        by_stop = dec.generate([Request(prompt=prompt, max_new_tokens=40,
                                        stop_token_ids=[stop])])[0]
        assert by_length.tokens == free.tokens
        assert (by_stop.tokens, by_stop.finish_reason) == (free.tokens[:n_stop], "stop_id")
        assert dec.metrics.overrun_rounds == (1 if ahead and n_stop < 36 else 0)
        assert len(lessons) == dec.metrics.rounds     # none of the round run past the end
        assert all(b.all() for b in lessons)


def test_pinned_reads_ring():
    """The GPU backends' to_host_async (``backends._PinnedReads``) on host stand-ins: each
    handle returns the array as it was when read, a copy it may keep; every shape and dtype
    has its own ring of buffers, reused in turn."""
    from types import SimpleNamespace
    from specdec_lib.orchestrator.backends import _PinnedReads
    made, waits = [], []

    def pinned(a):
        made.append((a.shape, a.dtype))
        return np.empty_like(a)

    def event():
        return SimpleNamespace(record=lambda: None, synchronize=lambda: waits.append(1))
    read = _PinnedReads(pinned, lambda h, a: np.copyto(h, a), event, lambda h: h)
    a, b = np.arange(6, dtype=np.int32), np.zeros((2, 3), np.uint8)
    handles = []
    for i in range(_PinnedReads.RING + 2):
        a[0] = i
        got = read(a)()
        assert got[0] == i and got is not a
        got[1] = -5                         # the caller's copy: the next read is unaffected
        handles.append(got)
    first = read(a)
    a[0] = 99
    assert first()[0] == _PinnedReads.RING + 1 and read(b)().shape == (2, 3)
    assert made.count(((6,), np.dtype(np.int32))) == _PinnedReads.RING
    assert made.count(((2, 3), np.dtype(np.uint8))) == _PinnedReads.RING
    assert [h[0] for h in handles] == list(range(_PinnedReads.RING + 2)) and len(waits) == 8


def test_serve_argument_errors(demo):
    be = reference_backend()
    target, draft = _models(demo, be)
    dec = SpeculativeDecoder(target, draft, num_speculative_tokens=2)
    reqs = _mixed_requests(1)[:2]
    with pytest.raises(ValueError, match="slots"):
        dec.serve(reqs, slots=0)
    with pytest.raises(ValueError, match="arrivals"):
        dec.serve(reqs, slots=1, arrivals=[0])
    with pytest.raises(ValueError, match="arrivals"):
        dec.serve(reqs, slots=1, arrivals=[0, -1])
    assert dec.serve([], slots=1) == []


def test_decoder_argument_errors(demo):
    be = reference_backend()
    target, draft = _models(demo, be)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeDecoder(target, draft, num_speculative_tokens=16)
    with pytest.raises(ValueError, match="draft"):
        SpeculativeDecoder(target, None, num_speculative_tokens=2)
    with pytest.raises(ValueError, match="backend"):
        SpeculativeDecoder(target, draft, backend="tpu")
    dec = SpeculativeDecoder(target, draft, num_speculative_tokens=2)
    with pytest.raises(ValueError, match="prompt"):
        dec.generate([Request(prompt=[])])


def test_demo_main_reports_lossless(capsys):
    from specdec_lib.demo import main
    assert main(["--model", "tiny-hybrid", "--backend", "reference", "--batch", "2",
                 "--max-new-tokens", "12", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for key in ("acceptance rate:", "mean accepted length:", "tokens/s", "speed-up",
                "lossless: yes", "k = auto (k_max 4)", "auto: k="):
        assert key in out
    assert main(["--model", "tiny-hybrid", "--backend", "reference", "--batch", "2", "-k", "3",
                 "--max-new-tokens", "8", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "lossless: yes" in out and "k = 3\n" in out and "auto:" not in out


@pytest.mark.parametrize("argv, msg", [(["--k-max", "16"], "--k-max"),
                                       (["--k-max", "0"], "--k-max"),
                                       (["-k", "16"], "--num-speculative-tokens")])
def test_demo_bad_k_refused(capsys, argv, msg):
    from specdec_lib.demo import main
    assert main(["--model", "tiny-hybrid", "--backend", "reference", "--no-progress"]
                + argv) == 2
    assert msg in capsys.readouterr().err


# ------------------------------------------------------------------------------ GPU

@needs_gpu
def test_async_upload_serves_the_same_cuda(demo):
    """``state.ASYNC_UPLOAD`` (admissions and prefills copied through the backend's pinned
    staging ring, no wait for the round run ahead): a served stream with more requests than
    slots, arrivals and graphs emits what the pageable copies emit, sampled requests too
    (torch: test_llama's twin)."""
    pytest.importorskip("cupy")
    from specdec_lib.orchestrator import cuda_backend, state
    be = cuda_backend()
    reqs = _mixed_requests(8) + _mixed_requests(9)

    def run():
        dec = _decoder(demo, 3, True, be, cuda_graph=True)
        served = dec.serve(reqs, slots=3, arrivals=[0, 0, 1, 1, 9, 9] + [20] * 6)
        return [(r.tokens, r.finish_reason) for r in served]
    got = switched(state, "ASYNC_UPLOAD", run)
    assert got[True] == got[False]


@needs_gpu
@pytest.mark.parametrize("k", [1, 3, 7])
def test_lossless_greedy_cuda(demo, k):
    pytest.importorskip("cupy")
    from specdec_lib.orchestrator import cuda_backend
    be = cuda_backend()
    reqs = [Request(prompt=p, max_new_tokens=24) for p in _prompts(1, [1, 6, 19, 3])]
    base, _ = _run(demo, reqs, 0, be)
    res, m = _run(demo, reqs, k, be)
    assert [r.tokens for r in res] == [r.tokens for r in base]
    assert m.acceptance_rate > 0


@needs_gpu
def test_demo_main_cuda(capsys):
    pytest.importorskip("cupy")
    from specdec_lib.demo import main
    assert main(["--model", "tiny-hybrid", "--backend", "cuda", "--batch", "8", "--max-new-tokens", "64",
                 "--no-progress"]) == 0
    assert "lossless: yes" in capsys.readouterr().out


def _linear_f64_order(x, w):
    """x @ w.T in linear_f64's order: lane l of 32 chains fma over k = l, l + 32, ... (each
    fma rounded once, through exact fractions), then the xor butterfly 16, 8, 4, 2, 1."""
    from fractions import Fraction
    M, K = x.shape
    y = np.zeros((M, w.shape[0]))
    for m in range(M):
        for n in range(w.shape[0]):
            p = np.zeros(32)
            for lane in range(32):
                acc = 0.0
                for k in range(lane, K, 32):
                    acc = float(Fraction(float(x[m, k])) * Fraction(float(w[n, k])) + Fraction(acc))
                p[lane] = acc
            for d in (16, 8, 4, 2, 1):
                p = p + p[np.arange(32) ^ d]
            y[m, n] = p[0]
    return y


@needs_gpu
def test_cuda_backend_linear_f64_bits():
    """The cuda backend's float64 GEMM (kernel linear_f64, the host models' dense math): the
    bits of its fixed order, eagerly and replayed from a CUDA graph; K past one lane stride,
    N not a multiple of the CTA's 8 columns, rows past 65535 (grid-stride)."""
    cupy = pytest.importorskip("cupy")
    from specdec_lib.orchestrator import cuda_backend
    be = cuda_backend()
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((5, 70)), rng.standard_normal((9, 70))
    want = _linear_f64_order(x, w)
    np.testing.assert_allclose(want, x @ w.T, rtol=1e-12, atol=1e-12)
    tall = rng.standard_normal((65537, 1))
    with be.stream_scope():                 # inputs copied on the backend's stream
        xd, wd = cupy.asarray(x), cupy.asarray(w)
        got = be.to_host(be.linear(xd, wd))
        out = {}
        replay = be.capture(lambda: out.setdefault("y", be.linear(xd, wd)))
        replay()
        graphed = be.to_host(out["y"])
        y = be.to_host(be.linear(cupy.asarray(tall), cupy.asarray([[1.5], [-2.0]])))
        with pytest.raises(ValueError, match="linear"):
            be.linear(xd, cupy.zeros((9, 71)))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(graphed, want)
    np.testing.assert_array_equal(y, tall * np.array([1.5, -2.0]))


def _mixed_requests(seed):
    """Greedy and sampled requests (seeds, top-k/top-p), stop ids and sequences, ragged
    prompts and lengths: requests finish in different rounds."""
    ps = _prompts(seed, [1, 6, 19, 3, 9, 2])
    return [Request(prompt=ps[0], max_new_tokens=40),
            Request(prompt=ps[1], max_new_tokens=33, temperature=1.2, seed=7),
            Request(prompt=ps[2], max_new_tokens=25, temperature=0.8, top_k=20, top_p=0.9,
                    seed=11),
            Request(prompt=ps[3], max_new_tokens=40, stop_token_ids=[5, 17]),
            Request(prompt=ps[4], max_new_tokens=12, temperature=1.0, min_p=0.05, seed=3),
            Request(prompt=ps[5], max_new_tokens=40, stop_sequences=[[3, 4]])]


@needs_gpu
@pytest.mark.parametrize("k", [0, 2, 4])
def test_graph_replay_equals_eager(demo, k):
    """The round captured once as a CUDA graph and replayed (lengths, steps, seeds and
    tokens changing on the device every round) emits exactly the eager tokens."""
    pytest.importorskip("cupy")
    from specdec_lib.orchestrator import cuda_backend
    be = cuda_backend()
    reqs = _mixed_requests(5)
    eager, me = _run(demo, reqs, k, be)
    graph, mg = _run(demo, reqs, k, be, cuda_graph=True)
    assert mg.graph_captured and not me.graph_captured
    assert mg.rounds == me.rounds > 3
    assert [(r.tokens, r.finish_reason) for r in graph] == \
        [(r.tokens, r.finish_reason) for r in eager]
    # a second generate() with the same decoder objects captures afresh: same tokens again
    again, _ = _run(demo, reqs, k, be, cuda_graph=True)
    assert [r.tokens for r in again] == [r.tokens for r in eager]


def _long_run(*args):
    import subprocess
    import sys
    from pathlib import Path
    tool = Path(__file__).resolve().parents[1] / "tools" / "gpu" / "long_run.py"
    r = subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "long run: PASS" in r.stdout
    return r.stdout


def test_long_run_tool_reference():
    """tools/gpu/long_run.py (issue 7's 10k-round run) on a short schedule on the CPU: no slot
    leak, a fresh run and requests decoded alone give the same tokens."""
    _long_run("--backend", "reference", "--rounds", "30", "--slots", "3", "--alone", "2")


@needs_gpu
def test_long_run_tool_cuda_graph():
    pytest.importorskip("cupy")
    out = _long_run("--backend", "cuda", "--rounds", "400", "--slots", "8", "--alone", "4")
    assert "graph True" in out


def _live_rows_served(demo, k, be=None, cuda_graph=False):
    """The demo (carry-fed MTP draft) serving greedy and sampled requests through 6 slots,
    arrivals leaving slots idle, with ``serve.LIVE_ROWS`` off and on: {on: (results,
    rounds, accepted, whether a live-rows graph was recorded)}."""
    from specdec_lib.orchestrator import serve
    reqs = _mixed_requests(8) + _mixed_requests(9)

    def run():
        dec = _decoder(demo, k, True, be, cuda_graph=cuda_graph)
        out = dec.serve(reqs, slots=6, arrivals=[0, 0, 1, 1, 9, 9] + [30] * 6)
        res = [(r.tokens, r.finish_reason) for r in out]
        if k == "auto":     # its choices follow measured round times: greedy replies only
            return [res[i] for i, r in enumerate(reqs) if r.temperature == 0]
        return (res, dec.metrics.rounds, dec.metrics.accepted,
                any(key[2] and key[2][0] == "live" for key in dec._state.replays))
    return switched(serve, "LIVE_ROWS", run)


@pytest.mark.parametrize("k", [3, "auto"])
def test_live_rows_serve_the_same(demo, k):
    """``serve.LIVE_ROWS`` (rounds with at most half the slots busy give idle slots one row)
    with the demo's carry-fed MTP draft: the same tokens, finish reasons, rounds and accepted
    drafts as whole blocks, greedy and sampled requests (auto: the greedy replies)."""
    got = _live_rows_served(demo, k)
    assert got[True] == got[False]


@needs_gpu
def test_live_rows_graphs_serve_the_same_cuda(demo):
    """cuda backend, recorded rounds: live-rows rounds (one graph per live count, the row
    split refilled before each replay) serve what whole blocks serve, sampled requests too
    (torch with a draft head: test_llama's twin)."""
    pytest.importorskip("cupy")
    from specdec_lib.orchestrator import cuda_backend
    got = _live_rows_served(demo, 3, cuda_backend(), cuda_graph=True)
    assert got[True][:3] == got[False][:3] and got[True][3] and not got[False][3]
