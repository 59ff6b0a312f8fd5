#!/usr/bin/env bash
# One device session of training and measuring on SmolLM2 (issues 29 and 30): the GGUF
# travels in three parts (.g0/g00, .g1/g01, .g2/g02 + the gguf wheel in .g2; NOTES.md "How
# to work"), one a call, each call sent within 30 s of the last (a warm machine keeps /tmp).
# Run from the tree's root there, one STEP a call:
#
#   1  carry .whl .g0  copy the tree to /tmp/clean, build, every GPU test on the three
#                      families, `bench $BENCH` (default round_b1)            ~5 min
#   2  carry .g1       memcheck over $SAN_TESTS (small cases)                  ~1.5 min
#   3  carry .g2       the GGUF; train-draft (both heads, the prompt mix) -> /tmp/h, data
#                      -> /tmp/m/data.npz; a train-hybrid probe (3 + 3 steps) beside it
#                                                                               ~9.5 min
#   4  (none)          e2e_smollm2 of the new heads (B=1 general + docstring sets, B=32,
#                      served 128/32, -k auto), then train-hybrid on the same data -> /tmp/hyb
#                                                                               ~9.5 min
#   5  (none)          the hybrid demo in f32 / bf16 / f16 state, the shipped heads on the
#                      general set (the before of step 4's after)             ~3 min
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
  cd "$CLEAN" || exit 1
  timeout "${CHECK_S:-480}" bash tools/gpu/gpu_check.sh "$L/chk" --parallel \
    --families "${FAMILIES:-native 75 80}" --bench "${BENCH:-round_b1}" --bench80 copy \
    > "$L/check.txt" 2>&1
  tail -30 "$L/check.txt"
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
  # the probe: every stage of train-hybrid on this GPU, on the small stdlib set in the tree
  timeout 240 python3 -m specdec_lib train-hybrid --out /tmp/hprobe \
    --data tools/gpu/train_data/smollm2_stdlib_replies.npz --stage1-steps 3 --stage2-steps 3 \
    --eval-sequences 8 > "$L/hybrid_probe.log" 2>&1 &
  probe=$!
  DATA=$M/data.npz GGUF=$M/smol.gguf SKIP_BUILD=1 timeout "${TRAIN_S:-585}" \
    bash tools/gpu/gpu_train.sh /tmp/h --prompts "${PROMPTS:-30000}" --heldout 64 \
    --sampled-fraction 0.25 --gen-batch 512 --gen-tokens 256 --steps 5 \
    --budget-seconds "${BUDGET_S:-530}" --train-seconds 240
  wait $probe; echo "hybrid probe rc=$?"; tail -4 "$L/hybrid_probe.log"
  cp /tmp/h/train.log "$L/"
  for m in mtp eagle3; do
    mkdir -p "$OUT/smollm2_$m" && cp /tmp/h/smollm2_$m/* "$OUT/smollm2_$m/" 2>/dev/null
  done
  pack ;;
4)
  cd "$CLEAN" || exit 1
  gguf_env
  timeout "${E2E_S:-240}" python3 tools/perf/e2e_smollm2.py --heads-dir /tmp/h --drafts mtp,eagle3 \
    --sets general,heldout --per-set 32 --new 128 --new32 128 --stop-at-eos --head-k 4 \
    --auto 4 --b32 32 --serve 128 --no-profile --json "$L/e2e.json" > "$L/e2e.log" 2>&1
  echo "e2e rc=$?"; grep -E "tok/s, target-only" "$L/e2e.log" | head -40
  timeout "${HYB_S:-345}" python3 -m specdec_lib train-hybrid --out /tmp/hyb --data "$M/data.npz" \
    --stage1-seconds "${STAGE1_S:-100}" --stage2-seconds "${STAGE2_S:-200}" --seq-len 512 \
    --batch-tokens 16384 2>&1 | tr '\r' '\n' | grep -vE "it/s\]|s/it\]|^\s*$" > "$L/hybrid.log"
  echo "hybrid rc=${PIPESTATUS[0]}"; tail -6 "$L/hybrid.log"
  mkdir -p "$OUT/hybrid" && cp /tmp/hyb/* "$OUT/hybrid/" 2>/dev/null
  pack ;;
5)
  cd "$CLEAN" || exit 1
  gguf_env
  for sd in float32 bfloat16 float16; do
    timeout 60 python3 -m specdec_lib demo --model smollm2-hybrid --weights /tmp/hyb \
      --state-dtype $sd --draft ngram --no-progress > "$L/demo_$sd.log" 2>&1
    echo "demo $sd rc=$?"; tail -4 "$L/demo_$sd.log"
  done
  timeout "${E2E_S:-100}" python3 tools/perf/e2e_smollm2.py --drafts mtp,eagle3 --sets general \
    --per-set 32 --new 128 --stop-at-eos --head-k 4 --b32 0 --no-profile \
    --json "$L/e2e_shipped.json" > "$L/e2e_shipped.log" 2>&1
  echo "e2e shipped rc=$?"; grep -E "tok/s, target-only" "$L/e2e_shipped.log" | head -20
  pack ;;
*) echo "unknown step $STEP"; exit 2 ;;
esac
