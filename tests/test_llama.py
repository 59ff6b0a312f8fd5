"""The Llama host model's own math (specdec_lib/models/llama.py) without a GGUF: the batched
prefill attention of the torch math on CPU tensors against its per-prompt loop and the
float64 numpy oracle, and a tiny random-weights LlamaTarget on the reference backend
(prefill of ragged prompts == the verify-block forward, K/V caches included)."""
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import needs_gpu, switched
from toy_models import skip_unless_torch_gpu, toy_llama
from specdec_lib.models.llama import SMALL_ROWS_MAX, LlamaTarget, _NumpyMath

COUNTS = [5, 0, 17, 1, 9, 0, 2]     # ragged prompts, empty slots between and at the end


def _qkv(rng, T, Hq=9, Hkv=3, D=64):
    return (rng.standard_normal((T, Hq, D)), rng.standard_normal((T, Hkv, D)),
            rng.standard_normal((T, Hkv, D)))


def test_numpy_prefill_attention_is_per_prompt_causal(rng):
    m = _NumpyMath()
    q, k, v = _qkv(rng, sum(COUNTS))
    out = np.full(q.shape, np.nan)
    m.prefill_attention(m.prefill_plan(COUNTS), q, k, v, 0.125, out)
    r0 = 0
    for n in COUNTS:
        for i in range(n):                       # row i of the prompt: keys 0..i, head h -> h // 3
            for h in range(q.shape[1]):
                s = k[r0:r0 + i + 1, h // 3] @ q[r0 + i, h] * 0.125
                p = np.exp(s - s.max())
                want = p @ v[r0:r0 + i + 1, h // 3] / p.sum()
                np.testing.assert_allclose(out[r0 + i, h], want, rtol=1e-12, atol=1e-12)
        r0 += n


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-6), ("bfloat16", 2e-2)])
def test_torch_prefill_attention_batched_equals_per_prompt(rng, dtype, tol):
    """_TorchMath on CPU tensors: one padded, masked SDPA call for all prompts == its
    per-prompt causal loop (and the float64 oracle); pad rows leak nothing (every output row
    finite, rows outside the prompts untouched)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from specdec_lib.models.llama import _TorchMath
    m = _TorchMath(SimpleNamespace(device=torch.device("cpu")))
    dt = getattr(torch, dtype)
    T = sum(COUNTS)
    qn, kn, vn = _qkv(rng, T + 3)                # 3 rows past the prompts: must stay untouched
    q, k, v = (torch.from_numpy(a).to(dt) for a in (qn, kn, vn))
    scale = 0.125
    plan = m.prefill_plan(COUNTS)
    assert plan["allowed"].shape == (5, 1, 17, 17)   # empty prompts dropped, padded to the longest
    out = torch.full(q.shape, float("nan"), dtype=dt)
    m.prefill_attention(plan, q, k, v, scale, out)
    assert torch.isfinite(out[:T]).all() and torch.isnan(out[T:]).all()
    loop = torch.full(q.shape, float("nan"), dtype=dt)
    r0 = 0
    for n in COUNTS:
        if n:
            loop[r0:r0 + n] = m.causal_attention(q[r0:r0 + n], k[r0:r0 + n], v[r0:r0 + n], scale)
        r0 += n
    got, per_prompt = out[:T].double().numpy(), loop[:T].double().numpy()
    assert np.linalg.norm(got - per_prompt) / np.linalg.norm(per_prompt) < tol
    oracle = np.full((T, 9, 64), np.nan)
    f64 = [a[:T].double().numpy() for a in (q, k, v)]
    _NumpyMath().prefill_attention(_NumpyMath().prefill_plan(COUNTS), *f64, scale, oracle)
    assert np.linalg.norm(got - oracle) / np.linalg.norm(oracle) < tol


def test_torch_prefill_plan_without_prompts_or_with_one(rng):
    """No prompt: nothing to do. One prompt (score(), B = 1): the plain causal call on its
    rows, no gather, same values as the batched path gives it."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from specdec_lib.models.llama import _TorchMath
    m = _TorchMath(SimpleNamespace(device=torch.device("cpu")))
    assert m.prefill_plan([0, 0]) is None
    out = torch.zeros(0, 2, 64)
    m.prefill_attention(None, out, out[:, :1], out[:, :1], 1.0, out)
    assert m.prefill_plan([0, 7, 0]) == {"single": (0, 7)}
    q, k, v = (torch.from_numpy(a).float() for a in _qkv(rng, 7))
    one = torch.full(q.shape, float("nan"))
    m.prefill_attention(m.prefill_plan([0, 7, 0]), q, k, v, 0.125, one)
    both = torch.full((9, 9, 64), float("nan"))
    q2, k2, v2 = (torch.cat([a, a[:2]]) for a in (q, k, v))
    m.prefill_attention(m.prefill_plan([7, 2]), q2, k2, v2, 0.125, both)
    assert torch.allclose(one, both[:7], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-6), ("bfloat16", 2e-2)])
