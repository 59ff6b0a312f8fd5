"""Runtime: which image of each kernel module runs on which device, and the handles.

Loader choice per (module, device): exact cubin (sm_90a first on cc 9.0 for modules
that ship one) -> same-major lower-minor cubin (sm_86 runs sm_80) -> the PTX of the
newest family not newer than the device (the driver JIT-compiles it; that is also
how GPUs newer than sm_90 run). ``SPECDEC_FORCE_ARCH=75|80|90`` forces that family's
PTX, which is how the Turing and Ampere code paths are tested on a Hopper GPU.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from . import _kernels
from .errors import ExtensionMissing

__all__ = ["CUBIN_DIR", "ExtensionMissing", "info", "gpu_unavailable_reason", "forced_family",
           "arch_family", "choose_image", "device_props", "sm_count", "resident_ctas", "kernel",
           "driver"]

CUBIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cubin")
_FAMILY_CC = {"75": (7, 5), "80": (8, 0), "90": (9, 0), "90a": (9, 0)}

log = logging.getLogger(__name__)
_lock = threading.Lock()
_kernel_cache: dict = {}      # (device, module, symbol) -> Kernel
_module_cache: dict = {}      # (device, module) -> (Module, choice dict)
_device_cache: dict = {}      # device -> dict of properties


_DRIVER = None


def driver() -> Any:
    """The compiled driver layer (specdec_lib._driver); a clear error if it was not built."""
    global _DRIVER
    if _DRIVER is None:
        try:
            from . import _driver
        except ImportError as e:
            raise ExtensionMissing(
                "specdec_lib's compiled extension is not built/installed "
                f"({e}); install with `pip install -e .`") from e
        _DRIVER = _driver
    return _DRIVER


def gpu_unavailable_reason() -> str | None:
    """None when a CUDA GPU can run specdec_lib's kernels, else why not (a sentence)."""
    try:
        drv = driver()
    except ExtensionMissing as e:
        return str(e)
    try:
        if drv.device_count() < 1:
            return "no CUDA device"
    except Exception as e:   # CudaUnavailable, or a driver that cannot be loaded
        return f"no usable CUDA driver: {e}"
    if not os.path.isdir(CUBIN_DIR):
        return f"no kernel images in {CUBIN_DIR}"
    return None


def forced_family() -> str | None:
    """The family SPECDEC_FORCE_ARCH forces ('75', '80', '90'), or None."""
    v = os.environ.get("SPECDEC_FORCE_ARCH", "").strip().lower().replace("sm_", "").replace("compute_", "")
    if not v:
        return None
    if v not in _kernels.PTX_FAMILIES:
        raise ValueError(f"SPECDEC_FORCE_ARCH={v!r}: expected one of {', '.join(_kernels.PTX_FAMILIES)}")
    return v


def device_props(device: int) -> dict[str, Any]:
    """Name, compute capability, SM count, L2 bytes and opt-in shared memory of ``device``."""
    p = _device_cache.get(device)
    if p is None:
        drv = driver()
        p = {
            "name": drv.device_name(device),
            "cc": (drv.device_attribute(device, drv.ATTR_CC_MAJOR),
                   drv.device_attribute(device, drv.ATTR_CC_MINOR)),
            "sm_count": drv.device_attribute(device, drv.ATTR_SM_COUNT),
            "l2_bytes": drv.device_attribute(device, drv.ATTR_L2_BYTES),
            "smem_optin": drv.device_attribute(device, drv.ATTR_SMEM_OPTIN),
        }
        _device_cache[device] = p
    return p


def sm_count(device: int = 0) -> int:
    """Streaming multiprocessors of ``device``."""
    return device_props(device)["sm_count"]


def arch_family(device: int = 0) -> int:
    """The code path kernels take on ``device``: 75, 80 or 90 (forced PTX counts)."""
    f = forced_family()
    if f is not None:
        return int(f)
    cc = device_props(device)["cc"]
    if cc < (7, 5):
        raise RuntimeError(f"device {device} has compute capability {cc[0]}.{cc[1]}; "
                           "specdec_lib needs sm_75 (Turing) or newer")
    return 75 if cc < (8, 0) else 80 if cc < (9, 0) else 90


def choose_image(module: str, device: int = 0) -> dict[str, str]:
    """Which file of ``module`` loads on ``device``: {'kind','arch','path','reason'}."""
    mod = _kernels.MODULES[module]
    forced = forced_family()
    if forced is not None:
        path = os.path.join(CUBIN_DIR, f"{module}.compute_{forced}.ptx")
        return {"kind": "ptx", "arch": f"compute_{forced}", "path": path,
                "reason": f"SPECDEC_FORCE_ARCH={forced}"}
    cc = device_props(device)["cc"]
    cands = []
    if cc == (9, 0) and mod.sm90a:
        cands.append(("90a", "exact cubin (arch-specific)"))
    exact = f"{cc[0]}{cc[1]}"
    cands.append((exact, "exact cubin"))
    lower = sorted((a for a in _kernels.CUBIN_ARCHS
                    if int(a[:-1]) == cc[0] and int(a[-1]) < cc[1]), reverse=True)
    cands += [(a, f"same-major lower-minor cubin for sm_{exact}") for a in lower]
    for arch, why in cands:
        path = os.path.join(CUBIN_DIR, f"{module}.sm_{arch}.cubin")
        if os.path.isfile(path):
            return {"kind": "cubin", "arch": f"sm_{arch}", "path": path, "reason": why}
    fams = sorted((f for f in mod.ptx_families() if f != "90a" and _FAMILY_CC[f] <= cc),
                  key=lambda f: _FAMILY_CC[f], reverse=True)
    for f in fams:
        path = os.path.join(CUBIN_DIR, f"{module}.compute_{f}.ptx")
        if os.path.isfile(path):
            return {"kind": "ptx", "arch": f"compute_{f}", "path": path,
                    "reason": f"no cubin for sm_{exact}: JIT from PTX"}
    raise FileNotFoundError(f"no image of kernel module {module!r} runs on device {device} "
                            f"(sm_{exact}); looked in {CUBIN_DIR}")


