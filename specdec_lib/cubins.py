"""Inspect the shipped cubins: what each kernel costs, and whether the build is complete.

(This module was ``specdec_lib.inspect``, a name that hid the standard library's ``inspect``
from a reader; ``specdec_lib.inspect`` still imports, as this module.)

``python -m specdec_lib inspect`` (also ``specdec-inspect``) reads every cubin in
``specdec_lib/_cubin/`` and prints, per kernel: registers, static shared memory,
stack frame (local memory: spills or indexed local arrays), parameter-block bytes,
parameter layout, launch bounds.  Everything is read from the ELF itself in pure
Python, so it works where cuobjdump is absent.  When ``cuobjdump`` or ``nvdisasm``
is on PATH it adds the SASS instruction mix (HMMA, HGMMA, LDGSTS, UTMALDG, LDL ...).

``--check`` compares the build with the kernel table (``specdec_lib._kernels``) and
the Cython launchers, and exits non-zero when a module lacks a cubin for one of its
targets, a table kernel is missing from a cubin, a kernel uses local memory the
table does not allow, or a launcher's param struct size differs from the cubin's
``CBANK_PARAM_SIZE``.

Where the numbers come from (cubin = ELF64, machine EM_CUDA):

* ``.nv.info``            per-symbol attributes: REGCOUNT, FRAME_SIZE, MIN_STACK_SIZE
* ``.nv.info.<kernel>``   per-kernel attributes: CBANK_PARAM_SIZE, KPARAM_INFO,
                          MAX_THREADS, REQNTID, MAXREG_COUNT, NUM_BARRIERS ...
* ``.nv.shared.<kernel>`` static shared memory (on sm_90+ it starts with the 1 KiB
                          window the driver reserves, which is subtracted; dynamic
                          shared memory is a launch argument and not in the cubin)
* ``.nv.constant0.<kernel>``  constant bank 0: driver area + the parameter block
* ``.text.<kernel>``      the code (size; the register count on older layouts)

An attribute record ("EIATTR") is: format byte, attribute byte, then either a u16
value (formats BVAL/HVAL), nothing (NVAL), or a u16 payload size and the payload
(SVAL).  Payloads are little-endian u32 words.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["CUBIN_DIR", "CubinFormatError", "CubinReport", "KernelResources", "KernelParam",
           "inspect_cubin", "read_cuda_elf", "check_build", "collect_cubins", "format_report",
           "report_to_json", "parse_sass_listing", "find_disassembler", "main"]

CUBIN_DIR = Path(__file__).resolve().parent / "_cubin"
CUBIN_NAME = re.compile(r"^(?P<module>.+)\.sm_(?P<arch>\d+a?)\.cubin$")

# ----------------------------------------------------------------------------
# ELF container
# ----------------------------------------------------------------------------

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
EM_CUDA = 190
SHT_NOBITS = 8
SHT_NOTE = 7
SHT_CUDA_INFO = 0x70000000
# The ELF ABI version byte: 8 and later (CUDA 13 toolkits) moved the SM number
# from e_flags bits 0-7 to bits 8-15.
CUDA_ELF_ABI_SM_IN_BITS_8_15 = 8
EF_CUDA_ACCELERATORS_OLD = 0x800     # "sm_90a" bit of the pre-ABI-8 e_flags layout


@dataclass
class ElfSection:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int


@dataclass
class ElfSymbol:
    index: int
    name: str
    info: int
    other: int
    section: int
    value: int
    size: int


@dataclass
class CudaElf:
    """The parts of a cubin's ELF container that inspection needs."""
    data: bytes
    e_flags: int
    abi_version: int
    sections: list
    symbols: list

    def section(self, name):
        for sec in self.sections:
            if sec.name == name:
                return sec
        return None

    def section_bytes(self, sec):
        if sec.type == SHT_NOBITS:
            return b""
        return self.data[sec.offset:sec.offset + sec.size]

    def symbol(self, name):
        for sym in self.symbols:
            if sym.name == name:
                return sym
        return None


class CubinFormatError(ValueError):
    """The file is not a cubin this tool can read."""


