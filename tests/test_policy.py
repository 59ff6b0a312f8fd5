"""num_speculative_tokens="auto" (orchestrator.policy.AutoK) on the reference backend:
lossless, reproducible, driven to k = 0 by a useless draft and to k_max by a perfect one,
bad input refused, and the sampled distribution kept (the policy reads accepted history only).
"""
import numpy as np
import pytest

from specdec_lib.models import TinyHybridTarget, TinyMTPDraft
from specdec_lib.orchestrator import (AutoK, FixedK, Request, RoundPlan, SpeculativeDecoder,
                                      reference_backend)

# a round's cost at k (seconds; any B): speculating is cheap, so the tiny model's MTP head
# (acceptance ~0.8) pays up to k_max
CHEAP = {0: 1.0, 1: 1.05, 2: 1.1, 3: 1.15, 4: 1.2}
# speculating costs more than a perfect draft can repay below k=... (k=1 doubles the round)
DEAR = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0}


def _prompts(seed, lens, V=256):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, V, n).tolist() for n in lens]


def _decoder(demo, k, draft="mtp", be=None):
    be = be or reference_backend()
    cfg, tensors, dw = demo
    target = TinyHybridTarget(cfg, tensors, be)
    d = TinyMTPDraft(cfg, dw, tensors, be) if draft == "mtp" else draft
    return SpeculativeDecoder(target, d, num_speculative_tokens=k, backend=be)


@pytest.fixture(scope="module")
def baseline(demo):
    reqs = [Request(prompt=p, max_new_tokens=24) for p in _prompts(1, [1, 6, 19, 3, 9])]
    dec = _decoder(demo, 0, draft=None)
    return reqs, [r.tokens for r in dec.generate(reqs)]


class WrongDraft:
    """Proposes a token the target never picks next (its greedy output + 1, known)."""

    def __init__(self, inner):
        self.inner = inner

    def propose(self, carry, last_token, k):
        return (self.inner.propose(carry, last_token, k) + 1) % 256


class OracleDraft:
    """Proposes the target's own greedy continuation (slot b holds request b)."""
    uses_context = True

    def __init__(self, want):
        self.want = [list(w) + [0] * 16 for w in want]

    def propose(self, carry, last_token, k, context):
        n = np.asarray(context.output_lens)
        return np.asarray([w[m:m + k] for w, m in zip(self.want, n)], np.int32).reshape(-1, k)


# ----------------------------------------------------------------------- lossless

@pytest.mark.parametrize("spec", [lambda: AutoK(4, costs=CHEAP), lambda: AutoK(3, costs=DEAR),
                                  lambda: "auto", lambda: AutoK(2, costs=CHEAP, ragged=False)],
                         ids=["cheap", "dear", "measured", "uniform"])
def test_auto_lossless_greedy(demo, baseline, spec):
    reqs, want = baseline
    dec = _decoder(demo, spec())
    assert [r.tokens for r in dec.generate(reqs)] == want
    m = dec.metrics
    assert m.policy == "auto" and sum(m.k_rounds.values()) == m.rounds


def test_auto_cheap_speculates_dear_does_not(demo, baseline):
    reqs, _ = baseline
    cheap = _decoder(demo, AutoK(4, costs=CHEAP))
    cheap.generate(reqs)
    assert max(cheap.metrics.k_rounds) >= 3 and cheap.metrics.mean_accepted_length > 2
    dear = _decoder(demo, AutoK(3, costs=DEAR, explore_every=0))
    dear.generate(reqs)
    # only the prefill's drafts are verified (round 1 plans from the neutral prior)
    assert dear.metrics.k_rounds.get(0, 0) >= dear.metrics.rounds - 1


def test_auto_serve_matches_target_only(demo):
    """Continuous batching (slots reused, ragged per-request counts, k changing between
    rounds) emits what target-only decoding emits."""
    reqs = [Request(prompt=p, max_new_tokens=n, stop_token_ids=s) for p, n, s in
            zip(_prompts(5, [3, 8, 1, 12, 5, 7]), [9, 20, 14, 6, 17, 11],
                [(), (), (7,), (), (3, 4), ()])]
    arrivals = [0, 0, 1, 4, 9, 30]
    base = _decoder(demo, 0, draft=None).serve(reqs, slots=2, arrivals=arrivals)
    dec = _decoder(demo, AutoK(4, costs=CHEAP))
    got = dec.serve(reqs, slots=2, arrivals=arrivals)
    assert [(g.tokens, g.finish_reason) for g in got] == \
        [(b.tokens, b.finish_reason) for b in base]
    assert len({p.verify for p in dec.spec.choices}) > 1            # k moved


# ----------------------------------------------------------------------- choices

