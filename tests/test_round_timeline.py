"""tools/perf/round_timeline.py: the timeline analysis on synthetic GPU events (replays,
overlaps as under PDL, gaps, kernels mapped to the round's steps, a missing kernel, foreign
events, start ties), the summary of a run's raw material and the CUDA-event fallback's
analysis on the CPU; the whole tool on the GPU (torch with CUDA) where there is one."""
import importlib.util
import json
import os

import pytest

from conftest import needs_gpu

_PATH = os.path.join(os.path.dirname(__file__), "..", "tools", "perf", "round_timeline.py")
_spec = importlib.util.spec_from_file_location("round_timeline_under_test", _PATH)
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)

STEPS = ["a", "b", "a", "c"]
KERNELS = {"a": ["ka"], "b": ["kb1", "kb2"], "c": ["kc"]}


def _replay(t, kc_dur=10.0):
    """One replay at t: ka | gap 1 | kb1, kb2 overlapping it by 1 | gap 1 | ka, kc
    overlapping it by 1 (span 14 + kc_dur)."""
    return [("ka", t, 5.0), ("kb1", t + 6, 3.0), ("kb2", t + 8, 4.0), ("ka", t + 13, 2.0),
            ("kc", t + 14, kc_dur)]


def test_expected_launches_expand_steps_in_order():
    assert rt.expected_launches(STEPS, KERNELS) == [
        (0, "a", "ka"), (1, "b", "kb1"), (1, "b", "kb2"), (2, "a", "ka"), (3, "c", "kc")]


def test_one_replay_rows_and_totals():
    res = rt.analyse(_replay(100.0), STEPS, KERNELS)
    assert res["replays"] == res["complete_replays"] == 1 and res["foreign"] == {}
    rows = res["representative"]["launches"]
    assert [(r["op"], r["kernel"]) for r in rows] == [
        ("a", "ka"), ("b", "kb1"), ("b", "kb2"), ("a", "ka"), ("c", "kc")]
    assert [r["start"] for r in rows] == [0, 6, 8, 13, 14]
    assert [r["gap"] for r in rows] == [None, 1, -1, 1, -1]
    assert [r["advance"] for r in rows] == [5, 4, 3, 3, 9]
    t = res["representative"]["totals"]
    assert (t["span"], t["sum_dur"], t["sum_gaps"], t["sum_overlaps"]) == (24, 24, 2, 2)
    assert (t["busy"], t["idle"], t["missing"]) == (22, 2, 0)
    assert sum(r["advance"] for r in rows) == t["span"]


def test_replays_median_representative_and_per_op():
    # spans 24, 34, 29, given out of order and interleaved: sorted by start inside
    evs = _replay(100.0) + _replay(200.0, kc_dur=20.0) + _replay(300.0, kc_dur=15.0)
    res = rt.analyse(list(reversed(evs)), STEPS, KERNELS)
    assert res["replays"] == res["complete_replays"] == 3
    assert res["spans"] == [24, 34, 29]
    assert res["span"] == {"median": 29, "min": 24, "max": 34}
    assert res["representative"]["replay"] == 2
    assert res["between_replays"] == {"median": 71, "min": 66}
    kc = res["launches"][4]
    assert (kc["present"], kc["dur"], kc["advance"], kc["gap"]) == (3, 15, 14, -1)
    ops = {d["op"]: d for d in res["per_op"]}
    assert [d["op"] for d in res["per_op"]] == ["c", "a", "b"]      # largest advance first
    a, b = ops["a"], ops["b"]
    assert (a["steps"], a["launches"], a["mean_dur"], a["mean_gap"]) == (2, 2, 3.5, 1)
    assert (a["dur_per_round"], a["advance_per_round"]) == (7, 8)
    assert (b["steps"], b["launches"], b["mean_gap"], b["gaps_per_round"],
            b["overlaps_per_round"]) == (1, 2, 0, 1, 1)
    assert ops["c"]["advance_per_round"] == pytest.approx(14)
    per_k = {(d["op"], d["kernel"]): d for d in res["per_kernel"]}
    assert per_k[("b", "kb2")]["mean_gap"] == -1 and per_k[("b", "kb1")]["mean_gap"] == 1
    assert res["median_totals"]["span"] == 29


