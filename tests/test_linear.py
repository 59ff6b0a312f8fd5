"""layers.linear: the small-M GEMM with the fused rms_norm prologue and silu_mul epilogue,
whose row result depends only on that row (row invariance)."""
import numpy as np
import pytest

from conftest import needs_gpu, poison, rel_err
from specdec_lib.dtypes import from_host_storage, round_to
from specdec_lib.reference import layers as ref
from test_draft import _Fake, _View
from test_layers import HOST, TOL, _bits, _dev, _host, _rand, _store

# (N, K): SmolLM2-135M's qkv, o, gate_up, down; then odd and awkward ones: K % 8 != 0 (the
# scalar path with a zero tail), K past one 768-element slab, N odd, K with 5 norm warps
SMOL = [(1728, 576), (576, 576), (3072, 576), (576, 1536)]
ODD = [(100, 72), (7, 77), (130, 1000), (2, 1), (64, 4104)]


# ---------------------------------------------------------------- reference

def test_linear_reference_matches_formula(rng):
    M, N, K = 5, 12, 20
    x, w = rng.standard_normal((M, K)), rng.standard_normal((N, K))
    out = np.full((M, N), np.nan)
    ref.linear(x, w, out)
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-13)
    # norm prologue: rms_norm then the product
    nw, r = rng.standard_normal(K), rng.standard_normal((M, K))
    s = np.full((M, K), np.nan)
    ref.linear(x, w, out, norm_weight=nw, residual=r, residual_out=s, eps=1e-5)
    h = (x + r) / np.sqrt(((x + r) ** 2).mean(1, keepdims=True) + 1e-5) * nw
    np.testing.assert_array_equal(s, x + r)
    np.testing.assert_allclose(out, h @ w.T, rtol=1e-12)
    ref.linear(x, w, out, norm_weight=nw, unit_offset=True)
    h = x / np.sqrt((x ** 2).mean(1, keepdims=True) + 1e-6) * (1 + nw)
    np.testing.assert_allclose(out, h @ w.T, rtol=1e-12)
    # silu_mul: silu(gate) * up of the unrounded products
    o2 = np.full((M, N // 2), np.nan)
    ref.linear(x, w, o2, epilogue="silu_mul")
    g, u = x @ w[:N // 2].T, x @ w[N // 2:].T
    np.testing.assert_allclose(o2, g / (1 + np.exp(-g)) * u, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear_reference_fused_equals_two_steps(dtype, rng):
    """In a storage dtype the fused norm is rms_norm's stored h, then the product: exactly."""
    M, N, K = 4, 10, 24
    x, r = _store(rng.standard_normal((M, K)), dtype), _store(rng.standard_normal((M, K)), dtype)
    w = _store(rng.standard_normal((N, K)), dtype)
    nw = rng.standard_normal(K).astype(np.float32)
    out, s = np.zeros((M, N), HOST[dtype]), np.zeros_like(x)
    ref.linear(x, w, out, norm_weight=nw, residual=r, residual_out=s, eps=1e-5)
    h, s2 = np.zeros_like(x), np.zeros_like(x)
    ref.rms_norm(x, nw, h, residual=r, residual_out=s2, eps=1e-5)
    two = np.zeros_like(out)
    ref.linear(h, w, two)
    np.testing.assert_array_equal(s, s2)
    np.testing.assert_array_equal(out, two)
    # silu_mul epilogue vs the product in float64 then silu_mul (rounded once)
    o2 = np.zeros((M, N // 2), HOST[dtype])
    ref.linear(x, w, o2, epilogue="silu_mul")
    acc = np.zeros((M, N))
    ref.linear(from_host_storage(x, dtype), from_host_storage(w, dtype), acc)
    want = np.zeros((M, N // 2))
    ref.silu_mul(acc, want)
    np.testing.assert_array_equal(o2, _store(want, dtype))


def test_linear_reference_empty():
    out = np.zeros((0, 3), np.float16)
    assert ref.linear(np.zeros((0, 8), np.float16), np.zeros((3, 8), np.float16), out) is out


def _ref_args():
    return dict(x=np.zeros((2, 4), np.float32), weight=np.zeros((6, 4), np.float32),
                out=np.zeros((2, 6), np.float32))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(x=np.zeros((2, 4), np.int32)), TypeError, "x: dtype"),
    (dict(x=np.zeros(4, np.float32)), ValueError, "x"),
    (dict(x=np.zeros((2, 0), np.float32), weight=np.zeros((6, 0), np.float32)), ValueError,
     "x: K"),
    (dict(weight=np.zeros((6, 5), np.float32)), ValueError, "weight"),
    # numpy dtypes are checked by kind here (float16 weights for float32 x pass): exact
    # dtypes on the torch path, test_linear_refuses_bad_input
    (dict(weight=np.zeros((6, 4), np.int16)), TypeError, "weight"),
    (dict(out=np.zeros((2, 5), np.float32)), ValueError, "out"),
    (dict(out=np.zeros((2, 6), np.int32)), TypeError, "out"),
    (dict(epilogue="gelu"), ValueError, "epilogue"),
    (dict(epilogue="silu_mul"), ValueError, "out"),                 # out must be [2, 3]
    (dict(epilogue="silu_mul", weight=np.zeros((5, 4), np.float32),
          out=np.zeros((2, 2), np.float32)), ValueError, "weight: 5 rows"),
    (dict(norm_weight=np.zeros(3, np.float32)), ValueError, "norm_weight"),
    (dict(norm_weight=np.zeros(4, np.float32), eps=0.0), ValueError, "eps"),
    (dict(residual=np.zeros((2, 4), np.float32), residual_out=np.zeros((2, 4), np.float32)),
     ValueError, "residual: only with norm_weight"),
    (dict(norm_weight=np.ones(4), residual=np.zeros((2, 4), np.float32)), ValueError,
     "residual_out: required"),
    (dict(norm_weight=np.ones(4), residual_out=np.zeros((2, 4), np.float32)), ValueError,
     "residual_out: given"),
    (dict(norm_weight=np.ones(4), residual=np.zeros((2, 3), np.float32),
          residual_out=np.zeros((2, 4), np.float32)), ValueError, "residual"),
    (dict(norm_weight=np.ones(4), residual=np.zeros((2, 4), np.float32),
          residual_out=np.zeros((2, 4), np.int16)), TypeError, "residual_out"),
    (dict(unit_offset=True), ValueError, "unit_offset"),
])
def test_linear_reference_validation(kw, exc, match):
    args = _ref_args()
    args.update(kw)
    with pytest.raises(exc, match=match):
        ref.linear(args.pop("x"), args.pop("weight"), args.pop("out"), **args)


def test_linear_reference_rejects_aliasing_and_writes_nothing():
    x, w = np.ones((2, 4), np.float32), np.ones((6, 4), np.float32)
    out = np.full((2, 6), 7.0, np.float32)
    r = np.ones((2, 4), np.float32)
    for kw, match in [(dict(residual=r, residual_out=x), "residual_out: overlaps x"),
                      (dict(residual=r, residual_out=r), "residual_out: overlaps residual")]:
        with pytest.raises(ValueError, match=match):
            ref.linear(x, w, out, norm_weight=np.ones(4), **kw)
    buf = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match="out: overlaps x"):
        ref.linear(buf[:, :4], w, buf[:, 4:])
    assert np.all(out == 7.0) and np.all(x == 1.0) and np.all(r == 1.0)


# ---------------------------------------------------------------- op validation without a GPU

def test_linear_op_exported():
    import specdec_lib
    from specdec_lib import ops
    assert specdec_lib.linear is ops.linear
    assert specdec_lib.reference.linear is ref.linear


def _op_args():
    return dict(x=_Fake((3, 8), "<f2"), weight=_Fake((6, 8), "<f2"), out=_Fake((3, 6), "<f2"))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(x=np.zeros((3, 8), np.float16)), TypeError, "x"),
    (dict(x=_Fake((3, 8))), TypeError, "x: dtype"),                 # float32: not a GEMM dtype
    (dict(x=_Fake((3, 8, 1), "<f2")), ValueError, "x"),
    (dict(x=_Fake((3, 8), "<f2", strides=(32, 4))), ValueError, "x: the last dimension"),
    (dict(x=_Fake((3, 0), "<f2"), weight=_Fake((6, 0), "<f2")), ValueError, "x: K"),
    (dict(weight=_Fake((6, 8))), TypeError, "weight"),
    (dict(weight=_Fake((6, 7), "<f2")), ValueError, "weight"),
    (dict(weight=_Fake((6, 8), "<f2", strides=(32, 2))), ValueError, "weight: must be C-contig"),
    (dict(out=_Fake((3, 6))), TypeError, "out"),
    (dict(out=_Fake((3, 5), "<f2")), ValueError, "out"),
    (dict(out=_Fake((3, 6), "<f2", strides=(12, 4))), ValueError, "out: the last dimension"),
    (dict(out=_Fake((3, 6), "<f2", strides=(4, 2))), ValueError, "out: rows overlap"),
    (dict(epilogue="silu"), ValueError, "epilogue"),
    (dict(epilogue="silu_mul"), ValueError, "out"),
    (dict(epilogue="silu_mul", weight=_Fake((7, 8), "<f2")), ValueError, "weight: 7 rows"),
    (dict(norm_weight=_Fake((7,), "<f2")), ValueError, "norm_weight"),
    (dict(norm_weight=_Fake((8,), "<i4")), TypeError, "norm_weight"),
    (dict(norm_weight=_Fake((8,), "<f2", strides=(4,))), ValueError, "norm_weight"),
    (dict(norm_weight=_Fake((8,), "<f2"), eps=-1.0), ValueError, "eps"),
    (dict(unit_offset=True), ValueError, "unit_offset"),
    (dict(tensor_cores=1), TypeError, "^tensor_cores: expected a bool"),
    (dict(residual=_Fake((3, 8), "<f2"), residual_out=_Fake((3, 8), "<f2")), ValueError,
     "residual: only with norm_weight"),
    (dict(norm_weight=_Fake((8,)), residual=_Fake((3, 8), "<f2")), ValueError,
     "residual_out: required"),
    (dict(norm_weight=_Fake((8,)), residual_out=_Fake((3, 8), "<f2")), ValueError,
     "residual_out: given"),
    (dict(norm_weight=_Fake((8,)), residual=_Fake((3, 8)), residual_out=_Fake((3, 8), "<f2")),
     TypeError, "residual"),
    (dict(norm_weight=_Fake((8,)), residual=_Fake((3, 8), "<f2"),
          residual_out=_Fake((3, 8), "<f2", strides=(0, 2))), ValueError,
     "residual_out: rows overlap"),
    # every _Fake sits at address 0: a valid call reaches the overlap check, which refuses it
    (dict(), ValueError, "out: overlaps x"),
    (dict(norm_weight=_Fake((8,)), residual=_Fake((3, 8), "<f2"),
          residual_out=_Fake((3, 8), "<f2"), out=_Fake((0, 6), "<f2")), ValueError, "out"),
])
def test_linear_op_validation(kw, exc, match):
    from specdec_lib import ops
    args = _op_args()
    args.update(kw)
    with pytest.raises(exc, match=match):
        ops.linear(args.pop("x"), args.pop("weight"), args.pop("out"), **args)


def test_linear_op_empty_batch_needs_no_gpu():
    """M = 0 is a valid no-op: validated, nothing launched (so it runs without a driver)."""
    from specdec_lib import ops
    out = _Fake((0, 6), "<f2")
    assert ops.linear(_Fake((0, 8), "<f2"), _Fake((6, 8), "<f2"), out) is out
    o2 = _Fake((0, 3), "<f2")
    assert ops.linear(_Fake((0, 8), "<f2"), _Fake((6, 8), "<f2"), o2, norm_weight=_Fake((8,)),
                      residual=_Fake((0, 8), "<f2"), residual_out=_Fake((0, 8), "<f2"),
                      epilogue="silu_mul", unit_offset=True) is o2
    with pytest.raises(TypeError, match="stream"):
        ops.linear(_Fake((0, 8), "<f2"), _Fake((6, 8), "<f2"), out, stream="default")


# ------------------------------------------------------------------------------ GPU

DTYPES = ["float16", "bfloat16"]
# (name, norm, residual, epilogue)
VARIANTS = [("plain", False, False, None), ("norm", True, False, None),
            ("norm_res", True, True, None), ("silu", False, False, "silu_mul"),
            ("norm_res_silu", True, True, "silu_mul")]


def _case(rng, M, N, K, dtype, wdtype):
    x, r = _rand(rng, (M, K), dtype), _rand(rng, (M, K), dtype)
    w = _rand(rng, (N, K), dtype, scale=1.0 / np.sqrt(K))
    nw = round_to(1.0 + 0.5 * rng.standard_normal(K), wdtype)
    return x, r, w, nw


def _want(x, r, w, nw, dtype, norm, res, epilogue, eps=1e-6, unit_offset=False):
    """(s as dtype holds it or None, out in float64) from the reference: h as the dtype
    stores it (rms_norm's output), then the float64 product (and silu_mul)."""
    M, K = x.shape
    N = w.shape[0]
    xs = _store(x, dtype)
    s, h = None, x
    if norm:
        hh = np.zeros((M, K), HOST[dtype])
        kw = {}
        if res:
            s = np.zeros((M, K), HOST[dtype])
            kw = dict(residual=_store(r, dtype), residual_out=s)
        ref.rms_norm(xs, nw, hh, eps=eps, unit_offset=unit_offset, **kw)
        h = from_host_storage(hh, dtype)
        s = None if s is None else from_host_storage(s, dtype)
    want = np.zeros((M, N // 2 if epilogue else N))
    ref.linear(h, w, want, epilogue=epilogue)
    return s, want


def _run(x, r, w, nw, dtype, wdtype, norm, res, epilogue, eps=1e-6, unit_offset=False):
    from specdec_lib import ops
    M, K = x.shape
    N = w.shape[0]
    out = poison((M, N // 2 if epilogue else N), dtype)
    kw = dict(epilogue=epilogue)
    s = None
    if norm:
        kw.update(norm_weight=_dev(nw, wdtype), eps=eps, unit_offset=unit_offset)
    if res:
        s = poison((M, K), dtype)
        kw.update(residual=_dev(r, dtype), residual_out=s)
    assert ops.linear(_dev(x, dtype), _dev(w, dtype), out, **kw) is out
    return out, s


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K", SMOL + ODD)
@pytest.mark.parametrize("M", [1, 3, 4, 8, 16, 17, 64, 256])
def test_linear_gpu(dtype, N, K, M, rng):
    x, r, w, nw = _case(rng, M, N, K, dtype, dtype)
    _, want = _want(x, r, w, nw, dtype, False, False, None)
    out, _ = _run(x, r, w, nw, dtype, dtype, False, False, None)
    assert rel_err(_host(out, dtype), want) < TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype", [("float16", "float16"), ("float16", "float32"),
                                          ("bfloat16", "bfloat16"), ("bfloat16", "float32")])
@pytest.mark.parametrize("N,K", [(1728, 576), (3072, 576), (576, 1536), (100, 72), (130, 1000)])
@pytest.mark.parametrize("M", [1, 4, 17, 64])
@pytest.mark.parametrize("variant", VARIANTS[1:], ids=[v[0] for v in VARIANTS[1:]])
def test_linear_gpu_fused(dtype, wdtype, N, K, M, variant, rng):
    """Norm prologue (+ residual add) and silu_mul epilogue vs the float64 reference;
    residual_out bit for bit the rounded x + residual."""
    _, norm, res, epi = variant
    x, r, w, nw = _case(rng, M, N, K, dtype, wdtype)
    s_want, want = _want(x, r, w, nw, dtype, norm, res, epi)
    out, s = _run(x, r, w, nw, dtype, wdtype, norm, res, epi)
    assert rel_err(_host(out, dtype), want) < TOL[dtype]
    if res:
        np.testing.assert_array_equal(_host(s, dtype), s_want)


def _call_rows(x, r, w, nw, dtype, rows, variant, offset=0, tensor_cores=False):
    """ops.linear on x[rows] (and r[rows]) -> raw output bits; offset > 0: the inputs start
    ``offset`` elements into their buffers (unaligned: the scalar load path)."""
    from specdec_lib import DeviceArray, ops
    _, norm, res, epi = variant
    M, K = len(rows), x.shape[1]
    N = w.shape[0]

    def put(a):
        flat = np.concatenate([np.zeros(offset), a.reshape(-1)])
        base = DeviceArray.from_numpy(_store(flat, dtype), dtype)
        return base, _View(base, a.shape, (a.shape[1], 1), offset)
    _, xv = put(x[rows])
    out = poison((M, N // 2 if epi else N), dtype)
    kw = dict(epilogue=epi)
    s = None
    if norm:
        kw.update(norm_weight=_dev(nw, dtype))
    if res:
        _, rv = put(r[rows])
        s = poison((M, K), dtype)
        kw.update(residual=rv, residual_out=s)
    ops.linear(xv, _dev(w, dtype), out, tensor_cores=tensor_cores, **kw)
    return out.to_numpy(), None if s is None else s.to_numpy()


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K", [(1728, 576), (576, 1536), (3072, 576), (100, 72)])
@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[2], VARIANTS[3], VARIANTS[4]],
                         ids=["plain", "norm_res", "silu", "norm_res_silu"])
def test_linear_gpu_row_invariance(dtype, N, K, variant, rng):
    """The same row gives the same bits computed alone (M = 1), inside M = 2, 4, 6, 17 and 64
    calls at different positions (other chunks, other CTAs of gridDim.y; M <= 8 take the
    linear_m* kernels, the others linear_*), and from an unaligned copy
    (scalar loads)."""
    x, r, w, nw = _case(rng, 64, N, K, dtype, dtype)
    full, full_s = _call_rows(x, r, w, nw, dtype, list(range(64)), variant)
    for row in (0, 5, 63):
        others = [i for i in range(64) if i != row]
        for rows, pos in (([row], 0), (others[:1] + [row], 1), (others[:2] + [row] + others[2:3], 2),
                          (others[:5] + [row], 5),
                          (others[:16] + [row], 16), (others[:40] + [row] + others[40:], 40)):
            got, got_s = _call_rows(x, r, w, nw, dtype, rows, variant)
            np.testing.assert_array_equal(_bits(got[pos]), _bits(full[row]))
            if got_s is not None:
                np.testing.assert_array_equal(_bits(got_s[pos]), _bits(full_s[row]))
        got, _ = _call_rows(x, r, w, nw, dtype, [row, others[0], others[1]], variant, offset=1)
        np.testing.assert_array_equal(_bits(got[0]), _bits(full[row]))


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype", [("bfloat16", "bfloat16"), ("float16", "float32")])
@pytest.mark.parametrize("N,K", [(1728, 576), (576, 1536), (3072, 576), (100, 72)])
@pytest.mark.parametrize("cta_rows", [1, 2, 4])
@pytest.mark.parametrize("variant", [VARIANTS[2], VARIANTS[4]], ids=["norm_res", "norm_res_silu"])
def test_linear_gpu_few_row_cta_rows(dtype, wdtype, N, K, cta_rows, variant, monkeypatch, rng):
    """Every rows-a-CTA choice of the two-column few-row kernels (gridDim.y CTA rows, the
    last one ragged) gives each row the bits of the chunked kernel's 17-row call,
    residual_out included, for M = 1 .. 8; and the values of the reference. (The default's
    four columns a warp: test_linear_gpu_few_row_wide.)"""
    from specdec_lib.ops import layers as ops_layers
    _, norm, res, epi = variant
    x, r, w, nw = _case(rng, 17, N, K, dtype, wdtype)
    full, full_s = _run(x, r, w, nw, dtype, wdtype, norm, res, epi)
    full, full_s = full.to_numpy(), full_s.to_numpy()
    monkeypatch.setitem(ops_layers.TUNING, "linear_cta_rows", cta_rows)
    monkeypatch.setitem(ops_layers.TUNING, "linear_cols_per_warp", 2)
    for M in range(1, ops_layers.LINEAR_FAST_MAX_ROWS + 1):
        out, s = _run(x[M:2 * M], r[M:2 * M], w, nw, dtype, wdtype, norm, res, epi)
        np.testing.assert_array_equal(_bits(out.to_numpy()), _bits(full[M:2 * M]))
        np.testing.assert_array_equal(_bits(s.to_numpy()), _bits(full_s[M:2 * M]))
    s_want, want = _want(x[3:6], r[3:6], w, nw, dtype, norm, res, epi)
    out, _ = _run(x[3:6], r[3:6], w, nw, dtype, wdtype, norm, res, epi)
    assert rel_err(_host(out, dtype), want) < TOL[dtype]


def _spy_kernels(monkeypatch):
    """The kernel names ops ask runtime.kernel for from now on (a list that grows)."""
    from specdec_lib import runtime
    names, real = [], runtime.kernel

    def spy(module, name, *a, **k):
        names.append(name)
        return real(module, name, *a, **k)
    monkeypatch.setattr(runtime, "kernel", spy)
    return names


def _run_padded_out(x, r, w, nw, dtype, wdtype, variant):
    """ops.linear on x's rows (r's) into a view of a wider, poisoned out buffer (24 columns
    past N, past I with silu_mul): returns the view's host storage, after checking that the
    columns past it stayed untouched."""
    from specdec_lib import ops
    _, norm, res, epi = variant
    M, K = x.shape
    Wd = w.shape[0] // 2 if epi else w.shape[0]
    SO = Wd + 24
    ob = poison((M * SO,), dtype)
    ov = _View(ob, (M, Wd), (SO, 1))
    kw = dict(epilogue=epi)
    if norm:
        kw.update(norm_weight=_dev(nw, wdtype))
    if res:
        kw.update(residual=_dev(r, dtype), residual_out=poison((M, K), dtype))
    ops.linear(_dev(x, dtype), _dev(w, dtype), ov, **kw)
    raw = ob.to_numpy()
    assert np.all(raw.view(np.uint16).reshape(M, SO)[:, Wd:] == 0xFFFF)   # untouched
    return ov.np_view(raw)


# Four columns a warp (the default; linear_w4_m*_k4_*): SmolLM2's qkv
# and gate_up (K 576), K = 1024 (all four units of every lane), N with a tail inside a warp
# (N % 4) and a CTA (N % 16), gate_up with I odd (102 = 2 x 51: a warp's second gate past I),
# a one-warp N; odd N (plain only); K = 1536 keeps the two-column k8 form (the fallback).
_WIDE_NK = [(1728, 576), (3072, 576), (576, 1024), (102, 72), (6, 64), (101, 72), (7, 136),
            (576, 1536)]
_WIDE_VARIANTS = [VARIANTS[0], VARIANTS[2], VARIANTS[3], VARIANTS[4]]


def _wide_cases():
    cases = []
    for dt, wdt in [("float16", "float16"), ("float16", "float32"), ("bfloat16", "bfloat16"),
                    ("bfloat16", "float32")]:
        for N, K in _WIDE_NK:
            for v in _WIDE_VARIANTS:
                if (v[3] and N % 2) or (not v[1] and wdt != dt):   # silu: N even; no norm: one
                    continue
                cases.append(pytest.param(dt, wdt, N, K, v, id=f"{dt}-w{wdt}-{N}x{K}-{v[0]}"))
    return cases


@pytest.mark.parametrize("M,K,N,epi,cta_rows,cols,kernel,gx,gy", [
    (4, 576, 3072, "silu_mul", None, 4, "linear_w4_m1_k4_bf16_wbf16", 192, 4),  # 1536 / 2 / 4
    (4, 576, 3072, "silu_mul", None, None, "linear_w4_m1_k4_bf16_wbf16", 192, 4),  # default
    (4, 576, 3072, "silu_mul", None, 2, "linear_m1_k4_bf16_wbf16", 384, 4),
    (3, 576, 1728, None, 2, 4, "linear_w4_m2_k4_bf16_wbf16", 108, 2),
    (5, 72, 101, None, None, 4, "linear_w4_m1_k4_bf16_wbf16", 7, 5),            # 26 warps
    (5, 72, 102, "silu_mul", None, 4, "linear_w4_m1_k4_bf16_wbf16", 7, 5),      # I = 51
    (8, 64, 6, None, None, 4, "linear_w4_m1_k4_bf16_wbf16", 1, 8),
    (1, 1536, 576, None, None, 4, "linear_m1_k8_bf16_wbf16", 72, 1),            # no k8 form
    (2, 576, 576, None, 4, 4, "linear_m4_k4_bf16_wbf16", 72, 1),                # nor m4
    (9, 576, 576, None, None, 4, "linear_bf16_wbf16", 72, 1),                   # chunked
])
def test_linear_cols_per_warp_launch(M, K, N, epi, cta_rows, cols, kernel, gx, gy):
    """The launcher's choice (CPU, recorded launches; the CUDA-core kernels, TUNING["linear_mma"]
    forcing them even where a call would ask for the tensor cores): four columns a warp where the shape has the form (K <= 1024, 1 or 2
    rows a CTA), with a warp per 4 columns (silu_mul: per 2 gates) and 4 warps a CTA;
    otherwise, or with TUNING's 2, the two-column kernels and grid."""
    import launch_record
    from specdec_lib import ops
    from specdec_lib.ops import layers as ops_layers
    with launch_record.LaunchRecorder("h200") as rec:
        ops_layers.TUNING.update(linear_cta_rows=cta_rows, linear_cols_per_warp=cols,
                                 linear_mma=False)
        x = rec.array("x", (M, K), "bfloat16")
        w = rec.array("weight", (N, K), "bfloat16")
        o = rec.array("out", (M, N // 2 if epi else N), "bfloat16")
        kw = {}
        if epi:
            kw = dict(norm_weight=rec.array("nw", (K,), "bfloat16"), epilogue=epi,
                      residual=rec.array("r", (M, K), "bfloat16"),
                      residual_out=rec.array("s", (M, K), "bfloat16"))
        ops.linear(x, w, o, tensor_cores=True, **kw)
        (launch,) = rec.launches
    assert ops_layers.TUNING == {"linear_cta_rows": None, "linear_cols_per_warp": None,
                                 "linear_mma": None}
    a = launch["args"]
    assert (a["k"], a["gx"], a["gy"], a["block"]) == (f"kernel:linear/{kernel}", gx, gy, 128)


@needs_gpu
@pytest.mark.parametrize("cta_rows", [1, 2])
@pytest.mark.parametrize("dtype,wdtype,N,K,variant", _wide_cases())
def test_linear_gpu_few_row_wide(dtype, wdtype, N, K, variant, cta_rows, monkeypatch, rng):
    """Four columns a warp: every row the bits of the chunked kernel's 17-row call,
    residual_out included, for M = 1 .. 8 at 1 and 2 rows a CTA (the last CTA row ragged);
    the four-column kernel ran (K <= 1024; the two-column k8 one at K = 1536); nothing
    written past N (an out row of a wider, poisoned buffer); the reference's values."""
    from specdec_lib.ops import layers as ops_layers
    _, norm, res, epi = variant
    x, r, w, nw = _case(rng, 17, N, K, dtype, wdtype)
    full, full_s = _run(x, r, w, nw, dtype, wdtype, norm, res, epi)
    full = full.to_numpy()
    full_s = None if full_s is None else full_s.to_numpy()
    names = _spy_kernels(monkeypatch)
    monkeypatch.setitem(ops_layers.TUNING, "linear_cta_rows", cta_rows)
    monkeypatch.setitem(ops_layers.TUNING, "linear_cols_per_warp", 4)
    for M in range(1, ops_layers.LINEAR_FAST_MAX_ROWS + 1):
        out, s = _run(x[M:2 * M], r[M:2 * M], w, nw, dtype, wdtype, norm, res, epi)
        np.testing.assert_array_equal(_bits(out.to_numpy()), _bits(full[M:2 * M]))
        if res:
            np.testing.assert_array_equal(_bits(s.to_numpy()), _bits(full_s[M:2 * M]))
    form = f"linear_w4_m{cta_rows}_k4_" if K <= 1024 else f"linear_m{cta_rows}_k8_"
    assert names and all(n.startswith(form) for n in names), names
    got = _run_padded_out(x[3:6], r[3:6], w, nw, dtype, wdtype, variant)
    np.testing.assert_array_equal(_bits(got), _bits(full[3:6]))
    _, want = _want(x[3:6], r[3:6], w, nw, dtype, norm, res, epi)
    assert rel_err(from_host_storage(got, dtype), want) < TOL[dtype]


def _check_norm_bits(dtype, wdtype, M, N, K, unit_offset, rng):
    """ops.linear with the norm prologue (without and with the residual) against ops.rms_norm
    then ops.linear(h): the same output bits, the same residual_out bits."""
    from specdec_lib import ops
    x, r, w, nw = _case(rng, M, N, K, dtype, wdtype)
    dx, dr, dw, dn = _dev(x, dtype), _dev(r, dtype), _dev(w, dtype), _dev(nw, wdtype)
    for res in (False, True):
        h, s2 = poison((M, K), dtype), poison((M, K), dtype)
        kw = dict(residual=dr, residual_out=s2) if res else {}
        ops.rms_norm(dx, dn, h, eps=1e-5, unit_offset=unit_offset, **kw)
        two = poison((M, N), dtype)
        ops.linear(h, dw, two)
        one, s1 = poison((M, N), dtype), poison((M, K), dtype)
        kw = dict(residual=dr, residual_out=s1) if res else {}
        ops.linear(dx, dw, one, norm_weight=dn, eps=1e-5, unit_offset=unit_offset, **kw)
        np.testing.assert_array_equal(_bits(one.to_numpy()), _bits(two.to_numpy()))
        if res:
            np.testing.assert_array_equal(_bits(s1.to_numpy()), _bits(s2.to_numpy()))


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype", [("float16", "float16"), ("float16", "float32"),
                                          ("bfloat16", "bfloat16"), ("bfloat16", "float32")])
@pytest.mark.parametrize("N,K", [(1728, 576), (576, 1536), (100, 72), (64, 4104), (8, 40000)])
@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("M", [1, 4, 5, 17])
def test_linear_gpu_norm_bit_identical_to_rms_norm(dtype, wdtype, N, K, unit_offset, M, rng):
    """The fused prologue gives the bits of ops.rms_norm (+ residual) then ops.linear: the same
    h (K = 4104: five of rms_norm's warps; 40000: 1024 threads and past its register cache),
    the same residual_out, so the same output; M <= 8: the linear_m* kernels where K allows
    them (each warp's own norm)."""
    _check_norm_bits(dtype, wdtype, M, N, K, unit_offset, rng)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gpu_strided_rows_and_nan_row(dtype, rng):
    """x rows with a free stride (a view of a wider buffer, aligned), out a view too: the
    padding stays untouched; a NaN in one x row stays in that output row."""
    from specdec_lib import DeviceArray, ops
    M, N, K, S, SO = 6, 100, 72, 96, 120
    x, _, w, nw = _case(rng, M, N, K, dtype, dtype)
    x[3, 7] = np.nan
    buf = np.zeros((M, S))
    buf[:, :K] = x
    xb = DeviceArray.from_numpy(_store(buf, dtype), dtype)
    ob = poison((M * SO,), dtype)
    ov = _View(ob, (M, N), (SO, 1))
    ops.linear(_View(xb, (M, K), (S, 1)), _dev(w, dtype), ov, norm_weight=_dev(nw, dtype))
    got_raw = ob.to_numpy()
    got = from_host_storage(ov.np_view(got_raw), dtype)
    assert np.all(np.isnan(got[3]))
    ok = np.arange(M) != 3
    _, want = _want(x[ok], None, w, nw, dtype, True, False, None)
    assert rel_err(got[ok], want) < TOL[dtype]
    pad = np.ones((M, SO), bool)
    pad[:, :N] = False
    assert np.all(got_raw.view(np.uint16).reshape(M, SO)[pad] == 0xFFFF)   # untouched


@needs_gpu
def test_linear_gpu_rejects_before_launch(rng):
    """Bad arguments on real device arrays raise before any launch: outputs untouched."""
    from specdec_lib import DeviceArray, ops
    M, N, K = 4, 16, 64
    x = _dev(_rand(rng, (M, K), "bfloat16"), "bfloat16")
    r = _dev(_rand(rng, (M, K), "bfloat16"), "bfloat16")
    w = _dev(_rand(rng, (N, K), "bfloat16"), "bfloat16")
    nw = _dev(np.ones(K), "bfloat16")
    out, s = poison((M, N), "bfloat16"), poison((M, K), "bfloat16")
    big = poison((M, K + N), "bfloat16")
    for kw, exc, match in [
        (dict(weight=_dev(np.ones((N, K)), "float16")), TypeError, "weight"),
        (dict(weight=_dev(np.ones((N, K - 8)), "bfloat16")), ValueError, "weight"),
        (dict(norm_weight=_dev(np.ones(K), "float16")), TypeError, "norm_weight"),
        (dict(norm_weight=nw, residual=r), ValueError, "residual_out"),
        (dict(residual=r, residual_out=s), ValueError, "residual: only with norm_weight"),
        (dict(norm_weight=nw, residual=r, residual_out=r), ValueError,
         "residual_out: overlaps residual"),
        (dict(norm_weight=nw, residual=r, residual_out=x), ValueError, "residual_out: overlaps x"),
        (dict(x=_View(big, (M, K), (K + N, 1)), out=_View(big, (M, N), (K + N, 1), K)),
         ValueError, "out: overlaps x"),
        (dict(epilogue="silu_mul"), ValueError, "out"),
        (dict(norm_weight=nw, eps=0.0), ValueError, "eps"),
    ]:
        args = dict(x=x, weight=w, out=out)
        args.update(kw)
        with pytest.raises(exc, match=match):
            ops.linear(args.pop("x"), args.pop("weight"), args.pop("out"), **args)
    assert np.all(out.to_numpy() == 0xFFFF) and np.all(s.to_numpy() == 0xFFFF)
    assert np.all(big.to_numpy() == 0xFFFF)
    # M = 0 with real arrays: nothing launched, nothing written
    e = DeviceArray.empty((0, N), "bfloat16")
    assert ops.linear(DeviceArray.empty((0, K), "bfloat16"), w, e) is e


# ---------------------------------------------------------------- the tensor-core few-row form
# TUNING["linear_mma"] (cuda_src/layers/linear_mma.cu): <= 8 aligned rows of K <= 2048 on mma
# m16n8k16 with the weights as A. K: one k16 step (16), two k-blocks (64), SmolLM2's 576 and
# 1536, the widest (2048), and K past a multiple of 32 (40, 72, 1000: a zero-padded last
# k-block; 1032: the same in the k8 form); N: one CTA (16), three (48), SmolLM2's 576 / 960 /
# 3072, tails inside a CTA (N % 16: 100, 22; silu_mul I % 8: 50, 51, 11).
_MMA_NK = [(16, 16), (48, 64), (576, 576), (960, 576), (3072, 576), (576, 1536), (48, 2048),
           (960, 2048), (16, 72), (100, 1000), (102, 1032), (22, 40)]
_MMA_DTYPES = [("float16", "float16"), ("float16", "float32"), ("bfloat16", "bfloat16"),
               ("bfloat16", "float32")]


def _mma_cases():
    cases = []
    for dt, wdt in _MMA_DTYPES:
        for N, K in _MMA_NK:
            for v in VARIANTS:
                if not v[1] and wdt != dt:        # no norm: the norm weight's dtype is moot
                    continue
                cases.append(pytest.param(dt, wdt, N, K, v, id=f"{dt}-w{wdt}-{N}x{K}-{v[0]}"))
    return cases


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype,N,K,variant", _mma_cases())
def test_linear_gpu_mma(dtype, wdtype, N, K, variant, monkeypatch, rng):
    """TUNING["linear_mma"]: M = 1 .. 8 rows on the tensor-core kernel (linear_mma_k4 at K <=
    1024, k8 past it: it ran) against the float64 reference of rms_norm's stored h, by
    relative norm; out and residual_out poisoned first, residual_out bit for bit round(x +
    residual); out as a view of a wider poisoned buffer: nothing written past N (past I)."""
    from specdec_lib.ops import layers as ops_layers
    _, norm, res, epi = variant
    names = _spy_kernels(monkeypatch)
    monkeypatch.setitem(ops_layers.TUNING, "linear_mma", True)
    x, r, w, nw = _case(rng, 8, N, K, dtype, wdtype)
    for M in range(1, ops_layers.LINEAR_FAST_MAX_ROWS + 1):
        s_want, want = _want(x[:M], r[:M], w, nw, dtype, norm, res, epi)
        out, s = _run(x[:M], r[:M], w, nw, dtype, wdtype, norm, res, epi)
        assert rel_err(_host(out, dtype), want) < TOL[dtype], M
        if res:
            np.testing.assert_array_equal(_host(s, dtype), s_want)
    form = "linear_mma_k4_" if K <= 1024 else "linear_mma_k8_"
    assert names and all(n.startswith(form) for n in names), names
    got = _run_padded_out(x[:3], r[:3], w, nw, dtype, wdtype, variant)
    _, want = _want(x[:3], r[:3], w, nw, dtype, norm, res, epi)
    assert rel_err(from_host_storage(got, dtype), want) < TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K", [(960, 576), (3072, 576), (576, 1536), (100, 72), (48, 2048)])
@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[2], VARIANTS[4]],
                         ids=["plain", "norm_res", "norm_res_silu"])
def test_linear_gpu_mma_row_invariance(dtype, N, K, variant, monkeypatch, rng):
    """Within the tensor-core form a row's bits (and its residual_out's) are the same computed
    alone (M = 1) and at any position of M = 2 .. 8 calls among any other rows."""
    from specdec_lib.ops import layers as ops_layers
    names = _spy_kernels(monkeypatch)
    monkeypatch.setitem(ops_layers.TUNING, "linear_mma", True)
    x, r, w, nw = _case(rng, 16, N, K, dtype, dtype)
    alone = [_call_rows(x, r, w, nw, dtype, [i], variant) for i in range(16)]
    pick = np.random.default_rng(3)
    for M in range(2, ops_layers.LINEAR_FAST_MAX_ROWS + 1):
        for _ in range(2):
            rows = [int(i) for i in pick.choice(16, M, replace=False)]
            got, got_s = _call_rows(x, r, w, nw, dtype, rows, variant)
            for pos, row in enumerate(rows):
                np.testing.assert_array_equal(_bits(got[pos]), _bits(alone[row][0][0]))
                if got_s is not None:
                    np.testing.assert_array_equal(_bits(got_s[pos]), _bits(alone[row][1][0]))
    assert names and all(n.startswith("linear_mma_") for n in names), names


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype", _MMA_DTYPES)
@pytest.mark.parametrize("K", [40, 576, 1536, 2048])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_linear_gpu_mma_norm_bit_identical_to_rms_norm(dtype, wdtype, K, unit_offset,
                                                        monkeypatch, rng):
    """The tensor-core form's fused prologue stages rms_norm's h: linear(x, norm_weight=...)
    gives the bits of ops.rms_norm (+ residual) then linear(h) on the same form, M = 1, 5, 8
    (a float32 or 16-bit norm weight, unit_offset); residual_out the same too."""
    from specdec_lib.ops import layers as ops_layers
    names = _spy_kernels(monkeypatch)
    monkeypatch.setitem(ops_layers.TUNING, "linear_mma", True)
    for M in (1, 5, 8):
        _check_norm_bits(dtype, wdtype, M, 48, K, unit_offset, rng)
    assert names and all(n.startswith("linear_mma_") or n.startswith("rms_norm") for n in names)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gpu_mma_switch_restores_default(dtype, monkeypatch, rng):
    """tensor_cores only picks the kernel: by default the CUDA-core few-row kernel, with
    tensor_cores=True linear_mma (the reference's values, other bits), then the default again
    with its bits; TUNING["linear_mma"] forces either form whatever the call asks."""
    from specdec_lib.ops import layers as ops_layers
    variant = VARIANTS[4]
    x, r, w, nw = _case(rng, 4, 960, 576, dtype, dtype)
    names = _spy_kernels(monkeypatch)
    rows = [0, 1, 2, 3]
    default, _ = _call_rows(x, r, w, nw, dtype, rows, variant)
    first = list(names)
    assert first and not any(n.startswith("linear_mma") for n in first), first
    del names[:]
    mma, _ = _call_rows(x, r, w, nw, dtype, rows, variant, tensor_cores=True)
    assert names and all(n.startswith("linear_mma_k4_") for n in names), names
    del names[:]
    again, _ = _call_rows(x, r, w, nw, dtype, rows, variant)
    assert names == first
    np.testing.assert_array_equal(_bits(again), _bits(default))
    for force, want_mma in ((False, False), (True, True)):
        monkeypatch.setitem(ops_layers.TUNING, "linear_mma", force)
        del names[:]
        forced, _ = _call_rows(x, r, w, nw, dtype, rows, variant, tensor_cores=not force)
        assert names and all(n.startswith("linear_mma") == want_mma for n in names), names
        np.testing.assert_array_equal(_bits(forced), _bits(mma if want_mma else default))
    _, want = _want(x, r, w, nw, dtype, True, True, "silu_mul")
    for got in (default, mma):
        assert rel_err(from_host_storage(got, dtype), want) < TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K", [(960, 576), (576, 1536), (100, 72)])
@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[4]], ids=lambda v: v[0])
def test_linear_gpu_tensor_cores_row_invariant(dtype, N, K, variant, rng):
    """tensor_cores=True: a row's bits (and residual_out's) are the same alone and inside any
    call of <= 256 rows, at any position -- one row group of 8 or several (gridDim.y) -- the
    contract that lets LlamaTarget's few-row decode verify a block against one-row steps; a
    257-row call takes the chunked kernel, whose bits are the CUDA-core ones."""
    x, r, w, nw = _case(rng, 300, N, K, dtype, dtype)
    alone = {i: _call_rows(x, r, w, nw, dtype, [i], variant, tensor_cores=True)
             for i in (0, 3, 7, 8, 15, 40, 199)}
    for M in (2, 5, 8, 9, 17, 64, 256):
        rows = [i for i in range(M - 1, -1, -1)] if M < 200 else list(range(M))
        got, got_s = _call_rows(x, r, w, nw, dtype, rows, variant, tensor_cores=True)
        for pos, row in enumerate(rows):
            if row not in alone:
                continue
            np.testing.assert_array_equal(_bits(got[pos]), _bits(alone[row][0][0]))
            if got_s is not None:
                np.testing.assert_array_equal(_bits(got_s[pos]), _bits(alone[row][1][0]))
    big, _ = _call_rows(x, r, w, nw, dtype, list(range(257)), variant, tensor_cores=True)
    cuda, _ = _call_rows(x, r, w, nw, dtype, [40], variant)
    np.testing.assert_array_equal(_bits(big[40]), _bits(cuda[0]))
    _, want = _want(x[:1], r[:1], w, nw, dtype, variant[1], variant[2], variant[3])
    assert rel_err(from_host_storage(alone[0][0], dtype), want) < TOL[dtype]


