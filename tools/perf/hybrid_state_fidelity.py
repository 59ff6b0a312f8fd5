"""How a 16-bit GDN state drifts from the float32 state over a long reply (issue 30's state
fidelity bar): smollm2-hybrid (the shipped weights or --weights DIR) decodes --new tokens
greedily from each prompt in float32 state (no stop: the reply runs on through EOS); then each
state dtype's model reads that same sequence as decoding does (``kv_agreement.forced_logits``:
one committed row a step, the state rounded after every token) and its logits are compared with
the float32 state's, position by position: relative error ||a - b|| / ||a|| (mean and max per
window of positions) and greedy agreement (argmax equal). Free-running too: each dtype decodes
the prompt itself and the first position where its reply departs from float32's is reported.
Row-invariant ops throughout (``row_invariant=True``), so the comparison is exact up to the
state dtype. On the H200 (torch backend, ~1 min for 4 prompts x 1000 tokens x 3 dtypes):

  python3 tools/perf/hybrid_state_fidelity.py --prompts 4 --new 1000 --json fidelity.json

``--backend reference`` runs it on the CPU (slow at SmolLM2 size: use --new 32 there).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from e2e_smollm2 import general_prompts  # noqa: E402

from specdec_lib.models import load_smollm2_hybrid_target  # noqa: E402
from specdec_lib.models.kv_agreement import first_divergence, forced_logits  # noqa: E402
from specdec_lib.models.smollm2 import chat_prompt  # noqa: E402
from specdec_lib.orchestrator import make_backend  # noqa: E402
from specdec_lib.train import hybrid_eval  # noqa: E402


def greedy(target, prompt, n_new):
    """Target-only greedy reply of ``n_new`` tokens (no stop id: it runs on through EOS)."""
    return hybrid_eval.greedy(target, target.be, [prompt], n_new, ())[0]


def compare(ref, got, windows):
    """Per window [a, b) of reply positions: mean / max relative error and agreement."""
    rel = np.linalg.norm(got - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
    agree = ref.argmax(1) == got.argmax(1)
    out = {}
    for a, b in windows:
        b = min(b, len(rel))
        if a < b:
            out[f"{a}-{b}"] = dict(rel_mean=float(rel[a:b].mean()), rel_max=float(rel[a:b].max()),
                                   agreement=float(agree[a:b].mean()))
    out["all"] = dict(rel_mean=float(rel.mean()), rel_max=float(rel.max()),
                      agreement=float(agree.mean()))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", default=None, help="hybrid weights DIR (default: shipped)")
    p.add_argument("--gguf", default=None)
    p.add_argument("--backend", default="torch", choices=("torch", "reference"))
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new", type=int, default=1000)
    p.add_argument("--state-dtypes", default="bfloat16,float16")
    p.add_argument("--dtype", default="bfloat16", help="dense math (torch backend)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    be = make_backend(args.backend)
    dtypes = ["float32"] + [d for d in args.state_dtypes.split(",") if d and d != "float32"]
    targets = {}
    for sd in dtypes:
        targets[sd], tok = load_smollm2_hybrid_target(
            be, weights=args.weights, path=args.gguf, progress=False, row_invariant=True,
            state_dtype=sd, dtype=args.dtype)
    step = max(1, args.new // 10)
    windows = [(a, a + step) for a in range(0, args.new, step)]
    report = dict(new=args.new, backend=args.backend, dtype=args.dtype, prompts=[])
    t0 = time.perf_counter()
    for i, msgs in enumerate(general_prompts(args.prompts)):
        prompt = chat_prompt(tok, msgs)
        reply = greedy(targets["float32"], prompt, args.new)
        ref = forced_logits(targets["float32"], prompt, reply)
        row = dict(prompt_tokens=len(prompt), reply_tokens=len(reply), dtypes={})
        for sd in dtypes[1:]:
            got = forced_logits(targets[sd], prompt, reply)
            own = greedy(targets[sd], prompt, args.new)
            diverge = first_divergence(reply, own)
            row["dtypes"][sd] = dict(teacher_forced=compare(ref, got, windows),
                                     free_running_first_divergence=diverge)
            c = row["dtypes"][sd]["teacher_forced"]["all"]
            print(f"prompt {i} ({len(prompt)} + {len(reply)} tokens) {sd:8s}: rel err mean "
                  f"{c['rel_mean']:.2e} max {c['rel_max']:.2e}, greedy agreement "
                  f"{c['agreement']:.4f}, free-running first divergence {diverge}", flush=True)
        report["prompts"].append(row)
    for sd in dtypes[1:]:
        ag = [r["dtypes"][sd]["teacher_forced"]["all"]["agreement"] for r in report["prompts"]]
        last = [list(r["dtypes"][sd]["teacher_forced"].values())[-2] for r in report["prompts"]]
        print(f"{sd}: greedy agreement {np.mean(ag):.4f} over {len(ag)} prompts; last window "
              f"rel err mean {np.mean([w['rel_mean'] for w in last]):.2e}, agreement "
              f"{np.mean([w['agreement'] for w in last]):.4f}")
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
