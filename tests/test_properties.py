"""Property-based tests (hypothesis), CPU only (issue 7).

Part 1, the validation layer of every public op in ``specdec_lib.ops``: random VALID
argument sets, built from fake device arrays (DeviceArray instances made without the
driver), pass validation and reach the kernel lookup; random INVALID ones (one argument
perturbed: wrong dtype, ndim, size of one dimension, layout, device, None, a host numpy
array, or an op-specific limit) raise TypeError/ValueError naming that argument before
any kernel lookup, driver call or launch. ``runtime.kernel`` is replaced by a recorder
that raises a private sentinel, so nothing can launch.

Part 2, properties of the numpy references (the oracles the GPU tests trust), on small
random sizes: append_kv read-back, verify_attention against a dense masked softmax,
gdn / conv1d verify+commit against one-token decoding, greedy spec_sample against an
argmax chain, seq_advance / seq_build_block round trips, draft_carry row choice.

Everything is derandomized (reproducible in CI) and sized to run in well under a
minute on two cores.
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from specdec_lib import ops, reference as ref, runtime
from specdec_lib.arrays import DeviceArray
from specdec_lib.dtypes import DTYPES, canonical, f32_to_bf16_bits, host_dtype, itemsize

attn_ops = importlib.import_module("specdec_lib.ops.attention")

# hypothesis imports libcst to print a failing example (the strict xfails below);
# libcst's import warns about mypy_extensions: not ours
pytestmark = pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated")

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large])
VALID_EXAMPLES = 40       # per op
INVALID_EXAMPLES = 4      # per (op, argument, perturbation)

ALL_DTYPES = tuple(DTYPES)
FLOATS = ("float32", "float16", "bfloat16")
I32 = ("int32",)


# ============================================================== fake device arrays
def c_strides(shape):
    st_, acc = [], 1
    for s in reversed(shape):
        st_.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(st_))


_ADDR = itertools.count(1)
_FAKES: list = []          # every fake made inside guarded(): its ptr is zeroed on exit


def fake(shape, dtype, device=0, strides=None, ptr=None):
    """A DeviceArray that owns no memory: a 256-byte-aligned made-up address."""
    a = object.__new__(DeviceArray)
    a.shape = tuple(int(s) for s in shape)
    a.dtype = canonical(dtype)
    a.itemsize = itemsize(a.dtype)
    a.device = int(device)
    a.strides = tuple(int(s) for s in strides) if strides is not None else c_strides(a.shape)
    a.ptr = int(ptr) if ptr is not None else 0x7F00_0000_0000 + next(_ADDR) * 0x10_0000
    a.size = int(np.prod(a.shape, dtype=np.int64))
    a.nbytes = a.size * a.itemsize
    _FAKES.append(a)
    return a


def refake(a, **changes):
    """A copy of fake ``a`` with some fields changed (C strides when the shape changes)."""
    shape = changes.pop("shape", a.shape)
    strides = changes.pop("strides", a.strides if tuple(shape) == a.shape else None)
    kw = dict(dtype=a.dtype, device=a.device, ptr=a.ptr)
    kw.update(changes)
    return fake(shape, strides=strides, **kw)


class _Reached(Exception):
    """Raised by the patched runtime.kernel: validation passed, a launch was next."""


class _DriverTouched(Exception):
    pass


@contextlib.contextmanager
def guarded(family=90):
    """Patch the runtime so that nothing can look up a kernel, touch the driver or
    launch; yields the list of recorded calls."""
    calls = []

    def kernel(module, symbol, device=0):
        calls.append(("kernel", module, symbol, device))
        raise _Reached(f"{module}.{symbol} on device {device}")

    def driver():
        calls.append(("driver",))
        raise _DriverTouched("runtime.driver() called during validation")

    props = {"name": "fake", "cc": (9, 0), "sm_count": 132, "l2_bytes": 50 << 20,
             "smem_optin": 227 * 1024}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DeviceArray, "__del__", lambda self: None)
        mp.setattr(runtime, "kernel", kernel)
        mp.setattr(runtime, "driver", driver)
        mp.setattr(runtime, "sm_count", lambda device=0: 132)
        mp.setattr(runtime, "arch_family", lambda device=0: family)
        mp.setattr(runtime, "device_props", lambda device=0: dict(props))
        # verify_attention caches (family, SM count, smem, merge kernel) per device:
        # pre-fill it so the op does no lookup of its own before its checks
        for dev, tag, D in itertools.product((0, 1), ("f16", "bf16"), (64, 128, 256)):
            mp.setitem(attn_ops._launch_cache, (dev, tag, D),
                       (family, 132, attn_ops.verify_attention_smem_bytes(D, family), None))
        try:
            yield calls
        finally:
            for a in _FAKES:
                a.ptr = 0            # the real __del__ frees nothing once unpatched
            _FAKES.clear()


# ============================================================== generator helper
class Gen:
    """Draws one argument set. ``big``: sizes >= 2 (so every perturbation applies);
    ``force``: optional arguments that must be present."""

    def __init__(self, data, big=False, force=()):
        self.data, self.big, self.force = data, big, set(force)
        self.dev = 0 if big else self.int(0, 1)

    def int(self, lo, hi):
        return self.data.draw(st.integers(lo, hi))

    def size(self, lo, hi):
        if self.big:
            lo = max(lo, min(2, hi))
        return self.int(lo, hi)

    def pick(self, seq):
        return self.data.draw(st.sampled_from(list(seq)))

    def coin(self):
        return self.data.draw(st.booleans())

    def want(self, name):
        return name in self.force or self.coin()

    def arr(self, shape, dtype, layout="c"):
        """layout 'c': C order; 'rows': last dim contiguous, outer strides maybe padded
        (by 8 elements: keeps 16-byte row alignment); 'any': also maybe reversed order."""
        shape = tuple(int(s) for s in shape)
        strides = c_strides(shape)
        if layout in ("rows", "any") and len(shape) >= 2 and self.coin():
            pad = 8 * self.int(1, 2)
            strides = c_strides(shape[:-1] + (shape[-1] + pad,))
        if layout == "any" and len(shape) >= 2 and self.coin():
            rev = c_strides(shape[::-1])[::-1]
            strides = rev
        return fake(shape, dtype, self.dev, strides)


# ============================================================== op specifications
def _const(x):
    return x if callable(x) else (lambda kw: x)


@dataclass
class Arg:
    name: str
    dtypes: object = None        # allowed dtypes (tuple or fn(kw)); None: any dtype
    ndims: object = None         # valid ndims (tuple or fn(kw)); None: not checked
    contig: str | None = None    # "c": C-contiguous required; "last": last dim only
    optional: bool = False
    anchor: bool = False         # the device (and shapes) of others come from it
    eq_dims: object = ()         # dims whose size other arguments fix (tuple or fn(kw))


@dataclass
class Extra:
    label: str
    fn: Callable                 # (gen, kw) -> (kw, names) or None when not applicable
    force: tuple = ()
    family: int = 90
    xfail: str | None = None


@dataclass
class OpSpec:
    name: str
    fn: Callable
    build: Callable              # gen -> kwargs
    args: list
    empty: Callable              # kw -> True when the op may return without a launch
    extras: list = field(default_factory=list)

    def arg(self, name):
        return next(a for a in self.args if a.name == name)


def _set(kw, **changes):
    out = dict(kw)
    out.update(changes)
    return out


def _shape(kw, name):
    return kw[name].shape


# ---------------------------------------------------------------- copy family
def build_copy(g):
    nd = g.int(1, 4)
    shape = tuple(g.size(0 if not g.big else 2, 4) for _ in range(nd))
    dtype = g.pick(ALL_DTYPES)
    dst = g.arr(shape, dtype, "any")
    drop = g.int(0, nd)
    s_shape = tuple(1 if g.int(0, 3) == 0 else s for s in shape[drop:])
    return dict(dst=dst, src=g.arr(s_shape, dtype, "any"))


def _copy_src_bad_shape(g, kw):
    d, s = kw["dst"], kw["src"]
    if not s.shape:
        return None
    i = g.int(0, len(s.shape) - 1)
    want = d.shape[len(d.shape) - len(s.shape) + i]
    bad = want + 1 if want + 1 != 1 else want + 2
    return _set(kw, src=refake(s, shape=s.shape[:i] + (bad,) + s.shape[i + 1:])), {"src"}


def _copy_dst_stride0(g, kw):
    d = kw["dst"]
    dims = [i for i, n in enumerate(d.shape) if n > 1]
    if not dims:
        return None
    i = g.pick(dims)
    st_ = list(d.strides)
    st_[i] = 0
    return _set(kw, dst=refake(d, strides=st_)), {"dst"}


COPY = OpSpec(
    "copy", ops.copy, build_copy,
    [Arg("dst", None, (1, 2, 3, 4), anchor=True),
     Arg("src", lambda kw: (kw["dst"].dtype,), lambda kw: tuple(range(len(kw["dst"].shape) + 1)))],
    empty=lambda kw: 0 in kw["dst"].shape,
    extras=[Extra("src_not_broadcastable", _copy_src_bad_shape),
            Extra("dst_stride0", _copy_dst_stride0)])


def _append_kv_args(g, dtype, D=None):
    """append_kv's arguments (rope_append_kv's too): paged caches, k/v rows, the indices."""
    num_pages, ps, hkv = g.size(1, 6), g.size(1, 8), g.size(1, 3)
    D = g.size(1, 16) if D is None else D
    B = g.size(0, 3)
    T = g.size(0, 8) if B else 0
    kw = dict(k_cache=g.arr((num_pages, ps, hkv, D), dtype, "rows"),
              v_cache=g.arr((num_pages, ps, hkv, D), dtype, "rows"),
              k=g.arr((T, hkv, D), dtype, "rows"), v=g.arr((T, hkv, D), dtype, "rows"),
              page_table=g.arr((B, g.size(1, 4)), "int32", "rows"),
              seq_lens=g.arr((B,), "int32"), cu_q=g.arr((B + 1,), "int32"),
              check_indices=False)
    if g.want("finished"):
        kw["finished"] = g.arr((B,), g.pick(("uint8", "bool")))
    return kw


def build_append_kv(g):
    return _append_kv_args(g, g.pick(ALL_DTYPES))


def _akv_too_many_rows(g, kw):
    k, v = kw["k"], kw["v"]
    n = g.pick((2**30, 2**31))
    return _set(kw, k=refake(k, shape=(n,) + k.shape[1:]), v=refake(v, shape=(n,) + v.shape[1:])), {"k"}


def _akv_too_many_pages(g, kw):
    n = 2**31
    return _set(kw, k_cache=refake(kw["k_cache"], shape=(n,) + kw["k_cache"].shape[1:]),
                v_cache=refake(kw["v_cache"], shape=(n,) + kw["v_cache"].shape[1:])), {"k_cache"}


APPEND_KV = OpSpec(
    "append_kv", ops.append_kv, build_append_kv,
    [Arg("k_cache", None, (4,), "last", anchor=True),
     Arg("v_cache", lambda kw: (kw["k_cache"].dtype,), (4,), "last", eq_dims=(0, 1, 2, 3)),
     Arg("k", lambda kw: (kw["k_cache"].dtype,), (3,), "last", eq_dims=(1, 2)),
     Arg("v", lambda kw: (kw["k_cache"].dtype,), (3,), "last", eq_dims=(0, 1, 2)),
     Arg("page_table", I32, (2,), "last"),
     Arg("seq_lens", I32, (1,), "c", eq_dims=(0,)),
     Arg("cu_q", I32, (1,), "c", eq_dims=(0,)),
     Arg("finished", ("uint8", "bool"), (1,), "c", optional=True, eq_dims=(0,))],
    empty=lambda kw: kw["k"].shape[0] == 0 or kw["page_table"].shape[0] == 0,
    extras=[Extra("rows_2^30", _akv_too_many_rows), Extra("pages_2^31", _akv_too_many_pages)])


# ---------------------------------------------------------------- rope_append_kv
def build_rope_append_kv(g):
    dtype = g.pick(FLOATS)
    D = 2 * g.size(1, 8)
    kw = _append_kv_args(g, dtype, D)
    T = kw["k"].shape[0]
    kw.update(q=g.arr((T, g.size(1, 4), D), dtype, "rows"), positions=g.arr((T,), "int32"),
              cos_sin_cache=g.arr((g.size(1, 64), D), "float32"))
    return kw


def _rak_rows_2_30(g, kw):
    """2^30 rows everywhere (q, k, v, positions agree): append_kv's row limit."""
    n = 2**30
    ch = {a: refake(kw[a], shape=(n,) + kw[a].shape[1:]) for a in ("q", "k", "v", "positions")}
    return _set(kw, **ch), {"k"}


