"""models.kv_agreement (issue 32's agreement bar) on the CPU reference backend, with the tiny
random Llama of tests/test_llama.py: the teacher-forced pass through verify blocks over the
target's own cache, and the agreement report of an 8-bit-cache run against the 16-bit one.

* 16-bit against itself: every position agrees, every request identical, nothing listed; the
  teacher-forced argmax is the greedy reply token and its logits are ``score``'s (the plain
  prefill pass) at every position, whatever the block size;
* an 8-bit cache where the toy's greedy tokens change (seed 7: one prompt departs at
  position 5): the agreement counts equal an independent count over ``score``, the
  free-running divergence is where the replies first differ, and the teacher-forced pass
  disagrees there too (same prefix, same logits);
* bad arguments refused.
"""
import numpy as np
import pytest

from specdec_lib.models.kv_agreement import agreement, first_divergence, teacher_forced
from test_llama_kv8 import _generate, _prompts as prompts_with_repeats
from test_llama import _tiny_target


def generate(t, prompts, n_new):
    """Greedy target-only replies (lists of ids)."""
    return [list(r) for r in _generate(t, None, 0, prompts, n_new)[0]]


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([4], [5]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], []) is None


def _score_rows(t, prompt, reply):
    """Host float64 logits [len(reply), V] of ``t.score`` (one prefill pass) at the rows
    that predict ``reply``."""
    seq = list(prompt) + list(reply)
    return np.asarray(t.score(seq[:-1]), np.float64)[len(prompt) - 1:]


@pytest.mark.parametrize("block_rows", [16, 5, 1])
def test_16bit_against_itself(block_rows):
    t = _tiny_target(np.random.default_rng(7))
    prompts = prompts_with_repeats(11, 4)
    replies = generate(t, prompts, 24)
    replies[2] = replies[2][:9]           # uneven lengths: blocks end at different rows
    replies[3] = replies[3][:1]
    sc = teacher_forced(t, prompts, replies, block_rows=block_rows,
                        max_len=None if block_rows == 16 else 60)     # wider pages: same
    for p, r, s in zip(prompts, replies, sc):
        assert len(s.given) == len(r)
        np.testing.assert_array_equal(s.argmax, r)       # greedy: the reply is the argmax
        rows = _score_rows(t, p, r)
        np.testing.assert_allclose(s.top1, rows.max(axis=1), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(s.given, rows[np.arange(len(r)), r], rtol=1e-9, atol=1e-9)
        assert (s.top1 > s.top2).all()
        assert (s.runner_up != s.argmax).all()
    rep = agreement(replies, sc, replies, sc)
    tf, fr = rep["teacher_forced"], rep["free_running"]
    assert tf == dict(positions=24 + 24 + 9 + 1, agreeing=58, fraction=1.0, exact_ties=0,
                      disagreements=0, listed=[])
    assert fr["identical"] == 4 and fr["first_divergence"] == [None] * 4
    assert fr["divergences"] == [] and fr["common_prefix_fraction"] == 1.0
    assert fr["median_base_gap"] is None


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "int8"])
def test_8bit_cache_against_16bit(kv_dtype):
    seed = 7
    t16 = _tiny_target(np.random.default_rng(seed))
    t8 = _tiny_target(np.random.default_rng(seed), kv_dtype=kv_dtype)
    prompts = prompts_with_repeats(11, 4)
    base = generate(t16, prompts, 24)
    free = generate(t8, prompts, 24)        # records the fp8 scales, as decoding does
    base_sc = teacher_forced(t16, prompts, base)
    sc = teacher_forced(t8, prompts, base)
    rep = agreement(base, base_sc, free, sc, tie=0.25)
    tf, fr = rep["teacher_forced"], rep["free_running"]
    print(kv_dtype, tf, fr)
    # the pass read the 8-bit cache: its logits are not the 16-bit target's
    assert max(np.abs(a.top1 - b.top1).max() for a, b in zip(sc, base_sc)) > 1e-4
    # an independent count: t8's plain prefill pass (score) over the 16-bit sequences
    want = sum(int((_score_rows(t8, p, r).argmax(axis=1) == np.asarray(r)).sum())
               for p, r in zip(prompts, base))
    assert tf["positions"] == 96 and tf["agreeing"] == want
    assert 0.9 <= tf["fraction"] < 1.0 and tf["disagreements"] == 96 - want
    for d in tf["listed"]:
        assert d["margin"] > 0 and d["base_gap"] > 0 and d["token"] != d["base_token"]
    firsts = [first_divergence(a, b) for a, b in zip(base, free)]
    assert fr["first_divergence"] == firsts and fr["identical"] == firsts.count(None)
    assert 1 <= len(fr["divergences"]) < 4
    listed = {(d["request"], d["position"]) for d in tf["listed"]}
    for d in fr["divergences"]:
        i, j = d["request"], d["position"]
        assert base[i][:j] == free[i][:j] and base[i][j] != free[i][j]
        assert (d["base_token"], d["token"]) == (base[i][j], free[i][j])
        # same prefix: the teacher-forced pass is the free run's pass there
        assert d["teacher_forced_agrees"] is False and (i, j) in listed
        rows = _score_rows(t16, prompts[i], base[i])
        top = np.sort(rows[j])[-2:]
        assert d["base_gap"] == pytest.approx(top[1] - top[0], abs=1e-4)
        assert d["base_runner_up"] == (int(np.argsort(rows[j])[-2]) == free[i][j])
    assert fr["near_ties"] == sum(d["base_gap"] < 0.25 for d in fr["divergences"])
    assert 0 < fr["common_prefix_fraction"] < 1


