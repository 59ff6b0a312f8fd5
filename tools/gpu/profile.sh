#!/usr/bin/env bash
# Full Nsight Compute profile of single kernels of tools/perf/profile_op.py's cases: the
# details page (every section: occupancy, warp stalls, instruction mix, memory) and the
# per-SASS-line source page (stall samples per instruction) as text, for reading off the
# device machine.
#
#   tools/gpu/profile.sh OUTDIR CASE:KERNEL_REGEX[:SKIP:COUNT] ...
#   e.g. tools/gpu/profile.sh /tmp/r/prof gdn:gdn_verify sample_topp:threshold:4:4
# SKIP matching launches are skipped (default 1: the first may pay the module load / JIT),
# then COUNT are profiled (default 1).
#
# Expects the extension built in place (tools/gpu/gpu_check.sh). Clocks are left alone
# (--clock-control none, METHOD.md).
set -u -o pipefail
OUT=${1:?usage: tools/gpu/profile.sh OUTDIR CASE:REGEX ...}
shift
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/specdec_site${PYTHONPATH:+:$PYTHONPATH}
for spec in "$@"; do
  IFS=: read -r case_ regex skip count <<< "$spec"
  label=${case_}_$(tr -c 'A-Za-z0-9_' '_' <<< "$regex" | sed 's/_*$//')
  t0=$(date +%s)
  ncu --clock-control none --set full --import-source no -k "regex:$regex" \
      --launch-skip "${skip:-1}" -c "${count:-1}" \
      -f -o "$OUT/$label" python3 tools/perf/profile_op.py "$case_" --iters 3 > "$OUT/$label.ncu.log" 2>&1
  ncu --import "$OUT/$label.ncu-rep" --page details > "$OUT/$label.details.txt" 2>&1
  ncu --import "$OUT/$label.ncu-rep" --page source --csv --print-source sass > "$OUT/$label.sass.csv" 2>&1
  echo "$label: $(( $(date +%s) - t0 ))s, $(wc -l < "$OUT/$label.sass.csv") sass lines" | tee -a "$OUT/profile_summary.txt"
done