def _ptx_entries(module, family):
    """{kernel name: PTX body} of a shipped module's compute_<family> PTX."""
    import re
    from pathlib import Path
    from specdec_lib import runtime
    path = Path(runtime.CUBIN_DIR) / f"{module}.compute_{family}.ptx"
    if not path.is_file():
        pytest.skip(f"no {path.name} (the package is not built)")
    text = path.read_text()
    starts = [(m.group(1), m.start()) for m in re.finditer(r"\.entry\s+(\w+)\s*\(", text)]
    return {name: text[at:(starts[i + 1][1] if i + 1 < len(starts) else len(text))]
            for i, (name, at) in enumerate(starts)}


@pytest.mark.parametrize("module,prefixes", [("linear", ("linear_m", "linear_w4_", "linear_bf16",
                                                         "linear_f16")),
                                             ("linear_mma", ("linear_mma_",))])
def test_linear_weights_load_before_the_pdl_wait(module, prefixes):
    """linear's kernels request weights before griddepcontrol.wait by plain ld.global, never
    ld.global.nc: ptxas 13.0 schedules the wait (SASS ACQBULK) above .nc loads on sm_90, so
    .nc weights never overlapped the previous kernel (s45; plain loads 10% faster in a
    SmolLM2 chain, s46). In each kernel's compute_90 PTX: a 16-byte global load before the
    wait and no .nc load there (the norm weight's, after the wait, may be .nc)."""
    entries = {n: b for n, b in _ptx_entries(module, 90).items() if n.startswith(prefixes)}
    assert entries
    for name, body in entries.items():
        wait = body.find("griddepcontrol.wait")
        assert wait > 0, name
        assert "ld.global.v4" in body[:wait] and "ld.global.nc" not in body[:wait], name


