"""The hybrid targets' fused mode (``fused_state=True``, ``models.gdn_layer.FusedJournals``:
each round's GDN / conv commit folded into the next round's verifies) against their plain
mode (verify, then gdn_commit / conv1d_commit), on the reference backend:

* the same decodes through SpeculativeDecoder -- greedy and sampled, fixed k, auto k with
  ragged blocks, target-only, stop ids and sequences, served streams with arrivals and slot
  reuse, batched and bucketed prefill, run ahead on and off -- give the same tokens, finish
  reasons and acceptance, for TinyHybridTarget (the demo model) and a toy LlamaHybridTarget
  (prompt lookup and an MTP head that reads the target's block);
* after ``flush()`` every GDN and conv state equals the plain mode's bit for bit; before it
  the fused state lags by the last commit's rows;
* a second forward before a commit applies nothing twice; a forward past the pools flushes
  and runs plain; ``reset_slots`` drops a slot's pending rows; the decoder sizes a
  LlamaHybridTarget's pools by its k_max + 1 rows a slot; FusedJournals' in-place writes on
  torch tensors (CPU).
"""
from types import SimpleNamespace

import numpy as np
import pytest

from specdec_lib.models import TinyHybridTarget, TinyMTPDraft
from specdec_lib.models.gdn_layer import FusedJournals
from specdec_lib.models.llama_hybrid import LlamaHybridTarget
from specdec_lib.models.ngram import NgramDraft
from specdec_lib.models.smollm2_hybrid import (hybrid_config, load_hybrid_weights,
                                               random_hybrid_tensors, save_hybrid_weights)
from specdec_lib.orchestrator import AutoK, Request, SpeculativeDecoder, reference_backend
from test_policy import CHEAP      # round costs that make AutoK speculate (no clock read)
from toy_models import toy_llama


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(base config, base weights, hybrid config, hybrid tensors): a 4-layer Llama with GDN
    layers 0, 1 and 3 (as tests/test_hybrid_host.py builds it)."""
    c, w = toy_llama(4, 64, 2, 1, 64, 64, 64, 0, context=128, name="toy", float32=True)
    cfg = hybrid_config(c, pattern="GGA", rank=4)
    d = tmp_path_factory.mktemp("hybrid")
    save_hybrid_weights(str(d), random_hybrid_tensors(cfg, seed=1, scale=0.05), cfg)
    cfg, t = load_hybrid_weights(str(d), base=c)
    return c, w, cfg, t


def _tiny(demo, fused, **_):
    cfg, tensors, _ = demo
    return TinyHybridTarget(cfg, tensors, reference_backend(), fused_state=fused)


def _llama(toy, fused, state_dtype="float32", backend=None, **kw):
    c, w, cfg, t = toy
    return LlamaHybridTarget(c, w, cfg, t, backend or reference_backend(), page_size=4,
                             state_dtype=state_dtype, fused_state=fused, **kw)


def _mtp_head(target, tmp_path):
    """A random MTP head reading the toy hybrid's block (its own KV cache)."""
    from specdec_lib.models import heads
    from specdec_lib.models.llama_draft import LlamaDraftHead
    cfg = heads.head_config("mtp", SimpleNamespace(**dict(vars(target.c), name="tiny")))
    t = heads.random_head_tensors("mtp", cfg, seed=1, scale=0.3)
    for name in [n for n in t if "shared_head.head" in n]:
        del t[name]
    path = tmp_path / "mtp"
    if not path.exists():
        heads.save_head(str(path), t, cfg)
    return LlamaDraftHead.load(target, str(path), "mtp")


def _host(a):
    """A numpy copy of a state (torch tensors: bf16 widened to float32, exactly)."""
    return a.float().cpu().numpy() if hasattr(a, "cpu") else np.array(a)


def _states(t):
    """Host copies of every GDN layer's state and conv state."""
    return [_host(L[k]) for L in t.layers if "state" in L for k in ("state", "conv_state")]


def _same_states(a, b):
    return all(np.array_equal(x, y) for x, y in zip(_states(a), _states(b), strict=True))


