// Building blocks of the gdn kernels: how a CTA's slice of one head's recurrent state is
// spread over registers, how it is loaded/stored coalesced for both pool layouts, and the
// one delta-rule row step that gdn_verify and gdn_commit share (so that the state the
// commit produces is bit-identical to the one verify computed its outputs from).
#pragma once
#include <stdint.h>
#include <cuda_fp16.h>
#include "common/dtype.cuh"
#include "gdn/gdn_params.h"

namespace specdec {
namespace gdn {

constexpr int kMaxThreads = 256;   // 8 warps
constexpr int kRowChunk = 8;       // block rows staged in shared memory at a time
constexpr int kMaxSliceCols = 128; // Dv columns one CTA owns at most

// ---------------------------------------------------------------- dtype helpers

// Inputs whose dtype is a run-time code (SPECDEC_DT_*): scalar, read-only loads.
__device__ __forceinline__ float load_dt(const void* p, int64_t i, int dt) {
  if (dt == SPECDEC_DT_F32) return __ldg(static_cast<const float*>(p) + i);
  const unsigned short u = __ldg(static_cast<const unsigned short*>(p) + i);
  if (dt == SPECDEC_DT_F16) return __half2float(__ushort_as_half(u));
  return __uint_as_float(static_cast<uint32_t>(u) << 16);
}

// The same load split in two, so that many loads can be in flight at once: load_raw's
// dtype branch holds nothing but the load (the bits, zero-extended for 16-bit types), and
// the conversion, raw_to_float, is a separate step placed after every load of a batch.
// (load_dt converts inside its branch, so a warp waits for each load before it issues
// the next one: staging a row that way costs one memory latency per element.)
__device__ __forceinline__ uint32_t load_raw(const void* p, int64_t i, int dt) {
  if (dt == SPECDEC_DT_F32) return __float_as_uint(__ldg(static_cast<const float*>(p) + i));
  return __ldg(static_cast<const unsigned short*>(p) + i);
}

__device__ __forceinline__ float raw_to_float(uint32_t u, int dt) {
  const float h = __half2float(__ushort_as_half(static_cast<unsigned short>(u)));
  return dt == SPECDEC_DT_F32 ? __uint_as_float(u) : dt == SPECDEC_DT_F16 ? h : __uint_as_float(u << 16);
}

// Same, through the coherent path: for data the kernel itself writes later.
__device__ __forceinline__ float load_dt_rw(const void* p, int64_t i, int dt) {
  if (dt == SPECDEC_DT_F32) return static_cast<const float*>(p)[i];
  const unsigned short u = static_cast<const unsigned short*>(p)[i];
  if (dt == SPECDEC_DT_F16) return __half2float(__ushort_as_half(u));
  return __uint_as_float(static_cast<uint32_t>(u) << 16);
}

__device__ __forceinline__ void store_dt(void* p, int64_t i, int dt, float x) {
  if (dt == SPECDEC_DT_F32) {
    static_cast<float*>(p)[i] = x;
  } else if (dt == SPECDEC_DT_F16) {
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  } else {
    static_cast<uint16_t*>(p)[i] = from_float<bf16_t>(x).bits;
  }
}

// float -> nearest value of the state dtype, kept as float (the state lives in
// registers as float32 and is rounded after every token, as a stored state would be).
template <typename TS> __device__ __forceinline__ float round_state(float x);
template <> __device__ __forceinline__ float round_state<float>(float x) { return x; }
template <> __device__ __forceinline__ float round_state<__half>(float x) {
  return __half2float(__float2half_rn(x));
}
template <> __device__ __forceinline__ float round_state<bf16_t>(float x) {
#if __CUDA_ARCH__ >= 800
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
#else
  return to_float(from_float<bf16_t>(x));   // integer round-to-nearest-even (no bf16 ALU)
#endif
}

// Two 16-bit state values packed in a 32-bit word <-> floats.
template <typename TS> __device__ __forceinline__ void unpack2(uint32_t w, float& lo, float& hi);
template <> __device__ __forceinline__ void unpack2<__half>(uint32_t w, float& lo, float& hi) {
  lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}
template <> __device__ __forceinline__ void unpack2<bf16_t>(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
// The values are already rounded to the state dtype (round_state), so packing is exact.
template <typename TS> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
         (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
}
template <> __device__ __forceinline__ uint32_t pack2<bf16_t>(float lo, float hi) {
  return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
}

// N contiguous state elements <-> float[N], as 16-byte (or 8-byte) vectors.
// NC: read through the non-coherent path (verify: the state is read-only there).
template <typename TS, int N, bool NC>
__device__ __forceinline__ void load_state_vec(const TS* p, float* d) {
  static_assert(N % 4 == 0, "state vectors are 4 or 8 elements");
  if constexpr (sizeof(TS) == 4) {
    const float4* v = reinterpret_cast<const float4*>(p);
#pragma unroll
    for (int u = 0; u < N / 4; ++u) {
      const float4 x = NC ? __ldg(v + u) : v[u];
      d[4 * u] = x.x; d[4 * u + 1] = x.y; d[4 * u + 2] = x.z; d[4 * u + 3] = x.w;
    }
  } else if constexpr (N % 8 == 0) {
    const uint4* v = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int u = 0; u < N / 8; ++u) {
      const uint4 x = NC ? __ldg(v + u) : v[u];
      unpack2<TS>(x.x, d[8 * u + 0], d[8 * u + 1]);
      unpack2<TS>(x.y, d[8 * u + 2], d[8 * u + 3]);
      unpack2<TS>(x.z, d[8 * u + 4], d[8 * u + 5]);
      unpack2<TS>(x.w, d[8 * u + 6], d[8 * u + 7]);
    }
  } else {
    const uint2* v = reinterpret_cast<const uint2*>(p);
    const uint2 x = NC ? __ldg(v) : v[0];
    unpack2<TS>(x.x, d[0], d[1]);
    unpack2<TS>(x.y, d[2], d[3]);
  }
}

template <typename TS, int N>
__device__ __forceinline__ void store_state_vec(TS* p, const float* d) {
  if constexpr (sizeof(TS) == 4) {
    float4* v = reinterpret_cast<float4*>(p);
#pragma unroll
    for (int u = 0; u < N / 4; ++u) v[u] = make_float4(d[4 * u], d[4 * u + 1], d[4 * u + 2], d[4 * u + 3]);
  } else if constexpr (N % 8 == 0) {
    uint4* v = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (int u = 0; u < N / 8; ++u)
      v[u] = make_uint4(pack2<TS>(d[8 * u], d[8 * u + 1]), pack2<TS>(d[8 * u + 2], d[8 * u + 3]),
                        pack2<TS>(d[8 * u + 4], d[8 * u + 5]), pack2<TS>(d[8 * u + 6], d[8 * u + 7]));
  } else {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack2<TS>(d[0], d[1]), pack2<TS>(d[2], d[3]));
  }
}

// ---------------------------------------------------------------- the state tile
//
// A warp owns WARP_COLS = 2*CJ columns (Dv entries) of one head's state, all DK rows
// (Dk entries); a thread holds RI = DK/16 rows x CJ columns as float32 registers
// (32 registers for an f32 state: CJ = 4; 64 for a 16-bit state: CJ = 8, so that each
// thread's vector is 16 bytes either way). The 16 lanes that share columns split the
// Dk rows, so every Dk reduction is a 4-step shuffle inside the warp: no shared memory,
// no __syncthreads in the per-token loop.
//   "kv" ([Dk][Dv], Dv contiguous): lane = 2*lr + lc, rows lr + 16*r, columns lc*CJ + c:
//        a row of the warp's columns is one 16-byte vector per lane, 32 contiguous bytes
//        per lane pair.
//   "vk" ([Dv][Dk], Dk contiguous): lane = 16*lc + lr, rows lr*RI + r (contiguous),
//        columns lc*CJ + c: a column is 16 lanes x RI contiguous elements.
template <typename TS, int DK, bool VK>
struct StateTile {
  static constexpr int RI = DK / 16;
  static constexpr int CJ = sizeof(TS) == 4 ? 4 : 8;
  static constexpr int WARP_COLS = 2 * CJ;
  static_assert(DK == 64 || DK == 128, "Dk must be 64 or 128");

