// verify_attention_kv8: verify_attention (verify_attention.cu, whose comments hold for this
// kernel too) over an 8-bit paged KV cache, fp8_e4m3 or int8 (issue 32; the formats are
// specdec_lib/reference/kvquant.py's).
//
// What differs from the 16-bit kernel:
// * The cp.async ring holds 8-bit tiles (half the bytes per stage: the KV read, which bounds
//   this kernel, is halved). int8 rows bring their (scale, zero) pairs along (8-byte cp.async
//   per key row and K/V) into a small per-stage params ring.
// * After a tile has landed, one CTA pass dequantises it into a single 16-bit tile in the
//   16-bit kernel's swizzled layout (each thread converts the 16-byte chunks it copied:
//   smem -> registers -> 16-bit smem), a barrier, then the 16-bit kernel's unchanged MMA /
//   online-softmax code reads that tile. One barrier more per tile than the 16-bit kernel.
// * fp8: E4M3 values are exact in float16 and bfloat16, so the tile holds the codes' values
//   exactly and the per-head scales are applied in float32: k_scale folded into the score
//   scale, v_scale into the output (before the split merge, which is linear). compute_90
//   decodes with cvt.rn.f16x2.e4m3x2; compute_75 / compute_80 (hence sm_86 / sm_89) with the
//   branch-free integer decoder of common/kv8.cuh (same values); bf16 q goes on through
//   float32 to bf16 (exact).
// * int8: each element is dequantised to (c + 128) * scale + zero in float32 (kvquant.py),
//   then rounded to q's dtype for the MMA (the reference attends the float32 values; the
//   extra rounding is the 16-bit kernel's own input rounding, inside its tolerance).
// Split-KV, the merge kernel (verify_attention_merge_<dtype> of the attention module: the
// partials have the same layout) and row_invariant plans are the 16-bit kernel's.
#include <math.h>

#include "common/cp_async.cuh"
#include "common/pdl.cuh"
#include "common/dtype.cuh"
#include "common/mma.cuh"
#include "common/warp.cuh"
#include "common/kv8.cuh"
#include "common/kv8_row.cuh"
#include "attention/attention_params.h"

using namespace specdec;

