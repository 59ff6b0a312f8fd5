// verify_attention_kv8: verify_attention (verify_attention.cu, whose comments hold for this
// kernel too) over an 8-bit paged KV cache, fp8_e4m3 or int8 (issue 32; the formats are
// specdec_lib/reference/kvquant.py's).
//
// What differs from the 16-bit kernel:
// * The cp.async ring holds 8-bit tiles (half the bytes per stage: the KV read, which bounds
//   this kernel, is halved). int8 rows bring their (scale, zero) pairs along (8-byte cp.async
//   per key row and K/V) into a small per-stage params ring.
// * No 16-bit copy of a tile: each warp `ldmatrix`es the 8-bit rows (.b16 matrices of 8 rows
//   x 16 bytes, the 16-bit kernel's XOR swizzle on 16-byte chunks; D=64 rows pair up into
//   128-byte lines) and turns the bytes into float16 B fragments in registers
//   (common/kv8_frag.cuh). K (no .trans): a lane gets 4 consecutive bytes d..d+3 of one key,
//   which serve as the fragment's k pairs (2t, 2t+1) / (2t+8, 2t+9); q's columns are loaded
//   permuted to match. V (.trans): a lane gets keys (2t, 2t+1) x columns (d, d+1), i.e. the
//   B pairs of two n-tiles, column d and d+1: the accumulators hold output columns
//   interleaved (acc[2c] columns 16c + 2n, acc[2c+1] columns 16c + 2n + 1), which the
//   epilogue writes back in order.
// * Q . K always runs in float16: bf16 q is moved to float16 exactly per row (times a power
//   of two putting the row's max |q| in [2^14, 2^15); entries more than 2^31 below the max
//   round), the power undone in the score scale.
// * fp8: E4M3 values are exact in float16; k_scale goes into the score scale, v_scale into
//   the output (before the split merge, which is linear). P . V runs in float16 for either q
//   dtype (P in [0, 1]). compute_90 decodes with cvt.rn.f16x2.e4m3x2; compute_75 / compute_80
//   (hence sm_86 / sm_89) with the branch-free integer decoder of common/kv8.cuh (same
//   values).
// * int8: each code byte becomes the float16 1152 + c by one byte shuffle (no conversion,
//   no subtraction: kv8::int8x4_to_f16_biased); the bias and the (scale s, zero z) pairs
//   (kvquant.py's value is (c + 128) s + z) are taken out per key and per row, in float32:
//   K: q . k = s (q . (1152 + c)) + (z - 1024 s) sum(q), on the score column.
//   V: P . V runs in float16 for either q dtype with P' = p s 2^E (each key's weight times
//   its scale) against the biased codes; one more MMA of P' against 1152 takes the bias out
//   and the float32 sum p (z + 128 s) per row (the range's midpoint) adds the rest:
//   sum p v = 2^-E (P' . (1152 + c) - P' . 1152) + sum p (z + 128 s). E is a running
//   exponent per warp, dropping (acc rescaled by a power of two, exact) when a key's s 2^E
//   reaches 2^14; a drop places the step's largest s 2^E in [2^8, 2^9). (s36's kernel made
//   each V element c s + (z + 128 s) in q's dtype by a 16-bit fma: 505 -> 405 SASS
//   instructions a 16-key step at D = 128 bf16; P' in float16 is also finer than bf16 P.)
// * Occupancy (s35): fp8 at D <= 128 on sm_80+ runs four CTAs an SM (128 registers): a B=64
//   grid of 512 CTAs runs as one wave on 132 SMs rather than 1.29 (the last 0.29 alone). At
//   D = 128 that needs Q in shared memory (ldmatrix'ed per k-step) instead of 32 registers;
//   fp8 leaves out int8's params ring, which keeps four fp8 CTAs within an SM's 228 KB when
//   the plan has one m-tile a CTA (max_q * group <= 16: the orchestrator's max_q, its
//   longest block; the default min(T, 16) plans four m-tiles' Q space: three CTAs). H100
//   s36, B=64 L=4096 q=4 with max_q = 4: 264.1 -> 211.9 us (67% -> 84% of copy).
//   Each key row's cache offsets are worked out once per tile (kv_row) and parked in a ring
//   beside the page ids' old place, not recomputed by each of the row's 8 copying threads.
//   (Parking whole addresses plus a valid flag instead cut the load path's instructions a
//   further ~20% but ran 6% slower on the H100: s36, PERF.md.)
//   int8 at D = 128 (s37) runs four CTAs an SM too: two ring stages instead of three (its
//   (scale, zero) ring kept three stages at three CTAs), Q in shared memory, 128 registers
//   (the scaled-P dequantisation above freed them). H200, B=64 q=4: 252.2 -> 206.2 us
//   (53 -> 65% of copy).
// Split-KV, the merge kernel (verify_attention_merge_<dtype> of the attention module: the
// partials have the same layout) and row_invariant plans are the 16-bit kernel's.
#include <math.h>

#include "common/cp_async.cuh"
#include "common/pdl.cuh"
#include "common/dtype.cuh"
#include "common/mma.cuh"
#include "common/warp.cuh"
#include "common/kv8.cuh"
#include "common/kv8_frag.cuh"
#include "common/kv8_row.cuh"
#include "attention/attention_params.h"

using namespace specdec;

