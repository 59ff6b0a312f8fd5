"""verify_attention: the float64 reference (CPU) and the CUDA kernels against it (GPU).

Tolerances (relative L2 norm over all written rows, against the float64 reference run
on the same rounded inputs): float16 2e-3, bfloat16 1.5e-2 (P is rounded to the input
dtype before the P.V product, as in every flash-attention kernel); LSE 1e-4.
"""
import math

import numpy as np
import pytest

from specdec_lib import reference as ref
from specdec_lib.ops.attention import (MAX_SPLITS, plan_verify_attention,
                                       verify_attention_smem_bytes)
from conftest import needs_gpu, poison, rel_err

TOL = {"float16": 2e-3, "bfloat16": 1.5e-2}
LSE_TOL = 1e-4


# ------------------------------------------------------------------ case builder

def _case(rng, qs, Ls, Hq=4, Hkv=2, D=64, page_size=4, extra_pages=3, shuffle=True,
          dtype=None, extra_rows=0):
    """A ragged batch with a random pool (every slot filled) and a shuffled page table.
    Returns float64 host data (rounded to ``dtype`` when given)."""
    from specdec_lib.dtypes import round_to
    qs, Ls = list(qs), list(Ls)
    B = len(qs)
    cu_q = np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)
    T = int(cu_q[-1]) + extra_rows
    need = [-(-(L + q) // page_size) for L, q in zip(Ls, qs)]
    max_pages = max(need + [1])
    num_pages = B * max_pages + extra_pages
    ids = rng.permutation(num_pages) if shuffle else np.arange(num_pages)
    pt = ids[: B * max_pages].reshape(B, max_pages).astype(np.int32)

    def rnd(shape):
        x = rng.standard_normal(shape)
        return round_to(x, dtype) if dtype else x
    return dict(q=rnd((T, Hq, D)), k_cache=rnd((num_pages, page_size, Hkv, D)),
                v_cache=rnd((num_pages, page_size, Hkv, D)), page_table=pt,
                seq_lens=np.array(Ls, np.int32), cu_q=cu_q)


def _dense_attention(c, scale):
    """Independent formulation: contiguous K/V per sequence and an explicit
    bottom-right causal mask matrix."""
    q, pt, ps = c["q"], c["page_table"], c["k_cache"].shape[1]
    T, Hq, D = q.shape
    Hkv = c["k_cache"].shape[2]
    out = np.full((T, Hq, D), np.nan)
    lse = np.full((T, Hq), np.nan)
    for b in range(len(c["seq_lens"])):
        L, t0, t1 = int(c["seq_lens"][b]), int(c["cu_q"][b]), int(c["cu_q"][b + 1])
        n, qn = L + t1 - t0, t1 - t0
        if qn == 0:
            continue
        K = np.concatenate([c["k_cache"][p] for p in pt[b]], axis=0)[:n]   # [n, Hkv, D]
        V = np.concatenate([c["v_cache"][p] for p in pt[b]], axis=0)[:n]
        mask = np.arange(n)[None, :] <= (L + np.arange(qn))[:, None]        # [qn, n]
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            s = q[t0:t1, h] @ K[:, kh].T * scale
            s = np.where(mask, s, -np.inf)
            m = s.max(1, keepdims=True)
            p = np.exp(s - m)
            out[t0:t1, h] = p @ V[:, kh] / p.sum(1, keepdims=True)
            lse[t0:t1, h] = m[:, 0] + np.log(p.sum(1))
    return out, lse


def _run_ref(c, **kw):
    T, Hq, D = c["q"].shape
    out = np.full((T, Hq, D), np.nan)
    lse = np.full((T, Hq), np.nan)
    ref.verify_attention(c["q"], c["k_cache"], c["v_cache"], c["page_table"], c["seq_lens"],
                         c["cu_q"], out, lse_out=lse, **kw)
    return out, lse


# ------------------------------------------------------------------ reference (CPU)

def test_verify_attention_reference_matches_dense(rng):
    c = _case(rng, qs=[1, 5, 0, 16, 3], Ls=[0, 3, 7, 9, 12], Hq=6, Hkv=2, D=64, page_size=4)
    out, lse = _run_ref(c, scale=0.3)
    d_out, d_lse = _dense_attention(c, 0.3)
    np.testing.assert_allclose(out, d_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, d_lse, rtol=1e-12, atol=1e-12)


def test_verify_attention_reference_closed_forms(rng):
    # L = 0, q = 1: the row sees only its own key -> out = v, lse = scale * q.k
    c = _case(rng, qs=[1], Ls=[0], Hq=2, Hkv=1, D=64, page_size=1)
    out, lse = _run_ref(c)
    page = c["page_table"][0, 0]
    np.testing.assert_allclose(out[0], np.repeat(c["v_cache"][page, 0], 2, 0), rtol=1e-12)
    np.testing.assert_allclose(lse[0], c["q"][0] @ c["k_cache"][page, 0, 0] / 8.0, rtol=1e-12)
    # identical keys: uniform weights -> row i averages the L+i+1 visible values
    c = _case(rng, qs=[4], Ls=[6], Hq=1, Hkv=1, D=64, page_size=2)
    c["k_cache"][:] = c["k_cache"][0, 0]
    out, lse = _run_ref(c)
    V = np.concatenate([c["v_cache"][p] for p in c["page_table"][0]], 0)[:, 0]
    s = c["q"][:, 0] @ c["k_cache"][0, 0, 0] / 8.0
    for i in range(4):
        np.testing.assert_allclose(out[i, 0], V[: 6 + i + 1].mean(0), rtol=1e-10)
        np.testing.assert_allclose(lse[i, 0], s[i] + math.log(6 + i + 1), rtol=1e-12)


def test_verify_attention_reference_page_layout_invariant(rng):
    c = _case(rng, qs=[2, 3], Ls=[5, 8], page_size=4, shuffle=False)
    out0, lse0 = _run_ref(c)
    perm = rng.permutation(c["k_cache"].shape[0])
    inv = np.argsort(perm)
    c2 = dict(c, k_cache=c["k_cache"][perm], v_cache=c["v_cache"][perm],
              page_table=inv[c["page_table"]].astype(np.int32))
    out1, lse1 = _run_ref(c2)
    np.testing.assert_array_equal(out0, out1)
    np.testing.assert_array_equal(lse0, lse1)


def test_verify_attention_reference_leaves_unowned_rows(rng):
    c = _case(rng, qs=[0, 2, 0], Ls=[4, 1, 0], extra_rows=2)
    out, lse = _run_ref(c)
    assert np.isfinite(out[:2]).all() and np.isfinite(lse[:2]).all()
    assert np.isnan(out[2:]).all() and np.isnan(lse[2:]).all()


def test_verify_attention_workspace_covers_smaller_max_q(monkeypatch):
    """The helper's size covers every max_q up to the one given (s36: a buffer sized for the
    default min(T, 16) was too small for a call with max_q = 2, whose plan has fewer m-tiles
    a CTA and so more KV splits)."""
    from specdec_lib import runtime
    from specdec_lib.ops import verify_attention_workspace_size
    from specdec_lib.ops.attention import plan_verify_attention
    monkeypatch.setitem(runtime._device_cache, 0, dict(name="fake", cc=(9, 0), sm_count=132,
                                                       l2_bytes=50 << 20, smem_optin=232448))
    T, Hq, Hkv, D, B, kv = 36, 16, 2, 64, 24, 720
    need = {mq: plan_verify_attention(B, Hkv, Hq // Hkv, D, mq, kv, 132).workspace_bytes(T, Hq, D)
            for mq in range(1, 17)}
    assert need[2] > need[16] > 0
    assert verify_attention_workspace_size(T, Hq, Hkv, D, B, kv) == max(need.values())
    assert verify_attention_workspace_size(T, Hq, Hkv, D, B, kv, max_q=4) == max(
        need[m] for m in range(1, 5))


def test_verify_attention_reference_max_q_bounds_rows(rng):
    """A sequence whose block has more rows than max_q is left unwritten, whole (as the CUDA
    op leaves it: its CTAs return); the other sequences get the rows of the default bound."""
    c = _case(rng, qs=[4, 1, 3, 2], Ls=[5, 0, 9, 2])
    full, full_lse = _run_ref(c)
    out, lse = _run_ref(c, max_q=2)
    for b, (t0, t1) in enumerate(zip(c["cu_q"][:-1], c["cu_q"][1:])):
        if t1 - t0 > 2:
            assert np.isnan(out[t0:t1]).all() and np.isnan(lse[t0:t1]).all(), f"seq {b}"
        else:
            np.testing.assert_array_equal(out[t0:t1], full[t0:t1], err_msg=f"seq {b}")
            np.testing.assert_array_equal(lse[t0:t1], full_lse[t0:t1])


@pytest.mark.parametrize("change,exc,match", [
    (dict(q=np.zeros((3, 5, 64))), ValueError, "query heads"),
    (dict(q=np.zeros((3, 4, 96))), ValueError, "head dim 96"),
    (dict(k_cache=np.zeros((9, 3, 2, 64)), v_cache=np.zeros((9, 3, 2, 64))), ValueError,
     "page size 3"),
    (dict(page_table=np.zeros((2, 1), np.int32)), ValueError, "page_table"),
    (dict(page_table=np.full((2, 3), 99, np.int32)), ValueError, "outside the pool"),
    (dict(cu_q=np.array([0, 2, 1], np.int32)), ValueError, "cu_q"),
    (dict(cu_q=np.array([0, 17, 17], np.int32)), ValueError, "at most 16"),
    (dict(seq_lens=np.array([-1, 0], np.int32)), ValueError, "seq_lens"),
    (dict(seq_lens=np.array([1.0, 0.0])), TypeError, "seq_lens"),
])
def test_verify_attention_reference_rejects(rng, change, exc, match):
    c = _case(rng, qs=[2, 1], Ls=[3, 2], Hq=4, Hkv=2, D=64, page_size=4)
    c.update(change)
    T, Hq, D = c["q"].shape
    if c["cu_q"][-1] > T:
        c["q"] = np.zeros((int(c["cu_q"][-1]), Hq, D))
        T = c["q"].shape[0]
    with pytest.raises(exc, match=match):
        ref.verify_attention(c["q"], c["k_cache"], c["v_cache"], c["page_table"], c["seq_lens"],
                             c["cu_q"], np.zeros((T, Hq, D)))


# ------------------------------------------------------------------ launch plan (CPU)

def test_verify_attention_plan():
    # batch 64 at 4k fills an H200 without splitting
    p = plan_verify_attention(64, 8, 4, 128, 16, 4100, 132)
    assert (p.num_splits, p.m_groups) == (1, 1)
    # batch 1 at 32k: enough CTAs for 2 per SM, tile-aligned chunks that cover the context
    p = plan_verify_attention(1, 8, 4, 128, 4, 32772, 132)
    assert 8 * p.num_splits >= 2 * 132 and p.kv_chunk % 64 == 0
    assert p.num_splits * p.kv_chunk >= 32772 > (p.num_splits - 1) * p.kv_chunk
    # packed rows: q*group > 64 takes several CTAs along the row axis
    p = plan_verify_attention(2, 2, 16, 256, 16, 100, 132)
    assert (p.warps_m, p.m_groups) == (4, 4) and p.kv_chunk % 32 == 0
    assert plan_verify_attention(2, 2, 1, 64, 1, 1000, 132).warps_m == 1
    # row_invariant: one m-tile per CTA and the split count of q = 1, whatever q is
    one = plan_verify_attention(1, 3, 3, 64, 1, 4096, 132)
    for q in (2, 6, 16):
        p = plan_verify_attention(1, 3, 3, 64, q, 4096, 132, row_invariant=True)
        assert (p.warps_m, p.m_groups) == (1, -(-q * 3 // 16))
        assert (p.num_splits, p.kv_chunk) == (one.num_splits, one.kv_chunk)
    # forced split counts are honoured up to tile-aligned chunks
    for n in (1, 2, 7, 32):
        p = plan_verify_attention(4, 2, 2, 64, 4, 4096, 132, num_splits=n)
        assert p.num_splits == n and p.num_splits * p.kv_chunk >= 4096
    assert plan_verify_attention(4, 2, 2, 64, 4, 4096, 132, num_splits=33).num_splits == 32
    assert plan_verify_attention(1, 1, 1, 64, 1, 70, 132, num_splits=MAX_SPLITS).num_splits == 2
    assert p.workspace_bytes(16, 4, 64) >= 32 * 16 * 4 * 65 * 4
    assert plan_verify_attention(1, 1, 1, 64, 1, 70, 132, 1).workspace_bytes(16, 4, 64) == 0


def test_verify_attention_cluster_plan():
    """The sm_90 one-launch path's plan (ops.attention.TUNING["cluster"]): where "auto" takes
    it, its cluster size / tiles per CTA, and what keeps the split-KV plan."""
    from specdec_lib.ops.attention import _CLUSTER_MAX_TILES, cluster_smem_bytes

    def plan(B, Hkv, group, D, q, max_kv, mode="auto", **kw):
        return plan_verify_attention(B, Hkv, group, D, q, max_kv, 132, kw.pop("n", None),
                                     kw.pop("ri", False), mode, **kw)
    # bench verify_attention_b1's shapes (L + q rounded to the page), and round_b1's table
    for (Hkv, group, D, max_kv), (c, chunk) in {
            (8, 4, 128, 528): (9, 64),      # L=512 32/8: 9 tiles, one each
            (3, 3, 64, 304): (5, 64),       # L=300 9/3
            (2, 8, 256, 528): (9, 64),      # L=512 16/2 D=256: 17 tiles -> 9 CTAs of <= 2
            (2, 8, 256, 1008): (16, 64),    # L=1000: 32 tiles, 16 x 2
            (2, 8, 256, 2032): (16, 128),   # round_b1 (L=1000, table for 2032 keys): 16 x 4
            }.items():
        p = plan(1, Hkv, group, D, 4, max_kv)
        tile = 32 if D == 256 else 64
        n_tiles = -(-max_kv // tile)
        assert p.cluster and p.num_splits * p.kv_chunk >= max_kv
        assert p.kv_chunk // tile <= _CLUSTER_MAX_TILES and p.num_splits <= 16
        assert p.num_splits == -(-n_tiles // (p.kv_chunk // tile))   # no idle CTA planned
        assert p.workspace_bytes(4, Hkv * group, D) == 0
        assert (p.num_splits, p.kv_chunk) == (c, chunk)
    # just over the threshold (16 CTAs x _CLUSTER_MAX_TILES tiles): the split-KV plan, as off
    for D in (64, 128, 256):
        keys = 16 * _CLUSTER_MAX_TILES * (32 if D == 256 else 64)
        assert plan(1, 8, 4, D, 4, keys).cluster
        over = plan(1, 8, 4, D, 4, keys + 1)
        assert not over.cluster and over == plan(1, 8, 4, D, 4, keys + 1, "off")
        assert plan(1, 8, 4, D, 4, keys + 1, "force").cluster   # forced: any length
    # a single tile needs no split: the direct path (one launch already)
    assert not plan(1, 8, 4, 128, 4, 64).cluster and plan(1, 8, 4, 128, 4, 65).cluster
    # the portable limit halves the cluster and doubles the tiles per CTA
    p = plan(1, 8, 4, 128, 4, 1024, max_cluster=8)
    assert p.cluster and (p.num_splits, p.kv_chunk) == (8, 128)
    # a batch that fills the GPU without splits: not in auto, nor forced (a cluster of one
    # CTA is never launched: memcheck refuses its st.async), nor with max_cluster 1
    assert not plan(64, 8, 4, 128, 4, 528).cluster
    f = plan(64, 8, 4, 128, 4, 528, "force")
    assert not f.cluster and f == plan(64, 8, 4, 128, 4, 528, "off")
    assert not plan(1, 8, 4, 128, 4, 528, "force", max_cluster=1).cluster
    # mid batch: fewer CTAs per cluster (2 per SM over the grid), <= 4 tiles each
    p = plan(4, 8, 4, 128, 4, 528)
    assert p.cluster and p.num_splits * 32 <= 2 * 132 and p.kv_chunk <= 128
    assert plan(8, 8, 4, 128, 4, 528).cluster          # 64 head CTAs x 4 CTAs of 3 tiles
    assert not plan(16, 8, 4, 128, 4, 528).cluster     # 2 CTAs of 5 tiles: split plan
    # 64 packed rows (q=16 x group 4): one m-group of 4 m-tiles, the rows ride along
    p = plan(2, 4, 4, 128, 16, 1280)
    assert p.cluster and (p.warps_m, p.m_groups) == (4, 1)
    # m_split: one m-tile a CTA while the grid holds <= one CTA an SM (round_b1: 2 x 2 x 16)
    p = plan(1, 2, 8, 256, 4, 2032, m_split=True)
    assert p.cluster and (p.warps_m, p.m_groups, p.num_splits) == (1, 2, 16)
    assert plan(1, 2, 8, 256, 4, 2032) == plan(1, 2, 8, 256, 4, 2032, m_split=False)
    p = plan(1, 2, 4, 128, 16, 1280, m_split=True)             # 2 heads x 4 m-tiles x 10
    assert (p.warps_m, p.m_groups, p.num_splits) == (1, 4, 10)
    big = plan(2, 4, 4, 128, 16, 1280, m_split=True)           # 32 head CTAs x 7 > 132
    assert big == plan(2, 4, 4, 128, 16, 1280) and big.warps_m == 4
    assert plan(1, 8, 4, 128, 4, 528, m_split=True) == plan(1, 8, 4, 128, 4, 528)  # one m-tile
    # row_invariant and a forced split count keep their plans and bits, mode or not
    for kw in (dict(ri=True), dict(n=4), dict(n=1)):
        for mode in ("auto", "force"):
            a, b = plan(1, 8, 4, 128, 4, 528, mode, **kw), plan(1, 8, 4, 128, 4, 528, "off", **kw)
            assert a == b and not a.cluster
    # shared memory fits sm_90's 227 KiB (+ 1 KiB static) for every D, row count and size
    for D in (64, 128, 256):
        for wm in (1, 2, 4):
            for c in range(1, 17):
                assert cluster_smem_bytes(D, wm, c) + 1024 <= 227 * 1024, (D, wm, c)
    assert cluster_smem_bytes(128, 1, 9) == 98304 + 9 * 16 * 4 + 9 * 16 * 4 * 16 + 4096


def test_verify_attention_cluster_mode(monkeypatch):
    from specdec_lib.ops import attention as A
    monkeypatch.setitem(A.TUNING, "cluster", None)
    for env, want in (("", "auto"), ("auto", "auto"), ("1", "force"), ("0", "off")):
        monkeypatch.setenv(A.CLUSTER_ENV, env)
        assert A.cluster_mode() == want
    monkeypatch.setenv(A.CLUSTER_ENV, "2")
    with pytest.raises(ValueError, match=A.CLUSTER_ENV):
        A.cluster_mode()
    monkeypatch.setitem(A.TUNING, "cluster", False)
    assert A.cluster_mode() == "off"
    monkeypatch.setitem(A.TUNING, "cluster", True)
    assert A.cluster_mode() == "force"


def test_verify_attention_smem_fits_every_target():
    for D in (64, 128, 256):
        assert verify_attention_smem_bytes(D, 75) <= 64 * 1024
        assert verify_attention_smem_bytes(D, 80) <= 99 * 1024     # sm_86 / sm_89 opt-in limit
        assert verify_attention_smem_bytes(D, 90) <= 227 * 1024


def test_verify_attention_op_rejects_host_arrays(rng):
    from specdec_lib import ops
    c = _case(rng, qs=[1], Ls=[0])
    with pytest.raises(TypeError, match="q"):
        ops.verify_attention(c["q"].astype(np.float16), c["k_cache"], c["v_cache"],
                             c["page_table"], c["seq_lens"], c["cu_q"], c["q"])


# ------------------------------------------------------------------ GPU

def _family():
    from specdec_lib import runtime
    return runtime.arch_family(0)


def _to_dev(c, dtype):
    from specdec_lib import DeviceArray
    from specdec_lib.dtypes import to_host_storage
    d = {k: DeviceArray.from_numpy(to_host_storage(c[k], dtype), dtype=dtype)
         for k in ("q", "k_cache", "v_cache")}
    d.update({k: DeviceArray.from_numpy(c[k]) for k in ("page_table", "seq_lens", "cu_q")})
    return d


def _workspace(c):
    """A workspace sized by the public helper for the automatic plan of case ``c``."""
    from specdec_lib import DeviceArray
    from specdec_lib.ops import verify_attention_workspace_size
    T, Hq, D = c["q"].shape
    B, max_pages = c["page_table"].shape
    nbytes = verify_attention_workspace_size(T, Hq, c["k_cache"].shape[2], D, B,
                                             max_pages * c["k_cache"].shape[1])
    return DeviceArray.empty((max(nbytes, 1),), "uint8")


def _gpu_run(c, dtype, **kw):
    """Run the op with poisoned out/lse; returns float64 (out, lse) host copies."""
    from specdec_lib import ops
    from specdec_lib.dtypes import from_host_storage
    T, Hq, D = c["q"].shape
    d = _to_dev(c, dtype)
    out, lse = poison((T, Hq, D), dtype), poison((T, Hq), "float32")
    ops.verify_attention(d["q"], d["k_cache"], d["v_cache"], d["page_table"], d["seq_lens"],
                         d["cu_q"], out, lse_out=lse, **kw)
    return from_host_storage(out.to_numpy(), dtype), lse.to_numpy().astype(np.float64)


def _check(c, got_out, got_lse, dtype, what=""):
    exp_out, exp_lse = _run_ref(c)
    n = int(c["cu_q"][-1])
    # rows no sequence owns stay poisoned; every owned row is written
    assert np.isnan(got_out[n:]).all() and np.isnan(got_lse[n:]).all(), f"{what}: wrote unowned rows"
    errs = []
    for b in range(len(c["seq_lens"])):
        t0, t1 = c["cu_q"][b], c["cu_q"][b + 1]
        if t1 > t0:
            errs.append((b, rel_err(got_out[t0:t1], exp_out[t0:t1]),
                         rel_err(got_lse[t0:t1], exp_lse[t0:t1])))
    bad = [e for e in errs if not (e[1] <= TOL[dtype] and e[2] <= LSE_TOL)]
    assert not bad, (f"{what}: (seq, out rel err, lse rel err) over tolerance: {bad}; "
                     f"L={list(c['seq_lens'])} q={list(np.diff(c['cu_q']))}")


# (D, group, Hkv, page_size, dtype): every D, group 1/4/8/16, page 1/16/64/256, both dtypes
GPU_SHAPES = [
    (64, 1, 2, 1, "float16"),
    (64, 16, 1, 256, "bfloat16"),
    (64, 8, 2, 16, "float16"),
    (128, 4, 2, 16, "bfloat16"),
    (128, 8, 1, 64, "float16"),
    (128, 16, 1, 16, "bfloat16"),
    (128, 1, 4, 256, "float16"),
    (256, 1, 2, 64, "bfloat16"),
    (256, 4, 1, 256, "float16"),
    (256, 16, 1, 1, "float16"),
    (256, 8, 1, 16, "bfloat16"),
]


@needs_gpu
@pytest.mark.parametrize("D,group,Hkv,page_size,dtype", GPU_SHAPES,
                         ids=[f"d{a}-g{b}-hkv{c}-p{d}-{e}" for a, b, c, d, e in GPU_SHAPES])
def test_verify_attention_gpu(rng, D, group, Hkv, page_size, dtype):
    if dtype == "bfloat16" and _family() < 80:
        pytest.skip("bf16 needs the sm_80 path")
    ps = page_size
    # ragged q 0..16 (q=1 decode rows, an empty row, full 16) against L = 0, 1, page-1,
    # page, page+1, 4095 and a few odd lengths; one row past cu_q[B] must stay untouched
    Ls = [0, 1, max(ps - 1, 2), ps, ps + 1, 4095, 37, 0, 200]
    qs = [1, 16, 3, 0, 7, 4, 1, 11, 16]
    c = _case(rng, qs, Ls, Hq=group * Hkv, Hkv=Hkv, D=D, page_size=ps, dtype=dtype, extra_rows=1)
    # automatic plan with a workspace: short sequences take the direct path, long ones split
    out, lse = _gpu_run(c, dtype, workspace=_workspace(c))
    _check(c, out, lse, dtype, f"D={D} group={group} page={ps} {dtype}")


@needs_gpu
@pytest.mark.parametrize("group,Hkv,dtype", [(3, 3, "bfloat16"), (16, 1, "float16"),
                                             (4, 2, "float16")])
@pytest.mark.parametrize("split", [False, True], ids=["direct", "workspace"])
def test_verify_attention_gpu_row_invariant_equals_one_row_calls(rng, group, Hkv, dtype, split):
    """row_invariant=True: each row of a block (q x group past 16 packed rows: several
    m-tiles) has the bits of the same row decoded alone (q = 1, L + i, same batch and page
    table), with and without KV splits."""
    from specdec_lib import DeviceArray, ops
    if dtype == "bfloat16" and _family() < 80:
        pytest.skip("bf16 needs the sm_80 path")
    qs, Ls = [6, 16, 1, 0, 11], [300, 37, 5, 9, 1000]
    c = _case(rng, qs, Ls, Hq=group * Hkv, Hkv=Hkv, D=64, page_size=16, dtype=dtype)
    T, Hq, D = c["q"].shape
    ws = {}
    if split:
        B, max_pages = c["page_table"].shape
        n = ops.verify_attention_workspace_size(T, Hq, Hkv, D, B, max_pages * 16,
                                                row_invariant=True)
        assert n > 0
        ws = dict(workspace=DeviceArray.empty((n,), "uint8"))
    d = _to_dev(c, dtype)

    def call(q, seq_lens, cu_q):
        out, lse = poison((q.shape[0], Hq, D), dtype), poison((q.shape[0], Hq), "float32")
        ops.verify_attention(q, d["k_cache"], d["v_cache"], d["page_table"], seq_lens, cu_q,
                             out, lse_out=lse, row_invariant=True, **ws)
        return out.to_numpy(), lse.to_numpy()
    block, block_lse = call(d["q"], d["seq_lens"], d["cu_q"])
    _check(c, *_gpu_run(c, dtype, row_invariant=True, **ws), dtype, "row_invariant")
    q_host = d["q"].to_numpy()
    for i in range(max(qs)):
        rows = [c["cu_q"][b] + i for b in range(len(qs)) if qs[b] > i]
        counts = [1 if qs[b] > i else 0 for b in range(len(qs))]
        one, one_lse = call(DeviceArray.from_numpy(q_host[rows], dtype=dtype),
                            DeviceArray.from_numpy(np.array(Ls, np.int32) + i * np.array(counts, np.int32)),
                            DeviceArray.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)))
        np.testing.assert_array_equal(one, block[rows], err_msg=f"row {i}")
        np.testing.assert_array_equal(one_lse, block_lse[rows], err_msg=f"row {i} lse")


@needs_gpu
def test_verify_attention_gpu_split_counts(rng):
    """Every split count from 1 to the tile count on one batch (merge path, sequences that
    need fewer splits than the grid has, splits ending inside the causal block)."""
    from specdec_lib import DeviceArray, ops
    from specdec_lib.dtypes import from_host_storage
    dtype = "float16"
    c = _case(rng, qs=[4, 1, 16, 2], Ls=[700, 0, 250, 63], Hq=8, Hkv=2, D=128, page_size=16,
              dtype=dtype)
    T, Hq, D = c["q"].shape
    max_kv = c["page_table"].shape[1] * 16
    d = _to_dev(c, dtype)
    exp_out, exp_lse = _run_ref(c)
    ws = DeviceArray.empty((max_kv // 64 * T * Hq * (D + 1) * 4 + 4096,), "uint8")
    for n in sorted({1, 2, 3, 4, 5, 8, 11, max_kv // 64}):
        out, lse = poison((T, Hq, D), dtype), poison((T, Hq), "float32")
        ops.verify_attention(d["q"], d["k_cache"], d["v_cache"], d["page_table"], d["seq_lens"],
                             d["cu_q"], out, lse_out=lse, workspace=ws, num_splits=n)
        got = from_host_storage(out.to_numpy(), dtype)
        e_out, e_lse = rel_err(got, exp_out), rel_err(lse.to_numpy(), exp_lse)
        assert e_out <= TOL[dtype] and e_lse <= LSE_TOL, f"num_splits={n}: {e_out=} {e_lse=}"


@needs_gpu
@pytest.mark.parametrize("group,Hkv,q,dtype", [(3, 3, 4, "bfloat16"), (8, 2, 2, "float16"),
                                               (4, 1, 5, "float16")])
@pytest.mark.parametrize("ws", [False, True], ids=["direct", "workspace"])
def test_verify_attention_gpu_tight_max_q(rng, group, Hkv, q, dtype, ws):
    """A batch of short blocks (a decode round at batch) with max_q = the longest block,
    the bound the orchestrator passes (a smaller m-tile plan than min(T, 16)); and max_q
    one below it: the sequences whose blocks are longer stay unwritten (the op's contract),
    the others are still attended."""
    if dtype == "bfloat16" and _family() < 80:
        pytest.skip("bf16 needs the sm_80 path")
    B = 24
    Ls = list(rng.integers(0, 700, B))
    Ls[:3] = [0, 1, 63]
    qs = [q if b % 2 == 0 else q - 1 for b in range(B)]   # every other sequence one row short
    c = _case(rng, qs, Ls, Hq=group * Hkv, Hkv=Hkv, D=64, page_size=16, dtype=dtype,
              extra_rows=1)
    kw = dict(workspace=_workspace(c)) if ws else {}
    _check(c, *_gpu_run(c, dtype, max_q=q, **kw), dtype, f"max_q={q}")
    out, lse = _gpu_run(c, dtype, max_q=q - 1, **kw)
    exp_out, _ = _run_ref(c, max_q=q - 1)
    owned = np.isfinite(exp_out).all(axis=(1, 2))
    assert owned.sum() == (B // 2) * (q - 1)
    assert np.isnan(out[~owned]).all() and np.isnan(lse[~owned]).all(), "wrote a longer block"
    assert rel_err(out[owned], exp_out[owned]) <= TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_verify_attention_gpu_long_context(rng, dtype):
    """Batch 1 at 32k context: the automatic plan splits the KV (workspace from the helper)."""
    from specdec_lib.ops import verify_attention_workspace_size
    if dtype == "bfloat16" and _family() < 80:
        pytest.skip("bf16 needs the sm_80 path")
    c = _case(rng, qs=[4], Ls=[32768], Hq=8, Hkv=2, D=128, page_size=64, dtype=dtype)
    T, Hq, D = c["q"].shape
    max_kv = c["page_table"].shape[1] * 64
    assert verify_attention_workspace_size(T, Hq, 2, D, 1, max_kv) > 0, \
        "batch 1 at 32k must split the KV"
    out, lse = _gpu_run(c, dtype, workspace=_workspace(c))
    _check(c, out, lse, dtype, "L=32768")


@needs_gpu
def test_verify_attention_gpu_strided_views(rng):
    """K and V as views of one [pages, 2, page, Hkv, D] pool, q and out inside wider
    buffers, lse_out transposed: strides are honoured; no lse_out also works."""
    from specdec_lib import DeviceArray, ops
    from specdec_lib.dtypes import from_host_storage, to_host_storage
    dtype, ps, Hkv, D, Hq = "float16", 16, 2, 64, 8
    c = _case(rng, qs=[3, 5], Ls=[20, 47], Hq=Hq, Hkv=Hkv, D=D, page_size=ps, dtype=dtype)
    T = c["q"].shape[0]
    P = c["k_cache"].shape[0]
    pool = DeviceArray.from_numpy(to_host_storage(np.stack([c["k_cache"], c["v_cache"]], 1), dtype),
                                  dtype=dtype)
    qbuf = DeviceArray.from_numpy(to_host_storage(
        np.concatenate([c["q"], np.zeros((T, Hq, D))], axis=2), dtype), dtype=dtype)
    obuf = poison((T, Hq, 2 * D), dtype)
    lbuf = poison((Hq, T), "float32")

    class View:
        def __init__(self, base, shape, strides, offset=0):
            isz = 4 if base.dtype == "float32" else 2
            self.__cuda_array_interface__ = {
                "shape": shape, "strides": tuple(s * isz for s in strides),
                "typestr": "<f4" if base.dtype == "float32" else "<f2",
                "data": (base.ptr + offset * isz, False), "version": 3}
    e = ps * Hkv * D
    kv = lambda which: View(pool, (P, ps, Hkv, D), (2 * e, Hkv * D, D, 1), which * e)   # noqa: E731
    q = View(qbuf, (T, Hq, D), (Hq * 2 * D, 2 * D, 1))
    out = View(obuf, (T, Hq, D), (Hq * 2 * D, 2 * D, 1), D)
    lse = View(lbuf, (T, Hq), (1, T))
    idx = {k: DeviceArray.from_numpy(c[k]) for k in ("page_table", "seq_lens", "cu_q")}
    ops.verify_attention(q, kv(0), kv(1), idx["page_table"], idx["seq_lens"], idx["cu_q"], out,
                         lse_out=lse)
    got = from_host_storage(obuf.to_numpy(), dtype)
    assert np.isnan(got[..., :D]).all(), "wrote outside the out view"
    _check(c, got[..., D:], lbuf.to_numpy().T.astype(np.float64), dtype, "strided")
    ops.verify_attention(q, kv(0), kv(1), idx["page_table"], idx["seq_lens"], idx["cu_q"], out)


@needs_gpu
def test_verify_attention_gpu_bad_indices(rng):
    """Bad page ids: check_indices raises before launch; without it the kernel does not
    fault and flags the affected sequence's rows with NaN, other sequences are right."""
    dtype = "float16"
    c = _case(rng, qs=[2, 3], Ls=[40, 17], Hq=4, Hkv=2, D=64, page_size=16, dtype=dtype)
    c["page_table"][1, 0] = c["k_cache"].shape[0] + 5
    with pytest.raises(ValueError, match="outside the pool"):
        _gpu_run(c, dtype, check_indices=True)
    out, lse = _gpu_run(c, dtype, check_indices=False)
    assert np.isnan(out[2:]).all(), "rows reading a bad page must be flagged"
    good = dict(c, page_table=c["page_table"][:1], seq_lens=c["seq_lens"][:1], cu_q=c["cu_q"][:2])
    exp_out, _ = _run_ref(dict(good, q=c["q"][:2]))
    assert rel_err(out[:2], exp_out) <= TOL[dtype]


@needs_gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_verify_attention_gpu_many_splits(rng, D):
    """More splits than a warp has lanes (the merge's LSE reduction loops) for every
    column/slice layout of the merge (D/4 column threads), ragged rows, with a sequence
    that needs fewer splits than the grid has."""
    from specdec_lib import DeviceArray
    from specdec_lib.ops import verify_attention_workspace_size
    dtype = "float16"
    c = _case(rng, qs=[5, 16, 1], Ls=[3000, 40, 1500], Hq=4, Hkv=2, D=D, page_size=16,
              dtype=dtype, extra_rows=1)
    T, Hq, _ = c["q"].shape
    max_kv = c["page_table"].shape[1] * 16
    n = max_kv // (32 if D == 256 else 64)   # one KV tile per split
    assert plan_verify_attention(3, 2, 2, D, 16, max_kv, 132, n).num_splits > 32
    nbytes = verify_attention_workspace_size(T, Hq, 2, D, 3, max_kv, num_splits=n)
    out, lse = _gpu_run(c, dtype, workspace=DeviceArray.empty((nbytes,), "uint8"), num_splits=n)
    _check(c, out, lse, dtype, f"D={D} num_splits={n}")


@needs_gpu
@pytest.mark.parametrize("split", [False, True])
def test_verify_attention_gpu_bad_page_deep(rng, split):
    """A bad page id many tiles into a long sequence (read through the page-id prefetch
    ring, not the prologue): that sequence's rows are NaN, the others are right, direct
    and split-KV paths."""
    from specdec_lib import DeviceArray
    from specdec_lib.ops import verify_attention_workspace_size
    dtype = "float16"
    c = _case(rng, qs=[3, 2], Ls=[30, 1200], Hq=4, Hkv=2, D=128, page_size=16, dtype=dtype)
    c["page_table"][1, 50] = -7   # keys 800..815: tile 12 of the direct path
    kw = {}
    if split:
        n = 4
        T, Hq, D = c["q"].shape
        nbytes = verify_attention_workspace_size(T, Hq, 2, D, 2, c["page_table"].shape[1] * 16,
                                                 num_splits=n)
        kw = dict(workspace=DeviceArray.empty((nbytes,), "uint8"), num_splits=n)
    out, lse = _gpu_run(c, dtype, check_indices=False, **kw)
    assert np.isnan(out[3:]).all(), "rows reading a bad page must be flagged"
    good = dict(c, page_table=c["page_table"][:1], seq_lens=c["seq_lens"][:1], cu_q=c["cu_q"][:2])
    exp_out, exp_lse = _run_ref(dict(good, q=c["q"][:3]))
    assert rel_err(out[:3], exp_out) <= TOL[dtype] and rel_err(lse[:3], exp_lse) <= LSE_TOL


# ------------------------------------------------------------------ GPU: the sm_90 cluster path
# (ops.attention.TUNING["cluster"]: True forces it wherever it can run; the plan it takes is
# asserted, so a test never passes on the split path by accident)

def _needs_cluster_family():
    if _family() < 90:
        pytest.skip("the cluster path runs on sm_90 code only")


def _planned(c, **kw):
    """The plan the op takes for case ``c`` (automatic split count) under the current
    TUNING / environment: ops.attention.choose_plan, the op's own choice."""
    from specdec_lib.ops import attention as A
    T, Hq, D = c["q"].shape
    Hkv = c["k_cache"].shape[2]
    B, max_pages = c["page_table"].shape
    max_kv = kw.get("max_kv_len", max_pages * c["k_cache"].shape[1])
    return A.choose_plan(0, "f16", D, B, Hkv, Hq // Hkv, kw.get("max_q", min(T, 16)), max_kv)[0]


# (D, group, Hkv, page_size, dtype): every D, GQA 1/3/4/8, both dtypes, pages 1..64
CLUSTER_SHAPES = [
    (64, 1, 2, 16, "float16"),
    (64, 3, 3, 16, "bfloat16"),
    (64, 8, 1, 1, "float16"),
    (128, 4, 8, 16, "bfloat16"),
    (128, 4, 2, 64, "float16"),
    (128, 8, 1, 16, "float16"),
    (128, 16, 1, 4, "bfloat16"),
    (256, 1, 2, 16, "float16"),
    (256, 8, 2, 16, "bfloat16"),
    (256, 3, 1, 32, "float16"),
]


@needs_gpu
@pytest.mark.parametrize("D,group,Hkv,page_size,dtype", CLUSTER_SHAPES,
                         ids=[f"d{a}-g{b}-hkv{c}-p{d}-{e}" for a, b, c, d, e in CLUSTER_SHAPES])
@pytest.mark.parametrize("ws", [False, True], ids=["no_ws", "ws"])
def test_verify_attention_gpu_cluster(rng, monkeypatch, D, group, Hkv, page_size, dtype, ws):
    """Forced cluster path against the float64 reference: ragged q 0..16 (q = 1 rows, an
    empty sequence), L = 0, 1, page-1, page, page+1 and a few odd lengths, one row past
    cu_q[B] that must stay poisoned; with and without a workspace (it needs none)."""
    from specdec_lib.ops import attention as A
    _needs_cluster_family()
    ps = page_size
    Ls = [0, 1, max(ps - 1, 2), ps, ps + 1, 37, 0, 200, 511]
    qs = [1, 16, 3, 0, 7, 4, 1, 11, 4]
    c = _case(rng, qs, Ls, Hq=group * Hkv, Hkv=Hkv, D=D, page_size=ps, dtype=dtype, extra_rows=1)
    monkeypatch.setitem(A.TUNING, "cluster", True)
    assert _planned(c).cluster
    out, lse = _gpu_run(c, dtype, **(dict(workspace=_workspace(c)) if ws else {}))
    _check(c, out, lse, dtype, f"cluster D={D} group={group} page={ps} {dtype}")


@needs_gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("group,Hkv", [(1, 8), (3, 3), (4, 8), (8, 2)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_verify_attention_gpu_cluster_b1_auto(rng, monkeypatch, D, group, Hkv, dtype):
    """Batch 1, q = 4, the automatic plan (no env, no TUNING): the cluster path from 2 KV
    tiles up to the threshold (16 CTAs x 2 tiles), the direct path below and the split-KV
    path just past it; every L on both sides against the reference."""
    from specdec_lib.ops import attention as A
    _needs_cluster_family()
    monkeypatch.setitem(A.TUNING, "cluster", None)
    monkeypatch.delenv(A.CLUSTER_ENV, raising=False)
    tile = 32 if D == 256 else 64
    wm = 1 if 4 * group <= 16 else 2
    max_cluster = A._cluster_setup(0, "f16", D, wm)[1]   # 16, or 8 where 16 cannot be resident
    limit = 16 * A._CLUSTER_MAX_TILES * tile
    for L in (0, 1, 15, 16, 17, 60, 508, limit - 4, limit - 3):
        c = _case(rng, [4], [L], Hq=group * Hkv, Hkv=Hkv, D=D, page_size=16, dtype=dtype)
        # the plan sees max_kv_len = the page table's span (L + 4 rounded up to a page)
        n_tiles = -(-c["page_table"].shape[1] * 16 // tile)
        p = _planned(c)
        assert p.cluster == (2 <= n_tiles <= max_cluster * A._CLUSTER_MAX_TILES), (L, n_tiles, p)
        out, lse = _gpu_run(c, dtype, workspace=_workspace(c))
        _check(c, out, lse, dtype, f"B=1 L={L} D={D} {group * Hkv}/{Hkv} {dtype} cluster={p.cluster}")


@needs_gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("q,group,Hkv", [(4, 8, 2), (4, 4, 8), (16, 4, 2), (5, 7, 1)])
def test_verify_attention_gpu_cluster_m_split(rng, monkeypatch, D, q, group, Hkv):
    """TUNING["cluster_m_split"]: one m-tile per cluster CTA (warps_m 1, m_groups = m-tiles)
    where the grid stays within one CTA an SM; ragged last m-tile (5 x 7 = 35 rows), L on
    both sides of a page and of a tile, against the reference."""
    from specdec_lib.ops import attention as A
    _needs_cluster_family()
    monkeypatch.setitem(A.TUNING, "cluster", True)
    monkeypatch.setitem(A.TUNING, "cluster_m_split", True)
    for L in (100, 127, 1000):   # >= 2 KV tiles: a single tile takes the direct path
        c = _case(rng, [q], [L], Hq=group * Hkv, Hkv=Hkv, D=D, page_size=16, dtype="bfloat16")
        p = _planned(c)
        mt = -(-q * group // 16)
        assert p.cluster and (p.warps_m, p.m_groups) == ((1, mt) if mt > 1 else (1, 1)), p
        out, lse = _gpu_run(c, "bfloat16", workspace=_workspace(c))
        _check(c, out, lse, "bfloat16", f"m-split B=1 q={q} L={L} D={D} {group * Hkv}/{Hkv}")


@needs_gpu
@pytest.mark.parametrize("max_cluster", [16, 8, 3, 2])
def test_verify_attention_gpu_cluster_sizes(rng, monkeypatch, max_cluster):
    """Cluster sizes below 16 (so several tiles per CTA, ring reuse past 3 tiles, page ids
    fetched in the loop), sequences longer than max_kv_len (the kernel splits the actual
    length), page size 1 past the 1024 staged page-table entries (global reads), each D;
    against the reference."""
    from specdec_lib.ops import attention as A
    _needs_cluster_family()
    monkeypatch.setitem(A.TUNING, "cluster", True)
    monkeypatch.setattr(A, "_CLUSTER_MAX", max_cluster)
    monkeypatch.setattr(A, "_CLUSTER_PORTABLE", min(8, max_cluster))
    A._cluster_cache.clear()
    try:
        for D, ps in ((64, 1), (128, 16), (256, 16)):
            c = _case(rng, qs=[4, 1, 16], Ls=[700, 0, 1300], Hq=8, Hkv=2, D=D, page_size=ps,
                      dtype="float16")
            for kv in (None, 200):   # 200 < L + q: more tiles per CTA than planned
                kw = {} if kv is None else dict(max_kv_len=kv)
                p = _planned(c, **kw)
                assert p.cluster and p.num_splits <= max_cluster
                out, lse = _gpu_run(c, "float16", **kw)
                _check(c, out, lse, "float16", f"D={D} max_cluster={max_cluster} max_kv_len={kv}")
    finally:
        A._cluster_cache.clear()


@needs_gpu
def test_verify_attention_gpu_cluster_bad_input(rng, monkeypatch):
    """A page id outside the pool (in the prologue's ids, and several tiles deep into a CTA's
    range), and a negative L: those sequences' rows are NaN, the others right; no fault."""
    from specdec_lib.ops import attention as A
    _needs_cluster_family()
    monkeypatch.setitem(A.TUNING, "cluster", True)
    dtype = "float16"
    c = _case(rng, qs=[3, 2, 4, 1], Ls=[30, 1200, 90, 50], Hq=8, Hkv=2, D=128, page_size=16,
              dtype=dtype)
    c["page_table"][0, 1] = c["k_cache"].shape[0] + 5   # keys 16..31: the first tile
    c["page_table"][1, 60] = -7                         # keys 960..975: tile 15 of 19
    c["seq_lens"][3] = -1
    # default plan: 10 CTAs x 2 tiles (the bad ids in the prologue); max_kv_len=128: 2 CTAs,
    # sequence 1's second CTA runs tiles 10..18 (tile 15 read in the loop)
    for kw in ({}, dict(max_kv_len=128)):
        assert _planned(c, **kw).cluster
        out, lse = _gpu_run(c, dtype, check_indices=False, **kw)
        assert np.isnan(out[:5]).all() and np.isnan(out[9:10]).all(), "bad rows must be NaN"
        good = dict(c, page_table=c["page_table"][2:3], seq_lens=c["seq_lens"][2:3],
                    cu_q=np.array([0, 4], np.int32))
        exp_out, exp_lse = _run_ref(dict(good, q=c["q"][5:9]))
        assert rel_err(out[5:9], exp_out) <= TOL[dtype] and rel_err(lse[5:9], exp_lse) <= LSE_TOL


@needs_gpu
@pytest.mark.parametrize("kw", [dict(row_invariant=True), dict(num_splits=3), dict(num_splits=1)],
                         ids=["row_invariant", "splits3", "splits1"])
def test_verify_attention_gpu_cluster_leaves_other_plans(rng, monkeypatch, kw):
    """row_invariant=True and a forced split count never take the cluster path: the same
    bits with the path forced on as off."""
    from specdec_lib import DeviceArray
    from specdec_lib.ops import attention as A
    dtype = "bfloat16" if _family() >= 80 else "float16"
    c = _case(rng, qs=[4, 1], Ls=[300, 20], Hq=8, Hkv=2, D=64, page_size=16, dtype=dtype)
    ws = DeviceArray.empty((1 << 20,), "uint8")
    got = []
    for on in (False, True):
        monkeypatch.setitem(A.TUNING, "cluster", on)
        out, lse = _gpu_run(c, dtype, workspace=ws, **kw)
        got.append((out, lse))
    np.testing.assert_array_equal(got[0][0], got[1][0])
    np.testing.assert_array_equal(got[0][1], got[1][1])
    _check(c, *got[1], dtype, str(kw))


@needs_gpu
def test_verify_attention_gpu_cluster_matches_split_path(rng, monkeypatch):
    """The same batch through the cluster path and the split-KV + merge path: both within
    tolerance of the reference and of each other (they differ only in rounding order)."""
    from specdec_lib.ops import attention as A
    _needs_cluster_family()
    dtype = "bfloat16"
    c = _case(rng, qs=[4], Ls=[512], Hq=32, Hkv=8, D=128, page_size=16, dtype=dtype)
    res = {}
    for on in (False, True):
        monkeypatch.setitem(A.TUNING, "cluster", on)
        res[on] = _gpu_run(c, dtype, workspace=_workspace(c))
        _check(c, *res[on], dtype, f"cluster={on}")
    assert rel_err(res[True][0], res[False][0]) <= TOL[dtype]


@needs_gpu
def test_verify_attention_gpu_rejects_before_launch(rng):
    from specdec_lib import DeviceArray, ops
    c = _case(rng, qs=[2, 1], Ls=[300, 2], Hq=4, Hkv=2, D=64, page_size=4, dtype="float16")
    d = _to_dev(c, "float16")
    T, Hq, D = c["q"].shape
    out = poison((T, Hq, D), "float16")
    base = dict(q=d["q"], k_cache=d["k_cache"], v_cache=d["v_cache"], page_table=d["page_table"],
                seq_lens=d["seq_lens"], cu_q=d["cu_q"], out=out)
    cases = [
        (dict(out=poison((T, Hq, D), "bfloat16")), TypeError, "out: dtype"),
        (dict(q=DeviceArray.from_numpy(c["q"].astype(np.float32))), TypeError, "q: dtype"),
        (dict(v_cache=DeviceArray.from_numpy(c["v_cache"][:, :2].astype(np.float16))),
         ValueError, "v_cache"),
        (dict(page_table=DeviceArray.from_numpy(c["page_table"].astype(np.int64))),
         TypeError, "page_table"),
        (dict(cu_q=DeviceArray.from_numpy(np.array([0, 3], np.int32))), ValueError, "cu_q"),
        (dict(lse_out=poison((T, Hq + 1), "float32")), ValueError, "lse_out"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(num_splits=2), ValueError, "workspace"),
        (dict(num_splits=2, workspace=DeviceArray.empty((16,), "uint8")), ValueError, "workspace"),
    ]
    if _family() < 80:
        bf = {k: DeviceArray.from_numpy(c[k], dtype="bfloat16") for k in ("q", "k_cache", "v_cache")}
        cases.append((dict(bf, out=poison((T, Hq, D), "bfloat16")), TypeError, "bfloat16"))
    for override, exc, match in cases:
        with pytest.raises(exc, match=match):
            ops.verify_attention(**dict(base, **override))
    assert np.isnan(out.to_numpy().astype(np.float32)).all()


# ------------------------------------------------------------------ rope_append_kv
# = rope(q, k, positions, cos_sin_cache) then append_kv(k, v, k_cache, v_cache, ...), one launch

def _rak_case(rng, qs, Ls, Hq=4, Hkv=2, D=64, page_size=4, P=None, host=np.float64):
    """Random q/k/v of a ragged batch, rope positions L[b] + i, a shuffled page table with
    room to spare, NaN caches (untouched entries stay NaN), a cos/sin table of P rows."""
    qs, Ls = list(qs), list(Ls)
    B = len(qs)
    cu_q = np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)
    T = int(cu_q[-1])
    max_pages = max([-(-(L + q) // page_size) for L, q in zip(Ls, qs)] + [1]) + 1
    num_pages = B * max_pages + 2
    pt = rng.permutation(num_pages)[:B * max_pages].reshape(B, max_pages).astype(np.int32)
    pos = np.concatenate([np.arange(L, L + q) for L, q in zip(Ls, qs)] + [[]]).astype(np.int32)
    P = P or int(max(Ls) + max(qs) + 1)
    return dict(q=rng.standard_normal((T, Hq, D)).astype(host),
                k=rng.standard_normal((T, Hkv, D)).astype(host),
                v=rng.standard_normal((T, Hkv, D)).astype(host), positions=pos,
                cos_sin_cache=ref.rope_cos_sin_cache(P, D, 10000.0),
                k_cache=np.full((num_pages, page_size, Hkv, D), np.nan, host),
                v_cache=np.full((num_pages, page_size, Hkv, D), np.nan, host),
                page_table=pt, seq_lens=np.array(Ls, np.int32), cu_q=cu_q)


_RAK_ARGS = ("q", "k", "v", "positions", "cos_sin_cache", "k_cache", "v_cache", "page_table",
             "seq_lens", "cu_q")


def _rak_unfused(c, finished=None):
    """What the fused op must equal: the two reference ops on copies."""
    d = {n: np.array(a, copy=True) for n, a in c.items()}
    ref.rope(d["q"], d["k"], d["positions"], d["cos_sin_cache"])
    ref.append_kv(d["k"], d["v"], d["k_cache"], d["v_cache"], d["page_table"], d["seq_lens"],
                  d["cu_q"], finished)
    return d


@pytest.mark.parametrize("host", [np.float64, np.float32])
def test_rope_append_kv_reference_is_rope_then_append_kv(rng, host):
    """Ragged rows (an empty sequence, one crossing a page boundary), a finished sequence
    (rotated, not appended) and a position past the table (NaN heads, appended as NaN)."""
    c = _rak_case(rng, qs=[3, 0, 5, 2], Ls=[0, 4, 3, 7], page_size=4, host=host)
    c["positions"][1] = c["cos_sin_cache"].shape[0]
    fin = np.array([False, False, False, True])
    want = _rak_unfused(c, fin)
    got = ref.rope_append_kv(*(c[n] for n in _RAK_ARGS), fin)
    assert got[0] is c["q"] and got[3] is c["v_cache"]
    for n in ("q", "k", "k_cache", "v_cache"):
        np.testing.assert_array_equal(c[n], want[n], err_msg=n)
    assert np.isnan(c["q"][1]).all() and np.isnan(c["k"][1]).all()
    pg = c["page_table"][0, 0]
    assert np.isnan(c["k_cache"][pg, 1]).all() and np.isfinite(c["v_cache"][pg, 1]).all()
    written = np.isfinite(c["v_cache"][..., 0, 0]).sum()
    assert written == 3 + 5                                   # sequence 3 finished


def test_rope_append_kv_reference_bf16_bits(rng):
    """bfloat16 as uint16 bits (how the reference takes bf16): same as the unfused pair."""
    from specdec_lib.dtypes import to_host_storage
    c = _rak_case(rng, qs=[2, 3], Ls=[5, 0], page_size=2, host=np.float32)
    for n in ("q", "k", "v", "k_cache", "v_cache"):
        c[n] = to_host_storage(c[n], "bfloat16")
    want = _rak_unfused(c)
    ref.rope_append_kv(*(c[n] for n in _RAK_ARGS))
    for n in ("q", "k", "k_cache", "v_cache"):
        np.testing.assert_array_equal(c[n], want[n], err_msg=n)


@pytest.mark.parametrize("change,exc,match", [
    (dict(seq_lens=np.array([-1, 0], np.int32)), ValueError, "seq_lens"),
    (dict(cu_q=np.array([0, 3, 2], np.int32)), ValueError, "cu_q"),
    (dict(page_table=np.full((2, 4), 99, np.int32)), ValueError, "page id"),
    (dict(page_table=np.zeros((2, 1), np.int32)), ValueError, "page_table"),
    (dict(k=np.zeros((5, 2, 64), np.int32)), TypeError, "k: dtype"),   # (floats: by kind)
    (dict(k=np.zeros((4, 2, 64))), ValueError, "k"),
    (dict(v=np.zeros((5, 1, 64))), ValueError, "v"),
    (dict(k_cache=np.zeros((10, 4, 3, 64)), v_cache=np.zeros((10, 4, 3, 64))), ValueError,
     "k: expected shape"),                                 # (k_cache: append_kv's anchor)
    (dict(k_cache=np.zeros((10, 4, 3, 64))), ValueError, "v_cache: expected shape"),
    (dict(positions=np.zeros(4, np.int32)), ValueError, "positions"),
    (dict(cos_sin_cache=np.zeros((8, 32), np.float32)), ValueError, "cos_sin_cache"),
    (dict(q=np.zeros((5, 4, 63))), ValueError, "q: head dim"),
    (dict(q=[[0.0]]), TypeError, "q"),
])
def test_rope_append_kv_reference_rejects_before_writing(rng, change, exc, match):
    c = _rak_case(rng, qs=[3, 2], Ls=[1, 6], page_size=4)
    c.update(change)
    before = {n: np.array(c[n], copy=True) for n in ("q", "k", "k_cache", "v_cache")
              if isinstance(c[n], np.ndarray)}
    with pytest.raises(exc, match=match):
        ref.rope_append_kv(*(c[n] for n in _RAK_ARGS))
    for n, a in before.items():
        np.testing.assert_array_equal(c[n], a, err_msg=f"{n} written before the error")


def test_rope_append_kv_exported():
    import specdec_lib
    from specdec_lib import ops
    assert specdec_lib.rope_append_kv is ops.rope_append_kv
    from specdec_lib.reference import attention
    assert ref.rope_append_kv is attention.rope_append_kv


def _rak_fakes(T=5, Hq=4, Hkv=2, D=64, B=2, ps=4, dt="<f2"):
    from test_draft import _Fake
    return dict(q=_Fake((T, Hq, D), dt), k=_Fake((T, Hkv, D), dt), v=_Fake((T, Hkv, D), dt),
                positions=_Fake((T,), "<i4"), cos_sin_cache=_Fake((16, D)),
                k_cache=_Fake((9, ps, Hkv, D), dt), v_cache=_Fake((9, ps, Hkv, D), dt),
                page_table=_Fake((B, 4), "<i4"), seq_lens=_Fake((B,), "<i4"),
                cu_q=_Fake((B + 1,), "<i4"))


def _fake(shape, typestr="<f2", strides=None):
    from test_draft import _Fake
    return _Fake(shape, typestr, strides)


@pytest.mark.parametrize("kw,exc,match", [
    # rope's checks
    (dict(q=_fake((5, 4, 64), "<f8")), TypeError, "q: dtype"),
    (dict(q=_fake((5, 256))), ValueError, "q"),
    (dict(q=_fake((5, 4, 64), strides=(1024, 128, 4))), ValueError, "q: the last dimension"),
    (dict(k=None), TypeError, "k: required"),
    (dict(k=_fake((5, 2, 64), "<f4")), TypeError, "k"),
    (dict(k=_fake((4, 2, 64))), ValueError, "k"),
    (dict(positions=_fake((5,), "<i8")), TypeError, "positions"),
    (dict(positions=_fake((6,), "<i4")), ValueError, "positions"),
    (dict(cos_sin_cache=_fake((16, 64), "<f2")), TypeError, "cos_sin_cache"),
    (dict(cos_sin_cache=_fake((16, 32), "<f4")), ValueError, "cos_sin_cache"),
    # append_kv's checks
    (dict(k_cache=_fake((9, 4, 2, 64), "<f4"), v_cache=_fake((9, 4, 2, 64), "<f4")), TypeError,
     "k_cache: dtype"),
    (dict(k_cache=_fake((9, 4, 2, 64), "<f4")), TypeError, "k_cache: dtype"),
    (dict(k_cache=_fake((9, 4, 2, 64, 1))), ValueError, "k_cache"),
    (dict(k_cache=_fake((9, 4, 3, 64)), v_cache=_fake((9, 4, 3, 64))), ValueError, "k: "),
    (dict(v_cache=_fake((9, 4, 2, 64), "<f4")), TypeError, "v_cache"),
    (dict(v=_fake((5, 1, 64))), ValueError, "v"),
    (dict(v=_fake((5, 2, 64), "<f4")), TypeError, "v"),
    (dict(v=_fake((5, 2, 64), strides=(512, 256, 4))), ValueError, "v: the head dimension"),
    (dict(page_table=_fake((2, 4), "<i8")), TypeError, "page_table"),
    (dict(page_table=_fake((2, 4), "<i4", strides=(32, 8))), ValueError, "page_table: rows"),
    (dict(seq_lens=_fake((3,), "<i4")), ValueError, "seq_lens"),
    (dict(cu_q=_fake((2,), "<i4")), ValueError, "cu_q"),
    (dict(finished=_fake((3,), "|u1")), ValueError, "finished"),
    (dict(finished=_fake((2,), "<i4")), TypeError, "finished"),
    (dict(stream="default"), TypeError, "stream"),
])
def test_rope_append_kv_op_validation(kw, exc, match):
    """The union of rope's and append_kv's checks, all before any launch (no GPU here)."""
    from specdec_lib import ops
    args = _rak_fakes()
    args.update(kw)
    with pytest.raises(exc, match=match):
        ops.rope_append_kv(**args, check_indices=False)


def test_rope_append_kv_op_empty_batch_needs_no_gpu():
    from specdec_lib import ops
    args = _rak_fakes(T=0)
    got = ops.rope_append_kv(**args, check_indices=False)
    assert got[0] is args["q"] and got[3] is args["v_cache"]


RAK_DTYPES = ["float32", "float16", "bfloat16"]
RAK_TOL = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}


def _rak_device(c, dtype):
    """Device copies (floats in dtype, caches poisoned: 0xFF bytes) of a host case."""
    from specdec_lib import DeviceArray
    from test_layers import _store
    d = {}
    for n, a in c.items():
        if n in ("k_cache", "v_cache"):
            d[n] = poison(a.shape, dtype)
        elif n in ("q", "k", "v"):
            d[n] = DeviceArray.from_numpy(_store(a, dtype), dtype)
        else:
            d[n] = DeviceArray.from_numpy(a)
    return d


def _rak_pair(d, finished):
    """The unfused pair on the device."""
    from specdec_lib import ops
    ops.rope(d["q"], d["k"], d["positions"], d["cos_sin_cache"])
    ops.append_kv(d["k"], d["v"], d["k_cache"], d["v_cache"], d["page_table"], d["seq_lens"],
                  d["cu_q"], finished, check_indices=False)


def _same_bits(a, b, what):
    np.testing.assert_array_equal(np.ascontiguousarray(a.to_numpy()).view(np.uint8),
                                  np.ascontiguousarray(b.to_numpy()).view(np.uint8),
                                  err_msg=what)


@needs_gpu
@pytest.mark.parametrize("dtype", RAK_DTYPES)
@pytest.mark.parametrize("Hq,Hkv,D", [(9, 3, 64), (32, 8, 128), (4, 4, 256), (8, 1, 64),
                                      (2, 1, 6)])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_rope_append_kv_gpu_bit_identical_to_rope_then_append_kv(rng, dtype, Hq, Hkv, D,
                                                                 page_size):
    """Ragged blocks (q = 1, 0, 4, 16, 3, and a 40-row prefill), lengths at page boundaries,
    a finished sequence, a position past the cos/sin table: q, k and both (poisoned) caches
    hold the same bytes as rope then append_kv; k and the cache rows also match the float64
    reference. D = 6 takes the scalar path."""
    from specdec_lib import DeviceArray, ops
    from test_layers import _host
    qs = [1, 0, 4, 16, 3, 40]
    Ls = [0, 3, page_size - 1, page_size, 3 * page_size - 2, 0]
    c = _rak_case(rng, qs, Ls, Hq=Hq, Hkv=Hkv, D=D, page_size=page_size)
    c["positions"][7] = c["cos_sin_cache"].shape[0]            # sequence 3's row 2: NaN heads
    c["positions"][-1] = -1
    fin = np.array([0, 0, 0, 1, 0, 0], np.uint8)
    a, b = _rak_device(c, dtype), _rak_device(c, dtype)
    _rak_pair(a, DeviceArray.from_numpy(fin))
    got = ops.rope_append_kv(*(b[n] for n in _RAK_ARGS), DeviceArray.from_numpy(fin))
    assert got[0] is b["q"] and got[2] is b["k_cache"]
    for n in ("q", "k", "k_cache", "v_cache"):
        _same_bits(a[n], b[n], f"{n} differs from rope + append_kv")
    # and the pair is what the reference says (float64, by relative norm, NaN where flagged)
    from test_layers import _store
    from specdec_lib.dtypes import from_host_storage
    h = {n: (from_host_storage(_store(x, dtype), dtype).astype(np.float64)
             if n in ("q", "k", "v") else x) for n, x in c.items()}
    want = _rak_unfused(h, fin.astype(bool))
    for n in ("q", "k"):
        assert rel_err(_host(b[n], dtype), want[n]) < RAK_TOL[dtype], n
    for n in ("k_cache", "v_cache"):
        got_c = _host(b[n], dtype)
        # poisoned slots stay NaN, as the reference's NaN-filled caches do
        assert rel_err(got_c, want[n]) < RAK_TOL[dtype], n


@needs_gpu
@pytest.mark.parametrize("dtype", RAK_DTYPES)
@pytest.mark.parametrize("offset", [0, 1])
def test_rope_append_kv_gpu_qkv_views(rng, dtype, offset):
    """q, k, v as head views of one fused projection [T, (Hq + 2 Hkv) D + 8] (offset 1:
    unaligned, the scalar path), strided caches (a view of a wider pool): same bytes as the
    unfused pair on the same views, the padding untouched."""
    from specdec_lib import DeviceArray, ops
    from test_draft import _View
    from test_layers import _store
    Hq, Hkv, D, ps = 9, 3, 64, 16
    c = _rak_case(rng, qs=[5, 1, 16, 0, 2], Ls=[0, 15, 31, 4, 100], Hq=Hq, Hkv=Hkv, D=D,
                  page_size=ps)
    T = c["q"].shape[0]
    W = (Hq + 2 * Hkv) * D + 8
    flat = np.concatenate([np.zeros(offset), rng.standard_normal(T * W)])
    n_pages = c["k_cache"].shape[0]
    cw = Hkv * D + D                                          # pool rows one head wider
    outs = []
    for _ in range(2):
        base = DeviceArray.from_numpy(_store(flat, dtype), dtype)
        pool = poison((2, n_pages * ps * cw), dtype)
        q = _View(base, (T, Hq, D), (W, D, 1), offset)
        k = _View(base, (T, Hkv, D), (W, D, 1), offset + Hq * D)
        v = _View(base, (T, Hkv, D), (W, D, 1), offset + (Hq + Hkv) * D)
        kc = _View(pool, (n_pages, ps, Hkv, D), (ps * cw, cw, D, 1), 0)
        vc = _View(pool, (n_pages, ps, Hkv, D), (ps * cw, cw, D, 1), n_pages * ps * cw)
        outs.append((base, pool, dict(c, q=q, k=k, v=v, k_cache=kc, v_cache=vc)))
    (b1, p1, d1), (b2, p2, d2) = outs
    d1 = {n: (DeviceArray.from_numpy(x) if isinstance(x, np.ndarray) else x) for n, x in d1.items()}
    d2 = {n: (DeviceArray.from_numpy(x) if isinstance(x, np.ndarray) else x) for n, x in d2.items()}
    _rak_pair(d1, None)
    ops.rope_append_kv(*(d2[n] for n in _RAK_ARGS), None, check_indices=False)
    _same_bits(b1, b2, "q/k/v buffer")
    _same_bits(p1, p2, "cache pool")
    raw = b2.to_numpy()[offset:].reshape(T, W)
    np.testing.assert_array_equal(raw[:, -8:], _store(flat, dtype)[offset:].reshape(T, W)[:, -8:])


@needs_gpu
@pytest.mark.parametrize("dtype", RAK_DTYPES)
def test_rope_append_kv_gpu_empty_batch(rng, dtype):
    """No rows (T = 0, with sequences or none): nothing written; sequences with no rows
    beside rows of others; B = 0 with rows (check_indices off): rotated as rope, no append."""
    from specdec_lib import ops
    for qs in ([0, 0], [0, 3, 0]):
        c = _rak_case(rng, qs=qs, Ls=[2] * len(qs), Hq=4, Hkv=2, D=64, page_size=4)
        a, b = _rak_device(c, dtype), _rak_device(c, dtype)
        _rak_pair(a, None)
        ops.rope_append_kv(*(b[n] for n in _RAK_ARGS))
        for n in ("q", "k", "k_cache", "v_cache"):
            _same_bits(a[n], b[n], f"{n} (qs={qs})")
    c = _rak_case(rng, qs=[3], Ls=[0], Hq=4, Hkv=2, D=64, page_size=4)
    c.update(page_table=np.zeros((0, 2), np.int32), seq_lens=np.zeros(0, np.int32),
             cu_q=np.zeros(1, np.int32))
    a, b = _rak_device(c, dtype), _rak_device(c, dtype)
    ops.rope(a["q"], a["k"], a["positions"], a["cos_sin_cache"])
    ops.rope_append_kv(*(b[n] for n in _RAK_ARGS), check_indices=False)
    for n in ("q", "k", "k_cache", "v_cache"):
        _same_bits(a[n], b[n], f"{n} (B = 0)")
    assert np.all(b["k_cache"].to_numpy().view(np.uint8) == 0xFF)


@needs_gpu
def test_rope_append_kv_gpu_bad_indices_skip_rows(rng):
    """check_indices off, a page id outside the pool and a length past the page table:
    those rows are rotated but not appended (as append_kv skips them), nothing faults."""
    from specdec_lib import ops
    dtype = "float16"
    c = _rak_case(rng, qs=[2, 3, 2], Ls=[0, 5, 2], Hq=4, Hkv=2, D=64, page_size=4)
    c["page_table"][1, 1] = 10**6
    c["seq_lens"][2] = 4 * c["page_table"].shape[1]
    c["positions"] = np.clip(c["positions"], 0, c["cos_sin_cache"].shape[0] - 1)
    a, b = _rak_device(c, dtype), _rak_device(c, dtype)
    _rak_pair(a, None)
    ops.rope_append_kv(*(b[n] for n in _RAK_ARGS), check_indices=False)
    for n in ("q", "k", "k_cache", "v_cache"):
        _same_bits(a[n], b[n], n)


@needs_gpu
def test_rope_append_kv_gpu_rejects_before_launch(rng):
    """Bad indices with check_indices (the default), a dtype mix: ValueError/TypeError,
    and q, k and the caches untouched."""
    from specdec_lib import DeviceArray, ops
    dtype = "bfloat16"
    c = _rak_case(rng, qs=[2, 2], Ls=[0, 4], page_size=4)
    d = _rak_device(c, dtype)
    keep = {n: d[n].to_numpy().copy() for n in ("q", "k", "k_cache", "v_cache")}
    cases = [
        (dict(seq_lens=DeviceArray.from_numpy(np.array([0, 99], np.int32))), ValueError,
         "page_table"),
        (dict(page_table=DeviceArray.from_numpy(np.full(c["page_table"].shape, 777, np.int32))),
         ValueError, "page id"),
        (dict(cu_q=DeviceArray.from_numpy(np.array([0, 3, 2], np.int32))), ValueError, "cu_q"),
        (dict(v=DeviceArray.from_numpy(c["v"].astype(np.float16))), TypeError, "v"),
        (dict(k_cache=poison(c["k_cache"].shape, "float16"),
              v_cache=poison(c["k_cache"].shape, "float16")), TypeError, "k_cache: dtype"),
        (dict(v_cache=poison(c["k_cache"].shape, "float16")), TypeError, "v_cache: dtype"),
        (dict(cos_sin_cache=DeviceArray.from_numpy(c["cos_sin_cache"].astype(np.float16))),
         TypeError, "cos_sin_cache"),
        (dict(q=c["q"]), TypeError, "q"),
    ]
    for override, exc, match in cases:
        args = dict(d, **override)
        with pytest.raises(exc, match=match):
            ops.rope_append_kv(*(args[n] for n in _RAK_ARGS))
    for n, a in keep.items():
        np.testing.assert_array_equal(d[n].to_numpy(), a, err_msg=f"{n} written before an error")


# ---------------------------------------------------------------- the argument contract (CPU)
from conftest import REFUSAL_PATHS, assert_refused, call_op, on_path, strided_last  # noqa: E402
from conftest import cast as _cast, vals as _vals  # noqa: E402

_VA_ORDER = ("q", "k_cache", "v_cache", "page_table", "seq_lens", "cu_q", "out")
_VA_F16 = {"q": "float16", "k_cache": "float16", "v_cache": "float16", "out": "float16"}


def _va_call(rng):
    c = _case(rng, qs=[2, 3], Ls=[3, 5], Hq=4, Hkv=2, D=64, page_size=4)
    c = {n: (a.astype(np.float32) if a.dtype == np.float64 else a) for n, a in c.items()}
    T = c["q"].shape[0]
    return dict(c, out=np.zeros((T, 4, 64), np.float32), lse_out=np.zeros((T, 4), np.float32))


_VERIFY_ATTENTION_BAD = [
    ("q_float32", ("torch",), lambda a, p: a.update(q=_cast(p, a["q"], "float32")), TypeError, r"^q: dtype"),
    ("out_bf16_for_f16_q", ("torch",), lambda a, p: a.update(out=_cast(p, a["out"], "bfloat16")),
     TypeError, r"^out: dtype"),
    ("page_table_int64", ("torch",), lambda a, p: a.update(page_table=_cast(p, a["page_table"], "int64")),
     TypeError, r"^page_table: dtype"),
    ("seq_lens_float32", REFUSAL_PATHS, lambda a, p: a.update(seq_lens=_cast(p, a["seq_lens"], "float32")),
     TypeError, r"^seq_lens: dtype"),
    ("lse_out_int32", REFUSAL_PATHS, lambda a, p: a.update(lse_out=_cast(p, a["lse_out"], "int32")),
     TypeError, r"^lse_out: dtype"),
    ("q_head_dim_96", REFUSAL_PATHS, lambda a, p: a.update(q=_on(p, np.zeros((5, 4, 96), np.float32)),
                                                           out=_on(p, np.zeros((5, 4, 96), np.float32))),
     ValueError, r"^q: head dim 96"),
    ("q_head_dim_not_contiguous", REFUSAL_PATHS, lambda a, p: a.update(q=strided_last(a["q"])),
     ValueError, r"^q: the head dimension must be contiguous"),
    ("out_wrong_rows", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:4]), ValueError, r"^out: expected shape"),
    ("lse_out_wrong_heads", REFUSAL_PATHS, lambda a, p: a.update(lse_out=a["lse_out"][:, :3]),
     ValueError, r"^lse_out: expected shape"),
    ("query_heads_not_multiple", REFUSAL_PATHS, lambda a, p: a.update(q=a["q"][:, :3], out=a["out"][:, :3],
                                                                       lse_out=a["lse_out"][:, :3]),
     ValueError, r"^q: 3 query heads"),
    ("cu_q_decreasing", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 3, 2])),
     ValueError, r"^cu_q: decreasing"),
    ("cu_q_past_T", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 2, 6])),
     ValueError, r"^cu_q: last offset 6"),
    ("cu_q_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(cu_q=a["cu_q"][:2]), ValueError, r"^cu_q: expected shape"),
    ("seq_lens_negative", REFUSAL_PATHS, lambda a, p: a["seq_lens"].__setitem__(0, -1),
     ValueError, r"^seq_lens: negative"),
    ("page_id_outside_pool", REFUSAL_PATHS, lambda a, p: a["page_table"].__setitem__((1, 0), 99),
     ValueError, r"^page_table: sequence 1 page 0 is 99"),
    ("page_table_too_narrow", REFUSAL_PATHS, lambda a, p: a.update(page_table=a["page_table"][:, :1]),
     ValueError, r"^page_table: sequence 0 needs"),
    ("scale_nan", REFUSAL_PATHS, lambda a, p: a.update(scale=float("nan")), ValueError, r"^scale"),
    ("num_splits_zero", ("torch",), lambda a, p: a.update(num_splits=0), ValueError, r"^num_splits"),
]


def _on(path, a, dtype="float16"):
    return on_path(path, {"a": a}, {"a": dtype})["a"]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _VERIFY_ATTENTION_BAD, ids=[c[0] for c in _VERIFY_ATTENTION_BAD])
def test_verify_attention_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: not a reference-path case (dtypes by kind; no such argument)")
    args = on_path(path, _va_call(rng), _VA_F16)
    mutate(args, path)
    kw = {n: args[n] for n in ("scale", "lse_out", "num_splits") if args.get(n) is not None}
    assert_refused(lambda: call_op(path, "verify_attention", [args[n] for n in _VA_ORDER], kw), exc,
                   match, [args["out"], args["lse_out"]])


_RAK_BF16 = {"q": "bfloat16", "k": "bfloat16", "v": "bfloat16", "k_cache": "bfloat16",
             "v_cache": "bfloat16"}


def _rak_call(rng):
    c = _rak_case(rng, qs=[3, 2], Ls=[1, 6], page_size=4, host=np.float32)
    return {n: (np.zeros_like(a) if n in ("k_cache", "v_cache") else a) for n, a in c.items()}


_ROPE_APPEND_KV_BAD = [
    ("k_float32_for_bf16_q", ("torch",), lambda a, p: a.update(k=_cast(p, a["k"], "float32")),
     TypeError, r"^k: dtype"),
    ("positions_int64", ("torch",), lambda a, p: a.update(positions=_cast(p, a["positions"], "int64")),
     TypeError, r"^positions: dtype"),
    ("cos_sin_cache_float16", ("torch",),
     lambda a, p: a.update(cos_sin_cache=_cast(p, a["cos_sin_cache"], "float16")), TypeError, r"^cos_sin_cache: dtype"),
    ("k_cache_float32_for_bf16_q", ("torch",),
     lambda a, p: a.update(k_cache=_cast(p, a["k_cache"], "float32"), v_cache=_cast(p, a["v_cache"], "float32")),
     TypeError, r"^k_cache: dtype"),
    ("positions_float32", REFUSAL_PATHS, lambda a, p: a.update(positions=_cast(p, a["positions"], "float32")),
     TypeError, r"^positions: dtype"),
    ("positions_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(positions=a["positions"][:4]),
     ValueError, r"^positions: expected shape"),
    ("q_odd_head_dim", REFUSAL_PATHS, lambda a, p: a.update(q=a["q"][..., :63]), ValueError, r"^q: head dim 63"),
    ("q_not_contiguous", REFUSAL_PATHS, lambda a, p: a.update(q=strided_last(a["q"])),
     ValueError, r"^q: the last dimension must be contiguous"),
    ("k_wrong_rows", REFUSAL_PATHS, lambda a, p: a.update(k=a["k"][:4]), ValueError, r"^k: expected shape"),
    ("cos_sin_cache_wrong_width", REFUSAL_PATHS, lambda a, p: a.update(cos_sin_cache=_on(p, np.zeros((9, 32), np.float32), "float32")),
     ValueError, r"^cos_sin_cache: expected shape"),
    ("v_wrong_heads", REFUSAL_PATHS, lambda a, p: a.update(v=a["v"][:, :1]), ValueError, r"^v: expected shape"),
    ("cu_q_decreasing", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 3, 2])),
     ValueError, r"^cu_q: must start at 0, never decrease"),
    ("seq_lens_negative", REFUSAL_PATHS, lambda a, p: a["seq_lens"].__setitem__(0, -1),
     ValueError, r"^seq_lens: negative"),
    ("page_table_too_narrow", REFUSAL_PATHS, lambda a, p: a.update(page_table=a["page_table"][:, :1]),
     ValueError, r"^page_table: sequence 1 writes position"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _ROPE_APPEND_KV_BAD, ids=[c[0] for c in _ROPE_APPEND_KV_BAD])
def test_rope_append_kv_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _rak_call(rng), _RAK_BF16)
    mutate(args, path)
    assert_refused(lambda: call_op(path, "rope_append_kv", [args[n] for n in _RAK_ARGS]), exc, match,
                   [args["q"], args["k"], args["k_cache"], args["v_cache"]])


def _f64(path, a):
    return (a.float().numpy() if path == "torch" else np.asarray(a, np.float64)).copy()


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_attention_good_input_passes_the_contract(path, rng):
    args = on_path(path, _va_call(rng), _VA_F16)
    call_op(path, "verify_attention", [args[n] for n in _VA_ORDER], {"lse_out": args["lse_out"]})
    assert np.isfinite(_f64(path, args["out"])).all() and np.count_nonzero(_f64(path, args["lse_out"]))
    args = on_path(path, _rak_call(rng), _RAK_BF16)
    q0 = _f64(path, args["q"])
    call_op(path, "rope_append_kv", [args[n] for n in _RAK_ARGS])
    assert not np.array_equal(_f64(path, args["q"]), q0)
    assert np.count_nonzero(_f64(path, args["k_cache"])) > 0
