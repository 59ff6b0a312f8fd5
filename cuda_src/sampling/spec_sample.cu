// spec_sample: exact speculative (rejection) sampling straight from target logits.
//
// Contract and exact semantics: specdec_lib/reference/sampling.py (the spec). Shapes:
// logits [T, V] (f32/f16/bf16, rows of B ragged verify blocks given by cu_q [B+1]),
// draft_ids [T-B], optional draft_probs [T-B, Vd] (+ d2t [Vd]); outputs num_accepted [B],
// emitted [B, W], status [B], optional logprobs [B, W].
//
// Three kernels per call (tiles, one filter kernel: threshold for f32 / hist for 16-bit
// logits, finish), launched in this order on one stream:
//  1. spec_sample_tiles_<dt>     grid (T, ceil(num_tiles / tiles_per_cta)), 4 warps (it also
//     zeroes the threshold state of rows that filter): the vocab
//     is split across CTAs so batch 1 fills the GPU; one warp owns one 2048-token tile at a
//     time (16-byte loads, one shuffle tree per tile, no block barrier). Per (row, tile) it
//     writes max / sum-exp / raw argmax / NaN-inf flags: the logits are read once, in their
//     own dtype. The one-hot draft token of a row is left out of the tile sums, so the tile
//     sums are directly the weights of the rejection residual p - onehot(x).
//  2. spec_sample_threshold_<dt> grid (T, S), 256 threads, launched 4 times (filter_step
//     0..3): only rows whose request uses top-k / top-p; each filter takes two steps, both
//     split over the S CTAs of the row: a bucket histogram into a per-row global histogram
//     (64-bit integer atomics, zeroed by pass 1: order-free, so the same threshold as a
//     single CTA), the last CTA picks the bucket; then the bucket's keys into a per-row list,
//     the last CTA runs the exact radix select over it (count for top-k, fixed-point mass
//     for top-p). Then spec_sample_tiles_<dt> runs again with filtered_pass=1 to
//     recompute the tile sums of those rows over the kept set (min-p needs only the row
//     max: it is a per-token test).
//     filters=False on the host skips these launches (params.no_filters = 1); finish then
//     gives a request that filters status 5 instead of sampling it unfiltered.
//  2'. spec_sample_hist_<dt>     16-bit logits only, instead of 2.: grid (T, S), 512 threads,
//     one launch: a count per logit value below the row max gives top-k / top-p exactly
//     (sample_hist.cuh); the CTA that resolves a row's threshold then recounts that row's
//     tile sums over the kept set, as the filtered tile pass does for f32.
//  3. spec_sample_finish_<dt>    grid B, 512 threads: one CTA per sequence; its warps evaluate
//     all rows of the block at once (tile merge in a fixed order: deterministic; draft logit,
//     Philox uniform, accept decision), warp 0 scans the decisions (the accept chain), all
//     threads race the tiles (one noise per tile serves the residual and its fallback p),
//     then the CTA samples the token inside the chosen tile (2048 logits re-read).
//     With draft_probs the residual max(0, p - q) is not known per tile from pass 1, so this
//     CTA recomputes it over the rejected row (one row read); a known cost of that mode.
//
// sm_90 code, 16-bit logits, one-hot drafts, small calls (ops.sampling.sample_path): instead
// of 1-3, two launches -- spec_sample_rows_<dt> (one thread-block cluster per row keeps the
// row in shared memory through max, histogram, threshold, kept sums, accept and the race:
// sample_rows.cuh) and spec_sample_chain (one warp per sequence walks its rows' records).
//
// Numbers: s2 = logit * log2(e) / temperature so every exponential is one exp2. Greedy rows
// compare raw logits (bit-exact with the reference: NaN never wins, lowest id on ties).
// Nothing faults on NaN / inf / bad ids / bad cu_q: such rows get a status code.
#include "sampling/sample_common.cuh"
#include "common/pdl.cuh"
#include "sampling/sample_tiles.cuh"
#include "sampling/sample_threshold.cuh"
#include "sampling/sample_hist.cuh"
#include "sampling/sample_finish.cuh"
#include "sampling/sample_rows.cuh"
#include "sampling/sample_small.cuh"


#define SPEC_SAMPLE_KERNELS(NAME, T)                                                          \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_TILE_THREADS, SPEC_SAMPLE_TILE_CTAS_PER_SM)               \
  spec_sample_tiles_##NAME(const SpecSampleParams p) { tiles_kernel<T>(p); }                 \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_THRESHOLD_THREADS, SPEC_SAMPLE_THRESHOLD_CTAS_PER_SM)             \
  spec_sample_threshold_##NAME(const SpecSampleParams p) { specdec::pdl_begin(); threshold_kernel<T>(p); }         \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_FINISH_THREADS, 1)                \
  spec_sample_finish_##NAME(const SpecSampleParams p) { finish_kernel<T>(p); }

#define SPEC_SAMPLE_HIST_KERNEL(NAME, T)                                                      \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_HIST_THREADS, SPEC_SAMPLE_HIST_CTAS_PER_SM) \
  spec_sample_hist_##NAME(const SpecSampleParams p) { hist_kernel<T>(p); }

SPEC_SAMPLE_KERNELS(f32, float)
SPEC_SAMPLE_KERNELS(f16, __half)
SPEC_SAMPLE_KERNELS(bf16, bf16_t)
SPEC_SAMPLE_HIST_KERNEL(f16, __half)
SPEC_SAMPLE_HIST_KERNEL(bf16, bf16_t)

// sm_90, 16-bit logits, one-hot drafts: one cluster per row, the row read once (sample_rows.cuh)
#define SPEC_SAMPLE_ROWS_KERNEL(NAME, T)                                                      \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_ROWS_THREADS, SPEC_SAMPLE_ROWS_CTAS_PER_SM) \
  spec_sample_rows_##NAME(const SpecSampleParams p) { rows_kernel<T>(p); }

SPEC_SAMPLE_ROWS_KERNEL(f16, __half)
SPEC_SAMPLE_ROWS_KERNEL(bf16, bf16_t)

extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_CHAIN_THREADS)
spec_sample_chain(const SpecSampleParams p) { chain_kernel(p); }

// sm_90, 16-bit logits, one-hot drafts, one wave of clusters: the rows layout with a shorter
// chain of dependent steps (sample_small.cuh) + the chain with its inputs read before the wait
#define SPEC_SAMPLE_SMALL_KERNEL(NAME, T)                                                     \
  extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_ROWS_THREADS, 1)                  \
  spec_sample_small_##NAME(const SpecSampleParams p) { small_kernel<T>(p); }

SPEC_SAMPLE_SMALL_KERNEL(f16, __half)
SPEC_SAMPLE_SMALL_KERNEL(bf16, bf16_t)

extern "C" __global__ void __launch_bounds__(SPEC_SAMPLE_CHAIN_THREADS)
spec_sample_chain_pre(const SpecSampleParams p) { chain_pre_kernel(p); }
