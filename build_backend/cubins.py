"""Kernel build: cuda_src/ -> PTX per code family -> cubins per SM target (used by setup.py).

Importable without side effects so the build can be tested. What gets compiled is read
from specdec_lib/_kernels.py (the kernel table).
"""
import concurrent.futures as cf
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUBIN_DIR = os.path.join(ROOT, "specdec_lib", "_cubin")
NVCC_FLAGS = ["-std=c++17", "-O3", "--use_fast_math", "-lineinfo"]


def load_kernel_table(root=ROOT):
    """Exec specdec_lib/_kernels.py standalone (the package may not be importable yet)."""
    path = os.path.join(root, "specdec_lib", "_kernels.py")
    name = "specdec_lib_kernel_table"
    mod = types.ModuleType(name)
    sys.modules[name] = mod          # dataclasses look the defining module up there
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), mod.__dict__)
    return mod


# ---------------------------------------------------------------- toolkit discovery

def _site_dirs():
    return [p for p in sys.path if p and os.path.isdir(p)]


def find_nvcc():
    cands = []
    if os.environ.get("CUDA_HOME"):
        cands.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"))
    which = shutil.which("nvcc")
    if which:
        cands.append(which)
    for d in _site_dirs():   # cuda-toolkit[nvcc] wheels
        cands += glob.glob(os.path.join(d, "nvidia", "cu1*", "bin", "nvcc"))
        cands += glob.glob(os.path.join(d, "nvidia", "cuda_nvcc", "bin", "nvcc"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.realpath(c)
    raise RuntimeError(
        "specdec_lib build: nvcc not found. Set CUDA_HOME, put nvcc on PATH, or "
        "`pip install 'cuda-toolkit[nvcc,cccl,cudart]'` (the build backend does this "
        "automatically when no nvcc is found).")


def _header_version(path):
    with open(path, errors="replace") as f:
        m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", f.read())
    return int(m.group(1)) if m else 0


def bindings_version():
    try:
        from cuda.bindings import __version__ as v
    except ImportError:
        try:
            from cuda import __version__ as v   # cuda-python < 12.6 layout
        except ImportError as e:
            raise RuntimeError("specdec_lib build: cuda-bindings is required to build the "
                               "Cython driver layer (pip install cuda-bindings)") from e
    major, minor = (int(x) for x in v.split(".")[:2])
    return major, minor, v


def find_cuda_include(nvcc=None):
    """Include dirs for the Cython layer: a cuda.h at least as new as cuda-bindings.

    cuda-bindings' cydriver.pxd declares the newest driver API; an older cuda.h
    fails to compile it. Inside pip's isolated build env the header wheels are on
    sys.path, so they are searched first.
    """
    major, minor, v = bindings_version()
    need = major * 1000 + minor * 10
    cands = []
    for d in _site_dirs():
        cands += glob.glob(os.path.join(d, "nvidia", "cu1*", "include"))
        cands += glob.glob(os.path.join(d, "nvidia", "cuda_runtime", "include"))
    if os.environ.get("CUDA_HOME"):
        cands.append(os.path.join(os.environ["CUDA_HOME"], "include"))
    if nvcc:
        cands.append(os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include"))
    seen = []
    for c in cands:
        h = os.path.join(c, "cuda.h")
        if os.path.isfile(h):
            hv = _header_version(h)
            seen.append(f"{h} ({hv})")
            if hv >= need:
                dirs = [c]
                if (major, minor) < (13, 5):  # older bindings also cimport cudaProfiler.h
                    prof = [d for d in cands if os.path.isfile(os.path.join(d, "cudaProfiler.h"))]
                    if not prof:
                        raise RuntimeError(
                            f"specdec_lib build: cuda-bindings {v} needs cudaProfiler.h "
                            "(pip install nvidia-cuda-profiler-api)")
                    dirs += [d for d in prof if d != c][:1]
                return dirs
    raise RuntimeError(
        f"specdec_lib build: cuda-bindings {v} needs cuda.h >= {major}.{minor}; found: "
        + (", ".join(seen) or "none") +
        f". Install matching headers: pip install 'nvidia-cuda-runtime=={major}.{minor}.*'")


# ---------------------------------------------------------------- kernel build

def _wanted(env, default):
    val = os.environ.get(env, "").strip()
    if not val:
        return list(default)
    if val.lower() == "none":
        return []
    return [a.strip().replace("sm_", "").replace("compute_", "") for a in val.split(",") if a.strip()]


def _hash_inputs(mod, extra, root):
    h = hashlib.sha256()
    files = [os.path.join(root, mod.source)]
    files += sorted(glob.glob(os.path.join(root, "cuda_src", "**", "*.h"), recursive=True))
    files += sorted(glob.glob(os.path.join(root, "cuda_src", "**", "*.cuh"), recursive=True))
    for f in files:
        h.update(f.encode())
        with open(f, "rb") as fh:
            h.update(fh.read())
    h.update(repr(extra).encode())
    return h.hexdigest()


def _up_to_date(out, digest):
    stamp = out + ".sha256"
    return os.path.isfile(out) and os.path.isfile(stamp) and open(stamp).read() == digest


def _run(cmd, what):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"specdec_lib build: {what} failed:\n$ {' '.join(cmd)}\n"
                           f"{r.stdout}{r.stderr}")
    return time.time() - t0


def _print(msg):
    print(msg, flush=True)


def build_kernels(out_dir=CUBIN_DIR, table=None, root=ROOT, only=None, log=_print):
    """Compile every module of the kernel table (or those named in ``only``) into
    ``out_dir``; returns the file names that ship. Inputs are hashed, so a rebuild
    with nothing changed runs no nvcc. A compile error raises RuntimeError holding
    nvcc's own message."""
    table = table or load_kernel_table(root)
    nvcc = find_nvcc()
    ptxas = os.path.join(os.path.dirname(nvcc), "ptxas")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    archs = _wanted("SPECDEC_ARCHS", list(table.CUBIN_ARCHS) + ["90a"])
    ship_ptx = _wanted("SPECDEC_PTX", table.PTX_FAMILIES)
    jobs = int(os.environ.get("SPECDEC_JOBS", os.cpu_count() or 1))
    os.makedirs(out_dir, exist_ok=True)
    inc = os.path.join(root, "cuda_src")

    # family of each cubin arch; 90a is its own family
    fam_of = dict(table.CUBIN_ARCHS, **{"90a": "90a"})
    plans = []   # (module, family, [archs])
    for mod in table.MODULES.values():
        if only is not None and mod.name not in only:
            continue
        mod_archs = [a for a in mod.cubin_archs() if a in archs]
        fams = {fam_of[a] for a in mod_archs} | {f for f in mod.ptx_families() if f in ship_ptx}
        for fam in sorted(fams):
            plans.append((mod, fam, [a for a in mod_archs if fam_of[a] == fam]))

    log(f"specdec_lib: nvcc {nvcc}; cubins {','.join(archs)}; PTX "
        f"{','.join(ship_ptx) or 'none'}; {jobs} jobs")
    t_all = time.time()

    def one_family(plan):
        mod, fam, fam_archs = plan
        ptx = os.path.join(out_dir, f"{mod.name}.compute_{fam}.ptx")
        digest = _hash_inputs(mod, (NVCC_FLAGS, fam, version), root)
        lines = []
        if not _up_to_date(ptx, digest):
            dt = _run([nvcc, "-ptx", f"-arch=compute_{fam}", *NVCC_FLAGS, "-I", inc,
                       os.path.join(root, mod.source), "-o", ptx], f"nvcc {mod.source} compute_{fam}")
            with open(ptx + ".sha256", "w") as f:
                f.write(digest)
            lines.append(f"  ptx    {mod.name}.compute_{fam}.ptx  {dt:6.1f}s")
        for a in fam_archs:
            cub = os.path.join(out_dir, f"{mod.name}.sm_{a}.cubin")
            cdig = digest + a
            if _up_to_date(cub, cdig):
                continue
            dt = _run([ptxas, f"-arch=sm_{a}", "-O3", ptx, "-o", cub], f"ptxas {mod.name} sm_{a}")
            with open(cub + ".sha256", "w") as f:
                f.write(cdig)
            lines.append(f"  cubin  {mod.name}.sm_{a}.cubin  {dt:6.1f}s")
        return lines

    n_done = 0
    with cf.ThreadPoolExecutor(max_workers=jobs) as ex:
        for lines in ex.map(one_family, plans):
            for ln in lines:
                log(ln)
            n_done += len(lines)
    # PTX that is not to ship (only an intermediate for the cubins) stays out of the package
    log(f"specdec_lib: {n_done} nvcc/ptxas jobs ({'nothing to do' if not n_done else 'rebuilt'}) "
        f"in {time.time() - t_all:.1f}s")
    keep = set()
    for mod, fam, fam_archs in plans:
        keep |= {f"{mod.name}.sm_{a}.cubin" for a in fam_archs}
        if fam in ship_ptx:
            keep.add(f"{mod.name}.compute_{fam}.ptx")
    with open(os.path.join(out_dir, "MANIFEST"), "w") as f:
        f.write("\n".join(sorted(keep)) + "\n")
    return sorted(keep)


