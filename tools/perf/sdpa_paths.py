"""Which SDPA kernel a fresh sequence's causal prefill attention gets, and what it costs
(SmolLM2's shape: 128 rows, 9 query / 3 KV heads of 64, bf16, on the torch backend's GPU).

  python3 tools/perf/sdpa_paths.py

"math": 3-D inputs with ``enable_gqa=True`` (what LlamaTarget used until session 13: torch
took its float32 math path); "bf16": 4-D, K/V heads repeated (session 13's: cuDNN's flash
kernel, probabilities rounded to bf16: ``_TorchMath.causal_attention``); "fp32": the same
4-D call on float32 copies (the memory-efficient kernel). Prints each one's relative
difference to float64 attention, us per call replayed from a CUDA graph, and the kernels
the bf16 call launches. s14 on the H200: rel 1.54e-3 / 1.85e-3 / 1.54e-3, 41.5 / 10.6 /
26.9 us (s13: math 67.6-70.9 us).
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from types import SimpleNamespace  # noqa: E402

from specdec_lib.bench._harness import Bench  # noqa: E402
from specdec_lib.models.llama import _TorchMath  # noqa: E402


def main(n=128, calls=30):
    F = torch.nn.functional
    m = _TorchMath(SimpleNamespace(device=torch.device("cuda", 0)))
    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = torch.randn(n, 9, 64, **bf), torch.randn(n, 3, 64, **bf), torch.randn(n, 3, 64, **bf)

    def math(q=q, k=k, v=v):
        return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                              v.transpose(0, 1), is_causal=True, scale=0.125,
                                              enable_gqa=True).transpose(0, 1)

    def bf16():
        return m.causal_attention(q, k, v, 0.125)

    def fp32():
        def heads(x):
            return m.repeat_heads(x.float(), 9).transpose(0, 1)[None]
        return F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True,
                                              scale=0.125)[0].transpose(0, 1).bfloat16()
    exact = math(q.double(), k.double(), v.double()).cpu().numpy()
    b = Bench(0)
    for name, f in (("math", math), ("bf16", bf16), ("fp32", fp32)):
        got = f().double().cpu().numpy()
        print(name, "rel to float64", float(np.linalg.norm(got - exact) / np.linalg.norm(exact)),
              "us per call", round(b.time_torch_graph(f, per_graph=calls) * 1e3, 1))
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        bf16()
        torch.cuda.synchronize()
    print([e.key[:60] for e in p.key_averages() if getattr(e, "self_device_time_total", 0) > 0])


if __name__ == "__main__":
    main()
