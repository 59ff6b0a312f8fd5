"""specdec_lib.adapters: FlashInfer's chain_speculative_sampling and vLLM v1's rejection
sampler on spec_sample. CPU (reference kernels): layouts, -1 padding, counters, seeds and
-inf handling on hand-made cases, and equality with a direct reference call. GPU: each
adapter equals a native spec_sample call bit for bit."""
import types

import numpy as np
import pytest

from conftest import needs_gpu

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
adapters = pytest.importorskip("specdec_lib.adapters")
from specdec_lib import reference as ref  # noqa: E402

fi = adapters.chain_speculative_sampling


def _probs(g, *shape, zeros=0.0):
    p = torch.rand(*shape, generator=g) + 0.05
    if zeros:
        p[torch.rand(*shape, generator=g) < zeros] = 0.0
    return p / p.sum(-1, keepdim=True)


# ----------------------------------------------------------------- FlashInfer, CPU
def test_flashinfer_documented_example():
    dp = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    ids = torch.tensor([[2, 1]], dtype=torch.int32)
    tp = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    out, acc, em = fi(dp, ids, tp)
    assert out.tolist() == [[2, 0, -1]] and out.dtype == torch.int32
    assert acc.tolist() == [1] and em.tolist() == [1]


def test_flashinfer_all_accepted_then_bonus_and_first_rejected():
    V, n = 7, 3
    dp = torch.full((2, n, V), 1.0 / V)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    tp = torch.zeros(2, n + 1, V)
    for i in range(n):
        tp[0, i, ids[0, i]] = 1.0          # p(d) = 1 >= q(d): always accepted
    tp[0, n, 6] = 1.0                      # bonus row: one-hot on 6
    tp[1, 0, 0] = 1.0                      # p(d1) = 0: rejected, residual one-hot on 0
    tp[1, 1:, :] = 1.0 / V
    acc0 = torch.tensor([5, 5], dtype=torch.int32)
    em0 = torch.tensor([1, 1], dtype=torch.int32)
    status = torch.full((2,), -1, dtype=torch.int32)
    out, acc, em = fi(dp, ids, tp, acc0, em0, seed=3, offset=1, status=status)
    assert out.tolist() == [[1, 2, 3, 6], [0, -1, -1, -1]]
    assert acc is acc0 and acc.tolist() == [8, 5]       # added in place
    assert em is em0 and em.tolist() == [4, 1]
    assert status.tolist() == [0, 0]


def _fi_reference(dp, ids, tp, seeds, steps):
    B, q, V = tp.shape
    n = q - 1
    na, emitted, st = np.empty(B, np.int32), np.empty((B, q), np.int32), np.empty(B, np.int32)
    with np.errstate(divide="ignore"):
        logits = np.log(tp.numpy().astype(np.float32)).reshape(B * q, V)
    ref.spec_sample(logits, (np.arange(B + 1) * q).astype(np.int32),
                    ids.numpy().astype(np.int32).reshape(-1), np.ones(B, np.float32),
                    np.zeros(B, np.int32), np.ones(B, np.float32), np.zeros(B, np.float32),
                    np.asarray(seeds, np.int64), np.asarray(steps, np.int64), na, emitted, st,
                    dp.numpy().astype(np.float32).reshape(B * n, V))
    return na, emitted, st


@pytest.mark.parametrize("B,n,V", [(1, 1, 5), (4, 3, 37), (3, 5, 2100)])
def test_flashinfer_equals_a_direct_reference_call(B, n, V):
    g = torch.Generator().manual_seed(B * 100 + n)
    dp = _probs(g, B, n, V)
    tp = _probs(g, B, n + 1, V, zeros=0.3)          # zero probabilities: -inf logits
    ids = torch.multinomial(dp.reshape(-1, V), 1, generator=g).reshape(B, n)
    seeds = torch.arange(B, dtype=torch.int64) * 11 + 3
    steps = torch.full((B,), 9, dtype=torch.int64)
    status = torch.empty(B, dtype=torch.int32)
    out, acc, em = fi(dp, ids, tp, seed=seeds, offset=steps, status=status)
    na, emitted, st = _fi_reference(dp, ids, tp, seeds, steps)
    np.testing.assert_array_equal(out.numpy(), emitted)
    np.testing.assert_array_equal(em.numpy(), na)
    np.testing.assert_array_equal(st, 0)
    np.testing.assert_array_equal(status.numpy(), 0)
    # layout: n accepted drafts, then one token, then -1
    for b in range(B):
        k = int(na[b])
        assert out[b, :k].tolist() == ids[b, :k].tolist()
        assert out[b, k] >= 0 and (out[b, k + 1:] == -1).all()
        assert tp[b, k, out[b, k]] > 0          # never a zero-probability (-inf) token