def test_same_history_same_choices(demo, baseline):
    reqs, _ = baseline
    runs = []
    for _ in range(2):
        dec = _decoder(demo, AutoK(4, costs=CHEAP))
        dec.generate(reqs)
        runs.append((dec.spec.choices, dec.metrics.k_rounds))
    assert runs[0] == runs[1]
    # the policy alone, fed one recorded history: the same plans again
    hist = np.random.default_rng(0).integers(0, 5, (40, 3))
    plans = []
    for _ in range(2):
        pol = AutoK(4, costs=lambda B, k: 1.0 + 0.3 * k)
        pol.start(3, graphs=False)
        pol.admit([0, 1, 2])
        out = []
        for n in hist:
            p = pol.before_round([True, True, True])
            q = p.num_draft or (p.verify,) * 3
            pol.after_round(np.minimum(n, q), [True, True, True])
            out.append(p)
        plans.append(out)
    assert plans[0] == plans[1]


def test_choices_read_only_accepted_history():
    """A plan is a function of the num_accepted seen so far (and the cost table): nothing
    else reaches the policy, so a round's own logits cannot bias its k."""
    pol = AutoK(3, costs=CHEAP)
    pol.start(2, graphs=True)
    pol.admit([0, 1])
    seen = []
    for n in ([3, 0], [2, 1], [0, 0], [3, 3]):
        seen.append(pol.before_round([True, True]))
        pol.after_round(np.asarray(n), [True, True])
    again = AutoK(3, costs=CHEAP)
    again.start(2, graphs=True)
    again.admit([0, 1])
    for plan, n in zip(seen, ([3, 0], [2, 1], [0, 0], [3, 3])):
        assert again.before_round([True, True]) == plan
        again.after_round(np.asarray(n), [True, True])
    assert all(p.num_draft is None for p in seen)         # graphs: whole blocks only


def test_wrong_draft_drives_k_to_zero(demo, baseline):
    reqs, want = baseline
    cfg, tensors, dw = demo
    be = reference_backend()
    wrong = WrongDraft(TinyMTPDraft(cfg, dw, tensors, be))
    dec = _decoder(demo, AutoK(3, costs={0: 1.0, 1: 1.2, 2: 1.4, 3: 1.6}, explore_every=8),
                   draft=wrong, be=be)
    assert [r.tokens for r in dec.generate(reqs)] == want
    ks = [p.propose for p in dec.spec.choices]
    assert ks[-12:].count(0) >= 10, ks
    assert dec.metrics.k_rounds[0] >= dec.metrics.rounds - 6
    assert 1 in ks[9:]                                    # a probe after 8 rounds at 0


def test_perfect_draft_drives_k_to_k_max(demo, baseline):
    reqs, want = baseline
    dec = _decoder(demo, AutoK(4, costs={0: 1.0, 1: 1.3, 2: 1.6, 3: 1.9, 4: 2.2}),
                   draft=OracleDraft(want))
    assert [r.tokens for r in dec.generate(reqs)] == want
    ks = [p.propose for p in dec.spec.choices]
    # from the neutral prior (0.5 a position: k=1 pays best) up to k_max within rounds (a
    # choice sees the history up to the round before last: serve learns while a round runs)
    assert ks[0] < 4 and ks[4:] == [4] * (len(ks) - 4), ks
    m = dec.metrics     # every draft accepted where its request had room for it
    assert m.accept_counts[:3] == m.position_rows[:3] and m.acceptance_rate > 0.9


def test_ragged_trims_a_hopeless_request():
    """Without graphs a request whose drafts keep failing verifies fewer of them than one
    whose drafts land; with graphs every slot verifies the batch's k."""
    for graphs in (False, True):
        pol = AutoK(4, costs={0: 1.0, 1: 1.2, 2: 1.4, 3: 1.6, 4: 1.8})
        pol.start(2, graphs=graphs)
        pol.admit([0, 1])
        for _ in range(12):
            p = pol.before_round([True, True])
            q = p.num_draft or (p.verify,) * 2
            pol.after_round(np.asarray([q[0], 0]), [True, True])
        p = pol.before_round([True, True])
        if graphs:
            assert p.num_draft is None
        else:
            assert p.num_draft[0] == p.verify > p.num_draft[1]


def test_measured_costs_calibrate_each_k(demo, baseline):
    reqs, want = baseline
    dec = _decoder(demo, AutoK(2, hold=3))
    assert not dec.spec.calibrated(len(reqs))
    assert [r.tokens for r in dec.generate(reqs)] == want
    assert dec.spec.calibrated(len(reqs))
    assert {k for B, k in dec.spec.measured} == {0, 1, 2}
    # each k: the switch round, its shape's first (eager: compiling) round, one sample
    assert [p.propose for p in dec.spec.choices[:9]] == [2, 2, 2, 1, 1, 1, 0, 0, 0]


