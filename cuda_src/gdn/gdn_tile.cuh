// Building blocks of the gdn kernels: how a CTA's slice of one head's recurrent state is
// spread over registers, how it is loaded/stored coalesced for both pool layouts, and the
// one delta-rule row step that gdn_verify and gdn_commit share (so that the state the
// commit produces is bit-identical to the one verify computed its outputs from).
#pragma once
#include <stdint.h>
#include <cuda_fp16.h>
#include "common/dtype.cuh"
#include "common/mma.cuh"
#include "common/warp.cuh"
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

// Two floats -> the nearest values of the state dtype, kept as floats: round_state on each, bit
// for bit (round to nearest even; sm_80+ NaN -> the canonical NaN, as cvt.rn.bf16.f32), but one
// paired conversion for both (cvt.rn.{bf16,f16}x2.f32: one F2FP, on the ALU pipe) and one
// widening op per value (bf16: a shift or a mask; f16: HADD2.F32), 1.5 instructions per value
// instead of 2 (sm_90 bf16 was F2F.BF16.F32, a conversion-unit op, + a shift per value).
template <typename TS> __device__ __forceinline__ void round_state2(float& a, float& b);
template <> __device__ __forceinline__ void round_state2<float>(float&, float&) {}
template <> __device__ __forceinline__ void round_state2<__half>(float& a, float& b) {
#if __CUDA_ARCH__ >= 800
  uint32_t w;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(b), "f"(a));   // a -> low half
  a = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  b = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
#else
  a = round_state<__half>(a);
  b = round_state<__half>(b);
#endif
}
template <> __device__ __forceinline__ void round_state2<bf16_t>(float& a, float& b) {
#if __CUDA_ARCH__ >= 800
  uint32_t w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(b), "f"(a));  // a -> low half
  a = __uint_as_float(w << 16);
  b = __uint_as_float(w & 0xffff0000u);
#else
  a = round_state<bf16_t>(a);
  b = round_state<bf16_t>(b);
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
// no __syncthreads in the per-token loop. The CJ column sums are reduce-scattered (each
// step hands half of the columns to the partner lane: CJ - 1 + 4 - log2(CJ) shuffles for
// all CJ columns instead of 4 per column), so a lane ends with one column's total.
//   "kv" ([Dk][Dv], Dv contiguous): lane = 2*lr + lc, rows lr + 16*r, columns lc*CJ + c:
//        a row of the warp's columns is one 16-byte vector per lane, 32 contiguous bytes
//        per lane pair.
//   "vk" ([Dv][Dk], Dk contiguous): lane = 16*lc + lr, rows lr*RI + r (contiguous),
//        columns lc*CJ + c: a column is 16 lanes x RI contiguous elements.
// CJX: columns per thread, 4 or 8; 0 picks the default above (4 for f32, 8 for 16-bit).
// gdn_verify uses 8 for every dtype but f32 with Dk = 64 (gdn.cu verify_cj), gdn_commit too except
// for f32 "vk" (commit_cj). Each column's sums are
// the same FMA chain over the same rows and the same butterfly tree for any CJ (see
// reduce_scatter), so the two agree bit for bit.
template <typename TS, int DK, bool VK, int CJX = 0>
struct StateTile {
  static constexpr int RI = DK / 16;
  static constexpr int CJ = CJX != 0 ? CJX : sizeof(TS) == 4 ? 4 : 8;
  static_assert(CJ == 4 || CJ == 8, "4 or 8 columns per thread");
  static constexpr int WARP_COLS = 2 * CJ;
  static constexpr int LOG_CJ = CJ == 4 ? 2 : 3;
  // gdn_verify's column placement (load_head_nc, piece_off): a thread's CJ columns are NP pieces
  // of SPAN (one 16-byte vector each), the lane pair's pieces interleaved (piece u of lane lc
  // at warp column u * 2 * SPAN + lc * SPAN), so each kv load instruction reads 32 contiguous
  // bytes per lane pair. NP = 1 (f32 CJ 4, 16-bit CJ 8): columns lc * CJ + c, as load/store.
  static constexpr int SPAN = CJ * int(sizeof(TS)) > 16 ? 16 / int(sizeof(TS)) : CJ;
  static constexpr int NP = CJ / SPAN;
  // column c's offset from the thread's first column (col0 = warp's first + lc * SPAN)
  __device__ __forceinline__ static constexpr int piece_off(int c) { return (c / SPAN) * 2 * SPAN + c % SPAN; }
  static_assert(DK == 64 || DK == 128, "Dk must be 64 or 128");

