"""Argument checks shared by the reference ops (numpy arrays only)."""
from __future__ import annotations

import numpy as np

_KINDS = {"f": "a floating-point", "i": "an integer", "iu": "an integer"}


def np_array(name, a, ndim=None, kinds=None):
    """``a`` if it is a numpy array with ``ndim`` dimensions whose dtype kind is one of
    ``kinds`` (numpy kind letters); else TypeError / ValueError naming ``name``."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(a).__name__}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {a.shape}")
    if kinds is not None and a.dtype.kind not in kinds:
        raise TypeError(f"{name}: expected {_KINDS.get(kinds, 'a supported')} array, got {a.dtype}")
    return a
