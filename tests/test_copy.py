"""copy / append_kv: reference, validation, GPU kernels against the reference."""
import numpy as np
import pytest

from specdec_lib import reference as ref
from conftest import needs_gpu, poison

DTYPES = ["float32", "float16", "bfloat16", "int8", "int64"]


# ------------------------------------------------------------------ reference (CPU)

def _paged_case(rng, B=3, hkv=2, D=8, page_size=4, max_pages=6, num_pages=20, qs=None, Ls=None):
    qs = list(rng.integers(0, 5, B)) if qs is None else qs
    Ls = list(rng.integers(0, page_size * (max_pages - 1) - 5, B)) if Ls is None else Ls
    cu_q = np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)
    T = int(cu_q[-1])
    pt = rng.permutation(num_pages)[: B * max_pages].reshape(B, max_pages).astype(np.int32)
    return dict(k=rng.standard_normal((T, hkv, D)).astype(np.float32),
                v=rng.standard_normal((T, hkv, D)).astype(np.float32),
                k_cache=np.full((num_pages, page_size, hkv, D), np.nan, np.float32),
                v_cache=np.full((num_pages, page_size, hkv, D), np.nan, np.float32),
                page_table=pt, seq_lens=np.array(Ls, np.int32), cu_q=cu_q)


def test_append_kv_reference_positions(rng):
    c = _paged_case(rng, B=2, qs=[3, 2], Ls=[5, 0], page_size=4)
    ref.append_kv(**c)
    for b, (L, q) in enumerate([(5, 3), (0, 2)]):
        for i in range(q):
            pos = L + i
            page = c["page_table"][b, pos // 4]
            np.testing.assert_array_equal(c["k_cache"][page, pos % 4], c["k"][c["cu_q"][b] + i])
            np.testing.assert_array_equal(c["v_cache"][page, pos % 4], c["v"][c["cu_q"][b] + i])
    written = np.isfinite(c["k_cache"][..., 0, 0]).sum()
    assert written == 5


def test_append_kv_reference_skips_finished(rng):
    c = _paged_case(rng, B=2, qs=[2, 2], Ls=[0, 0])
    ref.append_kv(**c, finished=np.array([True, False]))
    assert np.isfinite(c["k_cache"][..., 0, 0]).sum() == 2


@pytest.mark.parametrize("bad,match", [
    (dict(seq_lens=np.array([-1, 0, 0], np.int32)), "seq_lens"),
    (dict(cu_q=np.array([0, 2, 1, 3], np.int32)), "cu_q"),
    (dict(Ls=[24, 0, 0]), "page_table"),
])
def test_append_kv_reference_rejects(rng, bad, match):
    kw = dict(B=3, qs=[1, 1, 1], Ls=[0, 0, 0])
    if "Ls" in bad:
        kw["Ls"] = bad.pop("Ls")
    c = _paged_case(rng, **kw)
    c.update(bad)
    before = c["k_cache"].copy()
    with pytest.raises(ValueError, match=match):
        ref.append_kv(**c)
    np.testing.assert_array_equal(c["k_cache"], before)


def test_append_kv_reference_bad_page_id(rng):
    c = _paged_case(rng, B=1, qs=[2], Ls=[0])
    c["page_table"][0, 0] = 999
    with pytest.raises(ValueError, match="page id 999"):
        ref.append_kv(**c)


def test_copy_reference_broadcast():
    dst = np.zeros((3, 4), np.float32)
    ref.copy(dst, np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(dst, np.tile(np.arange(4), (3, 1)))
    with pytest.raises(ValueError, match="src"):
        ref.copy(dst, np.zeros(3, np.float32))


# ------------------------------------------------------------------ validation without a GPU

def test_ops_reject_host_arrays():
    from specdec_lib import ops
    a = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="dst"):
        ops.copy(a, a)


# ------------------------------------------------------------------ GPU

def _host_data(rng, shape, dtype):
    from specdec_lib.dtypes import to_host_storage, host_dtype
    if dtype in ("float32", "float16", "bfloat16"):
        return to_host_storage(rng.standard_normal(shape), dtype)
    info = np.iinfo(host_dtype(dtype))
    return rng.integers(info.min, info.max, shape, dtype=host_dtype(dtype), endpoint=True)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (1000003,), (7, 33), (3, 5, 129), (2, 3, 4, 1031)])
def test_copy_contiguous(rng, dtype, shape):
    from specdec_lib import DeviceArray, ops
    src = _host_data(rng, shape, dtype)
    d_src = DeviceArray.from_numpy(src, dtype=dtype)
    d_dst = poison(shape, dtype)
    ops.copy(d_dst, d_src)
    np.testing.assert_array_equal(d_dst.to_numpy(), src)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "uint64"])
