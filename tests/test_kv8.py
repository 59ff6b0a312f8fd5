"""8-bit paged KV caches (issue 32): append_kv / rope_append_kv quantising on write and
verify_attention reading fp8_e4m3 / int8 caches. CPU: the reference ops against
reference/kvquant.py and the argument contract (bad scales refused, outputs untouched) on
the reference and eager torch paths. GPU (skipped without one; run natively and with
SPECDEC_FORCE_ARCH=75 / 80): the kernels byte for byte (quantise on write) and by relative
norm (attention) against the reference."""
import numpy as np
import pytest

from specdec_lib import reference as ref
from specdec_lib.reference import kvquant as kq
from conftest import REFUSAL_PATHS, assert_refused, call_op, needs_gpu, on_path, poison, rel_err

FMTS = ("fp8", "int8")


def _paged(rng, T=5, Hkv=2, D=16, pages=4, page=4, src=np.float32):
    return {"k": (rng.standard_normal((T, Hkv, D)) * 3).astype(src),
            "v": (rng.standard_normal((T, Hkv, D)) * 3).astype(src),
            "page_table": np.array([[0, 1], [2, 3]], np.int32),
            "seq_lens": np.array([1, 3], np.int32), "cu_q": np.array([0, 2, 5], np.int32),
            "finished": None, "pages": pages, "page": page}


def _caches(fmt, pages, page, Hkv, D, per_tensor=False):
    if fmt == "fp8":
        return dict(k_cache=np.full((pages, page, Hkv, D), 0x55, np.uint8),
                    v_cache=np.full((pages, page, Hkv, D), 0x55, np.uint8),
                    k_scale=np.array([0.05] if per_tensor else np.linspace(0.02, 0.05, Hkv),
                                     np.float32),
                    v_scale=np.array([0.03] if per_tensor else np.linspace(0.01, 0.04, Hkv),
                                     np.float32))
    return dict(k_cache=np.full((pages, page, Hkv, D), 7, np.int8),
                v_cache=np.full((pages, page, Hkv, D), 7, np.int8),
                k_params=np.full((pages, page, Hkv, 2), -1.0, np.float32),
                v_params=np.full((pages, page, Hkv, 2), -1.0, np.float32))


