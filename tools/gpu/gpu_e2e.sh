#!/usr/bin/env bash
# The real model on the H200: the SmolLM2 GPU tests, the demo, the end-to-end benchmark and the
# HF transformers peer, logs under OUTDIR. Run after tools/gpu/gpu_check.sh built the tree (same
# warm machine), with the GGUF assembled at $GGUF (parts carried in consecutive calls: three
# since the tree holds the draft heads, docs/NOTES.md "Session 11 learnings") and the gguf
# wheel in .g2/, .model2/ or .whl/.
#
#   GGUF=/tmp/m/smol.gguf tools/gpu/gpu_e2e.sh OUTDIR [--quick] [--no-peer] [--only "demo tests e2e peer"]
#
# E2E_ARGS passes options to tools/perf/e2e_smollm2.py (session 14's: "--stop-at-eos --sets heldout
# --head-k 4 --serve 128": 32 held-out prompts at B=1 by default, ~135-180 s).
set -u -o pipefail
OUT=${1:?usage: tools/gpu/gpu_e2e.sh OUTDIR [--quick] [--no-peer] [--only LIST]}
shift
QUICK="" ONLY="tests demo e2e peer"
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=--quick; shift ;;
    --no-peer) ONLY=${ONLY/peer/}; shift ;;
    --only) ONLY=$2; shift 2 ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
done
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 SITE=/tmp/specdec_site
GGUF=${GGUF:-/tmp/m/smol.gguf}
[ -f "$GGUF" ] || { echo "no GGUF at $GGUF"; exit 1; }
echo "$(sha256sum "$GGUF")" | tee "$OUT/e2e_summary.txt"
whl=$(ls .g2/gguf-*.whl .model2/gguf-*.whl .whl/gguf-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $SITE "$whl"
export PYTHONPATH=$SITE SPECDEC_SMOLLM2_GGUF=$GGUF
for step in $ONLY; do
  t0=$(date +%s)
  case $step in
    tests) timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_smollm2_gpu.py \
             tests/test_torch.py > "$OUT/e2e_tests.log" 2>&1
           echo "tests: $(tail -1 "$OUT/e2e_tests.log")" | tee -a "$OUT/e2e_summary.txt" ;;
    demo)  timeout 180 python3 -m specdec_lib demo --no-progress > "$OUT/demo.log" 2>&1
           echo "demo rc=$?: $(grep -E 'tokens/s|speed-up|lossless' "$OUT/demo.log" | tr '\n' ' ')" \
             | tee -a "$OUT/e2e_summary.txt" ;;
    e2e)   timeout 300 python3 tools/perf/e2e_smollm2.py --gguf "$GGUF" $QUICK ${E2E_ARGS:-} --json "$OUT/e2e.json" \
             > "$OUT/e2e.log" 2>&1
           echo "e2e rc=$?" | tee -a "$OUT/e2e_summary.txt"; tail -12 "$OUT/e2e.log" ;;
    peer)  mkdir -p /tmp/hfm && ln -sf "$GGUF" /tmp/hfm/smol.gguf
           timeout 400 python3 tools/perf/hf_peer.py --dir /tmp/hfm --gguf smol.gguf --json "$OUT/hf_peer.json" \
             > "$OUT/hf_peer.log" 2>&1
           echo "peer rc=$?" | tee -a "$OUT/e2e_summary.txt"; grep -vE "^\s*$|Warning|warn" "$OUT/hf_peer.log" | tail -12 ;;
  esac
  echo "  ($step: $(( $(date +%s) - t0 )) s)" | tee -a "$OUT/e2e_summary.txt"
done
cat "$OUT/e2e_summary.txt"
