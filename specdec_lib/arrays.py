"""DeviceArray: a small owning device buffer with a numpy round trip.

For users without a framework (and for the tests). It speaks
``__cuda_array_interface__`` (v3) so cupy/numba/torch can view it. We do not use
cuda.core's Buffer here: cuda-core is not among our dependencies (cuda-bindings is),
and its memory API is still marked experimental; this class needs five driver calls.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import dtypes as _dt
from .runtime import driver

__all__ = ["DeviceArray"]

_CAI_TYPESTR = {"bfloat16": "<V2"}   # no standard typestr for bf16


class DeviceArray:
    """C-contiguous device array. ``dtype`` is a canonical name ('bfloat16' included)."""

    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    device: int
    size: int
    nbytes: int
    ptr: int
    strides: tuple[int, ...]

    def __init__(self, shape: Sequence[int], dtype: Any, device: int = 0) -> None:
        drv = driver()
        self.shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")
        self.dtype = _dt.canonical(dtype)
        self.itemsize = _dt.itemsize(self.dtype)
        self.device = int(device)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.itemsize
        drv.ensure_context(self.device)
        self.ptr = drv.mem_alloc(self.nbytes)
        st, acc = [], 1
        for s in reversed(self.shape):
            st.append(acc)
            acc *= s
        self.strides = tuple(reversed(st))   # elements, C order

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: Any, device: int = 0) -> DeviceArray:
        """An uninitialised array (its bytes are whatever the allocator left)."""
        return cls(shape, dtype, device)

    @classmethod
    def from_numpy(cls, a: Any, dtype: Any = None, device: int = 0) -> DeviceArray:
        """Copy a host array to the device. ``dtype='bfloat16'`` takes uint16 bits
        (or float data, which is rounded to bf16)."""
        a = np.asarray(a)
        name = _dt.canonical(dtype if dtype is not None else a.dtype)
        if name == "bfloat16" and a.dtype != np.uint16:
            a = _dt.f32_to_bf16_bits(a)
        host = np.ascontiguousarray(a, dtype=_dt.host_dtype(name))
        out = cls(host.shape, name, device)
        driver().memcpy_htod(out.ptr, host.reshape(-1).view(np.uint8))
        return out

    def to_numpy(self) -> np.ndarray:
        """Copy to the host. bf16 comes back as uint16 bits. Waits for all work on the
        device first (work on non-blocking streams does not order with the default
        stream), so results of any stream are complete."""
        host = np.empty(self.shape, dtype=_dt.host_dtype(self.dtype))
        driver().ensure_context(self.device)
        driver().ctx_synchronize()
        driver().memcpy_dtoh(host.reshape(-1).view(np.uint8), self.ptr)
        return host

    def copy_from_numpy(self, a: Any) -> DeviceArray:
        """Overwrite the contents from a host array of the same shape (bf16: uint16 bits)."""
        host = np.ascontiguousarray(a, dtype=_dt.host_dtype(self.dtype))
        if host.shape != self.shape:
            raise ValueError(f"shape {host.shape} != {self.shape}")
        driver().ensure_context(self.device)
        driver().ctx_synchronize()   # the buffer may still be in use on another stream
        driver().memcpy_htod(self.ptr, host.reshape(-1).view(np.uint8))
        return self

    def fill_bytes(self, value: int, stream: int = 0) -> DeviceArray:
        """Set every byte to ``value & 0xFF`` (on ``stream``, a raw handle)."""
        driver().memset_d8(self.ptr, value & 0xFF, self.nbytes, stream)
        return self

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        typestr = _CAI_TYPESTR.get(self.dtype) or np.dtype(_dt.host_dtype(self.dtype)).str
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": None}

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if ptr:
            try:
                drv = driver()
                drv.ensure_context(self.device)
                drv.mem_free(ptr)
            except Exception:
                pass