def test_a_missing_kernel_and_foreign_events():
    second = [e for e in _replay(200.0) if e[0] != "kb2"]
    evs = _replay(100.0) + second + _replay(300.0, kc_dur=15.0) + [("Memcpy HtoD", 150.0, 1.0)]
    res = rt.analyse(evs, STEPS, KERNELS)
    assert res["replays"] == 3 and res["complete_replays"] == 2
    assert res["foreign"] == {"Memcpy HtoD": 1}
    assert res["launches"][2]["present"] == 2
    assert res["representative"]["replay"] == 0            # the median of the complete ones
    replays, _ = rt.match_replays(evs, rt.expected_launches(STEPS, KERNELS))
    rows, t = rt.replay_timeline(replays[1], rt.expected_launches(STEPS, KERNELS))
    assert rows[2] == {"pos": 2, "step_index": 1, "op": "b", "kernel": "kb2", "missing": True}
    assert rows[3]["gap"] == 13 - 9                        # from kb1, the last present
    assert (t["missing"], t["present"]) == (1, 4)


def test_a_replay_missing_its_first_kernel_starts_a_replay():
    evs = _replay(100.0) + _replay(200.0)[1:]
    res = rt.analyse(evs, STEPS, KERNELS)
    assert res["replays"] == 2 and res["complete_replays"] == 1
    replays, _ = rt.match_replays(evs, rt.expected_launches(STEPS, KERNELS))
    assert replays[1][0] is None and replays[1][1] == ("kb1", 206.0, 3.0)


def test_start_ties_fill_the_skipped_slot():
    # kb1 and kb2 start together and kb2 ends first: sorted kb2 first, kb1 fills its slot behind
    evs = [("ka", 0.0, 5.0), ("kb1", 6.0, 3.0), ("kb2", 6.0, 2.0), ("ka", 10.0, 1.0),
           ("kc", 11.0, 1.0)]
    res = rt.analyse(evs, STEPS, KERNELS)
    assert res["replays"] == res["complete_replays"] == 1
    rows = res["representative"]["launches"]
    assert [r["kernel"] for r in rows] == ["ka", "kb1", "kb2", "ka", "kc"]
    assert rows[2]["gap"] == 6 - 9 and rows[3]["advance"] == 11 - 9     # kb1 ended at 9


def test_unmapped_steps_and_no_events():
    res = rt.analyse(_replay(0.0) + [("kd", 30.0, 1.0)], STEPS + ["d"], KERNELS)
    assert res["unmapped_steps"] == ["d"] and res["foreign"] == {"kd": 1}
    assert res["complete_replays"] == 1
    empty = rt.analyse([], STEPS, KERNELS)
    assert empty["replays"] == 0 and "span" not in empty
    lines = []
    rt.report(empty, out=lines.append)
    assert len(lines) == 1 and "0 replays" in lines[0]


def test_gpu_events_from_a_chrome_trace():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "rms_norm_bf16", "ts": 10.5, "dur": 2.25,
         "args": {"stream": 7}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 13.0, "dur": 0.5},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9.0, "dur": 1.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 9.0, "dur": 1.0},
        {"ph": "f", "cat": "kernel", "name": "flow", "ts": 10.5},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 20, "dur": 1}]}
    assert rt.gpu_events_from_trace(trace) == [("rms_norm_bf16", 10.5, 2.25),
                                               ("Memset (Device)", 13.0, 0.5),
                                               ("Memcpy HtoD", 20.0, 1.0)]
    assert rt.step_kernels_from({"b": [("kb2", 5.0, 1.0), ("kb1", 1.0, 1.0)], "c": []}) == {
        "b": ["kb1", "kb2"], "c": []}