namespace {

#include "attention/verify_attention_common.cuh"

template <int D>
struct Tile {
  static constexpr int kKeys = D <= 128 ? 64 : 32;              // keys per KV tile
  static constexpr int kSubTiles = kKeys / 16;                  // 16-key MMA steps per tile
  static constexpr int kChunks8 = D / 16;                       // 16-byte chunks per 8-bit key row
  static constexpr int kRowsPerPass8 = kThreads / kChunks8;
  static constexpr int kPasses8 = kKeys / kRowsPerPass8;
  static constexpr int kStageBytes8 = 2 * kKeys * D;            // K then V, 8-bit
  static constexpr int kRingBytes8 = kStages * kStageBytes8;
  static constexpr int kTileBytes16 = 2 * kKeys * D * 2;        // the dequantised K, V tile
  static constexpr int kParamBytes = kStages * 2 * kKeys * 8;   // int8 (scale, zero) ring
  static constexpr int kAllBytes = kRingBytes8 + kTileBytes16 + kParamBytes;
  static constexpr int kSmemBytes =
      kAllBytes > VERIFY_ATTN_EPILOGUE_SMEM ? kAllBytes : VERIFY_ATTN_EPILOGUE_SMEM;
  static_assert(kKeys % kRowsPerPass8 == 0, "tile rows must split evenly over the copy passes");
};

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

// 16 cache bytes -> 16 elements of the MMA dtype (bits), into two 16-byte chunks.
template <int FMT, bool kBf16>
__device__ __forceinline__ void kv8_dequant16(const uint4 in, float scale, float zero, uint4& lo,
                                              uint4& hi) {
  uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t two = (w[i >> 1] >> ((i & 1) * 16)) & 0xFFFFu;
    if constexpr (FMT == KV8_FP8 && !kBf16) {
      o[i] = kv8::e4m3x2_to_f16x2(two);
    } else if constexpr (FMT == KV8_FP8) {
      // through float16 (E4M3 values are exact in both 16-bit types), then to bf16 exactly
      const uint32_t h = kv8::e4m3x2_to_f16x2(two);
      __half2 v;
      memcpy(&v, &h, 4);
      const float2 f = __half22float2(v);
      o[i] = static_cast<uint32_t>(from_float<bf16_t>(f.x).bits) |
             (static_cast<uint32_t>(from_float<bf16_t>(f.y).bits) << 16);
    } else {
      float f[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t b = (two >> (8 * e)) & 0xFFu;
        f[e] = kv8::int8_decode(static_cast<int>(static_cast<int8_t>(b)), scale, zero);
      }
      uint16_t h0, h1;
      if constexpr (kBf16) {
        h0 = from_float<bf16_t>(f[0]).bits;
        h1 = from_float<bf16_t>(f[1]).bits;
      } else {
        const __half a = __float2half_rn(f[0]), c = __float2half_rn(f[1]);
        memcpy(&h0, &a, 2);
        memcpy(&h1, &c, 2);
      }
      o[i] = static_cast<uint32_t>(h0) | (static_cast<uint32_t>(h1) << 16);
    }
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}


template <int D, typename Mma, int FMT>
__device__ __forceinline__ void verify_attention_kv8_body(const VerifyAttentionKV8Params& P) {
  const VerifyAttentionParams& p = P.base;
  using TL = Tile<D>;
  extern __shared__ __align__(16) unsigned char smem[];
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
  if (dynamic_smem_bytes() < static_cast<uint32_t>(TL::kSmemBytes)) return;   // launcher bug: leave out untouched
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

  // ---- Q fragments (A operand), straight from global: 16 rows x D per warp. Held in
  // registers for the whole KV loop, except D=256 on sm_75 where that would spill: there
  // they are re-read (L1 hits) per 16-key step.
  constexpr bool kQInRegs = D <= 128 || kStages > 1;
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
  auto load_q_frag = [&](int kk, uint32_t (&a)[4]) {
    const int c = kk * 16 + 2 * t4;
    a[0] = qlo ? ld_u32(qlo + c) : 0u;
    a[1] = qhi ? ld_u32(qhi + c) : 0u;
    a[2] = qlo ? ld_u32(qlo + c + 8) : 0u;
    a[3] = qhi ? ld_u32(qhi + c + 8) : 0u;
  };
  uint32_t qa[kQInRegs ? D / 16 : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_q_frag(kk, qa[kk]);
  }
  // Last key each of the thread's two rows may see inside this split.
  const int lim_lo = min(L + r_lo / group, kv_end - 1);
  const int lim_hi = min(L + r_hi / group, kv_end - 1);

  // ---- KV tile loader (8-bit rows): thread copies chunk `ld_chunk` of key rows
  // ld_row0 + k*kRowsPerPass8, and dequantises exactly those chunks later.
  const int ld_chunk = threadIdx.x % TL::kChunks8;
  const int ld_row0 = threadIdx.x / TL::kChunks8;
  const uint8_t* k_head = static_cast<const uint8_t*>(p.k_cache) + (int64_t)kvh * p.k_stride_h +
                          ld_chunk * 16;
  const uint8_t* v_head = static_cast<const uint8_t*>(p.v_cache) + (int64_t)kvh * p.v_stride_h +
                          ld_chunk * 16;
  const int32_t* pt_row = p.page_table + (int64_t)b * p.page_table_stride;
  const int slot_mask = (1 << p.page_size_log2) - 1;
  uint8_t* const ring8 = smem;
  uint16_t* const tile16 = reinterpret_cast<uint16_t*>(smem + TL::kRingBytes8);
  float2* const prm = reinterpret_cast<float2*>(smem + TL::kRingBytes8 + TL::kTileBytes16);
  const int64_t prm_head = kvh;   // (scale, zero) pair index: (page * page_size + slot) * Hkv + kvh
  const float k_sc = FMT == KV8_FP8 ? __ldg(P.k_scale + kvh * P.scale_stride) : 1.f;
  const float v_sc = FMT == KV8_FP8 ? __ldg(P.v_scale + kvh * P.scale_stride) : 1.f;
  const float score_scale = p.scale_log2 * k_sc;

  // Page id of key row `row` of tile `tile`, or -1 when the row lies past the split (its
  // smem row is zero-filled) or its page is outside the table / pool (flags the CTA).
  auto tile_page = [&](int tile, int row) -> int {
    const int key = kv_begin + tile * TL::kKeys + row;
    if (key >= kv_end) return -1;
    const int pidx = key >> p.page_size_log2;
    const int page = pidx < p.max_pages ? __ldg(pt_row + pidx) : -1;
    if (page < 0 || page >= p.num_pages) {
      bad_input = 1;
      return -1;
    }
    return page;
  };
  // Multi-stage builds look the page ids up one tile before the tile's copies are issued
  // (thread r < kKeys fetches row r during the previous tile's compute and parks it in this
  // ring, slot = tile % kStages), so no page-table load sits between a barrier and the
  // cp.async it feeds. The single-stage (sm_75) build reads the table inline.
  __shared__ int tile_pages[kStages > 1 ? kStages : 1][TL::kKeys];

  auto load_tile = [&](int tile, int stage) {
    const int key_tile = kv_begin + tile * TL::kKeys;
    uint8_t* sk = ring8 + stage * TL::kStageBytes8;
    uint8_t* sv_ = sk + TL::kKeys * D;
#pragma unroll
    for (int pass = 0; pass < TL::kPasses8; ++pass) {
      const int row = ld_row0 + pass * TL::kRowsPerPass8;
      int page;
      if constexpr (kStages > 1) {
        page = tile_pages[stage][row];
      } else {
        page = tile_page(tile, row);
      }
      const bool valid = page >= 0;
      const int slot = (key_tile + row) & slot_mask;
      const int soff = row * D + ld_chunk * 16;
      const uint8_t* ksrc = valid ? k_head + (int64_t)page * p.k_stride_page + slot * p.k_stride_slot : k_head;
      const uint8_t* vsrc = valid ? v_head + (int64_t)page * p.v_stride_page + slot * p.v_stride_slot : v_head;
      cp_async_16(sk + soff, ksrc, valid);
      cp_async_16(sv_ + soff, vsrc, valid);
      if constexpr (FMT == KV8_INT8) {
        if (ld_chunk == 0) {
          const int64_t pi = valid ? ((((int64_t)page << p.page_size_log2) + slot) * p.num_kv_heads + prm_head) * 2 : 0;
          float2* pr = prm + (stage * 2) * TL::kKeys + row;
          cp_async_8(pr, P.k_params + pi, valid);
          cp_async_8(pr + TL::kKeys, P.v_params + pi, valid);
        }
      }
    }
  };

  // Dequantise the landed 8-bit stage into the 16-bit tile (the chunks this thread copied;
  // int8 params were copied by the row's chunk-0 thread: call after a barrier).
  auto convert_tile = [&](int stage) {
    const uint8_t* sk = ring8 + stage * TL::kStageBytes8;
#pragma unroll
    for (int pass = 0; pass < TL::kPasses8; ++pass) {
      const int row = ld_row0 + pass * TL::kRowsPerPass8;
#pragma unroll
      for (int kv = 0; kv < 2; ++kv) {
        const uint4 in = *reinterpret_cast<const uint4*>(sk + kv * TL::kKeys * D + row * D + ld_chunk * 16);
        float sc = 0.f, zr = 0.f;
        if constexpr (FMT == KV8_INT8) {
          const float2 pr = prm[(stage * 2 + kv) * TL::kKeys + row];
          sc = pr.x;
          zr = pr.y;
        }
        uint4 lo, hi;
        kv8_dequant16<FMT, Mma::kIsBf16>(in, sc, zr, lo, hi);
        uint16_t* dst = tile16 + kv * TL::kKeys * D + row * D;
        *reinterpret_cast<uint4*>(dst + (((2 * ld_chunk) ^ (row & 7)) << 3)) = lo;
        *reinterpret_cast<uint4*>(dst + (((2 * ld_chunk + 1) ^ (row & 7)) << 3)) = hi;
      }
    }
  };

  // ---- per-warp online softmax state: rows r_lo / r_hi, log2 domain, unnormalised acc.
  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  const int swz = lane & 7;   // every ldmatrix row address below has (row & 7) == (lane & 7)

  auto compute_tile = [&](int tile, int stage) {
    if (!warp_has_rows) return;
    const int key_tile = kv_begin + tile * TL::kKeys;
    (void)stage;
    const uint16_t* sk = tile16;
    const uint16_t* sv_ = sk + TL::kKeys * D;
    for (int sub = wn; sub < TL::kSubTiles; sub += warps_n) {
      const int key0 = key_tile + sub * 16;
      if (key0 >= kv_end) break;
      // S = Q K^T for 16 rows x 16 keys (two n-tiles of 8 keys)
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      const int k_row = sub * 16 + ((lane >> 4) << 3) + (lane & 7);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kb[4];
        const int chunk = 2 * kk + ((lane >> 3) & 1);
        ldmatrix_x4(kb, sk + k_row * D + ((chunk ^ swz) << 3));
        if constexpr (kQInRegs) {
          Mma::mma(s[0], qa[kk], kb[0], kb[1]);
          Mma::mma(s[1], qa[kk], kb[2], kb[3]);
        } else {
          uint32_t a[4];
          load_q_frag(kk, a);
          Mma::mma(s[0], a, kb[0], kb[1]);
          Mma::mma(s[1], a, kb[2], kb[3]);
        }
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= score_scale;
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
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        acc[n][0] *= alpha_lo;
        acc[n][1] *= alpha_lo;
        acc[n][2] *= alpha_hi;
        acc[n][3] *= alpha_hi;
      }
      // O += P V: P (16 x 16 keys) is already laid out as an A fragment.
      const uint32_t pa[4] = {Mma::pack(s[0][0], s[0][1]), Mma::pack(s[0][2], s[0][3]),
                              Mma::pack(s[1][0], s[1][1]), Mma::pack(s[1][2], s[1][3])};
      const int v_row = sub * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
#pragma unroll
      for (int dc = 0; dc < D / 8; dc += 2) {
        uint32_t vb[4];
        const int chunk = dc + (lane >> 4);
        ldmatrix_x4_trans(vb, sv_ + v_row * D + ((chunk ^ swz) << 3));
        Mma::mma(acc[dc], pa, vb[0], vb[1]);
        Mma::mma(acc[dc + 1], pa, vb[2], vb[3]);
      }
    }
  };

