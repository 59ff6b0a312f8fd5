// verify_attention: the target pass's attention over one speculative verify block.
//
// Shapes: q [T, Hq, D]; k_cache, v_cache [num_pages, page_size, Hkv, D] read through
// page_table [B, max_pages]; seq_lens [B] (committed L); cu_q [B+1]; out [T, Hq, D].
// Row i of sequence b sits at position L+i and sees keys 0..L+i (bottom-right causal;
// the block's own K/V are already in the pages).
//
// Why it looks like this:
// * Decode-like: each KV byte is used by only q*group query rows (<= 256), so the kernel
//   is bound by reading K/V. One CTA owns one (sequence, KV head, m-group, KV split) and
//   packs the q x group query rows that share a KV head into the MMA M dimension
//   (packed row r = i*group + h_in_group, 16 rows per warp m-tile), so a KV tile is read
//   from memory once per KV head, not once per query head. Up to 4 m-tiles (64 rows) per
//   CTA; more rows take more CTAs along grid.y (the KV tile then comes from L2).
// * 4 warps = warps_m (m-tiles) x warps_n (key slices): with few rows (q*group <= 16)
//   the four warps split each KV tile's 16-key sub-tiles between them and merge their
//   softmax states at the end, so the tensor-core work is spread over the SM.
// * KV tiles (64 keys, 32 for D=256) are gathered row by row through the page table
//   with 16-byte cp.async into a 3-stage ring (sm_80+); the compute_75 build uses the
//   same code with synchronous copies and one stage. Shared rows are XOR-swizzled in
//   16-byte chunks so ldmatrix reads are conflict-free. The page ids of a tile are
//   fetched one iteration before its copies are issued (a small smem ring), so the
//   page-table load latency never sits between a barrier and the cp.async it feeds.
// * Grid (Hkv * m-groups, B, splits): the KV heads of a sequence are adjacent CTAs and
//   run together, so the resident CTAs stream whole page slots (every head's 2*D bytes)
//   from few pages instead of one head's slice of many pages.
// * Scores use mma m16n8k16 (two m16n8k8 on sm_75, see common/mma.cuh); P stays in
//   registers as the A operand of P.V. Online softmax in the log2 domain; the causal
//   mask is applied only to sub-tiles that reach past key L (or the split's end).
// * Split-KV (grid.z): split s covers keys [s*kv_chunk, (s+1)*kv_chunk) of the
//   sequence; a sequence needing one split writes `out` directly, otherwise each split
//   writes a normalised partial output + log2 LSE and verify_attention_merge combines
//   (one CTA per output row; lanes/threads spread over the splits, few round trips).
// * Bad input never faults: a page id outside the pool / table, or a negative L, turns
//   the CTA's rows into NaN; a sequence whose cu_q range is invalid is left unwritten.
#include <math.h>

#include "common/cluster.cuh"
#include "common/cp_async.cuh"
#include "common/pdl.cuh"
#include "common/dtype.cuh"
#include "common/mma.cuh"
#include "common/warp.cuh"
#include "attention/attention_params.h"

using namespace specdec;