@pytest.mark.parametrize("M,K,N,epi,wdt,env,kernel,gx,gy,block", [
    (1, 576, 960, None, None, {}, "linear_mma_k4_bf16_wbf16", 60, 1, 256),
    (8, 576, 3072, "silu_mul", "bfloat16", {}, "linear_mma_k4_bf16_wbf16", 192, 1, 256),
    (5, 1536, 576, None, None, {}, "linear_mma_k8_bf16_wbf16", 36, 1, 256),
    (4, 1024, 48, None, None, {}, "linear_mma_k4_bf16_wbf16", 3, 1, 256),
    (4, 1032, 48, None, None, {}, "linear_mma_k8_bf16_wbf16", 3, 1, 256),
    (8, 2048, 16, None, None, {}, "linear_mma_k8_bf16_wbf16", 1, 1, 256),
    (3, 40, 22, "silu_mul", "float32", {}, "linear_mma_k4_bf16_wf32", 2, 1, 256),  # I = 11
    (2, 72, 100, None, None, {}, "linear_mma_k4_bf16_wbf16", 7, 1, 256),
    # compute_75's bf16 multiplies the mma fragments on the CUDA cores: still this form
    (4, 576, 960, None, None, {"SPECDEC_FORCE_ARCH": "75"}, "linear_mma_k4_bf16_wbf16", 60, 1,
     256),
    # more rows: 8 a row group (gridDim.y), up to LINEAR_MMA_MAX_ROWS = 256
    (9, 576, 576, None, None, {}, "linear_mma_k4_bf16_wbf16", 36, 2, 256),
    (64, 576, 3072, "silu_mul", "bfloat16", {}, "linear_mma_k4_bf16_wbf16", 192, 8, 256),
    (256, 1536, 576, None, None, {}, "linear_mma_k8_bf16_wbf16", 36, 32, 256),
    # not for it: 257 rows, K past 2048, K % 8 (no 16-byte rows): the kernels they take without
    (257, 576, 576, None, None, {}, "linear_bf16_wbf16", 72, 17, 128),
    (4, 2056, 576, None, None, {}, "linear_bf16_wbf16", 72, 1, 128),
    (2, 76, 16, None, None, {}, "linear_bf16_wbf16", 2, 1, 128),
])
def test_linear_mma_launch(M, K, N, epi, wdt, env, kernel, gx, gy, block):
    """The launcher's choice with tensor_cores=True (CPU, recorded launches): the
    tensor-core kernel (units a lane 4 at K <= 1024, else 8) for <= 256 aligned rows of K <=
    2048, a CTA per 16 output columns (silu_mul: per 8 gates), 8 warps, a CTA row per 8 rows;
    other calls the kernels they take without it."""
    import launch_record
    from specdec_lib import ops
    from specdec_lib.ops import layers as ops_layers
    with launch_record.LaunchRecorder("h200", env) as rec:
        x = rec.array("x", (M, K), "bfloat16")
        w = rec.array("weight", (N, K), "bfloat16")
        o = rec.array("out", (M, N // 2 if epi else N), "bfloat16")
        kw = {}
        if wdt:
            kw = dict(norm_weight=rec.array("nw", (K,), wdt),
                      residual=rec.array("r", (M, K), "bfloat16"),
                      residual_out=rec.array("s", (M, K), "bfloat16"))
        ops.linear(x, w, o, epilogue=epi, tensor_cores=True, **kw)
        (launch,) = rec.launches
    assert ops_layers.TUNING["linear_mma"] is None      # untouched: the call asked
    a = launch["args"]
    module = "linear_mma" if kernel.startswith("linear_mma") else "linear"
    assert (a["k"], a["gx"], a["gy"], a["block"]) == (f"kernel:{module}/{kernel}", gx, gy, block)


def test_linear_mma_kernel_table():
    """Every dtype pair of linear's other forms has both units-a-lane forms in the table
    (runtime.kernel refuses a missing one, but only on a GPU)."""
    from specdec_lib import _kernels
    names = _kernels.MODULES["linear_mma"].kernels
    assert set(names) == {f"linear_mma_k{u}_{t}_w{w}" for u in (4, 8)
                          for t, w in (("f16", "f16"), ("f16", "f32"), ("bf16", "bf16"),
                                       ("bf16", "f32"))}
    assert set(names.values()) == {"LinearParams"}
    assert _kernels.MODULES["linear_mma"].params_header == _kernels.MODULES["linear"].params_header


# ---------------------------------------------------------------- the argument contract (CPU)
# Bad inputs on the reference path and the eager torch path (test_draft.run_refusal): the
# named error, the outputs untouched. float32 x is refused on the torch path (the GEMM takes
# float16 / bfloat16); numpy floats of any width stand in for them on the reference path.
from conftest import REFUSAL_PATHS, strided_last  # noqa: E402
from test_draft import TORCH, _cast, _dense, _host as _as_f64, _rows_overlap, run_good, run_refusal  # noqa: E402

_LIN_ORDER = ("x", "weight", "out")
_LIN_BF16 = {"x": "bfloat16", "weight": "bfloat16", "out": "bfloat16", "residual": "bfloat16",
             "residual_out": "bfloat16"}


def _lin_call(norm=False):
    r = np.random.default_rng(8)
    call = {"x": r.standard_normal((3, 8)).astype(np.float32),
            "weight": r.standard_normal((6, 8)).astype(np.float32),
            "out": np.full((3, 6), 7.0, np.float32)}
    if norm:
        call.update(norm_weight=np.ones(8, np.float32), eps=1e-5,
                    residual=r.standard_normal((3, 8)).astype(np.float32),
                    residual_out=np.full((3, 8), 7.0, np.float32))
    return call


def _drop_norm(a, p):
    a.pop("norm_weight")
    a.pop("eps")


_LIN_BAD = [
    # (case id, with the norm prologue, paths, mutate(args, path), exception, message start)
    ("x_float32", False, TORCH,
     lambda a, p: a.update(x=_cast(p, a["x"], "float32")), TypeError, r"^x: dtype must be float16 or bfloat16"),
    ("out_fp16_for_bf16_x", False, TORCH, lambda a, p: a.update(out=_cast(p, a["out"], "float16")),
     TypeError, r"^out: dtype"),
    ("weight_fp16_for_bf16_x", False, TORCH,
     lambda a, p: a.update(weight=_cast(p, a["weight"], "float16")), TypeError, r"^weight: dtype"),
    ("residual_float32_for_bf16", True, TORCH,
     lambda a, p: a.update(residual=_cast(p, a["residual"], "float32")), TypeError, r"^residual: dtype"),
    ("x_int", False, REFUSAL_PATHS, lambda a, p: a.update(x=_cast(p, a["x"], "int16")),
     TypeError, r"^x: dtype"),
    ("norm_weight_int", True, REFUSAL_PATHS,
     lambda a, p: a.update(norm_weight=_cast(p, a["norm_weight"], "int32")), TypeError, r"^norm_weight: dtype"),
    ("weight_wrong_K", False, REFUSAL_PATHS, lambda a, p: a.update(weight=_dense(a["weight"][:, :7])),
     ValueError, r"^weight: expected shape \[N, 8\]"),
    ("weight_not_contiguous", False, REFUSAL_PATHS, lambda a, p: a.update(weight=strided_last(a["weight"])),
     ValueError, r"^weight: must be C-contiguous"),
    ("out_wrong_width", False, REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:, :5]),
     ValueError, r"^out: expected shape \[3, 6\]"),
    ("out_for_silu_mul", False, REFUSAL_PATHS, lambda a, p: a.update(epilogue="silu_mul"),
     ValueError, r"^out: expected shape \[3, 3\]"),
    ("epilogue_unknown", False, REFUSAL_PATHS, lambda a, p: a.update(epilogue="gelu"),
     ValueError, r"^epilogue"),
    ("unit_offset_without_norm", False, REFUSAL_PATHS, lambda a, p: a.update(unit_offset=True),
     ValueError, r"^unit_offset: only with norm_weight"),
    ("residual_without_norm", True, REFUSAL_PATHS, _drop_norm,
     ValueError, r"^residual: only with norm_weight"),
    ("residual_out_missing", True, REFUSAL_PATHS, lambda a, p: a.pop("residual_out"),
     ValueError, r"^residual_out: required with residual"),
    ("norm_weight_short", True, REFUSAL_PATHS, lambda a, p: a.update(norm_weight=a["norm_weight"][:7]),
     ValueError, r"^norm_weight: expected shape \[8\]"),
    ("eps_zero", True, REFUSAL_PATHS, lambda a, p: a.update(eps=0.0), ValueError, r"^eps"),
    # (torch's schema types the flag itself)
    ("tensor_cores_not_bool", False, ("reference",), lambda a, p: a.update(tensor_cores="yes"),
     TypeError, r"^tensor_cores: expected a bool"),
    ("x_last_dim_strided", False, REFUSAL_PATHS, lambda a, p: a.update(x=strided_last(a["x"])),
     ValueError, r"^x: the last dimension must be contiguous"),
    ("out_rows_overlap", False, REFUSAL_PATHS, lambda a, p: a.update(out=_rows_overlap(a["out"])),
     ValueError, r"^out: rows overlap"),
    ("out_overlaps_x", False, REFUSAL_PATHS, lambda a, p: a.update(out=a["x"][:, :6]),
     ValueError, r"^out: overlaps x"),
    ("residual_out_is_residual", True, REFUSAL_PATHS, lambda a, p: a.update(residual_out=a["residual"]),
     ValueError, r"^residual_out: overlaps residual"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _LIN_BAD, ids=[c[0] for c in _LIN_BAD])
def test_linear_refuses_bad_input(path, case):
    name, norm, *rest = case
    run_refusal("linear", path, (name, *rest), _lin_call(norm), _LIN_ORDER,
                ("out", "residual_out"), _LIN_BF16)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("norm", [False, True])
def test_linear_good_input_passes_the_contract(path, norm):
    args = run_good("linear", path, _lin_call(norm), _LIN_ORDER, _LIN_BF16)
    h, w = _as_f64(args["x"]), _as_f64(args["weight"])       # the inputs as the path holds them
    if norm:
        h = h + _as_f64(args["residual"])
        h = h / np.sqrt((h * h).mean(1, keepdims=True) + 1e-5)
    assert rel_err(_as_f64(args["out"]), h @ w.T) < (3e-2 if path == "torch" else 1e-6)
