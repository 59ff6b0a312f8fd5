"""Benchmarks of the layers family: ``linear`` (the small-M, row-invariant GEMM) on
SmolLM2-135M's four projections at M = 4..128, against torch.nn.functional.linear (cuBLAS)
on the same shapes when torch imports; then the fused variants (rms_norm + residual
prologue, silu_mul epilogue) against the unfused pairs they replace. Every row is timed
as CUDA-graph replays (the decode round is captured), bytes = weight + x + out (the weight
dominates: GB/s is weight bandwidth). ``gated_rms_norm``: a GDN layer's output norm at the
hybrids' shapes against the torch math it replaces.
"""
from __future__ import annotations

from ._harness import Bench, _rand, _strided, bench

# (name, N, K) of SmolLM2-135M (H = 576, 9 + 2x3 heads of 64, MLP 1536)
SMOLLM2 = (("qkv", 1728, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536))
ROWS = (1, 4, 16, 64, 128)
_E = 2   # bfloat16


def _torch(op="linear"):
    try:
        import torch
        import torch.nn.functional as F
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda is not available")
        return torch, F
    except Exception as e:   # not installed here (or no CUDA build): say so once
        print(f"  {op}: torch peer skipped: {type(e).__name__}: {e}")
        return None


@bench("linear")
def bench_linear(b: Bench):
    from ..arrays import DeviceArray
    from ..ops import linear
    d = b.device
    peer = _torch()
    for M in ROWS:
        for name, N, K in SMOLLM2:
            x, w = _rand((M, K), "bfloat16", d, 1), _rand((N, K), "bfloat16", d, 2)
            out = DeviceArray.empty((M, N), "bfloat16", d)
            nbytes = (N * K + M * K + M * N) * _E
            shape = f"{name} M={M} N={N} K={K} bf16 (graph)"

            def run():
                linear(x, w, out, stream=b.stream)
            b.report("linear", shape, nbytes, b.time_graph(run))
            if peer is not None:
                torch, F = peer
                xt = torch.randn(M, K, device=f"cuda:{d}", dtype=torch.bfloat16)
                wt = torch.randn(N, K, device=f"cuda:{d}", dtype=torch.bfloat16)
                try:
                    ms = b.time_torch_graph(lambda: F.linear(xt, wt))
                    b.report("linear", shape, nbytes, ms, impl="torch F.linear")
                except Exception as e:
                    print(f"  linear: torch F.linear failed: {type(e).__name__}: {e}")
    _bench_fused(b, peer)


def _bench_fused(b: Bench, peer):
    """The two fusions a Llama layer uses, at decode sizes: [residual add +] rms_norm in front
    of qkv / gate_up, silu_mul behind gate_up; each against the unfused launches."""
    from ..arrays import DeviceArray
    from ..ops import linear, rms_norm, silu_mul
    d, st = b.device, b.stream
    H, eps = 576, 1e-5
    for M in (1, 4, 16):
        for name, N, K, silu in (("qkv", 1728, H, False), ("gate_up", 3072, H, True)):
            I = N // 2
            W = I if silu else N
            x, r = _rand((M, K), "bfloat16", d, 1), _rand((M, K), "bfloat16", d, 3)
            w, nw = _rand((N, K), "bfloat16", d, 2), _rand((K,), "bfloat16", d, 4)
            s = DeviceArray.empty((M, K), "bfloat16", d)
            h = DeviceArray.empty((M, K), "bfloat16", d)
            acc = DeviceArray.empty((M, N), "bfloat16", d)
            out = DeviceArray.empty((M, W), "bfloat16", d)
            nbytes = (N * K + 3 * M * K + M * W) * _E
            epi = "silu_mul" if silu else None
            shape = f"{name} M={M} norm+residual{'+silu_mul' if silu else ''} bf16 (graph)"

            def fused():
                linear(x, w, out, norm_weight=nw, residual=r, residual_out=s, eps=eps,
                       epilogue=epi, stream=st)

            def unfused():
                rms_norm(x, nw, h, residual=r, residual_out=s, eps=eps, stream=st)
                linear(h, w, acc if silu else out, stream=st)
                if silu:
                    silu_mul(acc, out, stream=st)
            b.report("linear", shape, nbytes, b.time_graph(fused), impl="specdec fused")
            b.report("linear", shape, nbytes, b.time_graph(unfused),
                     impl="specdec rms_norm+linear" + ("+silu_mul" if silu else ""))
            if peer is None:
                continue
            torch, F = peer
            dev = f"cuda:{d}"
            xt, rt = (torch.randn(M, K, device=dev, dtype=torch.bfloat16) for _ in range(2))
            wt = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
            nwt = torch.randn(K, device=dev, dtype=torch.bfloat16)
            ht, st_t = torch.empty_like(xt), torch.empty_like(xt)
            act = torch.empty(M, I, device=dev, dtype=torch.bfloat16)

            def lib_norm_cublas():       # what models/llama.py runs today
                cs = torch.cuda.current_stream().cuda_stream
                rms_norm(xt, nwt, ht, residual=rt, residual_out=st_t, eps=eps, stream=cs)
                y = F.linear(ht, wt)
                if silu:
                    silu_mul(y, act, stream=cs)

            def all_torch():
                sr = xt + rt
                y = F.linear(F.rms_norm(sr, (K,), nwt, eps), wt)
                if silu:
                    F.silu(y[:, :I]) * y[:, I:]
            for impl, fn in (("specdec rms_norm+F.linear" + ("+silu_mul" if silu else ""),
                              lib_norm_cublas),
                             ("torch add+rms_norm+F.linear" + ("+silu*up" if silu else ""),
                              all_torch)):
                try:
                    b.report("linear", shape, nbytes, b.time_torch_graph(fn), impl=impl)
                except Exception as e:
                    print(f"  linear: {impl} failed: {type(e).__name__}: {e}")


