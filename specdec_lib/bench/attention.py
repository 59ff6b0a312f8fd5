"""Benchmark of verify_attention (``python -m specdec_lib bench verify_attention``).

Bytes counted: the K and V rows the op must read (B * (L+q) * Hkv * D * 2 tensors *
itemsize); q/out are < 1% of that. Peer in the same run, when torch is importable:
``scaled_dot_product_attention`` (flash backend when it accepts the call) on the same K/V
already gathered into contiguous [B, Hkv, L+q, D] tensors, lower-right causal mask,
GQA without materialising repeated heads.
"""
from __future__ import annotations

import numpy as np

from ._harness import Bench, _paged_batch, _rand, _strided, bench

SHAPES = [   # (B, L, q, Hq, Hkv, D, page_size)
    (64, 4096, 4, 32, 8, 128, 16),
    (64, 4096, 4, 32, 8, 128, 64),
    (1, 32768, 4, 32, 8, 128, 16),
    (1, 32768, 4, 32, 8, 128, 64),
]


def _torch_sdpa(b: Bench, B, L, q, Hq, Hkv, D, kv_bytes, shape):
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right
        import torch.nn.functional as F
    except Exception as e:   # torch missing or too old
        print(f"  verify_attention   torch SDPA peer skipped: {type(e).__name__}: {e}")
        return
    dev = torch.device("cuda", b.device)
    g = torch.Generator(device=dev).manual_seed(0)
    S = L + q
    qt = torch.randn(B, Hq, q, D, device=dev, dtype=torch.bfloat16, generator=g)
    kt = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    vt = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    mask = causal_lower_right(q, S)
    stream = torch.cuda.ExternalStream(b.stream, device=dev)
    for backend, name in ((SDPBackend.FLASH_ATTENTION, "torch sdpa flash"),
                          (None, "torch sdpa (auto)")):
        def run():
            with torch.cuda.stream(stream):
                if backend is None:
                    F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
                else:
                    with sdpa_kernel(backend):
                        F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
        try:
            run()
            torch.cuda.synchronize(dev)
            ms = b.time(run, iters=10)
        except Exception as e:
            print(f"  verify_attention   {name}: not available for this shape "
                  f"({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            continue
        b.report("verify_attention", shape, kv_bytes, ms, impl=name)
        break


def _paged_case(b: Bench, B, L, q, Hq, Hkv, D, ps):
    """A paged verify batch of B sequences at L cached keys + q new rows (bf16 q, seed 1):
    (q, page_table, seq_lens, cu_q, out, max_kv_len, num_pages); the K/V caches are the
    caller's (16- or 8-bit)."""
    from ..arrays import DeviceArray
    T, max_pages = B * q, (L + q + ps - 1) // ps
    qd = _rand((T, Hq, D), "bfloat16", b.device, 1)
    pt, sl, cq = _paged_batch(b.device, B, L, q, B * max_pages, max_pages)
    out = DeviceArray.empty((T, Hq, D), "bfloat16", b.device)
    return qd, pt, sl, cq, out, max_pages * ps, B * max_pages


@bench("verify_attention")
def bench_verify_attention(b: Bench):
    from ..arrays import DeviceArray
    from ..ops import verify_attention, verify_attention_workspace_size
    from ..ops.attention import plan_verify_attention
    from .. import runtime
    for B, L, q, Hq, Hkv, D, ps in SHAPES:
        T = B * q
        qd, pt, sl, cq, out, max_kv, num_pages = _paged_case(b, B, L, q, Hq, Hkv, D, ps)
        kc = _rand((num_pages, ps, Hkv, D), "bfloat16", b.device, 2)
        vc = _rand((num_pages, ps, Hkv, D), "bfloat16", b.device, 3)
        lse = DeviceArray.empty((T, Hq), "float32", b.device)
        nbytes = verify_attention_workspace_size(T, Hq, Hkv, D, B, max_kv, device=b.device)
        ws = DeviceArray.empty((max(nbytes, 1),), "uint8", b.device)
        plan = plan_verify_attention(B, Hkv, Hq // Hkv, D, min(T, 16), max_kv,
                                     runtime.sm_count(b.device))

        def run():
            verify_attention(qd, kc, vc, pt, sl, cq, out, lse_out=lse, workspace=ws,
                             stream=b.stream)
        kv_bytes = B * (L + q) * Hkv * D * 2 * 2
        shape = f"B={B} L={L} q={q} Hq={Hq} Hkv={Hkv} D={D} page={ps} bf16"
        ms = b.time_graph(run, per_graph=10)
        b.report("verify_attention", shape, kv_bytes, ms, splits=plan.num_splits,
                 host_us=round(b.host_us(run), 1))
        del kc, vc
        if ps == 16 and B > 1:   # the same with head-major pages (beside the 8-bit rows')
            kc = _HeadMajorPages(_rand((num_pages, Hkv, ps, D), "bfloat16", b.device, 2), "<V2")
            vc = _HeadMajorPages(_rand((num_pages, Hkv, ps, D), "bfloat16", b.device, 3), "<V2")
            ms = b.time_graph(run, per_graph=10)
            b.report("verify_attention", shape + " head-major", kv_bytes, ms,
                     splits=plan.num_splits)
            del kc, vc
        if ps == 16:   # the peer reads contiguous K/V: page size does not apply
            _torch_sdpa(b, B, L, q, Hq, Hkv, D, kv_bytes, shape)
    _bench_verify_attention_kv8(b)



# batch 1 (issue 31): latency, not bandwidth; the split count decides it
SMALL_SHAPES = [   # (L, Hq, Hkv, D): Llama-3-8B-like, Qwen3-Next's attention, SmolLM2
    (512, 32, 8, 128), (4096, 32, 8, 128), (512, 16, 2, 256), (1000, 16, 2, 256),
    (4096, 16, 2, 256), (300, 9, 3, 64)]


@bench("verify_attention_b1", default=False)
def bench_verify_attention_b1(b: Bench):
    """verify_attention at B=1 q=4 (page 16, bf16): the automatic plan, the split-KV plan
    (+ merge launch) and the sm_90 cluster path (one launch) each forced, then a sweep of
    forced split counts (split-KV): the data for the small-batch policy (graph replays, 20
    calls). The cluster rows need sm_90 code (skipped on other families)."""
    from ..arrays import DeviceArray
    from ..ops import verify_attention, verify_attention_workspace_size
    from ..ops import attention as A
    from .. import runtime
    B, q, ps = 1, 4, 16
    cluster_ok = runtime.arch_family(b.device) >= 90
    for L, Hq, Hkv, D in SMALL_SHAPES:
        qd, pt, sl, cq, out, max_kv, num_pages = _paged_case(b, B, L, q, Hq, Hkv, D, ps)
        kc = _rand((num_pages, ps, Hkv, D), "bfloat16", b.device, 2)
        vc = _rand((num_pages, ps, Hkv, D), "bfloat16", b.device, 3)
        ws = DeviceArray.empty((max(verify_attention_workspace_size(
            q, Hq, Hkv, D, B, max_kv, max_q=q, num_splits=n, device=b.device)
            for n in (None, 64)),), "uint8", b.device)
        kv_bytes = (L + q) * Hkv * D * 2 * 2
        shape = f"B=1 L={L} q={q} Hq={Hq} Hkv={Hkv} D={D} page={ps} bf16"
        rows = [("auto", None, None), ("split", False, None)]
        if cluster_ok:
            rows.append(("cluster", True, None))
            if q * (Hq // Hkv) > 16:   # more than one m-tile: one a CTA (TUNING "cluster_m_split")
                rows.append(("m-split", True, None))
        rows += [("forced", None, n) for n in (1, 2, 4, 8, 16, 32, 64) if n <= -(-max_kv // 32)]
        saved, saved_m = A.TUNING["cluster"], A.TUNING["cluster_m_split"]
        for kind, tuning, splits in rows:
            A.TUNING["cluster"] = tuning if kind != "auto" else saved
            A.TUNING["cluster_m_split"] = True if kind == "m-split" else saved_m
            try:
                label = f"forced {splits}"
                if splits is None:
                    plan = A.choose_plan(b.device, "bf16", D, B, Hkv, Hq // Hkv, q, max_kv)[0]
                    what = (f"cluster {plan.num_splits} x {plan.kv_chunk // A._TILE_KEYS[D]} tiles"
                            if plan.cluster else f"split-KV {plan.num_splits} + merge")
                    label = {"auto": "planned: ", "split": "planned split-KV: ",
                             "cluster": "cluster forced: ",
                             "m-split": "cluster m-split forced: "}[kind] + what
                    if plan.cluster:
                        label += f" ({Hkv * plan.m_groups * plan.num_splits} CTAs)"

                def run():
                    verify_attention(qd, kc, vc, pt, sl, cq, out, workspace=ws, num_splits=splits,
                                     max_q=q, stream=b.stream)
                ms = b.time_graph(run, per_graph=20)
            finally:
                A.TUNING["cluster"], A.TUNING["cluster_m_split"] = saved, saved_m
            b.report("verify_attention_b1", shape, kv_bytes, ms, splits=label)


class _HeadMajorPages:
    """A cache stored head-major within each page ([num_pages, Hkv, page_size, D], FlashInfer's
    "HND") seen as the ops' [num_pages, page_size, Hkv, D] through strides (CUDA Array
    Interface): a KV head's rows of a page are one contiguous run instead of D-sized pieces
    Hkv * D apart."""

    def __init__(self, base, typestr):
        n, h, ps, d = base.shape
        e = base.itemsize
        self.base = base
        self.__cuda_array_interface__ = {"shape": (n, ps, h, d), "typestr": typestr,
                                         "strides": (h * ps * d * e, d * e, ps * d * e, e),
                                         "data": (base.ptr, False), "version": 3}


def _kv8_cache(fmt, num_pages, ps, Hkv, D, device, seed, head_major=False):
    """A random 8-bit cache (fp8 codes without NaN; int8 codes) and its scales / params;
    ``head_major``: the codes stored [num_pages, Hkv, ps, D] (_HeadMajorPages)."""
    from ..arrays import DeviceArray
    rng = np.random.default_rng(seed)
    shape = (num_pages, Hkv, ps, D) if head_major else (num_pages, ps, Hkv, D)
    if fmt == "fp8":
        c = (rng.integers(0, 256, shape, dtype=np.uint8) & 0xF7).astype(np.uint8)
        extra = np.full((Hkv,), 0.05, np.float32)
    else:
        c = rng.integers(-128, 128, shape, dtype=np.int8)
        extra = np.stack([np.full((num_pages, ps, Hkv), 0.01, np.float32),
                          np.full((num_pages, ps, Hkv), -1.0, np.float32)], axis=-1)
    cache = DeviceArray.from_numpy(c, device=device)
    if head_major:
        cache = _HeadMajorPages(cache, "|u1" if fmt == "fp8" else "|i1")
    return cache, DeviceArray.from_numpy(extra, device=device)


def _bench_verify_attention_kv8(b: Bench):
    """verify_attention over fp8_e4m3 and int8 caches at the bf16 bench's shapes (issue 32).
    Bytes counted as actually read: 1 byte per K/V element, plus the int8 rows' (scale,
    zero) pairs (8 bytes per token per head, K and V); the bf16 row of the same shape (bench
    verify_attention) reads twice the K/V bytes."""
    from ..arrays import DeviceArray
    from ..ops import verify_attention, verify_attention_workspace_size
    for B, L, q, Hq, Hkv, D, ps in SHAPES:
        if ps != 16:
            continue
        T = B * q
        qd, pt, sl, cq, out, max_kv, num_pages = _paged_case(b, B, L, q, Hq, Hkv, D, ps)
        lse = DeviceArray.empty((T, Hq), "float32", b.device)
        nbytes = verify_attention_workspace_size(T, Hq, Hkv, D, B, max_kv, device=b.device)
        ws = DeviceArray.empty((max(nbytes, 1),), "uint8", b.device)
        # B > 1 also with head-major pages: the same kernel, each head's page rows contiguous
        for fmt, hm in [(f, hm) for hm in ((False, True) if B > 1 else (False,))
                        for f in ("fp8", "int8")]:
            kc, kx = _kv8_cache(fmt, num_pages, ps, Hkv, D, b.device, 2, hm)
            vc, vx = _kv8_cache(fmt, num_pages, ps, Hkv, D, b.device, 3, hm)
            kw = (dict(k_scale=kx, v_scale=vx) if fmt == "fp8" else dict(k_params=kx, v_params=vx))
            kv_bytes = B * (L + q) * Hkv * (D * 2 + (16 if fmt == "int8" else 0))
            shape = (f"B={B} L={L} q={q} Hq={Hq} Hkv={Hkv} D={D} page={ps} bf16 q, {fmt} cache"
                     + (" head-major" if hm else ""))
            # B=1: the automatic split count and forced ones beside it (the plan aims at two
            # CTAs an SM; the 8-bit kernel fits four at D = 128: fp8 with one m-tile's Q
            # space, int8 always). B > 1 (NHD pages): also
            # max_q = q, the bound the orchestrator passes (a plan of fewer m-tiles a CTA)
            runs = ([(None, None)] + ([(None, q)] if not hm else []) if B > 1
                    else [(None, None), (64, None), (128, None)])
            for ns, mq in runs:
                wsn = ws
                if ns is not None:
                    n = verify_attention_workspace_size(T, Hq, Hkv, D, B, max_kv, num_splits=ns,
                                                        device=b.device)
                    wsn = DeviceArray.empty((max(n, 1),), "uint8", b.device)

                def run():
                    verify_attention(qd, kc, vc, pt, sl, cq, out, lse_out=lse, workspace=wsn,
                                     stream=b.stream, num_splits=ns, max_q=mq, **kw)
                ms = b.time_graph(run, per_graph=10)
                extra = {k: v for k, v in (("splits", ns), ("max_q", mq)) if v is not None}
                b.report("verify_attention", shape, kv_bytes, ms, host_us=round(b.host_us(run), 1),
                         **extra)
            del kc, vc, kx, vx


@bench("verify_attention_kv8", default=False)
def bench_verify_attention_kv8(b: Bench):
    """The 8-bit rows of ``bench verify_attention`` alone (kernel A/B runs)."""
    _bench_verify_attention_kv8(b)


@bench("rope_append_kv")
def bench_rope_append_kv(b: Bench):
    """The fused op against the rope + append_kv pair it replaces, on SmolLM2-135M's heads
    (Hq=9, Hkv=3, D=64) and Llama-8B's (32, 8, 128): a decode round (B=32, q=4) and a prefill
    (B=32 prompts of 256). Bytes: q and k read + written, v read, k and v cache rows written."""
    from ..arrays import DeviceArray
    from ..ops import append_kv, rope, rope_append_kv
    from ..reference.layers import rope_cos_sin_cache
    ps = 16
    for B, q, Hq, Hkv, D in ((32, 4, 9, 3, 64), (32, 256, 9, 3, 64), (32, 4, 32, 8, 128),
                             (32, 256, 32, 8, 128)):
        T, L = B * q, 1024
        max_pages = (L + q) // ps + 1
        num_pages = B * max_pages
        W = (Hq + 2 * Hkv) * D
        qkv = _rand((T, W), "bfloat16", b.device, 1)
        # heads h0 .. h0+n-1 of the fused projection as [T, n, D] views: how a host model
        # hands q / k / v to the ops
        qv, kv, vv = (_strided(qkv, (T, n, D), (W, D, 1), h0 * D)
                      for h0, n in ((0, Hq), (Hq, Hkv), (Hq + Hkv, Hkv)))
        kc = DeviceArray.empty((num_pages, ps, Hkv, D), "bfloat16", b.device)
        vc = DeviceArray.empty((num_pages, ps, Hkv, D), "bfloat16", b.device)
        pt, sl, cq = _paged_batch(b.device, B, L, q, num_pages, max_pages)
        pos = DeviceArray.from_numpy(np.tile(np.arange(L, L + q, dtype=np.int32), B),
                                     device=b.device)
        cs = DeviceArray.from_numpy(rope_cos_sin_cache(L + q, D, 10000.0), device=b.device)

        def fused():
            rope_append_kv(qv, kv, vv, pos, cs, kc, vc, pt, sl, cq, check_indices=False,
                           stream=b.stream)

        def pair():
            rope(qv, kv, pos, cs, stream=b.stream)
            append_kv(kv, vv, kc, vc, pt, sl, cq, check_indices=False, stream=b.stream)
        nbytes = T * D * 2 * (2 * Hq + 5 * Hkv)
        shape = f"B={B} q={q} Hq={Hq} Hkv={Hkv} D={D} page={ps} bf16"
        for name, fn in (("specdec_lib", fused), ("rope + append_kv", pair)):
            ms = b.time_graph(fn, per_graph=20)
            b.report("rope_append_kv", shape, nbytes, ms, impl=name,
                     host_us=round(b.host_us(fn), 1))