def _requests(seed, lens, V, new=20, sampled=False):
    rng = np.random.default_rng(seed)
    out = []
    for b, n in enumerate(lens):
        part = rng.integers(0, V, max(1, n // 2)).tolist()
        prompt = (part * 2 + rng.integers(0, V, 2).tolist())[:n]     # repeats: lookup hits
        out.append(Request(prompt=prompt, max_new_tokens=new + 3 * b,
                           temperature=0.8 if sampled and b % 2 == 0 else 0.0,
                           top_p=0.9 if sampled else 1.0, seed=100 + b))
    return out


def _with_stops(reqs, tokens):
    """Request 0 stops at its 7th token's first occurrence, request 1 at the sequence of its
    tokens 4..5; the rest unchanged (``tokens``: a decode without stops)."""
    from dataclasses import replace
    return [replace(reqs[0], stop_token_ids=[tokens[0][6]]),
            replace(reqs[1], stop_sequences=[tokens[1][4:6]])] + list(reqs[2:])


def _decode(make, draft, spec, reqs, slots=None, arrivals=None, **kw):
    """Serve ``reqs`` with a fused and a plain target; the same results in both modes and,
    after the fused target's flush, the same states. Returns the plain results."""
    out = {}
    for fused in (True, False):
        t = make(fused)
        dec = SpeculativeDecoder(t, draft(t) if draft else None, num_speculative_tokens=spec(),
                                 backend=t.be, **kw)
        res = dec.serve(reqs, slots=slots or len(reqs), arrivals=arrivals)
        m = dec.metrics
        out[fused] = ([(r.tokens, r.finish_reason) for r in res],
                      (m.rounds, m.accepted, m.proposed, m.overrun_rounds), t)
    (res_f, m_f, t_f), (res_p, m_p, t_p) = out[True], out[False]
    assert res_f == res_p
    assert m_f == m_p
    t_f.flush()
    assert _same_states(t_f, t_p)
    return res_p


TINY_CASES = {
    "greedy_k3": dict(spec=lambda: 3),
    "sampled_k2": dict(spec=lambda: 2, sampled=True),
    "auto_ragged_sampled": dict(spec=lambda: AutoK(4, costs=CHEAP), sampled=True),
    "auto_measured": dict(spec=lambda: "auto"),
    "target_only": dict(spec=lambda: 0),
    "served": dict(spec=lambda: 3, sampled=True, slots=2, arrivals=[0, 0, 1, 3, 3, 8]),
}


@pytest.mark.parametrize("run_ahead", [True, False], ids=["ahead", "sync"])
@pytest.mark.parametrize("case", TINY_CASES)
def test_tiny_hybrid_fused_equals_plain(demo, case, run_ahead):
    c = TINY_CASES[case]
    cfg, tensors, dw = demo
    n = len(c.get("arrivals") or [0] * 4)
    reqs = _requests(1, [1, 6, 19, 3, 9, 12][:n], 256, sampled=c.get("sampled", False))
    k = c["spec"]()
    draft = (lambda t: TinyMTPDraft(cfg, dw, tensors, t.be)) if k != 0 else None
    _decode(lambda f: _tiny(demo, f), draft, c["spec"], reqs, slots=c.get("slots"),
            arrivals=c.get("arrivals"), run_ahead=run_ahead)


@pytest.mark.parametrize("run_ahead", [True, False], ids=["ahead", "sync"])
def test_tiny_hybrid_fused_equals_plain_with_stops(demo, run_ahead):
    cfg, tensors, dw = demo
    reqs = _requests(2, [5, 8, 4], 256)
    draft = lambda t: TinyMTPDraft(cfg, dw, tensors, t.be)       # noqa: E731
    tokens = [r[0] for r in _decode(lambda f: _tiny(demo, f), draft, lambda: 3, reqs)]
    res = _decode(lambda f: _tiny(demo, f), draft, lambda: 3, _with_stops(reqs, tokens),
                  slots=2, arrivals=[0, 1, 2], run_ahead=run_ahead)
    assert [r[1] for r in res[:2]] == ["stop_id", "stop_sequence"]


LLAMA_CASES = {
    "ngram_k3": dict(spec=lambda: 3),
    "ngram_sampled": dict(spec=lambda: 3, sampled=True),
    "auto_ragged": dict(spec=lambda: AutoK(3, costs=CHEAP)),
    "mtp_head_k2": dict(spec=lambda: 2, draft="mtp"),
    "target_only": dict(spec=lambda: 0),
    "served_batched": dict(spec=lambda: 3, sampled=True, slots=2, arrivals=[0, 0, 1, 4, 4]),
    "served_bucketed": dict(spec=lambda: 3, slots=2, arrivals=[0, 0, 1, 4, 4],
                            prefill="bucketed"),
    "served_mtp_bucketed": dict(spec=lambda: 2, draft="mtp", slots=2, arrivals=[0, 2, 3],
                                prefill="bucketed"),
}


@pytest.mark.parametrize("run_ahead", [True, False], ids=["ahead", "sync"])
@pytest.mark.parametrize("case", LLAMA_CASES)
def test_llama_hybrid_fused_equals_plain(toy, tmp_path, case, run_ahead):
    c = LLAMA_CASES[case]
    n = len(c.get("arrivals") or [0] * 3)
    reqs = _requests(3, [9, 12, 6, 10, 7][:n], 64, new=14, sampled=c.get("sampled", False))
    if c["spec"]() == 0:
        draft = None
    elif c.get("draft") == "mtp":
        draft = lambda t: _mtp_head(t, tmp_path)                  # noqa: E731
    else:
        draft = lambda t: NgramDraft(t.be)                         # noqa: E731
    _decode(lambda f: _llama(toy, f), draft, c["spec"], reqs, slots=c.get("slots"),
            arrivals=c.get("arrivals"), run_ahead=run_ahead, prefill=c.get("prefill", "auto"))


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cuda_graph", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("case", ["ngram_sampled", "auto_ragged", "mtp_head_k2",
                                  "served_bucketed"])
