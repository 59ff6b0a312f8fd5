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

Adding an op is one ``_OpSpec`` entry in ``_TABLE``: its name in ``specdec_lib.ops``, its
schema (``Tensor!`` marks a written tensor, ``Tensor!?`` an optional written one) and
optionally a fake-time check. Entries whose op does not exist (yet) are skipped and listed
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
    check: Optional[Callable[..., None]] = None   # fake-time check(**bound arguments)
    bf16_bits: bool = False   # CPU: pass bf16 as uint16 bit patterns (the reference rounds)
    setup: Optional[Callable[[dict], None]] = None   # CUDA: fills defaults (workspace) in place


# ----------------------------------------------------------------- fake-time checks
def _fail(name, msg):
    raise ValueError(f"{name}: {msg}")


def _dt(name, t, *dtypes):
    if t is not None and t.dtype not in dtypes:
        raise TypeError(f"{name}: dtype must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")


def _shape(name, t, *want):
    if t is None:
        return
    got = tuple(t.shape)
    if len(got) != len(want) or any(w is not None and g != w for g, w in zip(got, want)):
        pretty = "[" + ", ".join("*" if w is None else str(w) for w in want) + "]"
        _fail(name, f"expected shape {pretty}, got {list(got)}")


_F = (torch.float32, torch.float16, torch.bfloat16)
_I32 = (torch.int32,)


def _check_copy(dst, src):
    if src.dtype != dst.dtype:
        raise TypeError(f"src: dtype {src.dtype} differs from dst's {dst.dtype}")
    try:
        torch.broadcast_shapes(tuple(src.shape), tuple(dst.shape))
    except RuntimeError:
        _fail("src", f"shape {list(src.shape)} does not broadcast to dst's {list(dst.shape)}")


def _check_append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished=None, **_):
    _shape("k_cache", k_cache, None, None, None, None)
    _, _, hkv, d = k_cache.shape
    _shape("v_cache", v_cache, *k_cache.shape)
    _shape("k", k, None, hkv, d)
    _shape("v", v, *k.shape)
    for n, t in (("k", k), ("v", v), ("v_cache", v_cache)):
        _dt(n, t, k_cache.dtype)
    _shape("page_table", page_table, None, None)
    B = page_table.shape[0]
    _shape("seq_lens", seq_lens, B)
    _shape("cu_q", cu_q, B + 1)
    _shape("finished", finished, B)
    for n, t in (("page_table", page_table), ("seq_lens", seq_lens), ("cu_q", cu_q)):
        _dt(n, t, *_I32)


def _check_verify_attention(q, k_cache, v_cache, page_table, seq_lens, cu_q, out, scale=None,
                            lse_out=None, **_):
    _dt("q", q, torch.float16, torch.bfloat16)
    _shape("q", q, None, None, None)
    T, Hq, D = q.shape
    _shape("out", out, T, Hq, D)
    _dt("out", out, q.dtype)
    _shape("lse_out", lse_out, T, Hq)
    _dt("lse_out", lse_out, torch.float32)
    _shape("k_cache", k_cache, None, None, None, D)
    _shape("v_cache", v_cache, *k_cache.shape)
    B = page_table.shape[0]
    _shape("seq_lens", seq_lens, B)
    _shape("cu_q", cu_q, B + 1)


def _gdn_state(state, layout):
    _shape("state", state, None, None, None, None)
    if layout not in ("kv", "vk"):
        _fail("layout", f"expected 'kv' or 'vk', got {layout!r}")
    _, Hv, a, b = state.shape
    return (Hv, a, b) if layout == "kv" else (Hv, b, a)


