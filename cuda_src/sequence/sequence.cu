// sequence family: the bookkeeping at the end of a speculative round.
//
// All three ops touch O(B * (k+1)) int32s, so they are launch-latency bound: one small
// CTA-per-row (or one CTA for the prefix sum) is enough; what matters is never faulting
// on bad data (n out of range, negative tokens) and matching the reference bit for bit.
#include "sequence/sequence_params.h"

namespace {

constexpr uint8_t kStopId = 1, kStopSeq = 2, kMaxLen = 3, kCapacity = 4, kBadRow = 5;

// Token j of history ++ emitted[0..i]: history has `have` tokens.
__device__ __forceinline__ int32_t tail_token(const int32_t* hist, int have, const int32_t* em,
                                              int pos) {
  return pos < have ? hist[pos] : em[pos - have];
}

// seq_stop: one thread per sequence (B threads in total; rows are short).
// emitted [B, W], out_tokens [B, C], stop_ids [B, S], stop_seqs [B, NS, M].
__device__ void seq_stop_row(const SeqStopParams& p, int b) {
  uint8_t fin = p.finished[b];
  if (fin != 0) { p.accept_len[b] = 0; return; }
  const int n = p.num_accepted[b];
  const int have = p.out_lens[b];
  const int limit = p.max_new_tokens[b] - have;
  if (limit <= 0) { p.accept_len[b] = 0; p.finished[b] = kMaxLen; return; }
  if (n < 0 || n >= p.width) { p.accept_len[b] = 0; p.finished[b] = kBadRow; return; }
  const int32_t* em = p.emitted + static_cast<int64_t>(b) * p.width;
  const int32_t* hist = p.out_tokens + static_cast<int64_t>(b) * p.capacity;
  const int hist_len = have < p.capacity ? have : p.capacity;
  int keep = n + 1;
  uint8_t reason = 0;
  for (int i = 0; i <= n; ++i) {
    const int32_t t = em[i];
    if (t < 0) { keep = i; reason = kBadRow; break; }
    bool hit = false;
    for (int s = 0; s < p.num_stop_ids && !hit; ++s)
      hit = p.stop_ids[static_cast<int64_t>(b) * p.num_stop_ids + s] == t;
    if (hit) { keep = i + 1; reason = kStopId; break; }
    const int total = hist_len + i + 1;
    for (int s = 0; s < p.num_stop_seqs && !hit; ++s) {
      const int32_t* seq = p.stop_seqs + (static_cast<int64_t>(b) * p.num_stop_seqs + s) * p.stop_seq_len;
      int first = 0;
      while (first < p.stop_seq_len && seq[first] < 0) ++first;
      const int m = p.stop_seq_len - first;
      if (m == 0 || m > total) continue;
      bool eq = true;
      for (int j = 0; j < m && eq; ++j)
        eq = tail_token(hist, hist_len, em, total - m + j) == seq[first + j];
      hit = eq;
    }
    if (hit) { keep = i + 1; reason = kStopSeq; break; }
    if (i + 1 >= limit) { keep = i + 1; reason = kMaxLen; break; }
  }
  p.accept_len[b] = keep;
  if (reason) p.finished[b] = reason;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(128) seq_stop(const SeqStopParams p) {
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < p.batch; b += gridDim.x * blockDim.x)
    seq_stop_row(p, b);
}

// seq_advance: one CTA per sequence; threads copy the kept tokens into the output buffer.
extern "C" __global__ void __launch_bounds__(128) seq_advance(const SeqAdvanceParams p) {
  for (int b = blockIdx.x; b < p.batch; b += gridDim.x) {
    int a = p.accept_len[b];
    if (a <= 0) continue;
    a = a < p.width ? a : p.width;
    const int have = p.out_lens[b];
    int fit = p.capacity - have;
    fit = fit < 0 ? 0 : (fit < a ? fit : a);
    const int32_t* em = p.emitted + static_cast<int64_t>(b) * p.width;
    int32_t* out = p.out_tokens + static_cast<int64_t>(b) * p.capacity + have;
    for (int i = threadIdx.x; i < fit; i += blockDim.x) out[i] = em[i];
    __syncthreads();   // every thread has read out_lens before thread 0 updates it
    if (threadIdx.x == 0) {
      p.seq_lens[b] += a;
      p.out_lens[b] = have + fit;
      if (fit < a) p.finished[b] = kCapacity;
      p.last_token[b] = em[a - 1];
    }
  }
}

// seq_build_block: ONE CTA of exactly 256 threads (the scan buffer size); a prefix sum of q_b = 1 + clamp(num_draft, 0, K)
// (serial over warps of 32: B is at most a few thousand), then every thread fills rows.
extern "C" __global__ void __launch_bounds__(256) seq_build_block(const SeqBuildBlockParams p) {
  __shared__ int32_t carry;
  if (threadIdx.x == 0) { carry = 0; p.cu_q[0] = 0; }
  __syncthreads();
  for (int base = 0; base < p.batch; base += blockDim.x) {
    const int b = base + threadIdx.x;
    int q = 0;
    if (b < p.batch) {
      int nd = p.num_draft[b];
      nd = nd < 0 ? 0 : (nd > p.max_draft ? p.max_draft : nd);
      q = 1 + nd;
    }
    // inclusive scan within the CTA through shared memory (Hillis-Steele)
    __shared__ int32_t scan[256];
    scan[threadIdx.x] = q;
    __syncthreads();
    for (int off = 1; off < blockDim.x; off <<= 1) {
      const int v = threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
      __syncthreads();
      scan[threadIdx.x] += v;
      __syncthreads();
    }
    const int start = carry + scan[threadIdx.x] - q;
    if (b < p.batch) {
      p.cu_q[b + 1] = start + q;
      const int L = p.seq_lens[b];
      p.block_tokens[start] = p.last_token[b];
      p.positions[start] = L;
      for (int i = 1; i < q; ++i) {
        const int32_t d = p.draft_tokens[static_cast<int64_t>(b) * p.max_draft + i - 1];
        p.block_tokens[start + i] = d;
        p.positions[start + i] = L + i;
        if (p.draft_ids) p.draft_ids[start - b + i - 1] = d;
      }
    }
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) carry += scan[threadIdx.x];
    __syncthreads();
  }
}
