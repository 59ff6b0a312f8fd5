#!/usr/bin/env bash
# A/B of kernel patches to one module in one device call (s36, for the verify kernels): main
# is built in full (SPECDEC_ARCHS=90: sm_90 cubins + the compute_75/80/90 PTX), each patch is
# applied to a copy of that built tree where only $MODULE is rebuilt, then `bench $BENCH` runs
# in every tree (twice, in opposite orders, while time allows); the trees of $TESTS_ON run the
# GPU tests of $TESTS natively and on forced compute_75 / compute_80, main runs $MAIN_TESTS
# beside them and $MAIN_BENCH once after them. Logs come back as OUT/ab_logs.tgz.
#
#   tools/gpu/kv8_ab.sh OUT PATCH...     PATCH: a path in the tree (e.g. in an ignored,
#                                        carried folder: `carry: [".whl"]`)
#   MODULE (verify_attention_kv8; a patch's own `modules: a b` header line overrides it)
#   BENCH (verify_attention; main runs it all, a patch's `bench: x y` line narrows its own)
#   GREP (the bench rows shown, GREP_N of them: default verify attention's page=16 rows, 10)
#   TESTS ("tests/test_kv8.py tests/test_attention.py")  TESTS_ON (trees: "main p1 ...";
#   default the last)  MAIN_TESTS (pytest -k expression on main, -m gpu; empty: none)
#   MAIN_BENCH (bench names; empty: none)
#   SANITIZE_ON (a tree: compute-sanitizer over SAN_FILES (default $TESTS) -k SAN_TESTS, tools
#   SAN_TOOLS (memcheck), families SAN_FAMS (native), beside the tests)
set -u -o pipefail
OUT=${1:?usage: tools/gpu/kv8_ab.sh OUT PATCH...}
shift
MODULE=${MODULE:-verify_attention_kv8} BENCH=${BENCH:-verify_attention}
TESTS=${TESTS:-tests/test_kv8.py tests/test_attention.py} MAIN_TESTS=${MAIN_TESTS:-}
T0=$(date +%s) ROOT=$(pwd) HDR=/tmp/specdec_hdr AB=/tmp/ab
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4
mkdir -p "$OUT"
el() { echo "$(( $(date +%s) - T0 ))s"; }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $HDR \
  .whl/nvidia_cuda_runtime*.whl .whl/nvidia_cuda_profiler_api*.whl
rm -rf $AB && mkdir -p $AB/main
tar --exclude='./.g[0-9]' -cf - . | tar -xf - -C $AB/main
(cd $AB/main && PYTHONPATH=$HDR SPECDEC_ARCHS=90 python3 setup.py build_ext --inplace) > "$OUT/build_main.log" 2>&1
echo "main build rc=$? at $(el)"
trees=(main)
declare -A tree_bench=()   # a patch's own `bench:` line
i=0
for pf in "$@"; do
  i=$((i + 1)); v=p$i
  cp -r $AB/main $AB/$v
  (cd $AB/$v && patch -p1 -s --forward < "$ROOT/$pf") || { echo "patch $pf failed"; continue; }
  mods=$(sed -n 's/^modules: *//p' "$ROOT/$pf" | head -1)
  b=$(sed -n 's/^bench: *//p' "$ROOT/$pf" | head -1); [ -n "$b" ] && tree_bench[$v]=$b
  (cd $AB/$v && PYTHONPATH=$HDR SPECDEC_ARCHS=90 python3 -c \
    "from build_backend.cubins import build_kernels; build_kernels(only=set('${mods:-$MODULE}'.split()))" \
    > "$OUT/build_$v.log" 2>&1; echo "$v = $pf (${mods:-$MODULE}): build rc=$?")
  trees+=("$v")
done
echo "builds done at $(el)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.txt" 2>&1
bench_in() {   # $1 tree, $2 round
  (cd $AB/$1 && timeout 150 python3 -m specdec_lib bench ${tree_bench[$1]:-$BENCH} \
     --json "$OUT/bench_$1_$2.json" > "$OUT/bench_$1_$2.log" 2>&1)
  echo "bench $1 round $2 rc=$? at $(el)"
  grep -E "${GREP:-specdec_lib .*page=16}" "$OUT/bench_$1_$2.log" | grep -vE "head-major|splits=(64|128)" \
    | sed -E 's/ +/ /g; s/verify_attention specdec_lib //' | head -${GREP_N:-10}
}
for v in "${trees[@]}"; do bench_in "$v" 1; done
last=${trees[-1]}
run_t() {   # $1 label, $2 tree, $3 selection args..., env before
  local label=$1 tree=$2; shift 2
  (cd $AB/$tree && timeout 280 env "$@" > "$OUT/tests_$label.log" 2>&1)
  echo "tests $label: $(tail -1 "$OUT/tests_$label.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/tests_$label.log" | head -10
}
# shellcheck disable=SC2086
{
  for t in ${TESTS_ON:-$last}; do
    run_t "${t}_native" "$t" python3 -m pytest $TESTS -q -rfE -p no:cacheprovider -m gpu &
    run_t "${t}_ptx75" "$t" SPECDEC_FORCE_ARCH=75 python3 -m pytest $TESTS -q -rfE -p no:cacheprovider -m gpu &
    run_t "${t}_ptx80" "$t" SPECDEC_FORCE_ARCH=80 python3 -m pytest $TESTS -q -rfE -p no:cacheprovider -m gpu &
  done
  if [ -n "${SANITIZE_ON:-}" ]; then   # beside the tests: tools/gpu/sanitize.sh in that tree
    (bash $AB/$SANITIZE_ON/tools/gpu/sanitize.sh "$OUT/san_$SANITIZE_ON" --tools "${SAN_TOOLS:-memcheck}" \
       --families "${SAN_FAMS:-native}" --files "${SAN_FILES:-$TESTS}" --tests "${SAN_TESTS:-}" \
       --run-timeout 250 > "$OUT/san.log" 2>&1
     echo "sanitize $SANITIZE_ON rc=$?"; cat "$OUT/san_$SANITIZE_ON/sanitize_summary.txt") &
  fi
  [ -n "$MAIN_TESTS" ] && run_t main_selected main python3 -m pytest tests -q -rfE -p no:cacheprovider -m gpu -k "$MAIN_TESTS" &
  wait
}
echo "tests done at $(el)"
if [ -n "${MAIN_BENCH:-}" ]; then   # once, in main (e.g. the full verify_attention rows)
  (cd $AB/main && timeout 150 python3 -m specdec_lib bench $MAIN_BENCH --json "$OUT/bench_main_full.json" \
     > "$OUT/bench_main_full.log" 2>&1)
  echo "bench main ($MAIN_BENCH) rc=$? at $(el)"
  grep -E "page=16" "$OUT/bench_main_full.log" | sed -E 's/ +/ /g' | head -24
fi
left=$(( ${CALL_S:-560} - $(date +%s) + T0 ))
for ((j = ${#trees[@]} - 1; j >= 0; j--)); do   # the second round, in the opposite order
  [ "$left" -gt 60 ] || break
  bench_in "${trees[$j]}" 2
  left=$(( ${CALL_S:-560} - $(date +%s) + T0 ))
done
echo "done at $(el)"
# what comes back: one archive (a call returns few files)
(cd "$OUT" && tar -czf ../ab_logs.tgz . && rm -rf ./* && mv ../ab_logs.tgz .)