def _check_gdn_verify(q, k, v, state, slot_ids, cu_q, out, journal, *, layout="kv", status=None,
                      **_):
    Hv, Dk, Dv = _gdn_state(state, layout)
    _shape("q", q, None, None, Dk)
    T, Hk = q.shape[0], q.shape[1]
    _shape("k", k, *q.shape)
    _shape("v", v, T, Hv, Dv)
    _shape("out", out, T, Hv, Dv)
    _shape("journal", journal, T, Hk * Dk + Hv * Dv + 2 * Hv)
    _dt("journal", journal, torch.float32)
    B = slot_ids.shape[0]
    _shape("cu_q", cu_q, B + 1)
    _shape("status", status, B)


def _check_gdn_commit(state, slot_ids, cu_q, accept_len, journal, *, layout="kv", status=None,
                      **_):
    _gdn_state(state, layout)
    B = slot_ids.shape[0]
    _shape("cu_q", cu_q, B + 1)
    _shape("accept_len", accept_len, B)
    _shape("status", status, B)
    _dt("journal", journal, torch.float32)


def _check_gdn_flush(state, slot_ids, pending_journal, pending_row0, pending_len, *,
                     layout="kv", status=None, **_):
    _gdn_state(state, layout)
    B = slot_ids.shape[0]
    for n, t in (("pending_row0", pending_row0), ("pending_len", pending_len), ("status", status)):
        _shape(n, t, B)


def _check_conv1d_verify(x, weight, conv_state, slot_ids, cu_q, out, *, journal=None,
                         status=None, **_):
    _shape("conv_state", conv_state, None, None, None)
    dim = conv_state.shape[1]
    _shape("x", x, None, dim)
    _shape("out", out, *x.shape)
    _shape("journal", journal, *x.shape)
    B = slot_ids.shape[0]
    _shape("cu_q", cu_q, B + 1)
    _shape("status", status, B)


def _check_conv1d_commit(conv_state, slot_ids, cu_q, accept_len, journal, *, status=None, **_):
    _shape("conv_state", conv_state, None, None, None)
    _shape("journal", journal, None, conv_state.shape[1])
    B = slot_ids.shape[0]
    _shape("cu_q", cu_q, B + 1)
    _shape("accept_len", accept_len, B)
    _shape("status", status, B)


def _check_spec_sample(logits, cu_q, draft_ids, temperature, top_k, top_p, min_p, seed, step,
                       num_accepted, emitted, status, draft_probs=None, d2t=None,
                       accepted_logprobs=None, **_):
    _dt("logits", logits, *_F)
    _shape("logits", logits, None, None)
    T = logits.shape[0]
    _shape("cu_q", cu_q, None)
    B = cu_q.shape[0] - 1
    if B < 0 or T < B:
        _fail("cu_q", f"{B + 1} entries for {T} logit rows")
    _shape("draft_ids", draft_ids, T - B)
    for n, t, dts in (("temperature", temperature, (torch.float32,)), ("top_k", top_k, _I32),
                      ("top_p", top_p, (torch.float32,)), ("min_p", min_p, (torch.float32,)),
                      ("seed", seed, (torch.int64, torch.uint64)), ("step", step, (torch.int64,)),
                      ("num_accepted", num_accepted, _I32), ("status", status, _I32)):
        _shape(n, t, B)
        _dt(n, t, *dts)
    _shape("emitted", emitted, B, None)
    _dt("emitted", emitted, *_I32)
    _shape("accepted_logprobs", accepted_logprobs, *emitted.shape)
    _shape("draft_probs", draft_probs, T - B, None)


def _check_rows(b_shape, **tensors):
    for n, t in tensors.items():
        _shape(n, t, *b_shape)


def _check_seq_stop(emitted, num_accepted, out_tokens, out_lens, stop_ids, stop_seqs,
                    max_new_tokens, accept_len, finished):
    _shape("emitted", emitted, None, None)
    B = emitted.shape[0]
    _check_rows((B,), num_accepted=num_accepted, out_lens=out_lens,
                max_new_tokens=max_new_tokens, accept_len=accept_len, finished=finished)
    _shape("out_tokens", out_tokens, B, None)
    _dt("finished", finished, torch.uint8)