namespace {

#include "attention/verify_attention_common.cuh"

template <int D>
struct Tile {
  static constexpr int kKeys = D <= 128 ? 64 : 32;              // keys per KV tile
  static constexpr int kSubTiles = kKeys / 16;                  // 16-key MMA steps per tile
  static constexpr int kChunks = D / 8;                         // 16-byte chunks per key row
  static constexpr int kRowsPerPass = kThreads / kChunks;       // key rows per CTA-wide copy pass
  static constexpr int kPasses = kKeys / kRowsPerPass;
  static constexpr int kStageElems = 2 * kKeys * D;             // K then V, 16-bit elements
  static constexpr int kPipeBytes = kStages * kStageElems * 2;
  static constexpr int kSmemBytes =
      kPipeBytes > VERIFY_ATTN_EPILOGUE_SMEM ? kPipeBytes : VERIFY_ATTN_EPILOGUE_SMEM;
  static_assert(kKeys % kRowsPerPass == 0, "tile rows must split evenly over the copy passes");
};

template <int D, typename Mma>
__device__ __forceinline__ void verify_attention_body(const VerifyAttentionParams& p) {
  using TL = Tile<D>;
  extern __shared__ __align__(512) unsigned char smem[];   // rows at multiples of their size: swz_chunk
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
  if (smem_addr(smem) & (2 * D - 1)) return;   // (never seen: __align__ places it; swz_chunk needs it)
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

  // ---- KV tile loader: thread copies chunk `ld_chunk` of key rows ld_row0 + k*kRowsPerPass.
  const int ld_chunk = threadIdx.x % TL::kChunks;
  const int ld_row0 = threadIdx.x / TL::kChunks;
  const uint16_t* k_head = static_cast<const uint16_t*>(p.k_cache) + (int64_t)kvh * p.k_stride_h +
                           ld_chunk * 8;
  const uint16_t* v_head = static_cast<const uint16_t*>(p.v_cache) + (int64_t)kvh * p.v_stride_h +
                           ld_chunk * 8;
  const int32_t* pt_row = p.page_table + (int64_t)b * p.page_table_stride;
  const int slot_mask = (1 << p.page_size_log2) - 1;
  uint16_t* const ring = reinterpret_cast<uint16_t*>(smem);

  // Page id of key row `row` of tile `tile`, or -1 when the row lies past the split (its
  // smem row is zero-filled) or its page is outside the table / pool (flags the CTA).
  auto tile_page = [&](int tile, int row) -> int {
    return kv_page(p, pt_row, kv_begin + tile * TL::kKeys + row, kv_end, bad_input);
  };
  // Multi-stage builds look the page ids up one tile before the tile's copies are issued
  // (thread r < kKeys fetches row r during the previous tile's compute and parks it in this
  // ring, slot = tile % kStages), so no page-table load sits between a barrier and the
  // cp.async it feeds. The single-stage (sm_75) build reads the table inline.
  __shared__ int tile_pages[kStages > 1 ? kStages : 1][TL::kKeys];

  auto load_tile = [&](int tile, int stage) {
    const int key_tile = kv_begin + tile * TL::kKeys;
    uint16_t* sk = ring + stage * TL::kStageElems;
    uint16_t* sv_ = sk + TL::kKeys * D;
#pragma unroll
    for (int pass = 0; pass < TL::kPasses; ++pass) {
      const int row = ld_row0 + pass * TL::kRowsPerPass;
      int page;
      if constexpr (kStages > 1) {
        page = tile_pages[stage][row];
      } else {
        page = tile_page(tile, row);
      }
      const bool valid = page >= 0;
      const int slot = (key_tile + row) & slot_mask;
      const int soff = row * D + ((ld_chunk ^ (row & 7)) << 3);
      const uint16_t* ksrc = valid ? k_head + (int64_t)page * p.k_stride_page + slot * p.k_stride_slot : k_head;
      const uint16_t* vsrc = valid ? v_head + (int64_t)page * p.v_stride_page + slot * p.v_stride_slot : v_head;
      cp_async_16(sk + soff, ksrc, valid);
      cp_async_16(sv_ + soff, vsrc, valid);
    }
  };

  // ---- per-warp online softmax state: rows r_lo / r_hi, log2 domain, unnormalised acc.
  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  // ldmatrix rows by XOR (swz_chunk): every row address below has (row & 7) == (lane & 7)
  const uint32_t xsw = swz_xor(lane);

  auto compute_tile = [&](int tile, int stage) {
    if (!warp_has_rows) return;
    const int key_tile = kv_begin + tile * TL::kKeys;
    const uint16_t* sk = ring + stage * TL::kStageElems;
    const uint16_t* sv_ = sk + TL::kKeys * D;
    for (int sub = wn; sub < TL::kSubTiles; sub += warps_n) {
      const int key0 = key_tile + sub * 16;
      if (key0 >= kv_end) break;
      // S = Q K^T for 16 rows x 16 keys (two n-tiles of 8 keys)
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      const int k_row = sub * 16 + ((lane >> 4) << 3) + (lane & 7);
      const uint32_t k_addr = swz_row(smem_addr(sk + k_row * D), (lane >> 3) & 1, lane);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kb[4];
        if constexpr (kStages > 1) {
          ldmatrix_x4_at(kb, swz_chunk(k_addr, 2 * kk, xsw));
        } else {   // sm_75 (96 registers): the XOR form spills there
          ldmatrix_x4(kb, sk + k_row * D + (((2 * kk + ((lane >> 3) & 1)) ^ (lane & 7)) << 3));
        }
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
        for (int e = 0; e < 4; ++e) s[n][e] *= p.scale_log2;
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
      const uint32_t v_addr = swz_row(smem_addr(sv_ + v_row * D), lane >> 4, lane);
#pragma unroll
      for (int dc = 0; dc < D / 8; dc += 2) {
        uint32_t vb[4];
        if constexpr (kStages > 1) {
          ldmatrix_x4_trans_at(vb, swz_chunk(v_addr, dc, xsw));
        } else {
          ldmatrix_x4_trans(vb, sv_ + v_row * D + (((dc + (lane >> 4)) ^ (lane & 7)) << 3));
        }
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
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
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

// Combine the per-split partial outputs of sequences that needed more than one split.
// grid (Hq, B, max_q): one CTA per output row (token, head), 128 threads. Latency-bound
// (a few MB at most), so the work is laid out for few dependent round trips: each warp
// reduces the split LSEs with its lanes striding the splits (max, then sum, shuffles),
// then thread t owns 4 columns of one "slice" of the splits (D/4 column threads, 128/(D/4)
// slices), issues all of its partial loads back to back, and the slices add up in smem.
template <typename Mma>
__device__ __forceinline__ void verify_attention_merge_body(const VerifyAttentionMergeParams& p) {
  __shared__ __align__(16) float4 slice_sum[128];
  const int b = blockIdx.y;
  SeqView sv;
  if (!seq_view(p.cu_q, p.seq_lens, b, p.max_q, p.num_tokens, p.num_splits, p.kv_chunk, sv))
    return;
  const int i = blockIdx.z;
  if (sv.num_splits <= 1 || i >= sv.qn) return;   // one split: written by the attention kernel
  const int h = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int ns = sv.num_splits;
  const int64_t split_stride = (int64_t)p.num_tokens * p.num_qo_heads;
  const int64_t tok = sv.q0 + i;
  const int64_t row = tok * p.num_qo_heads + h;
  const float* lse = p.partial_lse + row;

  float M = -INFINITY;
  for (int s = lane; s < ns; s += 32) M = fmaxf(M, lse[s * split_stride]);
  M = warp_max(M);
  const float base = M == -INFINITY ? 0.f : M;
  float lsum = 0.f;
  for (int s = lane; s < ns; s += 32) lsum += ex2(lse[s * split_stride] - base);   // L1 hits
  lsum = warp_sum(lsum);
  const float inv = lsum > 0.f ? 1.f / lsum : 0.f;

  const int col_threads = p.head_dim >> 2;   // 16, 32 or 64
  const int slices = blockDim.x / col_threads;
  const int c = (threadIdx.x % col_threads) * 4;
  const int slice = threadIdx.x / col_threads;
  const float* po = p.partial_o + row * p.head_dim + c;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int s = slice; s < ns; s += slices) {
    const float w = ex2(lse[s * split_stride] - base) * inv;
    const float4 v = *reinterpret_cast<const float4*>(po + s * split_stride * p.head_dim);
    o.x += w * v.x;
    o.y += w * v.y;
    o.z += w * v.z;
    o.w += w * v.w;
  }
  slice_sum[threadIdx.x] = o;
  __syncthreads();
  if (slice != 0) return;
  for (int k = 1; k < slices; ++k) {
    const float4 v = slice_sum[k * col_threads + threadIdx.x];
    o.x += v.x;
    o.y += v.y;
    o.z += v.z;
    o.w += v.w;
  }
  uint16_t* dst = static_cast<uint16_t*>(p.out) + tok * p.out_stride_t + h * p.out_stride_h + c;
  *reinterpret_cast<uint2*>(dst) = make_uint2(Mma::pack(o.x, o.y), Mma::pack(o.z, o.w));
  if (threadIdx.x == 0 && p.lse_out != nullptr)
    p.lse_out[tok * p.lse_stride_t + h * p.lse_stride_h] =
        lsum > 0.f ? (base + __log2f(lsum)) * kLn2 : -INFINITY;
}


// ======================================================================================
// The sm_90 small-batch path (verify_attention_cluster_*): one launch, no workspace.
//
// A thread-block cluster of C = p.num_splits CTAs per (sequence, KV head, m-group), grid
// (C * Hkv * m-groups, B, 1), clusters along x (blockIdx.x = head_cta * C + rank). The
// sequence's actual L + q keys (not the host's bound max_kv_len: a page table sized for
// growth would otherwise leave CTAs idle) go ceil(tiles / C) whole KV tiles per CTA; rank r
// computes its keys as a split CTA of the kernel above (same inner loop), then:
// * its four warps' states are merged in shared memory (all D columns in one pass), giving
//   per packed row a normalised partial output and its log2 LSE;
// * the partial of column group c4 (4 columns) goes to CTA c4 % C of the cluster, the LSE of
//   every row to CTAs 0..C-1, by st.async into a receive buffer that is not the ring (peers
//   push while this CTA may still be computing), counted by the receiver's mbarrier;
// * each CTA waits for its bytes, combines its column groups over the splits (the merge
//   kernel's arithmetic) and writes `out` (and lse_out, CTA 0).
// No global workspace, no counters, no second launch, and no MEMBAR.GPU: the only cluster
// barrier is arrive.relaxed (after the mbarrier init) ... wait (before the first push).
// Latency: cu_q / seq_lens and the page-table prefix (staged to shared memory) are one
// round trip, so the KV cp.async and Q loads are the second and last before the math.
// The inner loop is a copy of verify_attention_body's: that kernel's PTX stays untouched.
// p.kv_chunk is the host's plan (tiles per CTA at max_kv_len), informative only here.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// A 4-byte read-only load issued here, -1 when `pred` is false (volatile: not moved).
__device__ __forceinline__ int ldg_now(const int32_t* ptr, bool pred) {
  int v;
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\tmov.b32 %0, -1;\n\t"
               "@p ld.global.nc.b32 %0, [%1];\n\t}"
               : "=r"(v) : "l"(ptr), "r"(static_cast<int>(pred)));
  return v;
}

template <int D>
struct ClusterTile {
  static constexpr int kCols4 = D / 4;                      // 4-column groups of a row
  static constexpr int kEpiStride = D + 8;                  // floats per epilogue row (== 8 mod 32)
  static constexpr int kEpiBytes = kWarps * 16 * kEpiStride * 4 + 2 * kWarps * 16 * 4;
  static constexpr int kRegion0 =
      Tile<D>::kPipeBytes > kEpiBytes ? Tile<D>::kPipeBytes : kEpiBytes;   // ring, then epilogue
  static constexpr int kPtStage = VERIFY_ATTN_CLUSTER_PT_STAGE;   // page-table entries staged
  static_assert(kPtStage % kThreads == 0, "page-table stage: whole passes of the CTA");
  static_assert(kRegion0 % 16 == 0, "receive buffer must stay 16-byte aligned");
};

template <int D, typename Mma>
__device__ __forceinline__ void verify_attention_cluster_body(const VerifyAttentionParams& p) {
  using TL = Tile<D>;
  using CT = ClusterTile<D>;
  extern __shared__ __align__(512) unsigned char smem[];   // rows at multiples of their size: swz_chunk
  __shared__ int bad_input;
  __shared__ __align__(8) uint64_t recv_bar;
  __shared__ int tile_pages[kStages][TL::kKeys];

  const int C = p.num_splits;                      // == the cluster size (host)
  const int rank = static_cast<int>(cluster_rank());
  const int head_cta = blockIdx.x / C;
  const int b = blockIdx.y;
  const int kvh = head_cta % p.num_kv_heads;
  const int row_base = (head_cta / p.num_kv_heads) * p.warps_m * 16;
  const int32_t* pt_row = p.page_table + (int64_t)b * p.page_table_stride;
  const bool fetches_ids = threadIdx.x < TL::kKeys;
  const int R = p.warps_m * 16;                    // receive-buffer rows per source
  const int own_max = (CT::kCols4 + C - 1) / C;    // column groups a CTA combines, at most
  const int recv_bytes = C * R * 4 + C * R * own_max * 16;
  const uint32_t need = CT::kRegion0 + recv_bytes + CT::kPtStage * 4;
  if (dynamic_smem_bytes() < need) return;         // launcher bug (uniform): out untouched
  if (smem_addr(smem) & (2 * D - 1)) return;       // (never seen: __align__; swz_chunk needs it)
  float* const recv_lse = reinterpret_cast<float*>(smem + CT::kRegion0);   // [C][R]
  float4* const recv_o = reinterpret_cast<float4*>(recv_lse + C * R);       // [C][R][own_max]
  int* const pt_stage = reinterpret_cast<int*>(smem + CT::kRegion0 + recv_bytes);

  // ---- trip 1: cu_q / seq_lens, and the sequence's first P page-table entries staged into
  // shared memory (4-byte cp.async: no registers), all issued before the first branch
  // (volatile loads: NVVM sinks plain ones below the exits that do not use them). Which keys
  // this CTA owns depends on L (the actual length is split over the cluster, not the
  // host's bound), so the table prefix is staged whole; ids past it are read from global.
  const int q0 = ldg_now(p.cu_q + b, true);
  const int q1 = ldg_now(p.cu_q + b + 1, true);
  const int L_raw = ldg_now(p.seq_lens + b, true);
  const int P = min(p.max_pages, CT::kPtStage);
#pragma unroll
  for (int k = 0; k < CT::kPtStage / kThreads; ++k) {
    const int e = static_cast<int>(threadIdx.x) + k * kThreads;
    if (e < P) cp_async_4(pt_stage + e, pt_row + e);
  }
  cp_async_commit();
  if (threadIdx.x == 0) {
    bad_input = 0;
    mbar_init(&recv_bar, 1);
    fence_mbar_init();
  }
  // seq_view's checks. Every early exit is uniform over the cluster (same b, same head
  // group): no peer is left waiting or pushing to a CTA that has gone.
  SeqView sv;
  sv.q0 = q0;
  sv.qn = q1 - q0;
  const int group = p.group;
  const int rows = sv.qn * group;
  if (q0 < 0 || sv.qn <= 0 || sv.qn > p.max_q || q1 > p.num_tokens || row_base >= rows) {
    cp_async_wait<0>();   // no copy into this CTA's shared memory outlives it
    return;
  }
  sv.bad_len = L_raw < 0;
  sv.L = sv.bad_len ? 0 : L_raw;
  cluster_arrive_relaxed();                        // after the mbarrier init (fenced above)

  // The actual L + q keys over the C CTAs: ceil(tiles / C) whole tiles each, ns CTAs busy.
  const int L = sv.L;
  const int n_ctx = L + sv.qn;
  const int n_tiles = (n_ctx + TL::kKeys - 1) / TL::kKeys;
  const int tpc = (n_tiles + C - 1) / C;
  const int chunk = tpc * TL::kKeys;
  const int ns = (n_tiles + tpc - 1) / tpc;
  const bool active = rank < ns;
  const int kv_begin = rank * chunk;
  const int kv_end = rank == ns - 1 ? n_ctx : kv_begin + chunk;
  const int n_rows = min(rows - row_base, R);
  const int own = (CT::kCols4 - rank + C - 1) / C;   // c4 = rank, rank + C, ... (C <= 16 <= kCols4)
  if (threadIdx.x == 0)
    mbar_arrive_expect_tx(&recv_bar, static_cast<uint32_t>(ns * n_rows * (16 * own + 4)));

  // Page id of key row `row` of tile `tile`: the staged copy below P, else a global read;
  // -1 past the split (zero-filled row), or for an id outside the table / pool (`bad`).
  auto tile_page = [&](int tile, int row, bool& bad) -> int {
    const int key = kv_begin + tile * TL::kKeys + row;
    if (key >= kv_end) return -1;
    const int pidx = key >> p.page_size_log2;
    const int page = pidx < P ? pt_stage[pidx] : pidx < p.max_pages ? __ldg(pt_row + pidx) : -1;
    if (page < 0 || page >= p.num_pages) {
      bad = true;
      return -1;
    }
    return page;
  };
  cp_async_wait<0>();
  __syncthreads();   // the staged page ids are visible
  bool my_bad = sv.bad_len;
  if (active && fetches_ids) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) tile_pages[st][threadIdx.x] = tile_page(st, threadIdx.x, my_bad);
  }

  const int span_mtiles = (min(rows - row_base, p.warps_m * 16) + 15) >> 4;
  const int warps_m = span_mtiles == 1 ? 1 : span_mtiles == 2 ? 2 : 4;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps_n = kWarps / warps_m;
  const int wm = warp / warps_n;
  const int wn = warp - wm * warps_n;
  const int g = lane >> 2;
  const int t4 = lane & 3;
  const int r_lo = row_base + wm * 16 + g;
  const int r_hi = r_lo + 8;
  const bool warp_has_rows = active && row_base + wm * 16 < rows;

  // ---- trip 2 (with the KV copies below): Q fragments, held in registers (sm_90: 3 stages)
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
  uint32_t qa[D / 16][4];
  if (warp_has_rows) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int c = kk * 16 + 2 * t4;
      qa[kk][0] = qlo ? ld_u32(qlo + c) : 0u;
      qa[kk][1] = qhi ? ld_u32(qhi + c) : 0u;
      qa[kk][2] = qlo ? ld_u32(qlo + c + 8) : 0u;
      qa[kk][3] = qhi ? ld_u32(qhi + c + 8) : 0u;
    }
  }
  const int lim_lo = min(L + r_lo / group, kv_end - 1);
  const int lim_hi = min(L + r_hi / group, kv_end - 1);

  const int ld_chunk = threadIdx.x % TL::kChunks;
  const int ld_row0 = threadIdx.x / TL::kChunks;
  const uint16_t* k_head = static_cast<const uint16_t*>(p.k_cache) + (int64_t)kvh * p.k_stride_h +
                           ld_chunk * 8;
  const uint16_t* v_head = static_cast<const uint16_t*>(p.v_cache) + (int64_t)kvh * p.v_stride_h +
                           ld_chunk * 8;
  const int slot_mask = (1 << p.page_size_log2) - 1;
  uint16_t* const ring = reinterpret_cast<uint16_t*>(smem);

  auto load_tile = [&](int tile, int stage) {
    const int key_tile = kv_begin + tile * TL::kKeys;
    uint16_t* sk = ring + stage * TL::kStageElems;
    uint16_t* sv_ = sk + TL::kKeys * D;
#pragma unroll
    for (int pass = 0; pass < TL::kPasses; ++pass) {
      const int row = ld_row0 + pass * TL::kRowsPerPass;
      const int page = tile_pages[stage][row];
      const bool valid = page >= 0;
      const int slot = (key_tile + row) & slot_mask;
      const int soff = row * D + ((ld_chunk ^ (row & 7)) << 3);
      const uint16_t* ksrc = valid ? k_head + (int64_t)page * p.k_stride_page + slot * p.k_stride_slot : k_head;
      const uint16_t* vsrc = valid ? v_head + (int64_t)page * p.v_stride_page + slot * p.v_stride_slot : v_head;
      cp_async_16(sk + soff, ksrc, valid);
      cp_async_16(sv_ + soff, vsrc, valid);
    }
  };

  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  const uint32_t xsw = swz_xor(lane);   // as verify_attention_body's

  auto compute_tile = [&](int tile, int stage) {   // verify_attention_body's compute_tile
    if (!warp_has_rows) return;
    const int key_tile = kv_begin + tile * TL::kKeys;
    const uint16_t* sk = ring + stage * TL::kStageElems;
    const uint16_t* sv_ = sk + TL::kKeys * D;
    for (int sub = wn; sub < TL::kSubTiles; sub += warps_n) {
      const int key0 = key_tile + sub * 16;
      if (key0 >= kv_end) break;
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      const int k_row = sub * 16 + ((lane >> 4) << 3) + (lane & 7);
      const uint32_t k_addr = swz_row(smem_addr(sk + k_row * D), (lane >> 3) & 1, lane);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kb[4];
        ldmatrix_x4_at(kb, swz_chunk(k_addr, 2 * kk, xsw));
        Mma::mma(s[0], qa[kk], kb[0], kb[1]);
        Mma::mma(s[1], qa[kk], kb[2], kb[3]);
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= p.scale_log2;
      if (key0 + 15 > L || key0 + 16 > kv_end) {
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
      const float base_lo = mn_lo == -INFINITY ? 0.f : mn_lo;
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
      const uint32_t pa[4] = {Mma::pack(s[0][0], s[0][1]), Mma::pack(s[0][2], s[0][3]),
                              Mma::pack(s[1][0], s[1][1]), Mma::pack(s[1][2], s[1][3])};
      const int v_row = sub * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
      const uint32_t v_addr = swz_row(smem_addr(sv_ + v_row * D), lane >> 4, lane);
#pragma unroll
      for (int dc = 0; dc < D / 8; dc += 2) {
        uint32_t vb[4];
        ldmatrix_x4_trans_at(vb, swz_chunk(v_addr, dc, xsw));
        Mma::mma(acc[dc], pa, vb[0], vb[1]);
        Mma::mma(acc[dc + 1], pa, vb[2], vb[3]);
      }
    }
  };

  // ---- the split's KV tiles: the 3-stage ring of verify_attention_body, its first kStages
  // page ids already fetched (the barrier also ORs the prologue's bad-page flags)
  const bool bad0 = __syncthreads_or(my_bad) != 0;   // also: tile_pages visible
  if (active) {
    const int num_tiles = (kv_end - kv_begin + TL::kKeys - 1) / TL::kKeys;
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < num_tiles) load_tile(st, st);
      cp_async_commit();
    }
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int ahead = tile + kStages;
      const bool fetch = fetches_ids && ahead < num_tiles;
      bool ahead_bad = false;
      const int ahead_page = fetch ? tile_page(ahead, threadIdx.x, ahead_bad) : -1;
      cp_async_wait<kStages - 2>();
      __syncthreads();
      const int next = tile + kStages - 1;
      if (next < num_tiles) load_tile(next, next % kStages);
      cp_async_commit();
      compute_tile(tile, tile % kStages);
      if (fetch) tile_pages[ahead % kStages][threadIdx.x] = ahead_page;
      if (ahead_bad) bad_input = 1;
    }
    cp_async_wait<0>();
    __syncthreads();   // ring no longer read: the epilogue reuses it

    // ---- merge the warps_n key slices of each m-tile, all D columns at once
    float* epi_o = reinterpret_cast<float*>(smem);                  // [kWarps][16][kEpiStride]
    float* epi_m = epi_o + kWarps * 16 * CT::kEpiStride;            // [kWarps][16]
    float* epi_l = epi_m + kWarps * 16;                             // [kWarps][16]
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
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float* dst = epi_o + (warp * 16 + g) * CT::kEpiStride + n * 8 + 2 * t4;
      *reinterpret_cast<float2*>(dst) = make_float2(acc[n][0], acc[n][1]);
      *reinterpret_cast<float2*>(dst + 8 * CT::kEpiStride) = make_float2(acc[n][2], acc[n][3]);
    }
    __syncthreads();
    const bool bad = bad0 || bad_input != 0;
    cluster_wait();   // every peer's mbarrier is initialised: pushes may start
    for (int it = threadIdx.x; it < n_rows * CT::kCols4; it += kThreads) {
      const int rl = it / CT::kCols4;
      const int c4 = it - rl * CT::kCols4;
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
        const float4 v = *reinterpret_cast<const float4*>(epi_o + (w * 16 + r) * CT::kEpiStride + c4 * 4);
        o.x += f * v.x;
        o.y += f * v.y;
        o.z += f * v.z;
        o.w += f * v.w;
      }
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
      o.x *= inv;
      o.y *= inv;
      o.z *= inv;
      o.w *= inv;
      float lse2 = lsum > 0.f ? base + __log2f(lsum) : -INFINITY;
      if (bad) {
        o = make_float4(NAN, NAN, NAN, NAN);
        lse2 = NAN;   // the combine turns the whole row (and its LSE) into NaN
      }
      const int dst = c4 % C;
      const int j = c4 / C;
      st_async_v4(cluster_map(recv_o + (rank * R + rl) * own_max + j, dst), o,
                  cluster_map(&recv_bar, dst));
      if (c4 < C)
        st_async_f32(cluster_map(recv_lse + rank * R + rl, c4), lse2, cluster_map(&recv_bar, c4));
    }
  } else {
    cluster_wait();   // (matches the arrive; an idle split pushes nothing)
  }

  // ---- receive: this CTA's column groups c4 = rank + j * C of every row, from ns splits
  while (!mbar_try_wait(&recv_bar, 0)) {
  }
  for (int it = threadIdx.x; it < n_rows * own; it += kThreads) {
    const int rl = it / own;
    const int j = it - rl * own;
    const int c4 = rank + j * C;
    float M = -INFINITY;
    bool nan = false;
    for (int s = 0; s < ns; ++s) {
      const float l = recv_lse[s * R + rl];
      M = fmaxf(M, l);
      nan |= (__float_as_uint(l) & 0x7fffffffu) > 0x7f800000u;   // a flagged split (bit test:
                                                                  // immune to fast-math folding)
    }
    const float base = M == -INFINITY ? 0.f : M;
    float lsum = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < ns; ++s) {
      const float w = ex2(recv_lse[s * R + rl] - base);
      const float4 v = recv_o[(s * R + rl) * own_max + j];
      lsum += w;
      o.x += w * v.x;
      o.y += w * v.y;
      o.z += w * v.z;
      o.w += w * v.w;
    }
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    o.x *= inv;
    o.y *= inv;
    o.z *= inv;
    o.w *= inv;
    float lse = lsum > 0.f ? (base + __log2f(lsum)) * kLn2 : -INFINITY;
    if (nan) {
      o = make_float4(NAN, NAN, NAN, NAN);
      lse = NAN;
    }
    const int R_ = row_base + rl;
    const int i = R_ / group;
    const int64_t tok = sv.q0 + i;
    const int head = kvh * group + (R_ - i * group);
    uint16_t* dst = static_cast<uint16_t*>(p.out) + tok * p.out_stride_t + head * p.out_stride_h + c4 * 4;
    *reinterpret_cast<uint2*>(dst) = make_uint2(Mma::pack(o.x, o.y), Mma::pack(o.z, o.w));
    if (c4 == 0 && p.lse_out != nullptr) p.lse_out[tok * p.lse_stride_t + head * p.lse_stride_h] = lse;
  }
}
#endif  // __CUDA_ARCH__ >= 900


}  // namespace

