"""spec_sample on the GPU (kernels: cuda_src/sampling/spec_sample.cu; spec and numpy twin:
specdec_lib/reference/sampling.py)."""
from __future__ import annotations

import functools
import numbers
import os
from typing import Any, Optional, Tuple

import numpy as np

from .. import runtime
from .._validate import DeviceArg, as_stream, check_int
from ..contract import index_values
from ..contract import sampling as contract
from ..contract.sampling import MAX_TILES, TILE  # noqa: F401  (SPEC_SAMPLE_TILE, _MAX_TILES)
from ._types import ArrayLike, Stream


_TILE_BYTES = 20            # sizeof(SpecSampleTile)
_ROW_BYTES = 8              # sizeof(SpecSampleRow)
_FILTER_BYTES = 32864       # sizeof(SpecSampleFilter): the threshold's per-row state
_THRESHOLD_CTAS_PER_SM = 2  # SPEC_SAMPLE_THRESHOLD_CTAS_PER_SM
_THRESHOLD_MIN_TOKENS = 8192  # SPEC_SAMPLE_THRESHOLD_MIN_TOKENS: tokens per threshold CTA, at least
_HIST_CTAS_PER_SM = 2       # SPEC_SAMPLE_HIST_CTAS_PER_SM
_KERNEL_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_TILE_WARPS = 4             # SPEC_SAMPLE_TILE_THREADS / 32: tiles a CTA works on at once
_TILE_CTAS_PER_SM = 6       # SPEC_SAMPLE_TILE_CTAS_PER_SM: resident tile CTAs per SM
_ROWS_BINS = 4096           # SPEC_SAMPLE_ROWS_BINS
_ROWS_MAX_TILES = 32        # SPEC_SAMPLE_ROWS_MAX_TILES: tiles one CTA of a row's cluster holds
_ROWS_MAX_CLUSTER = 16      # SPEC_SAMPLE_ROWS_MAX_CLUSTER: CTAs per row, at most
_ROWS_CLUSTER = 8           # CTAs per row by default (the portable cluster size)
_ROWS_MAX_T = 64            # automatic path: rows for calls with at most this many logit rows
PATH_ENV = "SPECDEC_SPEC_SAMPLE_PATH"   # auto (default) | small | rows | tiles: which kernels run
PDL_ENV = runtime.PDL_ENV   # "0": every launch the plain way (A/B timing)
CLUSTER_ENV = "SPECDEC_SPEC_SAMPLE_CLUSTER"   # rows path: CTAs per row (1..16; tuning runs)
# The small path (spec_sample_small_* + spec_sample_chain_pre: the rows layout with a shorter
# chain of dependent steps, sm_90): "small" False keeps the automatic choice off it (the
# environment switch still forces it); "small_cluster" the most CTAs per row it uses (1..16;
# fewer when T x that would not fit one CTA per SM); "small_smem_min" a floor on its dynamic
# shared memory per CTA (e.g. 120_000: one CTA per SM, for placement experiments).
# small_cluster 8: s20's H200 bench at B=1 k=3 V=151936 bf16 timed 8 CTAs a row against 16 at
# 12.7 / 14.0 us (no filter), 20.5 / 21.8 (top-p 0.9), 22.9 / 23.8 (top-k 50 + top-p; one run).
TUNING = {"small": True, "small_cluster": 8, "small_smem_min": 0}


def spec_sample_workspace_size(num_rows: int, vocab: int) -> int:
    """Bytes of the ``workspace`` that ``spec_sample`` needs for ``num_rows`` (T) logit rows
    of ``vocab`` (V) tokens. Independent of batch composition and device: allocate once
    for the largest T a captured graph will see.

    Layout: per (row, tile) partials (20 B each), per row the threshold and row max (8 B),
    padding to 16 B, then per row the multi-CTA threshold's state (32864 B: 2048 bucket
    counters and mass sums, a 4096-key candidate list). B=64 k=3 (T=256), V=151936:
    386 KB + 8.4 MB."""
    return _workspace_bytes(check_int("num_rows", num_rows, lo=0),
                            check_int("vocab", vocab, lo=0))


