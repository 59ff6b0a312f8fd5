/* Parameter block of the sampling family (spec_sample), shared by the kernels (nvcc) and
 * the Cython launcher. One struct serves the three kernels of the op (tiles, threshold,
 * finish); each reads the fields it needs. Strides are in elements. */
#pragma once
#include <stdint.h>

#define SPEC_SAMPLE_TILE 2048          /* tokens per tile: a constant of the spec (reference TILE) */
#define SPEC_SAMPLE_MAX_TILES 1024     /* V <= 2^21 */
#define SPEC_SAMPLE_TILE_THREADS 128   /* spec_sample_tiles_*: 4 warps, one tile per warp at a time */
#define SPEC_SAMPLE_TILE_CTAS_PER_SM 6 /* its occupancy (launch bounds): sizes the vocab split */
#define SPEC_SAMPLE_THRESHOLD_THREADS 256
#define SPEC_SAMPLE_THRESHOLD_CTAS_PER_SM 2    /* its occupancy (launch bounds) */
#define SPEC_SAMPLE_THRESHOLD_STEPS 4          /* threshold launches per call (2 per filter) */
#define SPEC_SAMPLE_THRESHOLD_MIN_TOKENS 8192  /* a threshold CTA covers at least this many tokens */
#define SPEC_SAMPLE_THRESHOLD_CANDIDATES 4096  /* keys of the selected bucket kept in the row's list */
#define SPEC_SAMPLE_HIST_THREADS 512     /* spec_sample_hist_* (16-bit logits): exact-value histogram + recount */
#define SPEC_SAMPLE_HIST_CTAS_PER_SM 2   /* its occupancy (launch bounds) */
#define SPEC_SAMPLE_HIST_BINS 8192       /* values below the row max it counts exactly */
#define SPEC_SAMPLE_ROWS_THREADS 256    /* spec_sample_rows_* (sm_90, 16-bit, one-hot): one cluster per row */
#define SPEC_SAMPLE_ROWS_CTAS_PER_SM 3  /* its occupancy (launch bounds) */
#define SPEC_SAMPLE_ROWS_BINS 4096      /* values below the row max counted per histogram window */
#define SPEC_SAMPLE_ROWS_MAX_TILES 32   /* tiles one CTA of the cluster holds (128 KB of smem) */
#define SPEC_SAMPLE_ROWS_MAX_CLUSTER 16 /* CTAs per row (above 8: a non-portable cluster size, sm_90 allows 16) */
#define SPEC_SAMPLE_CHAIN_THREADS 128   /* spec_sample_chain: one warp per sequence */
#define SPEC_SAMPLE_FINISH_THREADS 512   /* level-2 race: 4 tokens per thread */
#define SPEC_SAMPLE_FINISH_ROWS 32       /* block rows whose accept step finish evaluates in parallel */

/* status codes (specdec_lib/reference/sampling.py STATUS_*) */
#define SPEC_SAMPLE_OK 0
#define SPEC_SAMPLE_NONFINITE 1
#define SPEC_SAMPLE_BAD_DRAFT 2
#define SPEC_SAMPLE_EMPTY 3
#define SPEC_SAMPLE_BAD_LAYOUT 4
#define SPEC_SAMPLE_FILTER_SKIPPED 5  /* filters=False was promised but the request filters */

/* Workspace (caller-provided, 16-byte aligned):
 *   SpecSampleTile    tiles[T * num_tiles]  per (row, tile) partials
 *   SpecSampleRow     rows[T]               per row: filter threshold, row max
 *   (padding to 16 bytes)
 *   SpecSampleFilter  filters[T]            per row: the multi-CTA threshold's global
 *                                           histogram, counters and candidate list
 * bytes = round_up(T * num_tiles * sizeof(SpecSampleTile) + T * sizeof(SpecSampleRow), 16)
 *       + T * sizeof(SpecSampleFilter)
 * Nothing in it has to survive between calls: the tile pass zeroes head + count of each row
 * that filters (top-k / top-p) before the threshold launches read them. */
typedef struct {
  float m;          /* max of s2 = logit * log2(e) / temperature over non-NaN tokens (-inf: none) */
  float s;          /* sum of exp2(s2 - m) over counted tokens (not the one-hot draft, kept) */
  float raw_max;    /* max raw logit (non-NaN) */
  int32_t arg;      /* lowest id of raw_max, -1 if the tile is all NaN */
  uint32_t flags;   /* bit 0: NaN seen, bit 1: +inf seen */
} SpecSampleTile;

typedef struct {
  uint32_t tau_key; /* kept iff orderable_key(logit) >= tau_key (0: no top-k/top-p cut) */
  float m;          /* row max of s2 */
} SpecSampleRow;

