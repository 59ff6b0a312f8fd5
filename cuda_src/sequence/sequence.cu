// sequence family: the bookkeeping at the end of a speculative round (and the start of
// the next one). Semantics: specdec_lib/reference/sequence.py, bit for bit.
//
// All three ops touch O(B * (k+1)) int32s, so they are launch-latency bound: one thread
// per sequence (seq_stop, seq_advance) or a single CTA (seq_build_block, whose prefix
// sum over the batch needs one). What matters is that every value read from memory is
// treated as untrusted: an n, a length or an id out of range flags the row
// (FINISH_BAD_ROW) or is clamped, and never becomes an out-of-bounds address.
#include "sequence/sequence_params.h"
#include "common/pdl.cuh"

namespace {

constexpr int kRowThreads = 128;    // seq_stop / seq_advance: one thread per sequence
constexpr int kScanThreads = 256;   // seq_build_block: the one CTA (the launcher uses exactly this)

// Does history ++ em[0..i] end with the stop sequence seq[first..M-1]?
// history: hist[0..hist_len-1]; all em[0..i] are valid (>= 0) tokens.
__device__ __forceinline__ bool ends_with(const int32_t* hist, int hist_len, const int32_t* em,
                                          int i, const int32_t* seq, int first, int M) {
  const int m = M - first;
  const int total = hist_len + i + 1;
  if (m == 0 || m > total) return false;
  for (int j = 0; j < m; ++j) {
    const int pos = total - m + j;
    const int32_t t = pos < hist_len ? __ldg(hist + pos) : __ldg(em + pos - hist_len);
    if (t != __ldg(seq + first + j)) return false;
  }
  return true;
}

__device__ void seq_stop_row(const SeqStopParams& p, int b) {
  if (p.finished[b] != 0) { p.accept_len[b] = 0; return; }
  const int n = __ldg(p.num_accepted + b);
  const int have = __ldg(p.out_lens + b);
  if (have < 0) { p.accept_len[b] = 0; p.finished[b] = SPECDEC_FINISH_BAD_ROW; return; }
  const int64_t limit = static_cast<int64_t>(__ldg(p.max_new_tokens + b)) - have;
  if (limit <= 0) { p.accept_len[b] = 0; p.finished[b] = SPECDEC_FINISH_MAX_LEN; return; }
  if (n < 0 || n >= p.width) { p.accept_len[b] = 0; p.finished[b] = SPECDEC_FINISH_BAD_ROW; return; }
  const int32_t* em = p.emitted + static_cast<int64_t>(b) * p.width;
  const int32_t* hist = p.out_tokens + static_cast<int64_t>(b) * p.capacity;
  const int hist_len = have < p.capacity ? have : p.capacity;
  const int32_t* ids = p.stop_ids + static_cast<int64_t>(b) * p.num_stop_ids;
  const int32_t* seqs = p.stop_seqs + static_cast<int64_t>(b) * p.num_stop_seqs * p.stop_seq_len;
  int keep = n + 1;
  uint8_t reason = 0;
  for (int i = 0; i <= n && reason == 0; ++i) {
    const int32_t t = __ldg(em + i);
    if (t < 0) { keep = i; reason = SPECDEC_FINISH_BAD_ROW; break; }
    keep = i + 1;
    for (int s = 0; s < p.num_stop_ids && reason == 0; ++s)
      if (__ldg(ids + s) == t) reason = SPECDEC_FINISH_STOP_ID;
    for (int s = 0; s < p.num_stop_seqs && reason == 0; ++s) {
      const int32_t* seq = seqs + static_cast<int64_t>(s) * p.stop_seq_len;
      int first = 0;   // rows are left-padded with -1: the sequence starts at the first id >= 0
      while (first < p.stop_seq_len && __ldg(seq + first) < 0) ++first;
      if (ends_with(hist, hist_len, em, i, seq, first, p.stop_seq_len))
        reason = SPECDEC_FINISH_STOP_SEQ;
    }
    if (reason == 0 && i + 1 >= limit) reason = SPECDEC_FINISH_MAX_LEN;
  }
  p.accept_len[b] = keep;
  if (reason) p.finished[b] = reason;
}

}  // namespace

