"""Draft methods and their weights.

``normalize_spec_method(name)`` turns what a user typed into one of the draft methods
the library runs: ``"eagle3"``, ``"mtp"`` or the weight-free ``"ngram"`` (prompt lookup,
``ops.ngram_propose``; aliases ``prompt_lookup`` / ``prompt-lookup``). The weight *layout*
of an MTP draft depends on the family that trained it; ``draft_layout(name, config)``
picks it (for ``ngram`` it raises: there are no weights to lay out):

================  ===========================================================
layout            tensors (H hidden, V vocab, Vd draft vocab)
================  ===========================================================
eagle3            ``fc.weight [H, taps*Ht]``, ``midlayer.*`` (q/k/v take 2H),
                  ``norm.weight``, ``lm_head.weight [Vd, H]``, ``d2t [Vd]``
                  (offsets: target = draft + d2t[draft]), ``t2d [V]``, optional
                  ``embed_tokens.weight [V, H]``
qwen3_next_mtp    ``mtp.fc.weight [H, 2H]``, ``mtp.pre_fc_norm_embedding``,
                  ``mtp.pre_fc_norm_hidden``, ``mtp.layers.{i}.*``, ``mtp.norm``;
                  embedding and lm_head shared with the target; norms are
                  zero-centred (scale 1 + w)
deepseek_mtp      ``model.layers.{N}.{enorm,hnorm,eh_proj,shared_head.norm,...}``
                  with N = num_hidden_layers + i; norms scale w
================  ===========================================================

``eh_proj``/``fc`` both take ``RMSNorm(embed) ++ RMSNorm(hidden)`` (embedding half
first): ``ops.draft_combine`` builds that input.

EAGLE3 auxiliary layers: ``eagle_config.eagle_aux_hidden_state_layer_ids`` (or
``eagle_aux_hidden_state_layer_ids``) numbers the target decoder layer whose *output*
is captured, 0-based; the capture therefore happens before layer ``id + 1`` (the
convention SGLang applies with ``val + 1``). Without the field, the usual default
captures before layers ``(2, n // 2, n - 3)``, i.e. outputs of ``(1, n//2 - 1, n - 4)``.
Both are recorded on the spec (``aux_layer_ids``, ``aux_capture_before_layers``).

Checkpoints are read lazily: ``open_safetensors`` parses the header and memory-maps
the file (a packed one, ``models.packed``, is unpacked into memory instead); a tensor's
bytes are touched only when used. Validation checks every expected name, shape and dtype
class against the config before any tensor is read;
a missing, misshapen or wrongly typed tensor raises ``DraftWeightError`` naming it, an
unknown tensor inside the draft's namespace too (it means config and checkpoint
disagree); quantised checkpoints raise ``NotImplementedError``.
"""
from __future__ import annotations