def test_calibrate_runs_past_stops(demo, baseline):
    """A warm-up request whose stop comes at once (the second token it emits) still gives
    every k its cost: calibrate drops the stops (the replies are discarded),
    keeps the stop buffers' widths (the timed call reuses its state), restores the decoder's
    and forgets the acceptance it saw (the cost table stays)."""
    reqs, want = baseline
    stop = Request(prompt=reqs[1].prompt, max_new_tokens=24, stop_token_ids=[want[1][1]],
                   stop_sequences=[want[1][:3] + [0] * 3])
    dec = _decoder(demo, AutoK(2, hold=3))
    assert dec.calibrate([stop])
    assert {k for B, k in dec.spec.measured} == {0, 1, 2} and dec.spec.sweep == []
    assert not dec.spec.pool_tries.any() and dec.metrics.rounds == 0
    assert (dec.max_stop_ids, dec.max_stop_sequences, dec.max_stop_length) == (4, 2, 4)
    state = dec._state
    assert state.shape.stop_length == 6       # the stop sequence's 6 tokens, not the default 4
    [res] = dec.generate([stop])
    assert res.tokens == want[1][:2] and res.finish_reason == "stop_id"
    assert dec._state.shape == state.shape      # so a target that keeps its caches reuses
    # the warm-up's buffers and graphs (this tiny one does not: a fresh state, same shape)
    # without the stops dropped it gets two rounds a call: nowhere near three k's
    raw = _decoder(demo, AutoK(2, hold=3))
    for _ in range(4):
        raw.serve([stop], slots=1)
    assert not raw.spec.calibrated(1)


# ----------------------------------------------------------------------- bad input

def test_bad_input_refused(demo):
    be = reference_backend()
    cfg, tensors, dw = demo
    target = TinyHybridTarget(cfg, tensors, be)
    draft = TinyMTPDraft(cfg, dw, tensors, be)
    for k_max in (0, 16, -1, 2.5, True):
        with pytest.raises(ValueError, match="k_max"):
            AutoK(k_max)
    with pytest.raises(ValueError, match="draft"):
        SpeculativeDecoder(target, None, num_speculative_tokens="auto", backend=be)
    with pytest.raises(ValueError, match="draft"):
        SpeculativeDecoder(target, None, num_speculative_tokens=AutoK(2), backend=be)

    class Short:
        max_draft_tokens = 2

        def propose(self, carry, last_token, k):
            raise AssertionError("never launched")
    with pytest.raises(ValueError, match="draft.*max_draft_tokens.*k_max=3"):
        SpeculativeDecoder(target, Short(), num_speculative_tokens=AutoK(3), backend=be)
    with pytest.raises(ValueError, match="draft.*k_max=4"):
        SpeculativeDecoder(target, Short(), num_speculative_tokens=4, backend=be)
    SpeculativeDecoder(target, Short(), num_speculative_tokens=AutoK(2), backend=be)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeDecoder(target, draft, num_speculative_tokens="fast", backend=be)
    assert FixedK(3).before_round([True]) == RoundPlan(3, 3)


# ----------------------------------------------------------------------- sampled

def test_auto_sampled_keeps_the_target_distribution(demo):
    """Two-sample chi-square: the third emitted token of N seeds under auto (k changing,
    ragged blocks) vs target-only; same law (each round is exact speculative sampling for
    any k fixed before it runs)."""
    prompt = _prompts(3, [5])[0]
    N = 400
    reqs = [Request(prompt=prompt, max_new_tokens=3, temperature=2.0, seed=s) for s in range(N)]
    base = _decoder(demo, 0, draft=None).generate(reqs)
    dec = _decoder(demo, AutoK(3, costs={0: 1.0, 1: 1.02, 2: 1.2, 3: 1.5}))
    spec = dec.generate(reqs)
    assert any(p.num_draft is not None for p in dec.spec.choices)
    a = np.bincount([r.tokens[2] for r in base], minlength=256).astype(float)
    b = np.bincount([r.tokens[2] for r in spec], minlength=256).astype(float)
    order = np.argsort(-(a + b))
    bins_a, bins_b, ca, cb = [], [], 0.0, 0.0
    for t in order:                   # merge into bins of >= 10 pooled counts
        ca, cb = ca + a[t], cb + b[t]
        if ca + cb >= 10:
            bins_a.append(ca), bins_b.append(cb)
            ca = cb = 0.0
    if ca + cb:
        bins_a[-1] += ca
        bins_b[-1] += cb
    x, y = np.array(bins_a), np.array(bins_b)
    tot = x + y
    chi2 = float((((x - tot / 2) ** 2 + (y - tot / 2) ** 2) / (tot / 2)).sum())
    dof = len(tot) - 1
    z = 3.09                          # 99.9% quantile, Wilson-Hilferty
    crit = dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < crit, (chi2, crit, dof)


# ----------------------------------------------------------------------- scripted plans

class Scripted:
    """A policy object that plays a fixed cycle of (verify, propose[, num_draft]) plans:
    every shape change the round supports (k up, down, to 0 and back, ragged blocks)."""
    name = "scripted"

    def __init__(self, k_max, plans):
        self.k_max, self.plans = k_max, plans

    def check(self, draft):
        assert draft is not None

    def start(self, slots, graphs):
        self.i, self.B = 0, slots

    def admit(self, slots):
        pass

    def before_round(self, busy):
        v, p, *q = self.plans[self.i % len(self.plans)]
        self.i += 1
        return RoundPlan(v, p, tuple(min(x, v) for x in q[0][:self.B]) if q else None)

    def after_round(self, num_accepted, busy, seconds=None):
        pass


# verify of each plan = propose of the one before it (the first: <= k_max, from the prefill)
CYCLE = [(4, 4), (4, 2), (2, 2, (2, 0, 1, 2, 0)), (2, 0), (0, 0), (0, 3), (3, 1), (1, 4),
         (4, 4, (4, 1, 0, 3, 2)), (4, 4)]


