"""The GPU timeline of bench round_b1's round: when each of its kernels started and ended
on the GPU, launch by launch, to find the round's critical path.

The round is ``specdec_lib.bench.round._b1_round`` (one B=1 round of a Qwen3-Next-like
hybrid, ~319 library op launches), recorded as one CUDA graph through the bench harness, as
``python -m specdec_lib bench round_b1`` does. After a warm-up its graph is replayed N times
back to back under ``torch.profiler`` (CUDA activity: CUPTI's concurrent-kernel records,
which cover every kernel of the process's contexts, those of our own driver-API launches
and of replayed graphs included), then a graph of 100 one-element ``copy`` kernels (the
launch floor), then each distinct op alone (eager, one profiler session each: which kernels
an op launches, in order, maps the round's kernels to its steps). The graphs are captured
before the first profiler session (a CUPTI session before a capture has been seen to leave
later sessions empty).

Per launch, in round order: the kernel, its op (step name), its start offset in the replay,
its duration, its gap from the previous kernel's end (negative: it overlapped it, as under
PDL) and its *advance*: how far it moved the replay's end (its end minus the latest earlier
end, at least 0; the advances add up to the span). Under PDL a kernel's CUPTI start is when
its CTAs were scheduled, and they wait in griddepcontrol.wait for the previous launch, so
its duration includes that wait: the advance, not the duration, is its share of the critical
path. Reported for the median replay (by span) and aggregated over replays (medians per
launch, means per replay per op); totals: span, sum of durations, sum of positive gaps, sum
of overlaps, busy (union of kernels) and idle time. Beside it: the round's time per replay
timed with CUDA events without the profiler (the bench's figure; the profiler's own cost per
kernel is the difference), the gap between replays and the floor's per-kernel time.

  python3 tools/perf/round_timeline.py [--replays 20] [--warmup 5] [--json OUT.json]
                                       [--trace OUT.trace.json] [--top 25]
  SPECDEC_PDL=0 python3 tools/perf/round_timeline.py ...     # every launch the plain way
  python3 tools/perf/round_timeline.py --events [--json ...]  # the fallback alone

The fallback, taken by itself when the profiler recorded no replay of the round (CUPTI not
seeing the graph's kernels): the round captured with a CUDA event recorded before its first
step and after each step (event-record nodes inside the one graph), each replay waited for
and its 319 step times read. It needs no torch, but an event node between two launches turns
their programmatic (PDL) edge into a full one: per-op costs with the overlaps taken away.

SPECDEC_PDL is read from the environment (recorded in the JSON). Needs a CUDA GPU, the
extension built in place and torch with CUDA (the H200 machine's torch). On the device, two
calls on one warm machine: ``tools/gpu/train_chain.sh build "$OUT"`` (carry .whl .g0; with
FAMILIES=native BENCH=none it is shortest), then ``TIMELINE=only tools/gpu/train_chain.sh
prof "$OUT"``: both PDL settings, prof/timeline_pdl{1,0}.{log,json} in prof.tgz (TIMELINE=1:
after the ncu profiles). Without a GPU it says why and exits 0. The analysis (``analyse``) is a pure function over
``(name, start_us, dur_us)`` tuples: tests/test_round_timeline.py.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# the chrome-trace categories of GPU work on a stream (kineto's names)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


# ---------------------------------------------------------------- pure analysis
def expected_launches(steps, step_kernels):
    """``[(step_index, step_name, kernel_name)]``: the round's launches in order, each step
    expanded to the kernels ``step_kernels[name]`` says it launches (a step with none
    listed contributes nothing: see ``analyse``'s ``unmapped_steps``)."""
    return [(i, s, k) for i, s in enumerate(steps) for k in step_kernels.get(s, ())]


def match_replays(events, expected):
    """Splits GPU events ``(name, start_us, dur_us)`` into replays of ``expected``
    (``expected_launches``' list): returns ``(replays, foreign)``, each replay a list with
    one slot per expected launch (the event, or None where it is missing), ``foreign`` the
    events whose name is no expected kernel.

    Events are taken in start order (ties: earlier end first). Each goes to the next slot of
    the current replay that expects its name, the slots it skips left missing; a name with no
    such slot ahead fills a missing slot behind (the same start order broken by a tie), or
    else begins the next replay (at its first slot for that name)."""
    where = collections.defaultdict(list)
    for p, (_, _, k) in enumerate(expected):
        where[k].append(p)
    replays, foreign = [], []
    cur, pos = None, 0
    for e in sorted(events, key=lambda e: (e[1], e[1] + e[2])):
        ps = where.get(e[0])
        if not ps:
            foreign.append(e)
            continue
        j = None
        if cur is not None:
            i = bisect.bisect_left(ps, pos)
            if i < len(ps):
                j = ps[i]
            else:
                j = next((p for p in reversed(ps[:i]) if cur[p] is None), None)
        if j is None:
            cur, pos = [None] * len(expected), 0
            replays.append(cur)
            j = ps[0]
        cur[j] = e
        pos = max(pos, j + 1)
    return replays, foreign


def replay_timeline(slots, expected):
    """``(rows, totals)`` of one replay: per expected launch a row (pos, step_index, op,
    kernel, missing; for a present one start (offset from the replay's first start), dur,
    gap (from the previous present launch's end; None for the first), advance); totals:
    span, sum_dur, sum_gaps (positive), sum_overlaps (the negative gaps, as a positive
    number), busy (union of the launches), idle (span - busy), present, missing, t0 and
    t_end (absolute)."""
    present = [e for e in slots if e is not None]
    rows = []
    if not present:
        return rows, {"present": 0, "missing": len(expected)}
    t0 = min(e[1] for e in present)
    prev_end, frontier = None, t0
    sum_gaps = sum_over = sum_dur = 0.0
    for p, ((si, step, kname), e) in enumerate(zip(expected, slots)):
        row = {"pos": p, "step_index": si, "op": step, "kernel": kname}
        if e is None:
            row["missing"] = True
            rows.append(row)
            continue
        start, dur = e[1], e[2]
        end = start + dur
        gap = None if prev_end is None else start - prev_end
        adv = max(0.0, end - frontier)
        frontier = max(frontier, end)
        prev_end = end
        sum_dur += dur
        if gap is not None:
            if gap > 0:
                sum_gaps += gap
            else:
                sum_over -= gap
        row.update(start=start - t0, dur=dur, gap=gap, advance=adv)
        rows.append(row)
    busy, cs, ce = 0.0, None, None          # union of [start, end) over the present launches
    for s, e in sorted((e[1], e[1] + e[2]) for e in present):
        if ce is None or s > ce:
            if ce is not None:
                busy += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    busy += ce - cs
    t_end = max(e[1] + e[2] for e in present)
    span = t_end - t0
    totals = {"span": span, "sum_dur": sum_dur, "sum_gaps": sum_gaps, "sum_overlaps": sum_over,
              "busy": busy, "idle": span - busy, "present": len(present),
              "missing": len(expected) - len(present), "t0": t0, "t_end": t_end}
    return rows, totals


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _group(replay_rows, key, n_replays):
    """Per key (of a row): launches per round, mean dur / gap before per launch, and per
    replay (mean over replays) the sums of dur, positive gaps, overlaps and advance."""
    acc = {}
    for rows in replay_rows:
        for r in rows:
            if r.get("missing"):
                continue
            a = acc.setdefault(key(r), {"n": 0, "dur": 0.0, "gap_n": 0, "gap": 0.0, "gaps": 0.0,
                                        "over": 0.0, "adv": 0.0})
            a["n"] += 1
            a["dur"] += r["dur"]
            a["adv"] += r["advance"]
            if r["gap"] is not None:
                a["gap_n"] += 1
                a["gap"] += r["gap"]
                if r["gap"] > 0:
                    a["gaps"] += r["gap"]
                else:
                    a["over"] -= r["gap"]
    out = []
    for k, a in acc.items():
        out.append({"key": k, "launches": a["n"] / n_replays, "mean_dur": a["dur"] / a["n"],
                    "mean_gap": a["gap"] / a["gap_n"] if a["gap_n"] else None,
                    "dur_per_round": a["dur"] / n_replays, "gaps_per_round": a["gaps"] / n_replays,
                    "overlaps_per_round": a["over"] / n_replays,
                    "advance_per_round": a["adv"] / n_replays})
    out.sort(key=lambda d: -d["advance_per_round"])
    return out


def analyse(events, steps, step_kernels):
    """The round's timeline from GPU events ``(name, start_us, dur_us)`` (any order, several
    replays, foreign events allowed), the round's step names in order (``steps``) and the
    kernels each step launches (``step_kernels``: name -> [kernel names in launch order]).

    Returns a JSON-able dict: the expected launches, the replays found (complete ones have no
    missing launch), their spans, the gaps between consecutive replays, the representative
    replay (the median by span among the complete ones, else among all) with its rows and
    totals, the median of each total and per-launch medians (start, dur, gap, advance) over
    the replays, and per op / per (op, kernel) the means of ``_group``, largest advance
    first."""
    steps = list(steps)
    expected = expected_launches(steps, step_kernels)
    replays, foreign = match_replays(events, expected)
    per = [replay_timeline(r, expected) for r in replays]
    per = [(rows, t) for rows, t in per if t["present"]]
    out = {"steps": len(steps), "launches_expected": len(expected),
           "unmapped_steps": sorted({s for s in steps if not step_kernels.get(s)}),
           "replays": len(per), "complete_replays": sum(1 for _, t in per if not t["missing"]),
           "foreign": dict(collections.Counter(e[0] for e in foreign))}
    if not per:
        return out
    spans = [t["span"] for _, t in per]
    out["spans"] = spans
    out["span"] = {"median": statistics.median(spans), "min": min(spans), "max": max(spans)}
    ts = sorted((t["t0"], t["t_end"]) for _, t in per)
    between = [b[0] - a[1] for a, b in zip(ts, ts[1:])]
    out["between_replays"] = {"median": _median(between),
                              "min": min(between) if between else None}
    pool = [i for i, (_, t) in enumerate(per) if not t["missing"]] or list(range(len(per)))
    pool.sort(key=lambda i: per[i][1]["span"])
    rep = pool[(len(pool) - 1) // 2]
    rows, tot = per[rep]
    out["representative"] = {"replay": rep, "totals": tot, "launches": rows}
    keys = ("span", "sum_dur", "sum_gaps", "sum_overlaps", "busy", "idle", "present", "missing")
    out["median_totals"] = {k: statistics.median(t[k] for _, t in per) for k in keys}
    agg = []
    for p, (si, step, kname) in enumerate(expected):
        rs = [rows[p] for rows, _ in per if not rows[p].get("missing")]
        agg.append({"pos": p, "step_index": si, "op": step, "kernel": kname, "present": len(rs),
                    **{f: _median(r[f] for r in rs) for f in ("start", "dur", "gap", "advance")}})
    out["launches"] = agg
    all_rows = [rows for rows, _ in per]
    per_op = _group(all_rows, lambda r: r["op"], len(per))
    nsteps = collections.Counter(steps)
    for d in per_op:
        d["op"] = d.pop("key")
        d["steps"] = nsteps[d["op"]]
    out["per_op"] = per_op
    per_k = _group(all_rows, lambda r: (r["op"], r["kernel"]), len(per))
    for d in per_k:
        d["op"], d["kernel"] = d.pop("key")
    out["per_kernel"] = per_k
    return out


def gpu_events_from_trace(trace, cats=GPU_CATS):
    """``[(name, ts_us, dur_us)]`` of the GPU events of a chrome trace (torch.profiler's
    ``export_chrome_trace``): complete events ("ph": "X") of the given categories."""
    evs = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return [(e["name"], float(e["ts"]), float(e.get("dur", 0.0))) for e in evs
            if e.get("ph") == "X" and e.get("cat") in cats]


def step_kernels_from(per_step_events):
    """``{step: [kernel names in start order]}`` from each step's events run alone."""
    return {s: [e[0] for e in sorted(evs, key=lambda e: (e[1], e[1] + e[2]))]
            for s, evs in per_step_events.items()}


def _fmt(v, w=8, d=2):
    return f"{'-':>{w}}" if v is None else f"{v:{w}.{d}f}"


def report(res, top=25, out=print):
    """The compact table: totals, per op (largest advance first), the representative
    replay's launches with the largest advance."""
    out(f"  round: {res['steps']} steps, {res['launches_expected']} launches expected; "
        f"{res['replays']} replays ({res['complete_replays']} complete)"
        + (f"; foreign events {sum(res['foreign'].values())}" if res["foreign"] else "")
        + (f"; steps without kernels: {', '.join(res['unmapped_steps'])}"
           if res["unmapped_steps"] else ""))
    if not res.get("replays"):
        return
    sp, mt = res["span"], res["median_totals"]
    br = res["between_replays"]["median"]
    out(f"  span per replay {sp['median']:.1f} us (min {sp['min']:.1f}, max {sp['max']:.1f})"
        + (f"; between replays {br:.2f} us" if br is not None else ""))
    out(f"  median totals: durations {mt['sum_dur']:.1f}, positive gaps {mt['sum_gaps']:.1f}, "
        f"overlaps {mt['sum_overlaps']:.1f}, busy {mt['busy']:.1f}, idle {mt['idle']:.1f} us; "
        f"{mt['present']:.0f} present, {mt['missing']:.0f} missing")
    out(f"  {'op':<18} {'steps':>5} {'launch':>6} {'mean dur':>8} {'mean gap':>8} "
        f"{'dur/rnd':>8} {'gaps/rnd':>8} {'ovl/rnd':>8} {'adv/rnd':>8} {'adv%':>5}")
    span = sp["median"] or 1.0
    for d in res["per_op"]:
        out(f"  {d['op']:<18} {d['steps']:5d} {d['launches']:6.1f} {_fmt(d['mean_dur'])} "
            f"{_fmt(d['mean_gap'])} {_fmt(d['dur_per_round'], d=1)} {_fmt(d['gaps_per_round'], d=1)} "
            f"{_fmt(d['overlaps_per_round'], d=1)} {_fmt(d['advance_per_round'], d=1)} "
            f"{100 * d['advance_per_round'] / span:5.1f}")
    rep = res["representative"]
    rows = sorted((r for r in rep["launches"] if not r.get("missing")),
                  key=lambda r: -r["advance"])[:top]
    out(f"  replay {rep['replay']} (median span {rep['totals']['span']:.1f} us): "
        f"the {len(rows)} launches with the largest advance")
    out(f"  {'pos':>4} {'op':<18} {'kernel':<40} {'start':>8} {'dur':>7} {'gap':>7} {'adv':>7}")
    for r in rows:
        out(f"  {r['pos']:4d} {r['op']:<18} {r['kernel'][:40]:<40} {r['start']:8.2f} "
            f"{r['dur']:7.2f} {_fmt(r['gap'], 7)} {r['advance']:7.2f}")


# ---------------------------------------------------------------- on the GPU
def unavailable_reason():
    """Why the GPU part cannot run here (None when it can)."""
    from specdec_lib import runtime
    why = runtime.gpu_unavailable_reason()
    if why:
        return why
    try:
        import torch
    except Exception as e:   # noqa: BLE001
        return f"torch does not import ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} has no CUDA device (torch.profiler's CUDA activity needs it)"
    if runtime.arch_family(0) < 80:
        # the round is bench round_b1's, in bf16: the sm_75 code path has no bf16 kernels
        return "round_b1 runs in bfloat16, which needs the sm_80 or newer code path (this one is sm_75)"
    return None


def profiled_gpu_events(fn, sync, trace_path=None):
    """GPU events of everything the process ran on the GPU during ``fn(); sync()`` under
    torch.profiler (CUDA activity), read back from its chrome trace (kept at trace_path)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    with tempfile.TemporaryDirectory() as d:
        path = trace_path or os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            return gpu_events_from_trace(json.load(fh))


def _meta(device, replays, warmup, **extra):
    """What a run's JSON says of where and how it ran (both recorders)."""
    from specdec_lib import runtime
    from specdec_lib.bench.round import _b1_label
    return {"device": runtime.device_props(device)["name"], "label": _b1_label(),
            "SPECDEC_PDL": os.environ.get(runtime.PDL_ENV),
            "pdl_enabled": runtime.pdl_enabled(device), "replays": replays, "warmup": warmup,
            **extra}


def record(replays=20, warmup=5, device=0, trace_path=None):
    """Records the round and the floor, profiles them (module docstring); returns the
    raw material: events of the round's replays, of the floor's, each step's kernels, the
    steps, and the CUDA-event times."""
    import torch
    from specdec_lib.bench._harness import Bench
    from specdec_lib.bench.round import _b1_setup, _floor_copy
    b = Bench(device)
    drv, st = b.drv, b.stream
    steps, reset = _b1_setup(b)
    floor_fn = _floor_copy(b)

    def round_():
        for _, fn in steps:
            fn(st)
    reset()
    g, ge = b.capture_graph(round_)                 # both graphs before any profiler session
    gf, gfe = b.capture_graph(floor_fn, per_graph=100)
    try:
        reset()
        launch = lambda: drv.graph_launch(ge, st)  # noqa: E731
        events_us = b.time(launch, iters=5, repeats=9) * 1e3      # the bench's figure
        reset()
        floor_us = b.time(lambda: drv.graph_launch(gfe, st), iters=5, repeats=7) * 1e3 / 100
        torch.cuda.synchronize()                     # torch's CUDA state up (same primary context)

        reset()
        for _ in range(warmup):
            launch()
        drv.stream_synchronize(st)

        def replays_():      # the page table has room for ~250 replays from a reset
            for i in range(replays):
                if i and i % 200 == 0:
                    reset()
                launch()
        round_ev = profiled_gpu_events(replays_, lambda: drv.stream_synchronize(st), trace_path)
        reset()
        floor_ev = profiled_gpu_events(lambda: [drv.graph_launch(gfe, st) for _ in range(5)],
                                       lambda: drv.stream_synchronize(st))
        first = {}
        for name, fn in steps:
            first.setdefault(name, fn)
        per_step = {}
        for name, fn in first.items():
            fn(st)
            drv.stream_synchronize(st)
            per_step[name] = profiled_gpu_events(lambda: fn(st), lambda: drv.stream_synchronize(st))
            reset()
    finally:
        drv.stream_synchronize(st)
        drv.graph_destroy(g, ge)
        drv.graph_destroy(gf, gfe)
    meta = _meta(device, replays, warmup, torch=torch.__version__,
                 round_us_cuda_events=events_us, floor_us_cuda_events=floor_us)
    b.close()
    return {"meta": meta, "steps": [s for s, _ in steps], "round_events": round_ev,
            "floor_events": floor_ev, "per_step_events": per_step}


def record_with_events(replays=20, warmup=5, device=0):
    """The fallback where torch.profiler sees no kernel: the round captured with a CUDA event
    recorded before its first step and after every step (``external=True``: event-record
    nodes in the graph),
    replayed ``replays`` times, each replay waited for and read: ``(steps, [[ms of each
    step] per replay], meta)``. An event node between two launches replaces their
    programmatic (PDL) edge by a full one, so this times each op serialised: per-op costs,
    not the overlaps."""
    from specdec_lib.bench._harness import Bench
    from specdec_lib.bench.round import _b1_setup
    b = Bench(device)
    drv, st = b.drv, b.stream
    steps, reset = _b1_setup(b)
    evs = [drv.event_create() for _ in range(len(steps) + 1)]

    def round_():
        ext = drv.stream_is_capturing(st)   # event-record nodes in the graph (the flag is
        drv.event_record(evs[0], st, external=ext)   # invalid outside a capture)
        for (_, fn), e in zip(steps, evs[1:]):
            fn(st)
            drv.event_record(e, st, external=ext)
    reset()
    g, ge = b.capture_graph(round_)
    times = []
    try:
        reset()
        for i in range(warmup + replays):
            if i % 200 == 0:
                reset()
            drv.graph_launch(ge, st)
            drv.stream_synchronize(st)
            if i >= warmup:
                times.append([drv.event_elapsed_ms(a, c) for a, c in zip(evs, evs[1:])])
    finally:
        drv.stream_synchronize(st)
        drv.graph_destroy(g, ge)
        for e in evs:
            drv.event_destroy(e)
    meta = _meta(device, replays, warmup, mode="cuda events between steps")
    b.close()
    return [s for s, _ in steps], times, meta


def analyse_step_times(steps, times_ms):
    """Per op (largest total first) and per step (medians) from ``record_with_events``'
    per-replay step times; totals: the median replay's sum."""
    rows_per = [[{"pos": i, "step_index": i, "op": s, "kernel": s, "start": None, "dur": t * 1e3,
                  "gap": None, "advance": t * 1e3} for i, (s, t) in enumerate(zip(steps, ts))]
                for ts in times_ms]
    if not rows_per:
        return {"steps": len(steps), "replays": 0}
    sums = [sum(ts) * 1e3 for ts in times_ms]
    per_op = _group(rows_per, lambda r: r["op"], len(rows_per))
    nsteps = collections.Counter(steps)
    for d in per_op:
        d["op"] = d.pop("key")
        d["steps"] = nsteps[d["op"]]
    return {"steps": len(steps), "replays": len(rows_per),
            "span": {"median": statistics.median(sums), "min": min(sums), "max": max(sums)},
            "per_op": per_op,
            "per_step_us": [statistics.median(ts[i] for ts in times_ms) * 1e3
                            for i in range(len(steps))]}


def summarise(raw):
    """The JSON of a run from ``record``'s raw material (pure: tested on the CPU)."""
    step_kernels = step_kernels_from(raw["per_step_events"])
    res = analyse(raw["round_events"], raw["steps"], step_kernels)
    fl = collections.Counter(e[0] for e in raw["floor_events"])
    floor = {"kernel": None}
    if fl:
        k = fl.most_common(1)[0][0]
        f = analyse(raw["floor_events"], ["copy"] * 100, {"copy": [k]})
        floor = {"kernel": k, "replays": f["replays"]}
        if f.get("replays"):
            floor.update(per_kernel_us=f["span"]["median"] / 100,
                         mean_dur=f["per_op"][0]["mean_dur"], mean_gap=f["per_op"][0]["mean_gap"])
    return {"meta": raw["meta"], "step_kernels": step_kernels, "floor": floor, **res}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--json", default=None, help="write everything here")
    p.add_argument("--trace", default=None, help="keep the round's chrome trace here (Perfetto)")
    p.add_argument("--top", type=int, default=25, help="launches listed from the median replay")
    p.add_argument("--events", action="store_true",
                   help="the fallback only: CUDA events between the graph's steps (no torch)")
    args = p.parse_args(argv)
    if args.events:
        from specdec_lib import runtime
        why = runtime.gpu_unavailable_reason()
        if why:
            print(f"round_timeline: skipped: {why}")
            return 0
        return _events_main(args)
    why = unavailable_reason()
    if why:
        print(f"round_timeline: skipped: {why}")
        return 0
    raw = record(args.replays, args.warmup, args.device, args.trace)
    res = summarise(raw)
    m = res["meta"]
    print(f"round_timeline {m['label']} on {m['device']}: SPECDEC_PDL={m['SPECDEC_PDL']} "
          f"(PDL {'on' if m['pdl_enabled'] else 'off'}), torch {m['torch']}")
    fl = res["floor"]
    print(f"  CUDA events, no profiler: {m['round_us_cuda_events']:.1f} us per replay; "
          f"floor {m['floor_us_cuda_events']:.2f} us per kernel"
          + (f" (profiled: {fl['per_kernel_us']:.2f}, {fl['kernel']})" if fl.get("per_kernel_us")
             else ""))
    if not res.get("replays"):
        print("  torch.profiler recorded no replay of the round's kernels: falling back to "
              "CUDA events between the graph's steps (--events)")
        report(res, top=args.top)
        return _events_main(args, res)
    report(res, top=args.top)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


def _events_main(args, profiled=None):
    steps, times, meta = record_with_events(args.replays, args.warmup, args.device)
    res = {"meta": meta, **analyse_step_times(steps, times)}
    if profiled is not None:
        res["profiler"] = profiled
    print(f"round_timeline (CUDA events between steps; PDL edges become full ones) {meta['label']} "
          f"on {meta['device']}: SPECDEC_PDL={meta['SPECDEC_PDL']}")
    if res["replays"]:
        sp = res["span"]
        print(f"  sum of steps per replay {sp['median']:.1f} us (min {sp['min']:.1f}, "
              f"max {sp['max']:.1f})")
        print(f"  {'op':<18} {'steps':>5} {'mean us':>8} {'us/rnd':>8} {'share%':>6}")
        for d in res["per_op"]:
            print(f"  {d['op']:<18} {d['steps']:5d} {_fmt(d['mean_dur'])} "
                  f"{_fmt(d['dur_per_round'], d=1)} {100 * d['dur_per_round'] / sp['median']:6.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