def _c_string(data, offset):
    end = data.find(b"\0", offset)
    return data[offset:end if end >= 0 else len(data)].decode("utf-8", "replace")


def read_cuda_elf(data: bytes) -> CudaElf:
    """Section headers and symbol table of a 64-bit little-endian CUDA ELF."""
    if len(data) < 64 or data[:4] != ELF_MAGIC:
        raise CubinFormatError("not an ELF file")
    if data[4] != ELFCLASS64 or data[5] != 1:
        raise CubinFormatError("not a 64-bit little-endian ELF (cubins are)")
    (e_machine,) = struct.unpack_from("<H", data, 18)
    if e_machine != EM_CUDA:
        raise CubinFormatError(f"ELF machine {e_machine} is not EM_CUDA ({EM_CUDA})")
    e_flags, = struct.unpack_from("<I", data, 48)
    e_shoff, = struct.unpack_from("<Q", data, 40)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 58)
    raw = []
    for i in range(e_shnum):
        hdr = struct.unpack_from("<IIQQQQII", data, e_shoff + i * e_shentsize)
        raw.append(hdr)
    names_at = raw[e_shstrndx][4] if e_shstrndx < len(raw) else 0
    sections = [ElfSection(i, _c_string(data, names_at + h[0]), h[1], h[2], h[4], h[5], h[6], h[7])
                for i, h in enumerate(raw)]
    symbols = []
    symtab = next((s for s in sections if s.name == ".symtab"), None)
    if symtab is not None:
        strtab = sections[symtab.link]
        for i in range(symtab.size // 24):
            name, info, other, shndx, value, size = struct.unpack_from(
                "<IBBHQQ", data, symtab.offset + 24 * i)
            symbols.append(ElfSymbol(i, _c_string(data, strtab.offset + name), info, other,
                                     shndx, value, size))
    return CudaElf(data, e_flags, data[8], sections, symbols)


def iter_elf_notes(blob: bytes):
    """(name, type, desc) of each note in a SHT_NOTE section."""
    pos = 0
    while pos + 12 <= len(blob):
        namesz, descsz, ntype = struct.unpack_from("<III", blob, pos)
        pos += 12
        name = blob[pos:pos + namesz].rstrip(b"\0").decode("ascii", "replace")
        pos += (namesz + 3) & ~3
        desc = blob[pos:pos + descsz]
        pos += (descsz + 3) & ~3
        yield name, ntype, desc


# ----------------------------------------------------------------------------
# EIATTR records (.nv.info, .nv.info.<kernel>, .nv.compat)
# ----------------------------------------------------------------------------

EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4

EIATTR_MAX_THREADS = 0x05       # .maxntid / __launch_bounds__: u32 x, y, z
EIATTR_PARAM_CBANK = 0x0A       # u32 symbol of .nv.constant0.<k>, u16 offset, u16 size
EIATTR_REQNTID = 0x10           # .reqntid: u32 x, y, z
EIATTR_FRAME_SIZE = 0x11        # u32 symbol, u32 bytes: this function's stack frame
EIATTR_MIN_STACK_SIZE = 0x12    # u32 symbol, u32 bytes: frame incl. callees
EIATTR_KPARAM_INFO = 0x17       # one per parameter, see decode_kparam_info
EIATTR_CBANK_PARAM_SIZE = 0x19  # u16: bytes of the parameter block
EIATTR_MAXREG_COUNT = 0x1B      # u16: register cap (maxrregcount / launch bounds)
EIATTR_EXIT_INSTR_OFFSETS = 0x1C
EIATTR_MAX_STACK_SIZE = 0x23
EIATTR_REGCOUNT = 0x2F          # u32 symbol, u32 registers per thread
EIATTR_CUDA_API_VERSION = 0x37
EIATTR_NUM_MBARRIERS = 0x38
EIATTR_CTA_PER_CLUSTER = 0x3D
EIATTR_EXPLICIT_CLUSTER = 0x3E
EIATTR_MAX_CLUSTER_RANK = 0x3F
EIATTR_NUM_BARRIERS = 0x4C
EIATTR_SPARSE_MMA_MASK = 0x50

EIATTR_NAMES = {
    0x04: "CTAIDZ_USED", 0x05: "MAX_THREADS", 0x0A: "PARAM_CBANK", 0x0F: "EXTERNS",
    0x10: "REQNTID", 0x11: "FRAME_SIZE", 0x12: "MIN_STACK_SIZE", 0x17: "KPARAM_INFO",
    0x19: "CBANK_PARAM_SIZE", 0x1B: "MAXREG_COUNT", 0x1C: "EXIT_INSTR_OFFSETS",
    0x1D: "S2RCTAID_INSTR_OFFSETS", 0x1E: "CRS_STACK_SIZE", 0x23: "MAX_STACK_SIZE",
    0x28: "COOP_GROUP_INSTR_OFFSETS", 0x2B: "WMMA_USED", 0x2F: "REGCOUNT",
    0x36: "SW_WAR", 0x37: "CUDA_API_VERSION", 0x38: "NUM_MBARRIERS",
    0x39: "MBARRIER_INSTR_OFFSETS", 0x3D: "CTA_PER_CLUSTER", 0x3E: "EXPLICIT_CLUSTER",
    0x3F: "MAX_CLUSTER_RANK", 0x4C: "NUM_BARRIERS", 0x50: "SPARSE_MMA_MASK",
}

# .nv.compat: 1 when the cubin uses arch-specific ("sm_90a") features
EICOMPAT_ARCH_SPECIFIC = 0x09


@dataclass
class EiattrRecord:
    fmt: int
    attr: int
    value: int | None = None      # BVAL / HVAL
    payload: bytes = b""          # SVAL

    @property
    def name(self):
        return EIATTR_NAMES.get(self.attr, f"0x{self.attr:02x}")


def iter_eiattr(blob: bytes):
    """Decode the attribute records of one .nv.info-style section."""
    pos = 0
    while pos + 4 <= len(blob):
        fmt, attr, half = blob[pos], blob[pos + 1], struct.unpack_from("<H", blob, pos + 2)[0]
        pos += 4
        if fmt == EIFMT_SVAL:
            yield EiattrRecord(fmt, attr, None, bytes(blob[pos:pos + half]))
            pos += half
        elif fmt in (EIFMT_BVAL, EIFMT_HVAL):
            yield EiattrRecord(fmt, attr, half)
        elif fmt == EIFMT_NVAL:
            yield EiattrRecord(fmt, attr)
        else:
            raise CubinFormatError(f"unknown EIATTR format {fmt} at byte {pos - 4}")


def decode_symbol_value(payload: bytes):
    """(symbol index, value): REGCOUNT, FRAME_SIZE, MIN_STACK_SIZE, MAX_STACK_SIZE."""
    return struct.unpack_from("<II", payload)


def decode_dim3(payload: bytes):
    """(x, y, z): MAX_THREADS, REQNTID, CTA_PER_CLUSTER."""
    return tuple(struct.unpack_from("<III", payload))


def decode_param_cbank(payload: bytes):
    """(symbol of .nv.constant0.<k>, byte offset of the params in bank 0, their size)."""
    return struct.unpack_from("<IHH", payload)


@dataclass
class KernelParam:
    ordinal: int      # argument position
    offset: int       # byte offset inside the parameter block
    size: int         # bytes
    flags: int        # raw word (bits 18-31: size; 12-16: constant bank, 0x1f = param bank)


def decode_kparam_info(payload: bytes) -> KernelParam:
    """KPARAM_INFO: u32 index (0), u16 ordinal, u16 offset, u32 flags with size in bits 18-31."""
    _index, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
    return KernelParam(ordinal, offset, (flags >> 18) & 0x3FFF, flags)


# ----------------------------------------------------------------------------
# Target architecture
# ----------------------------------------------------------------------------

def elf_flags_sm(elf: CudaElf) -> int:
    """SM number from e_flags (bits 8-15 from ELF ABI version 8 on, bits 0-7 before)."""
    if elf.abi_version >= CUDA_ELF_ABI_SM_IN_BITS_8_15:
        return (elf.e_flags >> 8) & 0xFF
    return elf.e_flags & 0xFF


def toolkit_note(elf: CudaElf):
    """(toolkit version string, tool options string) from .note.nv.tkinfo, or ("", "")."""
    sec = elf.section(".note.nv.tkinfo")
    if sec is None:
        return "", ""
    version = options = ""
    for _name, _type, desc in iter_elf_notes(elf.section_bytes(sec)):
        for text in desc[24:].split(b"\0"):
            text = text.decode("ascii", "replace").strip()
            if text.startswith("Cuda compilation tools") and not version:
                version = text
            elif "-arch" in text and not options:
                options = text
    return version, options


def cuinfo_sm(elf: CudaElf):
    """Virtual arch recorded in .note.nv.cuinfo (u16 version, u16 sm, u32 api), or None.

    This is the PTX target the cubin was assembled from (75 for a cubin built from
    compute_75 PTX), not the SM the cubin runs on: it tells which code path
    (``__CUDA_ARCH__``) the cubin holds.
    """
    sec = elf.section(".note.nv.cuinfo")
    if sec is None:
        return None
    for _name, _type, desc in iter_elf_notes(elf.section_bytes(sec)):
        if len(desc) >= 4:
            return struct.unpack_from("<H", desc, 2)[0]
    return None


def is_arch_specific(elf: CudaElf, tool_options: str) -> bool:
    """True for an 'a' cubin (sm_90a): wgmma/setmaxnreg allowed, runs only on that SM."""
    if elf.abi_version < CUDA_ELF_ABI_SM_IN_BITS_8_15:
        return bool(elf.e_flags & EF_CUDA_ACCELERATORS_OLD)
    sec = elf.section(".nv.compat")
    if sec is not None:
        for rec in iter_eiattr(elf.section_bytes(sec)):
            if rec.attr == EICOMPAT_ARCH_SPECIFIC and rec.value is not None:
                return rec.value == 1
    return bool(re.search(r"-arch\s+sm_\d+a\b", tool_options))


# ----------------------------------------------------------------------------
# Per-kernel resources
# ----------------------------------------------------------------------------

SM90_RESERVED_SHARED_BYTES = 1024   # sm_90 layout: .nv.shared.<k> starts with this window


@dataclass
class KernelResources:
    name: str
    registers: int = 0
    static_shared_bytes: int = 0
    stack_frame_bytes: int = 0        # local memory per thread (spills, indexed arrays)
    min_stack_bytes: int = 0          # incl. callees
    param_bytes: int | None = None    # CBANK_PARAM_SIZE
    param_offset: int | None = None   # where the parameter block starts in constant bank 0
    params: list = field(default_factory=list)       # KernelParam per argument
    max_threads: tuple | None = None  # launch bounds
    required_threads: tuple | None = None
    max_registers: int | None = None  # register cap ptxas honoured (255: none)
    barriers: int = 0
    mbarriers: int = 0
    cluster_dims: tuple | None = None
    constant0_bytes: int = 0
    code_bytes: int = 0
    attributes: list = field(default_factory=list)   # names of every EIATTR present
    sass_mix: dict | None = None      # opcode -> count, when a disassembler ran

    @property
    def uses_local_memory(self):
        return self.stack_frame_bytes > 0 or self.min_stack_bytes > 0


@dataclass
class CubinReport:
    path: str
    arch: str                  # from the ELF: "90", "90a", "75" ...
    file_arch: str | None      # from the file name, None when it does not follow the scheme
    module: str | None
    toolkit: str
    kernels: dict              # name -> KernelResources
    arch_sources: dict         # the arch according to e_flags and to the file name
    ptx_family: str | None     # PTX target it was assembled from ("80" for sm_86), if recorded
    sass_tool: str | None = None
    sass_error: str | None = None

    @property
    def arch_consistent(self):
        seen = {v for v in self.arch_sources.values() if v is not None}
        return len(seen) <= 1


def _reserved_shared_bytes(elf: CudaElf, sm: int) -> int:
    cap = elf.symbol(".nv.reservedSmem.cap")
    if cap is not None and cap.value:
        return cap.value
    if sm >= 90 and any(s.name.startswith(".nv.shared.reserved.") for s in elf.sections):
        return SM90_RESERVED_SHARED_BYTES
    return 0


def read_kernel_resources(elf: CudaElf) -> dict:
    """KernelResources for every kernel (STT_FUNC symbol with a .nv.info.<name> section)."""
    kernels = {}
    by_symbol = {}
    for sec in elf.sections:
        if sec.name.startswith(".nv.info.") and sec.type == SHT_CUDA_INFO:
            name = sec.name[len(".nv.info."):]
            kernels[name] = KernelResources(name)
    for sym in elf.symbols:
        if sym.name in kernels and (sym.info & 0xF) == 2:      # STT_FUNC
            by_symbol[sym.index] = kernels[sym.name]
    sm = elf_flags_sm(elf)
    reserved = _reserved_shared_bytes(elf, sm)

    # per-symbol attributes live in the global .nv.info
    nv_info = elf.section(".nv.info")
    if nv_info is not None:
        for rec in iter_eiattr(elf.section_bytes(nv_info)):
            if rec.attr not in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE):
                continue
            sym_index, value = decode_symbol_value(rec.payload)
            k = by_symbol.get(sym_index)
            if k is None:
                continue
            if rec.attr == EIATTR_REGCOUNT:
                k.registers = value
            elif rec.attr == EIATTR_FRAME_SIZE:
                k.stack_frame_bytes = value
            else:
                k.min_stack_bytes = value

    for name, k in kernels.items():
        for rec in iter_eiattr(elf.section_bytes(elf.section(f".nv.info.{name}"))):
            k.attributes.append(rec.name)
            if rec.attr == EIATTR_CBANK_PARAM_SIZE:
                k.param_bytes = rec.value
            elif rec.attr == EIATTR_PARAM_CBANK:
                _sym, k.param_offset, _size = decode_param_cbank(rec.payload)
            elif rec.attr == EIATTR_KPARAM_INFO:
                k.params.append(decode_kparam_info(rec.payload))
            elif rec.attr == EIATTR_MAX_THREADS:
                k.max_threads = decode_dim3(rec.payload)
            elif rec.attr == EIATTR_REQNTID:
                k.required_threads = decode_dim3(rec.payload)
            elif rec.attr == EIATTR_CTA_PER_CLUSTER:
                k.cluster_dims = decode_dim3(rec.payload)
            elif rec.attr == EIATTR_MAXREG_COUNT:
                k.max_registers = rec.value
            elif rec.attr == EIATTR_NUM_BARRIERS:
                k.barriers = rec.value
            elif rec.attr == EIATTR_NUM_MBARRIERS:
                k.mbarriers = struct.unpack_from("<I", rec.payload)[0] if rec.payload else rec.value
        k.params.sort(key=lambda p: p.ordinal)

        text = elf.section(f".text.{name}")
        if text is not None:
            k.code_bytes = text.size
            if not k.registers:             # older layouts keep it in sh_info bits 24-31
                k.registers = text.info >> 24
        shared = elf.section(f".nv.shared.{name}")
        if shared is not None:
            in_window = shared.size >= reserved
            k.static_shared_bytes = shared.size - reserved if in_window else shared.size
        const0 = elf.section(f".nv.constant0.{name}")
        if const0 is not None:
            k.constant0_bytes = const0.size
    return kernels