  int lr, lc;
  float s[RI][CJ];

  __device__ __forceinline__ explicit StateTile(int lane)
      : lr(VK ? (lane & 15) : (lane >> 1)), lc(VK ? (lane >> 4) : (lane & 1)) {}

  __device__ __forceinline__ int row(int r) const { return VK ? lr * RI + r : lr + 16 * r; }

  // Shuffle mask of reduction step i: the lanes that share columns differ in lr's bits,
  // which are lane bits 0..3 ("vk") or 1..4 ("kv").
  __device__ __forceinline__ static constexpr int step_mask(int i) { return (VK ? 1 : 2) << i; }

  // The column (0..CJ-1, relative to the thread's first) whose total reduce_scatter leaves in
  // this lane: step i keeps the upper half of the remaining columns when lr's bit i is set.
  __device__ __forceinline__ int red_col() const {
    int c = 0;
#pragma unroll
    for (int i = 0; i < LOG_CJ; ++i) c += ((lr >> i) & 1) * (CJ >> (i + 1));
    return c;
  }
  // One lane per column writes a reduced value: the lanes whose all-reduce bits are 0.
  __device__ __forceinline__ bool red_writer() const { return (lr >> LOG_CJ) == 0; }

  // Sums a[c] over the 16 lanes that share this thread's columns and returns the total of
  // column red_col() (a[] is clobbered). Every total is bit-identical in all the lanes that
  // hold it, and to a per-column butterfly over the same masks: at each step the same two
  // partial sums are added (own + partner's), only which lane keeps which column differs.
  __device__ __forceinline__ float reduce_scatter(float (&a)[CJ]) const {
#pragma unroll
    for (int i = 0; i < LOG_CJ; ++i) {
      const int h = CJ >> (i + 1);
      const bool up = (lr >> i) & 1;
#pragma unroll
      for (int j = 0; j < h; ++j) {
        const float send = up ? a[j] : a[j + h];
        const float keep = up ? a[j + h] : a[j];
        a[j] = keep + __shfl_xor_sync(0xffffffffu, send, step_mask(i));
      }
    }
    float x = a[0];
#pragma unroll
    for (int i = LOG_CJ; i < 4; ++i) x += __shfl_xor_sync(0xffffffffu, x, step_mask(i));
    return x;
  }

  // The inverse of reduce_scatter's placement: x is this lane's value of column red_col();
  // d[c] receives column c's value (copies of what its holders computed: bit-identical).
  __device__ __forceinline__ void all_gather(float x, float (&d)[CJ]) const {
    d[0] = x;
#pragma unroll
    for (int i = LOG_CJ - 1; i >= 0; --i) {
      const int h = CJ >> (i + 1);
      const bool up = (lr >> i) & 1;
      float r[CJ / 2];
#pragma unroll
      for (int j = 0; j < h; ++j) r[j] = __shfl_xor_sync(0xffffffffu, d[j], step_mask(i));
#pragma unroll
      for (int j = 0; j < h; ++j) {
        const float own = d[j];
        d[j] = up ? r[j] : own;
        d[j + h] = up ? own : r[j];
      }
    }
  }

  // head: this (slot, value head)'s [Dk][Dv] or [Dv][Dk] block; col: the thread's first column
  template <bool NC>
  __device__ __forceinline__ void load(const TS* head, int col, int Dv) {
    if constexpr (!VK) {
#pragma unroll
      for (int r = 0; r < RI; ++r) load_state_vec<TS, CJ, NC>(head + int64_t(row(r)) * Dv + col, s[r]);
    } else {
#pragma unroll
      for (int c = 0; c < CJ; ++c) {
        float t[RI];
        load_state_vec<TS, RI, NC>(head + int64_t(col + c) * DK + lr * RI, t);
#pragma unroll
        for (int r = 0; r < RI; ++r) s[r][c] = t[r];
      }
    }
  }

