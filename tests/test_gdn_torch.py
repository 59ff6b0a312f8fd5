"""The trainer's torch gated delta rule (specdec_lib.train.gdn_torch): the recurrent and the
chunked forms against the library's float64 reference (reference.gdn.gdn_decode_reference),
and the chunked form's gradient against the recurrent one's (float64 autograd)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specdec_lib.reference.gdn import gdn_decode_reference  # noqa: E402
from specdec_lib.train.gdn_torch import chunk_gated_delta_rule, recurrent_gated_delta_rule  # noqa: E402


def _inputs(B, T, Hk, Hv, Dk, Dv, seed, strong_decay=False):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, Hk, Dk)).astype(np.float32)
    k = rng.standard_normal((B, T, Hk, Dk)).astype(np.float32)
    v = rng.standard_normal((B, T, Hv, Dv)).astype(np.float32)
    lo = -6.0 if strong_decay else -1.0
    g = rng.uniform(lo, -0.001, (B, T, Hv)).astype(np.float32)     # log decay
    beta = rng.uniform(0.05, 1.0, (B, T, Hv)).astype(np.float32)
    S0 = (rng.standard_normal((B, Hv, Dk, Dv)) * 0.3).astype(np.float32)
    return q, k, v, g, beta, S0


def _reference(q, k, v, g, beta, S0, qk_l2norm, scale=None):
    """float64 reference, one sequence per slot; the state stored in float64."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2:]
    flat = lambda x: x.reshape(B * T, *x.shape[2:])  # noqa: E731
    state = S0.astype(np.float64).copy()
    out = np.zeros((B * T, Hv, Dv))
    gdn_decode_reference(flat(q), flat(k), flat(v), state, np.arange(B), np.arange(B + 1) * T,
                         out, g=flat(g), beta=flat(beta), qk_l2norm=qk_l2norm, scale=scale)
    return out.reshape(B, T, Hv, Dv), state


def _t(*xs):
    return [torch.from_numpy(np.asarray(x, np.float64)) for x in xs]


@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv,chunk,l2", [
    (1, 1, 1, 1, 8, 8, 4, True),            # one token
    (2, 13, 1, 2, 16, 8, 4, True),          # GVA, tail chunk of 1
    (1, 37, 3, 9, 16, 16, 16, True),        # SmolLM2-hybrid-like heads, awkward length
    (2, 20, 2, 2, 8, 24, 64, False),        # one chunk larger than T, no normalisation
    (1, 9, 2, 4, 8, 8, 1, True),            # chunk 1 == recurrent
])
def test_gdn_torch_forward_matches_reference(B, T, Hk, Hv, Dk, Dv, chunk, l2):
    q, k, v, g, beta, S0 = _inputs(B, T, Hk, Hv, Dk, Dv, seed=T * 7 + Hv)
    if not l2:          # unnormalised keys: keep the recurrence contractive
        k = (k / np.sqrt(Dk)).astype(np.float32)
    want_o, want_S = _reference(q, k, v, g, beta, S0, l2)
    args = _t(q, k, v, g, beta)
    for fn, kw in ((recurrent_gated_delta_rule, {}),
                   (chunk_gated_delta_rule, dict(chunk_size=chunk))):
        o, S = fn(*args, state=torch.from_numpy(S0.astype(np.float64)), qk_l2norm=l2, **kw)
        # the reference rounds the normalised k to float32 (what its journal stores): exact
        # agreement without normalisation, float32 rounding of k_hat with it
        tol = dict(rtol=1e-5, atol=1e-7) if l2 else dict(rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(o.numpy(), want_o, err_msg=fn.__name__, **tol)
        np.testing.assert_allclose(S.numpy(), want_S, err_msg=fn.__name__, **tol)


def test_gdn_torch_strong_decay_and_scale():
    q, k, v, g, beta, S0 = _inputs(2, 70, 2, 4, 16, 16, seed=3, strong_decay=True)
    want_o, want_S = _reference(q, k, v, g, beta, S0, True, scale=0.3)
    o, S = chunk_gated_delta_rule(*_t(q, k, v, g, beta), state=torch.from_numpy(
        S0.astype(np.float64)), qk_l2norm=True, scale=0.3, chunk_size=32)
    np.testing.assert_allclose(o.numpy(), want_o, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(S.numpy(), want_S, rtol=1e-5, atol=1e-7)


def test_gdn_torch_zero_state_default():
    q, k, v, g, beta, _ = _inputs(1, 10, 1, 1, 8, 8, seed=5)
    want_o, _ = _reference(q, k, v, g, beta, np.zeros((1, 1, 8, 8), np.float32), True)
    o, _ = chunk_gated_delta_rule(*_t(q, k, v, g, beta), qk_l2norm=True, chunk_size=4)
    np.testing.assert_allclose(o.numpy(), want_o, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [3, 8, 64])
def test_gdn_torch_chunked_gradient_matches_recurrent(chunk):
    q, k, v, g, beta, S0 = _inputs(2, 19, 1, 2, 8, 8, seed=11)
    base = _t(q, k, v, g, beta, S0)
    rng = np.random.default_rng(1)
    wo = torch.from_numpy(rng.standard_normal((2, 19, 2, 8)))
    wS = torch.from_numpy(rng.standard_normal((2, 2, 8, 8)))
    grads = []
    for fn, kw in ((recurrent_gated_delta_rule, {}), (chunk_gated_delta_rule,
                                                      dict(chunk_size=chunk))):
        xs = [x.clone().requires_grad_() for x in base]
        o, S = fn(*xs[:5], state=xs[5], qk_l2norm=True, **kw)
        ((o * wo).sum() + (S * wS).sum()).backward()
        grads.append([x.grad.numpy() for x in xs])
    for name, a, b in zip("q k v g beta state".split(), *grads):
        assert np.isfinite(b).all(), name
        np.testing.assert_allclose(b, a, rtol=1e-8, atol=1e-10, err_msg=name)


def test_gdn_torch_chunked_gradcheck():
    q, k, v, g, beta, S0 = _inputs(1, 6, 1, 1, 4, 3, seed=2)
    xs = [x.requires_grad_() for x in _t(q, k, v, g, beta, S0)]
    fn = lambda q, k, v, g, b, s: chunk_gated_delta_rule(  # noqa: E731
        q, k, v, g, b, state=s, qk_l2norm=True, chunk_size=4)
    assert torch.autograd.gradcheck(fn, xs)


def test_gdn_torch_float32_close():
    q, k, v, g, beta, S0 = _inputs(1, 50, 2, 2, 16, 16, seed=9)
    want_o, _ = _reference(q, k, v, g, beta, S0, True)
    o, _ = chunk_gated_delta_rule(*[torch.from_numpy(x) for x in (q, k, v, g, beta)],
                                  state=torch.from_numpy(S0), qk_l2norm=True, chunk_size=16)
    assert o.dtype == torch.float32
    np.testing.assert_allclose(o.numpy(), want_o, rtol=1e-4, atol=1e-4)


def test_gdn_torch_bad_shapes():
    q, k, v, g, beta = _t(*_inputs(1, 4, 2, 3, 4, 4, seed=0)[:5])
    with pytest.raises(ValueError, match="multiple"):
        chunk_gated_delta_rule(q, k, v, g, beta)
    q, k, v, g, beta = _t(*_inputs(1, 4, 1, 2, 4, 4, seed=0)[:5])
    with pytest.raises(ValueError, match="state"):
        chunk_gated_delta_rule(q, k, v, g, beta, state=torch.zeros(1, 2, 4, 5, dtype=torch.float64))
