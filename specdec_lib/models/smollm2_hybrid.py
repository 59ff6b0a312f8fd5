"""smollm2-hybrid: SmolLM2-135M-Instruct with most attention layers replaced by gated
delta-net (GDN) layers -- its config, the tensors of the shipped file, and the file's checks.
No torch here (the trainer, ``specdec_lib.train.hybrid``, and the host model both use it).

Design (issue 30):

* **Layer pattern**: a string over {G, A} (GDN / attention), one letter per layer; a shorter
  unit is tiled, so the default ``"GGGA"`` on SmolLM2's 30 layers keeps attention in layers
  3, 7, 11, 15, 19, 23, 27 (Qwen3-Next's every fourth layer: ``full_attention_interval`` 4)
  and makes the other 23 GDN (the last two layers, 28 and 29, are GDN).
* **Head layout**: Hk = Hv = SmolLM2's 9 query heads, Dk = Dv = 64. Every attention query
  head becomes a GDN head with its own query (q starts as q_proj); keys and values start as
  their GQA group's k_proj / v_proj rows (head h reads kv group h // 3), and the conv and
  the low-rank deltas let the three copies part. o_proj then reads the 9 heads as it read
  the attention's 9 head outputs. (Hk = 3 would keep only one query head per group.)
  State: 9 x 64 x 64 per layer.
* **Parameters of a GDN layer** (under ``model.layers.{i}.linear_attn.``): q/k/v/o are
  SmolLM2's frozen matrices (derived from the GGUF at load: ``base_projections``) plus
  trainable rank-r deltas ``{q,k,v,o}_proj.lora_B @ lora_A``; the output gate
  z = ``z_proj.lora_B @ lora_A`` x + ``z_bias`` (no base matrix: z is new; the bias starts
  at 1, so silu(z) starts as a constant gate, not as 0); ``in_proj_ba.weight`` [2 Hv, H]
  (rows b then a: beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)); the causal
  depthwise ``conv1d.weight`` [3 * 576, 4] (tap W-1 hits the current token, the library's
  conv1d convention) + SiLU over q, k, v; ``A_log``, ``dt_bias`` [Hv]; the gated RMSNorm
  ``norm.weight`` [Hv * Dv] (per head over Dv: w * rms_norm(o) * silu(z)).
* **Size**: per GDN layer 5 deltas of r (576 + 576) = 5760 r values plus 18,450 small
  ones (ba 10,368, conv 6,912, norm 576, z_bias 576, A_log 9, dt_bias 9). Deltas stored
  bfloat16, the small tensors float32: with 23 GDN layers and r = 32,
  23 * (5760 * 32 * 2 + 18450 * 4) = 10,176,120 bytes of data, 10,215,848 with the
  header: 10.2 MB <= 12 MB (``shipped_bytes``; r = 40 would be 12.6 MB). r = 16 in
  float32 is the same size (10,215,616 bytes).

The file is ``DIR/model.safetensors`` (shipped packed: ``DIR/model.safetensors.packed``,
``packed``) + ``DIR/config.json``; ``load_hybrid_weights(DIR)``
checks, in this order, that every tensor the config implies is present with its shape and
dtype, that no tensor lies outside the file (truncation) or belongs to a layer the pattern
says is attention, and the sha256 and size the config records; each refusal names the
tensor or the check (``HybridWeightsError``).
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from .gguf_llama import sha256_of
from .packed import PACKED_SUFFIX, check_digest, drop_packed, plain_size, resolve

__all__ = ["HybridWeightsError", "DEFAULT_PATTERN", "expand_pattern", "hybrid_config",
           "gdn_layers", "tensor_spec", "shipped_bytes", "base_projections",
           "save_hybrid_weights", "load_hybrid_weights", "random_hybrid_tensors", "WEIGHTS_FILE",
           "SHIPPED_DIR", "shipped_weights"]

DEFAULT_PATTERN = "GGGA"
DEFAULT_RANK = 32
WEIGHTS_FILE = "model.safetensors"
# where the trained weights ship (none yet: ``python -m specdec_lib train-hybrid`` makes them)
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hybrid", "smollm2_hybrid")
TRAIN_COMMAND = "python -m specdec_lib train-hybrid --out DIR"
_ST = {"float32": ("F32", 4), "bfloat16": ("BF16", 2)}


class HybridWeightsError(ValueError):
    """A hybrid weights file that is not what its config says (missing, misshapen,
    truncated, altered, or of another layer pattern)."""


def check_base(cfg, sha256, base_name, where, hint=""):
    """Refuse (HybridWeightsError naming ``where``) a hybrid config that records a base GGUF
    other than ``sha256`` (``base_name``'s); one recording none passes."""
    got = cfg.get("base_gguf_sha256")
    if got not in (None, sha256):
        raise HybridWeightsError(f"{where}: trained on a base model of sha256 {got}, not "
                                 f"{base_name}'s GGUF ({sha256}){hint}")


def expand_pattern(pattern: str, num_layers: int) -> str:
    """A {G, A} string for every layer: ``pattern`` tiled (or taken as is when it is
    ``num_layers`` long)."""
    p = str(pattern).upper()
    if not p or set(p) - {"G", "A"}:
        raise ValueError(f"layer pattern {pattern!r}: letters G (GDN) and A (attention) only")
    if len(p) > num_layers:
        raise ValueError(f"layer pattern {pattern!r} is longer than the {num_layers} layers")
    return (p * (num_layers // len(p) + 1))[:num_layers]


def hybrid_config(c, *, pattern=DEFAULT_PATTERN, rank=DEFAULT_RANK, conv_width=4,
                  delta_dtype="bfloat16", base_model=None, base_sha256=None):
    """The config.json (a dict) of a hybrid built on the Llama config ``c``
    (``gguf_llama.LlamaConfig`` or anything with its fields)."""
    full = expand_pattern(pattern, c.num_layers)
    if delta_dtype not in _ST:
        raise ValueError(f"delta_dtype: one of {sorted(_ST)}, not {delta_dtype!r}")
    if int(rank) < 1:
        raise ValueError(f"rank must be >= 1, not {rank}")
    return dict(
        model_type="smollm2_hybrid", architectures=["SpecdecLlamaGDNHybridForCausalLM"],
        base_model=base_model or getattr(c, "name", "") or "llama", base_gguf_sha256=base_sha256,
        hidden_size=int(c.hidden_size), num_hidden_layers=int(c.num_layers),
        num_attention_heads=int(c.num_heads), num_key_value_heads=int(c.num_kv_heads),
        head_dim=int(c.head_dim), rms_norm_eps=float(c.rms_norm_eps),
        layer_pattern=full,
        layer_types=["linear_attention" if ch == "G" else "full_attention" for ch in full],
        linear_num_key_heads=int(c.num_heads), linear_num_value_heads=int(c.num_heads),
        linear_key_head_dim=int(c.head_dim), linear_value_head_dim=int(c.head_dim),
        linear_conv_kernel_dim=int(conv_width), lora_rank=int(rank), delta_dtype=delta_dtype,
        z_bias_init=1.0, weights_file=WEIGHTS_FILE)


def gdn_layers(cfg) -> list[int]:
    return [i for i, ch in enumerate(cfg["layer_pattern"]) if ch == "G"]


def layer_prefix(i):
    return f"model.layers.{i}.linear_attn."


def tensor_spec(cfg) -> dict:
    """name -> (shape, dtype name) of every tensor of the file, in file order."""
    H, r = cfg["hidden_size"], cfg["lora_rank"]
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    Dk, Dv, W = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], \
        cfg["linear_conv_kernel_dim"]
    dd = cfg["delta_dtype"]
    out = {}
    for i in gdn_layers(cfg):
        p = layer_prefix(i)
        for n, rows, cols in (("q", Hk * Dk, H), ("k", Hk * Dk, H), ("v", Hv * Dv, H),
                              ("o", H, Hv * Dv), ("z", Hv * Dv, H)):
            out[p + f"{n}_proj.lora_A"] = ((r, cols), dd)
            out[p + f"{n}_proj.lora_B"] = ((rows, r), dd)
        out[p + "z_bias"] = ((Hv * Dv,), "float32")
        out[p + "in_proj_ba.weight"] = ((2 * Hv, H), "float32")
        out[p + "conv1d.weight"] = ((2 * Hk * Dk + Hv * Dv, W), "float32")
        out[p + "A_log"] = ((Hv,), "float32")
        out[p + "dt_bias"] = ((Hv,), "float32")
        out[p + "norm.weight"] = ((Hv * Dv,), "float32")
    return out


def _header(spec):
    header, off = {}, 0
    for name, (shape, dt) in spec.items():
        n = int(np.prod(shape)) * _ST[dt][1]
        header[name] = dict(dtype=_ST[dt][0], shape=list(shape), data_offsets=[off, off + n])
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, off


def shipped_bytes(cfg) -> int:
    """The exact size of the weights file for ``cfg`` (header included)."""
    raw, data = _header(tensor_spec(cfg))
    return 8 + len(raw) + data


def base_projections(cfg, weights, i):
    """The frozen float32 q, k, v, o matrices of GDN layer ``i`` from SmolLM2's weights
    (HF names): q = q_proj, k / v = k_proj / v_proj rows repeated per GQA group to
    Hk / Hv heads (head h reads group h // (Hq // Hkv)), o = o_proj."""
    p = f"model.layers.{i}.self_attn."
    nq, nkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    if Hk != nq or Hv != nq or cfg["linear_key_head_dim"] != D or cfg["linear_value_head_dim"] != D:
        raise HybridWeightsError(f"head layout Hk={Hk} Hv={Hv}: only Hk = Hv = {nq} query heads "
                                 f"of {D} are built from the attention layer")

    def rep(w):
        H = w.shape[1]
        return np.repeat(np.asarray(w, np.float32).reshape(nkv, D, H), nq // nkv, axis=0) \
            .reshape(nq * D, H)
    return dict(q=np.asarray(weights[p + "q_proj.weight"], np.float32),
                k=rep(weights[p + "k_proj.weight"]), v=rep(weights[p + "v_proj.weight"]),
                o=np.asarray(weights[p + "o_proj.weight"], np.float32))


def save_hybrid_weights(path, tensors, cfg):
    """Write ``path``/model.safetensors from float32 numpy arrays (deltas rounded to the
    config's delta dtype) and ``path``/config.json with the file's size and sha256.
    Returns the config written."""
    from ..dtypes import f32_to_bf16_bits
    spec = tensor_spec(cfg)
    if set(tensors) != set(spec):
        extra, missing = sorted(set(tensors) - set(spec)), sorted(set(spec) - set(tensors))
        raise HybridWeightsError(f"tensors to save: missing {missing[:3]}, unexpected {extra[:3]}")
    os.makedirs(path, exist_ok=True)
    raw, _ = _header(spec)
    f = os.path.join(path, WEIGHTS_FILE)
    drop_packed(f)
    with open(f, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, (shape, dt) in spec.items():
            a = np.ascontiguousarray(np.asarray(tensors[name], np.float32))
            if a.shape != tuple(shape):
                raise HybridWeightsError(f"tensor {name}: shape {list(a.shape)}, "
                                         f"expected {list(shape)}")
            fh.write((f32_to_bf16_bits(a) if dt == "bfloat16" else a).astype(
                np.uint16 if dt == "bfloat16" else "<f4").tobytes())
    cfg = dict(cfg, weights_size=os.path.getsize(f), weights_sha256=sha256_of(f))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1, sort_keys=True)
    return cfg


def _check_config(cfg, where):
    need = ("layer_pattern", "layer_types", "num_hidden_layers", "lora_rank", "delta_dtype",
            "hidden_size", "linear_num_key_heads", "linear_num_value_heads",
            "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
            "weights_sha256", "weights_size")
    missing = [k for k in need if k not in cfg]
    if missing:
        raise HybridWeightsError(f"{where}: config lacks {missing}")
    pat = cfg["layer_pattern"]
    if len(pat) != cfg["num_hidden_layers"] or set(pat) - {"G", "A"}:
        raise HybridWeightsError(f"{where}: layer pattern {pat!r} is not one G/A per layer of "
                                 f"{cfg['num_hidden_layers']}")
    types = ["linear_attention" if ch == "G" else "full_attention" for ch in pat]
    if cfg["layer_types"] != types:
        raise HybridWeightsError(f"{where}: layer pattern {pat!r} does not match layer_types")


def load_hybrid_weights(path, *, base=None):
    """(config dict, {name: float32 array}) of a hybrid weights directory, checked (module
    docstring). ``base``: a Llama config the hybrid must be built on (hidden size, layers)."""
    from ..registry import DraftWeightError, open_safetensors
    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    f = resolve(os.path.join(path, cfg.get("weights_file", WEIGHTS_FILE)))
    _check_config(cfg, f)
    if base is not None:
        for key, want in (("hidden_size", base.hidden_size), ("num_hidden_layers", base.num_layers),
                          ("num_attention_heads", base.num_heads), ("head_dim", base.head_dim)):
            if cfg.get(key) != want:
                raise HybridWeightsError(f"{f}: {key} = {cfg.get(key)}, the base model has {want}")
    spec = tensor_spec(cfg)
    try:
        found = open_safetensors(f)
    except (DraftWeightError, OSError) as e:
        raise HybridWeightsError(f"{f}: unreadable ({e})") from None
    size = plain_size(f)
    gdn = set(gdn_layers(cfg))
    for name, t in found.items():
        if name not in spec:
            layer = name.split(".")[2] if name.startswith("model.layers.") else None
            if layer is not None and layer.isdigit() and int(layer) not in gdn:
                raise HybridWeightsError(
                    f"{f}: tensor {name} is a GDN tensor of layer {layer}, which layer pattern "
                    f"{cfg['layer_pattern']!r} makes attention")
            raise HybridWeightsError(f"{f}: unexpected tensor {name}")
    for name, (shape, dt) in spec.items():
        t = found.get(name)
        if t is None:
            raise HybridWeightsError(f"{f}: tensor {name} missing (layer pattern "
                                     f"{cfg['layer_pattern']!r} makes its layer GDN)")
        if t.shape != tuple(shape):
            raise HybridWeightsError(f"{f}: tensor {name} has shape {list(t.shape)}, "
                                     f"expected {list(shape)}")
        if t.dtype != _ST[dt][0]:
            raise HybridWeightsError(f"{f}: tensor {name} has dtype {t.dtype}, expected {_ST[dt][0]}")
        if t._data_start + t._end > size or t._end - t._begin != int(np.prod(shape)) * _ST[dt][1]:
            raise HybridWeightsError(f"{f}: tensor {name} lies beyond the file's {size:,} bytes "
                                     "(truncated)")
    check_digest(f, cfg["weights_size"], cfg["weights_sha256"], HybridWeightsError,
                 unpacked=True)         # (open_safetensors unpacked and checked it)
    out = {name: np.array(found[name].float32()) for name in spec}
    for name, a in out.items():
        if not np.isfinite(a).all():
            raise HybridWeightsError(f"{f}: tensor {name} holds non-finite values")
    return cfg, out


def shipped_weights(weights=None):
    """The weights directory of ``weights`` (a directory or its model.safetensors, plain or
    packed; None: the shipped one, ``SHIPPED_DIR``); FileNotFoundError naming the missing file
    and the command that trains it."""
    d = SHIPPED_DIR if weights is None else os.fspath(weights)
    if os.path.basename(d) in (WEIGHTS_FILE, WEIGHTS_FILE + PACKED_SUFFIX) and not os.path.isdir(d):
        d = os.path.dirname(d) or "."
    f = os.path.join(d, WEIGHTS_FILE)
    if not os.path.isfile(resolve(f)) or not os.path.isfile(os.path.join(d, "config.json")):
        what = "the shipped smollm2-hybrid weights are missing" if weights is None else \
            "no hybrid weights here"
        raise FileNotFoundError(f"{f}: {what} (model.safetensors + config.json); train them "
                                f"with `{TRAIN_COMMAND}` and pass that DIR as the weights")
    return d


def random_hybrid_tensors(cfg, seed=0, scale=0.02):
    """float32 tensors of ``tensor_spec(cfg)`` near the trainer's initial values, perturbed
    (an untrained hybrid for tests and demos: deltas B A of size about ``scale``, conv near
    the identity, decays exp(-A dt) spread over (0, 1), gates and norms near their start)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, _) in tensor_spec(cfg).items():
        leaf = name.split(".linear_attn.", 1)[1]
        if leaf.endswith("lora_A"):
            a = rng.standard_normal(shape) / np.sqrt(shape[1])
        elif leaf.endswith("lora_B"):
            a = rng.standard_normal(shape) * scale
        elif leaf == "z_bias":
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        elif leaf == "in_proj_ba.weight":
            a = rng.standard_normal(shape) * 0.5 / np.sqrt(shape[1])
        elif leaf == "conv1d.weight":
            a = 0.2 * rng.standard_normal(shape)
            a[:, -1] += 1.0
        elif leaf == "A_log":
            a = np.log(rng.uniform(1.0, 16.0, shape))
        elif leaf == "dt_bias":
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
            a = dt + np.log(-np.expm1(-dt))           # softplus^-1(dt)
        elif leaf == "norm.weight":
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            raise AssertionError(name)
        out[name] = np.asarray(a, np.float32)
    return out
