# cython: language_level=3
"""Argument checks shared by every op: they run before any launch and name the argument.

Compiled (it runs for every array argument of every op call, and host overhead per op
must stay in the single-digit microseconds); ``specdec_lib._validate`` re-exports it.
``DeviceArg`` accepts anything a user may hold on the GPU: our DeviceArray, torch
tensors (read through their attributes: faster than either protocol), objects with
``__cuda_array_interface__`` (cupy, numba, cuda.core views) and DLPack producers.
"""
import ctypes

from specdec_lib import dtypes as _dt

cdef dict _DTYPES = _dt.DTYPES

_TORCH_DTYPES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
                 "torch.float64": "float64", "torch.int32": "int32", "torch.int64": "int64",
                 "torch.int16": "int16", "torch.int8": "int8", "torch.uint8": "uint8",
                 "torch.float8_e4m3fn": "fp8_e4m3",
                 "torch.bool": "bool", "torch.uint16": "uint16", "torch.uint32": "uint32",
                 "torch.uint64": "uint64"}
_CAI_TYPES = {"<f4": "float32", "<f2": "float16", "<f8": "float64", "<i4": "int32", "<i8": "int64",
              "<i2": "int16", "|i1": "int8", "|u1": "uint8", "<u2": "uint16", "<u4": "uint32",
              "<u8": "uint64", "|b1": "bool", "<V2": "bfloat16"}
