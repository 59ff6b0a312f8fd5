#!/usr/bin/env bash
# One device session of training and measuring on SmolLM2 (issues 29 and 30): the GGUF
# travels in three parts (.g0/g00, .g1/g01, .g2/g02 + the gguf wheel in .g2; NOTES.md "How
# to work"), one a call, each call sent within 30 s of the last (a warm machine keeps /tmp).
# Run from the tree's root there, one STEP a call:
#
#   1  carry .whl .g0  copy the tree to /tmp/clean, build, every GPU test on $FAMILIES
#                      (default the three), `bench $BENCH` (default round_b1)  ~7 min;
#                      with PATCHES="docs/patches/A.patch ..." the tests and the bench run on
#                      a patched copy, main's tree is built beside it and benched after it
#   2  carry .g1       memcheck over $SAN_TESTS (small cases)                  ~1 min
#   3  carry .g2       the GGUF; the data (train-draft --data-only, $PROMPTS prompts of the
#                      mix -> /tmp/m/data.npz, ~180 s for 30k), then beside each other on the
#                      GPU: train-draft (both heads -> /tmp/h, --budget-seconds $HEADS_S) and
#                      train-hybrid (-> /tmp/hyb, $STAGE1_S + $STAGE2_S)       ~9.5 min
#   4  (none)          e2e_smollm2 of the new heads (B=1 general, unseen and docstring sets,
#                      B=32, served 128/32, -k auto) and of the shipped ones (B=1); then
#                      the hybrid's MTP head (train-draft --hybrid /tmp/hyb)   ~9.5 min
#   5  (none)          the hybrid: e2e --hybrid (B=1 general, served) in f32 state, the demo
#                      in bf16 / f16 state and on forced compute_75 (f16 math + f16 state)
#                                                                               ~5 min
#
#   tools/gpu/train_chain.sh STEP "$OUT"
#
# What comes back: at most 8 files, two folders down: logs are tarred (sN.tgz), the heads
# and the hybrid come back as files. Sizes and budgets are environment variables (below).
set -u -o pipefail
STEP=${1:?usage: tools/gpu/train_chain.sh STEP OUTDIR}
OUT=${2:?usage: tools/gpu/train_chain.sh STEP OUTDIR}
CLEAN=/tmp/clean M=/tmp/m SITE=/tmp/specdec_site
export PYTHONUNBUFFERED=1
T0=$(date +%s)
mkdir -p "$M" "$OUT/s$STEP"
L=$OUT/s$STEP
pack() { (cd "$OUT" && tar -czf "s$STEP.tgz" "s$STEP" && rm -rf "s$STEP"); }
gguf_env() {
  export PYTHONPATH=$SITE SPECDEC_SMOLLM2_GGUF=$M/smol.gguf
  [ -f "$M/smol.gguf" ] || { echo "no $M/smol.gguf: the machine went cold, start at step 1"; exit 1; }
}
case $STEP in
1)
  cp .g0/g00 "$M/"
  rm -rf "$CLEAN" && mkdir -p "$CLEAN"
  tar --exclude=./.g0 --exclude=./.g1 --exclude=./.g2 -cf - . | tar -xf - -C "$CLEAN"
  CHK=$CLEAN
  if [ -n "${PATCHES:-}" ]; then
    # the patches are tested and timed in a copy; the training steps run on main's tree,
    # built beside it (its own header target: two pip installs must not share one)
    rm -rf /tmp/patched && cp -r "$CLEAN" /tmp/patched && CHK=/tmp/patched
    for pf in $PATCHES; do
      (cd /tmp/patched && patch -p1 -s --forward -F3 < "$pf") || { echo "patch $pf failed"; pack; exit 1; }
      echo "applied $pf"
    done
    (cd "$CLEAN" && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
       --target /tmp/hdr_main .whl/nvidia_cuda_runtime*.whl .whl/nvidia_cuda_profiler_api*.whl \
     && PYTHONPATH=/tmp/hdr_main SPECDEC_ARCHS=90,90a python3 setup.py build_ext --inplace \
       > "$L/build_main.log" 2>&1; echo "main build rc=$?") &
  fi
  cd "$CHK" || exit 1
  TEST_TIMEOUT=${TEST_TIMEOUT:-300} timeout "${CHECK_S:-520}" bash tools/gpu/gpu_check.sh "$L/chk" --parallel \
    --families "${FAMILIES:-native 75 80}" --bench "${BENCH:-round_b1}" --bench80 copy \
    > "$L/check.txt" 2>&1
  tail -30 "$L/check.txt"
  wait
  if [ -n "${PATCHES:-}" ] && [ "${BENCH:-round_b1}" != none ]; then    # main, same run
    (cd "$CLEAN" && PYTHONPATH=$SITE timeout 100 python3 -m specdec_lib bench ${BENCH:-round_b1} \
       --json "$L/bench_main.json" > "$L/bench_main.log" 2>&1)
    grep -E "per round|us x" "$L/bench_main.log" | head -20
  fi
  pack ;;
2)
  cp .g1/g01 "$M/"
  cd "$CLEAN" || exit 1
  timeout "${SAN_S:-100}" bash tools/gpu/sanitize.sh "$L/san" --tools memcheck --families native \
    --tests "${SAN_TESTS:-rms_norm or conv1d or rope_append}" --max-per-test 3 \
    --budget "$(( ${SAN_S:-100} - 15 ))" > "$L/san.txt" 2>&1
  tail -15 "$L/san.txt"
  pack ;;
