// gdn family: the gated delta rule of a speculative round, split transactionally.
//
//   gdn_verify  q, k [T,Hk,Dk], v [T,Hv,Dv], gates [T,Hv], state pool (read only)
//               -> out [T,Hv,Dv] and journal [T, Hk*Dk + Hv*Dv + 2*Hv] (f32)
//   gdn_commit  journal + accept_len [B] -> state advanced in place over the accepted rows
//
// Traffic per round: verify reads each selected state once, commit reads and writes it
// once (and not at all when accept_len = 0); vLLM-style "a state per draft row" moves
// q+1 states instead.
//
// Work items: one per (sequence, value head, Dv slice), numbered
// item = (b * Hv + h) * num_slices + z, so the items that share a key head's q/k rows run
// next to each other. The grid is persistent (at most the CTAs resident at once; the
// launcher sizes it from the kernel's registers): CTA x takes items x, x + gridDim.x, ...
// and fetches the next item's state (raw words, in registers) while it works on the
// current one. Per item, the CTA keeps its [Dk x BV] slice of the state in registers
// (gdn_tile.cuh) for the whole block: the rows are applied one after the other with
// warp-local Dk reductions, the state rounded to its dtype after each row exactly as a
// stored state would be, so verify's row-i output equals one-token decoding of row i and
// commit's result equals decoding the accepted rows one by one. Block rows are staged in
// shared memory kRowChunk at a time (normalised k, q*scale, the v slice, decay, beta,
// k.q); a warp normalises one row with shuffles, so no block-wide reduction is needed.
//
// Per token and state element verify does 2 FMAs of reductions (S^T k, S^T q, both from
// the pre-token state: o = decay S^T q + delta (k.q)) and 2 of update; commit 1 + 2.
// CUDA cores only, for now. Future work, to be justified by measurement:
//  * chunked (WY) form: all q rows' S0^T k_t and S0^T q_t in one pass (an
//    [Dv x Dk] x [Dk x 2q] product, mma-able with q <= 8), then the intra-block
//    interactions through q x q scalars: delta_t = beta_t (v_t - e_t (g_{t-1} S0^T k_t +
//    sum_{s<t} (g_{t-1}/g_s)(k_s.k_t) delta_s)), o_t = g_t S0^T q_t + sum_{s<=t}
//    (g_t/g_s)(k_s.q_t) delta_s with g_t the running decay product. No per-row state
//    update in verify at all; exact up to f32 reassociation for an f32 state, but it
//    skips the per-row rounding of a 16-bit state (so keep the sequential path there).
//  * fused mode: verify of round r+1 first replays round r's accepted rows from the
//    previous journal (commit folded in), writes the advanced state once, then computes
//    the new block's outputs: 1 read + 1 write per round instead of 1 + 2. Needs a
//    per-sequence "pending accept_len" and a flush op for sequences that leave the
//    batch; worth it only if the round is bandwidth-bound at ~3 passes (measure first).
#include "gdn/gdn_tile.cuh"

using namespace specdec;
using namespace specdec::gdn;

