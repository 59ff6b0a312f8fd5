#!/usr/bin/env bash
# The one GPU script: build on the GPU machine, run the GPU tests natively and with each
# forced PTX family (the sm_75 / sm_80 code paths through driver JIT), run the benchmarks,
# and write every log under OUTDIR.
#
#   tools/gpu/gpu_check.sh OUTDIR [--tests EXPR] [--bench "op op"|none] [--families "native 75 80"] [--parallel]
#
# Expects (see ../shared/GPU_MACHINE.md): .whl/ holding the nvidia-cuda-runtime and
# nvidia-cuda-profiler-api header wheels matching that machine's cuda-bindings (and
# optionally fla-core for the GDN peer). The Cython layer must be built there (Python
# 3.12); cubins could come from anywhere but building them there is quick.
set -u -o pipefail
OUT=${1:?usage: tools/gpu/gpu_check.sh OUTDIR [--tests EXPR] [--bench OPS] [--families LIST]}
shift
TESTS="" BENCH="" BENCH80="" FAMS="native 75 80" FORCED=1 TEST_TIMEOUT=${TEST_TIMEOUT:-240} PARALLEL=0
while [ $# -gt 0 ]; do
  case $1 in
    --tests) TESTS=$2; shift 2 ;;
    --bench) BENCH=$2; shift 2 ;;
    --bench80) BENCH80=$2; shift 2 ;;   # benchmarks to repeat on the forced compute_80 path
    --families) FAMS=$2; shift 2 ;;
    --parallel) PARALLEL=1; shift ;;    # the families' test runs at once (correctness only: one GPU;
                                        # the long-run memory-growth tests then run alone after them)
    *) echo "unknown option $1"; exit 2 ;;
  esac
done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."

# headers for the Cython build only (kept off PYTHONPATH at run time: the wheel also
# carries a libcudart that must not shadow the machine's own)
HDR=/tmp/specdec_hdr SITE=/tmp/specdec_site
if ls .whl/nvidia_cuda_runtime*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $HDR \
    .whl/nvidia_cuda_runtime*.whl .whl/nvidia_cuda_profiler_api*.whl
fi
if ls .whl/fla_core*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $SITE .whl/fla_core*.whl
fi

echo "== build" | tee "$OUT/summary.txt"
t0=$(date +%s)
PYTHONPATH=$HDR SPECDEC_ARCHS=${SPECDEC_ARCHS:-90,90a} python3 setup.py build_ext --inplace \
  > "$OUT/build.log" 2>&1
rc=$?
grep -E "^  (ptx|cubin)|specdec_lib:|rror" "$OUT/build.log" | tail -60
echo "build rc=$rc in $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
[ $rc -eq 0 ] || { tail -50 "$OUT/build.log"; exit 1; }

export PYTHONPATH=$SITE
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.txt" 2>&1
python3 -m specdec_lib info --load > "$OUT/info.json" 2>&1
python3 -m specdec_lib inspect > "$OUT/inspect.txt" 2>&1 || true

run_tests() {   # $1 = label, rest = env
  local label=$1; shift
  local sel=(-m gpu)
  [ -n "$TESTS" ] && sel+=(-k "$TESTS")
  env "$@" timeout $TEST_TIMEOUT python3 -m pytest tests -q -rfE -p no:cacheprovider "${sel[@]}" \
    > "$OUT/tests_$label.log" 2>&1
  echo "tests $label: $(tail -1 "$OUT/tests_$label.log")" | tee -a "$OUT/summary.txt"
  grep -E "^(FAILED|ERROR)" "$OUT/tests_$label.log" | head -25
}
run_family() {
  case $1 in
    native) run_tests native ;;
    none) ;;
    *) run_tests ptx$1 SPECDEC_FORCE_ARCH=$1 ;;
  esac
}
if [ $PARALLEL = 1 ]; then
  # three pytest processes share 16 cores: numpy's BLAS threads must not fight (s12: the
  # linear tests took > 200 s per family unset, 35 s at 5 threads)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-5} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-5}
  # the long-run tests check device-wide memory growth, which the other families' processes
  # on the same GPU would show: they run afterwards, natively and alone
  TESTS_ALL=$TESTS
  TESTS="${TESTS_ALL:+($TESTS_ALL) and }not long_run"
  for fam in $FAMS; do run_family $fam & done
  wait
  TESTS="${TESTS_ALL:+($TESTS_ALL) and }long_run"
  run_tests native_long_run
else
  for fam in $FAMS; do run_family $fam; done
fi
case " $FAMS " in *" 80 "*) FORCED=1 ;; *) FORCED=0 ;; esac

if [ "$BENCH" != "none" ]; then
  echo "== bench" | tee -a "$OUT/summary.txt"
  timeout 300 python3 -m specdec_lib bench $BENCH --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
  if [ $FORCED = 1 ] && [ -n "${BENCH80:-$BENCH}" ]; then
    SPECDEC_FORCE_ARCH=80 timeout 120 python3 -m specdec_lib bench ${BENCH80:-$BENCH} --json "$OUT/bench_ptx80.json" \
      > "$OUT/bench_ptx80.log" 2>&1
  fi
fi
cat "$OUT/summary.txt"
