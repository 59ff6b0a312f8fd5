"""Summarise the per-SASS-line CSV of tools/gpu/profile.sh (ncu --page source --csv --print-source sass).

    python3 tools/perf/sass_summary.py FILE.sass.csv [--top N]

For each profiled kernel (the CSV holds one section per kernel, each starting with a "Kernel
Name" line): warp instructions executed and stall samples per opcode, the stall reasons, and
the N hottest lines by stall samples, so the question "what does this kernel spend its issue
slots and its waits on" has an answer in one screen.
"""
from __future__ import annotations

import argparse
import csv
import io
from collections import defaultdict


def sections(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    cur_name, cur_lines = None, []
    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            if cur_name is not None:
                yield cur_name, cur_lines
            cur_name = line.split(",")[1].strip('"')
            cur_lines = []
        elif cur_name is not None:
            cur_lines.append(line)
    if cur_name is not None:
        yield cur_name, cur_lines


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def summarise(name, lines, top):
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if not rows:
        return
    stall_cols = [c for c in rows[0] if c.startswith("stall_") and "(Not Issued)" not in c]
    by_op = defaultdict(lambda: [0.0, 0.0])
    reasons = defaultdict(float)
    tot_i = tot_s = 0.0
    for r in rows:
        src = (r.get("Source") or "").strip()
        op = src.split()[0] if src else "?"
        if op.startswith("@"):
            op = src.split()[1] if len(src.split()) > 1 else op
        op = op.split(".")[0]
        i = num(r.get("Instructions Executed"))
        s = num(r.get("Warp Stall Sampling (All Samples)"))
        by_op[op][0] += i
        by_op[op][1] += s
        tot_i += i
        tot_s += s
        for c in stall_cols:
            reasons[c] += num(r.get(c))
    print(f"== {name}: {tot_i / 1e6:.2f} M warp instructions, {tot_s:.0f} stall samples")
    print("   opcode        instr%   stall%")
    for op, (i, s) in sorted(by_op.items(), key=lambda kv: -(kv[1][0] + kv[1][1] * tot_i / max(tot_s, 1))) [:18]:
        print(f"   {op:12s} {100 * i / max(tot_i, 1):6.1f}  {100 * s / max(tot_s, 1):6.1f}")
    rs = sorted(((v, k) for k, v in reasons.items() if v), reverse=True)[:8]
    if rs:
        print("   stalls: " + ", ".join(f"{k.replace('stall_', '')} {100 * v / max(tot_s, 1):.0f}%" for v, k in rs))
    hot = sorted(rows, key=lambda r: -num(r.get("Warp Stall Sampling (All Samples)")))[:top]
    print("   hottest lines (stall samples, instructions executed, source):")
    for r in hot:
        print(f"   {num(r.get('Warp Stall Sampling (All Samples)')):7.0f} {num(r.get('Instructions Executed')):10.0f}  "
              f"{r.get('Address', '')[-5:]}  {(r.get('Source') or '').strip()[:70]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)
    for name, lines in sections(a.csv):
        summarise(name, lines, a.top)


if __name__ == "__main__":
    main()
