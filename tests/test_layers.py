"""Dense-layer glue ops: rms_norm (optionally fused with the residual add), rope, silu_mul,
gated_rms_norm (a GDN layer's output norm)."""
import math

import numpy as np
import pytest

from conftest import needs_gpu, poison, rel_err
from specdec_lib._kernels import GATED_NORM_DTYPES
from specdec_lib.dtypes import canonical, from_host_storage, round_to, to_host_storage
from specdec_lib.reference import layers as ref
from test_draft import _Fake, _View

TOL = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}
HOST = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def _store(x, dtype):
    """float values -> the host storage array of dtype (bf16: uint16 bits), rounded once."""
    return to_host_storage(np.asarray(x, np.float64).astype(np.float32)
                           if dtype == "bfloat16" else x, dtype)


# ---------------------------------------------------------------- rms_norm reference

@pytest.mark.parametrize("unit_offset", [False, True])
def test_rms_norm_constant_row(unit_offset):
    H, c, eps = 8, -3.0, 1e-6
    x = np.full((2, H), c)
    x[1] = 0.0
    w = np.linspace(0.5, 2.0, H)
    out = np.full_like(x, np.nan)
    ref.rms_norm(x, w, out, eps=eps, unit_offset=unit_offset)
    scale = (1 + w) if unit_offset else w
    np.testing.assert_allclose(out[0], c / math.sqrt(c * c + eps) * scale, rtol=1e-15)
    assert np.all(out[1] == 0)


def test_rms_norm_matches_formula(rng):
    x = rng.standard_normal((5, 12))
    w = rng.standard_normal(12)
    out = np.zeros_like(x)
    ref.rms_norm(x, w, out, eps=1e-5)
    want = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, want, rtol=1e-13)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_rms_norm_fused_residual_equals_two_steps(dtype, rng):
    """The fused path stores s = round(x + r) and normalises that rounded s: exactly the
    unfused add (in the dtype) followed by rms_norm."""
    T, H = 6, 40
    x = _store(rng.standard_normal((T, H)), dtype)
    r = _store(rng.standard_normal((T, H)), dtype)
    w = rng.standard_normal(H).astype(np.float32)
    out, s = np.zeros_like(x), np.zeros_like(x)
    ref.rms_norm(x, w, out, residual=r, residual_out=s, eps=1e-5, unit_offset=True)
    h = _store(from_host_storage(x, dtype) + from_host_storage(r, dtype), dtype)
    two = np.zeros_like(x)
    ref.rms_norm(h, w, two, eps=1e-5, unit_offset=True)
    np.testing.assert_array_equal(s, h)
    np.testing.assert_array_equal(out, two)
    # in place: out is x, residual_out is residual
    xi, ri = x.copy(), r.copy()
    ref.rms_norm(xi, w, xi, residual=ri, residual_out=ri, eps=1e-5, unit_offset=True)
    np.testing.assert_array_equal(xi, out)
    np.testing.assert_array_equal(ri, s)


def test_rms_norm_empty():
    for T, H in ((0, 8), (3, 0)):
        out = np.zeros((T, H), np.float32)
        ref.rms_norm(np.zeros((T, H), np.float32), np.ones(H, np.float32), out)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(x=np.zeros((2, 4), np.int32)), TypeError, "x: dtype"),
    (dict(x=np.zeros(4, np.float32)), ValueError, "x"),
    (dict(weight=np.ones(3, np.float32)), ValueError, "weight"),
    # numpy dtypes are checked by kind here (a float16 out for float32 x passes): exact
    # dtypes on the torch path, test_rms_norm_refuses_bad_input
    (dict(out=np.zeros((2, 4), np.int16)), TypeError, "out"),
    (dict(out=np.zeros((2, 5), np.float32)), ValueError, "out"),
    (dict(eps=0.0), ValueError, "eps"),
    (dict(eps=-1e-6), ValueError, "eps"),
    (dict(eps=float("inf")), ValueError, "eps"),
    (dict(residual=np.zeros((2, 4), np.float32)), ValueError, "residual_out: required"),
    (dict(residual_out=np.zeros((2, 4), np.float32)), ValueError, "residual_out: given"),
    (dict(residual=np.zeros((2, 3), np.float32), residual_out=np.zeros((2, 4), np.float32)),
     ValueError, "residual"),
    (dict(residual=np.zeros((2, 4), np.float32), residual_out=np.zeros((2, 4), np.int32)),
     TypeError, "residual_out"),
])
def test_rms_norm_reference_validation(kw, exc, match):
    args = dict(x=np.zeros((2, 4), np.float32), weight=np.ones(4, np.float32),
                out=np.zeros((2, 4), np.float32))
    args.update(kw)
    with pytest.raises(exc, match=match):
        ref.rms_norm(args.pop("x"), args.pop("weight"), args.pop("out"), **args)


# ---------------------------------------------------------------- rope reference