@pytest.mark.parametrize("draft", ["mtp", "ngram"])
def test_scripted_plans_lossless(demo, baseline, draft):
    reqs, want = baseline
    if draft == "ngram":
        from specdec_lib.models.ngram import NgramDraft
        be = reference_backend()
        dec = _decoder(demo, Scripted(4, CYCLE), draft=NgramDraft(be), be=be)
    else:
        dec = _decoder(demo, Scripted(4, CYCLE))
    assert [r.tokens for r in dec.generate(reqs)] == want
    assert dec.metrics.k_rounds.keys() >= {0, 1, 2, 3, 4}


def test_scripted_plans_lossless_smollm2_head():
    """The same cycle with a trained head that keeps its own KV cache (the block path: rows
    fed through a gather when blocks are narrower than k_max + 1; k = 0 rounds skip it)."""
    from toy_models import skip_unless_smollm2
    skip_unless_smollm2()
    from specdec_lib.models import smollm2
    from specdec_lib.models import load_smollm2_target
    from specdec_lib.models.heads import smollm2_head
    from specdec_lib.models.llama_draft import LlamaDraftHead
    from specdec_lib.orchestrator import make_backend
    be = make_backend("reference")
    target, tok = load_smollm2_target(be, progress=False)
    reqs = [Request(prompt=smollm2.chat_prompt(tok, t), max_new_tokens=16)
            for t in smollm2.OPEN_PROMPTS[:2]]
    base = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be).generate(reqs)
    head = LlamaDraftHead.load(target, smollm2_head("eagle3"), "eagle3")
    cycle = [(2, 0), (0, 0), (0, 3), (3, 1, (1, 0)), (1, 4), (4, 2, (4, 2)), (2, 4)]
    dec = SpeculativeDecoder(target, head, num_speculative_tokens=Scripted(4, cycle), backend=be)
    assert [r.tokens for r in dec.generate(reqs)] == [r.tokens for r in base]
    assert dec.metrics.accepted > 0 and dec.metrics.rounds >= len(cycle), dec.metrics


# ----------------------------------------------------------------------- host cost
# before_round / after_round run while the GPU idles (between the round's read of
# num_accepted and the next launch): they are kept to a handful of numpy calls.

def _feed(pol, B, rounds, seed=0, ragged_q=False):
    """Run ``pol`` over ``rounds`` random rounds; returns [(q, n, busy)] as it saw them."""
    rng = np.random.default_rng(seed)
    busy = np.ones(B, bool)
    seen = []
    for r in range(rounds):
        if r % 7 == 3:
            busy = rng.random(B) < 0.7
        p = pol.before_round(busy)
        q = np.asarray(p.num_draft or (p.verify,) * B)
        n = np.minimum(rng.integers(-1, pol.k_max + 1, B), q).astype(np.int32)
        pol.after_round(n, busy, float(1e-3 * (1 + 0.1 * p.verify + 0.01 * (r % 3))))
        seen.append((q, n, busy.copy()))
        assert pol.costs() == [pol.cost(B, k) for k in range(pol.k_max + 1)]
    return seen


@pytest.mark.parametrize("graphs", [True, False])
def test_counts_follow_their_definition(graphs):
    """acc / tries and the pooled counts, bit for bit the per-round update of the design
    (decay at each position tried, then +1 there / where accepted: j <= min(n + 1, q) /
    j <= min(n, q), idle slots and n < 0 adding nothing and keeping their counts; the pool
    decayed every round), and the cached cost list always the table's."""
    B, K, decay = 3, 4, 0.9
    pol = AutoK(K, decay=decay, hold=2)
    pol.start(B, graphs)
    pol.admit(range(B))
    seen = _feed(pol, B, 120)
    assert pol.calibrated(B) and any(q.max() < K for q, _, _ in seen)
    acc, tries, pa, pt = np.zeros((B, K)), np.zeros((B, K)), np.zeros(K), np.zeros(K)
    pos = np.arange(1, K + 1)[None, :]
    for q, n, busy in seen:
        tried = pos <= (np.minimum(q, n + 1) * busy)[:, None]
        hit = pos <= (np.minimum(n, q) * busy)[:, None]
        acc *= np.where(tried, decay, 1.0)
        tries *= np.where(tried, decay, 1.0)
        pa *= 0.995
        pt *= 0.995
        tries += tried
        acc += hit
        pt += tried.sum(axis=0)
        pa += hit.sum(axis=0)
    for got, want in ((pol.acc, acc), (pol.tries, tries), (pol.pool_acc, pa),
                      (pol.pool_tries, pt)):
        assert np.array_equal(got, want)


def test_choices_bounded(monkeypatch):
    """A server's plans do not pile up: ``choices`` keeps the last CHOICES_KEPT or more."""
    from specdec_lib.orchestrator import policy
    monkeypatch.setattr(policy, "CHOICES_KEPT", 10)
    pol = AutoK(2, costs=CHEAP)
    pol.start(1, True)
    pol.admit([0])
    plans = []
    for r in range(57):
        plans.append(pol.before_round([True]))
        pol.after_round(np.asarray([r % 3]), [True])
    assert 10 <= len(pol.choices) <= 20 and pol.choices == plans[-len(pol.choices):]