namespace {

#include "attention/verify_attention_common.cuh"

template <int D, int FMT>
struct Tile {
  static constexpr int kKeys = D <= 128 ? 64 : 32;              // keys per KV tile
  static constexpr int kSubTiles = kKeys / 16;                  // 16-key MMA steps per tile
  static constexpr int kChunks8 = D / 16;                       // 16-byte chunks per 8-bit key row
  static constexpr int kRowsPerPass8 = kThreads / kChunks8;
  static constexpr int kPasses8 = kKeys / kRowsPerPass8;
  static constexpr int kStageBytes8 = 2 * kKeys * D;            // K then V, 8-bit
  // int8 at D = 128: two stages, so that four CTAs share an SM (smem; 128 registers with Q
  // in shared memory): a B=64 grid of 512 CTAs in one wave rather than 1.29
  static constexpr int kSt = FMT == KV8_INT8 && D == 128 && kStages > 1 ? 2 : kStages;
  static constexpr int kRingBytes8 = kSt * kStageBytes8;
  // int8 (scale, zero) ring
  static constexpr int kParamBytes = FMT == KV8_INT8 ? kSt * 2 * kKeys * 8 : 0;
  // Q as float16 A fragments in shared memory rather than registers where that lets four CTAs
  // share an SM (D = 128, multi-stage builds: 32 registers a thread; s35): per CTA m-tile
  // 16 rows x D halves, after the rings
  // int8 too since s37, with two stages (kSt): with three, its params ring kept it at three
  // CTAs, and Q in shared memory alone only cost (H100 s35: 286 -> 311 us at B=64)
  static constexpr bool kQSmem = D == 128 && kStages > 1;
  static constexpr int kQOff = kRingBytes8 + kParamBytes;
  static constexpr int kQBytesPerMTile = kQSmem ? 16 * D * 2 : 0;
  // dynamic smem for a plan of warps_m m-tiles (ops/attention.py::verify_attention_kv8_smem_bytes)
  __device__ static constexpr int smem_bytes(int warps_m) {
    return kQOff + warps_m * kQBytesPerMTile > VERIFY_ATTN_EPILOGUE_SMEM
               ? kQOff + warps_m * kQBytesPerMTile
               : VERIFY_ATTN_EPILOGUE_SMEM;
  }
  static_assert(kKeys % kRowsPerPass8 == 0, "tile rows must split evenly over the copy passes");
};

// Byte offset of 16-byte chunk c of 8-bit key row `row` in a K or V tile. Rows 8r .. 8r+7 at
// the same chunk fall into 8 different 16-byte bank groups, so each ldmatrix matrix (8 such
// rows x 16 bytes) is conflict-free: D >= 128 XORs the chunk with row & 7 (the 16-bit
// kernel's swizzle); D = 64 rows are 64 bytes, so two rows share a 128-byte line and the
// chunk's place in the line is XORed with the line index.
template <int D>
__device__ __forceinline__ int kv8_off(int row, int c) {
  if constexpr (D >= 128) {
    return row * D + ((c ^ (row & 7)) << 4);
  } else {
    static_assert(D == 64, "8-bit tiles: D is 64, 128 or 256");
    const int line = row >> 1;
    return (line << 7) + (((((row & 1) << 2) | c) ^ (line & 7)) << 4);
  }
}

// 8-byte cp.async (.ca) zero-filling when !valid; sm_75: a plain load + shared store.
__device__ __forceinline__ void cp_async_8(void* smem_dst, const void* gmem_src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
#else
  uint2 v = make_uint2(0u, 0u);
  if (valid) v = __ldg(reinterpret_cast<const uint2*>(gmem_src));
  *reinterpret_cast<uint2*>(smem_dst) = v;
#endif
}

// 2^e as float32 for e in [-126, 127]
__device__ __forceinline__ float exp2i(int e) { return __uint_as_float(static_cast<uint32_t>(e + 127) << 23); }

template <int D, typename Mma, int FMT>
__device__ __forceinline__ void verify_attention_kv8_body(const VerifyAttentionKV8Params& P) {
  const VerifyAttentionParams& p = P.base;
  using TL = Tile<D, FMT>;
  // fp8 software decode pairs K bytes (0, 2) / (1, 3): q's columns follow (see kv8_frag.cuh)
  constexpr bool kQStrided = FMT == KV8_FP8 && kv8::kKStrided;
  extern __shared__ __align__(256) unsigned char smem[];   // 256: see kXorAddr
  constexpr bool kXorAddr = D >= 128;   // ldmatrix addresses by XOR (below, at xsw)
  __shared__ int bad_input;

  // grid (Hkv * m-groups, B, splits): the KV heads of one sequence are consecutive CTAs, so
  // the CTAs resident together read whole page slots (all heads) rather than one head's
  // 2*D bytes out of every slot of twice as many pages (DRAM row and TLB locality).
  const int b = blockIdx.y;
  SeqView sv;
  if (!seq_view(p.cu_q, p.seq_lens, b, p.max_q, p.num_tokens, p.num_splits, p.kv_chunk, sv))
    return;
  const int kvh = blockIdx.x % p.num_kv_heads;
  const int row_base = (blockIdx.x / p.num_kv_heads) * p.warps_m * 16;
  const int split = blockIdx.z;
  const int group = p.group;
  const int rows = sv.qn * group;
  if (row_base >= rows || split >= sv.num_splits) return;
  if (dynamic_smem_bytes() < static_cast<uint32_t>(TL::smem_bytes(p.warps_m))) return;   // launcher bug: leave out untouched
  if (kXorAddr && (smem_addr(smem) & 255u)) return;   // (never seen: __align__ places it)
  const int L = sv.L;
  const int kv_begin = split * p.kv_chunk;
  const int kv_end = split == sv.num_splits - 1 ? L + sv.qn : kv_begin + p.kv_chunk;
  const bool direct = sv.num_splits == 1;

  if (threadIdx.x == 0) bad_input = sv.bad_len;
  __syncthreads();

  // The host sized the grid for the longest block (p.warps_m m-tiles per CTA); this
  // sequence may have fewer rows, so pick the warp split from the rows actually present:
  // 1 m-tile -> 4 warps split the keys, 2 -> 2 x 2, 3..4 -> one m-tile per warp.
  const int span_mtiles = (min(rows - row_base, p.warps_m * 16) + 15) >> 4;
  const int warps_m = span_mtiles == 1 ? 1 : span_mtiles == 2 ? 2 : 4;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps_n = kWarps / warps_m;
  const int wm = warp / warps_n;
  const int wn = warp - wm * warps_n;
  const int g = lane >> 2;
  const int t4 = lane & 3;
  const int r_lo = row_base + wm * 16 + g;   // packed rows of this thread's C fragment
  const int r_hi = r_lo + 8;
  const bool warp_has_rows = row_base + wm * 16 < rows;

  // ---- Q fragments (A operand), straight from global: 16 rows x D per warp, columns
  // permuted to the K bytes' order: k-step c's pairs are columns 16c + 4t + {0, 1} and
  // {2, 3} ({0, 2} and {1, 3} when kQStrided). Held in registers for the whole KV loop,
  // except D=256 on sm_75 where that would spill: there they are re-read (L1 hits) per
  // 16-key step (float16 only there: the compute_75 build traps bf16).
  constexpr bool kQInRegs = D <= 128 || TL::kSt > 1;
  static_assert(kQInRegs || !Mma::kIsBf16, "bf16 q is converted once, in registers");
  const uint16_t* qlo = nullptr;
  const uint16_t* qhi = nullptr;
  if (r_lo < rows) {
    const int i = r_lo / group;
    qlo = static_cast<const uint16_t*>(p.q) + (int64_t)(sv.q0 + i) * p.q_stride_t +
          (int64_t)(kvh * group + r_lo - i * group) * p.q_stride_h;
  }
  if (r_hi < rows) {
    const int i = r_hi / group;
    qhi = static_cast<const uint16_t*>(p.q) + (int64_t)(sv.q0 + i) * p.q_stride_t +
          (int64_t)(kvh * group + r_hi - i * group) * p.q_stride_h;
  }
  auto load_q_pairs = [&](const uint16_t* qr, int kk, uint32_t& first, uint32_t& second) {
    const int c = kk * 16 + 4 * t4;
    const uint32_t x = qr ? ld_u32(qr + c) : 0u;
    const uint32_t y = qr ? ld_u32(qr + c + 2) : 0u;
    if constexpr (kQStrided) {
      first = __byte_perm(x, y, 0x5410);
      second = __byte_perm(x, y, 0x7632);
    } else {
      first = x;
      second = y;
    }
  };
  auto load_q_frag = [&](int kk, uint32_t (&a)[4]) {
    load_q_pairs(qlo, kk, a[0], a[2]);
    load_q_pairs(qhi, kk, a[1], a[3]);
  };
  uint32_t qa[kQInRegs ? D / 16 : 1][4];
  // per row: the float32 factor undoing bf16 q's power-of-two move, and (int8) sum(q)
  float qinv_lo = 1.f, qinv_hi = 1.f, qsum_lo = 0.f, qsum_hi = 0.f;
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_q_frag(kk, qa[kk]);
    if constexpr (Mma::kIsBf16) {
      auto bf16_lo_f32 = [](uint32_t w) { return __uint_as_float(w << 16); };
      auto bf16_hi_f32 = [](uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); };
      float mx_lo = 0.f, mx_hi = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float m = fmaxf(fabsf(bf16_lo_f32(qa[kk][j])), fabsf(bf16_hi_f32(qa[kk][j])));
          if (j & 1) mx_hi = fmaxf(mx_hi, m); else mx_lo = fmaxf(mx_lo, m);
        }
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
      // e: max |q| * 2^e in [2^14, 2^15) (exponent field E: e = 141 - E), kept in [-126, 126]
      // (NaN / inf rows: e = -114, they stay NaN / inf)
      const int e_lo = min(max(141 - static_cast<int>(__float_as_uint(mx_lo) >> 23), -126), 126);
      const int e_hi = min(max(141 - static_cast<int>(__float_as_uint(mx_hi) >> 23), -126), 126);
      const float up_lo = exp2i(e_lo), up_hi = exp2i(e_hi);
      qinv_lo = exp2i(-e_lo);
      qinv_hi = exp2i(-e_hi);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float up = (j & 1) ? up_hi : up_lo;
          qa[kk][j] = pack_f16x2(bf16_lo_f32(qa[kk][j]) * up, bf16_hi_f32(qa[kk][j]) * up);
        }
    }
  }
  if constexpr (FMT == KV8_INT8) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      if constexpr (kQInRegs) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j] = qa[kk][j];
      } else {
        load_q_frag(kk, a);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(kv8::bits_h2(a[j]));
        if (j & 1) qsum_hi += f.x + f.y; else qsum_lo += f.x + f.y;
      }
    }
    qsum_lo += __shfl_xor_sync(0xffffffffu, qsum_lo, 1);
    qsum_lo += __shfl_xor_sync(0xffffffffu, qsum_lo, 2);
    qsum_hi += __shfl_xor_sync(0xffffffffu, qsum_hi, 1);
    qsum_hi += __shfl_xor_sync(0xffffffffu, qsum_hi, 2);
  }
  // Q in shared memory (TL::kQSmem): warp wn == 0 of each m-tile parks its fragments in
  // ldmatrix order (16-byte chunk 2kk holds k-pairs 0-3 of k-step kk, 2kk+1 pairs 4-7, XOR
  // swizzled by row & 7 like the tiles); compute_tile ldmatrix_x4es them per k-step. Visible
  // after the barrier that precedes the main loop.
  unsigned char* const sq = smem + TL::kQOff + wm * TL::kQBytesPerMTile;
  auto q_off = [](int row, int chunk) { return row * (D * 2) + ((chunk ^ (row & 7)) << 4); };
  if constexpr (TL::kQSmem) {
    if (wn == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        *reinterpret_cast<uint32_t*>(sq + q_off(g, 2 * kk) + 4 * t4) = qa[kk][0];
        *reinterpret_cast<uint32_t*>(sq + q_off(g + 8, 2 * kk) + 4 * t4) = qa[kk][1];
        *reinterpret_cast<uint32_t*>(sq + q_off(g, 2 * kk + 1) + 4 * t4) = qa[kk][2];
        *reinterpret_cast<uint32_t*>(sq + q_off(g + 8, 2 * kk + 1) + 4 * t4) = qa[kk][3];
      }
    }
  }
  // ldmatrix_x4 row addresses of the Q fragments: lanes 8m..8m+7 give matrix m's rows
  // (m = 0: rows 0-7 chunk 2kk, 1: rows 8-15 chunk 2kk, 2 / 3: the same of chunk 2kk + 1)
  const int q_lrow = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int q_lhi = lane >> 4;
  // ldmatrix addresses by one XOR (D >= 128: swz_chunk in verify_attention_common.cuh; K, V
  // and Q rows of 128 / 256 bytes in 256-byte aligned rings and Q block)
  const uint32_t xsw = swz_xor(lane);
  const uint32_t q_row = swz_row(smem_addr(sq) + q_lrow * (D * 2), q_lhi, lane);
  // Last key each of the thread's two rows may see inside this split.
  const int lim_lo = min(L + r_lo / group, kv_end - 1);
  const int lim_hi = min(L + r_hi / group, kv_end - 1);

  // ---- KV tile loader (8-bit rows): thread copies chunk `ld_chunk` of key rows
  // ld_row0 + k*kRowsPerPass8.
  const int ld_chunk = threadIdx.x % TL::kChunks8;
  const int ld_row0 = threadIdx.x / TL::kChunks8;
  const uint8_t* k_head = static_cast<const uint8_t*>(p.k_cache) + (int64_t)kvh * p.k_stride_h +
                          ld_chunk * 16;
  const uint8_t* v_head = static_cast<const uint8_t*>(p.v_cache) + (int64_t)kvh * p.v_stride_h +
                          ld_chunk * 16;
  const int32_t* pt_row = p.page_table + (int64_t)b * p.page_table_stride;
  const int slot_mask = (1 << p.page_size_log2) - 1;
  uint8_t* const ring8 = smem;
  float2* const prm = reinterpret_cast<float2*>(smem + TL::kRingBytes8);
  const int64_t prm_head = kvh;   // (scale, zero) pair index: (page * page_size + slot) * Hkv + kvh
  const float k_sc = FMT == KV8_FP8 ? __ldg(P.k_scale + kvh * P.scale_stride) : 1.f;
  const float v_sc = FMT == KV8_FP8 ? __ldg(P.v_scale + kvh * P.scale_stride) : 1.f;
  const float sc_lo = p.scale_log2 * k_sc * qinv_lo;   // raw Q . K -> log2-domain score
  const float sc_hi = p.scale_log2 * k_sc * qinv_hi;

  // Where key row `row` of tile `tile` lives (kv_row) and, for int8, the float index of its
  // (scale, zero) pair: ((page * page_size + slot) * Hkv + kvh) * 2, -1 past the split.
  struct Row8 {
    KVRow kv;
    int64_t prm;
  };
  auto tile_row = [&](int tile, int row) -> Row8 {
    const int key = kv_begin + tile * TL::kKeys + row;
    const int page = kv_page(p, pt_row, key, kv_end, bad_input);
    Row8 r{kv_row(p, page, key), -1};
    if constexpr (FMT == KV8_INT8) {
      if (page >= 0)
        r.prm = ((((int64_t)page << p.page_size_log2) + (key & slot_mask)) * p.num_kv_heads + prm_head) * 2;
    }
    return r;
  };
  // Multi-stage builds work the rows out one tile before the tile's copies are issued
  // (thread r < kKeys does row r during the previous tile's compute and parks it in these
  // rings, slot = tile % TL::kSt), so no page-table load sits between a barrier and the
  // cp.async it feeds. The single-stage (sm_75) build works them out inline.
  constexpr int kRing = TL::kSt > 1 ? TL::kSt : 1;
  __shared__ KVRow tile_kv[kRing][TL::kKeys];
  __shared__ int64_t tile_prm[FMT == KV8_INT8 ? kRing : 1][FMT == KV8_INT8 ? TL::kKeys : 1];
  auto park_row = [&](int stage, int row, const Row8& r) {
    tile_kv[stage][row] = r.kv;
    if constexpr (FMT == KV8_INT8) tile_prm[stage][row] = r.prm;
  };

  auto load_tile = [&](int tile, int stage) {
    uint8_t* sk = ring8 + stage * TL::kStageBytes8;
    uint8_t* sv_ = sk + TL::kKeys * D;
#pragma unroll
    for (int pass = 0; pass < TL::kPasses8; ++pass) {
      const int row = ld_row0 + pass * TL::kRowsPerPass8;
      Row8 r;
      if constexpr (TL::kSt > 1) {
        r.kv = tile_kv[stage][row];
      } else {
        r = tile_row(tile, row);
      }
      const bool valid = r.kv.k >= 0;
      const int soff = kv8_off<D>(row, ld_chunk);
      cp_async_16(sk + soff, k_head + (valid ? r.kv.k : 0), valid);
      cp_async_16(sv_ + soff, v_head + (valid ? r.kv.v : 0), valid);
      if constexpr (FMT == KV8_INT8) {
        if (ld_chunk == 0) {
          if constexpr (TL::kSt > 1) r.prm = tile_prm[stage][row];
          const int64_t pi = valid ? r.prm : 0;
          float2* pr = prm + (stage * 2) * TL::kKeys + row;
          cp_async_8(pr, P.k_params + pi, valid);
          cp_async_8(pr + TL::kKeys, P.v_params + pi, valid);
        }
      }
    }
  };

  // ---- per-warp online softmax state: rows r_lo / r_hi, log2 domain, unnormalised acc
  // (acc[2c] / acc[2c+1]: output columns 16c + 2n / 16c + 2n + 1 of n-tile column n).
  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  // int8 V (see compute_tile): the warp's exponent E (v_exp), P' . 1152 (acc_off) and this
  // thread's share of sum p (z + 128 s) per row (zsum)
  int v_exp = 126;   // until a key with s >= 2^-112 comes
  float acc_off[4] = {0.f, 0.f, 0.f, 0.f};
  float zsum_lo = 0.f, zsum_hi = 0.f;

  auto compute_tile = [&](int tile, int stage) {
    if (!warp_has_rows) return;
    const int key_tile = kv_begin + tile * TL::kKeys;
    const uint8_t* sk = ring8 + stage * TL::kStageBytes8;
    const uint8_t* sv_ = sk + TL::kKeys * D;
    for (int sub = wn; sub < TL::kSubTiles; sub += warps_n) {
      const int key0 = key_tile + sub * 16;
      if (key0 >= kv_end) break;
      // ldmatrix rows: lanes 8m..8m+7 address matrix m = (keys 0-7 | 8-15) x (chunk c | c+1)
      const int mrow = sub * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
      const int mchunk = lane >> 4;
      const uint32_t k_row = swz_row(smem_addr(sk) + mrow * D, mchunk, lane);
      const uint32_t v_row = k_row + TL::kKeys * D;
      // S = Q K^T for 16 rows x 16 keys (two n-tiles of 8 keys)
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kc = 0; kc < D / 16; kc += 2) {
        uint32_t w[4];
        if constexpr (kXorAddr) {
          ldmatrix_x4_at(w, swz_chunk(k_row, kc, xsw));
        } else {
          ldmatrix_x4(w, sk + kv8_off<D>(mrow, kc + mchunk));
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t a[4];
          if constexpr (TL::kQSmem) {
            ldmatrix_x4_at(a, swz_chunk(q_row, 2 * (kc + h), xsw));
          } else if constexpr (kQInRegs) {
#pragma unroll
            for (int j = 0; j < 4; ++j) a[j] = qa[kc + h][j];
          } else {
            load_q_frag(kc + h, a);
          }
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            uint32_t b0, b1;
            if constexpr (FMT == KV8_FP8) {
              kv8::e4m3x4_row_to_f16(w[2 * h + n], b0, b1);
            } else {
              kv8::int8x4_to_f16_biased<0x4140, 0x4342>(w[2 * h + n], b0, b1);   // 1152 + c
            }
            mma_f16::mma(s[n], a, b0, b1);
          }
        }
      }
      // this thread's score columns: keys sub*16 + 8n + 2t + {0, 1}
      const float2* kp = prm + (stage * 2) * TL::kKeys + sub * 16 + 2 * t4;   // int8 (s, z) of those
      if constexpr (FMT == KV8_INT8) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float4 k4 = *reinterpret_cast<const float4*>(kp + 8 * n);
          // q . k = s (q . c) + (z + 128 s) sum(q) = s (q . (1152 + c)) + (z - 1024 s) sum(q)
          const float z0 = fmaf(-1024.f, k4.x, k4.y), z1 = fmaf(-1024.f, k4.z, k4.w);
          s[n][0] = fmaf(k4.x, s[n][0], z0 * qsum_lo) * sc_lo;
          s[n][1] = fmaf(k4.z, s[n][1], z1 * qsum_lo) * sc_lo;
          s[n][2] = fmaf(k4.x, s[n][2], z0 * qsum_hi) * sc_hi;
          s[n][3] = fmaf(k4.z, s[n][3], z1 * qsum_hi) * sc_hi;
        }
      } else {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          s[n][0] *= sc_lo;
          s[n][1] *= sc_lo;
          s[n][2] *= sc_hi;
          s[n][3] *= sc_hi;
        }
      }
      if (key0 + 15 > L || key0 + 16 > kv_end) {   // causal edge or split end: mask
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = key0 + n * 8 + 2 * t4 + e;
            if (key > lim_lo) s[n][e] = -INFINITY;
            if (key > lim_hi) s[n][2 + e] = -INFINITY;
          }
      }
      float mx_lo = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
      float mx_hi = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
      const float mn_lo = fmaxf(m_lo, mx_lo);
      const float mn_hi = fmaxf(m_hi, mx_hi);
      const float base_lo = mn_lo == -INFINITY ? 0.f : mn_lo;   // fully masked so far: keep 0s
      const float base_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
      const float alpha_lo = ex2(m_lo - base_lo);
      const float alpha_hi = ex2(m_hi - base_hi);
      m_lo = mn_lo;
      m_hi = mn_hi;
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][0] = ex2(s[n][0] - base_lo);
        s[n][1] = ex2(s[n][1] - base_lo);
        s[n][2] = ex2(s[n][2] - base_hi);
        s[n][3] = ex2(s[n][3] - base_hi);
        sum_lo += s[n][0] + s[n][1];
        sum_hi += s[n][2] + s[n][3];
      }
      l_lo = l_lo * alpha_lo + sum_lo;
      l_hi = l_hi * alpha_hi + sum_hi;
      // int8 V: (s, z) of keys 2t, 2t+1 (v4[0]) and 2t+8, 2t+9 (v4[1]); sum p (z + 128 s) per
      // row in float32 (zsum, rescaled as l is); `grow`: some key's s 2^E reaches 2^14, where
      // the float16 P' = p s 2^E nears its range
      float4 v4[2];
      float s_max = 0.f;   // the thread's 4 keys' largest s (lanes t4 = 0..3 hold the 16)
      bool grow = false;
      if constexpr (FMT == KV8_INT8) {
        v4[0] = *reinterpret_cast<const float4*>(kp + TL::kKeys);
        v4[1] = *reinterpret_cast<const float4*>(kp + TL::kKeys + 8);
        const float m00 = fmaf(128.f, v4[0].x, v4[0].y), m01 = fmaf(128.f, v4[0].z, v4[0].w);
        const float m10 = fmaf(128.f, v4[1].x, v4[1].y), m11 = fmaf(128.f, v4[1].z, v4[1].w);
        zsum_lo = fmaf(zsum_lo, alpha_lo, fmaf(s[0][0], m00, fmaf(s[0][1], m01, fmaf(s[1][0], m10, s[1][1] * m11))));
        zsum_hi = fmaf(zsum_hi, alpha_hi, fmaf(s[0][2], m00, fmaf(s[0][3], m01, fmaf(s[1][2], m10, s[1][3] * m11))));
        s_max = fmaxf(fmaxf(v4[0].x, v4[0].z), fmaxf(v4[1].x, v4[1].z));
        grow = s_max >= 16384.f * exp2i(-v_exp);
      }
      // rescale only when some row's max moved (x 1.0 is exact: skipping it changes no bit;
      // past the first tiles it is the common case, and D/2 multiplies per sub-tile are a
      // fifth of this loop's instructions) or int8's exponent E must drop
      if (__any_sync(0xffffffffu, alpha_lo != 1.f || alpha_hi != 1.f || grow)) {
        float f_lo = alpha_lo, f_hi = alpha_hi;
        if constexpr (FMT == KV8_INT8) {
          // E from the step's largest s: s 2^E in [2^8, 2^9), room for 2^22 smaller s before
          // P' turns subnormal, 2^5 larger before the next drop
          if (__any_sync(0xffffffffu, grow)) {
            float m = fmaxf(s_max, __shfl_xor_sync(0xffffffffu, s_max, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            const int e_new = min(max(135 - static_cast<int>(__float_as_uint(m) >> 23), -126), 126);
            const float r = e_new - v_exp < -126 ? 0.f : exp2i(e_new - v_exp);   // e_new < v_exp
            v_exp = e_new;
            f_lo *= r;
            f_hi *= r;
          }
          acc_off[0] *= f_lo;   // P' . 1152 is rescaled as acc is
          acc_off[1] *= f_lo;
          acc_off[2] *= f_hi;
          acc_off[3] *= f_hi;
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          acc[n][0] *= f_lo;
          acc[n][1] *= f_lo;
          acc[n][2] *= f_hi;
          acc[n][3] *= f_hi;
        }
      }
      // O += P V: P (16 x 16 keys) is already laid out as an A fragment. int8: P' = p s 2^E
      // (float16), V the biased codes 1152 + c; the bias goes by one more MMA (acc_off), the
      // range's midpoint z + 128 s in float32 (zsum):
      //   sum p ((c + 128) s + z) = 2^-E (P' . (1152 + c) - P' . 1152) + sum p (z + 128 s)
      // (P' times c rather than c + 128: its float16 rounding scales with |v - midpoint|)
      uint32_t pa[4];
      if constexpr (FMT == KV8_INT8) {
        const float v_esc = exp2i(v_exp);
        const float s00 = v4[0].x * v_esc, s01 = v4[0].z * v_esc;
        const float s10 = v4[1].x * v_esc, s11 = v4[1].z * v_esc;
        pa[0] = pack_f16x2(s[0][0] * s00, s[0][1] * s01);
        pa[1] = pack_f16x2(s[0][2] * s00, s[0][3] * s01);
        pa[2] = pack_f16x2(s[1][0] * s10, s[1][1] * s11);
        pa[3] = pack_f16x2(s[1][2] * s10, s[1][3] * s11);
        mma_f16::mma(acc_off, pa, 0x64806480u, 0x64806480u);   // P' . 1152
      } else {
        pa[0] = pack_f16x2(s[0][0], s[0][1]);
        pa[1] = pack_f16x2(s[0][2], s[0][3]);
        pa[2] = pack_f16x2(s[1][0], s[1][1]);
        pa[3] = pack_f16x2(s[1][2], s[1][3]);
      }
#pragma unroll
      for (int vc = 0; vc < D / 16; vc += 2) {
        uint32_t w[4];
        if constexpr (kXorAddr) {
          ldmatrix_x4_trans_at(w, swz_chunk(v_row, vc, xsw));
        } else {
          ldmatrix_x4_trans(w, sv_ + kv8_off<D>(mrow, vc + mchunk));
        }
        // w[2h]: keys 2t, 2t+1 of chunk vc + h; w[2h + 1]: keys 2t+8, 2t+9
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t e0, o0, e1, o1;   // B registers of the column-d (e) and column-d+1 (o) n-tiles
          if constexpr (FMT == KV8_FP8) {
            kv8::e4m3x4_trans_to_f16(w[2 * h], e0, o0);
            kv8::e4m3x4_trans_to_f16(w[2 * h + 1], e1, o1);
          } else {
            kv8::int8x4_to_f16_biased<0x4240, 0x4341>(w[2 * h], e0, o0);
            kv8::int8x4_to_f16_biased<0x4240, 0x4341>(w[2 * h + 1], e1, o1);
          }
          mma_f16::mma(acc[2 * (vc + h)], pa, e0, e1);
          mma_f16::mma(acc[2 * (vc + h) + 1], pa, o0, o1);
        }
      }
    }
  };

  // ---- main loop over the split's KV tiles
  const int num_tiles = (kv_end - kv_begin + TL::kKeys - 1) / TL::kKeys;
  if constexpr (TL::kSt == 1) {
    for (int tile = 0; tile < num_tiles; ++tile) {
      if (tile > 0) __syncthreads();   // everyone is done with the previous tile
      load_tile(tile, 0);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
      compute_tile(tile, 0);
    }
  } else {
    const bool fetches_ids = threadIdx.x < TL::kKeys;
    if (fetches_ids) {
#pragma unroll
      for (int st = 0; st < TL::kSt; ++st)
        if (st < num_tiles) park_row(st, threadIdx.x, tile_row(st, threadIdx.x));
    }
    __syncthreads();
#pragma unroll
    for (int st = 0; st < TL::kSt - 1; ++st) {
      if (st < num_tiles) load_tile(st, st);
      cp_async_commit();
    }
    for (int tile = 0; tile < num_tiles; ++tile) {
      // ids of tile + TL::kSt: loaded now, parked after the compute below into the slot of
      // tile `tile`, whose copies were issued two iterations ago
      const int ahead = tile + TL::kSt;
      const bool fetch = fetches_ids && ahead < num_tiles;
      Row8 ahead_row;
      if (fetch) ahead_row = tile_row(ahead, threadIdx.x);
      cp_async_wait<TL::kSt - 2>();
      __syncthreads();   // tile `tile` and the ids of tile+TL::kSt-1 visible; stage (tile-1) % TL::kSt free
      const int next = tile + TL::kSt - 1;
      if (next < num_tiles) load_tile(next, next % TL::kSt);
      cp_async_commit();
      compute_tile(tile, tile % TL::kSt);
      if (fetch) park_row(ahead % TL::kSt, threadIdx.x, ahead_row);
    }
    cp_async_wait<0>();
  }
  __syncthreads();   // ring no longer read: reuse it for the epilogue

  // ---- epilogue: merge the warps_n key slices of each m-tile, normalise, write
  float* epi_o = reinterpret_cast<float*>(smem);          // [kWarps][16][kEpiStride]
  float* epi_m = epi_o + kWarps * 16 * kEpiStride;        // [kWarps][16]
  float* epi_l = epi_m + kWarps * 16;                     // [kWarps][16]
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
  if constexpr (FMT == KV8_INT8) {   // back to values: 2^-E (acc - P' . 1152) + sum p (z + 128 s)
    zsum_lo += __shfl_xor_sync(0xffffffffu, zsum_lo, 1);
    zsum_lo += __shfl_xor_sync(0xffffffffu, zsum_lo, 2);
    zsum_hi += __shfl_xor_sync(0xffffffffu, zsum_hi, 1);
    zsum_hi += __shfl_xor_sync(0xffffffffu, zsum_hi, 2);
    const float inv = exp2i(-v_exp);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      acc[n][0] = fmaf(acc[n][0] - acc_off[0], inv, zsum_lo);
      acc[n][1] = fmaf(acc[n][1] - acc_off[1], inv, zsum_lo);
      acc[n][2] = fmaf(acc[n][2] - acc_off[2], inv, zsum_hi);
      acc[n][3] = fmaf(acc[n][3] - acc_off[3], inv, zsum_hi);
    }
  }
  if (t4 == 0) {
    epi_m[warp * 16 + g] = m_lo;
    epi_m[warp * 16 + g + 8] = m_hi;
    epi_l[warp * 16 + g] = l_lo;
    epi_l[warp * 16 + g + 8] = l_hi;
  }
  const bool bad = bad_input != 0;
  const int64_t T = p.num_tokens;
  const int Hq = p.num_qo_heads;