  // The 16 lanes that share columns differ in the lane bits M0, 2*M0, 4*M0, 8*M0; every Dk
  // reduction adds across them in that order (lane_sum and reduce_t build the same tree).
  static constexpr int M0 = VK ? 1 : 2;
  static constexpr int GROUP_BITS = 15 * M0;
  // 32-bit words of the state slice a thread holds, as it lies in memory (16-bit states packed)
  static constexpr int NW = RI * CJ * int(sizeof(TS)) / 4;

  int lr, lc;
  float s[RI][CJ];

  __device__ __forceinline__ explicit StateTile(int lane)
      : lr(VK ? (lane & 15) : (lane >> 1)), lc(VK ? (lane >> 4) : (lane & 1)) {}

  __device__ __forceinline__ int row(int r) const { return VK ? lr * RI + r : lr + 16 * r; }

  // Sum over the 16 lanes that share this thread's columns (every lane gets the total,
  // bit-identical across lanes: each butterfly step adds the same two numbers). The
  // reference add order of every Dk reduction; the kernels use reduce_t (same tree).
  __device__ __forceinline__ static float lane_sum(float x) {
#pragma unroll
    for (int m = (VK ? 1 : 2); m <= (VK ? 8 : 16); m <<= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
  }

  // The thread's slice of the state as raw words (w) only: the loads are issued and nothing
  // waits for them until unpack(w). The persistent kernels fetch the next item's state this
  // way while they work on the current one (w: 32 registers for Dk = 128, whatever the dtype).
  // head: this (slot, value head)'s [Dk][Dv] or [Dv][Dk] block; col: the thread's first column.
  template <bool NC>
  __device__ __forceinline__ void fetch(const TS* head, int col, int Dv, uint32_t (&w)[NW]) const {
    if constexpr (!VK) {   // one 16-byte vector per row: CJ * sizeof(TS) == 16
#pragma unroll
      for (int r = 0; r < RI; ++r) {
        const uint4* v = reinterpret_cast<const uint4*>(head + int64_t(row(r)) * Dv + col);
        const uint4 x = NC ? __ldg(v) : *v;
        w[4 * r] = x.x; w[4 * r + 1] = x.y; w[4 * r + 2] = x.z; w[4 * r + 3] = x.w;
      }
    } else {               // per column, RI contiguous elements
      constexpr int WPC = RI * int(sizeof(TS)) / 4;
#pragma unroll
      for (int c = 0; c < CJ; ++c) {
        const TS* e = head + int64_t(col + c) * DK + lr * RI;
        if constexpr (WPC % 4 == 0) {
#pragma unroll
          for (int u = 0; u < WPC / 4; ++u) {
            const uint4* v = reinterpret_cast<const uint4*>(e) + u;
            const uint4 x = NC ? __ldg(v) : *v;
            w[c * WPC + 4 * u] = x.x; w[c * WPC + 4 * u + 1] = x.y;
            w[c * WPC + 4 * u + 2] = x.z; w[c * WPC + 4 * u + 3] = x.w;
          }
        } else {
          const uint2* v = reinterpret_cast<const uint2*>(e);
          const uint2 x = NC ? __ldg(v) : *v;
          w[c * WPC] = x.x; w[c * WPC + 1] = x.y;
        }
      }
    }
  }

  // fetch's words -> s (16-bit values widened exactly).
  __device__ __forceinline__ void unpack(const uint32_t (&w)[NW]) {
    if constexpr (!VK) {
#pragma unroll
      for (int r = 0; r < RI; ++r) {
        if constexpr (sizeof(TS) == 4) {
#pragma unroll
          for (int c = 0; c < CJ; ++c) s[r][c] = __uint_as_float(w[4 * r + c]);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) unpack2<TS>(w[4 * r + j], s[r][2 * j], s[r][2 * j + 1]);
        }
      }
    } else {
      constexpr int WPC = RI * int(sizeof(TS)) / 4;
#pragma unroll
      for (int c = 0; c < CJ; ++c) {
        if constexpr (sizeof(TS) == 4) {
#pragma unroll
          for (int r = 0; r < RI; ++r) s[r][c] = __uint_as_float(w[c * WPC + r]);
        } else {
#pragma unroll
          for (int j = 0; j < RI / 2; ++j) unpack2<TS>(w[c * WPC + j], s[2 * j][c], s[2 * j + 1][c]);
        }
      }
    }
  }