def test_flashinfer_scalar_seed_is_spread_over_the_batch_and_reproducible():
    g = torch.Generator().manual_seed(0)
    B, n, V = 3, 2, 11
    dp, tp = _probs(g, B, n, V), _probs(g, B, n + 1, V)
    ids = torch.randint(0, V, (B, n), generator=g)
    a = fi(dp, ids, tp, seed=123, offset=4)[0]
    b = fi(dp, ids, tp, seed=torch.tensor([123]), offset=torch.tensor([4]))[0]
    assert torch.equal(a, b)
    spread = torch.tensor([123 + i * 0x9E3779B9 for i in range(B)])
    _, emitted, _ = _fi_reference(dp, ids, tp, spread, [4] * B)
    np.testing.assert_array_equal(a.numpy(), emitted)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(fi(dp, ids, tp, generator=g1)[0], fi(dp, ids, tp, generator=g2)[0])


def test_flashinfer_bad_arguments_name_them():
    dp, tp = torch.rand(2, 3, 5), torch.rand(2, 4, 5)
    ids = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="draft_probs"):
        fi(torch.rand(2, 2, 5), ids, tp)
    with pytest.raises(ValueError, match="draft_token_ids"):
        fi(dp, torch.zeros(2, 2, dtype=torch.int32), tp)
    with pytest.raises(TypeError, match="draft_token_ids"):
        fi(dp, ids.float(), tp)
    with pytest.raises(ValueError, match="seed / offset"):
        fi(dp, ids, tp, seed=1)
    with pytest.raises(ValueError, match="seed"):
        fi(dp, ids, tp, seed=torch.tensor([1, 2, 3]), offset=torch.tensor([0]))


@pytest.mark.parametrize("where", ["nan", "negative", "inf", "no_mass"])
def test_flashinfer_bad_target_probs_raise_unless_status_is_passed(where):
    g = torch.Generator().manual_seed(11)
    B, n, V = 3, 2, 9
    dp, tp = _probs(g, B, n, V), _probs(g, B, n + 1, V)
    ids = torch.randint(0, V, (B, n), generator=g)
    if where == "no_mass":
        tp[1, 2] = 0.0
    else:
        tp[1, 2, 4] = {"nan": float("nan"), "negative": -0.1, "inf": float("inf")}[where]
    acc0, em0 = torch.full((B,), 5, dtype=torch.int32), torch.full((B,), 6, dtype=torch.int32)
    match = "no mass" if where == "no_mass" else "NaN, negative or \\+inf"
    with pytest.raises(ValueError, match=f"^target_probs: request 1 has .*{match}"):
        fi(dp, ids, tp, acc0, em0, seed=1, offset=2)
    assert acc0.tolist() == [5] * B and em0.tolist() == [6] * B      # counters untouched
    status = torch.full((B,), -1, dtype=torch.int32)
    out, _, _ = fi(dp, ids, tp, seed=1, offset=2, status=status)      # flagged, no error
    want = ref.sampling.STATUS_EMPTY if where == "no_mass" else ref.sampling.STATUS_NONFINITE
    assert status.tolist() == [0, want, 0] and (out[1] == -1).all()


@pytest.mark.parametrize("bad", [float("nan"), -0.2])
def test_flashinfer_bad_draft_probs_raise_unless_status_is_passed(bad):
    g = torch.Generator().manual_seed(12)
    B, n, V = 2, 3, 7
    dp, tp = _probs(g, B, n, V), _probs(g, B, n + 1, V)
    ids = torch.randint(0, V, (B, n), generator=g)
    dp[0, 1, 3] = bad
    with pytest.raises(ValueError, match="^draft_probs: NaN or negative"):
        fi(dp, ids, tp, seed=1, offset=2)
    fi(dp, ids, tp, seed=1, offset=2, status=torch.empty(B, dtype=torch.int32))


