"""Launch recording on the CPU: what the GPU ops' host code would launch, with no GPU.

Inside ``LaunchRecorder(profile)`` (a context manager):

* device arrays are ``FakeArray`` objects (``rec.array`` / ``rec.view``): they speak
  ``__cuda_array_interface__`` (bfloat16 as ``<V2``), sit at distinct, 256-byte aligned fake
  addresses and are backed by numpy arrays, so the ops' ``check_indices`` host copies read
  the values a test put there;
* ``specdec_lib.runtime``'s driver is a ``FakeDriver`` that answers what the ops ask
  (pointer_device, ensure_context, stream_is_capturing, memcpy_dtoh, the device attributes
  of ``PROFILES[profile]``); anything else it is asked raises and is listed in
  ``rec.unexpected``. ``runtime.device_props`` / ``sm_count`` / ``arch_family`` run
  unpatched over it, and every ``SPECDEC_*`` environment variable is cleared (so no forced
  arch) except those a case sets;
* ``runtime.kernel`` returns ``FakeKernel`` objects (after checking the symbol against the
  kernel table), whose attribute calls (set_max_dynamic_smem, prefer_max_shared, ...) are
  recorded;
* every ``launch*`` function of the Cython launcher modules is replaced by a recorder that
  binds the call to the launcher's signature and stores each argument, with kernels as
  ``"kernel:module/symbol"`` and pointers as ``"@array+byte_offset"``.

``rec.result()`` is the JSON-able record of what ran: launches (in order), host copies
(sorted), kernel attribute calls (in order). Module-level caches of specdec_lib are emptied
on entry and restored on exit, so every recorder starts from a cold process state and a
profile's SM count or code family never leaks into the next.
"""
from __future__ import annotations

import collections
import functools
import importlib
import inspect
import os
import pkgutil
import sys

import numpy as np

LAUNCHER_MODULES = ("_copy", "_attention", "_gdn", "_conv", "_sampling", "_sequence", "_draft",
                    "_layers")

# device profiles: what the fake driver reports for device 0
PROFILES = {
    "h200": {"name": "NVIDIA H200 (fake)", "cc": (9, 0), "sm_count": 132,
             "l2_bytes": 60 * 2**20, "smem_optin": 232448, "max_threads_per_sm": 2048},
    "a100": {"name": "NVIDIA A100 (fake)", "cc": (8, 0), "sm_count": 108,
             "l2_bytes": 40 * 2**20, "smem_optin": 166912, "max_threads_per_sm": 2048},
}

_CAI_TYPESTR = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "int32": "<i4",
                "int64": "<i8", "int16": "<i2", "int8": "|i1", "uint8": "|u1", "uint16": "<u2",
                "uint32": "<u4", "uint64": "<u8", "bool": "|b1", "bfloat16": "<V2"}
_HOST = {"float32": np.float32, "float16": np.float16, "float64": np.float64,
         "int32": np.int32, "int64": np.int64, "int16": np.int16, "int8": np.int8,
         "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
         "bool": np.bool_, "bfloat16": np.uint16}

_FAKE_BASE = 1 << 44          # fake device addresses live in [2^44, 2^45)
_FAKE_END = 1 << 45
_GAP = 4096                   # bytes between two fake buffers
_CACHE_WORDS = ("cache", "occupancy", "carveout", "memo")


class LaunchRecordError(AssertionError):
    pass


class _Buffer:
    """One fake device allocation: a numpy byte buffer at a fake address."""

    def __init__(self, name, ptr, nbytes):
        self.name, self.ptr, self.nbytes = name, ptr, nbytes
        self.data = np.zeros(max(nbytes, 1), dtype=np.uint8)


