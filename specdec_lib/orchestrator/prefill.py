"""Prefill: commit prompt[:-1] of newly admitted requests and propose their first drafts.

Two ways (``PrefillPolicy`` picks): *batched*, every prompt admitted at a round boundary in
one eager pass of ``target.prefill`` (or, without it, blocks of <= 16 rows through
``target.forward``); *bucketed*, up to ``group`` prompts a pass, each one's rows padded to the
group's length bucket (pads are dead rows past the prompt, like rejected drafts), so the pass
has one shape per (bucket, prompts) and, with graphs, is recorded once per shape and replayed
after.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np

from .request import Metrics, Request
from .state import MAX_BLOCK_ROWS, CallState, Parts, upload_to

MODES = ("auto", "batched", "bucketed")
# the default of PrefillPolicy.batched_from, tuned on the H200: a SmolLM2 bucket replay
# (64-256 rows) takes 1.49-1.58 ms of GPU (s14, flash prefill attention; 1.66-1.76 with a
# draft head's prefill), one eager batched pass of 32 prompts 23 ms (s11), ~20 ms of it fixed
# host enqueueing: 16 replays cost about one batched pass.
BATCHED_PREFILL_FROM = 16
# the defaults of PrefillPolicy.group / hold_rounds: a bucket pass is ~300 launches whose
# GPU time barely grows with its rows at these sizes, so prompts admitted together share one,
# and free slots wait a few rounds to be a group (s49, H100, SmolLM2 served 128/32, EAGLE3
# k=3: group 1 -> 4 -> 4 held 3 rounds -> 8 held 6: 1.21 -> 1.29 -> 1.35 -> 1.37x)
PREFILL_GROUP = 8
PREFILL_HOLD_ROUNDS = 6
# and the rows a grouped pass may pad to (8 prompts of a 256-row bucket): long prompts' passes
# are compute-bound, so they gain little from sharing one and would make large graphs
PREFILL_GROUP_ROWS = 2048


@dataclass(frozen=True)
class PrefillPolicy:
    """How admitted prompts are prefilled.

    mode          ``"batched"``, ``"bucketed"`` (needs a target with ``pads_prefill``), or
                  ``"auto"``: bucketed where the round is graph-captured and the target pads,
                  batched otherwise, and batched for a burst of ``batched_from`` or more
                  prompts admitted at one round boundary.
    batched_from  the burst size from which ``"auto"`` prefills in one batched pass rather
                  than bucket replays; the default (16) is the H200's crossover for SmolLM2
                  (``BATCHED_PREFILL_FROM``). Other GPUs and models may want another value.
    group         at most this many prompts share a bucket pass (those admitted at one round
                  boundary, by length: each padded to the longest's bucket); 1: a pass each
                  (default ``PREFILL_GROUP``, 8).
    hold_rounds   a serving call's free slots may wait up to this many rounds for more slots
                  to free (until ``group`` are free or every waiting request fits), so that
                  their prompts share a pass; 0: admit at the first boundary (default
                  ``PREFILL_HOLD_ROUNDS``, 6: a request may start ~6 rounds later, and the
                  stream runs faster).
    group_rows    at most this many rows (prompts x the pass's bucket) a grouped pass; a
                  prompt whose bucket is longer has a pass of its own (default 2048).
    """
    mode: str = "auto"
    batched_from: int = BATCHED_PREFILL_FROM
    group: int = PREFILL_GROUP
    hold_rounds: int = PREFILL_HOLD_ROUNDS
    group_rows: int = PREFILL_GROUP_ROWS

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(
                f"prefill: expected 'auto', 'batched' or 'bucketed', got {self.mode!r}")
        if int(self.batched_from) < 1:
            raise ValueError(f"prefill: batched_from must be >= 1, got {self.batched_from}")
        if int(self.group) < 1:
            raise ValueError(f"prefill: group must be >= 1, got {self.group}")
        if int(self.group_rows) < 1:
            raise ValueError(f"prefill: group_rows must be >= 1, got {self.group_rows}")
        if int(self.hold_rounds) < 0:
            raise ValueError(f"prefill: hold_rounds must be >= 0, got {self.hold_rounds}")

    def check(self, target: Any) -> None:
        if self.mode == "bucketed" and not getattr(target, "pads_prefill", False):
            raise ValueError("prefill: 'bucketed' needs a target with a padded one-pass prefill "
                             "(pads_prefill = True)")

    def use_buckets(self, target: Any, can_capture: bool, prompts: int) -> bool:
        """Whether ``prompts`` prompts (of two tokens or more) admitted at one round boundary
        go through buckets (else one batched pass)."""
        if self.mode == "auto":
            return (can_capture and getattr(target, "pads_prefill", False)
                    and prompts < self.batched_from)
        return self.mode == "bucketed"

    @staticmethod
    def bucket(n: int, max_len: int) -> int:
        """Rows a prompt of ``n`` prefill rows is padded to: the next power of two from 16
        up to 512, then the next multiple of 256; never past the slot's ``max_len``."""
        nb = max(16, 1 << (n - 1).bit_length()) if n <= 512 else -(-n // 256) * 256
        return min(nb, max_len)

    def groups(self, rows: Sequence[int], max_len: int) -> list[tuple[int, list[int]]]:
        """The bucket passes of prompts of ``rows`` prefill rows: [(bucket, indices)], at most
        ``group`` prompts and ``group_rows`` padded rows a pass (a longer prompt alone),
        taken in order of length (so a pass pads little), each padded to its longest
        prompt's bucket."""
        out: list = []
        for i in sorted(range(len(rows)), key=lambda i: rows[i]):
            nb = self.bucket(rows[i], max_len)      # the pass's longest so far
            if out and len(out[-1][1]) < self.group \
                    and (len(out[-1][1]) + 1) * nb <= self.group_rows:
                out[-1] = (nb, out[-1][1] + [i])
            else:
                out.append((nb, [i]))
        return out


def prefill(p: Parts, st: CallState, admitted: Sequence[tuple[int, Request]],
            policy: PrefillPolicy, can_capture: bool, metrics: Metrics) -> None:
    """Commit prompt[:-1] of every admitted (slot, Request) and propose its first drafts, in
    buckets or batched (``policy``). One-token prompts have nothing to prefill: they take the
    batched path's empty pass."""
    long = [(b, r) for b, r in admitted if len(r.prompt) >= 2]
    if not policy.use_buckets(p.target, can_capture, len(long)):
        return _batched(p, st, admitted)
    # each pass's slots in increasing order: cu_q lays their blocks out in slot order
    passes = [(nb, sorted((long[i] for i in part), key=lambda br: br[0]))
              for nb, part in policy.groups([len(r.prompt) - 1 for _, r in long],
                                            st.shape.max_len)]
    for (nb, group), src in zip(passes, _stage_buckets(p, st, passes)):
        _bucketed(p, st, nb, len(group), src, can_capture, metrics)
    if len(long) < len(admitted):
        _batched(p, st, [(b, r) for b, r in admitted if len(r.prompt) < 2])


def _bucket_size(nb: int, m: int, B: int) -> int:
    return 2 * m * nb + 2 * B + 1 + m


def _bucket_fields(a, nb: int, m: int, B: int) -> SimpleNamespace:
    """The fields of the input array ``a`` (int32, ``_bucket_size``) of a pass of ``m``
    prompts padded to ``nb`` rows each, as views: tokens [m nb], next [m nb] (the draft head's
    token per row), cu_q [B+1], valid [B], slot [m]; the same layout on the host staging
    array and on the device buffer the graph reads."""
    c, v = 2 * m * nb, 2 * m * nb + B + 1
    return SimpleNamespace(all=a, tokens=a[:m * nb], next=a[m * nb:c], cu_q=a[c:v],
                           valid=a[v:v + B], slot=a[v + B:])


def _stage_buckets(p: Parts, st: CallState, passes) -> list:
    """The input array of each pass (``_bucket_fields``; ``passes``: [(bucket, [(slot,
    request)] in slot order)]), staged on the host and copied to the device at once
    (``upload``): one host->device copy for all of them, so the copy into each pass's buffer
    is device to device and the host need not wait for one pass to end before enqueueing
    the next."""
    B = st.shape.slots
    host = {}
    for i, (nb, group) in enumerate(passes):
        m = len(group)
        f = _bucket_fields(np.zeros(_bucket_size(nb, m, B), np.int32), nb, m, B)
        rows = np.zeros(B + 1, np.int32)
        for j, (b, r) in enumerate(group):
            n = len(r.prompt) - 1
            f.tokens[j * nb:j * nb + n] = r.prompt[:-1]
            f.next[j * nb:j * nb + n] = r.prompt[1:]
            rows[b + 1] = nb                            # slot b holds the j-th nb rows
            f.valid[b] = n
            f.slot[j] = b
        f.cu_q[:] = np.cumsum(rows)
        host[f"bucket{i}"] = f.all
    dev = upload_to(p.be, host)
    return [dev[f"bucket{i}"] for i in range(len(passes))]


def _bucketed(p: Parts, st: CallState, nb: int, m: int, src, can_capture: bool,
              metrics: Metrics) -> None:
    """Prefill ``m`` admitted requests in one pass, each one's n = len(prompt) - 1 rows
    padded to ``nb`` (token 0 at positions n..nb-1: their K/V land past the committed
    length, dead rows that later appends overwrite, and the causal attention keeps them out
    of the real rows). The pass reads only device buffers (tokens, the draft's next tokens,
    cu_q and the valid counts that name the slots), so with graphs it is recorded on the
    first use of its shape (nb, m) and replayed after, whichever slots it fills. ``src``:
    the pass's input array on the device (``_stage_buckets``)."""
    xp, B = p.be.xp, st.shape.slots
    pb = st.prefills.get((nb, m))
    if pb is None:
        pb = st.prefills[nb, m] = _bucket_fields(
            xp.zeros(_bucket_size(nb, m, B), dtype=xp.int32), nb, m, B)
        pb.positions = xp.arange(m * nb, dtype=xp.int32) % nb
        pb.replay = None
    pb.all[...] = src                                   # one copy for every field

    def bucket_pass():
        _bucket_pass(p, st, pb, nb, m)
    if pb.replay is not None:
        pb.replay()
        return
    bucket_pass()           # the shape's first use runs eagerly (libraries initialised)
    if can_capture:
        tc = time.perf_counter()
        pb.replay = p.be.capture(bucket_pass)
        metrics.capture_s += time.perf_counter() - tc


def _bucket_pass(p: Parts, st: CallState, pb: SimpleNamespace, nb: int, m: int) -> None:
    """The pass's target prefill, commit, carry and first drafts of the ``m`` slots that
    ``pb.slot`` names (other slots have 0 rows and keep their drafts)."""
    xp, be, buf, carry = p.be.xp, p.be, st.buf, st.carry
    B = st.shape.slots
    counts = [nb] * m + [0] * (B - m)   # the plan's row split (m prompts of nb rows); which
    # slots hold them is device data (cu_q), so one recording serves any m slots
    _, hidden = p.target.prefill(pb.tokens, pb.positions, pb.cu_q, buf.seq_lens,
                                 buf.finished, row_counts=counts)
    p.target.commit(pb.cu_q, pb.valid)
    buf.seq_lens += pb.valid
    if p.uses_carry:
        new_carry = xp.empty_like(carry)
        be.draft_carry(hidden, pb.cu_q, pb.valid, new_carry)
        carry[pb.slot] = new_carry[pb.slot]
    if not p.k:
        return
    if p.block_draft:
        proposal = p.draft.propose_block(SimpleNamespace(
            hidden=hidden, tokens=pb.next, positions=pb.positions, cu_q=pb.cu_q,
            valid=pb.valid, seq_lens=buf.seq_lens, finished=buf.finished,
            row_counts=counts), p.k)
    else:
        proposal = p.propose(buf, carry)
    buf.draft_tokens[pb.slot] = proposal[pb.slot]


def _batched(p: Parts, st: CallState, admitted: Sequence[tuple[int, Request]]) -> None:
    """Commit prompt[:-1] of every admitted request (other slots get 0 rows): in one
    pass through ``target.prefill`` where the target has it, else in blocks of <= 16 rows
    through ``forward``; carry[b] = hidden of the last prompt row (zeros for one-token
    prompts); then propose the admitted slots' first drafts."""
    xp, be, buf, carry = p.be.xp, p.be, st.buf, st.carry
    B = st.shape.slots
    todo = [[] for _ in range(B)]
    for b, r in admitted:
        todo[b] = list(r.prompt[:-1])
    done = [0] * B
    whole = getattr(p.target, "prefill", None)
    block_draft = p.block_draft         # then it prefills on the target's prompt rows
    if block_draft and whole is None:
        raise TypeError("draft: a head with its own cache needs target.prefill (one pass)")
    prompts = {b: list(r.prompt) for b, r in admitted}
    # every pass planned on the host first, all its inputs (and the admitted rows) copied to
    # the device at once: no copy between passes waits for the stream
    plans, host = [], {}
    while any(done[b] < len(todo[b]) for b in range(B)):
        qs = [len(todo[b]) - done[b] if whole else min(MAX_BLOCK_ROWS, len(todo[b]) - done[b])
              for b in range(B)]
        i = len(plans)
        host[f"cu_q{i}"] = np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)
        host[f"valid{i}"] = np.asarray(qs, np.int32)
        host[f"tokens{i}"] = np.concatenate([todo[b][done[b]:done[b] + qs[b]]
                                             for b in range(B)]).astype(np.int32)
        pos = np.concatenate([np.arange(done[b], done[b] + qs[b]) for b in range(B)]).astype(np.int32)
        host[f"positions{i}"] = pos
        if p.uses_carry:            # the slots whose last prompt row is in this pass
            host[f"carry_rows{i}"] = np.flatnonzero(np.asarray(
                [done[b] + qs[b] == len(todo[b]) and qs[b] > 0 for b in range(B)])).astype(np.int64)
        if block_draft:     # the draft's own prefill: each prompt row fed its next token
            host[f"next{i}"] = np.concatenate([prompts[b][done[b] + 1:done[b] + qs[b] + 1]
                                               if qs[b] else [] for b in range(B)]).astype(np.int32)
            host[f"draft_positions{i}"] = pos.copy()
        plans.append(qs)
        done = [done[b] + qs[b] for b in range(B)]
    if p.k:
        host["rows"] = np.asarray([b for b, _ in admitted], np.int64)
    dev = upload_to(p.be, host)
    proposal = None
    for i, qs in enumerate(plans):
        cu_q, acc = dev[f"cu_q{i}"], dev[f"valid{i}"]
        if whole:
            logits, hidden = whole(dev[f"tokens{i}"], dev[f"positions{i}"], cu_q, buf.seq_lens,
                                   buf.finished, row_counts=qs)
        else:
            logits, hidden = p.target.forward(dev[f"tokens{i}"], dev[f"positions{i}"], cu_q,
                                              buf.seq_lens, buf.finished)
        p.target.commit(cu_q, acc)
        buf.seq_lens += acc
        if p.uses_carry:
            new_carry = xp.empty_like(carry)
            be.draft_carry(hidden, cu_q, acc, new_carry)
            rows = dev[f"carry_rows{i}"]
            carry[rows] = new_carry[rows]
        if block_draft:
            proposal = p.draft.propose_block(SimpleNamespace(
                hidden=hidden, tokens=dev[f"next{i}"], positions=dev[f"draft_positions{i}"],
                cu_q=cu_q, valid=acc, seq_lens=buf.seq_lens, finished=buf.finished,
                row_counts=qs), p.k)
    if p.k:
        rows = dev["rows"]
        if not block_draft:
            proposal = p.propose(buf, carry)
        elif proposal is None:      # one-token prompts only: nothing to prefill
            proposal = p.draft.propose_block(_empty_block(p, st), p.k)
        buf.draft_tokens[rows] = proposal[rows]


def _empty_block(p: Parts, st: CallState) -> SimpleNamespace:
    xp, buf, B = p.be.xp, st.buf, st.shape.slots
    return SimpleNamespace(
        hidden=xp.zeros((0, p.target.hidden_size), dtype=st.carry_dtype),
        tokens=xp.zeros(0, dtype=xp.int32), positions=xp.zeros(0, dtype=xp.int32),
        cu_q=xp.zeros(B + 1, dtype=xp.int32), valid=xp.zeros(B, dtype=xp.int32),
        seq_lens=buf.seq_lens, finished=buf.finished, row_counts=[0] * B)
