"""numpy reference of the draft-side ops: what the drafter needs from the target.

- ``draft_carry``     : the target hidden state of the last committed block row of each
                        sequence (row ``cu_q[b] + accept_len[b] - 1``), the MTP/EAGLE
                        input of the next draft step; owner-or-zero so that the outputs
                        of tensor-/sequence-parallel shards sum to the full carry.
- ``capture_hidden``  : EAGLE3 auxiliary taps: the hidden state after some target layers,
                        written side by side into ``[rows, taps * H]`` (the input of fc).
- ``draft_combine``   : ``RMSNorm(embed) ++ RMSNorm(hidden) -> [rows, 2H]``, the input of
                        MTP's fc / eh_proj and of EAGLE3's midlayer attention.
- ``draft_map_tokens``: EAGLE3 draft vocabulary -> target vocabulary through ``d2t``.
- ``ngram_propose``   : weight-free prompt-lookup drafting (vLLM's ngram proposer, HF's
                        ``prompt_lookup_num_tokens``): the tokens that followed the latest
                        earlier occurrence of the context's last n tokens.

Same names and argument order as ``specdec_lib.ops.draft``; outputs are written into
the caller's arrays and returned. Float math in float64. Every op runs its contract
(``specdec_lib.contract.draft``) first: dtypes by kind, shapes, strides, scalar ranges and
the host-visible values (cu_q, the n-gram lengths) as on the GPU.
"""
from __future__ import annotations

import numpy as np

from ..contract import checked
from .layers import rms_norm_f64 as _rms_norm


@checked("draft_carry")
def draft_carry(hidden, cu_q, accept_len, out, *, row_begin=0, col_begin=0):
    """out[b] = hidden row ``cu_q[b] + accept_len[b] - 1`` (the last committed row).

    hidden      [T_local, H_local]  any dtype (copied bit for bit)
    cu_q        int32 [B + 1]       global block row offsets
    accept_len  int32 [B]           rows committed this round (from seq_stop)
    out         [B, H_out]          same dtype as hidden
    row_begin   global row index of hidden's first row (sequence-parallel shards)
    col_begin   column of out where hidden's columns start (hidden-dim shards)

    Owner-or-zero: every element of out is written; it holds the gathered value where
    this shard owns the row and the column, zero elsewhere, so summing the outputs of
    all shards gives the full carry. A row with accept_len <= 0 (finished) is zero.
    """
    B = accept_len.shape[0]
    T, H = hidden.shape
    out[...] = 0
    for b in range(B):
        a = int(accept_len[b])
        if a <= 0:
            continue
        local = int(cu_q[b]) + a - 1 - row_begin
        if 0 <= local < T:
            out[b, col_begin:col_begin + H] = hidden[local]
    return out


@checked("capture_hidden")
def capture_hidden(hidden, out, tap, *, residual=None):
    """out[:, tap*H:(tap+1)*H] = hidden (+ residual): one EAGLE3 auxiliary tap.

    hidden    [T, H]          the hidden state after the tapped target layer
    residual  [T, H] or None  added first when the layer keeps a separate residual stream
                              (vLLM captures ``hidden_states + residual``)
    out       [T, taps * H]   the concatenated taps, input of the EAGLE3 fc
    tap       0 <= tap < taps
    """
    H = hidden.shape[1]
    x = hidden.astype(np.float64)
    if residual is not None:
        x = x + residual.astype(np.float64)
    out[:, tap * H:(tap + 1) * H] = x
    return out