  __device__ __forceinline__ void store(TS* head, int col, int Dv) const {
    if constexpr (!VK) {
#pragma unroll
      for (int r = 0; r < RI; ++r) store_state_vec<TS, CJ>(head + int64_t(row(r)) * Dv + col, s[r]);
    } else {
#pragma unroll
      for (int c = 0; c < CJ; ++c) {
        float t[RI];
#pragma unroll
        for (int r = 0; r < RI; ++r) t[r] = s[r][c];
        store_state_vec<TS, RI>(head + int64_t(col + c) * DK + lr * RI, t);
      }
    }
  }

  // Where Dk entry i of a vector staged in shared memory lives: permuted so that the RI
  // entries a thread needs (rows row(0..RI-1)) are contiguous (16-byte shared loads).
  __device__ __forceinline__ static int stage_idx(int i) { return VK ? i : (i & 15) * RI + (i >> 4); }

  // This thread's RI entries of a Dk vector staged in shared memory (at stage_idx order).
  __device__ __forceinline__ void gather(const float* vec, float (&x)[RI]) const {
#pragma unroll
    for (int u = 0; u < RI / 4; ++u) {
      const float4 f = reinterpret_cast<const float4*>(vec + lr * RI)[u];
      x[4 * u] = f.x; x[4 * u + 1] = f.y; x[4 * u + 2] = f.z; x[4 * u + 3] = f.w;
    }
  }

