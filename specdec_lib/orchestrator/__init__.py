"""SpeculativeDecoder: one chain-speculative round after another, on any backend.

The host stack supplies two objects; every name below is what the decoder reads.

``target``  required:
            ``hidden_size`` (int): the width H of ``hidden`` and of the draft's carry;
            ``reset(batch, max_len)``: caches for ``batch`` empty slots of ``max_len`` positions;
            ``forward(tokens, positions, cu_q, seq_lens, finished) -> (logits [T, V] float32,
            hidden [T, H])`` (calls append_kv / verify_attention / conv1d_verify / gdn_verify;
            commits no block row to a recurrent state; rows of finished slots are computed,
            not appended);
            ``commit(cu_q, accept_len)`` (gdn_commit / conv1d_commit; or, a hybrid's fused
            mode, the rows left pending for the next forward's verifies to commit first).
            optional:
            ``prefill(tokens, positions, cu_q, seq_lens, finished, *, row_counts) -> (logits or
            None, hidden)``: whole prompts of fresh sequences (any length) in one pass
            (``row_counts``: host ints, rows per slot); without it prompts go through
            ``forward`` in blocks of 16 rows;
            ``pads_prefill = True``: prefill rows past a prompt only write dead cache rows, so
            prompts may be padded to length buckets (``prefill="bucketed"``, and ``"auto"``
            with graphs);
            ``reset_slots(slot_ids)``: a new request takes these slots (``slot_ids``: an
            int64 device array; clear their recurrent state); without it reusing a slot
            raises TypeError, and no call reuses the last one's state;
            ``cache_epoch`` (int, bumped by every ``reset``): with ``reset_slots`` it lets a
            call reuse the last call's buffers and graphs while the caches are unchanged;
            ``hidden_dtype`` (default float32): the dtype of ``hidden`` and of the carry;
            ``takes_max_q = True``: called ``forward(..., max_q=n)`` in rounds, n (host int)
            the most rows any slot's block has (verify_attention's ``max_q``);
            ``takes_block_rows = True``: called ``reset(batch, max_len, block_rows=k_max + 1)``,
            the most rows a slot's block has in any round (a hybrid's fused-mode pools).
``draft``   ``propose(carry [B, H], last_token [B], k) -> draft tokens [B, k]``; may be
            None when ``num_speculative_tokens == 0`` (target-only decoding). Optional:
            ``max_draft_tokens`` (int): the most tokens it can propose a round (a k or
            k_max above it is refused);
            ``uses_context = True``: called ``propose(carry, last_token, k, context)``, where
            ``context`` holds the device buffers ``prompt [B, P]``, ``prompt_lens [B]``,
            ``output [B, O]``, ``output_lens [B]`` (prompt-lookup drafting reads them; no carry
            is gathered);
            ``uses_target_block = True``: a head with its own cache, called
            ``propose_block(block, k) -> [B, k]`` instead of ``propose`` after every target pass
            (rounds and prefills); ``block`` has hidden [R, H], tokens [R] (the token after each
            row), positions [R], cu_q [B+1], valid [B] (rows committed), seq_lens [B], finished
            [B], row_counts (host ints on a prefill, else None), max_q (host int: no
            block has more rows; on a round);
            ``reset(batch, max_len)`` and ``cache_epoch``: as the target's, for a draft with
            caches.

Each round, on one stream and with no synchronisation inside it (``round.run_round``)::

    seq_build_block -> target.forward -> spec_sample -> seq_stop -> target.commit
        -> seq_advance -> draft_carry (a draft that reads the carry) -> draft.propose

The block of every sequence, finished ones included, is ``k + 1`` rows, so ``T`` is fixed
and the round needs no host value (graph-capturable); finished rows are computed and
never committed. k comes from the speculation policy (``policy``): ``num_speculative_tokens``
an int (``FixedK``), ``"auto"`` (``AutoK``: chosen every round from the running acceptance
and the measured cost of a round) or a policy object; a round verifies the drafts the last
one proposed and proposes the next round's, one recorded graph per (verify, propose). After the round the host reads ``finished`` and ``num_accepted`` (one
small copy: one buffer, ``control``) to know whether to stop and for the metrics. With ``cuda_graph=True`` the
first round runs eagerly and is then captured once as a CUDA graph (cupy math, library
kernels, draft pass); every later round is one graph launch, its inputs (lengths, steps,
seeds, tokens) living in device buffers that the graph reads.

Backends (``backends``): ``"reference"`` (numpy arrays, ``specdec_lib.reference`` ops),
``"cuda"`` (cupy arrays, ``specdec_lib.ops``, all on one non-blocking stream of the
backend's) and ``"torch"`` (torch tensors, ``specdec_lib.ops`` on torch's current stream, the
round captured with ``torch.cuda.CUDAGraph``). cupy and torch are imported only by their
backends.

The package, bottom up (each module imports only those before it): ``request`` (Request,
Result, Metrics), ``backends``, ``state`` (the parts and the one owner of the device state),
``policy`` (``FixedK``, ``AutoK``: how many drafts a round verifies and proposes), ``round``,
``prefill`` (``PrefillPolicy``), ``serve`` (the scheduler and the loop),
``decoder`` (the façade).
"""
from __future__ import annotations

from .backends import (BACKENDS, Backend, cuda_backend, make_backend, reference_backend,
                       torch_backend)
from .decoder import SpeculativeDecoder
from .prefill import BATCHED_PREFILL_FROM, PrefillPolicy
from .request import Metrics, Request, Result
from .policy import AutoK, FixedK, RoundPlan
from .state import FINISH_REASONS, MAX_BLOCK_ROWS, SLOT_IDLE

__all__ = ["BACKENDS", "BATCHED_PREFILL_FROM", "FINISH_REASONS", "MAX_BLOCK_ROWS", "SLOT_IDLE",
           "AutoK", "Backend", "FixedK", "Metrics", "PrefillPolicy", "Request", "Result",
           "RoundPlan", "SpeculativeDecoder", "cuda_backend", "make_backend", "reference_backend",
           "torch_backend"]