def test_copy_broadcast_and_strided(rng, dtype):
    cp = pytest.importorskip("cupy")
    from specdec_lib import DeviceArray, ops
    # stride-0 broadcast source: one row to many
    row = _host_data(rng, (1, 257), dtype)
    d_dst = poison((9, 257), dtype)
    ops.copy(d_dst, DeviceArray.from_numpy(row, dtype=dtype))
    np.testing.assert_array_equal(d_dst.to_numpy(), np.broadcast_to(row, (9, 257)))
    # a transposed (non-contiguous) source through cupy's __cuda_array_interface__
    if dtype != "bfloat16":
        h = _host_data(rng, (5, 6, 7), dtype)
        src = cp.asarray(h).transpose(2, 0, 1)
        dst = poison((7, 5, 6), dtype)
        ops.copy(dst, src)
        np.testing.assert_array_equal(dst.to_numpy(), h.transpose(2, 0, 1))


@needs_gpu
def test_copy_torch_bf16_and_dlpack(rng):
    torch = pytest.importorskip("torch")
    from specdec_lib import ops
    x = torch.randn(33, 65, device="cuda", dtype=torch.bfloat16)
    y = torch.full_like(x, float("nan"))
    ops.copy(y, x[:, :].t().contiguous().t())
    torch.cuda.synchronize()
    assert torch.equal(x, y)
    z = torch.full((1000,), float("nan"), device="cuda")
    w = torch.arange(1000, device="cuda", dtype=torch.float32)

    class DL:   # only the DLPack protocol
        def __init__(self, t): self.t = t
        def __dlpack__(self, **kw): return self.t.__dlpack__(**kw)
        def __dlpack_device__(self): return self.t.__dlpack_device__()
    ops.copy(DL(z), DL(w))
    torch.cuda.synchronize()
    assert torch.equal(z, w)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int8"])
@pytest.mark.parametrize("page_size,hkv,D", [(1, 1, 64), (16, 8, 128), (64, 2, 256), (256, 4, 64),
                                             (4, 3, 5)])
def test_append_kv_gpu(rng, dtype, page_size, hkv, D):
    from specdec_lib import DeviceArray, ops
    B, max_pages = 5, 8 if page_size >= 16 else 40
    num_pages = B * max_pages + 3
    qs = [1, 0, 4, 16, 3]
    cap = page_size * max_pages
    Ls = [0, 3, page_size - 1, page_size, cap - 3]
    c = _paged_case(rng, B=B, hkv=hkv, D=D, page_size=page_size, max_pages=max_pages,
                    num_pages=num_pages, qs=qs, Ls=Ls)
    fin = np.array([0, 0, 0, 1, 0], np.uint8)
    k = _host_data(rng, c["k"].shape, dtype)
    v = _host_data(rng, c["v"].shape, dtype)
    cache_shape = c["k_cache"].shape
    # expected: the reference run on host copies of the poisoned caches
    d_kc, d_vc = poison(cache_shape, dtype), poison(cache_shape, dtype)
    k_exp, v_exp = d_kc.to_numpy(), d_vc.to_numpy()
    ref.append_kv(k, v, k_exp, v_exp, c["page_table"], c["seq_lens"], c["cu_q"], fin.astype(bool))
    ops.append_kv(DeviceArray.from_numpy(k, dtype=dtype), DeviceArray.from_numpy(v, dtype=dtype),
                  d_kc, d_vc, DeviceArray.from_numpy(c["page_table"]),
                  DeviceArray.from_numpy(c["seq_lens"]), DeviceArray.from_numpy(c["cu_q"]),
                  DeviceArray.from_numpy(fin))
    np.testing.assert_array_equal(d_kc.to_numpy().view(np.uint8), k_exp.view(np.uint8))
    np.testing.assert_array_equal(d_vc.to_numpy().view(np.uint8), v_exp.view(np.uint8))


@needs_gpu
def test_append_kv_gpu_rejects_before_launch(rng):
    from specdec_lib import DeviceArray, ops
    c = _paged_case(rng, B=2, qs=[2, 2], Ls=[0, 4], page_size=4, max_pages=3, num_pages=10)
    dev = {n: DeviceArray.from_numpy(a) for n, a in c.items()}
    dev["k_cache"] = poison(c["k_cache"].shape, "float32")
    dev["v_cache"] = poison(c["v_cache"].shape, "float32")

    def untouched():
        assert np.all(dev["k_cache"].to_numpy().view(np.uint32) == 0xFFFFFFFF)

    cases = [
        (dict(seq_lens=DeviceArray.from_numpy(np.array([0, 11], np.int32))), ValueError, "page_table"),
        (dict(seq_lens=DeviceArray.from_numpy(np.array([-2, 0], np.int32))), ValueError, "seq_lens"),
        (dict(page_table=DeviceArray.from_numpy(np.full((2, 3), 77, np.int32))), ValueError, "page id"),
        (dict(k=DeviceArray.from_numpy(c["k"].astype(np.float16))), TypeError, "k: dtype"),
        (dict(v=DeviceArray.from_numpy(c["v"][:, :1].copy())), ValueError, "v: expected shape"),
        (dict(seq_lens=DeviceArray.from_numpy(np.zeros(3, np.int32))), ValueError, "seq_lens"),
        (dict(cu_q=DeviceArray.from_numpy(np.array([0, 2, 4], np.int64))), TypeError, "cu_q"),
        (dict(k=c["k"]), TypeError, "k:"),
    ]
    for override, exc, match in cases:
        args = dict(dev, **override)
        with pytest.raises(exc, match=match):
            ops.append_kv(**args)
        untouched()


