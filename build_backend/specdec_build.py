"""In-tree PEP 517 backend: setuptools, plus the CUDA toolkit wheels when no nvcc exists.

A machine with CUDA_HOME or nvcc on PATH builds with that toolkit; a fresh machine
with only pip and g++ gets nvcc from the PyPI toolkit wheels as an extra build
requirement, so `pip install .` works on both.
"""
import os
import shutil

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F401,F403  (re-export the hooks we do not wrap)

_TOOLKIT = ["cuda-toolkit[nvcc,cccl,cudart]>=13.0,<14"]


def _have_nvcc():
    home = os.environ.get("CUDA_HOME")
    if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
        return True
    return shutil.which("nvcc") is not None


def _extra():
    return [] if _have_nvcc() else list(_TOOLKIT)


def get_requires_for_build_wheel(config_settings=None):
    return _orig.get_requires_for_build_wheel(config_settings) + _extra()


def get_requires_for_build_editable(config_settings=None):
    return _orig.get_requires_for_build_editable(config_settings) + _extra()
