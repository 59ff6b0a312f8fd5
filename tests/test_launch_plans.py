"""Launch plans of every public GPU op, recorded on the CPU and compared with a golden file.

Each case below calls one op of ``specdec_lib.ops`` on fake device arrays inside a
``launch_record.LaunchRecorder`` (fake driver, fake kernels, recording launchers) under two
device profiles (H200: sm_90, 132 SMs; A100: sm_80, 108 SMs). What the op's host code would
launch -- every launcher argument, pointers as ``@array+byte offset`` -- plus its host copies,
kernel attribute calls and return value must equal ``tests/data/launch_plans.json``.

The golden file was generated on the tree the host code was written on; a refactor of the
ops' host side must leave it unchanged. Regenerate (only for an intended change of what is
launched) with::

    SPECDEC_WRITE_LAUNCH_PLANS=1 python -m pytest -q tests/test_launch_plans.py

Only public op signatures are used, so this file, ``launch_record.py`` and the golden can
be copied into another tree of the same API and run there (from that tree's root, so that
its ``specdec_lib`` is the one imported)::

    cp tests/launch_record.py tests/test_launch_plans.py OTHER/tests/
    mkdir -p OTHER/tests/data && cp tests/data/launch_plans.json OTHER/tests/data/
    cd OTHER && python -m pytest -q -p no:cacheprovider tests/test_launch_plans.py
"""
import json
import os
import warnings

import numpy as np
import pytest

import launch_record
from specdec_lib import ops

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "launch_plans.json")
WRITE_ENV = "SPECDEC_WRITE_LAUNCH_PLANS"
PROFILES = ("h200", "a100")

CASES = {}   # id -> (build(rec), env)


def case(name, env=None):
    def deco(fn):
        if name in CASES:
            raise AssertionError(f"case {name} defined twice")
        CASES[name] = (fn, env)
        return fn
    return deco


def many(name, params, env=None):
    """One case per entry of params: name[key] -> fn(rec, **kw)."""
    def deco(fn):
        for key, kw in params.items():
            e = kw.pop("_env", env) if isinstance(kw, dict) else env
            CASES[f"{name}[{key}]"] = ((lambda rec, fn=fn, kw=kw: fn(rec, **kw)), e)
        return fn
    return deco


# ------------------------------------------------------------------ index helpers
def _cu(qs):
    return np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)


def _ragged(B, lo, hi, seed):
    return np.random.default_rng(seed).integers(lo, hi + 1, size=B)


def _paged(rec, qs, L, page_size, max_pages, num_pages, seed=0):
    """cu_q, seq_lens, page_table (valid for L + q) as fake arrays."""
    B = len(qs)
    rng = np.random.default_rng(seed)
    pt = rng.permutation(max(num_pages, B * max_pages))[:B * max_pages] % num_pages
    return (rec.array("cu_q", (B + 1,), "int32", _cu(qs)),
            rec.array("seq_lens", (B,), "int32", np.asarray(L, np.int32)),
            rec.array("page_table", (B, max_pages), "int32", pt.reshape(B, max_pages)))


def _slots(rec, B, num_slots, seed=0, pad=()):
    ids = np.random.default_rng(seed).permutation(num_slots)[:B].astype(np.int32)
    for i in pad:
        ids[i] = -1
    return rec.array("slot_ids", (B,), "int32", ids)


# ------------------------------------------------------------------ copy
@many("copy", {
    "1d_f32": dict(shape=(1000003,), dtype="float32"),
    "2d_bf16": dict(shape=(64, 4096), dtype="bfloat16"),
    "4d_u8": dict(shape=(3, 5, 7, 9), dtype="uint8"),
    "i64": dict(shape=(2, 3), dtype="int64"),
    "empty": dict(shape=(0, 8), dtype="float16"),
    "32M_f32_grid_capped": dict(shape=(1 << 25,), dtype="float32"),
})
def _copy_contig(rec, shape, dtype):
    dst = rec.array("dst", shape, dtype)
    src = rec.array("src", shape, dtype)
    return ops.copy(dst, src)


@case("copy[broadcast_bf16]")
def _copy_bcast(rec):
    dst = rec.array("dst", (64, 4096), "bfloat16")
    src = rec.array("src", (4096,), "bfloat16")
    return ops.copy(dst, src, stream=7)


@case("copy[strided_f16]")
def _copy_strided(rec):
    buf = rec.array("src", (8, 32, 128), "float16")
    src = rec.view(buf, (8, 16, 128), strides=(32 * 128, 256, 1))   # every other head
    dst = rec.array("dst", (8, 16, 128), "float16")
    return ops.copy(dst, src)


@case("copy[transpose_u16]")
def _copy_transpose(rec):
    buf = rec.array("src", (48, 40), "uint16")
    src = rec.view(buf, (40, 48), strides=(1, 40))
    dst = rec.array("dst", (40, 48), "uint16")
    return ops.copy(dst, src)


# ------------------------------------------------------------------ append_kv
def _kv(rec, T, Hkv, D, dtype, num_pages, page_size, fused_hq=None, offset=0):
    """k, v [T, Hkv, D] (views of one qkv buffer when fused_hq is given) and the caches."""
    if fused_hq is None:
        k = rec.array("k", (T, Hkv, D), dtype)
        v = rec.array("v", (T, Hkv, D), dtype)
        q = None
    else:
        W = (fused_hq + 2 * Hkv) * D
        qkv = rec.array("qkv", (T * W + offset,), dtype)
        q = rec.view(qkv, (T, fused_hq, D), strides=(W, D, 1), offset=offset)
        k = rec.view(qkv, (T, Hkv, D), strides=(W, D, 1), offset=offset + fused_hq * D)
        v = rec.view(qkv, (T, Hkv, D), strides=(W, D, 1), offset=offset + (fused_hq + Hkv) * D)
    kc = rec.array("k_cache", (num_pages, page_size, Hkv, D), dtype)
    vc = rec.array("v_cache", (num_pages, page_size, Hkv, D), dtype)
    return q, k, v, kc, vc


