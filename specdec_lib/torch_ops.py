"""specdec_lib's ops as PyTorch custom ops: ``torch.ops.specdec.<name>``.

Importing this module (``import specdec_lib.torch_ops``, or the older ``specdec_lib.torch``;
``import specdec_lib`` never imports
torch) registers every public op of ``specdec_lib.ops`` as a torch library op
(``torch.library.Library.define`` / ``impl`` / ``register_fake``), so that torch.compile
traces them as single graph nodes (no graph break, fullgraph=True works) and CUDA graphs
(``torch.cuda.graph``, ``mode="reduce-overhead"``) capture them:

* every tensor an op writes is a mutated argument of its schema (``Tensor(a!)``), so
  functionalization orders and re-inplaces the writes; every op returns nothing;
* a fake (meta) kernel runs the op's contract (``specdec_lib.contract``: dtypes, shapes,
  strides, devices) on the fake tensors and produces no tensor;
* the CUDA kernel launches on ``torch.cuda.current_stream(device)`` read at call time:
  inside ``torch.cuda.graph`` / compiled CUDA graphs that is the capture stream;
* CPU tensors are checked by the same contract on the tensors themselves (exact dtypes:
  a float32 ``k`` for a bf16 cache is refused), then run the numpy reference
  (``specdec_lib.reference``, unchecked: it computes on numpy copies), in place on the
  tensors' memory (bfloat16 through a float32 copy, or as bit patterns where the
  reference rounds to bf16 itself), so that ``torch.library.opcheck`` and compiled CPU
  graphs can be tested without a GPU. The reference raises on bad input where the GPU op
  would flag a row; ``status`` outputs that a reference lacks are written as 0.

Arguments and their order are those of ``specdec_lib.ops`` (see each op's docstring),
without ``stream=``. Differences: ``spec_sample``'s ``workspace`` is optional (allocated
per call with torch's allocator when None: graph-capture safe, since the capture's memory
pool owns it); ``verify_attention``'s workspace, when given, is a mutated argument.

Adding an op is one ``_OpSpec`` entry in ``_TABLE``: its name in ``specdec_lib.ops`` and its
schema (``Tensor!`` marks a written tensor, ``Tensor!?`` an optional written one); its
argument checks are its contract (``specdec_lib.contract``), which every op must have. Entries whose op does not exist (yet) are skipped and listed
in ``MISSING``.

Example::

    import torch, specdec_lib.torch_ops  # registers torch.ops.specdec.*
    torch.ops.specdec.append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q)
    torch.ops.specdec.spec_sample(logits, cu_q, drafts, temp, top_k, top_p, min_p, seed,
                                  step, n_acc, emitted, status)
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import ops as _gpu_ops
from . import reference as _ref_ops
from .contract import CHECKS as _CONTRACTS
from .contract import run_host_check as _host_check

NAMESPACE = "specdec"

__all__ = ["NAMESPACE", "OPS", "MISSING", "ops", "schema_of"]


@dataclass(frozen=True)
class _OpSpec:
    name: str
    schema: str                                   # "Tensor!" = written; letters are added
    bf16_bits: bool = False   # CPU: pass bf16 as uint16 bit patterns (the reference rounds)
    setup: Optional[Callable[[dict], None]] = None   # CUDA: fills defaults (workspace) in place


def _spec_sample_setup(kw):
    if kw.get("workspace") is None:
        lg = kw["logits"]
        nbytes = _gpu_ops.spec_sample_workspace_size(lg.shape[0], lg.shape[1])
        kw["workspace"] = torch.empty((nbytes,), dtype=torch.uint8, device=lg.device)


# ----------------------------------------------------------------- the table
_TABLE = (
    _OpSpec("copy", "(Tensor! dst, Tensor src) -> ()"),
    _OpSpec("append_kv", "(Tensor k, Tensor v, Tensor! k_cache, Tensor! v_cache, Tensor page_table, "
            "Tensor seq_lens, Tensor cu_q, Tensor? finished=None, *, bool check_indices=True, "
            "Tensor? k_scale=None, Tensor? v_scale=None, Tensor!? k_params=None, "
            "Tensor!? v_params=None) -> ()"),
    _OpSpec("verify_attention", "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, "
            "Tensor seq_lens, Tensor cu_q, Tensor! out, float? scale=None, Tensor!? lse_out=None, "
            "Tensor!? workspace=None, *, int? num_splits=None, int? max_kv_len=None, "
            "int? max_q=None, bool row_invariant=False, bool? check_indices=None, "
            "Tensor? k_scale=None, Tensor? v_scale=None, Tensor? k_params=None, "
            "Tensor? v_params=None) -> ()"),
    # the state is written too: the fused mode commits the pending rows into it
    _OpSpec("gdn_verify", "(Tensor q, Tensor k, Tensor v, Tensor! state, Tensor slot_ids, "
            "Tensor cu_q, Tensor! out, Tensor! journal, Tensor? g=None, Tensor? beta=None, "
            "Tensor? a=None, Tensor? b=None, Tensor? A_log=None, Tensor? dt_bias=None, "
            "Tensor!? status=None, Tensor? pending_journal=None, Tensor? pending_row0=None, "
            "Tensor? pending_len=None, *, float? scale=None, bool qk_l2norm=False, "
            "str layout=\"kv\", bool check_indices=True) -> ()", bf16_bits=True),
    _OpSpec("gdn_commit", "(Tensor! state, Tensor slot_ids, Tensor cu_q, Tensor accept_len, "
            "Tensor journal, Tensor!? status=None, *, str layout=\"kv\", bool check_indices=True) -> ()", bf16_bits=True),
    _OpSpec("gdn_flush", "(Tensor! state, Tensor slot_ids, Tensor pending_journal, "
            "Tensor pending_row0, Tensor pending_len, Tensor!? status=None, *, str layout=\"kv\", "
            "bool check_indices=True) -> ()", bf16_bits=True),
    # the state is written too: the fused mode shifts the pending rows into it
    _OpSpec("conv1d_verify", "(Tensor x, Tensor weight, Tensor! conv_state, Tensor slot_ids, "
            "Tensor cu_q, Tensor! out, Tensor? bias=None, Tensor!? journal=None, Tensor!? status=None, "
            "Tensor? pending_journal=None, Tensor? pending_row0=None, Tensor? pending_len=None, "
            "*, str? activation=\"silu\", bool check_indices=True) -> ()", bf16_bits=True),
    _OpSpec("conv1d_commit", "(Tensor! conv_state, Tensor slot_ids, Tensor cu_q, Tensor accept_len, "
            "Tensor journal, Tensor!? status=None, *, bool check_indices=True) -> ()", bf16_bits=True),
    _OpSpec("conv1d_flush", "(Tensor! conv_state, Tensor slot_ids, Tensor pending_journal, "
            "Tensor pending_row0, Tensor pending_len, Tensor!? status=None, *, "
            "bool check_indices=True) -> ()", bf16_bits=True),
    _OpSpec("spec_sample", "(Tensor logits, Tensor cu_q, Tensor draft_ids, Tensor temperature, "
            "Tensor top_k, Tensor top_p, Tensor min_p, Tensor seed, Tensor step, "
            "Tensor! num_accepted, Tensor! emitted, Tensor! status, Tensor? draft_probs=None, "
            "Tensor? d2t=None, Tensor!? accepted_logprobs=None, Tensor!? workspace=None, *, "
            "bool? filters=None, bool check_indices=True) -> ()", setup=_spec_sample_setup),
    _OpSpec("seq_stop", "(Tensor emitted, Tensor num_accepted, Tensor out_tokens, Tensor out_lens, "
            "Tensor? stop_ids, Tensor? stop_seqs, Tensor max_new_tokens, Tensor! accept_len, "
            "Tensor! finished) -> ()"),
    _OpSpec("seq_advance", "(Tensor emitted, Tensor accept_len, Tensor! seq_lens, Tensor! out_tokens, "
            "Tensor! out_lens, Tensor! last_token, Tensor! finished) -> ()"),
    _OpSpec("seq_build_block", "(Tensor last_token, Tensor draft_tokens, Tensor num_draft, "
            "Tensor seq_lens, Tensor! cu_q, Tensor! block_tokens, Tensor! positions, "
            "Tensor!? draft_ids=None) -> ()"),
    _OpSpec("draft_carry", "(Tensor hidden, Tensor cu_q, Tensor accept_len, Tensor! out, *, "
            "int row_begin=0, int col_begin=0) -> ()"),
    _OpSpec("capture_hidden", "(Tensor hidden, Tensor! out, int tap, Tensor? residual=None) -> ()"),
    _OpSpec("draft_combine", "(Tensor embed, Tensor hidden, Tensor embed_norm_weight, "
            "Tensor hidden_norm_weight, Tensor! out, Tensor? token_ids=None, *, float eps=1e-06, "
            "bool unit_offset=False) -> ()"),
    _OpSpec("draft_map_tokens", "(Tensor draft_ids, Tensor d2t, Tensor! out, *, bool offsets=True) -> ()"),
    # families being added in parallel (skipped while specdec_lib.ops lacks them)
    _OpSpec("rms_norm", "(Tensor x, Tensor weight, Tensor! out, Tensor? residual=None, "
            "Tensor!? residual_out=None, *, float eps=1e-06, bool unit_offset=False) -> ()"),
    _OpSpec("rope", "(Tensor! q, Tensor!? k, Tensor positions, Tensor cos_sin_cache) -> ()"),
    _OpSpec("silu_mul", "(Tensor x, Tensor! out) -> ()"),
    # bf16 as bits on the CPU: the reference rounds the output once (x may be float32)
    _OpSpec("gated_rms_norm", "(Tensor x, Tensor z, Tensor weight, Tensor! out, *, "
            "int group_size, Tensor? z_bias=None, float eps=1e-06) -> ()", bf16_bits=True),
    _OpSpec("rope_append_kv", "(Tensor! q, Tensor! k, Tensor v, Tensor positions, "
            "Tensor cos_sin_cache, Tensor! k_cache, Tensor! v_cache, Tensor page_table, "
            "Tensor seq_lens, Tensor cu_q, Tensor? finished=None, *, bool check_indices=True, "
            "Tensor? k_scale=None, Tensor? v_scale=None, Tensor!? k_params=None, "
            "Tensor!? v_params=None) -> ()"),
    _OpSpec("linear", "(Tensor x, Tensor weight, Tensor! out, *, Tensor? norm_weight=None, "
            "float eps=1e-06, Tensor? residual=None, Tensor!? residual_out=None, "
            "str? epilogue=None, bool unit_offset=False, bool tensor_cores=False) -> ()",
            bf16_bits=True),
    _OpSpec("ngram_propose", "(Tensor prompt, Tensor prompt_lens, Tensor output, Tensor output_lens, "
            "Tensor! draft_tokens, Tensor! num_draft, *, int min_n=1, int max_n=3, "
            "bool check_indices=True) -> ()"),
)


def schema_of(spec_schema: str) -> str:
    """Our shorthand -> a torch schema: ``Tensor!`` / ``Tensor!?`` become ``Tensor(a!)`` /
    ``Tensor(b!)?`` with one alias letter per written argument."""
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    return re.sub(r"Tensor!(\??)", lambda m: f"Tensor({next(letters)}!){m.group(1)}", spec_schema)


def _written(schema: str) -> tuple:
    parsed = torch._C.parse_schema(f"{NAMESPACE}::_probe{schema}")
    return tuple(a.name for a in parsed.arguments if a.alias_info is not None and a.alias_info.is_write)


def _arg_names(schema: str):
    parsed = torch._C.parse_schema(f"{NAMESPACE}::_probe{schema}")
    return [a.name for a in parsed.arguments]


def _device_of(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v.device
    raise ValueError("no tensor argument")


# ----------------------------------------------------------------- kernels
def _call(fn, bound, convert=lambda name, v: v, on_dropped=None):
    """fn(...) with the schema's arguments ``bound`` (name -> value) passed the way fn's own
    signature takes them (positional, or keyword-only); arguments fn lacks go to
    ``on_dropped(name, value)``."""
    params = inspect.signature(fn).parameters
    pos, kw = [], {}
    for name, p in params.items():
        if name not in bound:
            continue
        v = convert(name, bound[name])
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and len(pos) == list(params).index(name):
            pos.append(v)
        else:
            kw[name] = v
    for name, v in bound.items():
        if name not in params and on_dropped is not None:
            on_dropped(name, v)
    return fn(*pos, **kw)


def _cpu_call(ref_fn, spec, written, bound):
    """The numpy reference on CPU tensors, writing through to the tensors' memory."""
    copies_back = []

    def np_of(name, t):
        if not isinstance(t, torch.Tensor):
            return t
        if t.dtype == torch.bfloat16:
            if spec.bf16_bits:
                return t.view(torch.uint16).numpy()
            arr = t.float().numpy()
            if name in written:
                copies_back.append((t, arr))
            return arr
        if t.dtype == torch.float8_e4m3fn:
            return t.view(torch.uint8).numpy()   # the reference's fp8 caches: bit patterns
        return t.numpy()

    def dropped(name, v):
        if name == "status" and isinstance(v, torch.Tensor):
            v.zero_()   # the reference raises where the GPU op flags a row

    _call(ref_fn, bound, np_of, dropped)
    for t, arr in copies_back:
        t.copy_(torch.from_numpy(arr))


