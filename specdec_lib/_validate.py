"""Argument checks shared by every op (compiled: see pyx/_args.pyx).

They run before any launch and raise TypeError/ValueError naming the argument.
"""
import math

import numpy as np

from ._args import DeviceArg, as_stream, check_int, check_shape  # noqa: F401
from .dtypes import host_dtype


def to_host(arg, stream=0):
    """A small device array (a DeviceArg) -> host numpy array, copied on ``stream`` (the
    op's stream, so values its earlier work writes are the ones checked) and waited for.

    Only for validation: ops copy index arrays (slot ids, offsets, page tables) to the
    host to range-check them before a launch when ``check_indices`` is on.
    """
    from . import runtime
    out = np.empty(arg.shape, dtype=host_dtype(arg.dtype))
    if out.size:
        drv = runtime.driver()
        drv.ensure_context(arg.device)
        drv.memcpy_dtoh(out.reshape(-1).view(np.uint8), arg.ptr, stream)
    return out


def as_scale(scale, default):
    """A softmax/score scale: ``default`` when None; else a finite, non-zero real number
    (TypeError/ValueError naming ``scale`` otherwise)."""
    if scale is None:
        return float(default)
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale: expected a real number, got {type(scale).__name__} "
                        f"{scale!r}") from None
    if not math.isfinite(value) or value == 0.0:
        raise ValueError(f"scale: must be finite and non-zero, got {value}")
    return value