def test_torch_prefill_plan_of_equal_prompts_is_one_batched_causal_call(rng, dtype, tol):
    """A grouped bucket pass (P prompts of n rows each, back to back, empty slots between
    them): the ``uniform`` plan, one causal SDPA call on a [P, n] view, gives the float64
    oracle's per-prompt attention and writes no row outside the prompts."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from specdec_lib.models.llama import _TorchMath
    m = _TorchMath(SimpleNamespace(device=torch.device("cpu")))
    counts = [0, 16, 16, 0, 16, 0]
    plan = m.prefill_plan(counts)
    assert plan == {"uniform": (0, 3, 16)}
    assert "rows" in m.prefill_plan([16, 15, 16])          # unequal: the padded, masked call
    dt = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(a).to(dt) for a in _qkv(rng, 48 + 2))
    out = torch.full(q.shape, float("nan"), dtype=dt)
    m.prefill_attention(plan, q, k, v, 0.125, out)
    assert torch.isnan(out[48:]).all()
    oracle = np.full((48, 9, 64), np.nan)
    _NumpyMath().prefill_attention(_NumpyMath().prefill_plan(counts),
                                   *(a[:48].double().numpy() for a in (q, k, v)), 0.125, oracle)
    got = out[:48].double().numpy()
    assert np.linalg.norm(got - oracle) / np.linalg.norm(oracle) < tol


def _tiny_target(rng, page_size=4, backend="reference", row_invariant=False, nq=4, nkv=2,
                 kv_dtype="bfloat16"):
    from specdec_lib.orchestrator import make_backend
    c, w = toy_llama(nq=nq, nkv=nkv, rng=rng)    # D=64: verify_attention takes D in {64, 128, 256}
    return LlamaTarget(c, w, make_backend(backend), page_size=page_size,
                       row_invariant=row_invariant, kv_dtype=kv_dtype)


def _block_and_steps(t, rng, n=6, seqs=1):
    """Logits of an n-row verify block of each of ``seqs`` sequences after a 3-token prefill
    (one pass of seqs x n rows), and of the same tokens fed one row a sequence per forward
    (each row's K/V appended by its own pass), as host float64 [seqs x n, V] (max_q given:
    the attention plans min(T, 16) rows a block by default, at most 16)."""
    xp = t.m
    tok = rng.integers(0, 50, (seqs, 3 + n)).astype(np.int32)
    as_dev = (lambda a: xp.table(a)) if xp.name == "torch" else (lambda a: a)
    host = (lambda a: a.double().cpu().numpy()) if xp.name == "torch" else np.asarray
    i32 = (lambda a: as_dev(np.ascontiguousarray(a, dtype=np.int32)))

    def run(rows):
        t.reset(seqs, max(16, 3 + n))
        fin = as_dev(np.zeros(seqs, np.uint8))
        t.prefill(i32(tok[:, :3].ravel()), i32(np.tile(np.arange(3), seqs)),
                  i32(3 * np.arange(seqs + 1)), i32(np.zeros(seqs)), fin,
                  row_counts=[3] * seqs)
        out = []
        for r0 in range(0, n, rows):
            lg, _ = t.forward(i32(tok[:, 3 + r0:3 + r0 + rows].ravel()),
                              i32(np.tile(np.arange(3 + r0, 3 + r0 + rows), seqs)),
                              i32(rows * np.arange(seqs + 1)), i32(np.full(seqs, 3 + r0)), fin,
                              **({"max_q": rows} if getattr(t, "takes_max_q", False) else {}))
            out.append(host(lg).reshape(seqs, rows, -1))
        return np.concatenate(out, axis=1).reshape(seqs * n, -1)
    return run(n), run(1)


@pytest.mark.parametrize("backend", ["reference", pytest.param("torch", marks=needs_gpu)])
def test_tiny_llama_row_invariant_block_equals_one_row_steps(rng, backend, monkeypatch):
    """row_invariant=True: the decode GEMMs go through the library's linear (the prefill's
    do not), and a 6-row verify block's logits equal six one-row passes' bit for bit (GQA
    group 3: 18 packed rows, past one attention m-tile)."""
    if backend == "torch":
        torch = pytest.importorskip("torch", reason="torch is not installed")
        if not torch.cuda.is_available():
            pytest.skip("torch sees no CUDA GPU")
        from specdec_lib import runtime
        if runtime.arch_family(0) < 80:
            pytest.skip("the torch backend's bf16 verify_attention needs the sm_80 path")
    t = _tiny_target(rng, backend=backend, row_invariant=True, nq=6, nkv=2)
    assert t.row_invariant
    calls = []
    lin = t.be.row_linear
    monkeypatch.setattr(t.be, "row_linear",
                        lambda *a, **kw: calls.append(a[0].shape[0]) or lin(*a, **kw))
    block, steps = _block_and_steps(t, rng)
    # per forward 4 GEMMs x 2 layers + lm_head (1 block + 6 one-row forwards); never the
    # 3 prefill rows
    assert sorted(set(calls)) == [1, 6] and len(calls) == 9 * (1 + 6)
    assert np.isfinite(block).all()
    np.testing.assert_array_equal(block, steps)


def test_torch_math_routes_few_row_gemms_to_linear():
    """The torch math's GEMMs: at most 32 rows (small_rows_max(): linear's tensor-core form)
    of K <= 2048 (K % 8 == 0) over a
    layer's weight (N <= 8192) go through the library's linear (its few-row kernels), the rest
    (prefill under bulk(), a batch, the lm_head's vocabulary, K past 2048) through cuBLAS;
    row-invariant: all of them; small_rows=False: none."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from specdec_lib.models.llama import _TorchMath
    dev = SimpleNamespace(device=torch.device("cpu"))
    m = _TorchMath(dev)
    assert m.small_rows and not m.row_invariant
    assert m.library_rows(1, 576, 960) and m.library_rows(2, 1536, 576)
    assert m.library_rows(32, 576, 960) and not m.library_rows(33, 576, 960)
    assert not m.library_rows(2, 4096, 960) and not m.library_rows(1, 580, 960)
    assert not m.library_rows(1, 576, 49152)
    with m.bulk():
        assert not m.library_rows(1, 576, 960)
    assert m.library_rows(1, 576, 960)
    assert not _TorchMath(dev, small_rows=False).library_rows(1, 576, 960)
    ri = _TorchMath(dev, row_invariant=True)
    assert ri.library_rows(64, 4096, 49152)


def test_torch_math_routes_small_batches_with_linear_mma(monkeypatch):
    """The few-row torch math asks linear for its tensor-core form (tensor_cores) and sends
    passes of up to SMALL_ROWS_MAX_MMA = 32 rows to it; where ops.layers.TUNING["linear_mma"]
    forces the CUDA-core form, up to SMALL_ROWS_MAX = 5 (where those beat cuBLAS); the
    row-invariant math keeps the CUDA-core form (its rows must agree at every M)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from specdec_lib.models.llama import SMALL_ROWS_MAX_MMA, _TorchMath, small_rows_max
    from specdec_lib.ops import layers as ops_layers
    dev = SimpleNamespace(device=torch.device("cpu"))
    m = _TorchMath(dev)
    assert ops_layers.TUNING["linear_mma"] is None
    assert small_rows_max() == SMALL_ROWS_MAX_MMA == 32
    assert m.library_rows(32, 576, 960) and not m.library_rows(33, 576, 960)
    assert m.tensor_cores and not _TorchMath(dev, row_invariant=True).tensor_cores
    monkeypatch.setitem(ops_layers.TUNING, "linear_mma", False)
    assert small_rows_max() == SMALL_ROWS_MAX == 5 and not m.library_rows(6, 576, 960)
    monkeypatch.setitem(ops_layers.TUNING, "linear_mma", True)
    assert m.library_rows(32, 576, 960) and not m.library_rows(33, 576, 960)
    assert not m.library_rows(8, 4096, 960) and not m.library_rows(8, 576, 49152)
    assert not _TorchMath(dev, small_rows=False).library_rows(2, 576, 960)


@needs_gpu
@pytest.mark.parametrize("mma", [False, None], ids=["cuda_cores", "linear_mma"])
def test_tiny_llama_few_row_decode_through_linear(rng, monkeypatch, mma):
    """The default torch target (small_rows): a decode pass of <= small_rows_max() rows (32 on
    linear's tensor-core form, which it asks for; 5 where TUNING forces the CUDA-core one)
    runs the fused layers on linear's few-row kernels (norms, silu_mul fused; every GEMM, the
    tiny lm_head too, through row_linear), so an n-row pass (blocks of two sequences where n
    passes verify_attention's 16 rows a block) gives what one row a sequence gives, bit for
    bit; they agree with the cuBLAS target's (small_rows=False) to
    bf16 rounding."""
    skip_unless_torch_gpu()
    from specdec_lib import runtime
    if runtime.arch_family(0) < 80:
        pytest.skip("the torch backend's bf16 verify_attention needs the sm_80 path")
    from specdec_lib.models.llama import SMALL_ROWS_MAX_MMA, small_rows_max
    from specdec_lib.ops import layers as ops_layers
    from specdec_lib.orchestrator import make_backend
    monkeypatch.setitem(ops_layers.TUNING, "linear_mma", mma)
    c, w = toy_llama(nq=4, nkv=2, rng=rng)
    be = make_backend("torch")
    t = LlamaTarget(c, w, be, page_size=4)
    n = small_rows_max()
    assert n == (SMALL_ROWS_MAX if mma is False else SMALL_ROWS_MAX_MMA)
    assert t._fused(n) and not t._fused(n + 1) and not t.row_invariant
    calls = []
    lin = be.row_linear

    def spy(*a, **kw):
        assert kw["tensor_cores"] is True
        calls.append(a[0].shape[0])
        return lin(*a, **kw)
    monkeypatch.setattr(be, "row_linear", spy)
    # the n rows as blocks of at most 16 (verify_attention's max_q) of `seqs` sequences
    seqs = -(-n // 16)
    q = n // seqs
    assert seqs * q == n
    block, steps = _block_and_steps(t, np.random.default_rng(7), n=q, seqs=seqs)
    # per forward 4 GEMMs x 2 layers + lm_head (1 block + q one-row-a-sequence forwards), no
    # prefill rows
    assert sorted(set(calls)) == sorted({seqs, n}) and len(calls) == 9 * (1 + q)
    assert np.isfinite(block).all()
    np.testing.assert_array_equal(block, steps)
    host = LlamaTarget(c, w, be, page_size=4, small_rows=False)
    assert not host._fused(2)
    hb, _ = _block_and_steps(host, np.random.default_rng(7), n=q, seqs=seqs)
    assert np.abs(hb - block).max() <= 0.05 * np.abs(hb).max()


@pytest.mark.parametrize("taps", [(), (0, 1)])
def test_tiny_llama_fused_decode_equals_unfused_layers(rng, taps):
    """The row-invariant decode runs each norm in the prologue of the linear behind it and
    silu_mul in gate_up's epilogue (``LlamaTarget._run_fused``): on the reference backend
    (float64) its logits, final hidden and EAGLE3 aux taps equal the layer-by-layer pass's
    (``row_invariant=False``, the same weights) to rounding, through the paged caches."""
    seed = int(rng.integers(1 << 30))
    outs = []
    for ri in (False, True):
        t = _tiny_target(np.random.default_rng(seed), row_invariant=ri, nq=6, nkv=2)
        if taps:
            t.capture_aux(taps)
        t.reset(1, 16)
        r = np.random.default_rng(seed + 1)
        tok = r.integers(0, 50, 8).astype(np.int32)
        fin = np.zeros(1, np.uint8)
        t.prefill(tok[:3], np.arange(3, dtype=np.int32), np.array([0, 3], np.int32),
                  np.zeros(1, np.int32), fin, row_counts=[3])
        lg, hid = t.forward(tok[3:], np.arange(3, 8, dtype=np.int32), np.array([0, 5], np.int32),
                            np.array([3], np.int32), fin)
        assert hid.shape == (5, t.hidden_size)
        outs.append((np.asarray(lg), np.asarray(hid)))
    (lg0, h0), (lg1, h1) = outs
    assert np.isfinite(lg1).all() and np.isfinite(h1).all()
    np.testing.assert_allclose(lg1, lg0, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(h1, h0, rtol=1e-9, atol=1e-9)


def _serve_tiny(t, prefill, *, k=3, cuda_graph=False, max_len=None, dec=None, seed=0):
    """Six requests (one-token to 30-token prompts: buckets 16 and 32, a one-token prompt on
    the batched path) through two slots, arriving in three waves, with prompt lookup."""
    from specdec_lib.models.ngram import NgramDraft
    from specdec_lib.orchestrator import Request, SpeculativeDecoder
    rng = np.random.default_rng(seed)
    lens = [5, 17, 1, 30, 2, 9]
    reqs = [Request(prompt=rng.integers(0, 50, n).tolist(), max_new_tokens=9 + i)
            for i, n in enumerate(lens)]
    if dec is None:
        dec = SpeculativeDecoder(t, NgramDraft(t.be) if k else None, num_speculative_tokens=k,
                                 backend=t.be, prefill=prefill, cuda_graph=cuda_graph,
                                 max_len=max_len)
    out = dec.serve(reqs, slots=2, arrivals=[0, 0, 3, 3, 8, 8])
    return [r.tokens for r in out], dec


def test_bucketed_prefill_equals_batched_and_target_only(rng):
    """prefill="bucketed" (each prompt alone, padded to 16 / 32 rows, the pads' K/V written
    past the committed length) decodes what the batched prefill and target-only decoding do,
    token for token (float64), through slot reuse; the buckets' buffers are made once."""
    t = _tiny_target(rng)
    batched, _ = _serve_tiny(t, "batched")
    bucketed, dec = _serve_tiny(t, "bucketed")
    plain, _ = _serve_tiny(t, "batched", k=0)
    assert bucketed == batched == plain
    # (bucket, prompts): prompts admitted together share a pass (PrefillPolicy.group), a free
    # slot waiting for the other (hold_rounds): a one-token prompt takes the batched path
    assert sorted(dec._state.prefills) == [(16, 2), (32, 1)]
    assert [dec.prefill_bucket(n, 1000) for n in (1, 16, 17, 300, 513, 600)] == \
        [16, 16, 32, 512, 768, 768]
    assert dec.prefill_bucket(40, 50) == 50             # never past the slot's positions


def test_decoder_state_reused_across_calls_until_the_target_is_reset(rng):
    """With max_len, a second call of the same batch reuses the first call's buffers (no
    target reset: same cache_epoch) and decodes the same tokens; another decoder resetting
    the target (a new epoch) makes the next call start afresh; requests past max_len are
    refused before anything runs."""
    from specdec_lib.orchestrator import Request
    t = _tiny_target(rng)
    first, dec = _serve_tiny(t, "bucketed", max_len=64)
    st, epoch = dec._state, t.cache_epoch
    again, _ = _serve_tiny(t, "bucketed", dec=dec)
    assert again == first and dec._state is st and t.cache_epoch == epoch
    _serve_tiny(t, "batched", k=0)                       # another decoder resets the target
    assert t.cache_epoch == epoch + 1
    third, _ = _serve_tiny(t, "bucketed", dec=dec)
    assert third == first and dec._state is not st
    with pytest.raises(ValueError, match=r"requests\[0\].*max_len=64"):
        dec.generate([Request(prompt=[1] * 60, max_new_tokens=4)])
    assert dec.metrics.emitted == 3 * sum(len(x) for x in first)


def test_prefill_argument_errors(rng):
    from specdec_lib.orchestrator import SpeculativeDecoder
    t = _tiny_target(rng)
    with pytest.raises(ValueError, match="prefill: expected"):
        SpeculativeDecoder(t, None, num_speculative_tokens=0, prefill="padded")
    with pytest.raises(ValueError, match="max_len"):
        SpeculativeDecoder(t, object(), num_speculative_tokens=3, max_len=4)
    no_pads = SimpleNamespace(reset=t.reset, forward=t.forward, commit=t.commit)
    with pytest.raises(ValueError, match="pads_prefill"):
        SpeculativeDecoder(no_pads, None, num_speculative_tokens=0, prefill="bucketed")


def test_prefill_policy_burst_threshold_is_a_parameter(rng):
    """PrefillPolicy: "auto" buckets a padding target's prompts only where rounds are
    recorded and fewer than ``batched_from`` (default BATCHED_PREFILL_FROM) arrive at once;
    a policy object passed as ``prefill`` is the decoder's, and decodes what the mode does."""
    from specdec_lib.orchestrator import BATCHED_PREFILL_FROM, PrefillPolicy, SpeculativeDecoder
    t = _tiny_target(rng)
    auto = PrefillPolicy()
    assert auto.batched_from == BATCHED_PREFILL_FROM == 16
    assert auto.use_buckets(t, True, 15) and not auto.use_buckets(t, True, 16)
    assert not auto.use_buckets(t, False, 1)
    few = PrefillPolicy("auto", batched_from=3)
    assert few.use_buckets(t, True, 2) and not few.use_buckets(t, True, 3)
    assert PrefillPolicy("bucketed").use_buckets(t, False, 100)
    with pytest.raises(ValueError, match="batched_from"):
        PrefillPolicy("auto", batched_from=0)
    dec = SpeculativeDecoder(t, None, num_speculative_tokens=0, prefill=PrefillPolicy("bucketed"))
    assert dec.prefill == "bucketed" and dec.prefill_policy.mode == "bucketed"
    assert _serve_tiny(t, "bucketed", k=0, dec=dec)[0] == _serve_tiny(t, "batched", k=0)[0]


def test_prefill_groups_take_prompts_by_length():
    """PrefillPolicy.groups: at most ``group`` prompts and ``group_rows`` padded rows a pass,
    shortest first, each pass padded to its longest prompt's bucket; group 1 is a pass a
    prompt; bad values refused."""
    from specdec_lib.orchestrator import PrefillPolicy
    rows = [3, 40, 17, 5, 100]
    assert PrefillPolicy(group=2).groups(rows, 1000) == [(16, [0, 3]), (64, [2, 1]),
                                                         (128, [4])]
    assert PrefillPolicy(group=1).groups(rows, 1000) == [
        (16, [0]), (16, [3]), (32, [2]), (64, [1]), (128, [4])]
    assert PrefillPolicy(group=8).groups(rows, 64) == [(64, [0, 3, 2, 1, 4])]
    long = [100] * 6 + [600]            # buckets 128 (4 a pass within 512 rows) and 768
    assert PrefillPolicy(group=8, group_rows=512).groups(long, 4096) == [
        (128, [0, 1, 2, 3]), (128, [4, 5]), (768, [6])]
    for kw in (dict(group=0), dict(hold_rounds=-1), dict(group_rows=0)):
        with pytest.raises(ValueError, match=next(iter(kw))):
            PrefillPolicy(**kw)


def test_scheduler_holds_free_slots_for_a_group():
    """Scheduler(hold=h, group=g): a free slot waits up to h rounds for g free slots (or for
    every arrived request to fit, or while nobody runs); without hold it admits at once."""
    from specdec_lib.orchestrator.serve import Scheduler
    s = Scheduler([0] * 6, 3, group=2, hold=2)
    assert [b for b, _ in s.admit(0)] == [0, 1, 2]          # nobody runs yet
    s.release(1, 5)
    assert s.admit(5) == [] and s.admit(6) == []             # one free of a group of two
    assert s.admit(7) == [(1, 3)]                            # held two rounds: admitted
    s.release(0, 9)
    assert s.admit(9) == []
    s.release(2, 10)
    assert s.admit(10) == [(0, 4), (2, 5)]                   # two free: a group
    assert s.stats["held_rounds"] == 3
    s = Scheduler([0, 0, 0, 0], 2, group=2, hold=5)
    s.admit(0)
    s.release(0, 3)
    assert s.admit(3) == []
    s.release(1, 4)
    s.waiting = s.waiting[:1]                                 # one request left: it fits
    assert s.admit(4) == [(0, 2)]
    free = Scheduler([0, 0, 0], 1, group=4)
    free.admit(0)
    free.release(0, 1)
    assert free.admit(1) == [(0, 1)]


def test_grouped_and_held_prefill_decode_what_single_passes_do(rng):
    """Prompts admitted together share a bucket pass, and free slots held for a group
    (hold_rounds) change when requests start, never what they decode (float64, token for
    token)."""
    from specdec_lib.orchestrator import PrefillPolicy
    t = _tiny_target(rng)
    single, _ = _serve_tiny(t, PrefillPolicy("bucketed", group=1))
    grouped, dec = _serve_tiny(t, PrefillPolicy("bucketed", group=2, hold_rounds=3))
    assert grouped == single
    assert dec.slot_stats["held_rounds"] > 0
    assert any(m == 2 for _, m in dec._state.prefills)


@needs_gpu
def test_bucketed_prefill_graphs_replay_the_eager_pass(rng):
    """torch backend: prefill buckets recorded once and replayed (cuda_graph, many
    admissions through two slots) give the tokens of the same bucketed passes run eagerly,
    and a second call replays every graph again (no new recording)."""
    skip_unless_torch_gpu()
    t = _tiny_target(rng, backend="torch")
    eager, _ = _serve_tiny(t, "bucketed")
    graphed, dec = _serve_tiny(t, "bucketed", cuda_graph=True, max_len=64)
    assert graphed == eager
    assert all(pb.replay is not None for pb in dec._state.prefills.values())
    captured = dec.metrics.capture_s
    again, _ = _serve_tiny(t, "bucketed", dec=dec)
    assert again == eager and dec.metrics.capture_s == captured


@needs_gpu
@pytest.mark.parametrize("prefill", ["bucketed", "batched"])
def test_async_upload_serves_the_same_torch(rng, prefill):
    """torch backend, graphs: ``state.ASYNC_UPLOAD`` (admissions' and prefills' copies
    through the pinned staging ring) serves the tokens of the pageable copies, through the
    bucketed and the batched prefill."""
    from specdec_lib.orchestrator import state
    skip_unless_torch_gpu()
    t = _tiny_target(rng, backend="torch")
    got = switched(state, "ASYNC_UPLOAD",
                   lambda: _serve_tiny(t, prefill, cuda_graph=True, max_len=64)[0])
    assert got[True] == got[False]


class _HeadWeights(dict):
    """Tensors by name plus the ``spec`` LlamaDraftHead reads (the registry's DraftWeights
    without files)."""

    def __init__(self, spec, tensors):
        super().__init__(tensors)
        self.spec = spec


def _toy_head(t, layout, rng, I=40, Vd=24):
    """A random MTP (deepseek_mtp) or EAGLE3 head for the toy target ``t`` (3+ layers)."""
    from specdec_lib.models.llama_draft import LlamaDraftHead
    from specdec_lib.models.llama_layer import head_tensor_names
    H, nq, nkv, D = t.H, t.nq, t.nkv, t.D
    pre = "midlayer." if layout == "eagle3" else f"model.layers.{len(t.layers)}."
    A = 2 * H if layout == "eagle3" else H          # what q/k/v read
    shapes = dict(q=(nq * D, A), k=(nkv * D, A), v=(nkv * D, A), o=(H, nq * D), gate=(I, H),
                  up=(I, H), down=(H, I), ln1=(H,), ln2=(H,), norm_e=(H,), norm_h=(H,),
                  final=(H,), fc=(H, 3 * H) if layout == "eagle3" else (H, 2 * H),
                  lm_head=(Vd, H))
    w = {}
    for role, name in head_tensor_names(layout, pre).items():
        shape = shapes[role]
        w[name] = (1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                   else 0.3 * rng.standard_normal(shape))
    if layout == "eagle3":
        w["d2t"] = np.sort(rng.choice(t.V, Vd, replace=False)) - np.arange(Vd)
    spec = SimpleNamespace(layout=layout, hidden_size=H, vocab_size=t.V, layer_prefixes=[pre],
                           rms_norm_eps=1e-5, aux_capture_before_layers=(0, 1, 2))
    return LlamaDraftHead(t, _HeadWeights(spec, w), page_size=4)


@pytest.mark.parametrize("backend", ["reference", pytest.param("torch", marks=needs_gpu)])
@pytest.mark.parametrize("layout", ["eagle3", "deepseek_mtp"])
def test_draft_head_fused_step_equals_unfused(rng, layout, backend):
    """LlamaDraftHead.fused_step: a step whose GEMMs the target math's linear takes runs the
    norms in linear's prologues and silu_mul in gate_up's epilogue (``_step_fused``); on the
    reference backend (float64, row-invariant math) its outputs, the K/V it appends (read
    back by a second, one-row step) and its draft tokens equal the unfused step's to
    rounding; on the GPU (torch, bf16, the few-row tensor-core linear) to bf16 rounding
    (silu reads gate_up's float32 sums there). On by default, and never where the math's
    GEMMs are the host's."""
    from specdec_lib.models.llama_draft import LlamaDraftHead
    from specdec_lib.orchestrator import make_backend
    if backend == "torch":
        skip_unless_torch_gpu()
    seed = int(rng.integers(1 << 30))
    c, w = toy_llama(L=3, nq=4, nkv=2, rng=np.random.default_rng(seed))
    t = LlamaTarget(c, w, make_backend(backend), page_size=4,
                    row_invariant=backend == "reference")
    head = _toy_head(t, layout, np.random.default_rng(seed + 1))
    m = t.m
    dev_f = (lambda a: m.param(a)) if backend == "torch" else (lambda a: a)
    dev_i = (lambda a: m.table(a)) if backend == "torch" else (lambda a: a)
    host = ((lambda a: a.double().cpu().numpy()) if backend == "torch"
            else (lambda a: np.asarray(a, np.float64)))
    assert LlamaDraftHead.fused_step is True and head._fused(5)
    R = 5
    r = np.random.default_rng(seed + 2)
    feat = r.standard_normal((R, 3 * t.H if layout == "eagle3" else t.H))
    tokens = r.integers(0, t.V, R).astype(np.int32)
    nxt = r.integers(0, t.V, 1).astype(np.int32)
    outs = []
    for fused in (False, True):
        head.fused_step = fused
        assert head._fused(R) == fused and head._fused(1) == fused
        head.reset(1, 16)
        fin = dev_i(np.zeros(1, np.uint8))
        cu = dev_i(np.array([0, R], np.int32))
        lens = dev_i(np.zeros(1, np.int32))
        x, h = head._step(dev_f(feat), dev_i(tokens), dev_i(np.arange(R, dtype=np.int32)), cu,
                          lens, fin, t.paged_attention(head.page_table, lens, cu, R))
        lens1 = dev_i(np.array([R], np.int32))
        cu1 = dev_i(np.array([0, 1], np.int32))
        x1, h1 = head._step(x[-1:], dev_i(nxt), lens1, cu1, lens1, fin,
                            t.paged_attention(head.page_table, lens1, cu1, 1))
        ids = dev_i(np.zeros(R, np.int32))
        head._token(h, ids)
        outs.append([host(a) for a in (x, h, x1, h1)] + [np.asarray(host(ids), np.int64)])
    tol = 1e-9 if backend == "reference" else 0.05
    for a, b in zip(outs[0][:4], outs[1][:4]):
        assert np.isfinite(b).all()
        np.testing.assert_allclose(b, a, rtol=tol, atol=tol * np.abs(a).max())
    if backend == "reference":
        np.testing.assert_array_equal(outs[1][4], outs[0][4])
    plain = LlamaTarget(c, w, make_backend("reference"), page_size=4)   # host GEMMs
    head = _toy_head(plain, layout, np.random.default_rng(seed + 1))
    head.fused_step = True
    assert not head._fused(R)


def test_live_rows_policy_gives_idle_slots_one_row():
    """``policy.live_rows``: at most half the slots busy -> the busy ones and spare idle ones
    up to the smallest live count that holds them (an eighth or a half of the slots) verify
    k, the rest none; one key per (k, live count); ragged, target-only and busier plans come
    back unchanged. ``live_variants``: one plan per live count, the keys those rounds use."""
    from specdec_lib.orchestrator.policy import RoundPlan, live_counts, live_rows, live_variants
    assert [live_counts(B) for B in (1, 2, 6, 8, 32, 64)] == [(), (1,), (3,), (1, 4), (4, 16),
                                                               (8, 32)]
    plan = RoundPlan(3, 3)
    busy = np.zeros(8, bool)
    busy[[2, 5, 6]] = True
    got = live_rows(plan, busy)
    assert got.num_draft == (3, 0, 3, 0, 0, 3, 3, 0) and got.live == 4   # slot 0: a spare
    busy2 = np.zeros(8, bool)
    busy2[[0, 7]] = True
    other = live_rows(plan, busy2)
    assert other.live == 4 and other.num_draft == (3, 3, 3, 0, 0, 0, 0, 3)
    one = live_rows(plan, np.arange(8) == 6)
    assert one.live == 1 and one.num_draft == (0,) * 6 + (3, 0)
    assert live_rows(plan, np.arange(8) % 3 == 1).key == got.key == other.key != one.key
    for same in (live_rows(plan, np.ones(8, bool)), live_rows(plan, np.arange(8) < 5),
                 live_rows(RoundPlan(0, 0), busy), live_rows(RoundPlan(3, 3, (1,) * 8), busy)):
        assert same.live == 0
    assert live_rows(plan, np.arange(8) < 4).live == 4
    assert [q.key for q in live_variants(plan, 8)] == [one.key, got.key]
    assert [q.key for q in live_variants(RoundPlan(2, 1), 32)] == [
        (2, 1, ("live", 4)), (2, 1, ("live", 16))]
    assert live_variants(RoundPlan(0, 1), 8) == live_variants(plan, 1) == []


def _live_rows_ab(rng, layout, backend, **kw):
    """A toy Llama (row-invariant GEMMs: fewer rows change no bit) and head serving ragged
    requests through 8 slots, arrivals leaving slots idle and a draining tail, with
    ``serve.LIVE_ROWS`` off and on: {on: (results, rounds, proposed, accepted, live-rows
    graphs / gathers)}."""
    from specdec_lib.orchestrator import Request, SpeculativeDecoder, make_backend, serve
    from specdec_lib.orchestrator.policy import RoundPlan
    from specdec_lib.orchestrator.round import block_rows
    seed = int(rng.integers(1 << 30))
    c, w = toy_llama(L=3, nq=4, nkv=2, rng=np.random.default_rng(seed))
    t = LlamaTarget(c, w, make_backend(backend), page_size=4, row_invariant=True)
    head = _toy_head(t, layout, np.random.default_rng(seed + 1))
    r = np.random.default_rng(seed + 2)
    reqs = [Request(prompt=r.integers(0, t.V, int(n)).tolist(), max_new_tokens=int(m))
            for n, m in zip(r.integers(2, 30, 9), r.integers(4, 28, 9))]

    def run():         # (max_len: the toy's 64 positions)
        dec = SpeculativeDecoder(t, head, num_speculative_tokens=3, backend=t.be,
                                 max_len=64, **kw)
        out = dec.serve(reqs, slots=8, arrivals=[0, 0, 2, 5, 5, 9, 15, 15, 40])
        m, st = dec.metrics, dec._state     # the busy slots' drafts too: same acceptance
        live = [k for k in list(st.row_gathers) + [k[2] for k in st.replays]
                if k and k[0] == "live"]
        # each live-rows gather holds the index of the split it was last filled for (the
        # toy heads' drafts are rarely accepted, so acceptance alone would miss a stale one)
        for key, split in st.live_rows.items():
            rows = block_rows(RoundPlan(3, 3, split, key[2]), 8)
            want = np.concatenate([b * st.buf.emitted.shape[1] + np.arange(q)
                                   for b, q in enumerate(rows)])
            assert np.array_equal(np.asarray(t.m.host_rows(st.row_gathers[key])), want), key
        return [(x.tokens, x.finish_reason) for x in out], m.rounds, m.proposed, \
            m.accepted, live
    return switched(serve, "LIVE_ROWS", run)


@pytest.mark.parametrize("layout", ["eagle3", "deepseek_mtp"])
def test_live_rows_rounds_decode_what_whole_blocks_do(rng, layout):
    """``serve.LIVE_ROWS``: rounds with at most half the slots busy give idle slots one row,
    the busy ones whole blocks (the row split and the draft head's gather refilled before
    each round); every request decodes what it does with whole blocks (float64, token for
    token) and the busy slots' drafts are accepted as often."""
    got = _live_rows_ab(rng, layout, "reference")
    assert got[True][:4] == got[False][:4]
    assert not got[False][4] and got[True][4]


@needs_gpu
@pytest.mark.parametrize("capture_first", [False, True])
def test_live_rows_graphs_decode_what_whole_blocks_do_torch(rng, capture_first):
    """torch backend, recorded rounds: a live-rows round is recorded once per (k, live
    count) and replayed whichever slots are busy (row split and the head's gather are
    device buffers refilled before the replay); tokens, rounds and acceptance equal the
    whole blocks'. ``capture_first``: the live-rows graphs recorded with the whole-block
    one, before the first round ran (s50)."""
    skip_unless_torch_gpu()
    got = _live_rows_ab(rng, "eagle3", "torch", cuda_graph=True, capture_first=capture_first)
    assert got[True][:4] == got[False][:4]
    assert not got[False][4] and got[True][4]