def _targets(c):
    out = []
    for b in range(len(c["seq_lens"])):
        for t in range(c["cu_q"][b], c["cu_q"][b + 1]):
            pos = c["seq_lens"][b] + t - c["cu_q"][b]
            out.append((t, c["page_table"][b, pos // c["page"]], pos % c["page"]))
    return out


_QKW = ("k_scale", "v_scale", "k_params", "v_params")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("per_tensor", [False, True], ids=["per_head", "per_tensor"])
def test_append_kv_quantised_reference(rng, fmt, per_tensor):
    c = _paged(rng)
    T, Hkv, D = c["k"].shape
    q = _caches(fmt, c["pages"], c["page"], Hkv, D, per_tensor)
    before = {n: q[n].copy() for n in q}
    ref.append_kv(c["k"], c["v"], q["k_cache"], q["v_cache"], c["page_table"], c["seq_lens"],
                  c["cu_q"], **{n: q[n] for n in _QKW if n in q})
    written = np.zeros(q["k_cache"].shape[:2], bool)
    for t, page, slot in _targets(c):
        written[page, slot] = True
        for x, cache, kw in ((c["k"], "k_cache", "k"), (c["v"], "v_cache", "v")):
            if fmt == "fp8":
                s = q[f"{kw}_scale"].reshape(-1, 1)
                assert np.array_equal(q[cache][page, slot], kq.fp8_quantize(x[t], s))
            else:
                codes, params = kq.int8_quantize(x[t])
                assert np.array_equal(q[cache][page, slot], codes)
                assert np.array_equal(q[f"{kw}_params"][page, slot], params)
    for n in ("k_cache", "v_cache") + (("k_params", "v_params") if fmt == "int8" else ()):
        assert np.array_equal(q[n][~written], before[n][~written]), f"{n}: wrote an unowned slot"


@pytest.mark.parametrize("fmt", FMTS)
def test_append_kv_quantised_reference_bf16_source(rng, fmt):
    """numpy uint16 k / v are bfloat16 bits: quantised from their float32 values."""
    from specdec_lib.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
    c = _paged(rng)
    kb, vb = f32_to_bf16_bits(c["k"]), f32_to_bf16_bits(c["v"])
    T, Hkv, D = c["k"].shape
    q1 = _caches(fmt, c["pages"], c["page"], Hkv, D)
    q2 = _caches(fmt, c["pages"], c["page"], Hkv, D)
    args = (c["page_table"], c["seq_lens"], c["cu_q"])
    ref.append_kv(kb, vb, q1["k_cache"], q1["v_cache"], *args, **{n: q1[n] for n in _QKW if n in q1})
    ref.append_kv(bf16_bits_to_f32(kb), bf16_bits_to_f32(vb), q2["k_cache"], q2["v_cache"], *args,
                  **{n: q2[n] for n in _QKW if n in q2})
    for n in q1:
        assert np.array_equal(q1[n], q2[n])


@pytest.mark.parametrize("fmt", FMTS)
def test_rope_append_kv_quantised_reference_is_rope_then_append(rng, fmt):
    T, Hq, Hkv, D = 5, 4, 2, 16
    c = _paged(rng, T=T, Hkv=Hkv, D=D)
    qx = rng.standard_normal((T, Hq, D)).astype(np.float32)
    pos = np.array([3, 4, 0, 1, 2], np.int32)
    inv = 1.0 / (10000 ** (np.arange(0, D, 2) / D))
    ang = np.arange(16)[:, None] * inv[None]
    cs = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
    qa = _caches(fmt, c["pages"], c["page"], Hkv, D)
    qb = _caches(fmt, c["pages"], c["page"], Hkv, D)
    q1, k1, v1 = qx.copy(), c["k"].copy(), c["v"].copy()
    ref.rope_append_kv(q1, k1, v1, pos, cs, qa["k_cache"], qa["v_cache"], c["page_table"],
                       c["seq_lens"], c["cu_q"], **{n: qa[n] for n in _QKW if n in qa})
    q2, k2 = qx.copy(), c["k"].copy()
    ref.rope(q2, k2, pos, cs)
    ref.append_kv(k2, c["v"], qb["k_cache"], qb["v_cache"], c["page_table"], c["seq_lens"],
                  c["cu_q"], **{n: qb[n] for n in _QKW if n in qb})
    assert np.array_equal(q1, q2) and np.array_equal(k1, k2)
    for n in qa:
        assert np.array_equal(qa[n], qb[n]), n


def _va_case(rng, fmt, D=64, Hq=4, Hkv=2, page=4, qs=(3, 1), Ls=(9, 0), mags=None):
    """A paged case quantised by the reference; ``mags(pos)`` (optional): a factor per key
    position of every sequence (an array of positions in, factors out), applied to K and V
    before quantisation."""
    B = len(qs)
    cu = np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)
    T = int(cu[-1])
    need = max(-(-(L + q) // page) for L, q in zip(Ls, qs))
    pages = B * need + 1
    pt = rng.permutation(pages)[: B * need].reshape(B, need).astype(np.int32)
    kf = rng.standard_normal((pages, page, Hkv, D)).astype(np.float32)
    vf = rng.standard_normal((pages, page, Hkv, D)).astype(np.float32)
    if mags is not None:
        for b, (L, q) in enumerate(zip(Ls, qs)):
            pos = np.arange(L + q)
            f = np.asarray(mags(pos), np.float32)[:, None, None]
            kf[pt[b, pos // page], pos % page] *= np.cbrt(f)   # K milder: keep softmax broad
            vf[pt[b, pos // page], pos % page] *= f
    c = dict(q=rng.standard_normal((T, Hq, D)).astype(np.float16), page_table=pt,
             seq_lens=np.array(Ls, np.int32), cu_q=cu, kf=kf, vf=vf)
    if fmt == "fp8":
        ks = (np.abs(kf).max(axis=(0, 1, 3)) / 448).astype(np.float32)
        vs = (np.abs(vf).max(axis=(0, 1, 3)) / 448).astype(np.float32)
        c.update(k_cache=kq.fp8_quantize(kf, ks[:, None]), v_cache=kq.fp8_quantize(vf, vs[:, None]),
                 kw=dict(k_scale=ks, v_scale=vs))
    else:
        kc, kp = kq.int8_quantize(kf)
        vc, vp = kq.int8_quantize(vf)
        c.update(k_cache=kc, v_cache=vc, kw=dict(k_params=kp, v_params=vp))
    return c


def _va_dequant(c):
    from specdec_lib.reference.attention import dequantize_cache
    kw = c["kw"]
    return (dequantize_cache(c["k_cache"], kw.get("k_scale"), kw.get("k_params")),
            dequantize_cache(c["v_cache"], kw.get("v_scale"), kw.get("v_params")))


@pytest.mark.parametrize("fmt", FMTS)
def test_verify_attention_8bit_reference(rng, fmt):
    c = _va_case(rng, fmt)
    T, Hq, D = c["q"].shape
    args = (c["page_table"], c["seq_lens"], c["cu_q"])
    out8, lse8 = np.zeros((T, Hq, D), np.float64), np.zeros((T, Hq), np.float64)
    ref.verify_attention(c["q"].astype(np.float64), c["k_cache"], c["v_cache"], *args, out8,
                         lse_out=lse8, **c["kw"])
    kd, vd = _va_dequant(c)
    outd, lsed = np.zeros_like(out8), np.zeros_like(lse8)
    ref.verify_attention(c["q"].astype(np.float64), kd, vd, *args, outd, lse_out=lsed)
    assert np.array_equal(out8, outd) and np.array_equal(lse8, lsed)
    # and close to attention over the unquantised cache (the formats are sane)
    outf = np.zeros_like(out8)
    ref.verify_attention(c["q"].astype(np.float64), c["kf"], c["vf"], *args, outf)
    assert rel_err(out8, outf) < (0.08 if fmt == "fp8" else 0.02)


# ---------------------------------------------------------------- contract refusals
def _append_args(rng, fmt):
    c = _paged(rng)
    T, Hkv, D = c["k"].shape
    q = _caches(fmt, c["pages"], c["page"], Hkv, D)
    a = {n: c[n] for n in ("k", "v", "page_table", "seq_lens", "cu_q")}
    a.update(q)
    return a


_ORDER = ("k", "v", "k_cache", "v_cache", "page_table", "seq_lens", "cu_q")


def _call_append(path, a):
    kw = {n: a[n] for n in _QKW if a.get(n) is not None}
    return call_op(path, "append_kv", [a[n] for n in _ORDER], kw)


def _set(name, value):
    def f(a, path):
        a[name] = _as(path, value)
    return f


def _as(path, x):
    if path == "reference" or not isinstance(x, np.ndarray):
        return x
    import torch
    return torch.from_numpy(x.copy())


_BAD = [
    ("fp8", "k_scale_zero", _set("k_scale", np.array([0.1, 0.0], np.float32)), ValueError,
     r"^k_scale: scale 0.0 of KV head 1 must be finite"),
    ("fp8", "v_scale_negative", _set("v_scale", np.array([-1.0], np.float32)), ValueError,
     r"^v_scale: scale -1.0 of KV head 0"),
    ("fp8", "k_scale_nan", _set("k_scale", np.array([np.nan, 1], np.float32)), ValueError,
     r"^k_scale: scale nan"),
    ("fp8", "k_scale_inf", _set("k_scale", np.array([np.inf, 1], np.float32)), ValueError,
     r"^k_scale: scale inf"),
    ("fp8", "k_scale_subnormal", _set("k_scale", np.array([1e-40, 1], np.float32)), ValueError,
     r"^k_scale: scale"),
    ("fp8", "k_scale_wrong_shape", _set("k_scale", np.ones(3, np.float32)), ValueError,
     r"^k_scale: expected shape \[2\]"),
    ("fp8", "k_scale_2d", _set("k_scale", np.ones((2, 1), np.float32)), ValueError,
     r"^k_scale: expected 1 dimensions"),
    ("fp8", "k_scale_float64", _set("k_scale", np.ones(2, np.float64)), TypeError,
     r"^k_scale: dtype must be float32"),
    ("fp8", "v_scale_missing", _set("v_scale", None), TypeError, r"^v_scale: required"),
    ("fp8", "cache_int8_for_fp8", _set("k_cache", np.zeros((4, 4, 2, 16), np.int8)), TypeError,
     r"^k_cache: a fp8 cache"),
    ("fp8", "cache_float_for_fp8", _set("v_cache", np.zeros((4, 4, 2, 16), np.float16)), TypeError,
     r"^v_cache: a fp8 cache"),
    ("fp8", "mixed_formats", _set("k_params", np.zeros((4, 4, 2, 2), np.float32)), TypeError,
     r"^k_scale/v_scale \(fp8 cache\) and k_params"),
    ("int8", "k_params_wrong_shape", _set("k_params", np.zeros((4, 4, 2, 3), np.float32)),
     ValueError, r"^k_params: expected shape"),
    ("int8", "v_params_float16", _set("v_params", np.zeros((4, 4, 2, 2), np.float16)), TypeError,
     r"^v_params: dtype must be float32"),
    ("int8", "k_params_missing", _set("k_params", None), TypeError, r"^k_params: required"),
    ("int8", "cache_uint8_for_int8", _set("k_cache", np.zeros((4, 4, 2, 16), np.uint8)), TypeError,
     r"^k_cache: an int8 cache"),
    ("int8", "k_int32", _set("k", np.zeros((5, 2, 16), np.int32)), TypeError, r"^k: dtype"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _BAD, ids=[c[1] for c in _BAD])
def test_append_kv_8bit_refuses_bad_input(path, case, rng):
    fmt, _, mutate, exc, match = case
    a = on_path(path, _append_args(rng, fmt))
    mutate(a, path)
    outs = [a["k_cache"], a["v_cache"], a.get("k_params"), a.get("v_params")]
    assert_refused(lambda: _call_append(path, a), exc, match, outs)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("fmt", FMTS)
def test_append_kv_8bit_good_input_passes(path, fmt, rng):
    a = on_path(path, _append_args(rng, fmt))
    before = np.asarray(a["k_cache"]).copy()
    _call_append(path, a)
    assert not np.array_equal(np.asarray(a["k_cache"]), before)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("fmt", FMTS)
def test_verify_attention_8bit_refuses_bad_scales(path, fmt, rng):
    c = _va_case(rng, fmt)
    T, Hq, D = c["q"].shape
    a = on_path(path, dict(q=c["q"], k_cache=c["k_cache"], v_cache=c["v_cache"],
                           page_table=c["page_table"], seq_lens=c["seq_lens"], cu_q=c["cu_q"],
                           out=np.full((T, Hq, D), 7, np.float16), **c["kw"]))
    pos = [a[n] for n in ("q", "k_cache", "v_cache", "page_table", "seq_lens", "cu_q", "out")]
    if fmt == "fp8":
        bad = dict(k_scale=_as(path, np.array([1.0, -2.0], np.float32)), v_scale=a["v_scale"])
        match = r"^k_scale: scale -2.0 of KV head 1"
        exc = ValueError
    else:
        bad = dict(k_params=a["k_params"], v_params=_as(path, np.zeros((1, 2), np.float32)))
        match = r"^v_params: expected 4 dimensions|^v_params: expected shape"
        exc = ValueError
    assert_refused(lambda: call_op(path, "verify_attention", pos, bad), exc, match, [a["out"]])
    # and a 16-bit q with an 8-bit cache but no scales: the cache dtype is refused
    assert_refused(lambda: call_op(path, "verify_attention", pos), TypeError, r"^k_cache: dtype",
                   [a["out"]])


def test_torch_float8_cache_dtype_maps():
    torch = pytest.importorskip("torch")
    from specdec_lib.contract import HostArg
    t = torch.zeros((2, 3), dtype=torch.float8_e4m3fn)
    a = HostArg("k_cache", t)
    assert a.dtype == "fp8_e4m3" and a.itemsize == 1
    from specdec_lib.dtypes import canonical
    assert canonical("float8_e4m3fn") == canonical(torch.float8_e4m3fn) == "fp8_e4m3"


# ---------------------------------------------------------------- GPU
def _dev(x, dtype=None):
    from specdec_lib import DeviceArray
    return DeviceArray.from_numpy(x, dtype=dtype) if dtype else DeviceArray.from_numpy(x)


_SRC = {"float32": np.float32, "float16": np.float16, "bfloat16": None}


def _src_host(x, dtype):
    from specdec_lib.dtypes import to_host_storage
    return to_host_storage(x, dtype)


@needs_gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("D,Hkv,page", [(128, 8, 16), (64, 2, 1), (256, 1, 64), (40, 3, 4),
                                        (128, 16, 16), (64, 12, 8)])
@pytest.mark.parametrize("launch", [None, (1, 4, None), (2, 3, None), (1, 2, 3), (2, 1, 5)],
                         ids=["auto", "w1r4", "w2r3", "w1r2g3", "w2r1g5"])
def test_append_kv_8bit_gpu_bytes_equal_reference(rng, fmt, dtype, D, Hkv, page, launch,
                                                   monkeypatch):
    """Every launch shape (warps per token, tokens per CTA, CTAs) writes the reference's
    bytes: the default takes one token a CTA at this size, the forced ones several, the
    small grids runs of tokens a warp (each loaded while the one before is written; the
    owner kept across a run, past an empty block), and Hkv=16 / 12 take more than one of
    the kernel's load groups a token. NaN and infinite elements too (int8 rows ignore NaN
    in their min / max; an infinite range gets scale 1), and rows whose minimum is a zero."""
    import importlib
    from specdec_lib import ops
    if launch is not None:
        tun = importlib.import_module("specdec_lib.ops.copy").TUNING
        monkeypatch.setitem(tun, "append_kv8_warps", launch[0])
        monkeypatch.setitem(tun, "append_kv8_rows", launch[1])
        monkeypatch.setitem(tun, "append_kv8_grid", launch[2])
    qs, Ls = [1, 4, 16, 0, 3, 29], [0, page - 1, 37, 11, 200, 5]   # an empty block too
    B = len(qs)
    cu = np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)
    T = int(cu[-1])
    need = max(-(-(L + q) // page) for L, q in zip(Ls, qs))
    pages = B * need + 2
    pt = rng.permutation(pages)[: B * need].reshape(B, need).astype(np.int32)
    k, v = rng.standard_normal((2, T, Hkv, D)) * 2
    k[0, 0, :] = k[0, 0, :1]   # an all-equal row
    k[1, 0, 3] = v[2, -1, :D // 2] = np.nan
    k[3, -1, 1] = np.inf
    v[5, 0, :] = -np.inf
    # zero minima of either sign (stored as +0): min.bf16x2 pairs and numpy keep different zeros
    k[2, 0] = np.abs(k[2, 0])
    k[2, 0, ::3], k[2, 0, 1::3] = -0.0, 0.0
    v[4, -1] = np.where(np.arange(D) % 2, 0.0, -0.0)
    v[6, 0] = -0.0
    k, v = _src_host(k, dtype), _src_host(v, dtype)
    q = _caches(fmt, pages, page, Hkv, D)
    host = {n: x.copy() for n, x in q.items()}
    ref.append_kv(k, v, host["k_cache"], host["v_cache"], pt, np.array(Ls, np.int32), cu,
                  **{n: host[n] for n in _QKW if n in host})
    d = {n: _dev(x) for n, x in q.items()}
    ops.append_kv(_dev(k, dtype), _dev(v, dtype), d["k_cache"], d["v_cache"], _dev(pt),
                  _dev(np.array(Ls, np.int32)), _dev(cu), **{n: d[n] for n in _QKW if n in d})
    for n in q:
        got = d[n].to_numpy()
        assert np.array_equal(got.view(np.uint8), host[n].view(np.uint8)), \
            f"{n}: {np.count_nonzero(got.view(np.uint8) != host[n].view(np.uint8))} bytes differ"


@needs_gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 128, 34])
def test_rope_append_kv_8bit_gpu_bytes_equal_reference(rng, fmt, dtype, D):
    from specdec_lib import ops
    from specdec_lib.dtypes import from_host_storage
    T, Hq, Hkv, page = 9, 8, 2, 4
    cu = np.array([0, 4, 9], np.int32)
    Ls = np.array([2, 11], np.int32)
    pt = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int32)
    pos = (Ls.repeat(np.diff(cu)) + np.concatenate([np.arange(4), np.arange(5)])).astype(np.int32)
    inv = 1.0 / (10000 ** (np.arange(0, D, 2) / D))
    ang = np.arange(64)[:, None] * inv[None]
    cs = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
    qx = _src_host(rng.standard_normal((T, Hq, D)), dtype)
    kx = _src_host(rng.standard_normal((T, Hkv, D)), dtype)
    vx = _src_host(rng.standard_normal((T, Hkv, D)), dtype)
    q = _caches(fmt, 8, page, Hkv, D)
    host = {n: x.copy() for n, x in q.items()}
    # the reference on float32 copies rounded back to the dtype (the rope reference's rounding)
    qh, kh = from_host_storage(qx, dtype).astype(np.float32), from_host_storage(kx, dtype).astype(np.float32)
    ref.rope(qh, kh, pos, cs)
    kh = _src_host(kh, dtype)
    d = {n: _dev(x) for n, x in q.items()}
    dq, dk = _dev(qx, dtype), _dev(kx, dtype)
    ops.rope_append_kv(dq, dk, _dev(vx, dtype), _dev(pos), _dev(cs), d["k_cache"], d["v_cache"],
                       _dev(pt), _dev(Ls), _dev(cu), **{n: d[n] for n in _QKW if n in d})
    got_k = dk.to_numpy()
    if dtype == "float32":
        # float32 rope differs from numpy's by an ulp here and there (FMA contraction); the
        # quantised bytes must then follow the kernel's own rotated K, which is checked close
        np.testing.assert_allclose(got_k, kh, rtol=1e-6, atol=1e-6)
        kh = got_k
    else:
        assert np.array_equal(got_k.view(np.uint8), kh.view(np.uint8))
    ref.append_kv(kh, vx, host["k_cache"], host["v_cache"], pt, Ls, cu,
                  **{n: host[n] for n in _QKW if n in host})
    for n in q:
        assert np.array_equal(d[n].to_numpy().view(np.uint8), host[n].view(np.uint8)), n


# the bf16 path's tolerances (test_attention.TOL)
_TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}


@needs_gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D,group,Hkv,page", [(64, 4, 2, 16), (128, 4, 8, 16), (256, 1, 2, 64),
                                               (128, 16, 1, 1)])
@pytest.mark.parametrize("mode", ["direct", "split", "row_invariant"])
def test_verify_attention_8bit_gpu(rng, fmt, dtype, D, group, Hkv, page, mode):
    from specdec_lib import DeviceArray, ops, runtime
    from specdec_lib.dtypes import from_host_storage, to_host_storage
    if dtype == "bfloat16" and runtime.arch_family(0) < 80:
        pytest.skip("bf16 needs the sm_80 path")
    qs, Ls = (4, 1, 16, 0, 7), (700, 0, 250, 3, 4095)
    c = _va_case(rng, fmt, D=D, Hq=group * Hkv, Hkv=Hkv, page=page, qs=qs, Ls=Ls)
    T, Hq, _ = c["q"].shape
    qf = from_host_storage(to_host_storage(c["q"].astype(np.float32), dtype), dtype)
    kd, vd = _va_dequant(c)
    exp, exp_lse = np.zeros((T, Hq, D)), np.zeros((T, Hq))
    ref.verify_attention(qf, kd, vd, c["page_table"], c["seq_lens"], c["cu_q"], exp, lse_out=exp_lse)
    kw = {n: _dev(x) for n, x in c["kw"].items()}
    B, max_pages = c["page_table"].shape
    if mode != "direct":
        n = ops.verify_attention_workspace_size(T, Hq, Hkv, D, B, max_pages * page,
                                                row_invariant=mode == "row_invariant")
        kw["workspace"] = DeviceArray.empty((max(n, 1),), "uint8")
        kw["row_invariant"] = mode == "row_invariant"
    out, lse = poison((T, Hq, D), dtype), poison((T, Hq), "float32")
    ops.verify_attention(_dev(to_host_storage(qf, dtype), dtype), _dev(c["k_cache"]),
                         _dev(c["v_cache"]), _dev(c["page_table"]), _dev(c["seq_lens"]),
                         _dev(c["cu_q"]), out, lse_out=lse, **kw)
    got = from_host_storage(out.to_numpy(), dtype)
    assert rel_err(got, exp) <= _TOL[dtype] and rel_err(lse.to_numpy(), exp_lse) <= 1e-4


@needs_gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("q_mag", [1e-6, 300.0], ids=["tiny_q", "large_q"])
@pytest.mark.parametrize("D", [64, 128])
def test_verify_attention_8bit_gpu_q_magnitudes(rng, fmt, dtype, q_mag, D):
    """Q . K runs in float16 for either q dtype: bf16 q is moved into float16 range by a
    per-row power of two (undone in the score scale); tiny and large q rows stay within the
    16-bit path's tolerance (large: a peaked softmax)."""
    from specdec_lib import ops, runtime
    from specdec_lib.dtypes import from_host_storage, to_host_storage
    if dtype == "bfloat16" and runtime.arch_family(0) < 80:
        pytest.skip("bf16 needs the sm_80 path")
    qs, Ls = (4, 1, 3), (200, 0, 37)
    c = _va_case(rng, fmt, D=D, Hq=8, Hkv=2, page=16, qs=qs, Ls=Ls)
    T, Hq, _ = c["q"].shape
    q = c["q"].astype(np.float32) * np.float32(q_mag / 3.0)
    q[0, 0, :] *= 0.0   # an all-zero row
    qf = from_host_storage(to_host_storage(q, dtype), dtype)
    kd, vd = _va_dequant(c)
    exp, exp_lse = np.zeros((T, Hq, D)), np.zeros((T, Hq))
    ref.verify_attention(qf, kd, vd, c["page_table"], c["seq_lens"], c["cu_q"], exp, lse_out=exp_lse)
    kw = {n: _dev(x) for n, x in c["kw"].items()}
    out, lse = poison((T, Hq, D), dtype), poison((T, Hq), "float32")
    ops.verify_attention(_dev(to_host_storage(qf, dtype), dtype), _dev(c["k_cache"]),
                         _dev(c["v_cache"]), _dev(c["page_table"]), _dev(c["seq_lens"]),
                         _dev(c["cu_q"]), out, lse_out=lse, **kw)
    got = from_host_storage(out.to_numpy(), dtype)
    assert rel_err(got, exp) <= _TOL[dtype]
    assert np.max(np.abs(lse.to_numpy() - exp_lse)) <= 1e-4 * max(1.0, np.max(np.abs(exp_lse)))


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("order", ["random", "rising", "falling", "offset"])
@pytest.mark.parametrize("mode", ["direct", "split"])
def test_verify_attention_int8_gpu_token_scales(rng, dtype, D, order, mode):
    """int8 P . V runs as P' = p s 2^E in float16 against the codes, E a running exponent per
    warp that drops when a key's s 2^E reaches 2^14: token magnitudes spanning 2^-12 .. 2^12
    in random order, rising (E drops mid-split) and falling (late keys' P' subnormal), and
    rows far from zero (V = 40 + small: the midpoint z + 128 s carries the value) stay within
    the 16-bit path's tolerance."""
    from specdec_lib import DeviceArray, ops, runtime
    from specdec_lib.dtypes import from_host_storage, to_host_storage
    if dtype == "bfloat16" and runtime.arch_family(0) < 80:
        pytest.skip("bf16 needs the sm_80 path")
    qs, Ls = (4, 1, 3), (900, 0, 300)
    mags = {"random": lambda pos: 2.0 ** rng.uniform(-12, 12, pos.shape),
            "rising": lambda pos: 2.0 ** np.linspace(-12, 12, pos.size),
            "falling": lambda pos: 2.0 ** np.linspace(12, -12, pos.size),
            "offset": lambda pos: 2.0 ** rng.uniform(-3, 3, pos.shape)}[order]
    c = _va_case(rng, "int8", D=D, Hq=8, Hkv=2, page=16, qs=qs, Ls=Ls, mags=mags)
    if order == "offset":   # V = 40 + x / 64 per element: a tiny range far from zero
        c["vf"] = (40.0 + c["vf"] / 64).astype(np.float32)
        c["v_cache"], c["kw"]["v_params"] = kq.int8_quantize(c["vf"])
    T, Hq, _ = c["q"].shape
    qf = from_host_storage(to_host_storage(c["q"].astype(np.float32), dtype), dtype)
    kd, vd = _va_dequant(c)
    exp = np.zeros((T, Hq, D))
    ref.verify_attention(qf, kd, vd, c["page_table"], c["seq_lens"], c["cu_q"], exp)
    kw = {n: _dev(x) for n, x in c["kw"].items()}
    if mode == "split":
        B, max_pages = c["page_table"].shape
        n = ops.verify_attention_workspace_size(T, Hq, 2, D, B, max_pages * 16, num_splits=4)
        kw.update(workspace=DeviceArray.empty((max(n, 1),), "uint8"), num_splits=4)
    out = poison((T, Hq, D), dtype)
    ops.verify_attention(_dev(to_host_storage(qf, dtype), dtype), _dev(c["k_cache"]),
                         _dev(c["v_cache"]), _dev(c["page_table"]), _dev(c["seq_lens"]),
                         _dev(c["cu_q"]), out, **kw)
    got = from_host_storage(out.to_numpy(), dtype)
    assert rel_err(got, exp) <= _TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("which", ["k", "v"])
def test_verify_attention_fp8_gpu_nan_code(rng, which):
    """A NaN code (0x7F) in the cache turns NaN the rows that attend it, on the native and
    the software E4M3 decode alike (the reference's fp8_dequantize), and no row of another
    sequence or KV head. In K that is exactly the attending rows (a masked score is -inf
    whatever the key); in V the sequence's other rows of that KV head may turn NaN too: a
    masked key's weight is 0 and 0 x NaN is NaN inside the tensor-core P V, as in any
    flash-style kernel, so the contract there is 'flagged, never silently wrong'."""
    from specdec_lib import ops
    D = 64
    c = _va_case(rng, "fp8", D=D, Hq=4, Hkv=2, page=4, qs=(3, 2), Ls=(9, 5))
    pt = c["page_table"]
    key = 10                       # sequence 0, key 10: rows 1, 2 (positions 10, 11) see it
    cache = c[f"{which}_cache"]
    cache[pt[0, key // 4], key % 4, 1, 7] = 0x7F
    T, Hq, _ = c["q"].shape
    kd, vd = _va_dequant(c)
    exp = np.zeros((T, Hq, D))
    ref.verify_attention(c["q"].astype(np.float64), kd, vd, pt, c["seq_lens"], c["cu_q"], exp)
    nan_rows = np.isnan(exp).any(axis=2)
    assert nan_rows.sum() == 2 * 2   # 2 rows x the 2 query heads of KV head 1
    out = poison((T, Hq, D), "float16")
    ops.verify_attention(_dev(c["q"]), _dev(c["k_cache"]), _dev(c["v_cache"]), _dev(pt),
                         _dev(c["seq_lens"]), _dev(c["cu_q"]), out,
                         **{n: _dev(x) for n, x in c["kw"].items()})
    got = out.to_numpy().astype(np.float64)
    got_nan = np.isnan(got).any(axis=2)
    assert got_nan[nan_rows].all(), "a row attending the NaN code must be NaN"
    may = nan_rows.copy()
    if which == "v":
        may[c["cu_q"][0]:c["cu_q"][1], 2:] = True   # sequence 0, KV head 1's query heads
    assert not got_nan[~may].any(), "a row of another sequence or KV head turned NaN"
    ok = ~got_nan
    assert rel_err(got[ok], exp[ok]) <= _TOL["float16"]
