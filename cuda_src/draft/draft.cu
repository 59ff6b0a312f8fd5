// draft family: what the drafter needs from the target each round, and the weight-free
// prompt-lookup drafter (ngram_propose, in draft/ngram.cuh).
// Semantics: specdec_lib/reference/draft.py.
//
// The first four ops are memory-bound gathers/elementwise passes over at most a few rows of
// H elements per sequence, so the design goals are 16-byte accesses where the layout
// allows (the launcher decides and passes a flag or picks the unit size), several loads
// in flight per thread before any store, and never trusting an index read from memory:
// a bad cu_q / accept_len / token id gives a zero row or -1, never an out-of-bounds read.
#include "common/dtype.cuh"
#include "common/pdl.cuh"
#include "common/pack.cuh"
#include "common/rms_norm.cuh"
#include "draft/draft_params.h"
#include "draft/ngram.cuh"

using namespace specdec;

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;        // independent vector loads per thread before the stores
constexpr int kCombineMaxThreads = 512;

template <int U> struct unit { using type = typename storage<U>::type; };
template <> struct unit<16> { using type = uint4; };

// ------------------------------------------------------------------ draft_carry
// hidden [T_local, H_local] -> out [B, H_out]; grid (column chunks, sequences). The CTA
// of sequence b finds its row once (two index loads), then moves kUnroll units per thread.
template <int U>
__device__ __forceinline__ void draft_carry(const DraftCarryParams& p) {
  using V = typename unit<U>::type;
  const int64_t chunk = static_cast<int64_t>(kUnroll) * blockDim.x;
  const int64_t u0 = blockIdx.x * chunk + threadIdx.x;
  for (int b = blockIdx.y; b < p.batch; b += gridDim.y) {
    const int a = __ldg(p.accept_len + b);
    const int64_t local = static_cast<int64_t>(__ldg(p.cu_q + b)) + a - 1 - p.row_begin;
    const bool owned = a > 0 && local >= 0 && local < p.num_rows;
    const V* src = reinterpret_cast<const V*>(static_cast<const char*>(p.hidden) +
                                              (owned ? local : 0) * p.hidden_stride) - p.col_begin;
    V* dst = reinterpret_cast<V*>(static_cast<char*>(p.out) + b * p.out_stride);
    V v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t u = u0 + j * blockDim.x;
      const bool mine = owned && u >= p.col_begin && u < p.col_begin + p.hidden_units;
      v[j] = mine ? __ldg(src + u) : V{};
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t u = u0 + j * blockDim.x;
      if (u < p.out_units) dst[u] = v[j];
    }
  }
}

// ------------------------------------------------------------------ capture_hidden
// hidden (+ residual) [T, H] -> out[:, tap*H:(tap+1)*H] (out pre-offset). Grid (rows,
// column chunks); each thread adds in float and rounds once to T.
template <typename T, int N>
__device__ __forceinline__ void capture_rows(const CaptureHiddenParams& p) {
  const int units = p.width / N;
  const int c0 = blockIdx.y * kUnroll * blockDim.x + threadIdx.x;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(p.hidden) + r * p.hidden_stride;
    const T* res = static_cast<const T*>(p.residual) + r * p.residual_stride;
    T* y = static_cast<T*>(p.out) + r * p.out_stride;
    Pack<T, N> v[kUnroll], w[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int u = c0 + j * blockDim.x;
      if (u < units) {
        v[j] = load_pack<T, N>(x + u * N);
        if (p.residual != nullptr) w[j] = load_pack<T, N>(res + u * N);
      }
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int u = c0 + j * blockDim.x;
      if (u >= units) continue;
      if (p.residual != nullptr) {
#pragma unroll
        for (int i = 0; i < N; ++i)
          v[j].e[i] = from_float<T>(to_float(v[j].e[i]) + to_float(w[j].e[i]));
      }
      store_pack<T, N>(y + u * N, v[j]);
    }
  }
}

template <typename T>
__device__ __forceinline__ void capture_hidden(const CaptureHiddenParams& p) {
  if (p.vectorize) capture_rows<T, 16 / sizeof(T)>(p);
  else capture_rows<T, 1>(p);
}