def _check_seq_advance(emitted, accept_len, seq_lens, out_tokens, out_lens, last_token, finished):
    _shape("emitted", emitted, None, None)
    B = emitted.shape[0]
    _check_rows((B,), accept_len=accept_len, seq_lens=seq_lens, out_lens=out_lens,
                last_token=last_token, finished=finished)
    _shape("out_tokens", out_tokens, B, None)
    _dt("finished", finished, torch.uint8)


def _check_seq_build_block(last_token, draft_tokens, num_draft, seq_lens, cu_q, block_tokens,
                           positions, draft_ids=None):
    B = last_token.shape[0]
    _shape("draft_tokens", draft_tokens, B, None)
    _check_rows((B,), num_draft=num_draft, seq_lens=seq_lens)
    _shape("cu_q", cu_q, B + 1)


def _check_draft_carry(hidden, cu_q, accept_len, out, **_):
    B = accept_len.shape[0]
    _shape("cu_q", cu_q, B + 1)
    _shape("out", out, B, None)
    if out.dtype != hidden.dtype:
        raise TypeError(f"out: dtype {out.dtype} differs from hidden's {hidden.dtype}")


def _check_capture_hidden(hidden, out, tap, *, residual=None):
    _shape("hidden", hidden, None, None)
    T, H = hidden.shape
    _shape("out", out, T, None)
    _shape("residual", residual, T, H)


def _check_draft_combine(embed, hidden, embed_norm_weight, hidden_norm_weight, out, **_):
    _shape("hidden", hidden, None, None)
    rows, H = hidden.shape
    _shape("out", out, rows, 2 * H)
    _shape("embed_norm_weight", embed_norm_weight, H)
    _shape("hidden_norm_weight", hidden_norm_weight, H)


def _check_draft_map_tokens(draft_ids, d2t, out, **_):
    _shape("out", out, draft_ids.shape[0])
    _dt("out", out, *_I32)


def _check_rms_norm(x, weight, out, *, residual=None, residual_out=None, **_):
    _shape("out", out, *x.shape)
    _shape("weight", weight, x.shape[-1])
    _shape("residual", residual, *x.shape)
    _shape("residual_out", residual_out, *x.shape)


def _check_rope(q, k, positions, cos_sin_cache):
    _shape("positions", positions, q.shape[0])
    if k is not None and k.shape[0] != q.shape[0]:
        _fail("k", f"{k.shape[0]} rows != q's {q.shape[0]}")


def _check_rope_append_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, page_table,
                          seq_lens, cu_q, finished=None, **_):
    _check_rope(q, k, positions, cos_sin_cache)
    _dt("k", k, q.dtype)
    _check_append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished)


def _check_silu_mul(x, out):
    if x.shape[-1] != 2 * out.shape[-1] or tuple(x.shape[:-1]) != tuple(out.shape[:-1]):
        _fail("out", f"expected shape {list(x.shape[:-1]) + [x.shape[-1] // 2]} for x "
                     f"{list(x.shape)}, got {list(out.shape)}")


