#!/usr/bin/env python3
"""Check a release wheel before it ships (tools/release/build_wheel.sh and .ci/run run it):

- the platform tag is manylinux_2_28_x86_64 (a bare ``linux_x86_64`` wheel was never repaired
  and must not ship);
- the size is sane: compressed and unpacked within the limits below (an absurd size means
  stale build output or a missing kernel image);
- ``specdec_lib/_cubin`` holds exactly what the kernel table (the wheel's own
  ``specdec_lib/_kernels.py``) says ships: every module's cubins for sm_75/80/86/89/90 (+ sm_90a
  where asked) and PTX for every family of PTX_FAMILIES, and MANIFEST lists exactly those;
- one extension module per ``pyx/*.pyx`` of the source tree, none linking libcuda (the driver
  is reached through cuda.bindings.cydriver at run time);
- every Python file in the wheel exists in the source tree (nothing stale from an old build/).

    python3 tools/release/check_wheel.py WHEEL [WHEEL ...] [--src REPO_ROOT]

Prints, per wheel, its tag, sizes and contents by kind; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLATFORM = "manylinux_2_28_x86_64"
# limits (MB): the full build ships ~25 MB compressed (README "Install from a wheel")
MAX_COMPRESSED_MB = 120
MAX_UNPACKED_MB = 400
MIN_COMPRESSED_MB = 2


def wheel_tags(path: str):
    """(python tag, abi tag, [platform tags]) from a wheel's file name (PEP 427)."""
    parts = os.path.basename(path)[:-len(".whl")].split("-")
    if len(parts) < 5:
        raise ValueError(f"{path}: not a wheel file name")
    return parts[-3], parts[-2], parts[-1].split(".")


def expected_images(kernels_py: str):
    """The file names under specdec_lib/_cubin that the kernel table ships."""
    mod = types.ModuleType("specdec_lib_kernel_table_check")
    sys.modules[mod.__name__] = mod          # dataclasses look the defining module up there
    exec(compile(kernels_py, "_kernels.py", "exec"), mod.__dict__)
    want = set()
    for m in mod.MODULES.values():
        want |= {f"{m.name}.sm_{a}.cubin" for a in m.cubin_archs()}
        want |= {f"{m.name}.compute_{f}.ptx" for f in m.ptx_families()}
    return want


def needed_libs(data: bytes):
    """DT_NEEDED entries of an ELF shared object (readelf -d), or None without readelf."""
    if shutil.which("readelf") is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(data)
        f.flush()
        out = subprocess.run(["readelf", "-d", f.name], capture_output=True, text=True).stdout
    return [ln.split("[", 1)[1].split("]", 1)[0] for ln in out.splitlines() if "(NEEDED)" in ln]


def weights_files(src):
    """The wheel paths of every trained weights file of the source tree ``src``: the draft
    heads, the hybrid and its head (models/heads, models/hybrid: model.safetensors, or as
    shipped model.safetensors.packed, and config.json, at any depth)."""
    out = []
    names = ("model.safetensors", "model.safetensors.packed", "config.json")
    for kind in ("heads", "hybrid"):
        for root, _, files in sorted(os.walk(os.path.join(src, "specdec_lib", "models", kind))):
            out += [os.path.relpath(os.path.join(root, f), src).replace(os.sep, "/")
                    for f in sorted(files) if f in names]
    return out


