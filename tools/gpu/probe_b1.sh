#!/usr/bin/env bash
# Issue 31 / 32 probe in one device call, on a tree built in place by gpu_check.sh: the
# batch-1 round (bench round_b1), the small-batch split sweep (bench verify_attention_b1),
# every round kernel's own duration (kernel_times.sh), full profiles of the 8-bit KV
# kernels, then docs/patches/pdl-every-launch.patch built in a copy: the GPU tests natively
# under PDL and round_b1 with SPECDEC_PDL=0 / 1. Stops starting steps DEADLINE seconds after
# it began (default 540) so the caller's tar of OUTDIR still runs.
#
#   tools/gpu/probe_b1.sh OUTDIR SNAPSHOT_TAR [DEADLINE]
set -u -o pipefail
OUT=${1:?usage: probe_b1.sh OUTDIR SNAPSHOT_TAR [DEADLINE]}
SNAP=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
END=$(( $(date +%s) + ${3:-540} ))
left() { echo $(( END - $(date +%s) )); }
step() {   # step SECONDS LOGNAME command...: run when time is left, bounded by both
  local want=$1 log=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 15 ]; then echo "skipped (time): $*" | tee -a "$OUT/probe.txt"; return; fi
  [ "$want" -gt "$l" ] && want=$l
  local t0; t0=$(date +%s)
  timeout "$want" "$@" > "$OUT/$log" 2>&1
  echo "rc=$? $(( $(date +%s) - t0 ))s: $*" | tee -a "$OUT/probe.txt"
}
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=5 OPENBLAS_NUM_THREADS=5
step 60 b1.log python3 -m specdec_lib bench round_b1 --json "$OUT/b1.json"
step 60 vab1.log python3 -m specdec_lib bench verify_attention_b1 --json "$OUT/vab1.json"
step 60 kt.log bash tools/gpu/kernel_times.sh "$OUT/kt" round_b1 319 319
step 110 prof.log bash tools/gpu/profile.sh "$OUT/prof" \
  bench_verify_attention:verify_attention_kv8_d128_bf16_fp8:1:1 \
  bench_verify_attention:verify_attention_kv8_d128_bf16_int8:1:1 bench_append_kv:append_kv8_fp8:1:1
rm -f "$OUT"/prof/*.ncu-rep
# PDL on every launch, in a copy of the snapshot
P=/tmp/pdl
rm -rf $P && mkdir -p $P && tar -xf "$SNAP" -C $P && cp -r .whl $P/ && cd $P || exit 1
patch -p1 < docs/patches/pdl-every-launch.patch > "$OUT/pdl_patch.log" 2>&1 || exit 1
PYTHONPATH=/tmp/specdec_hdr SPECDEC_ARCHS=90,90a step 120 pdl_build.log python3 setup.py build_ext --inplace
for p in 1 0; do SPECDEC_PDL=$p step 50 b1_pdl$p.log python3 -m specdec_lib bench round_b1 --json "$OUT/b1_pdl$p.json"; done
# the GPU tests natively under PDL, three processes over the test files
files=(tests/test_*.py)
for g in 0 1 2; do
  sel=(); for i in "${!files[@]}"; do [ $(( i % 3 )) = $g ] && sel+=("${files[$i]}"); done
  step 200 pdl_tests_$g.log python3 -m pytest "${sel[@]}" -q -rfE -p no:cacheprovider -m gpu -k "not long_run" &
done
wait
for g in 0 1 2; do echo "pdl tests $g: $(tail -1 "$OUT/pdl_tests_$g.log")" | tee -a "$OUT/probe.txt"; done
