"""Where a B=1 round's period goes on the host: per mode (target-only, a fixed k, auto), the
mean per round of the GPU time (events around each replay), the replay call, the two reads,
the policy's calls, and the rest of the period (serve's own bookkeeping), over N requests
decoded one at a time as e2e_smollm2's B=1 sets are.

    python tools/perf/host_phases.py [--prompts 16] [--new 128] [--draft eagle3] [-k 4]
                                     [--row-invariant] [--cublas-rows]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

import e2e_smollm2 as e2e  # noqa: E402
from specdec_lib.models.smollm2 import STOP_TOKEN_IDS, chat_prompt  # noqa: E402
from specdec_lib.orchestrator import Request  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--draft", default="eagle3")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--batch", type=int, default=1, help="B > 1: the prompts in one serve "
                   "call over B slots (--prompts B), 3 runs")
    p.add_argument("--no-gc", action="store_true", help="gc.disable() while timing")
    p.add_argument("--nodrain", action="store_true", help="also AutoK(k, drain=False)")
    p.add_argument("--also-k", default="", help="more fixed k's, comma-separated (e.g. 1)")
    p.add_argument("--modes", default=None, help="the modes in this order instead, comma-"
                   "separated: target_only, kN, autoN[nodrain][table] (e.g. a mode twice: "
                   "drift), each with ':sync' for run_ahead=False (every round read before "
                   "the next launch)")
    p.add_argument("--row-invariant", action="store_true", help="the target's decode GEMMs "
                   "through the library's linear (LlamaTarget row_invariant=True)")
    p.add_argument("--cublas-rows", action="store_true", help="the target's few-row decode "
                   "GEMMs through cuBLAS (LlamaTarget small_rows=False), as before s40")
    p.add_argument("--replay-probe", type=int, default=0, metavar="N", help="after each "
                   "mode's timed runs, its most used graphs replayed N times in a row each "
                   "and N times alternating (the GPU time of a graph alone and after another)")
    e2e.add_decode_options(p)
    p.add_argument("--cuda-core-linear", action="store_true", help="linear's few-row calls "
                   "on the CUDA-core kernels (ops.layers.TUNING['linear_mma'] = False; the "
                   "target's passes of <= 5 rows on linear, models.llama.SMALL_ROWS_MAX), not "
                   "the tensor-core ones the few-row decode asks for")
    p.add_argument("--kernels", type=int, default=0, metavar="N", help="after each mode, N "
                   "replays of its most used graph under torch.profiler: GPU time per kernel "
                   "name (us a replay, launches a replay)")
    args = p.parse_args()
    e2e.apply_decode_options(p, args)
    from specdec_lib.ops import layers as ops_layers
    if args.cuda_core_linear:
        ops_layers.TUNING.update(linear_mma=False)
    if args.batch > 1:
        args.prompts = args.batch
    be = e2e.make_backend("torch")
    target, tok = e2e.load_smollm2_target(be, progress=False, row_invariant=args.row_invariant,
                                          small_rows=not args.cublas_rows)
    draft = e2e.LlamaDraftHead.load(target, e2e.smollm2_head(args.draft), args.draft)
    texts = e2e.pool_of(args.prompts)["general"][:args.prompts]
    reqs = [Request(prompt=chat_prompt(tok, t), max_new_tokens=args.new,
                    stop_token_ids=STOP_TOKEN_IDS) for t in texts]
    modes = [("target_only", None, 0)] + [
        (f"k{kk}", draft, kk) for kk in [int(x) for x in args.also_k.split(",") if x] + [args.k]
    ] + [(f"auto{args.k}", draft, f"auto{args.k}")]
    if args.nodrain:
        modes.append((f"auto{args.k}nodrain", draft, f"auto{args.k}nodrain"))
    if args.modes:
        modes = []
        for name in args.modes.split(","):
            m = name.removesuffix(":sync")
            modes.append((name, None, 0) if m == "target_only" else
                         (name, draft, int(m[1:]) if m.startswith("k") and m[1:].isdigit() else m))
    for name, d, k in modes:
        dec = e2e.decoder(target, d, k, be, reqs, args.batch if args.batch > 1 else None,
                          run_ahead=not name.endswith(":sync"))
        acc = {"read": 0.0, "replay": 0.0, "policy_before": 0.0, "policy_after": 0.0,
               "gap": 0.0}
        orig_to_host, orig_async = be.to_host, be.to_host_async

        mark = {"read_end": None}

        def to_host(a, _o=orig_to_host):
            t = time.perf_counter()
            r = _o(a)
            mark["read_end"] = time.perf_counter()
            acc["read"] += mark["read_end"] - t
            return r
        be.to_host = to_host

        def to_host_async(a, _o=orig_async):
            # read: the wait in the handle (the host idle until the round ends); gap: from
            # there to the next launch (run ahead, the GPU runs the next round meanwhile)
            t = time.perf_counter()
            h = _o(a)
            acc["read"] += time.perf_counter() - t

            def wait():
                t = time.perf_counter()
                r = h()
                mark["read_end"] = time.perf_counter()
                acc["read"] += mark["read_end"] - t
                return r
            return wait
        be.to_host_async = to_host_async
        spec = dec.spec
        saved = {}
        for meth, key in (("before_round", "policy_before"), ("after_round", "policy_after"),
                          ("prepare", "policy_after")):
            f = getattr(spec, meth, None)
            if f is None:
                continue
            saved[meth] = f

            def wrap(*a, _f=f, _k=key, **kw):
                t = time.perf_counter()
                r = _f(*a, **kw)
                acc[_k] += time.perf_counter() - t
                return r
            object.__setattr__(spec, meth, wrap)
        st = dec._state
        raw = dict(st.replays)
        for key_, rep in list(st.replays.items()):
            def wrep(_r=rep):
                t = time.perf_counter()
                if mark["read_end"] is not None:        # the host's critical path
                    acc["gap"] += t - mark["read_end"]
                    mark["read_end"] = None
                _r()
                acc["replay"] += time.perf_counter() - t
            st.replays[key_] = wrep
        gpu = []
        ev = []
        import torch
        orig = dict(st.replays)
        for key_, rep in orig.items():
            def trep(_r=rep, _key=key_):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                _r()
                e1.record()
                ev.append((e0, e1, _key))
            st.replays[key_] = trep
        dec.reset_metrics()
        import gc
        if args.no_gc:
            gc.disable()
        t0 = time.perf_counter()
        if args.batch > 1:
            for _ in range(3):
                mark["read_end"] = None
                dec.serve(reqs, slots=args.batch)
        else:
            for r in reqs:
                mark["read_end"] = None
                dec.generate([r])
        wall = time.perf_counter() - t0 - dec.metrics.capture_s
        gc.enable()
        torch.cuda.synchronize()
        gpu = sum(a.elapsed_time(b) for a, b, _ in ev) * 1e-3
        per_key: dict = {}          # the GPU time of each plan's replays, beside auto's table
        for a, b, key_ in ev:
            per_key.setdefault(key_, []).append(a.elapsed_time(b) * 1e3)
        m = dec.metrics
        n = m.rounds
        be.to_host, be.to_host_async = orig_to_host, orig_async
        for meth in saved:
            object.__delattr__(spec, meth)
        us = {k_: round(v / n * 1e6, 1) for k_, v in acc.items()}
        pre = m.prefill_s
        print(f"{name:12s} rounds {n:5d} wall/round {1e6 * (wall - pre) / n:7.1f} us "
              f"gpu {1e6 * gpu / max(len(ev), 1):7.1f} (replays {len(ev)}) "
              + " ".join(f"{k_} {v}" for k_, v in us.items())
              + f" tok/s {m.tokens_per_s:.1f} captures_s {m.capture_s:.3f} prefill_s "
            f"{m.prefill_s:.4f} admit_s {m.admit_s:.4f} admissions {m.admissions} "
            f"overrun {m.overrun_rounds} k_rounds {dict(sorted(m.k_rounds.items()))}", flush=True)
        for key_, xs in sorted(per_key.items(), key=lambda kv: -len(kv[1]))[:6]:
            print(f"    plan {str(key_)[:60]:60s} replays {len(xs):4d} gpu median "
                  f"{sorted(xs)[len(xs) // 2]:7.1f} us")
        if args.replay_probe:
            replay_probe(raw, per_key, args.replay_probe)
        if args.kernels:
            kernel_profile(raw, per_key, args.kernels)
        smi = os.popen("nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu "
                       "--format=csv,noheader 2>/dev/null").read().strip()
        print(f"    gpu state: {smi}")
        if getattr(spec, "measured", None):
            print("    calibrated (us):", {kk: round(v * 1e6, 1) for kk, v in sorted(spec.measured.items())})
            print("    live (us, n):", {kk: (round(e2e._median(v) * 1e6, 1), len(v))
                                        for kk, v in sorted(spec._live.items())})
            print("    cost (us):", {kk: round(spec.cost(*kk) * 1e6, 1) for kk in sorted(spec.measured)})


def kernel_profile(raw, per_key, n, top=24):
    """The most used graph replayed ``n`` times under torch.profiler: per kernel name, GPU us
    and launches a replay (the top ``top`` by time), and the total."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    key = max(per_key, key=lambda k_: len(per_key[k_]))
    raw[key]()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            raw[key]()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append((us / n, e.count / n, e.key))
    rows.sort(reverse=True)
    print(f"    kernels of plan {str(key)[:60]} ({n} replays): "
          f"{sum(r[0] for r in rows):.1f} us, {sum(r[1] for r in rows):.0f} launches a replay")
    for us, cnt, name in rows[:top]:
        print(f"      {us:8.1f} us {cnt:6.1f} x  {name[:100]}")


