"""Element types: canonical names, host storage, and bf16 conversion helpers.

numpy has no bfloat16, so bf16 data lives on the host as uint16 bit patterns;
``f32_to_bf16_bits`` rounds to nearest-even exactly like the kernels do.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DTYPES", "FLOAT_DTYPES", "KV_CACHE_DTYPES", "canonical", "one_of", "itemsize",
           "host_dtype", "f32_to_bf16_bits", "bf16_bits_to_f32", "round_to", "to_host_storage",
           "from_host_storage"]

# name -> (host numpy dtype, itemsize)
DTYPES: dict[str, tuple[type, int]] = {
    "float64": (np.float64, 8), "float32": (np.float32, 4), "float16": (np.float16, 2),
    "bfloat16": (np.uint16, 2),
    "int64": (np.int64, 8), "int32": (np.int32, 4), "int16": (np.int16, 2), "int8": (np.int8, 1),
    "uint64": (np.uint64, 8), "uint32": (np.uint32, 4), "uint16": (np.uint16, 2),
    "uint8": (np.uint8, 1), "bool": (np.bool_, 1),
    # E4M3 (torch.float8_e4m3fn): held on the host as uint8 bit patterns (reference/kvquant.py)
    "fp8_e4m3": (np.uint8, 1),
}
KV_CACHE_DTYPES = ("float16", "bfloat16", "fp8_e4m3", "int8")   # verify_attention's caches
FLOAT_DTYPES = ("float32", "float16", "bfloat16")

_ALIASES = {"f32": "float32", "f16": "float16", "half": "float16", "bf16": "bfloat16",
            "float": "float32", "i32": "int32", "i64": "int64", "u8": "uint8",
            "float8_e4m3fn": "fp8_e4m3", "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3"}


def canonical(dtype: Any) -> str:
    """'bf16', np.float16, 'torch.bfloat16', numpy dtype ... -> canonical name."""
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "").replace("cupy.", "")
        name = _ALIASES.get(name, name)
        if name in DTYPES:
            return name
        raise TypeError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    try:
        name = np.dtype(dtype).name
    except TypeError:
        return canonical(str(dtype))
    if name not in DTYPES:
        raise TypeError(f"unsupported dtype {dtype!r}")
    return name


def one_of(arg: str, dtype: Any, allowed) -> str:
    """``dtype``'s canonical name if it is one of ``allowed``, else a ValueError naming the
    argument ``arg`` (a model's ``kv_dtype=`` / ``state_dtype=`` / ``dtype=`` choices)."""
    try:
        name = canonical(dtype)
    except (TypeError, ValueError):
        name = None
    if name not in allowed:
        raise ValueError(f"{arg}: expected one of {', '.join(allowed)}, got {dtype!r}")
    return name


def itemsize(dtype: Any) -> int:
    """Bytes per element of ``dtype``."""
    return DTYPES[canonical(dtype)][1]


def host_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype that holds ``dtype`` on the host (bf16: uint16 bit patterns)."""
    return np.dtype(DTYPES[canonical(dtype)][0])


def f32_to_bf16_bits(x: Any) -> np.ndarray:
    """float array -> bf16 bit patterns (uint16), round to nearest even, NaN kept quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def bf16_bits_to_f32(b: Any) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(x: Any, dtype: Any) -> np.ndarray:
    """Round float data to ``dtype`` and return it as float64 (for references)."""
    name = canonical(dtype)
    if name == "bfloat16":
        return bf16_bits_to_f32(f32_to_bf16_bits(x)).astype(np.float64)
    return np.asarray(x).astype(DTYPES[name][0]).astype(np.float64)


def to_host_storage(x: Any, dtype: Any) -> np.ndarray:
    """Float data -> the host array that holds ``dtype`` (bf16 as uint16 bits)."""
    name = canonical(dtype)
    if name == "bfloat16":
        return f32_to_bf16_bits(x)
    return np.asarray(x, dtype=DTYPES[name][0])


def from_host_storage(a: Any, dtype: Any) -> np.ndarray:
    """Inverse of to_host_storage: float64 values of a host array holding ``dtype``."""
    if canonical(dtype) == "bfloat16":
        return bf16_bits_to_f32(a).astype(np.float64)
    return np.asarray(a).astype(np.float64)