def test_calibration_sweeps_down_and_back_up():
    """Measured costs: the sweep proposes k_max .. 0 and then 0 .. k_max, ``hold`` rounds
    each, and a k's cost is the median of its samples (in ``serve`` the first round admits,
    so every k has ``hold - 1`` samples each way and a round cost that drifts linearly over
    the sweep gives every k the same drift; here round 1 is a sample too)."""
    K, hold, B = 2, 3, 1
    pol = AutoK(K, hold=hold)
    pol.start(B, True)
    pol.admit([0])
    props, t = [], 0
    while not pol.calibrated(B) or pol.sweep:
        p = pol.before_round([True])
        props.append(p.propose)
        t += 1
        # a round costs 1 ms per k + 1 ms, plus a drift of 0.01 ms a round
        pol.after_round(np.asarray([p.verify]), [True], 1e-3 * (1 + p.verify) + 1e-5 * t)
    down = [k for k in range(K, -1, -1) for _ in range(hold)]
    assert props == down + down[::-1]
    # the samples of each k: the rounds that verified and proposed it (not a switch round;
    # the first round verifies the prefill's k_max drafts)
    for k in range(K + 1):
        ts = [i + 1 for i in range(len(props))
              if props[i] == k and (i == 0 or props[i - 1] == k)]
        assert len(ts) >= 2 * (hold - 1)
        want = np.median([1e-3 * (1 + k) + 1e-5 * i for i in ts])
        assert pol.measured[(B, k)] == pytest.approx(want, rel=1e-12)
    # after calibration the table stays (later samples would come from the k that runs
    # alone, in a batch that drains) and no round is timed
    table = dict(pol.measured)
    for _ in range(8):
        p = pol.before_round([True])
        assert not pol.measuring
        pol.after_round(np.asarray([p.verify]), [True], 50 * table[(B, K)], 0.1)
    assert pol.measured == table


def _calibrated(K, hold, times):
    """An AutoK(K) at one slot calibrated on rounds whose after_round times are
    ``times(round, k)`` ((seconds,) or (seconds, gpu_seconds)); every draft accepted."""
    pol = AutoK(K, hold=hold)
    pol.start(1, True)
    pol.admit([0])
    r = 0
    while not pol.calibrated(1) or pol.sweep:
        p = pol.before_round([True])
        r += 1
        pol.after_round(np.asarray([p.verify]), [True], *times(r, p.verify))
    return pol


def test_cost_is_gpu_time_plus_the_median_host_share():
    """With the replays' GPU times (``gpu_seconds``), a k's cost is its median GPU time plus
    the median over every k of (period - GPU time): a stall in a period (host) moves no k
    against another."""
    K, B = 2, 1

    def times(r, k):
        gpu = 1e-3 * (1 + 0.2 * k)
        host = 3e-5 + (5e-3 if r % 5 == 0 else 0.0)        # a host stall every 5th round
        return gpu + host, gpu
    pol = _calibrated(K, 4, times)
    for k in range(K + 1):
        assert pol.measured[(B, k)] == pytest.approx(1e-3 * (1 + 0.2 * k) + 3e-5, rel=1e-9)


def test_costs_fitted_nondecreasing_in_k():
    """A round at k + 1 does k's work and more: medians out of order are pooled (weighted by
    their sample counts) into one cost, never a cheaper k + 1."""
    from specdec_lib.orchestrator.policy import _nondecreasing
    assert _nondecreasing([1, 3, 2, 4], [1, 1, 1, 1]) == [1, 2.5, 2.5, 4]
    assert _nondecreasing([1, 3, 2, 1], [1, 1, 2, 1]) == pytest.approx([1, 2, 2, 2])
    assert _nondecreasing([5, 4, 3], [1, 1, 1]) == [4, 4, 4]
    K, B = 3, 1
    table = {0: 1.0e-3, 1: 1.3e-3, 2: 1.5e-3, 3: 1.4e-3}       # k = 3 measured below k = 2
    pol = _calibrated(K, 2, lambda r, k: (table[k], table[k]))
    got = [pol.measured[(B, k)] for k in range(K + 1)]
    assert got == sorted(got) and got[2] == got[3]
    assert got[0] == pytest.approx(1.0e-3) and got[1] == pytest.approx(1.3e-3)
    assert got[2] == pytest.approx(1.45e-3, rel=0.05)


def test_calibration_drops_outliers():
    """A k's cost is the median of its samples: one stall among them does not move it."""
    K, B = 1, 1
    # the second sample of k=1 (round 1's is one) stalls
    pol = _calibrated(K, 4, lambda r, k: (1e-3 * (1 + k) + (0.02 if r == 3 else 0.0),))
    assert pol.measured[(B, 1)] == pytest.approx(2e-3, rel=1e-12)
    assert pol.measured[(B, 0)] == pytest.approx(1e-3, rel=1e-12)
    assert max(pol._samples[(B, 1)]) > 0.02


