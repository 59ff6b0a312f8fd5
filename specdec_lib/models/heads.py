"""Trained draft heads for Llama targets: their config.json, their files, the shipped ones.

A head is an ordinary registry checkpoint (``model.safetensors`` + ``config.json``; the shipped
ones hold ``model.safetensors.packed`` instead: ``packed``) in the
``deepseek_mtp`` or ``eagle3`` layout; ``head_config`` writes the config a target implies,
``save_head`` the pair, ``smollm2_head(method)`` finds the heads shipped for SmolLM2 (trained
by ``python -m specdec_lib train-draft`` (``specdec_lib.train``); the exact command is in each config's ``specdec_training``).
``hybrid_head(DIR)`` finds the MTP head of the smollm2-hybrid in DIR (``train-draft --hybrid
DIR`` writes it to DIR/smollm2_hybrid_mtp).
"""
from __future__ import annotations

import json
import os

import numpy as np

from .gguf_llama import sha256_of
from .packed import drop_packed, weights_file

HEADS_DIR = os.path.join(os.path.dirname(__file__), "heads")
SMOLLM2_HEADS = {"mtp": "smollm2_mtp", "eagle3": "smollm2_eagle3"}
HYBRID_HEAD = "smollm2_hybrid_mtp"      # train-draft --hybrid DIR's default, inside DIR


def head_config(method, c, *, intermediate_size=None, draft_vocab_size=None,
                aux_layer_ids=None):
    """config.json (a dict) of a ``method`` ('mtp' -> deepseek_mtp layout, 'eagle3') head
    for the Llama target config ``c`` (``gguf_llama.LlamaConfig``)."""
    base = dict(hidden_size=c.hidden_size, vocab_size=c.vocab_size,
                num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
                head_dim=c.head_dim, rms_norm_eps=float(c.rms_norm_eps),
                rope_theta=float(c.rope_theta), torch_dtype="bfloat16",
                target_model=c.name or "llama")
    if method == "mtp":
        return dict(base, architectures=["LlamaMTPDraft"], model_type="llama_mtp",
                    num_hidden_layers=c.num_layers, num_nextn_predict_layers=1,
                    intermediate_size=int(intermediate_size or c.intermediate_size))
    if method == "eagle3":
        n = c.num_layers
        ids = list(aux_layer_ids) if aux_layer_ids is not None else [1, n // 2 - 1, n - 4]
        return dict(base, architectures=["LlamaForCausalLMEagle3"], model_type="llama",
                    num_hidden_layers=1, target_hidden_size=c.hidden_size,
                    target_num_hidden_layers=n,
                    intermediate_size=int(intermediate_size or c.intermediate_size),
                    draft_vocab_size=int(draft_vocab_size or c.vocab_size),
                    eagle_config={"eagle_aux_hidden_state_layer_ids": ids})
    raise ValueError(f"method: 'mtp' or 'eagle3', not {method!r}")


def head_method(config):
    """'eagle3' or 'mtp': which kind of head a config.json (a dict) describes."""
    arch = " ".join(config.get("architectures") or []).lower()
    return "eagle3" if "eagle" in arch or "eagle_config" in config else "mtp"


# the fields of a head's config.json that describe its target (the model it drafts for):
# a head continued by ``train-draft --init`` must agree on each with the config the target
# implies (``head_config``, plus the hybrid's sha256 with --hybrid)
TARGET_KEYS = ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "rms_norm_eps", "rope_theta", "num_hidden_layers",
               "num_nextn_predict_layers", "target_hidden_size", "target_num_hidden_layers",
               "target_model", "target_hybrid_weights_sha256")


