"""Run ahead against reading every round first, without the SmolLM2 GGUF: a random Llama of
SmolLM2-135M's shapes (30 layers, 576 wide, 9 / 3 heads of 64, MLP 1536, vocabulary 49152)
on the torch backend with graphs, target-only and the shipped EAGLE3 head at a fixed k (its
drafts land rarely on random weights: the round costs are real, the acceptance is not).
Per mode, wall us a round and tokens/s, B=1 (one request at a time) and B=32 (one serve call).

    python tools/perf/run_ahead_ab.py [--new 128] [--prompts 8] [--k 3] [--repeats 2]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

import numpy as np  # noqa: E402

import e2e_smollm2 as e2e  # noqa: E402
from toy_models import toy_llama  # noqa: E402
from specdec_lib.models.llama import LlamaTarget  # noqa: E402
from specdec_lib.orchestrator import Request  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    be = e2e.make_backend("torch")
    c, w = toy_llama(L=30, H=576, nq=9, nkv=3, D=64, I=1536, V=49152, context=2048,
                     attn_scale=0.05)
    target = LlamaTarget(c, w, be)
    draft = e2e.LlamaDraftHead.load(target, e2e.smollm2_head("eagle3"), "eagle3")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, c.vocab_size, int(n)).tolist()
               for n in rng.integers(20, 200, max(args.prompts, args.batch))]
    b1 = [Request(prompt=q, max_new_tokens=args.new) for q in prompts[:args.prompts]]
    bb = [Request(prompt=q, max_new_tokens=args.new) for q in prompts[:args.batch]]
    for rep in range(args.repeats):
        for name, d, k, ahead in (("target_only", None, 0, True), ("target_only:sync", None, 0, False),
                                  (f"k{args.k}", draft, args.k, True),
                                  (f"k{args.k}:sync", draft, args.k, False)):
            for B, reqs in ((1, b1), (args.batch, bb)):
                dec = e2e.decoder(target, d, k, be, reqs, B if B > 1 else None, run_ahead=ahead)
                t0 = time.perf_counter()
                if B == 1:
                    for r in reqs:
                        dec.generate([r])
                else:
                    dec.serve(reqs, slots=B)
                wall = time.perf_counter() - t0
                m = dec.metrics
                print(f"rep {rep} B={B:3d} {name:18s} rounds {m.rounds:5d} overrun "
                      f"{m.overrun_rounds} wall/round {1e6 * (wall - m.prefill_s) / m.rounds:7.1f} us "
                      f"tok/s {m.tokens_per_s:9.1f} accepted/round {m.mean_accepted_length:.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