def test_prepared_choice_when_slots_finish():
    """``prepare`` readies the choice for the running slots and each slot's P_i(j); when
    some slots finish before the next round, ``before_round`` sums the readied rows of those
    still running: the same k, bit for bit the same sums, as computing it afresh."""
    rng = np.random.default_rng(7)
    B, K = 6, 4
    costs = {k: 1e-3 * (1 + 0.08 * k) for k in range(K + 1)}
    for trial in range(20):
        pol = AutoK(K, costs=costs)
        pol.start(B, True)
        pol.admit(range(B))
        busy = np.ones(B, bool)
        for _ in range(int(rng.integers(1, 12))):
            p = pol.before_round(busy)
            q = p.verify
            pol.after_round(np.minimum(rng.integers(-1, K + 1, B), q).astype(np.int32), busy)
        pol.prepare(busy)
        later = busy & (rng.random(B) < 0.6)
        later[int(rng.integers(B))] = True
        fresh = pol._best(later)
        assert pol.expected_tokens(later, pol._prepared[2]) == pol.expected_tokens(later)
        ready = pol.ready
        got = pol.before_round(later).propose
        assert got == min(max(fresh, ready - 1), ready + 1)


def _plain_model(pol, busy):
    """The choice's numbers as the design's formulas read, computed plainly on the running
    slots alone (AutoK's code before issue 29 cut its host cost): their acceptance a
    column at a time, P = its cumprod, the expected tokens E(k) summed over them and the
    slowest request's rate min_i E_i(k) / R_i."""
    from specdec_lib.orchestrator.policy import CHAIN
    busy = np.asarray(busy, bool)
    prior, prev = [], 0.5
    for pa, pt in zip(pol.pool_acc.tolist(), pol.pool_tries.tolist()):
        prev = (pa + CHAIN * prev) / (pt + CHAIN)
        prior.append(prev)
    s, K = pol.prior_strength, pol.k_max
    acc, tries = pol.acc[busy], pol.tries[busy]
    a = np.empty_like(acc)
    a[:, 0] = (acc[:, 0] + s * prior[0]) / (tries[:, 0] + s)
    for j in range(1, K):
        pj = np.minimum(a[:, j - 1] * (prior[j] / prior[j - 1]), 1.0)
        a[:, j] = (acc[:, j] + s * pj) / (tries[:, j] + s)
    P = a.cumprod(axis=1)
    E = [float(np.count_nonzero(busy))]
    for x in np.add.reduce(P, axis=0).tolist():
        E.append(E[-1] + x)
    R = np.empty((len(P), K + 1))
    R[:, 0] = 0.0
    np.cumsum(P, axis=1, out=R[:, 1:])
    R += 1.0
    R /= np.maximum(pol._left[busy], 1.0)[:, None]
    rate = R.min(axis=0).tolist() if len(P) else None
    ratios = [prior[j] / prior[j - 1] for j in range(1, K)]
    return a, P, E, rate, ratios


