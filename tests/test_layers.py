"""Dense-layer glue ops: rms_norm (optionally fused with the residual add), rope, silu_mul."""
import math

import numpy as np
import pytest

from conftest import needs_gpu, poison, rel_err
from specdec_lib.dtypes import from_host_storage, round_to, to_host_storage
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


# ---------------------------------------------------------------- op validation without a GPU

def test_layers_ops_exported():
    import specdec_lib
    from specdec_lib import ops
    for name in ("rms_norm", "rope", "rope_cos_sin_cache", "silu_mul"):
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


# ---------------------------------------------------------------- the argument contract (CPU)
# Bad inputs on the reference path and the eager torch path (test_draft.run_refusal): the
# named error, the outputs untouched; dtype-exactness cases on the torch path only.
from conftest import REFUSAL_PATHS, strided_last  # noqa: E402
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