#pragma unroll
  for (int cp = 0; cp < D / kEpiCols; ++cp) {
    // chunk c of the pass: columns 16c + 4t .. +3 are acc[2c][0], acc[2c+1][0], acc[2c][1],
    // acc[2c+1][1] (row g; [2], [3]: row g + 8)
#pragma unroll
    for (int c = 0; c < kEpiCols / 16; ++c) {
      const float* e = acc[cp * (kEpiCols / 8) + 2 * c];
      const float* o = acc[cp * (kEpiCols / 8) + 2 * c + 1];
      float* dst = epi_o + (warp * 16 + g) * kEpiStride + c * 16 + 4 * t4;
      *reinterpret_cast<float4*>(dst) = make_float4(e[0], o[0], e[1], o[1]);
      *reinterpret_cast<float4*>(dst + 8 * kEpiStride) = make_float4(e[2], o[2], e[3], o[3]);
    }
    __syncthreads();
    for (int it = threadIdx.x; it < warps_m * 16 * (kEpiCols / 4); it += kThreads) {
      const int rl = it / (kEpiCols / 4);
      const int c4 = it - rl * (kEpiCols / 4);
      const int R = row_base + rl;
      if (R >= rows) continue;
      const int w0 = (rl >> 4) * warps_n;
      const int r = rl & 15;
      float M = -INFINITY;
      for (int n = 0; n < warps_n; ++n) M = fmaxf(M, epi_m[(w0 + n) * 16 + r]);
      const float base = M == -INFINITY ? 0.f : M;
      float lsum = 0.f;
      float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int n = 0; n < warps_n; ++n) {
        const int w = w0 + n;
        const float f = ex2(epi_m[w * 16 + r] - base);
        lsum += f * epi_l[w * 16 + r];
        const float4 v = *reinterpret_cast<const float4*>(epi_o + (w * 16 + r) * kEpiStride + c4 * 4);
        o.x += f * v.x;
        o.y += f * v.y;
        o.z += f * v.z;
        o.w += f * v.w;
      }
      const float inv = lsum > 0.f ? v_sc / lsum : 0.f;   // fp8: v_scale applied here
      o.x *= inv;
      o.y *= inv;
      o.z *= inv;
      o.w *= inv;
      float lse2 = lsum > 0.f ? base + __log2f(lsum) : -INFINITY;
      if (bad) {
        o = make_float4(NAN, NAN, NAN, NAN);
        lse2 = direct ? NAN : 0.f;   // a NaN partial output poisons the merge; its LSE stays finite
      }
      const int i = R / group;
      const int64_t tok = sv.q0 + i;
      const int head = kvh * group + (R - i * group);
      const int col = cp * kEpiCols + c4 * 4;
      const bool write_lse = cp == 0 && c4 == 0;
      if (direct) {
        uint16_t* dst = static_cast<uint16_t*>(p.out) + tok * p.out_stride_t + head * p.out_stride_h + col;
        *reinterpret_cast<uint2*>(dst) = make_uint2(Mma::pack(o.x, o.y), Mma::pack(o.z, o.w));
        if (write_lse && p.lse_out != nullptr)
          p.lse_out[tok * p.lse_stride_t + head * p.lse_stride_h] = lse2 * kLn2;
      } else {
        const int64_t prow = ((int64_t)split * T + tok) * Hq + head;
        *reinterpret_cast<float4*>(p.partial_o + prow * D + col) = o;
        if (write_lse) p.partial_lse[prow] = lse2;
      }
    }
    if (cp + 1 < D / kEpiCols) __syncthreads();
  }
}


}  // namespace