// seq_stop: emitted [B, W], num_accepted [B], out_tokens [B, C], out_lens [B],
// stop_ids [B, S], stop_seqs [B, NS, M], max_new_tokens [B] -> accept_len [B], finished [B].
// One thread per sequence: a row is at most 16 tokens, each checked against S ids and
// NS sequences of M tokens, all from L1/L2.
extern "C" __global__ void __launch_bounds__(kRowThreads) seq_stop(const SeqStopParams p) {
  specdec::pdl_begin();
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < p.batch; b += gridDim.x * blockDim.x)
    seq_stop_row(p, b);
}

// seq_advance: emitted [B, W], accept_len [B] -> seq_lens, out_tokens [B, C], out_lens,
// last_token, finished (all [B] unless noted), in place. One thread per sequence copies its
// <= W kept tokens; accept_len is clamped to W and the append to the buffer's capacity.
extern "C" __global__ void __launch_bounds__(kRowThreads) seq_advance(const SeqAdvanceParams p) {
  specdec::pdl_begin();
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < p.batch; b += gridDim.x * blockDim.x) {
    int a = __ldg(p.accept_len + b);
    a = a < p.width ? a : p.width;
    if (a <= 0) continue;
    const int32_t* em = p.emitted + static_cast<int64_t>(b) * p.width;
    p.seq_lens[b] += a;
    p.last_token[b] = __ldg(em + a - 1);
    const int have = p.out_lens[b];
    if (have < 0) { p.finished[b] = SPECDEC_FINISH_BAD_ROW; continue; }
    int fit = p.capacity - have;            // capacity - have cannot overflow: both >= 0
    fit = fit < 0 ? 0 : (fit < a ? fit : a);
    int32_t* out = p.out_tokens + static_cast<int64_t>(b) * p.capacity + have;
    for (int i = 0; i < fit; ++i) out[i] = __ldg(em + i);
    p.out_lens[b] = have + fit;
    if (fit < a) p.finished[b] = SPECDEC_FINISH_CAPACITY;
  }
}

// seq_build_block: last_token [B], draft_tokens [B, K], num_draft [B], seq_lens [B] ->
// cu_q [B+1], block_tokens / positions [T], draft_ids [T-B], T = sum_b (1 + clamp(k_b, 0, K)).
// ONE CTA of exactly kScanThreads threads: the row offsets are a prefix sum over the whole
// batch, done chunk by chunk (a warp-shuffle scan plus the warp totals in shared memory);
// B is at most a few thousand, so one CTA costs less than a second launch would.
extern "C" __global__ void __launch_bounds__(kScanThreads) seq_build_block(const SeqBuildBlockParams p) {
  specdec::pdl_begin();
  __shared__ int32_t warp_total[kScanThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) p.cu_q[0] = 0;
  int carry = 0;   // rows of all earlier chunks (the same value in every thread)
  for (int base = 0; base < p.batch; base += kScanThreads) {
    const int b = base + threadIdx.x;
    int q = 0;
    if (b < p.batch) {
      int nd = __ldg(p.num_draft + b);
      nd = nd < 0 ? 0 : (nd > p.max_draft ? p.max_draft : nd);
      q = 1 + nd;
    }
    int incl = q;   // inclusive scan within the warp
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    int before = 0, chunk = 0;
#pragma unroll
    for (int w = 0; w < kScanThreads / 32; ++w) {
      const int s = warp_total[w];
      before += w < warp ? s : 0;
      chunk += s;
    }
    if (b < p.batch) {
      const int start = carry + before + incl - q;
      const int L = __ldg(p.seq_lens + b);
      const int32_t* drafts = p.draft_tokens + static_cast<int64_t>(b) * p.max_draft;
      p.cu_q[b + 1] = start + q;
      p.block_tokens[start] = __ldg(p.last_token + b);
      p.positions[start] = L;
      for (int i = 1; i < q; ++i) {
        const int32_t d = __ldg(drafts + i - 1);
        p.block_tokens[start + i] = d;
        p.positions[start + i] = L + i;
        if (p.draft_ids != nullptr) p.draft_ids[start - b + i - 1] = d;
      }
    }
    carry += chunk;
    __syncthreads();   // warp_total is rewritten by the next chunk
  }
}
