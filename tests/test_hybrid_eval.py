"""``python -m specdec_lib eval-hybrid`` (specdec_lib.train.hybrid_eval) at toy size on the CPU:

* a hybrid with no GDN layer (pattern all attention: the base model itself) scores ratio 1,
  KL 0, agreement 1, identical replies; its perplexity is the one the reference host model's
  logits give over the same windows;
* a random GDN hybrid's report is consistent (ratio = hybrid / base, the pooled numbers the
  token-weighted ones of the sources, the base's numbers unchanged by the hybrid);
* the prompts and the natural-text sources are held out from the training set;
* ``--help`` works without torch.
"""
import json
import math

import numpy as np
import pytest

from specdec_lib.models.smollm2_hybrid import (hybrid_config, random_hybrid_tensors,
                                               save_hybrid_weights)
from toy_models import toy_gguf, toy_llama

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

TEXT = ("the quick brown fox jumps over the lazy dog and then it runs back into the deep "
        "forest where the other animals wait for the night to come ") * 6


def _toy(tmp_path):
    """(GGUF path, its LlamaConfig): a 4-layer Llama of head dim 64 (the host GDN kernels'),
    a letters tokenizer and a chat template."""
    from specdec_lib.models.gguf_llama import read_gguf_llama
    c, _ = toy_llama(4, 64, 2, 1, 64, 64, 64, 0, context=128, name="toy", float32=True)
    path = tmp_path / "toy.gguf"
    toy_gguf(path, c, chat_template="{% for m in messages %}<|im_start|>{{ m['content'] }}"
             "<|im_end|>{% endfor %}<|im_start|>")
    config, weights, tok = read_gguf_llama(str(path), progress=False)
    return str(path), config, weights, tok


def _hybrid(tmp_path, config, pattern, name):
    cfg = hybrid_config(config, pattern=pattern, rank=4)
    d = tmp_path / name
    save_hybrid_weights(str(d), random_hybrid_tensors(cfg, seed=3, scale=0.3), cfg)
    return str(d)


def _run(tmp_path, gguf, weights, name, *extra):
    from specdec_lib.train.hybrid_eval import main
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(TEXT)
    b.write_text(TEXT[::-1])
    out = tmp_path / f"{name}.json"
    md = tmp_path / f"{name}.md"
    argv = ["--gguf", gguf, "--weights", weights, "--sources", "none", "--text", str(a),
            "--text", str(b), "--max-tokens", "160", "--window", "48", "--prompts", "3",
            "--new-tokens", "6", "--device", "cpu", "--json", str(out), "--md", str(md),
            "--quiet", *extra]
    assert main(argv) == 0
    return json.loads(out.read_text()), md.read_text()