def test_flashinfer_offset_must_move_on():
    """The same seed and offset draw the same numbers: advance_step(offset) gives the next
    round fresh ones."""
    from specdec_lib import advance_step
    g = torch.Generator().manual_seed(13)
    B, n, V = 64, 1, 40
    dp, tp = _probs(g, B, n, V), _probs(g, B, n + 1, V)
    ids = torch.randint(0, V, (B, n), generator=g)
    seed, off = torch.arange(B, dtype=torch.int64), torch.zeros(B, dtype=torch.int64)
    a = fi(dp, ids, tp, seed=seed, offset=off)[0]
    assert torch.equal(a, fi(dp, ids, tp, seed=seed, offset=off.clone())[0])
    b = fi(dp, ids, tp, seed=seed, offset=advance_step(off))[0]
    assert not torch.equal(a, b)


# ----------------------------------------------------------------- vLLM, CPU
def _vllm_case(num_draft, V, g, temperature, top_k=None, top_p=None, drafts=None):
    B = len(num_draft)
    cu = torch.tensor(np.cumsum(num_draft), dtype=torch.int32)
    nt = int(sum(num_draft))
    md = types.SimpleNamespace(
        draft_token_ids=(torch.randint(0, V, (nt,), generator=g).to(torch.int32)
                         if drafts is None else torch.tensor(drafts, dtype=torch.int32)),
        num_draft_tokens=list(num_draft), cu_num_draft_tokens=cu, max_spec_len=max(num_draft))
    sm = types.SimpleNamespace(temperature=torch.tensor(temperature, dtype=torch.float32),
                               all_greedy=all(t <= 0 for t in temperature),
                               all_random=all(t > 0 for t in temperature),
                               top_k=top_k, top_p=top_p, generators={})
    logits = torch.randn(nt + B, V, generator=g) * 2
    return md, sm, logits


def test_vllm_greedy_ragged_layout():
    g = torch.Generator().manual_seed(1)
    V = 50
    md, sm, logits = _vllm_case([3, 0, 2, 3], V, g, [-1.0, 0.0, -1.0, 0.0])
    am = logits.argmax(-1).to(torch.int32)
    # request 0: rows 0..2 draft, row 3 bonus; all drafts = argmax -> all accepted + bonus
    # request 1: no drafts, row 4 bonus; request 2: rows 5,6 (+7 bonus), first draft wrong
    # request 3: rows 8..10 (+11), second draft wrong
    d = md.draft_token_ids
    d[0:3] = am[0:3]
    d[3] = (am[5] + 1) % V
    d[4] = am[6]
    d[5] = am[8]
    d[6] = (am[9] + 1) % V
    d[7] = am[10]
    out = adapters.rejection_sample(md, None, logits, sm)
    assert out.shape == (4, 4) and out.dtype == torch.int32
    assert out.tolist() == [am[0:4].tolist(), [int(am[4]), -1, -1, -1],
                            [int(am[5]), -1, -1, -1], [int(am[8]), int(am[9]), -1, -1]]


def _vllm_reference(md, sm, logits, seeds, draft_probs=None, min_p=None):
    B = md.cu_num_draft_tokens.shape[0]
    cu = np.concatenate([[0], md.cu_num_draft_tokens.numpy() + np.arange(1, B + 1)]).astype(np.int32)
    na, em, st = np.empty(B, np.int32), np.empty((B, md.max_spec_len + 1), np.int32), np.empty(B, np.int32)
    tk = np.zeros(B, np.int32) if sm.top_k is None else sm.top_k.numpy().astype(np.int32)
    tp = np.ones(B, np.float32) if sm.top_p is None else sm.top_p.numpy().astype(np.float32)
    mp = np.zeros(B, np.float32) if min_p is None else min_p.numpy()
    ref.spec_sample(logits.numpy(), cu, md.draft_token_ids.numpy(), sm.temperature.numpy(), tk, tp,
                    mp, np.asarray(seeds, np.int64), np.zeros(B, np.int64), na, em, st,
                    None if draft_probs is None else draft_probs.numpy())
    return na, em, st