@many("append_kv", {
    "B1_bf16": dict(B=1, q=(4, 4), L=(100, 100), Hkv=8, D=128, dtype="bfloat16", ps=16),
    "B64_ragged_f16": dict(B=64, q=(1, 5), L=(0, 900), Hkv=2, D=64, dtype="float16", ps=16,
                           finished=True),
    "B8_f32_D6": dict(B=8, q=(2, 4), L=(3, 60), Hkv=3, D=6, dtype="float32", ps=8),
    "B64_fused_qkv": dict(B=64, q=(4, 4), L=(10, 500), Hkv=8, D=128, dtype="bfloat16", ps=16,
                          fused_hq=32),
    "B4_no_check": dict(B=4, q=(1, 3), L=(5, 40), Hkv=1, D=256, dtype="float16", ps=1,
                        check=False),
    "B2_odd_offset": dict(B=2, q=(3, 3), L=(7, 9), Hkv=4, D=64, dtype="bfloat16", ps=64,
                          fused_hq=8, offset=1),
})
def _append_kv(rec, B, q, L, Hkv, D, dtype, ps, finished=False, fused_hq=None, offset=0,
               check=True):
    qs = _ragged(B, *q, seed=B)
    Ls = _ragged(B, *L, seed=B + 1)
    max_pages = -(-(int(max(Ls + qs))) // ps) + 1
    num_pages = B * max_pages + 3
    T = int(qs.sum())
    _, k, v, kc, vc = _kv(rec, T, Hkv, D, dtype, num_pages, ps, fused_hq, offset)
    cq, sl, pt = _paged(rec, qs, Ls, ps, max_pages, num_pages, seed=B)
    fin = None
    if finished:
        fin = rec.array("finished", (B,), "uint8", (np.arange(B) % 7 == 3).astype(np.uint8))
    return ops.append_kv(k, v, kc, vc, pt, sl, cq, fin, check_indices=check,
                         stream=None if check else 3)


@many("append_kv8", {
    "B64_q4_bf16_fp8": dict(B=64, q=(4, 4), L=(10, 500), Hkv=8, D=128, dtype="bfloat16",
                            ps=16, fmt="fp8"),
    "B128_ragged_f16_int8_grid_capped": dict(B=128, q=(60, 84), L=(0, 50), Hkv=1, D=64,
                                             dtype="float16", ps=64, fmt="int8"),
    "B4_f32_D256_int8": dict(B=4, q=(1, 3), L=(5, 40), Hkv=2, D=256, dtype="float32", ps=8,
                             fmt="int8"),
    "B3_bf16_D34_unvectorised_fp8_per_tensor": dict(B=3, q=(2, 5), L=(0, 9), Hkv=3, D=34,
                                                    dtype="bfloat16", ps=4, fmt="fp8",
                                                    per_tensor=True),
})
def _append_kv8(rec, B, q, L, Hkv, D, dtype, ps, fmt, per_tensor=False):
    """append_kv into 8-bit caches: the grid (capped at the resident CTAs), the kernel per
    format and source dtype, the vectorised flag, the scale stride."""
    qs = _ragged(B, *q, seed=B)
    Ls = _ragged(B, *L, seed=B + 1)
    max_pages = -(-(int(max(Ls + qs))) // ps) + 1
    num_pages = B * max_pages + 3
    T = int(qs.sum())
    k = rec.array("k", (T, Hkv, D), dtype)
    v = rec.array("v", (T, Hkv, D), dtype)
    cdt = "uint8" if fmt == "fp8" else "int8"
    kc = rec.array("k_cache", (num_pages, ps, Hkv, D), cdt)
    vc = rec.array("v_cache", (num_pages, ps, Hkv, D), cdt)
    cq, sl, pt = _paged(rec, qs, Ls, ps, max_pages, num_pages, seed=B)
    if fmt == "fp8":
        n = 1 if per_tensor else Hkv
        kw = dict(k_scale=rec.array("k_scale", (n,), "float32", np.full(n, 0.5, np.float32)),
                  v_scale=rec.array("v_scale", (n,), "float32", np.full(n, 0.25, np.float32)))
    else:
        kw = dict(k_params=rec.array("k_params", (num_pages, ps, Hkv, 2), "float32"),
                  v_params=rec.array("v_params", (num_pages, ps, Hkv, 2), "float32"))
    return ops.append_kv(k, v, kc, vc, pt, sl, cq, check_indices=True, **kw)


# ------------------------------------------------------------------ rope_append_kv
def _cos_sin(rec, max_pos, D):
    return rec.array("cos_sin", (max_pos, D), "float32")


@many("rope_append_kv", {
    "B1_bf16_fused": dict(B=1, q=(4, 4), L=(200, 200), Hq=32, Hkv=8, D=128, dtype="bfloat16",
                          ps=16, fused=True),
    "B64_ragged_f16": dict(B=64, q=(1, 5), L=(0, 700), Hq=9, Hkv=3, D=64, dtype="float16",
                           ps=16, finished=True),
    "B3_f32_D256": dict(B=3, q=(2, 6), L=(1, 30), Hq=4, Hkv=4, D=256, dtype="float32", ps=64),
    "B5_offset1": dict(B=5, q=(1, 4), L=(0, 50), Hq=8, Hkv=1, D=64, dtype="bfloat16", ps=1,
                       fused=True, offset=1, check=False),
})
def _rope_append_kv(rec, B, q, L, Hq, Hkv, D, dtype, ps, fused=False, offset=0,
                    finished=False, check=True):
    qs = _ragged(B, *q, seed=B + 10)
    Ls = _ragged(B, *L, seed=B + 11)
    max_pages = -(-(int(max(Ls + qs))) // ps) + 2
    num_pages = B * max_pages + 1
    T = int(qs.sum())
    qq, k, v, kc, vc = _kv(rec, T, Hkv, D, dtype, num_pages, ps, Hq if fused else None, offset)
    if qq is None:
        qq = rec.array("q", (T, Hq, D), dtype)
    pos = rec.array("positions", (T,), "int32",
                    np.concatenate([np.arange(l, l + n) for l, n in zip(Ls, qs)]))
    cs = _cos_sin(rec, 4096, D)
    cq, sl, pt = _paged(rec, qs, Ls, ps, max_pages, num_pages, seed=B + 12)
    fin = rec.array("finished", (B,), "bool", np.arange(B) % 5 == 1) if finished else None
    return ops.rope_append_kv(qq, k, v, pos, cs, kc, vc, pt, sl, cq, fin, check_indices=check)


# ------------------------------------------------------------------ verify_attention
_VA = {
    "B1_q4_bf16_d128": dict(B=1, q=(4, 4), L=(4000, 4000), Hq=32, Hkv=8, D=128,
                            dtype="bfloat16", ps=16, max_pages=256),
    "B1_q4_bf16_d128_ws_lse": dict(B=1, q=(4, 4), L=(4000, 4000), Hq=32, Hkv=8, D=128,
                                   dtype="bfloat16", ps=16, max_pages=256, ws=True, lse=True),
    "B64_ragged_f16_gqa4": dict(B=64, q=(1, 5), L=(10, 2000), Hq=32, Hkv=8, D=128,
                                dtype="float16", ps=16, max_pages=128, ws=True),
    "B8_gqa3_bf16_ws": dict(B=8, q=(2, 4), L=(100, 8000), Hq=9, Hkv=3, D=64, dtype="bfloat16",
                            ps=64, max_pages=128, ws=True, lse=True),
    "B4_splits4_d64": dict(B=4, q=(1, 4), L=(500, 3000), Hq=8, Hkv=2, D=64, dtype="float16",
                           ps=32, max_pages=100, ws=True, num_splits=4, max_kv_len=3200),
    "B2_q16_row_invariant": dict(B=2, q=(16, 16), L=(300, 1000), Hq=16, Hkv=4, D=128,
                                 dtype="bfloat16", ps=16, max_pages=80, ws=True,
                                 row_invariant=True),
    "B2_q16_default": dict(B=2, q=(16, 16), L=(300, 1000), Hq=16, Hkv=4, D=128,
                           dtype="bfloat16", ps=16, max_pages=80, ws=True),
    "B3_d256_group16": dict(B=3, q=(1, 3), L=(20, 300), Hq=16, Hkv=1, D=256, dtype="float16",
                            ps=1, max_pages=400, ws=True, check=True),
    "B16_max_q_scale": dict(B=16, q=(1, 2), L=(50, 600), Hq=4, Hkv=4, D=64, dtype="float16",
                            ps=8, max_pages=90, ws=True, max_q=2, scale=0.1, check=True,
                            stream=11),
    "B1_q1_long_ws": dict(B=1, q=(1, 1), L=(60000, 60000), Hq=32, Hkv=8, D=128,
                          dtype="bfloat16", ps=16, max_pages=4096, ws=True),
    "B1_q1_no_ws": dict(B=1, q=(1, 1), L=(30000, 30000), Hq=8, Hkv=1, D=128, dtype="float16",
                        ps=256, max_pages=128),
    # issue 31's one-launch path (sm_90: a cluster of KV splits per head group; A100: split-KV)
    "B1_q4_L512_cluster_ws_lse": dict(B=1, q=(4, 4), L=(512, 512), Hq=32, Hkv=8, D=128,
                                      dtype="bfloat16", ps=16, max_pages=33, ws=True, lse=True),
    "B1_q4_L1000_d256_cluster_no_ws": dict(B=1, q=(4, 4), L=(1000, 1000), Hq=16, Hkv=2, D=256,
                                           dtype="bfloat16", ps=16, max_pages=63),
    "B1_q4_L512_cluster_off_env": dict(B=1, q=(4, 4), L=(512, 512), Hq=32, Hkv=8, D=128,
                                       dtype="bfloat16", ps=16, max_pages=33, ws=True,
                                       _env={"SPECDEC_VERIFY_ATTN_CLUSTER": "0"}),
    # forced at a batch that fills the GPU: a cluster would be one CTA -> the split-KV kernel
    "B64_cluster_forced_env": dict(B=64, q=(1, 5), L=(10, 500), Hq=32, Hkv=8, D=128,
                                   dtype="float16", ps=16, max_pages=40, ws=True,
                                   _env={"SPECDEC_VERIFY_ATTN_CLUSTER": "1"}),
    "B1_L4096_cluster_forced_env": dict(B=1, q=(4, 4), L=(4092, 4092), Hq=9, Hkv=3, D=64,
                                        dtype="float16", ps=16, max_pages=256, ws=True,
                                        _env={"SPECDEC_VERIFY_ATTN_CLUSTER": "1"}),
    "B1_cluster_forced_splits_env": dict(B=1, q=(4, 4), L=(512, 512), Hq=32, Hkv=8, D=128,
                                         dtype="bfloat16", ps=16, max_pages=33, ws=True,
                                         num_splits=3, _env={"SPECDEC_VERIFY_ATTN_CLUSTER": "1"}),
}


@many("verify_attention", _VA)
def _verify_attention(rec, B, q, L, Hq, Hkv, D, dtype, ps, max_pages, ws=False, lse=False,
                      num_splits=None, max_kv_len=None, max_q=None, row_invariant=False,
                      scale=None, check=None, stream=None):
    qs = _ragged(B, *q, seed=B + 20)
    Ls = _ragged(B, *L, seed=B + 21)
    Ls = np.minimum(Ls, max_pages * ps - qs)
    num_pages = min(B * max_pages, 50000) + 5
    T = int(qs.sum())
    qa = rec.array("q", (T, Hq, D), dtype)
    _, _, _, kc, vc = _kv(rec, 0, Hkv, D, dtype, num_pages, ps)
    cq, sl, pt = _paged(rec, qs, Ls, ps, max_pages, num_pages, seed=B + 22)
    out = rec.array("out", (T, Hq, D), dtype)
    lse_out = rec.array("lse", (T, Hq), "float32") if lse else None
    kw = {}
    if ws:
        n = ops.verify_attention_workspace_size(
            T, Hq, Hkv, D, B, max_kv_len if max_kv_len is not None else max_pages * ps,
            max_q=max_q, num_splits=num_splits, row_invariant=row_invariant)
        kw["workspace"] = rec.array("workspace", (max(n, 1),), "uint8")
    for name, val in (("num_splits", num_splits), ("max_kv_len", max_kv_len), ("max_q", max_q),
                      ("check_indices", check), ("stream", stream)):
        if val is not None:
            kw[name] = val
    if row_invariant:
        kw["row_invariant"] = True
    return ops.verify_attention(qa, kc, vc, pt, sl, cq, out, scale, lse_out, **kw)


# ------------------------------------------------------------------ gdn
def _gdn_inputs(rec, B, q, Hk, Hv, Dk, Dv, dtype, sdt, layout, slots, seed, gating="g",
                status=False, pad=()):
    qs = _ragged(B, *q, seed=seed)
    T = int(qs.sum())
    shape = (slots, Hv, Dk, Dv) if layout == "kv" else (slots, Hv, Dv, Dk)
    st = rec.array("state", shape, sdt)
    qa = rec.array("q", (T, Hk, Dk), dtype)
    ka = rec.array("k", (T, Hk, Dk), dtype)
    va = rec.array("v", (T, Hv, Dv), dtype)
    out = rec.array("out", (T, Hv, Dv), dtype)
    W = ops.gdn_journal_width(Hk, Hv, Dk, Dv)
    jn = rec.array("journal", (T, W), "float32")
    gate = {}
    if gating == "g":
        gate["g"] = rec.array("g", (T, Hv), "float32")
        gate["beta"] = rec.array("beta", (T, Hv), dtype)
    else:
        gate["a"] = rec.array("a", (T, Hv), dtype)
        gate["b"] = rec.array("b", (T, Hv), dtype)
        gate["A_log"] = rec.array("A_log", (Hv,), "float32")
        gate["dt_bias"] = rec.array("dt_bias", (Hv,), dtype)
    sl = _slots(rec, B, slots, seed, pad)
    cq = rec.array("cu_q", (B + 1,), "int32", _cu(qs))
    sa = rec.array("status", (B,), "int32") if status else None
    return qs, T, W, st, qa, ka, va, out, jn, gate, sl, cq, sa


_GDN = {
    "B1_bf16_kv_g_l2": dict(B=1, q=(4, 4), Hk=16, Hv=32, Dk=128, Dv=128, dtype="bfloat16",
                            sdt="bfloat16", layout="kv", slots=4, l2=True),
    "B64_f32_vk_fused_gate": dict(B=64, q=(1, 5), Hk=16, Hv=32, Dk=128, Dv=128,
                                  dtype="bfloat16", sdt="float32", layout="vk", slots=70,
                                  gating="ab", l2=True, status=True),
    "B64_bf16_vk": dict(B=64, q=(4, 4), Hk=16, Hv=32, Dk=128, Dv=128, dtype="bfloat16",
                        sdt="bfloat16", layout="vk", slots=64, gating="ab"),
    "B8_f16_kv_d64": dict(B=8, q=(1, 3), Hk=4, Hv=8, Dk=64, Dv=64, dtype="float16",
                          sdt="float16", layout="kv", slots=12, pad=(2,)),
    "B3_f32_kv_d64_dv32": dict(B=3, q=(2, 2), Hk=2, Hv=4, Dk=64, Dv=32, dtype="float32",
                               sdt="float32", layout="kv", slots=3, scale=0.2),
    "B8_bf16_kv_fill_edge": dict(B=8, q=(4, 4), Hk=16, Hv=32, Dk=128, Dv=128,
                                 dtype="bfloat16", sdt="bfloat16", layout="kv", slots=8),
    "B64_f32_kv": dict(B=64, q=(3, 3), Hk=16, Hv=32, Dk=128, Dv=128, dtype="float32",
                       sdt="float32", layout="kv", slots=64, check=False),
    "B2_bf16_vk_mma_env": dict(B=2, q=(4, 4), Hk=2, Hv=4, Dk=128, Dv=256, dtype="bfloat16",
                               sdt="bfloat16", layout="vk", slots=2,
                               _env={"SPECDEC_GDN_MMA": "1"}),
    "B2_bf16_kv_nomma_env": dict(B=2, q=(4, 4), Hk=2, Hv=4, Dk=128, Dv=256, dtype="bfloat16",
                                 sdt="bfloat16", layout="kv", slots=2,
                                 _env={"SPECDEC_GDN_MMA": "0"}),
    # issue 31's batch-1 shape (the small-batch kernels) and B=3, just above their threshold
    "B1_f32_kv_small": dict(B=1, q=(4, 4), Hk=16, Hv=32, Dk=128, Dv=128, dtype="bfloat16",
                            sdt="float32", layout="kv", slots=2, gating="ab", l2=True),
    "B3_f32_kv_above_small": dict(B=3, q=(4, 4), Hk=16, Hv=32, Dk=128, Dv=128, dtype="bfloat16",
                                  sdt="float32", layout="kv", slots=3, gating="ab", l2=True),
}


@many("gdn_verify", _GDN)
def _gdn_verify(rec, B, q, Hk, Hv, Dk, Dv, dtype, sdt, layout, slots, gating="g", l2=False,
                status=False, pad=(), scale=None, check=True):
    _, T, W, st, qa, ka, va, out, jn, gate, sl, cq, sa = _gdn_inputs(
        rec, B, q, Hk, Hv, Dk, Dv, dtype, sdt, layout, slots, seed=B + 30, gating=gating,
        status=status, pad=pad)
    return ops.gdn_verify(qa, ka, va, st, sl, cq, out, jn, qk_l2norm=l2, layout=layout,
                          status=sa, scale=scale, check_indices=check, **gate)


_GDN_FUSED = {
    "B1_bf16_kv": dict(B=1, q=(4, 4), Hk=16, Hv=32, Dk=128, Dv=128, dtype="bfloat16",
                       sdt="bfloat16", layout="kv", slots=4),
    "B64_f32_vk": dict(B=64, q=(1, 5), Hk=16, Hv=32, Dk=128, Dv=128, dtype="bfloat16",
                       sdt="float32", layout="vk", slots=64, gating="ab", status=True),
    "B64_f16_kv_d64": dict(B=64, q=(2, 4), Hk=8, Hv=16, Dk=64, Dv=128, dtype="float16",
                           sdt="float16", layout="kv", slots=80),
    "B6_f32_kv_strided_pending": dict(B=6, q=(1, 4), Hk=2, Hv=4, Dk=128, Dv=64,
                                      dtype="float32", sdt="float32", layout="kv", slots=6,
                                      strided=True),
    "B1_f32_kv_small": dict(B=1, q=(4, 4), Hk=16, Hv=32, Dk=128, Dv=128, dtype="bfloat16",
                            sdt="float32", layout="kv", slots=2, gating="ab"),
}


def _pending(rec, B, W, rows, seed, strided=False, dtype="float32"):
    rng = np.random.default_rng(seed)
    n = rng.integers(0, 4, size=B).astype(np.int32)
    r0 = np.minimum(rng.integers(0, rows, size=B), rows - n).astype(np.int32)
    if strided:
        buf = rec.array("pending_journal", (rows, W + 8), dtype)
        pj = rec.view(buf, (rows, W), strides=(W + 8, 1))
    else:
        pj = rec.array("pending_journal", (rows, W), dtype)
    return (pj, rec.array("pending_row0", (B,), "int32", r0),
            rec.array("pending_len", (B,), "int32", n))


@many("gdn_verify_fused", _GDN_FUSED)
def _gdn_verify_fused(rec, B, q, Hk, Hv, Dk, Dv, dtype, sdt, layout, slots, gating="g",
                      status=False, strided=False):
    _, T, W, st, qa, ka, va, out, jn, gate, sl, cq, sa = _gdn_inputs(
        rec, B, q, Hk, Hv, Dk, Dv, dtype, sdt, layout, slots, seed=B + 40, gating=gating,
        status=status)
    pj, pr, pn = _pending(rec, B, W, 4 * B, seed=B + 41, strided=strided)
    return ops.gdn_verify(qa, ka, va, st, sl, cq, out, jn, qk_l2norm=True, layout=layout,
                          status=sa, pending_journal=pj, pending_row0=pr, pending_len=pn,
                          **gate)


_GDN_COMMIT = {
    "B1_bf16_kv": dict(B=1, q=(4, 4), Hk=16, Hv=32, Dk=128, Dv=128, sdt="bfloat16",
                       layout="kv", slots=4),
    "B64_f32_vk": dict(B=64, q=(1, 5), Hk=16, Hv=32, Dk=128, Dv=128, sdt="float32",
                       layout="vk", slots=64, status=True),
    "B64_f32_kv": dict(B=64, q=(1, 5), Hk=16, Hv=32, Dk=128, Dv=128, sdt="float32",
                       layout="kv", slots=64),
    "B64_f32_vk_d64": dict(B=64, q=(4, 4), Hk=8, Hv=16, Dk=64, Dv=128, sdt="float32",
                           layout="vk", slots=64),
    "B8_f16_vk_d64": dict(B=8, q=(1, 3), Hk=4, Hv=8, Dk=64, Dv=64, sdt="float16",
                          layout="vk", slots=8, pad=(0, 5)),
    "B1_f32_kv_small": dict(B=1, q=(4, 4), Hk=16, Hv=32, Dk=128, Dv=128, sdt="float32",
                            layout="kv", slots=2),
}


@many("gdn_commit", _GDN_COMMIT)
def _gdn_commit(rec, B, q, Hk, Hv, Dk, Dv, sdt, layout, slots, status=False, pad=()):
    qs, T, W, st, _, _, _, _, jn, _, sl, cq, sa = _gdn_inputs(
        rec, B, q, Hk, Hv, Dk, Dv, "float32", sdt, layout, slots, seed=B + 50, status=status,
        pad=pad)
    acc = np.minimum(_ragged(B, 0, 5, seed=B + 51), qs).astype(np.int32)
    al = rec.array("accept_len", (B,), "int32", acc)
    return ops.gdn_commit(st, sl, cq, al, jn, layout=layout, status=sa)


@many("gdn_flush", {
    "B3_bf16_kv": dict(B=3, Hk=16, Hv=32, Dk=128, Dv=128, sdt="bfloat16", layout="kv",
                       slots=8),
    "B64_f32_vk": dict(B=64, Hk=16, Hv=32, Dk=128, Dv=128, sdt="float32", layout="vk",
                       slots=64, status=True),
    "B5_f16_kv_d64": dict(B=5, Hk=2, Hv=4, Dk=64, Dv=64, sdt="float16", layout="kv",
                          slots=5, pad=(1,)),
})
def _gdn_flush(rec, B, Hk, Hv, Dk, Dv, sdt, layout, slots, status=False, pad=()):
    shape = (slots, Hv, Dk, Dv) if layout == "kv" else (slots, Hv, Dv, Dk)
    st = rec.array("state", shape, sdt)
    sl = _slots(rec, B, slots, seed=B + 60, pad=pad)
    W = ops.gdn_journal_width(Hk, Hv, Dk, Dv)
    pj, pr, pn = _pending(rec, B, W, 4 * B, seed=B + 61)
    sa = rec.array("status", (B,), "int32") if status else None
    return ops.gdn_flush(st, sl, pj, pr, pn, layout=layout, status=sa)


# ------------------------------------------------------------------ conv1d
_CONV = {
    "B1_bf16_W4": dict(B=1, q=(4, 4), dim=8192, W=4, xdt="bfloat16", wdt="bfloat16",
                       sdt="bfloat16", slots=2, bias=True, journal=True),
    "B64_f32_bf16state": dict(B=64, q=(1, 5), dim=4096, W=4, xdt="float32", wdt="float32",
                              sdt="bfloat16", slots=64, status=True),
    "B8_f16_W8_torch_weight": dict(B=8, q=(2, 3), dim=300, W=8, xdt="float16",
                                   wdt="float16", sdt="float16", slots=9, torch_w=True,
                                   act=None, pad=(3,)),
    "B2_W2_strided_x": dict(B=2, q=(1, 2), dim=256, W=2, xdt="bfloat16", wdt="float32",
                            sdt="float32", slots=2, strided=True, check=False),
    # the W = 4 kernels (ops.conv.verify_kernel): forced off, a weight dtype they do not cover,
    # a journal in x's dtype
    "B1_bf16_W4_generic_env": dict(B=1, q=(4, 4), dim=8192, W=4, xdt="bfloat16", wdt="bfloat16",
                                   sdt="bfloat16", slots=2, bias=True, journal=True,
                                   _env={"SPECDEC_CONV_GENERIC": "1"}),
    "B1_W4_f32_weight_generic": dict(B=1, q=(4, 4), dim=8192, W=4, xdt="bfloat16",
                                     wdt="float32", sdt="bfloat16", slots=2),
    "B4_W4_f32_x_bf16state_f32_journal": dict(B=4, q=(1, 4), dim=300, W=4, xdt="float32",
                                              wdt="float32", sdt="bfloat16", slots=5,
                                              journal=True, jdt="float32"),
}


def _conv_inputs(rec, B, q, dim, W, xdt, sdt, slots, seed, strided=False, status=False,
                 pad=()):
    qs = _ragged(B, *q, seed=seed)
    T = int(qs.sum())
    if strided:
        buf = rec.array("x", (T, 3 * dim), xdt)
        x = rec.view(buf, (T, dim), strides=(3 * dim, 1), offset=dim)
    else:
        x = rec.array("x", (T, dim), xdt)
    cs = rec.array("conv_state", (slots, dim, W - 1), sdt)
    sl = _slots(rec, B, slots, seed, pad)
    cq = rec.array("cu_q", (B + 1,), "int32", _cu(qs))
    sa = rec.array("status", (B,), "int32") if status else None
    return qs, T, x, cs, sl, cq, sa


@many("conv1d_verify", _CONV)
def _conv_verify(rec, B, q, dim, W, xdt, wdt, sdt, slots, bias=False, journal=False,
                 status=False, torch_w=False, act="silu", pad=(), strided=False, check=True,
                 jdt=None):
    _, T, x, cs, sl, cq, sa = _conv_inputs(rec, B, q, dim, W, xdt, sdt, slots, B + 70,
                                           strided, status, pad)
    w = rec.array("weight", (dim, 1, W) if torch_w else (dim, W), wdt)
    b = rec.array("bias", (dim,), wdt) if bias else None
    out = rec.array("out", (T, dim), xdt)
    jn = rec.array("journal", (T, dim), jdt or sdt) if journal else None
    return ops.conv1d_verify(x, w, cs, sl, cq, out, bias=b, activation=act, journal=jn,
                             status=sa, check_indices=check)


# fused mode (pending rows: one row lane, CTAs of ops.conv._fused_threads) and conv1d_flush
@many("conv1d_verify_fused", {
    "B1_bf16_W4": dict(B=1, q=(4, 4), dim=8192, W=4, xdt="bfloat16", sdt="bfloat16", slots=2,
                       pdt="bfloat16"),
    "B2_bf16_W4_journal": dict(B=2, q=(1, 4), dim=8192, W=4, xdt="bfloat16", sdt="bfloat16",
                               slots=3, pdt="bfloat16", journal=True),
    "B64_f32_bf16state": dict(B=64, q=(1, 5), dim=4096, W=4, xdt="float32", sdt="bfloat16",
                              slots=64, pdt="float32", status=True),
    "B1_bf16_f32state_generic": dict(B=1, q=(4, 4), dim=8192, W=4, xdt="bfloat16",
                                     sdt="float32", slots=2, pdt="float16"),
    "B3_W3_strided": dict(B=3, q=(2, 3), dim=300, W=3, xdt="float16", sdt="float16", slots=4,
                          pdt="float16", strided=True, pad=(1,)),
})
def _conv_verify_fused(rec, B, q, dim, W, xdt, sdt, slots, pdt, journal=False, status=False,
                       strided=False, pad=()):
    _, T, x, cs, sl, cq, sa = _conv_inputs(rec, B, q, dim, W, xdt, sdt, slots, B + 90,
                                           False, status, pad)
    w = rec.array("weight", (dim, W), xdt)
    out = rec.array("out", (T, dim), xdt)
    jn = rec.array("journal", (T, dim), pdt) if journal else None
    pj, pr, pn = _pending(rec, B, dim, 4 * B, seed=B + 91, strided=strided, dtype=pdt)
    return ops.conv1d_verify(x, w, cs, sl, cq, out, journal=jn, status=sa, pending_journal=pj,
                             pending_row0=pr, pending_len=pn)


@many("conv1d_flush", {
    "B1_bf16_W4": dict(B=1, dim=8192, W=4, pdt="bfloat16", sdt="bfloat16", slots=2),
    "B5_f32_into_bf16_W3": dict(B=5, dim=1000, W=3, pdt="float32", sdt="bfloat16", slots=6,
                                status=True, pad=(2,)),
})
def _conv_flush(rec, B, dim, W, pdt, sdt, slots, status=False, pad=()):
    cs = rec.array("conv_state", (slots, dim, W - 1), sdt)
    sl = _slots(rec, B, slots, B + 95, pad)
    sa = rec.array("status", (B,), "int32") if status else None
    pj, pr, pn = _pending(rec, B, dim, 4 * B, seed=B + 96, dtype=pdt)
    return ops.conv1d_flush(cs, sl, pj, pr, pn, status=sa)


@many("conv1d_commit", {
    "B1_bf16_W4": dict(B=1, q=(4, 4), dim=8192, W=4, xdt="bfloat16", sdt="bfloat16", slots=2),
    "B64_f32_into_bf16": dict(B=64, q=(1, 5), dim=4096, W=4, xdt="float32", sdt="bfloat16",
                              slots=64, status=True),
    "B3_strided_W8": dict(B=3, q=(2, 3), dim=100, W=8, xdt="float16", sdt="float32", slots=3,
                          strided=True),
    "B1_bf16_W4_generic_env": dict(B=1, q=(4, 4), dim=8192, W=4, xdt="bfloat16", sdt="bfloat16",
                                   slots=2, _env={"SPECDEC_CONV_GENERIC": "1"}),
})
def _conv_commit(rec, B, q, dim, W, xdt, sdt, slots, status=False, strided=False):
    qs, T, x, cs, sl, cq, sa = _conv_inputs(rec, B, q, dim, W, xdt, sdt, slots, B + 80,
                                            strided, status)
    acc = np.minimum(_ragged(B, 0, 5, seed=B + 81), qs).astype(np.int32)
    al = rec.array("accept_len", (B,), "int32", acc)
    return ops.conv1d_commit(cs, sl, cq, al, x, status=sa)


# ------------------------------------------------------------------ spec_sample
_SS = {
    "B1_k3_bf16_onehot": dict(B=1, k=3, V=151936, dtype="bfloat16"),
    "B1_k3_f16_onehot_nofilters": dict(B=1, k=3, V=151936, dtype="float16", filters=False),
    "B64_k3_f32_onehot": dict(B=64, k=3, V=151936, dtype="float32", logprobs=True),
    "B64_k3_bf16_onehot": dict(B=64, k=3, V=151936, dtype="bfloat16"),
    "B64_k3_bf16_rows_env": dict(B=64, k=3, V=151936, dtype="bfloat16",
                                 _env={"SPECDEC_SPEC_SAMPLE_PATH": "rows"}),
    "B4_bf16_tiles_env": dict(B=4, k=2, V=32000, dtype="bfloat16",
                              _env={"SPECDEC_SPEC_SAMPLE_PATH": "tiles"}),
    "B4_f16_pdl_off": dict(B=4, k=3, V=50000, dtype="float16", _env={"SPECDEC_PDL": "0"}),
    "B2_bf16_cluster16_env": dict(B=2, k=4, V=300000, dtype="bfloat16",
                                  _env={"SPECDEC_SPEC_SAMPLE_CLUSTER": "16",
                                        "SPECDEC_SPEC_SAMPLE_PATH": "rows"}),
    # B=1 on the rows path (the automatic choice there is the small path)
    "B1_k3_bf16_rows_env": dict(B=1, k=3, V=151936, dtype="bfloat16",
                                _env={"SPECDEC_SPEC_SAMPLE_PATH": "rows"}),
    # the small path forced where it does not fit one wave: the rows path
    "B16_bf16_small_env_too_big": dict(B=16, k=3, V=151936, dtype="bfloat16",
                                       _env={"SPECDEC_SPEC_SAMPLE_PATH": "small"}),
    "B16_f16_draft_probs": dict(B=16, k=(0, 5), V=32000, dtype="float16", probs=True,
                                logprobs=True),
    "B8_bf16_d2t": dict(B=8, k=(1, 4), V=128256, dtype="bfloat16", probs=True, Vd=32000),
    "B3_f32_d2t_strided_logits": dict(B=3, k=(2, 2), V=5003, dtype="float32", probs=True,
                                      Vd=1000, strided=True, filters=True),
    "B64_f32_draft_probs_nofilters": dict(B=64, k=(3, 3), V=151936, dtype="float32",
                                          probs=True, filters=False, stream=5),
    "B5_V7": dict(B=5, k=(0, 2), V=7, dtype="float32"),
    "B3_bf16_V600000_tiles": dict(B=3, k=3, V=600000, dtype="bfloat16"),
}


@many("spec_sample", _SS)
def _spec_sample(rec, B, k, V, dtype, probs=False, Vd=None, logprobs=False, filters=None,
                 strided=False, stream=None):
    ks = _ragged(B, *(k if isinstance(k, tuple) else (k, k)), seed=B + 90)
    qs = ks + 1
    T = int(qs.sum())
    if strided:
        buf = rec.array("logits", (T, V + 13), dtype)
        lg = rec.view(buf, (T, V), strides=(V + 13, 1))
    else:
        lg = rec.array("logits", (T, V), dtype)
    cq = rec.array("cu_q", (B + 1,), "int32", _cu(qs))
    Vd = Vd or V
    di = rec.array("draft_ids", (T - B,), "int32")
    tp = rec.array("temperature", (B,), "float32", 0.7)
    tk = rec.array("top_k", (B,), "int32", 50)
    pp = rec.array("top_p", (B,), "float32", 0.9)
    mp = rec.array("min_p", (B,), "float32", 0.0)
    sd = rec.array("seed", (B,), "uint64", 1234)
    sp = rec.array("step", (B,), "int64", 0)
    W = int(qs.max())
    na = rec.array("num_accepted", (B,), "int32")
    em = rec.array("emitted", (B, W), "int32")
    ss = rec.array("status", (B,), "int32")
    dp = rec.array("draft_probs", (T - B, Vd), "float32") if probs else None
    dm = rec.array("d2t", (Vd,), "int32", np.arange(Vd) * 3) if Vd != V else None
    lp = rec.array("logprobs", (B, W), "float32") if logprobs else None
    ws = rec.array("workspace", (ops.spec_sample_workspace_size(T, V),), "uint8")
    kw = {"workspace": ws, "filters": filters}
    if stream is not None:
        kw["stream"] = stream
    return ops.spec_sample(lg, cq, di, tp, tk, pp, mp, sd, sp, na, em, ss, dp, dm, lp, **kw)


# ------------------------------------------------------------------ sequence
@many("seq_stop", {
    "B1_plain": dict(B=1, W=4, C=2048),
    "B64_stops": dict(B=64, W=5, C=4096, S=4, NS=2, M=3),
    "B200_ids_only": dict(B=200, W=2, C=100, S=1),
})
def _seq_stop(rec, B, W, C, S=0, NS=0, M=0):
    em = rec.array("emitted", (B, W), "int32")
    na = rec.array("num_accepted", (B,), "int32")
    ot = rec.array("out_tokens", (B, C), "int32")
    ol = rec.array("out_lens", (B,), "int32")
    si = rec.array("stop_ids", (B, S), "int32") if S else None
    sq = rec.array("stop_seqs", (B, NS, M), "int32") if NS else None
    mn = rec.array("max_new_tokens", (B,), "int32")
    al = rec.array("accept_len", (B,), "int32")
    fin = rec.array("finished", (B,), "uint8")
    return ops.seq_stop(em, na, ot, ol, si, sq, mn, al, fin)


@many("seq_advance", {"B1": dict(B=1, W=4, C=2048), "B64": dict(B=64, W=5, C=4096),
                      "B129": dict(B=129, W=9, C=64)})
def _seq_advance(rec, B, W, C):
    em = rec.array("emitted", (B, W), "int32")
    al = rec.array("accept_len", (B,), "int32")
    sl = rec.array("seq_lens", (B,), "int32")
    ot = rec.array("out_tokens", (B, C), "int32")
    ol = rec.array("out_lens", (B,), "int32")
    lt = rec.array("last_token", (B,), "int32")
    fin = rec.array("finished", (B,), "uint8")
    return ops.seq_advance(em, al, sl, ot, ol, lt, fin, stream=9)


@many("seq_build_block", {"B1_K3": dict(B=1, K=3), "B64_K4_ids": dict(B=64, K=4, ids=True),
                          "B0": dict(B=0, K=2), "B300_K1_spare": dict(B=300, K=1, spare=17)})
def _seq_build_block(rec, B, K, ids=False, spare=0):
    lt = rec.array("last_token", (B,), "int32")
    dt = rec.array("draft_tokens", (B, K), "int32")
    nd = rec.array("num_draft", (B,), "int32")
    sl = rec.array("seq_lens", (B,), "int32")
    cq = rec.array("cu_q", (B + 1,), "int32")
    bt = rec.array("block_tokens", (B * (K + 1) + spare,), "int32")
    ps = rec.array("positions", (B * (K + 1) + spare,), "int32")
    di = rec.array("draft_ids", (B * K,), "int32") if ids else None
    return ops.seq_build_block(lt, dt, nd, sl, cq, bt, ps, di)


# ------------------------------------------------------------------ draft
@many("draft_carry", {
    "B1_bf16": dict(B=1, T=4, H=4096, dtype="bfloat16"),
    "B64_f16": dict(B=64, T=256, H=2048, dtype="float16"),
    "B5_u8_odd": dict(B=5, T=17, H=129, dtype="uint8"),
    "B8_shard": dict(B=8, T=20, H=1024, dtype="float32", H_out=4096, row_begin=12,
                     col_begin=1024),
    "B3_f32_col_odd": dict(B=3, T=9, H=100, dtype="float32", H_out=301, col_begin=3),
    "B0": dict(B=0, T=4, H=64, dtype="float32"),
})
def _draft_carry(rec, B, T, H, dtype, H_out=None, row_begin=0, col_begin=0):
    h = rec.array("hidden", (T, H), dtype)
    qs = np.full(B, T // max(B, 1))
    cq = rec.array("cu_q", (B + 1,), "int32", _cu(qs))
    al = rec.array("accept_len", (B,), "int32", 1)
    o = rec.array("out", (B, H_out or H), dtype)
    return ops.draft_carry(h, cq, al, o, row_begin=row_begin, col_begin=col_begin)


@many("capture_hidden", {
    "T4_bf16_tap1_res": dict(T=4, H=4096, taps=3, tap=1, dtype="bfloat16", residual=True),
    "T256_f16_tap0": dict(T=256, H=2048, taps=3, tap=0, dtype="float16"),
    "T7_f32_odd": dict(T=7, H=129, taps=2, tap=1, dtype="float32", residual=True),
    "T300_bf16_strided": dict(T=300, H=4096, taps=3, tap=2, dtype="bfloat16", strided=True),
    "T0": dict(T=0, H=32, taps=1, tap=0, dtype="float32"),
})
def _capture_hidden(rec, T, H, taps, tap, dtype, residual=False, strided=False):
    if strided:
        buf = rec.array("hidden", (T, H + 8), dtype)
        h = rec.view(buf, (T, H), strides=(H + 8, 1))
    else:
        h = rec.array("hidden", (T, H), dtype)
    o = rec.array("out", (T, taps * H), dtype)
    r = rec.array("residual", (T, H), dtype) if residual else None
    return ops.capture_hidden(h, o, tap, residual=r)


@many("draft_combine", {
    "rows1_bf16_wf32_gather64": dict(rows=1, H=4096, dtype="bfloat16", wdt="float32",
                                     gather="int64", V=32000),
    "rows64_f16": dict(rows=64, H=2048, dtype="float16", wdt="float16", unit_offset=True),
    "rows5_f32_H130": dict(rows=5, H=130, dtype="float32", wdt="float32", eps=1e-5),
    "rows3_bf16_H129_gather32": dict(rows=3, H=129, dtype="bfloat16", wdt="bfloat16",
                                     gather="int32", V=1000),
    "rows0": dict(rows=0, H=128, dtype="float32", wdt="float32"),
})
def _draft_combine(rec, rows, H, dtype, wdt, gather=None, V=None, unit_offset=False, eps=1e-6):
    em = rec.array("embed", (V if gather else rows, H), dtype)
    hd = rec.array("hidden", (rows, H), dtype)
    we = rec.array("w_embed", (H,), wdt)
    wh = rec.array("w_hidden", (H,), wdt)
    o = rec.array("out", (rows, 2 * H), dtype)
    ids = rec.array("token_ids", (rows,), gather) if gather else None
    return ops.draft_combine(em, hd, we, wh, o, token_ids=ids, eps=eps, unit_offset=unit_offset)


@many("draft_map_tokens", {
    "N256_i64_i32": dict(N=256, idt="int64", mdt="int32", Vd=32000),
    "N100000_i32_i64_abs": dict(N=100000, idt="int32", mdt="int64", Vd=32000, offsets=False),
    "N1000000": dict(N=1000000, idt="int32", mdt="int32", Vd=32000),
    "N3": dict(N=3, idt="int32", mdt="int32", Vd=10),
    "N0": dict(N=0, idt="int32", mdt="int32", Vd=10),
})
def _draft_map_tokens(rec, N, idt, mdt, Vd, offsets=True):
    di = rec.array("draft_ids", (N,), idt)
    m = rec.array("d2t", (Vd,), mdt)
    o = rec.array("out", (N,), "int32")
    return ops.draft_map_tokens(di, m, o, offsets=offsets)


@many("ngram_propose", {
    "B1_K4": dict(B=1, P=512, O=256, K=4),
    "B64_K3_n2_4": dict(B=64, P=2048, O=1024, K=3, min_n=2, max_n=4),
    "B5_strided_odd": dict(B=5, P=37, O=11, K=7, strided=True, max_n=32),
    "B3_no_check": dict(B=3, P=100, O=1, K=64, check=False),
})
def _ngram_propose(rec, B, P, O, K, min_n=1, max_n=3, strided=False, check=True):
    rng = np.random.default_rng(B + 100)
    if strided:
        buf = rec.array("prompt", (B, P + 3), "int32")
        pr = rec.view(buf, (B, P), strides=(P + 3, 1), offset=1)
    else:
        pr = rec.array("prompt", (B, P), "int32")
    pl = rec.array("prompt_lens", (B,), "int32", rng.integers(0, P + 1, size=B))
    ou = rec.array("output", (B, O), "int32")
    ol = rec.array("output_lens", (B,), "int32", rng.integers(0, O + 1, size=B))
    dt = rec.array("draft_tokens", (B, K), "int32")
    nd = rec.array("num_draft", (B,), "int32")
    return ops.ngram_propose(pr, pl, ou, ol, dt, nd, min_n=min_n, max_n=max_n,
                             check_indices=check)


# ------------------------------------------------------------------ layers
@many("rms_norm", {
    "T1_bf16_wf32": dict(T=1, H=4096, dtype="bfloat16", wdt="float32"),
    "T64_f16_residual": dict(T=64, H=2048, dtype="float16", wdt="float16", residual=True),
    "T256_bf16_residual_inplace": dict(T=256, H=4096, dtype="bfloat16", wdt="bfloat16",
                                       residual=True, inplace=True),
    "T7_f32_H129_unit_offset": dict(T=7, H=129, dtype="float32", wdt="float32",
                                    unit_offset=True, eps=1e-5),
    "T3_strided_x": dict(T=3, H=1000, dtype="float16", wdt="float32", strided=True),
    "T0": dict(T=0, H=64, dtype="float32", wdt="float32"),
})
def _rms_norm(rec, T, H, dtype, wdt, residual=False, inplace=False, unit_offset=False,
              eps=1e-6, strided=False):
    if strided:
        buf = rec.array("x", (T, 3 * H), dtype)
        x = rec.view(buf, (T, H), strides=(3 * H, 1), offset=H)
    else:
        x = rec.array("x", (T, H), dtype)
    w = rec.array("weight", (H,), wdt)
    o = rec.array("out", (T, H), dtype)
    kw = {}
    if residual:
        kw["residual"] = rec.array("residual", (T, H), dtype)
        kw["residual_out"] = kw["residual"] if inplace else rec.array("residual_out", (T, H),
                                                                      dtype)
    return ops.rms_norm(x, w, o, eps=eps, unit_offset=unit_offset, **kw)


@many("rope", {
    "T4_bf16_fused_qkv": dict(T=4, Hq=32, Hk=8, D=128, dtype="bfloat16", fused=True),
    "T64_f16_d64": dict(T=64, Hq=16, Hk=4, D=64, dtype="float16"),
    "T8192_bf16_grid_capped": dict(T=8192, Hq=32, Hk=8, D=128, dtype="bfloat16"),
    "T9_f32_no_k": dict(T=9, Hq=4, Hk=0, D=256, dtype="float32"),
    "T5_bf16_offset1": dict(T=5, Hq=8, Hk=2, D=64, dtype="bfloat16", fused=True, offset=1),
    "T1_f32_d6": dict(T=1, Hq=2, Hk=2, D=6, dtype="float32"),
    "T0": dict(T=0, Hq=2, Hk=2, D=64, dtype="float32"),
})
def _rope(rec, T, Hq, Hk, D, dtype, fused=False, offset=0):
    if fused:
        Wd = (Hq + 2 * Hk) * D
        qkv = rec.array("qkv", (T * Wd + offset,), dtype)
        q = rec.view(qkv, (T, Hq, D), strides=(Wd, D, 1), offset=offset)
        k = rec.view(qkv, (T, Hk, D), strides=(Wd, D, 1), offset=offset + Hq * D)
    else:
        q = rec.array("q", (T, Hq, D), dtype)
        k = rec.array("k", (T, Hk, D), dtype) if Hk else None
    pos = rec.array("positions", (T,), "int32", np.arange(T))
    cs = _cos_sin(rec, 2048, D)
    return ops.rope(q, k, pos, cs)


@many("silu_mul", {
    "T64_bf16": dict(T=64, I=11008, dtype="bfloat16"),
    "T1_f16": dict(T=1, I=8192, dtype="float16"),
    "T2048_bf16_grid_capped": dict(T=2048, I=11008, dtype="bfloat16"),
    "T7_f32_odd": dict(T=7, I=129, dtype="float32"),
    "T3_strided_out": dict(T=3, I=512, dtype="bfloat16", strided=True),
    "T0": dict(T=0, I=8, dtype="float32"),
})
def _silu_mul(rec, T, I, dtype, strided=False):
    x = rec.array("x", (T, 2 * I), dtype)
    if strided:
        buf = rec.array("out", (T, I + 40), dtype)
        o = rec.view(buf, (T, I), strides=(I + 40, 1))
    else:
        o = rec.array("out", (T, I), dtype)
    return ops.silu_mul(x, o)


@many("gated_rms_norm", {
    "T4_qwen3next_bf16_xf32": dict(T=4, C=4096, G=128, dt="bfloat16", xdt="float32",
                                   wdt="float32"),
    "T4_smollm2_hybrid_z_view": dict(T=4, C=576, G=64, dt="bfloat16", xdt="float32",
                                     wdt="float32", z_view=True),
    "T256_f16_shared_weight": dict(T=256, C=4096, G=128, dt="float16", xdt="float16",
                                   wdt="float16", w_len="G", b_len="G"),
    "T70000_f32_grid_y_capped": dict(T=70000, C=64, G=16, dt="float32", xdt="float32",
                                     wdt="float32", b_len=None),
    "T3_f32_G5_scalar_units": dict(T=3, C=15, G=5, dt="float32", xdt="float32", wdt="float32",
                                   w_len="G", b_len=None),
    "T2_bf16_G320_in_place": dict(T=2, C=640, G=320, dt="bfloat16", xdt="bfloat16",
                                  wdt="bfloat16", inplace=True),
    "T5_f16_G1": dict(T=5, C=40, G=1, dt="float16", xdt="float32", wdt="float32"),
    "T0": dict(T=0, C=64, G=16, dt="float32", xdt="float32", wdt="float32"),
})
def _gated_rms_norm(rec, T, C, G, dt, xdt, wdt, w_len="C", b_len="C", z_view=False,
                    inplace=False):
    n = {"C": C, "G": G}
    x = rec.array("x", (T, C), xdt)
    if z_view:                  # the hybrid's z: columns of the projection's rows (4C + 18)
        proj = rec.array("proj", (T, 4 * C + 18), dt)
        z = rec.view(proj, (T, C), strides=(4 * C + 18, 1), offset=3 * C)
    else:
        z = rec.array("z", (T, C), dt)
    w = rec.array("weight", (n[w_len],), wdt)
    b = rec.array("z_bias", (n[b_len],), wdt) if b_len else None
    o = x if inplace else rec.array("out", (T, C), dt)
    return ops.gated_rms_norm(x, z, w, o, group_size=G, z_bias=b, eps=1e-6)


@many("linear", {
    "M1_bf16_4096": dict(M=1, K=4096, N=4096, dtype="bfloat16"),
    "M4_bf16_norm_f32_residual": dict(M=4, K=2048, N=6144, dtype="bfloat16", norm="float32",
                                      residual=True),
    "M20_f16_silu": dict(M=20, K=1024, N=2 * 2816, dtype="float16", norm="float16",
                         epilogue="silu_mul", unit_offset=True),
    "M3_f16_K100": dict(M=3, K=100, N=77, dtype="float16"),
    "M2_bf16_strided_x_norm": dict(M=2, K=512, N=1000, dtype="bfloat16", norm="bfloat16",
                                   strided=True, eps=1e-5),
    "M64_bf16_silu_residual": dict(M=64, K=2048, N=2 * 5632, dtype="bfloat16",
                                   norm="bfloat16", residual=True, epilogue="silu_mul"),
    "M0": dict(M=0, K=64, N=64, dtype="float16"),
    "M4_bf16_smol_gate_up": dict(M=4, K=576, N=2 * 1536, dtype="bfloat16", norm="bfloat16",
                                 residual=True, epilogue="silu_mul"),
    "M1_bf16_smol_down": dict(M=1, K=1536, N=576, dtype="bfloat16"),
})
def _linear(rec, M, K, N, dtype, norm=None, residual=False, epilogue=None, unit_offset=False,
            strided=False, eps=1e-6):
    if strided:
        buf = rec.array("x", (M, K + 8), dtype)
        x = rec.view(buf, (M, K), strides=(K + 8, 1), offset=8)
    else:
        x = rec.array("x", (M, K), dtype)
    w = rec.array("weight", (N, K), dtype)
    width = N // 2 if epilogue == "silu_mul" else N
    o = rec.array("out", (M, width), dtype)
    kw = {}
    if norm:
        kw["norm_weight"] = rec.array("norm_weight", (K,), norm)
        kw["eps"] = eps
        kw["unit_offset"] = unit_offset
    if residual:
        kw["residual"] = rec.array("residual", (M, K), dtype)
        kw["residual_out"] = rec.array("residual_out", (M, K), dtype)
    if epilogue:
        kw["epilogue"] = epilogue
    return ops.linear(x, w, o, **kw)


# ------------------------------------------------------------------ the test
KEYS = [f"{name}|{profile}" for name in CASES for profile in PROFILES]


def _run(key):
    name, profile = key.split("|")
    build, env = CASES[name]
    out, _ = launch_record.record_call(profile, build, env)
    return json.loads(json.dumps(out))      # tuples -> lists, as the golden file has them


def _load_golden():
    with open(GOLDEN) as f:
        return json.load(f)["cases"]


def _dump(cases):
    """One line per launch: small diffs when a plan changes."""
    lines = ["{", ' "note": "launch plans of specdec_lib.ops (tests/test_launch_plans.py); '
             f'regenerate with {WRITE_ENV}=1",', ' "cases": {']
    keys = sorted(cases)
    for i, key in enumerate(keys):
        rec = cases[key]
        lines.append(f"  {json.dumps(key)}: {{")
        lines.append('   "launches": [' + ("" if rec["launches"] else "],"))
        for j, launch in enumerate(rec["launches"]):
            end = "]," if j == len(rec["launches"]) - 1 else ","
            lines.append("    " + json.dumps(launch) + end)
        for field in ("host_copies", "kernel_calls"):
            lines.append(f'   "{field}": {json.dumps(rec[field])},')
        lines.append(f'   "returns": {json.dumps(rec["returns"])}')
        lines.append("  }" + ("," if i < len(keys) - 1 else ""))
    lines += [" }", "}", ""]
    return "\n".join(lines)


def _explain(want, got):
    """Readable differences of one case's record."""
    msg = []
    wl, gl = want["launches"], got["launches"]
    if len(wl) != len(gl):
        msg.append(f"{len(gl)} launches, golden {len(wl)}: "
                   f"{[x['launcher'] for x in gl]} vs {[x['launcher'] for x in wl]}")
    for i, (w, g) in enumerate(zip(wl, gl)):
        if w["launcher"] != g["launcher"]:
            msg.append(f"launch {i}: {g['launcher']}, golden {w['launcher']}")
            continue
        for arg in dict.fromkeys(list(w["args"]) + list(g["args"])):
            if w["args"].get(arg, "<absent>") != g["args"].get(arg, "<absent>"):
                msg.append(f"launch {i} ({g['launcher']}) {arg}: {g['args'].get(arg, '<absent>')!r}"
                           f", golden {w['args'].get(arg, '<absent>')!r}")
    for field in ("host_copies", "kernel_calls", "returns"):
        if want[field] != got[field]:
            msg.append(f"{field}: {got[field]!r}, golden {want[field]!r}")
    return "\n".join(msg)


@pytest.fixture(scope="module")
def golden():
    if os.environ.get(WRITE_ENV) == "1":
        cases = {key: _run(key) for key in KEYS}
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w") as f:
            f.write(_dump(cases))
    return _load_golden()


def test_golden_covers_the_table(golden):
    assert sorted(golden) == sorted(KEYS), (
        f"missing from the golden file: {sorted(set(KEYS) - set(golden))}; "
        f"not in the table: {sorted(set(golden) - set(KEYS))}")


@pytest.mark.parametrize("key", KEYS)
def test_launch_plan(key, golden):
    if key not in golden:
        pytest.fail(f"{key}: not in {GOLDEN} (regenerate with {WRITE_ENV}=1)")
    got = _run(key)
    want = golden[key]
    assert got == want, f"{key}: the launch plan changed\n{_explain(want, got)}"


# the public ops of specdec_lib.ops when the golden file was made (helpers that launch nothing
# left out); each must still exist and have cases
BASE_OPS = ("copy", "append_kv", "rope_append_kv", "verify_attention", "gdn_verify",
            "gdn_commit", "gdn_flush", "conv1d_verify", "conv1d_commit", "conv1d_flush", "spec_sample",
            "seq_stop", "seq_advance", "seq_build_block", "draft_carry", "capture_hidden",
            "draft_combine", "draft_map_tokens", "ngram_propose", "rms_norm", "rope",
            "silu_mul", "linear", "gated_rms_norm")
HELPERS = ("verify_attention_workspace_size", "spec_sample_workspace_size",
           "gdn_journal_width", "rope_cos_sin_cache",
           "advance_step")   # (step += by on the caller's own array type: no library launch)


def test_every_public_op_is_in_the_table():
    covered = {name.split("[")[0] for name in CASES}
    missing = [n for n in BASE_OPS if n not in covered]
    assert not missing, f"public ops without a launch-plan case: {missing}"
    gone = [n for n in BASE_OPS + HELPERS if not callable(getattr(ops, n, None))]
    assert not gone, f"no longer in specdec_lib.ops: {gone}"
    public = {n for n in dir(ops) if not n.startswith("_") and callable(getattr(ops, n))}
    new = sorted(public - set(BASE_OPS) - set(HELPERS))
    if new:
        warnings.warn(f"specdec_lib.ops has callables the launch-plan table does not know: {new}")