// D <= 128, sm_80+: fp8 four CTAs an SM (128 registers; D = 128 keeps Q in shared memory to get
// there); int8 four at D = 128 (two stages), three at D = 64
#define SPECDEC_VERIFY_ATTENTION_KV8(D, TAG, MMA, FNAME, FMT)                                   \
  extern "C" __global__ void __launch_bounds__(VERIFY_ATTN_THREADS, D > 128 || kStages == 1 ? 1 : FMT == KV8_FP8 || D == 128 ? 4 : 3)\
      verify_attention_kv8_d##D##_##TAG##_##FNAME(const VerifyAttentionKV8Params p) { specdec::pdl_begin();           \
    if constexpr (kRunsHere<MMA>) verify_attention_kv8_body<D, MMA, FMT>(p); else __trap();   \
  }
#define SPECDEC_VERIFY_ATTENTION_KV8_FMTS(D, TAG, MMA)        \
  SPECDEC_VERIFY_ATTENTION_KV8(D, TAG, MMA, fp8, KV8_FP8)     \
  SPECDEC_VERIFY_ATTENTION_KV8(D, TAG, MMA, int8, KV8_INT8)

SPECDEC_VERIFY_ATTENTION_KV8_FMTS(64, f16, mma_f16)
SPECDEC_VERIFY_ATTENTION_KV8_FMTS(128, f16, mma_f16)
SPECDEC_VERIFY_ATTENTION_KV8_FMTS(256, f16, mma_f16)
SPECDEC_VERIFY_ATTENTION_KV8_FMTS(64, bf16, mma_bf16)
SPECDEC_VERIFY_ATTENTION_KV8_FMTS(128, bf16, mma_bf16)
SPECDEC_VERIFY_ATTENTION_KV8_FMTS(256, bf16, mma_bf16)