def test_rope_cos_sin_cache_closed_form():
    P, D, theta = 7, 8, 500.0
    c = ref.rope_cos_sin_cache(P, D, theta)
    assert c.shape == (P, D) and c.dtype == np.float32
    np.testing.assert_array_equal(c[0], [1, 1, 1, 1, 0, 0, 0, 0])
    for p in range(P):
        for i in range(D // 2):
            a = p * theta ** (-2 * i / D)
            assert c[p, i] == np.float32(math.cos(a)) and c[p, D // 2 + i] == np.float32(math.sin(a))
    for bad in (dict(head_dim=7), dict(head_dim=0), dict(max_position=-1), dict(theta=0.0),
                dict(theta=float("nan"))):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ref.rope_cos_sin_cache(**dict(dict(max_position=P, head_dim=D, theta=theta), **bad))


def test_rope_position_zero_is_identity_and_pairs_keep_norm(rng):
    T, Hq, Hk, D = 5, 3, 1, 16
    cache = ref.rope_cos_sin_cache(64, D, 10000.0)
    q0, k0 = rng.standard_normal((T, Hq, D)), rng.standard_normal((T, Hk, D))
    q, k = q0.copy(), k0.copy()
    pos = np.array([0, 1, 17, 63, 0], np.int32)
    ref.rope(q, k, pos, cache)
    for t in (0, 4):
        np.testing.assert_array_equal(q[t], q0[t])
        np.testing.assert_array_equal(k[t], k0[t])
    h = D // 2
    for a, a0 in ((q, q0), (k, k0)):
        np.testing.assert_allclose(a[..., :h] ** 2 + a[..., h:] ** 2,
                                   a0[..., :h] ** 2 + a0[..., h:] ** 2, rtol=1e-6)
    # D = 2: one pair, angle = pos: (1, 0) -> (cos p, sin p)
    c2 = ref.rope_cos_sin_cache(10, 2, 10000.0)
    x = np.tile([[[1.0, 0.0]]], (3, 1, 1))
    ref.rope(x, None, np.array([0, 3, 9], np.int32), c2)
    np.testing.assert_allclose(x[:, 0], [[1, 0], [math.cos(3), math.sin(3)],
                                         [math.cos(9), math.sin(9)]], rtol=1e-7, atol=1e-7)


def test_rope_rotations_compose(rng):
    """rope(a) then rope(b) == rope(a + b) (rotations add), up to the cache's float32."""
    D = 32
    cache = ref.rope_cos_sin_cache(200, D, 10000.0)
    q = rng.standard_normal((1, 2, D))
    q1 = q.copy()
    ref.rope(q1, None, np.array([70], np.int32), cache)
    ref.rope(q1, None, np.array([55], np.int32), cache)
    q2 = q.copy()
    ref.rope(q2, None, np.array([125], np.int32), cache)
    np.testing.assert_allclose(q1, q2, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_rope_out_of_range_position_is_nan_row(dtype, rng):
    T, D, P = 4, 8, 10
    cache = ref.rope_cos_sin_cache(P, D, 10000.0)
    q = _store(rng.standard_normal((T, 2, D)), dtype)
    k = _store(rng.standard_normal((T, 1, D)), dtype)
    q_ok, k_ok = q.copy(), k.copy()
    ref.rope(q_ok, k_ok, np.array([9, 9, 0, 9], np.int32), cache)
    ref.rope(q, k, np.array([9, P, 0, -1], np.int32), cache)
    for t in (1, 3):
        assert np.all(np.isnan(from_host_storage(q[t], dtype)))
        assert np.all(np.isnan(from_host_storage(k[t], dtype)))
    for t in (0, 2):
        np.testing.assert_array_equal(q[t], q_ok[t])
        np.testing.assert_array_equal(k[t], k_ok[t])


@pytest.mark.parametrize("kw,exc,match", [
    (dict(q=np.zeros((2, 3, 7))), ValueError, "q: head dim"),
    (dict(q=np.zeros((2, 3, 258)), k=None, cos_sin_cache=np.zeros((4, 258), np.float32)),
     ValueError, "q: head dim"),
    (dict(k=np.zeros((3, 1, 8))), ValueError, "k"),
    (dict(k=np.zeros((2, 1, 6))), ValueError, "k"),
    (dict(k=np.zeros((2, 1, 8), np.int32)), TypeError, "k"),
    (dict(positions=np.zeros(3, np.int32)), ValueError, "positions"),
    (dict(positions=np.zeros(2, np.float32)), TypeError, "positions"),
    (dict(cos_sin_cache=np.zeros((4, 6), np.float32)), ValueError, "cos_sin_cache"),
])
def test_rope_reference_validation(kw, exc, match):
    args = dict(q=np.zeros((2, 3, 8)), k=np.zeros((2, 1, 8)), positions=np.zeros(2, np.int32),
                cos_sin_cache=np.zeros((4, 8), np.float32))
    args.update(kw)
    with pytest.raises(exc, match=match):
        ref.rope(**args)


# ---------------------------------------------------------------- silu_mul reference

def test_silu_mul_closed_form():
    g = np.array([0.0, 1.0, -1.0, 50.0, -800.0, 800.0])
    u = np.array([3.0, 2.0, 2.0, 0.5, 1.0, 1.0])
    out = np.full((1, 6), np.nan)
    with np.errstate(all="raise"):
        ref.silu_mul(np.concatenate([g, u])[None], out)
    want = [0.0, 2 / (1 + math.exp(-1)), -2 / (1 + math.e), 25.0, -0.0, 800.0]
    np.testing.assert_allclose(out[0], want, rtol=1e-15)
    with pytest.raises(ValueError, match="x: width 5"):
        ref.silu_mul(np.zeros((1, 5)), np.zeros((1, 2)))
    with pytest.raises(ValueError, match="out"):
        ref.silu_mul(np.zeros((2, 6)), np.zeros((2, 2)))
    with pytest.raises(TypeError, match="out"):
        ref.silu_mul(np.zeros((2, 6)), np.zeros((2, 3), np.int32))


# ---------------------------------------------------------------- gated_rms_norm reference

def _gated_formula(x, z, w, b, G, eps):
    """out[t, c] element by element in float64 (math, no numpy reductions): the spec written
    independently of the reference."""
    T, C = x.shape
    out = np.zeros((T, C))
    for t in range(T):
        for j in range(C // G):
            ms = sum(float(x[t, c]) ** 2 for c in range(j * G, (j + 1) * G)) / G
            r = 1.0 / math.sqrt(ms + eps)
            for c in range(j * G, (j + 1) * G):
                wc = float(w[c if len(w) == C else c % G])
                bc = 0.0 if b is None else float(b[c if len(b) == C else c % G])
                g = float(z[t, c]) + bc
                out[t, c] = float(x[t, c]) * r * wc * g / (1.0 + math.exp(-g))
    return out


@pytest.mark.parametrize("C,G", [(12, 4), (15, 5), (16, 16), (7, 1), (64, 32)])
@pytest.mark.parametrize("w_len,b_len", [("C", "C"), ("G", None), ("C", "G"), ("G", "G")])
def test_gated_rms_norm_matches_formula(C, G, w_len, b_len, rng):
    T, eps = 3, 1e-5
    x, z = rng.standard_normal((T, C)), 2 * rng.standard_normal((T, C))
    n = {"C": C, "G": G}
    w = 1 + 0.5 * rng.standard_normal(n[w_len])
    b = None if b_len is None else rng.standard_normal(n[b_len])
    out = np.full((T, C), np.nan)
    assert ref.gated_rms_norm(x, z, w, out, group_size=G, z_bias=b, eps=eps) is out
    np.testing.assert_allclose(out, _gated_formula(x, z, w, b, G, eps), rtol=1e-12, atol=1e-300)


def test_gated_rms_norm_closed_form():
    """A constant group c: x / sqrt(c^2 + eps) * w * silu(z + b) (w, b [G]: every group's);
    a zero group gives 0; a gate z + b = 0 gives 0; far gates: silu -> 0 (-0) and -> z + b,
    no warning."""
    G, eps = 4, 1e-6
    x = np.array([[2.0] * G + [0.0] * G, [-3.0] * G + [1.0, -1.0, 1.0, -1.0]])
    z = np.array([[0.5, -0.5, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0],
                  [800.0, -800.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0]])
    w = np.array([1.0, 2.0, 3.0, 4.0])
    b = np.array([0.0, 0.0, 0.0, -1.0])
    out = np.full_like(x, np.nan)
    with np.errstate(all="raise"):
        ref.gated_rms_norm(x, z, w, out, group_size=G, z_bias=b, eps=eps)
    silu = lambda g: g / (1 + math.exp(-g))  # noqa: E731
    s = 2 / math.sqrt(4 + eps)
    np.testing.assert_allclose(out[0, :4], [s * silu(0.5), s * 2 * silu(-0.5), 0.0, 0.0],
                               rtol=1e-15)
    assert np.all(out[0, 4:] == 0)
    r = -3 / math.sqrt(9 + eps)
    np.testing.assert_allclose(out[1, :4], [r * 800, -0.0, r * 3 * silu(1), r * 4 * silu(-2)],
                               rtol=1e-15)
    np.testing.assert_allclose(out[1, 4:7], 0.0)          # silu(0) = 0
    np.testing.assert_allclose(out[1, 7], -1 / math.sqrt(1 + eps) * 4 * silu(-1), rtol=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gated_rms_norm_rounds_once_and_runs_in_place(dtype, rng):
    """A 16-bit out is the float64 value rounded once; out = x (x in out's dtype) gives the
    same values in place."""
    T, C, G = 4, 24, 8
    x = _store(rng.standard_normal((T, C)), dtype)
    z = _store(rng.standard_normal((T, C)), dtype)
    w = rng.standard_normal(G).astype(np.float32)
    out = np.zeros_like(z)
    ref.gated_rms_norm(x, z, w, out, group_size=G, eps=1e-6)
    want = _gated_formula(from_host_storage(x, dtype), from_host_storage(z, dtype), w, None, G,
                          1e-6)
    np.testing.assert_array_equal(out, _store(want, dtype))
    xi = x.copy()
    ref.gated_rms_norm(xi, z, w, xi, group_size=G, eps=1e-6)
    np.testing.assert_array_equal(xi, out)


def test_gated_rms_norm_empty():
    for T, C, G in ((0, 8, 4), (3, 0, 2)):
        out = np.zeros((T, C), np.float32)
        ref.gated_rms_norm(np.zeros((T, C), np.float32), np.zeros((T, C), np.float32),
                           np.ones(C, np.float32), out, group_size=G)


# ---------------------------------------------------------------- op validation without a GPU

def test_layers_ops_exported():
    import specdec_lib
    from specdec_lib import ops
    for name in ("rms_norm", "rope", "rope_cos_sin_cache", "silu_mul", "gated_rms_norm"):
        assert getattr(specdec_lib, name) is getattr(ops, name)
        assert callable(getattr(specdec_lib.reference, name))
    assert ops.rope_cos_sin_cache is ref.rope_cos_sin_cache


@pytest.mark.parametrize("kw,exc,match", [
    (dict(x=np.zeros((3, 8), np.float32)), TypeError, "x"),
    (dict(x=_Fake((3, 8), "<f8")), TypeError, "x: dtype"),
    (dict(x=_Fake((3, 8, 1))), ValueError, "x"),
    (dict(weight=_Fake((7,))), ValueError, "weight"),
    (dict(weight=_Fake((8,), "<f2")), TypeError, "weight"),
    (dict(weight=_Fake((8,), strides=(8,))), ValueError, "weight"),
    (dict(out=_Fake((3, 8), "<f2")), TypeError, "out"),
    (dict(out=_Fake((2, 8))), ValueError, "out"),
    (dict(out=_Fake((3, 8), strides=(16, 8))), ValueError, "out: the last dimension"),
    (dict(out=_Fake((3, 8), strides=(16, 4))), ValueError, "out: rows overlap"),
    (dict(x=_Fake((3, 8), strides=(64, 8))), ValueError, "x: the last dimension"),
    (dict(eps=0.0), ValueError, "eps"),
    (dict(eps="1e-6"), ValueError, "eps"),
    (dict(residual=_Fake((3, 8))), ValueError, "residual_out: required"),
    (dict(residual_out=_Fake((3, 8))), ValueError, "residual_out: given"),
    (dict(residual=_Fake((3, 9)), residual_out=_Fake((3, 8))), ValueError, "residual"),
    (dict(residual=_Fake((3, 8), "<f2"), residual_out=_Fake((3, 8))), TypeError, "residual"),
    (dict(residual=_Fake((3, 8)), residual_out=_Fake((3, 8), "<f2")), TypeError, "residual_out"),
    (dict(residual=_Fake((3, 8)), residual_out=_Fake((3, 8), strides=(0, 4))), ValueError,
     "residual_out: rows overlap"),
    (dict(stream="default"), TypeError, "stream"),
])
def test_rms_norm_op_validation(kw, exc, match):
    from specdec_lib import ops
    args = dict(x=_Fake((3, 8)), weight=_Fake((8,)), out=_Fake((3, 8)))
    args.update(kw)
    with pytest.raises(exc, match=match):
        ops.rms_norm(args.pop("x"), args.pop("weight"), args.pop("out"), **args)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(q=_Fake((2, 3, 8), "<f8")), TypeError, "q: dtype"),
    (dict(q=_Fake((2, 24))), ValueError, "q"),
    (dict(q=_Fake((2, 3, 7)), k=None, cos_sin_cache=_Fake((5, 7))), ValueError, "q: head dim"),
    (dict(q=_Fake((2, 3, 512)), k=None, cos_sin_cache=_Fake((5, 512))), ValueError, "q: head dim"),
    (dict(q=_Fake((2, 3, 8), strides=(192, 64, 8))), ValueError, "q: the last dimension"),
    (dict(k=_Fake((2, 1, 8), "<f2")), TypeError, "k"),
    (dict(k=_Fake((3, 1, 8))), ValueError, "k"),
    (dict(k=_Fake((2, 1, 4))), ValueError, "k"),
    (dict(k=_Fake((2, 1, 8), strides=(64, 64, 8))), ValueError, "k: the last dimension"),
    (dict(positions=_Fake((2,), "<i8")), TypeError, "positions"),
    (dict(positions=_Fake((3,), "<i4")), ValueError, "positions"),
    (dict(positions=_Fake((2,), "<i4", strides=(8,))), ValueError, "positions"),
    (dict(cos_sin_cache=_Fake((5, 8), "<f2")), TypeError, "cos_sin_cache"),
    (dict(cos_sin_cache=_Fake((5, 16))), ValueError, "cos_sin_cache"),
    (dict(cos_sin_cache=_Fake((5, 8), strides=(64, 4))), ValueError, "cos_sin_cache"),
])
def test_rope_op_validation(kw, exc, match):
    from specdec_lib import ops
    args = dict(q=_Fake((2, 3, 8)), k=_Fake((2, 1, 8)), positions=_Fake((2,), "<i4"),
                cos_sin_cache=_Fake((5, 8)))
    args.update(kw)
    with pytest.raises(exc, match=match):
        ops.rope(**args)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(x=_Fake((3, 8), "<i4")), TypeError, "x: dtype"),
    (dict(x=_Fake((3, 7))), ValueError, "x: width 7"),
    (dict(x=_Fake((3, 8), strides=(64, 8))), ValueError, "x: the last dimension"),
    (dict(out=_Fake((3, 8))), ValueError, "out"),
    (dict(out=_Fake((2, 4))), ValueError, "out"),
    (dict(out=_Fake((3, 4), "<f2")), TypeError, "out"),
    (dict(out=_Fake((3, 4), strides=(8, 4))), ValueError, "out: rows overlap"),
])
def test_silu_mul_op_validation(kw, exc, match):
    from specdec_lib import ops
    args = dict(x=_Fake((3, 8)), out=_Fake((3, 4)))
    args.update(kw)
    with pytest.raises(exc, match=match):
        ops.silu_mul(**args)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(x=np.zeros((3, 8), np.float32)), TypeError, "x"),
    (dict(x=_Fake((3, 8), "<f8")), TypeError, "x: dtype"),
    (dict(x=_Fake((3, 8), "<f2")), TypeError, "x: dtype must be float32 or bfloat16"),
    (dict(x=_Fake((3, 8, 1))), ValueError, "x"),
    (dict(z=_Fake((3, 8))), TypeError, "out: dtype"),
    (dict(z=_Fake((3, 9), "<V2")), ValueError, "z: expected shape"),
    (dict(out=_Fake((3, 8))), TypeError, "out: dtype"),
    (dict(out=_Fake((2, 8), "<V2")), ValueError, "out"),
    (dict(group_size=3), ValueError, "group_size: 3 must be >= 1 and divide"),
    (dict(group_size=0), ValueError, "group_size"),
    (dict(group_size=4.0), TypeError, "group_size"),
    (dict(group_size=True), TypeError, "group_size"),
    (dict(weight=_Fake((6,))), ValueError, r"weight: expected shape \[8\] or \[4\]"),
    (dict(weight=_Fake((8,), "<f2")), TypeError, "weight: dtype"),
    (dict(weight=_Fake((8,), strides=(8,))), ValueError, "weight: must be C-contiguous"),
    (dict(z_bias=_Fake((8,), "<V2")), TypeError, "z_bias: dtype"),
    (dict(z_bias=_Fake((2,))), ValueError, "z_bias: expected shape"),
    (dict(eps=0.0), ValueError, "eps"),
    (dict(x=_Fake((3, 8), strides=(64, 8))), ValueError, "x: the last dimension"),
    (dict(z=_Fake((3, 8), "<V2", strides=(32, 4))), ValueError, "z: the last dimension"),
    (dict(out=_Fake((3, 8), "<V2", strides=(4, 2))), ValueError, "out: rows overlap"),
    (dict(), ValueError, "out: overlaps x"),       # every fake array sits at address 0
])
def test_gated_rms_norm_op_validation(kw, exc, match):
    from specdec_lib import ops
    args = dict(x=_Fake((3, 8)), z=_Fake((3, 8), "<V2"), weight=_Fake((8,)),
                out=_Fake((3, 8), "<V2"), group_size=4, z_bias=_Fake((4,)))
    args.update(kw)
    with pytest.raises(exc, match=match):
        ops.gated_rms_norm(args.pop("x"), args.pop("z"), args.pop("weight"), args.pop("out"),
                           **args)


