"""Draft methods and weight specs: aliases, tiny safetensors checkpoints, every error."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from specdec_lib import registry
from specdec_lib.registry import (DraftWeightError, draft_layout, load_draft_weights,
                                  normalize_spec_method, weight_spec)

H, V = 16, 40

EAGLE3_CFG = {"hidden_size": H, "vocab_size": V, "draft_vocab_size": 24,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
              "intermediate_size": 32, "target_num_hidden_layers": 12,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]}}
QWEN_CFG = {"model_type": "qwen3_next", "hidden_size": H, "vocab_size": V,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "intermediate_size": 32, "num_experts": 2, "moe_intermediate_size": 8,
            "shared_expert_intermediate_size": 12, "mtp_num_hidden_layers": 1,
            "attn_output_gate": True}
DEEPSEEK_CFG = {"model_type": "deepseek_v3", "hidden_size": H, "vocab_size": V,
                "num_hidden_layers": 3, "num_nextn_predict_layers": 1,
                "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 6,
                "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4,
                "n_routed_experts": 2, "moe_intermediate_size": 8, "n_shared_experts": 1}
CFGS = {"eagle3": EAGLE3_CFG, "qwen3_next_mtp": QWEN_CFG, "deepseek_mtp": DEEPSEEK_CFG}


def _tensors(spec, rng, skip=()):
    t = {}
    for s in spec.tensors.values():
        if s.name in skip:
            continue
        if s.kind == "int":
            t[s.name] = np.arange(s.shape[0], dtype=np.int64)
        elif s.kind == "bool":
            t[s.name] = np.ones(s.shape, dtype=np.bool_)
        else:
            t[s.name] = rng.standard_normal(s.shape).astype(np.float32)
    return t


def _write(tmp_path, tensors, cfg, name="model.safetensors"):
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    save_file(tensors, str(d / name))
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


@pytest.mark.parametrize("name,method,layout", [
    ("eagle3", "eagle3", "eagle3"), ("EAGLE3", "eagle3", "eagle3"),
    ("qwen3_5_mtp", "mtp", "qwen3_next_mtp"), ("Qwen3.5-MTP", "mtp", "qwen3_next_mtp"),
    ("qwen3_next_mtp", "mtp", "qwen3_next_mtp"), ("Qwen3-Next-MTP", "mtp", "qwen3_next_mtp"),
    ("deepseek_mtp", "mtp", "deepseek_mtp"), ("DeepSeek_MTP", "mtp", "deepseek_mtp"),
    ("hy3_mtp", "mtp", "deepseek_mtp"), ("HY3_MTP", "mtp", "deepseek_mtp"),
])
def test_aliases(name, method, layout):
    assert normalize_spec_method(name) == method
    assert draft_layout(name) == layout


def test_plain_mtp_layout_from_config():
    assert normalize_spec_method("MTP") == "mtp"
    assert draft_layout("mtp", QWEN_CFG) == "qwen3_next_mtp"
    assert draft_layout("mtp", DEEPSEEK_CFG) == "deepseek_mtp"
    with pytest.raises(ValueError, match="layout"):
        draft_layout("mtp", {"model_type": "llama"})


@pytest.mark.parametrize("name", ["ngram", "NGram", "prompt_lookup", "prompt-lookup",
                                  "Prompt-Lookup", " PROMPT_LOOKUP "])
def test_ngram_aliases_are_weight_free(name, tmp_path):
    assert normalize_spec_method(name) == "ngram"
    with pytest.raises(ValueError, match="weight-free"):
        draft_layout(name)
    with pytest.raises(ValueError, match="weight-free"):
        weight_spec(name, EAGLE3_CFG)
    # raised before any file is looked for: no config, no checkpoint here
    with pytest.raises(ValueError, match="weight-free"):
        load_draft_weights(name, str(tmp_path / "missing"))


def test_unknown_method_lists_known():
    with pytest.raises(ValueError) as e:
        normalize_spec_method("medusa")
    for k in registry.KNOWN_METHODS:
        assert k in str(e.value)
    assert {"ngram", "prompt_lookup", "eagle3", "mtp"} <= set(registry.KNOWN_METHODS)
    with pytest.raises(TypeError):
        normalize_spec_method(3)


@pytest.mark.parametrize("layout", list(CFGS))
def test_valid_checkpoint_loads_lazily(layout, tmp_path, rng):
    spec = weight_spec(layout, CFGS[layout])
    t = _tensors(spec, rng)
    extra = {"model.layers.0.mlp.up_proj.weight": np.zeros((3, 3), np.float32)} \
        if layout != "eagle3" else {}                 # target tensors are not the draft's
    path = _write(tmp_path, {**t, **extra}, CFGS[layout])
    w = load_draft_weights(layout, path)
    assert w.spec.layout == layout
    name = next(iter(t))
    assert np.array_equal(w[name], t[name])
    assert isinstance(w.lazy(name).numpy(), np.memmap)   # a view of the file, no copy


def test_eagle3_aux_layer_convention():
    s = weight_spec("eagle3", EAGLE3_CFG)
    assert s.aux_layer_ids == (1, 5, 9)
    assert s.aux_capture_before_layers == (2, 6, 10)
    assert s.tensors["fc.weight"].shape == (H, 3 * H)
    assert s.tensors["midlayer.self_attn.q_proj.weight"].shape == (16, 2 * H)
    cfg = {k: v for k, v in EAGLE3_CFG.items() if k != "eagle_config"}
    s = weight_spec("eagle3", cfg)
    assert s.aux_capture_before_layers == (2, 6, 9)           # (2, n//2, n-3), n = 12
    assert s.aux_layer_ids == (1, 5, 8)


def test_norm_conventions():
    assert weight_spec("qwen3_5_mtp", QWEN_CFG).norm_unit_offset is True
    assert weight_spec("deepseek_mtp", DEEPSEEK_CFG).norm_unit_offset is False
    assert weight_spec("eagle3", EAGLE3_CFG).norm_unit_offset is False


def _all_required(layout):
    spec = weight_spec(layout, CFGS[layout])
    return [s.name for s in spec.tensors.values() if s.required]


@pytest.mark.parametrize("layout,name", [(l, n) for l in CFGS for n in _all_required(l)])
def test_missing_tensor_is_named(layout, name, tmp_path, rng):
    spec = weight_spec(layout, CFGS[layout])
    path = _write(tmp_path, _tensors(spec, rng, skip=(name,)), CFGS[layout])
    with pytest.raises(DraftWeightError, match="missing tensor '" + name.replace(".", r"\.")):
        load_draft_weights(layout, path)


@pytest.mark.parametrize("layout,name", [(l, n) for l in CFGS for n in _all_required(l)])
def test_misshapen_tensor_is_named(layout, name, tmp_path, rng):
    spec = weight_spec(layout, CFGS[layout])
    t = _tensors(spec, rng)
    t[name] = np.zeros(tuple(s + 1 for s in t[name].shape), t[name].dtype)
    path = _write(tmp_path, t, CFGS[layout])
    with pytest.raises(DraftWeightError, match=name.replace(".", r"\.") + ".*shape"):
        load_draft_weights(layout, path)


def test_wrong_dtype_and_unexpected_tensor(tmp_path, rng):
    spec = weight_spec("eagle3", EAGLE3_CFG)
    t = _tensors(spec, rng)
    t["d2t"] = t["d2t"].astype(np.float32)
    with pytest.raises(DraftWeightError, match="'d2t'.*dtype"):
        load_draft_weights("eagle3", _write(tmp_path, t, EAGLE3_CFG))
    spec = weight_spec("qwen3_next_mtp", QWEN_CFG)
    t = _tensors(spec, rng)
    t["mtp.layers.1.input_layernorm.weight"] = np.zeros(H, np.float32)
    with pytest.raises(DraftWeightError, match="unexpected tensor 'mtp.layers.1"):
        load_draft_weights("qwen3_5_mtp", _write(tmp_path, t, QWEN_CFG))


def test_quantised_checkpoints_not_implemented(tmp_path, rng):
    cfg = dict(QWEN_CFG, quantization_config={"quant_method": "fp8"})
    with pytest.raises(NotImplementedError, match="fp8"):
        weight_spec("qwen3_next_mtp", cfg)
    spec = weight_spec("deepseek_mtp", DEEPSEEK_CFG)
    t = _tensors(spec, rng)
    t["model.layers.3.eh_proj.weight_scale_inv"] = np.ones((1, 1), np.float32)
    with pytest.raises(NotImplementedError, match="eh_proj.weight_scale_inv"):
        load_draft_weights("deepseek_mtp", _write(tmp_path, t, DEEPSEEK_CFG))
    t = _tensors(spec, rng)
    t["model.layers.3.eh_proj.weight"] = t["model.layers.3.eh_proj.weight"].astype(np.int8)
    with pytest.raises(NotImplementedError, match="eh_proj"):
        load_draft_weights("deepseek_mtp", _write(tmp_path, t, DEEPSEEK_CFG))


def test_missing_config_value_is_named():
    with pytest.raises(DraftWeightError, match="v_head_dim"):
        weight_spec("deepseek_mtp", dict(DEEPSEEK_CFG, v_head_dim=None))
    with pytest.raises(DraftWeightError, match="hidden_size"):
        weight_spec("eagle3", {k: v for k, v in EAGLE3_CFG.items() if k != "hidden_size"})


def test_bf16_and_sharded_index(tmp_path, rng):
    # hand-written BF16 tensor (numpy cannot hold bf16) split over two files with an index
    from specdec_lib.dtypes import f32_to_bf16_bits
    spec = weight_spec("qwen3_next_mtp", dict(QWEN_CFG, num_experts=0))
    t = _tensors(spec, rng)
    names = sorted(n for n in t if n != "mtp.fc.weight")
    half = len(names) // 2
    d = tmp_path / "ckpt"
    d.mkdir()
    save_file({n: t[n] for n in names[:half]}, str(d / "a.safetensors"))
    # second shard: fc as bf16 bits written with a raw header
    fc = t["mtp.fc.weight"]
    rest = {n: t[n] for n in names[half:] if n != "mtp.fc.weight"}
    save_file(rest, str(d / "b.safetensors"))
    bits = f32_to_bf16_bits(fc)
    header = json.dumps({"mtp.fc.weight": {"dtype": "BF16", "shape": list(fc.shape),
                                           "data_offsets": [0, bits.nbytes]}}).encode()
    with open(d / "c.safetensors", "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header + bits.tobytes())
    wm = {n: "a.safetensors" for n in names[:half]}
    wm.update({n: "b.safetensors" for n in rest})
    wm["mtp.fc.weight"] = "c.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    w = load_draft_weights("qwen3_next_mtp", str(d), dict(QWEN_CFG, num_experts=0))
    assert w.lazy("mtp.fc.weight").dtype == "BF16"
    assert np.allclose(w["mtp.fc.weight"], fc, rtol=1e-2, atol=1e-2)
    assert os.path.basename(w.lazy("mtp.norm.weight").path) in ("a.safetensors", "b.safetensors")


def test_demo_checkpoint_roundtrip(tmp_path):
    from specdec_lib.models import load_demo_checkpoint, make_demo_checkpoint
    make_demo_checkpoint(str(tmp_path))
    cfg, tensors, draft = load_demo_checkpoint(str(tmp_path))
    assert draft.spec.layout == "qwen3_next_mtp"
    assert "model.embed_tokens.weight" in draft and "lm_head.weight" in draft
    assert draft["mtp.fc.weight"].shape == (cfg["hidden_size"], 2 * cfg["hidden_size"])


def test_recorded_digest_checked_at_load(tmp_path, rng):
    """save_head records the file's size and sha256; a flipped byte or a truncated file is
    refused naming the file, before any tensor is read; without a record nothing is checked."""
    from specdec_lib.models.heads import save_head
    spec = weight_spec("eagle3", EAGLE3_CFG)
    path = save_head(str(tmp_path / "h"), _tensors(spec, rng), EAGLE3_CFG)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    f = tmp_path / "h" / "model.safetensors"
    assert cfg["weights_size"] == f.stat().st_size and len(cfg["weights_sha256"]) == 64
    load_draft_weights("eagle3", path)
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 1                                   # inside a tensor: the header still parses
    f.write_bytes(bytes(raw))
    with pytest.raises(DraftWeightError, match=r"model.safetensors: sha256 .* \(altered file\)"):
        load_draft_weights("eagle3", path)
    f.write_bytes(bytes(raw[:-8]))
    with pytest.raises(DraftWeightError, match="size .* config says"):
        load_draft_weights("eagle3", path)
    f.write_bytes(bytes(raw))
    del cfg["weights_sha256"], cfg["weights_size"]
    load_draft_weights("eagle3", path, cfg)        # an unrecorded checkpoint: not checked


def test_shipped_heads_record_their_digest():
    from specdec_lib.models.heads import SMOLLM2_HEADS, hybrid_head, smollm2_head
    from specdec_lib.models.smollm2_hybrid import SHIPPED_DIR
    for m, d in [(m, smollm2_head(m)) for m in SMOLLM2_HEADS] + [("mtp", hybrid_head(SHIPPED_DIR))]:
        cfg = json.loads(open(os.path.join(d, "config.json")).read())
        assert len(cfg["weights_sha256"]) == 64, d
        load_draft_weights(m, d)