@pytest.mark.parametrize("with_probs", [False, True])
def test_vllm_sampled_mixed_with_greedy_equals_a_direct_reference_call(with_probs):
    g = torch.Generator().manual_seed(2 + with_probs)
    V = 2500
    nd = [2, 0, 4, 1, 3]
    md, sm, logits = _vllm_case(nd, V, g, [0.7, 1.0, 0.0, 1.5, 0.9],
                                top_k=torch.tensor([0, 40, 0, V, 7], dtype=torch.int32),
                                top_p=torch.tensor([0.9, 1.0, 1.0, 0.5, 1.0]))
    logits[::3, ::5] = float("-inf")       # masked tokens (log 0) in some rows
    dprobs = _probs(g, sum(nd), V) if with_probs else None
    seed = torch.tensor([5, 6, 7, 8, 9], dtype=torch.int64)
    status = torch.full((5,), -1, dtype=torch.int32)
    lp = torch.empty(5, 5)
    out = adapters.rejection_sample(md, dprobs, logits, sm, seed=seed, status=status,
                                    accepted_logprobs=lp)
    na, em, st = _vllm_reference(md, sm, logits, seed, dprobs)
    np.testing.assert_array_equal(out.numpy(), em)
    np.testing.assert_array_equal(status.numpy(), 0)
    assert np.isfinite(lp.numpy()[em >= 0]).all()
    cu = np.concatenate([[0], np.cumsum(np.array(nd) + 1)])
    for b, k in enumerate(na):
        tok = int(out[b, k])
        assert logits[cu[b] + k, tok] > float("-inf")        # a masked token is never emitted
        assert (out[b, k + 1:] == -1).all()


def test_vllm_generators_make_seeded_requests_reproducible():
    g = torch.Generator().manual_seed(4)
    md, sm, logits = _vllm_case([3, 2], 300, g, [1.0, 1.0])
    runs = []
    for _ in range(2):
        sm.generators = {1: torch.Generator().manual_seed(99)}
        runs.append(adapters.rejection_sample(md, None, logits, sm))
    assert torch.equal(runs[0][1], runs[1][1])


def test_vllm_bad_arguments_name_them():
    g = torch.Generator().manual_seed(5)
    md, sm, logits = _vllm_case([2, 1], 20, g, [1.0, 0.0])
    with pytest.raises(ValueError, match="logits"):
        adapters.rejection_sample(md, None, logits[:-1], sm)
    with pytest.raises(ValueError, match="draft_probs"):
        adapters.rejection_sample(md, torch.rand(3, 19), logits, sm)
    with pytest.raises(TypeError, match="cu_num_draft_tokens"):
        adapters.rejection_sample(types.SimpleNamespace(draft_token_ids=md.draft_token_ids,
                                                        max_spec_len=2), None, logits, sm)


