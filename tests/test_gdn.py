"""gdn_verify / gdn_commit: numpy reference (CPU) and CUDA kernels (GPU) against it."""
import numpy as np
import pytest

from specdec_lib.reference import gdn as ref
from specdec_lib.reference.gdn import (bf16_bits_to_f32, f32_to_bf16_bits, gdn_commit,
                                       gdn_decode_reference, gdn_journal_width, gdn_verify)

STATE_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


# ------------------------------------------------------------------ case builders

def cast(x, dtype):
    """float array -> dtype (uint16 = bfloat16 bits)."""
    if np.dtype(dtype) == np.uint16:
        return f32_to_bf16_bits(np.asarray(x, np.float32))
    return np.asarray(x).astype(dtype)


def make_block(rng, q_lens, Hk, Hv, Dk, Dv, in_dtype=np.float32, fused=False, unit_k=True):
    """Random inputs of one GDN block (k roughly unit norm so the recurrence stays tame)."""
    T = int(sum(q_lens))
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((T, Hk, Dk))
    k = rng.standard_normal((T, Hk, Dk))
    if unit_k:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, Hv, Dv))
    inputs = dict(q=cast(q, in_dtype), k=cast(k, in_dtype), v=cast(v, in_dtype))
    if fused:
        gating = dict(a=cast(rng.standard_normal((T, Hv)), in_dtype),
                      b=cast(rng.standard_normal((T, Hv)), in_dtype),
                      A_log=rng.uniform(-2.0, 0.5, Hv).astype(np.float32),
                      dt_bias=rng.uniform(-1.0, 1.0, Hv).astype(np.float32))
    else:
        gating = dict(g=(-rng.uniform(0.0, 0.5, (T, Hv))).astype(np.float32),
                      beta=rng.uniform(0.1, 0.9, (T, Hv)).astype(np.float32))
    return cu_q, inputs, gating


def make_state(rng, slots, Hv, Dk, Dv, dtype, layout):
    s = 0.5 * rng.standard_normal((slots, Hv, Dk, Dv))
    if layout == "vk":
        s = s.transpose(0, 1, 3, 2)
    return cast(np.ascontiguousarray(s), dtype)


def empty_out(T, Hv, Dv, dtype=np.float32):
    return np.full((T, Hv, Dv), np.nan, dtype) if np.dtype(dtype) != np.uint16 else \
        np.full((T, Hv, Dv), 0x7FC0, np.uint16)


def empty_journal(T, Hk, Hv, Dk, Dv):
    return np.full((T, gdn_journal_width(Hk, Hv, Dk, Dv)), np.nan, np.float32)


def f64(a):
    return ref.to_f64(a)


def _i(*values):
    """An int32 index array (the ops take arrays, not lists)."""
    return np.array(values, np.int32)


# ------------------------------------------------------------------ closed forms

def test_gdn_verify_single_token_closed_form():
    # zero state, one token: S = beta k v^T, o = beta (k.q) scale v
    Dk, Dv = 4, 3
    q = np.array([[[1.0, 2.0, 0.0, -1.0]]], np.float32)
    k = np.array([[[0.5, 0.0, 1.0, 0.5]]], np.float32)
    v = np.array([[[1.0, -2.0, 3.0]]], np.float32)
    g = np.array([[-0.3]], np.float32)
    beta = np.array([[0.25]], np.float32)
    state = np.zeros((1, 1, Dk, Dv), np.float32)
    out = empty_out(1, 1, Dv)
    j = empty_journal(1, 1, 1, Dk, Dv)
    gdn_verify(q, k, v, state, np.array([0]), np.array([0, 1]), out, j, g=g, beta=beta, scale=0.5)
    kq = float(np.dot(q[0, 0], k[0, 0]))
    np.testing.assert_allclose(out[0, 0], 0.25 * kq * 0.5 * v[0, 0], rtol=1e-6)
    assert not state.any()
    gdn_commit(state, np.array([0]), np.array([0, 1]), np.array([1]), j)
    np.testing.assert_allclose(state[0, 0], 0.25 * np.outer(k[0, 0], v[0, 0]), rtol=1e-6)


def test_gdn_two_tokens_by_hand():
    # explicit per-element loops of the delta rule, float64, f32 state (exactly representable)
    rng = np.random.default_rng(1)
    Dk, Dv = 3, 2
    S0 = rng.standard_normal((Dk, Dv))
    ks = rng.standard_normal((2, Dk))
    qs = rng.standard_normal((2, Dk))
    vs = rng.standard_normal((2, Dv))
    gs = np.array([-0.1, -0.7])
    bs = np.array([0.3, 0.8])
    S = S0.astype(np.float32).astype(np.float64)
    outs = []
    kk = ks.astype(np.float32).astype(np.float64)
    for t in range(2):
        S = S * np.exp(np.float32(gs[t]))
        for j in range(Dv):
            kv = sum(S[i, j] * kk[t, i] for i in range(Dk))
            d = np.float32(bs[t]) * (np.float32(vs[t, j]) - kv)
            for i in range(Dk):
                S[i, j] += kk[t, i] * d
        outs.append([sum(S[i, j] * qs[t, i] / np.sqrt(Dk) for i in range(Dk)) for j in range(Dv)])
        S = S.astype(np.float32).astype(np.float64)
    state = S0.astype(np.float32)[None, None]
    out = empty_out(2, 1, Dv, np.float64 if False else np.float32)
    j = empty_journal(2, 1, 1, Dk, Dv)
    gdn_verify(qs[:, None].astype(np.float32), ks[:, None].astype(np.float32),
               vs[:, None].astype(np.float32), state, np.array([0]), np.array([0, 2]), out, j,
               g=gs[:, None].astype(np.float32), beta=bs[:, None].astype(np.float32))
    np.testing.assert_allclose(out[:, 0], np.array(outs), rtol=1e-5, atol=1e-6)
    gdn_commit(state, np.array([0]), np.array([0, 2]), np.array([2]), j)
    np.testing.assert_allclose(state[0, 0], S, rtol=1e-6)