def inspect_cubin(path, *, sass=True) -> CubinReport:
    """Read one cubin file; with sass=True also disassemble it when a tool is on PATH."""
    path = Path(path)
    elf = read_cuda_elf(path.read_bytes())
    toolkit, tool_options = toolkit_note(elf)
    sm = elf_flags_sm(elf)
    arch = f"{sm}{'a' if is_arch_specific(elf, tool_options) else ''}"
    match = CUBIN_NAME.match(path.name)
    note_sm = cuinfo_sm(elf)
    family = None if note_sm is None else f"{note_sm}{arch[len(str(sm)):]}"
    sources = {"e_flags": arch, "file_name": match["arch"] if match else None}
    report = CubinReport(str(path), arch, match["arch"] if match else None,
                         match["module"] if match else None, toolkit,
                         read_kernel_resources(elf), sources, family)
    if sass:
        tool = find_disassembler()
        if tool is not None:
            report.sass_tool = Path(tool[0]).name
            try:
                mix = sass_instruction_mix(path, tool)
            except (OSError, subprocess.SubprocessError, RuntimeError) as err:
                report.sass_error = str(err)
            else:
                for name, counts in mix.items():
                    if name in report.kernels:
                        report.kernels[name].sass_mix = dict(counts)
    return report


# ----------------------------------------------------------------------------
# SASS instruction mix (needs cuobjdump or nvdisasm)
# ----------------------------------------------------------------------------

