#!/usr/bin/env python3
"""Group the SASS lines of an ncu per-line CSV (tools/profile.sh *.sass.csv) by how often each
line executed: a loop body shows up as many lines with one large count, per-warp fixed code
as many lines with the count of warps launched. Prints, largest share first: the count, the
number of lines, their warp instructions, their stall samples, the address range and the
most frequent opcodes.

    python3 tools/sass_by_count.py prof/sample_topp_spec_sample_rows.sass.csv [--top 15]
"""
import argparse
import csv
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    hdr = next((r for r in rows if "Instructions Executed" in r), None)
    if hdr is None:
        raise SystemExit(f"{a.csv}: no per-line table (did ncu profile a kernel? see its .ncu.log)")
    data = rows[rows.index(hdr) + 1:]
    ia, src, ad = hdr.index("Instructions Executed"), hdr.index("Source"), hdr.index("Address")
    st = hdr.index("Warp Stall Sampling (All Samples)")
    groups = defaultdict(lambda: {"instr": 0, "lines": 0, "stall": 0, "ops": defaultdict(int),
                                  "lo": None, "hi": None})
    total = 0
    for r in data:
        try:
            n = int(r[ia].replace(",", "") or 0)
            addr = int(r[ad], 16)
        except ValueError:
            continue
        if not n:
            continue
        g = groups[n]
        g["instr"] += n
        g["lines"] += 1
        total += n
        try:
            g["stall"] += int(r[st] or 0)
        except ValueError:
            pass
        words = r[src].split()
        op = (words[1] if words and words[0].startswith("@") else words[0]).split(".")[0] if words else "?"
        g["ops"][op] += 1
        g["lo"] = addr if g["lo"] is None else min(g["lo"], addr)
        g["hi"] = addr if g["hi"] is None else max(g["hi"], addr)
    print(f"{total / 1e6:.2f} M warp instructions")
    for n, g in sorted(groups.items(), key=lambda kv: -kv[1]["instr"])[:a.top]:
        ops = sorted(g["ops"].items(), key=lambda x: -x[1])[:6]
        print(f"count {n:>8}  lines {g['lines']:>5}  {g['instr'] / 1e6:6.2f} M ({100 * g['instr'] / total:4.1f}%)"
              f"  stall {g['stall']:>6}  {g['lo'] & 0xfffff:x}-{g['hi'] & 0xfffff:x}  {ops}")


if __name__ == "__main__":
    main()