namespace {

template <int DK>
struct RowStage {
  float k[kRowChunk][DK];      // normalised k (what the journal holds), at Tile::stage_idx
  float q[kRowChunk][DK];      // normalised q * scale, at Tile::stage_idx
  float v[kRowChunk][kMaxSliceCols];
  float4 gate[kRowChunk];      // exp(g), beta, k . (q * scale), unused
};

// One work item = (sequence b, value head h, Dv slice z), numbered
// item = (b * Hv + h) * num_slices + z, so consecutive items share a key head's q/k rows.
struct ItemPos {
  int z, h, b;
};

__device__ __forceinline__ ItemPos item_pos(int item, int num_slices, int num_v_heads) {
  ItemPos p;
  p.z = item % num_slices;
  const int bh = item / num_slices;
  p.h = bh % num_v_heads;
  p.b = bh / num_v_heads;
  return p;
}

// The per-sequence indices of an item (loaded an item before they are needed).
struct SeqIdx {
  int row0, row1, slot, n;
};

__device__ __forceinline__ SeqIdx load_seq(const int32_t* cu_q, const int32_t* slot_ids,
                                           const int32_t* accept_len, int b) {
  SeqIdx s;
  s.row0 = __ldg(cu_q + b);
  s.row1 = __ldg(cu_q + b + 1);
  s.slot = __ldg(slot_ids + b);
  s.n = accept_len != nullptr ? __ldg(accept_len + b) : 0;
  return s;
}

__device__ __forceinline__ bool rows_ok(const SeqIdx& s, int num_rows) {
  return 0 <= s.row0 && s.row0 <= s.row1 && s.row1 <= num_rows;
}

// The raw gate inputs of row t, one per lane so that the four loads are in flight
// together: lane 0 gate0[t], 1 gate1[t], and with fused gating 2 A_log, 3 dt_bias.
__device__ __forceinline__ uint32_t gate_raw(const GdnVerifyParams& p, int64_t t, int h, int lane) {
  const void* ptr = nullptr;
  int64_t i = h;
  int dt = 0;
  if (lane == 0) {
    ptr = p.gate0; i = t * p.gate_stride_t[0] + h; dt = p.gate_dtype[0];
  } else if (lane == 1) {
    ptr = p.gate1; i = t * p.gate_stride_t[1] + h; dt = p.gate_dtype[1];
  } else if (lane == 2 && p.fused_gating) {
    ptr = p.A_log; dt = p.gate_dtype[2];
  } else if (lane == 3 && p.fused_gating) {
    ptr = p.dt_bias; dt = p.gate_dtype[3];
  }
  return ptr != nullptr ? load_raw(ptr, i, dt) : 0u;
}

// gate_raw's values (all lanes of the warp) -> (g, beta), the same in every lane;
// fused: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b).
__device__ __forceinline__ void gates_of_row(const GdnVerifyParams& p, uint32_t raw, float& g,
                                             float& beta) {
  const float x0 = raw_to_float(__shfl_sync(0xffffffffu, raw, 0), p.gate_dtype[0]);
  const float x1 = raw_to_float(__shfl_sync(0xffffffffu, raw, 1), p.gate_dtype[1]);
  const uint32_t r2 = __shfl_sync(0xffffffffu, raw, 2), r3 = __shfl_sync(0xffffffffu, raw, 3);
  if (p.fused_gating) {
    const float x = x0 + raw_to_float(r3, p.gate_dtype[3]);
    const float softplus = fmaxf(x, 0.f) + log1pf(__expf(-fabsf(x)));
    g = -__expf(raw_to_float(r2, p.gate_dtype[2])) * softplus;
    beta = 1.f / (1.f + __expf(-x1));
  } else {
    g = x0;
    beta = x1;
  }
}

// ------------------------------------------------------------------------ gdn_verify
//
// Persistent: the grid is at most the CTAs that fit on the GPU at once, and CTA x takes
// items x, x + gridDim.x, ... While it works on one item, the next item's state is already
// in flight (fetched as raw words right after the current one is unpacked, its sequence
// indices one item earlier still), so memory and math overlap instead of adding up.

template <typename TS, int DK, bool VK>
__device__ __forceinline__ void gdn_verify_impl(const GdnVerifyParams& p) {
  using Tile = StateTile<TS, DK, VK>;
  constexpr int RI = Tile::RI, CJ = Tile::CJ;
  constexpr int PER_LANE = DK / 32;
  constexpr int NV = 2 * CJ;   // column sums per row: S^T k (0..CJ-1), S^T q (CJ..2CJ-1)
  __shared__ __align__(16) RowStage<DK> st;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int slice_cols = nwarps * Tile::WARP_COLS;
  const int group = p.num_v_heads / p.num_k_heads;
  const int Dv = p.head_v_dim;
  const int items_per_seq = p.num_v_heads * p.num_slices;
  const int num_items = p.batch * items_per_seq;
  const int64_t jv = int64_t(p.num_k_heads) * DK;            // journal column offsets
  const int64_t jg = jv + int64_t(p.num_v_heads) * Dv;
  const int64_t jb = jg + p.num_v_heads;

  Tile tile(lane);
  // after reduce_t<NV>: this lane's value, its column within the thread's CJ, and its role
  const int my_val = Tile::template value_index<NV>(lane);
  const int my_c = my_val & (CJ - 1);
  const bool out_lane = my_val >= CJ && Tile::template first_copy<NV>(lane);
  const int warp_col = warp * Tile::WARP_COLS + tile.lc * CJ;   // thread's first column in the slice

  auto col_of = [&](int item) { return (item % p.num_slices) * slice_cols + warp_col; };
  auto needs_state = [&](const SeqIdx& s) {
    return rows_ok(s, p.num_rows) && s.row0 < s.row1 && s.slot >= 0 && s.slot < p.num_slots;
  };
  auto head_of = [&](int item, int slot) {   // the item's [Dk][Dv] or [Dv][Dk] block
    const ItemPos q = item_pos(item, p.num_slices, p.num_v_heads);
    return static_cast<const TS*>(p.state) + slot * p.state_stride_slot + int64_t(q.h) * DK * Dv;
  };

  int item = blockIdx.x;
  if (item >= num_items) return;
  uint32_t w[Tile::NW];
  SeqIdx cur = load_seq(p.cu_q, p.slot_ids, nullptr, item / items_per_seq);
  bool cur_need = needs_state(cur);
  if (cur_need) tile.template fetch<true>(head_of(item, cur.slot), col_of(item), Dv, w);
  SeqIdx nxt = {0, 0, -1, 0};
  if (item + int(gridDim.x) < num_items)
    nxt = load_seq(p.cu_q, p.slot_ids, nullptr, (item + gridDim.x) / items_per_seq);

  for (; item < num_items; item += gridDim.x) {
    const ItemPos pos = item_pos(item, p.num_slices, p.num_v_heads);
    const int col_base = pos.z * slice_cols;
    const int hk = pos.h / group;
    const bool r_ok = rows_ok(cur, p.num_rows);
    const bool slot_ok = cur.slot >= 0 && cur.slot < p.num_slots;
    const int row0 = cur.row0, qlen = cur.row1 - cur.row0;
    if (p.status != nullptr && pos.z == 0 && pos.h == 0 && threadIdx.x == 0)
      p.status[pos.b] = (r_ok ? 0 : SPECDEC_GDN_BAD_ROWS) | (cur.slot >= p.num_slots ? SPECDEC_GDN_BAD_SLOT : 0);

    // this item's state out of the prefetch words, then the next item's state into them
    if (cur_need) tile.unpack(w);
    const int item1 = item + gridDim.x, item2 = item1 + gridDim.x;
    const bool nxt_need = item1 < num_items && needs_state(nxt);
    if (nxt_need) tile.template fetch<true>(head_of(item1, nxt.slot), col_of(item1), Dv, w);
    SeqIdx nxt2 = {0, 0, -1, 0};
    if (item2 < num_items) nxt2 = load_seq(p.cu_q, p.slot_ids, nullptr, item2 / items_per_seq);

    const bool write_k = pos.z == 0 && pos.h % group == 0;   // one CTA journals each k row
    for (int c0 = 0; r_ok && c0 < qlen; c0 += kRowChunk) {
      const int nrows = min(kRowChunk, qlen - c0);
      __syncthreads();   // the previous chunk's (or item's) rows have been consumed
      // Every global load of the chunk is issued before the first value is used (raw bits,
      // converted afterwards), so staging costs about one memory latency, not one per element.
      constexpr int VPT = kRowChunk * Tile::WARP_COLS / 32;   // v entries per thread, at most
      uint32_t vraw[VPT];
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const int e = threadIdx.x + j * blockDim.x;
        vraw[j] = 0u;
        if (e < nrows * slice_cols) {
          const int rr = e / slice_cols, jj = e - rr * slice_cols;
          vraw[j] = load_raw(p.v, (row0 + c0 + rr) * p.v_stride_t + pos.h * p.v_stride_h + col_base + jj,
                             p.qkv_dtype);
        }
      }
      for (int rr = warp; rr < nrows; rr += nwarps) {
        const int64_t t = row0 + c0 + rr;
        uint32_t qraw[PER_LANE], kraw[PER_LANE];
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) {
          const int i = lane + 32 * e;
          qraw[e] = load_raw(p.q, t * p.q_stride_t + hk * p.q_stride_h + i, p.qkv_dtype);
          kraw[e] = load_raw(p.k, t * p.k_stride_t + hk * p.k_stride_h + i, p.qkv_dtype);
        }
        const uint32_t graw = gate_raw(p, t, pos.h, lane);
        float qx[PER_LANE], kx[PER_LANE];
        float ssq = 0.f, ssk = 0.f;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) {
          qx[e] = raw_to_float(qraw[e], p.qkv_dtype);
          kx[e] = raw_to_float(kraw[e], p.qkv_dtype);
          ssq = fmaf(qx[e], qx[e], ssq);
          ssk = fmaf(kx[e], kx[e], ssk);
        }
        float rq = p.scale, rk = 1.f;
        if (p.qk_l2norm) {
          rq *= rsqrtf(warp_sum(ssq) + 1e-6f);
          rk = rsqrtf(warp_sum(ssk) + 1e-6f);
        }
        float kq = 0.f;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) {
          const int i = lane + 32 * e;
          const float kn = kx[e] * rk, qn = qx[e] * rq;
          st.k[rr][Tile::stage_idx(i)] = kn;
          st.q[rr][Tile::stage_idx(i)] = qn;
          kq = fmaf(kn, qn, kq);
          if (write_k) p.journal[t * p.journal_stride_t + hk * DK + i] = kn;
        }
        kq = warp_sum(kq);
        float g, beta;
        gates_of_row(p, graw, g, beta);
        if (lane == 0) {
          st.gate[rr] = make_float4(__expf(g), beta, kq, 0.f);
          if (pos.z == 0) {
            p.journal[t * p.journal_stride_t + jg + pos.h] = g;
            p.journal[t * p.journal_stride_t + jb + pos.h] = beta;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const int e = threadIdx.x + j * blockDim.x;
        if (e < nrows * slice_cols) {
          const int rr = e / slice_cols, jj = e - rr * slice_cols;
          const float x = raw_to_float(vraw[j], p.qkv_dtype);
          st.v[rr][jj] = x;
          p.journal[(row0 + c0 + rr) * p.journal_stride_t + jv + int64_t(pos.h) * Dv + col_base + jj] = x;
        }
      }
      __syncthreads();

      const int64_t out_col = pos.h * p.out_stride_h + col_base + warp_col + my_c;
      for (int rr = 0; rr < nrows; ++rr) {
        const int64_t t = row0 + c0 + rr;
        if (slot_ok) {
          float kr[RI], qr[RI], part[NV];
          tile.gather(st.k[rr], kr);
          tile.gather(st.q[rr], qr);
          tile.partial_dot(kr, part);
          tile.partial_dot(qr, part + CJ);
          const float sum = Tile::template reduce_t<NV>(part, lane);   // (S^T k or S^T q)[my_c]
          const float4 gt = st.gate[rr];                               // decay, beta, kq
          // lanes holding S^T k: delta of their column; the S^T q lanes get it from their
          // partner (bit M0) and form o = decay S^T q + delta (k.q) (S_new^T q, pre-token S)
          const float d = delta_of(gt.y, st.v[rr][warp_col + my_c], gt.x, sum);
          const float dq = __shfl_xor_sync(0xffffffffu, d, Tile::M0);
          if (out_lane) store_dt(p.out, t * p.out_stride_t + out_col, p.out_dtype, fmaf(gt.x, sum, dq * gt.z));
          if (c0 + rr + 1 < qlen) {
            float delta[CJ];
#pragma unroll
            for (int c = 0; c < CJ; ++c)
              delta[c] = __shfl_sync(0xffffffffu, d, Tile::template lane_of_value<NV>(lane, c));
            tile.template update<TS>(gt.x, kr, delta);
          }
        } else if (out_lane) {
          store_dt(p.out, t * p.out_stride_t + out_col, p.out_dtype, 0.f);
        }
      }
    }
    cur = nxt;
    cur_need = nxt_need;
    nxt = nxt2;
  }
}