def check_same_target(config, want, where, hint=""):
    """Refuse (ValueError naming ``where``) a head config (a dict) that was trained for
    another target than the one ``want`` (a ``head_config`` of this target) describes: any
    of ``TARGET_KEYS`` different, or a ``target_gguf_sha256`` other than ``want``'s (a head
    that records none, as the heads shipped before it was recorded, passes that one)."""
    for k in TARGET_KEYS:
        if config.get(k) != want.get(k):
            raise ValueError(f"{where}: a head for another target ({k} {config.get(k)!r}, "
                             f"this target's is {want.get(k)!r}){hint}")
    got, sha = config.get("target_gguf_sha256"), want.get("target_gguf_sha256")
    if got is not None and sha is not None and got != sha:
        raise ValueError(f"{where}: trained on a GGUF of sha256 {got}, not this target's "
                         f"({sha}){hint}")


def random_head_tensors(method, config, *, seed=0, scale=0.02):
    """float32 tensors of every required tensor of a head (random; tests and init)."""
    from ..registry import weight_spec
    spec = weight_spec(method, config)
    rng = np.random.default_rng(seed)
    out = {}
    for s in spec.tensors.values():
        if not s.required:
            continue
        if s.kind == "int":           # d2t: the first Vd target ids (offsets 0)
            out[s.name] = np.zeros(s.shape, np.int64)
        elif len(s.shape) == 1:       # norm weights
            out[s.name] = np.ones(s.shape, np.float32)
        else:
            out[s.name] = (rng.standard_normal(s.shape) * scale).astype(np.float32)
    return out


def save_head(path, tensors, config):
    """Write ``path``/model.safetensors (numpy arrays, or torch tensors through
    safetensors.torch) and ``path``/config.json, which records the file's size and sha256
    (checked at load: ``registry.check_weights_digest``)."""
    os.makedirs(path, exist_ok=True)
    if tensors and not isinstance(next(iter(tensors.values())), np.ndarray):
        from safetensors.torch import save_file
    else:
        from safetensors.numpy import save_file
    f = os.path.join(path, "model.safetensors")
    save_file(tensors, f)
    drop_packed(f)
    config = dict(config, weights_size=os.path.getsize(f), weights_sha256=sha256_of(f))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1, sort_keys=True)
    return path


def smollm2_head(method: str) -> str:
    """The shipped SmolLM2 head of ``method`` ('mtp' / 'eagle3'), a directory."""
    from ..registry import normalize_spec_method
    key = normalize_spec_method(method)
    if key not in SMOLLM2_HEADS:
        raise ValueError(f"method: SmolLM2 has trained heads for {sorted(SMOLLM2_HEADS)}, "
                         f"not {method!r}")
    path = os.path.join(HEADS_DIR, SMOLLM2_HEADS[key])
    if weights_file(path) is None:
        raise FileNotFoundError(f"{path}: no trained head here (python -m specdec_lib train-draft makes it)")
    return path


def hybrid_head(weights, head=None) -> str:
    """The MTP head directory of the hybrid in ``weights`` (a hybrid weights directory):
    ``head``, or by default weights/smollm2_hybrid_mtp (what ``train-draft --hybrid weights``
    writes), checked against the hybrid's config.json before anything is loaded:
    FileNotFoundError naming the head and the command that trains it; ValueError naming
    ``head`` for one that is no MTP head or whose hidden size is not the hybrid's."""
    path = os.fspath(head) if head is not None else os.path.join(os.fspath(weights), HYBRID_HEAD)
    if not os.path.isfile(os.path.join(path, "config.json")) or weights_file(path) is None:
        raise FileNotFoundError(f"head {path}: no trained head here (model.safetensors + "
                                f"config.json); train it with `python -m specdec_lib "
                                f"train-draft --hybrid {weights}`")
    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    with open(os.path.join(weights, "config.json")) as fh:
        hidden = json.load(fh)["hidden_size"]
    if head_method(cfg) != "mtp":
        raise ValueError(f"head {path}: an EAGLE3 head; the hybrid runs MTP heads "
                         "(deepseek_mtp layout)")
    if cfg.get("hidden_size") != hidden:
        raise ValueError(f"head {path}: hidden size {cfg.get('hidden_size')}, the hybrid's "
                         f"({weights}) is {hidden}")
    return path
