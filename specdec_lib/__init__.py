"""specdec_lib: AOT-compiled CUDA kernels for chain speculative decoding.

GPU ops: ``specdec_lib.ops`` (also re-exported here); numpy reference backend:
``specdec_lib.reference``; what runs where: ``specdec_lib.runtime.info()``.
Importing works without a GPU or driver; the first GPU call raises a clear error.
"""
__version__ = "0.1.0"

from . import dtypes, reference, runtime  # noqa: F401
from .ops import *  # noqa: F401,F403


def __getattr__(name):
    # DeviceArray imports the driver layer lazily, so `import specdec_lib` never needs it
    if name == "DeviceArray":
        from .arrays import DeviceArray
        return DeviceArray
    raise AttributeError(f"module 'specdec_lib' has no attribute {name!r}")
