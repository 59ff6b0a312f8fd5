// copy family: generic strided copy and the paged KV append.
//
// Both are pure data movement, so the only things that matter are 16-byte accesses
// where the layout allows them, enough independent loads in flight, and 64-bit index
// math (a KV cache or a state pool can exceed 2^31 elements).
#include "common/dtype.cuh"
#include "common/pdl.cuh"
#include "common/ragged.cuh"
#include "copy/copy_params.h"

using namespace specdec;

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;     // 16-byte vectors per thread per step: loads in flight
constexpr int kRowUnroll = 8;  // append_kv: a 32-thread row issues 8 vectors (4 KiB: K+V of Hkv=8, D=128, bf16) at once

// Copies n bytes as 16-byte vectors (both pointers 16-byte aligned, n % 16 == 0).
// (Streaming .cs hints were tried: no gain on the H200, 86.7% vs 87-89% of copy.)
__device__ __forceinline__ void copy_vec16(char* d, const char* s, int64_t n) {
  const int64_t nv = n >> 4;
  const uint4* src = reinterpret_cast<const uint4*>(s);
  uint4* dst = reinterpret_cast<uint4*>(d);
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * blockDim.x < nv; i += kUnroll * blockDim.x) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(src + i + u * blockDim.x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * blockDim.x] = v[u];
  }
  for (; i < nv; i += blockDim.x) dst[i] = __ldg(src + i);
}

// dst[i0,i1,i2,i3] = src[i0,i1,i2,i3] over a 4-D index space (Python pads to 4-D and
// merges dims that are contiguous in both tensors). A work unit is one chunk of one
// innermost row, so a single huge row still spreads over the whole grid.
template <int E>
__device__ __forceinline__ void copy_strided(const CopyParams& p) {
  using T = typename storage<E>::type;
  const int64_t units = p.rows * p.chunks_per_row;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const int64_t row = u / p.chunks_per_row;
    const int64_t c0 = (u - row * p.chunks_per_row) * p.chunk;
    const int64_t n = min(p.chunk, p.shape[3] - c0);
    const int64_t i2 = row % p.shape[2];
    const int64_t r01 = row / p.shape[2];
    const int64_t i1 = r01 % p.shape[1];
    const int64_t i0 = r01 / p.shape[1];
    T* d = static_cast<T*>(p.dst) + i0 * p.dst_stride[0] + i1 * p.dst_stride[1] +
           i2 * p.dst_stride[2] + c0 * p.dst_stride[3];
    const T* s = static_cast<const T*>(p.src) + i0 * p.src_stride[0] + i1 * p.src_stride[1] +
                 i2 * p.src_stride[2] + c0 * p.src_stride[3];
    if (p.dst_stride[3] == 1 && p.src_stride[3] == 1 && is_aligned16(d) && is_aligned16(s) &&
        (n * E) % 16 == 0) {
      copy_vec16(reinterpret_cast<char*>(d), reinterpret_cast<const char*>(s), n * E);
    } else if (p.src_stride[3] == 0) {
      const T v = *s;   // broadcast source: one load per row chunk
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) d[i * p.dst_stride[3]] = v;
    } else {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        d[i * p.dst_stride[3]] = s[i * p.src_stride[3]];
    }
  }
}

