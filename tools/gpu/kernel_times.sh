#!/usr/bin/env bash
# Every kernel's own duration (ncu, one metric: no replay passes beyond the first) in a run
# of one tools/perf/profile_op.py case, as CSV plus a per-kernel-name summary: what a
# launch costs beyond the kernel (graph timing minus this) and what the kernel itself costs.
#
#   tools/gpu/kernel_times.sh OUTDIR CASE [SKIP] [COUNT]
#   e.g. tools/gpu/kernel_times.sh /tmp/r/kt round_b1 319 319   (the second eager round)
set -u -o pipefail
OUT=${1:?usage: tools/gpu/kernel_times.sh OUTDIR CASE [SKIP] [COUNT]}
CASE=${2:?case}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/specdec_site${PYTHONPATH:+:$PYTHONPATH}
ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip "${3:-0}" \
    -c "${4:-400}" --csv --page raw python3 tools/perf/profile_op.py "$CASE" --iters 2 \
    > "$OUT/${CASE}_times.csv" 2> "$OUT/${CASE}_times.err"
python3 - "$OUT/${CASE}_times.csv" <<'PY' | tee "$OUT/${CASE}_times.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
names = rows[head]
k, t = names.index("Kernel Name"), names.index("gpu__time_duration.sum")
per = collections.defaultdict(list)
for r in rows[head + 2:]:          # (the row after the header holds the units)
    try:
        per[r[k].split("(")[0]].append(float(r[t].replace(",", "")))
    except (ValueError, IndexError):
        pass
unit = rows[head + 1][t]
total = sum(sum(v) for v in per.values())
print(f"{len(sum(per.values(), []))} kernels, {total:.0f} {unit} in all")
for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
    print(f"  {name:<48} {len(v):4d} x {sum(v) / len(v):9.1f} {unit} = {sum(v):10.0f}")
PY