import io
import json
import logging
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["KNOWN_METHODS", "LAYOUTS", "DraftWeightError", "normalize_spec_method",
           "draft_layout", "LazyTensor", "open_safetensors", "TensorSpec", "DraftWeightSpec",
           "weight_spec", "DraftWeights", "load_draft_weights", "validate_draft_tensors"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# method names

_WEIGHT_FREE = "weight-free"
_METHOD_ALIASES = {
    "eagle3": ("eagle3", "eagle3"),
    "mtp": ("mtp", None),                       # layout inferred from the config
    "qwen3_5_mtp": ("mtp", "qwen3_next_mtp"),
    "qwen3_next_mtp": ("mtp", "qwen3_next_mtp"),
    "deepseek_mtp": ("mtp", "deepseek_mtp"),
    "hy3_mtp": ("mtp", "deepseek_mtp"),
    "ngram": ("ngram", _WEIGHT_FREE),           # prompt lookup: no draft weights at all
    "prompt_lookup": ("ngram", _WEIGHT_FREE),
}
KNOWN_METHODS = tuple(_METHOD_ALIASES)
LAYOUTS = ("eagle3", "qwen3_next_mtp", "deepseek_mtp")


class DraftWeightError(ValueError):
    """A draft checkpoint does not match its method's weight spec (names the tensor)."""


def _canon(name):
    if not isinstance(name, str):
        raise TypeError(f"spec method: expected a string, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_").replace(".", "_")
    if key not in _METHOD_ALIASES:
        raise ValueError(f"unknown speculative method {name!r}; known: "
                         + ", ".join(KNOWN_METHODS) + " (case-insensitive)")
    return key


def normalize_spec_method(name: str) -> str:
    """``"eagle3"``, ``"mtp"`` or ``"ngram"`` for any known name or alias (case-insensitive,
    ``-``/``.`` read as ``_``); ValueError listing the known names otherwise."""
    return _METHOD_ALIASES[_canon(name)][0]


def _reject_weight_free(name):
    key = _canon(name)
    if _METHOD_ALIASES[key][1] is _WEIGHT_FREE:
        raise ValueError(f"method {name!r}: {_METHOD_ALIASES[key][0]} (prompt lookup) is "
                         "weight-free, it has no draft weights or weight layout; propose "
                         "drafts with specdec_lib.ops.ngram_propose")


def draft_layout(name: str, config: dict | None = None) -> str:
    """The weight layout of a method name: explicit for aliases, from the config for
    plain ``"mtp"`` (``model_type`` / ``architectures`` / ``num_nextn_predict_layers``).
    ValueError for the weight-free ``ngram``."""
    _reject_weight_free(name)
    layout = _METHOD_ALIASES[_canon(name)][1]
    if layout is not None:
        return layout
    cfg = _text_config(config or {})
    mt = str(cfg.get("model_type", "")).lower()
    arch = " ".join(cfg.get("architectures", []) or []).lower()
    if mt.startswith("qwen3") or "qwen3" in arch or "mtp_num_hidden_layers" in cfg:
        return "qwen3_next_mtp"
    if mt.startswith(("deepseek", "hunyuan", "hy")) or "num_nextn_predict_layers" in cfg:
        return "deepseek_mtp"
    raise ValueError("method 'mtp': cannot tell the weight layout from the config "
                     f"(model_type={mt!r}); use qwen3_next_mtp, qwen3_5_mtp, deepseek_mtp "
                     "or hy3_mtp")


def _text_config(config):
    # multimodal configs (Qwen3.5) nest the language model's config
    if "text_config" in config and "hidden_size" not in config:
        return config["text_config"]
    return config


# ---------------------------------------------------------------------------------------
# lazy safetensors reading

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}
_FLOAT = {"F64", "F32", "F16", "BF16"}
_INT = {"I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8"}
_QUANT_DTYPES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "I4", "U4"}
_QUANT_SUFFIXES = ("weight_scale", "weight_scale_inv", "input_scale", "qweight", "qzeros",
                   "scales", "g_idx", "weight_packed", "weight_zero_point", "SCB")


class LazyTensor:
    """One tensor of a safetensors file: header facts now, bytes on first use."""

    path: str
    name: str
    dtype: str            # the safetensors dtype name ("BF16", "F32", ...)
    shape: tuple[int, ...]

    def __init__(self, path: str, name: str, dtype: str, shape: Any, begin: int, end: int,
                 data_start: int, mm_cache: dict) -> None:
        self.path, self.name, self.dtype, self.shape = path, name, dtype, tuple(shape)
        self._begin, self._end, self._data_start, self._mm = begin, end, data_start, mm_cache

    def __repr__(self) -> str:
        return f"LazyTensor({self.name!r}, {self.dtype}, {list(self.shape)})"

    def numpy(self) -> np.ndarray:
        """A read-only view into the memory map or a packed file's unpacked bytes (no copy);
        BF16 comes back as uint16 bits."""
        if self.dtype not in _ST_DTYPES:
            raise NotImplementedError(f"tensor {self.name!r}: dtype {self.dtype} not readable")
        mm = self._mm.get(self.path)
        if mm is None:
            mm = self._mm[self.path] = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = mm[self._data_start + self._begin:self._data_start + self._end]
        return raw.view(_ST_DTYPES[self.dtype]).reshape(self.shape)

    def float32(self) -> np.ndarray:
        """The tensor as a float32 array (BF16 bits widened exactly)."""
        a = self.numpy()
        if self.dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(a, dtype=np.float32)


