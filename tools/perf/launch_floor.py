"""What one kernel of a B=1 decode round costs at the least: the time per kernel of N
dependent kernels replayed from one CUDA graph (torch backend, the H200), for

  * a one-element torch add (a kernel that does nothing: the graph's launch floor),
  * the library's rms_norm of one SmolLM2 row (576 bf16), and its rope_append_kv of one row,
  * cuBLAS bf16 GEMMs of one row with SmolLM2's weight shapes (qkv, o, gate_up, down),

so a round's time can be split into "kernels x floor" and "work above the floor".

  python3 tools/perf/launch_floor.py [--n 300] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def per_kernel_us(b, fn, n):
    """us per call of fn from replays of a graph holding n calls (``Bench.time_torch_graph``:
    median of repeats)."""
    return round(b.time_torch_graph(fn, per_graph=n) * 1e3, 3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import numpy as np
    import torch
    import torch.nn.functional as F
    from specdec_lib.bench._harness import Bench
    from specdec_lib.orchestrator import make_backend
    from specdec_lib.reference.layers import rope_cos_sin_cache
    be = make_backend("torch")
    b = Bench(0)
    dev, bf = be.device, torch.bfloat16
    H, nq, nkv, D, I = 576, 9, 3, 64, 1536
    rep = {"device": torch.cuda.get_device_name(), "kernels_per_graph": args.n}
    one = torch.zeros(1, device=dev)
    rep["empty_add"] = per_kernel_us(b, lambda: one.add_(1), args.n)
    x = torch.randn(1, H, device=dev, dtype=bf)
    w = torch.ones(H, device=dev, dtype=bf)
    out = torch.empty_like(x)
    rep["rms_norm_1x576"] = per_kernel_us(b, lambda: be.rms_norm(x, w, out, eps=1e-5), args.n)
    res = torch.randn_like(x)
    rep["rms_norm_residual_1x576"] = per_kernel_us(
        b, lambda: be.rms_norm(x, w, out, eps=1e-5, residual=res, residual_out=res), args.n)
    q = torch.randn(1, nq, D, device=dev, dtype=bf)
    k = torch.randn(1, nkv, D, device=dev, dtype=bf)
    v = torch.randn(1, nkv, D, device=dev, dtype=bf)
    cs = torch.as_tensor(np.asarray(rope_cos_sin_cache(64, D, 1e5))).to(dev)
    kc = torch.zeros(4, 16, nkv, D, device=dev, dtype=bf)
    vc = torch.zeros_like(kc)
    i32 = dict(device=dev, dtype=torch.int32)
    pt = torch.arange(4, **i32).reshape(1, 4)
    pos, sl, cu = torch.zeros(1, **i32), torch.zeros(1, **i32), torch.tensor([0, 1], **i32)
    fin = torch.zeros(1, device=dev, dtype=torch.uint8)
    rep["rope_append_kv_1row"] = per_kernel_us(
        b, lambda: be.rope_append_kv(q, k, v, pos, cs, kc, vc, pt, sl, cu, fin), args.n)
    act = torch.randn(1, I, device=dev, dtype=bf)
    gu = torch.randn(1, 2 * I, device=dev, dtype=bf)
    rep["silu_mul_1x1536"] = per_kernel_us(b, lambda: be.silu_mul(gu, act), args.n)
    for name, (N, K) in dict(qkv=((nq + 2 * nkv) * D, H), o=(H, nq * D), gate_up=(2 * I, H),
                             down=(H, I), lm_head=(49152, H)).items():
        W = torch.randn(N, K, device=dev, dtype=bf) * 0.02
        a = torch.randn(1, K, device=dev, dtype=bf)
        rep[f"cublas_{name}_M1"] = per_kernel_us(b, lambda: F.linear(a, W), args.n // 10
                                                 if name == "lm_head" else args.n)
    print(json.dumps(rep, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rep, fh, indent=1)


if __name__ == "__main__":
    main()
