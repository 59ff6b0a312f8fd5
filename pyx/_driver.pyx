# cython: language_level=3
"""Driver layer over cuda.bindings.cydriver: init, contexts, modules, launches, memory.

Every CUresult other than CUDA_SUCCESS becomes a ``CudaError`` carrying the error
name, the driver's explanation and the operation that failed. Importing this module
never touches the driver; the first call does (and raises ``CudaUnavailable`` when
there is no usable driver or device).
"""
from libc.stdint cimport uintptr_t
from libc.string cimport memset
from cuda.bindings cimport cydriver


# defined in pure Python (specdec_lib.errors) so that `import specdec_lib` can export them
# without loading this extension; they stay reachable here as specdec_lib._driver.CudaError
from specdec_lib.errors import CudaError, CudaUnavailable


cdef str _err_name(cydriver.CUresult err):
    cdef const char* s = NULL
    try:
        if cydriver.cuGetErrorName(err, &s) == cydriver.CUDA_SUCCESS and s != NULL:
            return s.decode()
    except Exception:
        pass
    return f"CUresult {<int>err}"


cdef str _err_text(cydriver.CUresult err):
    cdef const char* s = NULL
    try:
        if cydriver.cuGetErrorString(err, &s) == cydriver.CUDA_SUCCESS and s != NULL:
            return s.decode()
    except Exception:
        pass
    return "no description"


cdef int check(cydriver.CUresult err, str op) except -1:
    if err == cydriver.CUDA_SUCCESS:
        return 0
    name = _err_name(err)
    cls = CudaUnavailable if err in (cydriver.CUDA_ERROR_NO_DEVICE,
                                     cydriver.CUDA_ERROR_NOT_INITIALIZED) else CudaError
    raise cls(<int>err, name, _err_text(err), op)


cdef bint _initialized = False
_init_error = None


def init():
    """cuInit once; raises CudaUnavailable (with the reason) when there is no driver/GPU."""
    global _initialized, _init_error
    cdef cydriver.CUresult err
    if _initialized:
        return
    if _init_error is not None:
        raise _init_error
    try:
        with nogil:
            err = cydriver.cuInit(0)
    except Exception as e:   # cuda-bindings could not load libcuda
        _init_error = CudaUnavailable(-1, "DRIVER_NOT_FOUND",
                                      f"the CUDA driver library could not be loaded: {e}", "cuInit")
        raise _init_error
    if err != cydriver.CUDA_SUCCESS:
        try:
            check(err, "cuInit")
        except CudaError as e:
            _init_error = CudaUnavailable(e.code, e.name, str(e), "cuInit")
            raise _init_error
    _initialized = True


def device_count():
    cdef int n = 0
    init()
    check(cydriver.cuDeviceGetCount(&n), "cuDeviceGetCount")
    return n


def device_attribute(int device, int attr):
    cdef int v = 0
    init()
    check(cydriver.cuDeviceGetAttribute(&v, <cydriver.CUdevice_attribute>attr, device),
          "cuDeviceGetAttribute")
    return v


ATTR_CC_MAJOR = cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
ATTR_CC_MINOR = cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
ATTR_SM_COUNT = cydriver.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
ATTR_L2_BYTES = cydriver.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
ATTR_SMEM_OPTIN = cydriver.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN


def device_name(int device):
    cdef char buf[256]
    init()
    check(cydriver.cuDeviceGetName(buf, 256, device), "cuDeviceGetName")
    return buf.decode()


def driver_version():
    cdef int v = 0
    init()
    check(cydriver.cuDriverGetVersion(&v), "cuDriverGetVersion")
    return v


# ------------------------------------------------------------------ contexts

cdef dict _primary = {}     # device -> primary CUcontext (retained by us)


