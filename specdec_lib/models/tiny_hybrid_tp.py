"""Tensor-parallel shard of the demo target (Megatron-style head sharding).

``TinyHybridTargetTP(config, tensors, backend, rank, world_size, all_reduce)`` is a
``TinyHybridTarget`` built from a *local* config (this rank's head counts) and a view
of the checkpoint that hands out this rank's slices; the model's math is the parent
class's, unchanged. The only TP step is ``_reduce``: each layer's output projection
(attention ``o_proj``, GDN ``out_proj``) gives this rank's partial sum over its heads,
and ``all_reduce`` (host supplied: NCCL through torch.distributed, or a fake in the
tests) sums it over the ranks before the residual add. Everything else -- embedding,
norms, lm_head, the MTP draft -- is replicated, so every rank ends the forward pass
with the same hidden states and logits (bitwise, provided ``all_reduce`` returns the
same sum on every rank, as NCCL's ring and tree all-reduce do), and every rank can
run spec_sample and the sequence ops on its own copy.

Which heads rank ``r`` of ``n`` holds (contiguous ranges, so the local GQA/GVA maps
``head // group`` stay right):

* attention: query heads ``[r*Hq/n, (r+1)*Hq/n)`` and the KV heads they read
  (``h // (Hq/Hkv)``): ``Hkv/n`` of them when ``n`` divides ``Hkv``, else one KV head
  replicated on ``n/Hkv`` ranks (needs ``Hkv`` to divide ``n``). ``q_proj``/``k_proj``/
  ``v_proj``: those heads' output rows; ``o_proj``: the query heads' input columns.
* GDN: value heads ``[r*Hv/n, (r+1)*Hv/n)`` and the key heads they read
  (``h // (Hv/Hk)``), split or replicated the same way. ``in_proj_qkv`` and
  ``conv1d.weight``: the q rows and k rows of those key heads and the v rows of those
  value heads (in the q | k | v channel order of the conv); ``in_proj_ba``: the b rows
  and the a rows of the value heads; ``A_log``, ``dt_bias``: the value heads' entries;
  ``out_proj``: the value heads' input columns. Each rank keeps the recurrent and conv
  state of its own heads/channels only.
"""
from __future__ import annotations

import re

import numpy as np

from .tiny_hybrid import DEMO_CONFIG, TinyHybridTarget

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(self_attn|linear_attn)\.(.+)$")


def _split(total_heads, reader_heads, rank, world_size, what):
    """(start, count) of the heads read by this rank's share of ``reader_heads``."""
    if reader_heads % world_size:
        raise ValueError(f"{what}: {reader_heads} heads do not split over {world_size} ranks")
    per = reader_heads // world_size
    group = reader_heads // total_heads
    if total_heads % world_size == 0:
        count = total_heads // world_size
    elif world_size % total_heads == 0:
        count = 1                    # fewer heads than ranks: each rank holds one copy
    else:
        raise ValueError(f"{what}: {total_heads} heads neither split over nor replicate "
                         f"onto {world_size} ranks")
    return (rank * per) // group, count


