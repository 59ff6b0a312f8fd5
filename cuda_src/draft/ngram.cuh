// ngram_propose: prompt-lookup (n-gram) drafting, weight-free.
// Semantics (the spec, a plain loop): specdec_lib/reference/draft.py::ngram_propose.
//
// prompt [B, P], output [B, O] int32 (rows strided), lengths [B] -> draft_tokens [B, K],
// num_draft [B]. The context of sequence b is c = prompt[b, :lp] ++ output[b, :lo], N = lp + lo.
//
// One pass instead of one search per n: for every candidate end e (1 <= e <= N - 1) let
// s(e) = the length of the common suffix of c[:e] and c[:N], capped at n_hi = min(max_n, N - 1).
// n matches ending at e exactly when s(e) >= n, so the longest matching n is max_e s(e) and
// its latest match is the largest e reaching it: the maximum of the key (s(e) << 32 | e).
// A max-reduction is order-free, so the result is deterministic by construction.
//
// One CTA per sequence. Candidates are scanned from the END of the context backwards in
// rounds of kThreads * kGroups groups of 4 tokens (one int4 load each where the row is
// 16-byte aligned; scalar loads at a segment's ragged end); a candidate whose last token
// equals c[N-1] is then extended backwards with scalar loads (L1 hits). After a round in
// which some thread reached s = n_hi (the best possible length) nothing earlier can win,
// so the CTA stops: __syncthreads_or keeps the exit uniform. Lengths read from memory are
// clamped into 0..P / 0..O, so no load is ever out of bounds.
#pragma once
#include <stdint.h>

#include "common/warp.cuh"
#include "common/pdl.cuh"
#include "draft/draft_params.h"

namespace specdec {
namespace ngram {

constexpr int kThreads = 256;
constexpr int kGroups = 4;        // 4-token groups per thread per round, all loaded first
constexpr int kMaxN = 32;         // ops.draft NGRAM_MAX_N
constexpr int kWarps = kThreads / 32;

// c[j] over the two segments
struct Context {
  const int32_t* prompt;
  const int32_t* output;
  int lp;
  __device__ __forceinline__ int32_t operator[](int j) const {
    return j < lp ? __ldg(prompt + j) : __ldg(output + (j - lp));
  }
};

// One segment's candidate positions: base[0..count) (count <= len, the valid length).
struct Segment {
  const int32_t* base;
  int len;
  int count;
  int offset;                     // context index of base[0]
  bool vec;
};

__device__ __forceinline__ int4 load_group(const Segment& sg, int g) {
  const int i = 4 * g;
  if (sg.vec && i + 4 <= sg.len) return __ldg(reinterpret_cast<const int4*>(sg.base + i));
  int4 t;
  t.x = i < sg.count ? __ldg(sg.base + i) : 0;
  t.y = i + 1 < sg.count ? __ldg(sg.base + i + 1) : 0;
  t.z = i + 2 < sg.count ? __ldg(sg.base + i + 2) : 0;
  t.w = i + 3 < sg.count ? __ldg(sg.base + i + 3) : 0;
  return t;
}

// key of candidate j (its last token tok = c[j]): s << 32 | (j + 1), 0 when s = 0
__device__ __forceinline__ unsigned long long candidate(const Context& c, int j, int32_t tok,
                                                        const int32_t* tail, int n_hi) {
  if (tok != tail[0]) return 0ull;
  const int cap = min(n_hi, j + 1);
  int s = 1;
  while (s < cap && c[j - s] == tail[s]) ++s;
  return (static_cast<unsigned long long>(s) << 32) | static_cast<unsigned>(j + 1);
}

__device__ __forceinline__ unsigned long long group_best(const Context& c, const Segment& sg,
                                                         int g, int4 t, const int32_t* tail,
                                                         int n_hi) {
  const int i = 4 * g;
  const int j = sg.offset + i;
  unsigned long long best = 0ull, k;
  if (i < sg.count) { k = candidate(c, j, t.x, tail, n_hi); best = k > best ? k : best; }
  if (i + 1 < sg.count) { k = candidate(c, j + 1, t.y, tail, n_hi); best = k > best ? k : best; }
  if (i + 2 < sg.count) { k = candidate(c, j + 2, t.z, tail, n_hi); best = k > best ? k : best; }
  if (i + 3 < sg.count) { k = candidate(c, j + 3, t.w, tail, n_hi); best = k > best ? k : best; }
  return best;
}

__device__ __forceinline__ void propose(const NgramProposeParams& p) {
  __shared__ int32_t tail[kMaxN];               // tail[t] = c[N - 1 - t]
  __shared__ unsigned long long red[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const int lp = min(max(__ldg(p.prompt_lens + b), 0), p.prompt_cap);
    const int lo = min(max(__ldg(p.output_lens + b), 0), p.output_cap);
    const int N = lp + lo;
    const Context c{p.prompt + static_cast<int64_t>(b) * p.prompt_stride,
                    p.output + static_cast<int64_t>(b) * p.output_stride, lp};
    int32_t* dst = p.draft_tokens + static_cast<int64_t>(b) * p.draft_stride;
    const int n_hi = min(p.max_n, N - 1);
    __syncthreads();                            // tail / red: the previous sequence is done
    unsigned long long best = 0ull;
    if (n_hi >= p.min_n) {                      // uniform over the CTA
      if (tid < n_hi) tail[tid] = c[N - 1 - tid];
      __syncthreads();
      // candidates j in 0..N-2: output positions lp..N-2 first (latest), then the prompt's
      const Segment out{c.output, lo, lo > 0 ? lo - 1 : 0, lp, p.vec_output != 0};
      const Segment pro{c.prompt, lp, lo > 0 ? lp : lp - 1, 0, p.vec_prompt != 0};
      const int go = (out.count + 3) >> 2, gp = (pro.count + 3) >> 2;
      for (int v0 = 0; v0 < go + gp; v0 += kThreads * kGroups) {
        int4 t[kGroups];
#pragma unroll
        for (int k = 0; k < kGroups; ++k) {       // every load of the round in flight first
          const int v = v0 + k * kThreads + tid;
          if (v < go) t[k] = load_group(out, go - 1 - v);
          else if (v < go + gp) t[k] = load_group(pro, gp - 1 - (v - go));
          else t[k] = make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < kGroups; ++k) {
          const int v = v0 + k * kThreads + tid;
          unsigned long long g = 0ull;
          if (v < go) g = group_best(c, out, go - 1 - v, t[k], tail, n_hi);
          else if (v < go + gp) g = group_best(c, pro, gp - 1 - (v - go), t[k], tail, n_hi);
          best = g > best ? g : best;
        }
        if (__syncthreads_or(static_cast<int>(best >> 32) == n_hi)) break;
      }
    }
    best = warp_max_u64(best);
    if (lane == 0) red[warp] = best;
    __syncthreads();
    unsigned long long key = red[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) key = red[w] > key ? red[w] : key;
    const int s = static_cast<int>(key >> 32);
    const int e = static_cast<int>(key & 0xffffffffull);
    const int m = s >= p.min_n ? min(p.num_slots, N - e) : 0;
    for (int t = tid; t < p.num_slots; t += blockDim.x) dst[t] = t < m ? c[e + t] : -1;
    if (tid == 0) p.num_draft[b] = m;
  }
}

}  // namespace ngram
}  // namespace specdec

extern "C" __global__ void __launch_bounds__(specdec::ngram::kThreads)
ngram_propose(const NgramProposeParams p) {
  specdec::pdl_begin();
  specdec::ngram::propose(p);
}
