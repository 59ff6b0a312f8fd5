# cython: language_level=3
"""Launchers of the sampling family (spec_sample): pack the parameter block, launch the
three kernels in order on the caller's stream. No validation here
(specdec_lib.ops.sampling does it before calling in)."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from specdec_lib._driver cimport Kernel, launch, launch_after, launch_cluster_grid

cdef extern from "sampling/sampling_params.h":
    int SPEC_SAMPLE_TILE
    int SPEC_SAMPLE_MAX_TILES
    int SPEC_SAMPLE_TILE_THREADS
    int SPEC_SAMPLE_THRESHOLD_THREADS
    int SPEC_SAMPLE_FINISH_THREADS
    int SPEC_SAMPLE_TILE_CTAS_PER_SM
    int SPEC_SAMPLE_THRESHOLD_STEPS
    int SPEC_SAMPLE_THRESHOLD_CTAS_PER_SM
    int SPEC_SAMPLE_THRESHOLD_MIN_TOKENS
    int SPEC_SAMPLE_THRESHOLD_CANDIDATES
    int SPEC_SAMPLE_HIST_THREADS
    int SPEC_SAMPLE_HIST_CTAS_PER_SM
    int SPEC_SAMPLE_HIST_BINS
    int SPEC_SAMPLE_ROWS_THREADS
    int SPEC_SAMPLE_ROWS_BINS
    int SPEC_SAMPLE_ROWS_MAX_TILES
    int SPEC_SAMPLE_ROWS_MAX_CLUSTER
    int SPEC_SAMPLE_CHAIN_THREADS

    ctypedef struct SpecSampleTile:
        float m
        float s
        float raw_max
        int32_t arg
        uint32_t flags

    ctypedef struct SpecSampleRow:
        uint32_t tau_key
        float m

    ctypedef struct SpecSampleFilter:
        pass

    ctypedef struct SpecSampleRowOut:
        pass

    ctypedef struct SpecSampleParams:
        const void* logits
        const int32_t* cu_q
        const int32_t* draft_ids
        const float* temperature
        const int32_t* top_k
        const float* top_p
        const float* min_p
        const uint64_t* seed
        const int64_t* step
        const float* draft_probs
        const int32_t* d2t
        int32_t* num_accepted
        int32_t* emitted
        int32_t* status
        float* logprobs
        void* workspace
        int64_t logits_stride
        int64_t draft_probs_stride
        int64_t emitted_stride
        int64_t logprobs_stride
        int32_t num_rows
        int32_t batch
        int32_t vocab
        int32_t draft_vocab
        int32_t num_tiles
        int32_t tiles_per_cta
        int32_t width
        int32_t filtered_pass
        int32_t no_filters
        int32_t filter_step

PARAM_SIZES = {"SpecSampleParams": sizeof(SpecSampleParams)}
TILE = SPEC_SAMPLE_TILE
MAX_TILES = SPEC_SAMPLE_MAX_TILES
TILE_BYTES = sizeof(SpecSampleTile)
ROW_BYTES = sizeof(SpecSampleRow)
TILE_WARPS = SPEC_SAMPLE_TILE_THREADS // 32
TILE_CTAS_PER_SM = SPEC_SAMPLE_TILE_CTAS_PER_SM
FILTER_BYTES = sizeof(SpecSampleFilter)
THRESHOLD_STEPS = SPEC_SAMPLE_THRESHOLD_STEPS
THRESHOLD_CTAS_PER_SM = SPEC_SAMPLE_THRESHOLD_CTAS_PER_SM
THRESHOLD_MIN_TOKENS = SPEC_SAMPLE_THRESHOLD_MIN_TOKENS
HIST_CTAS_PER_SM = SPEC_SAMPLE_HIST_CTAS_PER_SM
HIST_BINS = SPEC_SAMPLE_HIST_BINS
ROWS_THREADS = SPEC_SAMPLE_ROWS_THREADS
ROWS_BINS = SPEC_SAMPLE_ROWS_BINS
ROWS_MAX_TILES = SPEC_SAMPLE_ROWS_MAX_TILES
ROWS_MAX_CLUSTER = SPEC_SAMPLE_ROWS_MAX_CLUSTER
ROW_OUT_BYTES = sizeof(SpecSampleRowOut)


cdef SpecSampleParams _params(uintptr_t logits, uintptr_t cu_q, uintptr_t draft_ids,
                              uintptr_t temperature, uintptr_t top_k, uintptr_t top_p, uintptr_t min_p,
                              uintptr_t seed, uintptr_t step, uintptr_t draft_probs, uintptr_t d2t,
                              uintptr_t num_accepted, uintptr_t emitted, uintptr_t status,
                              uintptr_t logprobs, uintptr_t workspace,
                              int64_t logits_stride, int64_t draft_probs_stride,
                              int64_t emitted_stride, int64_t logprobs_stride,
                              int num_rows, int batch, int vocab, int draft_vocab, int num_tiles,
                              int tiles_per_cta, int width, bint filters):
    cdef SpecSampleParams p
    p.logits = <const void*>logits
    p.cu_q = <const int32_t*>cu_q
    p.draft_ids = <const int32_t*>draft_ids
    p.temperature = <const float*>temperature
    p.top_k = <const int32_t*>top_k
    p.top_p = <const float*>top_p
    p.min_p = <const float*>min_p
    p.seed = <const uint64_t*>seed
    p.step = <const int64_t*>step
    p.draft_probs = <const float*>draft_probs
    p.d2t = <const int32_t*>d2t
    p.num_accepted = <int32_t*>num_accepted
    p.emitted = <int32_t*>emitted
    p.status = <int32_t*>status
    p.logprobs = <float*>logprobs
    p.workspace = <void*>workspace
    p.logits_stride = logits_stride
    p.draft_probs_stride = draft_probs_stride
    p.emitted_stride = emitted_stride
    p.logprobs_stride = logprobs_stride
    p.num_rows = num_rows
    p.batch = batch
    p.vocab = vocab
    p.draft_vocab = draft_vocab
    p.num_tiles = num_tiles
    p.tiles_per_cta = tiles_per_cta
    p.width = width
    p.filtered_pass = 0
    p.no_filters = 0 if filters else 1
    p.filter_step = 0
    return p


def launch_spec_sample(Kernel k_tiles, Kernel k_threshold, Kernel k_finish, size_t stream,
                       uintptr_t logits, uintptr_t cu_q, uintptr_t draft_ids,
                       uintptr_t temperature, uintptr_t top_k, uintptr_t top_p, uintptr_t min_p,
                       uintptr_t seed, uintptr_t step, uintptr_t draft_probs, uintptr_t d2t,
                       uintptr_t num_accepted, uintptr_t emitted, uintptr_t status,
                       uintptr_t logprobs, uintptr_t workspace,
                       int64_t logits_stride, int64_t draft_probs_stride,
                       int64_t emitted_stride, int64_t logprobs_stride,
                       int num_rows, int batch, int vocab, int draft_vocab, int num_tiles,
                       int tiles_per_cta, int width, bint filters=True, int threshold_ctas=1,
                       Kernel k_hist=None, bint pdl=False):
    """f32 logits: tiles (grid T x chunks) -> threshold x SPEC_SAMPLE_THRESHOLD_STEPS (grid
    T x threshold_ctas, filter_step 0..3) -> tiles, filtered pass -> finish (grid B).
    16-bit logits (``k_hist`` given): tiles -> hist (grid T x threshold_ctas, one launch:
    the thresholds from an exact-value histogram, then the filtered rows' tile sums
    recounted over the kept set) -> finish. ``filters=False`` (the caller's promise that no
    request filters) skips the filter launches; finish then flags a request that does filter
    (status 5) instead of sampling it unfiltered. With filters=True the launches always run
    (CTAs of unfiltered rows exit at once). ``pdl`` (sm_90 code): hist and finish are
    launched with programmatic stream serialization (scheduled while their predecessor
    drains; they wait for its results in the kernel)."""
    cdef SpecSampleParams p = _params(logits, cu_q, draft_ids, temperature, top_k, top_p, min_p,
                  seed, step, draft_probs, d2t, num_accepted, emitted, status, logprobs, workspace,
                  logits_stride, draft_probs_stride, emitted_stride, logprobs_stride,
                  num_rows, batch, vocab, draft_vocab, num_tiles, tiles_per_cta, width, filters)
    cdef unsigned int chunks = (num_tiles + tiles_per_cta - 1) // tiles_per_cta
    if num_rows > 0:
        launch(k_tiles, num_rows, chunks, 1, SPEC_SAMPLE_TILE_THREADS, 1, 1, 0, stream, &p)
        if filters and k_hist is not None:
            launch_after(k_hist, num_rows, threshold_ctas, 1, SPEC_SAMPLE_HIST_THREADS, 1, 1, 0,
                         stream, &p, pdl)
        elif filters:
            for step in range(SPEC_SAMPLE_THRESHOLD_STEPS):
                p.filter_step = step
                launch(k_threshold, num_rows, threshold_ctas, 1, SPEC_SAMPLE_THRESHOLD_THREADS,
                       1, 1, 0, stream, &p)
            p.filter_step = 0
            p.filtered_pass = 1
            launch(k_tiles, num_rows, chunks, 1, SPEC_SAMPLE_TILE_THREADS, 1, 1, 0, stream, &p)
            p.filtered_pass = 0
    # (the first launch of the call when there are no rows: then a plain one)
    launch_after(k_finish, batch, 1, 1, SPEC_SAMPLE_FINISH_THREADS, 1, 1, 0, stream, &p,
                 pdl and num_rows > 0)


cdef void _allow_smem(Kernel k, unsigned int smem):
    """Lets k launch with smem bytes of dynamic shared memory (the rows path holds more than
    the default 48 KB)."""
    if smem > <unsigned int>k.max_dynamic_smem:
        k.prefer_max_shared()
        k.set_max_dynamic_smem(smem)


def launch_spec_sample_rows(Kernel k_row, Kernel k_chain, size_t stream,
                            uintptr_t logits, uintptr_t cu_q, uintptr_t draft_ids,
                            uintptr_t temperature, uintptr_t top_k, uintptr_t top_p, uintptr_t min_p,
                            uintptr_t seed, uintptr_t step, uintptr_t num_accepted, uintptr_t emitted,
                            uintptr_t status, uintptr_t logprobs, uintptr_t workspace,
                            int64_t logits_stride, int64_t emitted_stride, int64_t logprobs_stride,
                            int num_rows, int batch, int vocab, int num_tiles, int tiles_per_cta,
                            int cluster, unsigned int smem, int width, bint filters=True,
                            bint pdl=False, bint pdl_row=False):
    """sm_90, 16-bit logits, the rows layout of the rows and small paths: ``k_row``
    (spec_sample_rows_* / spec_sample_small_*: grid T x ``cluster`` CTAs in clusters of
    ``cluster``, each holding ``tiles_per_cta`` tiles of its row in ``smem`` bytes of dynamic
    shared memory; with programmatic stream serialization when ``pdl_row``: the small path)
    -> ``k_chain`` (spec_sample_chain / spec_sample_chain_pre: one warp per sequence; ``pdl``:
    launched with programmatic stream serialization, as in launch_spec_sample, when a row
    launch went before)."""
    cdef SpecSampleParams p = _params(logits, cu_q, draft_ids, temperature, top_k, top_p, min_p,
                                      seed, step, 0, 0, num_accepted, emitted, status, logprobs,
                                      workspace, logits_stride, 0, emitted_stride, logprobs_stride,
                                      num_rows, batch, vocab, 0, num_tiles, tiles_per_cta, width,
                                      filters)
    if num_rows > 0:
        _allow_smem(k_row, smem)
        if cluster > 8:
            k_row.allow_large_clusters()
        launch_cluster_grid(k_row, num_rows * cluster, 1, 1, SPEC_SAMPLE_ROWS_THREADS, smem,
                            stream, &p, cluster, pdl_row)
    cdef int per_cta = SPEC_SAMPLE_CHAIN_THREADS // 32   # one warp per sequence
    launch_after(k_chain, (batch + per_cta - 1) // per_cta, 1, 1,
                 SPEC_SAMPLE_CHAIN_THREADS, 1, 1, 0, stream, &p, pdl and num_rows > 0)