def test_layers_ops_empty_batch_needs_no_gpu():
    """T = 0 is a valid no-op: validated, nothing launched (so it runs without a driver)."""
    from specdec_lib import ops
    out = _Fake((0, 8))
    assert ops.rms_norm(_Fake((0, 8)), _Fake((8,)), out) is out
    assert ops.rms_norm(_Fake((0, 8)), _Fake((8,)), out, residual=_Fake((0, 8)),
                        residual_out=_Fake((0, 8))) is out
    q = _Fake((0, 3, 8))
    assert ops.rope(q, None, _Fake((0,), "<i4"), _Fake((4, 8)))[0] is q
    o2 = _Fake((0, 4))
    assert ops.silu_mul(_Fake((0, 8)), o2) is o2
    o3 = _Fake((0, 64), "<V2")
    assert ops.gated_rms_norm(_Fake((0, 64)), _Fake((0, 64), "<V2"), _Fake((64,)), o3,
                              group_size=16, z_bias=_Fake((16,))) is o3


# ------------------------------------------------------------------------------ GPU

RMS_DTYPES = [("float32", "float32"), ("float16", "float16"), ("float16", "float32"),
              ("bfloat16", "bfloat16"), ("bfloat16", "float32")]


def _rand(rng, shape, dtype, scale=1.0):
    """Random values as dtype holds them (float64)."""
    return round_to(scale * rng.standard_normal(shape), dtype)


def _dev(a, dtype):
    from specdec_lib import DeviceArray
    return DeviceArray.from_numpy(_store(a, dtype), dtype)


def _host(d, dtype):
    return from_host_storage(d.to_numpy(), dtype)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _rms_case(rng, T, H, dtype, wdtype):
    x, r = _rand(rng, (T, H), dtype), _rand(rng, (T, H), dtype)
    w = round_to(1.0 + 0.5 * rng.standard_normal(H), wdtype)
    return x, r, w


def _rms_want(x, r, w, dtype, eps=1e-6, unit_offset=False):
    """(s as dtype holds it, out in float64) from the reference."""
    if r is not None:
        xs, rs, s = _store(x, dtype), _store(r, dtype), np.zeros(x.shape, HOST[dtype])
        ref.rms_norm(xs, w, np.zeros_like(s), residual=rs, residual_out=s, eps=eps)
        s = from_host_storage(s, dtype)
    else:
        s = x
    want = np.zeros(x.shape)
    ref.rms_norm(s, w, want, eps=eps, unit_offset=unit_offset)
    return s, want


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype", RMS_DTYPES)
@pytest.mark.parametrize("H", [576, 64, 1000, 4096])
@pytest.mark.parametrize("T", [0, 1, 7, 130])
@pytest.mark.parametrize("fused", [False, True])
def test_rms_norm_gpu(dtype, wdtype, H, T, fused, rng):
    from specdec_lib import ops
    x, r, w = _rms_case(rng, T, H, dtype, wdtype)
    s_want, want = _rms_want(x, r if fused else None, w, dtype)
    out = poison((T, H), dtype)
    if fused:
        s = poison((T, H), dtype)
        ops.rms_norm(_dev(x, dtype), _dev(w, wdtype), out, residual=_dev(r, dtype), residual_out=s)
        np.testing.assert_array_equal(_host(s, dtype), s_want)     # the add: exact
    else:
        ops.rms_norm(_dev(x, dtype), _dev(w, wdtype), out)
    assert rel_err(_host(out, dtype), want) < TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype", RMS_DTYPES)