3)
  cat "$M/g00" "$M/g01" .g2/g02 > "$M/smol.gguf" && sha256sum "$M/smol.gguf" | tee "$L/sha.txt"
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $SITE .g2/gguf-*.whl
  mkdir -p "$CLEAN/.whl" && cp .g2/gguf-*.whl "$CLEAN/.whl/"
  cd "$CLEAN" || exit 1
  gguf_env
  DATA=$M/data.npz
  timeout "${GEN_S:-240}" python3 -m specdec_lib train-draft --out /tmp/h --data "$DATA" \
    --data-only --prompts "${PROMPTS:-30000}" --heldout 64 --sampled-fraction 0.25 \
    --gen-batch 512 --gen-tokens 256 --quiet > "$L/data.log" 2>&1
  echo "data rc=$?"; tail -2 "$L/data.log"
  [ -f "$DATA" ] || { pack; exit 1; }
  left=$(( ${CALL_S:-580} - $(date +%s) + T0 ))
  timeout "$left" python3 -m specdec_lib train-hybrid --out /tmp/hyb --data "$DATA" \
    --stage1-seconds "${STAGE1_S:-110}" --stage2-seconds "${STAGE2_S:-$(( left - 170 ))}" \
    --seq-len 512 --batch-tokens 16384 2>&1 | tr '\r' '\n' | grep -vE "it/s\]|s/it\]|^\s*$" \
    > "$L/hybrid.log" &
  hyb=$!
  [ "${HEADS_METHOD:-both}" = none ] || DATA=$DATA GGUF=$M/smol.gguf SKIP_BUILD=1 timeout "$left" \
    bash tools/gpu/gpu_train.sh /tmp/h --method "${HEADS_METHOD:-both}" --steps 5 \
    --budget-seconds "${HEADS_S:-$(( left - 40 ))}" --train-seconds 400 | tail -3
  wait $hyb; echo "hybrid rc=$?"; tail -4 "$L/hybrid.log"
  cp /tmp/h/train.log "$L/" 2>/dev/null
  for m in mtp eagle3; do
    mkdir -p "$OUT/smollm2_$m" && cp /tmp/h/smollm2_$m/* "$OUT/smollm2_$m/" 2>/dev/null
  done
  mkdir -p "$OUT/hybrid" && cp /tmp/hyb/* "$OUT/hybrid/" 2>/dev/null
  pack ;;
4)
  cd "$CLEAN" || exit 1
  gguf_env
  e2e="python3 tools/perf/e2e_smollm2.py --per-set 32 --new 128 --new32 128 --stop-at-eos --no-profile"
  timeout "${E2E_S:-260}" $e2e --heads-dir /tmp/h --drafts mtp,eagle3 --sets general,unseen,heldout \
    --head-k 4 --auto 4 --b32 32 --serve 128 --json "$L/e2e.json" > "$L/e2e.log" 2>&1
  echo "e2e rc=$?"; grep -E "tok/s, target-only" "$L/e2e.log" | head -40
  timeout "${SHIPPED_S:-110}" $e2e --drafts mtp,eagle3 --sets general,unseen --head-k 4 --b32 0 \
    --json "$L/e2e_shipped.json" > "$L/e2e_shipped.log" 2>&1
  echo "e2e shipped rc=$?"; grep -E "tok/s, target-only" "$L/e2e_shipped.log" | head -20
  left=$(( ${CALL_S:-580} - $(date +%s) + T0 ))
  timeout "$left" python3 -m specdec_lib train-draft --hybrid /tmp/hyb --data "$M/data.npz" \
    --steps 3 --budget-seconds "$(( left - 20 ))" --train-seconds 400 2>&1 | tr '\r' '\n' \
    | grep -vE "it/s\]|s/it\]|^\s*$" > "$L/hybrid_head.log"
  echo "hybrid head rc=${PIPESTATUS[0]}"; tail -8 "$L/hybrid_head.log"
  mkdir -p "$OUT/smollm2_hybrid_mtp" && cp /tmp/hyb/smollm2_hybrid_mtp/* "$OUT/smollm2_hybrid_mtp/" 2>/dev/null
  pack ;;
5)
  cd "$CLEAN" || exit 1
  gguf_env
  timeout "${E2E_S:-200}" python3 tools/perf/e2e_smollm2.py --hybrid /tmp/hyb --drafts ngram,mtp \
    --sets general,unseen --per-set 32 --new 128 --new32 128 --stop-at-eos --b32 32 --serve 128 \
    --no-profile --json "$L/e2e_hybrid.json" > "$L/e2e_hybrid.log" 2>&1
  echo "e2e hybrid rc=$?"; grep -E "tok/s, target-only" "$L/e2e_hybrid.log" | head -20
  for sd in bfloat16 float16; do
    timeout 60 python3 -m specdec_lib demo --model smollm2-hybrid --weights /tmp/hyb \
      --state-dtype $sd --no-progress > "$L/demo_$sd.log" 2>&1
    echo "demo $sd rc=$?"; tail -3 "$L/demo_$sd.log"
  done
  SPECDEC_FORCE_ARCH=75 timeout 90 python3 -m specdec_lib demo --model smollm2-hybrid \
    --weights /tmp/hyb --state-dtype float16 --dtype float16 --no-progress > "$L/demo_sm75.log" 2>&1
  echo "demo compute_75 f16 rc=$?"; tail -3 "$L/demo_sm75.log"
  pack ;;
*) echo "unknown step $STEP"; exit 2 ;;
esac