def replay_probe(raw, per_key, n):
    """GPU time (median us) of a decoder's two most replayed graphs: each ``n`` times in a
    row, then ``n`` times alternating (after its call every slot is finished: the rounds
    compute and commit nothing)."""
    import torch
    keys = [k for k, _ in sorted(per_key.items(), key=lambda kv: -len(kv[1]))[:2]]

    def timed(seq):
        ev = []
        for key in seq:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            raw[key]()
            e1.record()
            ev.append((key, e0, e1))
        torch.cuda.synchronize()
        out: dict = {}
        for key, e0, e1 in ev:
            out.setdefault(key, []).append(e0.elapsed_time(e1) * 1e3)
        return {key: round(float(np.median(v)), 1) for key, v in out.items()}
    for key in keys:
        t0 = time.perf_counter()
        for _ in range(n):
            raw[key]()
        host = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"    replay {key} x{n} in a row: {timed([key] * n)[key]} us (launch alone "
              f"{host:.1f} us on the host)")
    if len(keys) == 2:
        print(f"    alternating {keys[0]} / {keys[1]}: {timed(keys * n)}")
    want = keys[:1]
    if os.environ.get("REPLAY_PROFILE") and want:
        # the kernels of the most replayed graph: count and GPU time by name over 5 replays
        # (profile last: after torch.profiler every graph launch took ~210 us on the host)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                raw[want[0]]()
            torch.cuda.synchronize()
        by: dict = {}
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type.name == "CUDA")
        idle = overlap = 0.0
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            d = s1 - e0
            if 0 < d < 50:
                idle += d           # the GPU idle between two kernels of a replay
            elif d < 0:
                overlap -= d        # a kernel starting before the last ended (PDL)
        print(f"    timeline: idle between kernels {idle / 5:.1f} us a replay, "
              f"overlap {overlap / 5:.1f} us")
        for e in prof.events():
            if e.device_type.name == "CUDA":
                t = by.setdefault(e.name[:70], [0, 0.0])
                t[0] += 1
                t[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        tot = sum(v[1] for v in by.values()) / 5
        print(f"    profile {want[0]}: {sum(v[0] for v in by.values()) / 5:.0f} kernels a replay, "
              f"{tot:.1f} us of kernels")
        for name, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:30]:
            print(f"      {c / 5:5.1f}x {t / 5:8.1f} us  {name}")


if __name__ == "__main__":
    main()
