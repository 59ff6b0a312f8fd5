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

Same names and argument order as ``specdec_lib.ops.draft``; outputs are written into
the caller's arrays and returned. Float math in float64.
"""
from __future__ import annotations

import numpy as np

from ._checks import np_array
from .layers import rms_norm_f64 as _rms_norm


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
    np_array("hidden", hidden, 2)
    np_array("cu_q", cu_q, 1)
    np_array("accept_len", accept_len, 1)
    np_array("out", out, 2)
    B = accept_len.shape[0]
    T, H = hidden.shape
    if cu_q.shape[0] != B + 1:
        raise ValueError(f"cu_q: expected shape ({B + 1},), got {cu_q.shape}")
    if out.shape[0] != B:
        raise ValueError(f"out: first dimension {out.shape[0]} != batch {B}")
    if out.dtype != hidden.dtype:
        raise TypeError(f"out: dtype {out.dtype} != hidden dtype {hidden.dtype}")
    if col_begin < 0 or col_begin + H > out.shape[1]:
        raise ValueError(f"col_begin: columns {col_begin}..{col_begin + H} do not fit "
                         f"out's {out.shape[1]} columns")
    out[...] = 0
    for b in range(B):
        a = int(accept_len[b])
        if a <= 0:
            continue
        local = int(cu_q[b]) + a - 1 - row_begin
        if 0 <= local < T:
            out[b, col_begin:col_begin + H] = hidden[local]
    return out


def capture_hidden(hidden, out, tap, *, residual=None):
    """out[:, tap*H:(tap+1)*H] = hidden (+ residual): one EAGLE3 auxiliary tap.

    hidden    [T, H]          the hidden state after the tapped target layer
    residual  [T, H] or None  added first when the layer keeps a separate residual stream
                              (vLLM captures ``hidden_states + residual``)
    out       [T, taps * H]   the concatenated taps, input of the EAGLE3 fc
    tap       0 <= tap < taps
    """
    np_array("hidden", hidden, 2)
    np_array("out", out, 2)
    T, H = hidden.shape
    if out.shape[0] != T:
        raise ValueError(f"out: {out.shape[0]} rows != hidden's {T}")
    if H == 0 or out.shape[1] % H:
        raise ValueError(f"out: {out.shape[1]} columns is not a multiple of H={H}")
    taps = out.shape[1] // H
    if not 0 <= tap < taps:
        raise ValueError(f"tap: {tap} out of range for {taps} taps")
    x = hidden.astype(np.float64)
    if residual is not None:
        np_array("residual", residual, 2)
        if residual.shape != hidden.shape:
            raise ValueError(f"residual: shape {residual.shape} != hidden {hidden.shape}")
        x = x + residual.astype(np.float64)
    out[:, tap * H:(tap + 1) * H] = x
    return out


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
    np_array("hidden", hidden, 2)
    np_array("embed", embed, 2)
    np_array("out", out, 2)
    rows, H = hidden.shape
    if embed.shape[1] != H:
        raise ValueError(f"embed: width {embed.shape[1]} != hidden width {H}")
    if out.shape != (rows, 2 * H):
        raise ValueError(f"out: expected shape {(rows, 2 * H)}, got {out.shape}")
    for name, w in (("embed_norm_weight", embed_norm_weight),
                    ("hidden_norm_weight", hidden_norm_weight)):
        np_array(name, w, 1)
        if w.shape[0] != H:
            raise ValueError(f"{name}: expected shape ({H},), got {w.shape}")
    if token_ids is not None:
        np_array("token_ids", token_ids, 1)
        if token_ids.shape[0] != rows:
            raise ValueError(f"token_ids: {token_ids.shape[0]} ids != {rows} hidden rows")
        V = embed.shape[0]
        e = np.zeros((rows, H), dtype=np.float64)
        ok = (token_ids >= 0) & (token_ids < V)
        e[ok] = embed[token_ids[ok]]
    else:
        if embed.shape[0] != rows:
            raise ValueError(f"embed: {embed.shape[0]} rows != hidden's {rows}")
        e = embed
    ne = _rms_norm(e, embed_norm_weight, eps, unit_offset)
    if token_ids is not None:
        ne[~ok] = 0.0
    out[:, :H] = ne
    out[:, H:] = _rms_norm(hidden, hidden_norm_weight, eps, unit_offset)
    return out


def draft_map_tokens(draft_ids, d2t, out, *, offsets=True):
    """EAGLE3 draft-vocabulary ids -> target ids.

    draft_ids  int [N]    ids in 0..Vd-1 (other values map to -1)
    d2t        int [Vd]   offsets (HF EAGLE3 checkpoints: target = draft + d2t[draft]),
                          or absolute target ids with offsets=False
    out        int32 [N]
    """
    np_array("draft_ids", draft_ids, 1)
    np_array("d2t", d2t, 1)
    np_array("out", out, 1)
    if out.shape != draft_ids.shape:
        raise ValueError(f"out: shape {out.shape} != draft_ids {draft_ids.shape}")
    Vd = d2t.shape[0]
    for i in range(draft_ids.shape[0]):
        d = int(draft_ids[i])
        if 0 <= d < Vd:
            out[i] = d + int(d2t[d]) if offsets else int(d2t[d])
        else:
            out[i] = -1
    return out
