#!/usr/bin/env bash
# One device session of checking, training and measuring on SmolLM2 (issues 29-32), one STEP
# a call, each call sent within 30 s of the last (a warm machine keeps /tmp). The GGUF travels
# in four ignored parts, .g0/g00 .. .g3/g03 (the gguf wheel in .g3): any call may carry one
# (`carry: [".g1"]`); every step first copies the parts it finds to /tmp/m, and the steps that
# need the model assemble it once all four are there. The tree is ~31 MB since the shipped
# weights travel packed (specdec_lib/models/packed.py: 27 MB of it, 40 MB as plain
# safetensors), so a part (24.6 MB) and .whl (3.3 MB) fit beside it again under the 64 MiB a
# call takes, as the steps below carry them; no stripping of the safetensors (s48's route, when
# the tree was ~44 MB) is needed.
#
#   build  carry .whl .g0  copy the tree to /tmp/clean, build, every GPU test on $FAMILIES
#                          (default the three), `bench $BENCH` (default round_b1)   ~7 min;
#                          TESTS="expr": only those GPU tests (pytest -k);
#                          PATCHES="docs/patches/A.patch ...": tests and bench on a patched
#                          copy (/tmp/patched), main built beside it and benched after it
#   san    carry .g1       memcheck over $SAN_TESTS in the patched copy if any     ~1 min
#   prof   carry .g2       tools/gpu/profile.sh $PROF (CASE:KERNEL ...), same tree  ~2 min;
#                          TIMELINE=1: then tools/perf/round_timeline.py (round_b1's GPU
#                          timeline per launch, torch.profiler) with SPECDEC_PDL=1 and =0,
#                          timeline_pdl1.{log,json} / timeline_pdl0.* in the step's folder
#                          (~1 min; TIMELINE_ARGS, e.g. "--replays 50"); TIMELINE=only: the
#                          timelines without the ncu profile
#   train  carry .g3       the GGUF; the data (train-draft --data-only, $PROMPTS prompts of
#                          $PROMPTS_FROM, default mix; mix2: advice and code grown ->
#                          /tmp/m/data.npz, ~180 s for 30k; kept while warm), then beside each
#                          other on the GPU: HYBRID=continue (default: train-hybrid --init the
#                          shipped or /tmp/hyb hybrid, stage 2 with $TEXT_TOKENS of natural
#                          text) | fresh ($PATTERN, stage 1 too) | head (its MTP head,
#                          train-draft --hybrid /tmp/hyb) | none; and the SmolLM2 heads
#                          ($HEADS_METHOD, default eagle3; none: skip; HEADS_INIT=DIR continues
#                          saved heads, e.g. specdec_lib/models/heads; HEADS_ARGS: more
#                          train-draft options, e.g. "--draft-vocab-from data")    ~9.5 min
#   e2e    (none)          e2e_smollm2 of the new heads (if trained; HEADS_DIR=DIR: those in
#                          DIR, e.g. specdec_lib/models/heads) and the shipped ones (B=1
#                          general / unseen / heldout sets, B=32, served 128/32, -k auto;
#                          OLD_HEADS=/abs/DIR: B=1 on the heads in DIR instead of the
#                          shipped, SHIPPED_S its seconds, 0: none; B32_REPEATS timed runs of
#                          the mixed batches a mode, median kept, default 5; BATCHES: more
#                          mixed batch sizes, default 4,16,64; E2E_S 360), then autok_ab.py
#                          (fixed k=4 against auto at B=1, ABBA)                    ~8 min
#   phases (none)          tools/perf/host_phases.py ($PH_ARGS, default "--prompts 12"; e.g.
#                          "--batch 32") in /tmp/clean and, after build with PATCHES, in
#                          /tmp/patched: a round's host time by phase against its GPU time
#   kv8    (none)          SmolLM2 per 8-bit cache: e2e --kv-agreement fp8_e4m3,int8 (32
#                          general prompts) and --long-context 8192 for each    ~5 min
#   hybrid (none)          the hybrid with its new head: e2e --hybrid (B=1 general, served) in
#                          f32 state, the demo in bf16 / f16 state and on forced compute_75
#                          (f16 math + f16 state) and compute_80, the state fidelity over
#                          1000 tokens (tools/perf/hybrid_state_fidelity.py)        ~7 min;
#                          HYB_E2E="--auto 4" (or "" for the profile; "--serve-repeats 3":
#                          three served ratios), HYB_DEMOS=0 (e2e only), HYB_SETS
#
#   tools/gpu/train_chain.sh STEP "$OUT"
#
# What comes back: at most 8 files, two folders down: logs are tarred (STEP.tgz), heads come
# back as files. Sizes and budgets are environment variables (below).
set -u -o pipefail
STEP=${1:?usage: tools/gpu/train_chain.sh STEP OUTDIR}
OUT=${2:?usage: tools/gpu/train_chain.sh STEP OUTDIR}
CLEAN=/tmp/clean M=/tmp/m SITE=/tmp/specdec_site PARTS=${GGUF_PARTS:-4}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
mkdir -p "$M" "$OUT/$STEP"
L=$OUT/$STEP
pack() { (cd "$OUT" && tar -czf "$STEP.tgz" "$STEP" && rm -rf "$STEP"); }
for f in .g*/g0* .g*/gguf-*.whl; do [ -f "$f" ] && cp "$f" "$M/"; done
# the tree the checks run on: the patched copy where step build made one
chk_tree() { [ -d /tmp/patched ] && echo /tmp/patched || echo "$CLEAN"; }
gguf_env() {
  if [ ! -f "$M/smol.gguf" ]; then
    [ "$(ls "$M"/g0* 2>/dev/null | wc -l)" -eq "$PARTS" ] \
      || { echo "GGUF parts in $M: $(ls "$M" | tr '\n' ' ') (need $PARTS; a cold machine starts at build)"; pack; exit 1; }
    cat "$M"/g0* > "$M/smol.gguf" && sha256sum "$M/smol.gguf" | tee "$L/sha.txt"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $SITE "$M"/gguf-*.whl
  fi
  mkdir -p "$CLEAN/.whl" && cp "$M"/gguf-*.whl "$CLEAN/.whl/"
  export PYTHONPATH=$SITE SPECDEC_SMOLLM2_GGUF=$M/smol.gguf
}
case $STEP in
build)
  rm -rf "$CLEAN" /tmp/patched && mkdir -p "$CLEAN"
  tar --exclude='./.g[0-9]' -cf - . | tar -xf - -C "$CLEAN"
  CHK=$CLEAN
  if [ -n "${PATCHES:-}" ]; then
    # the patches are tested and timed in a copy; the training steps run on main's tree,
    # built beside it (its own header target: two pip installs must not share one)
    cp -r "$CLEAN" /tmp/patched && CHK=/tmp/patched
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
    ${TESTS:+--tests "$TESTS"} > "$L/check.txt" 2>&1
  tail -30 "$L/check.txt"
  wait
  if [ -n "${PATCHES:-}" ] && [ "${BENCH:-round_b1}" != none ]; then    # main, same run
    (cd "$CLEAN" && PYTHONPATH=$SITE timeout 100 python3 -m specdec_lib bench ${BENCH:-round_b1} \
       --json "$L/bench_main.json" > "$L/bench_main.log" 2>&1)
    grep -E "per round|us x" "$L/bench_main.log" | head -20
  fi
  pack ;;
