"""A/B of a fixed k and ``num_speculative_tokens="auto"`` at B=1 (the H200 question of s17:
auto chose k=4 on every round yet took 16% longer than k=4 with the MTP head, 3% with EAGLE3).

  python3 tools/perf/autok_ab.py [--draft mtp] [-k 4] [--prompts 32] [--new 256] [--reps 2]
                                 [--gc on|off|freeze] [--json OUT.json]

The e2e_smollm2 B=1 case (its ``decoder`` warm-up, then each held-out prompt in a call of its
own), the two decoders in ABBA order ``--reps`` times, each run fresh. Per run: seconds and
rounds (as e2e_smollm2 counts them), and where a round's period goes:

  period      median / p90 / max / sum of the time from one round's end to the next's
              (``on_round``), prefill rounds left out
  device      median / sum of each round replay's GPU time (CUDA events around it; torch)
  policy      host us a round in before_round (the GPU idles through it); policy_overlap:
              in after_round + prepare (run while the next round is on the GPU, since s27)
  launch      host us a round in the replay call (metrics.host_us_per_round)
  gc          collections and their time inside the timed calls (gc.callbacks)
  graphs      captures inside the timed calls, replays per graph key, the plan each call's
              last round proposed (never verified: it decides no round, only a graph)

So a gap between the two shows up as GPU time (device), host time on the critical path
(policy, launch, the rest of the period), or the process (gc); ABBA and --reps show the
noise. --backend reference runs it on the CPU (slow; acceptance and counts only).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import e2e_smollm2 as e2e  # noqa: E402
from specdec_lib.models import load_smollm2_target  # noqa: E402
from specdec_lib.models.smollm2 import chat_prompt  # noqa: E402
from specdec_lib.models.heads import smollm2_head  # noqa: E402
from specdec_lib.models.llama_draft import LlamaDraftHead  # noqa: E402
from specdec_lib.models.prompts import stdlib_prompts  # noqa: E402
from specdec_lib.orchestrator import Request, make_backend  # noqa: E402


def _stats(xs):
    xs = np.asarray(xs, float) * 1e6
    if not len(xs):
        return {}
    return dict(median=round(float(np.median(xs)), 1), p90=round(float(np.percentile(xs, 90)), 1),
                max=round(float(xs.max()), 1), sum_ms=round(float(xs.sum()) / 1e3, 2))


def run(target, draft, k, be, reqs, gc_mode):
    """One fresh decoder of ``k`` (an int or "autoN"), warmed up as e2e_smollm2's, then each
    request in a call of its own; returns the numbers of the module docstring."""
    dec = e2e.decoder(target, draft, k, be, reqs)
    spec = dec.spec
    pc = time.perf_counter
    policy_s = [0.0, 0.0]       # before_round; after_round + prepare (overlapped)
    real = {n: getattr(spec, n) for n in ("before_round", "after_round", "prepare")
            if hasattr(spec, n)}

    def timed(fn, i):
        def call(*a, **kw):
            t0 = pc()
            try:
                return fn(*a, **kw)
            finally:
                policy_s[i] += pc() - t0
        return call
    for n, fn in real.items():
        object.__setattr__(spec, n, timed(fn, 0 if n == "before_round" else 1))
    torch = None
    if be.name == "torch":
        import torch
    events, per_key = [], {}
    st = dec._state                     # (None: no warm-up, a backend without graphs)
    captured = dict(st.replays) if st is not None else {}

    def wrap(key, replay):
        def call():
            per_key[key] = per_key.get(key, 0) + 1
            if torch is None:
                return replay()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            replay()
            b.record()
            events.append((a, b))
        return call
    if st is not None:
        st.replays.update({key: wrap(key, r) for key, r in st.replays.items()})
    gcs = []
    gc_t = {}

    def on_gc(phase, info):
        if phase == "start":
            gc_t["t"] = pc()
        else:
            gcs.append((info["generation"], pc() - gc_t.get("t", pc())))
    periods, last_plans = [], []
    stamp = [None]

    def on_round(_):
        t = pc()
        if stamp[0] is not None:
            periods.append(t - stamp[0])
        stamp[0] = t
    if gc_mode == "off":
        gc.disable()
    elif gc_mode == "freeze":
        gc.collect()
        gc.freeze()
    gc.callbacks.append(on_gc)
    out = []
    try:
        for r in reqs:
            stamp[0] = None             # the first round's period holds the prefill
            out += dec.serve([r], slots=1, on_round=on_round)
            last_plans.append(getattr(spec, "last", None))
    finally:
        gc.callbacks.remove(on_gc)
        if gc_mode == "off":
            gc.enable()
        elif gc_mode == "freeze":
            gc.unfreeze()
        for n in real:
            object.__delattr__(spec, n)
    m = dec.metrics
    if torch is not None:
        torch.cuda.synchronize()
    device = [a.elapsed_time(b) / 1e3 for a, b in events]
    new_graphs = [key for key in dec._state.replays if key not in captured]
    return out, dict(
        seconds=round(m.wall_s - m.capture_s, 4), rounds=m.rounds,
        k_rounds=dict(sorted(m.k_rounds.items())), capture_s=round(m.capture_s, 4),
        period_us=_stats(periods), device_us=_stats(device),
        policy_us_per_round=round(1e6 * policy_s[0] / max(m.rounds, 1), 1),
        policy_overlap_us_per_round=round(1e6 * policy_s[1] / max(m.rounds, 1), 1),
        launch_us_per_round=round(m.host_us_per_round, 1),
        gc=dict(collections=[sum(g == i for g, _ in gcs) for i in range(3)],
                ms=round(1e3 * sum(t for _, t in gcs), 2)),
        graphs=dict(captured_in_timed_calls=[str(k) for k in new_graphs],
                    replays={str(k): v for k, v in sorted(per_key.items(), key=str)},
                    last_proposes=[None if p is None else p.propose for p in last_plans]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--draft", default="mtp", help="mtp or eagle3 (the shipped heads)")
    p.add_argument("-k", type=int, default=4, help="the fixed k; auto runs AutoK(k)")
    p.add_argument("--prompts", type=int, default=32, help="held-out prompts, one call each")
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--reps", type=int, default=2, help="ABBA repetitions")
    p.add_argument("--gc", default="on", choices=("on", "off", "freeze"),
                   help="the garbage collector in the timed calls")
    p.add_argument("--backend", default="torch")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    be = make_backend(args.backend)
    target, tok = load_smollm2_target(be, progress=False)
    draft = LlamaDraftHead.load(target, smollm2_head(args.draft), args.draft)
    reqs = [Request(prompt=chat_prompt(tok, t), max_new_tokens=args.new)
            for t in stdlib_prompts("heldout")[:args.prompts]]
    fixed, auto = args.k, f"auto{args.k}"
    report = dict(draft=args.draft, k=args.k, prompts=len(reqs), new=args.new, gc=args.gc, runs=[])
    base = None
    for rep in range(args.reps):
        for k in ((fixed, auto) if rep % 2 == 0 else (auto, fixed)):
            out, r = run(target, draft, k, be, reqs, args.gc)
            toks = [x.tokens for x in out]
            base = base or toks
            r.update(spec=str(k), rep=rep, identical=toks == base)
            report["runs"].append(r)
            print(json.dumps(r), flush=True)
    for k in (str(fixed), auto):
        rs = [r for r in report["runs"] if r["spec"] == k]
        print(f"{k:>6}: seconds {[r['seconds'] for r in rs]}, rounds {[r['rounds'] for r in rs]}, "
              f"period median {[r['period_us'].get('median') for r in rs]} us, device median "
              f"{[r['device_us'].get('median') for r in rs]} us, policy "
              f"{[r['policy_us_per_round'] for r in rs]} us, launch "
              f"{[r['launch_us_per_round'] for r in rs]} us, gc ms {[r['gc']['ms'] for r in rs]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
