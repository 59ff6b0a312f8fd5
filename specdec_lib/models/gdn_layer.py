"""The speculative part of a gated delta-net (GDN) layer, on the library's ops, written once
for the host models that have one (``TinyHybridTarget``, ``LlamaHybridTarget``).

From a layer's projected rows (``qkv`` [T, 2 Hk Dk + Hv Dv], the raw gates ``b``, ``a``
[T, Hv]), one verify block::

    q, k, v = split(conv1d_verify(qkv, conv, conv_state) + SiLU)     # state only read
    o = gdn_verify(q, k, v, a, b, A_log, dt_bias, state, qk_l2norm)  # outputs + a journal

and after acceptance ``commit``: ``gdn_commit`` replays the journal over the first
``accept_len[b]`` rows, ``conv1d_commit`` shifts the same rows of qkv into the conv state.
Fused mode (``FusedJournals``) folds that commit into the next round's verifies instead.
The dense math around it (projections, output gate, norm, output projection) is the host
model's; arrays come from its ``empty(shape, dtype)`` (numpy, cupy or torch).
"""
from __future__ import annotations

from types import SimpleNamespace

from ..contract.attention import MAX_Q_PER_SEQ

# a verify block's most rows a sequence (verify_attention's): what fused mode's pools hold
# a slot unless the decoder tells the target its rounds' (``takes_block_rows``)
FUSED_BLOCK_ROWS = MAX_Q_PER_SEQ


def gdn_dims(c):
    """Hk, Hv, Dk, Dv, W (conv width) and conv_dim of a Qwen3-Next-style config dict."""
    hk, hv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    dk, dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
    return SimpleNamespace(hk=hk, hv=hv, dk=dk, dv=dv, W=int(c["linear_conv_kernel_dim"]),
                           conv_dim=2 * hk * dk + hv * dv)


def gdn_block(be, empty, f32, d, L, qkv, b_gate, a_gate, state, conv_state, slot_ids, cu_q,
              fused=None):
    """One verify block of a GDN layer: ``L`` holds conv [conv_dim, W], A_log, dt_bias [Hv];
    qkv [T, conv_dim], b_gate / a_gate [T, Hv] (views of wider rows are fine). ``fused``:
    the layer's ``FusedJournals.layer`` (fused mode), else None.
    Returns (o [T, Hv, Dv] float32, the record ``gdn_commit_rows`` needs)."""
    T = qkv.shape[0]
    conv_kw, journal, gdn_kw = fused or ({}, None, {})
    conv_out = empty((T, d.conv_dim), f32)
    be.conv1d_verify(qkv, L["conv"], conv_state, slot_ids, cu_q, conv_out, activation="silu",
                     **conv_kw)

    # q / k / v and the gates go in as views (rows of conv_out and of the projection): the
    # op takes any row and head strides, so no copy kernel a tensor (5 a layer a round)
    nk = d.hk * d.dk
    q = conv_out[:, :nk].reshape(T, d.hk, d.dk)
    k = conv_out[:, nk:2 * nk].reshape(T, d.hk, d.dk)
    v = conv_out[:, 2 * nk:].reshape(T, d.hv, d.dv)
    o = empty((T, d.hv, d.dv), f32)
    if journal is None:
        journal = empty((T, be.gdn_journal_width(d.hk, d.hv, d.dk, d.dv)), f32)
    be.gdn_verify(q, k, v, state, slot_ids, cu_q, o, journal, a=a_gate, b=b_gate,
                  A_log=L["A_log"], dt_bias=L["dt_bias"], qk_l2norm=True, **gdn_kw)
    return o, (qkv, journal)


def gdn_commit_rows(be, state, conv_state, slot_ids, cu_q, accept_len, record):
    """Advance the GDN and conv states over the first accept_len[b] rows of the block that
    ``gdn_block`` returned ``record`` for."""
    qkv, journal = record
    be.gdn_commit(state, slot_ids, cu_q, accept_len, journal)
    be.conv1d_commit(conv_state, slot_ids, cu_q, accept_len, qkv)


def _zero(a):
    """a[...] = 0 by one fill on the array's device (torch ``fill_``, numpy / cupy ``fill``)."""
    (a.fill_ if hasattr(a, "fill_") else a.fill)(0)


class FusedJournals:
    """Fused mode of a target's G GDN layers: each pass's conv1d_verify and gdn_verify first
    advance the states over the last round's accepted rows (bit for bit what the commits
    would have done, and written back), so ``commit`` is four copies for every layer at once
    instead of gdn_commit + conv1d_commit a layer. The states lag the accepted tokens by one
    round until ``flush``.

    ``journal``, ``conv_rows``: [current, pending] pools, float32 [G, rows, journal width] and
    [G, rows, conv_dim] (the conv input rows qkv, in their dtype); a fused pass writes the
    current ones and reads the pending ones, which ``commit`` copies it into. ``row0``, ``len``
    int32 [B]: slot b's pending rows are rows row0[b] .. row0[b] + len[b] - 1 of the pending
    pools (a block row keeps its row number). ``rows``: the most rows a fused pass may have."""

    def __init__(self, zeros, f32, i32, conv_dtype, journal_width, conv_dim, G, B, rows):
        self.rows, self.T = rows, 0          # T: rows of the last fused pass
        self.journal = [zeros((G, rows, journal_width), f32) for _ in range(2)]
        self.conv_rows = [zeros((G, rows, conv_dim), conv_dtype) for _ in range(2)]
        self.row0, self.len = zeros((B,), i32), zeros((B,), i32)

    def layer(self, j, T):
        """``gdn_block``'s ``fused`` for GDN layer j of a pass of T rows."""
        pending = dict(pending_row0=self.row0, pending_len=self.len)
        return (dict(journal=self.conv_rows[0][j, :T], pending_journal=self.conv_rows[1][j],
                     **pending),
                self.journal[0][j, :T], dict(pending_journal=self.journal[1][j], **pending))

    def applied(self, T):
        """After a fused pass of T rows: its verifies applied what was pending, so nothing is
        now (a second pass before ``commit`` cannot apply it twice)."""
        self.T = T
        _zero(self.len)

    def commit(self, cu_q, accept_len):
        """The first accept_len[b] rows of slot b in the last fused pass become pending."""
        T = self.T
        self.journal[1][:, :T] = self.journal[0][:, :T]
        self.conv_rows[1][:, :T] = self.conv_rows[0][:, :T]
        self.row0[...] = cu_q[:-1]
        self.len[...] = accept_len

    def flush(self, be, states, slot_ids):
        """Apply the pending rows now; ``states``: (state, conv_state) of each of the G layers."""
        for j, (state, conv_state) in enumerate(states):
            be.gdn_flush(state, slot_ids, self.journal[1][j], self.row0, self.len)
            be.conv1d_flush(conv_state, slot_ids, self.conv_rows[1][j], self.row0, self.len)
        _zero(self.len)
