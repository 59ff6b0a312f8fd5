"""8-bit KV caches in the Llama target (issue 32, end to end) on the CPU reference backend,
with a tiny random Llama (tests/test_llama.py's): ``LlamaTarget(kv_dtype=...)`` for fp8_e4m3
and int8.

* the caches hold the 8-bit codes (and int8's per-row params), the fp8 scales are recorded
  once, by the target's first pass, and kept;
* prefill == the verify-block forward over the same 8-bit cache (prefill's attention reads
  the dequantised cache too), caches bit for bit;
* speculative decoding (prompt lookup and a random MTP head, whose own cache stays 16-bit)
  == target-only decoding token for token with the same cache dtype;
* greedy tokens of the 8-bit cache against the 16-bit one (float64 on this backend): the
  share of positions whose argmax agrees, teacher-forced on the 16-bit run's sequences;
* bad kv_dtype values and bad fp8 scales are refused with the argument named.
"""
import numpy as np
import pytest

from specdec_lib.models.llama import KV_DTYPES, kv_dtype_name
from specdec_lib.orchestrator import Request, SpeculativeDecoder, make_backend
from test_llama import _tiny_target
from toy_models import skip_unless_torch_gpu

KV8 = ("fp8_e4m3", "int8")


def _prompts(seed, n=3):
    """Prompts with repeats (prompt lookup finds drafts in them)."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n):
        part = rng.integers(0, 50, 4 + b).tolist()
        out.append(part * 2 + rng.integers(0, 50, 2).tolist())
    return out


def _generate(target, draft, k, prompts, n_new=20):
    be = target.be
    dec = SpeculativeDecoder(target, draft, num_speculative_tokens=k, backend=be)
    res = dec.generate([Request(prompt=p, max_new_tokens=n_new) for p in prompts])
    return [r.tokens for r in res], dec.metrics


def _mtp_head(target, tmp_path, seed=1):
    from specdec_lib.models import heads
    from specdec_lib.models.llama_draft import LlamaDraftHead
    from types import SimpleNamespace
    cfg = heads.head_config("mtp", SimpleNamespace(**dict(vars(target.c), name="tiny")))
    t = heads.random_head_tensors("mtp", cfg, seed=seed, scale=0.3)
    for name in list(t):                  # the head's norms: ones; its lm_head: the target's
        if "shared_head.head" in name:
            del t[name]
    path = heads.save_head(str(tmp_path / "mtp"), t, cfg)
    return LlamaDraftHead.load(target, path, "mtp")


@pytest.mark.parametrize("kv_dtype", KV8)
def test_kv8_caches_and_scales(rng, kv_dtype):
    t = _tiny_target(rng, kv_dtype=kv_dtype)
    assert t.kv_dtype == kv_dtype and t.kv_scales is None
    t.reset(2, 16)
    kc, vc = t.kv[0]
    assert kc.dtype == (np.uint8 if kv_dtype == "fp8_e4m3" else np.int8) == vc.dtype
    if kv_dtype == "int8":
        assert set(t.kv_quant[0]) == {"k_params", "v_params"}
        assert t.kv_quant[0]["k_params"].shape == kc.shape[:3] + (2,)
    tok = rng.integers(0, 50, 7).astype(np.int32)
    counts = [7, 0]
    t.prefill(tok, np.arange(7, dtype=np.int32), np.array([0, 7, 7], np.int32),
              np.zeros(2, np.int32), np.zeros(2, np.uint8), row_counts=counts)
    if kv_dtype == "int8":
        assert t.kv_scales is None
        return
    ks, vs = t.kv_scales
    assert ks.shape == vs.shape == (2, t.nkv) and ks.dtype == np.float32
    assert (ks > 0).all() and (vs > 0).all()
    from specdec_lib.reference.kvquant import e4m3_decode
    for kc, vc in t.kv:     # the headroom: the recording pass's K/V use half the range
        assert np.abs(e4m3_decode(kc)).max() <= 224 and np.abs(e4m3_decode(vc)).max() <= 224
    t.reset(2, 16)           # recorded once per target: a reset keeps them, a new pass too
    t.prefill(tok[::-1].copy(), np.arange(7, dtype=np.int32), np.array([0, 7, 7], np.int32),
              np.zeros(2, np.int32), np.zeros(2, np.uint8), row_counts=counts)
    np.testing.assert_array_equal(t.kv_scales[0], ks)


@pytest.mark.parametrize("kv_dtype", KV8)
def test_kv8_speculative_equals_target_only(rng, kv_dtype, tmp_path):
    """Same cache dtype, token for token: prompt lookup (k=3) and a random MTP head (k=2,
    its own cache 16-bit) against target-only greedy decoding."""
    from specdec_lib.models.ngram import NgramDraft
    t = _tiny_target(rng, kv_dtype=kv_dtype)
    prompts = _prompts(3)
    base, _ = _generate(t, None, 0, prompts)
    spec, m = _generate(t, NgramDraft(t.be), 3, prompts)
    assert spec == base
    assert m.accepted > 0, m                     # some drafts were right: multi-row blocks
    head = _mtp_head(t, tmp_path)
    spec2, _ = _generate(t, head, 2, prompts)
    assert spec2 == base
    assert head.kv[0].dtype == t.m.kv            # the head's own cache: 16-bit, not 8-bit


def _agreement(t16, t8, prompts, n_new=24):
    """(agreeing positions, positions) of t8's argmax against t16's greedy tokens, each
    position scored teacher-forced on t16's final sequence; and the free-running runs'
    common prefix lengths."""
    base, _ = _generate(t16, None, 0, prompts, n_new)
    free, _ = _generate(t8, None, 0, prompts, n_new)
    agree = total = 0
    for p, out in zip(prompts, base):
        seq = list(p) + list(out)
        logits = t8.score(seq[:-1])[len(p) - 1:]
        agree += int((logits.argmax(axis=1) == np.asarray(out)).sum())
        total += len(out)
    prefix = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
              for x, y in zip(base, free)]
    return agree, total, prefix


@pytest.mark.parametrize("kv_dtype,least", [("fp8_e4m3", 0.9), ("int8", 0.95)])
def test_kv8_greedy_agrees_with_16bit_cache(kv_dtype, least):
    seed = 7
    t16 = _tiny_target(np.random.default_rng(seed))
    t8 = _tiny_target(np.random.default_rng(seed), kv_dtype=kv_dtype)
    agree, total, prefix = _agreement(t16, t8, _prompts(11, 4))
    print(f"{kv_dtype}: {agree}/{total} positions agree with the 16-bit cache; free-running "
          f"common prefixes {prefix}")
    assert agree >= least * total, (agree, total, prefix)


def test_bad_kv_dtype_refused(rng):
    for bad in ("int4", "float32", "e5m2", None, 3):
        with pytest.raises(ValueError, match="kv_dtype"):
            _tiny_target(rng, kv_dtype=bad)
    assert kv_dtype_name("bf16") == "bfloat16" and kv_dtype_name("fp8") == "fp8_e4m3"
    assert KV_DTYPES == ("bfloat16", "float16", "fp8_e4m3", "int8")
    from types import SimpleNamespace

    from specdec_lib.models.llama import kv_dtype_unsupported
    assert "'reference' or 'torch'" in kv_dtype_unsupported(SimpleNamespace(name="cuda"), "int8", 64)
    assert "head dim" in kv_dtype_unsupported(make_backend("reference"), "fp8_e4m3", 512)


def test_fp8_scales_given_and_bad_scales_refused(rng):
    t = _tiny_target(rng, kv_dtype="fp8_e4m3")
    n, h = 2, t.nkv
    for bad in (np.zeros((n, h)), np.full((n, h), np.nan), -np.ones((n, h)), np.ones((n, 3))):
        with pytest.raises(ValueError, match="k_scale"):
            t.set_kv_scales(bad, np.ones((n, h)))
    t.set_kv_scales(np.full(n, 0.05), np.full((n, h), 0.02))
    ks, vs = t.kv_scales
    np.testing.assert_array_equal(ks, np.full((n, h), 0.05, np.float32))
    t.reset(1, 16)
    t.prefill(np.arange(5, dtype=np.int32), np.arange(5, dtype=np.int32),
              np.array([0, 5], np.int32), np.zeros(1, np.int32), np.zeros(1, np.uint8),
              row_counts=[5])
    np.testing.assert_array_equal(t.kv_scales[1], np.full((n, h), 0.02, np.float32))
    t16 = _tiny_target(rng, kv_dtype="int8")
    with pytest.raises(ValueError, match="set_kv_scales"):
        t16.set_kv_scales(np.ones((n, h)), np.ones((n, h)))


def test_reference_16bit_kv_dtypes_keep_the_float64_cache(rng):
    for kv in ("bfloat16", "float16"):
        t = _tiny_target(rng, kv_dtype=kv)
        t.reset(1, 8)
        assert t.kv[0][0].dtype == np.float64 and t.kv_quant[0] == {}


@pytest.mark.parametrize("kv_dtype", KV8)
def test_torch_math_reads_the_cache_as_numpy_does(rng, kv_dtype):
    """The torch math's 8-bit helpers (cache rows of a block, dequantised reads, fp8 scales)
    on CPU tensors equal the numpy math's (the torch backend's prefill over an 8-bit cache;
    bf16 rounding of the read is the only difference)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from types import SimpleNamespace

    from specdec_lib.models.llama import FP8_SCALE_HEADROOM, _NumpyMath, _TorchMath
    import importlib
    ref_copy = importlib.import_module("specdec_lib.reference.copy")
    tm, nm = _TorchMath(SimpleNamespace(device=torch.device("cpu"))), _NumpyMath()
    ps, B, pages, H, D = 4, 3, 4, 2, 64
    pt = rng.permutation(B * pages).astype(np.int32).reshape(B, pages)
    sl = np.array([0, 3, 0], np.int32)
    cu = np.array([0, 5, 7, 13], np.int32)
    T = int(cu[-1])
    k = rng.standard_normal((T, H, D)).astype(np.float32)
    v = rng.standard_normal((T, H, D)).astype(np.float32)
    rows_n = nm.cache_rows(pt, sl, cu, T, ps)
    rows_t = tm.cache_rows(*(torch.from_numpy(a) for a in (pt, sl, cu)), T, ps)
    np.testing.assert_array_equal(rows_t.numpy(), rows_n)
    assert len(set(rows_n.tolist())) == T
    shape = (B * pages, ps, H, D)
    if kv_dtype == "fp8_e4m3":
        ks, vs = np.zeros(H, np.float32), np.zeros(H, np.float32)
        nm.fp8_scales(k, v, ks, vs, FP8_SCALE_HEADROOM)
        kt, vt = torch.zeros(H), torch.zeros(H)
        tm.fp8_scales(torch.from_numpy(k), torch.from_numpy(v), kt, vt, FP8_SCALE_HEADROOM)
        np.testing.assert_allclose(kt.numpy(), ks, rtol=1e-6)
        q8 = dict(k_scale=ks, v_scale=vs)
        kc, vc = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
    else:
        q8 = dict(k_params=np.zeros(shape[:3] + (2,), np.float32),
                  v_params=np.zeros(shape[:3] + (2,), np.float32))
        kc, vc = np.zeros(shape, np.int8), np.zeros(shape, np.int8)
    ref_copy.append_kv(k, v, kc, vc, pt, sl, cu, **q8)
    read = "read_fp8" if kv_dtype == "fp8_e4m3" else "read_int8"
    arg = "k_scale" if kv_dtype == "fp8_e4m3" else "k_params"
    want = getattr(nm, read)(kc, rows_n, q8[arg])
    tm.act = torch.float32                 # the read before its rounding to bf16
    got = getattr(tm, read)(torch.from_numpy(kc), rows_t, torch.from_numpy(q8[arg]))
    np.testing.assert_array_equal(got.numpy(), want.astype(np.float32))
    err = np.abs(want - k)
    if kv_dtype == "fp8_e4m3":          # 3 mantissa bits: half an ulp is 2^-4 relative
        assert (err <= 2.0 ** -4 * np.abs(k) + 2.0 ** -10 * q8["k_scale"][:, None]).all()
    else:                               # half a step of the row's (max - min) / 255
        assert err.max() < 0.03