def test_llama_hybrid_fused_equals_plain_gpu(toy, tmp_path, case, cuda_graph, state_dtype):
    """The torch backend on the GPU (the fused kernels, the pools' copies and fills, every
    round a CUDA graph or eager): the same tokens, acceptance and flushed states as plain."""
    from toy_models import skip_unless_torch_gpu
    skip_unless_torch_gpu()
    from specdec_lib.orchestrator import make_backend
    c = LLAMA_CASES[case]
    n = len(c.get("arrivals") or [0] * 3)
    reqs = _requests(5, [9, 12, 6, 10, 7][:n], 64, new=14, sampled=c.get("sampled", False))
    draft = (lambda t: _mtp_head(t, tmp_path)) if c.get("draft") == "mtp" else \
        (lambda t: NgramDraft(t.be))                                # noqa: E731
    _decode(lambda f: _llama(toy, f, state_dtype, make_backend("torch"), row_invariant=True),
            draft, c["spec"], reqs, slots=c.get("slots"), arrivals=c.get("arrivals"),
            prefill=c.get("prefill", "auto"), cuda_graph=cuda_graph, max_len=64)


def test_llama_hybrid_fused_equals_plain_with_stops(toy):
    reqs = _requests(4, [9, 12, 6], 64, new=16)
    draft = lambda t: NgramDraft(t.be)                             # noqa: E731
    tokens = [r[0] for r in _decode(lambda f: _llama(toy, f), draft, lambda: 3, reqs)]
    res = _decode(lambda f: _llama(toy, f), draft, lambda: 3, _with_stops(reqs, tokens))
    assert [r[1] for r in res[:2]] == ["stop_id", "stop_sequence"]


# ------------------------------------------------------------------ passes by hand

def _block(rng, V, L, q):
    """A verify block of q rows for every slot (lengths L): tokens, positions, cu_q."""
    B = len(L)
    pos = (L[:, None] + np.arange(q)).reshape(-1).astype(np.int32)
    return (rng.integers(0, V, B * q).astype(np.int32), pos,
            (np.arange(B + 1) * q).astype(np.int32))