def open_safetensors(path: str | os.PathLike) -> dict[str, LazyTensor]:
    """name -> LazyTensor for a .safetensors file, a directory of them, or an index json; a
    packed file (``models.packed``) stands for its absent plain twin and is read from memory,
    unpacked here once."""
    from .models import packed
    files = _safetensors_files(path)
    mm_cache = {}
    tensors: dict[str, LazyTensor] = {}
    for f in files:
        if packed.is_packed(f):
            data = packed.unpack_bytes(f)
            mm_cache[f] = np.frombuffer(data, np.uint8)     # read-only, as the memory map
            fh = io.BytesIO(data)
        else:
            fh = open(f, "rb")
        with fh:
            head = fh.read(8)
            if len(head) != 8:
                raise DraftWeightError(f"{f}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            if n > 100 * 1024 * 1024:
                raise DraftWeightError(f"{f}: implausible safetensors header size {n}")
            try:
                header = json.loads(fh.read(n))
            except ValueError as e:
                raise DraftWeightError(f"{f}: bad safetensors header: {e}") from None
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in tensors:
                raise DraftWeightError(f"tensor {name!r} appears in two files ({f})")
            b, e = info["data_offsets"]
            tensors[name] = LazyTensor(f, name, info["dtype"], info["shape"], b, e, 8 + n,
                                       mm_cache)
    return tensors


def _safetensors_files(path):
    from .models.packed import PACKED_SUFFIX, resolve
    path = os.fspath(path)
    if os.path.isdir(path):
        idx = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(idx):
            return _safetensors_files(idx)
        names = set(os.listdir(path))
        # a packed file only where its plain twin is absent (training writes plain files)
        files = sorted(os.path.join(path, f) for f in names if f.endswith(".safetensors")
                       or (f.endswith(".safetensors" + PACKED_SUFFIX)
                           and f[:-len(PACKED_SUFFIX)] not in names))
        if not files:
            raise FileNotFoundError(f"{path}: no .safetensors files")
        return files
    if path.endswith(".json"):
        with open(path) as fh:
            wm = json.load(fh)["weight_map"]
        base = os.path.dirname(path)
        return sorted({resolve(os.path.join(base, f)) for f in wm.values()})
    path = resolve(path)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return [path]


# ---------------------------------------------------------------------------------------
# weight specs

@dataclass(frozen=True)
class TensorSpec:
    """One expected tensor: name, shape, dtype class, whether it must be present."""
    name: str
    shape: tuple
    kind: str = "float"        # "float" | "int" | "bool"
    required: bool = True


@dataclass
class DraftWeightSpec:
    """What a draft checkpoint of one method and layout must hold (``weight_spec``)."""
    method: str                # "eagle3" | "mtp"
    layout: str                # one of LAYOUTS
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    tensors: dict              # name -> TensorSpec
    namespace: tuple           # name prefixes owned by the draft ("" = the whole file)
    norm_unit_offset: bool     # RMSNorm scale is 1 + w (True) or w (False)
    rms_norm_eps: float = 1e-6
    num_layers: int = 1
    layer_prefixes: tuple = ()
    shared_with_target: tuple = ()     # target tensors the draft reuses (embed, lm_head)
    aux_layer_ids: tuple | None = None             # EAGLE3: outputs of these layers
    aux_capture_before_layers: tuple | None = None  # == aux_layer_ids + 1
    d2t_is_offset: bool = True
    allow_unknown: bool = False        # unknown tensors in the namespace are tolerated
    notes: list = field(default_factory=list)


def _need(cfg, key, what):
    if key not in cfg or cfg[key] is None:
        raise DraftWeightError(f"config: missing {key!r} (needed for {what})")
    return int(cfg[key])


def _attn_specs(pre, cfg, in_dim, *, qk_norm=False, gate=False, qk_norm_required=True):
    H = _need(cfg, "hidden_size", "attention shapes")
    nq = _need(cfg, "num_attention_heads", "attention shapes")
    nkv = int(cfg.get("num_key_value_heads") or nq)
    D = int(cfg.get("head_dim") or H // nq)
    s = [TensorSpec(f"{pre}self_attn.q_proj.weight", (nq * D * (2 if gate else 1), in_dim)),
         TensorSpec(f"{pre}self_attn.k_proj.weight", (nkv * D, in_dim)),
         TensorSpec(f"{pre}self_attn.v_proj.weight", (nkv * D, in_dim)),
         TensorSpec(f"{pre}self_attn.o_proj.weight", (H, nq * D))]
    if qk_norm:
        s += [TensorSpec(f"{pre}self_attn.q_norm.weight", (D,), required=qk_norm_required),
              TensorSpec(f"{pre}self_attn.k_norm.weight", (D,), required=qk_norm_required)]
    if cfg.get("attention_bias"):
        s += [TensorSpec(f"{pre}self_attn.{p}_proj.bias", (n,)) for p, n in
              (("q", nq * D * (2 if gate else 1)), ("k", nkv * D), ("v", nkv * D))]
    return s


def _mla_specs(pre, cfg):
    H = _need(cfg, "hidden_size", "MLA shapes")
    nq = _need(cfg, "num_attention_heads", "MLA shapes")
    kvr = _need(cfg, "kv_lora_rank", "MLA shapes")
    nope = _need(cfg, "qk_nope_head_dim", "MLA shapes")
    rope = _need(cfg, "qk_rope_head_dim", "MLA shapes")
    vd = _need(cfg, "v_head_dim", "MLA shapes")
    a = f"{pre}self_attn."
    s = []
    if cfg.get("q_lora_rank"):
        qr = int(cfg["q_lora_rank"])
        s += [TensorSpec(a + "q_a_proj.weight", (qr, H)),
              TensorSpec(a + "q_a_layernorm.weight", (qr,)),
              TensorSpec(a + "q_b_proj.weight", (nq * (nope + rope), qr))]
    else:
        s += [TensorSpec(a + "q_proj.weight", (nq * (nope + rope), H))]
    s += [TensorSpec(a + "kv_a_proj_with_mqa.weight", (kvr + rope, H)),
          TensorSpec(a + "kv_a_layernorm.weight", (kvr,)),
          TensorSpec(a + "kv_b_proj.weight", (nq * (nope + vd), kvr)),
          TensorSpec(a + "o_proj.weight", (H, nq * vd))]
    return s


def _mlp_specs(pre, cfg, *, experts_key, expert_inter_key, shared_key, shared_name,
               shared_gate=False, score_bias=False):
    H = _need(cfg, "hidden_size", "MLP shapes")
    E = int(cfg.get(experts_key) or 0)
    m = f"{pre}mlp."
    if E == 0:
        inter = _need(cfg, "intermediate_size", "MLP shapes")
        return [TensorSpec(m + "gate_proj.weight", (inter, H)),
                TensorSpec(m + "up_proj.weight", (inter, H)),
                TensorSpec(m + "down_proj.weight", (H, inter))]
    im = _need(cfg, expert_inter_key, "MoE expert shapes")
    s = [TensorSpec(m + "gate.weight", (E, H))]
    if score_bias:
        s.append(TensorSpec(m + "gate.e_score_correction_bias", (E,), required=False))
    for e in range(E):
        s += [TensorSpec(f"{m}experts.{e}.gate_proj.weight", (im, H)),
              TensorSpec(f"{m}experts.{e}.up_proj.weight", (im, H)),
              TensorSpec(f"{m}experts.{e}.down_proj.weight", (H, im))]
    si = cfg.get(shared_key)
    if shared_key == "n_shared_experts" and si:
        si = int(si) * im
    if si:
        si = int(si)
        s += [TensorSpec(f"{m}{shared_name}.gate_proj.weight", (si, H)),
              TensorSpec(f"{m}{shared_name}.up_proj.weight", (si, H)),
              TensorSpec(f"{m}{shared_name}.down_proj.weight", (H, si))]
        if shared_gate:
            s.append(TensorSpec(f"{m}shared_expert_gate.weight", (1, H)))
    return s


def _eagle3_spec(cfg):
    H = _need(cfg, "hidden_size", "eagle3")
    V = _need(cfg, "vocab_size", "eagle3")
    Vd = int(cfg.get("draft_vocab_size") or V)
    Ht = int(cfg.get("target_hidden_size") or H)
    ecfg = cfg.get("eagle_config") or {}
    ids = ecfg.get("eagle_aux_hidden_state_layer_ids", cfg.get("eagle_aux_hidden_state_layer_ids"))
    notes = []
    if ids is not None:
        ids = tuple(int(i) for i in ids)
        before = tuple(i + 1 for i in ids)
    else:
        n = cfg.get("target_num_hidden_layers")
        if n:
            n = int(n)
            before = (2, n // 2, n - 3)
            ids = tuple(i - 1 for i in before)
            notes.append("aux layers: default (2, n//2, n-3) capture points")
        else:
            before = None
            notes.append("aux layers: not in config; the target's default applies")
    taps = len(ids) if ids is not None else 3
    inter = _need(cfg, "intermediate_size", "eagle3 MLP")
    t = [TensorSpec("fc.weight", (H, taps * Ht)),
         TensorSpec("midlayer.input_layernorm.weight", (H,)),
         TensorSpec("midlayer.hidden_norm.weight", (H,)),
         TensorSpec("midlayer.post_attention_layernorm.weight", (H,)),
         *_attn_specs("midlayer.", cfg, 2 * H),
         TensorSpec("midlayer.mlp.gate_proj.weight", (inter, H)),
         TensorSpec("midlayer.mlp.up_proj.weight", (inter, H)),
         TensorSpec("midlayer.mlp.down_proj.weight", (H, inter)),
         TensorSpec("norm.weight", (H,)),
         TensorSpec("lm_head.weight", (Vd, H)),
         TensorSpec("d2t", (Vd,), kind="int", required=Vd != V),
         TensorSpec("t2d", (V,), kind="bool", required=False),
         TensorSpec("embed_tokens.weight", (V, H), required=False)]
    return DraftWeightSpec(
        method="eagle3", layout="eagle3", hidden_size=H, vocab_size=V, draft_vocab_size=Vd,
        tensors={s.name: s for s in t}, namespace=("",), norm_unit_offset=False,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), num_layers=1,
        layer_prefixes=("midlayer.",), shared_with_target=("embed_tokens.weight",),
        aux_layer_ids=ids, aux_capture_before_layers=before, d2t_is_offset=True, notes=notes)


def _qwen3_next_mtp_spec(cfg):
    cfg = _text_config(cfg)
    H = _need(cfg, "hidden_size", "qwen3_next_mtp")
    V = _need(cfg, "vocab_size", "qwen3_next_mtp")
    n = int(cfg.get("mtp_num_hidden_layers") or 1)
    gate = bool(cfg.get("attn_output_gate", True))
    t = [TensorSpec("mtp.fc.weight", (H, 2 * H)),
         TensorSpec("mtp.pre_fc_norm_embedding.weight", (H,)),
         TensorSpec("mtp.pre_fc_norm_hidden.weight", (H,)),
         TensorSpec("mtp.norm.weight", (H,))]
    prefixes = []
    for i in range(n):
        pre = f"mtp.layers.{i}."
        prefixes.append(pre)
        t += [TensorSpec(pre + "input_layernorm.weight", (H,)),
              TensorSpec(pre + "post_attention_layernorm.weight", (H,)),
              *_attn_specs(pre, cfg, H, qk_norm=True, gate=gate),
              *_mlp_specs(pre, cfg, experts_key="num_experts",
                          expert_inter_key="moe_intermediate_size",
                          shared_key="shared_expert_intermediate_size",
                          shared_name="shared_expert", shared_gate=True)]
    return DraftWeightSpec(
        method="mtp", layout="qwen3_next_mtp", hidden_size=H, vocab_size=V, draft_vocab_size=V,
        tensors={s.name: s for s in t}, namespace=("mtp.",), norm_unit_offset=True,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), num_layers=n,
        layer_prefixes=tuple(prefixes),
        shared_with_target=("model.embed_tokens.weight", "lm_head.weight"))


def _deepseek_mtp_spec(cfg):
    cfg = _text_config(cfg)
    H = _need(cfg, "hidden_size", "deepseek_mtp")
    V = _need(cfg, "vocab_size", "deepseek_mtp")
    L = _need(cfg, "num_hidden_layers", "deepseek_mtp layer numbering")
    n = int(cfg.get("num_nextn_predict_layers") or 1)
    t, prefixes = [], []
    for i in range(n):
        pre = f"model.layers.{L + i}."
        prefixes.append(pre)
        t += [TensorSpec(pre + "enorm.weight", (H,)),
              TensorSpec(pre + "hnorm.weight", (H,)),
              TensorSpec(pre + "eh_proj.weight", (H, 2 * H)),
              TensorSpec(pre + "shared_head.norm.weight", (H,)),
              TensorSpec(pre + "shared_head.head.weight", (V, H), required=False),
              TensorSpec(pre + "embed_tokens.weight", (V, H), required=False),
              TensorSpec(pre + "input_layernorm.weight", (H,)),
              TensorSpec(pre + "post_attention_layernorm.weight", (H,))]
        if cfg.get("kv_lora_rank"):
            t += _mla_specs(pre, cfg)
        else:
            t += _attn_specs(pre, cfg, H, qk_norm=True, qk_norm_required=False)
        t += _mlp_specs(pre, cfg, experts_key="n_routed_experts",
                        expert_inter_key="moe_intermediate_size", shared_key="n_shared_experts",
                        shared_name="shared_experts", score_bias=True)
    return DraftWeightSpec(
        method="mtp", layout="deepseek_mtp", hidden_size=H, vocab_size=V, draft_vocab_size=V,
        tensors={s.name: s for s in t}, namespace=tuple(prefixes), norm_unit_offset=False,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), num_layers=n,
        layer_prefixes=tuple(prefixes),
        shared_with_target=("model.embed_tokens.weight", "lm_head.weight"),
        # Hy3 and DeepSeek variants name some attention/MoE tensors differently: the
        # MTP-specific tensors are checked strictly, other layer tensors where known.
        allow_unknown=True)