// ------------------------------------------------------------------------ gdn_commit
//
// Persistent like gdn_verify: the next item's state is read while this one is replayed
// and written back.

template <typename TS, int DK, bool VK>
__device__ __forceinline__ void gdn_commit_impl(const GdnCommitParams& p) {
  using Tile = StateTile<TS, DK, VK>;
  constexpr int RI = Tile::RI, CJ = Tile::CJ;
  constexpr int PER_LANE = DK / 32;
  __shared__ __align__(16) float sk_rows[kRowChunk][DK];
  __shared__ float sv_rows[kRowChunk][kMaxSliceCols];
  __shared__ float2 sgate[kRowChunk];   // exp(g), beta

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int slice_cols = nwarps * Tile::WARP_COLS;
  const int group = p.num_v_heads / p.num_k_heads;
  const int Dv = p.head_v_dim;
  const int items_per_seq = p.num_v_heads * p.num_slices;
  const int num_items = p.batch * items_per_seq;
  const int64_t jv = int64_t(p.num_k_heads) * DK;
  const int64_t jg = jv + int64_t(p.num_v_heads) * Dv;
  const int64_t jb = jg + p.num_v_heads;

  Tile tile(lane);
  const int my_c = Tile::template value_index<CJ>(lane);   // after reduce_t<CJ>: S^T k [my_c]
  const int warp_col = warp * Tile::WARP_COLS + tile.lc * CJ;

  auto col_of = [&](int item) { return (item % p.num_slices) * slice_cols + warp_col; };
  auto needs_state = [&](const SeqIdx& s) {
    return rows_ok(s, p.num_rows) && 0 < s.n && s.n <= s.row1 - s.row0 && s.slot >= 0 &&
           s.slot < p.num_slots;
  };
  auto head_of = [&](int item, int slot) {   // the item's [Dk][Dv] or [Dv][Dk] block
    const ItemPos q = item_pos(item, p.num_slices, p.num_v_heads);
    return static_cast<TS*>(p.state) + slot * p.state_stride_slot + int64_t(q.h) * DK * Dv;
  };

  int item = blockIdx.x;
  if (item >= num_items) return;
  uint32_t w[Tile::NW];
  SeqIdx cur = load_seq(p.cu_q, p.slot_ids, p.accept_len, item / items_per_seq);
  bool cur_need = needs_state(cur);
  if (cur_need) tile.template fetch<false>(head_of(item, cur.slot), col_of(item), Dv, w);
  SeqIdx nxt = {0, 0, -1, 0};
  if (item + int(gridDim.x) < num_items)
    nxt = load_seq(p.cu_q, p.slot_ids, p.accept_len, (item + gridDim.x) / items_per_seq);

  for (; item < num_items; item += gridDim.x) {
    const ItemPos pos = item_pos(item, p.num_slices, p.num_v_heads);
    const int col_base = pos.z * slice_cols;
    const int hk = pos.h / group;
    const bool r_ok = rows_ok(cur, p.num_rows);
    const bool acc_ok = 0 <= cur.n && cur.n <= cur.row1 - cur.row0;
    if (p.status != nullptr && pos.z == 0 && pos.h == 0 && threadIdx.x == 0)
      p.status[pos.b] = (r_ok ? 0 : SPECDEC_GDN_BAD_ROWS) |
                        (r_ok && !acc_ok ? SPECDEC_GDN_BAD_ACCEPT : 0) |
                        (cur.slot >= p.num_slots ? SPECDEC_GDN_BAD_SLOT : 0);
    const bool need = cur_need;   // else: state untouched, not even read
    const int row0 = cur.row0, n = cur.n;
    TS* head = need ? head_of(item, cur.slot) : nullptr;

    if (need) tile.unpack(w);
    const int item1 = item + gridDim.x, item2 = item1 + gridDim.x;
    const bool nxt_need = item1 < num_items && needs_state(nxt);
    if (nxt_need) tile.template fetch<false>(head_of(item1, nxt.slot), col_of(item1), Dv, w);
    SeqIdx nxt2 = {0, 0, -1, 0};
    if (item2 < num_items) nxt2 = load_seq(p.cu_q, p.slot_ids, p.accept_len, item2 / items_per_seq);

    for (int c0 = 0; need && c0 < n; c0 += kRowChunk) {
      const int nrows = min(kRowChunk, n - c0);
      __syncthreads();
      // All journal loads of the chunk in flight before the first is used (as in verify).
      constexpr int VPT = kRowChunk * Tile::WARP_COLS / 32;   // v entries per thread, at most
      float vrow[VPT];
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const int e = threadIdx.x + j * blockDim.x;
        vrow[j] = 0.f;
        if (e < nrows * slice_cols) {
          const int rr = e / slice_cols, jj = e - rr * slice_cols;
          vrow[j] = __ldg(p.journal + (row0 + c0 + rr) * p.journal_stride_t + jv + int64_t(pos.h) * Dv +
                          col_base + jj);
        }
      }
      for (int rr = warp; rr < nrows; rr += nwarps) {
        const float* jrow = p.journal + (row0 + c0 + rr) * p.journal_stride_t;
        float kx[PER_LANE];
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) kx[e] = __ldg(jrow + hk * DK + lane + 32 * e);
        const float gb = __ldg(jrow + ((lane & 1) ? jb : jg) + pos.h);   // lane 0: g, lane 1: beta
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) sk_rows[rr][Tile::stage_idx(lane + 32 * e)] = kx[e];
        const float beta = __shfl_sync(0xffffffffu, gb, 1);
        if (lane == 0) sgate[rr] = make_float2(__expf(gb), beta);
      }
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const int e = threadIdx.x + j * blockDim.x;
        if (e < nrows * slice_cols) {
          const int rr = e / slice_cols, jj = e - rr * slice_cols;
          sv_rows[rr][jj] = vrow[j];
        }
      }
      __syncthreads();
      for (int rr = 0; rr < nrows; ++rr) {
        float kr[RI], part[CJ], delta[CJ];
        tile.gather(sk_rows[rr], kr);
        tile.partial_dot(kr, part);
        const float sum = Tile::template reduce_t<CJ>(part, lane);   // (S^T k)[my_c]
        const float2 gt = sgate[rr];
        const float d = delta_of(gt.y, sv_rows[rr][warp_col + my_c], gt.x, sum);
#pragma unroll
        for (int c = 0; c < CJ; ++c)
          delta[c] = __shfl_sync(0xffffffffu, d, Tile::template lane_of_value<CJ>(lane, c));
        tile.template update<TS>(gt.x, kr, delta);
      }
    }
    if (need) tile.store(head, col_base + warp_col, Dv);
    cur = nxt;
    cur_need = nxt_need;
    nxt = nxt2;
  }
}

}  // namespace