def test_demo_kv_dtype_for_the_tiny_hybrid_refused(capsys):
    from specdec_lib.demo import main
    assert main(["--model", "tiny-hybrid", "--kv-dtype", "int8", "--no-progress"]) == 2
    assert "--kv-dtype int8" in capsys.readouterr().err


def _torch_gpu_target(rng, kv_dtype):
    skip_unless_torch_gpu()
    return _tiny_target(rng, backend="torch", kv_dtype=kv_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", KV8)
def test_kv8_torch_gpu_speculative_equals_target_only(rng, kv_dtype):
    """The torch backend on the GPU (the kernels' 8-bit append / attention, the recorded fp8
    scales, the device-side prefill gather): prompt lookup k=3 == target-only, eagerly and
    with every round a CUDA graph."""
    from specdec_lib.models.ngram import NgramDraft
    t = _torch_gpu_target(rng, kv_dtype)
    prompts = _prompts(3)
    base, _ = _generate(t, None, 0, prompts)
    spec, m = _generate(t, NgramDraft(t.be), 3, prompts)
    assert spec == base and m.accepted > 0, m
    dec = SpeculativeDecoder(t, NgramDraft(t.be), num_speculative_tokens=3, backend=t.be,
                             cuda_graph=True, max_len=64)
    res = dec.generate([Request(prompt=p, max_new_tokens=20) for p in prompts])
    assert [r.tokens for r in res] == base


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype,least", [("fp8_e4m3", 0.9), ("int8", 0.95)])
def test_kv8_torch_gpu_agrees_with_16bit_cache(kv_dtype, least):
    seed = 7
    t16 = _torch_gpu_target(np.random.default_rng(seed), "bfloat16")
    t8 = _torch_gpu_target(np.random.default_rng(seed), kv_dtype)
    agree, total, prefix = _agreement(t16, t8, _prompts(11, 4))
    print(f"torch {kv_dtype}: {agree}/{total} agree; free-running prefixes {prefix}")
    assert agree >= least * total, (agree, total, prefix)