# Opcodes worth a column: tensor cores, async copies, TMA, ldmatrix, local memory.
SASS_HIGHLIGHT = ("HMMA", "HGMMA", "IMMA", "LDGSTS", "UTMALDG", "UTMASTG", "UBLKCP",
                  "LDSM", "STSM", "LDGDEPBAR", "SYNCS", "LDL", "STL", "BAR", "SHFL",
                  "LDG", "STG", "LDS", "STS")

_FUNCTION_HEADER = re.compile(r"^\s*(?:Function\s*:\s*(?P<fn>\S+)|\.text\.(?P<label>[\w$.]+):)\s*$")
_INSTRUCTION = re.compile(
    r"^\s*/\*[0-9a-fA-F]+\*/\s+(?:\{\s*)?(?:@!?U?P(?:T|\d+)\s+)?(?P<op>[A-Z][A-Z0-9_]*)")


def find_disassembler():
    """Command prefix of cuobjdump or nvdisasm (PATH, then CUDA_HOME/bin), or None."""
    dirs = [None]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs.append(str(Path(os.environ[env]) / "bin"))
    for tool, args in (("cuobjdump", ["-sass"]), ("nvdisasm", [])):
        for d in dirs:
            found = shutil.which(tool, path=d) if d else shutil.which(tool)
            if found:
                return [found, *args]
    return None