def test_bad_arguments_refused():
    t = _tiny_target(np.random.default_rng(0))
    with pytest.raises(ValueError, match="block_rows"):
        teacher_forced(t, [[1, 2]], [[3]], block_rows=17)
    with pytest.raises(ValueError, match="block_rows"):
        teacher_forced(t, [[1, 2]], [[3]], block_rows=0)
    with pytest.raises(ValueError, match="replies"):
        teacher_forced(t, [[1, 2], [3]], [[3]])
    with pytest.raises(ValueError, match="prompts"):
        teacher_forced(t, [[]], [[3]])
    with pytest.raises(ValueError, match="max_len"):
        teacher_forced(t, [[1, 2]], [[3, 4]], max_len=3)
    sc = teacher_forced(t, [[1, 2]], [[3, 4]])
    with pytest.raises(ValueError, match="one entry per request"):
        agreement([[3, 4]], sc, [], sc)
    with pytest.raises(ValueError, match="positions"):
        agreement([[3, 4, 5]], sc, [[3, 4, 5]], sc)


def test_e2e_kv_agreement_mode_on_a_toy(monkeypatch, tmp_path, capsys):
    """tools/perf/e2e_smollm2.py --kv-agreement fp8,int8 on the reference backend with the
    toy (seed 7) in SmolLM2's place: a bf16 entry over its own replies (all agree), an entry
    per 8-bit cache with the divergence of the library test above (fp8: its recorded scales),
    prompt lookup == target-only for each, the JSON and the table written."""
    import importlib.util
    import json
    import os
    import sys
    path = os.path.join(os.path.dirname(__file__), "..", "tools", "perf", "e2e_smollm2.py")
    spec = importlib.util.spec_from_file_location("e2e_smollm2_under_test", path)
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)
    prompts = prompts_with_repeats(11, 4)

    from specdec_lib.models import smollm2
    from toy_models import toy_llama
    monkeypatch.setattr(smollm2, "load_smollm2",
                        lambda path, progress: (*toy_llama(rng=np.random.default_rng(7)), None))
    monkeypatch.setattr(e2e, "pool_of", lambda n: {"toy": prompts[:n]})
    monkeypatch.setattr(e2e, "chat_prompt", lambda tok, t: list(t))
    out = tmp_path / "kva.json"
    monkeypatch.setattr(sys, "argv", ["e2e", "--backend", "reference", "--kv-agreement", "fp8,int8",
                                      "--sets", "toy", "--per-set", "4", "--new", "24",
                                      "--drafts", "ngram", "--json", str(out)])
    e2e.main()
    r = json.loads(out.read_text())
    assert r["kv_dtypes"] == ["bfloat16", "fp8_e4m3", "int8"] and r["requests"] == 4
    assert r["bfloat16"]["self"]["teacher_forced"]["fraction"] == 1.0
    for kv in ("fp8_e4m3", "int8"):
        a = r[kv]["agreement"]
        assert a["teacher_forced"]["agreeing"] == 95 and a["teacher_forced"]["positions"] == 96
        assert a["free_running"]["first_divergence"] == [None, 5, None, None]
    assert np.array(r["fp8_e4m3"]["fp8_scales"]["k"]).shape == (2, 2)
    assert "fp8_scales" not in r["int8"]
    for kv in r["kv_dtypes"]:
        assert r[kv]["ngram_k3"]["identical_requests"] == 4
        assert r[kv]["ngram_k3"]["first_divergence"] == [None] * 4
    text = capsys.readouterr().out
    assert "int8 diverges from bf16 at (request, position, bf16 gap): (1, 5, " in text
    assert "95/96" in text


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "int8"])
@pytest.mark.parametrize("row_invariant,block_rows", [(True, 16), (False, 1)])
def test_torch_gpu_agreement(kv_dtype, row_invariant, block_rows):
    """The torch backend (verify_attention over the 8-bit cache, torch's top-2), caches as
    wide as the decoder's (the same KV split): with row-invariant GEMMs a 16-row block has
    the bits of one-row decoding, and one-row blocks of the whole batch are the decode's own
    shape, so the bf16 target over its own replies agrees everywhere either way; the 8-bit
    one mostly."""
    from specdec_lib.orchestrator import Request, SpeculativeDecoder
    from toy_models import skip_unless_torch_gpu
    skip_unless_torch_gpu()
    kw = dict(backend="torch", row_invariant=row_invariant)
    t16 = _tiny_target(np.random.default_rng(7), **kw)
    t8 = _tiny_target(np.random.default_rng(7), kv_dtype=kv_dtype, **kw)
    prompts = prompts_with_repeats(11, 4)
    width = SpeculativeDecoder.positions_needed(
        [Request(prompt=p, max_new_tokens=24) for p in prompts], 0)
    base = generate(t16, prompts, 24)
    base_sc = teacher_forced(t16, prompts, base, block_rows, max_len=width)
    assert agreement(base, base_sc, base, base_sc)["teacher_forced"]["fraction"] == 1.0
    rep = agreement(base, base_sc, generate(t8, prompts, 24),
                    teacher_forced(t8, prompts, base, block_rows, max_len=width))
    print(kv_dtype, rep)
    assert rep["teacher_forced"]["fraction"] >= 0.9
