"""spec_sample: numpy reference (CPU: exactness statistics, greedy rules, status codes,
validation) and the CUDA kernels (GPU: against the reference)."""
import math

import numpy as np
import pytest

from specdec_lib.reference import sampling as ref
from specdec_lib.reference.sampling import (TILE, filtered_probs, philox4x32_10,
                                            sample_block, sample_block_many, spec_sample)

from conftest import needs_gpu

N_STAT = 100_000          # samples per chi-square case


# ------------------------------------------------------------------ helpers

def chi_square_z(counts, probs):
    """Wilson-Hilferty z-score of Pearson's chi-square (bins with expected < 5 merged)."""
    counts = np.asarray(counts, dtype=np.float64)
    exp = np.asarray(probs, dtype=np.float64) * counts.sum()
    assert counts[exp == 0].sum() == 0, f"samples where p == 0: {np.flatnonzero((exp == 0) & (counts > 0))}"
    big = exp >= 5
    c = np.append(counts[big], counts[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    keep = e > 0
    c, e = c[keep], e[keep]
    df = len(c) - 1
    if df < 1:
        return 0.0
    x2 = float(((c - e) ** 2 / e).sum())
    return ((x2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))


def seeds(n, base=0):
    return (np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(base))


def batch_inputs(q_lens, V, rng, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, dtype=np.float32):
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    logits = (rng.standard_normal((T, V)) * 2).astype(dtype)
    draft_ids = rng.integers(0, V, T - B).astype(np.int32)
    full = lambda v, dt: np.full(B, v, dt) if np.isscalar(v) else np.asarray(v, dt)
    params = dict(temperature=full(temperature, np.float32), top_k=full(top_k, np.int32),
                  top_p=full(top_p, np.float32), min_p=full(min_p, np.float32),
                  seed=np.arange(B, dtype=np.int64) * 7919 + 17, step=np.full(B, 3, np.int64))
    return cu_q, logits, draft_ids, params


def outputs(B, W):
    return (np.full(B, -7, np.int32), np.full((B, W), -7, np.int32), np.full(B, -7, np.int32))


def run_ref(cu_q, logits, draft_ids, params, W=None, unchecked=False, **kw):
    """The reference op; ``unchecked``: without its contract (what the kernels do with
    check_indices=False: a bad layout is flagged, status 4, instead of refused)."""
    B = len(cu_q) - 1
    W = W or int(np.max(np.diff(cu_q), initial=1))
    n, em, st = outputs(B, W)
    fn = spec_sample.unchecked if unchecked else spec_sample
    fn(logits, cu_q, draft_ids, params["temperature"], params["top_k"], params["top_p"],
       params["min_p"], params["seed"], params["step"], n, em, st, **kw)
    return n, em, st


# ------------------------------------------------------------------ Philox

def test_philox4x32_10_known_answers():
    # Random123 kat_vectors: counter[4] key[2] -> output[4]
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in cases:
        assert tuple(int(x) for x in philox4x32_10(ctr, key)) == want


def test_philox_streams_are_uniform_and_distinct():
    bits = ref.philox_bits(seeds(1 << 16), 5, 0, ref.PURPOSE_ACCEPT, 0)
    u = ref.uniform_accept(bits)
    assert abs(u.mean() - 0.5) < 0.01 and u.min() >= 0 and u.max() < 1
    other = ref.philox_bits(seeds(1 << 16), 6, 0, ref.PURPOSE_ACCEPT, 0)
    assert (bits != other).mean() > 0.999
    e = ref.exponential(ref.philox_bits(7, 1, 2, ref.PURPOSE_TOKEN, np.arange(1 << 16)))
    assert abs(e.mean() - 1) < 0.02 and np.isfinite(e).all() and (e > 0).all()
    # both ends of the 32-bit range stay finite and positive
    ends = ref.exponential(np.array([0, 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1], np.uint32))
    assert np.isfinite(ends).all() and (ends > 0).all()


# ------------------------------------------------------------------ exactness (chi-square)

def rand_logits(rng, V, scale=2.0, dead=0):
    l = rng.standard_normal(V) * scale
    if dead:
        l[rng.choice(V, dead, replace=False)] = -np.inf
    return l


def dirichlet_q(rng, V, zeros=0):
    q = rng.dirichlet(np.full(V, 0.5))
    if zeros:
        q[rng.choice(V, zeros, replace=False)] = 0
        q /= q.sum()
    return q


@pytest.mark.parametrize("V", [16, 37, 64])
def test_spec_sample_first_token_one_hot_draft(V, rng):
    block = np.stack([rand_logits(rng, V), rand_logits(rng, V)])
    p0 = filtered_probs(block[0], 0.8, 0, 1.0, 0.0)
    x = int(np.argsort(p0)[V // 2])         # a middling draft: both outcomes frequent
    n, em = sample_block_many(block, np.full((N_STAT, 1), x), 0.8, 0, 1.0, 0.0, seeds(N_STAT), 11)
    assert chi_square_z(np.bincount(em[:, 0], minlength=V), p0) < 4.5
    assert abs((n == 1).mean() - p0[x]) < 5 * math.sqrt(p0[x] * (1 - p0[x]) / N_STAT) + 1e-9
    # given acceptance, the bonus token follows row 1
    p1 = filtered_probs(block[1], 0.8, 0, 1.0, 0.0)
    assert chi_square_z(np.bincount(em[n == 1, 1], minlength=V), p1) < 4.5


@pytest.mark.parametrize("case", ["dirichlet", "zeros_in_q", "disjoint", "topk_topp", "minp", "d2t"])
def test_spec_sample_first_token_draft_probs(case, rng):
    V = 48
    block = np.stack([rand_logits(rng, V), rand_logits(rng, V)])
    temp, top_k, top_p, min_p, d2t = 1.0, 0, 1.0, 0.0, None
    qd = dirichlet_q(rng, V)
    if case == "zeros_in_q":
        qd = dirichlet_q(rng, V, zeros=V // 3)
    elif case == "disjoint":
        block[0, V // 2:] = -np.inf
        qd = np.zeros(V)
        qd[V // 2:] = rng.dirichlet(np.ones(V - V // 2))
    elif case == "topk_topp":
        temp, top_k, top_p = 0.7, 20, 0.8
    elif case == "minp":
        temp, min_p, top_p = 1.3, 0.05, 0.95
    elif case == "d2t":
        d2t = np.sort(rng.choice(V, 20, replace=False)).astype(np.int32)
        qd = rng.dirichlet(np.ones(20))
    p0 = filtered_probs(block[0], temp, top_k, top_p, min_p)
    support = np.arange(V) if d2t is None else d2t
    drafts = rng.choice(support, size=(N_STAT, 1), p=qd)     # x ~ q, as the drafter would
    n, em = sample_block_many(block, drafts, temp, top_k, top_p, min_p, seeds(N_STAT, 5), 2,
                              draft_rows=qd[None], d2t=d2t)
    assert chi_square_z(np.bincount(em[:, 0], minlength=V), p0) < 4.5
    qv = np.zeros(V)
    qv[support] = qd
    acc = np.minimum(p0, qv).sum()            # closed form P(accept)
    assert abs((n == 1).mean() - acc) < 5 * math.sqrt(acc * (1 - acc) / N_STAT) + 1e-9
    if case == "disjoint":
        assert (n == 0).all()


def test_spec_sample_filters_active_chi_square(rng):
    # top-k / top-p / min-p active together, one-hot draft of a filtered-out token
    V = 64
    block = np.stack([rand_logits(rng, V, 3.0)] * 2)
    p0 = filtered_probs(block[0], 0.9, 24, 0.7, 0.01)
    assert 1 < (p0 > 0).sum() < 24
    x = int(np.argmin(block[0]))             # filtered out: always rejected
    n, em = sample_block_many(block, np.full((N_STAT, 1), x), 0.9, 24, 0.7, 0.01, seeds(N_STAT, 9), 0)
    assert (n == 0).all()
    assert chi_square_z(np.bincount(em[:, 0], minlength=V), p0) < 4.5


def test_spec_sample_two_level_race_over_tiles(rng):
    # V spans 3 tiles; the mass sits on a few tokens of every tile
    V = 2 * TILE + 100
    l = np.full(V, -np.inf)
    hot = np.concatenate([rng.choice(np.arange(t * TILE, min(V, (t + 1) * TILE)), 6, replace=False)
                          for t in range(3)])
    l[hot] = rng.standard_normal(hot.size)
    block = l[None]
    p = filtered_probs(l, 1.0, 0, 1.0, 0.0)
    N = 40_000
    n, em = sample_block_many(block, np.zeros((N, 0)), 1.0, 0, 1.0, 0.0, seeds(N, 3), 4)
    assert chi_square_z(np.bincount(em[:, 0], minlength=V)[hot], p[hot]) < 4.5


def test_sample_block_many_matches_the_loop(rng):
    V = 40
    block = np.stack([rand_logits(rng, V) for _ in range(3)])
    qd = np.stack([dirichlet_q(rng, V) for _ in range(2)])
    for dr in (None, qd):
        drafts = rng.integers(0, V, (64, 2))
        drafts[::4, 0] = -1                    # bad ids: always rejected
        sd = seeds(64, 77)
        n, em = sample_block_many(block, drafts, 0.9, 30, 0.9, 0.0, sd, 8, draft_rows=dr)
        for j in range(64):
            st, nj, toks, _ = sample_block(block, list(drafts[j]), 0.9, 30, 0.9, 0.0, sd[j], 8, dr)
            assert nj == n[j] and list(em[j, :nj + 1]) == toks


# ------------------------------------------------------------------ filters by hand

def test_filtered_probs_thresholds_by_hand():
    l = np.array([3.0, 2.0, 2.0, 1.0, 0.0, -np.inf])
    kept = lambda **kw: np.flatnonzero(filtered_probs(l, kw.get("t", 1.0), kw.get("k", 0),
                                                      kw.get("p", 1.0), kw.get("m", 0.0)) > 0)
    assert list(kept()) == [0, 1, 2, 3, 4]
    assert list(kept(k=2)) == [0, 1, 2]            # ties at the k-th value are kept
    assert list(kept(k=1)) == [0]
    assert list(kept(k=100)) == [0, 1, 2, 3, 4]    # k >= V: off
    e = np.exp(l[:5] - 3)
    assert list(kept(p=e[0] / e.sum())) == [0]                       # exactly reaches p
    assert list(kept(p=e[0] / e.sum() + 1e-6)) == [0, 1, 2]          # next group, ties kept
    assert list(kept(p=0.0)) == [0]
    assert list(kept(k=3, p=0.99)) == [0, 1, 2]      # top-p on the top-k renormalised dist
    assert list(kept(m=math.exp(-1.5))) == [0, 1, 2]
    assert list(kept(m=2.0)) == [0]                  # clamped to 1: the max survives


# ------------------------------------------------------------------ greedy

def test_spec_sample_greedy_rules():
    V = 8
    rows = np.array([
        [0, 5, 5, 1, 0, 0, 0, 0],                    # tie: lowest id (1)
        [np.nan, 1, 2, np.nan, 2, -np.inf, 0, 0],    # NaN never wins: 2
        [-np.inf] * 8,                                # all -inf: 0 (an ordinary value)
        [np.nan, np.nan, 1, 1, 9, 9, np.nan, np.inf],  # +inf is the largest: 7
    ], np.float32)
    cu_q = np.array([0, 4], np.int32)
    drafts = np.array([1, 2, 0], np.int32)            # all match: bonus from row 3
    p = dict(temperature=np.zeros(1, np.float32), top_k=np.zeros(1, np.int32),
             top_p=np.ones(1, np.float32), min_p=np.zeros(1, np.float32),
             seed=np.zeros(1, np.int64), step=np.zeros(1, np.int64))
    n, em, st = run_ref(cu_q, rows, drafts, p)
    assert n[0] == 3 and list(em[0]) == [1, 2, 0, 7] and st[0] == ref.STATUS_NONFINITE
    n, em, st = run_ref(cu_q, rows, np.array([1, 3, 0], np.int32), p)
    assert n[0] == 1 and list(em[0]) == [1, 2, -1, -1]
    n, em, st = run_ref(cu_q, rows, np.array([1, 2, 99], np.int32), p, W=6)
    assert n[0] == 2 and list(em[0]) == [1, 2, 0, -1, -1, -1] and st[0] == ref.STATUS_NONFINITE
    rows[2] = np.nan                                  # an all-NaN row: invalid block
    n, em, st = run_ref(cu_q, rows, drafts, p)
    assert n[0] == 0 and (em[0] == -1).all() and st[0] == ref.STATUS_NONFINITE


def test_spec_sample_greedy_bad_draft_is_rejected(rng):
    cu_q, logits, drafts, p = batch_inputs([3], 20, rng, temperature=0.0)
    drafts[0] = int(np.argmax(logits[0]))
    drafts[1] = 20
    n, em, st = run_ref(cu_q, logits, drafts, p)
    assert n[0] == 1 and list(em[0]) == [drafts[0], np.argmax(logits[1]), -1]
    assert st[0] == ref.STATUS_BAD_DRAFT


# ------------------------------------------------------------------ batches, status

def test_spec_sample_ragged_mixed_batch(rng):
    q_lens = [1, 4, 2, 1, 3]
    temps = [0.0, 0.7, 1.0, 0.0, 1.2]
    cu_q, logits, drafts, p = batch_inputs(q_lens, 50, rng, temperature=temps, top_p=0.9, top_k=[0, 5, 0, 0, 50])
    # make the greedy drafts of sequence 1.. partially right
    n, em, st = run_ref(cu_q, logits, drafts, p, W=5)
    assert (st == 0).all()
    for b, q in enumerate(q_lens):
        assert 0 <= n[b] <= q - 1
        assert (em[b, :n[b] + 1] >= 0).all() and (em[b, n[b] + 1:] == -1).all()
        d = drafts[cu_q[b] - b: cu_q[b + 1] - b - 1]
        assert list(em[b, :n[b]]) == list(d[:n[b]])
    # same inputs -> same outputs; another step -> another stream
    again = run_ref(cu_q, logits, drafts, p, W=5)
    assert all((a == b).all() for a, b in zip((n, em, st), again))


def test_spec_sample_is_deterministic_and_step_dependent(rng):
    V, B = 64, 256
    cu_q, logits, drafts, p = batch_inputs([2] * B, V, rng)
    logits[:] = np.tile(logits[:2], (B, 1))        # every sequence sees the same block
    drafts[:] = drafts[0]
    p["seed"][:] = 1234
    a = run_ref(cu_q, logits, drafts, p)
    assert (a[1] == a[1][0]).all()                 # same seed/step: identical everywhere
    p["step"] = np.arange(B, dtype=np.int64)
    b = run_ref(cu_q, logits, drafts, p)
    assert len({tuple(r) for r in b[1]}) > 10      # different steps: different draws


def test_spec_sample_status_codes(rng):
    cu_q, logits, drafts, p = batch_inputs([2, 2, 2, 2, 1], 16, rng)
    logits[0, 3] = np.nan                          # seq 0: NaN -> invalid
    logits[3, 5] = np.inf                          # seq 1: +inf -> invalid
    logits[4] = -np.inf                            # seq 2: empty row -> invalid
    drafts[3] = 16                                 # seq 3: bad draft -> rejected, valid
    n, em, st = run_ref(cu_q, logits, drafts, p)
    assert list(st) == [1, 1, 3, 2, 0]
    for b in range(3):
        assert n[b] == 0 and (em[b] == -1).all()
    assert n[3] == 0 and em[3, 0] >= 0 and em[3, 1] == -1
    assert n[4] == 0 and em[4, 0] >= 0


def test_spec_sample_bad_layout_is_flagged(rng):
    cu_q, logits, drafts, p = batch_inputs([3, 1], 16, rng)
    with pytest.raises(ValueError, match="^emitted: 2 columns, but block 0 has 3 rows"):
        run_ref(cu_q, logits, drafts, p, W=2)           # the op's contract refuses it
    n, em, st = run_ref(cu_q, logits, drafts, p, W=2, unchecked=True)   # the kernels flag it
    assert list(st) == [ref.STATUS_BAD_LAYOUT, 0] and n[0] == 0 and (em[0] == -1).all()


def test_spec_sample_logprobs(rng):
    cu_q, logits, drafts, p = batch_inputs([3, 2], 30, rng, temperature=[0.0, 0.9], top_k=[0, 10])
    drafts[0] = np.argmax(logits[0])
    lp = np.full((2, 3), np.nan, np.float32)
    n, em, st = run_ref(cu_q, logits, drafts, p, W=3, accepted_logprobs=lp)
    l0 = logits[0].astype(np.float64)
    assert np.isclose(lp[0, 0], l0[em[0, 0]] - np.log(np.exp(l0).sum()), atol=1e-6)
    pr = filtered_probs(logits[3], 0.9, 10, 1.0, 0.0)
    assert np.isclose(lp[1, n[1]], np.log(pr[em[1, n[1]]])) or n[1] == 0
    assert (lp[:, 2:][em[:, 2:] == -1] == 0).all()


def test_request_filters_matches_the_kernel_rule():
    V = 100
    f = ref.request_filters
    assert not f(V, 0.0, 5, 0.5, 0.1)              # greedy: never filtered
    assert not f(V, float("nan"), 5, 0.5, 0.1)
    assert not f(V, 1.0, 0, 1.0, 0.0)
    assert not f(V, 1.0, V, 1.0, 0.0) and not f(V, 1.0, -3, 1.0, 0.0)   # top_k off
    assert not f(V, 1.0, 0, float("nan"), float("nan"))                  # NaN: off
    assert f(V, 1.0, V - 1, 1.0, 0.0) and f(V, 0.5, 0, 0.999, 0.0) and f(V, 2.0, 0, 1.0, 1e-6)


def test_spec_sample_filters_false_flags_filtering_requests(rng):
    q_lens = [2, 3, 1, 2, 3]
    cu_q, logits, drafts, p = batch_inputs(q_lens, 40, rng, temperature=[0.0, 0.8, 1.0, 1.1, 0.7],
                                           top_k=[5, 0, 0, 10, 0], top_p=[0.5, 1.0, 0.9, 1.0, 1.0],
                                           min_p=[0.0, 0.0, 0.0, 0.0, 0.0])
    base = run_ref(cu_q, logits, drafts, p, W=3)
    for flag in (None, True):
        got = run_ref(cu_q, logits, drafts, p, W=3, filters=flag)
        assert all((a == b).all() for a, b in zip(base, got))
    n, em, st = run_ref(cu_q, logits, drafts, p, W=3, filters=False)
    assert list(st) == [0, 0, ref.STATUS_FILTER_SKIPPED, ref.STATUS_FILTER_SKIPPED, 0]
    for b in (2, 3):                               # invalid block: nothing sampled
        assert n[b] == 0 and (em[b] == -1).all()
    for b in (0, 1, 4):                            # greedy (any top-k/p) and unfiltered: as before
        assert n[b] == base[0][b] and (em[b] == base[1][b]).all() and st[b] == base[2][b]
    # bad layout (unchecked: flagged by the kernels) still wins over the skipped filter
    n, em, st = run_ref(cu_q, logits, drafts, p, W=2, filters=False, unchecked=True)
    assert st[1] == ref.STATUS_BAD_LAYOUT and st[3] == ref.STATUS_FILTER_SKIPPED


def test_spec_sample_validation_errors(rng):
    cu_q, logits, drafts, p = batch_inputs([2, 2], 16, rng)
    args = lambda **o: [o.get(k, v) for k, v in (("logits", logits), ("cu_q", cu_q), ("draft_ids", drafts))] + \
        [o.get(k, p[k]) for k in ("temperature", "top_k", "top_p", "min_p", "seed", "step")] + \
        list(outputs(2, 2))
    with pytest.raises(ValueError, match="draft_ids"):
        spec_sample(*args(draft_ids=drafts[:1]))
    with pytest.raises(ValueError, match="top_p"):
        spec_sample(*args(top_p=np.ones(3, np.float32)))
    with pytest.raises(TypeError, match="logits"):
        spec_sample(*args(logits=logits.astype(np.int32)))
    with pytest.raises(ValueError, match="draft_probs"):
        spec_sample(*args(), draft_probs=np.ones((2, 15), np.float32))
    with pytest.raises(ValueError, match="d2t"):
        spec_sample(*args(), draft_probs=np.ones((2, 3), np.float32), d2t=np.array([3, 2, 5], np.int32))
    with pytest.raises(TypeError, match="filters"):
        spec_sample(*args(), filters="no")


# ================================================================== GPU
# The kernels against the reference. Outputs are filled with a sentinel (0x7F7F7F7F, not a
# value the op ever writes) before each run, so an element the kernel misses shows up.

SENTINEL = 0x7F7F7F7F


# Every GPU test runs on the three kernel paths of spec_sample: "small" (spec_sample_small,
# sm_90, 16-bit logits, one-hot drafts, calls whose T x CTAs per row fit one wave; larger
# calls then take the rows path), "rows" (the one-pass cluster path spec_sample_rows, at any
# batch size, wherever it can run: sm_90 code, 16-bit logits, one-hot drafts; other inputs
# take the tiles path) and "tiles" (tiles -> hist / threshold -> finish).
def pytest_generate_tests(metafunc):
    if "spec_sample_path" in metafunc.fixturenames and metafunc.definition.get_closest_marker("gpu"):
        metafunc.parametrize("spec_sample_path", ["small", "rows", "tiles"], indirect=True)


@pytest.fixture(autouse=True)
def spec_sample_path(request, monkeypatch):
    """"small" / "rows" force that path wherever it can run (so large and small batches test
    it), "tiles" the other; CPU tests see none."""
    from specdec_lib.ops.sampling import PATH_ENV
    path = getattr(request, "param", None)
    monkeypatch.delenv(PATH_ENV, raising=False)
    if path in ("rows", "small"):
        from specdec_lib import runtime
        if runtime.gpu_unavailable_reason() is None and runtime.arch_family(0) < 90:
            pytest.skip("below sm_90 code only the tiles path runs")
    if path is not None:
        monkeypatch.setenv(PATH_ENV, path)
    return path
GPU_DTYPES = ["float32", "float16", "bfloat16"]


def to_dtype(x, dtype):
    """float64/32 host logits -> (host storage for DeviceArray, float64 values the GPU sees)."""
    from specdec_lib.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
    x = np.asarray(x, np.float32)
    if dtype == "bfloat16":
        bits = f32_to_bf16_bits(x)
        return bits, bf16_bits_to_f32(bits).astype(np.float64)
    if dtype == "float16":
        h = x.astype(np.float16)
        return h, h.astype(np.float64)
    return x, x.astype(np.float64)


def gpu_run(cu_q, logits_host, dtype, draft_ids, params, W, draft_probs=None, d2t=None,
            logprobs=False, stream=None, runs=1, filters=None, check_indices=True):
    """Upload, run the op ``runs`` times (fresh sentinel each time), return host outputs."""
    from specdec_lib import DeviceArray
    from specdec_lib.ops import spec_sample as op, spec_sample_workspace_size
    B = len(cu_q) - 1
    T, V = logits_host.shape
    dev = lambda a, dt=None: DeviceArray.from_numpy(a, dtype=dt)
    lg = dev(logits_host, dtype)
    args = [dev(np.asarray(cu_q, np.int32)), dev(np.asarray(draft_ids, np.int32))] + \
        [dev(params[k]) for k in ("temperature", "top_k", "top_p", "min_p", "seed", "step")]
    ws = DeviceArray.empty((spec_sample_workspace_size(T, V),), "uint8")
    dp = dev(np.asarray(draft_probs, np.float32)) if draft_probs is not None else None
    dm = dev(np.asarray(d2t, np.int32)) if d2t is not None else None
    results = []
    for _ in range(runs):
        na = dev(np.full(B, SENTINEL, np.int32))
        em = dev(np.full((B, W), SENTINEL, np.int32))
        st = dev(np.full(B, SENTINEL, np.int32))
        lp = dev(np.full((B, W), np.nan, np.float32)) if logprobs else None
        op(lg, *args, na, em, st, dp, dm, lp, workspace=ws, stream=stream, filters=filters,
           check_indices=check_indices)
        res = [na.to_numpy(), em.to_numpy(), st.to_numpy()] + ([lp.to_numpy()] if logprobs else [])
        for a in res[:3]:
            assert (a != SENTINEL).all(), "an output element was not written"
        results.append(res)
    return results if runs > 1 else results[0]


def half_top_drafts(rng, seen, cu_q, V):
    """Draft ids [T - B]: random, but each block row's top token half of the time (so that
    chains get accepted); draws from ``rng`` in a fixed order."""
    B = len(cu_q) - 1
    drafts = rng.integers(0, V, int(cu_q[-1]) - B).astype(np.int32)
    for b in range(B):
        for i in range(int(cu_q[b + 1] - cu_q[b]) - 1):
            if rng.random() < 0.5:
                drafts[cu_q[b] - b + i] = int(np.nanargmax(seen[cu_q[b] + i]))
    return drafts


def make_params(B, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None, step=3):
    full = lambda v, dt: np.full(B, v, dt) if np.isscalar(v) else np.asarray(v, dt)
    return dict(temperature=full(temperature, np.float32), top_k=full(top_k, np.int32),
                top_p=full(top_p, np.float32), min_p=full(min_p, np.float32),
                seed=(np.arange(B, dtype=np.uint64) * np.uint64(7919) + np.uint64(17)) if seed is None
                else np.asarray(seed, np.uint64),
                step=full(step, np.int64))


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_spec_sample_gpu_greedy_signed_zero_max(dtype, rng):
    # The fast path's max is packed / NaN-propagating (sm_80+) and the argmax is found from it
    # afterwards: -0.0 and +0.0 are the same maximum, the lowest id of either wins, in any
    # lane / 16-byte vector of a tile (V = 5003: two full tiles and a tail tile).
    V = 5003
    q_lens = [3, 1, 4, 2]
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    raw = np.full((T, V), -1.0, np.float32)
    for t in range(T):
        pos = rng.choice(V, size=int(rng.integers(1, 6)), replace=False)
        raw[t, pos] = np.where(rng.random(pos.size) < 0.5, -0.0, 0.0)
    raw[1, [100, 101, 2100]] = [-0.0, 0.0, 0.0]     # -0 first, +0 in the next lane
    raw[2, [4095, 40]] = [0.0, -0.0]                  # the lower id is the -0
    host, seen = to_dtype(raw, dtype)
    drafts = np.empty(T - B, np.int32)
    for b in range(B):                                # accept a while, then miss
        for i in range(q_lens[b] - 1):
            a = ref.greedy_argmax(seen[cu_q[b] + i])
            drafts[cu_q[b] - b + i] = a if i < b % 2 + 1 else (a + 1) % V
    params = make_params(B, temperature=0.0)
    W = max(q_lens) + 1
    n, em, st = gpu_run(cu_q, host, dtype, drafts, params, W)
    rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=W)
    np.testing.assert_array_equal(n, rn)
    np.testing.assert_array_equal(em, rem)
    np.testing.assert_array_equal(st, rst)
    assert rem[0, 0] == min(np.flatnonzero(raw[0] == 0))   # the reference sees -0 == +0


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("V", [7, 1000, 5003, 151936])
@pytest.mark.parametrize("nan", [True, False])
def test_spec_sample_gpu_greedy_bit_exact(dtype, V, nan, rng):
    # nan=False: whole tiles take the vectorised fast path (ties across lanes and 16-byte
    # vectors, -inf); nan=True: every tile falls back to the per-token path
    q_lens = [1, 4, 2, 3, 1, 5] if V < 100000 else [4, 1]
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    raw = rng.integers(-3, 4, (T, V)).astype(np.float32) * 0.5     # many ties
    raw[rng.random((T, V)) < 0.05] = -np.inf
    if nan:
        raw[rng.random((T, V)) < 0.05] = np.nan
    else:
        raw[0, :] = -np.inf                # a row of -inf only: the lowest id wins
    host, seen = to_dtype(raw, dtype)
    drafts = np.empty(T - B, np.int32)
    for b in range(B):                     # drafts: argmax for a while, then a miss
        for i in range(q_lens[b] - 1):
            a = ref.greedy_argmax(seen[cu_q[b] + i])
            drafts[cu_q[b] - b + i] = a if i < b % 3 + 1 else (a + 1) % V
    drafts[-1:] = V + 5 if T - B > 0 else drafts[-1:]          # one bad id
    params = make_params(B, temperature=0.0)
    W = max(q_lens) + 1
    n, em, st, lp = gpu_run(cu_q, host, dtype, drafts, params, W, logprobs=True)
    rlp = np.zeros((B, W), np.float32)
    rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=W, accepted_logprobs=rlp)
    np.testing.assert_array_equal(n, rn)
    np.testing.assert_array_equal(em, rem)
    np.testing.assert_array_equal(st, rst)
    if not nan:
        ok = em >= 0
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(lp[ok], rlp[ok], rtol=2e-3, atol=2e-3)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_spec_sample_gpu_filters_large_vocab(dtype, rng):
    """Top-k / top-p thresholds at V=151936: the bucket + candidate-list select, and (rows
    with a plateau of 8000 equal logits at the cut) its fallback to the full-row radix."""
    V = 151936
    q_lens = [2, 3, 1, 2, 2, 1, 3, 2]
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    x = rng.standard_normal((T, V)) * 3
    for b in (6, 7):
        for r in range(cu_q[b], cu_q[b + 1]):
            x[r] = rng.standard_normal(V) - 20
            x[r, rng.choice(V, 8000, replace=False)] = 1.0
            x[r, 17] = 3.0
    host, seen = to_dtype(x, dtype)
    params = make_params(B, temperature=[0.7, 1.0, 0.8, 1.3, 0.0, 1.0, 1.0, 0.9],
                         top_k=[0, 50, 0, 2000, 0, 100000, 0, 6000],
                         top_p=[0.9, 1.0, 0.5, 0.95, 1.0, 1.0, 0.3, 0.8],
                         min_p=[0.0, 0.0, 0.02, 0.0, 0.0, 0.0, 0.0, 0.0])
    drafts = rng.integers(0, V, T - B).astype(np.int32)
    for b in range(B):
        for i in range(q_lens[b] - 1):
            if i % 2 == 0:
                drafts[cu_q[b] - b + i] = int(np.argmax(seen[cu_q[b] + i]))
    W = 4
    n, em, st, lp = gpu_run(cu_q, host, dtype, drafts, params, W, logprobs=True)
    rlp = np.zeros((B, W), np.float32)
    rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=W, accepted_logprobs=rlp)
    np.testing.assert_array_equal(st, rst)
    same = (n == rn) & (em == rem).all(1)
    assert (~same).sum() <= 1, f"{(~same).sum()} of {B} sequences differ from the reference"
    ok = same[:, None] & (em >= 0)
    np.testing.assert_allclose(lp[ok], rlp[ok], rtol=2e-3, atol=2e-3)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_spec_sample_gpu_misaligned_rows(dtype, rng):
    """Rows that are not 16-byte aligned (row stride V + 1) take the per-token path."""
    from specdec_lib import DeviceArray
    from specdec_lib.ops import spec_sample as op, spec_sample_workspace_size
    V = 2 * 2048 + 3
    q_lens = [3, 2, 1, 4]
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    host, seen = to_dtype(rng.standard_normal((T, V)) * 2, dtype)
    padded = np.zeros((T, V + 1), host.dtype)
    padded[:, :V] = host
    base = DeviceArray.from_numpy(padded)
    isz = padded.dtype.itemsize
    view = {"shape": (T, V), "typestr": padded.dtype.str, "strides": ((V + 1) * isz, isz),
            "data": (base.ptr, True), "version": 3}

    class Strided:
        __cuda_array_interface__ = view
    params = make_params(B, temperature=[1.0, 0.0, 0.8, 1.2], top_p=[1.0, 1.0, 0.9, 1.0])
    drafts = rng.integers(0, V, T - B).astype(np.int32)
    dev = lambda a: DeviceArray.from_numpy(a)
    args = [dev(cu_q), dev(drafts)] + [dev(params[k]) for k in ("temperature", "top_k", "top_p",
                                                                "min_p", "seed", "step")]
    W = 4
    na, em, stt = dev(np.full(B, SENTINEL, np.int32)), dev(np.full((B, W), SENTINEL, np.int32)), \
        dev(np.full(B, SENTINEL, np.int32))
    ws = DeviceArray.empty((spec_sample_workspace_size(T, V),), "uint8")
    op(Strided(), *args, na, em, stt, workspace=ws)
    n, e, st = na.to_numpy(), em.to_numpy(), stt.to_numpy()
    # the same values, contiguous (fast path): the same outputs (tile sums differ only in rounding)
    c = gpu_run(cu_q, host, dtype, drafts, params, W)
    np.testing.assert_array_equal(n, c[0])
    np.testing.assert_array_equal(e, c[1])
    np.testing.assert_array_equal(st, c[2])
    rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=W)
    np.testing.assert_array_equal(st, rst)


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("mode", ["onehot", "filters", "draft_probs", "d2t"])
def test_spec_sample_gpu_matches_reference_sampled(dtype, mode, rng):
    V = 3001                                 # two tiles, odd
    q_lens = [1, 3, 4, 2, 1, 4, 3, 2] * 4
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    host, seen = to_dtype(rng.standard_normal((T, V)) * 3, dtype)
    temps = rng.choice([0.0, 0.6, 1.0, 1.5], B).astype(np.float32)
    params = make_params(B, temperature=temps)
    dp = d2t = None
    if mode == "filters":
        params["top_k"] = rng.choice([0, 1, 20, 500, V + 3], B).astype(np.int32)
        params["top_p"] = rng.choice([1.0, 0.0, 0.5, 0.9], B).astype(np.float32)
        params["min_p"] = rng.choice([0.0, 0.0, 0.05], B).astype(np.float32)
    if mode in ("draft_probs", "d2t"):
        Vd = V if mode == "draft_probs" else 1200
        d2t = None if mode == "draft_probs" else np.sort(rng.choice(V, Vd, replace=False)).astype(np.int32)
        dp = rng.dirichlet(np.full(Vd, 0.3), T - B).astype(np.float32)
        ids = np.array([rng.choice(Vd, p=r / r.sum()) for r in dp.astype(np.float64)])
        drafts = (ids if d2t is None else d2t[ids]).astype(np.int32)
    else:
        # drafts: the row's top token half of the time (so chains get accepted)
        drafts = half_top_drafts(rng, seen, cu_q, V)
    W = 5
    n, em, st, lp = gpu_run(cu_q, host, dtype, drafts, params, W, dp, d2t, logprobs=True)
    rlp = np.zeros((B, W), np.float32)
    rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=W, draft_probs=dp, d2t=d2t,
                           accepted_logprobs=rlp)
    np.testing.assert_array_equal(st, rst)
    same = (n == rn) & (em == rem).all(1)
    # float32 vs float64 may flip a draw that sits on a boundary: allow a rare one
    assert same.mean() >= 0.95, f"{(~same).sum()} of {B} sequences differ from the reference"
    assert (n[~same] >= 0).all()
    ok = same[:, None] & (em >= 0)
    np.testing.assert_allclose(lp[ok], rlp[ok], rtol=2e-3, atol=2e-3)


@needs_gpu
@pytest.mark.parametrize("case,dtype", [
    ("onehot", "float32"), ("draft_probs", "float32"), ("filters", "float32"), ("disjoint", "float32"),
    # 16-bit logits filter through the exact-value histogram (thresholds and kept mass in one
    # launch) and finish sums the sampling row's kept tiles itself: the same distribution
    ("filters", "bfloat16"), ("filters", "float16"), ("filters_draft_probs", "bfloat16"),
    ("min_p", "bfloat16")])
def test_spec_sample_gpu_chi_square(case, dtype, rng):
    V, N = 37, N_STAT
    block = np.stack([rand_logits(rng, V), rand_logits(rng, V)]).astype(np.float32)
    block, seen = to_dtype(block, dtype)
    temp, top_k, top_p, min_p, dp = 0.9, 0, 1.0, 0.0, None
    if case.startswith("filters"):
        top_k, top_p, min_p = 20, 0.8, 0.01
    if case == "min_p":
        min_p = 0.05
    if case == "disjoint":
        block[0, V // 2:] = -np.inf
        seen[0, V // 2:] = -np.inf
    p0 = filtered_probs(seen[0], temp, top_k, top_p, min_p)
    if case in ("draft_probs", "disjoint", "filters_draft_probs"):
        qd = dirichlet_q(rng, V, zeros=5)
        if case == "disjoint":
            qd = np.zeros(V)
            qd[V // 2:] = rng.dirichlet(np.ones(V - V // 2))
        drafts = rng.choice(V, N, p=qd).astype(np.int32)
        dp = np.repeat(qd[None].astype(np.float32), N, 0)
    else:
        drafts = np.full(N, int(np.argsort(p0)[-3]), np.int32)
    cu_q = (np.arange(N + 1) * 2).astype(np.int32)
    logits = np.tile(block, (N, 1))
    params = make_params(N, temp, top_k, top_p, min_p, seed=seeds(N, 1))
    n, em, st = gpu_run(cu_q, logits, dtype, drafts, params, 2, dp)
    assert (st == 0).all()
    assert chi_square_z(np.bincount(em[:, 0], minlength=V), p0) < 4.5
    qv = np.zeros(V)
    if dp is None:
        qv[drafts[0]] = 1
    else:
        qv = dp[0].astype(np.float64)
    acc = np.minimum(p0, qv).sum()
    assert abs((n == 1).mean() - acc) < 5 * math.sqrt(acc * (1 - acc) / N) + 1e-9
    p1 = filtered_probs(seen[1], temp, top_k, top_p, min_p)
    if (n == 1).sum() > 1000:
        assert chi_square_z(np.bincount(em[n == 1, 1], minlength=V), p1) < 4.5


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_spec_sample_gpu_filters_false(dtype, rng):
    """filters=False skips the threshold + recount launches: unfiltered requests (greedy ones
    with any top-k/top-p) give bit-identical outputs to the default; requests that do filter
    get status 5 (never a silently unfiltered sample)."""
    V = 5003
    q_lens = [1, 3, 4, 2, 1, 4, 3, 2] * 3
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    host, seen = to_dtype(rng.standard_normal((T, V)) * 3, dtype)
    temps = rng.choice([0.0, 0.7, 1.0], B).astype(np.float32)
    params = make_params(B, temperature=temps, top_p=np.where(temps == 0, 0.5, 1.0))
    drafts = half_top_drafts(rng, seen, cu_q, V)
    W = 5
    a = gpu_run(cu_q, host, dtype, drafts, params, W, logprobs=True)
    c = gpu_run(cu_q, host, dtype, drafts, params, W, logprobs=True, filters=False)
    for x, y in zip(a, c):
        np.testing.assert_array_equal(x, y)
    # now some sampled requests filter: status 5 for them, the rest as the reference says
    params["top_k"] = np.where(np.arange(B) % 3 == 1, 20, 0).astype(np.int32)
    params["min_p"] = np.where(np.arange(B) % 5 == 2, 0.05, 0.0).astype(np.float32)
    n, em, st = gpu_run(cu_q, host, dtype, drafts, params, W, filters=False)
    rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=W, filters=False)
    np.testing.assert_array_equal(st, rst)
    assert (rst == ref.STATUS_FILTER_SKIPPED).sum() >= 3
    skipped = rst == ref.STATUS_FILTER_SKIPPED
    assert (n[skipped] == 0).all() and (em[skipped] == -1).all()
    same = (n == rn) & (em == rem).all(1)
    assert same.mean() >= 0.95, f"{(~same).sum()} of {B} sequences differ from the reference"


@needs_gpu
@pytest.mark.parametrize("greedy", [True, False])
def test_spec_sample_gpu_long_blocks(greedy, rng):
    """Blocks longer than SPEC_SAMPLE_FINISH_ROWS (32): finish evaluates the first 32 rows in
    parallel and the rest inside the chain; drafts that (almost) always get accepted walk the
    chain past row 32."""
    V = 3001
    q_lens = [40, 1, 33, 5]
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    x = rng.standard_normal((T, V)) * 2
    hot = rng.integers(0, V, T)
    x[np.arange(T), hot] = 40.0                  # p(hot) ~ 1 at temperature 1
    host, seen = to_dtype(x, "float32")
    drafts = np.empty(T - B, np.int32)
    for b in range(B):
        for i in range(q_lens[b] - 1):
            drafts[cu_q[b] - b + i] = hot[cu_q[b] + i] if i != 36 else (hot[cu_q[b] + i] + 1) % V
    params = make_params(B, temperature=0.0 if greedy else 1.0)
    W = 41
    n, em, st, lp = gpu_run(cu_q, host, "float32", drafts, params, W, logprobs=True)
    rlp = np.zeros((B, W), np.float32)
    rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=W, accepted_logprobs=rlp)
    np.testing.assert_array_equal(st, rst)
    np.testing.assert_array_equal(n, rn)
    np.testing.assert_array_equal(em, rem)
    assert n[0] == 36 and n[2] == 32
    ok = em >= 0
    np.testing.assert_allclose(lp[ok], rlp[ok], rtol=2e-3, atol=2e-3)


@needs_gpu
def test_spec_sample_gpu_deterministic_across_runs_and_streams(rng):
    from specdec_lib import runtime
    V = 151936
    q_lens = [4, 4, 1, 3]
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    host, seen = to_dtype(rng.standard_normal((T, V)) * 2, "bfloat16")
    drafts = rng.integers(0, V, T - B).astype(np.int32)
    params = make_params(B, temperature=[1.0, 0.7, 0.0, 1.0], top_p=[0.9, 1.0, 1.0, 0.95],
                         top_k=[0, 50, 0, 0])
    a = gpu_run(cu_q, host, "bfloat16", drafts, params, 5, runs=3)
    drv = runtime.driver()
    s = drv.stream_create()
    try:
        c = gpu_run(cu_q, host, "bfloat16", drafts, params, 5, stream=s)
        drv.stream_synchronize(s)
    finally:
        drv.stream_destroy(s)
    for r in a[1:] + [c]:
        for x, y in zip(a[0], r):
            np.testing.assert_array_equal(x, y)
    rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=5)
    np.testing.assert_array_equal(a[0][2], rst)
    params["step"] = params["step"] + 1
    tokens = set()
    for stp in range(20):
        params["step"][:] = stp
        tokens.add(tuple(gpu_run(cu_q, host, "bfloat16", drafts, params, 5)[1][0]))
    assert len(tokens) > 1


@needs_gpu
def test_spec_sample_gpu_status_and_poison(rng):
    V = 100
    q_lens = [2, 2, 2, 2, 1, 3]
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    x = rng.standard_normal((T, V)).astype(np.float32)
    x[0, 3] = np.nan
    x[3, 5] = np.inf
    x[4] = -np.inf
    drafts = rng.integers(0, V, T - B).astype(np.int32)
    drafts[3] = -4
    params = make_params(B, temperature=[1, 1, 1, 1, 0, 1])
    n, em, st = gpu_run(cu_q, x, "float32", drafts, params, 3)
    rn, rem, rst = run_ref(cu_q, x, drafts, params, W=3)
    np.testing.assert_array_equal(st, rst)
    np.testing.assert_array_equal(n[:3], rn[:3])
    np.testing.assert_array_equal(em[:3], rem[:3])
    # bad layout: the last block does not fit W=2 -- refused with check_indices, else flagged
    with pytest.raises(ValueError, match="^emitted: 2 columns, but block 5 has 3 rows"):
        gpu_run(cu_q, x, "float32", drafts, params, 2)
    n, em, st = gpu_run(cu_q, x, "float32", drafts, params, 2, check_indices=False)
    assert st[-1] == ref.STATUS_BAD_LAYOUT and n[-1] == 0 and (em[-1] == -1).all()
    # a decreasing cu_q, or one that ends before T: refused with check_indices; unchecked
    # the decreasing one's block is flagged (one that ends early just leaves rows unread)
    for bad in ([0, 2, 4, 3, 8, 9, 12], [0, 2, 4, 6, 8, 9, 11]):
        with pytest.raises(ValueError, match="^cu_q: must start at 0"):
            gpu_run(np.array(bad, np.int32), x, "float32", drafts, params, 3)
    n, em, st = gpu_run(np.array([0, 2, 4, 3, 8, 9, 12], np.int32), x, "float32", drafts,
                        params, 3, check_indices=False)
    assert st[2] == ref.STATUS_BAD_LAYOUT and n[2] == 0 and (em[2] == -1).all()


@needs_gpu
def test_spec_sample_gpu_validation_errors(rng):
    from specdec_lib import DeviceArray
    from specdec_lib.ops import spec_sample as op, spec_sample_workspace_size
    B, V = 2, 50
    cu_q = DeviceArray.from_numpy(np.array([0, 2, 4], np.int32))
    lg = DeviceArray.from_numpy(np.zeros((4, V), np.float32))
    dr = DeviceArray.from_numpy(np.zeros(2, np.int32))
    p = make_params(B)
    args = [DeviceArray.from_numpy(p[k]) for k in ("temperature", "top_k", "top_p", "min_p", "seed", "step")]
    outs = [DeviceArray.empty((B,), "int32"), DeviceArray.empty((B, 2), "int32"), DeviceArray.empty((B,), "int32")]
    ws = DeviceArray.empty((spec_sample_workspace_size(4, V),), "uint8")
    with pytest.raises(ValueError, match="draft_ids"):
        op(lg, cu_q, DeviceArray.from_numpy(np.zeros(3, np.int32)), *args, *outs, workspace=ws)
    with pytest.raises(TypeError, match="logits"):
        op(DeviceArray.from_numpy(np.zeros((4, V), np.int32)), cu_q, dr, *args, *outs, workspace=ws)
    with pytest.raises(ValueError, match="workspace"):
        op(lg, cu_q, dr, *args, *outs, workspace=DeviceArray.empty((16,), "uint8"))
    with pytest.raises(TypeError, match="temperature"):
        op(lg, cu_q, dr, DeviceArray.from_numpy(np.ones(B, np.float64)), *args[1:], *outs, workspace=ws)
    with pytest.raises(ValueError, match="draft_probs"):
        op(lg, cu_q, dr, *args, *outs, DeviceArray.from_numpy(np.ones((2, V - 1), np.float32)), workspace=ws)


@needs_gpu
def test_spec_sample_workspace_size_matches_the_extension():
    from specdec_lib import _sampling
    from specdec_lib.ops import sampling as ops_sampling
    assert _sampling.TILE == ops_sampling.TILE == TILE
    assert _sampling.MAX_TILES == ops_sampling.MAX_TILES
    assert _sampling.TILE_BYTES == ops_sampling._TILE_BYTES
    assert _sampling.ROW_BYTES == ops_sampling._ROW_BYTES
    assert _sampling.TILE_WARPS == ops_sampling._TILE_WARPS
    assert _sampling.TILE_CTAS_PER_SM == ops_sampling._TILE_CTAS_PER_SM
    assert _sampling.FILTER_BYTES == ops_sampling._FILTER_BYTES
    assert _sampling.HIST_CTAS_PER_SM == ops_sampling._HIST_CTAS_PER_SM
    # the rows path's plan (ops.sampling.rows_plan) and the record layout the threshold test reads
    assert _sampling.ROWS_BINS == ops_sampling._ROWS_BINS
    assert _sampling.ROWS_MAX_TILES == ops_sampling._ROWS_MAX_TILES
    assert _sampling.ROWS_MAX_CLUSTER == ops_sampling._ROWS_MAX_CLUSTER
    assert _sampling.ROW_OUT_BYTES == 32
    assert _sampling.THRESHOLD_CTAS_PER_SM == ops_sampling._THRESHOLD_CTAS_PER_SM
    assert _sampling.THRESHOLD_MIN_TOKENS == ops_sampling._THRESHOLD_MIN_TOKENS


def test_tile_split_is_valid():
    """The vocab split of the tile pass: at least one tile per CTA, grid y in range, and one
    wave with one tile per warp where the GPU has room (B=1, V=151936 on 132 SMs)."""
    from specdec_lib.ops.sampling import _TILE_WARPS, _tiles_per_cta
    for T in (1, 4, 64, 256, 4096):
        for nt in (1, 2, 75, 1024):
            tpc = _tiles_per_cta(T, nt, 132)
            assert 1 <= tpc <= nt
            assert -(-nt // tpc) <= 65535
    assert _tiles_per_cta(4, 75, 132) == _TILE_WARPS


def test_threshold_split_and_workspace_size():
    """The threshold's CTAs per row (grid y) and the workspace formula: tiles + rows, padded
    to 16 bytes, + one SpecSampleFilter per row."""
    from specdec_lib.ops.sampling import (_FILTER_BYTES, _ROW_BYTES, _TILE_BYTES,
                                          _THRESHOLD_MIN_TOKENS, _threshold_ctas,
                                          spec_sample_workspace_size)
    assert _threshold_ctas(256, 151936, 132) == 3
    assert _threshold_ctas(4, 151936, 132) == 19
    from specdec_lib.ops.sampling import _hist_ctas
    assert _hist_ctas(256, 151936, 132) == 1 and _hist_ctas(132, 151936, 132) == 1
    assert _hist_ctas(4, 151936, 132) == 19 and _hist_ctas(64, 151936, 132) == 5
    for T in (1, 4, 64, 131, 4096):
        for V in (1, 7, 8193, 151936, 2 ** 21):
            assert 1 <= _hist_ctas(T, V, 132) <= max(1, -(-V // _THRESHOLD_MIN_TOKENS))
    for T in (1, 4, 64, 256, 4096):
        for V in (1, 7, 8192, 8193, 151936, 2 ** 21):
            s = _threshold_ctas(T, V, 132)
            assert 1 <= s <= max(1, -(-V // _THRESHOLD_MIN_TOKENS)) and s <= 65535
    for T, V in ((1, 7), (3, 5003), (256, 151936)):
        head = T * (-(-V // TILE) * _TILE_BYTES + _ROW_BYTES)
        assert spec_sample_workspace_size(T, V) == -(-head // 16) * 16 + T * _FILTER_BYTES
    assert _FILTER_BYTES % 16 == 0
    assert spec_sample_workspace_size(256, 151936) == 386048 + 256 * 32864


def _kept_check(cu_q, seen, params, n, em, st):
    """Every emitted token of a status-0 sampled request lies in the reference's kept set of
    the row that produced it; returns the number that do not."""
    bad = 0
    for b in range(len(cu_q) - 1):
        if st[b] != 0 or not params["temperature"][b] > 0:
            continue
        for j in range(int(n[b]) + 1):
            tok = int(em[b, j])
            p = filtered_probs(seen[cu_q[b] + j], params["temperature"][b], params["top_k"][b],
                               params["top_p"][b], params["min_p"][b])
            bad += int(p is None or not p[tok] > 0)
    return bad


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_spec_sample_gpu_threshold_split_over_ctas(dtype, rng):
    """The top-k / top-p threshold of one row split over many CTAs (V=151936: 3 CTAs per row
    here, 19 at B=1): top-k 1 / 50 / V-1, top-p 0 / 0.01 / 0.5 / 0.99, top-k + top-p (two
    filter slots), all three filters, min-p alone, plateaus of equal logits at the cut (the
    candidate list overflows: full-row fallback in the last CTA), a NaN row, greedy rows
    carrying filter values. Status exact, greedy tokens exact, every sampled token inside
    the reference's kept set, per-seed tokens as the reference, identical across runs."""
    V = 151936
    cases = [  # (temperature, top_k, top_p, min_p, row kind)
        (1.0, 1, 1.0, 0.0, "normal"), (0.8, 50, 1.0, 0.0, "normal"),
        (1.0, V - 1, 1.0, 0.0, "normal"), (0.7, 0, 0.01, 0.0, "normal"),
        (0.8, 0, 0.5, 0.0, "normal"), (1.2, 0, 0.99, 0.0, "normal"),
        (0.8, 50, 0.5, 0.0, "normal"), (1.0, 3000, 0.99, 0.01, "normal"),
        (1.0, 0, 1.0, 0.1, "normal"), (0.9, 0, 0.0, 0.0, "normal"),
        (1.0, 6000, 1.0, 0.0, "plateau"), (1.0, 0, 0.3, 0.0, "plateau"),
        (0.9, 0, 0.9, 0.0, "nan"), (0.0, 5, 0.5, 0.0, "normal"), (0.0, 0, 1.0, 0.0, "nan")]
    q_lens = [1, 2, 1, 3, 1, 2, 1, 2, 1, 3, 2, 1, 2, 3, 2]
    B = len(cases)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    x = rng.standard_normal((T, V)) * 3
    for b, (_, _, _, _, kind) in enumerate(cases):
        for r in range(cu_q[b], cu_q[b + 1]):
            if kind == "plateau":
                x[r] = rng.standard_normal(V) - 20
                x[r, rng.choice(V, 8000, replace=False)] = 1.0
                x[r, 17] = 3.0
            elif kind == "nan":
                x[r, rng.integers(0, V)] = np.nan
    host, seen = to_dtype(x, dtype)
    drafts = rng.integers(0, V, T - B).astype(np.int32)
    for b in range(B):
        for i in range(q_lens[b] - 1):
            if i % 2 == 0:
                drafts[cu_q[b] - b + i] = int(np.nanargmax(seen[cu_q[b] + i]))
    W = 4
    greedy = np.array([c[0] == 0.0 for c in cases])
    same_total = bad_total = 0
    for rep in range(4):
        params = make_params(B, temperature=[c[0] for c in cases], top_k=[c[1] for c in cases],
                             top_p=[c[2] for c in cases], min_p=[c[3] for c in cases],
                             seed=seeds(B, base=1000 * rep + 1), step=rep)
        runs = gpu_run(cu_q, host, dtype, drafts, params, W, runs=2)
        for a, c in zip(runs[0], runs[1]):
            np.testing.assert_array_equal(a, c)   # last-CTA-done order never shows
        n, em, st = runs[0]
        rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=W)
        np.testing.assert_array_equal(st, rst)
        np.testing.assert_array_equal(n[greedy], rn[greedy])
        np.testing.assert_array_equal(em[greedy], rem[greedy])
        same_total += int(((n == rn) & (em == rem).all(1)).sum())
        bad_total += _kept_check(cu_q, seen, params, n, em, st)
    # fixed-point top-p mass vs the reference's float64 cumsum may move a boundary token, and
    # float32 vs float64 race keys may flip a boundary draw: allow a rare one
    assert bad_total <= 1, f"{bad_total} sampled tokens outside the reference's kept set"
    assert same_total >= 4 * B - 2, f"{4 * B - same_total} of {4 * B} sequences differ"


def _order_key(x32):
    u = (np.asarray(x32, np.float32) + np.float32(0)).view(np.uint32)
    return np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000)).astype(np.uint64)


def _threshold_model(x32, temperature, top_k, top_p):
    """The kernel's threshold rule in numpy: the largest key K with mass(keys >= K) >= target,
    mass = 1 (top-k) or floor(min(exp2(s2 - m), 1) * 2^31) (top-p after top-k). Returns
    (tau_key, keys, masses of the top-p slot) for checking; exp2 here is not the GPU's
    ex2.approx, so a top-p boundary is checked with a tolerance, a top-k one exactly."""
    keys = _order_key(x32)
    ok = ~np.isnan(x32)
    floor = np.uint64(0)
    if 0 < top_k < len(x32):
        ks = np.sort(keys[ok])[::-1]
        floor = ks[top_k - 1]
    if not top_p < 1.0:
        return floor, keys, None
    scale = np.float32(math.log2(math.e) / temperature)
    s2 = (x32.astype(np.float32) * scale).astype(np.float32)
    m = np.float32(np.nanmax(s2))
    e = np.minimum(np.exp2((s2 - m).astype(np.float64)), 1.0)
    mass = np.where(ok & (keys >= floor) & np.isfinite(s2), np.floor(e * 2.0 ** 31), 0.0)
    return floor, keys, mass


@needs_gpu
@pytest.mark.parametrize("dtype,pad", [("float32", 0), ("bfloat16", 0), ("float16", 0),
                                       # >= one row per SM: the 16-bit path's one-CTA-per-row split
                                       ("bfloat16", 160), ("float16", 160)])
def test_spec_sample_gpu_threshold_exact(dtype, pad, rng):
    """The threshold key the kernels leave in the workspace, against the integer-mass rule
    computed in numpy, on distributions that stress the bucket window: N(0, 3) logits, a
    heavy tail (most of the vocabulary 40+ below the max: the clamped far bucket), a few
    dominant tokens, a plateau at the cut (list overflow: full-row fallback), top-p 0 / tiny /
    0.5 / 0.999, top-k alone (exact) and top-k + top-p. Top-k thresholds must match exactly;
    top-p ones must satisfy the rule under numpy's exp2 up to 1e-5 of the target."""
    from specdec_lib import DeviceArray
    from specdec_lib.ops import spec_sample as op, spec_sample_workspace_size
    V = 151936
    cases = [  # (temperature, top_k, top_p, kind)
        (1.0, 0, 0.9, "normal"), (0.7, 0, 0.5, "normal"), (1.3, 0, 0.999, "normal"),
        (1.0, 0, 1e-4, "normal"), (1.0, 0, 0.0, "normal"), (1.0, 0, 0.9, "tail"),
        (0.6, 0, 0.95, "tail"), (1.0, 0, 0.8, "dominant"), (1.0, 0, 0.3, "plateau"),
        (1.0, 50, 1.0, "normal"), (1.0, 7000, 1.0, "tail"), (0.8, 50, 0.9, "normal"),
        (1.0, 4000, 0.7, "tail"), (1.0, 1, 1.0, "normal"), (1.0, 0, 0.9, "halfinf"),
        # max just above 0, the rest below: for 16-bit logits the crossing lies past the
        # histogram's 8192 values (the fallback radix select)
        (1.0, 0, 0.9, "crosszero"), (1.0, 50, 1.0, "crosszero"), (1.0, 50, 0.9, "crosszero"),
        (2.0, 0, 0.99, "wide"),
        # ~152k tokens of one value: more than a 16-bit counter holds (the crossing inside
        # that one value's bin)
        (1.0, 100000, 1.0, "flat"), (1.0, 0, 0.5, "flat")]
    B = len(cases)
    cu_q = np.arange(B + 1, dtype=np.int32)
    x = rng.standard_normal((B, V)) * 3
    for b, (_, _, _, kind) in enumerate(cases):
        if kind == "tail":
            x[b] = rng.standard_normal(V) * 2 - 45
            x[b, rng.choice(V, 300, replace=False)] = rng.standard_normal(300) * 2
        elif kind == "dominant":
            x[b, rng.choice(V, 3, replace=False)] = [20.0, 19.5, 19.0]
        elif kind == "plateau":
            x[b] = rng.standard_normal(V) - 20
            x[b, rng.choice(V, 8000, replace=False)] = 1.0
            x[b, 17] = 3.0
        elif kind == "halfinf":
            x[b, rng.choice(V, V // 2, replace=False)] = -np.inf
        elif kind == "crosszero":
            x[b] = -np.abs(rng.standard_normal(V) * 3)
            x[b, 17] = 0.25
        elif kind == "flat":
            x[b] = 0.0
            x[b, [5, 77, 150000]] = [1.0, 1.0, 0.5]
        elif kind == "wide":   # fp16: 8192 values span 8 octaves below the max
            x[b] = rng.standard_normal(V) * 6
    if pad:   # greedy rows of zeros after the cases (they only make the batch large)
        x = np.concatenate([x, np.zeros((pad, V))])
        cases = cases + [(0.0, 0, 1.0, "pad")] * pad
        B = len(cases)
        cu_q = np.arange(B + 1, dtype=np.int32)
    host, seen = to_dtype(x, dtype)
    params = make_params(B, temperature=[c[0] for c in cases], top_k=[c[1] for c in cases],
                         top_p=[c[2] for c in cases])
    dev = lambda a, dt=None: DeviceArray.from_numpy(a, dtype=dt)
    ws = DeviceArray.empty((spec_sample_workspace_size(B, V),), "uint8")
    na, em, st = dev(np.zeros(B, np.int32)), dev(np.zeros((B, 1), np.int32)), dev(np.zeros(B, np.int32))
    op(dev(host, dtype), dev(cu_q), dev(np.zeros(0, np.int32)),
       *[dev(params[k]) for k in ("temperature", "top_k", "top_p", "min_p", "seed", "step")],
       na, em, st, workspace=ws)
    raw = ws.to_numpy()
    off = B * (-(-V // TILE)) * 20
    tau_gpu = raw[off:off + 8 * B].view(np.uint32).reshape(B, 2)[:, 0].astype(np.uint64)
    from specdec_lib.ops.sampling import sample_path
    if sample_path(dtype, True, V, 0, B) in ("rows", "small"):   # SpecSampleRowOut [T] (32 B), its field tau
        off = -(-(off + 8 * B) // 16) * 16
        tau_gpu = raw[off:off + 32 * B].view(np.uint32).reshape(B, 8)[:, 7].astype(np.uint64)
    for b, (temp, top_k, top_p, kind) in enumerate(cases):
        if kind == "pad":
            continue
        x32 = np.asarray(seen[b], np.float32)
        floor, keys, mass = _threshold_model(x32, temp, top_k, top_p)
        tau = tau_gpu[b]
        if mass is None:   # top-k alone: counts, exact
            assert tau == floor, f"case {b}: top-k threshold {tau:#x}, expected {floor:#x}"
            continue
        target = min(max(math.ceil(max(top_p, 0.0) * mass.sum()), 1), mass.sum())
        above, incl = mass[keys > tau].sum(), mass[keys >= tau].sum()
        assert tau >= floor, f"case {b}: threshold below the top-k floor"
        assert incl >= target * (1 - 1e-5), f"case {b} ({kind}): keeps too little ({incl} < {target})"
        assert above < target * (1 + 1e-5), f"case {b} ({kind}): keeps too much ({above} >= {target})"
        assert (mass[keys == tau] > 0).any(), f"case {b} ({kind}): threshold is no token's key"


@needs_gpu
@pytest.mark.parametrize("filt", [(50, 1.0), (0, 0.9), (0, 0.01), (50, 0.5), (1, 1.0), (0, 0.99)])
def test_spec_sample_gpu_threshold_split_batch1(filt, rng):
    """B=1, q=4 at V=151936: the threshold split over ~19 CTAs per row (the most of any
    shape), every row of the block filtered; bf16 logits."""
    V = 151936
    top_k, top_p = filt
    cu_q = np.array([0, 4], np.int32)
    host, seen = to_dtype(rng.standard_normal((4, V)) * 3, "bfloat16")
    drafts = np.array([int(np.nanargmax(seen[i])) for i in range(3)], np.int32)
    bad = same = 0
    for rep in range(8):
        params = make_params(1, temperature=0.8, top_k=top_k, top_p=top_p,
                             seed=seeds(1, base=77 + rep), step=rep)
        n, em, st = gpu_run(cu_q, host, "bfloat16", drafts, params, 4)
        rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=4)
        np.testing.assert_array_equal(st, rst)
        bad += _kept_check(cu_q, seen, params, n, em, st)
        same += int(n[0] == rn[0] and (em == rem).all())
    assert bad <= 1, f"{bad} sampled tokens outside the reference's kept set"
    assert same >= 7, f"{8 - same} of 8 draws differ from the reference"


def test_sample_path_rules_without_a_gpu(monkeypatch):
    """The kernel path choice on what needs no device: f32 logits and draft probabilities
    always take the tiles path; the environment switch is validated; the cluster plan keeps
    every CTA busy with at most 32 tiles."""
    from specdec_lib.ops.sampling import (CLUSTER_ENV, PATH_ENV, rows_plan, rows_unsupported,
                                          sample_path)
    assert rows_unsupported("float32", True, 151936) == "float32 logits"
    assert rows_unsupported("bfloat16", False, 151936) == "draft_probs given"
    assert rows_unsupported("float16", True, 2048 * 256 + 1).startswith("V >")
    monkeypatch.setenv(PATH_ENV, "rows")
    assert sample_path("float32", True, 151936, 0, 4) == "tiles"
    assert sample_path("float16", False, 151936, 0, 4) == "tiles"
    monkeypatch.setenv(PATH_ENV, "tiles")
    assert sample_path("bfloat16", True, 151936, 0, 4) == "tiles"
    for gone in ("fast", "stream"):   # (the stream path left the tree: PERF_HISTORY.md)
        monkeypatch.setenv(PATH_ENV, gone)
        with pytest.raises(ValueError, match=PATH_ENV):
            sample_path("float32", True, 151936, 0, 4)
    monkeypatch.delenv(PATH_ENV)
    assert rows_plan(75) == (10, 8, 10 * 4096 + 512 * 4)
    assert rows_plan(75, 4)[:2] == (19, 4)
    assert rows_plan(1) == (1, 1, 4096 + 4096 * 4)
    for nt in (1, 2, 9, 75, 128, 255, 256):
        for cl in (1, 4, 8, 16):
            tpc, c, smem = rows_plan(nt, cl)
            assert tpc <= 32 and (c - 1) * tpc < nt <= c * tpc
    monkeypatch.setenv(CLUSTER_ENV, "17")
    with pytest.raises(ValueError, match=CLUSTER_ENV):
        rows_plan(75)


def test_small_path_plan_without_a_gpu(monkeypatch):
    """The small path's split: 8 CTAs per row by default (10 tiles each at V=151936) while
    T x 8 fits one CTA per SM, then none (the rows path); with small_cluster 16, 16 CTAs (15
    at V=151936: 5 tiles each) while T x 16 fits, then 8; the switches are validated."""
    from specdec_lib.ops import sampling as ops
    assert ops.TUNING["small_cluster"] == 8
    assert ops.small_plan(4, 75, 132) == (10, 8, 10 * 4096 + 512 * 4)
    assert ops.small_plan(16, 75, 132)[:2] == (10, 8)
    with monkeypatch.context() as m:
        m.setitem(ops.TUNING, "small_cluster", 16)
        assert ops.small_plan(4, 75, 132) == (5, 15, 5 * 4096 + 274 * 4)
        assert ops.small_plan(8, 75, 132)[:2] == (5, 15)
        assert ops.small_plan(16, 75, 132)[:2] == (10, 8)
    assert ops.small_plan(17, 75, 132) is None and ops.small_plan(64, 75, 132) is None
    assert ops.small_plan(4, 1, 132)[:2] == (1, 1)
    assert ops.small_plan(4, 3, 132)[:2] == (1, 3)
    assert ops.small_plan(4, 75, 132, cluster=3)[:2] == (25, 3)
    for nt in (1, 2, 3, 9, 75, 128, 256):
        for cl in (1, 2, 3, 5, 8, 15, 16):
            plan = ops.small_plan(2, nt, 132, cluster=cl)
            tpc, c, smem = plan
            assert tpc <= 32 and (c - 1) * tpc < nt <= c * tpc and 2 * c <= 132
    monkeypatch.setitem(ops.TUNING, "small_smem_min", 120_000)
    assert ops.small_plan(4, 75, 132)[2] == 120_000
    monkeypatch.setitem(ops.TUNING, "small_cluster", 0)
    with pytest.raises(ValueError, match="small_cluster"):
        ops.small_plan(4, 75, 132)
    monkeypatch.setenv(ops.PATH_ENV, "small")
    assert ops.sample_path("float32", True, 151936, 0, 4) == "tiles"
    assert ops.sample_path("bfloat16", False, 151936, 0, 4) == "tiles"


def test_spec_sample_pdl_rule(monkeypatch):
    """Programmatic dependent launch only for sm_90 code (the forced compute_75 / compute_80
    kernels have no griddepcontrol.wait, so launching them early would race), and
    SPECDEC_PDL=0 turns it off."""
    from specdec_lib.ops.sampling import PDL_ENV, use_pdl
    monkeypatch.delenv(PDL_ENV, raising=False)
    for fam, want in (("75", False), ("80", False), ("90", True)):
        monkeypatch.setenv("SPECDEC_FORCE_ARCH", fam)
        assert use_pdl(0) is want
    monkeypatch.setenv(PDL_ENV, "0")
    assert use_pdl(0) is False


def test_kernel_pdl_off_list(monkeypatch):
    """$SPECDEC_PDL_OFF (kernel-name prefixes, comma-separated) launches those kernels the
    plain way where PDL is on; unset, the default list; SPECDEC_PDL=0 and sm_75 / sm_80 code
    keep every kernel plain."""
    from specdec_lib import runtime
    monkeypatch.delenv(runtime.PDL_ENV, raising=False)
    monkeypatch.setenv("SPECDEC_FORCE_ARCH", "90")
    monkeypatch.delenv(runtime.PDL_OFF_ENV, raising=False)
    assert runtime.pdl_off_prefixes() == runtime.PDL_OFF_DEFAULT
    for sym in ("rms_norm_bf16_wbf16", "gdn_verify_fused_kv_d128_bf16"):
        assert runtime.kernel_pdl(sym) is not sym.startswith(runtime.PDL_OFF_DEFAULT)
    monkeypatch.setenv(runtime.PDL_OFF_ENV, " gdn_verify , verify_attention_cluster,")
    assert runtime.pdl_off_prefixes() == ("gdn_verify", "verify_attention_cluster")
    assert runtime.kernel_pdl("gdn_verify_fused_kv_d128_bf16") is False
    assert runtime.kernel_pdl("verify_attention_cluster_d256_bf16") is False
    assert runtime.kernel_pdl("gdn_commit_kv_d128_bf16") is True
    monkeypatch.setenv(runtime.PDL_OFF_ENV, "")
    assert runtime.pdl_off_prefixes() == () and runtime.kernel_pdl("gdn_verify_x") is True
    monkeypatch.setenv("SPECDEC_FORCE_ARCH", "80")
    assert runtime.kernel_pdl("rms_norm_bf16_wbf16") is False
    monkeypatch.setenv("SPECDEC_FORCE_ARCH", "90")
    monkeypatch.setenv(runtime.PDL_ENV, "0")
    assert runtime.kernel_pdl("rms_norm_bf16_wbf16") is False


# ================================================================== seed / step across rounds
def _bonus_round(logits, seed, step):
    """One round of q=1 blocks (bonus rows only: every request samples one token from its
    row) on the reference op; the tokens."""
    B = logits.shape[0]
    n, em, st = outputs(B, 1)
    spec_sample(logits, np.arange(B + 1, dtype=np.int32), np.zeros(0, np.int32),
                np.ones(B, np.float32), np.zeros(B, np.int32), np.ones(B, np.float32),
                np.zeros(B, np.float32), seed, step, n, em, st)
    assert (st == 0).all()
    return em[:, 0].copy()


def test_advance_step_makes_consecutive_rounds_independent(rng):
    from specdec_lib.ops import advance_step
    N, V = 1500, 6
    seed = rng.integers(0, 2**63, N).astype(np.int64)
    step = np.full(N, 5, np.int64)
    # one distribution for every request and round: the joint counts of two consecutive
    # rounds must follow p x p
    row = np.log(np.array([0.3, 0.25, 0.2, 0.12, 0.08, 0.05]))
    logits = np.tile(row, (N, 1)).astype(np.float32)
    p = filtered_probs(logits[0], 1.0, 0, 1.0, 0.0)
    a = _bonus_round(logits, seed, step)
    same_step = _bonus_round(logits, seed, step.copy())
    np.testing.assert_array_equal(a, same_step)        # same seed + step: same tokens
    assert advance_step(step) is step and (step == 6).all()
    b = _bonus_round(logits, seed, step)
    joint = np.bincount(a * V + b, minlength=V * V)
    assert chi_square_z(joint, np.outer(p, p).ravel()) < 4.5
    agree, expect = (a == b).mean(), float((p * p).sum())
    assert abs(agree - expect) < 5 * math.sqrt(expect * (1 - expect) / N)
    # unrelated logits each round: with the step reused the draws are strongly correlated
    # (the same exponential race noise), with advance_step the agreement is that of
    # independent draws, sum_t p1(t) p2(t)
    l1 = (rng.standard_normal((N, V)) * 2).astype(np.float32)
    l2 = (rng.standard_normal((N, V)) * 2).astype(np.float32)
    p1 = np.stack([filtered_probs(r, 1.0, 0, 1.0, 0.0) for r in l1])
    p2 = np.stack([filtered_probs(r, 1.0, 0, 1.0, 0.0) for r in l2])
    expect = float((p1 * p2).sum(1).mean())
    sd = math.sqrt(expect * (1 - expect) / N)
    t1 = _bonus_round(l1, seed, step)
    reused = (_bonus_round(l2, seed, step) == t1).mean()
    assert reused > expect + 10 * sd                   # the mistake the docstrings warn about
    advanced = (_bonus_round(l2, seed, advance_step(step)) == t1).mean()
    assert abs(advanced - expect) < 5 * sd


def test_advance_step_by_arrays_and_refusals():
    from specdec_lib.ops import advance_step
    step = np.array([3, 7, 0], np.int64)
    advance_step(step, np.array([2, 0, 1], np.int32))  # accept_len: step stays = L
    assert step.tolist() == [5, 7, 1]
    advance_step(step, 4)
    assert step.tolist() == [9, 11, 5]
    with pytest.raises(ValueError, match="^by: must be >= 1"):
        advance_step(step, 0)
    with pytest.raises(ValueError, match="^by: must be >= 0"):
        advance_step(step, np.array([1, -1, 1], np.int32))
    with pytest.raises(TypeError, match="^by:"):
        advance_step(step, True)
    with pytest.raises(TypeError, match="^step: expected an int64 array"):
        advance_step(np.zeros(3, np.int32))
    assert step.tolist() == [9, 11, 5]
    torch = pytest.importorskip("torch")
    t = torch.tensor([1, 2], dtype=torch.int64)
    assert advance_step(t, torch.tensor([1, 3], dtype=torch.int32)) is t
    assert t.tolist() == [2, 5]
    import specdec_lib
    assert specdec_lib.advance_step is advance_step


# ================================================================== the argument contract (CPU)
from conftest import REFUSAL_PATHS, assert_refused, call_op, on_path, strided_last  # noqa: E402
from conftest import cast as _cast, vals as _vals, zeros_on as _new  # noqa: E402

_SS_ORDER = ("logits", "cu_q", "draft_ids", "temperature", "top_k", "top_p", "min_p", "seed",
             "step", "num_accepted", "emitted", "status")
_SS_OUTPUTS = ("num_accepted", "emitted", "status", "accepted_logprobs")


def _spec_sample_call(rng, V=20):
    """B=2 blocks of q = 2, 3 (T=5), W=3; outputs filled with -7."""
    cu_q, logits, drafts, p = batch_inputs([2, 3], V, rng, temperature=[0.8, 0.0])
    n, em, st = outputs(2, 3)
    return dict(logits=logits, cu_q=cu_q, draft_ids=drafts, **p, num_accepted=n, emitted=em,
                status=st, draft_probs=None, d2t=None,
                accepted_logprobs=np.full((2, 3), -7.0, np.float32))








def _with_draft_probs(a, p, cols=20, d2t=None):
    a["draft_probs"] = _vals(p, np.full((3, cols), 1.0 / cols).tolist(), "float32")
    if d2t is not None:
        a["d2t"] = _vals(p, d2t)


_REF = ("reference",)
_TORCH = ("torch",)
# (case id, paths, break(args, path), exception, message start)
_SPEC_SAMPLE_BAD = [
    ("logits_float64", _TORCH, lambda a, p: a.update(logits=_cast(p, a["logits"], "float64")),
     TypeError, r"^logits: dtype"),
    ("seed_int32", _TORCH, lambda a, p: a.update(seed=_cast(p, a["seed"], "int32")),
     TypeError, r"^seed: dtype"),
    ("step_int32", _TORCH, lambda a, p: a.update(step=_cast(p, a["step"], "int32")),
     TypeError, r"^step: dtype"),
    ("temperature_float64", _TORCH, lambda a, p: a.update(temperature=_cast(p, a["temperature"], "float64")),
     TypeError, r"^temperature: dtype"),
    ("emitted_int64", _TORCH, lambda a, p: a.update(emitted=_cast(p, a["emitted"], "int64")),
     TypeError, r"^emitted: dtype"),
    ("draft_probs_bfloat16", _TORCH,
     lambda a, p: (_with_draft_probs(a, p), a.update(draft_probs=_cast(p, a["draft_probs"], "bfloat16"))),
     TypeError, r"^draft_probs: dtype"),
    ("logits_int32", REFUSAL_PATHS, lambda a, p: a.update(logits=_cast(p, a["logits"], "int32")),
     TypeError, r"^logits: dtype"),
    ("logits_vocab_not_contiguous", REFUSAL_PATHS, lambda a, p: a.update(logits=strided_last(a["logits"])),
     ValueError, r"^logits: the vocabulary dimension must be contiguous"),
    ("logits_vocab_0", REFUSAL_PATHS, lambda a, p: a.update(logits=a["logits"][:, :0]),
     ValueError, r"^logits: vocabulary size"),
    ("logits_fewer_rows_than_blocks", REFUSAL_PATHS, lambda a, p: a.update(logits=a["logits"][:1]),
     ValueError, r"^logits: 1 rows for 2 sequences"),
    ("draft_ids_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(draft_ids=a["draft_ids"][:2]),
     ValueError, r"^draft_ids: expected shape \[3\]"),
    ("top_p_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(top_p=_vals(p, [1.0] * 3, "float32")),
     ValueError, r"^top_p: expected shape \[2\]"),
    ("seed_float", REFUSAL_PATHS, lambda a, p: a.update(seed=_cast(p, a["seed"], "float32")),
     TypeError, r"^seed: dtype"),
    ("emitted_narrower_than_a_block", REFUSAL_PATHS,
     lambda a, p: a.update(emitted=a["emitted"][:, :2], accepted_logprobs=None),
     ValueError, r"^emitted: 2 columns, but block 1 has 3 rows"),
    ("emitted_width_0", REFUSAL_PATHS, lambda a, p: a.update(emitted=a["emitted"][:, :0], accepted_logprobs=None),
     ValueError, r"^emitted: expected shape \[2, kmax\+1 >= 1\]"),
    ("cu_q_decreasing", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 6, 5])),
     ValueError, r"^cu_q: must start at 0, grow by at least 1 per block"),
    ("cu_q_ends_before_T", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 2, 4])),
     ValueError, r"^cu_q: must .* end at T=5"),
    ("cu_q_empty_block", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 0, 5])),
     ValueError, r"^cu_q: must start at 0, grow by at least 1"),
    ("cu_q_not_from_0", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [1, 3, 5])),
     ValueError, r"^cu_q: must start at 0"),
    ("cu_q_int64", _TORCH, lambda a, p: a.update(cu_q=_cast(p, a["cu_q"], "int64")),
     TypeError, r"^cu_q: dtype"),
    ("accepted_logprobs_wrong_shape", REFUSAL_PATHS,
     lambda a, p: a.update(accepted_logprobs=a["accepted_logprobs"][:, :2]),
     ValueError, r"^accepted_logprobs: expected shape \[2, 3\]"),
    ("d2t_without_draft_probs", REFUSAL_PATHS, lambda a, p: a.update(d2t=_vals(p, [0, 1, 2])),
     ValueError, r"^d2t: only meaningful with draft_probs"),
    ("draft_probs_columns_not_V", REFUSAL_PATHS, lambda a, p: _with_draft_probs(a, p, cols=19),
     ValueError, r"^draft_probs: 19 columns but V = 20"),
    ("draft_probs_wrong_rows", REFUSAL_PATHS,
     lambda a, p: (_with_draft_probs(a, p), a.update(draft_probs=a["draft_probs"][:2])),
     ValueError, r"^draft_probs: expected T-B = 3 rows"),
    ("d2t_not_increasing", REFUSAL_PATHS, lambda a, p: _with_draft_probs(a, p, cols=4, d2t=[3, 2, 5, 7]),
     ValueError, r"^d2t: must be strictly increasing"),
    ("d2t_outside_vocab", REFUSAL_PATHS, lambda a, p: _with_draft_probs(a, p, cols=4, d2t=[3, 5, 7, 20]),
     ValueError, r"^d2t: must be strictly increasing target ids in \[0, V=20\)"),
    ("d2t_wrong_length", REFUSAL_PATHS, lambda a, p: _with_draft_probs(a, p, cols=4, d2t=[3, 5, 7]),
     ValueError, r"^d2t: expected shape \[4\]"),
]
_SS_BF16 = {"logits": "bfloat16"}