// bf16 needs sm_80 tensor cores: the compute_75 build keeps the symbols (every cubin has
// the same kernel table) but they trap; the Python layer never launches them there.
#define SPECDEC_VERIFY_ATTENTION(D, TAG, MMA)                                                   \
  extern "C" __global__ void __launch_bounds__(VERIFY_ATTN_THREADS)                             \
      verify_attention_d##D##_##TAG(const VerifyAttentionParams p) { specdec::pdl_begin();                            \
    if constexpr (kRunsHere<MMA>) verify_attention_body<D, MMA>(p); else __trap();            \
  }

SPECDEC_VERIFY_ATTENTION(64, f16, mma_f16)
SPECDEC_VERIFY_ATTENTION(128, f16, mma_f16)
SPECDEC_VERIFY_ATTENTION(256, f16, mma_f16)
SPECDEC_VERIFY_ATTENTION(64, bf16, mma_bf16)
SPECDEC_VERIFY_ATTENTION(128, bf16, mma_bf16)
SPECDEC_VERIFY_ATTENTION(256, bf16, mma_bf16)

extern "C" __global__ void __launch_bounds__(128)
    verify_attention_merge_f16(const VerifyAttentionMergeParams p) {
  specdec::pdl_begin();
  verify_attention_merge_body<mma_f16>(p);
}

