"""The speculative part of a gated delta-net (GDN) layer, on the library's ops, written once
for the host models that have one (``TinyHybridTarget``, ``SmolLM2HybridTarget``).

From a layer's projected rows (``qkv`` [T, 2 Hk Dk + Hv Dv], the raw gates ``b``, ``a``
[T, Hv]), one verify block::

    q, k, v = split(conv1d_verify(qkv, conv, conv_state) + SiLU)     # state only read
    o = gdn_verify(q, k, v, a, b, A_log, dt_bias, state, qk_l2norm)  # outputs + a journal

and after acceptance ``commit``: ``gdn_commit`` replays the journal over the first
``accept_len[b]`` rows, ``conv1d_commit`` shifts the same rows of qkv into the conv state.
The dense math around it (projections, output gate, norm, output projection) is the host
model's; arrays come from its ``empty(shape, dtype)`` (numpy, cupy or torch).
"""
from __future__ import annotations

from types import SimpleNamespace


def gdn_dims(c):
    """Hk, Hv, Dk, Dv, W (conv width) and conv_dim of a Qwen3-Next-style config dict."""
    hk, hv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    dk, dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
    return SimpleNamespace(hk=hk, hv=hv, dk=dk, dv=dv, W=int(c["linear_conv_kernel_dim"]),
                           conv_dim=2 * hk * dk + hv * dv)


def gdn_block(be, empty, f32, d, L, qkv, b_gate, a_gate, state, conv_state, slot_ids, cu_q):
    """One verify block of a GDN layer: ``L`` holds conv [conv_dim, W], A_log, dt_bias [Hv];
    qkv [T, conv_dim], b_gate / a_gate [T, Hv] (views of wider rows are fine).
    Returns (o [T, Hv, Dv] float32, the record ``gdn_commit_rows`` needs)."""
    T = qkv.shape[0]
    conv_out = empty((T, d.conv_dim), f32)
    be.conv1d_verify(qkv, L["conv"], conv_state, slot_ids, cu_q, conv_out, activation="silu")

    def dense(x, shape):
        # gdn_verify gets contiguous q / k / v and gates, as the tiny hybrid always gave it
        # (its strided-row path has no GPU test)
        out = empty(shape, f32)
        out[...] = x.reshape(shape)
        return out
    nk = d.hk * d.dk
    q = dense(conv_out[:, :nk], (T, d.hk, d.dk))
    k = dense(conv_out[:, nk:2 * nk], (T, d.hk, d.dk))
    v = dense(conv_out[:, 2 * nk:], (T, d.hv, d.dv))
    o = empty((T, d.hv, d.dv), f32)
    journal = empty((T, be.gdn_journal_width(d.hk, d.hv, d.dk, d.dv)), f32)
    be.gdn_verify(q, k, v, state, slot_ids, cu_q, o, journal, a=dense(a_gate, (T, d.hv)),
                  b=dense(b_gate, (T, d.hv)), A_log=L["A_log"], dt_bias=L["dt_bias"],
                  qk_l2norm=True)
    return o, (qkv, journal)


def gdn_commit_rows(be, state, conv_state, slot_ids, cu_q, accept_len, record):
    """Advance the GDN and conv states over the first accept_len[b] rows of the block that
    ``gdn_block`` returned ``record`` for."""
    qkv, journal = record
    be.gdn_commit(state, slot_ids, cu_q, accept_len, journal)
    be.conv1d_commit(conv_state, slot_ids, cu_q, accept_len, qkv)
