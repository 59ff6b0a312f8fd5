"""One speculative round: the ops in sequence, on one stream, reading no host value.

    seq_build_block -> target.forward -> spec_sample -> seq_stop -> target.commit
        -> seq_advance -> draft_carry (a draft that reads the carry) -> draft.propose

A round follows a ``RoundPlan`` (``policy``): it verifies ``plan.verify`` drafts per slot and
proposes ``plan.propose`` for the next round, under buffers sized for ``k_max``. The block of
every slot, finished and idle ones included, is ``verify + 1`` rows (or ``num_draft[b] + 1``
on a ragged eager round), so ``T`` is fixed per plan and the round is graph-capturable;
finished rows are computed and never committed.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from .policy import RoundPlan
from .state import CallState, Parts, upload_to

__all__ = ["block_rows", "emitted_rows", "run_round", "write_live_rows"]


def block_rows(plan: RoundPlan, B: int) -> list[int]:
    """Rows of each slot's block in a round of ``plan``."""
    if plan.num_draft is None:
        return [plan.verify + 1] * B
    return [q + 1 for q in plan.num_draft]


def emitted_rows(p: Parts, st: CallState, plan: RoundPlan):
    """The gather that feeds every block row the token emitted after it (row j of slot b:
    ``emitted[b, j]``) when a ragged plan's blocks are narrower than ``emitted`` (k_max + 1);
    None for whole blocks (``run_round`` takes ``emitted``'s first verify + 1 columns: s31
    H200, B=16, a k_max = 4 decoder's (3, 3) graph replayed alone in 1320 us with the gather,
    182 us of it idle between kernels, against 1181 us with the columns' copy) and for blocks
    as wide. Made on the host before the round runs (or is recorded) and kept per plan, so
    the recorded round only reads a device buffer."""
    if plan.num_draft is None:
        return None
    W, B = st.buf.emitted.shape[1], st.shape.slots
    rows = block_rows(plan, B)
    if all(q == W for q in rows):
        return None
    if plan.live:       # which slots have whole blocks changes: the index is refilled
        key = _live_key(plan)                       # before each round (``write_live_rows``)
        idx = st.row_gathers.get(key)
        if idx is None:
            idx = st.row_gathers[key] = p.be.xp.zeros(sum(rows), dtype=p.be.xp.int64)
        return idx
    key = tuple(rows)
    idx = st.row_gathers.get(key)
    if idx is None:
        idx = st.row_gathers[key] = p.be.xp.asarray(_gather_index(rows, W))
    return idx


def _live_key(plan: RoundPlan) -> tuple:
    """The gather of a live-rows plan: one per (verify, live count), whichever slots are live."""
    return ("live", plan.verify, plan.live)


def _gather_index(rows, W: int) -> np.ndarray:
    """Row j of slot b's block reads ``emitted[b, j]`` (flat index b * W + j)."""
    return np.concatenate([b * W + np.arange(q) for b, q in enumerate(rows)]).astype(np.int64)


def write_live_rows(p: Parts, st: CallState, plan: RoundPlan) -> None:
    """Before a live-rows round (``plan.live``; its ``num_draft`` already on the device):
    ``emitted_rows``' index for this round's row split, copied into the buffer the recorded
    round reads (stream-ordered, without waiting for it), where it changed."""
    if not (plan.live and p.block_draft and plan.propose):
        return
    idx = emitted_rows(p, st, plan)
    key = _live_key(plan)
    if idx is None or st.live_rows.get(key) == plan.num_draft:
        return
    rows = block_rows(plan, st.shape.slots)
    src = upload_to(p.be, {"int64": _gather_index(rows, st.buf.emitted.shape[1])})["int64"]
    idx[...] = src
    st.live_rows[key] = plan.num_draft


def run_round(p: Parts, st: CallState, plan: RoundPlan = None) -> None:
    """Enqueue one round of every slot of ``st`` on the backend's stream. ``buf.num_draft``
    must already hold the plan's per-slot counts (``serve`` writes them)."""
    be, buf, carry = p.be, st.buf, st.carry
    plan = plan or RoundPlan(p.k, p.k)
    kp = plan.propose
    B = carry.shape[0]
    rows = block_rows(plan, B)
    T, max_q = sum(rows), max(rows, default=1)
    be.seq_build_block(buf.last_token, buf.draft_tokens, buf.num_draft, buf.seq_lens,
                       buf.cu_q, buf.block_tokens, buf.positions, buf.draft_ids)
    positions = buf.positions[:T]
    bound = dict(max_q=max_q) if p.takes_max_q else {}
    logits, hidden = p.target.forward(buf.block_tokens[:T], positions, buf.cu_q,
                                      buf.seq_lens, buf.finished, **bound)
    buf.step[...] = buf.seq_lens                  # Philox step: advances every round
    be.spec_sample(logits, buf.cu_q, buf.draft_ids[:T - B], buf.temperature, buf.top_k,
                   buf.top_p, buf.min_p, buf.seed, buf.step, buf.num_accepted,
                   buf.emitted, buf.status, filters=st.filters)
    be.seq_stop(buf.emitted, buf.num_accepted, buf.out_tokens, buf.out_lens,
                buf.stop_ids, buf.stop_seqs, buf.max_new, buf.accept_len, buf.finished)
    p.target.commit(buf.cu_q, buf.accept_len)
    be.seq_advance(buf.emitted, buf.accept_len, buf.seq_lens, buf.out_tokens,
                   buf.out_lens, buf.last_token, buf.finished)
    if kp == 0:             # no draft pass (k = 0 next round; a head's cache skips this one)
        return
    if p.uses_carry:
        be.draft_carry(hidden, buf.cu_q, buf.accept_len, carry)
    if p.block_draft:
        # every block row is fed the token emitted after it (row j of sequence b:
        # emitted[b, j]; -1 past the accepted ones, a zero embedding: dead rows)
        idx = emitted_rows(p, st, plan)
        if idx is not None:
            tokens = buf.emitted.reshape(-1)[idx]
        elif plan.num_draft is None and plan.verify + 1 < buf.emitted.shape[1]:
            # whole blocks narrower than emitted (+ 0: a new C-contiguous array in numpy,
            # cupy and torch alike, one elementwise kernel; a reshape of the slice is a
            # strided view where verify is 0)
            tokens = (buf.emitted[:, :plan.verify + 1] + 0).reshape(-1)
        else:
            tokens = buf.emitted.reshape(-1)
        proposal = p.draft.propose_block(SimpleNamespace(
            hidden=hidden, tokens=tokens, positions=positions,
            cu_q=buf.cu_q, valid=buf.accept_len, seq_lens=buf.seq_lens,
            finished=buf.finished, row_counts=None, max_q=max_q), kp)
    else:
        proposal = p.propose(buf, carry, kp)
    if kp == p.k:
        buf.draft_tokens[...] = proposal
    else:
        buf.draft_tokens[:, :kp] = proposal
