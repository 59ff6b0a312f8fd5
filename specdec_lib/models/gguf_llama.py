"""Read a Llama-architecture GGUF checkpoint: config, dequantised weights, tokenizer.

``read_gguf_llama(path)`` checks the file (size / sha256 when given, every tensor present with
the shape the metadata implies), dequantises each tensor once (``gguf``'s own numpy
dequantisers: Q4_1, Q8_0, F16, F32, ...) with a progress bar (by default only when stderr is
a terminal; what was read is logged to the ``specdec_lib`` logger), and returns HF-named float32
weights. llama.cpp's converter permutes the rows of q/k projections for its interleaved RoPE;
they are put back in HF order here, so the host model uses rotate-half RoPE as HF Llama does.

``GGUFTokenizer`` builds a byte-level BPE tokenizer (the ``tokenizers`` library) from the
vocabulary and merges inside the file, with the file's control tokens as special tokens, and
renders the file's own Jinja chat template (``jinja2``'s sandbox, as HF does).

These need the ``model`` extra (``pip install "specdec_lib[model]"``): gguf, tokenizers,
jinja2, tqdm.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

__all__ = ["LlamaConfig", "GGUFError", "GGUFTokenizer", "read_gguf_llama", "read_config",
           "expected_tensors", "sha256_of", "check_recorded_digest"]

log = logging.getLogger(__name__)
_MODEL_EXTRA = 'pip install "specdec_lib[model]"'


def _need(module):
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{module} is needed to read GGUF models: {_MODEL_EXTRA} "
                          f"({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    context_length: int
    tied_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None
    name: str = ""


class GGUFError(ValueError):
    """A GGUF file that is not the model it claims to be (truncated, altered, misshapen)."""


def sha256_of(path, chunk=1 << 22):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def check_recorded_digest(path, size, sha256, error):
    """Raise ``error`` naming ``path`` when its size or sha256 is not what a config records
    (``None``: that one not checked); the size first, which costs no read."""
    got = os.path.getsize(path)
    if size is not None and got != size:
        raise error(f"{path}: size {got:,} bytes, config says {size:,}")
    if sha256 is not None:
        digest = sha256_of(path)
        if digest != sha256:
            raise error(f"{path}: sha256 {digest}, config says {sha256} (altered file)")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _open(path, expected_size=None, expected_sha256=None):
    gguf = _need("gguf")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    size = os.path.getsize(path)
    if expected_size is not None and size != expected_size:
        raise GGUFError(f"{path}: size {size:,} bytes, expected {expected_size:,} "
                        "(truncated or a different file)")
    if expected_sha256 is not None:
        digest = sha256_of(path)
        if digest != expected_sha256:
            raise GGUFError(f"{path}: sha256 {digest}, expected {expected_sha256} (altered file)")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:   # the reader's own errors on a damaged header / tensor table
        raise GGUFError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def read_config(reader) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"general.architecture: {arch!r}, only 'llama' is supported")

    def need(key):
        v = _field(reader, f"llama.{key}")
        if v is None:
            raise GGUFError(f"metadata llama.{key} missing")
        return v
    H, nh = int(need("embedding_length")), int(need("attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, "llama.vocab_size")
    if vocab is None:   # the token list's length, without decoding its strings (the tokenizer does)
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else 0
    vocab = int(vocab)
    return LlamaConfig(
        vocab_size=vocab, hidden_size=H, num_layers=int(need("block_count")), num_heads=nh,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", nh)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", H // nh)),
        intermediate_size=int(need("feed_forward_length")),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        context_length=int(_field(reader, "llama.context_length", 2048)),
        tied_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        name=str(_field(reader, "general.name", "")))


def expected_tensors(c: LlamaConfig) -> dict:
    """GGUF tensor name -> (HF name, numpy shape [rows, cols] / [n])."""
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    out = {"token_embd.weight": ("model.embed_tokens.weight", (c.vocab_size, H)),
           "output_norm.weight": ("model.norm.weight", (H,))}
    if not c.tied_embeddings:
        out["output.weight"] = ("lm_head.weight", (c.vocab_size, H))
    for i in range(c.num_layers):
        g, p = f"blk.{i}.", f"model.layers.{i}."
        out.update({
            g + "attn_norm.weight": (p + "input_layernorm.weight", (H,)),
            g + "ffn_norm.weight": (p + "post_attention_layernorm.weight", (H,)),
            g + "attn_q.weight": (p + "self_attn.q_proj.weight", (c.num_heads * D, H)),
            g + "attn_k.weight": (p + "self_attn.k_proj.weight", (c.num_kv_heads * D, H)),
            g + "attn_v.weight": (p + "self_attn.v_proj.weight", (c.num_kv_heads * D, H)),
            g + "attn_output.weight": (p + "self_attn.o_proj.weight", (H, c.num_heads * D)),
            g + "ffn_gate.weight": (p + "mlp.gate_proj.weight", (I, H)),
            g + "ffn_up.weight": (p + "mlp.up_proj.weight", (I, H)),
            g + "ffn_down.weight": (p + "mlp.down_proj.weight", (H, I)),
        })
    return out


def _unpermute(w, n_head):
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> HF's rotate-half)."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def read_gguf_llama(path: str | os.PathLike, *, expected_size: int | None = None,
                    expected_sha256: str | None = None, progress: bool | None = None,
                    ) -> tuple[LlamaConfig, dict[str, np.ndarray], GGUFTokenizer]:
    """(LlamaConfig, {HF name: float32 array}, GGUFTokenizer) from a Llama GGUF file.
    ``progress``: a tqdm bar on stderr (None: only when stderr is a terminal)."""
    quants = _need("gguf.quants")
    reader = _open(path, expected_size, expected_sha256)
    config = read_config(reader)
    want = expected_tensors(config)
    have = {t.name: t for t in reader.tensors}
    missing = sorted(set(want) - set(have))
    if missing:
        raise GGUFError(f"{path}: tensor {missing[0]} missing"
                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for name, (_, shape) in want.items():
        got = tuple(int(n) for n in reversed(have[name].shape))   # GGUF lists ne0 first
        if got != shape:
            raise GGUFError(f"{path}: tensor {name} has shape {list(got)}, expected {list(shape)}")
    if progress is None:
        progress = sys.stderr.isatty()
    t0 = time.perf_counter()
    weights = {}
    items = list(want.items())
    log.info("%s: %s, %d layers, %d tensors; dequantising", path, config.name or "llama",
             config.num_layers, len(items))
    bar = _need("tqdm").tqdm(items, desc="dequantising", unit="tensor", disable=not progress,
                             leave=False)
    for name, (hf, shape) in bar:
        t = have[name]
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if name.endswith("attn_q.weight"):
            w = _unpermute(w, config.num_heads)
        elif name.endswith("attn_k.weight"):
            w = _unpermute(w, config.num_kv_heads)
        if not np.isfinite(w).all():
            raise GGUFError(f"{path}: tensor {name} holds non-finite values")
        weights[hf] = w
    bar.close()
    log.info("%s: %d tensors dequantised in %.1f s", path, len(weights), time.perf_counter() - t0)
    return config, weights, GGUFTokenizer.from_reader(reader)


class GGUFTokenizer:
    """Byte-level BPE from a GGUF's ``tokenizer.ggml.*`` fields, plus its chat template."""

    def __init__(self, tokens, merges, special_ids, chat_template=None, eos_token_id=None,
                 bos_token_id=None):
        tk = _need("tokenizers")
        vocab = {t: i for i, t in enumerate(tokens)}
        try:
            bpe = tk.models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                                fuse_unk=False, byte_fallback=False)
        except Exception as e:     # a merge naming a token the vocabulary lacks, ...
            raise GGUFError(f"tokenizer.ggml.merges: {e}") from None
        tok = tk.Tokenizer(bpe)
        # SmolLM2 / StarCoder pre-tokenisation: each digit alone, then GPT-2's byte-level split
        tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
            tk.pre_tokenizers.Digits(individual_digits=True),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tok.decoder = tk.decoders.ByteLevel()
        tok.add_special_tokens([tk.AddedToken(tokens[i], special=True, normalized=False)
                                for i in special_ids])
        self._tok, self.tokens = tok, list(tokens)
        self.special_ids = set(int(i) for i in special_ids)
        self.chat_template = chat_template
        self.eos_token_id, self.bos_token_id = eos_token_id, bos_token_id

    @classmethod
    def from_reader(cls, reader):
        model = _field(reader, "tokenizer.ggml.model")
        if model != "gpt2":
            raise GGUFError(f"tokenizer.ggml.model: {model!r}, only byte-level BPE ('gpt2') "
                            "is supported")
        tokens = _field(reader, "tokenizer.ggml.tokens")
        merges = _field(reader, "tokenizer.ggml.merges")
        types = _field(reader, "tokenizer.ggml.token_type")
        if not tokens or merges is None or types is None:
            raise GGUFError("tokenizer.ggml.tokens / merges / token_type missing")
        special = [i for i, t in enumerate(types) if int(t) == 3]   # CONTROL tokens
        return cls(tokens, merges, special, _field(reader, "tokenizer.chat_template"),
                   _field(reader, "tokenizer.ggml.eos_token_id"),
                   _field(reader, "tokenizer.ggml.bos_token_id"))

    def encode(self, text: str) -> list:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens=True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages, add_generation_prompt=True) -> str:
        """The file's chat template rendered with ``messages`` ([{role, content}])."""
        if not self.chat_template:
            raise GGUFError("tokenizer.chat_template missing")
        sandbox = _need("jinja2.sandbox")
        env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.tokens[self.bos_token_id] if self.bos_token_id is not None else "",
            eos_token=self.tokens[self.eos_token_id] if self.eos_token_id is not None else "")

    def apply_chat_template(self, messages, add_generation_prompt=True) -> list:
        return self.encode(self.render_chat(messages, add_generation_prompt))
