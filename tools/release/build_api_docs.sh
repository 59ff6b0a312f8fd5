#!/usr/bin/env bash
# The API reference, generated from the docstrings by pdoc (the `docs` extra): HTML under
# build/api (not committed; OUT=DIR or the first argument chooses another folder).
#   tools/release/build_api_docs.sh [OUT]   (python: $PYTHON, else .venv/bin/python, else python3)
# pdoc imports every module it documents. It follows the package's `__all__` (errors, status,
# runtime, dtypes, reference and its submodules); the other modules are named here; specdec_lib.torch_ops and specdec_lib.adapters import
# torch and are documented only where torch imports (CI: after its torch step). The old aliases specdec_lib.inspect (=
# specdec_lib.cubins) and specdec_lib.torch (= torch_ops) and the private modules are left
# out. Fails on any pdoc warning, so a
# docstring that pdoc cannot render, or an __all__ name that does not resolve, is caught.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-build/api}}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
mods=(specdec_lib specdec_lib.ops specdec_lib.contract specdec_lib.arrays specdec_lib.registry specdec_lib.orchestrator specdec_lib.models specdec_lib.models.llama
      specdec_lib.models.llama_draft specdec_lib.models.gguf_llama specdec_lib.models.smollm2
      specdec_lib.models.tiny_hybrid specdec_lib.models.tiny_hybrid_tp specdec_lib.models.ngram
      specdec_lib.models.heads specdec_lib.models.prompts specdec_lib.cubins specdec_lib.bench
      specdec_lib.demo)
if "$PY" -c "import torch" 2>/dev/null; then
  mods+=(specdec_lib.torch_ops specdec_lib.adapters)
else
  echo "build_api_docs: torch not importable: specdec_lib.torch_ops and specdec_lib.adapters left out"
fi
rm -rf "$OUT"
log=$(mktemp)
"$PY" -m pdoc --docformat restructuredtext -o "$OUT" "${mods[@]}" 2>&1 | tee "$log"
if grep -q "^Warn" "$log"; then
  echo "build_api_docs: pdoc warned (above)"; rm -f "$log"; exit 1
fi
rm -f "$log"
echo "build_api_docs: $(find "$OUT" -name '*.html' | wc -l) pages in $OUT ($OUT/index.html)"