extern "C" __global__ void __launch_bounds__(128)
    verify_attention_merge_bf16(const VerifyAttentionMergeParams p) {
  specdec::pdl_begin();
  verify_attention_merge_body<mma_bf16>(p);   // bf16 packing only: fine on every arch
}

// The sm_90 small-batch path: launched in clusters of p.num_splits CTAs along x (grid
// (num_splits * Hkv * m-groups, B, 1)); the compute_75 / compute_80 builds keep the symbols
// (one kernel table per cubin) but trap: the Python layer only plans it on sm_90 code.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SPECDEC_VA_CLUSTER_BODY(D, MMA) verify_attention_cluster_body<D, MMA>(p)
#else
#define SPECDEC_VA_CLUSTER_BODY(D, MMA) __trap()
#endif
#define SPECDEC_VERIFY_ATTENTION_CLUSTER(D, TAG, MMA)                                           \
  extern "C" __global__ void __launch_bounds__(VERIFY_ATTN_THREADS)                             \
      verify_attention_cluster_d##D##_##TAG(const VerifyAttentionParams p) {                    \
    specdec::pdl_begin();                                                                       \
    SPECDEC_VA_CLUSTER_BODY(D, MMA);                                                            \
  }

SPECDEC_VERIFY_ATTENTION_CLUSTER(64, f16, mma_f16)
SPECDEC_VERIFY_ATTENTION_CLUSTER(128, f16, mma_f16)
SPECDEC_VERIFY_ATTENTION_CLUSTER(256, f16, mma_f16)
SPECDEC_VERIFY_ATTENTION_CLUSTER(64, bf16, mma_bf16)
SPECDEC_VERIFY_ATTENTION_CLUSTER(128, bf16, mma_bf16)
SPECDEC_VERIFY_ATTENTION_CLUSTER(256, bf16, mma_bf16)
