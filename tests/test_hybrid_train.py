"""smollm2-hybrid distillation at toy size on the CPU (specdec_lib.train.hybrid): the GDN
model starts from the attention it replaces, both stages lower their losses, the file
round-trips and a bad one is refused naming the tensor or the check."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import specdec_lib
from toy_models import toy_gguf, toy_llama
from specdec_lib.models.smollm2_hybrid import (HybridWeightsError, expand_pattern,
                                               hybrid_config, load_hybrid_weights,
                                               save_hybrid_weights, shipped_bytes, tensor_spec)

SMOL = SimpleNamespace(num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64,
                       rms_norm_eps=1e-5, name="SmolLM2")


def _toy(L=4, H=48, nq=4, nkv=2, D=16, I=40, V=64, seed=0):
    return toy_llama(L, H, nq, nkv, D, I, V, seed, attn_scale=0.3, name="toy", float32=True)


# ------------------------------------------------------------------ config and file (no torch)

def test_pattern_and_smollm2_size():
    assert expand_pattern("GGGA", 30) == "GGGA" * 7 + "GG"
    assert expand_pattern("ga", 3) == "GAG"
    with pytest.raises(ValueError, match="letters"):
        expand_pattern("GXA", 30)
    cfg = hybrid_config(SMOL)
    assert [i for i, ch in enumerate(cfg["layer_pattern"]) if ch == "A"] == [3, 7, 11, 15, 19, 23, 27]
    assert cfg["layer_pattern"].count("G") == 23 and cfg["lora_rank"] == 32
    size = shipped_bytes(cfg)
    assert 10_176_120 < size <= 12_000_000, size             # the docstring's number + header
    assert shipped_bytes(hybrid_config(SMOL, rank=16, delta_dtype="float32")) <= 12_000_000
    assert shipped_bytes(hybrid_config(SMOL, rank=40)) > 12_000_000


def _random_tensors(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, (s, _) in tensor_spec(cfg).items()}


def test_hybrid_weights_round_trip(tmp_path):
    c, _ = _toy()
    cfg = hybrid_config(c, pattern="GA", rank=3)
    t = _random_tensors(cfg)
    written = save_hybrid_weights(str(tmp_path), t, cfg)
    assert os.path.getsize(tmp_path / "model.safetensors") == shipped_bytes(cfg) == \
        written["weights_size"]
    got_cfg, got = load_hybrid_weights(str(tmp_path), base=c)
    assert got_cfg["layer_pattern"] == "GAGA" and set(got) == set(t)
    for n, (_, dt) in tensor_spec(cfg).items():
        if dt == "float32":
            np.testing.assert_array_equal(got[n], t[n])
        else:                                                  # bfloat16: 8 mantissa bits
            np.testing.assert_allclose(got[n], t[n], rtol=2 ** -8)
    # the file is an ordinary safetensors file (numpy has no bfloat16: read it with torch)
    pytest.importorskip("torch")
    from safetensors.torch import load_file
    st = load_file(str(tmp_path / "model.safetensors"))
    assert st["model.layers.0.linear_attn.A_log"].shape == (4,)
    assert str(st["model.layers.2.linear_attn.q_proj.lora_B"].dtype) == "torch.bfloat16"
    np.testing.assert_array_equal(st["model.layers.2.linear_attn.q_proj.lora_B"].float().numpy(),
                                  got["model.layers.2.linear_attn.q_proj.lora_B"])


def _saved(tmp_path, name="w", **kw):
    c, _ = _toy()
    cfg = hybrid_config(c, pattern="GA", rank=3, **kw)
    d = tmp_path / name
    save_hybrid_weights(str(d), _random_tensors(cfg), cfg)
    return c, d


def test_hybrid_weights_truncated(tmp_path):
    c, d = _saved(tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-100])
    with pytest.raises(HybridWeightsError, match=r"tensor model\.layers\.2\.linear_attn\.norm\.weight .*truncated"):
        load_hybrid_weights(str(d))
    f.write_bytes(data[:5])
    with pytest.raises(HybridWeightsError, match="unreadable"):
        load_hybrid_weights(str(d))


def test_hybrid_weights_checksum(tmp_path):
    c, d = _saved(tmp_path)
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(HybridWeightsError, match="sha256"):
        load_hybrid_weights(str(d))


def test_hybrid_weights_wrong_shape_and_dtype(tmp_path):
    c, d = _saved(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    big = dict(cfg, lora_rank=4)              # the file's tensors are rank 3
    (d / "config.json").write_text(json.dumps(big))
    with pytest.raises(HybridWeightsError, match=r"tensor model\.layers\.0\.linear_attn\.q_proj\.lora_A has shape \[3, 48\], expected \[4, 48\]"):
        load_hybrid_weights(str(d))
    (d / "config.json").write_text(json.dumps(dict(cfg, delta_dtype="float32")))
    with pytest.raises(HybridWeightsError, match="q_proj.lora_A has dtype BF16, expected F32"):
        load_hybrid_weights(str(d))
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HybridWeightsError, match="hidden_size = 48, the base model has 576"):
        load_hybrid_weights(str(d), base=SimpleNamespace(hidden_size=576, num_layers=4,
                                                         num_heads=4, head_dim=16))


def test_hybrid_weights_pattern_mismatch(tmp_path):
    c, d = _saved(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    flipped = dict(cfg, layer_pattern="GAAA",
                   layer_types=["linear_attention"] + ["full_attention"] * 3)
    (d / "config.json").write_text(json.dumps(flipped))
    with pytest.raises(HybridWeightsError, match="layer 2, which layer pattern 'GAAA' makes attention"):
        load_hybrid_weights(str(d))
    (d / "config.json").write_text(json.dumps(dict(cfg, layer_pattern="GAGG",
                                                   layer_types=cfg["layer_types"])))
    with pytest.raises(HybridWeightsError, match="does not match layer_types"):
        load_hybrid_weights(str(d))
    grown = dict(cfg, layer_pattern="GGGA",
                 layer_types=["linear_attention"] * 3 + ["full_attention"])
    (d / "config.json").write_text(json.dumps(grown))
    with pytest.raises(HybridWeightsError, match=r"tensor model\.layers\.1\..* missing"):
        load_hybrid_weights(str(d))


# ------------------------------------------------------------------ the torch model

torch_needed = pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None,
                                  reason="torch not installed")


@torch_needed
def test_hybrid_model_starts_from_attention_and_stages_learn():
    import torch
    from specdec_lib.train.hybrid import Batches, kl_loss, stage1_loss, train_stage
    from specdec_lib.train.hybrid_model import HybridModel
    torch.manual_seed(0)
    c, w = _toy()
    cfg = hybrid_config(c, pattern="GA", rank=4, delta_dtype="float32")
    m = HybridModel(c, w, cfg, "cpu", chunk_size=8)
    # the GDN layers' q/k/v/o bases are the attention's (k/v repeated per GQA group)
    base = m.base[0]["qkv"]
    D = c.head_dim
    np.testing.assert_array_equal(base[:4 * D].numpy(), w["model.layers.0.self_attn.q_proj.weight"])
    kp = w["model.layers.0.self_attn.k_proj.weight"]
    np.testing.assert_array_equal(base[4 * D:5 * D].numpy(), kp[:D])
    np.testing.assert_array_equal(base[5 * D:6 * D].numpy(), kp[:D])
    np.testing.assert_array_equal(base[6 * D:7 * D].numpy(), kp[D:])
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, c.vocab_size, int(n)) for n in rng.integers(28, 33, 24)]
    batches = Batches(seqs, range(24), 32, 8 * 32, torch.device("cpu"), 0)
    tokens, mask = batches.sample()
    assert tokens.shape[0] == 8 and not mask[:, -1].all()
    before, _, taps = stage1_loss(m, tokens, mask)
    m.calibrate_norms(taps, mask)
    calibrated, _, _ = stage1_loss(m, tokens, mask)
    assert calibrated.item() < before.item()
    n, a, b = train_stage("s1", m, batches, lambda mm, t, k: stage1_loss(mm, t, k)[0],
                          m.params(), 3e-2, None, 30, lambda *x: None, True)
    assert n == 30 and b < 0.8 * a, (a, b)
    k0 = kl_loss(m, tokens, mask).item()
    n, a, b = train_stage("s2", m, batches, kl_loss, m.params(), 1e-2, None, 20,
                          lambda *x: None, True)
    assert b < a and kl_loss(m, tokens, mask).item() < k0
    # gradients reach every trainable tensor
    m.p["model.layers.0.linear_attn.A_log"].grad = None
    kl_loss(m, tokens, mask).backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in m.params())


@torch_needed
def test_hybrid_model_chunk_size_does_not_change_the_output():
    import torch
    from specdec_lib.train.hybrid_model import HybridModel, init_gdn_tensors
    c, w = _toy(L=2)
    cfg = hybrid_config(c, pattern="G", rank=2, delta_dtype="float32")
    init = init_gdn_tensors(cfg, 3)
    rng = np.random.default_rng(2)
    init = {k: v + (0.1 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in init.items()}
    tokens = torch.from_numpy(rng.integers(0, c.vocab_size, (2, 23)))
    a = HybridModel(c, w, cfg, "cpu", chunk_size=1, init=init).forward(tokens)
    b = HybridModel(c, w, cfg, "cpu", chunk_size=16, init=init).forward(tokens)
    torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


# ------------------------------------------------------------------ the CLI, end to end

def _toy_gguf(path, L=4):
    pytest.importorskip("gguf")
    return toy_gguf(path, _toy(L=L, D=16)[0])


@torch_needed
def test_train_hybrid_cli_toy(tmp_path):
    from specdec_lib.train.data import save_data
    from specdec_lib.train.hybrid import main
    _toy_gguf(tmp_path / "toy.gguf")
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 64, int(n)) for n in rng.integers(10, 40, 30)]
    save_data(str(tmp_path / "d.npz"), seqs, [4] * 30, [0] * 24 + [1] * 6)
    argv = ["--out", str(tmp_path / "out"), "--gguf", str(tmp_path / "toy.gguf"),
            "--data", str(tmp_path / "d.npz"), "--pattern", "GA", "--rank", "4",
            "--seq-len", "32", "--batch-tokens", "256", "--stage1-steps", "10",
            "--stage2-steps", "6", "--lr1", "2e-2", "--lr2", "1e-2", "--chunk-size", "8", "--device", "cpu", "--quiet"]
    assert main(argv) == 0
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    tr = cfg["specdec_training"]
    assert tr["command"] == "python -m specdec_lib train-hybrid " + " ".join(argv)
    assert tr["stage1"]["updates"] == 10 and tr["stage2"]["updates"] == 6
    assert tr["stage1"]["loss_last"] < tr["stage1"]["loss_first"]
    rep = tr["heldout"]
    assert rep["tokens"] > 0 and 0 <= rep["greedy_agreement"] <= 1 and rep["ppl_ratio"] > 0
    assert set(rep["layer_nmse"]) == {"0", "2"}
    loaded_cfg, t = load_hybrid_weights(str(tmp_path / "out"))
    assert loaded_cfg["layer_pattern"] == "GAGA" and loaded_cfg["weights_sha256"] == cfg["weights_sha256"]
    # continue from the saved file (--init): its pattern and rank are kept
    argv2 = argv[:1] + [str(tmp_path / "out2")] + argv[2:] + ["--init", str(tmp_path / "out"),
                                                            "--pattern", "G"]
    argv2[argv2.index("--stage1-steps") + 1] = "0"
    assert main(argv2) == 0
    cfg2 = json.loads((tmp_path / "out2" / "config.json").read_text())
    assert cfg2["layer_pattern"] == "GAGA" and cfg2["specdec_training"]["stage1"]["updates"] == 0
    # ... and records the run it continued, so the chain of commands that made it is on file
    assert cfg2["specdec_training"]["init"] == tr


def test_train_hybrid_help_without_torch():
    from toy_models import cli_without_torch
    p = cli_without_torch("train-hybrid", "--help")
    assert p.returncode == 0, p.stderr
    assert "--pattern" in p.stdout and "--stage2-seconds" in p.stdout
    assert "--text-tokens" in p.stdout and "--text-fraction" in p.stdout
    assert "train-hybrid" in cli_without_torch("--help").stdout
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(specdec_lib.__file__)))
    p = subprocess.run([sys.executable, "-c", "import sys, specdec_lib, specdec_lib.models, "
                        "specdec_lib.models.smollm2_hybrid, specdec_lib.train.hybrid; "
                        "assert 'torch' not in sys.modules"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stderr


@torch_needed
def test_train_hybrid_cli_toy_text(tmp_path):
    """--text-tokens: text windows mixed into the batches, recorded; the held-out rows
    spread over the families; eval-hybrid's natural-text report in heldout.natural."""
    from specdec_lib.train.data import save_data
    from specdec_lib.train.hybrid import main
    _toy_gguf(tmp_path / "toy.gguf")
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 64, int(n)) for n in rng.integers(10, 40, 40)]
    fams = ["a"] * 24 + ["x"] * 8 + ["y"] * 8
    save_data(str(tmp_path / "d.npz"), seqs, [4] * 40, [0] * 24 + [1] * 16, families=fams)
    txt = tmp_path / "t.txt"
    txt.write_text("abc def ghi jkl mno pqr stu vwx yz\n" * 200)
    argv = ["--out", str(tmp_path / "out"), "--gguf", str(tmp_path / "toy.gguf"),
            "--data", str(tmp_path / "d.npz"), "--pattern", "GA", "--rank", "4",
            "--seq-len", "32", "--batch-tokens", "256", "--stage1-steps", "3",
            "--stage2-steps", "3", "--chunk-size", "8", "--device", "cpu", "--quiet",
            "--text-tokens", "400", "--text-sources", "none", "--text-file", str(txt),
            "--text-fraction", "0.25", "--eval-sequences", "4", "--eval-text-tokens", "256"]
    assert main(argv) == 0
    tr = json.loads((tmp_path / "out" / "config.json").read_text())["specdec_training"]
    t = tr["text"]
    assert t["tokens"] == 256 and t["windows"] == 8 and t["rows_per_batch"] == 2  # 8 rows
    assert t["sources"]["files"]["files"] == 1 and t["text_tokens"] == 400
    assert tr["heldout"]["families"] == {"x": 2, "y": 2}     # not the first 4 (all x)
    nat = tr["heldout"]["natural"]
    assert nat["overall"]["tokens"] > 0 and nat["sources"]
    assert {s["source"] for s in nat["sources"]} <= set(__import__(
        "specdec_lib.train.hybrid_eval", fromlist=["x"]).NATURAL_SOURCES)


def test_mixed_batches_rows():
    pytest.importorskip("torch")
    import torch
    from specdec_lib.train.hybrid import Batches, MixedBatches
    rep = Batches([np.full(20, 5)] * 3, range(3), 16, 64, torch.device("cpu"), 0)
    txt = Batches([np.full(16, 7)] * 3, range(3), 16, 64, torch.device("cpu"), 0)
    m = MixedBatches(rep, txt, 0.5, 0)
    tokens, mask = m.sample()
    assert tokens.shape == (4, 16) and (tokens[:2] == 7).all() and (tokens[2:] == 5).all()
    assert mask[:, :15].all() and not mask[:, 15].any()