san)
  cd "$(chk_tree)" || exit 1
  timeout "${SAN_S:-100}" bash tools/gpu/sanitize.sh "$L/san" --tools memcheck --families native \
    --tests "${SAN_TESTS:-rms_norm or conv1d or rope_append}" --max-per-test 3 \
    --budget "$(( ${SAN_S:-100} - 15 ))" > "$L/san.txt" 2>&1
  tail -15 "$L/san.txt"
  pack ;;
prof)
  cd "$(chk_tree)" || exit 1
  if [ "${TIMELINE:-}" != only ]; then
    # shellcheck disable=SC2086
    timeout "${PROF_S:-150}" bash tools/gpu/profile.sh "$L/prof" ${PROF:-round_b1:rms_norm round_b1:gdn_verify} \
      > "$L/prof.txt" 2>&1
    rm -f "$L"/prof/*.ncu-rep; tail -5 "$L/prof.txt"
  fi
  if [ -n "${TIMELINE:-}" ]; then
    for pdl in 1 0; do
      # shellcheck disable=SC2086
      SPECDEC_PDL=$pdl PYTHONPATH=$SITE timeout "${TIMELINE_S:-120}" python3 tools/perf/round_timeline.py \
        ${TIMELINE_ARGS:-} --json "$L/timeline_pdl$pdl.json" > "$L/timeline_pdl$pdl.log" 2>&1
      echo "round_timeline SPECDEC_PDL=$pdl rc=$?"; head -32 "$L/timeline_pdl$pdl.log"
    done
  fi
  pack ;;
train)
  cd "$CLEAN" || exit 1
  gguf_env
  DATA=$M/data.npz
  [ -f "$DATA" ] || timeout "${GEN_S:-240}" python3 -m specdec_lib train-draft --out /tmp/h --data "$DATA" \
    --data-only --prompts "${PROMPTS:-30000}" --prompts-from "${PROMPTS_FROM:-mix}" --heldout 64 --sampled-fraction 0.25 \
    --gen-batch 512 --gen-tokens 256 --quiet > "$L/data.log" 2>&1
  echo "data rc=$?"; tail -2 "$L/data.log"
  [ -f "$DATA" ] || { pack; exit 1; }
  left=$(( ${CALL_S:-580} - $(date +%s) + T0 ))
  hyb=
  if [ "${HYBRID:-continue}" = none ]; then     # the SmolLM2 heads alone (s25: "none" used to
    :                                           # fall through to continue, sharing the GPU)
  elif [ "${HYBRID:-continue}" = head ]; then   # the MTP head of the hybrid in /tmp/hyb (or shipped)
    [ -d /tmp/hyb ] || cp -r specdec_lib/models/hybrid/smollm2_hybrid /tmp/hyb
    timeout "$left" python3 -m specdec_lib train-draft --hybrid /tmp/hyb --data "$DATA" \
      --steps 3 --budget-seconds "$(( left - 20 ))" --train-seconds "${HYB_HEAD_S:-400}" 2>&1 | tr '\r' '\n' \
      | grep -vE "it/s\]|s/it\]|^\s*$" > "$L/hybrid.log" &
    hyb=$!
  else                                          # the hybrid itself, with natural text
    hinit=specdec_lib/models/hybrid/smollm2_hybrid; [ -d /tmp/hyb ] && hinit=/tmp/hyb
    stage=(--stage1-steps 0 --stage1-seconds 0 --init "$hinit")
    s1=0   # a fresh run's stage 1 comes out of stage 2's seconds (s19 lost a run to this)
    [ "${HYBRID:-continue}" = fresh ] && s1=${STAGE1_S:-100} \
      && stage=(--pattern "${PATTERN:-GGGAGGAAAAGAGGGAGAAAAGAAGGAAGG}" --stage1-seconds "$s1")
    timeout "$left" python3 -m specdec_lib train-hybrid --out /tmp/hyb_new --data "$DATA" "${stage[@]}" \
      --stage2-seconds "$(( left - ${HYB_RESERVE_S:-90} - s1 ))" --lr2 "${LR2:-3e-4}" --seq-len 512 \
      --batch-tokens 16384 --text-tokens "${TEXT_TOKENS:-4000000}" --text-fraction 0.5 \
      --eval-text-tokens 8192 2>&1 | tr '\r' '\n' | grep -vE "it/s\]|s/it\]|^\s*$" > "$L/hybrid.log" &
    hyb=$!
  fi
  init=()
  [ -n "${HEADS_INIT:-}" ] && init=(--init "$HEADS_INIT")
  [ "${HEADS_METHOD:-eagle3}" = none ] || DATA=$DATA GGUF=$M/smol.gguf SKIP_BUILD=1 timeout "$left" \
    bash tools/gpu/gpu_train.sh /tmp/h --method "${HEADS_METHOD:-eagle3}" --steps 5 "${init[@]}" \
    --prompts-from "${PROMPTS_FROM:-mix}" \
    --budget-seconds "${HEADS_S:-$(( left - 40 ))}" --train-seconds 400 ${HEADS_ARGS:-} | tail -3
  [ -n "$hyb" ] && { wait "$hyb"; echo "hybrid ($HYBRID) rc=$?"; tail -8 "$L/hybrid.log"; }
  [ -f /tmp/hyb_new/model.safetensors ] && rm -rf /tmp/hyb && mv /tmp/hyb_new /tmp/hyb \
    && mkdir -p "$OUT/hybrid" && cp /tmp/hyb/*.json /tmp/hyb/*.safetensors "$OUT/hybrid/"
  cp /tmp/h/train.log "$L/" 2>/dev/null
  for m in mtp eagle3; do
    [ -d /tmp/h/smollm2_$m ] && mkdir -p "$OUT/smollm2_$m" && cp /tmp/h/smollm2_$m/* "$OUT/smollm2_$m/"
  done
  mkdir -p "$OUT/smollm2_hybrid_mtp" && cp /tmp/hyb/smollm2_hybrid_mtp/* "$OUT/smollm2_hybrid_mtp/" 2>/dev/null
  pack ;;
e2e)
  cd "$CLEAN" || exit 1
  gguf_env
  e2e="python3 tools/perf/e2e_smollm2.py --per-set 32 --new 128 --new32 128 --stop-at-eos --no-profile"
  e2e="$e2e --general-mix ${GENERAL_MIX:-2}"   # 1: s26-s27's general set
  hd=${HEADS_DIR:-/tmp/h}     # HEADS_DIR=specdec_lib/models/heads: the full run on the shipped ones
  if ls -d "$hd"/smollm2_* > /dev/null 2>&1; then
    drafts=$(ls -d "$hd"/smollm2_* | sed 's|.*/smollm2_||' | paste -sd,)
    timeout "${E2E_S:-360}" $e2e --heads-dir "$hd" --drafts "$drafts" --sets general,unseen,heldout \
      --head-k 4 --auto 4 --b32 32 --batches "${BATCHES:-4,16,64}" \
      --batch-repeats "${B32_REPEATS:-5}" --serve 128 \
      --json "$L/e2e.json" > "$L/e2e.log" 2>&1
    echo "e2e heads of $hd rc=$?"; grep -E "tok/s, target-only" "$L/e2e.log" | head -40
  fi
  # the short B=1 run on the shipped heads, or with OLD_HEADS=DIR (absolute: this step runs in
  # $CLEAN) on the heads in DIR, e.g. a head being replaced, for a same-run A/B
  ref=(--drafts mtp,eagle3 --sets general,unseen) tag=shipped
  [ -n "${OLD_HEADS:-}" ] && tag=old && ref=(--heads-dir "$OLD_HEADS" --sets general,unseen,heldout \
    --drafts "$(ls -d "$OLD_HEADS"/smollm2_* | sed 's|.*/smollm2_||' | paste -sd,)")
  [ "${SHIPPED_S:-110}" -gt 0 ] && timeout "${SHIPPED_S:-110}" $e2e "${ref[@]}" --head-k 4 --b32 0 \
    --json "$L/e2e_$tag.json" > "$L/e2e_$tag.log" 2>&1
  echo "e2e $tag rc=$?"; grep -E "tok/s, target-only" "$L/e2e_$tag.log" | head -20
  [ "${AB_S:-90}" -gt 0 ] && timeout "${AB_S:-90}" python3 tools/perf/autok_ab.py --draft mtp -k 4 \
    --prompts 16 --new 128 --reps 2 --json "$L/autok_ab.json" > "$L/autok_ab.log" 2>&1
  echo "autok_ab rc=$?"; tail -6 "$L/autok_ab.log"
  pack ;;