@pytest.mark.parametrize("K", [1, 2, 3, 4])
@pytest.mark.parametrize("graphs", [True, False])
def test_choice_numbers_match_the_plain_formulas(K, graphs):
    """What a choice reads, bit for bit the plain formulas' (``_plain_model``), though the
    policy computes every slot's into buffers reused a round, skips the prior's min where
    it cannot bind and sums / takes minima over masks: the acceptance, the expected
    tokens and the slowest rate (readied by prepare, and afresh) for the running slots and
    for subsets of them (slots that finished), the trimmed drafts, the choice; over a
    random history of admissions, idle slots with junk num_accepted, both objectives. The
    same numbers give the same choice, ties included (first maximum)."""
    rng = np.random.default_rng(K + 10 * graphs)
    B = 19                              # > 8: numpy's pairwise sums where K = 1
    pol = AutoK(K, costs=lambda b, k: 1e-3 * (1 + 0.12 * k + 0.01 * k * k))
    pol.start(B, graphs)
    busy = np.zeros(B, bool)
    ratios = set()
    for r in range(400):
        idle = np.flatnonzero(~busy)
        if r % 9 == 0 and len(idle):             # admissions (and how many wait)
            new = rng.choice(idle, size=int(rng.integers(1, len(idle) + 1)), replace=False)
            pol.admit(new.tolist())
            pol.budget(new.tolist(), rng.integers(1, 300, len(new)).tolist(),
                       int(rng.integers(0, 2)))
            busy[new] = True
        plan = pol.before_round(busy)
        q = np.asarray(plan.num_draft or (plan.verify,) * B)
        # a request's drafts land with its own odds, phases of good and bad text
        p = 0.9 if (r // 50) % 2 == 0 else 0.3
        n = np.minimum((np.cumprod(rng.random((B, K)) < p, axis=1)).sum(axis=1), q)
        n = n.astype(np.int32) - (rng.random(B) < 0.05)             # some -1
        n[~busy] = rng.integers(-3, 2 ** 31 - 1, int((~busy).sum()))  # junk where idle
        pol.after_round(n, busy.copy(), None)
        busy &= rng.random(B) > 0.04             # some finish
        if not busy.any():
            continue
        pol.prepare(busy)
        P_all = pol._prepared[2]
        a_all, P_plain, _, _, rs = _plain_model(pol, np.ones(B, bool))
        ratios.update(x <= 1.0 for x in rs)
        assert np.array_equal(pol.acceptance(), a_all) and np.array_equal(P_all, P_plain)
        sub = busy & (rng.random(B) < 0.7)
        for b in (busy, sub):
            if not b.any():
                continue
            _, _, E, rate, _ = _plain_model(pol, b)
            assert pol.expected_tokens(b, P_all) == E == pol.expected_tokens(b)
            if b.sum() > 1:
                assert pol._slowest_rate(b, P_all) == rate == pol._slowest_rate(b)
            c = pol.costs()
            score = [x / ck for x, ck in zip(rate if pol._draining and b.sum() > 1 else E, c)]
            assert pol._best(b, P_all) == score.index(max(score)) == pol._best(b)
            for k in range(1, K + 1):               # the eager rounds' per-slot drafts
                row = max(c[k] - c[0], 0.0) / (B * k)
                keep = (P_plain[:, :k] * c[k] >= row * E[k]).sum(axis=1)
                want = tuple(int(keep[i]) if b[i] else 0 for i in range(B))
                assert pol._trim(b, k, P_all) == (None if want == (k,) * B else want)
    assert K == 1 or ratios == {True, False}        # both sides of the skipped min


def test_drain_chooses_for_the_slowest_request():
    """With no request waiting (``budget(..., waiting=0)``) the call ends with its slowest
    request: a long request whose drafts never land keeps k at 0 though a short one would
    gain from drafts; while requests wait, the batch's rate of tokens decides (k > 0); the
    budgets left follow the tokens each round emitted."""
    costs = {0: 1.0, 1: 1.3, 2: 1.6, 3: 1.9, 4: 2.2}
    picks = {}
    for drain, waiting in ((True, 0), (True, 3), (False, 0)):
        pol = AutoK(4, costs=costs, drain=drain, ragged=False)
        pol.start(2, graphs=False)
        pol.admit([0, 1])
        pol.budget([0, 1], [400, 2000], waiting)
        busy = np.ones(2, bool)
        emitted = np.zeros(2)
        for _ in range(16):
            v = pol.before_round(busy).verify
            n = np.asarray([v, 0], np.int32)        # slot 0 lands every draft, slot 1 none
            pol.after_round(n, busy)
            emitted += n + 1
        np.testing.assert_array_equal(pol._left, [400, 2000] - emitted)
        picks[drain, waiting] = pol.before_round(busy).propose
    assert picks[True, 0] == 0
    assert picks[True, 3] == picks[False, 0] > 0


def test_live_costs_correct_a_calibration_that_underprices_k():
    """Calibrated at one slot on replays that price each extra draft at 5% of a round where
    decoding rounds cost 50% more a draft (s30: the warm-up's table against the decodes at
    B=32): the probes price the k's the choice moves through from the periods of decoding
    rounds, and the choice walks down to the k that is best at the true costs (k=1 at an
    acceptance of 0.6), where a policy kept on the table (``probe_every=0``) stays high.
    Live costs are medians of decoding periods; without live samples the table is the
    calibration's."""
    K, B = 4, 1
    true = [1e-3 * (1 + 0.5 * k) for k in range(K + 1)]
    table = [1e-3 * (1 + 0.05 * k) for k in range(K + 1)]
    last = {}
    for probe in (24, 0):
        pol = _calibrated(K, 2, lambda r, k: (table[k],))
        assert [pol.cost(B, k) for k in range(K + 1)] == pytest.approx(table)
        pol.probe_every = probe
        pol._interval = probe
        rng = np.random.default_rng(3)
        busy = np.ones(B, bool)
        props = []
        for _ in range(600):
            p = pol.before_round(busy)
            props.append(p.propose)
            n = 0
            while n < p.verify and rng.random() < 0.6:
                n += 1
            cost = 0.5 * (true[p.verify] + true[p.propose])
            pol.after_round(np.asarray([n]), busy, cost)
        last[probe] = props[-200:]
        if probe:
            for k in {p for p in props if props.count(p) > 2}:
                assert pol.cost(B, k) == pytest.approx(true[k], rel=1e-9), k
    assert max(set(last[24]), key=last[24].count) == 1
    assert last[24].count(1) > 0.8 * len(last[24])
    assert 1 not in last[0] and max(set(last[0]), key=last[0].count) >= 3


def test_a_never_landing_request_holds_a_drained_batch_at_k0():
    """A drained batch (no request waits: the slowest request's time) whose slowest request's
    drafts never land runs k = 0 with only the exploration rounds (one in ``explore_every``
    + 1) above it: a position a round did not try keeps its evidence. With counts decayed
    every round the request drifted back to the pooled prior ~15 rounds after k = 0 and took
    the batch up again, again and again (autok_sim, B=32: 0.95x of target-only)."""
    K, B = 3, 4
    for seed in range(3):
        pol = AutoK(K, costs={0: 1030.0, 1: 1130.0, 2: 1232.0, 3: 1317.0})  # issue 29, H100
        pol.start(B, True)
        pol.admit(range(B))
        pol.budget(range(B), [10 ** 6] * B, 0)
        busy = np.ones(B, bool)
        rng = np.random.default_rng(seed)
        ks = []
        for _ in range(200):
            p = pol.before_round(busy)
            ks.append(p.propose)
            n = [0]                     # slot 0: never; the others ~0.3 a draft
            for _ in range(1, B):
                m = 0
                while m < p.verify and rng.random() < 0.3:
                    m += 1
                n.append(m)
            pol.after_round(np.asarray(n), busy)
        late = ks[40:]
        assert max(late) <= 1, ks
        assert late.count(0) >= 0.85 * len(late), ks
        assert all(a == 0 or b == 0 for a, b in zip(late, late[1:])), ks   # explorations only


def test_live_samples_need_every_slot_busy():
    """A round with an idle slot is no live sample (its rows are cheaper), nor is a round of
    given costs; a round with every slot busy is."""
    pol = AutoK(2)
    pol.measured.update({(2, k): 1e-3 for k in range(3)})      # calibrated at 2 slots
    pol.start(2, True)
    pol.admit([0, 1])
    for busy in ([True, False], [True, True]):
        before = {key: len(v) for key, v in pol._live.items()}
        p = pol.before_round(np.asarray(busy))
        pol.after_round(np.asarray([p.verify, 0]), np.asarray(busy), 5e-3)
        p = pol.before_round(np.asarray(busy))
        pol.after_round(np.asarray([p.verify, 0]), np.asarray(busy), 5e-3)
        grew = {key: len(v) - before.get(key, 0) for key, v in pol._live.items()}
        assert sum(grew.values()) == (0 if not all(busy) else 2), (busy, grew)
    given = AutoK(2, costs={0: 1.0, 1: 1.1, 2: 1.2})
    given.start(1, True)
    given.admit([0])
    for _ in range(40):
        p = given.before_round(np.ones(1, bool))
        given.after_round(np.asarray([p.verify]), np.ones(1, bool), 9.0)
    assert not given._live and given.cost(1, 2) == 1.2


def test_unpriced_k_on_the_calibration_scaled_where_live_costs_rise_faster():
    """A k without live samples: where two k's have them and their live costs rise more
    between them than the calibrated ones, the nearest's live cost plus the calibration's
    step scaled by that ratio (issue 29, B=32: live samples came only for k = 3 and 2
    before the first request ended, and k = 1 priced by k = 2's gap alone, 1.32 where it
    cost 1.15, kept auto at k = 2, 0.88x of target-only against 0.99x for k = 1); the
    calibration's shape is kept (s47, B=4, tensor-core GEMMs by row groups of 8: a line
    through the live k = 1 / 2 priced k = 3 at 931 us where it cost 821, and auto stayed at
    k = 1); where the live costs rise less than the calibration (noise), the calibrated
    cost moved by the nearest k's gap, as with one live k."""
    K, B = 3, 4
    for cal, live, want in (
            # the calibration underprices each draft: below the live k's, its steps x 5
            ([1.0, 1.03, 1.06, 1.10], {3: 1.55, 2: 1.35}, [1.05, 1.20, 1.35, 1.55]),
            # above them too (and between two live k's: x 6)
            ([1.0, 1.03, 1.06, 1.10], {0: 1.0, 1: 1.15}, [1.0, 1.15, 1.30, 1.50]),
            ([1.0, 1.03, 1.06, 1.10], {0: 1.0, 3: 1.6}, [1.0, 1.18, 1.36, 1.6]),
            # a flat calibration between the live k's: their line
            ([1.0, 1.0, 1.0, 1.0], {0: 1.0, 1: 1.1}, [1.0, 1.1, 1.2, 1.3]),
            # a live line flatter than the calibration: the gap rule
            ([1.0, 1.15, 1.35, 1.55], {3: 1.45, 2: 1.35}, [1.0, 1.15, 1.35, 1.45]),
            ([1.0, 1.15, 1.35, 1.55], {0: 1.0, 1: 1.01}, [1.0, 1.01, 1.21, 1.41]),
            # one live k: the gap rule
            ([1.0, 1.03, 1.06, 1.10], {2: 1.35}, [1.29, 1.32, 1.35, 1.39])):
        pol = AutoK(K)
        pol.measured.update({(B, k): c for k, c in enumerate(cal)})
        pol.start(B, True)
        for k, c in live.items():
            pol._live_sample(k, c)
        assert [pol.cost(B, k) for k in range(K + 1)] == pytest.approx(want), (cal, live)
    # s47's B=4 round (H100, us): k = 3 priced near what it cost (821), so auto moves to it
    pol = AutoK(4)
    cal = [570.8, 643.8, 776.0, 838.7, 951.4]
    pol.measured.update({(B, k): c for k, c in enumerate(cal)})
    pol.start(B, True)
    pol._live_sample(1, 637.6)
    pol._live_sample(2, 784.2)
    r = (784.2 - 637.6) / (776.0 - 643.8)
    assert pol.cost(B, 3) == pytest.approx(784.2 + r * (838.7 - 776.0)) and pol.cost(B, 3) < 860