  // Per-lane partial dot products of N column values (x[0..N-1]) -> each summed over the 16
  // lanes that share columns, transposed: at each step a lane keeps half of its values and
  // sends the other half to its partner, so N = 8 takes 4 + 2 + 1 (+ 1) shuffles instead of
  // 8 x 4. Every value is added over the same tree as lane_sum (partner bits M0, 2M0, 4M0,
  // 8M0 in that order; a + b == b + a), so the sums are bit-identical to lane_sum's.
  // Returns the lane's value: the one with index value_index(lane).
  template <int N, int K = 0>
  __device__ __forceinline__ static float reduce_t(float* x, int lane) {
    static_assert(N >= 1 && N <= 16 && (N & (N - 1)) == 0, "N: a power of two <= 16");
    if constexpr (K == 4) {
      static_assert(N == 1, "more values than lanes");
      return x[0];
    } else {
      constexpr int M = M0 << K;
      if constexpr (N == 1) {
        x[0] += __shfl_xor_sync(0xffffffffu, x[0], M);
      } else {
        const bool up = (lane & M) != 0;   // keeps the upper half
#pragma unroll
        for (int j = 0; j < N / 2; ++j) {
          const float send = up ? x[j] : x[j + N / 2];
          const float keep = up ? x[j + N / 2] : x[j];
          x[j] = keep + __shfl_xor_sync(0xffffffffu, send, M);
        }
      }
      return reduce_t<(N > 1 ? N / 2 : 1), K + 1>(x, lane);
    }
  }

  // Which of reduce_t<N>'s values a lane holds, and a lane (of this lane's 16) holding value i.
  template <int N>
  __device__ __forceinline__ static int value_index(int lane) {
    int idx = 0;
#pragma unroll
    for (int k = 0; (N >> (k + 1)) > 0; ++k) idx += (lane & (M0 << k)) ? (N >> (k + 1)) : 0;
    return idx;
  }
  template <int N>
  __device__ __forceinline__ static int lane_of_value(int lane, int i) {
    int src = lane & ~GROUP_BITS;
#pragma unroll
    for (int k = 0; (N >> (k + 1)) > 0; ++k) src |= (i & (N >> (k + 1))) ? (M0 << k) : 0;
    return src;
  }
  // reduce_t leaves each value in 16 / N lanes: true in exactly one of them.
  template <int N>
  __device__ __forceinline__ static bool first_copy(int lane) {
    int bits = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) bits |= (N >> (k + 1)) > 0 ? 0 : (M0 << k);
    return (lane & bits) == 0;
  }

  // This thread's partial (S^T x)[c] over its RI rows (the Dk order of dot()).
  __device__ __forceinline__ void partial_dot(const float (&x)[RI], float* out) const {
#pragma unroll
    for (int c = 0; c < CJ; ++c) {
      float acc = 0.f;
#pragma unroll
      for (int r = 0; r < RI; ++r) acc = fmaf(s[r][c], x[r], acc);
      out[c] = acc;
    }
  }

  // The delta rule's state update for one token, given delta = beta (v - decay S^T k):
  //   S <- round(decay * S + k delta^T)
  template <typename TSR>
  __device__ __forceinline__ void update(float decay, const float (&k)[RI], const float (&delta)[CJ]) {
#pragma unroll
    for (int r = 0; r < RI; ++r)
#pragma unroll
      for (int c = 0; c < CJ; ++c) s[r][c] = round_state<TSR>(fmaf(decay, s[r][c], k[r] * delta[c]));
  }
};

// delta = beta * (v - decay * (S^T k)): the one formula verify and commit share.
__device__ __forceinline__ float delta_of(float beta, float v, float decay, float sk) {
  return beta * (v - decay * sk);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

}  // namespace gdn
}  // namespace specdec
