"""Build: cuda_src/ -> PTX per code family -> cubins per SM target; pyx/ -> Cython extensions.

The kernel build lives in build_backend/cubins.py (what gets compiled is read from
specdec_lib/_kernels.py, the kernel table). Environment:
  SPECDEC_ARCHS   cubin targets, e.g. "90" or "75,90a" (default: all of the table's)
  SPECDEC_PTX     PTX families to ship, e.g. "75,80,90" or "none" (default: all)
  SPECDEC_JOBS    parallel nvcc/ptxas jobs (default: CPU count)
  CUDA_HOME       toolkit to use; else nvcc on PATH; else the PyPI toolkit wheels
"""
import glob
import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "build_backend"))
from cubins import CUBIN_DIR, build_kernels, find_cuda_include, find_nvcc  # noqa: E402


class BuildExt(build_ext):
    def run(self):
        shipped = build_kernels()
        if not self.inplace:
            dst = os.path.join(self.build_lib, "specdec_lib", "_cubin")
            os.makedirs(dst, exist_ok=True)
            for name in shipped + ["MANIFEST"]:
                shutil.copy2(os.path.join(CUBIN_DIR, name), os.path.join(dst, name))
        super().run()


def extensions():
    from Cython.Build import cythonize
    try:
        nvcc = find_nvcc()
    except RuntimeError:   # asking for build requirements: the toolkit wheels come next
        nvcc = None
    inc = find_cuda_include(nvcc)
    # stage the driver layer's .pxd where `cimport specdec_lib._driver` finds it
    pxd_root = os.path.join(ROOT, "build", "pxd")
    os.makedirs(os.path.join(pxd_root, "specdec_lib"), exist_ok=True)
    for pxd in glob.glob(os.path.join(ROOT, "pyx", "*.pxd")):
        shutil.copy2(pxd, os.path.join(pxd_root, "specdec_lib", os.path.basename(pxd)))
    exts = []
    for pyx in sorted(glob.glob(os.path.join(ROOT, "pyx", "*.pyx"))):
        stem = os.path.splitext(os.path.basename(pyx))[0]
        exts.append(Extension(f"specdec_lib.{stem}", [os.path.relpath(pyx, ROOT)],
                              include_dirs=inc + [os.path.join(ROOT, "cuda_src")],
                              language="c++",
                              extra_compile_args=["-O2", "-Wno-unused-function"]))
    return cythonize(exts, include_path=[pxd_root, os.path.join(ROOT, "pyx")],
                     compiler_directives={"language_level": 3, "embedsignature": True},
                     quiet=True)


setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
    package_data={"specdec_lib": ["py.typed", "_cubin/*.cubin", "_cubin/*.ptx", "_cubin/MANIFEST",
                                  # the trained weights: plain, or packed as they ship
                                  # (models/packed.py)
                                  "models/heads/*/*.json", "models/heads/*/*.safetensors",
                                  "models/heads/*/*.safetensors.packed",
                                  "models/hybrid/*/*.json", "models/hybrid/*/*.safetensors",
                                  "models/hybrid/*/*.safetensors.packed",
                                  # the hybrid's MTP head, where train-draft --hybrid writes it
                                  "models/hybrid/*/*/*.json", "models/hybrid/*/*/*.safetensors",
                                  "models/hybrid/*/*/*.safetensors.packed"]},
)
