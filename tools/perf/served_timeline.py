"""Where a served stream's GPU time goes: e2e_smollm2's served case (N mixed requests through
B slots, greedy, stops at EOS), target-only and each (draft, k), split into the rounds with
every slot busy, the rounds with idle slots (the draining tail and the rounds before an
admission), the admissions with their prefills, and the GPU's waits for the host before them.

An event is recorded on the stream before each admission, after its prefill and after each
round's launch; the GPU passes an event once the work before it is done and the host has
enqueued it, so consecutive events cut the GPU's timeline into segments that add up to the
call's: an admission's first segment is the GPU waiting for the host (the round before it
ended before the host reached the admission), its second the admission's copies and prefill
passes (with any idle time inside), a round's the round (with any idle time before it).

  python3 tools/perf/served_timeline.py [--gguf PATH] --drafts eagle3 -k 3 [--auto 3]
      [--serve 128 --slots 32 --new 128] [--pageable-upload] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import e2e_smollm2 as e2e  # noqa: E402

from specdec_lib.orchestrator import decoder as decoder_mod  # noqa: E402
from specdec_lib.orchestrator import serve as serve_mod  # noqa: E402
from specdec_lib.orchestrator import state  # noqa: E402


class Marks:
    """Timing events on torch's current stream (the torch backend's), with what each ends."""

    def __init__(self, torch):
        self.torch, self.all = torch, []

    def __call__(self, kind, **info):
        capturing = getattr(self.torch.cuda, "is_current_stream_capturing", lambda: False)
        if capturing():             # (a round recorded as a graph: its replays are marked)
            return
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        self.all.append((kind, ev, info))


class _MarkedReplays(dict):
    """A call state's graphs, each replay followed by a "round" mark."""

    def __init__(self, replays, marks, busy):
        super().__init__(replays)
        self.marks, self.busy = marks, busy

    def get(self, key, default=None):
        graph = dict.get(self, key, default)
        if graph is None:
            return None

        def replay():
            graph()
            self.marks("round", key=key, busy=self.busy[0])
        return replay


class _Counting:
    """The speculation policy, noting each round's busy slot count for its mark."""

    def __init__(self, spec, busy):
        self._spec, self._busy = spec, busy

    def __getattr__(self, name):
        return getattr(self._spec, name)

    def before_round(self, busy):
        self._busy[0] = int(busy.sum())
        return self._spec.before_round(busy)


def traced(marks):
    """Patch the serving loop so its call marks admissions, prefills and rounds; returns the
    undo."""
    real_serve, real_admit, real_prefill = decoder_mod._serve, serve_mod.admit, serve_mod.prefill
    real_round = serve_mod.run_round
    busy = [0]

    def run_round(p, st, plan):         # a round run eagerly (no graph)
        real_round(p, st, plan)
        marks("round", key=plan.key, busy=busy[0])

    def serve(p, st, reqs, arrivals, **kw):
        kw["spec"] = _Counting(kw["spec"], busy)
        st.replays = _MarkedReplays(st.replays, marks, busy)
        marks("start")
        try:
            return real_serve(p, st, reqs, arrivals, **kw)
        finally:
            marks("end")
            st.replays = dict(st.replays)

    def admit(p, st, admitted):
        marks("admit", n=len(admitted))
        return real_admit(p, st, admitted)

    def prefill(p, st, admitted, policy, can_capture, metrics):
        out = real_prefill(p, st, admitted, policy, can_capture, metrics)
        L = st.shape.max_len
        marks("prefill", rows=[len(r.prompt) - 1 for _, r in admitted],
              buckets=[policy.bucket(len(r.prompt) - 1, L) for _, r in admitted],
              batched=not policy.use_buckets(p.target, can_capture, len(admitted)))
        return out
    decoder_mod._serve, serve_mod.admit, serve_mod.prefill = serve, admit, prefill
    serve_mod.run_round = run_round

    def undo():
        decoder_mod._serve, serve_mod.admit, serve_mod.prefill = real_serve, real_admit, real_prefill
        serve_mod.run_round = real_round
    return undo