class FakeArray:
    """A device array stand-in: ``__cuda_array_interface__`` over a fake pointer."""

    def __init__(self, buf, dtype, shape, strides, offset_bytes):
        self.buffer = buf
        self.dtype = dtype
        self.shape = tuple(int(s) for s in shape)
        self.itemsize = np.dtype(_HOST[dtype]).itemsize
        self.strides = tuple(int(s) for s in strides)          # elements
        self.offset = int(offset_bytes)
        self.ptr = buf.ptr + self.offset
        lo = hi = 0
        for n, st in zip(self.shape, self.strides):
            if n == 0:
                lo = hi = 0
                break
            if st < 0:
                lo += (n - 1) * st
            else:
                hi += (n - 1) * st
        if self.shape and 0 not in self.shape:
            if self.offset + lo * self.itemsize < 0 or \
                    self.offset + (hi + 1) * self.itemsize > buf.nbytes:
                raise LaunchRecordError(f"view of {buf.name}: outside its {buf.nbytes} bytes")

    @property
    def name(self):
        return self.buffer.name

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": _CAI_TYPESTR[self.dtype],
                "data": (self.ptr, False),
                "strides": tuple(s * self.itemsize for s in self.strides), "version": 3,
                "stream": None}

    def host(self):
        """The numpy view of the backing bytes this array covers (bf16: uint16 bits)."""
        base = self.buffer.data.view(_HOST[self.dtype]) if self.buffer.nbytes else \
            np.zeros(0, _HOST[self.dtype])
        return np.lib.stride_tricks.as_strided(
            base[self.offset // self.itemsize:], self.shape,
            tuple(s * self.itemsize for s in self.strides))

    def __repr__(self):
        return f"FakeArray({self.name}+{self.offset}: {self.dtype}{list(self.shape)})"


def _c_strides(shape):
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(st))