  // gdn_verify's load<true>: the same 16-byte loads, with the offsets inside the head in 32 bits
  // (a head is Dk x Dv <= 128 x 1024 elements) from one 64-bit base, so a load costs one
  // IMAD.WIDE or an immediate offset instead of a 64-bit multiply-add chain. col0: the thread's
  // first column; column c is col0 + piece_off(c) (with NP = 1, the columns load() reads).
  // NC: through the non-coherent path (verify); gdn_commit reads coherently (load_head<false>)
  // and writes the same elements back with store_head.
  template <bool NC>
  __device__ __forceinline__ void load_head(const TS* head, int col0, int Dv) {
    if constexpr (!VK) {
      const TS* b = head + (lr * Dv + col0);
      const int step = 16 * Dv;   // row(r + 1) - row(r), times Dv
#pragma unroll
      for (int r = 0; r < RI; ++r)
#pragma unroll
        for (int u = 0; u < NP; ++u) load_state_vec<TS, SPAN, NC>(b + r * step + u * 2 * SPAN, s[r] + u * SPAN);
    } else {
      const TS* b = head + (col0 * DK + lr * RI);
#pragma unroll
      for (int c = 0; c < CJ; ++c) {
        float t[RI];
        load_state_vec<TS, RI, NC>(b + piece_off(c) * DK, t);
#pragma unroll
        for (int r = 0; r < RI; ++r) s[r][c] = t[r];
      }
    }
  }
  __device__ __forceinline__ void load_head_nc(const TS* head, int col0, int Dv) { load_head<true>(head, col0, Dv); }

