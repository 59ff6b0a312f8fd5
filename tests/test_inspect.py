"""specdec_lib.cubins (``python -m specdec_lib inspect``; the old name specdec_lib.inspect is an
alias): the pure-Python cubin reader against ptxas's own report.

Test cubins are built at test time: nvcc turns KERNELS_CU into compute_75 PTX once,
ptxas (-v) assembles it for every target, and each number the ELF reader decodes is
compared with what ptxas printed for the same compile.  Skips when nvcc/ptxas are
missing.  The SASS test runs only where cuobjdump or nvdisasm exists (the H200
machine); the --check test of the real build only once the package is built.
"""
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdec_lib import cubins as insp

# One kernel per thing the reader decodes.  No #include: keeps nvcc -ptx cheap.
KERNELS_CU = r"""
struct P40 { const float* a; float* b; long long n; int k; int j; long long m; };   // 40 bytes

// stack frame: a 1 KiB local array indexed at run time cannot live in registers
extern "C" __global__ void local_array_kernel(const P40 p) {
  float loc[256];
  for (int i = 0; i < 256; ++i) loc[i] = p.a[i * p.k + threadIdx.x];
  loc[p.m & 255] += 1.0f;
  p.b[threadIdx.x] = loc[p.j & 255] + loc[(p.j * 7) & 255];
}

// register spills: 48 live floats under a 24-register cap
extern "C" __global__ void __maxnreg__(24) spill_kernel(const float4* a, float4* b, int n) {
  float4 acc[12];
#pragma unroll
  for (int i = 0; i < 12; ++i) acc[i] = a[i * n + threadIdx.x];
  for (int r = 0; r < n; ++r) {
#pragma unroll
    for (int i = 0; i < 12; ++i) {
      float4 x = a[r + i];
      acc[i].x = acc[i].x * x.y + x.z; acc[i].y += acc[(i + 1) % 12].x * x.w;
      acc[i].z -= x.x; acc[i].w *= x.z;
    }
  }
#pragma unroll
  for (int i = 0; i < 12; ++i) b[i * n + threadIdx.x] = acc[i];
}

// static shared memory (4000 bytes) and one barrier
extern "C" __global__ void shared_kernel(const float* a, float* b) {
  __shared__ float tile[1000];
  tile[threadIdx.x] = a[threadIdx.x];
  __syncthreads();
  b[threadIdx.x] = tile[(threadIdx.x + 1) % 1000];
}

// launch bounds: 128 threads, 4 blocks/SM -> register cap 65536 / 512 = 128
extern "C" __global__ void __launch_bounds__(128, 4) bounded_kernel(const P40 p) {
  p.b[threadIdx.x] = p.a[threadIdx.x] * p.n;
}

// two scalar params: layout 0:8, 8:4, block 12 bytes
extern "C" __global__ void two_param_kernel(float* b, int x) { b[threadIdx.x] = x; }
"""