def _make_kernel(spec, gpu_fn, ref_fn, names, written):
    def kernel(*args, **kwargs):
        bound = dict(zip(names, args))
        bound.update(kwargs)
        dev = _device_of(args, kwargs)
        if dev.type == "cuda":
            if gpu_fn is None:
                raise NotImplementedError(f"specdec::{spec.name}: no GPU op in this build")
            if spec.setup is not None:
                spec.setup(bound)
            bound["stream"] = torch.cuda.current_stream(dev).cuda_stream
            _call(gpu_fn, bound)
        elif dev.type == "cpu":
            if ref_fn is None:
                raise NotImplementedError(f"specdec::{spec.name}: no numpy reference for CPU tensors")
            _host_check(spec.name, bound)
            _cpu_call(getattr(ref_fn, "unchecked", ref_fn), spec, written, bound)
        else:
            raise TypeError(f"specdec::{spec.name}: tensors on {dev} are not supported (cuda or cpu)")
        return None
    kernel.__name__ = spec.name
    return kernel


def _make_fake(spec, names):
    def fake(*args, **kwargs):
        bound = dict(zip(names, args))
        bound.update(kwargs)
        devs = {v.device for v in bound.values() if isinstance(v, torch.Tensor)}
        if len(devs) > 1:
            raise ValueError(f"specdec::{spec.name}: tensors on several devices {sorted(map(str, devs))}")
        _host_check(spec.name, bound)
        return None
    return fake