# (C, G) of a GDN layer's gated norm: SmolLM2 hybrid (Hv = 9 heads of Dv = 64), Qwen3-Next
# (32 of 128); T = 4: batch 1 at k = 3, T = 256: batch 64
GATED_SHAPES = ((576, 64), (4096, 128))


@bench("gated_rms_norm")
def bench_gated_rms_norm(b: Bench):
    """o float32 [T, C] (gdn_verify's output), z bf16 [T, C] as a column slice of the
    projection's rows (row stride 4C + 18: not 8-byte aligned, scalar z units, as in the
    SmolLM2 hybrid), weight and z_bias float32 [C] -> bf16 out; bytes = x + z + out + weight +
    z_bias. Against the same math in torch (rsqrt, mean, silu, casts: what the hybrid ran
    before) when torch imports."""
    from ..arrays import DeviceArray
    from ..ops import gated_rms_norm
    d, eps = b.device, 1e-6
    peer = _torch("gated_rms_norm")
    for T in (4, 256):
        for C, G in GATED_SHAPES:
            S = 4 * C + 18
            x = _rand((T, C), "float32", d, 1)
            proj = _rand((T, S), "bfloat16", d, 2)
            z = _strided(proj, (T, C), (S, 1), 3 * C)
            w, zb = _rand((C,), "float32", d, 3), _rand((C,), "float32", d, 4)
            out = DeviceArray.empty((T, C), "bfloat16", d)
            nbytes = T * C * (4 + 2 + 2) + 2 * C * 4
            shape = f"T={T} C={C} G={G} x f32 z/out bf16 w f32 (graph)"

            def run():
                gated_rms_norm(x, z, w, out, group_size=G, z_bias=zb, eps=eps, stream=b.stream)
            b.report("gated_rms_norm", shape, nbytes, b.time_graph(run),
                     host_us=round(b.host_us(run), 1))
            if peer is None:
                continue
            torch, F = peer
            dev = f"cuda:{d}"
            o = torch.randn(T, C // G, G, device=dev)
            zt = torch.randn(T, S, device=dev).to(torch.bfloat16)[:, 3 * C:4 * C]
            wt, bt = torch.randn(C, device=dev), torch.randn(C, device=dev)

            def torch_math():
                r = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
                (r.reshape(T, -1) * wt * F.silu(zt.float() + bt)).to(torch.bfloat16)
            try:
                b.report("gated_rms_norm", shape, nbytes, b.time_torch_graph(torch_math),
                         impl="torch (the hybrid's old math)")
            except Exception as e:
                print(f"  gated_rms_norm: torch peer failed: {type(e).__name__}: {e}")


@bench("linear_chain", default=False)
def bench_linear_chain(b: Bench):
    """SmolLM2-135M's 30 layers of decode GEMMs as one graph, each layer its own weights (212
    MB: they come from HBM, as in a round, not from L2 as in ``linear``'s rows of one call
    replayed), at M = 1..8 and a small batch's 16..128 rows: qkv (norm + residual fused), o,
    gate_up (norm + residual + silu_mul), down; through linear (its default CUDA-core few-row
    kernels at M <= 8, the chunked one past that, then tensor_cores=True's
    linear_mma, what LlamaTarget's few-row decode asks for; then the CUDA-core kernels' other
    rows-a-CTA choices, then two columns a warp at 1 and 2 rows a CTA: the default's four
    serve qkv, o and gate_up; down's K = 1536 has two either way) and through
    cuBLAS (torch F.linear, with the library's rms_norm and silu_mul between, what
    LlamaTarget runs at small_rows=False)."""
    from ..arrays import DeviceArray
    from ..ops import linear, rms_norm, silu_mul
    d, st = b.device, b.stream
    L, H, I, QKV, eps = 30, 576, 1536, 960, 1e-5
    peer = _torch()
    layers = [dict(qkv=_rand((QKV, H), "bfloat16", d, 10 + 4 * i), o=_rand((H, H), "bfloat16", d, 11 + 4 * i),
                   gate_up=_rand((2 * I, H), "bfloat16", d, 12 + 4 * i),
                   down=_rand((H, I), "bfloat16", d, 13 + 4 * i), ln=_rand((H,), "bfloat16", d, 5))
              for i in range(L)]
    wbytes = L * (QKV * H + H * H + 2 * I * H + H * I) * _E
    from ..ops import layers as ops_layers
    for M in list(range(1, 9)) + [16, 32, 64, 128]:     # past 8: the decode of a small batch
        x, r = _rand((M, H), "bfloat16", d, 1), _rand((M, H), "bfloat16", d, 3)
        s = DeviceArray.empty((M, H), "bfloat16", d)
        qkv = DeviceArray.empty((M, QKV), "bfloat16", d)
        mix = DeviceArray.empty((M, H), "bfloat16", d)
        act = DeviceArray.empty((M, I), "bfloat16", d)

        def chain():
            for w in layers:
                linear(x, w["qkv"], qkv, norm_weight=w["ln"], residual=r, residual_out=s, eps=eps,
                       stream=st)
                linear(mix, w["o"], x, stream=st)
                linear(x, w["gate_up"], act, norm_weight=w["ln"], residual=r, residual_out=s,
                       eps=eps, epilogue="silu_mul", stream=st)
                linear(act, w["down"], mix, stream=st)
        shape = f"SmolLM2 30 layers x 4 GEMMs M={M} bf16 (one graph, weights from HBM)"
        b.report("linear_chain", shape, wbytes, b.time_graph(chain, per_graph=1))
        # the tensor-core form (TUNING["linear_mma"] forces what tensor_cores=True asks), each
        # other rows-a-CTA choice (the default's above), then the two-column form (the
        # default's four where K <= 1024) at 1 and 2 rows a CTA
        choices = [(dict(linear_mma=True), "linear tensor_cores=True (linear_mma)")]
        if M <= 8:
            default_mr = ops_layers._linear_small(M, H, True, True)[0]
            choices += [(dict(linear_cta_rows=mr), f"linear {mr} rows a CTA")
                        for mr in (1, 2, 4) if mr != default_mr]
            choices += [(dict(linear_cta_rows=mr, linear_cols_per_warp=2),
                         f"linear 2 columns a warp, {mr} rows a CTA") for mr in (1, 2)]
        saved = dict(ops_layers.TUNING)
        for tuning, impl in choices:
            ops_layers.TUNING.update(tuning)
            try:
                b.report("linear_chain", shape, wbytes, b.time_graph(chain, per_graph=1),
                         impl=impl)
            finally:
                ops_layers.TUNING.update(saved)
        if peer is None:
            continue
        torch, F = peer
        tw = [{k: torch.as_tensor(v.to_numpy().view("int16")).view(torch.bfloat16)
               .to(f"cuda:{d}") for k, v in w.items()} for w in layers]
        dev = f"cuda:{d}"
        xt, rt = (torch.randn(M, H, device=dev, dtype=torch.bfloat16) for _ in range(2))
        ht, st_t = torch.empty_like(xt), torch.empty_like(xt)
        actt = torch.empty(M, I, device=dev, dtype=torch.bfloat16)

        def cublas_chain():
            cs = torch.cuda.current_stream().cuda_stream
            for w in tw:
                rms_norm(xt, w["ln"], ht, residual=rt, residual_out=st_t, eps=eps, stream=cs)
                F.linear(ht, w["qkv"])
                y = F.linear(ht, w["o"])
                rms_norm(y, w["ln"], ht, residual=rt, residual_out=st_t, eps=eps, stream=cs)
                silu_mul(F.linear(ht, w["gate_up"]), actt, stream=cs)
                F.linear(actt, w["down"])
        try:
            b.report("linear_chain", shape, wbytes, b.time_torch_graph(cublas_chain, per_graph=1),
                     impl="cuBLAS + rms_norm / silu_mul")
        except Exception as e:
            print(f"  linear_chain: cuBLAS chain failed: {type(e).__name__}: {e}")
