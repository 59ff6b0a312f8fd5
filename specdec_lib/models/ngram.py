"""Prompt-lookup drafting (method ``ngram``, alias ``prompt_lookup``) as a ``SpeculativeDecoder``
draft: the k tokens that followed the latest earlier occurrence of the context's last n tokens
(n from ``max_n`` down to ``min_n``), found by the library's ``ngram_propose`` op on the
device, so the draft step is inside the captured round.

A sequence with fewer than k proposals (or none) still gets a full block: its empty draft
slots repeat the last token. Any draft keeps rejection sampling exact, so this costs nothing
in correctness; it only keeps every round the same shape (one graph). ``num_draft`` keeps the
real count for the metrics.
"""
from __future__ import annotations


class NgramDraft:
    uses_context = True

    def __init__(self, backend, *, min_n: int = 1, max_n: int = 3):
        from ..contract.draft import ngram_args
        # the op's own rules, checked now rather than at the first proposal (the draft width
        # k is checked by the op when it is known)
        self.min_n, self.max_n = ngram_args(min_n, max_n, 1)
        self.be, self.xp = backend, backend.xp
        self._bufs = {}

    def propose(self, carry, last_token, k, context):
        xp, B = self.xp, last_token.shape[0]
        bufs = self._bufs.get((B, k))
        if bufs is None:
            bufs = self._bufs[(B, k)] = (xp.empty((B, k), dtype=xp.int32),
                                         xp.empty(B, dtype=xp.int32))
        drafts, self.num_draft = bufs
        self.be.ngram_propose(context.prompt, context.prompt_lens, context.output,
                              context.output_lens, drafts, self.num_draft,
                              min_n=self.min_n, max_n=self.max_n)
        return xp.where(drafts < 0, last_token.reshape(B, 1), drafts)