phases)
  cd "$CLEAN" || exit 1
  gguf_env
  for t in "$CLEAN" /tmp/patched; do
    [ -d "$t" ] || continue
    (cd "$t" && timeout "${PH_S:-120}" python3 tools/perf/host_phases.py ${PH_ARGS:---prompts 12} \
       > "$L/phases_$(basename "$t").txt" 2>&1)
    echo "== $t"; grep -E "rounds" "$L/phases_$(basename "$t").txt"
  done
  pack ;;
kv8)
  cd "$CLEAN" || exit 1
  gguf_env
  timeout "${KVA_S:-150}" python3 tools/perf/e2e_smollm2.py --kv-agreement fp8_e4m3,int8 --per-set 32 \
    --new 128 --drafts mtp --json "$L/kv_agreement.json" > "$L/kv_agreement.log" 2>&1
  echo "kv agreement rc=$?"; tail -12 "$L/kv_agreement.log"
  for kv in fp8_e4m3 int8; do
    timeout "${LONG_S:-100}" python3 tools/perf/e2e_smollm2.py --long-context 8192 --kv-dtype $kv \
      --drafts mtp --long-batch 1 --new32 256 --json "$L/long_$kv.json" > "$L/long_$kv.log" 2>&1
    echo "long context $kv rc=$?"; tail -4 "$L/long_$kv.log"
  done
  pack ;;