  // ---- main loop over the split's KV tiles
  const int num_tiles = (kv_end - kv_begin + TL::kKeys - 1) / TL::kKeys;
  if constexpr (kStages == 1) {
    for (int tile = 0; tile < num_tiles; ++tile) {
      if (tile > 0) __syncthreads();   // everyone is done with the previous tile
      load_tile(tile, 0);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
      convert_tile(0);
      __syncthreads();
      compute_tile(tile, 0);
    }
  } else {
    const bool fetches_ids = threadIdx.x < TL::kKeys;
    if (fetches_ids) {
#pragma unroll
      for (int st = 0; st < kStages; ++st)
        if (st < num_tiles) tile_pages[st][threadIdx.x] = tile_page(st, threadIdx.x);
    }
    __syncthreads();
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < num_tiles) load_tile(st, st);
      cp_async_commit();
    }
    for (int tile = 0; tile < num_tiles; ++tile) {
      // ids of tile + kStages: loaded now, parked after the compute below into the slot of
      // tile `tile`, whose copies were issued two iterations ago
      const int ahead = tile + kStages;
      const bool fetch = fetches_ids && ahead < num_tiles;
      const int ahead_page = fetch ? tile_page(ahead, threadIdx.x) : -1;
      cp_async_wait<kStages - 2>();
      __syncthreads();   // tile `tile` and the ids of tile+kStages-1 visible; stage (tile-1) % kStages free
      const int next = tile + kStages - 1;
      if (next < num_tiles) load_tile(next, next % kStages);
      cp_async_commit();
      convert_tile(tile % kStages);
      __syncthreads();   // the 16-bit tile written; (the next iteration's first barrier orders
                         // this tile's readers before the next conversion overwrites it)
      compute_tile(tile, tile % kStages);
      if (fetch) tile_pages[ahead % kStages][threadIdx.x] = ahead_page;
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
#pragma unroll
    for (int j = 0; j < kEpiCols / 8; ++j) {
      float* dst = epi_o + (warp * 16 + g) * kEpiStride + j * 8 + 2 * t4;
      *reinterpret_cast<float2*>(dst) = make_float2(acc[cp * 8 + j][0], acc[cp * 8 + j][1]);
      *reinterpret_cast<float2*>(dst + 8 * kEpiStride) =
          make_float2(acc[cp * 8 + j][2], acc[cp * 8 + j][3]);
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

#define SPECDEC_VERIFY_ATTENTION_KV8(D, TAG, MMA, FNAME, FMT)                                   \
  extern "C" __global__ void __launch_bounds__(VERIFY_ATTN_THREADS)                             \
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