# ---------------------------------------------------------------- the argument contract (CPU)
from conftest import REFUSAL_PATHS, assert_refused, call_op, on_path, strided_last  # noqa: E402
from conftest import cast as _cast, vals as _vals, zeros_on as _new  # noqa: E402

_APPEND_ORDER = ("k", "v", "k_cache", "v_cache", "page_table", "seq_lens", "cu_q", "finished")


def _append_kv_call(rng):
    T, Hkv, D, pages, page = 5, 2, 8, 4, 4
    return {"k": rng.standard_normal((T, Hkv, D)).astype(np.float32),
            "v": rng.standard_normal((T, Hkv, D)).astype(np.float32),
            "k_cache": np.zeros((pages, page, Hkv, D), np.float32),
            "v_cache": np.zeros((pages, page, Hkv, D), np.float32),
            "page_table": np.array([[0, 1], [2, 3]], np.int32),
            "seq_lens": np.array([1, 3], np.int32), "cu_q": np.array([0, 2, 5], np.int32),
            "finished": None}


_BF16_CACHE = {"k": "bfloat16", "v": "bfloat16", "k_cache": "bfloat16", "v_cache": "bfloat16"}





# (case id, paths it applies to, break(args, path), exception, message start)
_APPEND_KV_BAD = [
    ("k_float32_for_bf16_cache", ("torch",), lambda a, p: a.update(k=_cast(p, a["k"], "float32")),
     TypeError, r"^k: dtype"),
    ("page_table_int64", ("torch",), lambda a, p: a.update(page_table=_cast(p, a["page_table"], "int64")),
     TypeError, r"^page_table: dtype"),
    ("seq_lens_float32", REFUSAL_PATHS, lambda a, p: a.update(seq_lens=_cast(p, a["seq_lens"], "float32")),
     TypeError, r"^seq_lens: dtype"),
    ("k_wrong_head_dim", REFUSAL_PATHS, lambda a, p: a.update(k=a["k"][..., :4]),
     ValueError, r"^k: expected shape"),
    ("v_wrong_rows", REFUSAL_PATHS, lambda a, p: a.update(v=a["v"][:3]), ValueError, r"^v: expected shape"),
    ("k_head_dim_not_contiguous", REFUSAL_PATHS, lambda a, p: a.update(k=strided_last(a["k"])),
     ValueError, r"^k: the head dimension must be contiguous"),
    ("cu_q_decreasing", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 3, 2])),
     ValueError, r"^cu_q: must start at 0, never decrease"),
    ("cu_q_ends_before_T", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 2, 4])),
     ValueError, r"^cu_q: must .* end at T=5"),
    ("seq_lens_negative", REFUSAL_PATHS, lambda a, p: a["seq_lens"].__setitem__(0, -1),
     ValueError, r"^seq_lens: negative"),
    ("page_id_outside_pool", REFUSAL_PATHS, lambda a, p: a["page_table"].__setitem__((1, 1), 9),
     ValueError, r"^page_table: sequence 1 uses page id 9"),
    ("page_table_too_narrow", REFUSAL_PATHS, lambda a, p: a.update(page_table=a["page_table"][:, :1]),
     ValueError, r"^page_table: sequence 1 writes position"),
    ("cu_q_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(cu_q=a["cu_q"][:2]),
     ValueError, r"^cu_q: expected shape"),
]





@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _APPEND_KV_BAD, ids=[c[0] for c in _APPEND_KV_BAD])
def test_append_kv_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _append_kv_call(rng), _BF16_CACHE)
    mutate(args, path)
    a = [args[n] for n in _APPEND_ORDER]
    assert_refused(lambda: call_op(path, "append_kv", a), exc, match, [args["k_cache"], args["v_cache"]])


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_append_kv_good_input_passes_the_contract(path, rng):
    args = on_path(path, _append_kv_call(rng), _BF16_CACHE)
    call_op(path, "append_kv", [args[n] for n in _APPEND_ORDER])
    kc = np.asarray(args["k_cache"].float() if path == "torch" else args["k_cache"])
    assert np.count_nonzero(kc) > 0


_COPY_BAD = [
    ("src_other_dtype", lambda d, s, p: (d, _cast(p, s, "float64")), TypeError, r"^src: dtype"),
    ("src_does_not_broadcast", lambda d, s, p: (d, s[:, :3]), ValueError, r"^src: shape"),
    ("dst_five_dims", lambda d, s, p: (d.reshape(1, 1, 2, 3, 4), s), ValueError, r"^dst: 1 to 4"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _COPY_BAD, ids=[c[0] for c in _COPY_BAD])
def test_copy_refuses_bad_input(path, case, rng):
    name, mutate, exc, match = case
    args = on_path(path, {"dst": np.zeros((6, 4), np.float32),
                          "src": rng.standard_normal((6, 4)).astype(np.float32)})
    dst, src = mutate(args["dst"], args["src"], path)
    assert_refused(lambda: call_op(path, "copy", [dst, src]), exc, match, [dst])
