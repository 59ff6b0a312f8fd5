"""End-to-end benchmark of SmolLM2-135M-Instruct through the library (torch backend, GPU).

  python3 tools/e2e_smollm2.py [--gguf PATH] [--new 256] [--json OUT.json] [--quick]

Runs, each with the round captured as one CUDA graph (warm-up and capture outside the timing):
  * B=1 greedy, 8 copy-heavy prompts and 8 open-ended prompts, one request at a time:
    target-only and prompt-lookup speculative (k=3), tokens/s, acceptance per position, mean
    accepted length; generation runs through EOS (no stop ids) for a fixed token count;
  * B=32 mixed prompts: target-only and speculative;
  * the rescoring check of every emitted token (one plain forward pass over each final
    sequence; a token within --tie-tolerance of the best logit is a tie, counted);
  * where a round's GPU time goes (torch.profiler over graph replays, kernels grouped).
Prints one summary table; --json writes every number.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from specdec_lib.demo import rescoring_check  # noqa: E402
from specdec_lib.models import load_smollm2_target  # noqa: E402
from specdec_lib.models.ngram import NgramDraft  # noqa: E402
from specdec_lib.models.smollm2 import (COPY_PROMPTS, OPEN_PROMPTS, STOP_TOKEN_IDS,  # noqa: E402
                                        chat_prompt)
from specdec_lib.orchestrator import Request, SpeculativeDecoder, make_backend  # noqa: E402


def decode(target, draft, k, be, reqs, slots=None):
    """Warm-up of the same shapes, then one timed run; returns (results, metrics)."""
    warm = [Request(prompt=r.prompt, max_new_tokens=4) for r in reqs]
    SpeculativeDecoder(target, draft, num_speculative_tokens=k, backend=be,
                       cuda_graph=True).generate(warm)
    dec = SpeculativeDecoder(target, draft, num_speculative_tokens=k, backend=be,
                             cuda_graph=True, capture_first=True)
    res = dec.generate(reqs) if slots is None else dec.serve(reqs, slots=slots)
    return res, dec.metrics


def one_at_a_time(target, draft, k, be, reqs):
    """B=1: each request alone; metrics summed."""
    out, tot = [], None
    for r in reqs:
        res, m = decode(target, draft, k, be, [r])
        out += res
        if tot is None:
            tot = m
        else:
            for f in ("rounds", "row_rounds", "proposed", "accepted", "emitted", "wall_s",
                      "capture_s", "launch_s", "launched_rounds", "prefill_s"):
                setattr(tot, f, getattr(tot, f) + getattr(m, f))
            tot.accept_counts = [a + b for a, b in zip(tot.accept_counts, m.accept_counts)]
    return out, tot


def summary(m):
    return dict(tokens=m.emitted, seconds=round(m.wall_s - m.capture_s, 4),
                tokens_per_s=round(m.tokens_per_s, 1), rounds=m.rounds,
                mean_accepted_length=round(m.mean_accepted_length, 3),
                per_position_acceptance=[round(x, 3) for x in m.per_position_acceptance],
                host_us_per_round=round(m.host_us_per_round, 1),
                prefill_s=round(m.prefill_s, 4))


def round_profile(target, draft, k, be, prompt, rounds=20):
    """GPU time per round by kernel group, from torch.profiler over graph replays."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    reqs = [Request(prompt=prompt, max_new_tokens=rounds * (k + 1) + 8)]
    warm = [Request(prompt=prompt, max_new_tokens=4)]
    SpeculativeDecoder(target, draft, num_speculative_tokens=k, backend=be,
                       cuda_graph=True).generate(warm)
    dec = SpeculativeDecoder(target, draft, num_speculative_tokens=k, backend=be,
                             cuda_graph=True, capture_first=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        dec.generate(reqs)
        torch.cuda.synchronize()
    groups = {}
    for ev in prof.key_averages():
        if ev.device_type.name != "CUDA" and getattr(ev, "self_device_time_total", 0) == 0:
            continue
        t = getattr(ev, "self_device_time_total", 0) or getattr(ev, "self_cuda_time_total", 0)
        if t <= 0:
            continue
        n = ev.key.lower()
        g = ("attention (verify)" if "verify_attention" in n else
             "sampling" if "spec_sample" in n else
             "prefill attention" if ("flash" in n or "fmha" in n or "attention" in n) else
             "GEMM" if ("gemm" in n or "xmma" in n or "cutlass" in n or "sm90" in n or "ampere" in n) else
             "norm / rope / silu" if any(s in n for s in ("rms_norm", "rope", "silu_mul")) else
             "KV append" if "append_kv" in n else
             "sequence / draft ops" if any(s in n for s in ("seq_", "ngram", "draft_")) else
             "other (copies, torch elementwise)")
        groups[g] = groups.get(g, 0.0) + t
    m = dec.metrics
    per_round = {g: round(t / max(m.rounds, 1), 1) for g, t in sorted(groups.items(), key=lambda x: -x[1])}
    return dict(rounds=m.rounds, gpu_us_per_round=per_round,
                wall_us_per_round=round(1e6 * (m.wall_s - m.capture_s - m.prefill_s) / max(m.rounds, 1), 1),
                host_enqueue_us_per_round=round(m.host_us_per_round, 1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", default=None)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--new32", type=int, default=128)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--tie-tolerance", type=float, default=0.25)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="2 prompts per set, B=8")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="requests stop at <|im_end|> / <|endoftext|> (natural replies; tokens/s "
                        "over the tokens emitted) instead of generating through EOS")
    args = p.parse_args()
    import torch
    be = make_backend("torch")
    t0 = time.perf_counter()
    target, tok = load_smollm2_target(be, path=args.gguf, progress=False)
    print(f"loaded in {time.perf_counter() - t0:.1f} s; weights {target.weight_bytes / 1e6:.0f} MB bf16")
    draft = NgramDraft(be)
    k = args.k
    n_sets = 2 if args.quick else 8
    sets = {"copy": COPY_PROMPTS[:n_sets], "open": OPEN_PROMPTS[:n_sets]}
    report = {"device": torch.cuda.get_device_name(), "k": k}
    rows = []
    stops = dict(stop_token_ids=STOP_TOKEN_IDS) if args.stop_at_eos else {}
    report["stop_at_eos"] = bool(args.stop_at_eos)

    def case(label, key, reqs, run, **extra):
        """Target-only and speculative runs of ``reqs``, both rescored; one report entry."""
        base, mb = run(target, None, 0, be, reqs)
        spec, ms = run(target, draft, k, be, reqs)
        same = sum(x.tokens == y.tokens for x, y in zip(base, spec))
        chk = {}
        for lab, res in (("target_only", base), ("speculative", spec)):
            n, ties, bad = rescoring_check(target, reqs, res, args.tie_tolerance)
            chk[lab] = dict(tokens=n, ties=ties, mismatches=len(bad), first=bad[:3])
        report[key] = dict(target_only=summary(mb), speculative=summary(ms),
                           identical_requests=same, of=len(reqs), rescoring=chk,
                           sample_reply=tok.decode(spec[0].tokens[:80]), **extra)
        rows.append((label, mb, ms, same, len(reqs), chk))

    for name, texts in sets.items():
        reqs = [Request(prompt=chat_prompt(tok, t), max_new_tokens=args.new, **stops) for t in texts]
        case(f"B=1 {name}", f"b1_{name}", reqs, one_at_a_time)
    B = 8 if args.quick else 32
    texts = (COPY_PROMPTS + OPEN_PROMPTS) * (B // 16 + 1)
    reqs = [Request(prompt=chat_prompt(tok, t), max_new_tokens=args.new32, **stops)
            for t in texts[:B]]
    case(f"B={B} mixed", f"b{B}_mixed", reqs, decode)
    try:
        report["round_profile_spec_b1"] = round_profile(target, draft, k, be, reqs[0].prompt)
        report["round_profile_base_b1"] = round_profile(target, None, 0, be, reqs[0].prompt)
    except Exception as e:      # the profiler is a report, not the benchmark
        report["round_profile_error"] = f"{type(e).__name__}: {e}"
    print(f"\n{'case':14s} {'target-only tok/s':>18s} {'spec tok/s':>11s} {'speed-up':>9s} "
          f"{'acc len':>8s} {'per position':>20s} {'same':>6s} {'mismatch (ties)':>16s}")
    for lab, mb, ms, same, n, chk in rows:
        mm = sum(c["mismatches"] for c in chk.values())
        tt = sum(c["ties"] for c in chk.values())
        print(f"{lab:14s} {mb.tokens_per_s:18,.1f} {ms.tokens_per_s:11,.1f} "
              f"{ms.tokens_per_s / mb.tokens_per_s:8.2f}x {ms.mean_accepted_length:8.2f} "
              f"{' '.join(f'{x:.2f}' for x in ms.per_position_acceptance):>20s} {same:>3d}/{n:<2d} "
              f"{mm:>8d} ({tt})")
    for key in ("round_profile_spec_b1", "round_profile_base_b1", "round_profile_error"):
        if key in report:
            print(key, json.dumps(report[key]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