// k_src/v_src [T, Hkv, D] -> k_cache/v_cache [num_pages, page_size, Hkv, D] at position
// L[b] + i of sequence b. A row of threads (threadIdx.x, ~units/4 of them) moves K and V
// of all heads of one block row (2 * Hkv * D elements, 4 KiB for Hkv=8, D=128, bf16);
// a CTA holds blockDim.y such rows. Each row starts with a chain of dependent index
// loads (cu_q search, L, page id), so many rows must be in flight per SM: small thread
// rows, several per CTA (fewer CTAs to schedule), and each thread issues all of its
// 16-byte loads before its stores. A row whose target lies outside the page table or
// the pool is skipped, never written: Python validates those indices before launch
// unless the caller opted out.
template <int E>
__device__ __forceinline__ void append_kv(const AppendKVParams& p) {
  using T = typename storage<E>::type;
  const bool vec = p.vectorize && (static_cast<int64_t>(p.head_dim) * E) % 16 == 0;
  const int units_per_head = vec ? p.head_dim * E / 16 : p.head_dim;
  const int units_per_kv = p.num_heads * units_per_head;
  const int units = 2 * units_per_kv;
  for (int t = blockIdx.x * blockDim.y + threadIdx.y; t < p.num_rows; t += gridDim.x * blockDim.y) {
    int32_t page;
    int64_t slot;
    if (!kv_append_target(p.cu_q, p.seq_lens, p.finished, p.page_table, p.page_table_stride,
                          p.batch, p.page_size, p.num_pages, p.max_pages, t, page, slot))
      continue;
    // element offsets of unit u (a 16-byte vector, or one element when !vec)
    auto src_of = [&](int u, int& kv, int& x) -> const T* {
      kv = u >= units_per_kv;
      const int rem = u - kv * units_per_kv;
      const int h = rem / units_per_head;
      x = rem - h * units_per_head;
      return static_cast<const T*>(kv ? p.v_src : p.k_src) + t * p.src_stride_t[kv] +
             h * p.src_stride_h[kv];
    };
    auto dst_of = [&](int u, int kv) -> T* {
      const int h = (u - kv * units_per_kv) / units_per_head;
      return static_cast<T*>(kv ? p.v_cache : p.k_cache) + page * p.cache_stride_page[kv] +
             slot * p.cache_stride_slot[kv] + h * p.cache_stride_h[kv];
    };
    if (vec) {
      for (int u0 = threadIdx.x; u0 < units; u0 += kRowUnroll * blockDim.x) {
        uint4 v[kRowUnroll];
#pragma unroll
        for (int j = 0; j < kRowUnroll; ++j) {
          const int u = u0 + j * blockDim.x;
          int kv, x;
          if (u < units) v[j] = __ldg(reinterpret_cast<const uint4*>(src_of(u, kv, x)) + x);
        }
#pragma unroll
        for (int j = 0; j < kRowUnroll; ++j) {
          const int u = u0 + j * blockDim.x;
          int kv, x;
          if (u < units) {
            src_of(u, kv, x);
            reinterpret_cast<uint4*>(dst_of(u, kv))[x] = v[j];
          }
        }
      }
    } else {
      for (int u = threadIdx.x; u < units; u += blockDim.x) {
        int kv, x;
        const T* s = src_of(u, kv, x);
        dst_of(u, kv)[x] = s[x];
      }
    }
  }
}

}  // namespace

#define SPECDEC_COPY_KERNELS(E)                                                        \
  extern "C" __global__ void __launch_bounds__(kThreads) copy_strided_e##E(const CopyParams p) { specdec::pdl_begin(); \
    copy_strided<E>(p);                                                                \
  }                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads) append_kv_e##E(const AppendKVParams p) { specdec::pdl_begin(); \
    append_kv<E>(p);                                                                   \
  }

SPECDEC_COPY_KERNELS(1)
SPECDEC_COPY_KERNELS(2)
SPECDEC_COPY_KERNELS(4)
SPECDEC_COPY_KERNELS(8)

// ---- append_kv into 8-bit caches (issue 32): quantise on write
//
// W lanes per (token, K/V, head) row, W the fewest of 8 / 16 / 32 holding the row's D / V
// chunks (a warp takes 32 / W rows at once, so D=128 16-bit rows no longer leave half the
// lanes idle and the warp's rows load together): the row's D <= 256 values are loaded in
// chunks of V (16-byte vectors when the launcher found the rows aligned, else V = 1 and
// W = 32), quantised in registers (common/kv8_row.cuh: fp8 with the head's scale, int8 with
// the row's own min / max reduced over its W lanes) and stored as V-byte codes; int8 rows
// also store their (scale, zero) pair. A CTA row of blockDim.x threads (one warp by
// default) owns one token, blockDim.y tokens per CTA, and a warp issues the loads of G
// passes (8 where a lane holds one chunk of a row: all 16 rows of Hkv=8 D=128 bf16) before
// its first store: like append_kv, the
// time goes to each token's chain of dependent index loads (kv_append_target, skipped rows
// untouched), so many tokens must be in flight per SM (s34: a 256-thread CTA per token
// with one load a lane ran 34% of copy).
#include "common/kv8_row.cuh"
#include "common/pack.cuh"