def parse_sass_listing(text: str) -> dict:
    """kernel -> Counter of base opcodes (HMMA.16816.F32 -> HMMA), from either tool's output."""
    mix = {}
    current = None
    for line in text.splitlines():
        header = _FUNCTION_HEADER.match(line)
        if header:
            current = mix.setdefault(header["fn"] or header["label"], Counter())
            continue
        if current is None:
            continue
        ins = _INSTRUCTION.match(line)
        if ins:
            current[ins["op"]] += 1
    return mix


def sass_instruction_mix(path, tool) -> dict:
    proc = subprocess.run([*tool, str(path)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(tool[0]).name} failed on {Path(path).name}: "
                           f"{proc.stderr.strip()[:400]}")
    return parse_sass_listing(proc.stdout)


# ----------------------------------------------------------------------------
# --check: the build against the kernel table and the launchers
# ----------------------------------------------------------------------------

def module_family(module) -> str:
    """Op family of a kernel-table module: its launcher is specdec_lib._<family>."""
    return getattr(module, "family", None) or module.params_header.split("/")[0]


def launcher_param_sizes(module) -> dict:
    """PARAM_SIZES of the module's Cython launcher (struct name -> sizeof)."""
    import importlib
    mod = importlib.import_module(f"specdec_lib._{module_family(module)}")
    return dict(mod.PARAM_SIZES)