def _register():
    registered, missing = {}, []
    for spec in _TABLE:
        if spec.name not in _CONTRACTS:
            raise RuntimeError(f"specdec::{spec.name}: no argument contract (specdec_lib.contract)")
        gpu_fn = getattr(_gpu_ops, spec.name, None)
        ref_fn = getattr(_ref_ops, spec.name, None)
        if gpu_fn is None and ref_fn is None:
            missing.append(spec.name)
            continue
        schema = schema_of(spec.schema)
        names, written = _arg_names(schema), _written(schema)
        # torch.library.Library.define + impl rather than torch.library.custom_op: custom_op's
        # in-place bookkeeping (torch 2.11) indexes the mutated arguments positionally and
        # fails when a call leaves defaulted outputs (workspace, lse_out, status) out; the
        # schema's alias annotations are what torch.compile's functionalization reads anyway
        _LIB.define(f"{spec.name}{schema}")
        kernel = _make_kernel(spec, gpu_fn, ref_fn, names, written)
        for key in ("CPU", "CUDA"):
            _LIB.impl(spec.name, kernel, key)
        torch.library.register_fake(f"{NAMESPACE}::{spec.name}", _make_fake(spec, names), lib=_LIB)
        registered[spec.name] = getattr(getattr(torch.ops, NAMESPACE), spec.name)
    return registered, tuple(missing)


_LIB = torch.library.Library(NAMESPACE, "DEF")


OPS, MISSING = _register()
ops = torch.ops.specdec   # torch.ops.specdec.<name>: the OpOverloadPacket torch.compile sees


def __getattr__(name):
    if name in OPS:
        return OPS[name]
    raise AttributeError(f"module 'specdec_lib.torch_ops' has no attribute {name!r}")