def split(marks, slots):
    """The segments between consecutive marks, summed by what they end (ms)."""
    torch = marks.torch
    torch.cuda.synchronize()
    seg = Counter()
    count = Counter()
    per_admission = Counter()
    buckets = Counter()
    rounds_full = []
    tail = []           # (busy slots, us) of each round after the last admission
    last_admit = max((i for i, (k, _, _) in enumerate(marks.all) if k == "admit"), default=0)
    prev = marks.all[0][1]
    for i, (kind, ev, info) in enumerate(marks.all[1:], 1):
        ms = prev.elapsed_time(ev)
        prev = ev
        if kind == "admit":
            key = "host_wait_before_admission"
            per_admission[info["n"]] += 1
        elif kind == "prefill":
            key = "admission_batched" if info["batched"] else "admission_bucketed"
            buckets.update(info["buckets"])
        elif kind == "round":
            if info["busy"] == slots:
                key = "rounds_full"
                rounds_full.append(ms)
            elif i > last_admit:
                key = "rounds_tail"
                tail.append((info["busy"], round(1e3 * ms, 1)))
            else:
                key = "rounds_idle_slots"
        else:
            key = kind
        seg[key] += ms
        count[key] += 1
    total = marks.all[0][1].elapsed_time(marks.all[-1][1])
    rounds_full.sort()
    return dict(total_ms=round(total, 2),
                segments_ms={k: round(v, 2) for k, v in sorted(seg.items())},
                segments_n=dict(sorted(count.items())),
                round_full_median_us=round(1e3 * rounds_full[len(rounds_full) // 2], 1)
                if rounds_full else None,
                requests_per_admission=dict(sorted(per_admission.items())),
                prefill_buckets=dict(sorted(buckets.items())),
                tail_rounds=tail)


def variant(policy, text, upload, live):
    """(PrefillPolicy, ASYNC_UPLOAD, LIVE_ROWS) of a --variants entry: "flags", or gG / hH / a
    / l."""
    if text == "flags":
        return policy, upload, live
    m = re.fullmatch(r"g(\d+)(?:h(\d+))?(a?)(l?)", text)
    if not m:
        raise SystemExit(f"--variants: {text!r} is not gG[hH][a][l]")
    return (replace(policy, group=int(m[1]), hold_rounds=int(m[2] or 0)), bool(m[3]),
            bool(m[4]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    e2e.add_decode_options(p)
    e2e.add_prefill_options(p)
    p.add_argument("--gguf", default=None)
    p.add_argument("--drafts", default="eagle3")
    p.add_argument("-k", default="3", help="fixed k's, comma-separated")
    p.add_argument("--auto", type=int, default=0, metavar="K_MAX", help="also AutoK(K_MAX)")
    p.add_argument("--serve", type=int, default=128)
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2, help="traced runs a mode, in turns")
    p.add_argument("--variants", default="", help="comma-separated prefill variants, each "
                   "run on the same decoders in turns: gG (PrefillPolicy.group G), hH "
                   "(hold_rounds H), a (state.ASYNC_UPLOAD), l (serve.LIVE_ROWS), e.g. "
                   "g1,g4,g4h4,g8h6a,g8h6al; default: "
                   "the flags' policy alone")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    e2e.apply_decode_options(p, args)
    e2e.PREFILL = e2e.prefill_policy(args)
    import torch
    be = e2e.make_backend("torch")
    target, tok = e2e.load_smollm2_target(be, path=args.gguf, progress=False)
    heads = {n: e2e.LlamaDraftHead.load(target, e2e.smollm2_head(n), n)
             for n in args.drafts.split(",") if n}
    pool = e2e.pool_of(32)
    B = args.slots
    texts = ((pool["heldout"][8:8 + B // 2] + e2e.COPY_PROMPTS + e2e.OPEN_PROMPTS)
             * (B // 16 + 1))[:B]
    reqs = [e2e.Request(prompt=e2e.chat_prompt(tok, t), max_new_tokens=args.new,
                        stop_token_ids=e2e.STOP_TOKEN_IDS)
            for t in (texts * (args.serve // len(texts) + 1))[:args.serve]]
    modes = [("target_only", None, 0)] + [
        (f"{n}_k{k}", d, int(k)) for k in args.k.split(",") for n, d in heads.items()] + [
        (f"{n}_auto{args.auto}", d, f"auto{args.auto}") for n, d in heads.items() if args.auto]
    decs = {}
    for name, draft, k in modes:
        decs[name] = e2e.decoder(target, draft, k, be, reqs, B)
    report = dict(device=torch.cuda.get_device_name(), serve=args.serve, slots=B,
                  new=args.new, async_upload=bool(not args.pageable_upload), runs={})
    variants = {v: variant(e2e.PREFILL, v, not args.pageable_upload, not args.whole_blocks)
                for v in (args.variants.split(",") if args.variants else ["flags"])}
    turns = [(v, m) for v in variants for m in modes]
    for rep in range(args.repeats):
        for v, (name, _, _) in (turns if rep % 2 == 0 else turns[::-1]):
            dec = decs[name]
            dec.prefill_policy, state.ASYNC_UPLOAD, serve_mod.LIVE_ROWS = variants[v]
            name = f"{v}/{name}"
            dec.serve(reqs, slots=B)            # untimed: warm again
            dec.reset_metrics()
            marks = Marks(torch)
            undo = traced(marks)
            t0 = time.perf_counter()
            try:
                dec.serve(reqs, slots=B)
            finally:
                undo()
            wall = time.perf_counter() - t0
            m = dec.metrics
            out = split(marks, B)
            out.update(wall_ms=round(1e3 * wall, 2), tokens=m.emitted, rounds=m.rounds,
                       tokens_per_s=round(m.emitted / wall, 1),
                       accepted=round(m.mean_accepted_length, 3), prefill_host_ms=round(
                           1e3 * m.prefill_s, 2), admissions=m.admissions,
                       k_rounds=dict(sorted(m.k_rounds.items())))
            report["runs"].setdefault(name, []).append(out)
            # (the tail's rounds one by one go to --json only; here their mean by busy slots)
            by = {}
            for busy, us in out["tail_rounds"]:
                by.setdefault(busy, []).append(us)
            print(name, json.dumps({k: v for k, v in out.items() if k != "tail_rounds"}),
                  "tail us by busy:", {b: round(sum(v) / len(v)) for b, v in sorted(by.items())},
                  flush=True)
    for name, runs in report["runs"].items():
        base = report["runs"][name.split("/")[0] + "/target_only"]
        tps = [r["tokens_per_s"] for r in runs]
        print(f"{name}: tok/s {tps}, over target-only "
              f"{[round(a / b['tokens_per_s'], 3) for a, b in zip(tps, base)]}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
