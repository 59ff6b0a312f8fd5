"""One speculative round: the ops in sequence, on one stream, reading no host value.

    seq_build_block -> target.forward -> spec_sample -> seq_stop -> target.commit
        -> seq_advance -> draft_carry (a draft that reads the carry) -> draft.propose

The block of every slot, finished and idle ones included, is ``k + 1`` rows, so ``T`` is
fixed and the round is graph-capturable; finished rows are computed and never committed.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from .state import MAX_BLOCK_ROWS, CallState, Parts


def run_round(p: Parts, st: CallState) -> None:
    """Enqueue one round of every slot of ``st`` on the backend's stream."""
    be, K, buf, carry = p.be, p.k, st.buf, st.carry
    B = carry.shape[0]
    T = B * (K + 1)
    be.seq_build_block(buf.last_token, buf.draft_tokens, buf.num_draft, buf.seq_lens,
                       buf.cu_q, buf.block_tokens, buf.positions, buf.draft_ids)
    logits, hidden = p.target.forward(buf.block_tokens, buf.positions, buf.cu_q,
                                      buf.seq_lens, buf.finished)
    buf.step[...] = buf.seq_lens                  # Philox step: advances every round
    be.spec_sample(logits, buf.cu_q, buf.draft_ids[:T - B], buf.temperature, buf.top_k,
                   buf.top_p, buf.min_p, buf.seed, buf.step, buf.num_accepted,
                   buf.emitted, buf.status, filters=st.filters)
    be.seq_stop(buf.emitted, buf.num_accepted, buf.out_tokens, buf.out_lens,
                buf.stop_ids, buf.stop_seqs, buf.max_new, buf.accept_len, buf.finished)
    p.target.commit(buf.cu_q, buf.accept_len)
    be.seq_advance(buf.emitted, buf.accept_len, buf.seq_lens, buf.out_tokens,
                   buf.out_lens, buf.last_token, buf.finished)
    if p.uses_carry:
        be.draft_carry(hidden, buf.cu_q, buf.accept_len, carry)
    if p.block_draft:
        # every block row is fed the token emitted after it (row j of sequence b:
        # emitted[b, j]; -1 past the accepted ones, a zero embedding: dead rows)
        buf.draft_tokens[...] = p.draft.propose_block(SimpleNamespace(
            hidden=hidden, tokens=buf.emitted.reshape(-1), positions=buf.positions,
            cu_q=buf.cu_q, valid=buf.accept_len, seq_lens=buf.seq_lens,
            finished=buf.finished, row_counts=None), K)
    elif K:
        buf.draft_tokens[...] = p.propose(buf, carry)


@dataclass(frozen=True)
class FixedK:
    """How many drafts a slot's next block holds: ``k`` for every slot and round.

    The seam for ``num_speculative_tokens="auto"`` (a later issue): the round reads the
    per-slot counts from ``buf.num_draft`` [B] (device int32, ragged blocks: every op takes
    them), under buffers and graphs sized for ``k_max``. A policy that chooses k per round
    per request replaces this class, writing ``num_draft`` in ``before_round`` from what
    ``after_round`` measured; the serving loop already calls both at every round boundary."""
    k: int

    def __post_init__(self):
        if not 0 <= self.k < MAX_BLOCK_ROWS:
            raise ValueError(f"num_speculative_tokens: {self.k} outside 0..{MAX_BLOCK_ROWS - 1}")

    @property
    def k_max(self) -> int:
        return self.k

    def before_round(self, st: CallState) -> None:
        """Nothing to do: ``num_draft`` holds k from the start (``state.make_buffers``)."""

    def after_round(self, num_accepted) -> None:
        """Nothing to learn from ``num_accepted`` (host int32 [running slots])."""