def _check_linear(x, weight, out, *, norm_weight=None, residual=None, residual_out=None,
                  epilogue=None, **_):
    _shape("x", x, None, None)
    M, K = x.shape
    _shape("weight", weight, None, K)
    N = weight.shape[0]
    _shape("out", out, M, N // 2 if epilogue == "silu_mul" else N)
    _shape("norm_weight", norm_weight, K)
    _shape("residual", residual, M, K)
    _shape("residual_out", residual_out, M, K)


def _check_ngram_propose(prompt, prompt_lens, output, output_lens, draft_tokens, num_draft, **_):
    B = prompt.shape[0]
    _check_rows((B,), prompt_lens=prompt_lens, output_lens=output_lens,
                num_draft=num_draft)
    _shape("output", output, B, None)
    _shape("draft_tokens", draft_tokens, B, None)


def _spec_sample_setup(kw):
    if kw.get("workspace") is None:
        lg = kw["logits"]
        nbytes = _gpu_ops.spec_sample_workspace_size(lg.shape[0], lg.shape[1])
        kw["workspace"] = torch.empty((nbytes,), dtype=torch.uint8, device=lg.device)


# ----------------------------------------------------------------- the table
_TABLE = (
    _OpSpec("copy", "(Tensor! dst, Tensor src) -> ()", _check_copy),
    _OpSpec("append_kv", "(Tensor k, Tensor v, Tensor! k_cache, Tensor! v_cache, Tensor page_table, "
            "Tensor seq_lens, Tensor cu_q, Tensor? finished=None, *, bool check_indices=True, "
            "Tensor? k_scale=None, Tensor? v_scale=None, Tensor!? k_params=None, "
            "Tensor!? v_params=None) -> ()",
            _check_append_kv),
    _OpSpec("verify_attention", "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, "
            "Tensor seq_lens, Tensor cu_q, Tensor! out, float? scale=None, Tensor!? lse_out=None, "
            "Tensor!? workspace=None, *, int? num_splits=None, int? max_kv_len=None, "
            "int? max_q=None, bool row_invariant=False, bool? check_indices=None, "
            "Tensor? k_scale=None, Tensor? v_scale=None, Tensor? k_params=None, "
            "Tensor? v_params=None) -> ()",
            _check_verify_attention),
    # the state is written too: the fused mode commits the pending rows into it
    _OpSpec("gdn_verify", "(Tensor q, Tensor k, Tensor v, Tensor! state, Tensor slot_ids, "
            "Tensor cu_q, Tensor! out, Tensor! journal, Tensor? g=None, Tensor? beta=None, "
            "Tensor? a=None, Tensor? b=None, Tensor? A_log=None, Tensor? dt_bias=None, "
            "Tensor!? status=None, Tensor? pending_journal=None, Tensor? pending_row0=None, "
            "Tensor? pending_len=None, *, float? scale=None, bool qk_l2norm=False, "
            "str layout=\"kv\", bool check_indices=True) -> ()", _check_gdn_verify, bf16_bits=True),
    _OpSpec("gdn_commit", "(Tensor! state, Tensor slot_ids, Tensor cu_q, Tensor accept_len, "
            "Tensor journal, Tensor!? status=None, *, str layout=\"kv\", bool check_indices=True) -> ()",
            _check_gdn_commit, bf16_bits=True),
    _OpSpec("gdn_flush", "(Tensor! state, Tensor slot_ids, Tensor pending_journal, "
            "Tensor pending_row0, Tensor pending_len, Tensor!? status=None, *, str layout=\"kv\", "
            "bool check_indices=True) -> ()", _check_gdn_flush, bf16_bits=True),
    _OpSpec("conv1d_verify", "(Tensor x, Tensor weight, Tensor conv_state, Tensor slot_ids, "
            "Tensor cu_q, Tensor! out, Tensor? bias=None, Tensor!? journal=None, Tensor!? status=None, "
            "*, str? activation=\"silu\", bool check_indices=True) -> ()",
            _check_conv1d_verify, bf16_bits=True),
    _OpSpec("conv1d_commit", "(Tensor! conv_state, Tensor slot_ids, Tensor cu_q, Tensor accept_len, "
            "Tensor journal, Tensor!? status=None, *, bool check_indices=True) -> ()",
            _check_conv1d_commit, bf16_bits=True),
    _OpSpec("spec_sample", "(Tensor logits, Tensor cu_q, Tensor draft_ids, Tensor temperature, "
            "Tensor top_k, Tensor top_p, Tensor min_p, Tensor seed, Tensor step, "
            "Tensor! num_accepted, Tensor! emitted, Tensor! status, Tensor? draft_probs=None, "
            "Tensor? d2t=None, Tensor!? accepted_logprobs=None, Tensor!? workspace=None, *, "
            "bool? filters=None, bool check_indices=True) -> ()", _check_spec_sample, setup=_spec_sample_setup),
    _OpSpec("seq_stop", "(Tensor emitted, Tensor num_accepted, Tensor out_tokens, Tensor out_lens, "
            "Tensor? stop_ids, Tensor? stop_seqs, Tensor max_new_tokens, Tensor! accept_len, "
            "Tensor! finished) -> ()", _check_seq_stop),
    _OpSpec("seq_advance", "(Tensor emitted, Tensor accept_len, Tensor! seq_lens, Tensor! out_tokens, "
            "Tensor! out_lens, Tensor! last_token, Tensor! finished) -> ()", _check_seq_advance),
    _OpSpec("seq_build_block", "(Tensor last_token, Tensor draft_tokens, Tensor num_draft, "
            "Tensor seq_lens, Tensor! cu_q, Tensor! block_tokens, Tensor! positions, "
            "Tensor!? draft_ids=None) -> ()", _check_seq_build_block),
    _OpSpec("draft_carry", "(Tensor hidden, Tensor cu_q, Tensor accept_len, Tensor! out, *, "
            "int row_begin=0, int col_begin=0) -> ()", _check_draft_carry),
    _OpSpec("capture_hidden", "(Tensor hidden, Tensor! out, int tap, Tensor? residual=None) -> ()",
            _check_capture_hidden),
    _OpSpec("draft_combine", "(Tensor embed, Tensor hidden, Tensor embed_norm_weight, "
            "Tensor hidden_norm_weight, Tensor! out, Tensor? token_ids=None, *, float eps=1e-06, "
            "bool unit_offset=False) -> ()", _check_draft_combine),
    _OpSpec("draft_map_tokens", "(Tensor draft_ids, Tensor d2t, Tensor! out, *, bool offsets=True) -> ()",
            _check_draft_map_tokens),
    # families being added in parallel (skipped while specdec_lib.ops lacks them)
    _OpSpec("rms_norm", "(Tensor x, Tensor weight, Tensor! out, Tensor? residual=None, "
            "Tensor!? residual_out=None, *, float eps=1e-06, bool unit_offset=False) -> ()",
            _check_rms_norm),
    _OpSpec("rope", "(Tensor! q, Tensor!? k, Tensor positions, Tensor cos_sin_cache) -> ()",
            _check_rope),
    _OpSpec("silu_mul", "(Tensor x, Tensor! out) -> ()", _check_silu_mul),
    _OpSpec("rope_append_kv", "(Tensor! q, Tensor! k, Tensor v, Tensor positions, "
            "Tensor cos_sin_cache, Tensor! k_cache, Tensor! v_cache, Tensor page_table, "
            "Tensor seq_lens, Tensor cu_q, Tensor? finished=None, *, bool check_indices=True, "
            "Tensor? k_scale=None, Tensor? v_scale=None, Tensor!? k_params=None, "
            "Tensor!? v_params=None) -> ()", _check_rope_append_kv),
    _OpSpec("linear", "(Tensor x, Tensor weight, Tensor! out, *, Tensor? norm_weight=None, "
            "float eps=1e-06, Tensor? residual=None, Tensor!? residual_out=None, "
            "str? epilogue=None, bool unit_offset=False) -> ()", _check_linear, bf16_bits=True),
    _OpSpec("ngram_propose", "(Tensor prompt, Tensor prompt_lens, Tensor output, Tensor output_lens, "
            "Tensor! draft_tokens, Tensor! num_draft, *, int min_n=1, int max_n=3, "
            "bool check_indices=True) -> ()", _check_ngram_propose),
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
            if spec.name in _CONTRACTS:
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
        if spec.name in _CONTRACTS:
            _host_check(spec.name, bound)
        elif spec.check is not None:
            spec.check(**bound)
        return None
    return fake


def _register():
    registered, missing = {}, []
    for spec in _TABLE:
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
