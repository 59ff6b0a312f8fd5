"""numpy reference of the sequence ops: the executable spec of a round's bookkeeping.

After ``spec_sample`` has produced ``num_accepted[b] = n`` and ``emitted[b, 0..n]``
(``d1..dn`` then the correction/bonus token, pad -1), the round ends with

1. ``seq_stop``   : stop ids, stop sequences and the output-length limit may shorten the
                    commit to ``accept_len[b] <= n + 1`` and mark the row finished;
2. (state commits of ``accept_len`` block rows: gdn_commit, conv1d_commit)
3. ``seq_advance``: ``L += accept_len``, append the emitted tokens to the output buffer,
                    remember the last emitted token (the next block's first row);
4. ``seq_build_block``: the next round's block tokens, positions and ``cu_q``.

``finished`` is a ``uint8 [B]`` array holding a reason code (0 = running); a row that
is finished on entry to ``seq_stop`` commits nothing (``accept_len = 0``) and the
later ops leave it alone. Every function writes into the caller's arrays and also
returns them; plain per-row loops, this is the spec the kernels are tested against.
Arguments are checked by the ops' contract (``specdec_lib.contract.sequence``) first.
"""
from __future__ import annotations

import numpy as np

from ..contract import checked

# finished[b] reason codes (uint8); 0 means the request is still running
FINISH_NONE = 0
FINISH_STOP_ID = 1      # an emitted token is one of the request's stop ids
FINISH_STOP_SEQ = 2     # the output now ends with one of the request's stop sequences
FINISH_MAX_LEN = 3      # the output reached max_new_tokens
FINISH_CAPACITY = 4     # the output buffer was too small (seq_advance truncated the append)
FINISH_BAD_ROW = 5      # spec_sample gave an invalid row (num_accepted out of range, token < 0)

FINISH_REASONS = {
    FINISH_NONE: "running", FINISH_STOP_ID: "stop_id", FINISH_STOP_SEQ: "stop_sequence",
    FINISH_MAX_LEN: "max_length", FINISH_CAPACITY: "capacity", FINISH_BAD_ROW: "bad_row",
}


def stop_sequence_lengths(stop_seqs):
    """Length of each left-padded stop sequence row (-1 pads at the start)."""
    valid = stop_seqs >= 0
    # a row is its suffix after the last pad; leading pads only
    M = stop_seqs.shape[-1]
    first = np.where(valid.any(-1), np.argmax(valid, axis=-1), M)
    return (M - first).astype(np.int64)


@checked("seq_stop")
def seq_stop(emitted, num_accepted, out_tokens, out_lens, stop_ids, stop_seqs,
             max_new_tokens, accept_len, finished):
    """Apply stop conditions to one round's emitted tokens.

    emitted        int32 [B, W]   d1..dn then the correction/bonus token; W = k_max + 1
    num_accepted   int32 [B]      n from spec_sample, 0 <= n < W
    out_tokens     int32 [B, C]   tokens generated before this round (read: stop sequences
                                  may start before the block)
    out_lens       int32 [B]      valid prefix of out_tokens
    stop_ids       int32 [B, S] or None   per-request stop token ids, -1 = unused slot
    stop_seqs      int32 [B, NS, M] or None   per-request stop sequences, each row
                                  LEFT-padded with -1 (its last element is the final
                                  token); an all -1 row is unused
    max_new_tokens int32 [B]      limit on the number of output tokens (out_lens + new)
    accept_len     int32 [B]      OUT: rows to commit = emitted tokens to keep, 0..n+1
    finished       uint8 [B]      IN/OUT: 0 = running; set to a FINISH_* reason here

    Tokens are examined in order; the first token that is a stop id, ends a stop
    sequence, or brings the output to max_new_tokens is the last one kept (it is part of
    the output, as the EOS token is). A row finished on entry keeps nothing. A row with
    an out-of-range n or a negative token keeps the tokens before it and is marked
    FINISH_BAD_ROW; so is a row with out_lens < 0 (keeps nothing). Only the first
    min(out_lens, C) history tokens are searched for stop sequences.
    """
    B, W = emitted.shape
    C = out_tokens.shape[1]
    if stop_seqs is not None:
        seq_lens = stop_sequence_lengths(stop_seqs)
    for b in range(B):
        if finished[b] != FINISH_NONE:
            accept_len[b] = 0
            continue
        n = int(num_accepted[b])
        have = int(out_lens[b])
        if have < 0:                      # corrupt length: never index with it
            accept_len[b] = 0
            finished[b] = FINISH_BAD_ROW
            continue
        limit = int(max_new_tokens[b]) - have
        if limit <= 0:
            accept_len[b] = 0
            finished[b] = FINISH_MAX_LEN
            continue
        if n < 0 or n >= W:
            accept_len[b] = 0
            finished[b] = FINISH_BAD_ROW
            continue
        keep, reason = n + 1, FINISH_NONE
        for i in range(n + 1):
            t = int(emitted[b, i])
            if t < 0:
                keep, reason = i, FINISH_BAD_ROW
                break
            if stop_ids is not None and np.any(stop_ids[b] == t):
                keep, reason = i + 1, FINISH_STOP_ID
                break
            if stop_seqs is not None and _ends_with_stop_seq(
                    out_tokens[b, :min(have, C)], emitted[b, :i + 1], stop_seqs[b], seq_lens[b]):
                keep, reason = i + 1, FINISH_STOP_SEQ
                break
            if i + 1 >= limit:
                keep, reason = i + 1, FINISH_MAX_LEN
                break
        accept_len[b] = keep
        if reason != FINISH_NONE:
            finished[b] = reason
    return accept_len, finished