def tp_layout(config, rank: int, world_size: int) -> dict:
    """This rank's head ranges: {name: (start, count)} for q, kv, key (GDN k), value."""
    c = dict(DEMO_CONFIG, **config)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank} outside 0..{world_size - 1}")
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    out = {}
    kv0, nkv_l = _split(nkv, nq, rank, world_size, "attention")
    out["q"] = (rank * (nq // world_size), nq // world_size)
    out["kv"] = (kv0, nkv_l)
    k0, hk_l = _split(hk, hv, rank, world_size, "linear attention")
    out["value"] = (rank * (hv // world_size), hv // world_size)
    out["key"] = (k0, hk_l)
    return out


def tp_local_config(config, rank: int, world_size: int) -> dict:
    """The config a rank's ``TinyHybridTarget`` sees: the same model with its head counts."""
    lay = tp_layout(config, rank, world_size)
    return dict(config, num_attention_heads=lay["q"][1], num_key_value_heads=lay["kv"][1],
                linear_num_key_heads=lay["key"][1], linear_num_value_heads=lay["value"][1])


def tp_config(world_size: int, config=None) -> dict:
    """``config`` (default: the demo's) with KV heads and GDN key heads raised to a multiple
    of ``world_size`` where they are not (group sizes kept), so that every head kind
    splits evenly. The demo config (Hkv = Hk = 1) becomes Hq 4 / Hkv 2, Hk 2 / Hv 4 at 2."""
    c = dict(DEMO_CONFIG, **(config or {}))
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    if nkv % world_size:
        n = nkv * world_size // np.gcd(nkv, world_size)
        c["num_key_value_heads"], c["num_attention_heads"] = n, n * (nq // nkv)
    if hk % world_size:
        n = hk * world_size // np.gcd(hk, world_size)
        c["linear_num_key_heads"], c["linear_num_value_heads"] = n, n * (hv // hk)
    for key in ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads",
                "linear_num_value_heads"):
        c[key] = int(c[key])
    return c


def shard_weight(name: str, array, config, rank: int, world_size: int) -> np.ndarray:
    """This rank's slice of the target tensor ``name`` (float32, contiguous); tensors
    outside the sharded layers come back whole (replicated)."""
    a = np.asarray(array, dtype=np.float32)
    m = _LAYER.match(name)
    if m is None:
        return a
    c = dict(DEMO_CONFIG, **config)
    lay = tp_layout(c, rank, world_size)
    kind, leaf = m.group(2), m.group(3)
    if kind == "self_attn":
        D = c["head_dim"]
        (q0, nq), (k0, nk) = lay["q"], lay["kv"]
        if leaf == "q_proj.weight":
            return np.ascontiguousarray(a[q0 * D:(q0 + nq) * D])
        if leaf in ("k_proj.weight", "v_proj.weight"):
            return np.ascontiguousarray(a[k0 * D:(k0 + nk) * D])
        if leaf == "o_proj.weight":
            return np.ascontiguousarray(a[:, q0 * D:(q0 + nq) * D])
    else:
        hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        (k0, nk), (v0, nv) = lay["key"], lay["value"]
        if leaf in ("in_proj_qkv.weight", "conv1d.weight"):      # channels q | k | v
            qk = hk * dk
            rows = np.concatenate([np.arange(k0 * dk, (k0 + nk) * dk),
                                   qk + np.arange(k0 * dk, (k0 + nk) * dk),
                                   2 * qk + np.arange(v0 * dv, (v0 + nv) * dv)])
            return np.ascontiguousarray(a[rows])
        if leaf == "in_proj_ba.weight":                           # b rows | a rows
            rows = np.concatenate([np.arange(v0, v0 + nv), hv + np.arange(v0, v0 + nv)])
            return np.ascontiguousarray(a[rows])
        if leaf in ("A_log", "dt_bias"):
            return np.ascontiguousarray(a[v0:v0 + nv])
        if leaf == "out_proj.weight":
            return np.ascontiguousarray(a[:, v0 * dv:(v0 + nv) * dv])
    raise KeyError(f"{name}: no sharding rule for this tensor")


class _Shard:
    """What ``TinyHybridTarget`` reads from a checkpoint entry: ``float32()``."""

    def __init__(self, fn):
        self._fn = fn

    def float32(self):
        return self._fn()


class ShardedTensors:
    """A read-only view of a checkpoint (name -> LazyTensor, or name -> array) that hands
    out this rank's slice of each target tensor."""

    def __init__(self, tensors, config, rank, world_size):
        self._t, self._c, self._r, self._n = tensors, config, rank, world_size

    def __contains__(self, name):
        return name in self._t

    def __getitem__(self, name):
        src = self._t[name]

        def load():
            a = src.float32() if hasattr(src, "float32") else np.asarray(src, np.float32)
            return shard_weight(name, a, self._c, self._r, self._n)
        return _Shard(load)


class TinyHybridTargetTP(TinyHybridTarget):
    """Rank ``rank`` of ``world_size`` of the demo target; same interface as the parent
    (``reset``, ``forward``, ``commit``, ``flush``, ``hidden_size``; ``fused_state``), full-size
    hidden and logits.

    ``all_reduce(partial) -> summed``: float64 array [T, H] of this rank's partial layer
    output -> the sum over ranks (may work in place and return its argument); it must
    give the same result on every rank and be ordered with the array module's stream.
    """

    def __init__(self, config, tensors, backend, rank: int, world_size: int, all_reduce, *,
                 fused_state=True):
        self.rank, self.world_size = int(rank), int(world_size)
        self.full_config = dict(config)
        self.layout = tp_layout(config, self.rank, self.world_size)
        self._all_reduce = all_reduce
        super().__init__(tp_local_config(config, self.rank, self.world_size),
                         ShardedTensors(tensors, config, self.rank, self.world_size), backend,
                         fused_state=fused_state)

    def _reduce(self, partial):
        return self._all_reduce(partial)
