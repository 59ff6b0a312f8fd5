"""Greedy agreement of a target over an 8-bit KV cache with the same model over a 16-bit one
(issue 32's end-to-end bar: >= 99% of positions over 32 prompts, and where they diverge).

    scored = teacher_forced(target, prompts, replies)       # per request: argmax, top-2, ...
    report = agreement(base_replies, base_scored, replies, scored)

``teacher_forced`` runs a target over given sequences (prompt + reply) the way decoding runs
it: the prompt but its last token through ``target.prefill`` (what the decoder's prefill
commits), then ``[prompt[-1]] + reply[:-1]`` through ``target.forward`` in verify blocks of
up to 16 rows per sequence, every request of the list in one batch. Row i of that feed
predicts ``reply[i]`` and is scored through ``verify_attention`` over the target's own cache,
so an 8-bit target attends through its quantised cache there exactly as in decoding (rows
appended quantised by ``rope_append_kv``, read back dequantised by the kernel; prefill's
attention reads the dequantised cache too, ``LlamaTarget.prefill_attention``). The only
difference from target-only decoding is the block shape: with ``block_rows`` > 1 a call
scores several rows per sequence, which on the GPU moves the dense GEMMs' bits unless the
target is ``row_invariant``; ``block_rows=1`` over the same batch is the target-only decode's
own shape (B rows a call). The 16-bit target scored over its own replies measures the
procedure's floor (1.0 on the reference backend).

``agreement`` compares a run (its greedy replies and its teacher-forced scores over the
base run's sequences) with the base run (its replies and its scores over them):

* teacher-forced: the share of the base's reply positions where the base's token attains
  the other model's largest logit (an exact tie counts as agreement and is counted), and
  each position where it does not, with the two models' margins there;
* free-running: per request the first position where the run's greedy reply departs from
  the base's (None: identical), and at each the base model's top-2 logit gap there (the
  prefixes are equal up to it, so the base's teacher-forced scores are its logits there): a
  near-tie explains a divergence.

numpy only at import (torch logits are reduced on their device, by torch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..orchestrator.state import MAX_BLOCK_ROWS


@dataclass
class Scored:
    """Teacher-forced scores of one reply, one entry per reply position i (the row that
    predicts ``reply[i]``): ``argmax`` and ``runner_up`` the top-2 token ids, ``top1`` /
    ``top2`` their logits, ``given`` the logit of the reply's own token ``reply[i]``."""
    argmax: np.ndarray
    runner_up: np.ndarray
    top1: np.ndarray
    top2: np.ndarray
    given: np.ndarray

    def agrees(self) -> np.ndarray:
        """Whether the reply's token attains the largest logit at each position."""
        return self.given >= self.top1


def _top2(logits, given):
    """(argmax, runner_up, top1, top2, logit of ``given``) of each row of ``logits`` [T, V]
    (numpy, or a torch tensor reduced on its device), as host numpy (float64 logits)."""
    if isinstance(logits, np.ndarray):
        lg = np.asarray(logits, np.float64)
        idx = np.argsort(-lg, axis=1, kind="stable")[:, :2]
        val = np.take_along_axis(lg, idx, axis=1)
        g = lg[np.arange(lg.shape[0]), given]
        return idx[:, 0], idx[:, 1], val[:, 0], val[:, 1], g
    import torch
    lg = logits.float()
    val, idx = torch.topk(lg, 2, dim=1)
    g = lg.gather(1, torch.as_tensor(given, device=lg.device).long()[:, None])[:, 0]
    out = [a.cpu().numpy() for a in (idx[:, 0], idx[:, 1], val[:, 0], val[:, 1], g)]
    return out[0], out[1], *(a.astype(np.float64) for a in out[2:])


def teacher_forced(target: Any, prompts: Sequence[Sequence[int]],
                   replies: Sequence[Sequence[int]], block_rows: int = MAX_BLOCK_ROWS,
                   max_len: int | None = None) -> list[Scored]:
    """``target``'s scores of each ``replies[b]`` after ``prompts[b]`` (see the module
    docstring: prefill of prompt[:-1], then verify blocks of <= ``block_rows`` rows per
    sequence over the target's cache; all requests in one batch). ``max_len``: positions per
    slot of the caches (default the longest sequence); give the decoder's own (its
    ``max_len``, ``positions_needed``) to run the attention plan that decoding ran (the
    KV split follows the page table's width). Resets the target's caches (a decoder over it
    must reset before its next call: ``cache_epoch`` moves); an fp8 target whose scales are
    not recorded yet records them from this prefill."""
    empty = [np.zeros(0, np.int64)] * 2 + [np.zeros(0)] * 3
    return [Scored(*(np.concatenate([p[j] for p in ps]) if ps else empty[j] for j in range(5)))
            for ps in forced_blocks(target, prompts, replies, _top2, block_rows, max_len)]


def forced_logits(target: Any, prompt: Sequence[int], reply: Sequence[int],
                  block_rows: int = 1) -> np.ndarray:
    """Host logits [len(reply), V] of ``target`` fed ``reply`` after ``prompt`` as decoding
    feeds it (``teacher_forced``'s passes; default one row a step: a recurrent state
    rounded after every token, as target-only decoding rounds it). Row i predicts reply[i]."""
    host = target.m.host_rows
    (ps,) = forced_blocks(target, [prompt], [reply], lambda lg, _: (host(lg),), block_rows)
    return np.concatenate([p[0] for p in ps]) if ps else np.zeros((0, target.V), np.float32)