def _ppl_by_host(config, weights, tok, text, cap, window):
    """exp(mean NLL) of the reference host model's logits over eval-hybrid's windows."""
    from specdec_lib.models.llama import LlamaTarget
    from specdec_lib.orchestrator import make_backend
    from specdec_lib.train.hybrid_eval import source_windows
    t = LlamaTarget(config, weights, make_backend("reference"))
    nll = n = 0.0
    for w in source_windows(text, tok, cap, window):
        lg = np.asarray(t.score(w), np.float64)[:-1]
        lg = lg - lg.max(-1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        nll -= lp[np.arange(len(w) - 1), w[1:]].sum()
        n += len(w) - 1
    return math.exp(nll / n), int(n)


def test_eval_hybrid_identity_and_consistency(tmp_path):
    gguf, config, weights, tok = _toy(tmp_path)
    same, md = _run(tmp_path, gguf, _hybrid(tmp_path, config, "A", "same"), "same")
    srcs = same["natural"]["sources"]
    assert [s["source"] for s in srcs] == ["file:a.txt", "file:b.txt"]
    assert same["missing_sources"] == []
    for s in srcs + [same["natural"]["overall"]]:
        assert s["ppl_ratio"] == 1.0 and s["base_ppl"] == s["hybrid_ppl"] > 1
        assert abs(s["kl"]) < 1e-6 and s["greedy_agreement"] == 1.0
    # the windows: 160 tokens per source (80 each of two sources... the cap splits evenly)
    assert srcs[0]["windows"] == 2 and srcs[0]["tokens"] == 80 - 2
    # the scoring is the model's: the reference host model's logits give the same perplexity
    ppl, n = _ppl_by_host(config, weights, tok, TEXT, 80, 48)
    assert n == srcs[0]["tokens"]
    assert srcs[0]["base_ppl"] == pytest.approx(ppl, rel=1e-4)
    reps = same["replies"]
    assert len(reps) == 3 and [r["family"] for r in reps] == ["translation"] * 3
    assert all(r["first_divergence"] is None and r["tf_agreement"] == 1.0 and r["tie_flips"] == 0
               and r["base"] == r["hybrid"] and r["base_tokens"] == 6 for r in reps)
    o = same["replies_overall"]
    assert o["base_ppl"] == o["hybrid_ppl"] and o["ppl_ratio"] == 1.0
    assert {k: o[k] for k in ("tokens", "tf_agreement", "identical", "tie_flips")} == \
        dict(tokens=18, tf_agreement=1.0, identical=3, tie_flips=0)
    assert "| **all (pooled)** |" in md and md.count("\n| file:") == 2
    assert "| # | SmolLM2-135M-Instruct | smollm2-hybrid |" in md

    # a random GDN hybrid: different numbers, the same base, a consistent report
    hyb, md = _run(tmp_path, gguf, _hybrid(tmp_path, config, "GA", "gdn"), "gdn")
    tot_n = tot_b = tot_h = 0.0
    for s, s0 in zip(hyb["natural"]["sources"], srcs):
        assert s["base_ppl"] == s0["base_ppl"] and s["tokens"] == s0["tokens"]
        assert s["ppl_ratio"] == pytest.approx(s["hybrid_ppl"] / s["base_ppl"], abs=2e-4)
        assert s["ppl_ratio"] != 1.0 and s["kl"] > 1e-4 and 0 <= s["greedy_agreement"] <= 1
        tot_n += s["tokens"]
        tot_b += s["tokens"] * math.log(s["base_ppl"])
        tot_h += s["tokens"] * math.log(s["hybrid_ppl"])
    o = hyb["natural"]["overall"]
    assert o["tokens"] == tot_n
    assert o["base_ppl"] == pytest.approx(math.exp(tot_b / tot_n), rel=1e-4)
    assert o["hybrid_ppl"] == pytest.approx(math.exp(tot_h / tot_n), rel=1e-4)
    assert hyb["natural"]["worst"] == max(hyb["natural"]["sources"],
                                          key=lambda s: s["ppl_ratio"])["source"]
    # the base model's greedy replies do not depend on the hybrid; the hybrid's do
    assert [r["base"] for r in hyb["replies"]] == [r["base"] for r in reps]
    assert any(r["first_divergence"] is not None for r in hyb["replies"])
    o = hyb["replies_overall"]
    assert o["tie_flips"] == 0 and o["ppl_ratio"] == pytest.approx(
        o["hybrid_ppl"] / o["base_ppl"], rel=1e-3) and o["ppl_ratio"] != 1.0
    for r in hyb["replies"]:
        if r["first_divergence"] == 0:        # differs at once: the first argmax disagrees
            assert r["tf_agreement"] < 1

    # --context chat: the same positions scored after the template's opening (unscored)
    ctx, md = _run(tmp_path, gguf, _hybrid(tmp_path, config, "A", "same"), "ctx",
                   "--context", "chat", "--prompts", "0")
    assert ctx["context"]["kind"] == "chat" and ctx["context"]["tokens"] >= 1
    assert ctx["replies"] == [] and "Greedy replies" not in md
    for s, s0 in zip(ctx["natural"]["sources"], srcs):
        assert s["tokens"] == s0["tokens"] and s["ppl_ratio"] == 1.0 and abs(s["kl"]) < 1e-6
        assert s["base_ppl"] != s0["base_ppl"]            # the context changes the base's


def test_prompts_and_sources_are_held_out():
    from specdec_lib.models.prompts import stdlib_prompts
    from specdec_lib.train import prompt_mix as pm
    from specdec_lib.train.hybrid_eval import NATURAL_SOURCES, NEW_PROMPTS, prompts
    items = prompts()
    assert len(items) == 16
    assert [f for f, _ in items] == ["translation"] * 4 + ["chat"] * 4 + ["new"] * 8
    assert all(m[-1]["role"] == "user" for _, m in items)
    assert any(len(m) > 2 for f, m in items if f == "chat")              # multi-turn
    words = list(pm._TOPICS) + list(pm._CONCEPTS) + list(pm._SUBJECTS) + \
        [s for pair in pm._SITUATIONS for s in pair]
    for p in NEW_PROMPTS:
        assert not [w for w in words if w.lower() in p.lower()], p
    assert set(pm.HELDOUT_FAMILIES) == {"translation", "chat"}
    # no training docstring (either prompt set's) is in the scored part of any source
    docs = [d for _, d in pm._stdlib_text()[0]] + \
        [p.split("\n\n", 1)[1] for p in stdlib_prompts("train", None, 1) if "\n\n" in p]
    heads = {d.strip()[:100] for d in docs if len(d.strip()) >= 100}
    assert len(heads) > 500
    found = 0
    for name, (_, get) in NATURAL_SOURCES.items():
        text, files = get()
        if len(text) < 200:
            continue
        found += 1
        scored = text[:40000]
        assert not [h for h in heads if h in scored], name
    assert found >= 1


def test_eval_hybrid_help_without_torch():
    from toy_models import cli_without_torch
    p = cli_without_torch("eval-hybrid", "--help")
    assert p.returncode == 0, p.stderr
    assert "--max-tokens" in p.stdout and "--weights" in p.stdout
    assert "eval-hybrid" in cli_without_torch("--help").stdout