hybrid)
  cd "$CLEAN" || exit 1
  gguf_env
  [ -d /tmp/hyb ] || cp -r specdec_lib/models/hybrid/smollm2_hybrid /tmp/hyb
  drafts=ngram; [ -d /tmp/hyb/smollm2_hybrid_mtp ] && drafts=ngram,mtp
  # HYB_E2E: e2e options in place of the defaults' last ones (e.g. "--auto 4" for -k auto rows,
  # "" to keep the round / prefill profile); HYB_DEMOS=0: the e2e alone (no demos, no fidelity)
  timeout "${E2E_S:-200}" python3 tools/perf/e2e_smollm2.py --hybrid /tmp/hyb --drafts $drafts \
    --sets "${HYB_SETS:-general,unseen}" --per-set 32 --new 128 --new32 128 --stop-at-eos --b32 32 \
    --serve 128 ${HYB_E2E---no-profile} --json "$L/e2e_hybrid.json" > "$L/e2e_hybrid.log" 2>&1
  echo "e2e hybrid rc=$?"; grep -E "tok/s, target-only" "$L/e2e_hybrid.log" | head -20
  [ "${HYB_DEMOS:-1}" = 0 ] && { pack; exit 0; }
  for sd in bfloat16 float16; do
    timeout 60 python3 -m specdec_lib demo --model smollm2-hybrid --weights /tmp/hyb \
      --state-dtype $sd --no-progress > "$L/demo_$sd.log" 2>&1
    echo "demo $sd rc=$?"; tail -3 "$L/demo_$sd.log"
  done
  SPECDEC_FORCE_ARCH=75 timeout 90 python3 -m specdec_lib demo --model smollm2-hybrid \
    --weights /tmp/hyb --state-dtype float16 --dtype float16 --no-progress > "$L/demo_sm75.log" 2>&1
  echo "demo compute_75 f16 rc=$?"; tail -3 "$L/demo_sm75.log"
  SPECDEC_FORCE_ARCH=80 timeout 90 python3 -m specdec_lib demo --model smollm2-hybrid \
    --weights /tmp/hyb --state-dtype bfloat16 --no-progress > "$L/demo_sm80.log" 2>&1
  echo "demo compute_80 bf16 rc=$?"; tail -3 "$L/demo_sm80.log"
  timeout "${FID_S:-150}" python3 tools/perf/hybrid_state_fidelity.py --weights /tmp/hyb --prompts 4 \
    --new 1000 --json "$L/fidelity.json" > "$L/fidelity.log" 2>&1
  echo "state fidelity rc=$?"; tail -3 "$L/fidelity.log"
  pack ;;
*) echo "unknown step $STEP (build, san, prof, train, e2e, phases, kv8, hybrid)"; exit 2 ;;
esac
