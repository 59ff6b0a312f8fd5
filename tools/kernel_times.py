#!/usr/bin/env python3
"""Per-kernel device times of a benchmark run, through Nsight Compute.

    python3 tools/kernel_times.py OUT.txt [--filter REGEX] [--count N] -- CMD...
    python3 tools/kernel_times.py OUT.txt -- -      (summarise an existing OUT.txt.csv)

Runs CMD under ``ncu --clock-control none --cache-control none`` (clocks and caches as
the op would see them in a pipeline) collecting only gpu__time_duration (one
pass, no replay) for kernels whose name matches REGEX, then prints one line per
(kernel, grid, block): launches, median and mean microseconds. This is how the stages
of a multi-launch op (spec_sample's four launches, gdn verify/commit) are timed
separately without bench variants. Clocks are left alone (METHOD.md).
"""
from __future__ import annotations

import csv
import io
import os
import statistics
import subprocess
import sys


def main(argv):
    if "--" not in argv:
        print(__doc__)
        return 2
    cut = argv.index("--")
    opts, cmd = argv[:cut], argv[cut + 1:]
    out = opts[0]
    regex, count = "regex:.", "4000"
    i = 1
    while i < len(opts):
        if opts[i] == "--filter":
            regex = "regex:" + opts[i + 1]
        elif opts[i] == "--count":
            count = opts[i + 1]
        i += 2
    raw = out + ".csv"
    ncu = ["ncu", "--clock-control", "none", "--cache-control", "none", "--metrics",
           "gpu__time_duration.sum,launch__grid_size,launch__block_size",
           "--csv", "--page", "raw", "--print-units", "base", "-k", regex,
           "-c", count, "--log-file", raw] + cmd
    rc = subprocess.call(ncu, env=dict(os.environ)) if cmd != ["-"] else 0
    groups: dict = {}
    try:
        text = open(raw).read()
    except OSError:
        print(f"ncu wrote nothing (rc={rc})")
        return 1
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    for r in rows:
        try:
            t = float(r["gpu__time_duration.sum"].replace(",", "")) / 1e3   # ns -> us
        except (KeyError, ValueError):
            continue
        key = (r.get("Kernel Name", "?")[:48], r.get("Grid Size", "?").replace(" ", ""),
               r.get("Block Size", "?").replace(" ", ""))
        groups.setdefault(key, []).append(t)
    with open(out, "w") as f:
        f.write(f"{'kernel':48s} {'grid':>14s} {'block':>12s} {'n':>5s} {'med_us':>9s} {'mean_us':>9s}\n")
        for (name, grid, block), ts in groups.items():
            f.write(f"{name:48s} {grid:>14s} {block:>12s} {len(ts):5d} "
                    f"{statistics.median(ts):9.2f} {statistics.fmean(ts):9.2f}\n")
    print(open(out).read())
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
