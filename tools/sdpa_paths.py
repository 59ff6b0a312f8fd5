"""Which SDPA kernel a fresh sequence's causal prefill attention gets, and what it costs
(SmolLM2's shape: 128 rows, 9 query / 3 KV heads of 64, bf16, on the torch backend's GPU).

  python3 tools/sdpa_paths.py

"old": 3-D inputs with ``enable_gqa=True`` (what LlamaTarget used until session 13: torch
took its float32 math path); "new": ``_TorchMath.causal_attention`` (4-D, K/V heads
repeated: the flash kernel). Prints their relative difference, us per call replayed from a
CUDA graph, and the kernels the new call launches. s13 on the H200: rel 1.8e-3, 67.6-70.9
vs 12.3-12.9 us, cuDNN's sm90 flash forward.
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from types import SimpleNamespace  # noqa: E402

from specdec_lib.bench._harness import Bench  # noqa: E402
from specdec_lib.models.llama import _TorchMath  # noqa: E402


def main(n=128, calls=30):
    F = torch.nn.functional
    m = _TorchMath(SimpleNamespace(device=torch.device("cuda", 0)))
    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = torch.randn(n, 9, 64, **bf), torch.randn(n, 3, 64, **bf), torch.randn(n, 3, 64, **bf)

    def old():
        return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                              v.transpose(0, 1), is_causal=True, scale=0.125,
                                              enable_gqa=True).transpose(0, 1)

    def new():
        return m.causal_attention(q, k, v, 0.125)
    ref, got = old().double().cpu().numpy(), new().double().cpu().numpy()
    print("rel", np.linalg.norm(got - ref) / np.linalg.norm(ref))
    b = Bench(0)
    for name, f in (("old", old), ("new", new)):
        print(name, "us per call", round(b.time_torch_graph(f, per_graph=calls) * 1e3, 1))
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        new()
        torch.cuda.synchronize()
    print([e.key[:60] for e in p.key_averages() if getattr(e, "self_device_time_total", 0) > 0])


if __name__ == "__main__":
    main()