# Hand-written PTX for what CUDA C cannot ask for directly: .reqntid and a cluster shape.
REQNTID_PTX = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry reqntid_kernel(.param .u64 out)
.reqntid 64, 2, 1
.reqnctapercluster 2, 1, 1
{
  ret;
}
"""

TARGETS = ("75", "80", "86", "89", "90", "90a")
FAMILY = {"75": "75", "80": "80", "86": "80", "89": "80", "90": "90", "90a": "90a"}  # as setup.py

nvcc = shutil.which("nvcc")
ptxas = shutil.which("ptxas")
needs_toolkit = pytest.mark.skipif(nvcc is None or ptxas is None,
                                   reason="nvcc/ptxas not on PATH: cannot build test cubins")


def parse_ptxas_verbose(text):
    """kernel -> {registers, stack, smem, cmem0, barriers} from `ptxas -v` output."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = out.setdefault(m[1], {"smem": 0, "cmem0": None})
            continue
        if current is None:
            continue
        if m := re.search(r"(\d+) bytes stack frame", line):
            current["stack"] = int(m[1])
        if m := re.search(r"Used (\d+) registers", line):
            current["registers"] = int(m[1])
            if b := re.search(r"used (\d+) barriers", line):
                current["barriers"] = int(b[1])
            if s := re.search(r"(\d+) bytes smem", line):
                current["smem"] = int(s[1])
            if c := re.search(r"(\d+) bytes cmem\[0\]", line):
                current["cmem0"] = int(c[1])
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{arch: (cubin path, ptxas -v numbers)} for the test kernels, plus reqntid cubin."""
    if nvcc is None or ptxas is None:
        pytest.skip("nvcc/ptxas not on PATH: cannot build test cubins")
    d = tmp_path_factory.mktemp("cubins")
    (d / "k.cu").write_text(KERNELS_CU)
    subprocess.run([nvcc, "-ptx", "-arch=compute_75", "k.cu", "-o", "k.compute_75.ptx"],
                   cwd=d, check=True, capture_output=True)
    # the other families' PTX: same code, retargeted (the kernels have no __CUDA_ARCH__ paths)
    ptx75 = (d / "k.compute_75.ptx").read_text()
    for fam in ("80", "90", "90a"):
        (d / f"k.compute_{fam}.ptx").write_text(ptx75.replace(".target sm_75", f".target sm_{fam}"))
    result = {}
    for arch in TARGETS:
        src = f"k.compute_{FAMILY[arch]}.ptx"
        proc = subprocess.run([ptxas, f"-arch=sm_{arch}", "-v", src, "-o", f"k.sm_{arch}.cubin"],
                              cwd=d, check=True, capture_output=True, text=True)
        result[arch] = (d / f"k.sm_{arch}.cubin", parse_ptxas_verbose(proc.stdout + proc.stderr))
    (d / "r.ptx").write_text(REQNTID_PTX)
    subprocess.run([ptxas, "-arch=sm_90", "r.ptx", "-o", "r.sm_90.cubin"], cwd=d, check=True,
                   capture_output=True)
    result["reqntid"] = d / "r.sm_90.cubin"
    return result


def kernels_of(built, arch):
    path, ptxas_report = built[arch]
    return insp.inspect_cubin(path, sass=False).kernels, ptxas_report


# ---------------------------------------------------------------- decoders, no toolkit needed

def test_iter_eiattr_decodes_every_format():
    blob = (bytes([insp.EIFMT_HVAL, insp.EIATTR_CBANK_PARAM_SIZE]) + struct.pack("<H", 40)
            + bytes([insp.EIFMT_NVAL, 0x35, 0, 0])
            + bytes([insp.EIFMT_BVAL, insp.EIATTR_NUM_BARRIERS]) + struct.pack("<H", 3)
            + bytes([insp.EIFMT_SVAL, insp.EIATTR_KPARAM_INFO]) + struct.pack("<H", 12)
            + struct.pack("<IHHI", 0, 1, 8, (4 << 18) | 0x1F000)
            + bytes([insp.EIFMT_SVAL, insp.EIATTR_MAX_THREADS]) + struct.pack("<H", 12)
            + struct.pack("<III", 256, 2, 1))
    recs = list(insp.iter_eiattr(blob))
    assert [r.name for r in recs] == ["CBANK_PARAM_SIZE", "0x35", "NUM_BARRIERS", "KPARAM_INFO",
                                      "MAX_THREADS"]
    assert recs[0].value == 40 and recs[2].value == 3 and recs[1].value is None
    p = insp.decode_kparam_info(recs[3].payload)
    assert (p.ordinal, p.offset, p.size) == (1, 8, 4)
    assert insp.decode_dim3(recs[4].payload) == (256, 2, 1)


def test_iter_eiattr_rejects_unknown_format():
    with pytest.raises(insp.CubinFormatError, match="format 9"):
        list(insp.iter_eiattr(bytes([9, 0x19, 0, 0])))


def test_read_cuda_elf_rejects_non_cubins(tmp_path):
    with pytest.raises(insp.CubinFormatError, match="not an ELF"):
        insp.read_cuda_elf(b"hello world" * 10)
    host_elf = bytearray(64)
    host_elf[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<H", host_elf, 18, 62)               # EM_X86_64
    with pytest.raises(insp.CubinFormatError, match="EM_CUDA"):
        insp.read_cuda_elf(bytes(host_elf))
    bad = tmp_path / "bad.sm_80.cubin"
    bad.write_bytes(b"not a cubin")
    assert insp.main([str(bad), "--no-sass"]) == 1


def test_parse_sass_listing_both_tool_layouts():
    cuobjdump_style = """
        Function : copy_kernel
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64] ;
        /*0020*/              @!P0 HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
        /*0030*/               @P1 STL [R1], R2 ;
        /*0040*/                   EXIT ;
        Function : other_kernel
        /*0000*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
    """
    nvdisasm_style = """
        .text.tma_kernel:
        /*0000*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0010*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0020*/                   LDSM.16.M88.4 R8, [R2+0x200] ;
    """
    mix = insp.parse_sass_listing(cuobjdump_style + nvdisasm_style)
    assert mix["copy_kernel"] == {"MOV": 1, "LDGSTS": 1, "HMMA": 1, "STL": 1, "EXIT": 1}
    assert mix["other_kernel"] == {"HGMMA": 1}
    assert mix["tma_kernel"] == {"UTMALDG": 1, "LDSM": 2}


# ---------------------------------------------------------------- real cubins vs ptxas -v

@needs_toolkit
@pytest.mark.parametrize("arch", TARGETS)
def test_registers_stack_shared_cmem_match_ptxas(built, arch):
    kernels, ptxas_says = kernels_of(built, arch)
    assert set(kernels) == set(ptxas_says)
    for name, want in ptxas_says.items():
        k = kernels[name]
        assert k.registers == want["registers"], name
        assert k.stack_frame_bytes == want["stack"], name
        assert k.static_shared_bytes == want["smem"], name          # sm_90: reserved 1 KiB removed
        assert k.barriers == want["barriers"], name
        if want["cmem0"] is not None:                                # ptxas omits it on sm_90
            assert k.constant0_bytes == want["cmem0"], name


@needs_toolkit
@pytest.mark.parametrize("arch", TARGETS)
def test_local_memory_is_detected(built, arch):
    kernels, _ = kernels_of(built, arch)
    assert kernels["local_array_kernel"].stack_frame_bytes >= 1024
    assert kernels["spill_kernel"].uses_local_memory
    assert kernels["spill_kernel"].registers <= 24 == kernels["spill_kernel"].max_registers
    for name in ("shared_kernel", "bounded_kernel", "two_param_kernel"):
        assert not kernels[name].uses_local_memory, name


@needs_toolkit
@pytest.mark.parametrize("arch", TARGETS)
def test_parameter_block_and_kparam_info(built, arch):
    kernels, _ = kernels_of(built, arch)
    for name in ("bounded_kernel", "local_array_kernel"):       # one 40-byte struct by value
        k = kernels[name]
        assert k.param_bytes == 40
        assert [(p.ordinal, p.offset, p.size) for p in k.params] == [(0, 0, 40)]
    k = kernels["two_param_kernel"]                              # (float*, int)
    assert k.param_bytes == 12
    assert [(p.ordinal, p.offset, p.size) for p in k.params] == [(0, 0, 8), (1, 8, 4)]
    k = kernels["spill_kernel"]                                  # (ptr, ptr, int)
    assert [(p.offset, p.size) for p in k.params] == [(0, 8), (8, 8), (16, 4)]
    assert k.param_bytes == 20
    assert k.param_offset is not None and k.param_offset + k.param_bytes <= k.constant0_bytes


@needs_toolkit
@pytest.mark.parametrize("arch", TARGETS)
def test_launch_bounds(built, arch):
    kernels, _ = kernels_of(built, arch)
    k = kernels["bounded_kernel"]
    assert k.max_threads == (128, 1, 1)
    assert k.max_registers == 128
    assert kernels["shared_kernel"].max_threads is None
    assert kernels["shared_kernel"].max_registers == 255        # no cap


@needs_toolkit
def test_reqntid_and_cluster_shape(built):
    k = insp.inspect_cubin(built["reqntid"], sass=False).kernels["reqntid_kernel"]
    assert k.required_threads == (64, 2, 1)
    assert k.cluster_dims == (2, 1, 1)
    assert k.param_bytes == 8


@needs_toolkit
@pytest.mark.parametrize("arch", TARGETS)
def test_arch_from_elf_agrees_with_file_name(built, arch):
    report = insp.inspect_cubin(built[arch][0], sass=False)
    assert report.arch == arch
    assert report.file_arch == arch and report.module == "k"
    assert report.arch_consistent, report.arch_sources
    assert report.ptx_family == FAMILY[arch]
    assert "Cuda compilation tools" in report.toolkit


@needs_toolkit
def test_misnamed_cubin_is_an_arch_mismatch(built, tmp_path):
    wrong = tmp_path / "k.sm_75.cubin"
    shutil.copy(built["80"][0], wrong)
    report = insp.inspect_cubin(wrong, sass=False)
    assert report.arch == "80" and report.file_arch == "75"
    assert not report.arch_consistent


@needs_toolkit
def test_check_reports_a_cubin_from_the_wrong_code_path(package_dir, built, tmp_path):
    # an sm_86 cubin assembled from compute_75 PTX runs, but holds the wrong __CUDA_ARCH__ path
    d = Path(built["75"][0]).parent
    subprocess.run([ptxas, "-arch=sm_86", "k.compute_75.ptx", "-o", str(tmp_path / "x.cubin")],
                   cwd=d, check=True, capture_output=True)
    shutil.copy(tmp_path / "x.cubin", package_dir / "kmod.sm_86.cubin")
    problems = insp.check_build(package_dir, fake_table(kmod=fake_module()), param_sizes=sizes_40)
    assert problems == ["kmod.sm_86.cubin: assembled from compute_75 PTX; the kernel table "
                        "builds sm_86 from compute_80"]


@needs_toolkit
def test_cli_table_and_json(built, capsys):
    path = str(built["90"][0])
    assert insp.main([path, "--no-sass"]) == 0
    text = capsys.readouterr().out
    assert "k.sm_90.cubin: sm_90" in text
    line = next(l for l in text.splitlines() if l.strip().startswith("shared_kernel"))
    assert "4000" in line
    assert insp.main([path, "--no-sass", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (cubin,) = data["cubins"]
    assert cubin["arch"] == "90"
    k = cubin["kernels"]["local_array_kernel"]
    assert k["uses_local_memory"] and k["param_bytes"] == 40
    assert k["params"][0]["size"] == 40


@needs_toolkit
def test_sass_instruction_mix_when_a_disassembler_exists(built):
    if insp.find_disassembler() is None:
        pytest.skip("neither cuobjdump nor nvdisasm on PATH")
    report = insp.inspect_cubin(built["90"][0])
    assert report.sass_error is None, report.sass_error
    spill = report.kernels["spill_kernel"].sass_mix
    assert spill.get("STL", 0) > 0 and spill.get("LDL", 0) > 0
    shared = report.kernels["shared_kernel"].sass_mix
    assert shared.get("STS", 0) > 0 and shared.get("LDS", 0) > 0 and shared.get("BAR", 0) > 0


@needs_toolkit
def test_sass_section_wiring_with_a_stand_in_disassembler(built, tmp_path, monkeypatch, capsys):
    # a fake cuobjdump: checks how the tool is called and how its output/failure is reported
    fake = tmp_path / "bin" / "cuobjdump"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n[ \"$1\" = -sass ] || exit 3\n"
                    "echo '        Function : shared_kernel'\n"
                    "echo '        /*0000*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    report = insp.inspect_cubin(built["80"][0])
    assert report.sass_tool == "cuobjdump" and report.sass_error is None
    assert report.kernels["shared_kernel"].sass_mix == {"BAR": 1}
    assert report.kernels["bounded_kernel"].sass_mix is None
    assert insp.main([str(built["80"][0])]) == 0
    assert "shared_kernel: 1 instructions; BAR 1" in capsys.readouterr().out
    fake.write_text("#!/bin/sh\necho 'unsupported arch' >&2\nexit 1\n")
    report = insp.inspect_cubin(built["80"][0])
    assert "unsupported arch" in report.sass_error


@needs_toolkit
@pytest.mark.parametrize("arch", TARGETS)
def test_agrees_with_cuobjdump_resource_usage(built, arch):
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump not on PATH")
    path, _ = built[arch]
    text = subprocess.run([cuobjdump, "--dump-resource-usage", str(path)], check=True,
                          capture_output=True, text=True).stdout
    usage = {}
    for block in re.split(r"Function\s+", text)[1:]:
        name = block.split(":", 1)[0].strip()
        fields = re.findall(r"(REG|STACK|SHARED|CONSTANT\[0\]):(\d+)", block)
        usage[name] = {key: int(v) for key, v in fields}
    kernels = insp.inspect_cubin(path, sass=False).kernels
    assert set(usage) == set(kernels), text
    for name, want in usage.items():
        k = kernels[name]
        assert k.registers == want["REG"], (name, text)
        assert k.stack_frame_bytes == want["STACK"], (name, text)
        if "CONSTANT[0]" in want:
            assert k.constant0_bytes == want["CONSTANT[0]"], (name, text)
        if int(arch.rstrip("a")) < 90:       # sm_90's reserved window: ptxas -v is the judge above
            assert k.static_shared_bytes == want["SHARED"], (name, text)


# ---------------------------------------------------------------- --check against a kernel table

def fake_table(**modules):
    return SimpleNamespace(MODULES=modules, CUBIN_ARCHS={"75": "75", "80": "80", "86": "80",
                                                         "89": "80", "90": "90"},
                           PTX_FAMILIES=("75", "80", "90"))


def fake_module(name="kmod", kernels=None, sm90a=False, allow_local=()):
    # the real KernelModule's cubin_archs()/ptx_families() are not given: check_build
    # must derive them from the table, as it does for modules without those methods
    return SimpleNamespace(name=name, params_header="kfam/kfam_params.h",
                           kernels=kernels or {"bounded_kernel": "P40"},
                           sm90a=sm90a, allow_local=allow_local)


@pytest.fixture
def package_dir(built, tmp_path):
    """A cubin folder laid out like specdec_lib/_cubin for module 'kmod'."""
    for arch in TARGETS:
        shutil.copy(built[arch][0], tmp_path / f"kmod.sm_{arch}.cubin")
    for fam in ("75", "80", "90", "90a"):
        (tmp_path / f"kmod.compute_{fam}.ptx").write_text("// ptx\n")
    return tmp_path


def sizes_40(module):
    return {"P40": 40}


@needs_toolkit
def test_check_passes_on_a_complete_build(package_dir):
    table = fake_table(kmod=fake_module(sm90a=True))
    assert insp.check_build(package_dir, table, param_sizes=sizes_40) == []


@needs_toolkit
def test_check_reports_missing_cubins_and_ptx(package_dir):
    (package_dir / "kmod.sm_86.cubin").unlink()
    (package_dir / "kmod.sm_90a.cubin").unlink()
    (package_dir / "kmod.compute_80.ptx").unlink()
    problems = insp.check_build(package_dir, fake_table(kmod=fake_module(sm90a=True)),
                                param_sizes=sizes_40)
    assert any("kmod.sm_86.cubin" in p for p in problems)
    assert any("kmod.sm_90a.cubin" in p for p in problems)
    assert any("kmod.compute_80.ptx" in p for p in problems)
    # a module that does not ask for sm_90a does not need that cubin
    assert insp.check_build(package_dir, fake_table(kmod=fake_module()),
                            param_sizes=sizes_40) == [
        p for p in problems if "sm_90a" not in p and "compute_90a" not in p]


@needs_toolkit
def test_check_reports_a_table_kernel_missing_from_the_cubin(package_dir):
    module = fake_module(kernels={"bounded_kernel": "P40", "no_such_kernel": "P40"})
    problems = insp.check_build(package_dir, fake_table(kmod=module), param_sizes=sizes_40)
    assert len(problems) == 5 and all("no_such_kernel" in p for p in problems)


@needs_toolkit
def test_check_reports_local_memory_unless_allowed(package_dir):
    module = fake_module(kernels={"local_array_kernel": "P40"})
    problems = insp.check_build(package_dir, fake_table(kmod=module), param_sizes=sizes_40)
    assert len(problems) == 5 and all("local memory" in p for p in problems)
    module = fake_module(kernels={"local_array_kernel": "P40"}, allow_local=("local_array_kernel",))
    assert insp.check_build(package_dir, fake_table(kmod=module), param_sizes=sizes_40) == []


@needs_toolkit
def test_check_reports_param_size_mismatch(package_dir):
    problems = insp.check_build(package_dir, fake_table(kmod=fake_module()),
                                param_sizes=lambda m: {"P40": 48})
    assert len(problems) == 5
    assert all("sizeof(P40) = 48" in p and "CBANK_PARAM_SIZE is 40" in p for p in problems)
    problems = insp.check_build(package_dir, fake_table(kmod=fake_module()),
                                param_sizes=lambda m: {})
    assert len(problems) == 5 and all("PARAM_SIZES['P40']" in p for p in problems)


@needs_toolkit
def test_check_reports_more_than_one_kernel_parameter(package_dir):
    module = fake_module(kernels={"two_param_kernel": "Unused"})
    problems = insp.check_build(package_dir, fake_table(kmod=module),
                                param_sizes=lambda m: {"Unused": 12})
    assert len(problems) == 5 and all("takes 2 parameters" in p for p in problems)


@needs_toolkit
def test_check_reports_unimportable_launcher(package_dir):
    def no_launcher(module):
        raise ImportError("No module named 'specdec_lib._kfam'")
    problems = insp.check_build(package_dir, fake_table(kmod=fake_module()),
                                param_sizes=no_launcher)
    assert problems == ["kmod: cannot read the launcher's PARAM_SIZES (specdec_lib._kfam): "
                        "No module named 'specdec_lib._kfam'"]


@needs_toolkit
def test_check_reports_wrong_arch_behind_a_file_name(package_dir, built):
    shutil.copy(built["80"][0], package_dir / "kmod.sm_89.cubin")
    problems = insp.check_build(package_dir, fake_table(kmod=fake_module()), param_sizes=sizes_40)
    assert len(problems) == 1 and "kmod.sm_89.cubin: built for sm_80" in problems[0]


@needs_toolkit
def test_cli_check_exit_codes(package_dir, monkeypatch, capsys):
    monkeypatch.setattr(insp, "load_kernel_table", lambda: fake_table(kmod=fake_module()))
    monkeypatch.setattr(insp, "launcher_param_sizes", sizes_40)
    assert insp.main(["--check", "--no-sass", "--dir", str(package_dir)]) == 0
    assert "inspect --check: OK" in capsys.readouterr().out
    monkeypatch.setattr(insp, "launcher_param_sizes", lambda m: {"P40": 44})
    assert insp.main(["--check", "--no-sass", "--dir", str(package_dir), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert len(data["problems"]) == 5 and len(data["cubins"]) == len(TARGETS)


# ---------------------------------------------------------------- the real build

def test_check_passes_on_the_built_package(capsys):
    cubins = sorted(insp.CUBIN_DIR.glob("*.cubin"))
    if not cubins:
        pytest.skip(f"no cubins in {insp.CUBIN_DIR}: package not built in place")
    code = insp.main(["--check", "--no-sass"])
    out = capsys.readouterr().out
    assert code == 0, out
    from specdec_lib import _kernels
    for module in _kernels.MODULES.values():
        for arch in module.cubin_archs():
            assert f"{module.name}.sm_{arch}.cubin: sm_{arch}" in out