def _lockstep(fused, plain, rounds, V, seed=0, check=None):
    """Both targets (reset alike) fed the same blocks ((q, accept_len [B]) a round): the same
    logits every pass; ``check(fused, plain, accept_len)`` after every commit."""
    rng = np.random.default_rng(seed)
    L = np.zeros(fused.batch, np.int32)
    fin = np.zeros(fused.batch, np.uint8)
    for q, acc in rounds:
        tok, pos, cu = _block(rng, V, L, q)
        acc = np.asarray(acc, np.int32)
        a, b = (t.forward(tok, pos, cu, L.copy(), fin)[0] for t in (fused, plain))
        assert np.array_equal(a, b)
        for t in (fused, plain):
            t.commit(cu, acc)
        if check is not None:
            check(fused, plain, acc)
        L += acc


def _pair(demo, toy, which, state_dtype="float32"):
    """(fused, plain, V): one hybrid target in both modes ("tiny" or "llama"), each reset for
    2 slots of 40 positions; V its vocabulary."""
    if which == "tiny":
        fused, plain, V = _tiny(demo, True), _tiny(demo, False), 256
    else:
        fused, plain, V = _llama(toy, True, state_dtype), _llama(toy, False, state_dtype), 64
    for t in (fused, plain):
        t.reset(2, 40)
    return fused, plain, V


ROUNDS = [(4, [2, 4]), (3, [0, 3]), (1, [1, 1]), (4, [4, 1]), (2, [2, 0]), (3, [1, 2])]


@pytest.mark.parametrize("which", ["tiny", "llama_f32", "llama_bf16"])
def test_flush_catches_the_plain_states_up(demo, toy, which):
    """Rounds of ragged acceptance (0 to all rows): after each commit the fused states lag
    by the accepted rows (differ exactly where a slot accepted some), after ``flush`` they
    equal the plain states bit for bit, and decoding goes on from them unchanged."""
    fused, plain, V = _pair(demo, toy, which.split("_")[0],
                            "bfloat16" if which == "llama_bf16" else "float32")

    def check(f, p, acc):
        before = [np.array_equal(x, y) for x, y in zip(_states(f), _states(p))]
        assert all(before) == (acc.sum() == 0), before
        f.flush()
        assert _same_states(f, p)
    _lockstep(fused, plain, ROUNDS, V, check=check)
    _lockstep(fused, plain, ROUNDS[:2], V, seed=1)        # flushed every round: the same


@pytest.mark.parametrize("which", ["tiny", "llama"])
def test_second_forward_before_commit_applies_nothing_twice(demo, toy, which):
    """A forward repeated before its commit (what a fused pass consumed is no longer pending)
    gives the plain mode's logits both times, and the states stay the plain mode's."""
    fused, plain, V = _pair(demo, toy, which)
    _lockstep(fused, plain, ROUNDS[:2], V)
    rng = np.random.default_rng(5)
    L = np.asarray([2, 7], np.int32)
    tok, pos, cu = _block(rng, V, L, 3)
    fin = np.zeros(2, np.uint8)
    want = plain.forward(tok, pos, cu, L, fin)[0]
    for _ in range(2):
        assert np.array_equal(fused.forward(tok, pos, cu, L, fin)[0], want)
    for t in (fused, plain):
        t.commit(cu, np.asarray([3, 1], np.int32))
    fused.flush()
    assert _same_states(fused, plain)


def test_forward_past_the_pools_runs_plain(toy):
    """A LlamaHybridTarget reset for blocks of 2 rows a slot: a 3-row forward flushes and
    runs plain (its commit by gdn_commit), 2-row ones run fused; logits and states as plain."""
    fused, plain = _llama(toy, True), _llama(toy, False)
    fused.reset(2, 40, block_rows=2)
    plain.reset(2, 40)
    assert fused._journals.rows == 4
    modes = []
    _lockstep(fused, plain, [(2, [1, 2]), (3, [3, 1]), (2, [2, 2]), (1, [1, 0])], 64,
              check=lambda f, p, acc: modes.append(f._fused_pass))
    assert modes == [True, False, True, True]
    fused.flush()
    assert _same_states(fused, plain)


