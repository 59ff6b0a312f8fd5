#!/usr/bin/env python3
"""Prove a kernel-source change left kernels untouched, without a GPU: compare two PTX files
kernel by kernel (each .entry's instruction text, debug sections, .loc/.file and comments
dropped, branch labels' module-wide numbers and the hash nvcc puts into anonymous-namespace
names ignored -- they change with the other kernels and the source file's text and path, not
with the code) and the module-level declarations. Prints identical / DIFF per kernel, the kernels
only one side has, and exits 1 when a kernel present on both sides differs.

    python3 tools/release/ptx_same.py BEFORE.ptx AFTER.ptx [PREFIX]

(tools/perf/ptx_float_ops.py compares the float-op streams only, registers renamed: for changes
that are meant to alter control code but not arithmetic.)"""
import re
import sys


def _clean(path):
    txt = open(path).read()
    txt = re.sub(r"\.section\s*\.debug.*", "", txt, flags=re.S)
    txt = re.sub(r"_INTERNAL_[0-9a-f]{8}_", "_INTERNAL_", txt)
    txt = re.sub(r"__N__[0-9a-f]{8}_", "__N__", txt)
    # branch labels are numbered across the module: a kernel added before another renumbers
    # the later one's labels without changing its code
    txt = re.sub(r"\$L__BB\d+_", "$L__BB_", txt)
    lines = [ln.split("//")[0].rstrip() for ln in txt.splitlines()]
    return "\n".join(ln for ln in lines if ln.strip() and not ln.strip().startswith((".loc", ".file"))) + "\n"


def split(path, prefix=""):
    txt = _clean(path)
    entries = {m.group(1): m.group(0) for m in re.finditer(r"\.entry\s+(\w+)\s*\(.*?\n\}\n", txt, re.S)
               if m.group(1).startswith(prefix)}
    rest = re.sub(r"(\.visible\s+)?\.entry\s+\w+\s*\(.*?\n\}\n", "", txt, flags=re.S)
    return entries, [ln.strip() for ln in rest.splitlines()]


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    a, ga = split(argv[0], argv[2] if len(argv) > 2 else "")
    b, gb = split(argv[1], argv[2] if len(argv) > 2 else "")
    bad = 0
    for k in sorted(set(a) & set(b)):
        same = a[k] == b[k]
        bad += not same
        print(f"{k:40s} {'identical' if same else 'DIFF'}")
    for k in sorted(set(a) - set(b)):
        print(f"{k:40s} only in {argv[0]}")
    for k in sorted(set(b) - set(a)):
        print(f"{k:40s} only in {argv[1]}")
    for ln in sorted(set(ga) ^ set(gb)):
        print(f"module-level declaration {'removed' if ln in ga else 'added'}: {ln}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