def load_kernel_table():
    from . import _kernels
    return _kernels


def module_cubin_archs(module, table) -> list:
    if hasattr(module, "cubin_archs"):
        return list(module.cubin_archs())
    archs = list(table.CUBIN_ARCHS)
    return archs + (["90a"] if getattr(module, "sm90a", False) else [])


def module_ptx_families(module, table) -> list:
    if hasattr(module, "ptx_families"):
        return list(module.ptx_families())
    fams = list(getattr(table, "PTX_FAMILIES", ()))
    return fams + (["90a"] if getattr(module, "sm90a", False) else [])


def check_build(cubin_dir, table=None, *, param_sizes=None, reports=None):
    """Problems (strings) with the build in cubin_dir; an empty list means it passes.

    table: an object with MODULES (and CUBIN_ARCHS / PTX_FAMILIES); default the real one.
    param_sizes: module -> {struct name: sizeof}; default imports the Cython launcher.
    reports: {file name: CubinReport} already read (saves re-reading).
    """
    table = table or load_kernel_table()
    param_sizes = param_sizes or launcher_param_sizes
    cubin_dir = Path(cubin_dir)
    reports = dict(reports or {})
    problems = []
    for module in table.MODULES.values():
        try:
            sizes = param_sizes(module)
        except Exception as err:                      # noqa: BLE001 - reported, not raised
            sizes = None
            problems.append(f"{module.name}: cannot read the launcher's PARAM_SIZES "
                            f"(specdec_lib._{module_family(module)}): {err}")
        for fam in module_ptx_families(module, table):
            if not (cubin_dir / f"{module.name}.compute_{fam}.ptx").is_file():
                problems.append(f"{module.name}: missing PTX {module.name}.compute_{fam}.ptx")
        for arch in module_cubin_archs(module, table):
            fname = f"{module.name}.sm_{arch}.cubin"
            if fname not in reports:
                if not (cubin_dir / fname).is_file():
                    problems.append(f"{module.name}: missing cubin {fname}")
                    continue
                try:
                    reports[fname] = inspect_cubin(cubin_dir / fname, sass=False)
                except (OSError, CubinFormatError) as err:
                    problems.append(f"{fname}: unreadable: {err}")
                    continue
            family = dict(getattr(table, "CUBIN_ARCHS", {})).get(arch, arch)
            problems += check_cubin(module, reports[fname], arch, family, sizes)
    return problems