def check(path: str, src: str = ROOT) -> list:
    """Problems found in the wheel at ``path`` (empty: it may ship); prints its summary."""
    problems = []
    py, abi, plats = wheel_tags(path)
    if PLATFORM not in plats or any(p.startswith("linux_") for p in plats):
        problems.append(f"platform tag {'.'.join(plats)}: expected {PLATFORM} (run auditwheel repair)")
    with zipfile.ZipFile(path) as z:
        infos = [i for i in z.infolist() if not i.is_dir()]
        names = {i.filename for i in infos}
        compressed = os.path.getsize(path) / 2**20
        unpacked = sum(i.file_size for i in infos) / 2**20
        if not MIN_COMPRESSED_MB <= compressed <= MAX_COMPRESSED_MB:
            problems.append(f"{compressed:.1f} MB compressed: outside {MIN_COMPRESSED_MB}.."
                            f"{MAX_COMPRESSED_MB} MB")
        if unpacked > MAX_UNPACKED_MB:
            problems.append(f"{unpacked:.1f} MB unpacked: more than {MAX_UNPACKED_MB} MB")
        kinds = {}
        for i in infos:
            ext = os.path.splitext(i.filename)[1] or os.path.basename(i.filename)
            n, c, u = kinds.get(ext, (0, 0, 0))
            kinds[ext] = (n + 1, c + i.compress_size, u + i.file_size)
        # kernel images: exactly what the table ships
        if "specdec_lib/_kernels.py" not in names:
            problems.append("specdec_lib/_kernels.py missing")
            want = set()
        else:
            want = expected_images(z.read("specdec_lib/_kernels.py").decode())
        have = {n.split("/")[-1] for n in names if n.startswith("specdec_lib/_cubin/")} - {"MANIFEST"}
        if want - have:
            problems.append(f"missing kernel images: {sorted(want - have)}")
        if have - want:
            problems.append(f"kernel images the table does not ship (stale?): {sorted(have - want)}")
        if "specdec_lib/_cubin/MANIFEST" in names:
            listed = set(z.read("specdec_lib/_cubin/MANIFEST").decode().split())
            if listed != want:
                problems.append(f"MANIFEST differs from the table: {sorted(listed ^ want)}")
        else:
            problems.append("specdec_lib/_cubin/MANIFEST missing")
        # extensions: one per pyx/*.pyx, no libcuda
        stems = sorted(os.path.splitext(f)[0] for f in os.listdir(os.path.join(src, "pyx"))
                       if f.endswith(".pyx"))
        sos = {n for n in names if n.endswith(".so")}
        for stem in stems:
            if not any(n.startswith(f"specdec_lib/{stem}.") for n in sos):
                problems.append(f"extension specdec_lib/{stem} missing")
        needed = set()
        for n in sorted(sos):
            libs = needed_libs(z.read(n))
            if libs is None:
                continue
            needed.update(libs)
            if any(lib.startswith("libcuda.") for lib in libs):
                problems.append(f"{n} links libcuda ({libs}): the driver must come through cuda.bindings")
        # the trained weights the demo loads by default
        for n in weights_files(src):
            if n not in names:
                problems.append(f"trained weights file {n} missing")
        # Python files: all from the source tree (a stale build/lib would add old modules)
        for n in sorted(names):
            if n.endswith(".py") and n.startswith("specdec_lib/") and not os.path.isfile(os.path.join(src, n)):
                problems.append(f"{n} is not in the source tree (stale build output?)")
        other = sorted({n.split("/")[0] for n in names} - {"specdec_lib"}
                       - {n.split("/")[0] for n in names if ".dist-info/" in n})
        if other:
            problems.append(f"unexpected top-level entries: {other}")
    print(f"{os.path.basename(path)}: {py}-{abi}-{'.'.join(plats)}, {compressed:.1f} MB compressed, "
          f"{unpacked:.1f} MB unpacked, {len(infos)} files")
    for ext, (n, c, u) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
        print(f"  {ext:>10}  {n:4d} files  {c / 2**20:7.2f} MB compressed  {u / 2**20:7.2f} MB unpacked")
    if needed:
        print(f"  extensions need: {', '.join(sorted(needed))}")
    for p in problems:
        print(f"  FAIL {p}")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("wheels", nargs="+")
    ap.add_argument("--src", default=ROOT, help="the source tree the wheel was built from")
    a = ap.parse_args(argv)
    bad = 0
    for w in a.wheels:
        bad += bool(check(w, a.src))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
