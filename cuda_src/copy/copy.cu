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
// A (token, K/V, head) row's D <= 256 values are loaded in chunks of V (16-byte vectors when
// the launcher found the rows aligned, else V = 1), quantised in registers
// (common/kv8_row.cuh: fp8 with the head's scale, int8 with the row's own min / max) and
// stored as V-byte codes; int8 rows also store their (scale, zero) pair. W = 4 lanes hold a
// row, NC chunks each (W = 8 past 32 chunks, W = 32 unvectorised), so a warp takes R = 32 / W
// rows at once: each 16-byte load still covers 64 contiguous bytes of a row, and the work
// done once a row (the min / max reduction over its lanes, the int8 (scale, zero), the fp8
// reciprocal, the addresses) is shared by 8 rows instead of 2 (s33's 16 lanes a row: ~2000
// instructions a D=128 int8 token, half of them that per-row work; now ~1150).
// A CTA row of blockDim.x threads (one warp by default) owns one token at a time, blockDim.y
// tokens per CTA. A warp's work item is G passes of R rows (8 chunks a lane: all 16 rows of
// Hkv=8 D=128 bf16); the launcher sizes the grid to the resident CTAs so each warp runs a
// contiguous run of tokens, and it loads the next item's rows before it quantises the current
// one and finds the next token's page (its sequence kept across the run, so most tokens skip
// the search over cu_q; skipped rows untouched): its loads stay in flight while it computes.
#include <climits>

#include "common/kv8_row.cuh"
#include "common/pack.cuh"

namespace {

template <typename T, int FMT, int V, int W, int NC>
struct AppendKV8 {
  static constexpr int R = 32 / W;                                // rows a warp holds at once
  static constexpr int G = NC >= 8 ? 1 : 8 / NC;                  // passes an item: 8 chunks a lane
  // Rows in flight as raw 32-bit words (16-byte chunks), widened to float only in write():
  // as Packs, ptxas unpacked 16-bit elements right after the loads, doubling the registers.
  static constexpr int NW = sizeof(T) * V % 4 == 0 ? sizeof(T) * V / 4 : 0;
  using Chunk = typename std::conditional<NW != 0, uint4, Pack<T, V>>::type;
  using Rows = Chunk[G][NC];
  // An item in flight: its rows and, for fp8, each row's head scale (a dependent load that,
  // made where the row was written, stalled a third of the warps' time)
  struct Item {
    Rows raw;
    float scale[FMT == KV8_FP8 ? G : 1];
  };

  const AppendKV8Params& q;
  const AppendKVParams& p;
  int lane, sub, nchunks, rows;

  __device__ __forceinline__ bool has_chunk(int u, int j) const {
    return u < rows && lane + W * j < nchunks;
  }

  // base + i * stride for i >= 0 (head and token indices): unsigned, so the 64-bit product
  // is two multiplies without sign handling (signed, ptxas spent ~20 instructions a row)
  template <typename P>
  static __device__ __forceinline__ P* at(P* base, int i, int64_t stride) {
    return base + static_cast<uint64_t>(static_cast<uint32_t>(i)) * static_cast<uint64_t>(stride);
  }

  // Row u of a token: K (kv 0) or V (kv 1), head h.
  __device__ __forceinline__ int kv_of(int u) const { return u >= p.num_heads; }

  // Item (t, u0)'s rows into registers (unloaded slots zero: they are never stored). The
  // token's K and V row bases are worked out once, each row adds its head.
  __device__ __forceinline__ void load(Item& it, int t, int u0) const {
    Rows& raw = it.raw;
    const T* kbase = at(static_cast<const T*>(p.k_src), t, p.src_stride_t[0]);
    const T* vbase = at(static_cast<const T*>(p.v_src), t, p.src_stride_t[1]);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int u = u0 + g * R + sub;
      const int kv = kv_of(u);
      // selects, not an array indexed by kv (which went to the stack)
      const T* src = at(kv ? vbase : kbase, u - kv * p.num_heads,
                        kv ? p.src_stride_h[1] : p.src_stride_h[0]) + lane * V;
      if constexpr (FMT == KV8_FP8)
        it.scale[g] = u < rows ? __ldg((kv ? q.v_scale : q.k_scale) +
                                       (u - kv * p.num_heads) * q.scale_stride)
                               : 1.f;
#pragma unroll
      for (int j = 0; j < NC; ++j) {
        if constexpr (NW != 0) {
          raw[g][j] = has_chunk(u, j) ? __ldg(reinterpret_cast<const uint4*>(src + W * j * V))
                                      : make_uint4(0u, 0u, 0u, 0u);
        } else {
          raw[g][j] = has_chunk(u, j) ? load_pack<T, V>(src + W * j * V) : Pack<T, V>{};
        }
      }
    }
  }