class FakeKernel:
    """What ``runtime.kernel`` returns inside a recorder: the attributes the ops and the
    launchers read, attribute-setting calls recorded in ``rec.kernel_calls``."""

    def __init__(self, rec, module, symbol, device):
        self._rec = rec
        self.module, self.name, self.device = module, symbol, device
        self.max_dynamic_smem = 48 * 1024
        self.func = 0

    def __repr__(self):
        return f"<FakeKernel {self.module}:{self.name} on device {self.device}>"

    def _note(self, what, *args):
        self._rec.kernel_calls.append([f"{self.module}/{self.name}", what, *args])

    def set_max_dynamic_smem(self, nbytes):
        self._note("set_max_dynamic_smem", int(nbytes))
        if nbytes > self.max_dynamic_smem:
            self.max_dynamic_smem = int(nbytes)

    def prefer_max_shared(self):
        self._note("prefer_max_shared")

    def allow_large_clusters(self):
        self._note("allow_large_clusters")

    def occupancy(self, block, dynamic_smem=0):
        self._rec.driver_calls["Kernel.occupancy"] += 1
        return max(1, min(32, self._rec.profile["max_threads_per_sm"] // max(int(block), 1)))

    def max_active_clusters(self, grid, block, dynamic_smem, cluster):
        self._rec.driver_calls["Kernel.max_active_clusters"] += 1
        return max(1, self._rec.profile["sm_count"] // max(int(cluster), 1))

    def attributes(self):
        self._rec.driver_calls["Kernel.attributes"] += 1
        return {"registers": 64, "static_smem": 0, "local_bytes": 0, "max_threads": 1024,
                "ptx_version": 90, "binary_version": 90}


class FakeDriver:
    """Stands in for ``specdec_lib._driver``; counts what it is asked in ``rec.driver_calls``."""

    def __init__(self, rec, real):
        self._rec = rec
        for name in dir(real):
            if name.startswith("ATTR_"):
                setattr(self, name, getattr(real, name))
        p = rec.profile
        self._attrs = {}
        for key, value in (("ATTR_CC_MAJOR", p["cc"][0]), ("ATTR_CC_MINOR", p["cc"][1]),
                           ("ATTR_SM_COUNT", p["sm_count"]), ("ATTR_L2_BYTES", p["l2_bytes"]),
                           ("ATTR_SMEM_OPTIN", p["smem_optin"])):
            if hasattr(self, key):
                self._attrs[getattr(self, key)] = value

    def _count(self, name):
        self._rec.driver_calls[name] += 1

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        self._rec.unexpected.append(f"driver.{name}")
        raise LaunchRecordError(f"fake driver: the op asked for driver.{name}, which the "
                                "launch recorder does not answer")

    # --- what the ops ask
    def init(self):
        self._count("init")

    def device_count(self):
        self._count("device_count")
        return 1

    def device_name(self, device):
        self._count("device_name")
        return self._rec.profile["name"]

    def device_attribute(self, device, attr):
        self._count("device_attribute")
        if attr not in self._attrs:
            self._rec.unexpected.append(f"driver.device_attribute({attr})")
            raise LaunchRecordError(f"fake driver: device attribute {attr} not known")
        return self._attrs[attr]

    def driver_version(self):
        self._count("driver_version")
        return 12080

    def ensure_context(self, device):
        self._count("ensure_context")
        if device != 0:
            raise LaunchRecordError(f"fake driver: ensure_context({device}): only device 0")

    def current_context_device(self):
        self._count("current_context_device")
        return 0

    def pointer_device(self, ptr):
        self._count("pointer_device")
        self._rec.locate(int(ptr))          # raises for a pointer no fake array holds
        return 0

    def stream_is_capturing(self, stream):
        self._count("stream_is_capturing")
        return False

    def ctx_synchronize(self):
        self._count("ctx_synchronize")

    def stream_synchronize(self, stream=0):
        self._count("stream_synchronize")

    def memcpy_dtoh(self, dst, src, stream=0):
        self._count("memcpy_dtoh")
        dst = np.asarray(dst)
        n = dst.nbytes
        buf, off = self._rec.locate(int(src))
        if off + n > buf.nbytes:
            raise LaunchRecordError(f"memcpy_dtoh: {n} bytes at {buf.name}+{off} run past its "
                                    f"{buf.nbytes} bytes")
        dst.reshape(-1).view(np.uint8)[:] = buf.data[off:off + n]
        self._rec.host_copies.append(f"dtoh {self._rec.pointer_name(int(src))} {n}B "
                                     f"stream={int(stream)}")

    def memcpy_htod(self, dst, src, stream=0):
        self._count("memcpy_htod")
        src = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        buf, off = self._rec.locate(int(dst))
        buf.data[off:off + src.nbytes] = src
        self._rec.host_copies.append(f"htod {self._rec.pointer_name(int(dst))} {src.nbytes}B "
                                     f"stream={int(stream)}")

    def memcpy_dtod(self, dst, src, nbytes, stream=0):
        self._count("memcpy_dtod")
        db, do = self._rec.locate(int(dst))
        sb, so = self._rec.locate(int(src))
        db.data[do:do + nbytes] = sb.data[so:so + nbytes]
        self._rec.host_copies.append(f"dtod {self._rec.pointer_name(int(dst))} <- "
                                     f"{self._rec.pointer_name(int(src))} {int(nbytes)}B "
                                     f"stream={int(stream)}")

    def memset_d8(self, dst, value, nbytes, stream=0):
        self._count("memset_d8")
        buf, off = self._rec.locate(int(dst))
        buf.data[off:off + nbytes] = value & 0xFF
        self._rec.host_copies.append(f"memset {self._rec.pointer_name(int(dst))} "
                                     f"{int(nbytes)}B={value & 0xFF} stream={int(stream)}")

    def mem_alloc(self, nbytes):
        self._count("mem_alloc")
        a = self._rec.array(f"alloc{self._rec.driver_calls['mem_alloc']}", (int(nbytes),), "uint8")
        self._rec.host_copies.append(f"alloc {a.name} {int(nbytes)}B")
        return a.ptr

    def mem_free(self, ptr):
        self._count("mem_free")


def _changed(val, saved):
    """Whether a module-level dict/set differs from its snapshot (dict values by identity:
    they may be arrays, whose == is elementwise)."""
    if len(val) != len(saved):
        return True
    if isinstance(val, dict):
        return any(k not in saved or v is not saved[k] for k, v in val.items())
    return val != saved


def _specdec_modules():
    return [m for n, m in list(sys.modules.items())
            if m is not None and (n == "specdec_lib" or n.startswith("specdec_lib."))]


@functools.lru_cache(maxsize=1)
def _preimport():
    """Import every pure-Python module the ops may reach lazily (ops, reference, any
    contract package), so that no module first imported inside a recorder keeps state."""
    import specdec_lib
    import specdec_lib.ops  # noqa: F401
    import specdec_lib.runtime  # noqa: F401
    for pkg in ("specdec_lib.ops", "specdec_lib.reference", "specdec_lib.contract"):
        try:
            mod = importlib.import_module(pkg)
        except ImportError:
            continue
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), pkg + "."):
            importlib.import_module(info.name)
    for name in LAUNCHER_MODULES:
        importlib.import_module(f"specdec_lib.{name}")
    return True


class LaunchRecorder:
    """Context manager: fake arrays, fake driver, recorded launches (see the module doc)."""

    def __init__(self, profile="h200", env=None):
        if profile not in PROFILES:
            raise ValueError(f"profile: one of {sorted(PROFILES)}")
        self.profile_name = profile
        self.profile = PROFILES[profile]
        self.env = dict(env or {})
        self.launches = []
        self.host_copies = []
        self.kernel_calls = []
        self.driver_calls = collections.Counter()
        self.unexpected = []
        self._buffers = []          # sorted by ptr (allocation order)
        self._next = _FAKE_BASE
        self._undo = []
        self._kernels = {}

    # ------------------------------------------------------------ fake arrays
    def array(self, name, shape, dtype, values=None):
        """A C-contiguous fake device array named ``name`` (unique); ``values`` fill it
        (bfloat16: uint16 bits, or floats that are rounded)."""
        if any(b.name == name for b in self._buffers):
            raise LaunchRecordError(f"array name {name!r} used twice")
        shape = tuple(int(s) for s in shape)
        isz = np.dtype(_HOST[dtype]).itemsize
        nbytes = int(np.prod(shape, dtype=np.int64)) * isz
        buf = _Buffer(name, self._next, nbytes)
        self._next += -(-(nbytes + _GAP) // 256) * 256
        if self._next >= _FAKE_END:
            raise LaunchRecordError("fake address space exhausted")
        self._buffers.append(buf)
        a = FakeArray(buf, dtype, shape, _c_strides(shape), 0)
        if values is not None:
            v = np.asarray(values)
            if dtype == "bfloat16" and v.dtype != np.uint16:
                from specdec_lib.dtypes import f32_to_bf16_bits
                v = f32_to_bf16_bits(v)
            a.host()[...] = np.broadcast_to(v.astype(_HOST[dtype]), shape)
        return a

    def view(self, base, shape, strides=None, offset=0, dtype=None):
        """A view of ``base``'s buffer: ``offset`` elements (of ``dtype``, default base's)
        past base's start, ``strides`` in elements (default C order)."""
        dtype = dtype or base.dtype
        isz = np.dtype(_HOST[dtype]).itemsize
        strides = _c_strides(shape) if strides is None else strides
        return FakeArray(base.buffer, dtype, shape, strides, base.offset + offset * isz)

    def locate(self, ptr):
        """(buffer, byte offset) of a fake pointer; a pointer past a buffer's end by 0 bytes
        counts as that buffer's."""
        for buf in self._buffers:
            if buf.ptr <= ptr <= buf.ptr + buf.nbytes:
                return buf, ptr - buf.ptr
        raise LaunchRecordError(f"pointer {ptr:#x} is in no fake array")

    def pointer_name(self, ptr):
        buf, off = self.locate(ptr)
        return f"@{buf.name}+{off}"

    # ------------------------------------------------------------ encoding
    def encode(self, v):
        if isinstance(v, FakeKernel):
            return f"kernel:{v.module}/{v.name}"
        if isinstance(v, FakeArray):
            return f"array:{self.pointer_name(v.ptr)}"
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, (bool, np.bool_)):
            return int(v)
        if isinstance(v, (int, np.integer)):
            v = int(v)
            if _FAKE_BASE <= v < _FAKE_END:
                return self.pointer_name(v)
            return v
        if isinstance(v, (float, np.floating)):
            return float(v)
        if isinstance(v, (tuple, list)):
            return [self.encode(x) for x in v]
        if isinstance(v, dict):
            return {str(k): self.encode(x) for k, x in v.items()}
        raise LaunchRecordError(f"cannot record a launch argument of type {type(v).__name__}")

    def _recorder(self, module, fname, orig):
        sig = inspect.signature(orig)

        def record(*args, **kwargs):
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise LaunchRecordError(f"{module}.{fname}: {e}") from None
            bound.apply_defaults()
            self.launches.append({"launcher": f"{module}.{fname}",
                                  "args": {k: self.encode(v) for k, v in bound.arguments.items()}})
        record.__name__ = fname
        return record

    def _kernel(self, module, symbol, device=0):
        from specdec_lib import _kernels, runtime
        (runtime._DRIVER or runtime.driver()).ensure_context(device)
        if module not in _kernels.MODULES or symbol not in _kernels.MODULES[module].kernels:
            raise KeyError(f"kernel {symbol!r} is not in the table of module {module!r}")
        key = (device, module, symbol)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = FakeKernel(self, module, symbol, device)
        return k

    def result(self):
        return {"launches": self.launches, "host_copies": sorted(self.host_copies),
                "kernel_calls": self.kernel_calls}

    # ------------------------------------------------------------ patching
    _MISSING = object()

    def _set(self, module, name, value):
        self._undo.append((module, name, vars(module).get(name, self._MISSING)))
        setattr(module, name, value)

    def __enter__(self):
        _preimport()
        from specdec_lib import _driver as real_driver
        from specdec_lib import runtime
        try:
            # env: no SPECDEC_* setting of the caller's shell, then the case's
            self._env_saved = {k: v for k, v in os.environ.items() if k.startswith("SPECDEC_")}
            for k in self._env_saved:
                del os.environ[k]
            os.environ.update(self.env)
            mods = _specdec_modules()
            self._modules_at_entry = {id(m) for m in mods}
            # module-level state: snapshot every dict/set, empty the caches among them
            self._state = []
            for m in mods:
                for name, val in list(vars(m).items()):
                    if type(val) in (dict, set):
                        self._state.append((val, val.copy()))
                        if any(w in name.lower() for w in _CACHE_WORDS):
                            val.clear()
            self._lru_clear(mods)
            # patches: the originals, wherever a module holds a reference to them
            originals = {}
            for mname in LAUNCHER_MODULES:
                mod = sys.modules[f"specdec_lib.{mname}"]
                for fname in dir(mod):
                    if fname.startswith("launch") and callable(getattr(mod, fname)):
                        orig = getattr(mod, fname)
                        originals[id(orig)] = (orig, self._recorder(mname, fname, orig))
            orig_kernel = runtime.kernel
            originals[id(orig_kernel)] = (orig_kernel, self._kernel)
            # id -> (replacement, original); the replacement is held so that its id stays its own
            self._replacements = {id(new): (new, old) for old, new in originals.values()}
            fake = FakeDriver(self, real_driver)
            self._replacements[id(fake)] = (fake, real_driver)
            self._set(runtime, "_DRIVER", fake)
            for m in mods:
                for name, val in list(vars(m).items()):
                    hit = originals.get(id(val))
                    if hit is not None and hit[0] is val:
                        self._set(m, name, hit[1])
                    elif val is real_driver and m is not runtime and m.__name__ != "specdec_lib":
                        self._set(m, name, fake)
        except BaseException:
            self._restore()
            raise
        return self

    @staticmethod
    def _lru_clear(mods):
        for m in mods:
            for val in list(vars(m).values()):
                if callable(getattr(val, "cache_clear", None)) and \
                        getattr(val, "__module__", "").startswith("specdec_lib"):
                    val.cache_clear()

    def _restore(self):
        while self._undo:
            obj, name, old = self._undo.pop()
            if old is self._MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        for val, saved in getattr(self, "_state", ()):
            if _changed(val, saved):
                val.clear()
                val.update(saved)
        # a module first imported inside the recorder: no fake may stay in it
        new = [m for m in _specdec_modules()
               if id(m) not in getattr(self, "_modules_at_entry", ())]
        reps = getattr(self, "_replacements", {})
        for m in new:
            for name, val in list(vars(m).items()):
                if id(val) in reps and reps[id(val)][0] is val:
                    setattr(m, name, reps[id(val)][1])
                elif type(val) in (dict, set) and any(w in name.lower() for w in _CACHE_WORDS):
                    val.clear()
        self._lru_clear(_specdec_modules())
        for k in [k for k in os.environ if k.startswith("SPECDEC_")]:
            del os.environ[k]
        os.environ.update(getattr(self, "_env_saved", {}))

    def __exit__(self, *exc):
        self._restore()
        return False


def record_call(profile, build, env=None):
    """Run ``build(rec)`` inside a recorder; ``build`` makes the arrays and calls the op, and
    returns what the op returned. Returns rec.result() plus the encoded return value."""
    with LaunchRecorder(profile, env) as rec:
        ret = build(rec)
        out = rec.result()
        out["returns"] = rec.encode(_plain(ret))
        if rec.unexpected:
            raise LaunchRecordError(f"unanswered driver requests: {rec.unexpected}")
    return out, rec


def _plain(v):
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v