def forced_blocks(target, prompts, replies, reduce, block_rows=MAX_BLOCK_ROWS, max_len=None):
    """The passes of ``teacher_forced``: per sequence, the list of ``reduce(logits, want)``
    tuples of its rows, block by block (``want``: the reply tokens the rows predict)."""
    if len(prompts) != len(replies):
        raise ValueError(f"replies: {len(replies)} for {len(prompts)} prompts")
    if not 1 <= int(block_rows) <= MAX_BLOCK_ROWS:
        raise ValueError(f"block_rows: 1..{MAX_BLOCK_ROWS}, got {block_rows}")
    if any(len(p) < 1 for p in prompts):
        raise ValueError("prompts: each needs at least one token")
    m, B = target.m, len(prompts)
    i32 = np.int32
    target.capture_aux(())                  # the final hidden: a head may have left taps set
    need = max(len(p) + len(r) for p, r in zip(prompts, replies))
    if max_len is not None and max_len < need:
        raise ValueError(f"max_len: {max_len} positions, the longest sequence has {need}")
    target.reset(B, need if max_len is None else int(max_len))
    target.reset_slots(m.table(np.arange(B, dtype=i32)))     # fresh requests (a hybrid's state)
    zeros = m.table(np.zeros(B, i32))
    fin = m.table(np.zeros(B, np.uint8))
    counts = [len(p) - 1 for p in prompts]
    if sum(counts):
        cu = np.concatenate([[0], np.cumsum(counts)]).astype(i32)
        tok = np.concatenate([np.asarray(p[:-1], i32) for p in prompts])
        pos = np.concatenate([np.arange(n, dtype=i32) for n in counts])
        target.prefill(m.table(tok), m.table(pos), m.table(cu), zeros, fin, row_counts=counts)
        target.commit(m.table(cu), m.table(np.asarray(counts, i32)))
    feed = [[int(p[-1])] + [int(t) for t in r[:-1]] for p, r in zip(prompts, replies)]
    lens = np.asarray(counts, i32)
    parts = [[] for _ in range(B)]
    done = 0
    while any(done < len(r) for r in replies):
        qs = np.asarray([max(0, min(block_rows, len(r) - done)) for r in replies], i32)
        cu = np.concatenate([[0], np.cumsum(qs)]).astype(i32)
        tok = np.concatenate([np.asarray(f[done:done + q], i32) for f, q in zip(feed, qs)])
        pos = np.concatenate([lens[b] + np.arange(q, dtype=i32) for b, q in enumerate(qs)])
        want = np.concatenate([np.asarray(r[done:done + q], np.int64)
                               for r, q in zip(replies, qs)])
        cu_t = m.table(cu)
        logits, _ = target.forward(m.table(tok), m.table(pos), cu_t, m.table(lens), fin)
        target.commit(cu_t, m.table(qs))
        red = reduce(logits, want)
        for b in range(B):
            if qs[b]:
                parts[b].append([a[cu[b]:cu[b + 1]] for a in red])
        lens = lens + qs
        done += block_rows
    return parts


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ (one ending first counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(base_replies: Sequence[Sequence[int]], base_scored: Sequence[Scored],
              replies: Sequence[Sequence[int]], scored: Sequence[Scored], *,
              tie: float = 0.25, listed: int = 64) -> dict:
    """A run against the base run (see the module docstring). ``base_scored``: the base
    target over its own replies; ``scored``: the run's target over the base's replies;
    ``replies``: the run's own greedy replies. ``tie``: a base top-2 gap below it is a
    near-tie; ``listed``: at most this many disagreeing positions listed (all counted).
    Returns a JSON-able dict."""
    n = len(base_replies)
    if not len(base_scored) == len(replies) == len(scored) == n:
        raise ValueError("agreement: base_replies, base_scored, replies and scored must "
                         "have one entry per request")
    positions = agree = ties = 0
    where = []
    for i, (r, s, bs) in enumerate(zip(base_replies, scored, base_scored)):
        if len(s.given) != len(r) or len(bs.given) != len(r):
            raise ValueError(f"request {i}: scores of {len(s.given)} / {len(bs.given)} "
                             f"positions for a reply of {len(r)}")
        ok = s.agrees()
        positions += len(r)
        agree += int(ok.sum())
        ties += int(((s.top1 == s.top2) & ok).sum())
        for j in np.flatnonzero(~ok):
            where.append(dict(request=i, position=int(j), base_token=int(r[j]),
                              token=int(s.argmax[j]),
                              margin=round(float(s.top1[j] - s.given[j]), 4),
                              base_gap=round(float(bs.top1[j] - bs.top2[j]), 4)))
    firsts, divs = [], []
    for i, (a, b) in enumerate(zip(base_replies, replies)):
        j = first_divergence(a, b)
        firsts.append(j)
        if j is None:
            continue
        d = dict(request=i, position=j)
        if j < len(a) and j < len(b):
            bs, s = base_scored[i], scored[i]
            d.update(base_token=int(a[j]), token=int(b[j]),
                     base_gap=round(float(bs.top1[j] - bs.top2[j]), 4),
                     base_runner_up=bool(bs.runner_up[j] == b[j]),
                     teacher_forced_agrees=bool(s.agrees()[j]))
        divs.append(d)
    gaps = [d["base_gap"] for d in divs if "base_gap" in d]
    common = [len(a) if j is None else j for a, j in zip(base_replies, firsts)]
    return dict(
        teacher_forced=dict(positions=positions, agreeing=agree,
                            fraction=round(agree / max(positions, 1), 6), exact_ties=ties,
                            disagreements=len(where), listed=where[:listed]),
        free_running=dict(requests=n, identical=sum(j is None for j in firsts),
                          first_divergence=firsts,
                          common_prefix_fraction=round(sum(common) / max(sum(map(len, base_replies)), 1), 6),
                          divergences=divs,
                          near_ties=sum(g < tie for g in gaps), tie=tie,
                          median_base_gap=float(np.median(gaps)) if gaps else None))
