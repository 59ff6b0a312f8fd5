"""verify_attention and rope_append_kv on the GPU (kernels: cuda_src/attention/
verify_attention.cu, rope_append_kv.cu).

The launch plan (rows per CTA, KV splits, shared memory) is computed here, in one place,
from host-known sizes only, so a call can be captured in a CUDA graph: the split count
depends on the batch, the KV heads, the context bound ``max_kv_len`` (default: what the
page table can address) and the SM count, never on the device-side ``seq_lens``.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional, Tuple

from .. import runtime
from .._validate import as_stream
from ..contract import attention as contract
from ..contract import index_values
from ..contract.attention import MAX_Q_PER_SEQ, MAX_SPLITS  # noqa: F401 (public here too)
from ._types import ArrayLike, Stream


# --- must agree with cuda_src/attention/attention_params.h and verify_attention.cu
_THREADS = 128
_WARPS = _THREADS // 32
_EPILOGUE_SMEM = 4 * 16 * 72 * 4 + 2 * 4 * 16 * 4
_TILE_KEYS = {64: 64, 128: 64, 256: 32}

MAX_BATCH = 65535               # sequences per call: the batch is gridDim.y
_STATIC_SMEM = 1024             # bound on the kernels' static smem (page-id ring, flags)
_STATIC_SMEM_KV8 = 5120         # the same for verify_attention_kv8 (its ring of row offsets)
_MAX_AUTO_SPLITS = 64           # the automatic plan's cap (B=1 L=4096 D=256: 64 best of 1..64)
_CTAS_PER_SM = 2                # resident attention CTAs per SM the split count aims for

_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}   # kernel name suffixes

# The sm_90 small-batch path (verify_attention_cluster_*, issue 31): one launch, a
# thread-block cluster of KV splits per (sequence, KV head, m-group), merged on chip.
_CLUSTER_MAX = 16               # CTAs per cluster (non-portable; 8 where 16 cannot be resident)
_CLUSTER_PORTABLE = 8
# automatic plan: at most this many KV tiles per cluster CTA at max_kv_len, i.e. a page
# table spanning <= 16 x 4 tiles (4096 keys at D <= 128, 2048 at D = 256). The kernel splits
# the actual L + q over its CTAs, so a table sized for growth (bench round_b1: 2032 keys for
# L = 1000) costs the tiles of L, not of the bound. The latency model (PERF_HISTORY
# "verify_attention at batch 1: the cluster path") prices each tile past the first at
# 0.5-1.6 us: 4 tiles ~5.5-9 us at worst, against a split-KV + merge path that measured
# >= 14.6 us at those bounds (PERF.md s16). Revisit with the bench's forced-cluster rows.
_CLUSTER_MAX_TILES = 4
_CLUSTER_PT_STAGE = 1024        # VERIFY_ATTN_CLUSTER_PT_STAGE: page-table entries in smem
CLUSTER_ENV = "SPECDEC_VERIFY_ATTN_CLUSTER"
# "cluster": None = $SPECDEC_VERIFY_ATTN_CLUSTER ("1" force wherever it can run, "0" off,
# unset/"auto" the automatic plan); True / False force it on / off (tests, benchmarks).
# It can run on sm_90 code, 16-bit caches, an automatic split count (num_splits=None) and
# row_invariant=False; "auto" takes it where the split plan would have needed >= 2 splits
# and the CTAs hold <= _CLUSTER_MAX_TILES tiles at max_kv_len.
# "cluster_m_split": the cluster plan puts each 16-row m-tile in its own CTA (warps_m 1,
# m_groups = m-tiles) where the grid stays within one CTA an SM, instead of up to 4 m-tiles a
# CTA: more SMs for a small grid, each with a share of the rows' epilogue. H200, s22, B=1 q=4
# 16/2 D=256: L=512 13.01 -> 10.91 us, L=1000 12.79 -> 11.16 (32 -> 64 CTAs), round_b1 915.6
# -> 895.1 us. False: up to 4 m-tiles a CTA, as before.
TUNING = {"cluster": None, "cluster_m_split": True}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _stages(family: int) -> int:
    return 3 if family >= 80 else 1


def verify_attention_smem_bytes(head_dim: int, family: int) -> int:
    """Dynamic shared memory of one verify_attention CTA on code family 75/80/90."""
    ring = _stages(family) * 2 * _TILE_KEYS[head_dim] * head_dim * 2
    return max(ring, _EPILOGUE_SMEM)


def verify_attention_kv8_smem_bytes(head_dim: int, family: int, fmt: str = None,
                                    warps_m: int = 4) -> int:
    """Dynamic shared memory of one verify_attention_kv8 CTA (8-bit caches) for a plan of
    ``warps_m`` m-tiles: the 8-bit ring (int8 at D = 128 on sm_80+: two stages, not three),
    int8's (scale, zero) ring and, at D = 128 on sm_80+, the Q fragments (16 rows x D
    halves per m-tile; verify_attention_kv8.cu's Tile; the tiles are dequantised in
    registers). ``fmt=None``: the larger of "fp8" and "int8"."""
    if fmt is None:
        return max(verify_attention_kv8_smem_bytes(head_dim, family, f, warps_m)
                   for f in ("fp8", "int8"))
    keys, st = _TILE_KEYS[head_dim], _stages(family)
    q_smem = head_dim == 128 and st > 1
    if fmt == "int8" and q_smem:
        st = 2
    need = st * 2 * keys * head_dim + (st * 2 * keys * 8 if fmt == "int8" else 0)
    if q_smem:
        need += warps_m * 16 * head_dim * 2
    return max(need, _EPILOGUE_SMEM)


@dataclass(frozen=True)
class VerifyAttentionPlan:
    warps_m: int        # 16-row m-tiles per CTA (1, 2 or 4); 4 // warps_m warps split each KV tile
    m_groups: int       # CTAs along the packed-row axis per (sequence, KV head)
    num_splits: int     # KV splits (grid.z); 1 = no partial buffers, no merge
    kv_chunk: int       # keys per split, a multiple of the KV tile
    max_q: int          # block rows per sequence the grid covers
    cluster: bool = False   # sm_90 one-launch path: num_splits = CTAs per cluster, no workspace

    def workspace_bytes(self, num_tokens: int, num_qo_heads: int, head_dim: int) -> int:
        if self.num_splits <= 1 or self.cluster:
            return 0
        rows = self.num_splits * num_tokens * num_qo_heads
        return _lse_offset(rows, head_dim) + rows * 4


def _lse_offset(rows: int, head_dim: int) -> int:
    return (rows * head_dim * 4 + 255) // 256 * 256


def cluster_smem_bytes(head_dim: int, warps_m: int, cluster: int) -> int:
    """Dynamic shared memory of one verify_attention_cluster CTA (sm_90): the 3-stage ring
    (or the all-columns epilogue, whichever is larger), the receive buffer (per source CTA a
    log2 LSE and ceil(D/4 / cluster) float4 column groups per packed row, 16 x warps_m), and
    the staged page-table prefix."""
    ring = verify_attention_smem_bytes(head_dim, 90)
    epi = _WARPS * 16 * (head_dim + 8) * 4 + 2 * _WARPS * 16 * 4
    rows = 16 * warps_m
    own = _cdiv(head_dim // 4, cluster)
    return max(ring, epi) + cluster * rows * 4 + cluster * rows * own * 16 + _CLUSTER_PT_STAGE * 4


def _cluster_plan(batch_size, num_kv_heads, warps_m, m_groups, head_dim, max_q, max_kv_len,
                  sm_count, mode, max_cluster):
    """The cluster path's plan (num_splits = cluster size, kv_chunk = tiles per CTA x tile),
    or None where ``mode`` is "auto" and it does not apply (see TUNING)."""
    tile = _TILE_KEYS[head_dim]
    n_tiles = _cdiv(max(int(max_kv_len), 1), tile)
    ctas = max(batch_size * num_kv_heads * m_groups, 1)
    c = max(1, min(max_cluster, n_tiles, (_CTAS_PER_SM * sm_count) // ctas))
    tpc = _cdiv(n_tiles, c)
    c = _cdiv(n_tiles, tpc)
    # c = 1 (one KV tile, a full GPU, or max_cluster 1) takes the split-KV path even when
    # forced: compute-sanitizer's memcheck refuses st.async into a one-CTA cluster (s20)
    if c < 2 or (mode == "auto" and tpc > _CLUSTER_MAX_TILES):
        return None
    return VerifyAttentionPlan(warps_m, m_groups, c, tpc * tile, max_q, cluster=True)


@functools.lru_cache(maxsize=512)
def plan_verify_attention(batch_size, num_kv_heads, group, head_dim, max_q, max_kv_len,
                          sm_count, num_splits=None, row_invariant=False, cluster="off",
                          max_cluster=_CLUSTER_MAX, m_split=False) -> VerifyAttentionPlan:
    """The launch plan: pure function of host-known sizes (see the module docstring),
    cached per shape (a decode loop calls with the same sizes every round).

    Packed rows ``max_q * group`` go 16 per warp m-tile, up to 4 m-tiles per CTA. Splits
    are added until batch x KV heads x m-groups x splits fills ``_CTAS_PER_SM`` CTAs per
    SM, keeping at least one KV tile per split; ``num_splits`` overrides.
    ``row_invariant``: one m-tile per CTA (the four warps split every KV tile, as for a
    q = 1 call) and the split count of a q = 1 call, so no row's arithmetic depends on q.
    ``cluster`` ("off", "auto", "force"; the caller passes "off" unless sm_90 code and a
    16-bit cache): the one-launch cluster plan (``plan.cluster``) of at most
    ``max_cluster`` CTAs, for an automatic split count without ``row_invariant`` only;
    ``m_split``: one m-tile per cluster CTA where the grid then holds <= one CTA an SM.
    """
    n_mtiles = max(1, _cdiv(max_q * group, 16))
    warps_m = 1 if n_mtiles == 1 or row_invariant else 2 if n_mtiles == 2 else 4
    m_groups = _cdiv(n_mtiles, warps_m)
    if cluster in ("auto", "force") and num_splits is None and not row_invariant:
        cp = None
        if m_split and n_mtiles > 1:
            cp = _cluster_plan(batch_size, num_kv_heads, 1, n_mtiles, head_dim, max_q,
                               max_kv_len, sm_count, cluster, max_cluster)
            if cp is not None and batch_size * num_kv_heads * n_mtiles * cp.num_splits > sm_count:
                cp = None
        if cp is None:
            cp = _cluster_plan(batch_size, num_kv_heads, warps_m, m_groups, head_dim, max_q,
                               max_kv_len, sm_count, cluster, max_cluster)
        if cp is not None:
            return cp
    tile = _TILE_KEYS[head_dim]
    max_kv_len = max(int(max_kv_len), 1)
    if num_splits is None:
        ctas = max(batch_size * num_kv_heads * (1 if row_invariant else m_groups), 1)
        target = _CTAS_PER_SM * sm_count
        # down to one KV tile per split: at B=1 q=4 (H200, bench verify_attention_b1) one
        # tile per split beat 256 keys per split by 1.2-1.6x at L <= 1000 and was never slower
        # (more than _MAX_AUTO_SPLITS was not measured to pay: the merge reads every split)
        splits = 1 if ctas >= target else min(_cdiv(target, ctas), _MAX_AUTO_SPLITS)
    else:
        splits = num_splits
    splits = max(1, min(splits, MAX_SPLITS, _cdiv(max_kv_len, tile)))
    chunk = _cdiv(_cdiv(max_kv_len, splits), tile) * tile
    splits = _cdiv(max_kv_len, chunk)
    return VerifyAttentionPlan(warps_m, m_groups, splits, chunk, max_q)


def verify_attention_workspace_size(num_tokens, num_qo_heads, num_kv_heads, head_dim, batch_size,
                                    max_kv_len, *, max_q=None, num_splits=None, row_invariant=False,
                                    device=0) -> int:
    """Bytes of the ``workspace`` that ``verify_attention`` needs for these sizes (0 when
    the plan has a single split). Pass the same ``max_kv_len`` / ``num_splits`` /
    ``row_invariant`` to the op and a ``max_q`` no larger (``max_kv_len`` defaults there to
    ``max_pages * page_size``; ``max_q`` to ``min(num_tokens, 16)``). Allocate once
    for the largest shapes a captured graph will see. The size is the split-KV plan's even
    where the op takes the sm_90 cluster path (which needs none), so one buffer serves both
    settings of ``TUNING["cluster"]``. It covers every ``max_q`` up to the one given: a
    smaller bound plans fewer m-tiles a CTA and so may split the KV more (a decode loop
    passing each round's longest block, as the orchestrator does, needs one buffer)."""
    if max_q is None:
        max_q = min(num_tokens, MAX_Q_PER_SEQ)
    sms, group = runtime.sm_count(device), num_qo_heads // num_kv_heads

    def need(mq):
        plan = plan_verify_attention(batch_size, num_kv_heads, group, head_dim, mq, max_kv_len,
                                     sms, num_splits, bool(row_invariant))
        return plan.workspace_bytes(num_tokens, num_qo_heads, head_dim)
    return max(need(mq) for mq in range(1, max(int(max_q), 1) + 1))


def cluster_mode() -> str:
    """The cluster path's switch: "off", "auto" or "force" (TUNING["cluster"], else
    $SPECDEC_VERIFY_ATTN_CLUSTER)."""
    on = TUNING["cluster"]
    if on is not None:
        return "force" if on else "off"
    env = os.environ.get(CLUSTER_ENV, "").strip().lower()
    if env in ("", "auto"):
        return "auto"
    if env in ("1", "on", "force"):
        return "force"
    if env in ("0", "off"):
        return "off"
    raise ValueError(f"{CLUSTER_ENV}={env!r}: expected 1, 0 or auto")


_cluster_cache: dict = {}   # (device, dtype tag, D, warps_m) -> (kernel, max cluster size)


def _cluster_setup(dev, tag, D, warps_m):
    """The cluster kernel and the largest cluster it may use on ``dev``: 16 where the driver
    can make a 16-CTA cluster resident with the largest receive buffer of these rows (a GPC
    with fewer free SMs would refuse the launch), else the portable 8. Looked up once."""
    key = (dev, tag, D, warps_m)
    hit = _cluster_cache.get(key)
    if hit is None:
        kern = runtime.kernel("attention", f"verify_attention_cluster_d{D}_{tag}", dev)
        smem = cluster_smem_bytes(D, warps_m, _CLUSTER_MAX)
        kern.set_max_dynamic_smem(smem)
        kern.allow_large_clusters()
        fits = kern.max_active_clusters(_CLUSTER_MAX, _THREADS, smem, _CLUSTER_MAX) >= 1
        hit = (kern, _CLUSTER_MAX if fits else _CLUSTER_PORTABLE)
        _cluster_cache[key] = hit
    return hit


def choose_plan(dev, tag, head_dim, batch_size, num_kv_heads, group, max_q, max_kv_len,
                num_splits=None, row_invariant=False, has_workspace=True, kv8=False):
    """(plan, cluster kernel or None) that verify_attention takes for these sizes on device
    ``dev`` (dtype tag "f16" / "bf16"): the cluster plan where cluster_mode() and the code
    family allow it and plan_verify_attention picks it, else the split-KV plan (one split
    without a workspace)."""
    family = runtime.arch_family(dev)
    sms = runtime.sm_count(dev)
    mode = "off"
    if family >= 90 and not kv8 and num_splits is None and not row_invariant:
        mode = cluster_mode()
    if mode != "off":
        m_split = bool(TUNING["cluster_m_split"])
        plan = plan_verify_attention(batch_size, num_kv_heads, group, head_dim, max_q, max_kv_len,
                                     sms, None, False, mode, _CLUSTER_MAX, m_split)
        if plan.cluster:   # only then is the cluster kernel looked up
            kern, max_cluster = _cluster_setup(dev, tag, head_dim, plan.warps_m)
            if plan.num_splits > max_cluster:
                plan = plan_verify_attention(batch_size, num_kv_heads, group, head_dim, max_q,
                                             max_kv_len, sms, None, False, mode, max_cluster,
                                             m_split)
            if plan.cluster:
                return plan, kern
    if not has_workspace:
        num_splits = 1
    return plan_verify_attention(batch_size, num_kv_heads, group, head_dim, max_q, max_kv_len,
                                 sms, num_splits, bool(row_invariant)), None


def _debug_default():
    return os.environ.get("SPECDEC_DEBUG", "").strip() not in ("", "0")


_launch_cache: dict = {}   # (device, dtype tag, D[, "kv8"]) -> (family, sm_count, smem, merge kernel)


def _launch_setup(dev, tag, D, kv8=False):
    """Per (device, dtype, head dim, cache kind): code family, SM count, dynamic smem and the
    merge kernel, looked up once (the host path runs every decode round)."""
    key = (dev, tag, D, "kv8") if kv8 else (dev, tag, D)
    hit = _launch_cache.get(key)
    if hit is None:
        family = runtime.arch_family(dev)
        smem = (verify_attention_kv8_smem_bytes if kv8 else verify_attention_smem_bytes)(D, family)
        static = _STATIC_SMEM_KV8 if kv8 else _STATIC_SMEM
        optin = runtime.device_props(dev)["smem_optin"]
        if smem + static > optin:
            raise ValueError(f"q: head dim {D} needs {smem + static} bytes of shared "
                             f"memory per block, device {dev} allows {optin}")
        merge = runtime.kernel("attention", f"verify_attention_merge_{tag}", dev)
        hit = (family, runtime.sm_count(dev), smem, merge)
        _launch_cache[key] = hit
    return hit


def _aligned(name, a, elems=8):
    """Other strides than the (contiguous) head dim's and the base 16-byte aligned (16-byte
    vector I/O)."""
    st = a.strides
    if a.ptr % 16 or any(s % elems for s, n in zip(st[:-1], a.shape[:-1]) if n > 1):
        raise ValueError(f"{name}: data pointer and strides must be 16-byte aligned "
                         f"(ptr % 16 = {a.ptr % 16}, strides {a.strides} elements)")


def verify_attention(q: ArrayLike, k_cache: ArrayLike, v_cache: ArrayLike, page_table: ArrayLike,
                     seq_lens: ArrayLike, cu_q: ArrayLike, out: ArrayLike,
                     scale: Optional[float] = None, lse_out: Optional[ArrayLike] = None, *,
                     workspace: Optional[ArrayLike] = None, num_splits: Optional[int] = None,
                     max_kv_len: Optional[int] = None, max_q: Optional[int] = None,
                     row_invariant: bool = False, check_indices: Optional[bool] = None,
                     stream: Stream = None, k_scale: Optional[ArrayLike] = None,
                     v_scale: Optional[ArrayLike] = None, k_params: Optional[ArrayLike] = None,
                     v_params: Optional[ArrayLike] = None):
    """Paged block-verification attention of one speculative round.

    q ``[T, Hq, D]`` (float16; bfloat16 on sm_80+), k_cache / v_cache
    ``[num_pages, page_size, Hkv, D]`` (q's dtype; page size a power of two 1..256),
    page_table ``[B, max_pages]`` int32, seq_lens ``[B]`` int32 committed lengths L,
    cu_q ``[B+1]`` int32 block offsets (at most 16 rows per sequence), out ``[T, Hq, D]``
    (q's dtype), lse_out ``[T, Hq]`` float32 natural-log LSE (optional).
    Row i of sequence b (token ``cu_q[b]+i``) sits at position ``L[b]+i`` and attends
    keys ``0 .. L[b]+i`` (its own K/V already appended). ``Hq % Hkv == 0``, group <= 16,
    D in {64, 128, 256}; every head dimension contiguous, other strides free (16-byte
    aligned). Sequences with no block rows write nothing.

    ``workspace``: device buffer of at least ``verify_attention_workspace_size(...)``
    bytes for the split-KV partial results; without it the op runs unsplit (correct,
    but a small batch at long context then uses few SMs). On sm_90 code with a 16-bit
    cache, a small batch at a short context (``TUNING["cluster"]``) takes a one-launch path
    instead, with or without a workspace: the KV splits of each head are a thread-block
    cluster whose CTAs merge on chip (no workspace, no merge launch; same results within
    rounding). ``num_splits`` forces a split
    count, ``max_kv_len`` bounds L+q (default ``max_pages * page_size``; longer
    sequences are still right, their last split just does more work), ``max_q`` bounds
    the rows per sequence (default ``min(T, 16)``; a sequence with more is left
    unwritten; pass the longest block, as the orchestrator does: the plan then packs
    fewer m-tiles a CTA, and an fp8 cache at D = 128 runs four CTAs an SM, 1.25x faster at
    B=64 q=4 on an H100; int8 at D = 128 runs four at any bound). ``row_invariant=True``
    gives every row the bits it has in a one-row (q = 1) call at any block size: by default
    a block of more than 16 packed rows (q x group) shares each CTA's four warps between
    m-tiles, which changes how a row's keys are split between the warps and so its last
    bits; this plan keeps one m-tile per CTA (more CTAs, each reading the KV tiles: slower
    at large batches). ``check_indices`` (default: env
    ``SPECDEC_DEBUG``) copies cu_q / seq_lens / page_table to the host and raises
    ValueError on bad offsets, a page table too narrow for L+q, or page ids outside the
    pool; without it the kernel never faults on such input but writes NaN for the affected
    sequence/head rows.
    8-bit caches (``specdec_lib.reference.kvquant``): fp8 (uint8 bits or
    torch.float8_e4m3fn) with ``k_scale`` / ``v_scale`` float32 ``[Hkv]`` or ``[1]``, or int8
    with ``k_params`` / ``v_params`` float32 ``[num_pages, page_size, Hkv, 2]`` (as written
    by ``append_kv``); dequantised after the load, same plans (splits, row_invariant).
    Returns ``out``.

    Example::

        ws = DeviceArray.empty((verify_attention_workspace_size(T, 32, 8, 128, B,
                                 max_pages * 16),), "uint8")
        verify_attention(q, kc, vc, pt, L, cu_q, out, lse_out=lse, workspace=ws)
    """
    stream_h = as_stream(stream)
    if check_indices is None:
        check_indices = _debug_default()
    (qa, kc, vc, pt, sl, cq, oa, la, ws, scale, max_q, max_kv_len, num_splits,
     ks, vs, kp, vp) = contract.verify_attention(
        q, k_cache, v_cache, page_table, seq_lens, cu_q, out, scale, lse_out,
        workspace=workspace, num_splits=num_splits, max_kv_len=max_kv_len, max_q=max_q,
        k_scale=k_scale, v_scale=v_scale, k_params=k_params, v_params=v_params, kv8=True,
        values=index_values(stream_h) if check_indices else None)
    fmt = "fp8" if ks is not None else "int8" if kp is not None else None
    dev = qa.device
    T, Hq, D = qa.shape
    num_pages, page_size, Hkv = kc.shape[0], kc.shape[1], kc.shape[2]
    B, max_pages = pt.shape
    tag = "f16" if qa.dtype == "float16" else "bf16"
    family, sms, smem, merge = _launch_setup(dev, tag, D, fmt is not None)
    if qa.dtype == "bfloat16" and family < 80:
        raise TypeError("q: bfloat16 verify_attention needs sm_80 or newer (this device runs the "
                        "sm_75 code path, which has no bf16 tensor cores); use float16")
    for a in (qa, oa):
        _aligned(a.name, a)
    for a in (kc, vc):
        _aligned(a.name, a, 16 if fmt is not None else 8)
    if B > MAX_BATCH:
        raise ValueError(f"page_table: {B} sequences, at most {MAX_BATCH} per call")
    if T == 0 or B == 0:
        return out

    group = Hq // Hkv
    plan, ckern = choose_plan(dev, tag, D, B, Hkv, group, max_q, max_kv_len, num_splits,
                              row_invariant, workspace is not None, fmt is not None)
    partial_o = partial_lse = 0
    if plan.num_splits > 1 and not plan.cluster:   # the cluster path needs no workspace
        need = plan.workspace_bytes(T, Hq, D)
        have = ws.numel * ws.itemsize
        if have < need:
            raise ValueError(f"workspace: {have} bytes, this call needs {need} "
                             f"({plan.num_splits} KV splits); size it with "
                             "verify_attention_workspace_size(...)")
        if ws.ptr % 256:
            raise ValueError(f"workspace: must be 256-byte aligned (ptr % 256 = {ws.ptr % 256})")
        partial_o = ws.ptr
        partial_lse = ws.ptr + _lse_offset(plan.num_splits * T * Hq, D)

    from .. import _attention
    if fmt is not None:   # the plan's own Q space (D = 128: warps_m m-tiles)
        smem = verify_attention_kv8_smem_bytes(D, family, fmt, plan.warps_m)
    # the launch arguments both launchers take (the 8-bit one adds the scales after them)
    args = (merge, Hkv * plan.m_groups, smem, stream_h,
            (qa.ptr, kc.ptr, vc.ptr, pt.ptr, sl.ptr, cq.ptr, oa.ptr, la.ptr, partial_o, partial_lse),
            (qa.strides[0], qa.strides[1]), (kc.strides[0], kc.strides[1], kc.strides[2]),
            (vc.strides[0], vc.strides[1], vc.strides[2]), (oa.strides[0], oa.strides[1]),
            (la.strides[0], la.strides[1]) if lse_out is not None else (0, 0),
            pt.strides[0], scale * 1.4426950408889634, T, B, Hq, Hkv, D,
            page_size.bit_length() - 1, num_pages, max_pages, max_q, plan.warps_m, plan.num_splits,
            plan.kv_chunk)
    if fmt is not None:
        kern = runtime.kernel("verify_attention_kv8", f"verify_attention_kv8_d{D}_{tag}_{fmt}", dev)
        kern.set_max_dynamic_smem(smem)
        _attention.launch_verify_attention_kv8(
            kern, *args,
            (ks.ptr if ks is not None else 0, vs.ptr if vs is not None else 0,
             kp.ptr if kp is not None else 0, vp.ptr if vp is not None else 0),
            0 if ks is None or ks.shape[0] == 1 else 1)
        return out
    if plan.cluster:
        csmem = cluster_smem_bytes(D, plan.warps_m, plan.num_splits)
        ckern.set_max_dynamic_smem(csmem)
        _attention.launch_verify_attention_cluster(ckern, *args[1:2], csmem, *args[3:])
        return out
    kern = runtime.kernel("attention", f"verify_attention_d{D}_{tag}", dev)   # makes dev current
    kern.set_max_dynamic_smem(smem)   # no-op unless static + dynamic exceeds the current limit
    _attention.launch_verify_attention(kern, *args)
    return out


_ROPE_APPEND_THREADS = 512     # rope_append_kv: kThreads, a token row's cap (one item a thread)
_ROPE_APPEND_CTA = 256         # rope_append_kv: short rows are stacked up to this many threads


def _stride_bits(a, itemsize):
    """OR of a DeviceArg's pointer and byte strides (dims of size 1 left out): 0 mod 16
    when every row start it holds is 16-byte aligned."""
    bits = a.ptr
    for st, n in zip(a.strides[:-1], a.shape[:-1]):
        if n > 1:
            bits |= st * itemsize
    return bits


def rope_append_kv(q: ArrayLike, k: ArrayLike, v: ArrayLike, positions: ArrayLike,
                   cos_sin_cache: ArrayLike, k_cache: ArrayLike, v_cache: ArrayLike,
                   page_table: ArrayLike, seq_lens: ArrayLike, cu_q: ArrayLike,
                   finished: Optional[ArrayLike] = None, *, check_indices: bool = True,
                   stream: Stream = None, k_scale: Optional[ArrayLike] = None,
                   v_scale: Optional[ArrayLike] = None, k_params: Optional[ArrayLike] = None,
                   v_params: Optional[ArrayLike] = None
                   ) -> Tuple[ArrayLike, ArrayLike, ArrayLike, ArrayLike]:
    """``rope(q, k, positions, cos_sin_cache)`` then ``append_kv(k, v, k_cache, v_cache,
    page_table, seq_lens, cu_q, finished)`` in one launch, bit for bit the two ops.

    q [T, Hq, D], k and v [T, Hkv, D]: float32/float16/bfloat16 (one dtype), head dim
    contiguous, token/head strides free (views of one fused qkv projection work); D even,
    at most 256. positions int32 [T], cos_sin_cache float32 [max_position, D] (see
    ``rope``). k_cache / v_cache [num_pages, page_size, Hkv, D] in k's dtype, page_table
    [B, max_pages] int32, seq_lens [B] int32, cu_q [B+1] int32, finished [B] uint8/bool
    or None (see ``append_kv``). Every row of q and k is rotated in place (a position
    outside [0, max_position) makes the token's heads NaN, as rope does); the rotated k and
    v of row i of sequence b go to position L[b] + i unless b is finished. Validation is
    both ops' (``check_indices`` as in append_kv). Returns (q, k, k_cache, v_cache).

    Example (a decoder layer, q/k/v views of ``qkv [T, (Hq + 2 Hkv) D]``)::

        rope_append_kv(q, k, v, positions, cos_sin, k_cache, v_cache, page_table, L, cu_q,
                       finished, check_indices=False, stream=s)
    """
    stream_h = as_stream(stream)
    qa, ka, va, kc, vc, pa, ca, pt, sl, cq, fin, ks, vs, kp, vp = contract.rope_append_kv(
        q, k, v, positions, cos_sin_cache, k_cache, v_cache, page_table, seq_lens, cu_q, finished,
        k_scale=k_scale, v_scale=v_scale, k_params=k_params, v_params=v_params, kv8=True,
        values=index_values(stream_h) if check_indices else None)
    if ks is not None or kp is not None:
        # TODO(issue 32): the fused rope_append_kv8 kernel; until then the unfused pair
        from .layers import rope
        from .copy import append_kv
        rope(q, k, positions, cos_sin_cache, stream=stream)
        append_kv(k, v, k_cache, v_cache, page_table, seq_lens, cu_q, finished,
                  check_indices=False, stream=stream, k_scale=k_scale, v_scale=v_scale,
                  k_params=k_params, v_params=v_params)
        return q, k, k_cache, v_cache
    T, Hq, D = qa.shape
    Hk = ka.shape[1]
    dev = qa.device
    if T == 0:
        return q, k, k_cache, v_cache
    B = pt.shape[0]
    num_pages, page_size = kc.shape[0], kc.shape[1]
    E = qa.itemsize
    V = 16 // E
    half = D // 2
    bits = ca.ptr
    for a in (qa, ka, va, kc, vc):
        bits |= _stride_bits(a, E)
    vectorize = half % V == 0 and bits % 16 == 0
    per_row = (Hq + Hk) * (half // V if vectorize else half) + Hk * (D // V if vectorize else D)
    # fewer token rows than SMs (decode): one item a thread, up to 512 (the kernel's two memory
    # trips, none serialised behind a thread's own stores); more (prefill): 256, whose 2 items a
    # thread keep 8 CTAs an SM (448 threads at T=8192 of Llama-8B's heads: 82 -> 91 us, s40)
    cap = _ROPE_APPEND_THREADS if T < runtime.sm_count(dev) else _ROPE_APPEND_CTA
    threads = min(cap, max(32, -(-per_row // 32) * 32))
    rows = max(1, _ROPE_APPEND_CTA // threads)
    grid = int(min(-(-T // rows), 2**31 - 1))
    kern = runtime.kernel("rope_append_kv", f"rope_append_kv_{_SHORT[qa.dtype]}", dev)
    from .. import _attention
    _attention.launch_rope_append_kv(
        kern, grid, threads, rows, stream_h,
        (qa.ptr, ka.ptr, va.ptr, kc.ptr, vc.ptr, pa.ptr, ca.ptr, pt.ptr, sl.ptr, cq.ptr, fin.ptr),
        (qa.strides[0], qa.strides[1]), (ka.strides[0], ka.strides[1]),
        (va.strides[0], va.strides[1]), (kc.strides[0], kc.strides[1], kc.strides[2]),
        (vc.strides[0], vc.strides[1], vc.strides[2]), pt.strides[0], ca.shape[0], T, B, Hq, Hk,
        D, page_size, num_pages, pt.shape[1], vectorize)
    return q, k, k_cache, v_cache
