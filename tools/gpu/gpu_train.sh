#!/usr/bin/env bash
# Train the SmolLM2 draft heads on the H200 (one device call): build the library (native code
# only: generation runs through it), then `python -m specdec_lib train-draft` with the GGUF at $GGUF; heads
# (OUTDIR/smollm2_<method>/: the device returns files at most two folders deep), the
# generated data and the log go to OUTDIR.
#
#   GGUF=/tmp/m/smol.gguf [SKIP_BUILD=1] tools/gpu/gpu_train.sh OUTDIR [train-draft options]
#
# SKIP_BUILD=1: the tree is built in place already (tools/gpu/gpu_check.sh in an earlier call).
#
# Both heads on the prompt mix (train-draft's default --prompts-from mix), one ~450 s H200 call:
#
#   GGUF=/tmp/m/smol.gguf SKIP_BUILD=1 tools/gpu/gpu_train.sh OUTDIR --prompts 14000 \
#     --heldout 64 --sampled-fraction 0.25 --gen-batch 512 --gen-tokens 256 --steps 5 \
#     --budget-seconds 430 --train-seconds 175
#
# Why these sizes (session 12's stdlib run, the shipped heads: 11,740 replies, 1.59M tokens,
# --gen-batch 512, generation 59 s = ~2.6 s per 512-reply chunk, teacher 13.5 s, 163 s of
# training per head, 414-425 s in all under --budget-seconds 465): 14,000 training prompts
# (~13,900 after dropping the rewrite / summarise ones on held-out docstrings) + 64 report
# prompts for each of the 12 families (768) = ~14,700 replies = 29 chunks of 512, ~75 s (a
# chunk waits for its longest reply, so the mix's longer replies cost little more per chunk;
# 512 was measurably cheaper per reply than 256 in session 12); teacher ~20 s (the longest
# prompt is ~340 tokens, so N ~600; features ~41 GB of bf16 on the GPU); model load ~10 s;
# the 430 s budget then leaves (430 - ~105 - 2 x 30 reserve) / 2 ~ 130 s of training per
# head (the reserve covers the per-family report and the save). Total ~440 s + start-up.
# Fewer prompts buy training time (1,000 prompts ~ 5 s of generation); --gen-tokens 256 keeps
# the reply lengths of the shipped heads' data. The stdlib data of the shipped heads:
# --prompts-from stdlib --variants 6 --gen-batch 512 --budget-seconds 465 --train-seconds 175
# --steps 5 (or DATA=FILE to reuse that set: git show
# ec998bd:tools/gpu/train_data/smollm2_stdlib_replies.npz > FILE; out of the tree since s29).
set -u -o pipefail
OUT=${1:?usage: tools/gpu/gpu_train.sh OUTDIR [options]}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
HDR=/tmp/specdec_hdr SITE=/tmp/specdec_site
GGUF=${GGUF:-/tmp/m/smol.gguf}
[ -f "$GGUF" ] || { echo "no GGUF at $GGUF"; exit 1; }
whl=$(ls .g2/gguf-*.whl .model2/gguf-*.whl .whl/gguf-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $SITE "$whl"
t0=$(date +%s)
if [ "${SKIP_BUILD:-0}" != 1 ]; then   # (the header wheels are for the build only)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $HDR \
    .whl/nvidia_cuda_runtime*.whl .whl/nvidia_cuda_profiler_api*.whl
  PYTHONPATH=$HDR SPECDEC_ARCHS=${SPECDEC_ARCHS:-90} SPECDEC_PTX=${SPECDEC_PTX:-90} \
    python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "build $(( $(date +%s) - t0 )) s"
fi
export PYTHONPATH=$SITE SPECDEC_SMOLLM2_GGUF=$GGUF
DATA=${DATA:-$OUT/data.npz}
python3 -m specdec_lib train-draft --out "$OUT" --data "$DATA" "$@" 2>&1 \
  | tr '\r' '\n' | grep -v "^\s*$" > "$OUT/train.log"
rc=${PIPESTATUS[0]}
grep -vE "it/s\]|reply/s\]|s/it\]|s/reply\]" "$OUT/train.log" | tail -30
exit $rc