def test_vllm_max_spec_len_and_draft_counts_are_checked():
    g = torch.Generator().manual_seed(6)
    md, sm, logits = _vllm_case([3, 1, 2], 30, g, [1.0, 0.0, 0.7])
    md.max_spec_len = 2                        # request 0 has 3 drafts
    with pytest.raises(ValueError, match="^metadata.max_spec_len: 2, but request 0 has 3"):
        adapters.rejection_sample(md, None, logits, sm)
    md.max_spec_len = 3
    assert adapters.rejection_sample(md, None, logits, sm).shape == (3, 4)
    # counts from a CPU cu_num_draft_tokens (no host list): a decreasing one is refused
    bare = types.SimpleNamespace(draft_token_ids=md.draft_token_ids, max_spec_len=3,
                                 cu_num_draft_tokens=torch.tensor([3, 2, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="^metadata.cu_num_draft_tokens: request 1 has a negative"):
        adapters.rejection_sample(bare, None, logits, sm)
    bare.cu_num_draft_tokens = torch.tensor([3, 4, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="^metadata.cu_num_draft_tokens: 5 draft tokens in all"):
        adapters.rejection_sample(bare, None, logits, sm)
    bare.cu_num_draft_tokens = torch.tensor([1, 4, 6], dtype=torch.int32)
    bare.max_spec_len = 2
    with pytest.raises(ValueError, match="^metadata.max_spec_len: 2, but request 1 has 3"):
        adapters.rejection_sample(bare, None, logits, sm)


# ----------------------------------------------------------------- GPU: adapter == native
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device (CPU build or no GPU)")
    return torch.device("cuda", torch.cuda.current_device())


def _native(dev, logits, cu_q, drafts, temp, tk, tp, mp, seed, step, W, dprobs=None,
            filters=None):
    from specdec_lib import ops
    B = cu_q.shape[0] - 1
    na = torch.full((B,), -7, dtype=torch.int32, device=dev)
    em = torch.full((B, W), -7, dtype=torch.int32, device=dev)
    st = torch.full((B,), -7, dtype=torch.int32, device=dev)
    ws = torch.empty(ops.spec_sample_workspace_size(*logits.shape), dtype=torch.uint8, device=dev)
    ops.spec_sample(logits, cu_q, drafts, temp, tk, tp, mp, seed, step, na, em, st, dprobs,
                    workspace=ws, filters=filters, stream=torch.cuda.current_stream(dev).cuda_stream)
    torch.cuda.synchronize()
    return na, em, st


@needs_gpu
@pytest.mark.parametrize("B,n,V", [(1, 3, 32000), (16, 4, 151936), (5, 1, 7)])
def test_flashinfer_adapter_equals_native_gpu(B, n, V):
    dev = _cuda()
    g = torch.Generator().manual_seed(B + n)
    dp = _probs(g, B, n, V).to(dev)
    tp = _probs(g, B, n + 1, V, zeros=0.2).to(dev)
    ids = torch.multinomial(dp.reshape(-1, V).cpu(), 1, generator=g).reshape(B, n).to(dev)
    seed = torch.arange(B, dtype=torch.int64, device=dev) + 17
    off = torch.full((B,), 3, dtype=torch.int64, device=dev)
    status = torch.empty(B, dtype=torch.int32, device=dev)
    out, acc, em = fi(dp, ids, tp, seed=seed, offset=off, status=status)
    one = lambda v, dt: torch.full((B,), v, dtype=dt, device=dev)  # noqa: E731
    na, emitted, st = _native(dev, torch.log(tp).reshape(-1, V),
                              torch.arange(B + 1, dtype=torch.int32, device=dev) * (n + 1),
                              ids.to(torch.int32).reshape(-1), one(1.0, torch.float32),
                              one(0, torch.int32), one(1.0, torch.float32), one(0.0, torch.float32),
                              seed, off, n + 1, dp.reshape(-1, V), filters=False)
    assert torch.equal(out, emitted) and torch.equal(em, na) and torch.equal(acc, na)
    assert torch.equal(status, st) and int(st.abs().sum()) == 0      # -inf: never flagged


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_vllm_adapter_equals_native_gpu(dtype):
    dev = _cuda()
    g = torch.Generator().manual_seed(8)
    V = 151936
    nd = [3, 0, 2, 4, 1, 3, 0, 2]
    B = len(nd)
    md, sm, logits = _vllm_case(nd, V, g, [0.7, 0.0, 1.0, 0.0, 1.3, 0.6, 1.0, 0.0],
                                top_k=torch.tensor([0, 0, 50, 0, 0, 20, V, 0], dtype=torch.int32),
                                top_p=torch.tensor([0.9, 1, 1, 1, 0.8, 1, 1, 1.0]))
    logits[1::4, 7::3] = float("-inf")
    to = lambda t: t.to(dev)  # noqa: E731
    md = types.SimpleNamespace(**{k: to(v) if isinstance(v, torch.Tensor) else v
                                  for k, v in vars(md).items()})
    sm = types.SimpleNamespace(**{k: to(v) if isinstance(v, torch.Tensor) else v
                                  for k, v in vars(sm).items()})
    logits = logits.to(getattr(torch, dtype)).to(dev)
    seed = torch.arange(B, dtype=torch.int64, device=dev) * 3 + 1
    step = torch.full((B,), 12, dtype=torch.int64, device=dev)
    status = torch.empty(B, dtype=torch.int32, device=dev)
    out = adapters.rejection_sample(md, None, logits, sm, seed=seed, step=step, status=status)
    cu_q = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    cu_q[1:] = torch.tensor(np.cumsum(np.array(nd) + 1), dtype=torch.int32, device=dev)
    na, emitted, st = _native(dev, logits, cu_q, md.draft_token_ids, sm.temperature, sm.top_k,
                              sm.top_p, torch.zeros(B, device=dev), seed, step, max(nd) + 1)
    assert torch.equal(out, emitted) and torch.equal(status, st)
    assert int(st.abs().sum()) == 0