def _load(module: str, device: int):
    key = (device, module)
    hit = _module_cache.get(key)
    if hit is None:
        choice = choose_image(module, device)
        with open(choice["path"], "rb") as f:
            image = f.read()
        if choice["kind"] == "ptx":
            image += b"\0"
        m = driver().load_module(image, module, device)
        log.info("kernel module %s on device %d: %s %s (%s)", module, device, choice["kind"],
                 choice["arch"], choice["reason"])
        hit = (m, choice)
        _module_cache[key] = hit
    return hit


PDL_ENV = "SPECDEC_PDL"   # "0": every launch the plain way (A/B timing); read at kernel load


def pdl_enabled(device: int = 0) -> bool:
    """Whether launches on ``device`` use programmatic dependent launch: sm_90 code only
    (the compute_75 / compute_80 code has no griddepcontrol.wait), unless SPECDEC_PDL=0."""
    return arch_family(device) >= 90 and os.environ.get(PDL_ENV, "1").strip() != "0"


# Kernels launched the plain way even where PDL is on: a comma list of kernel-name prefixes in
# $SPECDEC_PDL_OFF (empty: none), else PDL_OFF_DEFAULT; read at kernel load. A kernel whose
# CTAs, placed early beside its predecessor's, finish later than a plain launch would (the
# round timeline's per-op advance with PDL on against off) goes here. gdn_verify: 6.27 us a
# launch in round_b1 early, 4.96 plain; the round 946.0 -> 913.6 us (H200, s22; plain
# gdn_verify + verify_attention 917.3, + conv1d_verify 920.2). Alone in a graph of its own
# calls it loses the overlap (3.47 -> 4.24 us a call): the round is what a model runs.
PDL_OFF_ENV = "SPECDEC_PDL_OFF"
PDL_OFF_DEFAULT: tuple[str, ...] = ("gdn_verify",)


def pdl_off_prefixes() -> tuple[str, ...]:
    """The kernel-name prefixes launched without PDL ($SPECDEC_PDL_OFF, else the default)."""
    env = os.environ.get(PDL_OFF_ENV)
    if env is None:
        return PDL_OFF_DEFAULT
    return tuple(s.strip() for s in env.split(",") if s.strip())


def kernel_pdl(symbol: str, device: int = 0) -> bool:
    """Whether kernel ``symbol`` goes out with programmatic serialization on ``device``."""
    return pdl_enabled(device) and not symbol.startswith(pdl_off_prefixes())


def kernel(module: str, symbol: str, device: int = 0) -> Any:
    """The loaded kernel ``symbol`` of ``module`` on ``device`` (cached; context made current)."""
    (_DRIVER or driver()).ensure_context(device)
    k = _kernel_cache.get((device, module, symbol))
    if k is None:
        with _lock:
            if symbol not in _kernels.MODULES[module].kernels:
                raise KeyError(f"kernel {symbol!r} is not in the table of module {module!r}")
            k = _load(module, device)[0].get_kernel(symbol)
            k.pdl = kernel_pdl(symbol, device)
            _kernel_cache[(device, module, symbol)] = k
    return k


_occupancy_cache: dict = {}


def resident_ctas(kern: Any, block: int, device: int = 0) -> int:
    """CTAs of ``block`` threads of ``kern`` that fit on the whole GPU at once (the driver's
    occupancy count times the SMs; cached, it is a driver query)."""
    key = (kern.module, kern.name, device, block)
    n = _occupancy_cache.get(key)
    if n is None:
        n = _occupancy_cache[key] = max(1, kern.occupancy(block)) * sm_count(device)
    return n


def info(device: int = 0, load: bool = False) -> dict[str, Any]:
    """What runs where: the package version, driver, device, and for each kernel module the
    chosen image (``python -m specdec_lib info`` prints it as JSON).

    ``load=True`` also loads every module (JIT-compiling PTX where chosen).
    """
    from . import __version__
    out = {"version": __version__, "cubin_dir": CUBIN_DIR, "forced_arch": forced_family()}
    reason = gpu_unavailable_reason()
    if reason:
        out["gpu"] = None
        out["reason"] = reason
        return out
    drv = driver()
    props = device_props(device)
    out["driver_version"] = drv.driver_version()
    out["gpu"] = dict(props, device=device, family=arch_family(device))
    mods = {}
    for name in _kernels.MODULES:
        try:
            choice = dict(_load(name, device)[1]) if load else choose_image(name, device)
        except Exception as e:
            choice = {"error": str(e)}
        mods[name] = choice
    out["modules"] = mods
    return out