def _rak_heads_int32(g, kw):
    """(Hq + Hkv) D fits rope's int32 token index, (Hq + 2 Hkv) D does not."""
    T, D = kw["q"].shape[0], 2
    hkv = 2**28
    hq = 2**30 - 1 - hkv
    pages = kw["k_cache"].shape[:2]
    return _set(kw, q=refake(kw["q"], shape=(T, hq, D)), k=refake(kw["k"], shape=(T, hkv, D)),
                v=refake(kw["v"], shape=(T, hkv, D)),
                cos_sin_cache=refake(kw["cos_sin_cache"], shape=(kw["cos_sin_cache"].shape[0], D)),
                k_cache=refake(kw["k_cache"], shape=pages + (hkv, D)),
                v_cache=refake(kw["v_cache"], shape=pages + (hkv, D))), {"q"}


ROPE_APPEND_KV = OpSpec(
    "rope_append_kv", ops.rope_append_kv, build_rope_append_kv,
    [Arg("q", FLOATS, (3,), "last", anchor=True),
     Arg("k", lambda kw: (kw["q"].dtype,), (3,), "last", eq_dims=(0, 1, 2)),
     Arg("v", lambda kw: (kw["q"].dtype,), (3,), "last", eq_dims=(0, 1, 2)),
     Arg("positions", I32, (1,), "c", eq_dims=(0,)),
     Arg("cos_sin_cache", ("float32",), (2,), "c", eq_dims=(1,)),
     Arg("k_cache", lambda kw: (kw["q"].dtype,), (4,), "last"),   # k's and v_cache's shapes
     Arg("v_cache", lambda kw: (kw["q"].dtype,), (4,), "last", eq_dims=(0, 1, 2, 3)),
     Arg("page_table", I32, (2,), "last"),
     Arg("seq_lens", I32, (1,), "c", eq_dims=(0,)),
     Arg("cu_q", I32, (1,), "c", eq_dims=(0,)),
     Arg("finished", ("uint8", "bool"), (1,), "c", optional=True, eq_dims=(0,))],
    empty=lambda kw: kw["q"].shape[0] == 0,
    extras=[Extra("rows_2^30", _rak_rows_2_30),
            Extra("heads_int32", _rak_heads_int32)])


# ---------------------------------------------------------------- attention
def build_attention(g):
    dtype = g.pick(("float16", "bfloat16"))
    D = g.pick((64, 128, 256))
    hkv, group = g.size(1, 2), g.size(1, 4)
    hq = hkv * group
    B = g.size(0, 3)
    T = g.size(1, 8) if B else g.size(0, 2)
    ps = g.pick((1, 2, 4, 8, 16)) if not g.big else g.pick((2, 4, 8, 16))
    num_pages, max_pages = g.size(1, 6), g.size(1, 4)
    kw = dict(q=g.arr((T, hq, D), dtype, "rows"),
              k_cache=g.arr((num_pages, ps, hkv, D), dtype, "rows"),
              v_cache=g.arr((num_pages, ps, hkv, D), dtype, "rows"),
              page_table=g.arr((B, max_pages), "int32", "rows"),
              seq_lens=g.arr((B,), "int32"), cu_q=g.arr((B + 1,), "int32"),
              out=g.arr((T, hq, D), dtype, "rows"), check_indices=False)
    if g.want("lse_out"):
        kw["lse_out"] = g.arr((T, hq), "float32", "any")
    if g.coin():
        kw["scale"] = g.data.draw(st.floats(0.01, 4.0))
    if g.coin():
        kw["max_q"] = g.int(1, 16)
    if g.coin():
        kw["max_kv_len"] = g.int(1, 600)
    if g.want("workspace"):
        ns = g.pick((None, 1, 2, 3, 8))
        if ns is not None:
            kw["num_splits"] = ns
        need = ops.verify_attention_workspace_size(
            T, hq, hkv, D, B, kw.get("max_kv_len", max_pages * ps), max_q=kw.get("max_q"),
            num_splits=ns)
        kw["workspace"] = g.arr((max(need, 16) + g.int(0, 64) * 16,), "uint8")
    return kw


def _attn_plan(kw):
    T, hq, D = kw["q"].shape
    B, max_pages = kw["page_table"].shape
    _, ps, hkv, _ = kw["k_cache"].shape
    max_q = kw.get("max_q") or min(T, 16)
    mkv = kw.get("max_kv_len") or max_pages * ps
    return attn_ops.plan_verify_attention(B, hkv, hq // hkv, D, max_q, mkv, 132,
                                          kw.get("num_splits", 1)), T, hq, D


def _attn_head_dim(g, kw):
    bad = g.pick((32, 96, 100, 512))
    ch = {n: refake(kw[n], shape=kw[n].shape[:-1] + (bad,)) for n in ("q", "k_cache", "v_cache", "out")}
    return _set(kw, **ch), {"q"}


def _attn_kv_head_dim(g, kw):
    D = kw["q"].shape[2]
    bad = g.pick([x for x in (64, 128, 256) if x != D])
    ch = {n: refake(kw[n], shape=kw[n].shape[:-1] + (bad,)) for n in ("k_cache", "v_cache")}
    return _set(kw, **ch), {"k_cache"}


def _attn_page_size(g, kw):
    bad = g.pick((3, 6, 12, 512))
    ch = {n: refake(kw[n], shape=(kw[n].shape[0], bad) + kw[n].shape[2:]) for n in ("k_cache", "v_cache")}
    return _set(kw, **ch), {"k_cache"}


