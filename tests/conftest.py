"""Shared test helpers. GPU tests carry ``@needs_gpu`` (the ``gpu`` marker): they are
skipped, with the reason, where there is no CUDA GPU or the extension is not built."""
import numpy as np
import pytest

from specdec_lib import runtime

_GPU_REASON = runtime.gpu_unavailable_reason()
needs_gpu = pytest.mark.gpu


def pytest_collection_modifyitems(config, items):
    if _GPU_REASON is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {_GPU_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def poison(shape, dtype, device=0):
    """A device array whose every byte is 0xFF: NaN for floats, -1 for ints, so an element
    a kernel fails to write shows up."""
    from specdec_lib import DeviceArray
    return DeviceArray.empty(shape, dtype, device).fill_bytes(0xFF)


def rel_err(out, ref):
    """||out - ref|| / ||ref|| in float64; inf when out holds NaN/inf the reference lacks."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise AssertionError(f"shape {out.shape} != reference {ref.shape}")
    if not np.all(np.isfinite(out) == np.isfinite(ref)):
        return float("inf")
    fin = np.isfinite(ref)
    den = np.linalg.norm(ref[fin])
    num = np.linalg.norm(out[fin] - ref[fin])
    return float(num / den) if den > 0 else float(num)


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test id (reproducible, different per case)."""
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
