# Driver layer: the only place that talks to the CUDA driver (through cuda-bindings'
# cydriver, so nothing links libcuda and import works on a machine without one).
from cuda.bindings cimport cydriver

cdef class Kernel:
    cdef cydriver.CUfunction func
    cdef readonly str name
    cdef readonly str module
    cdef readonly int device
    cdef readonly int max_dynamic_smem
    cdef public bint pdl          # launch() uses programmatic serialization (sm_90 code)

cdef int check(cydriver.CUresult err, str op) except -1
cdef int launch(Kernel k, unsigned int gx, unsigned int gy, unsigned int gz,
                unsigned int bx, unsigned int by, unsigned int bz,
                unsigned int smem, size_t stream, void* params) except -1
cdef int launch_after(Kernel k, unsigned int gx, unsigned int gy, unsigned int gz,
                      unsigned int bx, unsigned int by, unsigned int bz,
                      unsigned int smem, size_t stream, void* params, bint pdl) except -1
cdef int launch_cluster_grid(Kernel k, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int smem, size_t stream, void* params,
                             unsigned int cluster_x, bint pdl) except -1