def _ends_with_stop_seq(history, new, seqs, lens):
    """Does history ++ new end with one of the stop sequences (that ends inside new)?"""
    tail = np.concatenate([np.asarray(history, dtype=np.int64), np.asarray(new, dtype=np.int64)])
    for s in range(seqs.shape[0]):
        m = int(lens[s])
        if m == 0 or m > tail.shape[0]:
            continue
        if np.array_equal(tail[-m:], seqs[s, seqs.shape[1] - m:]):
            return True
    return False


@checked("seq_advance")
def seq_advance(emitted, accept_len, seq_lens, out_tokens, out_lens, last_token, finished):
    """Commit the kept tokens: lengths, output buffer, next block's first token.

    emitted     int32 [B, W]   this round's emitted tokens
    accept_len  int32 [B]      from seq_stop (0 for finished rows)
    seq_lens    int32 [B]      IN/OUT: committed length L; L += accept_len
    out_tokens  int32 [B, C]   IN/OUT: emitted[b, :accept_len] appended at out_lens[b]
    out_lens    int32 [B]      IN/OUT: += number of tokens appended
    last_token  int32 [B]      IN/OUT: emitted[b, accept_len - 1] when accept_len > 0
    finished    uint8 [B]      IN/OUT: FINISH_CAPACITY when the output buffer overflows
                               (the tokens that fit are written, L still advances: the
                               caches have committed those rows); FINISH_BAD_ROW when
                               out_lens[b] < 0 (nothing appended, L still advances)
    """
    B, W = emitted.shape
    C = out_tokens.shape[1]
    for b in range(B):
        a = min(int(accept_len[b]), W)
        if a <= 0:
            continue
        seq_lens[b] += a
        last_token[b] = emitted[b, a - 1]
        have = int(out_lens[b])
        if have < 0:                      # corrupt length: never index with it
            finished[b] = FINISH_BAD_ROW
            continue
        fit = max(0, min(a, C - have))
        out_tokens[b, have:have + fit] = emitted[b, :fit]
        out_lens[b] = have + fit
        if fit < a:
            finished[b] = FINISH_CAPACITY
    return seq_lens, out_tokens, out_lens, last_token, finished


@checked("seq_build_block")
def seq_build_block(last_token, draft_tokens, num_draft, seq_lens, cu_q, block_tokens,
                    positions, draft_ids=None):
    """Next round's verify block: ``[t0, d1..d_{k_b}]`` at positions ``L .. L + k_b``.

    last_token    int32 [B]       t0: the last emitted token (not yet run)
    draft_tokens  int32 [B, K]    the drafter's proposals
    num_draft     int32 [B]       k_b, clamped to 0..K (rows may differ: ragged blocks)
    seq_lens      int32 [B]       committed length L
    cu_q          int32 [B + 1]   OUT: block row offsets, cu_q[0] = 0
    block_tokens  int32 [>= B*(K+1)]   OUT: tokens of the T = cu_q[B] block rows (the
                                  worst-case size: the GPU op cannot see T before it runs)
    positions     int32 [>= B*(K+1)]   OUT: their positions
    draft_ids     int32 [>= B*K] or None   OUT: the drafts alone, block b's at
                                  ``cu_q[b] - b``: the ``draft_ids`` layout of spec_sample

    Finished rows keep their block (their rows are computed and never committed), so a
    fixed k gives a fixed T and the round needs no host synchronisation.
    """
    B, K = draft_tokens.shape
    qs = [1 + min(max(int(num_draft[b]), 0), K) for b in range(B)]
    cu_q[0] = 0
    for b in range(B):
        r = int(cu_q[b])
        block_tokens[r] = last_token[b]
        block_tokens[r + 1:r + qs[b]] = draft_tokens[b, :qs[b] - 1]
        positions[r:r + qs[b]] = int(seq_lens[b]) + np.arange(qs[b])
        if draft_ids is not None:
            draft_ids[r - b:r - b + qs[b] - 1] = draft_tokens[b, :qs[b] - 1]
        cu_q[b + 1] = r + qs[b]
    return cu_q, block_tokens, positions, draft_ids