_SPEC_BUILDERS = {"eagle3": _eagle3_spec, "qwen3_next_mtp": _qwen3_next_mtp_spec,
                  "deepseek_mtp": _deepseek_mtp_spec}


def weight_spec(method: str, config: dict) -> DraftWeightSpec:
    """The weight spec of a method (or alias) under a config (HF config.json as a dict)."""
    _reject_weight_free(method)
    if not isinstance(config, dict):
        raise TypeError(f"config: expected a dict, got {type(config).__name__}")
    _reject_quantised_config(config)
    return _SPEC_BUILDERS[draft_layout(method, config)](config)


def _reject_quantised_config(cfg):
    for c in (cfg, _text_config(cfg)):
        q = c.get("quantization_config")
        if q:
            qm = q.get("quant_method", "?") if isinstance(q, dict) else q
            raise NotImplementedError(f"quantised draft checkpoints are not supported "
                                      f"(config quantization_config: {qm}); use a bf16/fp16/"
                                      "fp32 draft")


# ---------------------------------------------------------------------------------------
# loading

class DraftWeights:
    """Validated, lazily read draft weights: ``w[name]`` gives a float32/int numpy array."""

    def __init__(self, spec: DraftWeightSpec, tensors: dict[str, LazyTensor],
                 shared: dict[str, LazyTensor]) -> None:
        self.spec = spec
        self._t = tensors          # draft-namespace name -> LazyTensor
        self._shared = shared      # shared target tensors found in the same files
        self._cache: dict[str, np.ndarray] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._t or name in self._shared

    def names(self) -> list[str]:
        return sorted(self._t)

    def lazy(self, name: str) -> LazyTensor:
        if name in self._t:
            return self._t[name]
        if name in self._shared:
            return self._shared[name]
        raise KeyError(f"draft weights: no tensor {name!r}")

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            lt = self.lazy(name)
            self._cache[name] = lt.float32() if lt.dtype in _FLOAT else np.asarray(lt.numpy())
        return self._cache[name]


