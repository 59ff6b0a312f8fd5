#!/usr/bin/env python3
"""Run one op at its benchmark's record shape a few times, untimed, for a profiler.

    ncu --set full -k regex:gdn_verify -c 1 -o rep python3 tools/perf/profile_op.py gdn
    python3 tools/perf/profile_op.py CASE [--iters N]

Cases (the shapes of docs/PERF.md's tables):
  gdn            gdn_verify + gdn_commit, B=64 q=4 Hk=16 Hv=32 128x128 f32 kv state, bf16 in
  gdn_bf16       the same with a bf16 state
  gdn_fused      the fused mode's round (gdn_verify_fused: previous commit + verify), f32 kv
  gdn_bf16_fused the same with a bf16 state
  sample         spec_sample B=64 k=3 V=151936 bf16, half greedy, no filter (filters=False)
  sample_topp    the same with top-p 0.9 (filters=None)
  sample_b1      spec_sample B=1, sampled, no filter (filters=False)
  sample_b1_topp spec_sample B=1, sampled, top-p 0.9 (the rows path on sm_90)
  round_b1       one B=1 Qwen3-Next-like round of library ops (bench round_b1), eager
  bench_NAME     the whole registered benchmark NAME (verify_attention, append_kv)
  kv8_fp8        verify_attention over an fp8 cache, B=64 L=4096 q=4 32/8 D=128 page 16
  kv8_fp8_head_major  the same cache stored head-major within each page
  kv8_int8       the same over an int8 cache
  kv8_fp8_b1 / kv8_int8_b1  the B=1 L=32768 row (split KV plus the merge)
  append_kv8_fp8 append_kv of bf16 K/V into an fp8 cache, B=256 q=128 Hkv=8 D=128 page 64
  append_kv8_int8  the same into an int8 cache
  sample_topp_rows  sample_topp through the rows path (SPECDEC_SPEC_SAMPLE_PATH=rows; the
                 automatic choice at B=64 is the tiles path)

Nothing is timed or checked here: the benchmark times (``python3 -m specdec_lib bench``)
and the tests check; this only gives ncu / compute-sanitizer a short, known launch sequence.
"""
from __future__ import annotations

import argparse
import os
import sys

# run as a script from anywhere: the in-place build lives in the repo root
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _gdn(state_dtype, iters, fused_mode=False):
    from specdec_lib.bench import Bench
    from specdec_lib.bench.gdn import gdn_round_calls
    b = Bench(0)
    verify, commit, fused = gdn_round_calls(b, 64, 4, 16, 32, 128, state_dtype, "kv")
    for _ in range(iters):
        if fused_mode:
            fused()
        else:
            verify()
            commit()
    b.close()   # waits for the stream


def _sample(B, greedy_frac, top_p, filters, iters, path=None):
    import os
    if path is not None:
        from specdec_lib.ops.sampling import PATH_ENV
        os.environ[PATH_ENV] = path
    from specdec_lib.bench import Bench
    from specdec_lib.bench.sampling import spec_sample_call
    b = Bench(0)
    run, _ = spec_sample_call(b, B, 3, 151936, greedy_frac, top_p, filters)
    for _ in range(iters):
        run()
    b.close()


def _round_b1(iters):
    from specdec_lib.bench import Bench
    from specdec_lib.bench.round import _b1_round
    b = Bench(0)
    _, steps = _b1_round(b.device)
    for _ in range(iters):
        for _, fn in steps:
            fn(b.stream)
    b.close()


def _kv8(fmt, head_major, iters, B=64, L=4096):
    """verify_attention over an 8-bit cache at the bench's B=64 L=4096 q=4 32/8 D=128 row
    (or its B=1 L=32768 row: the automatic split plan, then the merge)."""
    from specdec_lib.bench import Bench
    from specdec_lib.bench.attention import _kv8_cache, _paged_case
    from specdec_lib.arrays import DeviceArray
    from specdec_lib.ops import verify_attention, verify_attention_workspace_size
    b = Bench(0)
    q, Hq, Hkv, D, ps = 4, 32, 8, 128, 16
    qd, pt, sl, cq, out, max_kv, num_pages = _paged_case(b, B, L, q, Hq, Hkv, D, ps)
    kc, kx = _kv8_cache(fmt, num_pages, ps, Hkv, D, b.device, 2, head_major)
    vc, vx = _kv8_cache(fmt, num_pages, ps, Hkv, D, b.device, 3, head_major)
    kw = dict(k_scale=kx, v_scale=vx) if fmt == "fp8" else dict(k_params=kx, v_params=vx)
    # the bench's workspace: without one the op plans a single split (B=1: 8 CTAs)
    nbytes = verify_attention_workspace_size(B * q, Hq, Hkv, D, B, max_kv, device=b.device)
    ws = DeviceArray.empty((max(nbytes, 1),), "uint8", b.device)
    for _ in range(iters):
        verify_attention(qd, kc, vc, pt, sl, cq, out, workspace=ws, stream=b.stream, **kw)
    b.close()


def _bench(name):
    """A registered benchmark run whole (its timing loops are launches like any other):
    pick the launch with ncu's -k / --launch-skip."""
    def run(iters):
        from specdec_lib.bench import _BENCHES, Bench, _load_families
        _load_families()
        b = Bench(0)
        _BENCHES[name](b)
        b.close()
    return run


def _append_kv8(fmt, iters):
    """append_kv quantising on write at the bench's B=256 q=128 row."""
    from specdec_lib.bench import Bench
    from specdec_lib.bench.copy import append_kv8_call
    b = Bench(0)
    run, _ = append_kv8_call(b, 256, 128, 8, 128, 64, fmt)
    for _ in range(iters):
        run()
    b.close()


CASES = {
    "round_b1": _round_b1,
    "bench_verify_attention": _bench("verify_attention"),
    "bench_append_kv": _bench("append_kv"),
    "kv8_fp8": lambda n: _kv8("fp8", False, n),
    "kv8_fp8_head_major": lambda n: _kv8("fp8", True, n),
    "kv8_int8": lambda n: _kv8("int8", False, n),
    "kv8_fp8_b1": lambda n: _kv8("fp8", False, n, B=1, L=32768),
    "kv8_int8_b1": lambda n: _kv8("int8", False, n, B=1, L=32768),
    "append_kv8_fp8": lambda n: _append_kv8("fp8", n),
    "append_kv8_int8": lambda n: _append_kv8("int8", n),
    "gdn": lambda n: _gdn("float32", n),
    "gdn_bf16": lambda n: _gdn("bfloat16", n),
    "gdn_fused": lambda n: _gdn("float32", n, fused_mode=True),
    "gdn_bf16_fused": lambda n: _gdn("bfloat16", n, fused_mode=True),
    "sample": lambda n: _sample(64, 0.5, 1.0, False, n),
    "sample_topp": lambda n: _sample(64, 0.5, 0.9, None, n),
    "sample_b1": lambda n: _sample(1, 0.0, 1.0, False, n),
    "sample_b1_topp": lambda n: _sample(1, 0.0, 0.9, None, n),
    "sample_topp_rows": lambda n: _sample(64, 0.5, 0.9, None, n, path="rows"),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--iters", type=int, default=3)
    a = p.parse_args(argv)
    CASES[a.case](a.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