@pytest.mark.parametrize("which", ["tiny", "llama"])
def test_reset_slots_drops_pending_rows(demo, toy, which):
    """A slot given to a new request has nothing pending (its rows would otherwise be
    applied to the fresh state); the other slot's pending rows stay."""
    fused, plain, V = _pair(demo, toy, which)
    _lockstep(fused, plain, ROUNDS[:1], V)
    assert fused._journals.len.tolist() == [2, 4]
    for t in (fused, plain):
        t.reset_slots(np.asarray([0], np.int64))
    assert fused._journals.len.tolist() == [0, 4]
    _lockstep(fused, plain, ROUNDS[1:3], V, seed=2)
    fused.flush()
    assert _same_states(fused, plain)


def test_decoder_sizes_the_pools_by_k_max(toy):
    """SpeculativeDecoder tells a LlamaHybridTarget its rounds' rows a slot (k_max + 1):
    pools of B * (k_max + 1) rows; reset alone gives 16 a slot (verify_attention's most)."""
    t = _llama(toy, True)
    t.reset(3, 30)
    assert t._journals.rows == 3 * 16
    assert t._journals.journal[0].shape == (3, 3 * 16, t.be.gdn_journal_width(2, 2, 64, 64))
    dec = SpeculativeDecoder(t, NgramDraft(t.be), num_speculative_tokens=AutoK(3, costs=CHEAP),
                             backend=t.be)
    dec.generate(_requests(5, [9, 12, 6], 64, new=6))
    assert t._journals.rows == 3 * 4
    assert t._journals.conv_rows[1].shape == (3, 3 * 4, t.d.conv_dim)
    assert _llama(toy, False)._journals is None


def test_fused_journals_writes_on_torch_tensors():
    """FusedJournals' own writes on torch tensors (CPU): a pass's rows copied to the pending
    pools for every layer, row0 / len from cu_q / accept_len, len zeroed by ``applied`` and
    ``flush`` (which calls the flush ops once a layer with the pending pools)."""
    torch = pytest.importorskip("torch")
    G, B, rows = 2, 3, 12
    fj = FusedJournals(lambda shape, dt: torch.zeros(shape, dtype=dt), torch.float32,
                       torch.int32, torch.bfloat16, 5, 7, G, B, rows)
    conv_kw, journal, gdn_kw = fj.layer(1, 9)
    assert journal.shape == (9, 5) and journal.data_ptr() == fj.journal[0][1].data_ptr()
    assert conv_kw["journal"].shape == (9, 7) and conv_kw["journal"].dtype == torch.bfloat16
    assert gdn_kw["pending_journal"].shape == (rows, 5)
    fj.journal[0].fill_(1)                  # rows past the pass's: never copied
    fj.journal[0][:, :9] = torch.arange(G * 9 * 5, dtype=torch.float32).reshape(G, 9, 5)
    fj.conv_rows[0][:, :9] = 2
    fj.applied(9)
    fj.commit(torch.tensor([0, 3, 6, 9], dtype=torch.int32), torch.tensor([1, 3, 0],
                                                                          dtype=torch.int32))
    assert torch.equal(fj.journal[1][:, :9], fj.journal[0][:, :9])
    assert bool((fj.conv_rows[1][:, :9] == 2).all()) and bool((fj.journal[1][:, 9:] == 0).all())
    assert fj.row0.tolist() == [0, 3, 6] and fj.len.tolist() == [1, 3, 0]
    calls = []
    be = SimpleNamespace(gdn_flush=lambda *a: calls.append(("gdn",) + a),
                         conv1d_flush=lambda *a: calls.append(("conv",) + a))
    fj.flush(be, [("s0", "c0"), ("s1", "c1")], "slots")
    assert [(c[0], c[1], c[3].data_ptr()) for c in calls] == [
        ("gdn", "s0", fj.journal[1][0].data_ptr()), ("conv", "c0", fj.conv_rows[1][0].data_ptr()),
        ("gdn", "s1", fj.journal[1][1].data_ptr()), ("conv", "c1", fj.conv_rows[1][1].data_ptr())]
    assert fj.len.tolist() == [0, 0, 0]
    fj.len[...] = 4
    fj.applied(9)
    assert fj.len.tolist() == [0, 0, 0]
