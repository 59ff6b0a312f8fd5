#!/usr/bin/env python3
"""Run one op at its benchmark's record shape a few times, untimed, for a profiler.

    ncu --set full -k regex:gdn_verify -c 1 -o rep python3 tools/profile_op.py gdn
    python3 tools/profile_op.py CASE [--iters N]

Cases (the shapes of docs/PERF.md's tables):
  gdn            gdn_verify + gdn_commit, B=64 q=4 Hk=16 Hv=32 128x128 f32 kv state, bf16 in
  gdn_bf16       the same with a bf16 state
  sample         spec_sample B=64 k=3 V=151936 bf16, half greedy, no filter (filters=False)
  sample_topp    the same with top-p 0.9 (filters=None)
  sample_b1      spec_sample B=1, sampled, no filter (filters=False)

Nothing is timed or checked here: the benchmark times (``python3 -m specdec_lib bench``)
and the tests check; this only gives ncu / compute-sanitizer a short, known launch sequence.
"""
from __future__ import annotations

import argparse
import os
import sys

# run as a script from anywhere: the in-place build lives in the repo root
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gdn(state_dtype, iters):
    import numpy as np
    from specdec_lib.arrays import DeviceArray
    from specdec_lib.bench import Bench, _rand
    from specdec_lib.bench_gdn import _gdn_inputs
    from specdec_lib.ops import gdn_commit, gdn_journal_width, gdn_verify
    b = Bench(0)
    B, q, Hk, Hv, D = 64, 4, 16, 32, 128
    T, inp, cu_q, slot_ids = _gdn_inputs(b, B, q, Hk, Hv, D)
    state = _rand((B, Hv, D, D), state_dtype, 0, 6)
    out = DeviceArray.empty((T, Hv, D), "bfloat16", 0)
    journal = DeviceArray.empty((T, gdn_journal_width(Hk, Hv, D, D)), "float32", 0)
    acc = DeviceArray.from_numpy(np.full(B, q, np.int32), device=0)
    for _ in range(iters):
        gdn_verify(inp["q"], inp["k"], inp["v"], state, slot_ids, cu_q, out, journal,
                   a=inp["a"], b=inp["b"], A_log=inp["A_log"], dt_bias=inp["dt_bias"],
                   qk_l2norm=True, layout="kv", check_indices=False, stream=b.stream)
        gdn_commit(state, slot_ids, cu_q, acc, journal, layout="kv", check_indices=False,
                   stream=b.stream)
    b.stream.synchronize()


def _sample(B, greedy_frac, top_p, filters, iters):
    from specdec_lib.arrays import DeviceArray
    from specdec_lib.bench import Bench
    from specdec_lib.bench_sampling import _inputs
    from specdec_lib.ops import spec_sample, spec_sample_workspace_size
    b = Bench(0)
    V, k = 151936, 3
    a, T = _inputs(B, k, V, 0, greedy_frac, top_p)
    ws = DeviceArray.empty((spec_sample_workspace_size(T, V),), "uint8", 0)
    for _ in range(iters):
        spec_sample(a["logits"], a["cu_q"], a["draft_ids"], a["temperature"], a["top_k"],
                    a["top_p"], a["min_p"], a["seed"], a["step"], a["num_accepted"],
                    a["emitted"], a["status"], workspace=ws, stream=b.stream, filters=filters)
    b.stream.synchronize()


CASES = {
    "gdn": lambda n: _gdn("float32", n),
    "gdn_bf16": lambda n: _gdn("bfloat16", n),
    "sample": lambda n: _sample(64, 0.5, 1.0, False, n),
    "sample_topp": lambda n: _sample(64, 0.5, 0.9, None, n),
    "sample_b1": lambda n: _sample(1, 0.0, 1.0, False, n),
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