def current_context_device():
    """Device of the context current on this thread, or -1 when there is none."""
    cdef cydriver.CUcontext ctx = NULL
    cdef cydriver.CUdevice dev = 0
    init()
    check(cydriver.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent")
    if ctx == NULL:
        return -1
    check(cydriver.cuCtxGetDevice(&dev), "cuCtxGetDevice")
    return <int>dev


def ensure_context(int device):
    """Make a context for ``device`` current and return its handle (an int).

    A context the host framework already made current for that device is used as it
    is; otherwise the device's primary context (what the CUDA runtime, torch and cupy
    use) is retained and made current, so memory and streams interoperate.
    """
    cdef cydriver.CUcontext ctx = NULL
    cdef cydriver.CUdevice dev = 0
    init()
    check(cydriver.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent")
    if ctx != NULL:
        check(cydriver.cuCtxGetDevice(&dev), "cuCtxGetDevice")
        if <int>dev == device:
            return <uintptr_t>ctx
    if device not in _primary:
        check(cydriver.cuDeviceGet(&dev, device), "cuDeviceGet")
        check(cydriver.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain")
        _primary[device] = <uintptr_t>ctx
    ctx = <cydriver.CUcontext><uintptr_t>_primary[device]
    check(cydriver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return <uintptr_t>ctx


# ------------------------------------------------------------------ modules and kernels

cdef void _config(cydriver.CUlaunchConfig* cfg, cydriver.CUlaunchAttribute* attr,
                  unsigned int gx, unsigned int gy, unsigned int gz,
                  unsigned int bx, unsigned int by, unsigned int bz,
                  unsigned int smem, size_t stream) noexcept:
    """cuLaunchKernelEx's config of a launch with the one attribute ``attr`` (its caller sets it)."""
    memset(cfg, 0, sizeof(cfg[0]))
    cfg.gridDimX = gx
    cfg.gridDimY = gy
    cfg.gridDimZ = gz
    cfg.blockDimX = bx
    cfg.blockDimY = by
    cfg.blockDimZ = bz
    cfg.sharedMemBytes = smem
    cfg.hStream = <cydriver.CUstream>stream
    cfg.attrs = attr
    cfg.numAttrs = 1


cdef void _pdl_attr(cydriver.CUlaunchAttribute* attr) noexcept:
    """``attr`` = programmatic stream serialization (the launch may be scheduled while the
    previous one on the stream drains: the kernel waits for it in pdl_begin())."""
    memset(attr, 0, sizeof(attr[0]))
    attr.id = cydriver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1


cdef void _cluster_config(cydriver.CUlaunchConfig* cfg, cydriver.CUlaunchAttribute* attr,
                          unsigned int grid, unsigned int block, unsigned int smem, size_t stream,
                          unsigned int cluster) noexcept:
    """A 1-D launch of ``grid`` CTAs of ``block`` threads in clusters of ``cluster``."""
    memset(attr, 0, sizeof(attr[0]))
    attr.id = cydriver.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x = cluster
    attr.value.clusterDim.y = 1
    attr.value.clusterDim.z = 1
    _config(cfg, attr, grid, 1, 1, block, 1, 1, smem, stream)


cdef class Kernel:
    """A loaded kernel (CUfunction) plus what launching it needs to know."""

    def __repr__(self):
        return f"<Kernel {self.module}:{self.name} on device {self.device}>"

    def set_max_dynamic_smem(self, int nbytes):
        """Raise the kernel's dynamic shared-memory limit (needed when static + dynamic
        shared memory exceeds 48 KiB)."""
        if nbytes > self.max_dynamic_smem:
            check(cydriver.cuFuncSetAttribute(
                self.func, cydriver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
                f"cuFuncSetAttribute({self.name}, max dynamic smem={nbytes})")
            self.max_dynamic_smem = nbytes

    def prefer_max_shared(self):
        """Ask for the largest shared-memory carveout (L1 gets the rest): kernels whose
        occupancy is set by their shared memory, not their registers."""
        check(cydriver.cuFuncSetAttribute(
            self.func, cydriver.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100),
            f"cuFuncSetAttribute({self.name}, preferred carveout=100)")

    def allow_large_clusters(self):
        """Let the kernel launch with clusters of more than 8 CTAs (sm_90: up to 16)."""
        check(cydriver.cuFuncSetAttribute(
            self.func, cydriver.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
            f"cuFuncSetAttribute({self.name}, non-portable cluster size)")

    def max_active_clusters(self, int grid, int block, unsigned int dynamic_smem, int cluster):
        """Clusters of ``cluster`` CTAs of ``block`` threads that can run on the device at once
        (cuOccupancyMaxActiveClusters)."""
        cdef int n = 0
        cdef cydriver.CUlaunchConfig cfg
        cdef cydriver.CUlaunchAttribute attr
        _cluster_config(&cfg, &attr, grid, block, dynamic_smem, 0, cluster)
        check(cydriver.cuOccupancyMaxActiveClusters(&n, self.func, &cfg),
              f"cuOccupancyMaxActiveClusters({self.name})")
        return n

    def occupancy(self, int block, size_t dynamic_smem=0):
        """CTAs of ``block`` threads that fit on one SM at once (the driver's occupancy count)."""
        cdef int n = 0
        check(cydriver.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, self.func, block, dynamic_smem),
              f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})")
        return n

    def attributes(self):
        """Registers, static smem, local bytes, max threads, PTX/binary version as the driver sees them."""
        cdef int v = 0
        out = {}
        for key, attr in (("registers", cydriver.CU_FUNC_ATTRIBUTE_NUM_REGS),
                          ("static_smem", cydriver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                          ("local_bytes", cydriver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                          ("max_threads", cydriver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
                          ("ptx_version", cydriver.CU_FUNC_ATTRIBUTE_PTX_VERSION),
                          ("binary_version", cydriver.CU_FUNC_ATTRIBUTE_BINARY_VERSION)):
            check(cydriver.cuFuncGetAttribute(&v, attr, self.func), "cuFuncGetAttribute")
            out[key] = v
        return out


cdef class Module:
    """A loaded cubin or PTX image in one context."""
    cdef cydriver.CUmodule mod
    cdef readonly str name
    cdef readonly int device
    cdef dict _kernels

    def __cinit__(self):
        self.mod = NULL
        self._kernels = {}

    def get_kernel(self, str symbol):
        cdef cydriver.CUfunction f = NULL
        cdef Kernel k
        cdef int limit = 0
        if symbol in self._kernels:
            return self._kernels[symbol]
        b = symbol.encode()
        check(cydriver.cuModuleGetFunction(&f, self.mod, b),
              f"cuModuleGetFunction({self.name}:{symbol})")
        k = Kernel.__new__(Kernel)
        k.func = f
        k.name = symbol
        k.module = self.name
        k.device = self.device
        # the default is 48 KiB minus the kernel's static shared memory
        check(cydriver.cuFuncGetAttribute(&limit, cydriver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f),
              f"cuFuncGetAttribute({self.name}:{symbol})")
        k.max_dynamic_smem = limit
        self._kernels[symbol] = k
        return k


def load_module(bytes image, str name, int device):
    """Load a cubin or (NUL-terminated) PTX image into ``device``'s context.

    PTX is JIT-compiled by the driver; its error log is put into the exception.
    """
    cdef Module m = Module.__new__(Module)
    cdef char log[8192]
    cdef cydriver.CUjit_option opts[2]
    cdef void* vals[2]
    cdef cydriver.CUresult err
    cdef const char* data = image
    ensure_context(device)
    memset(log, 0, sizeof(log))
    opts[0] = cydriver.CU_JIT_ERROR_LOG_BUFFER
    vals[0] = <void*>log
    opts[1] = cydriver.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
    vals[1] = <void*><uintptr_t>sizeof(log)
    with nogil:
        err = cydriver.cuModuleLoadDataEx(&m.mod, data, 2, opts, vals)
    if err != cydriver.CUDA_SUCCESS:
        jit = log.decode(errors="replace").strip()
        try:
            check(err, f"cuModuleLoadDataEx({name})")
        except CudaError as e:
            if jit:
                e.args = (e.args[0] + "\nJIT log:\n" + jit,)
            raise
    m.name = name
    m.device = device
    return m


cdef int launch(Kernel k, unsigned int gx, unsigned int gy, unsigned int gz,
                unsigned int bx, unsigned int by, unsigned int bz,
                unsigned int smem, size_t stream, void* params) except -1:
    """Launch ``k`` with a single by-value parameter block at ``params`` (GIL released).
    A kernel loaded from sm_90 code (``k.pdl``, set by ``runtime.kernel``) goes out with
    programmatic stream serialization: every library kernel begins with pdl_begin()
    (cuda_src/common/pdl.cuh), which waits for the previous launch before touching memory."""
    if k.pdl:
        return launch_after(k, gx, gy, gz, bx, by, bz, smem, stream, params, 1)
    cdef void* args[1]
    cdef cydriver.CUresult err
    args[0] = params
    with nogil:
        err = cydriver.cuLaunchKernel(k.func, gx, gy, gz, bx, by, bz, smem,
                                      <cydriver.CUstream>stream, args, NULL)
    if err != cydriver.CUDA_SUCCESS:
        check(err, f"cuLaunchKernel({k.module}:{k.name}, grid=({gx},{gy},{gz}), "
                   f"block=({bx},{by},{bz}), smem={smem})")
    return 0


cdef int launch_after(Kernel k, unsigned int gx, unsigned int gy, unsigned int gz,
                      unsigned int bx, unsigned int by, unsigned int bz,
                      unsigned int smem, size_t stream, void* params, bint pdl) except -1:
    """``launch`` for a kernel that follows another launch of the same op on ``stream``: with
    ``pdl`` (sm_90 code that calls griddepcontrol.wait before it reads its predecessor's
    results: cuda_src/common/pdl.cuh) through cuLaunchKernelEx with programmatic stream
    serialization, so it is scheduled while the predecessor drains."""
    if not pdl:
        return launch(k, gx, gy, gz, bx, by, bz, smem, stream, params)
    cdef void* args[1]
    cdef cydriver.CUresult err
    cdef cydriver.CUlaunchConfig cfg
    cdef cydriver.CUlaunchAttribute attr
    args[0] = params
    _pdl_attr(&attr)
    _config(&cfg, &attr, gx, gy, gz, bx, by, bz, smem, stream)
    with nogil:
        err = cydriver.cuLaunchKernelEx(&cfg, k.func, args, NULL)
    if err != cydriver.CUDA_SUCCESS:
        check(err, f"cuLaunchKernelEx({k.module}:{k.name}, grid=({gx},{gy},{gz}), "
                   f"block=({bx},{by},{bz}), smem={smem}, programmatic serialization)")
    return 0


cdef int launch_cluster_grid(Kernel k, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int smem, size_t stream, void* params,
                             unsigned int cluster_x, bint pdl) except -1:
    """Launch ``k`` on grid (gx, gy, gz) of ``bx``-thread CTAs in clusters of ``cluster_x``
    CTAs along x (sm_90+: cuLaunchKernelEx with the cluster-dimension attribute), one
    by-value parameter block; when ``pdl`` and the kernel was loaded from sm_90 code
    (``k.pdl``: it begins with pdl_begin()), with programmatic stream serialization as
    ``launch`` does, so it is scheduled while the previous launch drains."""
    cdef void* args[1]
    cdef cydriver.CUresult err
    cdef cydriver.CUlaunchConfig cfg
    cdef cydriver.CUlaunchAttribute attrs[2]
    cdef bint serial = pdl and k.pdl
    args[0] = params
    _cluster_config(&cfg, &attrs[0], gx, bx, smem, stream, cluster_x)
    cfg.gridDimY = gy
    cfg.gridDimZ = gz
    if serial:
        _pdl_attr(&attrs[1])
        cfg.numAttrs = 2
    with nogil:
        err = cydriver.cuLaunchKernelEx(&cfg, k.func, args, NULL)
    if err != cydriver.CUDA_SUCCESS:
        check(err, f"cuLaunchKernelEx({k.module}:{k.name}, grid=({gx},{gy},{gz}), block={bx}, "
                   f"cluster={cluster_x}, smem={smem}, pdl={serial})")
    return 0


# ------------------------------------------------------------------ memory, streams, events

def mem_alloc(size_t nbytes):
    cdef cydriver.CUdeviceptr p = 0
    if nbytes == 0:
        return 0
    check(cydriver.cuMemAlloc(&p, nbytes), f"cuMemAlloc({nbytes} bytes)")
    return <uintptr_t>p


def mem_free(uintptr_t ptr):
    if ptr:
        check(cydriver.cuMemFree(<cydriver.CUdeviceptr>ptr), "cuMemFree")


def memcpy_htod(uintptr_t dst, const unsigned char[::1] src, size_t stream=0):
    """Host -> device copy of a contiguous host buffer, finished before returning."""
    cdef size_t n = src.shape[0]
    if n == 0:
        return
    with nogil:
        err = cydriver.cuMemcpyHtoDAsync(<cydriver.CUdeviceptr>dst, &src[0], n,
                                         <cydriver.CUstream>stream)
    check(err, "cuMemcpyHtoDAsync")
    check(cydriver.cuStreamSynchronize(<cydriver.CUstream>stream), "cuStreamSynchronize")


def memcpy_dtoh(unsigned char[::1] dst, uintptr_t src, size_t stream=0):
    """Device -> host copy into a contiguous writable host buffer (synchronous)."""
    cdef size_t n = dst.shape[0]
    if n == 0:
        return
    with nogil:
        err = cydriver.cuMemcpyDtoHAsync(&dst[0], <cydriver.CUdeviceptr>src, n,
                                         <cydriver.CUstream>stream)
    check(err, "cuMemcpyDtoHAsync")
    check(cydriver.cuStreamSynchronize(<cydriver.CUstream>stream), "cuStreamSynchronize")


def memcpy_dtod(uintptr_t dst, uintptr_t src, size_t nbytes, size_t stream=0):
    """Asynchronous device -> device copy on ``stream``."""
    if nbytes:
        check(cydriver.cuMemcpyDtoDAsync(<cydriver.CUdeviceptr>dst, <cydriver.CUdeviceptr>src,
                                         nbytes, <cydriver.CUstream>stream), "cuMemcpyDtoDAsync")


def memset_d8(uintptr_t dst, unsigned char value, size_t nbytes, size_t stream=0):
    if nbytes:
        check(cydriver.cuMemsetD8Async(<cydriver.CUdeviceptr>dst, value, nbytes,
                                       <cydriver.CUstream>stream), "cuMemsetD8Async")


def pointer_device(uintptr_t ptr):
    """Device ordinal owning a device pointer, or -1 for host / unknown memory."""
    cdef int ordinal = -1
    cdef cydriver.CUresult err = cydriver.cuPointerGetAttribute(
        &ordinal, cydriver.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, <cydriver.CUdeviceptr>ptr)
    return ordinal if err == cydriver.CUDA_SUCCESS else -1


def stream_create():
    cdef cydriver.CUstream s = NULL
    check(cydriver.cuStreamCreate(&s, cydriver.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    return <uintptr_t>s


def stream_destroy(uintptr_t s):
    if s:
        check(cydriver.cuStreamDestroy(<cydriver.CUstream>s), "cuStreamDestroy")


def stream_synchronize(uintptr_t s=0):
    with nogil:
        err = cydriver.cuStreamSynchronize(<cydriver.CUstream>s)
    check(err, "cuStreamSynchronize")


def stream_is_capturing(uintptr_t s=0):
    """True while ``s`` is being captured into a CUDA graph (host syncs are illegal then)."""
    cdef cydriver.CUstreamCaptureStatus st
    check(cydriver.cuStreamIsCapturing(<cydriver.CUstream>s, &st), "cuStreamIsCapturing")
    return st != cydriver.CU_STREAM_CAPTURE_STATUS_NONE


def ctx_synchronize():
    with nogil:
        err = cydriver.cuCtxSynchronize()
    check(err, "cuCtxSynchronize")


def event_create():
    cdef cydriver.CUevent e = NULL
    check(cydriver.cuEventCreate(&e, cydriver.CU_EVENT_DEFAULT), "cuEventCreate")
    return <uintptr_t>e


def event_destroy(uintptr_t e):
    if e:
        check(cydriver.cuEventDestroy(<cydriver.CUevent>e), "cuEventDestroy")


def event_record(uintptr_t e, uintptr_t stream=0, bint external=False):
    """Records ``e`` on ``stream``. ``external=True`` on a capturing stream puts an
    event-record node in the graph (each replay records ``e``: timing inside a graph); a
    plain record there only orders the capture, and ``e`` is never recorded (the driver
    refuses ``external`` on a stream that is not capturing)."""
    if external:
        check(cydriver.cuEventRecordWithFlags(<cydriver.CUevent>e, <cydriver.CUstream>stream,
                                              cydriver.CU_EVENT_RECORD_EXTERNAL),
              "cuEventRecordWithFlags")
        return
    check(cydriver.cuEventRecord(<cydriver.CUevent>e, <cydriver.CUstream>stream), "cuEventRecord")


def event_elapsed_ms(uintptr_t start, uintptr_t end):
    cdef float ms = 0
    with nogil:
        err = cydriver.cuEventSynchronize(<cydriver.CUevent>end)
    check(err, "cuEventSynchronize")
    check(cydriver.cuEventElapsedTime(&ms, <cydriver.CUevent>start, <cydriver.CUevent>end),
          "cuEventElapsedTime")
    return ms


def graph_capture_begin(uintptr_t stream):
    check(cydriver.cuStreamBeginCapture(<cydriver.CUstream>stream,
                                        cydriver.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
          "cuStreamBeginCapture")


def graph_capture_end(uintptr_t stream):
    """End capture and instantiate: returns (graph, graph_exec) handles."""
    cdef cydriver.CUgraph g = NULL
    cdef cydriver.CUgraphExec ge = NULL
    check(cydriver.cuStreamEndCapture(<cydriver.CUstream>stream, &g), "cuStreamEndCapture")
    check(cydriver.cuGraphInstantiate(&ge, g, 0), "cuGraphInstantiate")
    return <uintptr_t>g, <uintptr_t>ge


def graph_launch(uintptr_t graph_exec, uintptr_t stream):
    check(cydriver.cuGraphLaunch(<cydriver.CUgraphExec>graph_exec, <cydriver.CUstream>stream),
          "cuGraphLaunch")


def graph_destroy(uintptr_t graph, uintptr_t graph_exec):
    if graph_exec:
        check(cydriver.cuGraphExecDestroy(<cydriver.CUgraphExec>graph_exec), "cuGraphExecDestroy")
    if graph:
        check(cydriver.cuGraphDestroy(<cydriver.CUgraph>graph), "cuGraphDestroy")