@pytest.mark.parametrize("H", [64, 1000, 16384, 20000, 40000])
def test_rms_norm_gpu_fused_equals_unfused_bits(dtype, wdtype, H, rng):
    """Fused residual + norm gives the same bits as the unfused add then norm; in place
    (out is x, residual_out is residual) too. H = 20000 (f32) and 40000 rows pass the register
    cache (the kernel re-reads what it stored to residual_out)."""
    from specdec_lib import ops
    T = 5
    x, r, w = _rms_case(rng, T, H, dtype, wdtype)
    s_want, want = _rms_want(x, r, w, dtype, eps=1e-5, unit_offset=True)
    dw = _dev(w, wdtype)
    out, s = poison((T, H), dtype), poison((T, H), dtype)
    ops.rms_norm(_dev(x, dtype), dw, out, residual=_dev(r, dtype), residual_out=s, eps=1e-5,
                 unit_offset=True)
    two = poison((T, H), dtype)
    ops.rms_norm(_dev(s_want, dtype), dw, two, eps=1e-5, unit_offset=True)
    np.testing.assert_array_equal(_bits(out.to_numpy()), _bits(two.to_numpy()))
    np.testing.assert_array_equal(_host(s, dtype), s_want)
    xi, ri = _dev(x, dtype), _dev(r, dtype)
    ops.rms_norm(xi, dw, xi, residual=ri, residual_out=ri, eps=1e-5, unit_offset=True)
    np.testing.assert_array_equal(_bits(xi.to_numpy()), _bits(out.to_numpy()))
    np.testing.assert_array_equal(_bits(ri.to_numpy()), _bits(s.to_numpy()))
    assert rel_err(_host(out, dtype), want) < TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype", RMS_DTYPES)
@pytest.mark.parametrize("H", [576, 1000, 4096])
def test_rms_norm_gpu_row_invariance(dtype, wdtype, H, rng):
    """Row r's bits are the same computed alone (T = 1) and inside a T = 130 call, fused or
    not, and whether its row starts 16-byte aligned (vector loads) or not (scalar loads)."""
    from specdec_lib import DeviceArray, ops
    T = 130
    x, r, w = _rms_case(rng, T, H, dtype, wdtype)
    dw = _dev(w, wdtype)
    for fused in (False, True):
        kw = {}
        out = poison((T, H), dtype)
        if fused:
            kw = dict(residual=_dev(r, dtype), residual_out=poison((T, H), dtype))
        ops.rms_norm(_dev(x, dtype), dw, out, **kw)
        full = out.to_numpy()
        for row in (0, 57, 129):
            one = poison((1, H), dtype)
            kw1 = {}
            if fused:
                kw1 = dict(residual=_dev(r[row:row + 1], dtype), residual_out=poison((1, H), dtype))
            ops.rms_norm(_dev(x[row:row + 1], dtype), dw, one, **kw1)
            np.testing.assert_array_equal(_bits(one.to_numpy()[0]), _bits(full[row]))
        # the same row one element into a buffer: unaligned, the scalar path
        base = DeviceArray.from_numpy(_store(np.concatenate([[0.0], x[57]]), dtype), dtype)
        xv = _View(base, (1, H), (H + 1, 1), offset=1)
        obase = poison((H + 1,), dtype)
        ov = _View(obase, (1, H), (H + 1, 1), offset=1)
        if fused:
            rbase = DeviceArray.from_numpy(_store(np.concatenate([[0.0], r[57]]), dtype), dtype)
            rv = _View(rbase, (1, H), (H + 1, 1), offset=1)
            kw1 = dict(residual=rv, residual_out=rv)                     # in place, too
        else:
            kw1 = {}
        ops.rms_norm(xv, dw, ov, **kw1)
        np.testing.assert_array_equal(_bits(ov.np_view(obase.to_numpy())[0]), _bits(full[57]))


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype", [("float32", "float32"), ("float16", "float32"),
                                          ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("offset", [0, 8, 3])
def test_rms_norm_gpu_strided_views(dtype, wdtype, offset, rng):
    """x, residual, out, residual_out as rows of wider buffers (offset 8: aligned, vector
    path; 3: scalar path); padding between rows stays untouched."""
    from specdec_lib import DeviceArray, ops
    T, H, S = 7, 576, 640
    x, r, w = _rms_case(rng, T, H, dtype, wdtype)
    s_want, want = _rms_want(x, r, w, dtype)

    def view(a):
        buf = np.zeros(T * S + offset)
        buf[offset:].reshape(T, S)[:, :H] = a
        base = DeviceArray.from_numpy(_store(buf, dtype), dtype)
        return base, _View(base, (T, H), (S, 1), offset)
    xb, xv = view(x)
    rb, rv = view(r)
    ob = poison((T * S + offset,), dtype)
    ov = _View(ob, (T, H), (S, 1), offset)
    sb = poison((T * S + offset,), dtype)
    sv = _View(sb, (T, H), (S, 1), offset)
    ops.rms_norm(xv, _dev(w, wdtype), ov, residual=rv, residual_out=sv)
    got_o, got_s = ob.to_numpy(), sb.to_numpy()
    np.testing.assert_array_equal(from_host_storage(sv.np_view(got_s), dtype), s_want)
    assert rel_err(from_host_storage(ov.np_view(got_o), dtype), want) < TOL[dtype]
    pad = np.ones(T * S + offset, bool)
    pad[offset:].reshape(T, S)[:, :H] = False
    assert np.all(got_o.view(np.uint8).reshape(got_o.size, -1)[pad] == 0xFF)   # untouched


@needs_gpu
def test_rms_norm_gpu_nan_row_stays_in_its_row(rng):
    from specdec_lib import ops
    T, H = 6, 1000
    x, _, w = _rms_case(rng, T, H, "bfloat16", "bfloat16")
    x[3, 5] = np.nan
    out = poison((T, H), "bfloat16")
    ops.rms_norm(_dev(x, "bfloat16"), _dev(w, "bfloat16"), out)
    got = _host(out, "bfloat16")
    assert np.all(np.isnan(got[3]))
    ok = np.arange(T) != 3
    _, want = _rms_want(x[ok], None, w, "bfloat16")
    assert rel_err(got[ok], want) < TOL["bfloat16"]


def _rope_inputs(rng, T, Hq, Hk, D, dtype, P):
    q, k = _rand(rng, (T, Hq, D), dtype), _rand(rng, (T, Hk, D), dtype)
    pos = rng.integers(0, P, T).astype(np.int32)
    if T >= 3:
        pos[:3] = [P - 1, P - 2, 0]          # the cache's last rows
    return q, k, pos


def _rope_want(q, k, pos, cache):
    qw, kw = q.copy(), (None if k is None else k.copy())
    ref.rope(qw, kw, pos, cache)
    return qw, kw


ROPE_SHAPES = [(9, 3, 64), (32, 8, 128), (4, 0, 256), (2, 1, 6), (1, 1, 2)]


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("Hq,Hk,D", ROPE_SHAPES)
@pytest.mark.parametrize("T", [0, 1, 7, 130])
def test_rope_gpu(dtype, Hq, Hk, D, T, rng):
    """Contiguous q and k (k None when Hk = 0); D = 6 and 2 take the scalar path."""
    from specdec_lib import DeviceArray, ops
    P = 4096
    cache = ref.rope_cos_sin_cache(P, D, 10000.0)
    q, k, pos = _rope_inputs(rng, T, Hq, Hk, D, dtype, P)
    k = k if Hk else None
    qw, kw = _rope_want(q, k, pos, cache)
    dq = _dev(q, dtype)
    dk = _dev(k, dtype) if k is not None else None
    ops.rope(dq, dk, DeviceArray.from_numpy(pos), DeviceArray.from_numpy(cache))
    assert rel_err(_host(dq, dtype), qw) < TOL[dtype]
    if k is not None:
        assert rel_err(_host(dk, dtype), kw) < TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("Hq,Hk,D", [(9, 3, 64), (32, 8, 128)])
@pytest.mark.parametrize("offset", [0, 1])
def test_rope_gpu_qkv_views_and_bad_positions(dtype, Hq, Hk, D, offset, rng):
    """q and k as head views of one fused qkv buffer [T, (Hq + 2 Hk) D] (+ padding; offset 1:
    unaligned, the scalar path); v stays untouched; positions P and -1 give NaN tokens, the
    others are right and row-invariant (same bits as a T = 1 call)."""
    from specdec_lib import DeviceArray, ops
    T, P = 130, 257
    cache = ref.rope_cos_sin_cache(P, D, 500000.0)
    q, k, pos = _rope_inputs(rng, T, Hq, Hk, D, dtype, P)
    pos[40], pos[77] = P, -1
    W = (Hq + 2 * Hk) * D + 8
    qkv = _rand(rng, (T, W), dtype)
    qkv[:, :Hq * D] = q.reshape(T, -1)
    qkv[:, Hq * D:(Hq + Hk) * D] = k.reshape(T, -1)
    flat = np.concatenate([np.zeros(offset), qkv.reshape(-1)])
    base = DeviceArray.from_numpy(_store(flat, dtype), dtype)
    qv = _View(base, (T, Hq, D), (W, D, 1), offset)
    kv = _View(base, (T, Hk, D), (W, D, 1), offset + Hq * D)
    ops.rope(qv, kv, DeviceArray.from_numpy(pos), DeviceArray.from_numpy(cache))
    got = from_host_storage(base.to_numpy(), dtype)[offset:].reshape(T, W)
    bad = np.zeros(T, bool)
    bad[[40, 77]] = True
    assert np.all(np.isnan(got[bad, :(Hq + Hk) * D]))
    np.testing.assert_array_equal(got[:, (Hq + Hk) * D:], qkv[:, (Hq + Hk) * D:])   # v, padding
    ok = ~bad
    qw, kw = _rope_want(q[ok], k[ok], pos[ok], cache)
    assert rel_err(got[ok, :Hq * D].reshape(-1, Hq, D), qw) < TOL[dtype]
    assert rel_err(got[ok, Hq * D:(Hq + Hk) * D].reshape(-1, Hk, D), kw) < TOL[dtype]
    # row invariance: token 5 alone
    q1, k1 = _dev(q[5:6], dtype), _dev(k[5:6], dtype)
    ops.rope(q1, k1, DeviceArray.from_numpy(pos[5:6]), DeviceArray.from_numpy(cache))
    raw = base.to_numpy()[offset:].reshape(T, W)
    np.testing.assert_array_equal(_bits(q1.to_numpy().reshape(-1)), _bits(raw[5, :Hq * D]))
    np.testing.assert_array_equal(_bits(k1.to_numpy().reshape(-1)),
                                  _bits(raw[5, Hq * D:(Hq + Hk) * D]))


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("I", [1536, 64, 1000, 4096, 7])
@pytest.mark.parametrize("T", [0, 1, 7, 130])
def test_silu_mul_gpu(dtype, I, T, rng):
    from specdec_lib import ops
    x = _rand(rng, (T, 2 * I), dtype, scale=3.0)
    want = np.zeros((T, I))
    ref.silu_mul(x, want)
    out = poison((T, I), dtype)
    ops.silu_mul(_dev(x, dtype), out)
    assert rel_err(_host(out, dtype), want) < TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("offset", [0, 8, 1])
