"""An MTP head for the smollm2-hybrid at toy size on the CPU: ``train-draft --hybrid DIR``
trains one on the hybrid's own forward (train.hybrid_model) and writes it into DIR, recording
the hybrid it is for; it loads onto the host model (LlamaHybridTarget) and decodes losslessly
on the reference backend; --method eagle3 with --hybrid, a head of another hidden size, and
a missing head are refused naming the argument."""
import json

import numpy as np
import pytest

from specdec_lib.models.smollm2_hybrid import (hybrid_config, load_hybrid_weights,
                                               random_hybrid_tensors, save_hybrid_weights)
from specdec_lib.orchestrator import Request, SpeculativeDecoder, make_backend
from toy_models import toy_gguf, toy_llama

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_toy(tmp_path_factory.mktemp("hybrid_draft"))


def make_toy(d):
    """(d, gguf path, base config, base weights, hybrid dir, data npz, prompts) in directory
    d: a 4-layer Llama of head dim 64 (the gdn kernels' and verify_attention's) as a GGUF, a
    random hybrid (GGA tiled: GGAG) of it recording the GGUF's sha256, and as data the
    hybrid's own greedy replies (16 tokens) to 30 random prompts, 24 trained on."""
    from specdec_lib.models.gguf_llama import read_gguf_llama, sha256_of
    from specdec_lib.train.data import save_data
    c, _ = toy_llama(4, 64, 2, 1, 64, 64, 64, 0, context=128, name="toy", float32=True)
    toy_gguf(d / "toy.gguf", c)
    config, weights, _ = read_gguf_llama(str(d / "toy.gguf"), progress=False)
    cfg = hybrid_config(config, pattern="GGA", rank=4, base_sha256=sha256_of(d / "toy.gguf"))
    save_hybrid_weights(str(d / "hybrid"), random_hybrid_tensors(cfg, seed=1, scale=0.05), cfg)
    toy = (d, d / "toy.gguf", config, weights, d / "hybrid", d / "d.npz")
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 64, int(rng.integers(4, 9))).tolist() for _ in range(30)]
    replies, _ = _generate(_host(toy), None, 0, prompts)
    save_data(str(toy[5]), [np.array(p + r) for p, r in zip(prompts, replies)],
              [len(p) for p in prompts], [0] * 24 + [1] * 6)
    return toy + (prompts,)


def _argv(toy, *extra):
    d, gguf, _, _, hybrid, data = toy[:6]
    return ["--hybrid", str(hybrid), "--gguf", str(gguf), "--data", str(data), "--steps", "2",
            "--batch-tokens", "256", "--mtp-intermediate", "32", "--max-iters", "3",
            "--device", "cpu", "--quiet", *extra]


def _host(toy):
    from specdec_lib.models.llama_hybrid import LlamaHybridTarget
    _, _, config, weights, hybrid = toy[:5]
    cfg, t = load_hybrid_weights(str(hybrid), base=config)
    return LlamaHybridTarget(config, weights, cfg, t, make_backend("reference"), page_size=4)


def _generate(target, draft, k, prompts):
    dec = SpeculativeDecoder(target, draft, num_speculative_tokens=k, backend=target.be)
    res = dec.generate([Request(prompt=p, max_new_tokens=16) for p in prompts])
    return [r.tokens for r in res], dec.metrics


def test_train_draft_hybrid_writes_a_head_that_decodes_losslessly(toy):
    """train-draft --hybrid DIR (no --out): 40 updates on the hybrid's own replies, the head
    in DIR/smollm2_hybrid_mtp with the hybrid's sha256 and the command; loaded onto the host
    model (found by ``heads.hybrid_head``) speculative (k = 1, 3) == target-only token for
    token, and the head has learnt what the host model computes: most drafts of the training
    prompts accepted (measured: 67 of 102 at k = 3; a random head gets about 1 in 64)."""
    pytest.importorskip("torch")
    from specdec_lib.models.heads import hybrid_head
    from specdec_lib.models.llama_draft import LlamaDraftHead
    from specdec_lib.train.cli import main
    hybrid, prompts = toy[4], toy[6]
    argv = _argv(toy, "--steps", "3", "--lr", "1e-2")
    argv[argv.index("--max-iters") + 1] = "40"
    assert main(argv) == 0
    path = hybrid_head(str(hybrid))
    assert path == str(hybrid / "smollm2_hybrid_mtp")
    cfg = json.loads((hybrid / "smollm2_hybrid_mtp" / "config.json").read_text())
    hcfg = json.loads((hybrid / "config.json").read_text())
    assert cfg["target_model"] == "smollm2_hybrid" and cfg["architectures"] == ["LlamaMTPDraft"]
    assert cfg["target_hybrid_weights_sha256"] == hcfg["weights_sha256"]
    tr = cfg["specdec_training"]
    assert tr["command"] == "python -m specdec_lib train-draft " + " ".join(argv)
    assert tr["heldout"]["anchors"] > 0 and len(tr["heldout"]["step_accuracy"]) == 3
    load_hybrid_weights(str(hybrid))            # the head inside DIR leaves the hybrid valid
    t = _host(toy)
    head = LlamaDraftHead.load(t, path)
    assert head.layout == "deepseek_mtp" and head.I == 32
    base, _ = _generate(t, None, 0, prompts[:6])
    for k in (1, 3):
        spec, m = _generate(t, head, k, prompts[:6])
        assert spec == base, k
    assert m.accepted > 0.4 * m.proposed, m