def test_summarise_maps_steps_and_times_the_floor():
    floor = [("copy_strided_e4", g + 2.0 * i, 1.0) for g in (1000.0, 2000.0) for i in range(100)]
    raw = {"meta": {"SPECDEC_PDL": "0"}, "steps": STEPS,
           "round_events": _replay(100.0) + _replay(200.0),
           "floor_events": floor + [("Memcpy HtoD", 1500.0, 1.0)],
           "per_step_events": {"a": [("ka", 5.0, 1.0)], "b": [("kb2", 9.0, 1.0), ("kb1", 7.0, 1.0)],
                               "c": [("kc", 3.0, 1.0)]}}
    res = rt.summarise(raw)
    assert res["meta"] == {"SPECDEC_PDL": "0"}
    assert res["step_kernels"] == KERNELS
    assert res["complete_replays"] == 2 and res["span"]["median"] == 24
    f = res["floor"]
    assert (f["kernel"], f["replays"]) == ("copy_strided_e4", 2)
    assert f["per_kernel_us"] == pytest.approx(1.99)
    assert (f["mean_dur"], f["mean_gap"]) == (1.0, 1.0)
    json.dumps(res)                                        # all of it JSON-able
    lines = []
    rt.report(res, top=3, out=lines.append)
    text = "\n".join(lines)
    assert "span per replay 24.0 us" in text and "kc" in text
    assert sum(1 for ln in lines if ln.lstrip().startswith(("0 ", "1 ", "2 ", "3 ", "4 "))) == 3


def test_analyse_step_times_of_the_fallback():
    res = rt.analyse_step_times(["a", "b", "a"], [[0.001, 0.002, 0.003], [0.002, 0.002, 0.002]])
    assert res["replays"] == 2 and res["span"]["median"] == pytest.approx(6)
    a = next(d for d in res["per_op"] if d["op"] == "a")
    assert (a["steps"], a["launches"]) == (2, 2)
    assert a["mean_dur"] == pytest.approx(2) and a["dur_per_round"] == pytest.approx(4)
    assert res["per_step_us"] == pytest.approx([1.5, 2, 2.5])
    assert rt.analyse_step_times(["a"], [])["replays"] == 0


def test_main_without_a_gpu_says_why(capsys):
    if rt.unavailable_reason() is None:
        pytest.skip("a GPU and torch with CUDA are here: the GPU test runs the tool")
    assert rt.main(["--replays", "2"]) == 0
    assert "round_timeline: skipped:" in capsys.readouterr().out


@needs_gpu
def test_round_timeline_gpu(tmp_path, capsys):
    """The tool on the device: every replay of the round found whole, every step mapped to
    its kernels, the advances adding up to the span; the fallback's 319 step times."""
    why = rt.unavailable_reason()
    if why:
        pytest.skip(why)
    from specdec_lib.bench.round import _b1_round
    from specdec_lib import runtime
    out = tmp_path / "tl.json"
    assert rt.main(["--replays", "3", "--warmup", "2", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    steps = [s for s, _ in _b1_round(0)[1]]
    assert res["steps"] == len(steps) and res["unmapped_steps"] == []
    assert res["launches_expected"] >= len(steps)
    assert res["replays"] == res["complete_replays"] == 3, (res["replays"], res["foreign"])
    assert {d["op"] for d in res["per_op"]} == set(steps)
    t = res["representative"]["totals"]
    adv = sum(r["advance"] for r in res["representative"]["launches"])
    assert adv == pytest.approx(t["span"], rel=1e-6, abs=1e-3)
    assert res["floor"]["replays"] == 5 and res["floor"]["per_kernel_us"] > 0
    assert res["meta"]["pdl_enabled"] == runtime.pdl_enabled(0)
    assert "span per replay" in capsys.readouterr().out
    out2 = tmp_path / "ev.json"
    assert rt.main(["--events", "--replays", "2", "--warmup", "1", "--json", str(out2)]) == 0
    ev = json.loads(out2.read_text())
    assert ev["replays"] == 2 and len(ev["per_step_us"]) == len(steps)
    assert all(u > 0 for u in ev["per_step_us"])
