"""Property-based tests (hypothesis), GPU half (issue 7).

Part 1: random VALID shapes / dtypes / layouts / lengths for every op, run on the GPU
with every output poisoned (0xFF bytes) first, compared with the numpy reference run on
the same rounded inputs (float64; relative norm with the per-family GPU tests'
tolerances; integer and data-movement outputs exactly).

Part 2: random INVALID arguments on real device buffers (a wrong dtype, a wrong size, a
host array, a missing array, a bad scalar, or an index value that check_indices catches)
must raise TypeError/ValueError naming the argument before any launch, and every output
buffer keeps its bytes.

Small sizes, derandomized; 12 examples per op (3 under SPECDEC_SANITIZE): well under a
minute on an H200. The CPU half (fake arrays, references) is tests/test_properties.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import SANITIZE, needs_gpu, rel_err
from test_properties import named          # 'q: ...' / 'g/beta: ...' -> the argument names
from specdec_lib import reference as ref
from specdec_lib.dtypes import from_host_storage, host_dtype, round_to, to_host_storage

pytestmark = [needs_gpu, pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated")]

EXAMPLES = 3 if SANITIZE else 12
SETTINGS = dict(deadline=None, derandomize=True, database=None, max_examples=EXAMPLES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
FLOATS = ("float32", "float16", "bfloat16")


# ------------------------------------------------------------------ helpers

def family():
    from specdec_lib import runtime
    return runtime.arch_family(0)


def d_arr(host, dtype=None):
    """Host numpy data -> DeviceArray (float data rounded to ``dtype``)."""
    from specdec_lib import DeviceArray
    host = np.asarray(host)
    if dtype is None:
        return DeviceArray.from_numpy(host)
    return DeviceArray.from_numpy(to_host_storage(host, dtype), dtype=dtype)


def d_raw(host, dtype):
    """Host storage (bf16 as uint16 bits) -> DeviceArray of ``dtype``, bytes as they are."""
    from specdec_lib import DeviceArray
    return DeviceArray.from_numpy(np.asarray(host), dtype=dtype)


class View:
    """A strided view of a DeviceArray (byte strides) through the CUDA array interface."""

    def __init__(self, base, shape, byte_strides):
        self.base = base
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": base.__cuda_array_interface__["typestr"],
            "strides": tuple(int(s) for s in byte_strides), "data": (base.ptr, False),
            "version": 3}


def poisoned(shape, dtype):
    from specdec_lib import DeviceArray
    return DeviceArray.empty(shape, dtype).fill_bytes(0xFF)


def values(a, dtype):
    """Device array -> float64 values (bf16 bits decoded)."""
    return from_host_storage(a.to_numpy(), dtype).astype(np.float64)


def rnd(rng, shape, dtype, scale=1.0):
    """Random float64 data already rounded to dtype (what the GPU sees)."""
    return round_to(rng.standard_normal(shape) * scale, dtype)


def cu_of(qs):
    return np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)


def seed_rng(data):
    return np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))


# ================================================================== part 1: valid
@settings(**SETTINGS)
@given(data=st.data())
def test_copy_random_layouts(data):
    from specdec_lib import ops
    rng = seed_rng(data)
    dt = data.draw(st.sampled_from(["float32", "float16", "bfloat16", "int8", "int64", "uint16"]))
    nd = data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.integers(1, 40 if nd < 3 else 9)) for _ in range(nd))
    host = rng.integers(0, 200, shape).astype(host_dtype(dt))
    # source: broadcast (a trailing sub-shape with size-1 dims) or a permuted view
    mode = data.draw(st.sampled_from(["same", "broadcast", "permuted"]))
    if mode == "broadcast":
        drop = data.draw(st.integers(0, nd - 1))
        s_shape = tuple(1 if rng.random() < 0.4 else n for n in shape[drop:])
        s_host = rng.integers(0, 200, s_shape).astype(host_dtype(dt))
        src, want = d_raw(s_host, dt), np.broadcast_to(s_host, shape)
    elif mode == "permuted" and nd >= 2:
        perm = rng.permutation(nd)
        base = np.ascontiguousarray(host.transpose(perm))     # base axis j = host axis perm[j]
        b = d_raw(base, dt)
        inv = np.argsort(perm)
        src = View(b, shape, tuple(base.strides[inv[i]] for i in range(nd)))
        want = host
    else:
        src, want = d_raw(host, dt), host
    dst = poisoned(shape, dt)
    ops.copy(dst, src)
    np.testing.assert_array_equal(dst.to_numpy(), want)


@settings(**SETTINGS)
@given(data=st.data())
def test_append_kv_random(data):
    from specdec_lib import ops
    rng = seed_rng(data)
    dt = data.draw(st.sampled_from(["float16", "bfloat16", "float32", "int8"]))
    ps = data.draw(st.sampled_from([1, 2, 4, 16, 64]))
    hkv, D = data.draw(st.integers(1, 4)), data.draw(st.sampled_from([8, 64, 128, 5]))
    B = data.draw(st.integers(1, 5))
    qs = rng.integers(0, 17, B)
    L = rng.integers(0, 3 * ps + 5, B)
    need = -(-(L + qs) // ps)
    max_pages = int(max(need.max(), 1)) + data.draw(st.integers(0, 2))
    num_pages = B * max_pages + data.draw(st.integers(0, 3))
    pt = rng.permutation(num_pages)[:B * max_pages].reshape(B, max_pages).astype(np.int32)
    fin = (rng.random(B) < 0.2).astype(np.uint8) if data.draw(st.booleans()) else None
    cu = cu_of(qs)
    T = int(cu[-1])
    k = rng.integers(-100, 100, (T, hkv, D)).astype(host_dtype(dt))
    v = rng.integers(-100, 100, (T, hkv, D)).astype(host_dtype(dt))
    kc, vc = poisoned((num_pages, ps, hkv, D), dt), poisoned((num_pages, ps, hkv, D), dt)
    k_exp, v_exp = kc.to_numpy(), vc.to_numpy()
    ref.append_kv(k, v, k_exp, v_exp, pt, L.astype(np.int32), cu,
                  None if fin is None else fin.astype(bool))
    ops.append_kv(d_raw(k, dt), d_raw(v, dt), kc, vc, d_arr(pt), d_arr(L.astype(np.int32)), d_arr(cu),
                  None if fin is None else d_arr(fin))
    np.testing.assert_array_equal(kc.to_numpy().view(np.uint8), k_exp.view(np.uint8))
    np.testing.assert_array_equal(vc.to_numpy().view(np.uint8), v_exp.view(np.uint8))


@settings(**SETTINGS)
@given(data=st.data())
def test_verify_attention_random(data):
    from specdec_lib import DeviceArray, ops
    from specdec_lib.ops import verify_attention_workspace_size
    rng = seed_rng(data)
    dt = data.draw(st.sampled_from(["float16", "bfloat16"] if family() >= 80 else ["float16"]))
    D = data.draw(st.sampled_from([64, 128, 256]))
    hkv, group = data.draw(st.integers(1, 3)), data.draw(st.sampled_from([1, 2, 4, 8, 16]))
    hq = hkv * group
    ps = data.draw(st.sampled_from([1, 2, 8, 16, 64, 256]))
    B = data.draw(st.integers(1, 4))
    qs = rng.integers(0, 17, B)
    qs[rng.integers(0, B)] = max(int(qs.max()), 1)
    L = rng.integers(0, 700, B)
    need = -(-(L + qs) // ps)
    max_pages = int(need.max()) + data.draw(st.integers(0, 2))
    num_pages = B * max_pages + 2
    pt = rng.permutation(num_pages)[:B * max_pages].reshape(B, max_pages).astype(np.int32)
    cu = cu_of(qs)
    T = int(cu[-1]) + data.draw(st.integers(0, 2))     # rows nobody owns stay poisoned
    q = rnd(rng, (T, hq, D), dt)
    kc = rnd(rng, (num_pages, ps, hkv, D), dt)
    vc = rnd(rng, (num_pages, ps, hkv, D), dt)
    out, lse = poisoned((T, hq, D), dt), poisoned((T, hq), "float32")
    kw = {}
    how = data.draw(st.sampled_from(["direct", "auto", "forced"]))
    if how != "direct":
        ns = None if how == "auto" else data.draw(st.integers(2, 9))
        nb = verify_attention_workspace_size(T, hq, hkv, D, B, max_pages * ps, num_splits=ns)
        kw = dict(workspace=DeviceArray.empty((max(nb, 16),), "uint8"))
        if ns is not None:
            kw["num_splits"] = ns
    scale = data.draw(st.sampled_from([None, 0.05, 0.3]))
    ops.verify_attention(d_arr(q, dt), d_arr(kc, dt), d_arr(vc, dt), d_arr(pt),
                         d_arr(L.astype(np.int32)), d_arr(cu), out, scale, lse,
                         check_indices=True, **kw)
    exp_o, exp_l = np.full((T, hq, D), np.nan), np.full((T, hq), np.nan)
    ref.verify_attention(q, kc, vc, pt, L.astype(np.int32), cu, exp_o, scale, exp_l)
    got_o, got_l = values(out, dt), lse.to_numpy().astype(np.float64)
    n = int(cu[-1])
    assert np.isnan(got_o[n:]).all() and np.isnan(got_l[n:]).all(), "wrote rows nobody owns"
    tol = 2e-3 if dt == "float16" else 1.5e-2
    for b in range(B):
        r = slice(cu[b], cu[b + 1])
        if qs[b]:
            assert rel_err(got_o[r], exp_o[r]) <= tol, f"seq {b} out"
            assert rel_err(got_l[r], exp_l[r]) <= 1e-4, f"seq {b} lse"


def _gdn_inputs(rng, data, T, Hk, Hv, Dk, Dv, in_dt):
    fused = data.draw(st.booleans(), label="fused")
    l2 = data.draw(st.booleans(), label="l2norm")
    k = rng.standard_normal((T, Hk, Dk))
    if not l2:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    x = dict(q=rnd(rng, (T, Hk, Dk), in_dt), k=round_to(k, in_dt), v=rnd(rng, (T, Hv, Dv), in_dt))
    if fused:
        g = dict(a=rnd(rng, (T, Hv), in_dt), b=rnd(rng, (T, Hv), in_dt),
                 A_log=rng.uniform(-2, 0.5, Hv).astype(np.float32),
                 dt_bias=rng.uniform(-1, 1, Hv).astype(np.float32))
    else:
        g = dict(g=(-rng.uniform(0, 0.5, (T, Hv))).astype(np.float32),
                 beta=rng.uniform(0.1, 0.9, (T, Hv)).astype(np.float32))
    return x, g, l2


@settings(**SETTINGS)
@given(data=st.data())
def test_gdn_verify_commit_random(data):
    from specdec_lib import ops
    rng = seed_rng(data)
    layout = data.draw(st.sampled_from(["kv", "vk"]))
    sdt = data.draw(st.sampled_from(FLOATS))
    in_dt = data.draw(st.sampled_from(FLOATS))
    Dk = data.draw(st.sampled_from([64, 128]))
    Dv = data.draw(st.sampled_from([32, 64, 128, 256] if sdt == "float32" else [64, 128, 256]))
    Hk = data.draw(st.integers(1, 3))
    Hv = Hk * data.draw(st.sampled_from([1, 2, 4]))
    B = data.draw(st.integers(1, 4))
    slots = B + data.draw(st.integers(0, 3))
    qs = rng.integers(1, 7, B)
    cu = cu_of(qs)
    T = int(cu[-1])
    slot_ids = rng.permutation(slots)[:B].astype(np.int32)
    slot_ids[rng.random(B) < 0.2] = -1
    x, g, l2 = _gdn_inputs(rng, data, T, Hk, Hv, Dk, Dv, in_dt)
    shape = (slots, Hv, Dk, Dv) if layout == "kv" else (slots, Hv, Dv, Dk)
    state0 = to_host_storage(0.5 * rng.standard_normal(shape), sdt)
    d_state = d_raw(state0, sdt)
    W = ref.gdn_journal_width(Hk, Hv, Dk, Dv)
    out_dt = data.draw(st.sampled_from(FLOATS))
    d_out, d_j, d_st = poisoned((T, Hv, Dv), out_dt), poisoned((T, W), "float32"), poisoned((B,), "int32")
    dev_in = {n: (d_arr(a, in_dt) if n in ("q", "k", "v", "a", "b") else d_arr(a))
              for n, a in {**x, **g}.items()}
    ops.gdn_verify(**dev_in, state=d_state, slot_ids=d_arr(slot_ids), cu_q=d_arr(cu), out=d_out,
                   journal=d_j, qk_l2norm=l2, layout=layout, status=d_st)
    assert not d_st.to_numpy().any()
    np.testing.assert_array_equal(d_state.to_numpy().view(np.uint8), state0.view(np.uint8))
    host_x = {n: to_host_storage(a, in_dt) if n in ("q", "k", "v", "a", "b") else a
              for n, a in {**x, **g}.items()}
    exp_o = np.full((T, Hv, Dv), np.nan, np.float32)
    exp_j = np.full((T, W), np.nan, np.float32)
    ref.gdn_verify(**host_x, state=state0.copy(), slot_ids=slot_ids, cu_q=cu, out=exp_o,
                   journal=exp_j, qk_l2norm=l2, layout=layout)
    tol = 1e-4 if sdt == in_dt == out_dt == "float32" else 2e-2
    e = rel_err(values(d_out, out_dt), exp_o)
    assert e < tol, f"out rel err {e}"
    assert rel_err(d_j.to_numpy(), exp_j) < 1e-5
    acc = np.array([rng.integers(0, q + 1) for q in qs], np.int32)
    ops.gdn_commit(d_state, d_arr(slot_ids), d_arr(cu), d_arr(acc), d_j, layout=layout, status=d_st)
    assert not d_st.to_numpy().any()
    exp_s = state0.copy()
    ref.gdn_commit(exp_s, slot_ids, cu, acc, d_j.to_numpy(), layout=layout)
    got = d_state.to_numpy()
    for b in range(B):
        s = slot_ids[b]
        if s < 0:
            continue
        if acc[b] == 0:
            np.testing.assert_array_equal(got[s].view(np.uint8), state0[s].view(np.uint8))
        else:
            e = rel_err(from_host_storage(got[s], sdt), from_host_storage(exp_s[s], sdt))
            assert e < (2e-5 if sdt == "float32" else 5e-3), f"slot {s}: state rel err {e}"
    untouched = np.setdiff1d(np.arange(slots), slot_ids[(slot_ids >= 0) & (acc > 0)])
    np.testing.assert_array_equal(got[untouched].view(np.uint8), state0[untouched].view(np.uint8))


@settings(**SETTINGS)
@given(data=st.data())
def test_conv1d_verify_commit_random(data):
    from specdec_lib import ops
    rng = seed_rng(data)
    W = data.draw(st.integers(2, 8))
    dim = data.draw(st.sampled_from([1, 7, 64, 255, 256, 1031]))
    xdt, wdt, sdt, odt = (data.draw(st.sampled_from(FLOATS)) for _ in range(4))
    B = data.draw(st.integers(1, 4))
    slots = B + data.draw(st.integers(0, 2))
    qs = rng.integers(0, 7, B)
    cu = cu_of(qs)
    T = int(cu[-1])
    slot_ids = rng.permutation(slots)[:B].astype(np.int32)
    slot_ids[rng.random(B) < 0.2] = -1
    x = to_host_storage(rng.standard_normal((T, dim)), xdt)
    w = to_host_storage(rng.standard_normal((dim, W)) / 2, wdt)
    bias = to_host_storage(rng.standard_normal(dim), xdt) if data.draw(st.booleans()) else None
    act = data.draw(st.sampled_from(["silu", None]))
    st0 = to_host_storage(rng.standard_normal((slots, dim, W - 1)), sdt)
    dv = d_raw
    d_state = dv(st0, sdt)
    d_out, d_j, d_st = poisoned((T, dim), odt), poisoned((T, dim), sdt), poisoned((B,), "int32")
    ops.conv1d_verify(dv(x, xdt), dv(w, wdt), d_state, d_arr(slot_ids), d_arr(cu), d_out,
                      bias=None if bias is None else dv(bias, xdt), activation=act, journal=d_j,
                      status=d_st)
    assert not d_st.to_numpy().any()
    exp = np.full((T, dim), np.nan, np.float32)
    ref.conv1d_verify(x, w, st0.copy(), slot_ids, cu, exp, bias=bias, activation=act)
    e = rel_err(values(d_out, odt), exp)
    assert e < (1e-5 if "float32" == xdt == wdt == sdt == odt else 1.5e-2), f"out rel err {e}"
    acc = np.array([rng.integers(0, q + 1) for q in qs], np.int32)
    ops.conv1d_commit(d_state, d_arr(slot_ids), d_arr(cu), d_arr(acc), d_j, status=d_st)
    exp_s = st0.copy()
    ref.conv1d_commit(exp_s, slot_ids, cu, acc, x)       # journal == x rounded to the state dtype
    np.testing.assert_array_equal(d_state.to_numpy().view(np.uint8), exp_s.view(np.uint8))


@settings(**SETTINGS)
@given(data=st.data())
def test_spec_sample_random(data):
    """Greedy blocks exactly equal the reference; sampled blocks equal it except for a
    rare draw on a float32-vs-float64 boundary; status codes always equal."""
    from specdec_lib import DeviceArray, ops
    from specdec_lib.ops import spec_sample_workspace_size
    rng = seed_rng(data)
    dt = data.draw(st.sampled_from(FLOATS))
    V = data.draw(st.sampled_from([1, 5, 100, 2048, 2049, 5003]))
    B = data.draw(st.integers(1, 6))
    qs = rng.integers(1, 6, B)
    cu = cu_of(qs)
    T = int(cu[-1])
    raw = np.round(rng.standard_normal((T, V)) * 2, 1)
    if data.draw(st.booleans()):
        raw[rng.random((T, V)) < 0.02] = -np.inf
    host = to_host_storage(raw, dt)
    seen = from_host_storage(host, dt).astype(np.float32)
    greedy = rng.random(B) < 0.5
    temp = np.where(greedy, 0.0, rng.choice([0.5, 1.0, 1.3], B)).astype(np.float32)
    params = dict(temperature=temp, top_k=rng.choice([0, 1, 3, V + 1], B).astype(np.int32),
                  top_p=rng.choice([1.0, 0.9, 0.5], B).astype(np.float32),
                  min_p=rng.choice([0.0, 0.0, 0.1], B).astype(np.float32),
                  seed=rng.integers(0, 2**63, B).astype(np.uint64),
                  step=rng.integers(0, 1000, B).astype(np.int64))
    drafts = np.empty(T - B, np.int32)
    for b in range(B):
        for i in range(qs[b] - 1):
            r = cu[b] + i
            drafts[cu[b] - b + i] = (ref.sampling.greedy_argmax(seen[r]) if rng.random() < 0.7
                                     else rng.integers(-1, V + 1))
    Wd = int(qs.max()) + data.draw(st.integers(0, 2))
    na, em, sst = poisoned((B,), "int32"), poisoned((B, Wd), "int32"), poisoned((B,), "int32")
    lp = poisoned((B, Wd), "float32")
    ws = DeviceArray.empty((spec_sample_workspace_size(T, V),), "uint8")
    ops.spec_sample(d_raw(host, dt), d_arr(cu), d_arr(drafts),
                    *[d_arr(params[k]) for k in ("temperature", "top_k", "top_p", "min_p", "seed",
                                                 "step")],
                    na, em, sst, accepted_logprobs=lp, workspace=ws)
    n, e, s = na.to_numpy(), em.to_numpy(), sst.to_numpy()
    rn, rem, rst = np.zeros(B, np.int32), np.zeros((B, Wd), np.int32), np.zeros(B, np.int32)
    ref.spec_sample(seen, cu, drafts, *[params[k] for k in ("temperature", "top_k", "top_p",
                                                             "min_p", "seed", "step")],
                    rn, rem, rst)
    np.testing.assert_array_equal(s, rst)
    same = (n == rn) & (e == rem).all(1)
    assert same[greedy].all(), f"greedy blocks differ: {np.flatnonzero(greedy & ~same)}"
    assert (~same).sum() <= 1, f"{(~same).sum()} of {B} blocks differ from the reference"
    assert ((e >= -1) & (e < V)).all() and (n >= 0).all()
    assert not np.isnan(lp.to_numpy()[e >= 0]).any()


@settings(**SETTINGS)
@given(data=st.data())
def test_sequence_ops_random(data):
    from specdec_lib import ops
    rng = seed_rng(data)
    B, K, C = data.draw(st.integers(0, 300)), data.draw(st.integers(0, 6)), data.draw(st.integers(1, 20))
    Wd = K + 1
    last = rng.integers(0, 8, B).astype(np.int32)
    drafts = rng.integers(0, 8, (B, K)).astype(np.int32)
    nd = rng.integers(-1, K + 2, B).astype(np.int32)
    L = rng.integers(0, 100, B).astype(np.int32)
    cu, bt, pos = np.full(B + 1, -1, np.int32), np.full(B * Wd, -1, np.int32), np.full(B * Wd, -1, np.int32)
    dids = np.full(B * K, -1, np.int32)
    ref.seq_build_block(last, drafts, nd, L, cu, bt, pos, dids)
    d = [poisoned((B + 1,), "int32"), poisoned((B * Wd,), "int32"), poisoned((B * Wd,), "int32"),
         poisoned((B * K,), "int32")]
    ops.seq_build_block(d_arr(last), d_arr(drafts), d_arr(nd), d_arr(L), *d)
    T = int(cu[-1])
    np.testing.assert_array_equal(d[0].to_numpy(), cu)
    np.testing.assert_array_equal(d[1].to_numpy()[:T], bt[:T])
    np.testing.assert_array_equal(d[2].to_numpy()[:T], pos[:T])
    np.testing.assert_array_equal(d[3].to_numpy()[:T - B], dids[:T - B])
    emitted = rng.integers(0, 8, (B, Wd)).astype(np.int32)
    n = rng.integers(-1, Wd + 1, B).astype(np.int32)
    out_tokens = rng.integers(0, 8, (B, C)).astype(np.int32)
    out_lens = rng.integers(-1, C + 2, B).astype(np.int32)
    stop_ids = rng.integers(-1, 8, (B, 2)).astype(np.int32) if data.draw(st.booleans()) else None
    stop_seqs = rng.integers(-1, 8, (B, 2, 3)).astype(np.int32) if data.draw(st.booleans()) else None
    max_new = (np.maximum(out_lens, 0) + rng.integers(-1, Wd + 2, B)).astype(np.int32)
    fin = np.where(rng.random(B) < 0.2, rng.integers(1, 6, B), 0).astype(np.uint8)
    acc_r, fin_r = np.zeros(B, np.int32), fin.copy()
    ref.seq_stop(emitted, n, out_tokens, out_lens, stop_ids, stop_seqs, max_new, acc_r, fin_r)
    d_acc, d_fin = poisoned((B,), "int32"), d_arr(fin)
    d_em, d_out, d_ol = d_arr(emitted), d_arr(out_tokens), d_arr(out_lens)
    ops.seq_stop(d_em, d_arr(n), d_out, d_ol, None if stop_ids is None else d_arr(stop_ids),
                 None if stop_seqs is None else d_arr(stop_seqs), d_arr(max_new), d_acc, d_fin)
    np.testing.assert_array_equal(d_acc.to_numpy(), acc_r)
    np.testing.assert_array_equal(d_fin.to_numpy(), fin_r)
    host = [L.copy(), out_tokens.copy(), out_lens.copy(), last.copy(), fin_r.copy()]
    ref.seq_advance(emitted, acc_r, *host)
    devs = [d_arr(L), d_out, d_ol, d_arr(last), d_fin]
    ops.seq_advance(d_em, d_acc, *devs)
    for name, h, dd in zip(("seq_lens", "out_tokens", "out_lens", "last_token", "finished"), host, devs):
        np.testing.assert_array_equal(dd.to_numpy(), h, err_msg=name)


@settings(**SETTINGS)
@given(data=st.data())
def test_draft_ops_random(data):
    from specdec_lib import ops
    rng = seed_rng(data)
    dt = data.draw(st.sampled_from(FLOATS))
    B, H = data.draw(st.integers(0, 9)), data.draw(st.sampled_from([1, 3, 8, 64, 129, 1000, 4096]))
    qs = rng.integers(1, 5, B)
    cu = cu_of(qs)
    T = int(cu[-1])
    acc = np.array([rng.integers(-1, q + 1) for q in qs], np.int32)
    hidden = to_host_storage(rng.standard_normal((T, H)), dt)
    r0 = data.draw(st.integers(0, max(T, 0)))
    c0 = data.draw(st.integers(0, 3))
    part = np.ascontiguousarray(hidden[r0:])
    want = np.zeros((B, H + c0), hidden.dtype)
    ref.draft_carry(part, cu, acc, want, row_begin=r0, col_begin=c0)
    out = poisoned((B, H + c0), dt)
    ops.draft_carry(d_raw(part, dt), d_arr(cu), d_arr(acc),
                    out, row_begin=r0, col_begin=c0)
    np.testing.assert_array_equal(out.to_numpy(), want)
    # capture_hidden: every tap, the last with a residual
    taps = data.draw(st.integers(1, 3))
    x = [rnd(rng, (T, H), dt) for _ in range(taps)]
    res = rnd(rng, (T, H), dt)
    cap = poisoned((T, taps * H), dt)
    want = np.zeros((T, taps * H))
    for t in range(taps):
        r = res if t == taps - 1 else None
        ops.capture_hidden(d_arr(x[t], dt), cap, t, residual=None if r is None else d_arr(r, dt))
        ref.capture_hidden(x[t], want, t, residual=r)
    assert rel_err(values(cap, dt), want) <= (1e-7 if dt == "float32" else 5e-3)
    # draft_combine with a gathered embedding table and ids outside the table
    Vt = data.draw(st.integers(1, 20))
    table, hid = rnd(rng, (Vt, H), dt), rnd(rng, (T, H), dt)
    wdt = data.draw(st.sampled_from([dt, "float32"]))
    we, wh = rnd(rng, H, wdt), rnd(rng, H, wdt)
    ids = rng.integers(-2, Vt + 2, T).astype(data.draw(st.sampled_from([np.int32, np.int64])))
    uo = data.draw(st.booleans())
    comb = poisoned((T, 2 * H), dt)
    ops.draft_combine(d_arr(table, dt), d_arr(hid, dt), d_arr(we, wdt), d_arr(wh, wdt), comb,
                      token_ids=d_arr(ids), unit_offset=uo)
    want = np.zeros((T, 2 * H))
    ref.draft_combine(table, hid, we, wh, want, token_ids=ids, unit_offset=uo)
    assert rel_err(values(comb, dt), want) <= (1e-5 if dt == "float32" else 5e-3)
    # draft_map_tokens
    Vd = data.draw(st.integers(1, 50))
    d2t = rng.integers(0, 1000, Vd).astype(data.draw(st.sampled_from([np.int32, np.int64])))
    di = rng.integers(-3, Vd + 3, T).astype(np.int32)
    off = data.draw(st.booleans())
    mt = poisoned((T,), "int32")
    ops.draft_map_tokens(d_arr(di), d_arr(d2t), mt, offsets=off)
    want = np.zeros(T, np.int32)
    ref.draft_map_tokens(di, d2t, want, offsets=off)
    np.testing.assert_array_equal(mt.to_numpy(), want)


# ================================================================== part 2: invalid
# Each case: build(rng) -> (fn, kwargs, outputs), and a list of breakers: (label, fn(kw, rng)
# -> (kw', names)) that make the call invalid; names: what the error must start with.

def _host(a):
    return a.to_numpy()


def _wrong_dtype(name, dtype):
    def f(kw, rng):
        a = kw[name]
        return dict(kw, **{name: poisoned(a.shape, dtype)}), {name}
    return f


def _wrong_dim(name, axis=0, delta=1):
    def f(kw, rng):
        a = kw[name]
        shape = list(a.shape)
        shape[axis] += delta
        return dict(kw, **{name: poisoned(tuple(shape), a.dtype)}), {name}
    return f


def _as_host(name):
    return lambda kw, rng: (dict(kw, **{name: _host(kw[name])}), {name})


def _value(name, host_fn, names=None):
    """Replace index array ``name`` by host_fn(host copy) on the device (check_indices)."""
    def f(kw, rng):
        h = host_fn(kw[name].to_numpy().copy())
        return dict(kw, **{name: d_arr(h)}), names or {name}
    return f


def _scalar(name, value):
    return lambda kw, rng: (dict(kw, **{name: value}), {name})


def case_append_kv(rng):
    from specdec_lib import ops
    B, ps, hkv, D = 2, 4, 2, 8
    pt = np.arange(2 * 3, dtype=np.int32).reshape(2, 3)
    kw = dict(k=d_arr(rng.standard_normal((4, hkv, D)).astype(np.float32)),
              v=d_arr(rng.standard_normal((4, hkv, D)).astype(np.float32)),
              k_cache=poisoned((8, ps, hkv, D), "float32"), v_cache=poisoned((8, ps, hkv, D), "float32"),
              page_table=d_arr(pt), seq_lens=d_arr(np.array([1, 5], np.int32)),
              cu_q=d_arr(np.array([0, 2, 4], np.int32)))
    breakers = [("k dtype", _wrong_dtype("k", "float16")), ("v shape", _wrong_dim("v", 1)),
                ("seq_lens size", _wrong_dim("seq_lens")), ("cu_q host", _as_host("cu_q")),
                ("page id", _value("page_table", lambda h: h + 10, {"page_table"})),
                ("negative L", _value("seq_lens", lambda h: h - 9)),
                ("table too narrow", _value("seq_lens", lambda h: h + 10, {"page_table"}))]
    return ops.append_kv, kw, ("k_cache", "v_cache"), breakers


def case_verify_attention(rng):
    from specdec_lib import ops
    dt = "float16"
    T, hq, hkv, D, ps = 3, 4, 2, 64, 4
    pt = np.arange(2 * 4, dtype=np.int32).reshape(2, 4)
    kw = dict(q=d_arr(rnd(rng, (T, hq, D), dt), dt), k_cache=d_arr(rnd(rng, (9, ps, hkv, D), dt), dt),
              v_cache=d_arr(rnd(rng, (9, ps, hkv, D), dt), dt), page_table=d_arr(pt),
              seq_lens=d_arr(np.array([3, 10], np.int32)), cu_q=d_arr(np.array([0, 2, 3], np.int32)),
              out=poisoned((T, hq, D), dt), lse_out=poisoned((T, hq), "float32"), check_indices=True)
    breakers = [("q dtype", _wrong_dtype("q", "float32")), ("out shape", _wrong_dim("out", 1)),
                ("lse shape", _wrong_dim("lse_out", 1)), ("page_table host", _as_host("page_table")),
                ("scale nan", _scalar("scale", math.nan)), ("max_q 17", _scalar("max_q", 17)),
                ("splits without workspace", lambda kw, rng: (dict(kw, num_splits=3), {"workspace"})),
                ("page outside pool", _value("page_table", lambda h: h * 5, {"page_table"})),
                ("cu_q decreasing", _value("cu_q", lambda h: h[[0, 2, 1]]))]
    return ops.verify_attention, kw, ("out", "lse_out"), breakers


def case_gdn_verify(rng):
    from specdec_lib import ops
    T, Hk, Hv, D, B = 4, 1, 2, 64, 2
    W = ref.gdn_journal_width(Hk, Hv, D, D)
    kw = dict(q=d_arr(rng.standard_normal((T, Hk, D)).astype(np.float32)),
              k=d_arr(rng.standard_normal((T, Hk, D)).astype(np.float32)),
              v=d_arr(rng.standard_normal((T, Hv, D)).astype(np.float32)),
              state=d_arr(np.zeros((3, Hv, D, D), np.float32)),
              slot_ids=d_arr(np.array([0, 2], np.int32)), cu_q=d_arr(np.array([0, 1, 4], np.int32)),
              out=poisoned((T, Hv, D), "float32"), journal=poisoned((T, W), "float32"),
              g=d_arr(-np.ones((T, Hv), np.float32)), beta=d_arr(np.ones((T, Hv), np.float32) / 2),
              status=poisoned((B,), "int32"))
    breakers = [("k dtype", _wrong_dtype("k", "float16")), ("journal width", _wrong_dim("journal", 1)),
                ("v heads", _wrong_dim("v", 1)), ("g host", _as_host("g")),
                ("layout", _scalar("layout", "kk")), ("slot range", _value("slot_ids", lambda h: h + 2)),
                ("same slot", _value("slot_ids", lambda h: h * 0)),
                ("state Dk", lambda kw, rng: (dict(kw, state=poisoned((3, Hv, 96, D), "float32")), {"state"}))]
    return ops.gdn_verify, kw, ("out", "journal", "status", "state"), breakers


def case_conv1d_commit(rng):
    from specdec_lib import ops
    kw = dict(conv_state=d_arr(rng.standard_normal((3, 16, 3)).astype(np.float32)),
              slot_ids=d_arr(np.array([2, 0], np.int32)), cu_q=d_arr(np.array([0, 3, 4], np.int32)),
              accept_len=d_arr(np.array([2, 1], np.int32)),
              journal=d_arr(rng.standard_normal((4, 16)).astype(np.float32)),
              status=poisoned((2,), "int32"))
    breakers = [("journal dim", _wrong_dim("journal", 1)), ("accept_len dtype", _wrong_dtype("accept_len", "float32")),
                ("accept too long", _value("accept_len", lambda h: h + 3)),
                ("slot range", _value("slot_ids", lambda h: h + 5)),
                ("width 9", lambda kw, rng: (dict(kw, conv_state=poisoned((3, 16, 8), "float32")), {"conv_state"}))]
    return ops.conv1d_commit, kw, ("conv_state", "status"), breakers


def case_spec_sample(rng):
    from specdec_lib import DeviceArray, ops
    from specdec_lib.ops import spec_sample_workspace_size
    B, T, V = 2, 5, 40
    kw = dict(logits=d_arr(rng.standard_normal((T, V)).astype(np.float32)),
              cu_q=d_arr(np.array([0, 3, 5], np.int32)), draft_ids=d_arr(np.array([1, 2, 3], np.int32)),
              temperature=d_arr(np.ones(B, np.float32)), top_k=d_arr(np.zeros(B, np.int32)),
              top_p=d_arr(np.ones(B, np.float32)), min_p=d_arr(np.zeros(B, np.float32)),
              seed=d_arr(np.arange(B, dtype=np.uint64)), step=d_arr(np.zeros(B, np.int64)),
              num_accepted=poisoned((B,), "int32"), emitted=poisoned((B, 3), "int32"),
              status=poisoned((B,), "int32"), accepted_logprobs=poisoned((B, 3), "float32"),
              workspace=DeviceArray.empty((spec_sample_workspace_size(T, V),), "uint8"))
    breakers = [("logits dtype", _wrong_dtype("logits", "int32")), ("draft_ids size", _wrong_dim("draft_ids")),
                ("top_p dtype", _wrong_dtype("top_p", "float64")), ("emitted rows", _wrong_dim("emitted")),
                ("seed host", _as_host("seed")), ("workspace small", _wrong_dim("workspace", 0, -1)),
                ("d2t alone", lambda kw, rng: (dict(kw, d2t=d_arr(np.arange(3, dtype=np.int32))), {"d2t"}))]
    return ops.spec_sample, kw, ("num_accepted", "emitted", "status", "accepted_logprobs"), breakers


def case_draft_combine(rng):
    from specdec_lib import ops
    rows, H = 3, 16
    kw = dict(embed=d_arr(rng.standard_normal((7, H)).astype(np.float32)),
              hidden=d_arr(rng.standard_normal((rows, H)).astype(np.float32)),
              embed_norm_weight=d_arr(np.ones(H, np.float32)), hidden_norm_weight=d_arr(np.ones(H, np.float32)),
              out=poisoned((rows, 2 * H), "float32"), token_ids=d_arr(np.array([0, 6, 9], np.int32)))
    breakers = [("embed width", _wrong_dim("embed", 1)), ("weight dtype", _wrong_dtype("hidden_norm_weight", "float16")),
                ("ids size", _wrong_dim("token_ids")), ("eps", _scalar("eps", -1.0)),
                ("hidden host", _as_host("hidden"))]
    return ops.draft_combine, kw, ("out",), breakers


def case_seq_build_block(rng):
    from specdec_lib import ops
    B, K = 3, 2
    kw = dict(last_token=d_arr(np.arange(B, dtype=np.int32)), draft_tokens=d_arr(np.ones((B, K), np.int32)),
              num_draft=d_arr(np.full(B, 2, np.int32)), seq_lens=d_arr(np.zeros(B, np.int32)),
              cu_q=poisoned((B + 1,), "int32"), block_tokens=poisoned((B * (K + 1),), "int32"),
              positions=poisoned((B * (K + 1),), "int32"), draft_ids=poisoned((B * K,), "int32"))
    breakers = [("block_tokens short", _wrong_dim("block_tokens", 0, -1)), ("cu_q size", _wrong_dim("cu_q")),
                ("num_draft dtype", _wrong_dtype("num_draft", "int64")), ("drafts host", _as_host("draft_tokens"))]
    return ops.seq_build_block, kw, ("cu_q", "block_tokens", "positions", "draft_ids"), breakers


CASES = [case_append_kv, case_verify_attention, case_gdn_verify, case_conv1d_commit, case_spec_sample,
         case_draft_combine, case_seq_build_block]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[5:])
@settings(**dict(SETTINGS, max_examples=max(EXAMPLES, 8)))
@given(data=st.data())
def test_invalid_arguments_raise_before_launch_and_leave_outputs(case, data):
    rng = seed_rng(data)
    fn, kw, outputs, breakers = case(rng)
    label, breaker = data.draw(st.sampled_from(breakers), label="breaker")
    bad, names = breaker(kw, rng)
    before = {n: kw[n].to_numpy().tobytes() for n in outputs}
    with pytest.raises((TypeError, ValueError)) as ei:
        fn(**bad)
    msg = str(ei.value)
    assert named(msg) & set(names), f"{label}: the error does not name {sorted(names)}: {msg}"
    for n in outputs:
        assert kw[n].to_numpy().tobytes() == before[n], f"{label}: {n} was written"
    fn(**kw)              # the unbroken call still runs (nothing was left half-done)