  // Where a token's rows go: its K / V cache rows (head 0) and int8 (scale, zero) pairs.
  struct Dest {
    uint8_t *krow, *vrow;
    float *kprm, *vprm;
  };

  __device__ __forceinline__ Dest dest(int32_t page, int64_t slot) const {
    const int s = static_cast<int>(slot);
    const int64_t prow = (static_cast<int64_t>(page) * p.page_size + slot) * p.num_heads * 2;
    return {at(at(static_cast<uint8_t*>(p.k_cache), page, p.cache_stride_page[0]), s,
               p.cache_stride_slot[0]),
            at(at(static_cast<uint8_t*>(p.v_cache), page, p.cache_stride_page[1]), s,
               p.cache_stride_slot[1]),
            q.k_params + prow, q.v_params + prow};
  }

  // Quantise and store item u0 of the token whose rows go to d.
  __device__ __forceinline__ void write(const Item& it, int u0, const Dest& d) const {
    const Rows& raw = it.raw;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (u0 + g * R >= rows) continue;         // warp-uniform: every lane calls the write
      const int u = u0 + g * R + sub;
      const bool has_row = u < rows;            // else: this slot idles, lanes still shuffle
      const int kv = kv_of(u);
      const int h = u - kv * p.num_heads;
      int chunk[NC];
#pragma unroll
      for (int j = 0; j < NC; ++j) chunk[j] = has_chunk(u, j) ? lane + W * j : -1;
      const Chunk* rg = raw[g];
      auto x = [rg](int j, int i) -> float {
        if constexpr (NW != 0) {
          uint32_t w[4];
          memcpy(w, &rg[j], 16);
          return word_element_to_float<T>(w[i * sizeof(T) / 4], i * sizeof(T) % 4);
        } else {
          return to_float(rg[j].e[i]);
        }
      };
      uint8_t* dst = at(kv ? d.vrow : d.krow, h, kv ? p.cache_stride_h[1] : p.cache_stride_h[0]);
      // 16-bit rows on sm_80+: the range two elements an instruction (min / max .bf16x2 /
      // .f16x2 ignore NaN as min.f32 does), widened once at the end
      auto range = [rg](const int (&ch)[NC], float& mn, float& mx) -> bool {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        if constexpr (NW != 0 && sizeof(T) == 2) {
          uint32_t lo = 0x7fff7fffu, hi = 0x7fff7fffu;   // NaN in both formats
#pragma unroll
          for (int j = 0; j < NC; ++j) {
            if (ch[j] < 0) continue;
            uint32_t w[4];
            memcpy(w, &rg[j], 16);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              lo = kv8::minmax2<T, false>(lo, w[k]);
              hi = kv8::minmax2<T, true>(hi, w[k]);
            }
          }
          mn = kv8::fmin_nan(word_element_to_float<T>(lo, 0), word_element_to_float<T>(lo, 2));
          mx = kv8::fmax_nan(word_element_to_float<T>(hi, 0), word_element_to_float<T>(hi, 2));
          return true;
        }
#endif
        return false;
      };
      kv8_write_row<FMT, NC, V, W>(x, chunk, dst,
                                   FMT == KV8_FP8 ? it.scale[g] : 0.f,
                                   FMT == KV8_INT8 && has_row ? (kv ? d.vprm : d.kprm) + 2 * h
                                                              : nullptr,
                                   range);
    }
  }

  // kv_append_target with the owner's block [lo, hi) kept: a warp walks consecutive tokens,
  // so most find their sequence without the binary search's chain of dependent loads (the
  // same owner for a non-decreasing cu_q, which the op requires; hi is open for the last
  // sequence, as the search never reads cu_q[B]).
  struct Owner {
    int b = 0, lo = 1, hi = 0;
  };
  __device__ __forceinline__ bool target(int t, Owner& o, int32_t& page, int64_t& slot) const {
    if (p.batch <= 0) return false;
    if (t < o.lo || t >= o.hi) {
      o.b = owner_of_row(p.cu_q, p.batch, t);
      o.lo = __ldg(p.cu_q + o.b);
      o.hi = o.b + 1 < p.batch ? __ldg(p.cu_q + o.b + 1) : INT_MAX;
    }
    return kv_append_slot(p.seq_lens, p.finished, p.page_table, p.page_table_stride,
                          p.page_size, p.num_pages, p.max_pages, o.b, t - o.lo, page, slot);
  }

  // Items (t, u0) in order: the warp's passes of a token, then the CTA row's next token. A
  // CTA row takes a contiguous run of tokens (the grid is at most the resident CTAs).
  __device__ __forceinline__ void run() const {
    const int warp = threadIdx.x >> 5;
    const int u_first = warp * R * G, u_step = (blockDim.x >> 5) * R * G;
    const int64_t slots = static_cast<int64_t>(gridDim.x) * blockDim.y;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
    int t = static_cast<int>(r * p.num_rows / slots), u0 = u_first;
    const int t_end = static_cast<int>((r + 1) * p.num_rows / slots);
    if (u_first >= rows || t >= t_end) return;
    Item a, b;
    load(a, t, u0);
    int32_t page;
    int64_t slot;
    Owner o;
    bool ok = target(t, o, page, slot);
    Dest d = dest(page, slot);
    // One step: load the next item into nxt, write cur, walk the next token's chain; the
    // loop copies nxt into cur (one step a trip: half the code of two steps with the
    // buffers swapped, which missed the instruction cache)
    auto step = [&](const Item& cur, Item& nxt) -> bool {
      int tn = t, un = u0 + u_step;
      if (un >= rows) { un = u_first; ++tn; }
      const bool more = tn < t_end;
      if (more) load(nxt, tn, un);
      if (ok) write(cur, u0, d);
      if (more && tn != t) {
        ok = target(tn, o, page, slot);
        d = dest(page, slot);
      }
      t = tn;
      u0 = un;
      return more;
    };
    while (step(a, b)) a = b;
  }
};

