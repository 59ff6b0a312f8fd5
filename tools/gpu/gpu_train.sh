#!/usr/bin/env bash
# Train the SmolLM2 draft heads on the H200 (one device call): build the library (native code
# only: generation runs through it), then `python -m specdec_lib train-draft` with the GGUF at $GGUF; heads
# (OUTDIR/smollm2_<method>/: the device returns files at most two folders deep), the
# generated data and the log go to OUTDIR.
#
#   GGUF=/tmp/m/smol.gguf [SKIP_BUILD=1] tools/gpu/gpu_train.sh OUTDIR [train-draft options]
#
# SKIP_BUILD=1: the tree is built in place already (tools/gpu/gpu_check.sh in an earlier call).
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