namespace {

template <typename T, int FMT, int V, int W>
__device__ __forceinline__ void append_kv8(const AppendKV8Params& q) {
  const AppendKVParams& p = q.base;
  // chunk slots per lane: W < 32 only takes rows of <= W chunks (the dispatch below)
  constexpr int NC = W < 32 ? 1 : (256 / V + 31) / 32;   // D <= 256
  constexpr int R = 32 / W;                      // rows a warp holds at once
  constexpr int G = NC == 1 ? kRowUnroll : 2;    // warp passes loaded before the first store
  const int lane = (threadIdx.x & 31) % W;       // lane within the row
  const int sub = (threadIdx.x & 31) / W;        // the warp's row slot
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int nchunks = p.head_dim / V;
  const int rows = 2 * p.num_heads;              // (K | V, head) rows of a token
  for (int t = blockIdx.x * blockDim.y + threadIdx.y; t < p.num_rows; t += gridDim.x * blockDim.y) {
    int32_t page;
    int64_t slot;
    if (!kv_append_target(p.cu_q, p.seq_lens, p.finished, p.page_table, p.page_table_stride,
                          p.batch, p.page_size, p.num_pages, p.max_pages, t, page, slot))
      continue;
    for (int u0 = warp * R * G; u0 < rows; u0 += warps * R * G) {   // warp-uniform
      Pack<T, V> raw[G][NC];
      int chunk[G][NC];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int u = u0 + g * R + sub;
        const int kv = u >= p.num_heads;
        const T* src = static_cast<const T*>(kv ? p.v_src : p.k_src) + t * p.src_stride_t[kv] +
                       (u - kv * p.num_heads) * p.src_stride_h[kv];
#pragma unroll
        for (int j = 0; j < NC; ++j) {
          const int c = lane + W * j;
          chunk[g][j] = u < rows && c < nchunks ? c : -1;
          if (chunk[g][j] >= 0) raw[g][j] = load_pack<T, V>(src + c * V);
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (u0 + g * R >= rows) continue;         // warp-uniform: every lane calls the write
        const int u = u0 + g * R + sub;
        const bool has_row = u < rows;            // else: this slot idles, lanes still shuffle
        const int kv = u >= p.num_heads;
        const int h = u - kv * p.num_heads;
        float x[NC][V];
#pragma unroll
        for (int j = 0; j < NC; ++j)
#pragma unroll
          for (int i = 0; i < V; ++i) x[j][i] = chunk[g][j] >= 0 ? to_float(raw[g][j].e[i]) : 0.f;
        uint8_t* dst = static_cast<uint8_t*>(kv ? p.v_cache : p.k_cache) +
                       page * p.cache_stride_page[kv] + slot * p.cache_stride_slot[kv] +
                       h * p.cache_stride_h[kv];
        const float* sc = kv ? q.v_scale : q.k_scale;
        float* prm = kv ? q.v_params : q.k_params;
        const int64_t prow = ((static_cast<int64_t>(page) * p.page_size + slot) * p.num_heads + h) * 2;
        kv8_write_row<FMT, NC, V, W>(x, chunk[g], dst,
                                     FMT == KV8_FP8 && has_row ? __ldg(sc + h * q.scale_stride) : 0.f,
                                     FMT == KV8_INT8 && has_row ? prm + prow : nullptr);
      }
    }
  }
}

}  // namespace

#define SPECDEC_APPEND_KV8(FNAME, FMT, TNAME, T)                                              \
  extern "C" __global__ void __launch_bounds__(kThreads) append_kv8_##FNAME##_##TNAME(        \
      const AppendKV8Params p) { specdec::pdl_begin();                                                              \
    constexpr int kV = 16 / sizeof(T);                                                        \
    const int nchunks = p.base.head_dim / kV;                                                 \
    if (!p.base.vectorize) append_kv8<T, FMT, 1, 32>(p);                                      \
    else if (nchunks <= 8) append_kv8<T, FMT, kV, 8>(p);                                      \
    else if (nchunks <= 16) append_kv8<T, FMT, kV, 16>(p);                                    \
    else append_kv8<T, FMT, kV, 32>(p);                                                       \
  }
SPECDEC_APPEND_KV8(fp8, KV8_FP8, f32, float)
SPECDEC_APPEND_KV8(fp8, KV8_FP8, f16, __half)
SPECDEC_APPEND_KV8(fp8, KV8_FP8, bf16, bf16_t)
SPECDEC_APPEND_KV8(int8, KV8_INT8, f32, float)
SPECDEC_APPEND_KV8(int8, KV8_INT8, f16, __half)
SPECDEC_APPEND_KV8(int8, KV8_INT8, bf16, bf16_t)