// ------------------------------------------------------------------ draft_combine
// embed/hidden [rows, H] (or the table [vocab, H] + token_ids) -> out [rows, 2H]; grid
// (rows, 2): blockIdx.y = 0 normalises the embedding into columns 0..H, 1 the hidden
// state into H..2H, so the two halves' reductions run in parallel CTAs.
template <typename T, typename W, int N>
__device__ __forceinline__ void combine_rows(const DraftCombineParams& p, float* smem) {
  const bool embed_half = blockIdx.y == 0;
  const W* w = static_cast<const W*>(embed_half ? p.embed_weight : p.hidden_weight);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    T* y = static_cast<T*>(p.out) + r * p.out_stride + (embed_half ? 0 : p.width);
    const T* x;
    if (embed_half) {
      int64_t row = r;
      if (p.token_ids != nullptr) {
        row = p.ids_64 ? static_cast<int64_t>(__ldg(static_cast<const long long*>(p.token_ids) + r))
                       : static_cast<int64_t>(__ldg(static_cast<const int32_t*>(p.token_ids) + r));
        if (row < 0 || row >= p.vocab) {   // unknown token: a zero embedding half
          for (int i = threadIdx.x; i < p.width; i += blockDim.x) y[i] = from_float<T>(0.f);
          continue;                         // uniform over the CTA: no barrier is skipped by some
        }
      }
      x = static_cast<const T*>(p.embed) + row * p.embed_stride;
    } else {
      x = static_cast<const T*>(p.hidden) + r * p.hidden_stride;
    }
    rms_norm_row<T, W, N>(x, nullptr, nullptr, w, y, p.width, p.eps, p.unit_offset, p.vectorize,
                          smem);
  }
}

template <typename T, typename W>
__device__ __forceinline__ void draft_combine(const DraftCombineParams& p) {
  __shared__ float smem[32];
  combine_rows<T, W, 16 / sizeof(T)>(p, smem);   // p.vectorize picks the access, not the order
}

}  // namespace

#define SPECDEC_DRAFT_CARRY(U)                                                          \
  extern "C" __global__ void __launch_bounds__(kThreads) draft_carry_v##U(const DraftCarryParams p) { specdec::pdl_begin(); \
    draft_carry<U>(p);                                                                  \
  }
SPECDEC_DRAFT_CARRY(1)
SPECDEC_DRAFT_CARRY(2)
SPECDEC_DRAFT_CARRY(4)
SPECDEC_DRAFT_CARRY(8)
SPECDEC_DRAFT_CARRY(16)

#define SPECDEC_CAPTURE_HIDDEN(NAME, T)                                                 \
  extern "C" __global__ void __launch_bounds__(kThreads) capture_hidden_##NAME(const CaptureHiddenParams p) { specdec::pdl_begin(); \
    capture_hidden<T>(p);                                                               \
  }
SPECDEC_CAPTURE_HIDDEN(f32, float)
SPECDEC_CAPTURE_HIDDEN(f16, __half)
SPECDEC_CAPTURE_HIDDEN(bf16, bf16_t)

#define SPECDEC_DRAFT_COMBINE(NAME, T, W)                                               \
  extern "C" __global__ void __launch_bounds__(kCombineMaxThreads) draft_combine_##NAME(const DraftCombineParams p) { specdec::pdl_begin(); \
    draft_combine<T, W>(p);                                                             \
  }
SPECDEC_FOR_NORM_DTYPES(SPECDEC_DRAFT_COMBINE)

// draft_map_tokens: draft_ids [N] -> out [N] int32 through d2t [Vd]; one id per thread.
extern "C" __global__ void __launch_bounds__(kThreads) draft_map_tokens(const DraftMapTokensParams p) {
  specdec::pdl_begin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = p.ids_64 ? static_cast<int64_t>(__ldg(static_cast<const long long*>(p.draft_ids) + i))
                               : static_cast<int64_t>(__ldg(static_cast<const int32_t*>(p.draft_ids) + i));
    int64_t t = -1;
    if (d >= 0 && d < p.vocab) {
      const int64_t m = p.d2t_64 ? static_cast<int64_t>(__ldg(static_cast<const long long*>(p.d2t) + d))
                                 : static_cast<int64_t>(__ldg(static_cast<const int32_t*>(p.d2t) + d));
      t = p.offsets ? d + m : m;
    }
    p.out[i] = static_cast<int32_t>(t);
  }
}
