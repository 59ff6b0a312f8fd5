"""Gated delta net (GDN) for a speculative round: numpy reference (the executable spec).

Per value head h of one sequence, with key head ``h // (Hv // Hk)`` (GVA), per token::

    S = exp(g) * S                       # S is [Dk, Dv]
    S = S + k (beta * (v - S^T k))^T
    o = S^T (q * scale)                  # scale defaults to 1/sqrt(Dk)

q, k optionally L2-normalised first (``x / sqrt(sum x^2 + 1e-6)``); g, beta either
given or fused from raw a, b: ``g = -exp(A_log) * softplus(a + dt_bias)``,
``beta = sigmoid(b)``.

Precision contract (what the kernels implement, in float32): the per-row quantities
that the commit replays -- normalised k, v, g, beta -- are float32 values (they are
exactly what the journal stores); the recurrence is evaluated (here in float64) from
the stored state and the state is rounded to its storage dtype after *every* token,
the output of a token being taken from the unrounded state, exactly as one-token
decoding with a state stored in that dtype would do. Hence
``gdn_verify`` + ``gdn_commit(accept_len=n)`` equals ``gdn_decode_reference`` over
the first n rows, bit for bit in this reference.

State pool: ``[slots, Hv, Dk, Dv]`` (layout "kv") or ``[slots, Hv, Dv, Dk]``
(layout "vk"), float32, float16 or bfloat16 (numpy uint16 holding the bits).
A negative slot id marks a padding row of the batch: its outputs are zeros and its
state is never touched. Any other slot id must be in range and used once.

Journal (written by ``gdn_verify``, read by ``gdn_commit``): float32
``[T, gdn_journal_width(Hk, Hv, Dk, Dv)]``, per block row the concatenation
``k_hat [Hk*Dk] | v [Hv*Dv] | g [Hv] | beta [Hv]`` (k_hat: normalised k, unscaled).
"""
from __future__ import annotations

import numpy as np

from ..contract import checked
from ..contract._batch import check_batch
from ..contract.gdn import check_gating, journal_num_k_heads
from ..contract.gdn import gdn_journal_width  # noqa: F401 (the reference backend's too)
from ..dtypes import bf16_bits_to_f32, f32_to_bf16_bits  # noqa: F401 (re-exported)

L2NORM_EPS = 1e-6


# ------------------------------------------------------------------ dtype helpers
# bfloat16 travels as uint16 bit patterns (numpy has no bfloat16).