def test_silu_mul_gpu_views_and_extremes(dtype, offset, rng):
    """x as rows of a wider buffer (offset 1: scalar path), out a view too; gates far in
    both tails (exp overflows / underflows), zeros and a NaN: accurate and never a fault."""
    from specdec_lib import DeviceArray, ops
    T, I, S = 9, 1536, 2 * 1536 + 24
    x = _rand(rng, (T, 2 * I), dtype, scale=3.0)
    hi = {"float32": 200.0, "float16": 60000.0, "bfloat16": 1e30}[dtype]
    x[0, :6] = round_to(np.array([0.0, -0.0, 88.0, -88.0, hi, -hi]), dtype)
    x[0, I:I + 6] = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5]       # up: silu(hi) * up stays finite
    x[1, :3] = round_to(np.array([20.0, -20.0, -87.5]), dtype)
    x[2, 10] = np.nan
    want = np.zeros((T, I))
    ref.silu_mul(x, want)
    flat = np.zeros(T * S + offset)
    flat[offset:].reshape(T, S)[:, :2 * I] = x
    base = DeviceArray.from_numpy(_store(flat, dtype), dtype)
    ob = poison((T * (I + 8) + offset,), dtype)
    ov = _View(ob, (T, I), (I + 8, 1), offset)
    ops.silu_mul(_View(base, (T, 2 * I), (S, 1), offset), ov)
    got = from_host_storage(ov.np_view(ob.to_numpy()), dtype)
    assert np.isnan(got[2, 10]) and np.isfinite(np.delete(got.reshape(-1), 2 * I + 10)).all()
    assert rel_err(got, want) < TOL[dtype]
    # elementwise in the tails too (atol: float16 results below its subnormal spacing)
    np.testing.assert_allclose(got[:2, :6], want[:2, :6], rtol=TOL[dtype], atol=1e-7)


