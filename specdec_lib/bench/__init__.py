"""Benchmarks: ``python -m specdec_lib bench [op ...] [--json FILE]``.

One module per op family, as in ``specdec_lib.ops`` (copy, attention, gdn, conv, draft, layers,
sampling) plus ``round`` (the host cost of a whole round); ``_harness`` holds the timing.

Every benchmark reports the bytes the op must move, the achieved GB/s, and the ratio
to the device-to-device copy bandwidth measured in the same run (bytes read +
written), plus a peer on the same shape where one is importable (torch, fla).
Timing: CUDA events around many back-to-back calls on one stream after a warm-up,
median of repeats; small ops are timed as CUDA-graph replays so host launch
overhead is not what gets measured.
"""
from __future__ import annotations

import argparse
import json

from .. import runtime
from ._harness import _BENCHES, _OPTIONAL, Bench, _rand, bench

__all__ = ["Bench", "bench", "main", "_rand"]

FAMILIES = ("copy", "attention", "gdn", "conv", "draft", "layers", "round", "sampling")


def main(argv: list[str] | None = None) -> int:
    _load_families()
    p = argparse.ArgumentParser(prog="python -m specdec_lib bench",
                                description="Benchmark specdec_lib ops on the GPU against the "
                                            "copy bandwidth measured in the same run.")
    p.add_argument("ops", nargs="*", help=f"which benchmarks (default: all but "
                                          f"{', '.join(sorted(_OPTIONAL)) or 'none'}): {', '.join(_BENCHES)}")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args(argv)
    reason = runtime.gpu_unavailable_reason()
    if reason:
        print(f"bench: no GPU ({reason})")
        return 2
    names = args.ops or [n for n in _BENCHES if n not in _OPTIONAL]
    unknown = [n for n in names if n not in _BENCHES]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; known: {', '.join(_BENCHES)}")
    b = Bench(args.device)
    print(f"device: {b.props['name']} ({b.props['sm_count']} SMs), family sm_"
          f"{runtime.arch_family(args.device)}; copy bandwidth {b.copy_bw():.0f} GB/s")
    failed = []
    for n in names:
        try:
            _BENCHES[n](b)
        except Exception as e:   # one broken benchmark must not hide the others
            failed.append(n)
            print(f"  {n}: FAILED {type(e).__name__}: {e}", flush=True)
    b.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": b.props, "copy_GBps": b.copy_bw(), "family":
                       runtime.arch_family(args.device), "rows": b.rows}, f, indent=1, default=str)
    return 1 if failed else 0


def _load_families():
    """Import every family's module (each registers its benchmarks), in the order ``bench``
    runs them by default."""
    import importlib
    for name in FAMILIES:
        importlib.import_module(f"{__name__}.{name}")