@checked("draft_combine")
def draft_combine(embed, hidden, embed_norm_weight, hidden_norm_weight, out, *,
                  token_ids=None, eps=1e-6, unit_offset=False):
    """out = RMSNorm(embed) * w_e ++ RMSNorm(hidden) * w_h, shape [rows, 2H].

    embed               [rows, H], or the embedding table [V, H] when token_ids is given
    hidden              [rows, H]
    embed_norm_weight   [H]   (MTP pre_fc_norm_embedding / enorm, EAGLE3 input_layernorm)
    hidden_norm_weight  [H]   (MTP pre_fc_norm_hidden / hnorm, EAGLE3 hidden_norm)
    out                 [rows, 2H]
    token_ids           int [rows] or None: gather embed rows first (fused lookup);
                        an id outside 0..V-1 gives a zero embedding half
    unit_offset         False: weight w (Llama/DeepSeek); True: 1 + w (Qwen3-Next/3.5
                        zero-centred norms)
    """
    rows, H = hidden.shape
    if token_ids is not None:
        V = embed.shape[0]
        e = np.zeros((rows, H), dtype=np.float64)
        ok = (token_ids >= 0) & (token_ids < V)
        e[ok] = embed[token_ids[ok]]
    else:
        e = embed
    ne = _rms_norm(e, embed_norm_weight, eps, unit_offset)
    if token_ids is not None:
        ne[~ok] = 0.0
    out[:, :H] = ne
    out[:, H:] = _rms_norm(hidden, hidden_norm_weight, eps, unit_offset)
    return out


@checked("draft_map_tokens")
def draft_map_tokens(draft_ids, d2t, out, *, offsets=True):
    """EAGLE3 draft-vocabulary ids -> target ids.

    draft_ids  int [N]    ids in 0..Vd-1 (other values map to -1)
    d2t        int [Vd]   offsets (HF EAGLE3 checkpoints: target = draft + d2t[draft]),
                          or absolute target ids with offsets=False
    out        int32 [N]
    """
    Vd = d2t.shape[0]
    for i in range(draft_ids.shape[0]):
        d = int(draft_ids[i])
        if 0 <= d < Vd:
            out[i] = d + int(d2t[d]) if offsets else int(d2t[d])
        else:
            out[i] = -1
    return out


# ---------------------------------------------------------------------------------------
# prompt lookup (n-gram) drafting

@checked("ngram_propose")
def ngram_propose(prompt, prompt_lens, output, output_lens, draft_tokens, num_draft, *,
                  min_n=1, max_n=3, check_indices=True):
    """Propose up to K draft tokens per sequence by prompt lookup.

    prompt        int32 [B, P]   prompt tokens, prompt_lens int32 [B] of them valid
    output        int32 [B, O]   generated tokens, output_lens int32 [B] of them valid
    draft_tokens  int32 [B, K]   OUT (1 <= K <= 64): proposals, -1 after the last
    num_draft     int32 [B]      OUT: m, the number of proposals (0..K)

    The context of sequence b is ``c = prompt[b, :prompt_lens[b]] ++ output[b,
    :output_lens[b]]``, length N. For n = min(max_n, N - 1) down to min_n (longest first)
    the pattern is ``c[N-n:N]``; the match is the LARGEST start i with ``i + n <= N - 1``
    and ``c[i:i+n] == c[N-n:N]`` (it may overlap the pattern). The first n with a match
    wins: ``m = min(K, N - (i + n))`` tokens ``c[i+n : i+n+m]`` are proposed. No match for
    any n (or N < 2): m = 0 and the row is all -1. ``1 <= min_n <= max_n <= 32``.

    ``check_indices=True`` raises ValueError for lengths outside 0..P / 0..O; with False
    they are clamped into range (what the kernel does with such values).
    """
    B, P = prompt.shape
    O = output.shape[1]
    K = draft_tokens.shape[1]
    min_n, max_n = int(min_n), int(max_n)
    for b in range(B):
        lp = min(max(int(prompt_lens[b]), 0), P)
        lo = min(max(int(output_lens[b]), 0), O)
        c = [int(t) for t in prompt[b, :lp]] + [int(t) for t in output[b, :lo]]
        N = len(c)
        draft_tokens[b, :] = -1
        num_draft[b] = 0
        for n in range(min(max_n, N - 1), min_n - 1, -1):
            pattern = c[N - n:]
            match = next((i for i in range(N - 1 - n, -1, -1) if c[i:i + n] == pattern), None)
            if match is not None:
                m = min(K, N - (match + n))
                draft_tokens[b, :m] = c[match + n:match + n + m]
                num_draft[b] = m
                break
    return draft_tokens, num_draft
