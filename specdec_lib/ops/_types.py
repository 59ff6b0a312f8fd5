"""The type names of the ops' annotations (documentation only: nothing is checked by them;
the contract checks every argument)."""
from __future__ import annotations

from typing import Any

ArrayLike = Any    # a device array: DeviceArray, torch / cupy CUDA tensor, DLPack or CAI object
Stream = Any       # None (the legacy stream), an int CUstream handle, or an object with
                   # __cuda_stream__ (cuda.core, torch, cupy streams)