def _ss_run(path, args, **kw):
    pos = [args[n] for n in _SS_ORDER]
    opt = {n: args[n] for n in ("draft_probs", "d2t", "accepted_logprobs")}
    return call_op(path, "spec_sample", pos, dict(opt, **kw))


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _SPEC_SAMPLE_BAD, ids=[c[0] for c in _SPEC_SAMPLE_BAD])
def test_spec_sample_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _spec_sample_call(rng), _SS_BF16)
    mutate(args, path)
    assert_refused(lambda: _ss_run(path, args), exc, match, [args[n] for n in _SS_OUTPUTS])


def test_spec_sample_refuses_bad_filters(rng):
    args = _spec_sample_call(rng)
    assert_refused(lambda: _ss_run("reference", args, filters="no"), TypeError, r"^filters:",
                   [args[n] for n in _SS_OUTPUTS])


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("probs", [False, True])
def test_spec_sample_good_input_passes_the_contract(path, probs, rng):
    args = on_path(path, _spec_sample_call(rng), _SS_BF16)
    if probs:
        _with_draft_probs(args, path, cols=4, d2t=[0, 3, 9, 19])
        args["draft_ids"][:] = _vals(path, [3, 9, 19])     # in the draft vocabulary
    _ss_run(path, args)
    st, em = np.asarray(args["status"]), np.asarray(args["emitted"])
    assert (st == 0).all() and (em[:, 0] >= 0).all() and (em != -7).all()
    assert (np.asarray(args["accepted_logprobs"]) != -7).all()