def _workspace_bytes(num_rows: int, vocab: int) -> int:
    num_tiles = -(-vocab // TILE)
    head = num_rows * (num_tiles * _TILE_BYTES + _ROW_BYTES)
    return -(-head // 16) * 16 + num_rows * _FILTER_BYTES


def advance_step(step: ArrayLike, by: Any = 1) -> ArrayLike:
    """Move ``spec_sample``'s per-request Philox counter on for the next round: ``step +=
    by`` in place; returns ``step``.

    spec_sample draws request b's random numbers from Philox keyed by (seed[b], step[b],
    block row, purpose). A call with the seed and step of an earlier call draws the same
    numbers again, so its tokens are strongly correlated with the earlier call's (with
    other logits, most often the same token) instead of independent: advance ``step``
    between two calls with the same seeds, e.g. once per round after ``spec_sample``.

    step: the int64 [B] ``step`` array, of any library with in-place addition (numpy,
    torch on any device, cupy; on a GPU one elementwise kernel on the current stream:
    no host synchronisation, graph-capturable). A ``DeviceArray`` has no arithmetic: keep
    step in numpy / torch / cupy, or write the next round's values into it yourself.
    by: an int >= 1 (every request moves on by it), or a [B] integer array of the same
    library and device, e.g. seq_stop's ``accept_len``: a step that starts at the
    committed length L then stays equal to L (the decoder's rule, ``step = seq_lens``
    before each round; L grows by at least 1 every round a request runs). 0 is fine only
    for finished rows, whose draws are never used.

    Example::

        for _ in range(rounds):
            spec_sample(logits, cu_q, drafts, temp, top_k, top_p, min_p, seed, step,
                        n_acc, emitted, status, workspace=ws)
            advance_step(step)
    """
    dt = str(getattr(step, "dtype", None))
    if dt not in ("int64", "torch.int64"):
        raise TypeError(f"step: expected an int64 array (numpy, torch or cupy), got "
                        f"{type(step).__name__} of dtype {dt}")
    if not hasattr(step, "__iadd__"):
        raise TypeError(f"step: a {type(step).__name__} has no in-place addition; hold step "
                        f"in numpy, torch or cupy (or write the next round's values into it)")
    if isinstance(by, (bool, np.bool_)):
        raise TypeError("by: expected an int or an integer array, got a bool")
    if isinstance(by, numbers.Integral):
        if by < 1:
            raise ValueError(f"by: must be >= 1 (a step that does not move reuses the last "
                             f"round's random numbers), got {int(by)}")
        by = int(by)
    elif isinstance(by, np.ndarray):
        if by.dtype.kind not in "iu":
            raise TypeError(f"by: expected an integer array, got dtype {by.dtype}")
        if by.size and by.min() < 0:
            raise ValueError(f"by: must be >= 0 per request, got {int(by.min())}")
    step += by
    return step


def _ctas_per_row(num_rows: int, vocab: int, ctas: int) -> int:
    """Split of a row-parallel launch (grid rows x this) that gives about `ctas` CTAs in all,
    none with fewer than _THRESHOLD_MIN_TOKENS tokens."""
    want = -(-ctas // max(1, num_rows))
    return max(1, min(want, -(-int(vocab) // _THRESHOLD_MIN_TOKENS)))


@functools.lru_cache(maxsize=256)
def _threshold_ctas(num_rows: int, vocab: int, sm_count: int) -> int:
    """CTAs per row of the threshold launches (grid rows x this): enough for about
    _THRESHOLD_CTAS_PER_SM x 2 CTAs per SM if every row filters, but no CTA with fewer than
    _THRESHOLD_MIN_TOKENS tokens. B=64 k=3 (T=256), V=151936 on 132 SMs: 3; B=1 (T=4): 19."""
    return _ctas_per_row(num_rows, vocab, 2 * _THRESHOLD_CTAS_PER_SM * max(1, sm_count))


@functools.lru_cache(maxsize=256)
def _hist_ctas(num_rows: int, vocab: int, sm_count: int) -> int:
    """CTAs per row of the 16-bit hist launch (grid rows x this). One per row once the rows
    fill the SMs: the row's histogram never leaves shared memory (no global merge, no
    last-CTA hand-off) and the same CTA recounts the row. Fewer rows: about
    _HIST_CTAS_PER_SM CTAs per SM, none with fewer than _THRESHOLD_MIN_TOKENS tokens.
    B=64 k=3 (T=256) on 132 SMs: 1; B=1 (T=4), V=151936: 19."""
    if num_rows >= sm_count:
        return 1
    return _ctas_per_row(num_rows, vocab, _HIST_CTAS_PER_SM * max(1, sm_count))


@functools.lru_cache(maxsize=256)
def _tiles_per_cta(num_rows: int, num_tiles: int, sm_count: int) -> int:
    """Vocab split of the tile pass (grid rows x ceil(num_tiles / tiles_per_cta)): the split
    that minimises waves x tiles per warp (each warp walks its CTA's tiles with stride
    _TILE_WARPS), fewest CTAs among equals. B=64, V=151936 on 132 SMs: 3 chunks of 25 tiles
    (768 CTAs, one wave, 7 tiles per warp); B=1 (4 rows): 19 chunks of 4 (one tile per warp)."""
    slots = max(1, _TILE_CTAS_PER_SM * sm_count)
    best = None
    for tpc in range(_TILE_WARPS, num_tiles + _TILE_WARPS, _TILE_WARPS):
        chunks = -(-num_tiles // tpc)
        ctas = num_rows * chunks
        cost = (-(-ctas // slots)) * (-(-tpc // _TILE_WARPS))
        key = (cost, ctas)
        if best is None or key < best[0]:
            best = (key, tpc)
        if chunks == 1:
            break
    return min(best[1], max(num_tiles, 1)) if best else 1


def rows_plan(num_tiles: int, cluster: int | None = None):
    """(tiles per CTA, CTAs per row = cluster size, dynamic shared memory bytes) of the
    one-pass path (spec_sample_rows_*): the row split over ``cluster`` CTAs (default 8, or
    $SPECDEC_SPEC_SAMPLE_CLUSTER), at least ceil(num_tiles / 32) (a CTA holds <= 32 tiles),
    every CTA with at least one tile. V=151936 (75 tiles): 10 tiles x 8 CTAs, 43,008 B."""
    if cluster is None:
        cluster = int(os.environ.get(CLUSTER_ENV, _ROWS_CLUSTER))
    if not 1 <= cluster <= _ROWS_MAX_CLUSTER:
        raise ValueError(f"{CLUSTER_ENV}={cluster}: expected 1..{_ROWS_MAX_CLUSTER}")
    cluster = max(cluster, -(-num_tiles // _ROWS_MAX_TILES))
    tpc = -(-num_tiles // cluster)
    cluster = -(-num_tiles // tpc)
    smem = tpc * TILE * 2 + (-(-_ROWS_BINS // cluster)) * 4   # + the static histogram
    return tpc, cluster, smem


def rows_unsupported(dtype: str, one_hot: bool, vocab: int, device: int = 0):
    """Why the one-pass path (spec_sample_rows_*) cannot run these inputs on ``device``, or
    None: it needs sm_90 code (thread-block clusters), 16-bit logits, one-hot drafts and
    V <= 524288."""
    num_tiles = -(-int(vocab) // TILE)
    if dtype not in ("float16", "bfloat16"):
        return "float32 logits"
    if not one_hot:
        return "draft_probs given"
    if num_tiles > _ROWS_MAX_TILES * _ROWS_CLUSTER:   # > 8 CTAs per row: not every GPU
        return f"V > {TILE * _ROWS_MAX_TILES * _ROWS_CLUSTER}"
    if runtime.arch_family(device) < 90:
        return f"code family {runtime.arch_family(device)} (clusters need sm_90)"
    return None


def small_plan(num_rows: int, num_tiles: int, sm_count: int, cluster: int | None = None):
    """(tiles per CTA, CTAs per row, dynamic shared memory bytes) of the small path, or None
    when its grid (T x CTAs per row) would not fit one CTA per SM: the row split over
    TUNING["small_cluster"] CTAs (default 8, the portable cluster size; up to 16), halved
    until T x that fits ``sm_count`` SMs, at least 8 (rows_plan then widens it for V above
    8 x 32 tiles). V=151936 on 132 SMs: T=4 -> 10 tiles x 8 CTAs (32 CTAs); T=16 -> 10 tiles
    x 8 CTAs (128 CTAs); with small_cluster 16, T=4 -> 5 tiles x 15 CTAs (60 CTAs)."""
    want = int(TUNING["small_cluster"] if cluster is None else cluster)
    if not 1 <= want <= _ROWS_MAX_CLUSTER:
        raise ValueError(f"TUNING['small_cluster']={want}: expected 1..{_ROWS_MAX_CLUSTER}")
    while want > 8 and num_rows * want > sm_count:
        want //= 2
    tpc, cl, smem = rows_plan(num_tiles, want)
    if num_rows * cl > sm_count:
        return None
    return tpc, cl, max(smem, int(TUNING["small_smem_min"]))


def sample_path(dtype: str, one_hot: bool, vocab: int, device: int = 0, num_rows: int = 1) -> str:
    """Which kernels ``spec_sample`` runs: "small" (the rows layout with a shorter chain of
    dependent steps: one data exchange per row without filters, the level-2 race split over
    the cluster; + a chain launch that reads its inputs before it waits), "rows" (one launch
    that keeps each row on chip in a thread-block cluster, + the chain launch) or "tiles"
    (tiles -> threshold or hist -> finish). Automatic: small where the rows path can run
    (``rows_unsupported``) and T x CTAs per row fits one CTA per SM (``small_plan``: T <= 16
    with 8-CTA clusters on 132 SMs; TUNING["small"] turns this off), else
    rows up to _ROWS_MAX_T logit rows (one wave of clusters: B=1 top-p 23 us vs 34 on the
    tiles path), else tiles. SPECDEC_SPEC_SAMPLE_PATH=tiles forces the tiles path; =rows
    the rows path and =small the small path at any batch size wherever they can run (tests,
    benchmarks; small then falls back to rows where its grid does not fit one wave)."""
    want = os.environ.get(PATH_ENV, "auto").strip().lower() or "auto"
    if want not in ("auto", "small", "rows", "tiles"):
        raise ValueError(f"{PATH_ENV}={want!r}: expected auto, small, rows or tiles")
    if want == "tiles" or rows_unsupported(dtype, one_hot, vocab, device) is not None:
        return "tiles"
    if want == "rows":
        return "rows"
    fits = small_plan(num_rows, -(-int(vocab) // TILE), runtime.sm_count(device)) is not None
    if fits and (want == "small" or TUNING["small"]):
        return "small"
    if want == "small" or num_rows <= _ROWS_MAX_T:
        return "rows"
    return "tiles"


def use_pdl(device: int = 0) -> bool:
    """Whether a call's launches after its first go out with programmatic stream
    serialization (``runtime.pdl_enabled``: sm_90 code, unless SPECDEC_PDL=0)."""
    return runtime.pdl_enabled(device)


def spec_sample(logits: ArrayLike, cu_q: ArrayLike, draft_ids: ArrayLike,
                temperature: ArrayLike, top_k: ArrayLike, top_p: ArrayLike, min_p: ArrayLike,
                seed: ArrayLike, step: ArrayLike, num_accepted: ArrayLike, emitted: ArrayLike,
                status: ArrayLike, draft_probs: Optional[ArrayLike] = None,
                d2t: Optional[ArrayLike] = None, accepted_logprobs: Optional[ArrayLike] = None, *,
                workspace: ArrayLike, stream: Stream = None, filters: Optional[bool] = None,
                check_indices: bool = True) -> Tuple[ArrayLike, ArrayLike, ArrayLike]:
    """Exact speculative sampling of one round, straight from the target logits.

    logits [T, V] float32/float16/bfloat16 (last dim contiguous, any row stride, any V up
    to 2^21): block b = rows cu_q[b]..cu_q[b+1]-1, row i verifies draft d_{i+1}, the last
    row gives the bonus token. cu_q [B+1] int32. draft_ids [T-B] int32 (target ids; block
    b's drafts at [cu_q[b]-b, cu_q[b+1]-b-1)). Per request [B]: temperature float32 (not > 0
    -> greedy), top_k int32 (<= 0 or >= V: off), top_p float32 (>= 1: off), min_p float32
    (<= 0: off), seed uint64/int64, step int64 -- all in device memory (graph-capturable).
    ``seed`` / ``step``: request b's random numbers come from Philox keyed by (seed[b],
    step[b], block row, purpose), so the same inputs give the same tokens. ``step`` must
    be new for every call with the same seed: advance it every round (``advance_step``,
    or keep it equal to something that grows every round, as the decoder does with the
    committed length L). Reusing (seed, step) reuses the random numbers: a round with
    other logits then draws tokens strongly correlated with the last one's (most often
    the same token), not independent ones.
    Optional draft_probs [T-B, Vd] float32 (last dim contiguous; else one-hot drafts) and
    d2t [Vd] int32 strictly increasing target ids (else Vd must equal V).

    Outputs (fully written): num_accepted [B] int32, emitted [B, W] int32 (W >= max q_b;
    tokens then -1), status [B] int32 (0 ok, 1 NaN/+inf logits, 2 bad draft id, 3 empty
    distribution, 4 bad cu_q layout, 5 the request filters but ``filters=False`` was
    passed), optional accepted_logprobs [B, W] float32.
    ``workspace``: a device buffer of at least ``spec_sample_workspace_size(T, V)`` bytes,
    16-byte aligned (no allocation happens in the op). Filter order, tie rules and the
    Philox keying are those of ``specdec_lib.reference.sampling``; the same inputs give the
    same tokens on every run, stream and GPU.

    Kernels (``sample_path``): on sm_90 code, 16-bit logits with one-hot drafts, calls whose
    rows fit one wave of clusters (T <= 8 with 16 CTAs per row, T <= 16 with 8 on 132 SMs)
    take the small path and up to 64 logit rows the rows path (one thread-block cluster per
    row keeps the row in shared memory through every step; + a chain launch); every other call the tiles path
    (tiles -> threshold (f32) or hist (16-bit) -> finish). The same rules on every path (sums in other orders: a draw on a float32 rounding
    boundary may differ between the paths).

    ``filters``: None/True: the filter work runs (tiles path: the threshold / hist launch;
    its CTAs for rows without filters exit at once). False: the caller promises that no
    sampled request has top_k in (0, V), top_p < 1 or min_p > 0 (greedy requests may carry
    any values), and the filter work is skipped (tiles path: one to five launches less per
    call). A request that filters despite the promise is never sampled unfiltered: its block
    gets status 5 (``STATUS_FILTER_SKIPPED``), num_accepted 0 and emitted -1.

    ``check_indices=True`` (default) copies ``cu_q`` (and ``d2t``) to the host on
    ``stream``, waits, and raises ValueError before any launch when cu_q does not start
    at 0, grow by at least 1 per block and end at T, when a block has more rows than
    ``emitted`` has columns, or when d2t is not strictly increasing in [0, V) (the
    argument contract: ``specdec_lib.contract.sampling``). Pass False in a hot loop (the
    decoder does); while the stream captures a graph the copy is skipped anyway.
    Unchecked, the kernels flag a bad block layout with status 4 and never fault.

    Example::

        ws = DeviceArray.empty((spec_sample_workspace_size(T, V),), "uint8")
        spec_sample(logits, cu_q, drafts, temp, top_k, top_p, min_p, seed, step,
                    n_acc, emitted, status, workspace=ws)
        advance_step(step)          # step a torch / cupy array: the next round's counters
    """
    stream_h = as_stream(stream)
    lg, cq, di, tp, tk, pp, mp, sd, st, na, em, ss, dp, dm, lp = contract.spec_sample(
        logits, cu_q, draft_ids, temperature, top_k, top_p, min_p, seed, step, num_accepted,
        emitted, status, draft_probs, d2t, accepted_logprobs, filters=filters,
        values=index_values(stream_h) if check_indices else None)
    dev = lg.device
    T, V = lg.shape
    B = cq.shape[0] - 1
    W = em.shape[1]
    Vd = dp.shape[1] if draft_probs is not None else 0
    ws = DeviceArg("workspace", workspace, device=dev, contiguous=True)
    need = _workspace_bytes(T, V)
    have = ws.numel * ws.itemsize
    if have < need:
        raise ValueError(f"workspace: {have} bytes, this call needs {need} "
                         f"(spec_sample_workspace_size({T}, {V}))")
    if ws.ptr % 16:
        raise ValueError(f"workspace: must be 16-byte aligned (ptr % 16 = {ws.ptr % 16})")
    if B == 0:
        return num_accepted, emitted, status
    num_tiles = -(-V // TILE)
    from .. import _sampling
    path = sample_path(lg.dtype, draft_probs is None, V, dev, T)
    name = _KERNEL_DTYPES[lg.dtype]
    if path in ("small", "rows"):     # one cluster launch (+ the chain), as each plan says
        small = path == "small"
        if small:
            tpc, cluster, smem = small_plan(T, num_tiles, runtime.sm_count(dev))
        else:
            tpc, cluster, smem = rows_plan(num_tiles)
        pdl = use_pdl(dev)
        _sampling.launch_spec_sample_rows(
            runtime.kernel("sampling", f"spec_sample_{path}_{name}", dev),
            runtime.kernel("sampling", "spec_sample_chain_pre" if small else "spec_sample_chain",
                           dev), stream_h,
            lg.ptr, cq.ptr, di.ptr, tp.ptr, tk.ptr, pp.ptr, mp.ptr, sd.ptr, st.ptr,
            na.ptr, em.ptr, ss.ptr, lp.ptr, ws.ptr, lg.strides[0], em.strides[0],
            lp.strides[0] if accepted_logprobs is not None else 0,
            T, B, V, num_tiles, tpc, cluster, smem, W, filters is None or bool(filters),
            pdl, pdl and small)    # the small kernel's own launch goes out with PDL too
        return num_accepted, emitted, status
    tiles_per_cta = _tiles_per_cta(T, num_tiles, runtime.sm_count(dev))
    ks = [runtime.kernel("sampling", f"spec_sample_{stage}_{name}", dev)
          for stage in ("tiles", "threshold", "finish")]
    # 16-bit logits: the filters in one exact-value histogram launch (no recount)
    k_hist = runtime.kernel("sampling", f"spec_sample_hist_{name}", dev) if name != "f32" else None
    _sampling.launch_spec_sample(
        *ks, stream_h, lg.ptr, cq.ptr, di.ptr, tp.ptr, tk.ptr, pp.ptr, mp.ptr, sd.ptr,
        st.ptr, dp.ptr, dm.ptr, na.ptr, em.ptr, ss.ptr, lp.ptr, ws.ptr,
        lg.strides[0], dp.strides[0] if draft_probs is not None else 0, em.strides[0],
        lp.strides[0] if accepted_logprobs is not None else 0,
        T, B, V, Vd, num_tiles, tiles_per_cta, W, filters is None or bool(filters),
        (_hist_ctas if k_hist is not None else _threshold_ctas)(T, V, runtime.sm_count(dev)), k_hist,
        use_pdl(dev))
    return num_accepted, emitted, status
