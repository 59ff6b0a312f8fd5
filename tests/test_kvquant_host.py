"""cuda_src/common/kv8.cuh's software E4M3 encode/decode (the sm_75 / sm_80 / sm_89 code
path), compiled for the host, against the numpy spec (reference/kvquant.py) and against
CUDA's own __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) host implementation.
Needs nvcc (no GPU); skipped without it."""
import os
import shutil
import subprocess

import numpy as np
import pytest

from specdec_lib.reference import kvquant as kq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = shutil.which("nvcc")


@pytest.fixture(scope="module")
def host_bin(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc not found")
    out = tmp_path_factory.mktemp("kv8") / "kv8_host"
    r = subprocess.run([NVCC, "-std=c++17", "-I", os.path.join(ROOT, "cuda_src"),
                        os.path.join(ROOT, "tests", "host", "kv8_host.cu"), "-o", str(out)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"nvcc failed:\n{r.stdout}{r.stderr}")
    return out


def _run(host_bin, x, tmp_path):
    src, dst = tmp_path / "x.bin", tmp_path / "y.bin"
    np.asarray(x, np.float32).tofile(src)
    subprocess.run([str(host_bin), str(src), str(dst)], check=True)
    raw = np.fromfile(dst, np.uint8)
    n = len(x)
    enc = raw[:2 * n].reshape(n, 2)
    dec = raw[2 * n:].view(np.float32)
    return enc[:, 0], enc[:, 1], dec


def test_kv8_host_encode_decode(host_bin, tmp_path):
    rng = np.random.default_rng(5)
    table = kq.e4m3_decode(np.arange(256, dtype=np.uint8))
    fin = np.unique(np.abs(table[~np.isnan(table)])).astype(np.float64)
    mids = ((fin[1:] + fin[:-1]) / 2).astype(np.float32)
    pts = np.concatenate([fin.astype(np.float32), mids, np.float32([464, 480, 2.0 ** -10, 1e-40])])
    x = np.concatenate([
        pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0)),
        rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        np.arange(0x3A000000, 0x44000000, 61, dtype=np.uint32).view(np.float32),  # 2^-11 .. 512
        np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0]),
    ]).astype(np.float32)
    x = np.concatenate([x, -x])
    ours, cuda, dec = _run(host_bin, x, tmp_path)
    ref = kq.e4m3_encode(x)
    bad = np.flatnonzero(ours != ref)
    assert len(bad) == 0, [(float(x[i]), int(ours[i]), int(ref[i])) for i in bad[:8]]
    bad = np.flatnonzero(cuda != ref)
    assert len(bad) == 0, [(float(x[i]), int(cuda[i]), int(ref[i])) for i in bad[:8]]
    assert np.array_equal(np.isnan(dec), np.isnan(table))
    ok = ~np.isnan(table)
    assert np.array_equal(dec[ok].view(np.uint32), table[ok].view(np.uint32))   # signed zeros too