def test_gdn_fused_gating_and_l2norm_match_explicit():
    rng = np.random.default_rng(2)
    Hk, Hv, Dk, Dv = 2, 4, 8, 8
    cu_q, x, gat = make_block(rng, [3], Hk, Hv, Dk, Dv, fused=True, unit_k=False)
    a, b = f64(gat["a"]), f64(gat["b"])
    xx = a + gat["dt_bias"][None]
    g = (-np.exp(gat["A_log"].astype(np.float64))[None] * np.log1p(np.exp(xx))).astype(np.float32)
    beta = (1 / (1 + np.exp(-b))).astype(np.float32)
    qn = x["q"] / np.sqrt((x["q"].astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)
    kn = x["k"] / np.sqrt((x["k"].astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)
    state = make_state(rng, 1, Hv, Dk, Dv, np.float32, "kv")
    o1, o2 = empty_out(3, Hv, Dv), empty_out(3, Hv, Dv)
    j1, j2 = empty_journal(3, Hk, Hv, Dk, Dv), empty_journal(3, Hk, Hv, Dk, Dv)
    gdn_verify(x["q"], x["k"], x["v"], state, _i(0), cu_q, o1, j1, qk_l2norm=True, **gat)
    gdn_verify(qn.astype(np.float32), kn.astype(np.float32), x["v"], state, _i(0), cu_q, o2, j2,
               g=g, beta=beta)
    np.testing.assert_allclose(o1, o2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(j1, j2, rtol=1e-6, atol=1e-7)


def test_gdn_layouts_agree():
    rng = np.random.default_rng(3)
    Hk, Hv, Dk, Dv = 1, 2, 8, 4
    cu_q, x, gat = make_block(rng, [2, 3], Hk, Hv, Dk, Dv)
    skv = make_state(rng, 3, Hv, Dk, Dv, np.float32, "kv")
    svk = np.ascontiguousarray(skv.transpose(0, 1, 3, 2))
    o1, o2 = empty_out(5, Hv, Dv), empty_out(5, Hv, Dv)
    j1, j2 = empty_journal(5, Hk, Hv, Dk, Dv), empty_journal(5, Hk, Hv, Dk, Dv)
    gdn_verify(**x, state=skv, slot_ids=_i(2, 0), cu_q=cu_q, out=o1, journal=j1, **gat)
    gdn_verify(**x, state=svk, slot_ids=_i(2, 0), cu_q=cu_q, out=o2, journal=j2, layout="vk", **gat)
    np.testing.assert_array_equal(o1, o2)
    gdn_commit(skv, _i(2, 0), cu_q, _i(1, 3), j1)
    gdn_commit(svk, _i(2, 0), cu_q, _i(1, 3), j2, layout="vk")
    np.testing.assert_array_equal(skv, svk.transpose(0, 1, 3, 2))


# ------------------------------------------------------------------ verify + commit == decode

def run_chain(rng, *, layout, sdt, ratio, fused, l2norm, rounds=5, B=4, Hk=2, Dk=8, Dv=8,
              in_dtype=np.float32, max_q=4):
    """`rounds` speculative rounds (verify + commit of random accept lengths) against
    sequential decoding of the accepted tokens; returns the max abs differences."""
    Hv = Hk * ratio
    slots = B + 3
    state = make_state(rng, slots, Hv, Dk, Dv, sdt, layout)
    seq_state = state.copy()
    slot_ids = rng.permutation(slots)[:B].astype(np.int32)
    slot_ids[-1] = -1                                   # a padding row of the batch
    for _ in range(rounds):
        q_lens = rng.integers(1, max_q + 1, B)
        q_lens[0] = 1                                    # a plain decode row mixed in
        cu_q, x, gat = make_block(rng, q_lens, Hk, Hv, Dk, Dv, in_dtype, fused, unit_k=not l2norm)
        T = int(cu_q[-1])
        out = empty_out(T, Hv, Dv, in_dtype)
        journal = empty_journal(T, Hk, Hv, Dk, Dv)
        before = state.copy()
        gdn_verify(**x, state=state, slot_ids=slot_ids, cu_q=cu_q, out=out, journal=journal,
                   qk_l2norm=l2norm, layout=layout, **gat)
        np.testing.assert_array_equal(state, before)    # verify never writes the state
        acc = np.array([rng.integers(0, q + 1) for q in q_lens], np.int32)
        gdn_commit(state, slot_ids, cu_q, acc, journal, layout=layout)
        # oracle: decode the accepted rows one by one (outputs: all rows, from a scratch copy)
        scratch = seq_state.copy()
        out_seq = empty_out(T, Hv, Dv, in_dtype)
        gdn_decode_reference(**x, state=scratch, slot_ids=slot_ids, cu_q=cu_q, out=out_seq,
                             qk_l2norm=l2norm, layout=layout, **gat)
        np.testing.assert_array_equal(out, out_seq)
        for b in range(B):
            if slot_ids[b] < 0 or acc[b] == 0:
                continue
            r0 = cu_q[b]
            sub = {n: a[r0:r0 + acc[b]] for n, a in {**x, **gat}.items()
                   if n not in ("A_log", "dt_bias")}
            sub.update({n: gat[n] for n in ("A_log", "dt_bias") if n in gat})
            gdn_decode_reference(**sub, state=seq_state, slot_ids=slot_ids[b:b + 1],
                                 cu_q=np.array([0, acc[b]]),
                                 out=empty_out(int(acc[b]), Hv, Dv, in_dtype),
                                 qk_l2norm=l2norm, layout=layout)
        np.testing.assert_array_equal(state, seq_state)
    return state


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("sdt", ["f32", "f16", "bf16"])
def test_gdn_chain_equals_sequential_decode(layout, sdt):
    rng = np.random.default_rng(10 + len(layout) + len(sdt))
    run_chain(rng, layout=layout, sdt=STATE_DTYPES[sdt], ratio=2, fused=False, l2norm=False)


@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("fused,l2norm", [(True, True), (False, True), (True, False)])
def test_gdn_chain_gva_gating_norm(ratio, fused, l2norm):
    rng = np.random.default_rng(100 + ratio)
    run_chain(rng, layout="kv", sdt=np.uint16, ratio=ratio, fused=fused, l2norm=l2norm,
              rounds=3, in_dtype=np.uint16)


def test_gdn_commit_every_accept_len():
    rng = np.random.default_rng(5)
    Hk, Hv, Dk, Dv, q = 1, 2, 8, 4, 5
    cu_q, x, gat = make_block(rng, [q], Hk, Hv, Dk, Dv)
    state0 = make_state(rng, 1, Hv, Dk, Dv, np.float16, "kv")
    journal = empty_journal(q, Hk, Hv, Dk, Dv)
    gdn_verify(**x, state=state0, slot_ids=_i(0), cu_q=cu_q, out=empty_out(q, Hv, Dv),
               journal=journal, **gat)
    for n in range(q + 1):
        st = state0.copy()
        gdn_commit(st, _i(0), cu_q, _i(n), journal)
        seq = state0.copy()
        if n:
            sub = {k_: a[:n] for k_, a in {**x, **gat}.items()}
            gdn_decode_reference(**sub, state=seq, slot_ids=_i(0), cu_q=_i(0, n),
                                 out=empty_out(n, Hv, Dv))
        np.testing.assert_array_equal(st, seq)
        if n == 0:
            np.testing.assert_array_equal(st, state0)


def test_gdn_padding_rows_are_zero_and_untouched():
    rng = np.random.default_rng(6)
    cu_q, x, gat = make_block(rng, [2, 1], 1, 1, 4, 4)
    state = make_state(rng, 2, 1, 4, 4, np.float32, "kv")
    before = state.copy()
    out = empty_out(3, 1, 4)
    j = empty_journal(3, 1, 1, 4, 4)
    gdn_verify(**x, state=state, slot_ids=_i(-1, -1), cu_q=cu_q, out=out, journal=j, **gat)
    assert not out.any()
    gdn_commit(state, _i(-1, -1), cu_q, _i(2, 1), j)
    np.testing.assert_array_equal(state, before)


def test_gdn_empty_batch():
    state = np.zeros((2, 2, 4, 4), np.float32)
    q = np.zeros((0, 1, 4), np.float32)
    v = np.zeros((0, 2, 4), np.float32)
    g = np.zeros((0, 2), np.float32)
    out = empty_out(0, 2, 4)
    j = empty_journal(0, 1, 2, 4, 4)
    gdn_verify(q, q, v, state, np.zeros(0, np.int32), _i(0), out, j, g=g, beta=g)
    gdn_commit(state, np.zeros(0, np.int32), _i(0), np.zeros(0, np.int32), j)


# ------------------------------------------------------------------ bad arguments

def _bad_case():
    rng = np.random.default_rng(7)
    cu_q, x, gat = make_block(rng, [2, 2], 2, 4, 8, 8)
    state = make_state(rng, 4, 4, 8, 8, np.float32, "kv")
    return dict(**x, state=state, slot_ids=np.array([0, 1]), cu_q=cu_q,
                out=empty_out(4, 4, 8), journal=empty_journal(4, 2, 4, 8, 8), **gat)


@pytest.mark.parametrize("change,match", [
    (lambda c: c.update(q=c["q"][:, :1].copy(), k=c["k"][:, :1].copy(),
                        journal=empty_journal(4, 1, 4, 8, 8)) or c, None),   # fine: Hk=1
    (lambda c: c.update(q=np.zeros((4, 3, 8), np.float32), k=np.zeros((4, 3, 8), np.float32)),
     "multiple of key heads"),
    (lambda c: c.update(q=np.zeros((4, 2, 4), np.float32)), "q: expected"),
    (lambda c: c.update(k=np.zeros((4, 2, 4), np.float32)), "k: expected"),
    (lambda c: c.update(v=np.zeros((4, 4, 4), np.float32)), "v: expected"),
    (lambda c: c.update(q=c["q"].astype(np.int32)), "q: dtype"),   # (floats: by kind)
    (lambda c: c.update(slot_ids=np.array([0, 4])), "slot_ids: id 4 out of range"),
    (lambda c: c.update(slot_ids=np.array([1, 1])), "same slot"),
    (lambda c: c.update(cu_q=np.array([0, 3, 2])), "cu_q"),
    (lambda c: c.update(journal=empty_journal(4, 1, 4, 8, 8)), "journal"),
    (lambda c: c.update(a=c["g"]), "either g and beta"),
    (lambda c: c.pop("beta"), "g/beta: both required"),
    (lambda c: c.update(layout="kk"), "layout"),
])
def test_gdn_verify_rejects(change, match):
    c = _bad_case()
    change(c)
    if match is None:
        gdn_verify(**c)
        return
    with pytest.raises((ValueError, TypeError), match=match):
        gdn_verify(**c)


def test_gdn_commit_rejects():
    c = _bad_case()
    gdn_verify(**c)
    st, j = c["state"], c["journal"]
    with pytest.raises(ValueError, match="accept_len"):
        gdn_commit(st, _i(0, 1), c["cu_q"], _i(3, 0), j)
    with pytest.raises(ValueError, match="accept_len"):
        gdn_commit(st, _i(0, 1), c["cu_q"], _i(-1, 0), j)
    with pytest.raises(ValueError, match="same slot"):
        gdn_commit(st, _i(2, 2), c["cu_q"], _i(1, 1), j)
    with pytest.raises(ValueError, match="journal"):
        gdn_commit(st, _i(0, 1), c["cu_q"], _i(1, 1), j[:, :-1])


def test_bf16_bits_roundtrip():
    x = np.array([1.0, -2.5, 3.140625, 1e-3, np.inf, -np.inf], np.float32)
    y = bf16_bits_to_f32(f32_to_bf16_bits(x))
    np.testing.assert_array_equal(y[[0, 1, 2, 4, 5]], x[[0, 1, 2, 4, 5]])
    assert abs(y[3] - 1e-3) <= 2 ** -9 * 1e-3
    assert np.isnan(bf16_bits_to_f32(f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]
    # ties to even: 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125 -> 1.0
    assert bf16_bits_to_f32(f32_to_bf16_bits(np.array([1 + 2 ** -8], np.float32)))[0] == 1.0


def test_tf32_split_is_exact_and_16bit_states_are_tf32():
    """The tensor-core (mma) kernels' operands (gdn_tile.cuh MmaTile, mma.cuh split_tf32), in
    numpy: a bf16 or f16 state value is an exact tf32 number (its float32 bits end in 13 zero
    bits), and x = hi + lo with hi a tf32 (x's bits + 2^12, low 13 bits cleared) exactly, lo's
    own tf32 truncation within 2^-22 |x| of it; so a dot over [hi, lo] columns is f32-accurate."""
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(4096), rng.standard_normal(512) * 1e-20,
                        rng.standard_normal(512) * 1e20, [0.0, -0.0, 1.0, -3.0]]).astype(np.float32)
    u = x.view(np.uint32)
    hi = ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    lo = (x - hi).astype(np.float32)
    assert not np.any(hi.view(np.uint32) & 0x1FFF)
    np.testing.assert_array_equal(hi.astype(np.float64) + lo.astype(np.float64), x.astype(np.float64))
    lo_t = (lo.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    assert np.all(np.abs(lo_t.astype(np.float64) - lo) <= 2.0 ** -22 * np.abs(x.astype(np.float64)))
    with np.errstate(over="ignore"):   # (the 1e20 values are inf in f16)
        states = (bf16_bits_to_f32(f32_to_bf16_bits(x)), x.astype(np.float16).astype(np.float32))
    for st in states:
        assert not np.any(st[np.isfinite(st)].view(np.uint32) & 0x1FFF)
    # one row's S^T k as the mma sees it (state tf32-exact, k as tf32 hi + truncated lo)
    s = bf16_bits_to_f32(f32_to_bf16_bits((0.5 * rng.standard_normal((128, 16))).astype(np.float32)))
    k = (rng.standard_normal(128) / np.sqrt(128)).astype(np.float32)
    ku = k.view(np.uint32)
    kh = ((ku + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    kl = ((k - kh).astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    got = s.astype(np.float64).T @ kh + s.astype(np.float64).T @ kl
    exact = s.astype(np.float64).T @ k.astype(np.float64)
    assert np.max(np.abs(got - exact)) <= 2.0 ** -20 * np.abs(s).sum(axis=0).max() * np.abs(k).max()


def test_gdn_ops_reject_host_arrays():
    from specdec_lib import ops
    c = _bad_case()
    with pytest.raises(TypeError, match="state"):
        ops.gdn_verify(**c)
    with pytest.raises(ValueError, match="layout"):
        ops.gdn_commit(c["state"], c["slot_ids"], c["cu_q"], [1, 1], c["journal"], layout="xx")


# ------------------------------------------------------------------ GPU

from conftest import needs_gpu, poison, rel_err  # noqa: E402

# (state dtype, kernel family): the 16-bit states run on both the CUDA-core kernels and the
# tensor-core ones (ops.gdn.TUNING["mma16"]); f32 states have only the former.
SDT_FAMILIES = [("f32", "cuda"), ("f16", "cuda"), ("bf16", "cuda"), ("f16", "mma"), ("bf16", "mma")]


@pytest.fixture(autouse=True)
def _default_shape(request):
    """The tests of this file run the default launch shape (ops.gdn.TUNING["small_heads"] = 0:
    their batches are small enough for the small-batch path, which has its own tests below, bit
    for bit against this one) unless they ask for the dispatch as shipped (keep_small_heads)."""
    from specdec_lib.ops import gdn as gdn_ops
    old = gdn_ops.TUNING["small_heads"]
    gdn_ops.TUNING["small_heads"] = None if "keep_small_heads" in request.fixturenames else 0
    yield
    gdn_ops.TUNING["small_heads"] = old


@pytest.fixture
def keep_small_heads():
    """The shipped small-batch threshold (TUNING["small_heads"] None); a test may change it."""
    yield


@pytest.fixture
def family(request):
    """Selects the gdn kernel family for the test (indirect parametrisation; default "cuda")."""
    from specdec_lib.ops import gdn as gdn_ops
    name = getattr(request, "param", "cuda")
    old = gdn_ops.TUNING["mma16"]
    gdn_ops.TUNING["mma16"] = name == "mma"
    yield name
    gdn_ops.TUNING["mma16"] = old

_NAME = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
         np.dtype(np.uint16): "bfloat16"}


def dev(a):
    from specdec_lib import DeviceArray
    a = np.asarray(a)
    if a.dtype.kind in "iu" and a.dtype != np.uint16:
        return DeviceArray.from_numpy(a.astype(np.int32))
    return DeviceArray.from_numpy(a, dtype=_NAME[a.dtype])


def host(d, like):
    """Device array -> host array in the layout of numpy array `like` (bf16 as bits)."""
    return d.to_numpy().reshape(like.shape).view(like.dtype) if np.dtype(like.dtype) == np.uint16 \
        else d.to_numpy().reshape(like.shape)


def tol(sdt, in_dtype=np.float32):
    return 1e-4 if np.dtype(sdt) == np.float32 and np.dtype(in_dtype) == np.float32 else 2e-2


def gpu_case(rng, *, layout, sdt, ratio, fused, l2norm, Dk=128, Dv=128, Hk=2, in_dtype=np.uint16,
             q_lens=(1, 4, 3, 2, 5)):
    Hv = Hk * ratio
    B = len(q_lens)
    slots = B + 3
    cu_q, x, gat = make_block(rng, q_lens, Hk, Hv, Dk, Dv, in_dtype, fused, unit_k=not l2norm)
    state = make_state(rng, slots, Hv, Dk, Dv, sdt, layout)
    slot_ids = rng.permutation(slots)[:B].astype(np.int32)
    slot_ids[2] = -1                                     # padding row
    return dict(cu_q=cu_q, x=x, gat=gat, state=state, slot_ids=slot_ids, Hk=Hk, Hv=Hv, Dk=Dk,
                Dv=Dv, T=int(cu_q[-1]))


def run_gpu_verify(c, *, layout, l2norm, out_dtype="float32"):
    from specdec_lib import ops
    W = gdn_journal_width(c["Hk"], c["Hv"], c["Dk"], c["Dv"])
    d_state = dev(c["state"])
    d_out = poison((c["T"], c["Hv"], c["Dv"]), out_dtype)
    d_j = poison((c["T"], W), "float32")
    d_status = poison((len(c["slot_ids"]),), "int32")
    ops.gdn_verify(**{n: dev(a) for n, a in c["x"].items()}, state=d_state,
                   slot_ids=dev(c["slot_ids"]), cu_q=dev(c["cu_q"]), out=d_out, journal=d_j,
                   qk_l2norm=l2norm, layout=layout, status=d_status,
                   **{n: dev(a) for n, a in c["gat"].items()})
    assert not d_status.to_numpy().any()
    return d_state, d_out, d_j


def _verify_vs_reference(c, layout, l2norm):
    """gdn_verify on the GPU (state bit-for-bit unchanged) and the float64 reference on the
    same case: (device out, reference out, device journal, reference journal)."""
    d_state, d_out, d_j = run_gpu_verify(c, layout=layout, l2norm=l2norm)
    np.testing.assert_array_equal(host(d_state, c["state"]).view(np.uint8), c["state"].view(np.uint8))
    out = empty_out(c["T"], c["Hv"], c["Dv"])
    j = empty_journal(c["T"], c["Hk"], c["Hv"], c["Dk"], c["Dv"])
    gdn_verify(**c["x"], state=c["state"].copy(), slot_ids=c["slot_ids"], cu_q=c["cu_q"], out=out,
               journal=j, qk_l2norm=l2norm, layout=layout, **c["gat"])
    return d_out.to_numpy(), out, d_j, j


@needs_gpu
@pytest.mark.parametrize("Dk", [128, 64])
@pytest.mark.parametrize("fused,l2norm", [(True, True), (False, False)])
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("sdt,family", SDT_FAMILIES, indirect=["family"])
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_gdn_verify_gpu(rng, layout, sdt, family, ratio, fused, l2norm, Dk):
    sdt = STATE_DTYPES[sdt]
    in_dtype = np.float32 if sdt == np.float32 else (np.float16 if sdt == np.float16 else np.uint16)
    c = gpu_case(rng, layout=layout, sdt=sdt, ratio=ratio, fused=fused, l2norm=l2norm, Dk=Dk,
                 Dv=Dk, in_dtype=in_dtype)
    got, out, d_j, j = _verify_vs_reference(c, layout, l2norm)
    e = rel_err(got, out)
    assert e < tol(sdt, in_dtype), f"out rel err {e}"
    pad = slice(c["cu_q"][2], c["cu_q"][3])
    assert not got[pad].any(), "padding rows must be zero"
    ej = rel_err(d_j.to_numpy(), j)
    assert ej < 1e-5, f"journal rel err {ej}"


@needs_gpu
@pytest.mark.parametrize("Dk", [128, 64])
@pytest.mark.parametrize("fused,l2norm", [(True, True), (False, False), (False, True)])
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_gdn_verify_gpu_f32_block_lengths(rng, layout, ratio, fused, l2norm, Dk):
    """f32 state, q = 1..9 and 12, 17 rows per sequence (the chunked/WY verify works on 4
    rows at a time and advances its registers between chunks): outputs against the float64
    reference; the state bit-for-bit unchanged; the journal as before."""
    c = gpu_case(rng, layout=layout, sdt=np.float32, ratio=ratio, fused=fused, l2norm=l2norm,
                 Dk=Dk, Dv=Dk, in_dtype=np.float32, q_lens=(1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17))
    got, out, d_j, j = _verify_vs_reference(c, layout, l2norm)
    for b in range(len(c["slot_ids"])):          # per sequence, so a bad block length shows
        r = slice(c["cu_q"][b], c["cu_q"][b + 1])
        if c["slot_ids"][b] < 0:
            assert not got[r].any(), "padding rows must be zero"
            continue
        e = rel_err(got[r], out[r])
        assert e < 1e-4, f"q={r.stop - r.start}: out rel err {e}"
    assert rel_err(d_j.to_numpy(), j) < 1e-5


@needs_gpu
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("sdt,family", SDT_FAMILIES, indirect=["family"])
def test_gdn_commit_gpu_every_accept_len(rng, layout, sdt, family):
    from specdec_lib import ops
    sdt = STATE_DTYPES[sdt]
    q = 5
    c = gpu_case(rng, layout=layout, sdt=sdt, ratio=2, fused=True, l2norm=True,
                 q_lens=(q,) * (q + 1), in_dtype=np.uint16)
    # no padding row here: every accept length 0..q is exercised on a live slot
    c["slot_ids"] = rng.permutation(len(c["state"]))[:q + 1].astype(np.int32)
    d_state, d_out, d_j = run_gpu_verify(c, layout=layout, l2norm=True)
    acc = np.arange(q + 1, dtype=np.int32)
    rng.shuffle(acc)
    d_status = poison((q + 1,), "int32")
    ops.gdn_commit(d_state, dev(c["slot_ids"]), dev(c["cu_q"]), dev(acc), d_j, layout=layout,
                   status=d_status)
    assert not d_status.to_numpy().any()
    exp = c["state"].copy()
    gdn_commit(exp, c["slot_ids"], c["cu_q"], acc, d_j.to_numpy(), layout=layout)
    got = host(d_state, c["state"])
    for b in range(q + 1):
        s = c["slot_ids"][b]
        if acc[b] == 0:
            np.testing.assert_array_equal(got[s].view(np.uint8), c["state"][s].view(np.uint8))
        else:
            e = rel_err(f64(got[s]), f64(exp[s]))
            assert e < tol(sdt) / 4, f"accept {acc[b]}: state rel err {e}"
    untouched = np.setdiff1d(np.arange(len(c["state"])), c["slot_ids"])
    np.testing.assert_array_equal(got[untouched].view(np.uint8), c["state"][untouched].view(np.uint8))


@needs_gpu
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("sdt,family", SDT_FAMILIES, indirect=["family"])
def test_gdn_gpu_chain_equals_sequential(rng, layout, sdt, family):
    """5 rounds of GPU verify + commit (random accept lengths, q=1 rows, a padding row) ==
    the reference's one-token decoding, and == the GPU's own one-token rounds bit for bit:
    the states, and verify's float32 output of each accepted row (computed from the state
    verify advanced in registers) == a one-token verify's from the state commit wrote (verify
    and commit tile the columns alike, 8 per thread for f32 Dk = 128, but reduce differently:
    reduce_scatter vs per-column butterflies)."""
    from specdec_lib import ops
    sdt = STATE_DTYPES[sdt]
    Hk, Hv, D, B = 2, 4, 128, 4
    slots = B + 2
    state0 = make_state(rng, slots, Hv, D, D, sdt, layout)
    d_state = dev(state0)                       # speculative rounds
    d_seq = dev(state0)                         # the GPU decoding one token per round
    ref_state = state0.copy()                   # the reference decoding one token per round
    slot_ids = rng.permutation(slots)[:B].astype(np.int32)
    slot_ids[-1] = -1
    W = gdn_journal_width(Hk, Hv, D, D)
    for _ in range(5):
        q_lens = rng.integers(1, 6, B)
        q_lens[0] = 1
        cu_q, x, gat = make_block(rng, q_lens, Hk, Hv, D, D, np.uint16, True, unit_k=False)
        T = int(cu_q[-1])
        d_j = poison((T, W), "float32")
        d_x = {n: dev(a) for n, a in {**x, **gat}.items()}
        d_o = poison((T, Hv, D), "float32")
        ops.gdn_verify(**d_x, state=d_state, slot_ids=dev(slot_ids), cu_q=dev(cu_q),
                       out=d_o, journal=d_j, qk_l2norm=True, layout=layout)
        o_block = d_o.to_numpy().reshape(T, Hv, D)
        acc = np.array([rng.integers(0, q + 1) for q in q_lens], np.int32)
        ops.gdn_commit(d_state, dev(slot_ids), dev(cu_q), dev(acc), d_j, layout=layout)
        for b in range(B):
            for i in range(acc[b]):
                t = cu_q[b] + i
                one = {n: a[t:t + 1] for n, a in {**x, **gat}.items() if n not in ("A_log", "dt_bias")}
                one.update({n: gat[n] for n in ("A_log", "dt_bias")})
                d_j1 = poison((1, W), "float32")
                d_o1 = poison((1, Hv, D), "float32")
                ops.gdn_verify(**{n: dev(a) for n, a in one.items()}, state=d_seq,
                               slot_ids=dev(slot_ids[b:b + 1]), cu_q=dev([0, 1]),
                               out=d_o1, journal=d_j1, qk_l2norm=True, layout=layout)
                np.testing.assert_array_equal(d_o1.to_numpy().reshape(Hv, D).view(np.uint32),
                                              o_block[t].view(np.uint32))
                ops.gdn_commit(d_seq, dev(slot_ids[b:b + 1]), dev([0, 1]), dev([1]), d_j1,
                               layout=layout)
                gdn_decode_reference(**one, state=ref_state, slot_ids=slot_ids[b:b + 1],
                                     cu_q=np.array([0, 1]), out=empty_out(1, Hv, D),
                                     qk_l2norm=True, layout=layout)
    got = host(d_state, state0)
    np.testing.assert_array_equal(got.view(np.uint8), host(d_seq, state0).view(np.uint8))
    e = rel_err(f64(got), f64(ref_state))
    assert e < tol(sdt), f"state after 5 rounds: rel err {e}"


@needs_gpu
@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("mode", ["verify_commit", "fused"])
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("sdt,family", SDT_FAMILIES, indirect=["family"])
def test_gdn_gpu_block_commit_equals_four_steps(rng, layout, sdt, family, mode, D):
    """The per-row rounding contract (issue 20): a q=4 block verified and committed whole
    (mode "verify_commit": gdn_verify + gdn_commit accept 4; "fused": a fused gdn_verify with
    nothing pending, then gdn_flush of its 4 rows) == four q=1 verify + commit steps, bit for
    bit: every row's float32 output and the final states, for every state dtype, layout and
    kernel family."""
    from specdec_lib import ops
    sdt = STATE_DTYPES[sdt]
    Hk, Hv, q, B = 2, 4, 4, 3
    state0 = make_state(rng, B + 1, Hv, D, D, sdt, layout)
    slot_ids = np.array([2, 0, 3], np.int32)
    cu_q, x, gat = make_block(rng, (q,) * B, Hk, Hv, D, D, np.uint16, True, unit_k=False)
    W = gdn_journal_width(Hk, Hv, D, D)
    d_x = {n: dev(a) for n, a in {**x, **gat}.items()}
    d_block = dev(state0)
    d_o, d_j = poison((B * q, Hv, D), "float32"), poison((B * q, W), "float32")
    if mode == "verify_commit":
        ops.gdn_verify(**d_x, state=d_block, slot_ids=dev(slot_ids), cu_q=dev(cu_q), out=d_o,
                       journal=d_j, qk_l2norm=True, layout=layout)
        ops.gdn_commit(d_block, dev(slot_ids), dev(cu_q), dev(np.full(B, q, np.int32)), d_j,
                       layout=layout)
    else:
        none = np.zeros(B, np.int32)
        ops.gdn_verify(**d_x, state=d_block, slot_ids=dev(slot_ids), cu_q=dev(cu_q), out=d_o,
                       journal=d_j, qk_l2norm=True, layout=layout, pending_journal=poison((1, W), "float32"),
                       pending_row0=dev(none), pending_len=dev(none))
        ops.gdn_flush(d_block, dev(slot_ids), d_j, dev(cu_q[:-1]), dev(np.full(B, q, np.int32)),
                      layout=layout)
    o_block = d_o.to_numpy().reshape(B, q, Hv, D)
    d_steps = dev(state0)
    one_cu = np.arange(B + 1, dtype=np.int32)
    for i in range(q):
        rows = cu_q[:-1] + i
        one = {n: (a if n in ("A_log", "dt_bias") else a[rows]) for n, a in {**x, **gat}.items()}
        d_o1, d_j1 = poison((B, Hv, D), "float32"), poison((B, W), "float32")
        ops.gdn_verify(**{n: dev(a) for n, a in one.items()}, state=d_steps, slot_ids=dev(slot_ids),
                       cu_q=dev(one_cu), out=d_o1, journal=d_j1, qk_l2norm=True, layout=layout)
        np.testing.assert_array_equal(d_o1.to_numpy().reshape(B, Hv, D).view(np.uint32),
                                      o_block[:, i].view(np.uint32), err_msg=f"row {i}")
        ops.gdn_commit(d_steps, dev(slot_ids), dev(one_cu), dev(np.ones(B, np.int32)), d_j1,
                       layout=layout)
    got = host(d_block, state0)
    np.testing.assert_array_equal(got.view(np.uint8), host(d_steps, state0).view(np.uint8))
    assert not np.array_equal(got.view(np.uint8), state0.view(np.uint8))


@needs_gpu
def test_gdn_gpu_rejects_before_launch(rng):
    from specdec_lib import ops
    c = gpu_case(rng, layout="kv", sdt=np.float32, ratio=2, fused=False, l2norm=False,
                 in_dtype=np.float32)
    W = gdn_journal_width(c["Hk"], c["Hv"], 128, 128)
    d_state = dev(c["state"])
    base = dict(**{n: dev(a) for n, a in {**c["x"], **c["gat"]}.items()}, state=d_state,
                slot_ids=dev(c["slot_ids"]), cu_q=dev(c["cu_q"]),
                out=poison((c["T"], c["Hv"], 128), "float32"), journal=poison((c["T"], W), "float32"))
    B = len(c["slot_ids"])
    cases = [
        (dict(q=dev(np.zeros((c["T"], 3, 128), np.float32)), k=dev(np.zeros((c["T"], 3, 128), np.float32))),
         ValueError, "multiple of key heads"),
        (dict(q=dev(np.zeros((c["T"], 2, 64), np.float32))), ValueError, "q: expected"),
        (dict(k=dev(c["x"]["k"].astype(np.float16))), TypeError, "k: dtype"),
        (dict(state=dev(np.zeros((4, 4, 96, 128), np.float32))), ValueError, "Dk=96"),
        (dict(slot_ids=dev(np.full(B, 99, np.int32))), ValueError, "out of range"),
        (dict(slot_ids=dev(np.zeros(B, np.int32))), ValueError, "same slot"),
        (dict(journal=poison((c["T"], W + 1), "float32")), ValueError, "journal"),
        (dict(q=c["x"]["q"]), TypeError, "q:"),
        (dict(layout="kk"), ValueError, "layout"),
    ]
    for override, exc, match in cases:
        with pytest.raises(exc, match=match):
            ops.gdn_verify(**dict(base, **override))
    ops.gdn_verify(**base)
    acc = np.array(np.diff(c["cu_q"]), np.int32)
    acc[1] += 1
    with pytest.raises(ValueError, match="accept_len"):
        ops.gdn_commit(d_state, base["slot_ids"], base["cu_q"], dev(acc), base["journal"])
    np.testing.assert_array_equal(host(d_state, c["state"]), c["state"])
    # without the host check the kernel leaves that state alone and flags the row
    st = poison((B,), "int32")
    ops.gdn_commit(d_state, base["slot_ids"], base["cu_q"], dev(acc), base["journal"],
                   status=st, check_indices=False)
    flags = st.to_numpy()
    assert flags[1] == 4 and not np.delete(flags, 1).any()
    s1 = c["slot_ids"][1]
    np.testing.assert_array_equal(host(d_state, c["state"])[s1], c["state"][s1])


# ------------------------------------------------------------------ fused mode
# The commit of round r folded into the verify of round r+1 (pending_* arguments), gdn_flush
# for sequences that leave. A schedule of 5 rounds in which sequences join (nothing pending),
# leave (flushed after their last round), change places, and a padding row comes and goes.

FUSED_SCHEDULE = [[0, 1, 2, -1], [2, 0, 1, -1], [0, 3, 2], [3, 0, 4, 2, -1], [4, 3, 0]]


def fused_schedule_run(rng, verify, commit, flush, *, Hk=2, Hv=4, D=8, in_dtype=np.float32,
                       max_q=4):
    """Drives FUSED_SCHEDULE twice through the backend callables -- unfused (verify then
    commit every round) and fused (verify with the previous round's pending rows, flush on
    leaving, flush of everyone at the end) -- on the same inputs. verify(x, gat, slot_ids,
    cu_q, T, pending) -> (out, journal) with pending None or (journal, row0, len);
    commit(slot_ids, cu_q, acc, journal); flush(slot_ids, journal, row0, len). Returns the
    per-round (unfused, fused) outputs and journals."""
    nseq = 1 + max(max(r) for r in FUSED_SCHEDULE)
    slot_of = rng.permutation(nseq + 2)[:nseq]
    pending = {}                                     # seq -> (row0, len) in the last journal
    last_j = None
    rounds = []
    for r, batch in enumerate(FUSED_SCHEDULE):
        q_lens = rng.integers(1, max_q + 1, len(batch))
        q_lens[0] = 1                                # a plain decode row
        cu_q, x, gat = make_block(rng, q_lens, Hk, Hv, D, D, in_dtype, True, unit_k=False)
        T = int(cu_q[-1])
        slot_ids = np.array([slot_of[s] if s >= 0 else -1 for s in batch], np.int32)
        out_u, j_u = verify(x, gat, slot_ids, cu_q, T, None, "u")
        p_r0 = np.array([pending.get(s, (0, 0))[0] for s in batch], np.int32)
        p_n = np.array([pending.get(s, (0, 0))[1] if s >= 0 else 1 for s in batch], np.int32)
        out_f, j_f = verify(x, gat, slot_ids, cu_q, T, None if r == 0 else (last_j, p_r0, p_n), "f")
        acc = np.array([rng.integers(0, q + 1) for q in q_lens], np.int32)
        commit(slot_ids, cu_q, acc, j_u)
        pending = {s: (int(cu_q[i]), int(acc[i])) for i, s in enumerate(batch) if s >= 0}
        nxt = set(FUSED_SCHEDULE[r + 1]) if r + 1 < len(FUSED_SCHEDULE) else set()
        leave = [s for s in pending if s not in nxt]
        if leave:
            flush(np.array([slot_of[s] for s in leave], np.int32), j_f,
                  np.array([pending[s][0] for s in leave], np.int32),
                  np.array([pending[s][1] for s in leave], np.int32))
        last_j = j_f
        rounds.append((out_u, out_f, j_u, j_f))
    return rounds


def test_gdn_fused_mode_equals_verify_commit():
    """Reference: fused rounds + flushes == verify + commit rounds, outputs and states."""
    rng = np.random.default_rng(21)
    Hk, Hv, D = 2, 4, 8
    state0 = make_state(rng, 8, Hv, D, D, np.float16, "vk")
    st = {"u": state0.copy(), "f": state0.copy()}

    def verify(x, gat, slot_ids, cu_q, T, pending, which):
        out, j = empty_out(T, Hv, D), empty_journal(T, Hk, Hv, D, D)
        kw = {} if pending is None else dict(zip(("pending_journal", "pending_row0", "pending_len"), pending))
        gdn_verify(**x, **gat, state=st[which], slot_ids=slot_ids, cu_q=cu_q, out=out, journal=j,
                   qk_l2norm=True, layout="vk", **kw)
        return out, j

    rounds = fused_schedule_run(
        rng, verify, lambda sl, cu, acc, j: gdn_commit(st["u"], sl, cu, acc, j, layout="vk"),
        lambda sl, j, r0, n: ref.gdn_flush(st["f"], sl, j, r0, n, layout="vk"))
    for out_u, out_f, j_u, j_f in rounds:
        np.testing.assert_array_equal(out_u, out_f)
        np.testing.assert_array_equal(j_u, j_f)
    np.testing.assert_array_equal(st["u"], st["f"])
    assert not np.array_equal(st["u"], state0)


def test_gdn_fused_mode_rejects():
    rng = np.random.default_rng(22)
    cu_q, x, gat = make_block(rng, [2, 1], 1, 2, 4, 4)
    state = make_state(rng, 3, 2, 4, 4, np.float32, "kv")
    before = state.copy()
    j = empty_journal(3, 1, 2, 4, 4)
    pj = np.zeros_like(j)
    base = dict(**x, **gat, state=state, slot_ids=_i(0, 1), cu_q=cu_q, out=empty_out(3, 2, 4), journal=j)
    with pytest.raises(ValueError, match="pending_journal: overlaps journal"):
        gdn_verify(**base, pending_journal=j, pending_row0=_i(0, 0), pending_len=_i(0, 0))
    with pytest.raises(ValueError, match="without pending_journal"):
        gdn_verify(**base, pending_len=_i(1, 1))
    with pytest.raises(ValueError, match="outside the pending"):
        gdn_verify(**base, pending_journal=pj, pending_row0=_i(2, 0), pending_len=_i(2, 0))
    with pytest.raises(ValueError, match="outside the pending"):
        ref.gdn_flush(state, _i(0, 1), pj, _i(0, 0), _i(-1, 0))
    with pytest.raises(ValueError, match="same slot"):
        ref.gdn_flush(state, _i(1, 1), pj, _i(0, 0), _i(1, 1))
    np.testing.assert_array_equal(state, before)


@needs_gpu
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("sdt,family", SDT_FAMILIES, indirect=["family"])
@pytest.mark.parametrize("D", [128, 64])
def test_gdn_gpu_fused_mode_bit_exact(rng, layout, sdt, family, D):
    """GPU fused rounds (gdn_verify with pending rows, gdn_flush on leaving and at the end)
    == GPU verify + commit rounds bit for bit (outputs, journals, every slot of the pool),
    and the final states == the float64 reference's."""
    from specdec_lib import ops
    sdt = STATE_DTYPES[sdt]
    Hk, Hv = 2, 4
    state0 = make_state(rng, 8, Hv, D, D, sdt, layout)
    st = {"u": dev(state0), "f": dev(state0)}
    ref_state = state0.copy()
    W = gdn_journal_width(Hk, Hv, D, D)

    def verify(x, gat, slot_ids, cu_q, T, pending, which):
        d_o, d_j, d_s = poison((T, Hv, D), "float32"), poison((T, W), "float32"), poison((len(slot_ids),), "int32")
        kw = {}
        if pending is not None:
            kw = dict(pending_journal=pending[0], pending_row0=dev(pending[1]), pending_len=dev(pending[2]))
        ops.gdn_verify(**{n: dev(a) for n, a in {**x, **gat}.items()}, state=st[which],
                       slot_ids=dev(slot_ids), cu_q=dev(cu_q), out=d_o, journal=d_j,
                       qk_l2norm=True, layout=layout, status=d_s, **kw)
        assert not d_s.to_numpy().any()
        if which == "u":   # the reference follows the unfused rounds
            gdn_verify(**x, **gat, state=ref_state, slot_ids=slot_ids, cu_q=cu_q,
                       out=empty_out(T, Hv, D), journal=empty_journal(T, Hk, Hv, D, D),
                       qk_l2norm=True, layout=layout)
        return d_o, d_j

    def commit(sl, cu, acc, d_j):
        ops.gdn_commit(st["u"], dev(sl), dev(cu), dev(acc), d_j, layout=layout)
        gdn_commit(ref_state, sl, cu, acc, d_j.to_numpy(), layout=layout)

    def flush(sl, d_j, r0, n):
        d_s = poison((len(sl),), "int32")
        ops.gdn_flush(st["f"], dev(sl), d_j, dev(r0), dev(n), layout=layout, status=d_s)
        assert not d_s.to_numpy().any()

    rounds = fused_schedule_run(rng, verify, commit, flush, Hk=Hk, Hv=Hv, D=D, in_dtype=np.uint16)
    for out_u, out_f, j_u, j_f in rounds:
        np.testing.assert_array_equal(out_u.to_numpy().view(np.uint32), out_f.to_numpy().view(np.uint32))
        np.testing.assert_array_equal(j_u.to_numpy().view(np.uint32), j_f.to_numpy().view(np.uint32))
    got_u, got_f = host(st["u"], state0), host(st["f"], state0)
    np.testing.assert_array_equal(got_u.view(np.uint8), got_f.view(np.uint8))
    e = rel_err(f64(got_f), f64(ref_state))
    assert e < tol(sdt), f"states after the schedule: rel err {e}"
    assert not np.array_equal(got_f.view(np.uint8), state0.view(np.uint8))


@needs_gpu
@pytest.mark.parametrize("heads", [None, 0], ids=["small", "default"])
@pytest.mark.parametrize("sdt,family", [("f32", "cuda"), ("bf16", "cuda"), ("bf16", "mma")],
                         indirect=["family"])
def test_gdn_verify_gpu_strided_views(rng, sdt, family, heads, monkeypatch):
    """What the hybrid targets pass (models.gdn_layer.gdn_block): q / k / v as head views of
    one wider float32 row (the conv output; 16-byte rows, junk after), the raw gates as
    columns of a wider bf16 projection. Outputs and journal bit for bit the contiguous call's (the
    small-batch and the default launch shapes), and close to the float64 reference."""
    torch = pytest.importorskip("torch", reason="torch makes the strided views")
    from specdec_lib import ops
    from specdec_lib.ops import gdn as gdn_ops
    monkeypatch.setitem(gdn_ops.TUNING, "small_heads", heads)
    sdt = STATE_DTYPES[sdt]
    c = gpu_case(rng, layout="kv", sdt=sdt, ratio=2, fused=True, l2norm=True, Dk=64, Dv=64,
                 in_dtype=np.float32)
    T, Hk, Hv, D = c["T"], c["Hk"], c["Hv"], c["Dk"]
    nk, cuda = Hk * D, torch.device("cuda")
    x, gat = c["x"], c["gat"]
    wide = torch.full((T, 2 * nk + Hv * D + 4), float("nan"), device=cuda)
    for j, n in enumerate("qk"):
        wide[:, j * nk:(j + 1) * nk] = torch.from_numpy(x[n].reshape(T, -1))
    wide[:, 2 * nk:2 * nk + Hv * D] = torch.from_numpy(x["v"].reshape(T, -1))
    proj = torch.full((T, 2 * Hv + 5), float("nan"), device=cuda, dtype=torch.bfloat16)
    proj[:, 3:3 + Hv] = torch.from_numpy(gat["b"]).to(torch.bfloat16)
    proj[:, 3 + Hv:3 + 2 * Hv] = torch.from_numpy(gat["a"]).to(torch.bfloat16)
    views = dict(q=wide[:, :nk].view(T, Hk, D), k=wide[:, nk:2 * nk].view(T, Hk, D),
                 v=wide[:, 2 * nk:2 * nk + Hv * D].view(T, Hv, D),
                 b=proj[:, 3:3 + Hv], a=proj[:, 3 + Hv:3 + 2 * Hv])
    assert not views["q"].is_contiguous() and not views["a"].is_contiguous()
    state = torch.from_numpy(c["state"].view(np.int16) if sdt == np.uint16 else c["state"])
    state = state.to(cuda).view(torch.bfloat16 if sdt == np.uint16 else torch.float32)
    A_log, dt_bias = (torch.from_numpy(gat[n]).to(cuda) for n in ("A_log", "dt_bias"))
    W = gdn_journal_width(Hk, Hv, D, D)
    got = []
    for args in (views, {n: a.contiguous() for n, a in views.items()}):
        out = torch.full((T, Hv, D), float("nan"), device=cuda)
        journal = torch.full((T, W), float("nan"), device=cuda)
        status = torch.full((len(c["slot_ids"]),), -1, device=cuda, dtype=torch.int32)
        ops.gdn_verify(**args, state=state, slot_ids=torch.from_numpy(c["slot_ids"]).to(cuda),
                       cu_q=torch.from_numpy(c["cu_q"]).to(cuda), out=out, journal=journal,
                       A_log=A_log, dt_bias=dt_bias, qk_l2norm=True, status=status)
        assert not status.any()
        got.append((out.cpu().numpy(), journal.cpu().numpy()))
    for a, b in zip(*got):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    ref_out, ref_j = empty_out(T, Hv, D), empty_journal(T, Hk, Hv, D, D)
    gates = {n: views[n].float().cpu().numpy() for n in ("a", "b")}
    gdn_verify(**x, **gates, A_log=gat["A_log"], dt_bias=gat["dt_bias"], state=c["state"].copy(),
               slot_ids=c["slot_ids"], cu_q=c["cu_q"], out=ref_out, journal=ref_j, qk_l2norm=True)
    e = rel_err(got[0][0], ref_out)
    assert e < tol(sdt), f"out rel err {e}"


@needs_gpu
def test_gdn_gpu_fused_mode_rejects_and_flags(rng):
    from specdec_lib import ops
    c = gpu_case(rng, layout="kv", sdt=np.float32, ratio=2, fused=False, l2norm=False,
                 in_dtype=np.float32)
    B, T, W = len(c["slot_ids"]), c["T"], gdn_journal_width(c["Hk"], c["Hv"], 128, 128)
    d_state = dev(c["state"])
    j = poison((T, W), "float32")
    pj = dev(np.zeros((6, W), np.float32))
    base = dict(**{n: dev(a) for n, a in {**c["x"], **c["gat"]}.items()}, state=d_state,
                slot_ids=dev(c["slot_ids"]), cu_q=dev(c["cu_q"]),
                out=poison((T, c["Hv"], 128), "float32"), journal=j)
    ok_r0, ok_n = dev(np.zeros(B, np.int32)), dev(np.ones(B, np.int32))
    cases = [
        (dict(pending_journal=j, pending_row0=ok_r0, pending_len=ok_n), "overlaps journal"),
        (dict(pending_journal=dev(np.zeros((6, W + 1), np.float32)), pending_row0=ok_r0,
              pending_len=ok_n), "pending_journal: expected"),
        (dict(pending_journal=pj, pending_row0=ok_r0, pending_len=dev(np.full(B, 7, np.int32))),
         "outside the pending"),
        (dict(pending_len=ok_n), "without pending_journal"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            ops.gdn_verify(**base, **kw)
    with pytest.raises(ValueError, match="outside the pending"):
        ops.gdn_flush(d_state, base["slot_ids"], pj, ok_r0, dev(np.full(B, -1, np.int32)))
    np.testing.assert_array_equal(host(d_state, c["state"]), c["state"])
    # without the host check: the kernel commits nothing for that sequence and flags it
    n = np.zeros(B, np.int32)
    n[1] = 7
    st = poison((B,), "int32")
    ops.gdn_verify(**base, pending_journal=pj, pending_row0=ok_r0, pending_len=dev(n),
                   status=st, check_indices=False)
    flags = st.to_numpy()
    assert flags[1] == 8 and not np.delete(flags, 1).any()
    np.testing.assert_array_equal(host(d_state, c["state"]), c["state"])


# ---------------------------------------------------------------- the argument contract (CPU)
from conftest import REFUSAL_PATHS, assert_refused, call_op, on_path, strided_last  # noqa: E402
from test_copy import _cast, _vals  # noqa: E402

_GV_ORDER = ("q", "k", "v", "state", "slot_ids", "cu_q", "out", "journal")
_GC_ORDER = ("state", "slot_ids", "cu_q", "accept_len", "journal")
_GF_ORDER = ("state", "slot_ids", "pending_journal", "pending_row0", "pending_len")
_GDN_BF16 = {"q": "bfloat16", "k": "bfloat16", "v": "bfloat16", "state": "bfloat16"}


def _gdn_call(rng):
    """One small gdn round (Hk=1, Hv=2, Dk=8, Dv=4: the reference computes any head dims)."""
    Hk, Hv, Dk, Dv, T = 1, 2, 8, 4, 5
    cu_q, x, gat = make_block(rng, [2, 3], Hk, Hv, Dk, Dv)
    W = gdn_journal_width(Hk, Hv, Dk, Dv)
    return dict(**x, **gat, state=make_state(rng, 4, Hv, Dk, Dv, np.float32, "kv"),
                slot_ids=_i(2, 0), cu_q=cu_q, out=np.zeros((T, Hv, Dv), np.float32),
                journal=np.zeros((T, W), np.float32), accept_len=_i(1, 3),
                pending_journal=rng.standard_normal((T, W)).astype(np.float32),
                pending_row0=_i(0, 2), pending_len=_i(2, 3))


def _gdn_zeros(path, shape, dtype=np.float32):
    return on_path(path, {"a": np.zeros(shape, dtype)})["a"]


_GDN_VERIFY_BAD = [
    ("k_float32_for_bf16_q", ("torch",), lambda a, p: a.update(k=_cast(p, a["k"], "float32")),
     TypeError, r"^k: dtype"),
    ("slot_ids_int64", ("torch",), lambda a, p: a.update(slot_ids=_cast(p, a["slot_ids"], "int64")),
     TypeError, r"^slot_ids: dtype"),
    ("journal_float64", REFUSAL_PATHS, lambda a, p: a.update(journal=_cast(p, a["journal"], "float64")),
     TypeError, r"^journal: dtype"),
    ("cu_q_float32", REFUSAL_PATHS, lambda a, p: a.update(cu_q=_cast(p, a["cu_q"], "float32")),
     TypeError, r"^cu_q: dtype"),
    ("v_wrong_heads", REFUSAL_PATHS, lambda a, p: a.update(v=a["v"][:, :1]), ValueError, r"^v: expected shape"),
    ("q_wrong_head_dim", REFUSAL_PATHS, lambda a, p: a.update(q=a["q"][..., :4]), ValueError, r"^q: expected"),
    ("q_not_contiguous", REFUSAL_PATHS, lambda a, p: a.update(q=strided_last(a["q"]), k=strided_last(a["k"])),
     ValueError, r"^q: the last dimension must be contiguous"),
    ("journal_wrong_width", REFUSAL_PATHS, lambda a, p: a.update(journal=a["journal"][:, :-1]),
     ValueError, r"^journal: expected shape"),
    ("gating_mixed", REFUSAL_PATHS, lambda a, p: a.update(a=a["g"]), ValueError, r"^g/beta: give either"),
    ("state_not_contiguous", REFUSAL_PATHS, lambda a, p: a.update(state=strided_last(a["state"])),
     ValueError, r"^state: each slot's"),
    ("slot_shared", REFUSAL_PATHS, lambda a, p: a["slot_ids"].__setitem__(0, 0), ValueError, r"^slot_ids: the same slot"),
    ("slot_out_of_range", REFUSAL_PATHS, lambda a, p: a["slot_ids"].__setitem__(0, 9),
     ValueError, r"^slot_ids: id 9 out of range"),
    ("cu_q_decreasing", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 3, 2])),
     ValueError, r"^cu_q: must start at 0"),
    ("cu_q_ends_before_T", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 2, 4])),
     ValueError, r"^cu_q: .*end at T=5"),
    ("scale_nan", REFUSAL_PATHS, lambda a, p: a.update(scale=float("nan")), ValueError, r"^scale"),
    ("layout_bad", REFUSAL_PATHS, lambda a, p: a.update(layout="kk"), ValueError, r"^layout"),
    ("pending_is_journal", REFUSAL_PATHS, lambda a, p: a.update(pending=True, pending_journal=a["journal"]),
     ValueError, r"^pending_journal: overlaps journal"),
    ("pending_outside", REFUSAL_PATHS, lambda a, p: (a.update(pending=True), a["pending_len"].__setitem__(1, 4)),
     ValueError, r"^pending_row0 / pending_len: sequence 1"),
    ("pending_without_journal", REFUSAL_PATHS, lambda a, p: a.update(pending_only=True),
     ValueError, r"^pending_row0 / pending_len: given without"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _GDN_VERIFY_BAD, ids=[c[0] for c in _GDN_VERIFY_BAD])
def test_gdn_verify_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _gdn_call(rng), _GDN_BF16)
    mutate(args, path)
    kw = {n: args[n] for n in ("g", "beta", "a", "scale", "layout") if args.get(n) is not None}
    if args.get("pending"):
        kw.update({n: args[n] for n in ("pending_journal", "pending_row0", "pending_len")})
    if args.get("pending_only"):
        kw.update(pending_row0=args["pending_row0"], pending_len=args["pending_len"])
    assert_refused(lambda: call_op(path, "gdn_verify", [args[n] for n in _GV_ORDER], kw), exc, match,
                   [args["out"], args["journal"], args["state"]])


_GDN_COMMIT_BAD = [
    ("accept_len_int64", ("torch",), lambda a, p: a.update(accept_len=_cast(p, a["accept_len"], "int64")),
     TypeError, r"^accept_len: dtype"),
    ("journal_float64", REFUSAL_PATHS, lambda a, p: a.update(journal=_cast(p, a["journal"], "float64")),
     TypeError, r"^journal: dtype"),
    ("journal_width_not_for_state", REFUSAL_PATHS, lambda a, p: a.update(journal=a["journal"][:, :-1]),
     ValueError, r"^journal: width"),
    ("accept_len_past_block", REFUSAL_PATHS, lambda a, p: a["accept_len"].__setitem__(0, 3),
     ValueError, r"^accept_len: sequence 0 accepts 3"),
    ("accept_len_negative", REFUSAL_PATHS, lambda a, p: a["accept_len"].__setitem__(0, -1),
     ValueError, r"^accept_len: sequence 0"),
    ("slot_shared", REFUSAL_PATHS, lambda a, p: a["slot_ids"].__setitem__(0, 0), ValueError, r"^slot_ids: the same slot"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _GDN_COMMIT_BAD, ids=[c[0] for c in _GDN_COMMIT_BAD])
def test_gdn_commit_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _gdn_call(rng), _GDN_BF16)
    mutate(args, path)
    assert_refused(lambda: call_op(path, "gdn_commit", [args[n] for n in _GC_ORDER]), exc, match,
                   [args["state"]])


_GDN_FLUSH_BAD = [
    ("pending_len_int64", ("torch",), lambda a, p: a.update(pending_len=_cast(p, a["pending_len"], "int64")),
     TypeError, r"^pending_len: dtype"),
    ("pending_len_negative", REFUSAL_PATHS, lambda a, p: a["pending_len"].__setitem__(0, -1),
     ValueError, r"^pending_row0 / pending_len: sequence 0"),
    ("pending_row0_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(pending_row0=a["pending_row0"][:1]),
     ValueError, r"^pending_row0: expected shape"),
    ("pending_journal_not_contiguous", REFUSAL_PATHS,
     lambda a, p: a.update(pending_journal=strided_last(a["pending_journal"])),
     ValueError, r"^pending_journal: the last dimension"),
    ("slot_out_of_range", REFUSAL_PATHS, lambda a, p: a["slot_ids"].__setitem__(1, 4),
     ValueError, r"^slot_ids: id 4 out of range"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _GDN_FLUSH_BAD, ids=[c[0] for c in _GDN_FLUSH_BAD])
def test_gdn_flush_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _gdn_call(rng), _GDN_BF16)
    mutate(args, path)
    assert_refused(lambda: call_op(path, "gdn_flush", [args[n] for n in _GF_ORDER]), exc, match,
                   [args["state"]])


def _np(path, a):
    return (a.float().numpy() if path == "torch" else np.asarray(a, np.float64)).copy()


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_gdn_good_input_passes_the_contract(path, rng):
    args = on_path(path, _gdn_call(rng), _GDN_BF16)
    before = _np(path, args["state"])
    call_op(path, "gdn_verify", [args[n] for n in _GV_ORDER], {"g": args["g"], "beta": args["beta"]})
    assert np.count_nonzero(_np(path, args["out"])) > 0 and np.array_equal(_np(path, args["state"]), before)
    call_op(path, "gdn_commit", [args[n] for n in _GC_ORDER])
    after = _np(path, args["state"])
    assert not np.array_equal(after, before)
    call_op(path, "gdn_flush", [args[n] for n in _GF_ORDER])
    assert not np.array_equal(_np(path, args["state"]), after)


# ------------------------------------------------------------------ small-batch path
# ops.gdn._small_batch: a launch over B * Hv <= TUNING["small_heads"] (default 64) (sequence,
# value head) pairs runs the gdn_*_small_* kernels (CUDA-core family: 8 columns per warp, 4 or 8
# warps a CTA, the state slice prefetched into L2 before the PDL wait) or the _mma kernels with
# 4 or 8 warps. Outputs, journals and states must be the same bits as the default shape's.

def test_gdn_small_batch_dispatch(keep_small_heads):
    """The threshold and the small-batch launch shape (no GPU needed)."""
    from specdec_lib import _kernels
    from specdec_lib.ops import gdn as gdn_ops
    small = gdn_ops._small_batch
    assert small(1, 32) and small(2, 32) and small(1, 64) and small(64, 1)
    assert not small(3, 32) and not small(2, 64) and not small(65, 1) and not small(64, 32)
    try:
        gdn_ops.TUNING["small_heads"] = 0
        assert not small(1, 1)
        gdn_ops.TUNING["small_heads"] = 96
        assert small(3, 32) and not small(4, 32)
    finally:
        gdn_ops.TUNING["small_heads"] = None
    shape = gdn_ops._small_shape
    assert shape(128, 8, 1) == (4, 4) and shape(128, 8, 4) == (4, 4)   # one warp per block row
    assert shape(128, 8, 5) == (8, 2) and shape(64, 8, 8) == (8, 1)
    assert shape(16, 8, 4) == (2, 1) and shape(48, 8, 4) == (2, 3)     # as many as Dv allows
    assert shape(128, 16, 4) == (4, 2)                                 # the _mma kernels' 16
    try:
        gdn_ops.TUNING["warps"] = 2
        assert shape(128, 8, 4) == (2, 8)
    finally:
        gdn_ops.TUNING["warps"] = None
    kernels = _kernels.MODULES["gdn"].kernels
    for op in ("verify", "commit", "verify_fused"):
        for t in ("f32", "f16", "bf16"):
            for lay in ("kv", "vk"):
                for d in (64, 128):
                    assert f"gdn_{op}_small_{lay}_d{d}_{t}" in kernels
    assert not any("_small" in k and "_mma" in k for k in kernels)


# B = 1 / 2 at Hv = 32 (B * Hv = 32 / 64: the small-batch path by default); (4, 3): rows of
# unequal length; (8, 6): blocks longer than 4 rows (8 warps a CTA) and a padding row.
SMALL_BATCHES = [(1,), (4,), (4, 3), (8, 6)]


@needs_gpu
@pytest.mark.parametrize("q_lens", SMALL_BATCHES, ids=lambda q: "q" + "-".join(map(str, q)))
@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("sdt,family", SDT_FAMILIES, indirect=["family"])
def test_gdn_gpu_small_batch_equals_default_shape(rng, keep_small_heads, sdt, family, layout, D, q_lens):
    """Hk = 16, Hv = 32 (the issue's shape at D = 128), one or two sequences: a verify + commit
    round, and two fused rounds (the second with the first's accepted rows pending) + gdn_flush,
    each on the small-batch path and on the default shape from the same pool and inputs, every
    output, journal and status poisoned first: all of them and every slot of both pools bit for
    bit equal across the two shapes; the fused kernel with nothing pending == gdn_verify; the
    outputs and states against the float64 reference; padding rows zero, other slots untouched."""
    from specdec_lib import ops
    from specdec_lib.ops import gdn as gdn_ops
    sdt = STATE_DTYPES[sdt]
    Hk, Hv, B = 16, 32, len(q_lens)
    assert gdn_ops._small_batch(B, Hv)
    slots = B + 2
    state0 = make_state(rng, slots, Hv, D, D, sdt, layout)
    slot_ids = rng.permutation(slots)[:B].astype(np.int32)
    if q_lens == (8, 6):
        slot_ids[1] = -1                                   # padding row
    blocks = [make_block(rng, q_lens, Hk, Hv, D, D, np.uint16, True, unit_k=False) for _ in range(2)]
    cu_q = blocks[0][0]
    T = int(cu_q[-1])
    W = gdn_journal_width(Hk, Hv, D, D)
    accs = [np.array([rng.integers(1, q + 1) for q in q_lens], np.int32) for _ in range(2)]
    none = np.zeros(B, np.int32)

    def verify(state, blk, **kw):
        _, x, gat = blk
        o, j, s = poison((T, Hv, D), "float32"), poison((T, W), "float32"), poison((B,), "int32")
        ops.gdn_verify(**{n: dev(a) for n, a in {**x, **gat}.items()}, state=state,
                       slot_ids=dev(slot_ids), cu_q=dev(cu_q), out=o, journal=j, qk_l2norm=True,
                       layout=layout, status=s, **kw)
        return o, j, s

    def run(small_heads):
        gdn_ops.TUNING["small_heads"] = small_heads
        try:
            d_u, d_f = dev(state0), dev(state0)
            o, j, s = verify(d_u, blocks[0])
            sc = poison((B,), "int32")
            ops.gdn_commit(d_u, dev(slot_ids), dev(cu_q), dev(accs[0]), j, layout=layout, status=sc)
            o1, j1, s1 = verify(d_f, blocks[0], pending_journal=poison((1, W), "float32"),
                                pending_row0=dev(none), pending_len=dev(none))
            o2, j2, s2 = verify(d_f, blocks[1], pending_journal=j1, pending_row0=dev(cu_q[:-1]),
                                pending_len=dev(accs[0]))
            sf = poison((B,), "int32")
            ops.gdn_flush(d_f, dev(slot_ids), j2, dev(cu_q[:-1]), dev(accs[1]), layout=layout, status=sf)
            arrays = [a.to_numpy() for a in (o, j, o1, j1, o2, j2)]
            for st in (s, sc, s1, s2, sf):
                assert not st.to_numpy().any()
            return arrays, host(d_u, state0), host(d_f, state0)
        finally:
            gdn_ops.TUNING["small_heads"] = None

    small, default = run(None), run(0)
    for a, b in zip(small[0], default[0]):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    for a, b in zip(small[1:], default[1:]):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    (o, j, o1, j1, o2, j2), got_u, got_f = small
    np.testing.assert_array_equal(o.view(np.uint32), o1.view(np.uint32))
    np.testing.assert_array_equal(j.view(np.uint32), j1.view(np.uint32))
    # the float64 reference: round 1 verify + commit, round 2 verify + commit (= the flush)
    exp = state0.copy()
    outs = []
    for blk, acc, d_j in ((blocks[0], accs[0], j), (blocks[1], accs[1], j2)):
        _, x, gat = blk
        out = empty_out(T, Hv, D)
        gdn_verify(**x, **gat, state=exp.copy(), slot_ids=slot_ids, cu_q=cu_q, out=out,
                   journal=empty_journal(T, Hk, Hv, D, D), qk_l2norm=True, layout=layout)
        outs.append(out)
        gdn_commit(exp, slot_ids, cu_q, acc, d_j, layout=layout)
        if len(outs) == 1:
            e = rel_err(f64(got_u), f64(exp))
            assert e < tol(sdt) / 4, f"state after verify + commit: rel err {e}"
    for got, want in ((o, outs[0]), (o2, outs[1])):
        e = rel_err(got, want)
        assert e < tol(sdt, np.uint16), f"out rel err {e}"
    e = rel_err(f64(got_f), f64(exp))
    assert e < tol(sdt) / 4, f"state after two fused rounds + flush: rel err {e}"
    for b in range(B):
        if slot_ids[b] < 0:
            r = slice(cu_q[b], cu_q[b + 1])
            assert not o[r].any() and not o2[r].any(), "padding rows must be zero"
    untouched = np.setdiff1d(np.arange(slots), slot_ids)
    for got in (got_u, got_f):
        np.testing.assert_array_equal(got[untouched].view(np.uint8), state0[untouched].view(np.uint8))


@needs_gpu
@pytest.mark.parametrize("B", [2, 3])
def test_gdn_gpu_small_batch_threshold(rng, keep_small_heads, monkeypatch, B):
    """At Hv = 32 the shipped threshold (B * Hv <= 64) launches B = 2 on the small-batch kernels
    and B = 3 on the default ones (the launched names are recorded); either way the outputs
    (poisoned) and the committed state against the float64 reference."""
    from specdec_lib import ops
    from specdec_lib.ops import gdn as gdn_ops
    names = []
    real = gdn_ops.runtime.kernel
    monkeypatch.setattr(gdn_ops.runtime, "kernel", lambda mod, name, d: names.append(name) or real(mod, name, d))
    Hk, Hv, D = 16, 32, 128
    cu_q, x, gat = make_block(rng, (4,) * B, Hk, Hv, D, D, np.uint16, True, unit_k=False)
    c = dict(cu_q=cu_q, x=x, gat=gat, state=make_state(rng, B + 1, Hv, D, D, np.float32, "kv"),
             slot_ids=rng.permutation(B + 1)[:B].astype(np.int32), Hk=Hk, Hv=Hv, Dk=D, Dv=D,
             T=int(cu_q[-1]))
    got, out, d_j, j = _verify_vs_reference(c, "kv", True)
    assert rel_err(got, out) < tol(np.float32, np.uint16)
    assert rel_err(d_j.to_numpy(), j) < 1e-5
    d_state = dev(c["state"])
    acc = np.full(B, 3, np.int32)
    ops.gdn_commit(d_state, dev(c["slot_ids"]), dev(c["cu_q"]), dev(acc), d_j, layout="kv")
    exp = c["state"].copy()
    gdn_commit(exp, c["slot_ids"], c["cu_q"], acc, d_j.to_numpy(), layout="kv")
    assert rel_err(f64(host(d_state, exp)), f64(exp)) < tol(np.float32) / 4
    v = "_small" if B * Hv <= 64 else ""
    assert names == [f"gdn_verify{v}_kv_d128_f32", f"gdn_commit{v}_kv_d128_f32"]