def test_train_draft_hybrid_refuses_eagle3(toy, capsys):
    pytest.importorskip("torch")
    from specdec_lib.train.cli import main
    for method in ("eagle3", "both"):
        with pytest.raises(SystemExit) as e:
            main(_argv(toy, "--method", method, "--out", str(toy[0] / "never")))
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"--method {method}" in err and "--hybrid" in err and "--method mtp" in err
    assert not (toy[0] / "never").exists()
    with pytest.raises(SystemExit):
        main(["--data", "x.npz"])                        # no --out, no --hybrid
    assert "--out is required" in capsys.readouterr().err


def test_train_draft_hybrid_refuses_another_base(toy, tmp_path):
    """A hybrid distilled from another GGUF: refused naming --hybrid and --gguf."""
    pytest.importorskip("torch")
    from specdec_lib.models.smollm2_hybrid import HybridWeightsError
    from specdec_lib.train.cli import main
    _, _, config, _, hybrid = toy[:5]
    cfg, t = load_hybrid_weights(str(hybrid), base=config)
    other = tmp_path / "other"
    save_hybrid_weights(str(other), t, dict(cfg, base_gguf_sha256="0" * 64))
    argv = _argv(toy, "--out", str(tmp_path / "out"))
    argv[argv.index("--hybrid") + 1] = str(other)
    with pytest.raises(HybridWeightsError, match="--hybrid .*other.*--gguf"):
        main(argv)


def _other_head(tmp_path, hidden):
    """A random MTP head for a Llama of hidden size ``hidden`` (vocab 64)."""
    from specdec_lib.models import heads
    c, _ = toy_llama(4, hidden, 2, 1, 64, 64, 64, 0, name="other")
    cfg = heads.head_config("mtp", c)
    return heads.save_head(str(tmp_path / f"head{hidden}"),
                           heads.random_head_tensors("mtp", cfg, seed=2), cfg)


def test_head_of_another_hidden_size_refused(toy, tmp_path, capsys):
    """A head of hidden 48 for the hybrid of 64: ``hybrid_head`` and the demo's --head refuse
    it naming the head before anything loads (the demo's without the real GGUF even being
    read), and so does LlamaDraftHead on the host model; no head in DIR: the demo's
    --draft mtp names the train-draft command; an EAGLE3 --draft is refused."""
    from specdec_lib import demo
    from specdec_lib.models.heads import hybrid_head
    from specdec_lib.models.llama_draft import LlamaDraftHead
    hybrid = toy[4]
    bad = _other_head(tmp_path, 48)
    with pytest.raises(ValueError, match="head .*head48.*hidden size 48.*is 64"):
        hybrid_head(str(hybrid), bad)
    with pytest.raises(ValueError, match="hidden 48"):
        LlamaDraftHead.load(_host(toy), bad)
    run = ["--model", "smollm2-hybrid", "--weights", str(hybrid), "--backend", "reference",
           "--no-progress"]
    assert demo.main(run + ["--head", bad]) == 2
    err = capsys.readouterr().err
    assert "--head" in err and "hidden size 48" in err
    empty = tmp_path / "empty_hybrid"                # the hybrid's files, no head beside them
    empty.mkdir()
    for f in ("config.json", "model.safetensors"):
        (empty / f).write_bytes((hybrid / f).read_bytes())
    with pytest.raises(FileNotFoundError, match="train-draft --hybrid"):
        hybrid_head(str(empty))
    run[run.index("--weights") + 1] = str(empty)
    assert demo.main(run + ["--draft", "mtp"]) == 2
    err = capsys.readouterr().err
    assert "--draft mtp" in err and "train-draft --hybrid" in err
    assert demo.main(run + ["--draft", "eagle3"]) == 2
    assert "--draft eagle3" in capsys.readouterr().err
    assert demo.main(run[:2] + ["--draft", "ngram", "--head", bad]) == 2
    assert "--head" in capsys.readouterr().err


def test_train_draft_hybrid_init_continues_its_head(toy, tmp_path, capsys):
    """--hybrid with --init: a head trained for the hybrid (3 updates, in OUT) continued with
    0 updates from OUT (the DIR holding smollm2_hybrid_mtp) is the same tensors, for the same
    hybrid, with OUT's record as its ``init``; a plain Llama head (for the GGUF 'other') is
    refused naming --init and --hybrid, and so is the hybrid's own DIR without a head in it."""
    pytest.importorskip("torch")
    from safetensors.torch import load_file
    from specdec_lib.train.cli import main
    hybrid = toy[4]
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(_argv(toy, "--out", str(first))) == 0
    assert main(_argv(toy, "--out", str(second), "--init", str(first), "--max-iters", "0")) == 0
    a, b = (load_file(str(d / "smollm2_hybrid_mtp" / "model.safetensors")) for d in (first, second))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    ca, cb = (json.loads((d / "smollm2_hybrid_mtp" / "config.json").read_text())
              for d in (first, second))
    assert cb["specdec_training"]["init"] == ca["specdec_training"]
    assert cb["target_hybrid_weights_sha256"] == ca["target_hybrid_weights_sha256"]
    assert cb["intermediate_size"] == 32 and "target_gguf_sha256" not in cb
    with pytest.raises(ValueError, match="--init .*head64: a head for another target.*--hybrid"):
        main(_argv(toy, "--out", str(tmp_path / "never"), "--init", _other_head(tmp_path, 64),
                   "--mtp-intermediate", "64"))
    empty = tmp_path / "bare_hybrid"
    empty.mkdir()
    for f in ("config.json", "model.safetensors"):
        (empty / f).write_bytes((hybrid / f).read_bytes())
    with pytest.raises(SystemExit):
        main(_argv(toy, "--out", str(tmp_path / "never"), "--init", str(empty)))
    assert "--init" in (err := capsys.readouterr().err) and "not a head" in err
    assert not (tmp_path / "never").exists()
