"""The exceptions specdec_lib raises on purpose, in one public place.

``CudaError`` (a driver call failed) and ``CudaUnavailable`` (no usable driver or device) are
raised by the compiled driver layer (``specdec_lib._driver`` imports them from here, so
``specdec_lib._driver.CudaError`` is this class). ``ExtensionMissing`` means the package was
not built. Argument mistakes are plain ``TypeError`` / ``ValueError`` naming the argument;
data problems only the device can see (NaN logits, out-of-range ids) become status codes
(``specdec_lib.status``), never exceptions. ``DraftWeightError`` and ``GGUFError`` (weights
that are not what they claim) are re-exported here from the modules that raise them.
"""
from __future__ import annotations

__all__ = ["CudaError", "CudaUnavailable", "ExtensionMissing"]


class CudaError(RuntimeError):
    """A CUDA driver call failed: ``.code`` (the CUresult), ``.name`` (e.g.
    'CUDA_ERROR_INVALID_VALUE') and ``.op`` (the driver call or library op)."""

    code: int
    name: str
    op: str

    def __init__(self, code: int, name: str, text: str, op: str) -> None:
        super().__init__(f"{op}: {name} ({text})")
        self.code = code
        self.name = name
        self.op = op


class CudaUnavailable(CudaError):
    """No CUDA driver or no CUDA device on this machine."""


class ExtensionMissing(ImportError):
    """specdec_lib's compiled extension is not built or not installed."""
