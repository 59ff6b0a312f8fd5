#!/usr/bin/env bash
# Run the GPU tests under compute-sanitizer: every tool x every code family, one log per
# run, one summary line per run, non-zero exit on any report (issue 7).
#
#   tools/gpu/sanitize.sh OUTDIR [--tools "memcheck racecheck initcheck synccheck"]
#                            [--families "native 75 80"] [--tests EXPR] [--files "tests"]
#                            [--level N] [--race-level N] [--max-per-test N]
#                            [--race-max-per-test N] [--run-timeout S] [--budget S] [--dry-run]
#
# Expects the extension already built in place (tools/gpu/gpu_check.sh does it), so it can
# follow gpu_check.sh in the same device command:
#   tools/gpu/gpu_check.sh /tmp/r --bench none --families none && tools/gpu/sanitize.sh /tmp/r/san
#
# Small shapes: SPECDEC_SANITIZE=<level> (tests/conftest.py) deselects the huge
# statistical / large-index cases (level 1) and the large-vocab / long-context ones (level
# 2); SPECDEC_SANITIZE_MAX_PER_TEST=N keeps N evenly spaced parametrizations per GPU test
# function. Defaults: level 1 and every case for memcheck/initcheck/synccheck; level 2 and
# 4 cases per test for racecheck (the slow one on shared-memory-heavy kernels).
# --run-timeout bounds one run; --budget (seconds, 0 = none) stops starting runs when the
# call's time is nearly spent (they are reported SKIPPED), so a 10-minute device call
# returns its logs. Each log ends with pytest's --durations (tune the selection from it).
#
# Exit: 0 all clean; 1 a sanitizer report, a test failure or a timeout; 2 usage / setup;
# 3 clean so far but some runs SKIPPED by the budget.
set -u -o pipefail
OUT=${1:?usage: tools/gpu/sanitize.sh OUTDIR [--tools LIST] [--families LIST] [--tests EXPR] ...}
shift
TOOLS="memcheck racecheck initcheck synccheck" FAMS="native 75 80" TESTS="" FILES="tests"
LEVEL=1 RACE_LEVEL=2 CAP=0 RACE_CAP=4 RUN_TIMEOUT=300 BUDGET=0 DRY=0
while [ $# -gt 0 ]; do
  case $1 in
    --tools) TOOLS=$2; shift 2 ;;
    --families) FAMS=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    --files) FILES=$2; shift 2 ;;
    --level) LEVEL=$2; shift 2 ;;
    --race-level) RACE_LEVEL=$2; shift 2 ;;
    --max-per-test) CAP=$2; shift 2 ;;
    --race-max-per-test) RACE_CAP=$2; shift 2 ;;
    --run-timeout) RUN_TIMEOUT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
# as tools/gpu/gpu_check.sh runs the tests: the in-place extension from the repo root (python -m
# puts the cwd first on sys.path), optional peers (fla-core) from /tmp/specdec_site
export PYTHONPATH=/tmp/specdec_site${PYTHONPATH:+:$PYTHONPATH}
SUMMARY=$OUT/sanitize_summary.txt
: > "$SUMMARY"
T_START=$(date +%s)

SAN=$(command -v compute-sanitizer || true)
for c in "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer; do
  [ -z "$SAN" ] && [ -x "$c" ] && SAN=$c
done
if [ $DRY = 0 ]; then
  [ -n "$SAN" ] || { echo "compute-sanitizer not found (PATH, CUDA_HOME, /usr/local/cuda)" | tee -a "$SUMMARY"; exit 2; }
  if ! python3 -c "import specdec_lib._driver, specdec_lib._copy" > "$OUT/import_check.log" 2>&1; then
    echo "specdec_lib's extension does not import: build it first (tools/gpu/gpu_check.sh OUT --bench none --families none)" | tee -a "$SUMMARY"
    tail -5 "$OUT/import_check.log"
    exit 2
  fi
  "$SAN" --version 2>&1 | tail -2 | tee -a "$SUMMARY"
  HELP=$("$SAN" --help 2>&1)
else
  SAN=compute-sanitizer HELP=""
fi

# options that exist in this compute-sanitizer (probed from --help, so an older or newer
# release never fails on an unknown flag)
opt() {   # opt FLAG VALUE: "FLAG VALUE" when FLAG is listed in --help (always in --dry-run)
  if [ $DRY = 1 ] || grep -q -- "$1" <<< "$HELP"; then echo "$1 $2"; fi
}
tool_opts() {
  case $1 in
    memcheck)  echo "$(opt --leak-check no) $(opt --padding 64)" ;;   # padding: an overrun lands in no other allocation
    racecheck) echo "$(opt --racecheck-report all) $(opt --racecheck-detect-level warn)" ;;
    initcheck) echo "" ;;   # (--track-unused-memory is a bare flag in 2025.3: off is the default)
    synccheck) echo "" ;;
    *) echo "unknown tool $1" >&2; exit 2 ;;
  esac
}
COMMON="--error-exitcode 86 $(opt --print-limit 40)"