// Register caps (no spill at any of them: a spilled prefetch word would make the warp wait
// for the prefetch right where it is issued). f32 state: 128 on sm_90 (4 CTAs of 4 warps per
// SM); the sm_75/80 code needs a few more (3 CTAs). 16-bit state: 64 state floats + 32
// prefetch words do not fit 168, so no cap (2 CTAs of 4 warps per SM).
#if __CUDA_ARCH__ >= 900
template <typename TS> constexpr int kMaxRegs = sizeof(TS) == 4 ? 128 : 255;
#else
template <typename TS> constexpr int kMaxRegs = sizeof(TS) == 4 ? 136 : 255;
#endif

// Kernel names: gdn_{verify,commit}_{kv,vk}_d{64,128}_{f32,f16,bf16} (state layout, Dk,
// state dtype); input dtypes are run-time codes (they only touch the staging code).
#define SPECDEC_GDN_KERNELS(TS, TNAME, DK, VK, LNAME)                                          \
  extern "C" __global__ void __maxnreg__(kMaxRegs<TS>)            \
      gdn_verify_##LNAME##_d##DK##_##TNAME(const GdnVerifyParams p) {                          \
    gdn_verify_impl<TS, DK, VK>(p);                                                            \
  }                                                                                            \
  extern "C" __global__ void __maxnreg__(kMaxRegs<TS>)            \
      gdn_commit_##LNAME##_d##DK##_##TNAME(const GdnCommitParams p) {                          \
    gdn_commit_impl<TS, DK, VK>(p);                                                            \
  }

#define SPECDEC_GDN_LAYOUTS(TS, TNAME, DK)        \
  SPECDEC_GDN_KERNELS(TS, TNAME, DK, false, kv)   \
  SPECDEC_GDN_KERNELS(TS, TNAME, DK, true, vk)

#define SPECDEC_GDN_DIMS(TS, TNAME)   \
  SPECDEC_GDN_LAYOUTS(TS, TNAME, 64)  \
  SPECDEC_GDN_LAYOUTS(TS, TNAME, 128)

SPECDEC_GDN_DIMS(float, f32)
SPECDEC_GDN_DIMS(__half, f16)
SPECDEC_GDN_DIMS(bf16_t, bf16)