def _attn_heads(g, kw, bad_group):
    T, hq, D = kw["q"].shape
    hkv = kw["k_cache"].shape[2]
    hq2 = hkv * 17 if bad_group else hkv * (hq // hkv) + 1
    if hkv == 1 and not bad_group:
        return None            # every head count is a multiple of one KV head
    ch = dict(q=refake(kw["q"], shape=(T, hq2, D)), out=refake(kw["out"], shape=(T, hq2, D)))
    if kw.get("lse_out") is not None:
        ch["lse_out"] = refake(kw["lse_out"], shape=(T, hq2))
    return _set(kw, **ch), {"q"}


def _attn_batch(g, kw):
    B = 65536
    return _set(kw, page_table=refake(kw["page_table"], shape=(B, kw["page_table"].shape[1])),
                seq_lens=refake(kw["seq_lens"], shape=(B,)),
                cu_q=refake(kw["cu_q"], shape=(B + 1,))), {"page_table"}


def _attn_misaligned(g, kw):
    n = g.pick(("q", "k_cache", "v_cache", "out"))
    a = kw[n]
    if g.coin():
        return _set(kw, **{n: refake(a, ptr=a.ptr + 2 * g.int(1, 7))}), {n}
    shape = a.shape
    st_ = c_strides(shape[:-1] + (shape[-1] + g.pick((1, 2, 4)),))   # rows not 16-byte multiples
    return _set(kw, **{n: refake(a, strides=st_)}), {n}


def _attn_scalar(name, values):
    def fn(g, kw):
        return _set(kw, **{name: g.pick(values)}), {name}
    return fn


def _attn_splits_without_ws(g, kw):
    return _set(kw, num_splits=g.int(2, 8), workspace=None), {"workspace", "num_splits"}


def _attn_ws_small(g, kw):
    kw = _set(kw, num_splits=8, max_kv_len=600)
    plan, T, hq, D = _attn_plan(kw)
    if plan.num_splits <= 1:
        return None
    need = plan.workspace_bytes(T, hq, D)
    return _set(kw, workspace=refake(kw["workspace"], shape=(need - g.int(1, 16),))), {"workspace"}


def _attn_ws_misaligned(g, kw):
    kw = _set(kw, num_splits=8, max_kv_len=600)
    plan, T, hq, D = _attn_plan(kw)
    if plan.num_splits <= 1:
        return None
    need = plan.workspace_bytes(T, hq, D)
    return _set(kw, workspace=refake(kw["workspace"], shape=(need + 256,),
                                     ptr=kw["workspace"].ptr + 16 * g.int(1, 15))), {"workspace"}


def _attn_bf16_on_75(g, kw):
    if kw["q"].dtype != "bfloat16":
        return None
    return kw, {"q"}


ATTENTION = OpSpec(
    "verify_attention", ops.verify_attention, build_attention,
    [Arg("q", ("float16", "bfloat16"), (3,), "last", anchor=True),
     Arg("k_cache", lambda kw: (kw["q"].dtype,), (4,), "last"),   # v_cache's shape comes from it
     Arg("v_cache", lambda kw: (kw["q"].dtype,), (4,), "last", eq_dims=(0, 1, 2, 3)),
     Arg("page_table", I32, (2,), "last"),
     Arg("seq_lens", I32, (1,), "c", eq_dims=(0,)),
     Arg("cu_q", I32, (1,), "c", eq_dims=(0,)),
     Arg("out", lambda kw: (kw["q"].dtype,), (3,), "last", eq_dims=(0, 1, 2)),
     Arg("lse_out", ("float32",), (2,), None, optional=True, eq_dims=(0, 1)),
     Arg("workspace", None, None, "c", optional=True)],
    empty=lambda kw: kw["q"].shape[0] == 0 or kw["page_table"].shape[0] == 0,
    extras=[Extra("head_dim", _attn_head_dim), Extra("page_size", _attn_page_size),
            Extra("kv_head_dim_mismatch", _attn_kv_head_dim),
            Extra("heads_not_multiple", lambda g, kw: _attn_heads(g, kw, False)),
            Extra("group_gt_16", lambda g, kw: _attn_heads(g, kw, True)),
            Extra("batch_gt_65535", _attn_batch), Extra("misaligned", _attn_misaligned),
            Extra("scale_bad", _attn_scalar("scale", (0.0, math.nan, math.inf, -math.inf))),
            Extra("max_kv_len_int32", _attn_scalar("max_kv_len", (2**31 - 2**20, 2**31))),
            Extra("max_q_bad", _attn_scalar("max_q", (0, 17, -1, 2.5, "4"))),
            Extra("max_kv_len_bad", _attn_scalar("max_kv_len", (0, -5, 1.5))),
            Extra("num_splits_bad", _attn_scalar("num_splits", (0, 1025, 2.0))),
            Extra("splits_without_workspace", _attn_splits_without_ws),
            Extra("workspace_small", _attn_ws_small, force=("workspace",)),
            Extra("workspace_misaligned", _attn_ws_misaligned, force=("workspace",)),
            Extra("bf16_on_sm75", _attn_bf16_on_75, family=75),
            Extra("scale_not_a_number", _attn_scalar("scale", ("abc", object(), [1.0])))])


# ---------------------------------------------------------------- gdn / conv
def _batch_kw(g, kw, B, commit=False):
    kw["slot_ids"] = g.arr((B,), "int32")
    kw["cu_q"] = g.arr((B + 1,), "int32")
    if commit:
        kw["accept_len"] = g.arr((B,), "int32")
    if g.want("status"):
        kw["status"] = g.arr((B,), "int32")
    kw["check_indices"] = False


def _gdn_state(g, layout, dtype, slots, Hv, Dk, Dv):
    shape = (slots, Hv, Dk, Dv) if layout == "kv" else (slots, Hv, Dv, Dk)
    st_ = c_strides(shape)
    if g.coin():
        st_ = (st_[0] + 8 * g.int(1, 3),) + st_[1:]      # padded slot stride, 16-byte multiple
    return fake(shape, dtype, g.dev, st_)


_FUSED = ("a", "b", "A_log", "dt_bias")


def build_gdn_verify(g):
    layout = g.pick(("kv", "vk"))
    sdt, dt = g.pick(FLOATS), g.pick(FLOATS)
    Dk, Dv = g.pick((64, 128)), g.pick((16, 32, 48, 64, 128))
    Hk = g.size(1, 2)
    Hv = Hk * g.size(1, 2)
    B = g.size(0, 3)
    T = g.size(0, 6)
    kw = dict(state=_gdn_state(g, layout, sdt, g.size(1, 5), Hv, Dk, Dv), layout=layout,
              q=g.arr((T, Hk, Dk), dt, "rows"), k=g.arr((T, Hk, Dk), dt, "rows"),
              v=g.arr((T, Hv, Dv), dt, "rows"),
              out=g.arr((T, Hv, Dv), g.pick(FLOATS), "rows"),
              journal=g.arr((T, ref.gdn_journal_width(Hk, Hv, Dk, Dv)), "float32", "rows"))
    fused = bool(g.force & set(_FUSED)) or (not g.force & {"g", "beta"} and g.coin())
    if fused:
        kw.update(a=g.arr((T, Hv), g.pick(FLOATS), "rows"), b=g.arr((T, Hv), g.pick(FLOATS), "rows"),
                  A_log=g.arr((Hv,), g.pick(FLOATS)), dt_bias=g.arr((Hv,), g.pick(FLOATS)))
    else:
        kw.update(g=g.arr((T, Hv), g.pick(FLOATS), "rows"), beta=g.arr((T, Hv), g.pick(FLOATS), "rows"))
    if g.coin():
        kw["scale"] = g.data.draw(st.floats(0.01, 2.0))
    kw["qk_l2norm"] = g.coin()
    _batch_kw(g, kw, B)
    return kw


def build_gdn_commit(g):
    layout = g.pick(("kv", "vk"))
    Dk, Dv = g.pick((64, 128)), g.pick((16, 32, 48, 64, 128))
    Hk = g.size(1, 2)
    Hv = Hk * g.size(1, 2)
    T = g.size(0, 6)
    kw = dict(state=_gdn_state(g, layout, g.pick(FLOATS), g.size(1, 5), Hv, Dk, Dv), layout=layout,
              journal=g.arr((T, ref.gdn_journal_width(Hk, Hv, Dk, Dv)), "float32", "rows"))
    _batch_kw(g, kw, g.size(0, 3), commit=True)
    return kw


def _state_dims(kw):
    s = kw["state"]
    return (s.shape[2], s.shape[3]) if kw["layout"] == "kv" else (s.shape[3], s.shape[2])


def _gdn_with_state(kw, shape):
    return _set(kw, state=refake(kw["state"], shape=shape))


def _gdn_bad_dk(g, kw):
    s = kw["state"]
    i = 2 if kw["layout"] == "kv" else 3
    shape = list(s.shape)
    shape[i] = g.pick((32, 96, 256, 16))
    return _gdn_with_state(kw, tuple(shape)), {"state"}


def _gdn_bad_dv(g, kw):
    s = kw["state"]
    i = 3 if kw["layout"] == "kv" else 2
    shape = list(s.shape)
    shape[i] = g.pick((8, 24, 40, 1040, 0))
    return _gdn_with_state(kw, tuple(shape)), {"state"}


def _gdn_state_layout(g, kw):
    s = kw["state"]
    how = g.int(0, 2)
    if how == 0:       # inner block not contiguous
        st_ = (s.strides[0], s.strides[1] + 16) + s.strides[2:]
        return _set(kw, state=refake(s, strides=st_)), {"state"}
    if how == 1:       # pool pointer not 16-byte aligned
        return _set(kw, state=refake(s, ptr=s.ptr + s.itemsize)), {"state"}
    st_ = (s.strides[0] + 1,) + s.strides[1:]     # slot stride not a 16-byte multiple
    return _set(kw, state=refake(s, strides=st_)), {"state"}


def _gdn_heads(g, kw):
    T, Hk, Dk = kw["q"].shape
    Hv = kw["v"].shape[1]
    Hk2 = Hv + 1 if g.coin() else 0
    if Hk2 == 0:
        return _set(kw, q=refake(kw["q"], shape=(T, 0, Dk)), k=refake(kw["k"], shape=(T, 0, Dk))), {"q"}
    Dv = kw["v"].shape[2]
    return _set(kw, q=refake(kw["q"], shape=(T, Hk2, Dk)), k=refake(kw["k"], shape=(T, Hk2, Dk)),
                journal=refake(kw["journal"], shape=(T, ref.gdn_journal_width(Hk2, Hv, Dk, Dv)))), {"q"}


def _gdn_gating_mix(g, kw):
    T, Hv = kw["v"].shape[:2]
    extra = fake((T, Hv), "float32", kw["state"].device)
    if kw.get("g") is not None:
        return _set(kw, a=extra), {"g", "beta", "a"}
    return _set(kw, g=extra), {"g", "beta"}


GDN_VERIFY = OpSpec(
    "gdn_verify", ops.gdn_verify, build_gdn_verify,
    [Arg("state", FLOATS, (4,), "last", anchor=True),
     Arg("q", FLOATS, (3,), "last", eq_dims=(2,)),
     Arg("k", lambda kw: (kw["q"].dtype,), (3,), "last", eq_dims=(0, 1, 2)),
     Arg("v", lambda kw: (kw["q"].dtype,), (3,), "last", eq_dims=(0, 1, 2)),
     Arg("out", FLOATS, (3,), "last", eq_dims=(0, 1, 2)),
     Arg("journal", ("float32",), (2,), "last", eq_dims=(0, 1)),
     Arg("g", FLOATS, (2,), "last", eq_dims=(0, 1)),
     Arg("beta", FLOATS, (2,), "last", eq_dims=(0, 1)),
     Arg("a", FLOATS, (2,), "last", eq_dims=(0, 1)),
     Arg("b", FLOATS, (2,), "last", eq_dims=(0, 1)),
     Arg("A_log", FLOATS, (1,), "c", eq_dims=(0,)),
     Arg("dt_bias", FLOATS, (1,), "c", eq_dims=(0,)),
     Arg("slot_ids", I32, (1,), "c"),
     Arg("cu_q", I32, (1,), "c", eq_dims=(0,)),
     Arg("status", I32, (1,), "c", optional=True, eq_dims=(0,))],
    empty=lambda kw: kw["q"].shape[0] == 0 or kw["slot_ids"].shape[0] == 0,
    extras=[Extra("layout_bad", lambda g, kw: (_set(kw, layout=g.pick(("KV", "kvv", None, 0))), {"layout"})),
            Extra("head_k_dim", _gdn_bad_dk), Extra("head_v_dim", _gdn_bad_dv),
            Extra("state_layout", _gdn_state_layout),
            Extra("heads_not_multiple", _gdn_heads),
            Extra("gating_mixed", _gdn_gating_mix),
            Extra("scale_not_a_number",
                  lambda g, kw: (_set(kw, scale=g.pick(("abc", object(), [0.5], float("nan")))),
                                 {"scale"}))])

GDN_COMMIT = OpSpec(
    "gdn_commit", ops.gdn_commit, build_gdn_commit,
    [Arg("state", FLOATS, (4,), "last", anchor=True),
     Arg("journal", ("float32",), (2,), "last", eq_dims=(1,)),
     Arg("slot_ids", I32, (1,), "c"),
     Arg("cu_q", I32, (1,), "c", eq_dims=(0,)),
     Arg("accept_len", I32, (1,), "c", eq_dims=(0,)),
     Arg("status", I32, (1,), "c", optional=True, eq_dims=(0,))],
    empty=lambda kw: kw["journal"].shape[0] == 0 or kw["slot_ids"].shape[0] == 0,
    extras=[Extra("layout_bad", lambda g, kw: (_set(kw, layout="xy"), {"layout"})),
            Extra("head_k_dim", _gdn_bad_dk), Extra("head_v_dim", _gdn_bad_dv),
            Extra("state_layout", _gdn_state_layout)])


def build_conv_verify(g):
    wm1 = g.size(1, 7)
    dim, slots, B, T = g.size(0, 40), g.size(1, 4), g.size(0, 3), g.size(0, 6)
    w_shape = (dim, wm1 + 1) if g.coin() else (dim, 1, wm1 + 1)
    kw = dict(x=g.arr((T, dim), g.pick(FLOATS), "rows"), weight=g.arr(w_shape, g.pick(FLOATS), "rows"),
              conv_state=g.arr((slots, dim, wm1), g.pick(FLOATS), "rows"),
              out=g.arr((T, dim), g.pick(FLOATS), "rows"),
              activation=g.pick((None, "silu")))
    if g.want("bias"):
        kw["bias"] = g.arr((dim,), g.pick(FLOATS))
    if g.want("journal"):
        kw["journal"] = g.arr((T, dim), g.pick(FLOATS), "rows")
    _batch_kw(g, kw, B)
    return kw


def build_conv_commit(g):
    wm1 = g.size(1, 7)
    dim, T = g.size(0, 40), g.size(0, 6)
    kw = dict(conv_state=g.arr((g.size(1, 4), dim, wm1), g.pick(FLOATS), "rows"),
              journal=g.arr((T, dim), g.pick(FLOATS), "rows"))
    _batch_kw(g, kw, g.size(0, 3), commit=True)
    return kw


def _conv_width(g, kw):
    cs = kw["conv_state"]
    return _set(kw, conv_state=refake(cs, shape=cs.shape[:2] + (g.pick((0, 8, 9)),))), {"conv_state"}


def _conv_batch(g, kw):
    B = 65536
    ch = dict(slot_ids=refake(kw["slot_ids"], shape=(B,)), cu_q=refake(kw["cu_q"], shape=(B + 1,)))
    for n in ("status", "accept_len"):
        if kw.get(n) is not None:
            ch[n] = refake(kw[n], shape=(B,))
    return _set(kw, **ch), {"slot_ids"}


_CONV_INTS = [Arg("slot_ids", I32, (1,), "c"),
              Arg("cu_q", I32, (1,), "c", eq_dims=(0,)),
              Arg("status", I32, (1,), "c", optional=True, eq_dims=(0,))]

CONV_VERIFY = OpSpec(
    "conv1d_verify", ops.conv1d_verify, build_conv_verify,
    [Arg("conv_state", FLOATS, (3,), "last", anchor=True),
     Arg("x", FLOATS, (2,), "last", eq_dims=(1,)),
     Arg("weight", FLOATS, (2, 3), "last", eq_dims=lambda kw: (0, len(kw["weight"].shape) - 1)),
     Arg("bias", FLOATS, (1,), "c", optional=True, eq_dims=(0,)),
     Arg("out", FLOATS, (2,), "last", eq_dims=(0, 1)),
     Arg("journal", FLOATS, (2,), "last", optional=True, eq_dims=(0, 1))] + _CONV_INTS,
    empty=lambda kw: 0 in (kw["x"].shape[0], kw["slot_ids"].shape[0], kw["conv_state"].shape[1]),
    extras=[Extra("activation_bad", lambda g, kw: (_set(kw, activation=g.pick(("relu", "SiLU", 1))),
                                                   {"activation"})),
            Extra("width", _conv_width), Extra("batch_65536", _conv_batch)])

CONV_COMMIT = OpSpec(
    "conv1d_commit", ops.conv1d_commit, build_conv_commit,
    [Arg("conv_state", FLOATS, (3,), "last", anchor=True),
     Arg("journal", FLOATS, (2,), "last", eq_dims=(1,)),
     Arg("accept_len", I32, (1,), "c", eq_dims=(0,))] + _CONV_INTS,
    empty=lambda kw: 0 in (kw["journal"].shape[0], kw["slot_ids"].shape[0], kw["conv_state"].shape[1]),
    extras=[Extra("width", _conv_width), Extra("batch_65536", _conv_batch)])


# ---------------------------------------------------------------- sampling
_SAMPLE_VECS = (("temperature", ("float32",)), ("top_k", I32), ("top_p", ("float32",)),
                ("min_p", ("float32",)), ("seed", ("uint64", "int64")), ("step", ("int64",)),
                ("num_accepted", I32), ("status", I32))


def build_spec_sample(g):
    dt = g.pick(FLOATS)
    V = g.pick((1, 7, 50, 2048, 4099)) if not g.big else g.pick((7, 50, 4099))
    B = g.size(0, 3)
    T = B + g.size(0, 6)
    W = g.size(1, 6)
    kw = dict(logits=g.arr((T, V), dt, "rows"), cu_q=g.arr((B + 1,), "int32"),
              draft_ids=g.arr((T - B,), "int32"))
    for n, dts in _SAMPLE_VECS:
        kw[n] = g.arr((B,), g.pick(dts))
    kw["emitted"] = g.arr((B, W), "int32", "rows")
    if g.want("accepted_logprobs"):
        kw["accepted_logprobs"] = g.arr((B, W), "float32", "rows")
    if g.want("draft_probs") or "d2t" in g.force:
        use_map = "d2t" in g.force or g.coin()
        Vd = g.size(1, V) if use_map else V
        kw["draft_probs"] = g.arr((T - B, Vd), "float32", "rows")
        if use_map:
            kw["d2t"] = g.arr((Vd,), "int32")
    need = ops.spec_sample_workspace_size(T, V)
    wdt = g.pick(("uint8", "int32", "float64"))
    isz = itemsize(wdt)
    kw["workspace"] = g.arr((-(-need // isz) + g.int(0, 4),), wdt)
    kw["check_indices"] = False      # (fake arrays: no values to copy)
    return kw


def _ss_vocab(g, kw, V):
    T = kw["logits"].shape[0]
    return _set(kw, logits=refake(kw["logits"], shape=(T, V))), {"logits"}


def _ss_rows_lt_batch(g, kw):
    B = kw["cu_q"].shape[0] - 1
    return _set(kw, logits=refake(kw["logits"], shape=(B - 1, kw["logits"].shape[1]))), {"logits"}


def _ss_cu_q_empty(g, kw):
    return _set(kw, cu_q=refake(kw["cu_q"], shape=(0,))), {"cu_q"}


def _ss_ws_small(g, kw):
    ws = kw["workspace"]
    need = ops.spec_sample_workspace_size(*kw["logits"].shape)
    n = (need - 1) // ws.itemsize
    return _set(kw, workspace=refake(ws, shape=(n,))), {"workspace"}


def _ss_ws_misaligned(g, kw):
    ws = kw["workspace"]
    off = ws.itemsize * g.int(1, 16 // ws.itemsize - 1)     # naturally aligned, not to 16 bytes
    return _set(kw, workspace=refake(ws, ptr=ws.ptr + off)), {"workspace"}


def _ss_d2t_alone(g, kw):
    dev = kw["logits"].device
    return _set(kw, draft_probs=None, d2t=fake((3,), "int32", dev)), {"d2t"}


def _ss_vd_mismatch(g, kw):
    dp = kw["draft_probs"]
    return _set(kw, d2t=None, draft_probs=refake(dp, shape=(dp.shape[0], kw["logits"].shape[1] + 1))), {"draft_probs"}


SPEC_SAMPLE = OpSpec(
    "spec_sample", ops.spec_sample, build_spec_sample,
    [Arg("logits", FLOATS, (2,), "last", anchor=True),
     Arg("cu_q", I32, (1,), "c"),
     Arg("draft_ids", I32, (1,), "c", eq_dims=(0,))] +
    [Arg(n, dts, (1,), "c", eq_dims=(0,)) for n, dts in _SAMPLE_VECS] +
    [Arg("emitted", I32, (2,), "last", eq_dims=(0,)),
     Arg("accepted_logprobs", ("float32",), (2,), "last", optional=True, eq_dims=(0, 1)),
     Arg("draft_probs", ("float32",), (2,), "last", optional=True,
         eq_dims=lambda kw: (0,) if kw.get("d2t") is not None else (0, 1)),
     Arg("d2t", I32, (1,), "c", optional=True, eq_dims=(0,)),
     Arg("workspace", None, None, "c")],
    empty=lambda kw: kw["cu_q"].shape[0] == 1,
    extras=[Extra("vocab_0", lambda g, kw: _ss_vocab(g, kw, 0)),
            Extra("vocab_gt_2^21", lambda g, kw: _ss_vocab(g, kw, 2**21 + 1)),
            Extra("rows_lt_batch", _ss_rows_lt_batch), Extra("cu_q_empty", _ss_cu_q_empty),
            Extra("emitted_width_0", lambda g, kw: (_set(kw, emitted=refake(kw["emitted"], shape=(kw["emitted"].shape[0], 0))), {"emitted"})),
            Extra("workspace_small", _ss_ws_small), Extra("workspace_misaligned", _ss_ws_misaligned),
            Extra("d2t_without_draft_probs", _ss_d2t_alone),
            Extra("filters_bad", lambda g, kw: (_set(kw, filters=g.pick(("no", 1, 0.0))), {"filters"})),
            Extra("draft_vocab_mismatch", _ss_vd_mismatch, force=("draft_probs",))])


# ---------------------------------------------------------------- sequence
def build_seq_stop(g):
    B, W, C = g.size(0, 4), g.size(1, 5), g.size(0, 8)
    kw = dict(emitted=g.arr((B, W), "int32"), num_accepted=g.arr((B,), "int32"),
              out_tokens=g.arr((B, C), "int32"), out_lens=g.arr((B,), "int32"),
              stop_ids=g.arr((B, g.size(0, 3)), "int32") if g.want("stop_ids") else None,
              stop_seqs=g.arr((B, g.size(0, 3), g.size(0, 4)), "int32") if g.want("stop_seqs") else None,
              max_new_tokens=g.arr((B,), "int32"), accept_len=g.arr((B,), "int32"),
              finished=g.arr((B,), "uint8"))
    return kw


def build_seq_advance(g):
    B, W, C = g.size(0, 4), g.size(1, 5), g.size(0, 8)
    return dict(emitted=g.arr((B, W), "int32"), accept_len=g.arr((B,), "int32"),
                seq_lens=g.arr((B,), "int32"), out_tokens=g.arr((B, C), "int32"),
                out_lens=g.arr((B,), "int32"), last_token=g.arr((B,), "int32"),
                finished=g.arr((B,), "uint8"))


def build_seq_build_block(g):
    B, K = g.size(0, 4), g.size(0, 4)
    kw = dict(last_token=g.arr((B,), "int32"), draft_tokens=g.arr((B, K), "int32"),
              num_draft=g.arr((B,), "int32"), seq_lens=g.arr((B,), "int32"),
              cu_q=g.arr((B + 1,), "int32"),
              block_tokens=g.arr((B * (K + 1) + g.int(0, 3),), "int32"),
              positions=g.arr((B * (K + 1) + g.int(0, 3),), "int32"))
    if g.want("draft_ids"):
        kw["draft_ids"] = g.arr((B * K + g.int(0, 3),), "int32")
    return kw


def _sbb_short(name):
    def fn(g, kw):
        B, K = kw["draft_tokens"].shape
        need = B * K if name == "draft_ids" else B * (K + 1)
        if need == 0:
            return None
        return _set(kw, **{name: refake(kw[name], shape=(need - g.int(1, need),))}), {name}
    return fn


def _vec_args(names, eq=(0,)):
    return [Arg(n, I32, (1,), "c", eq_dims=eq) for n in names]


SEQ_STOP = OpSpec(
    "seq_stop", ops.seq_stop, build_seq_stop,
    [Arg("emitted", I32, (2,), "c", anchor=True)] +
    _vec_args(("num_accepted", "out_lens", "max_new_tokens", "accept_len")) +
    [Arg("out_tokens", I32, (2,), "c", eq_dims=(0,)),
     Arg("stop_ids", I32, (2,), "c", optional=True, eq_dims=(0,)),
     Arg("stop_seqs", I32, (3,), "c", optional=True, eq_dims=(0,)),
     Arg("finished", ("uint8",), (1,), "c", eq_dims=(0,))],
    empty=lambda kw: kw["emitted"].shape[0] == 0)

SEQ_ADVANCE = OpSpec(
    "seq_advance", ops.seq_advance, build_seq_advance,
    [Arg("emitted", I32, (2,), "c", anchor=True)] +
    _vec_args(("accept_len", "seq_lens", "out_lens", "last_token")) +
    [Arg("out_tokens", I32, (2,), "c", eq_dims=(0,)),
     Arg("finished", ("uint8",), (1,), "c", eq_dims=(0,))],
    empty=lambda kw: kw["emitted"].shape[0] == 0)

SEQ_BUILD_BLOCK = OpSpec(
    "seq_build_block", ops.seq_build_block, build_seq_build_block,
    [Arg("last_token", I32, (1,), "c", anchor=True),
     Arg("draft_tokens", I32, (2,), "c", eq_dims=(0,))] +
    _vec_args(("num_draft", "seq_lens", "cu_q")) +
    [Arg("block_tokens", I32, (1,), "c"), Arg("positions", I32, (1,), "c"),
     Arg("draft_ids", I32, (1,), "c", optional=True)],
    empty=lambda kw: False,                 # launched even for B == 0 (writes cu_q[0])
    extras=[Extra(f"{n}_short", _sbb_short(n), force=(n,))
            for n in ("block_tokens", "positions", "draft_ids")])


# ---------------------------------------------------------------- draft
def build_draft_carry(g):
    dt = g.pick(ALL_DTYPES)
    T, H, B = g.size(0, 8), g.size(1, 12), g.size(0, 4)
    col = g.int(0, 4)
    return dict(hidden=g.arr((T, H), dt, "rows"), cu_q=g.arr((B + 1,), "int32"),
                accept_len=g.arr((B,), "int32"),
                out=g.arr((B, H + col + g.int(0, 3)), dt, "rows"),
                row_begin=g.int(0, 9), col_begin=col)


def _carry_out_narrow(g, kw):
    o = kw["out"]
    H = kw["hidden"].shape[1]
    return _set(kw, out=refake(o, shape=(o.shape[0], kw["col_begin"] + H - 1))), {"out", "col_begin"}


def build_capture_hidden(g):
    dt = g.pick(FLOATS)
    T, H, taps = g.size(0, 6), g.size(1, 16), g.size(1, 3)
    kw = dict(hidden=g.arr((T, H), dt, "rows"), out=g.arr((T, taps * H), dt, "rows"),
              tap=g.int(0, taps - 1))
    if g.want("residual"):
        kw["residual"] = g.arr((T, H), dt, "rows")
    return kw


def _cap_out_width(g, kw):
    o, H = kw["out"], kw["hidden"].shape[1]
    return _set(kw, out=refake(o, shape=(o.shape[0], o.shape[1] + g.int(1, H - 1)))), {"out"}


def build_draft_combine(g):
    dt = g.pick(FLOATS)
    rows, H = g.size(0, 6), g.size(1, 16)
    wdt = g.pick((dt, "float32"))
    kw = dict(hidden=g.arr((rows, H), dt, "rows"), out=g.arr((rows, 2 * H), dt, "rows"),
              embed_norm_weight=g.arr((H,), wdt), hidden_norm_weight=g.arr((H,), wdt),
              eps=g.data.draw(st.floats(0.0, 1e-2)), unit_offset=g.coin())
    if g.want("token_ids"):
        kw["token_ids"] = g.arr((rows,), g.pick(("int32", "int64")))
        kw["embed"] = g.arr((g.size(1, 9), H), dt, "rows")
    else:
        kw["embed"] = g.arr((rows, H), dt, "rows")
    return kw


def build_draft_map_tokens(g):
    N = g.size(0, 9)
    return dict(draft_ids=g.arr((N,), g.pick(("int32", "int64"))),
                d2t=g.arr((g.size(0, 9),), g.pick(("int32", "int64"))),
                out=g.arr((N,), "int32"), offsets=g.coin())


DRAFT_CARRY = OpSpec(
    "draft_carry", ops.draft_carry, build_draft_carry,
    [Arg("hidden", None, (2,), "last", anchor=True),
     Arg("cu_q", I32, (1,), "c", eq_dims=(0,)),
     Arg("accept_len", I32, (1,), "c"),
     Arg("out", lambda kw: (kw["hidden"].dtype,), (2,), "last", eq_dims=(0,))],
    empty=lambda kw: kw["accept_len"].shape[0] == 0 or kw["out"].shape[1] == 0,
    extras=[Extra("row_begin_bad", lambda g, kw: (_set(kw, row_begin=g.pick((-1, 1.5, "0", None))), {"row_begin"})),
            Extra("col_begin_bad", lambda g, kw: (_set(kw, col_begin=g.pick((-1, 2.0, "1"))), {"col_begin"})),
            Extra("out_too_narrow", _carry_out_narrow)])

CAPTURE_HIDDEN = OpSpec(
    "capture_hidden", ops.capture_hidden, build_capture_hidden,
    [Arg("hidden", FLOATS, (2,), "last", anchor=True),
     Arg("out", lambda kw: (kw["hidden"].dtype,), (2,), "last", eq_dims=(0,)),
     Arg("residual", lambda kw: (kw["hidden"].dtype,), (2,), "last", optional=True, eq_dims=(0, 1))],
    empty=lambda kw: kw["hidden"].shape[0] == 0,
    extras=[Extra("tap_bad", lambda g, kw: (_set(kw, tap=g.pick((-1, kw["out"].shape[1] // kw["hidden"].shape[1], 0.0, "0", None))), {"tap"})),
            Extra("out_width_not_multiple", _cap_out_width)])

DRAFT_COMBINE = OpSpec(
    "draft_combine", ops.draft_combine, build_draft_combine,
    [Arg("hidden", FLOATS, (2,), "last", anchor=True),
     Arg("embed", lambda kw: (kw["hidden"].dtype,), (2,), "last",
         eq_dims=lambda kw: (1,) if kw.get("token_ids") is not None else (0, 1)),
     Arg("out", lambda kw: (kw["hidden"].dtype,), (2,), "last", eq_dims=(0, 1)),
     Arg("embed_norm_weight", lambda kw: tuple({kw["hidden"].dtype, "float32"}), (1,), "c", eq_dims=(0,)),
     Arg("hidden_norm_weight", lambda kw: (kw["embed_norm_weight"].dtype,), (1,), "c", eq_dims=(0,)),
     Arg("token_ids", ("int32", "int64"), (1,), "c", optional=True, eq_dims=(0,))],
    empty=lambda kw: 0 in kw["hidden"].shape,
    extras=[Extra("eps_bad", lambda g, kw: (_set(kw, eps=g.pick((-1e-6, math.nan, math.inf, "1e-6", True, None))), {"eps"}))])

DRAFT_MAP_TOKENS = OpSpec(
    "draft_map_tokens", ops.draft_map_tokens, build_draft_map_tokens,
    [Arg("draft_ids", ("int32", "int64"), (1,), "c", anchor=True),
     Arg("d2t", ("int32", "int64"), (1,), "c"),
     Arg("out", I32, (1,), "c", eq_dims=(0,))],
    empty=lambda kw: kw["draft_ids"].shape[0] == 0)

def build_ngram_propose(g):
    B, P, O, K = g.size(0, 4), g.size(0, 6), g.size(0, 6), g.size(1, 8)
    kw = dict(prompt=g.arr((B, P), "int32", "rows"), prompt_lens=g.arr((B,), "int32"),
              output=g.arr((B, O), "int32", "rows"), output_lens=g.arr((B,), "int32"),
              draft_tokens=g.arr((B, K), "int32", "rows"), num_draft=g.arr((B,), "int32"),
              check_indices=False)
    if g.coin():
        min_n = g.int(1, 4)
        kw.update(min_n=min_n, max_n=g.int(min_n, 32))
    return kw


def _ngram_k_bad(g, kw):
    dt = kw["draft_tokens"]
    return _set(kw, draft_tokens=refake(dt, shape=(dt.shape[0], g.pick((0, 65, 1000))))), {"draft_tokens"}


def _ngram_too_long(g, kw):
    return _set(kw, prompt=refake(kw["prompt"], shape=(kw["prompt"].shape[0], 2**30)),
                output=refake(kw["output"], shape=(kw["output"].shape[0], 2**30))), {"prompt", "output"}


NGRAM_PROPOSE = OpSpec(
    "ngram_propose", ops.ngram_propose, build_ngram_propose,
    [Arg("prompt", I32, (2,), "last", anchor=True),
     Arg("prompt_lens", I32, (1,), "c", eq_dims=(0,)),
     Arg("output", I32, (2,), "last", eq_dims=(0,)),
     Arg("output_lens", I32, (1,), "c", eq_dims=(0,)),
     Arg("draft_tokens", I32, (2,), "last", eq_dims=(0,)),
     Arg("num_draft", I32, (1,), "c", eq_dims=(0,))],
    empty=lambda kw: kw["prompt"].shape[0] == 0,
    extras=[Extra("min_n_bad", lambda g, kw: (_set(kw, min_n=g.pick((0, -1, 1.5, "1", None, True))), {"min_n"})),
            Extra("max_n_bad", lambda g, kw: (_set(kw, max_n=g.pick((33, 2**40, 2.0, "3", None, False))), {"max_n"})),
            Extra("max_n_below_min_n", lambda g, kw: (_set(kw, min_n=3, max_n=2), {"max_n"})),
            Extra("k_out_of_range", _ngram_k_bad),
            Extra("context_2^31", _ngram_too_long)])


def _conv_rows_2_31(names, blame):
    def fn(g, kw):
        n = 2**31
        ch = {k: refake(kw[k], shape=(n,) + kw[k].shape[1:]) for k in names if kw.get(k) is not None}
        return _set(kw, **ch), {blame}
    return fn


def _conv_slots_2_31(g, kw):
    cs = kw["conv_state"]
    return _set(kw, conv_state=refake(cs, shape=(2**31,) + cs.shape[1:])), {"conv_state"}


def _conv_dim_int32(g, kw):   # the kernel's channel index is int32: dim stays < 2^31 - 256
    cs = kw["conv_state"]
    return _set(kw, conv_state=refake(cs, shape=(cs.shape[0], 2**31 - 256, cs.shape[2]))), {"conv_state"}


CONV_VERIFY.extras += [Extra("rows_2^31", _conv_rows_2_31(("x", "out", "journal"), "x")),
                       Extra("slots_2^31", _conv_slots_2_31), Extra("dim_int32", _conv_dim_int32)]
CONV_COMMIT.extras += [Extra("rows_2^31", _conv_rows_2_31(("journal",), "journal")),
                       Extra("slots_2^31", _conv_slots_2_31), Extra("dim_int32", _conv_dim_int32)]

SPECS = [COPY, APPEND_KV, ROPE_APPEND_KV, ATTENTION, GDN_VERIFY, GDN_COMMIT, CONV_VERIFY, CONV_COMMIT,
         SPEC_SAMPLE, SEQ_STOP, SEQ_ADVANCE, SEQ_BUILD_BLOCK, DRAFT_CARRY, CAPTURE_HIDDEN,
         DRAFT_COMBINE, DRAFT_MAP_TOKENS, NGRAM_PROPOSE]

for _spec in SPECS:
    _spec.extras.append(Extra(
        "stream_bad", lambda g, kw: (_set(kw, stream=g.pick(("default", -1, 1.5, True))), {"stream"})))


def test_every_public_op_has_a_spec():
    public = {"copy", "append_kv", "rope_append_kv", "verify_attention", "gdn_verify", "gdn_commit",
              "conv1d_verify", "conv1d_commit", "spec_sample", "seq_stop", "seq_advance",
              "seq_build_block", "draft_carry", "capture_hidden", "draft_combine",
              "draft_map_tokens", "ngram_propose"}
    assert {s.name for s in SPECS} == public
    for s in SPECS:
        assert s.fn is getattr(ops, s.name)


# ============================================================== generic perturbations
KINDS = ("none", "host", "device", "dtype", "ndim", "size", "noncontig")


def _applicable(spec, a, kind):
    if kind == "none":
        return not a.optional
    if kind == "device":
        return not a.anchor
    if kind == "dtype":
        return a.dtypes is not None
    if kind == "ndim":
        return a.ndims is not None
    if kind == "size":
        return a.eq_dims != ()
    if kind == "noncontig":
        return a.contig is not None
    return True


def _host_array(a):
    return np.zeros(a.shape, dtype=host_dtype(a.dtype))


def perturb(g, spec, a, kind, kw):
    """kw with argument ``a`` perturbed by ``kind``; None when it does not apply here."""
    x = kw.get(a.name)
    if x is None:
        return None
    if kind == "none":
        return _set(kw, **{a.name: None})
    if kind == "host":
        return _set(kw, **{a.name: _host_array(x)})
    if kind == "device":
        return _set(kw, **{a.name: refake(x, device=1 - x.device)})
    if kind == "dtype":
        allowed = set(_const(a.dtypes)(kw))
        bad = [d for d in ALL_DTYPES if d not in allowed]
        return _set(kw, **{a.name: refake(x, dtype=g.pick(bad))})
    if kind == "ndim":
        ok = set(_const(a.ndims)(kw))
        cur = len(x.shape)
        cands = sorted((n for n in range(0, 6) if n not in ok), key=lambda n: abs(n - cur))[:2]
        n = g.pick(cands)
        shape = (2,) * (n - cur) + x.shape if n > cur else x.shape[cur - n:]
        return _set(kw, **{a.name: refake(x, shape=shape)})
    if kind == "size":
        dims = [d % len(x.shape) for d in _const(a.eq_dims)(kw)]
        d = g.pick(dims)
        n = x.shape[d]
        new = n + 1 if n == 0 or g.coin() else n - 1
        return _set(kw, **{a.name: refake(x, shape=x.shape[:d] + (new,) + x.shape[d + 1:])})
    if kind == "noncontig":
        if a.contig == "last" and (not x.shape or x.shape[-1] < 2):
            return None
        if a.contig == "c" and (x.size < 2):
            return None
        return _set(kw, **{a.name: refake(x, strides=tuple(2 * s for s in c_strides(x.shape)))})
    raise AssertionError(kind)


_PREFIX = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*(?:\s*/\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*:")


def named(msg):
    """The argument names a validation message starts with ('q: ...', 'g/beta: ...')."""
    m = _PREFIX.match(msg)
    return set(re.split(r"\s*/\s*", m.group(1))) if m else set()


def check_rejected(spec, kw, names, calls):
    """``spec.fn(**kw)`` raises TypeError/ValueError whose message starts with one of
    ``names``, before any kernel lookup or driver call (run inside guarded())."""
    with pytest.raises((TypeError, ValueError)) as ei:
        spec.fn(**kw)
    assert not isinstance(ei.value, (_Reached, _DriverTouched))
    msg = str(ei.value)
    assert named(msg) & set(names), \
        f"{spec.name}: error does not name {sorted(names)}: {type(ei.value).__name__}: {msg}"
    assert not [c for c in calls if c[0] in ("kernel", "driver")], calls


# ============================================================== part 1: validation
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@settings(max_examples=VALID_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_valid_arguments_reach_the_kernel_lookup(spec, data):
    with guarded() as calls:
        kw = spec.build(Gen(data))
        try:
            spec.fn(**kw)
        except _Reached:
            kcalls = [c for c in calls if c[0] == "kernel"]
            assert len(kcalls) == 1 and not [c for c in calls if c[0] == "driver"]
            dev = next(v for v in kw.values() if isinstance(v, DeviceArray)).device
            assert kcalls[0][3] == dev
        else:
            assert spec.empty(kw), f"{spec.name} returned without a launch for a non-empty problem"
            assert not calls or all(c[0] not in ("kernel", "driver") for c in calls)


_CASES = [pytest.param(spec, a.name, kind, id=f"{spec.name}-{a.name}-{kind}")
          for spec in SPECS for a in spec.args for kind in KINDS if _applicable(spec, a, kind)]


@pytest.mark.parametrize("spec,arg,kind", _CASES)
@settings(max_examples=INVALID_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_invalid_argument_is_rejected_before_launch(spec, arg, kind, data):
    with guarded() as calls:
        g = Gen(data, big=True, force=(arg,))
        kw = spec.build(g)
        bad = perturb(g, spec, spec.arg(arg), kind, kw)
        assert bad is not None, f"perturbation {kind} of {arg} did not apply"
        check_rejected(spec, bad, {arg}, calls)


_EXTRA_CASES = [pytest.param(spec, ex, id=f"{spec.name}-{ex.label}")
                for spec in SPECS for ex in spec.extras if not ex.xfail]
_KNOWN_BUGS = [pytest.param(spec, ex, id=f"{spec.name}-{ex.label}",
                            marks=pytest.mark.xfail(strict=True, reason=ex.xfail))
               for spec in SPECS for ex in spec.extras if ex.xfail]


def _limit_case(spec, extra, data):
    with guarded(extra.family) as calls:
        g = Gen(data, big=True, force=extra.force)
        kw = spec.build(g)
        res = extra.fn(g, kw)
        if res is None:
            return              # not applicable to this draw (e.g. one KV head)
        bad, names = res
        check_rejected(spec, bad, names, calls)


@pytest.mark.parametrize("spec,extra", _EXTRA_CASES)
@settings(max_examples=INVALID_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_op_limit_is_enforced_before_launch(spec, extra, data):
    _limit_case(spec, extra, data)


@pytest.mark.parametrize("spec,extra", _KNOWN_BUGS)
@settings(max_examples=2, **dict(SETTINGS, phases=(Phase.generate,)))
@given(data=st.data())
def test_known_validation_gap(spec, extra, data):
    """Validation gaps found by this file (strict xfail: fixing one turns it XPASS ->
    move the case to the passing list). No shrinking: the inputs are already small."""
    _limit_case(spec, extra, data)


# ============================================================== part 2: reference properties
REF = dict(max_examples=30, **SETTINGS)


def _cu(qs):
    return np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)


@settings(**REF)
@given(data=st.data())
def test_append_kv_rows_read_back_at_their_positions(data):
    d = data.draw
    B, ps, hkv, D = d(st.integers(1, 4)), d(st.sampled_from([1, 2, 4, 8])), d(st.integers(1, 2)), d(st.integers(1, 5))
    rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
    L = rng.integers(0, 12, B)
    qs = rng.integers(0, 5, B)
    need = -(-(L + qs) // ps)
    max_pages = int(need.max()) + d(st.integers(0, 2))
    num_pages = int(need.sum()) + d(st.integers(0, 3))
    perm = rng.permutation(num_pages)
    pt = np.full((B, max_pages), -1, np.int32)
    o = 0
    for b in range(B):
        pt[b, :need[b]] = perm[o:o + need[b]]
        o += need[b]
    cu = _cu(qs)
    T = int(cu[-1])
    k = rng.standard_normal((T, hkv, D)).astype(np.float32)
    v = rng.standard_normal((T, hkv, D)).astype(np.float32)
    kc0 = rng.standard_normal((num_pages, ps, hkv, D)).astype(np.float32)
    vc0 = rng.standard_normal((num_pages, ps, hkv, D)).astype(np.float32)
    fin = rng.integers(0, 2, B).astype(np.uint8) if d(st.booleans()) else None
    kc, vc = ref.append_kv(k, v, kc0.copy(), vc0.copy(), pt, L.astype(np.int32), cu, fin)
    written = np.zeros((num_pages, ps), bool)
    for b in range(B):
        if fin is not None and fin[b]:
            continue
        for i in range(qs[b]):
            pos = L[b] + i
            page, slot = pt[b, pos // ps], pos % ps
            np.testing.assert_array_equal(kc[page, slot], k[cu[b] + i])
            np.testing.assert_array_equal(vc[page, slot], v[cu[b] + i])
            written[page, slot] = True
    np.testing.assert_array_equal(kc[~written], kc0[~written])
    np.testing.assert_array_equal(vc[~written], vc0[~written])


@settings(**REF)
@given(data=st.data())
def test_verify_attention_equals_dense_masked_softmax(data):
    d = data.draw
    B, D = d(st.integers(1, 3)), d(st.sampled_from([64]))
    hkv, group = d(st.integers(1, 2)), d(st.integers(1, 3))
    hq = hkv * group
    ps = d(st.sampled_from([1, 2, 4, 8]))
    rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
    L = rng.integers(0, 10, B)
    qs = rng.integers(0, 5, B)
    n = L + qs
    need = -(-n // ps)
    max_pages = int(max(need.max(), 1))
    num_pages = int(need.sum()) + 1
    perm = rng.permutation(num_pages)
    pt = rng.integers(0, num_pages, (B, max_pages)).astype(np.int32)
    kc = rng.standard_normal((num_pages, ps, hkv, D))
    vc = rng.standard_normal((num_pages, ps, hkv, D))
    dense_k, dense_v, o = [], [], 0
    for b in range(B):
        pt[b, :need[b]] = perm[o:o + need[b]]
        o += need[b]
        Kb = rng.standard_normal((n[b], hkv, D))
        Vb = rng.standard_normal((n[b], hkv, D))
        for j in range(n[b]):
            kc[pt[b, j // ps], j % ps] = Kb[j]
            vc[pt[b, j // ps], j % ps] = Vb[j]
        dense_k.append(Kb)
        dense_v.append(Vb)
    cu = _cu(qs)
    T = int(cu[-1])
    q = rng.standard_normal((T, hq, D))
    scale = d(st.sampled_from([None, 0.3]))
    out = np.full((T, hq, D), np.nan)
    lse = np.full((T, hq), np.nan)
    ref.verify_attention(q, kc, vc, pt, L.astype(np.int32), cu, out, scale, lse)
    sc = 1 / math.sqrt(D) if scale is None else scale
    for b in range(B):
        if qs[b] == 0:
            continue
        Kh = np.repeat(dense_k[b], group, axis=1)        # [n, hq, D]
        Vh = np.repeat(dense_v[b], group, axis=1)
        Qb = q[cu[b]:cu[b + 1]]                           # [q, hq, D]
        s = np.einsum("ihd,jhd->hij", Qb, Kh) * sc        # [hq, q, n]
        vis = np.arange(n[b])[None, :] <= (L[b] + np.arange(qs[b]))[:, None]
        s = np.where(vis[None], s, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        want = np.einsum("hij,jhd->ihd", p / p.sum(-1, keepdims=True), Vh)
        np.testing.assert_allclose(out[cu[b]:cu[b + 1]], want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse[cu[b]:cu[b + 1]], (m[..., 0] + np.log(p.sum(-1))).T, rtol=1e-12)


def _float_in(rng, shape, dtype, scale=1.0):
    x = rng.standard_normal(shape) * scale
    return f32_to_bf16_bits(x) if dtype == "bfloat16" else x.astype(dtype)


def _batch_layout(rng, B, slots, max_q):
    qs = rng.integers(1, max_q + 1, B)
    slot_ids = rng.permutation(slots)[:B].astype(np.int32)
    slot_ids[rng.random(B) < 0.2] = -1
    return qs, slot_ids, _cu(qs)


def _rows_of(cu, acc):
    return np.concatenate([np.arange(cu[b], cu[b] + acc[b]) for b in range(len(acc))]).astype(np.int64)


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("state_dtype", FLOATS)
@settings(max_examples=15, **SETTINGS)
@given(data=st.data())
def test_gdn_verify_commit_equals_token_by_token_decoding(layout, state_dtype, data):
    d = data.draw
    rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
    Hk = d(st.integers(1, 2))
    Hv = Hk * d(st.integers(1, 2))
    Dk, Dv = d(st.sampled_from([4, 8])), d(st.sampled_from([4, 8]))
    B, slots = d(st.integers(1, 3)), 4
    qs, slot_ids, cu = _batch_layout(rng, B, slots, 4)
    T = int(cu[-1])
    in_dt = d(st.sampled_from(FLOATS))
    q, k = _float_in(rng, (T, Hk, Dk), in_dt), _float_in(rng, (T, Hk, Dk), in_dt)
    v = _float_in(rng, (T, Hv, Dv), in_dt)
    if d(st.booleans()):
        gate = dict(a=rng.standard_normal((T, Hv)).astype(np.float32),
                    b=rng.standard_normal((T, Hv)).astype(np.float32),
                    A_log=rng.standard_normal(Hv).astype(np.float32),
                    dt_bias=rng.standard_normal(Hv).astype(np.float32))
    else:
        gate = dict(g=-rng.random((T, Hv)).astype(np.float32), beta=rng.random((T, Hv)).astype(np.float32))
    shape = (slots, Hv, Dk, Dv) if layout == "kv" else (slots, Hv, Dv, Dk)
    state0 = _float_in(rng, shape, state_dtype, 0.5)
    common = dict(layout=layout, qk_l2norm=d(st.booleans()), **gate)
    out_dt = "float32"
    out_v = np.zeros((T, Hv, Dv), out_dt)
    journal = np.zeros((T, ref.gdn_journal_width(Hk, Hv, Dk, Dv)), np.float32)
    st_v = state0.copy()
    ref.gdn_verify(q, k, v, st_v, slot_ids, cu, out_v, journal, **common)
    np.testing.assert_array_equal(st_v, state0)                      # verify never writes
    out_d = np.zeros_like(out_v)
    ref.gdn_decode_reference(q, k, v, state0.copy(), slot_ids, cu, out_d, **common)
    np.testing.assert_array_equal(out_v, out_d)
    acc = np.array([rng.integers(0, q_ + 1) for q_ in qs], np.int32)
    st_c = state0.copy()
    ref.gdn_commit(st_c, slot_ids, cu, acc, journal, layout=layout)
    rows = _rows_of(cu, acc)
    sub = {n: x[rows] for n, x in gate.items() if x.ndim == 2}
    sub.update({n: x for n, x in gate.items() if x.ndim == 1})
    st_d = state0.copy()
    ref.gdn_decode_reference(q[rows], k[rows], v[rows], st_d, slot_ids, _cu(acc),
                             np.zeros((len(rows), Hv, Dv), out_dt), layout=layout,
                             qk_l2norm=common["qk_l2norm"], **sub)
    np.testing.assert_array_equal(st_c, st_d)


@pytest.mark.parametrize("state_dtype", FLOATS)
@settings(max_examples=20, **SETTINGS)
@given(data=st.data())
def test_conv1d_verify_commit_equals_token_by_token_decoding(state_dtype, data):
    d = data.draw
    rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
    W, dim, B, slots = d(st.integers(2, 5)), d(st.integers(1, 6)), d(st.integers(1, 3)), 4
    qs, slot_ids, cu = _batch_layout(rng, B, slots, 4)
    T = int(cu[-1])
    x_dt = d(st.sampled_from(FLOATS))
    x = _float_in(rng, (T, dim), x_dt)
    weight = _float_in(rng, (dim, W), d(st.sampled_from(FLOATS)))
    bias = _float_in(rng, (dim,), "float32") if d(st.booleans()) else None
    act = d(st.sampled_from([None, "silu"]))
    state0 = _float_in(rng, (slots, dim, W - 1), state_dtype)
    out_v = np.zeros((T, dim), np.float32)
    use_journal = d(st.booleans())
    journal = np.zeros((T, dim), np.float32) if use_journal else None
    st_v = state0.copy()
    ref.conv1d_verify(x, weight, st_v, slot_ids, cu, out_v, bias=bias, activation=act, journal=journal)
    np.testing.assert_array_equal(st_v, state0)
    out_d = np.zeros_like(out_v)
    ref.conv1d_decode_reference(x, weight, state0.copy(), slot_ids, cu, out_d, bias=bias, activation=act)
    np.testing.assert_array_equal(out_v, out_d)
    acc = np.array([rng.integers(0, q_ + 1) for q_ in qs], np.int32)
    st_c = state0.copy()
    ref.conv1d_commit(st_c, slot_ids, cu, acc, journal if use_journal else x)
    rows = _rows_of(cu, acc)
    st_d = state0.copy()
    ref.conv1d_decode_reference(x[rows], weight, st_d, slot_ids, _cu(acc),
                                np.zeros((len(rows), dim), np.float32), bias=bias, activation=act)
    np.testing.assert_array_equal(st_c, st_d)


@settings(**REF)
@given(data=st.data())
def test_spec_sample_greedy_rows_follow_the_argmax_chain(data):
    d = data.draw
    rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
    B, V = d(st.integers(1, 4)), d(st.sampled_from([1, 5, 33, 2100]))
    qs = rng.integers(1, 5, B)
    cu = _cu(qs)
    T = int(cu[-1])
    logits = np.round(rng.standard_normal((T, V)), 1).astype(np.float32)   # ties happen
    am = logits.argmax(axis=1)                       # lowest index of the maximum
    drafts = []
    for b in range(B):
        for i in range(qs[b] - 1):
            r = rng.random()
            drafts.append(am[cu[b] + i] if r < 0.7 else rng.integers(0, V) if r < 0.95 else V + 3)
    drafts = np.array(drafts, np.int32)
    W = int(qs.max()) + d(st.integers(0, 2))
    na, em, stt = np.zeros(B, np.int32), np.zeros((B, W), np.int32), np.zeros(B, np.int32)
    lp = np.zeros((B, W), np.float32)
    ref.spec_sample(logits, cu, drafts,
                    np.array([d(st.sampled_from([0.0, -1.0, math.nan])) for _ in range(B)], np.float32),
                    rng.integers(-1, V + 2, B).astype(np.int32), rng.random(B).astype(np.float32),
                    rng.random(B).astype(np.float32), rng.integers(0, 2**63, B).astype(np.uint64),
                    rng.integers(0, 100, B).astype(np.int64), na, em, stt, accepted_logprobs=lp)
    for b in range(B):
        k = qs[b] - 1
        dr = drafts[cu[b] - b:cu[b] - b + k]
        n = next((i for i in range(k) if dr[i] != am[cu[b] + i]), k)
        assert na[b] == n
        np.testing.assert_array_equal(em[b, :n + 1], am[cu[b]:cu[b] + n + 1])
        assert (em[b, n + 1:] == -1).all()
        bad = ((dr < 0) | (dr >= V)).any()
        assert stt[b] == (ref.sampling.STATUS_BAD_DRAFT if bad else 0)
        rows = logits[cu[b]:cu[b] + n + 1].astype(np.float64)
        lse = np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1)) + rows.max(1)
        np.testing.assert_allclose(lp[b, :n + 1], rows[np.arange(n + 1), em[b, :n + 1]] - lse, rtol=1e-6, atol=1e-6)


@settings(**REF)
@given(data=st.data())
def test_seq_advance_then_build_block_round_trip(data):
    d = data.draw
    rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
    B, W, C, K = d(st.integers(0, 4)), d(st.integers(1, 5)), d(st.integers(0, 10)), d(st.integers(0, 4))
    L0 = rng.integers(0, 50, B).astype(np.int32)
    out_lens0 = rng.integers(0, C + 1, B).astype(np.int32)
    out_tokens0 = rng.integers(0, 1000, (B, C)).astype(np.int32)
    emitted = rng.integers(0, 1000, (B, W)).astype(np.int32)
    accept = rng.integers(0, W + 2, B).astype(np.int32)
    last0 = rng.integers(0, 1000, B).astype(np.int32)
    fin0 = np.zeros(B, np.uint8)
    L, ot, ol, last, fin = (L0.copy(), out_tokens0.copy(), out_lens0.copy(), last0.copy(), fin0.copy())
    ref.seq_advance(emitted, accept, L, ot, ol, last, fin)
    for b in range(B):
        a = min(int(accept[b]), W)
        assert L[b] == L0[b] + a
        fit = max(0, min(a, C - out_lens0[b]))
        assert ol[b] == out_lens0[b] + fit
        np.testing.assert_array_equal(ot[b, :out_lens0[b]], out_tokens0[b, :out_lens0[b]])
        np.testing.assert_array_equal(ot[b, out_lens0[b]:ol[b]], emitted[b, :fit])
        np.testing.assert_array_equal(ot[b, ol[b]:], out_tokens0[b, ol[b]:])
        assert last[b] == (emitted[b, a - 1] if a > 0 else last0[b])
        assert fin[b] == (ref.sequence.FINISH_CAPACITY if fit < a else 0)
    drafts = rng.integers(0, 1000, (B, K)).astype(np.int32)
    nd = rng.integers(-1, K + 2, B).astype(np.int32)
    cu = np.full(B + 1, -7, np.int32)
    bt = np.full(B * (K + 1), -7, np.int32)
    pos = np.full(B * (K + 1), -7, np.int32)
    dids = np.full(B * K, -7, np.int32)
    ref.seq_build_block(last, drafts, nd, L, cu, bt, pos, dids)
    kb = np.clip(nd, 0, K)
    np.testing.assert_array_equal(np.diff(cu), kb + 1)
    assert cu[0] == 0
    for b in range(B):
        r = cu[b]
        assert bt[r] == last[b]
        np.testing.assert_array_equal(bt[r + 1:cu[b + 1]], drafts[b, :kb[b]])
        np.testing.assert_array_equal(pos[r:cu[b + 1]], L[b] + np.arange(kb[b] + 1))
        np.testing.assert_array_equal(dids[r - b:cu[b + 1] - b - 1], drafts[b, :kb[b]])
    # the block is in spec_sample's layout: greedy sampling reports no bad layout
    T = int(cu[-1])
    na, em, stt = np.zeros(B, np.int32), np.zeros((B, K + 1), np.int32), np.zeros(B, np.int32)
    z = np.zeros(B, np.float32)
    ref.spec_sample(rng.standard_normal((T, 7)).astype(np.float32), cu, dids[:T - B] % 7, z,
                    np.zeros(B, np.int32), z, z, np.zeros(B, np.uint64), np.zeros(B, np.int64), na, em, stt)
    assert (stt != ref.sampling.STATUS_BAD_LAYOUT).all()
    assert (na <= kb).all()


@settings(**REF)
@given(data=st.data())
def test_draft_carry_picks_the_last_accepted_row_and_shards_sum(data):
    d = data.draw
    rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
    B, H = d(st.integers(0, 4)), d(st.integers(1, 6))
    qs = rng.integers(1, 5, B)
    cu = _cu(qs)
    T = int(cu[-1])
    n = np.array([rng.integers(0, q_) for q_ in qs], np.int64)   # accepted drafts
    accept = (n + 1).astype(np.int32)
    accept[rng.random(B) < 0.2] = 0                               # finished rows
    hidden = rng.standard_normal((T, H)).astype(np.float32)
    out = np.full((B, H), np.nan, np.float32)
    ref.draft_carry(hidden, cu, accept, out)
    for b in range(B):
        want = hidden[cu[b] + n[b]] if accept[b] > 0 else np.zeros(H, np.float32)
        np.testing.assert_array_equal(out[b], want)
    rs, cs = d(st.integers(0, T)), d(st.integers(0, H))
    total = np.zeros((B, H), np.float32)
    for r0, r1 in ((0, rs), (rs, T)):
        for c0, c1 in ((0, cs), (cs, H)):
            part = np.full((B, H), np.nan, np.float32)
            ref.draft_carry(hidden[r0:r1, c0:c1], cu, accept, part, row_begin=r0, col_begin=c0)
            total += part
    np.testing.assert_array_equal(total, out)