echo "== sanitize: tools [$TOOLS] families [$FAMS] tests [${TESTS:-all}] level $LEVEL (racecheck $RACE_LEVEL)" \
  "max/test ${CAP} (racecheck ${RACE_CAP}) run-timeout ${RUN_TIMEOUT}s budget ${BUDGET}s" | tee -a "$SUMMARY"
printf "%-9s %-6s %-8s %6s  %s\n" tool family verdict secs "sanitizer summary | pytest" | tee -a "$SUMMARY"

FAILED=0 SKIPPED=0
for tool in $TOOLS; do
  topts=$(tool_opts "$tool") || exit 2
  lvl=$LEVEL cap=$CAP
  [ "$tool" = racecheck ] && lvl=$RACE_LEVEL && cap=$RACE_CAP
  for fam in $FAMS; do
    label=${tool}_${fam}
    log=$OUT/$label.log
    fenv=()
    case $fam in
      native) ;;
      75|80|90) fenv=(SPECDEC_FORCE_ARCH=$fam) ;;
      *) echo "unknown family $fam (native, 75, 80, 90)"; exit 2 ;;
    esac
    sel=(-m gpu)
    [ -n "$TESTS" ] && sel+=(-k "$TESTS")
    # shellcheck disable=SC2206
    cmd=(env "${fenv[@]}" SPECDEC_SANITIZE=$lvl SPECDEC_SANITIZE_MAX_PER_TEST=$cap
         "$SAN" --tool "$tool" $COMMON $topts
         python3 -m pytest $FILES -q -rfE -p no:cacheprovider --durations=12 "${sel[@]}")
    if [ $DRY = 1 ]; then
      n=$(env "${fenv[@]}" SPECDEC_SANITIZE=$lvl SPECDEC_SANITIZE_MAX_PER_TEST=$cap \
          python3 -m pytest $FILES -q -p no:cacheprovider --collect-only "${sel[@]}" 2>&1 | tail -1)
      printf "%-9s %-6s %-8s %6s  %s\n" "$tool" "$fam" dry - "$n" | tee -a "$SUMMARY"
      echo "    ${cmd[*]}" | tee -a "$SUMMARY"
      continue
    fi
    limit=$RUN_TIMEOUT
    if [ "$BUDGET" -gt 0 ]; then
      left=$(( BUDGET - ($(date +%s) - T_START) ))
      if [ $left -lt 30 ]; then
        printf "%-9s %-6s %-8s %6s  %s\n" "$tool" "$fam" SKIPPED 0 "budget spent" | tee -a "$SUMMARY"
        SKIPPED=$((SKIPPED + 1))
        continue
      fi
      [ $left -lt $limit ] && limit=$left
    fi
    echo "# ${cmd[*]}" > "$log"
    t0=$(date +%s)
    timeout -k 10 "$limit" "${cmd[@]}" >> "$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    san=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$log" | tail -1 | sed 's/^=* *//')
    tail_=$(grep -E "[0-9]+ (passed|failed|error|errors|deselected|skipped)( |,|$)" "$log" | tail -1 | sed 's/^=* *//; s/ *=*$//')
    clean=0
    case $san in
      *"ERROR SUMMARY: 0 errors"*|*"(0 errors, 0 warnings)"*) clean=1 ;;
    esac
    if [ $rc = 124 ] || [ $rc = 137 ]; then verdict=TIMEOUT
    elif [ $rc = 86 ] || { [ -n "$san" ] && [ $clean = 0 ]; }; then verdict=REPORT
    elif [ $rc = 5 ]; then verdict=NOTESTS
    elif [ $rc != 0 ]; then verdict=FAIL
    elif [ $clean = 0 ]; then verdict=NOSUMMARY
    else verdict=OK
    fi
    [ $verdict = OK ] || FAILED=$((FAILED + 1))
    printf "%-9s %-6s %-8s %6s  %s | %s\n" "$tool" "$fam" "$verdict" "$secs" "${san:-no sanitizer summary}" \
      "${tail_:-no pytest summary (rc=$rc)}" | tee -a "$SUMMARY"
    if [ $verdict != OK ]; then
      # the first reports and failing tests, to read without opening the log
      grep -E "^========= (Invalid|Error|Uninitialized|Race|Barrier|Warning|Program hit|[A-Z][a-z]+ access)|^(FAILED|ERROR) " "$log" \
        | sort | uniq -c | sort -rn | head -12 | sed 's/^/      /' | tee -a "$SUMMARY"
    fi
    # slowest tests of the run, to tune the selection (SANITIZE_DROP in tests/conftest.py)
    sed -n '/slowest .*durations/,/^$/p' "$log" | grep -E "^[0-9.]+s " | head -4 | sed 's/^/      slow: /' >> "$SUMMARY"
  done
done
echo "== sanitize done in $(( $(date +%s) - T_START ))s: $FAILED run(s) not clean, $SKIPPED skipped; logs in $OUT" \
  | tee -a "$SUMMARY"
[ $FAILED -gt 0 ] && exit 1
[ $SKIPPED -gt 0 ] && exit 3
exit 0