def check_cubin(module, report: CubinReport, arch: str, family: str, sizes) -> list:
    """Problems of one cubin of a table module: arch, code path, kernels, params, local memory."""
    fname = Path(report.path).name
    problems = []
    if report.arch != arch or not report.arch_consistent:
        problems.append(f"{fname}: built for sm_{report.arch}, expected sm_{arch} "
                        f"(arch sources: {report.arch_sources})")
    if report.ptx_family is not None and report.ptx_family != family:
        problems.append(f"{fname}: assembled from compute_{report.ptx_family} PTX; the kernel "
                        f"table builds sm_{arch} from compute_{family}")
    allowed_local = set(getattr(module, "allow_local", ()))
    for symbol, struct_name in module.kernels.items():
        k = report.kernels.get(symbol)
        if k is None:
            problems.append(f"{fname}: kernel {symbol} is in the table but not in the cubin")
            continue
        if k.uses_local_memory and symbol not in allowed_local:
            problems.append(f"{fname}: {symbol} uses {max(k.stack_frame_bytes, k.min_stack_bytes)} "
                            f"bytes of local memory per thread (stack frame; spills or an indexed "
                            f"local array) and the table does not allow it")
        if len(k.params) != 1:
            problems.append(f"{fname}: {symbol} takes {len(k.params)} parameters; kernels take "
                            f"exactly one param struct by value")
        if sizes is None:
            continue
        if struct_name not in sizes:
            problems.append(f"{fname}: {symbol}: launcher specdec_lib._{module_family(module)} "
                            f"has no PARAM_SIZES[{struct_name!r}]")
        elif k.param_bytes != sizes[struct_name]:
            problems.append(f"{fname}: {symbol}: launcher packs sizeof({struct_name}) = "
                            f"{sizes[struct_name]} bytes but the cubin's CBANK_PARAM_SIZE is "
                            f"{k.param_bytes}")
    return problems


# ----------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------

def _dims(d):
    if not d:
        return "-"
    x, y, z = d
    return str(x) if y == z == 1 else f"{x}x{y}x{z}"