def _in_namespace(name, spec):
    return any(name.startswith(p) for p in spec.namespace)


def load_draft_weights(method: str, path: str | os.PathLike,
                       config: dict | None = None) -> DraftWeights:
    """Open and validate a draft checkpoint (file, directory or index json) lazily.

    ``config`` defaults to ``config.json`` next to the weights. Raises DraftWeightError
    naming the first offending tensor, NotImplementedError for quantised checkpoints,
    ValueError for the weight-free ``ngram`` (before any file is opened).
    """
    _reject_weight_free(method)
    if config is None:
        base = path if os.path.isdir(path) else os.path.dirname(os.fspath(path))
        cfg_path = os.path.join(base, "config.json")
        if not os.path.exists(cfg_path):
            raise FileNotFoundError(f"{cfg_path}: no config given and none next to the weights")
        with open(cfg_path) as fh:
            config = json.load(fh)
    spec = weight_spec(method, config)
    found = open_safetensors(path)      # a packed file unpacked (its own sha256 checked) once
    check_weights_digest(path, config, unpacked=True)
    validate_draft_tensors(spec, {k: (v.dtype, v.shape) for k, v in found.items()})
    mine = {k: v for k, v in found.items() if _in_namespace(k, spec)}
    shared = {k: v for k, v in found.items() if k in spec.shared_with_target}
    log.info("draft weights %s: %s layout, %d tensors (+%d shared with the target) validated",
             os.fspath(path), spec.layout, len(mine), len(shared))
    return DraftWeights(spec, mine, shared)


