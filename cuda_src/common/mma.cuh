// Warp-level tensor-core building blocks: ldmatrix fragment loads and mma.sync wrappers.
//
// Fragment layouts (PTX ISA "Matrix fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A 16x16 (row-major), 4 x b32 of two halves each:
//       a0 = A[g][2t..2t+1]   a1 = A[g+8][2t..2t+1]   a2 = A[g][2t+8..]   a3 = A[g+8][2t+8..]
//   B 16x8 ("col": k pairs packed per column), 2 x b32:
//       b0 = B[2t..2t+1][g]   b1 = B[2t+8..2t+9][g]
//   C/D 16x8 f32: c0,c1 = C[g][2t..2t+1]   c2,c3 = C[g+8][2t..2t+1]
// m16n8k8 (the only f16 shape Turing has) uses exactly the first half of each operand
// (a0,a1 / b0), so on sm_75 an m16n8k16 product is two m16n8k8 products with the same
// registers: callers write one fragment layout for every architecture.
//
// The C fragment of two adjacent 16x8 tiles (columns 0-7, 8-15) is, register for register,
// the A fragment of a 16x16 operand once packed to 16-bit pairs (see pack_*x2): that is
// how an attention kernel feeds P = softmax(S) into P.V without touching shared memory.
#pragma once
#include <stdint.h>
#include <cuda_fp16.h>

namespace specdec {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the 8 row addresses (16 bytes each) of
// matrix m, and r[m] receives element pair [lane/4][2*(lane%4)..+1] of matrix m.
// (the _at forms take the row's shared-memory address itself, for kernels that work the
// addresses out as integers)
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t (&r)[4], uint32_t row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row_addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  ldmatrix_x4_at(r, smem_addr(smem_row));
}

// Same with each matrix transposed: r[m] receives elements [2*(lane%4)..+1][lane/4].
__device__ __forceinline__ void ldmatrix_x4_trans_at(uint32_t (&r)[4], uint32_t row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row_addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  ldmatrix_x4_trans_at(r, smem_addr(smem_row));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(smem_row)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(smem_row)));
}

// D += A(16x8 f16) * B(8x8 f16), f32 accumulate. sm_75+.
__device__ __forceinline__ void mma_m16n8k8_f16f32(float (&d)[4], uint32_t a0, uint32_t a1,
                                                   uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// D += A(16x16 f16) * B(16x8 f16), f32 accumulate. One instruction on sm_80+, two
// m16n8k8 on sm_75 (same fragments, see the header comment).
__device__ __forceinline__ void mma_m16n8k16_f16f32(float (&d)[4], const uint32_t (&a)[4],
                                                    uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  mma_m16n8k8_f16f32(d, a[0], a[1], b0);
  mma_m16n8k8_f16f32(d, a[2], a[3], b1);
#endif
}

// D += A(16x16 bf16) * B(16x8 bf16), f32 accumulate. sm_80+ only: Turing has no bf16
// tensor-core path, so the compute_75 build traps (the Python layer rejects bf16 there).
__device__ __forceinline__ void mma_m16n8k16_bf16f32(float (&d)[4], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// D += A(16x16 bf16) * B(16x8 bf16) on the CUDA cores, from the same fragments (the layout in
// the header comment): for a compute_75 build that must run a bf16 product correctly (Turing
// has no bf16 tensor-core path). Per k pair (2kp, 2kp + 1) a lane fetches, by shuffles, the
// pair of its rows g, g + 8 (from quad lane kp % 4: a0 / a1, or a2 / a3 for kp >= 4) and of
// its columns 2t, 2t + 1 (from the lanes 4 (2t) + kp % 4 and 4 (2t + 1) + kp % 4: b0, or b1),
// and adds the four products with fmaf, k in order: exact products, float32 sums, fixed
// order. Not the tensor core's bits (its sums round differently), but deterministic, and
// column n of D depends only on column n of B (and A, C). 32 shuffles and 64 fmaf a call.
// Whole warp, converged.
__device__ __forceinline__ void mma_m16n8k16_bf16f32_fma(float (&d)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  const int lane = threadIdx.x & 31, quad = lane & ~3, t = lane & 3;
#pragma unroll
  for (int kp = 0; kp < 8; ++kp) {
    const int src = kp & 3;
    const uint32_t ag = __shfl_sync(0xffffffffu, kp < 4 ? a[0] : a[2], quad | src);
    const uint32_t ah = __shfl_sync(0xffffffffu, kp < 4 ? a[1] : a[3], quad | src);
    const uint32_t bc0 = __shfl_sync(0xffffffffu, kp < 4 ? b0 : b1, 8 * t + src);
    const uint32_t bc1 = __shfl_sync(0xffffffffu, kp < 4 ? b0 : b1, 8 * t + 4 + src);
#pragma unroll
    for (int e = 0; e < 2; ++e) {            // element 2kp + e: the low half, then the high
      const auto f = [e](uint32_t w) { return __uint_as_float(e ? w & 0xffff0000u : w << 16); };
      d[0] = fmaf(f(ag), f(bc0), d[0]);
      d[1] = fmaf(f(ag), f(bc1), d[1]);
      d[2] = fmaf(f(ah), f(bc0), d[2]);
      d[3] = fmaf(f(ah), f(bc1), d[3]);
    }
  }
}

// D += A(16x8 tf32) * B(8x8 tf32), f32 accumulate: sm_80+ (the compute_75 build traps; callers
// keep a CUDA-core path there). Fragments (PTX ISA, m16n8k8 .tf32), g = lane / 4, t = lane % 4:
//   a0 = A[g][t]  a1 = A[g+8][t]  a2 = A[g][t+4]  a3 = A[g+8][t+4]     b0 = B[t][g]  b1 = B[t+4][g]
//   d0, d1 = D[g][2t..2t+1]  d2, d3 = D[g+8][2t..2t+1]
// The operands are f32 registers of which the tensor core reads the tf32 bits (sign, 8 exponent
// bits, the top 10 mantissa bits): exact for a value that already is a tf32, bf16 or f16 number.
// Not volatile: it has no side effect, so ptxas may interleave it with the caller's other work.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], float a0, float a1, float a2, float a3,
                                                 float b0, float b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)),
        "r"(__float_as_uint(a3)), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
#else
  __trap();
#endif
}

// x = hi + lo exactly, hi the tf32 nearest x (ties away, as cvt.rna.tf32.f32) and lo = x - hi,
// whose own tf32 truncation (what an mma reads) is within 2^-11 |lo| <= 2^-22 |x| of it: an mma
// over [hi, lo] columns gives a dot product of f32 operands to about f32 precision.
__device__ __forceinline__ void split_tf32(float x, float& hi, float& lo) {
  hi = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
  lo = x - hi;
}

// Two floats -> one b32 of 16-bit values, `lo` in the low half (the lower column index).
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  // round-to-nearest-even by bit arithmetic (no bf16 cvt before sm_80)
  auto rne = [](float x) -> uint32_t {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  };
  return rne(lo) | (rne(hi) << 16);
#endif
}

// Tag types selecting the 16-bit input format of a tensor-core product.
struct mma_f16 {
  static constexpr bool kIsBf16 = false;
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    mma_m16n8k16_f16f32(d, a, b0, b1);
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pack_f16x2(lo, hi); }
};
struct mma_bf16 {
  static constexpr bool kIsBf16 = true;
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    mma_m16n8k16_bf16f32(d, a, b0, b1);
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pack_bf16x2(lo, hi); }
};

}  // namespace specdec