@needs_gpu
def test_layers_ops_reject_before_launch(rng):
    """Bad arguments on real device arrays raise before any launch: outputs untouched."""
    from specdec_lib import DeviceArray, ops
    T, H = 4, 64
    x = _dev(_rand(rng, (T, H), "float16"), "float16")
    w = _dev(np.ones(H), "float16")
    out = poison((T, H), "float16")
    s = poison((T, H), "float16")
    for kw, exc, match in [
        (dict(weight=_dev(np.ones(H), "bfloat16")), TypeError, "weight"),
        (dict(weight=_dev(np.ones(H - 1), "float16")), ValueError, "weight"),
        (dict(residual=x), ValueError, "residual_out"),
        (dict(residual=_dev(np.ones((T, H)), "float32"), residual_out=s), TypeError, "residual"),
        (dict(eps=0.0), ValueError, "eps"),
    ]:
        args = dict(x=x, weight=w, out=out)
        args.update(kw)
        with pytest.raises(exc, match=match):
            ops.rms_norm(args.pop("x"), args.pop("weight"), args.pop("out"), **args)
    assert np.all(out.to_numpy().view(np.uint16) == 0xFFFF)
    assert np.all(s.to_numpy().view(np.uint16) == 0xFFFF)
    q = poison((T, 2, H), "bfloat16")
    cache = DeviceArray.from_numpy(ref.rope_cos_sin_cache(8, H, 10000.0))
    with pytest.raises(ValueError, match="cos_sin_cache"):
        ops.rope(q, None, DeviceArray.from_numpy(np.zeros(T, np.int32)),
                 DeviceArray.from_numpy(ref.rope_cos_sin_cache(8, 2 * H, 10000.0)))
    with pytest.raises(TypeError, match="positions"):
        ops.rope(q, None, DeviceArray.from_numpy(np.zeros(T, np.int64)), cache)
    assert np.all(q.to_numpy() == 0xFFFF)
    o32, wide = poison((T, H // 2), "float32"), poison((T, H), "float16")
    with pytest.raises(TypeError, match="out"):
        ops.silu_mul(x, o32)
    with pytest.raises(ValueError, match="out"):
        ops.silu_mul(x, wide)
    assert np.all(o32.to_numpy().view(np.uint32) == 0xFFFFFFFF)
    assert np.all(wide.to_numpy().view(np.uint16) == 0xFFFF)


# ------------------------------------------------------------------------ gated_rms_norm GPU
# (out / z, x, weight / z_bias) dtypes: every instantiated kernel (GATED_NORM_DTYPES)
GATED_DTYPES = [tuple(canonical(d) for d in kernel) for kernel in GATED_NORM_DTYPES]
# (C, G): SmolLM2 hybrid, Qwen3-Next, odd (scalar units), 4 lanes a group, G = 1 (32 groups a
# warp), two units a lane in registers, G > 256 (units read twice; 257: odd and scalar too)
GATED_SHAPES = [(576, 64), (4096, 128), (15, 5), (256, 16), (40, 1), (1024, 256), (640, 320),
                (514, 257)]


def _gated_inputs(rng, T, C, G, dt, xdt, wdt, w_len="C", b_len="C"):
    """(x, z, weight, z_bias) as their dtypes hold them (float64), z_bias None for b_len None."""
    n = {"C": C, "G": G}
    x = _rand(rng, (T, C), xdt)
    z = _rand(rng, (T, C), dt, scale=2.0)
    w = round_to(1.0 + 0.5 * rng.standard_normal(n[w_len]), wdt)
    b = None if b_len is None else _rand(rng, (n[b_len],), wdt)
    return x, z, w, b


def _gated_want(x, z, w, b, G, eps=1e-6):
    want = np.zeros(x.shape)
    ref.gated_rms_norm(x, z, w, want, group_size=G, z_bias=b, eps=eps)
    return want


def _gated_gpu(x, z, w, b, G, dt, xdt, wdt, eps=1e-6, out=None):
    from specdec_lib import ops
    out = poison(z.shape, dt) if out is None else out
    ops.gated_rms_norm(_dev(x, xdt), _dev(z, dt), _dev(w, wdt), out, group_size=G,
                       z_bias=None if b is None else _dev(b, wdt), eps=eps)
    return out


@needs_gpu
@pytest.mark.parametrize("dt,xdt,wdt", GATED_DTYPES)
@pytest.mark.parametrize("C,G", GATED_SHAPES)
@pytest.mark.parametrize("T", [0, 1, 4, 257])
def test_gated_rms_norm_gpu(dt, xdt, wdt, C, G, T, rng):
    """Every kernel over the edge shapes, weight and z_bias [C], against the float64
    reference by relative norm; out poisoned first (T = 0: nothing written)."""
    x, z, w, b = _gated_inputs(rng, T, C, G, dt, xdt, wdt)
    out = _gated_gpu(x, z, w, b, G, dt, xdt, wdt)
    if T == 0:
        return
    assert rel_err(_host(out, dt), _gated_want(x, z, w, b, G)) < TOL[dt]


@needs_gpu
@pytest.mark.parametrize("dt,xdt,wdt", [("bfloat16", "float32", "float32"),
                                        ("float16", "float16", "float16"),
                                        ("float32", "float32", "float32"),
                                        ("bfloat16", "bfloat16", "bfloat16")])
@pytest.mark.parametrize("w_len,b_len", [("G", "G"), ("G", None), ("C", None), ("C", "G"),
                                         ("G", "C")])
@pytest.mark.parametrize("C,G", [(4096, 128), (640, 320), (15, 5), (576, 64)])
def test_gated_rms_norm_gpu_weight_forms(dt, xdt, wdt, w_len, b_len, C, G, rng):
    """weight [G] (shared by every group) or [C], z_bias [G], [C] or None."""
    T = 5
    x, z, w, b = _gated_inputs(rng, T, C, G, dt, xdt, wdt, w_len, b_len)
    out = _gated_gpu(x, z, w, b, G, dt, xdt, wdt, eps=1e-5)
    assert rel_err(_host(out, dt), _gated_want(x, z, w, b, G, eps=1e-5)) < TOL[dt]


@needs_gpu
@pytest.mark.parametrize("dt,xdt,wdt", GATED_DTYPES)
@pytest.mark.parametrize("C,G", [(576, 64), (4096, 128), (640, 320), (15, 5)])
@pytest.mark.parametrize("offset", [0, 1])
def test_gated_rms_norm_gpu_strided_views(dt, xdt, wdt, C, G, offset, rng):
    """x, z and out as rows of wider buffers (the hybrid's z: a column slice of the
    projection's rows, row stride 4C + 18); offset 1 puts every row off its 16-byte
    alignment (the scalar units): the same bits as the contiguous call; the padding around
    out's rows untouched."""
    from specdec_lib import DeviceArray
    T = 6
    x, z, w, b = _gated_inputs(rng, T, C, G, dt, xdt, wdt)
    want = _gated_gpu(x, z, w, b, G, dt, xdt, wdt).to_numpy()

    def view(a, dtype, S, col):
        buf = np.zeros(T * S + offset)
        buf[offset:].reshape(T, S)[:, col:col + C] = a
        base = DeviceArray.from_numpy(_store(buf, dtype), dtype)
        return base, _View(base, (T, C), (S, 1), offset + col)
    _, xv = view(x, xdt, C + 8, 0)
    _, zv = view(z, dt, 4 * C + 18, 3 * C)
    S = C + 24
    ob = poison((T * S + offset,), dt)
    ov = _View(ob, (T, C), (S, 1), offset + 8)
    from specdec_lib import ops
    ops.gated_rms_norm(xv, zv, _dev(w, wdt), ov, group_size=G, z_bias=_dev(b, wdt))
    got = ob.to_numpy()
    np.testing.assert_array_equal(_bits(ov.np_view(got)), _bits(want))
    inside = np.zeros(T * S + offset, bool)
    for t in range(T):
        inside[offset + 8 + t * S:offset + 8 + t * S + C] = True
    assert np.all(got.view(np.uint8).reshape(got.size, -1)[~inside] == 0xFF)   # untouched


@needs_gpu
@pytest.mark.parametrize("dt,wdt", [("float32", "float32"), ("float16", "float32"),
                                    ("bfloat16", "bfloat16"), ("bfloat16", "float32")])
@pytest.mark.parametrize("C,G", [(4096, 128), (640, 320), (15, 5)])
def test_gated_rms_norm_gpu_in_place(dt, wdt, C, G, rng):
    """out = x (x in out's dtype): the bits of the out-of-place call."""
    T = 7
    x, z, w, b = _gated_inputs(rng, T, C, G, dt, dt, wdt, "G", "C")
    want = _gated_gpu(x, z, w, b, G, dt, dt, wdt).to_numpy()
    from specdec_lib import ops
    xi = _dev(x, dt)
    ops.gated_rms_norm(xi, _dev(z, dt), _dev(w, wdt), xi, group_size=G, z_bias=_dev(b, wdt))
    np.testing.assert_array_equal(_bits(xi.to_numpy()), _bits(want))


@needs_gpu
@pytest.mark.parametrize("dt,xdt,wdt", [("bfloat16", "float32", "float32"),
                                        ("float16", "float16", "float32")])
@pytest.mark.parametrize("C,G", [(576, 64), (4096, 128), (640, 320)])
def test_gated_rms_norm_gpu_row_invariance(dt, xdt, wdt, C, G, rng):
    """A row's bits are the same alone (T = 1) as inside a T = 257 call."""
    T = 257
    x, z, w, b = _gated_inputs(rng, T, C, G, dt, xdt, wdt)
    full = _gated_gpu(x, z, w, b, G, dt, xdt, wdt).to_numpy()
    for row in (0, 100, 256):
        one = _gated_gpu(x[row:row + 1], z[row:row + 1], w, b, G, dt, xdt, wdt).to_numpy()
        np.testing.assert_array_equal(_bits(one[0]), _bits(full[row]))


@needs_gpu
@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_gated_rms_norm_gpu_extremes_and_nan(dt, rng):
    """Gates far in both tails (silu -> -0 and -> z; exp(88) near float32's top, silu(-60) ~
    -5e-25 and normal), a zero group (x * rsqrt(eps) = 0) and a NaN: the NaN stays in its
    group of its row, the rest is accurate."""
    T, C, G = 5, 512, 128
    x, z, w, b = _gated_inputs(rng, T, C, G, dt, "float32", "float32")
    hi = {"float32": 200.0, "bfloat16": 1e30}[dt]
    z[0, :4] = round_to(np.array([hi, -hi, 88.0, -60.0]), dt)
    b[:4] = 0.0
    x[1, G:2 * G] = 0.0
    x[2, 3 * G + 7] = np.nan
    out = _host(_gated_gpu(x, z, w, b, G, dt, "float32", "float32"), dt)
    ok = np.ones((T, C), bool)
    ok[2, 3 * G:] = False                 # the NaN's group (the last of row 2)
    assert np.all(np.isnan(out[~ok])) and np.all(np.isfinite(out[ok]))
    want = _gated_want(x, z, w, b, G)
    assert rel_err(out[ok], want[ok]) < TOL[dt]
    np.testing.assert_allclose(out[0, [0, 2, 3]], want[0, [0, 2, 3]], rtol=TOL[dt], atol=0)
    assert abs(out[0, 1]) < 1e-30          # silu(-hi): -0 (the reference's is a float64 tiny)
    assert np.all(out[1, G:2 * G] == 0)


@needs_gpu
def test_gated_rms_norm_gpu_rejects_before_launch(rng):
    """Bad arguments on real device arrays raise before any launch: out untouched."""
    from specdec_lib import ops
    T, C, G = 4, 256, 64
    x, z, w, b = _gated_inputs(rng, T, C, G, "bfloat16", "float32", "float32")
    dx, dz, dw, db = _dev(x, "float32"), _dev(z, "bfloat16"), _dev(w, "float32"), _dev(b, "float32")
    out = poison((T, C), "bfloat16")
    for kw, exc, match in [
        (dict(group_size=48), ValueError, "group_size"),
        (dict(weight=_dev(w[:G - 1], "float32")), ValueError, "weight"),
        (dict(z_bias=_dev(b, "bfloat16")), TypeError, "z_bias"),
        (dict(x=_dev(x, "float16")), TypeError, "x: dtype"),
        (dict(z=out), ValueError, "out: overlaps z"),
        (dict(weight=_View(out, (C,), (1,), 0), z_bias=None), ValueError, "out: overlaps weight"),
        (dict(eps=-1.0), ValueError, "eps"),
    ]:
        args = dict(x=dx, z=dz, weight=dw, out=out, group_size=G, z_bias=db)
        args.update(kw)
        with pytest.raises(exc, match=match):
            ops.gated_rms_norm(args.pop("x"), args.pop("z"), args.pop("weight"), args.pop("out"),
                               **args)
    assert np.all(out.to_numpy().view(np.uint16) == 0xFFFF)


# ---------------------------------------------------------------- the argument contract (CPU)
# Bad inputs on the reference path and the eager torch path (test_draft.run_refusal): the
# named error, the outputs untouched; dtype-exactness cases on the torch path only.
from conftest import REFUSAL_PATHS, call_op, on_path, strided_last  # noqa: E402
from test_draft import (TORCH, _cast, _dense, _host as _as_f64, _new_like,  # noqa: E402
                        _rows_overlap, _vals, run_good, run_refusal)

# ------------------------------------------------------------ rms_norm
_RMS_ORDER = ("x", "weight", "out")
_RMS_BF16 = {"x": "bfloat16", "out": "bfloat16", "residual": "bfloat16", "residual_out": "bfloat16"}


def _rms_call(fused=False):
    r = np.random.default_rng(4)
    call = {"x": r.standard_normal((3, 8)).astype(np.float32),
            "weight": r.standard_normal(8).astype(np.float32),
            "out": np.full((3, 8), 7.0, np.float32), "eps": 1e-5}
    if fused:
        call.update(residual=r.standard_normal((3, 8)).astype(np.float32),
                    residual_out=np.full((3, 8), 7.0, np.float32))
    return call


_RMS_BAD = [
    # (case id, fused, paths, mutate(args, path), exception, message start)
    ("out_fp16_for_bf16_x", False, TORCH, lambda a, p: a.update(out=_cast(p, a["out"], "float16")),
     TypeError, r"^out: dtype"),
    ("x_float64", False, TORCH, lambda a, p: a.update(x=_cast(p, a["x"], "float64")),
     TypeError, r"^x: dtype"),
    ("weight_fp16_for_bf16_x", False, TORCH, lambda a, p: a.update(weight=_cast(p, a["weight"], "float16")),
     TypeError, r"^weight: dtype"),
    ("residual_out_float32_for_bf16", True, TORCH,
     lambda a, p: a.update(residual_out=_cast(p, a["residual_out"], "float32")),
     TypeError, r"^residual_out: dtype"),
    ("x_int32", False, REFUSAL_PATHS, lambda a, p: a.update(x=_cast(p, a["x"], "int32")),
     TypeError, r"^x: dtype"),
    ("weight_int32", False, REFUSAL_PATHS, lambda a, p: a.update(weight=_cast(p, a["weight"], "int32")),
     TypeError, r"^weight: dtype"),
    ("x_1d", False, REFUSAL_PATHS, lambda a, p: a.update(x=a["x"][0]), ValueError, r"^x: expected 2"),
    ("weight_short", False, REFUSAL_PATHS, lambda a, p: a.update(weight=a["weight"][:7]),
     ValueError, r"^weight: expected shape \[8\]"),
    ("out_wrong_rows", False, REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:2]),
     ValueError, r"^out: expected shape \[3, 8\]"),
    ("x_last_dim_strided", False, REFUSAL_PATHS, lambda a, p: a.update(x=strided_last(a["x"])),
     ValueError, r"^x: the last dimension must be contiguous"),
    ("weight_strided", False, REFUSAL_PATHS, lambda a, p: a.update(weight=strided_last(a["weight"])),
     ValueError, r"^weight: must be C-contiguous"),
    ("out_rows_overlap", False, REFUSAL_PATHS, lambda a, p: a.update(out=_rows_overlap(a["out"])),
     ValueError, r"^out: rows overlap"),
    ("eps_zero", False, REFUSAL_PATHS, lambda a, p: a.update(eps=0.0), ValueError, r"^eps"),
    ("eps_inf", False, REFUSAL_PATHS, lambda a, p: a.update(eps=float("inf")), ValueError, r"^eps"),
    ("residual_without_residual_out", True, REFUSAL_PATHS, lambda a, p: a.pop("residual_out"),
     ValueError, r"^residual_out: required with residual"),
    ("residual_out_without_residual", True, REFUSAL_PATHS, lambda a, p: a.pop("residual"),
     ValueError, r"^residual_out: given without residual"),
    ("residual_wrong_shape", True, REFUSAL_PATHS, lambda a, p: a.update(residual=a["residual"][:, :4]),
     ValueError, r"^residual: expected shape"),
    ("residual_out_rows_overlap", True, REFUSAL_PATHS,
     lambda a, p: a.update(residual_out=_rows_overlap(a["residual_out"])),
     ValueError, r"^residual_out: rows overlap"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _RMS_BAD, ids=[c[0] for c in _RMS_BAD])
def test_rms_norm_refuses_bad_input(path, case):
    name, fused, *rest = case
    run_refusal("rms_norm", path, (name, *rest), _rms_call(fused), _RMS_ORDER,
                ("out", "residual_out"), _RMS_BF16)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("fused", [False, True])
def test_rms_norm_good_input_passes_the_contract(path, fused):
    args = run_good("rms_norm", path, _rms_call(fused), _RMS_ORDER, _RMS_BF16)
    c = _rms_call(fused)
    s = c["x"] + c["residual"] if fused else c["x"]
    want = s / np.sqrt((s.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * c["weight"]
    assert rel_err(_as_f64(args["out"]), want) < (1e-2 if path == "torch" else 1e-6)


def test_rms_norm_reference_takes_uint16_as_bfloat16():
    """numpy has no bfloat16: the reference's uint16 arrays are bf16 bits (dtype kind float)."""
    x = _store(np.linspace(-2, 2, 16).reshape(2, 8), "bfloat16")
    out = np.zeros_like(x)
    ref.rms_norm(x, np.ones(8, np.float32), out)
    assert out.dtype == np.uint16 and np.all(np.isfinite(from_host_storage(out, "bfloat16")))
    with pytest.raises(TypeError, match="^x: dtype"):
        ref.rms_norm(x.astype(np.int16), np.ones(8, np.float32), np.zeros((2, 8), np.int16))


# ------------------------------------------------------------ rope
_ROPE_ORDER = ("q", "k", "positions", "cos_sin_cache")
_ROPE_BF16 = {"q": "bfloat16", "k": "bfloat16"}


def _rope_call():
    r = np.random.default_rng(6)
    return {"q": r.standard_normal((4, 2, 8)).astype(np.float32),
            "k": r.standard_normal((4, 1, 8)).astype(np.float32),
            "positions": np.array([0, 3, 7, 15], np.int32),
            "cos_sin_cache": ref.rope_cos_sin_cache(16, 8, 10000.0)}


_ROPE_BAD = [
    ("k_float32_for_bf16_q", TORCH, lambda a, p: a.update(k=_cast(p, a["k"], "float32")),
     TypeError, r"^k: dtype"),
    ("q_float64", TORCH, lambda a, p: a.update(q=_cast(p, a["q"], "float64")), TypeError, r"^q: dtype"),
    ("positions_int64", TORCH, lambda a, p: a.update(positions=_cast(p, a["positions"], "int64")),
     TypeError, r"^positions: dtype"),
    ("cache_bf16", TORCH, lambda a, p: a.update(cos_sin_cache=_cast(p, a["cos_sin_cache"], "bfloat16")),
     TypeError, r"^cos_sin_cache: dtype"),
    ("positions_float", REFUSAL_PATHS, lambda a, p: a.update(positions=_cast(p, a["positions"], "float32")),
     TypeError, r"^positions: dtype"),
    ("q_int", REFUSAL_PATHS, lambda a, p: a.update(q=_cast(p, a["q"], "int32")), TypeError, r"^q: dtype"),
    ("head_dim_odd", REFUSAL_PATHS, lambda a, p: a.update(q=a["q"][..., :7]),
     ValueError, r"^q: head dim 7 must be even"),
    ("head_dim_too_large", REFUSAL_PATHS,
     lambda a, p: a.update(q=_new_like(a["q"], (4, 2, 258)), k=None,
                           cos_sin_cache=_new_like(a["cos_sin_cache"], (16, 258))),
     ValueError, r"^q: head dim 258"),
    ("q_2d", REFUSAL_PATHS, lambda a, p: a.update(q=a["q"][:, 0]), ValueError, r"^q: expected 3"),
    ("k_wrong_rows", REFUSAL_PATHS, lambda a, p: a.update(k=a["k"][:3]), ValueError, r"^k: expected shape"),
    ("k_wrong_head_dim", REFUSAL_PATHS, lambda a, p: a.update(k=_dense(a["k"][..., :4])),
     ValueError, r"^k: expected shape"),
    ("positions_short", REFUSAL_PATHS, lambda a, p: a.update(positions=a["positions"][:3]),
     ValueError, r"^positions: expected shape \[4\]"),
    ("positions_strided", REFUSAL_PATHS, lambda a, p: a.update(positions=strided_last(a["positions"])),
     ValueError, r"^positions: must be C-contiguous"),
    ("cache_wrong_width", REFUSAL_PATHS,
     lambda a, p: a.update(cos_sin_cache=_dense(a["cos_sin_cache"][:, :4])),
     ValueError, r"^cos_sin_cache: expected shape \[max_position, 8\]"),
    ("q_head_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(q=strided_last(a["q"])),
     ValueError, r"^q: the last dimension must be contiguous"),
    ("k_head_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(k=strided_last(a["k"])),
     ValueError, r"^k: the last dimension must be contiguous"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _ROPE_BAD, ids=[c[0] for c in _ROPE_BAD])
def test_rope_refuses_bad_input(path, case):
    run_refusal("rope", path, case, _rope_call(), _ROPE_ORDER, ("q", "k"), _ROPE_BF16)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_rope_good_input_passes_the_contract(path):
    call = _rope_call()
    call["positions"][3] = 16            # outside the cache: device data, the NaN flag
    args = run_good("rope", path, call, _ROPE_ORDER, _ROPE_BF16)
    q, q0 = _as_f64(args["q"]), _rope_call()["q"]         # (the reference rotates call's q)
    tol = 1e-2 if path == "torch" else 1e-6
    assert rel_err(q[0], q0[0]) < tol                            # position 0: unrotated
    assert rel_err(q[1], q0[1]) > 0.01                           # rotated
    assert np.all(np.isnan(q[3])) and np.all(np.isnan(_as_f64(args["k"])[3]))


# ------------------------------------------------------------ silu_mul
_SILU_ORDER = ("x", "out")
_SILU_BF16 = {"x": "bfloat16", "out": "bfloat16"}


def _silu_call():
    return {"x": np.linspace(-3, 3, 24, dtype=np.float32).reshape(3, 8),
            "out": np.full((3, 4), 7.0, np.float32)}


_SILU_BAD = [
    ("out_fp16_for_bf16_x", TORCH, lambda a, p: a.update(out=_cast(p, a["out"], "float16")),
     TypeError, r"^out: dtype"),
    ("x_float64", TORCH, lambda a, p: a.update(x=_cast(p, a["x"], "float64")), TypeError, r"^x: dtype"),
    ("out_int32", REFUSAL_PATHS, lambda a, p: a.update(out=_cast(p, a["out"], "int32")),
     TypeError, r"^out: dtype"),
    ("x_odd_width", REFUSAL_PATHS, lambda a, p: a.update(x=a["x"][:, :7]), ValueError, r"^x: width 7"),
    ("out_wrong_width", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:, :3]),
     ValueError, r"^out: expected shape \[3, 4\]"),
    ("out_wrong_rows", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:2]),
     ValueError, r"^out: expected shape \[3, 4\]"),
    ("x_last_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(x=strided_last(a["x"])),
     ValueError, r"^x: the last dimension must be contiguous"),
    ("out_rows_overlap", REFUSAL_PATHS, lambda a, p: a.update(out=_rows_overlap(a["out"])),
     ValueError, r"^out: rows overlap"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _SILU_BAD, ids=[c[0] for c in _SILU_BAD])
def test_silu_mul_refuses_bad_input(path, case):
    run_refusal("silu_mul", path, case, _silu_call(), _SILU_ORDER, ("out",), _SILU_BF16)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_silu_mul_good_input_passes_the_contract(path):
    args = run_good("silu_mul", path, _silu_call(), _SILU_ORDER, _SILU_BF16)
    x = _as_f64(args["x"])
    g, u = x[:, :4], x[:, 4:]
    assert rel_err(_as_f64(args["out"]), g / (1 + np.exp(-g)) * u) < (1e-2 if path == "torch" else 1e-6)


# ------------------------------------------------------------ gated_rms_norm
_GATED_ORDER = ("x", "z", "weight", "out")
_GATED_BF16 = {"z": "bfloat16", "out": "bfloat16"}     # x, weight, z_bias float32


def _gated_call(bias=True):
    r = np.random.default_rng(8)
    call = {"x": r.standard_normal((3, 8)).astype(np.float32),
            "z": r.standard_normal((3, 8)).astype(np.float32),
            "weight": (1 + 0.5 * r.standard_normal(8)).astype(np.float32),
            "out": np.full((3, 8), 7.0, np.float32), "group_size": 4, "eps": 1e-5}
    if bias:
        call["z_bias"] = r.standard_normal(4).astype(np.float32)
    return call


def _shared_rows(path, a, shift):
    """A [3, 8] view of a [3, 9] buffer holding ``a`` in columns shift .. shift + 7, and the
    view of columns 1 - shift .. : two arrays overlapping without being the same."""
    if path == "reference":
        buf = np.zeros((3, 9), a.dtype)
    else:
        import torch
        buf = torch.zeros((3, 9), dtype=a.dtype)
    buf[:, shift:shift + 8] = a
    return buf[:, shift:shift + 8], buf[:, 1 - shift:9 - shift]


def _x_out_overlap(a, p):
    x, out = _shared_rows(p, a["x"], 0)
    z = _cast(p, a["z"], "float32")
    a.update(x=x, out=out, z=z)


_GATED_BAD = [
    ("x_float16_for_bf16_z", TORCH, lambda a, p: a.update(x=_cast(p, a["x"], "float16")),
     TypeError, r"^x: dtype must be float32 or bfloat16"),
    ("out_float32_for_bf16_z", TORCH, lambda a, p: a.update(out=_cast(p, a["out"], "float32")),
     TypeError, r"^out: dtype"),
    ("weight_fp16_for_bf16_z", TORCH, lambda a, p: a.update(weight=_cast(p, a["weight"], "float16")),
     TypeError, r"^weight: dtype"),
    ("z_bias_bf16_for_f32_weight", TORCH,
     lambda a, p: a.update(z_bias=_cast(p, a["z_bias"], "bfloat16")), TypeError, r"^z_bias: dtype"),
    ("x_int32", REFUSAL_PATHS, lambda a, p: a.update(x=_cast(p, a["x"], "int32")),
     TypeError, r"^x: dtype"),
    ("z_int32", REFUSAL_PATHS, lambda a, p: a.update(z=_cast(p, a["z"], "int32")),
     TypeError, r"^z: dtype"),
    ("x_1d", REFUSAL_PATHS, lambda a, p: a.update(x=a["x"][0]), ValueError, r"^x: expected 2"),
    ("z_wrong_shape", REFUSAL_PATHS, lambda a, p: a.update(z=a["z"][:2]),
     ValueError, r"^z: expected shape \[3, 8\]"),
    ("out_wrong_shape", REFUSAL_PATHS, lambda a, p: a.update(out=_dense(a["out"][:, :4])),
     ValueError, r"^out: expected shape \[3, 8\]"),
    ("group_size_not_dividing", REFUSAL_PATHS, lambda a, p: a.update(group_size=3),
     ValueError, r"^group_size: 3 must be >= 1 and divide the width 8"),
    ("group_size_zero", REFUSAL_PATHS, lambda a, p: a.update(group_size=0),
     ValueError, r"^group_size"),
    ("group_size_float", ("reference",), lambda a, p: a.update(group_size=4.0),
     TypeError, r"^group_size: expected an int"),
    ("weight_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(weight=_dense(a["weight"][:6])),
     ValueError, r"^weight: expected shape \[8\] or \[4\]"),
    ("weight_2d", REFUSAL_PATHS, lambda a, p: a.update(weight=a["weight"][None]),
     ValueError, r"^weight: expected 1"),
    ("weight_strided", REFUSAL_PATHS, lambda a, p: a.update(weight=strided_last(a["weight"])),
     ValueError, r"^weight: must be C-contiguous"),
    ("z_bias_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(z_bias=_dense(a["z_bias"][:3])),
     ValueError, r"^z_bias: expected shape \[8\] or \[4\]"),
    ("eps_zero", REFUSAL_PATHS, lambda a, p: a.update(eps=0.0), ValueError, r"^eps"),
    ("x_last_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(x=strided_last(a["x"])),
     ValueError, r"^x: the last dimension must be contiguous"),
    ("z_last_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(z=strided_last(a["z"])),
     ValueError, r"^z: the last dimension must be contiguous"),
    ("out_rows_overlap", REFUSAL_PATHS, lambda a, p: a.update(out=_rows_overlap(a["out"])),
     ValueError, r"^out: rows overlap"),
    ("out_is_z", REFUSAL_PATHS, lambda a, p: a.update(out=a["z"]), ValueError, r"^out: overlaps z"),
    ("out_overlaps_x_shifted", REFUSAL_PATHS, _x_out_overlap, ValueError, r"^out: overlaps x"),
    ("weight_is_a_row_of_out", REFUSAL_PATHS,
     lambda a, p: a.update(weight=a["out"][1], z_bias=None), ValueError, r"^out: overlaps weight"),
    ("z_bias_is_a_row_of_out", REFUSAL_PATHS,
     lambda a, p: a.update(weight=_cast(p, a["weight"], "bfloat16" if p == "torch" else "float32"),
                           z_bias=a["out"][2, :4]), ValueError, r"^out: overlaps z_bias"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _GATED_BAD, ids=[c[0] for c in _GATED_BAD])
def test_gated_rms_norm_refuses_bad_input(path, case):
    run_refusal("gated_rms_norm", path, case, _gated_call(), _GATED_ORDER, ("out",), _GATED_BF16)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("bias", [False, True])
def test_gated_rms_norm_good_input_passes_the_contract(path, bias):
    args = run_good("gated_rms_norm", path, _gated_call(bias), _GATED_ORDER, _GATED_BF16)
    c = _gated_call(bias)
    want = _gated_formula(c["x"], _as_f64(args["z"]), c["weight"], c.get("z_bias"), 4, 1e-5)
    assert rel_err(_as_f64(args["out"]), want) < (4e-3 if path == "torch" else 1e-6)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_gated_rms_norm_in_place_passes_the_contract(path):
    """out = x (the same array: dtype, address, strides) is allowed; the result is the
    out-of-place one."""
    c = _gated_call()
    dt = {"x": "bfloat16", "z": "bfloat16", "out": "bfloat16"}
    args = on_path(path, c, dt)
    want = on_path(path, c, dt)
    call_op(path, "gated_rms_norm", [want[n] for n in _GATED_ORDER],
            dict(group_size=4, z_bias=want["z_bias"], eps=1e-5))
    call_op(path, "gated_rms_norm", [args["x"], args["z"], args["weight"], args["x"]],
            dict(group_size=4, z_bias=args["z_bias"], eps=1e-5))
    np.testing.assert_array_equal(_as_f64(args["x"]), _as_f64(want["out"]))


def test_gated_rms_norm_torch_cpu_rounds_bf16_once():
    """The eager torch CPU kernel passes bf16 as bits: the float64 value rounded once to bf16,
    as the reference stores it (not through a float32 copy)."""
    torch = pytest.importorskip("torch")
    import specdec_lib.torch_ops  # noqa: F401
    c = _gated_call()
    z16 = torch.from_numpy(c["z"]).to(torch.bfloat16)
    out = torch.empty(3, 8, dtype=torch.bfloat16)
    torch.ops.specdec.gated_rms_norm(torch.from_numpy(c["x"]), z16, torch.from_numpy(c["weight"]),
                                     out, group_size=4, z_bias=torch.from_numpy(c["z_bias"]),
                                     eps=1e-5)
    want = np.zeros((3, 8), np.uint16)
    ref.gated_rms_norm(c["x"], z16.view(torch.uint16).numpy(), c["weight"], want, group_size=4,
                       z_bias=c["z_bias"], eps=1e-5)
    np.testing.assert_array_equal(out.view(torch.uint16).numpy(), want)
