#!/usr/bin/env python3
"""Static instruction mix of the loops of a cubin's kernels (no GPU needed).

    python3 tools/perf/sass_loops.py specdec_lib/_cubin/gdn.sm_90.cubin [--kernel REGEX] [--all]
            [--full-ops] [--top N]

Runs ``cuobjdump -sass`` (PATH, else the nvidia-cuda-cuobjdump wheel), splits it per kernel and
finds every loop (a backward branch and its target). For each kernel it prints the registers,
the stack and, per loop (innermost first, or only the largest with --top 1), its address range,
the instructions in it and the most frequent opcodes (modifiers dropped unless --full-ops).
Straight-line code inside a loop counts once per pass, branches not taken included: it is the
mix of one trip through the body as written, what PERF.md's "instructions per row" counts.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);")
BRA = re.compile(r"\bBRA\b(?:\.\w+)*\s+(?:(?:U?R\w+),\s*)?(0x[0-9a-f]+)")


def find_tool(name):
    p = shutil.which(name)
    if p:
        return p
    for d in sys.path:
        for c in glob.glob(os.path.join(d, "nvidia", "cu1*", "bin", name)):
            return c
    raise SystemExit(f"{name} not found (pip install nvidia-cuda-{name} or put it on PATH)")


def kernels(cubin):
    out = subprocess.run([find_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True,
                         check=True).stdout
    res = subprocess.run([find_tool("cuobjdump"), "-res-usage", cubin], capture_output=True,
                         text=True, check=True).stdout
    usage = {}
    for name, rest in re.findall(r"Function (\w+):\s*\n\s*(.*)", res):
        usage[name] = dict(re.findall(r"(\w+):(\d+)", rest))
    cur, body = None, []
    for line in out.splitlines():
        m = re.search(r"Function : (\w+)", line)
        if m:
            if cur:
                yield cur, body, usage.get(cur, {})
            cur, body = m.group(1), []
        elif cur:
            mi = INSN.search(line)
            if mi:
                body.append((int(mi.group(1), 16), mi.group(3), mi.group(4)))
    if cur:
        yield cur, body, usage.get(cur, {})


def loops(body):
    """(start, end) address ranges of backward branches, innermost (shortest) first."""
    found = set()
    for addr, op, rest in body:
        if op.startswith("BRA"):
            m = BRA.search(op + " " + rest)
            if m and int(m.group(1), 16) <= addr:
                found.add((int(m.group(1), 16), addr))
    return sorted(found, key=lambda r: r[1] - r[0])


def mix(body, lo, hi, full):
    c = Counter()
    for addr, op, _ in body:
        if lo <= addr <= hi:
            c[op if full else op.split(".")[0]] += 1
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubin")
    ap.add_argument("--kernel", default=".", help="regex on the kernel name")
    ap.add_argument("--top", type=int, default=0, help="only the N loops with most instructions")
    ap.add_argument("--full-ops", action="store_true", help="keep opcode modifiers")
    ap.add_argument("--ops", type=int, default=14, help="opcodes shown per loop")
    a = ap.parse_args()
    for name, body, use in sorted(kernels(a.cubin)):
        if not re.search(a.kernel, name):
            continue
        print(f"{name}: {len(body)} instructions, REG {use.get('REG', '?')}, "
              f"STACK {use.get('STACK', '?')}, LOCAL {use.get('LOCAL', '?')}")
        ls = loops(body)
        if a.top:
            ls = sorted(ls, key=lambda r: -sum(mix(body, *r, False).values()))[:a.top]
        for lo, hi in ls:
            c = mix(body, lo, hi, a.full_ops)
            ops = " ".join(f"{k} {v}" for k, v in c.most_common(a.ops))
            print(f"  loop {lo:#06x}-{hi:#06x}: {sum(c.values())} | {ops}")


if __name__ == "__main__":
    main()