def check_weights_digest(path: str | os.PathLike, config: dict, unpacked: bool = False) -> None:
    """A single-file checkpoint whose config records ``weights_size`` / ``weights_sha256``
    (``models.heads.save_head`` writes both) must match them: DraftWeightError naming the
    file otherwise (an altered or truncated download), before any tensor is read.
    ``unpacked``: a packed file was opened already (``packed.check_digest``)."""
    want = config.get("weights_sha256")
    from .models.packed import check_digest, resolve
    f = os.path.join(path, "model.safetensors") if os.path.isdir(path) else os.fspath(path)
    f = resolve(f)      # a packed file: its size and sha256 unpacked are the plain file's
    if want is None or not os.path.isfile(f) or f.endswith(".json"):
        return
    check_digest(f, config.get("weights_size"), want, DraftWeightError, unpacked)


def validate_draft_tensors(spec: DraftWeightSpec, found: dict[str, tuple[str, Any]]) -> None:
    """Check ``found`` (name -> (safetensors dtype, shape)) against ``spec``."""
    for name, (dt, _) in found.items():
        if not _in_namespace(name, spec):
            continue
        if dt in _QUANT_DTYPES:
            raise NotImplementedError(f"tensor {name!r}: quantised dtype {dt}; quantised "
                                      "drafts are not supported")
        if name.rsplit(".", 1)[-1] in _QUANT_SUFFIXES:
            raise NotImplementedError(f"tensor {name!r}: quantisation parameter; quantised "
                                      "drafts are not supported")
    for s in spec.tensors.values():
        if s.name not in found:
            if s.required:
                raise DraftWeightError(f"{spec.layout} draft: missing tensor {s.name!r} "
                                       f"(expected shape {list(s.shape)})")
            continue
        dt, shape = found[s.name]
        if tuple(shape) != tuple(s.shape):
            raise DraftWeightError(f"{spec.layout} draft: tensor {s.name!r} has shape "
                                   f"{list(shape)}, expected {list(s.shape)}")
        ok = {"float": _FLOAT, "int": _INT, "bool": {"BOOL", "U8"} | _INT}[s.kind]
        if dt not in ok:
            if s.kind == "float" and dt in {"I8", "U8"}:
                raise NotImplementedError(f"tensor {s.name!r}: integer weight ({dt}); "
                                          "quantised drafts are not supported")
            raise DraftWeightError(f"{spec.layout} draft: tensor {s.name!r} has dtype {dt}, "
                                   f"expected a {s.kind} dtype")
    if not spec.allow_unknown:
        benign = ("rotary_emb.inv_freq",)
        for name in sorted(found):
            if (_in_namespace(name, spec) and name not in spec.tensors
                    and not name.endswith(benign)):
                raise DraftWeightError(f"{spec.layout} draft: unexpected tensor {name!r} "
                                       "(config and checkpoint disagree?)")
