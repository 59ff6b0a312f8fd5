"""The build (build_backend/cubins.py) and the loader's choice of image, without a GPU."""
import os
import shutil
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "build_backend"))
import cubins  # noqa: E402

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"),
                                reason="needs nvcc")


def _fake_tree(tmp_path, body):
    """A throw-away source tree with one module 'toy' whose kernel is ``body``."""
    (tmp_path / "cuda_src" / "toy").mkdir(parents=True)
    (tmp_path / "cuda_src" / "toy" / "toy_params.h").write_text(
        "#pragma once\n#include <stdint.h>\ntypedef struct { float* out; int32_t n; } ToyParams;\n")
    (tmp_path / "cuda_src" / "toy" / "toy.cu").write_text(
        '#include "toy/toy_params.h"\n' + textwrap.dedent(body))
    table = cubins.load_kernel_table(ROOT)
    table.MODULES.clear()
    table.register(table.KernelModule(name="toy", source="cuda_src/toy/toy.cu",
                                      params_header="toy/toy_params.h",
                                      kernels={"toy_fill": "ToyParams"}))
    return table


@needs_nvcc
def test_rebuild_with_nothing_changed_runs_no_nvcc(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_ARCHS", "75,86")
    monkeypatch.setenv("SPECDEC_PTX", "75")
    table = _fake_tree(tmp_path, """
        extern "C" __global__ void toy_fill(const ToyParams p) {
          int i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i < p.n) p.out[i] = 1.0f;
        }""")
    out = tmp_path / "out"
    logs = []
    shipped = cubins.build_kernels(str(out), table=table, root=str(tmp_path), log=logs.append)
    assert shipped == ["toy.compute_75.ptx", "toy.sm_75.cubin", "toy.sm_86.cubin"]
    assert sum(ln.lstrip().startswith(("ptx", "cubin")) for ln in logs) == 4   # 2 ptx + 2 cubins
    assert all((out / f).is_file() for f in shipped)
    logs.clear()
    cubins.build_kernels(str(out), table=table, root=str(tmp_path), log=logs.append)
    assert "nothing to do" in logs[-1]
    # touching a shared header invalidates the stamp
    (tmp_path / "cuda_src" / "toy" / "toy_params.h").write_text(
        "#pragma once\n#include <stdint.h>\ntypedef struct { float* out; int32_t n; int32_t pad; } ToyParams;\n")
    logs.clear()
    cubins.build_kernels(str(out), table=table, root=str(tmp_path), log=logs.append)
    assert "rebuilt" in logs[-1]


@needs_nvcc
def test_compile_error_carries_nvcc_message(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_ARCHS", "75")
    monkeypatch.setenv("SPECDEC_PTX", "none")
    table = _fake_tree(tmp_path, """
        extern "C" __global__ void toy_fill(const ToyParams p) { p.out[0] = undefined_name; }""")
    with pytest.raises(RuntimeError, match="undefined_name") as ei:
        cubins.build_kernels(str(tmp_path / "out"), table=table, root=str(tmp_path), log=lambda m: None)
    assert "toy.cu" in str(ei.value)


def test_header_rule_rejects_old_cuda_h(tmp_path, monkeypatch):
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "cuda.h").write_text("#define CUDA_VERSION 12080\n")
    monkeypatch.setattr(cubins, "_site_dirs", lambda: [])
    monkeypatch.setattr(cubins, "bindings_version", lambda: (13, 3, "13.3.1"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"needs cuda.h >= 13.3"):
        cubins.find_cuda_include(None)
    (inc / "cuda.h").write_text("#define CUDA_VERSION 13030\n")
    with pytest.raises(RuntimeError, match="cudaProfiler.h"):
        cubins.find_cuda_include(None)
    (inc / "cudaProfiler.h").write_text("\n")
    assert cubins.find_cuda_include(None) == [str(inc)]


# ------------------------------------------------------------------ loader choice

@pytest.fixture
def fake_cubins(tmp_path, monkeypatch):
    from specdec_lib import runtime
    monkeypatch.setattr(runtime, "CUBIN_DIR", str(tmp_path))
    monkeypatch.delenv("SPECDEC_FORCE_ARCH", raising=False)

    def setup(cc, files):
        for f in files:
            (tmp_path / f).write_bytes(b"x")
        monkeypatch.setattr(runtime, "device_props", lambda device=0: {"cc": cc})
        return runtime
    return setup


@pytest.mark.parametrize("cc,files,want", [
    ((8, 6), ["copy.sm_80.cubin", "copy.sm_86.cubin", "copy.compute_80.ptx"], "sm_86"),
    ((8, 7), ["copy.sm_80.cubin", "copy.sm_86.cubin", "copy.compute_80.ptx"], "sm_86"),
    ((8, 9), ["copy.sm_80.cubin", "copy.compute_80.ptx"], "sm_80"),
    ((7, 5), ["copy.sm_75.cubin", "copy.compute_75.ptx"], "sm_75"),
    ((9, 0), ["copy.sm_80.cubin", "copy.compute_80.ptx", "copy.compute_90.ptx"], "compute_90"),
    ((12, 0), ["copy.sm_90.cubin", "copy.compute_80.ptx", "copy.compute_90.ptx"], "compute_90"),
])
def test_loader_choice(fake_cubins, cc, files, want):
    runtime = fake_cubins(cc, files)
    assert runtime.choose_image("copy")["arch"] == want


def test_loader_forced_ptx_and_missing(fake_cubins, monkeypatch):
    runtime = fake_cubins((9, 0), ["copy.sm_90.cubin", "copy.compute_75.ptx"])
    monkeypatch.setenv("SPECDEC_FORCE_ARCH", "75")
    c = runtime.choose_image("copy")
    assert (c["kind"], c["arch"]) == ("ptx", "compute_75") and "FORCE" in c["reason"]
    assert runtime.arch_family() == 75
    monkeypatch.setenv("SPECDEC_FORCE_ARCH", "61")
    with pytest.raises(ValueError, match="SPECDEC_FORCE_ARCH"):
        runtime.choose_image("copy")
    monkeypatch.delenv("SPECDEC_FORCE_ARCH")
    runtime = fake_cubins((7, 5), [])   # only sm_90 and compute_75 exist...
    assert runtime.choose_image("copy")["arch"] == "compute_75"
    os.remove(os.path.join(runtime.CUBIN_DIR, "copy.compute_75.ptx"))
    with pytest.raises(FileNotFoundError, match="no image"):
        runtime.choose_image("copy")


def test_info_without_gpu_says_why():
    from specdec_lib import runtime
    info = runtime.info()
    if info.get("gpu") is None:
        assert info["reason"]