def to_f64(a):
    """Array (float32/float16/float64, or uint16 = bfloat16 bits) -> float64."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return bf16_bits_to_f32(a).astype(np.float64)
    return a.astype(np.float64)


def round_to(x, dtype):
    """float64 values rounded to storage ``dtype`` (uint16 = bfloat16), returned as float64."""
    dtype = np.dtype(dtype)
    if dtype == np.uint16:
        return bf16_bits_to_f32(f32_to_bf16_bits(np.asarray(x, np.float64).astype(np.float32))).astype(np.float64)
    return np.asarray(x, np.float64).astype(dtype).astype(np.float64)


def store(dst, x):
    """Write float64 values into ``dst`` in its dtype (uint16 = bfloat16 bits)."""
    if dst.dtype == np.uint16:
        dst[...] = f32_to_bf16_bits(np.asarray(x, np.float64).astype(np.float32))
    else:
        dst[...] = np.asarray(x, np.float64).astype(dst.dtype)


# ------------------------------------------------------------------ shapes

def _state_dims(state, layout):
    slots, Hv, d1, d2 = state.shape
    Dk, Dv = (d1, d2) if layout == "kv" else (d2, d1)
    return slots, Hv, Dk, Dv


class _Rows:
    """The per-row quantities of one GDN block, computed once (float32 where journalled)."""

    def __init__(self, q, k, v, Hv, Dk, Dv, g, beta, a, b, A_log, dt_bias, scale, qk_l2norm):
        q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
        T, Hk, _ = q.shape
        if check_gating(g, beta, a, b, A_log, dt_bias):
            x = to_f64(a) + to_f64(dt_bias)[None, :]
            softplus = np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))
            g64 = -np.exp(to_f64(A_log))[None, :] * softplus
            beta64 = 1.0 / (1.0 + np.exp(-to_f64(b)))
        else:
            g64, beta64 = to_f64(g), to_f64(beta)
        q64, k64 = to_f64(q), to_f64(k)
        if qk_l2norm:
            q64 = q64 / np.sqrt(np.sum(q64 * q64, axis=-1, keepdims=True) + L2NORM_EPS)
            k64 = k64 / np.sqrt(np.sum(k64 * k64, axis=-1, keepdims=True) + L2NORM_EPS)
        self.scale = 1.0 / np.sqrt(Dk) if scale is None else float(scale)
        self.T, self.Hk, self.Hv, self.Dk, self.Dv = T, Hk, Hv, Dk, Dv
        self.q = q64 * self.scale                                  # [T, Hk, Dk] f64
        self.k = k64.astype(np.float32)                            # journalled as f32
        self.v = to_f64(v).astype(np.float32)
        self.g = g64.astype(np.float32)
        self.beta = beta64.astype(np.float32)

    def journal(self, out):
        T, Hk, Hv, Dk, Dv = self.T, self.Hk, self.Hv, self.Dk, self.Dv
        o = 0
        out[:, o:o + Hk * Dk] = self.k.reshape(T, Hk * Dk); o += Hk * Dk
        out[:, o:o + Hv * Dv] = self.v.reshape(T, Hv * Dv); o += Hv * Dv
        out[:, o:o + Hv] = self.g; o += Hv
        out[:, o:o + Hv] = self.beta


def _journal_rows(journal, Hv, Dk, Dv):
    """Unpacks a journal [T, W] into (k [T,Hk,Dk], v [T,Hv,Dv], g [T,Hv], beta [T,Hv]) f32."""
    journal = np.asarray(journal)
    T, W = journal.shape
    Hk = journal_num_k_heads(W, Hv, Dk, Dv)
    o = 0
    k = journal[:, o:o + Hk * Dk].reshape(T, Hk, Dk); o += Hk * Dk
    v = journal[:, o:o + Hv * Dv].reshape(T, Hv, Dv); o += Hv * Dv
    g = journal[:, o:o + Hv]; o += Hv
    beta = journal[:, o:o + Hv]
    return k, v, g, beta


# ------------------------------------------------------------------ the recurrence

def _load_state(state, slot, layout):
    s = to_f64(state[slot])                        # [Hv, Dk, Dv] or [Hv, Dv, Dk]
    return s if layout == "kv" else s.transpose(0, 2, 1).copy()


def _save_state(state, slot, S, layout):
    store(state[slot], S if layout == "kv" else S.transpose(0, 2, 1))


def _step(S, k, v, g, beta, q, dtype):
    """One token for all heads. S [Hv,Dk,Dv] f64 (rounded to dtype), k/q [Hv,Dk], v [Hv,Dv],
    g/beta [Hv]. Returns (new rounded S, o [Hv,Dv] from the unrounded state or None)."""
    S = S * np.exp(g.astype(np.float64))[:, None, None]
    kv = np.einsum("hij,hi->hj", S, k)
    delta = beta.astype(np.float64)[:, None] * (v - kv)
    S = S + k[:, :, None] * delta[:, None, :]
    o = None if q is None else np.einsum("hij,hi->hj", S, q)
    return round_to(S, dtype), o


def _run_rows(state, slot, layout, rows, r0, r1, head_of_v, out=None, commit=False):
    """Runs rows r0..r1-1 (global row ids) from the stored state of ``slot``."""
    S = _load_state(state, slot, layout)
    for t in range(r0, r1):
        k = rows.k[t][head_of_v].astype(np.float64)
        q = None if out is None else rows.q[t][head_of_v]
        S, o = _step(S, k, rows.v[t].astype(np.float64), rows.g[t], rows.beta[t], q, state.dtype)
        if out is not None:
            store(out[t], o)
    if commit:
        _save_state(state, slot, S, layout)


@checked("gdn_verify")
def gdn_verify(q, k, v, state, slot_ids, cu_q, out, journal, *, g=None, beta=None, a=None,
               b=None, A_log=None, dt_bias=None, scale=None, qk_l2norm=False, layout="kv",
               pending_journal=None, pending_row0=None, pending_len=None):
    """Outputs of every block row from the committed state; the state is not written.

    q, k [T, Hk, Dk]; v [T, Hv, Dv]; state [slots, Hv, Dk, Dv] ("kv") or
    [slots, Hv, Dv, Dk] ("vk"); slot_ids [B]; cu_q [B+1]; out [T, Hv, Dv] (written);
    journal float32 [T, gdn_journal_width(Hk, Hv, Dk, Dv)] (written). Returns (out, journal).

    Fused mode (``pending_journal`` given, with ``pending_row0`` and ``pending_len`` [B]):
    each state is first advanced over its pending rows exactly as gdn_flush does (the
    commit of the previous round, folded in; the state IS written then), and the block is
    verified from the advanced state. The argument contract
    (``specdec_lib.contract.gdn.gdn_verify``) runs before anything is written.
    """
    slots, Hv, Dk, Dv = _state_dims(state, layout)
    rows = _Rows(q, k, v, Hv, Dk, Dv, g, beta, a, b, A_log, dt_bias, scale, qk_l2norm)
    Hk = rows.Hk
    slot_ids, cu_q = _ints(slot_ids), _ints(cu_q)
    if pending_journal is not None:
        _replay(state, slot_ids, pending_journal, _ints(pending_row0), _ints(pending_len), layout)
    head_of_v = np.arange(Hv) // (Hv // Hk)
    rows.journal(journal)
    for bi, slot in enumerate(slot_ids):
        r0, r1 = int(cu_q[bi]), int(cu_q[bi + 1])
        if slot < 0:
            store(out[r0:r1], np.zeros((r1 - r0, Hv, Dv)))
            continue
        _run_rows(state, int(slot), layout, rows, r0, r1, head_of_v, out=out)
    return out, journal


def _ints(a):
    return np.asarray(a).astype(np.int64)


def _replay(state, slot_ids, journal, row0, n, layout):
    """Advances state[slot_ids[b]] over journal rows row0[b] .. row0[b]+n[b]-1 (in place)."""
    slots, Hv, Dk, Dv = _state_dims(state, layout)
    jk, jv, jg, jbeta = _journal_rows(journal, Hv, Dk, Dv)
    Hk = jk.shape[1]

    class _J:
        pass
    rows = _J()
    rows.k, rows.v, rows.g, rows.beta = jk, jv, jg, jbeta
    head_of_v = np.arange(Hv) // (Hv // Hk)
    for bi, slot in enumerate(slot_ids):
        if slot < 0 or n[bi] == 0:
            continue
        r0 = int(row0[bi])
        _run_rows(state, int(slot), layout, rows, r0, r0 + int(n[bi]), head_of_v, commit=True)


@checked("gdn_commit")
def gdn_commit(state, slot_ids, cu_q, accept_len, journal, *, layout="kv"):
    """Advances each sequence's state over its first accept_len[b] block rows (in place).

    Replays the journal written by gdn_verify; accept_len[b] = 0 leaves the state
    untouched, as does a negative slot id. Returns state.
    """
    slot_ids, cu_q, acc = _ints(slot_ids), _ints(cu_q), _ints(accept_len)
    _replay(state, slot_ids, journal, cu_q[:-1], acc, layout)
    return state


@checked("gdn_flush")
def gdn_flush(state, slot_ids, pending_journal, pending_row0, pending_len, *, layout="kv"):
    """Commits pending rows (fused mode): advances state[slot_ids[b]] over rows
    pending_row0[b] .. + pending_len[b] - 1 of ``pending_journal`` (a previous gdn_verify's
    journal), in place. For sequences that leave the batch, or before reading a state that a
    fused verify has not caught up yet. Returns state."""
    _replay(state, _ints(slot_ids), pending_journal, _ints(pending_row0), _ints(pending_len),
            layout)
    return state


def gdn_decode_reference(q, k, v, state, slot_ids, cu_q, out, *, g=None, beta=None, a=None,
                         b=None, A_log=None, dt_bias=None, scale=None, qk_l2norm=False,
                         layout="kv"):
    """Plain sequential decoding: every row of every sequence is run and committed, one
    token at a time, the state stored (rounded to its dtype) after each. The oracle of
    verify + commit. Same arguments as gdn_verify without the journal. Returns (out, state).
    """
    slots, Hv, Dk, Dv = _state_dims(state, layout)
    rows = _Rows(q, k, v, Hv, Dk, Dv, g, beta, a, b, A_log, dt_bias, scale, qk_l2norm)
    T, Hk = rows.T, rows.Hk
    if out.shape != (T, Hv, Dv):
        raise ValueError(f"out: expected shape {(T, Hv, Dv)}, got {out.shape}")
    slot_ids, cu_q = check_batch(slot_ids, cu_q, T, slots)
    head_of_v = np.arange(Hv) // (Hv // Hk)
    for bi, slot in enumerate(slot_ids):
        r0, r1 = int(cu_q[bi]), int(cu_q[bi + 1])
        if slot < 0:
            store(out[r0:r1], np.zeros((r1 - r0, Hv, Dv)))
            continue
        for t in range(r0, r1):    # one token = load, step, store
            _run_rows(state, int(slot), layout, rows, t, t + 1, head_of_v, out=out, commit=True)
    return out, state