template <typename T, int FMT, int V, int W, int NC>
__device__ __forceinline__ void append_kv8(const AppendKV8Params& q) {
  const AppendKV8<T, FMT, V, W, NC> k{q, q.base, static_cast<int>((threadIdx.x & 31) % W),
                                  static_cast<int>((threadIdx.x & 31) / W), q.base.head_dim / V,
                                  2 * q.base.num_heads};
  k.run();
}

}  // namespace

// Two 256-thread CTAs an SM: the rows in flight twice over take 64 registers a lane, and
// without the bound ptxas took up to 184 for the f16 forms (one CTA an SM).
#define SPECDEC_APPEND_KV8(FNAME, FMT, TNAME, T)                                              \
  extern "C" __global__ void __launch_bounds__(kThreads, 2) append_kv8_##FNAME##_##TNAME(     \
      const AppendKV8Params p) { specdec::pdl_begin();                                                              \
    constexpr int kV = 16 / sizeof(T);                                                        \
    const int nchunks = p.base.head_dim / kV;                                                 \
    if (!p.base.vectorize) append_kv8<T, FMT, 1, 32, 8>(p);                                   \
    else if (nchunks <= 4) append_kv8<T, FMT, kV, 4, 1>(p);                                   \
    else if (nchunks <= 8) append_kv8<T, FMT, kV, 4, 2>(p);                                   \
    else if (nchunks <= 16) append_kv8<T, FMT, kV, 4, 4>(p);                                  \
    else if (nchunks <= 32) append_kv8<T, FMT, kV, 4, 8>(p);                                  \
    else append_kv8<T, FMT, kV, 8, 8>(p);                                                     \
  }
SPECDEC_APPEND_KV8(fp8, KV8_FP8, f32, float)
SPECDEC_APPEND_KV8(fp8, KV8_FP8, f16, __half)
SPECDEC_APPEND_KV8(fp8, KV8_FP8, bf16, bf16_t)
SPECDEC_APPEND_KV8(int8, KV8_INT8, f32, float)
SPECDEC_APPEND_KV8(int8, KV8_INT8, f16, __half)
SPECDEC_APPEND_KV8(int8, KV8_INT8, bf16, bf16_t)