def format_report(report: CubinReport) -> str:
    name = Path(report.path).name
    arch_note = "" if report.arch_consistent else f"  ARCH MISMATCH {report.arch_sources}"
    origin = f" (from compute_{report.ptx_family} PTX)" if report.ptx_family else ""
    lines = [f"{name}: sm_{report.arch}{origin}, {len(report.kernels)} kernels"
             f"{', ' + report.toolkit if report.toolkit else ''}{arch_note}"]
    rows = [("kernel", "regs", "smem", "stack", "params", "layout", "maxthr", "regcap", "bar",
             "code")]
    for k in sorted(report.kernels.values(), key=lambda k: k.name):
        layout = " ".join(f"{p.offset}:{p.size}" for p in k.params) or "-"
        regcap = "-" if k.max_registers in (None, 255) else str(k.max_registers)
        rows.append((k.name, str(k.registers), str(k.static_shared_bytes),
                     str(k.stack_frame_bytes) + ("!" if k.uses_local_memory else ""),
                     "-" if k.param_bytes is None else str(k.param_bytes), layout,
                     _dims(k.max_threads or k.required_threads), regcap, str(k.barriers),
                     str(k.code_bytes)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  " + "  ".join(cells).rstrip())
    if report.sass_error:
        lines.append(f"  SASS: {report.sass_error}")
    elif report.sass_tool:
        lines.append(f"  SASS instruction mix ({report.sass_tool}):")
        for k in sorted(report.kernels.values(), key=lambda k: k.name):
            if k.sass_mix is None:
                continue
            total = sum(k.sass_mix.values())
            shown = ", ".join(f"{op} {k.sass_mix[op]}" for op in SASS_HIGHLIGHT
                              if k.sass_mix.get(op))
            lines.append(f"    {k.name}: {total} instructions; {shown or 'no highlighted opcode'}")
    return "\n".join(lines)


def report_to_json(report: CubinReport) -> dict:
    out = asdict(report)
    for k in out["kernels"].values():
        k["uses_local_memory"] = k["stack_frame_bytes"] > 0 or k["min_stack_bytes"] > 0
    out["arch_consistent"] = report.arch_consistent
    return out


def collect_cubins(paths, cubin_dir, module=None, arch=None) -> list:
    files = [Path(p) for p in paths] if paths else sorted(Path(cubin_dir).glob("*.cubin"))
    chosen = []
    for f in files:
        m = CUBIN_NAME.match(f.name)
        if module and (not m or m["module"] != module):
            continue
        if arch and (not m or m["arch"] != arch.removeprefix("sm_")):
            continue
        chosen.append(f)
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="specdec-inspect",
        description="Per-kernel resources of specdec_lib's cubins, read from the ELF "
                    "(registers, shared memory, stack/spills, parameter block, launch bounds).")
    parser.add_argument("cubins", nargs="*", help="cubin files (default: every cubin in --dir)")
    parser.add_argument("--dir", default=str(CUBIN_DIR),
                        help="cubin folder (default: the package's)")
    parser.add_argument("--module", help="only this kernel-table module")
    parser.add_argument("--arch", help="only this target, e.g. 90 or sm_90a")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the build is incomplete or disagrees with the kernel "
                             "table / launchers")
    parser.add_argument("--no-sass", action="store_true",
                        help="skip the SASS instruction mix even when cuobjdump/nvdisasm exist")
    args = parser.parse_args(argv)

    files = collect_cubins(args.cubins, args.dir, args.module, args.arch)
    reports, errors = [], []
    for f in files:
        try:
            reports.append(inspect_cubin(f, sass=not args.no_sass))
        except (OSError, CubinFormatError) as err:
            errors.append(f"{f}: {err}")
    problems = None
    if args.check:
        by_name = {Path(r.path).name: r for r in reports if Path(r.path).parent == Path(args.dir)}
        problems = errors + check_build(args.dir, reports=by_name)

    if args.json:
        out = {"cubin_dir": args.dir, "cubins": [report_to_json(r) for r in reports],
               "errors": errors}
        if problems is not None:
            out["problems"] = problems
        print(json.dumps(out, indent=1))
    else:
        if not files:
            hint = "" if args.cubins else " (is the package built?)"
            print(f"no cubins in {args.dir}{hint}")
        for r in reports:
            print(format_report(r))
            print()
        for e in errors:
            print(f"error: {e}")
        if problems is not None:
            for p in problems:
                print(f"FAIL {p}")
            n = sum(len(r.kernels) for r in reports)
            print(f"inspect --check: {len(problems)} problem(s)" if problems else
                  f"inspect --check: OK ({len(reports)} cubins, {n} kernels)")
    if problems:
        return 1
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