/* Per-row state of the threshold (spec_sample_threshold_*, split over gridDim.y CTAs per row).
 * Filter slot j = the row's j-th filter in the order top-k, top-p (a row with only top-p
 * uses slot 0). Step 2j: token counts and truncated masses per bucket (global u32 atomics), the exact mass of
 * the slot's tokens (u64, one atomic per CTA); the last CTA bounds each bucket's mass and
 * picks the window of buckets that must hold the crossing. Step 2j+1: the exact mass above
 * the window (one atomic per CTA) and the window's keys appended to cand[]; the last CTA runs
 * the radix rounds over them. head, count and msum are zeroed by the tile pass; the step-0
 * last CTA re-zeroes count and msum for slot 1. Every sum is an integer sum: order-free. */
typedef struct {
  uint32_t done[4];                 /* CTAs finished per threshold step (last-CTA-done) */
  uint32_t n_cand[2];               /* keys found in the window, per slot (may exceed the list) */
  int32_t win_lo[2];                /* window of buckets (distance below the row max, inclusive) */
  int32_t win_hi[2];                /*   that holds the crossing, per slot */
  unsigned long long target[2];     /* count / fixed-point mass target per slot */
  unsigned long long total[2];      /* exact count / mass of the slot's tokens (step 2j) */
  unsigned long long above[2];      /* exact count / mass above the window (step 2j+1) */
  uint32_t tau_k;                   /* slot 0's threshold when a slot 1 follows (its key floor) */
  uint32_t pad;
} SpecSampleFilterHead;             /* 96 bytes */

typedef struct {
  SpecSampleFilterHead head;
  uint32_t count[2048];             /* tokens per bucket */
  uint32_t msum[2048];              /* top-p: per bucket, sum of (mass >> bucket_shift(j)) */
  uint32_t cand[SPEC_SAMPLE_THRESHOLD_CANDIDATES];
} SpecSampleFilter;   /* 96 + 8192 + 8192 + 16384 = 32864 bytes. 16-bit logits use count, msum
                         and cand as one array of SPEC_SAMPLE_HIST_BINS (8192) per-value counts
                         (spec_sample_hist_*) */

/* Per row result of spec_sample_rows_* ([T] of them where the SpecSampleFilter array starts), read by
 * spec_sample_chain. */
typedef struct {
  int32_t owner;    /* the sequence whose params the row used (cu_q not increasing: mismatch) */
  int32_t token;    /* greedy: argmax (-1: all NaN); sampled: the row's sample (-1: none drawn) */
  int32_t accept;   /* sampled: u < p(x) for the row's draft */
  uint32_t flags;   /* NaN / +inf seen in the row */
  int32_t empty;    /* nothing to sample (sampled: max -inf; greedy: all NaN) */
  float lp_draft;   /* log p(x) */
  float lp_token;   /* log-probability of token */
  uint32_t tau;     /* sampled: the top-k / top-p keep threshold (order_key; 0: no cut), for tests */
} SpecSampleRowOut;

typedef struct {
  const void* logits;           /* [T, V], last dim contiguous */
  const int32_t* cu_q;          /* [B+1] */
  const int32_t* draft_ids;     /* [T-B] */
  const float* temperature;     /* [B] */
  const int32_t* top_k;         /* [B] */
  const float* top_p;           /* [B] */
  const float* min_p;           /* [B] */
  const uint64_t* seed;         /* [B] */
  const int64_t* step;          /* [B] */
  const float* draft_probs;     /* [T-B, Vd] or NULL (one-hot drafts) */
  const int32_t* d2t;           /* [Vd] strictly increasing target ids, or NULL */
  int32_t* num_accepted;        /* [B] */
  int32_t* emitted;             /* [B, width] */
  int32_t* status;              /* [B] */
  float* logprobs;              /* [B, width] or NULL */
  void* workspace;
  int64_t logits_stride;        /* elements between logits rows */
  int64_t draft_probs_stride;
  int64_t emitted_stride;
  int64_t logprobs_stride;
  int32_t num_rows;             /* T */
  int32_t batch;                /* B */
  int32_t vocab;                /* V */
  int32_t draft_vocab;          /* Vd (0 without draft_probs) */
  int32_t num_tiles;            /* ceil(V / SPEC_SAMPLE_TILE) */
  int32_t tiles_per_cta;        /* spec_sample_tiles_*: tiles one CTA walks (warps stride by 4) */
  int32_t width;                /* emitted.shape[1] = kmax + 1 */
  int32_t filtered_pass;        /* spec_sample_tiles_*: 0 = all rows, 1 = rows with filters */
  int32_t no_filters;           /* 1: the filter launches were skipped (host promise: no request
                                   filters); finish flags a request that does (status 5) */
  int32_t filter_step;          /* spec_sample_threshold_*: 0..SPEC_SAMPLE_THRESHOLD_STEPS-1 */
} SpecSampleParams;