# DLPack (type code, bits) -> name
_DL_TYPES = {(2, 32): "float32", (2, 16): "float16", (2, 64): "float64", (4, 16): "bfloat16",
             (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
             (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
             (6, 8): "bool"}
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _c_strides(shape):
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(st))


cdef class DeviceArg:
    """A validated view of one device array argument: ptr, shape, strides (elements),
    dtype (canonical name), itemsize, device."""

    cdef public str name
    cdef public object obj
    cdef public object ptr
    cdef public tuple shape
    cdef public tuple strides
    cdef public object dtype
    cdef public int itemsize
    cdef public object device
    cdef public bint by_kind     # numpy arrays (the reference path): dtypes checked by kind
    cdef object _capsule

    def __init__(self, name, obj, dtype=None, ndim=None, shape=None, device=None,
                 contiguous=False, optional=False):
        # This runs for every array argument of every op call: keep it lean (host overhead).
        self.name = name
        self.obj = obj
        self._capsule = None
        if type(obj) is _device_array_type():
            self.ptr, self.shape, self.strides = obj.ptr, obj.shape, obj.strides
            self.dtype, self.device, self.itemsize = obj.dtype, obj.device, obj.itemsize
        elif obj is None:
            if optional:
                self.ptr, self.shape, self.strides, self.dtype, self.itemsize, self.device = \
                    0, (), (), None, 0, device
                return
            raise TypeError(f"{name}: a device array is required, got None")
        else:
            self._read(obj)
            self.itemsize = _DTYPES[self.dtype][1]
        if dtype is not None and self.dtype != dtype and (isinstance(dtype, str) or
                                                          self.dtype not in dtype):
            allowed = (dtype,) if isinstance(dtype, str) else tuple(dtype)
            if not (self.by_kind and _same_kind(self.dtype, allowed)):
                raise TypeError(f"{name}: dtype must be {' or '.join(allowed)}, got {self.dtype}")
        if ndim is not None and len(self.shape) != ndim:
            raise ValueError(f"{name}: expected {ndim} dimensions, got shape {self.shape}")
        if shape is not None:
            check_shape(name, self.shape, shape)
        if device is not None and self.device != device:
            raise ValueError(f"{name}: on device {self.device}, but the other arguments are on "
                             f"device {device}")
        if contiguous and not self.contiguous:
            raise ValueError(f"{name}: must be C-contiguous (shape {self.shape}, "
                             f"strides {self.strides} elements)")

    def _read(self, obj):
        if isinstance(obj, _device_array_type()):   # a subclass
            self.ptr, self.shape, self.strides = obj.ptr, obj.shape, obj.strides
            self.dtype, self.device = obj.dtype, obj.device
        elif type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
            if obj.device.type != "cuda":
                raise TypeError(f"{self.name}: must be on a CUDA device, got a tensor on {obj.device}")
            dt = _TORCH_DTYPES.get(str(obj.dtype))
            if dt is None:
                raise TypeError(f"{self.name}: unsupported dtype {obj.dtype}")
            self.ptr, self.shape, self.strides = obj.data_ptr(), tuple(obj.shape), tuple(obj.stride())
            self.dtype, self.device = dt, obj.device.index
        elif hasattr(obj, "__cuda_array_interface__"):
            cai = obj.__cuda_array_interface__
            dt = _CAI_TYPES.get(cai["typestr"])
            if dt is None:
                raise TypeError(f"{self.name}: unsupported typestr {cai['typestr']!r}")
            self.dtype = dt
            self.ptr = int(cai["data"][0])
            self.shape = tuple(int(s) for s in cai["shape"])
            isz = _dt.itemsize(dt)
            st = cai.get("strides")
            self.strides = _c_strides(self.shape) if st is None else tuple(int(s) // isz for s in st)
            self.device = _device_of(self.ptr)
        elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
            dev_type, dev_id = obj.__dlpack_device__()
            if int(dev_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
                raise TypeError(f"{self.name}: must be on a CUDA device (DLPack device type "
                                f"{int(dev_type)}); copy it to the GPU first")
            self._read_dlpack(obj.__dlpack__())
        else:
            raise TypeError(f"{self.name}: expected a CUDA device array (DLPack or "
                            f"__cuda_array_interface__), got {type(obj).__name__}")

    def _read_dlpack(self, capsule):
        # A versioned capsule (DLPack >= 1.0) starts with a version header before the tensor.
        try:
            addr = _capsule_ptr(capsule, b"dltensor")
            t = _DLTensor.from_address(addr)
        except ValueError:
            addr = _capsule_ptr(capsule, b"dltensor_versioned")
            t = _DLTensor.from_address(addr + 8)   # DLPackVersion {u32 major, u32 minor}
        key = (t.dtype.code, t.dtype.bits)
        if key not in _DL_TYPES or t.dtype.lanes != 1:
            raise TypeError(f"{self.name}: unsupported DLPack dtype {key}")
        self.dtype = _DL_TYPES[key]
        self.shape = tuple(t.shape[i] for i in range(t.ndim))
        self.strides = (tuple(t.strides[i] for i in range(t.ndim)) if t.strides
                        else _c_strides(self.shape))
        self.ptr = (t.data or 0) + t.byte_offset
        self.device = t.device.device_id
        self._capsule = capsule   # noqa: keeps the producer's memory alive during the call

    @property
    def contiguous(self):
        cdef Py_ssize_t i
        cdef long long expect = 1, n
        if 0 in self.shape:
            return True            # an empty array has no layout to get wrong
        for i in range(len(self.shape) - 1, -1, -1):
            n = self.shape[i]
            if n > 1 and self.strides[i] != expect:
                return False
            expect *= n
        return True

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __repr__(self):
        return f"DeviceArg({self.name}: {self.dtype}{list(self.shape)} on device {self.device})"


_KIND = {"float64": "f", "float32": "f", "float16": "f", "bfloat16": "f",
         "int64": "i", "int32": "i", "int16": "i", "int8": "i",
         "uint64": "i", "uint32": "i", "uint16": "i", "uint8": "i", "bool": "i",
         "fp8_e4m3": "i"}


def _integer_spec(dtype):
    if dtype is None:
        return False
    names = (dtype,) if isinstance(dtype, str) else dtype
    return all(_KIND.get(d) == "i" for d in names)


def _same_kind(got, allowed):
    kind = _KIND.get(got)
    return kind is not None and any(_KIND.get(a) == kind for a in allowed)


_NP_NAMES = {"float64": "float64", "float32": "float32", "float16": "float16",
             "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8",
             "uint64": "uint64", "uint32": "uint32", "uint16": "uint16", "uint8": "uint8",
             "bool": "bool"}


class HostArg(DeviceArg):
    """The checks of ``DeviceArg`` on an array that is never launched on: a numpy array
    (the reference path) or a torch tensor on any device (eager CPU tensors, and the
    fake / meta tensors that torch.compile traces with). Same attributes; ``ptr`` is 0.

    torch tensors are checked exactly as on the GPU. numpy has no bfloat16 and the
    reference computes in float64, so a numpy array's dtype is checked by kind (any
    float where a float type is asked for, any integer or bool where an integer / bool
    type is; a uint16 array is bfloat16 bits unless an integer type is asked for);
    shapes, strides and values are checked as on the GPU.
    """

    def __init__(self, name, obj, dtype=None, ndim=None, shape=None, device=None,
                 contiguous=False, optional=False):
        if obj is not None and type(obj).__name__ == "DeviceArray":
            raise TypeError(f"{name}: a device array was given where host arrays are "
                            f"expected (numpy arrays or torch tensors)")
        # numpy has no bfloat16: the library keeps bf16 on the host as uint16 bit patterns
        # (specdec_lib.dtypes), so a numpy uint16 array is bfloat16 unless an integer dtype
        # is asked for
        import numpy as np
        self._bits = (isinstance(obj, np.ndarray) and obj.dtype == np.uint16
                      and not _integer_spec(dtype))
        DeviceArg.__init__(self, name, obj, dtype, ndim, shape, device, contiguous, optional)

    def _read(self, obj):
        import numpy as np
        if isinstance(obj, np.ndarray):
            dt = _NP_NAMES.get(obj.dtype.name)
            if dt is None:
                raise TypeError(f"{self.name}: unsupported dtype {obj.dtype}")
            isz = obj.dtype.itemsize
            if self._bits:
                dt = "bfloat16"
            self.dtype, self.device, self.ptr, self.by_kind = dt, "cpu", 0, True
            self.shape = tuple(obj.shape)
            # numpy gives an empty array any strides (often 0): it has no layout to get wrong
            self.strides = (_c_strides(self.shape) if obj.size == 0
                            else tuple(st // isz for st in obj.strides))
        elif type(obj).__module__.startswith("torch") and hasattr(obj, "stride"):
            dt = _TORCH_DTYPES.get(str(obj.dtype))
            if dt is None:
                raise TypeError(f"{self.name}: unsupported dtype {obj.dtype}")
            self.dtype, self.device, self.ptr = dt, str(obj.device), 0
            self.shape, self.strides = tuple(obj.shape), tuple(obj.stride())
        else:
            raise TypeError(f"{self.name}: expected a numpy array or a torch tensor, got "
                            f"{type(obj).__name__}")

    def values(self):
        """The array's values as numpy (index checks), or None where they cannot be read
        without a device copy (fake / meta tensors while torch.compile traces)."""
        obj = self.obj
        if obj is None:
            return None
        if not hasattr(obj, "stride"):
            return obj                               # numpy
        if type(obj).__name__ in ("Tensor", "Parameter") and obj.device.type == "cpu":
            return obj.detach().numpy()
        return None


cdef object _DA = None


cdef object _device_array_type():
    global _DA
    if _DA is None:
        from .arrays import DeviceArray
        _DA = DeviceArray
    return _DA


def _device_of(ptr):
    from .runtime import driver
    if ptr == 0:
        return 0
    d = driver().pointer_device(ptr)
    return 0 if d < 0 else d


def check_shape(name, got, want):
    """``want`` may contain None (any size)."""
    ok = len(got) == len(want)
    if ok:
        for g, w in zip(got, want):
            if w is not None and g != w:
                ok = False
                break
    if not ok:
        pretty = "[" + ", ".join("*" if w is None else str(w) for w in want) + "]"
        raise ValueError(f"{name}: expected shape {pretty}, got {list(got)}")


def check_int(name, value, lo=None, hi=None):
    if not isinstance(value, int) or isinstance(value, bool):
        try:
            import numpy as np
            if isinstance(value, np.integer):
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None
    if lo is not None and value < lo:
        raise ValueError(f"{name}: must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name}: must be <= {hi}, got {value}")
    return value


def as_stream(stream) -> int:
    """A raw CUstream handle from None (legacy default stream), an int handle, an object
    with ``__cuda_stream__`` (cuda.core, recent torch), or torch/cupy stream objects."""
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise ValueError(f"stream: invalid handle {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        val = proto() if callable(proto) else proto
        return int(val[1]) if isinstance(val, tuple) else int(val)
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream: expected None, an int handle or an object with __cuda_stream__, "
                    f"got {type(stream).__name__}")