  // load_head's placement and addressing, stored (gdn_commit): each kv store instruction writes
  // 32 contiguous bytes per lane pair (whole sectors) for any CJ.
  __device__ __forceinline__ void store_head(TS* head, int col0, int Dv) const {
    if constexpr (!VK) {
      TS* b = head + (lr * Dv + col0);
      const int step = 16 * Dv;
#pragma unroll
      for (int r = 0; r < RI; ++r)
#pragma unroll
        for (int u = 0; u < NP; ++u) store_state_vec<TS, SPAN>(b + r * step + u * 2 * SPAN, s[r] + u * SPAN);
    } else {
      TS* b = head + (col0 * DK + lr * RI);
#pragma unroll
      for (int c = 0; c < CJ; ++c) {
        float t[RI];
#pragma unroll
        for (int r = 0; r < RI; ++r) t[r] = s[r][c];
        store_state_vec<TS, RI>(b + piece_off(c) * DK, t);
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

  // This thread's RI entries of a Dk vector staged in shared memory.
  __device__ __forceinline__ void gather(const float* vec, float (&x)[RI]) const {
    if constexpr (VK) {
#pragma unroll
      for (int u = 0; u < RI / 4; ++u) {
        const float4 f = reinterpret_cast<const float4*>(vec + lr * RI)[u];
        x[4 * u] = f.x; x[4 * u + 1] = f.y; x[4 * u + 2] = f.z; x[4 * u + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int r = 0; r < RI; ++r) x[r] = vec[row(r)];
    }
  }

  // (S^T k) for all CJ columns in every lane: a butterfly per column over the same masks as
  // reduce_scatter, adding the same two partial sums at every step, so each total is
  // bit-identical to the one reduce_scatter leaves in its lane. gdn_commit uses this: its loop
  // is latency bound, and 4 independent butterflies are a shorter chain than reduce_scatter +
  // all_gather (vk: 78 -> 87 us with the latter; kv unchanged, 91 us: its s3 loss, 91 -> 102,
  // came from the staging's shift/mask index split, see gdn_commit_impl).
  __device__ __forceinline__ void dot_all(const float (&k)[RI], float (&out)[CJ]) const {
#pragma unroll
    for (int c = 0; c < CJ; ++c) {
      float acc = 0.f;
#pragma unroll
      for (int r = 0; r < RI; ++r) acc = fmaf(s[r][c], k[r], acc);
#pragma unroll
      for (int i = 0; i < 4; ++i) acc += __shfl_xor_sync(0xffffffffu, acc, step_mask(i));
      out[c] = acc;
    }
  }

  // This thread's partial of (S^T k) for its CJ columns (reduce_scatter completes it).
  __device__ __forceinline__ void partial_dot(const float (&k)[RI], float (&out)[CJ]) const {
#pragma unroll
    for (int c = 0; c < CJ; ++c) {
      float acc = 0.f;
#pragma unroll
      for (int r = 0; r < RI; ++r) acc = fmaf(s[r][c], k[r], acc);
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
      for (int c = 0; c < CJ; c += 2) {   // rounded in pairs (round_state2: the same bits)
        float a = fmaf(decay, s[r][c], k[r] * delta[c]), b = fmaf(decay, s[r][c + 1], k[r] * delta[c + 1]);
        round_state2<TSR>(a, b);
        s[r][c] = a;
        s[r][c + 1] = b;
      }
  }
};

// ---------------------------------------------------------------- the 16-bit tensor-core tile
//
// 16-bit states (sm_80+, the "mma" kernels): the two Dk reductions of a row (S^T k, S^T q) on the
// tensor cores instead of 2 FFMAs per element plus shuffle trees. A bf16 or f16 value is exactly
// a tf32 number, so the state, as kept in float registers (rounded after every row), is an exact
// tf32 A operand; the f32 vectors are split into tf32 hi + lo columns of B (split_tf32), so each
// dot is taken to about f32 precision: B = [k_hi, k_lo, q_hi, q_lo, 0, 0, 0, 0] (commit: k only),
// D = S^T B, and sk = D[:, 0] + D[:, 1], sq = D[:, 2] + D[:, 3]. The update stays on the CUDA
// cores (one FMUL + FFMA per element, rounded in pairs: round_state2).
// A warp owns WARP_COLS = 16 state columns (the mma's M), all DK rows (its K). Lane (g, t) =
// (lane / 4, lane % 4) holds columns 2g, 2g + 1 (M indices g, g + 8) and the RI = DK / 4 rows
// t*RI .. t*RI + RI - 1: K index 8j + t + 4h of k-step j is Dk row t*RI + 2j + h, for A and B
// alike, so a lane's B entries are RI contiguous floats of a staged vector and its "kv" state
// words are the two columns of one row (one 32-bit load per row, 32 bytes per 8 lanes), its "vk"
// columns RI contiguous elements (RI / 8 16-byte loads each). Staged Dk vectors are padded to
// PAD floats per t block (pad()), so the 4 t addresses of an LDS.128 phase hit distinct banks.
// Every column's sums come from the same instructions on the same operands in verify, commit and
// the fused kernel, one row or many: states and outputs are bit-identical across them.
template <typename TS, int DK, bool VK>
struct MmaTile {
  static_assert(sizeof(TS) == 2, "16-bit states only");
  static_assert(DK == 64 || DK == 128, "Dk must be 64 or 128");
  static constexpr int RI = DK / 4;        // Dk rows per lane
  static constexpr int PAD = RI + 4;       // floats per t block of a staged vector
  static constexpr int VLEN = 4 * PAD;     // floats per staged (padded) Dk vector
  static constexpr int WARP_COLS = 16;
  static constexpr int STEPS = DK / 8;     // m16n8k8 k-steps per dot

  int g, t;
  float s[RI][2];   // [row t*RI + r][column 2g + c]

  __device__ __forceinline__ explicit MmaTile(int lane) : g(lane >> 2), t(lane & 3) {}

  // position of Dk entry i in a staged (padded) vector
  __device__ __forceinline__ static constexpr int pad(int i) { return i + 4 * (i / RI); }

  // head: this (slot, value head)'s [Dk][Dv] or [Dv][Dk] block; col0: the warp's first column.
  template <bool NC>
  __device__ __forceinline__ void load_head(const TS* head, int col0, int Dv) {
    if constexpr (!VK) {
      const uint32_t* b = reinterpret_cast<const uint32_t*>(head + (t * RI * Dv + col0 + 2 * g));
      const int step = Dv / 2;   // words per row
#pragma unroll
      for (int r = 0; r < RI; ++r) {
        const uint32_t w = NC ? __ldg(b + r * step) : b[r * step];
        unpack2<TS>(w, s[r][0], s[r][1]);
      }
    } else {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float x[RI];
        load_state_vec<TS, RI, NC>(head + ((col0 + 2 * g + c) * DK + t * RI), x);
#pragma unroll
        for (int r = 0; r < RI; ++r) s[r][c] = x[r];
      }
    }
  }

  // load_head's placement, stored (the values are rounded already: packing is exact)
  __device__ __forceinline__ void store_head(TS* head, int col0, int Dv) const {
    if constexpr (!VK) {
      uint32_t* b = reinterpret_cast<uint32_t*>(head + (t * RI * Dv + col0 + 2 * g));
      const int step = Dv / 2;
#pragma unroll
      for (int r = 0; r < RI; ++r) b[r * step] = pack2<TS>(s[r][0], s[r][1]);
    } else {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float x[RI];
#pragma unroll
        for (int r = 0; r < RI; ++r) x[r] = s[r][c];
        store_state_vec<TS, RI>(head + ((col0 + 2 * g + c) * DK + t * RI), x);
      }
    }
  }

  // D = S^T B over the NV staged vectors at b (b + n * VLEN, n < NV; the lanes of columns n >= NV
  // read `zero`, VLEN zeros). x0, x1: D[2g][2t] + D[2g][2t+1] and the same for column 2g + 1,
  // i.e. in lanes t = 0 the S^T of vectors 0 + 1 (k_hi + k_lo), in lanes t = 1 of vectors 2 + 3.
  // Two accumulator chains (even / odd k-steps), added in a fixed order.
  template <int NV>
  __device__ __forceinline__ void dots(const float* b, const float* zero, float& x0, float& x1) const {
    const float4* p = reinterpret_cast<const float4*>((g < NV ? b + g * VLEN : zero) + t * PAD);
    float da[4] = {0.f, 0.f, 0.f, 0.f}, db[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < STEPS / 2; ++u) {
      const float4 f = p[u];   // k-steps 2u (x, y) and 2u + 1 (z, w)
      mma_m16n8k8_tf32(da, s[4 * u][0], s[4 * u][1], s[4 * u + 1][0], s[4 * u + 1][1], f.x, f.y);
      mma_m16n8k8_tf32(db, s[4 * u + 2][0], s[4 * u + 2][1], s[4 * u + 3][0], s[4 * u + 3][1], f.z, f.w);
    }
    x0 = (da[0] + db[0]) + (da[1] + db[1]);
    x1 = (da[2] + db[2]) + (da[3] + db[3]);
  }

  // this lane's RI entries of a staged (padded) Dk vector: RI / 4 LDS.128
  __device__ __forceinline__ void gather(const float* vec, float (&x)[RI]) const {
    const float4* f = reinterpret_cast<const float4*>(vec + t * PAD);
#pragma unroll
    for (int u = 0; u < RI / 4; ++u) {
      const float4 y = f[u];
      x[4 * u] = y.x; x[4 * u + 1] = y.y; x[4 * u + 2] = y.z; x[4 * u + 3] = y.w;
    }
  }

  // S <- round(decay * S + k delta^T) for this lane's two columns (delta d0, d1), as StateTile
  template <typename TSR>
  __device__ __forceinline__ void update(float decay, const float (&k)[RI], float d0, float d1) {
#pragma unroll
    for (int r = 0; r < RI; ++r) {
      float a = fmaf(decay, s[r][0], k[r] * d0), b = fmaf(decay, s[r][1], k[r] * d1);
      round_state2<TSR>(a, b);
      s[r][0] = a;
      s[r][1] = b;
    }
  }
};

// ---------------------------------------------------------------- the f32 WY tile
//
// The layout of the chunked (WY) path of an f32 state: a thread holds ONE column (Dv
// entry) and R = DK/4 contiguous rows (Dk entries); the 4 lanes of a quad (lane & 3) split
// Dk, the 8 quads of a warp own 8 adjacent columns (WARP_COLS = 8, as StateTile<float>, so
// the launch shape is the same). A Dk reduction is then 2 shuffles, and after it every lane
// of the quad holds the full dot products of its column, which is what the per-column
// triangular recurrence needs (no transposition, no selects).
//   "kv": the thread's R values are one per state row (scalar loads; a warp instruction is
//         4 rows x 32 contiguous bytes). "vk": R contiguous floats (R/4 16-byte loads).
// Staged Dk vectors are stored padded (4 floats after every R), so the 4 distinct 16-byte
// addresses of a quad's LDS.128 fall in different banks.
template <int DK, bool VK>
struct WyTile {
  static constexpr int R = DK / 4;
  static constexpr int WARP_COLS = 8;
  static constexpr int STRIDE = DK + 16;   // floats per staged (padded) Dk vector
  static_assert(DK == 64 || DK == 128, "Dk must be 64 or 128");

  int lr, lc;
  float s[R];

  __device__ __forceinline__ explicit WyTile(int lane) : lr(lane & 3), lc(lane >> 2) {}

  // position of Dk entry i in a staged vector
  __device__ __forceinline__ static int pad(int i) { return i + 4 * (i / R); }

  __device__ __forceinline__ static float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
  }

  template <bool NC>
  __device__ __forceinline__ void load(const float* head, int col, int Dv) {
    if constexpr (VK) {
      const float4* v = reinterpret_cast<const float4*>(head + int64_t(col) * DK + lr * R);
#pragma unroll
      for (int u = 0; u < R / 4; ++u) {
        const float4 x = NC ? __ldg(v + u) : v[u];
        s[4 * u] = x.x; s[4 * u + 1] = x.y; s[4 * u + 2] = x.z; s[4 * u + 3] = x.w;
      }
    } else {
      const float* c = head + int64_t(lr) * R * Dv + col;
#pragma unroll
      for (int r = 0; r < R; ++r) s[r] = NC ? __ldg(c + int64_t(r) * Dv) : c[int64_t(r) * Dv];
    }
  }

  __device__ __forceinline__ void store(float* head, int col, int Dv) const {
    if constexpr (VK) {
      float4* v = reinterpret_cast<float4*>(head + int64_t(col) * DK + lr * R);
#pragma unroll
      for (int u = 0; u < R / 4; ++u) v[u] = make_float4(s[4 * u], s[4 * u + 1], s[4 * u + 2], s[4 * u + 3]);
    } else {
      float* c = head + int64_t(lr) * R * Dv + col;
#pragma unroll
      for (int r = 0; r < R; ++r) c[int64_t(r) * Dv] = s[r];
    }
  }

  // this thread's R entries of a staged (padded) Dk vector: R/4 LDS.128
  __device__ __forceinline__ void gather(const float* vec, float (&x)[R]) const {
    const float4* f = reinterpret_cast<const float4*>(vec + lr * (R + 4));
#pragma unroll
    for (int u = 0; u < R / 4; ++u) {
      const float4 y = f[u];
      x[4 * u] = y.x; x[4 * u + 1] = y.y; x[4 * u + 2] = y.z; x[4 * u + 3] = y.w;
    }
  }

  // this thread's partial of (S^T x)[col] (1 FMA per element; quad_sum completes it)
  __device__ __forceinline__ float partial_dot(const float (&x)[R]) const {
    float acc = 0.f;   // one chain: the 2 q products of a chunk interleave anyway
#pragma unroll
    for (int r = 0; r < R; ++r) acc = fmaf(s[r], x[r], acc);
    return acc;
  }
};

// delta = beta * (v - decay * (S^T k)): the one formula verify and commit share.
__device__ __forceinline__ float delta_of(float beta, float v, float decay, float sk) {
  return beta * (v - decay * sk);
}

}  // namespace gdn
}  // namespace specdec