def test_spec_sample_contract_constants_agree():
    from specdec_lib.contract import sampling as contract
    from specdec_lib.ops import sampling as op
    assert contract.TILE == ref.TILE == op.TILE and contract.MAX_VOCAB == 2**21


# ------------------------------------------------------------------ the small path
# spec_sample_small_* runs every GPU test above too (the "small" parametrisation). These
# check what is its own: rows without filters summed and raced in each CTA's own frame, the
# level-2 race split over the cluster (cluster sizes that do not divide a tile, V below one
# tile), the one-exchange exits (invalid, accepted), and tokens equal to the rows path's.

_SMALL_CASES = [   # (temperature, top_k, top_p, min_p)
    (0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 0, 0.9, 0.0), (1.0, 50, 0.9, 0.0),
    (1.2, 0, 1.0, 0.05), (0.9, 20, 0.8, 0.01), (1.0, 1, 1.0, 0.0), (1.0, 0, 0.0, 0.0)]


def _only_small(path):
    if path != "small":
        pytest.skip("the small path's own test (it sets the paths it compares)")


@needs_gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("V", [1000, 5003, 151936])
@pytest.mark.parametrize("cluster", [16, 3])
def test_spec_sample_gpu_small_matches_rows_and_reference(dtype, V, cluster, spec_sample_path,
                                                         monkeypatch, rng):
    """Every filter mix at B=2 (q = 4, 3: T = 7, one wave): the small path's tokens equal the
    rows path's at the same split (rows with filters and greedy rows sum and race exactly as
    the rows kernel does -- a top-p-only row's base is summed in each CTA's frame, so its cut
    could move only if a cumulative mass sat within a float32 rounding of the target; rows
    without filters in each CTA's frame: a draw on a rounding boundary may differ, at most
    one here), its statuses the reference's, every sampled token
    inside the reference's kept set, and the reference's tokens in nearly every draw."""
    _only_small(spec_sample_path)
    from specdec_lib import runtime
    from specdec_lib.ops import sampling as ops
    monkeypatch.setitem(ops.TUNING, "small_cluster", cluster)
    cl = ops.small_plan(7, -(-V // TILE), runtime.sm_count(0))[1]
    q_lens = [4, 3]
    cu_q = np.array([0, 4, 7], np.int32)
    host, seen = to_dtype(rng.standard_normal((7, V)) * 3, dtype)
    drafts = half_top_drafts(rng, seen, cu_q, V)
    plain_diff = same_ref = total = bad = 0
    for case in _SMALL_CASES:
        temp, top_k, top_p, min_p = case
        for stp in range(4):
            params = make_params(2, temp, top_k, top_p, min_p, seed=seeds(2, 5 + stp), step=stp)
            monkeypatch.setenv(ops.PATH_ENV, "small")
            n, em, st, lp = gpu_run(cu_q, host, dtype, drafts, params, 5, logprobs=True)
            monkeypatch.setenv(ops.PATH_ENV, "rows")
            monkeypatch.setenv(ops.CLUSTER_ENV, str(cl))   # the same split: the same sums
            rn_, rem_, rst_, rlp_ = gpu_run(cu_q, host, dtype, drafts, params, 5, logprobs=True)
            monkeypatch.delenv(ops.CLUSTER_ENV)
            np.testing.assert_array_equal(st, rst_)
            if temp > 0 and top_k == 0 and top_p >= 1 and min_p == 0:
                plain_diff += int(((n != rn_) | (em != rem_).any(1)).sum())
            else:
                np.testing.assert_array_equal(n, rn_, err_msg=f"case {case} step {stp}")
                np.testing.assert_array_equal(em, rem_, err_msg=f"case {case} step {stp}")
            ok = (em >= 0) & (em == rem_)
            np.testing.assert_allclose(lp[ok], rlp_[ok], rtol=1e-4, atol=1e-4)
            rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=5)
            np.testing.assert_array_equal(st, rst)
            same_ref += int(((n == rn) & (em == rem).all(1)).sum())
            total += 2
            if temp > 0:
                bad += _kept_check(cu_q, seen, params, n, em, st)
    assert plain_diff <= 1, f"{plain_diff} unfiltered draws differ from the rows path"
    assert bad == 0, f"{bad} sampled tokens outside the reference's kept set"
    assert same_ref >= total - 3, f"{total - same_ref} of {total} draws differ from the reference"


@needs_gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("filt", [(0, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.05)])
def test_spec_sample_gpu_small_status_rows(dtype, filt, spec_sample_path, rng):
    """B=4, q=2, V=5003 (odd; 3 CTAs of one tile): a NaN row, a +inf row, a sampled row of
    -inf only, a bad draft id; the one-exchange exits (no filter) and the max exchange's
    (filters) flag them as the reference does; outputs poisoned first (gpu_run); greedy
    twins of the same rows as well."""
    _only_small(spec_sample_path)
    V = 5003
    top_k, top_p, min_p = filt
    cu_q = np.arange(0, 10, 2).astype(np.int32)
    x = rng.standard_normal((8, V)) * 2
    x[0, 4100] = np.nan            # seq 0, its draft row, the last (tail) tile
    x[3, 7] = np.inf               # seq 1, its bonus row
    x[4] = -np.inf                 # seq 2, its draft row: nothing to sample
    host, seen = to_dtype(x, dtype)
    drafts = np.array([int(np.nanargmax(seen[2 * b])) for b in range(4)], np.int32)
    drafts[3] = -4                 # seq 3: a bad id (rejected, the correction sampled)
    for temp in (1.0, 0.0):
        params = make_params(4, temp, top_k, top_p, min_p)
        n, em, st, lp = gpu_run(cu_q, host, dtype, drafts, params, 3, logprobs=True)
        rn, rem, rst = run_ref(cu_q, seen, drafts, params, W=3)
        np.testing.assert_array_equal(st, rst)
        np.testing.assert_array_equal(n, rn)
        np.testing.assert_array_equal(em, rem)
        if temp > 0:
            assert list(st) == [ref.STATUS_NONFINITE, ref.STATUS_NONFINITE, ref.STATUS_EMPTY,
                                ref.STATUS_BAD_DRAFT]


@needs_gpu
@pytest.mark.parametrize("case", ["plain", "filters", "min_p"])
def test_spec_sample_gpu_small_chi_square(case, spec_sample_path, rng):
    """The small path's distribution: V=5003 bf16 with 40 live tokens spread over its 3 tiles
    (3 CTAs, one tile each: the tile race crosses CTAs, level 2 reads the winning tile from
    its owner), B=4 q=2 per call, 4000 calls: the first token against the filtered target,
    the acceptance rate against sum min(p, onehot(x))."""
    _only_small(spec_sample_path)
    from specdec_lib import DeviceArray
    from specdec_lib.ops import spec_sample as op, spec_sample_workspace_size
    V, B, calls = 5003, 4, 4000
    live = np.sort(rng.choice(V, 40, replace=False))
    row = np.full(V, -np.inf)
    row[live] = rng.standard_normal(40) * 1.5
    block, seen = to_dtype(np.stack([row, np.roll(row, 7)]), "bfloat16")
    temp, top_k, top_p, min_p = {"plain": (0.9, 0, 1.0, 0.0), "filters": (0.9, 20, 0.8, 0.01),
                                 "min_p": (1.1, 0, 1.0, 0.05)}[case]
    p0 = filtered_probs(seen[0], temp, top_k, top_p, min_p)
    x = int(np.argsort(p0)[-2])
    cu_q = np.arange(0, 2 * B + 1, 2).astype(np.int32)
    dev = lambda a, dt=None: DeviceArray.from_numpy(a, dtype=dt)
    params = make_params(B, temp, top_k, top_p, min_p, seed=seeds(B, 11))
    lg = dev(np.tile(block, (B, 1)), "bfloat16")
    args = [dev(cu_q), dev(np.full(B, x, np.int32))] + \
        [dev(params[k]) for k in ("temperature", "top_k", "top_p", "min_p", "seed")]
    step = dev(np.zeros(B, np.int64))
    ws = DeviceArray.empty((spec_sample_workspace_size(2 * B, V),), "uint8")
    na, em, st = dev(np.zeros(B, np.int32)), dev(np.zeros((B, 2), np.int32)), dev(np.zeros(B, np.int32))
    firsts, accepted = [], 0
    for c in range(calls):
        step.copy_from_numpy(np.full(B, c, np.int64))
        op(lg, *args, step, na, em, st, workspace=ws, check_indices=False)
        e, n, s = em.to_numpy(), na.to_numpy(), st.to_numpy()
        assert (s == 0).all()
        firsts.append(e[:, 0])
        accepted += int((n == 1).sum())
    firsts = np.concatenate(firsts)
    assert chi_square_z(np.bincount(firsts, minlength=V), p0) < 4.5
    N = B * calls
    acc = p0[x]
    assert abs(accepted / N - acc) < 5 * math.sqrt(acc * (1 - acc) / N)
