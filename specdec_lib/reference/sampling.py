"""numpy reference of ``spec_sample``: exact speculative (rejection) sampling from logits.

This file is the executable spec the CUDA kernels (cuda_src/sampling/spec_sample.cu) are
tested against. Everything is computed in float64 from the logits as given.

Layout
------
* ``logits [T, V]``: the verify blocks of B sequences stacked; block b is rows
  ``cu_q[b] .. cu_q[b+1]-1`` (``q_b = cu_q[b+1]-cu_q[b] >= 1`` rows, ``k_b = q_b-1``
  drafts). Block row i scores the token after block position i, so row i verifies
  draft ``d_{i+1}`` and row ``k_b`` gives the bonus token.
* ``draft_ids [T-B]`` int32, target-vocabulary ids: block b's drafts ``d1..dk`` are
  ``draft_ids[cu_q[b]-b : cu_q[b+1]-b-1]`` (the block rows minus one per sequence).
* ``draft_probs [T-B, Vd]`` float (optional): the draft distribution that proposed each
  draft, same row layout as ``draft_ids``. Without it the draft is one-hot (q(d)=1: the
  EAGLE/MTP greedy-draft case).
* ``d2t [Vd]`` int32 (optional, only with draft_probs): the draft vocabulary as absolute,
  strictly increasing target ids (EAGLE3 checkpoints store offsets: pass
  ``arange(Vd) + d2t_offsets``). Without it ``Vd`` must equal ``V``.
* outputs: ``num_accepted [B]`` int32 = n, ``emitted [B, W]`` int32 (``W >= max q_b``):
  ``d1..dn`` then the correction / bonus token, padded with -1; ``status [B]`` int32;
  optional ``accepted_logprobs [B, W]`` float32: log-probability of each emitted token
  under the distribution of the row that produced it (padding 0.0).

Per-request parameters ([B] each): ``temperature`` (``not > 0`` -> greedy), ``top_k``
(``<= 0`` or ``>= V`` -> off), ``top_p`` (``>= 1`` or NaN -> off), ``min_p`` (``<= 0`` or NaN
-> off, clamped to 1), ``seed`` (64-bit), ``step`` (64-bit).

Target distribution of a sampled row (filter order temperature -> top-k -> top-p -> min-p)
------------------------------------------------------------------------------------------
``s = logits / temperature``. Each filter keeps the tokens whose logit is >= a threshold,
so the kept set is ``{t : logit_t >= tau}`` with ties at the threshold always kept:

* top-k: tau_k = the k-th largest logit (counted with multiplicity).
* top-p (on the top-k-renormalised distribution): with ``m(tau) = sum_{kept, logit >= tau}
  exp(s - max s)``, tau_p = the largest logit value with ``m(tau) >= top_p * m(tau_k)``
  (top_p <= 0 keeps only the maximum and its ties).
* min-p: keep ``exp(s_t - max s) >= min_p`` (p_t >= min_p * p_max).

Thresholds are on the raw logits, so the kept set never depends on the rounding of
``logit / temperature``. ``p`` is softmax(s) restricted to the kept set.

Round (sampled rows)
--------------------
For i = 0..k-1 with x = d_{i+1}: if x is out of range (or not in the draft vocabulary)
the draft is rejected. Otherwise with ``u = uniform(ACCEPT, row i)`` accept iff
``u * q(x) < p(x)`` (probability min(1, p/q)). At the first rejection, row i samples from
``normalise(max(0, p - q))`` (one-hot: p without x; if that has no mass, from p); if all k
are accepted row k samples the bonus from p.

Sampling a distribution w (the two-level exponential race)
----------------------------------------------------------
The vocabulary is cut into fixed tiles of ``TILE`` tokens (a constant of the spec, not of
the launch). Tile ``c* = argmax_c log W_c - log E_c`` over tiles with mass ``W_c > 0``,
then token ``argmax_{t in c*, w_t > 0} log w_t - log E_t``, ties to the lowest index, with
E ~ Exp(1) from Philox keyed (seed, step, block row, purpose, tile / token). P(c*) =
W_c/W and P(t | c*) = w_t/W_c, so the token is exactly w-distributed, and the kernel
only needs per-tile sums from its vocab-split pass plus one tile of logits at the end.

Greedy rows (temperature not > 0): argmax over non-NaN logits (NaN never wins, +-inf are
ordinary values, lowest id wins ties); accept while d_{i+1} == argmax_i, then emit argmax_n.
Logprobs of greedy rows are log_softmax of the raw logits (temperature 1, no filters).

Status (precedence BAD_LAYOUT > NONFINITE > EMPTY > BAD_DRAFT; the block's first applicable)
----------------------------------------------------------------------------------------
0 ok; 1 NaN or +inf logit in a block row; 2 a draft id out of range / not in the draft
vocabulary; 3 a row with nothing to sample (sampled: max logit is -inf or NaN-only;
greedy: all NaN); 4 bad layout (q_b < 1, q_b > W, or the block / its drafts outside [0, T) / [0, T-B));
5 filter skipped: the call passed ``filters=False`` (a promise that no request filters, so
the GPU op skips its threshold launches) but this sampled request has top_k in (0, V),
top_p < 1 or min_p > 0 (checked after 4, before the others).
The block is *invalid* (num_accepted 0, emitted all -1, logprobs 0) when status is 4 or 5, or
for sampled requests when status is 1 or 3, or for greedy requests when a row is all NaN.
Otherwise outputs follow the rules above (a bad draft id simply counts as rejected).

Philox keys: key = (seed lo32, seed hi32); counter = (index, row | purpose << 24,
step lo32, step hi32); the first output word is used.
"""
from __future__ import annotations

import numpy as np

from ..contract import checked

TILE = 2048                   # tokens per tile of the two-level race (spec constant)
PURPOSE_ACCEPT = 0            # counter index 0
PURPOSE_TILE = 1              # counter index = tile id
PURPOSE_TOKEN = 2             # counter index = token id

STATUS_OK = 0
STATUS_NONFINITE = 1
STATUS_BAD_DRAFT = 2
STATUS_EMPTY = 3
STATUS_BAD_LAYOUT = 4
STATUS_FILTER_SKIPPED = 5
STATUS_NAMES = {0: "ok", 1: "nonfinite_logits", 2: "bad_draft_id", 3: "empty_distribution",
                4: "bad_layout", 5: "filter_skipped"}

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_MASK = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


# ----------------------------------------------------------------------------- Philox
def philox4x32_10(counter, key):
    """Philox4x32-10 (Salmon et al. 2011, the Random123 definition), vectorised.

    counter: 4 uint32 arrays (broadcastable), key: 2 uint32 arrays. Returns 4 uint32 arrays.
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _MASK for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) & _MASK for k in key)
    for r in range(10):
        if r:
            k0 = (k0 + _W0) & _MASK
            k1 = (k1 + _W1) & _MASK
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = ((p1 >> _S32) ^ c1 ^ k0, p1 & _MASK, (p0 >> _S32) ^ c3 ^ k1, p0 & _MASK)
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def _u64(x):
    """int / int64 / uint64 (arrays) -> uint64 two's complement."""
    a = np.asarray(x)
    if a.dtype.kind == "u":
        return a.astype(np.uint64)
    return a.astype(np.int64).view(np.uint64) if a.dtype == np.int64 else \
        np.asarray(a, dtype=np.int64).view(np.uint64)


def philox_bits(seed, step, row, purpose, index):
    """The 32 random bits of (seed, step, block row, purpose, index); broadcasts."""
    s = _u64(seed)
    t = _u64(step)
    row = np.asarray(row, dtype=np.uint64)
    idx = np.asarray(index, dtype=np.uint64)
    ctr = (idx, row | (np.uint64(purpose) << np.uint64(24)), t & _MASK, t >> _S32)
    return philox4x32_10(ctr, (s & _MASK, s >> _S32))[0]


def uniform_accept(bits):
    """[0, 1) on a 2^-24 grid (exactly representable in float32 too)."""
    return (np.asarray(bits, dtype=np.uint32) >> np.uint32(8)).astype(np.float64) * 2.0 ** -24


def exponential(bits):
    """Exp(1) from 32 bits without losing precision at either end: -log(u) for small u,
    -log1p(-(1-u)) computed from the complement for u near 1; u = (x + 0.5) / 2^32."""
    x = np.asarray(bits, dtype=np.uint32).astype(np.float64)
    lo = x < 2.0 ** 31
    u = (x + 0.5) * 2.0 ** -32
    c = (2.0 ** 32 - x - 0.5) * 2.0 ** -32
    with np.errstate(divide="ignore"):
        return np.where(lo, -np.log(np.where(lo, u, 0.5)), -np.log1p(-np.where(lo, 0.5, c)))


# ----------------------------------------------------------------------------- one row
def filtered_probs(logits_row, temperature, top_k, top_p, min_p):
    """Sampled-row target distribution p [V] (float64, sums to 1), or None if empty."""
    l = np.asarray(logits_row, dtype=np.float64)
    V = l.shape[0]
    if np.isnan(l).any() or np.isposinf(l).any():
        return None
    mx = l.max() if V else -np.inf
    if not np.isfinite(mx):
        return None
    s = l / float(temperature)
    sm = s.max()
    e = np.exp(s - sm)
    keep = np.ones(V, dtype=bool)
    if 0 < int(top_k) < V:
        tau_k = np.sort(l)[::-1][int(top_k) - 1]
        keep &= l >= tau_k
    tp = float(top_p)
    if tp < 1.0:                       # NaN compares False: off
        order = np.argsort(-l, kind="stable")
        order = order[keep[order]]
        cum = np.cumsum(e[order])
        target = tp * cum[-1]
        j = int(np.searchsorted(cum, target, side="left")) if tp > 0 else 0
        j = min(j, len(order) - 1)
        keep &= l >= l[order[j]]
    mp = float(min_p)
    if mp > 0:
        keep &= e >= min(mp, 1.0)
    w = np.where(keep, e, 0.0)
    return w / w.sum()


def greedy_argmax(logits_row):
    """Lowest index of the largest non-NaN value, -1 if all NaN."""
    l = np.asarray(logits_row, dtype=np.float64)
    ok = ~np.isnan(l)
    if not ok.any():
        return -1
    m = l[ok].max()
    return int(np.flatnonzero(ok & (l == m))[0])


def greedy_logprobs(logits_row):
    l = np.asarray(logits_row, dtype=np.float64)
    l = l[~np.isnan(l)]
    m = l.max()
    with np.errstate(invalid="ignore", over="ignore"):
        return m + np.log(np.exp(l - m).sum())


def race_sample(w, seed, step, row):
    """Two-level exponential race over weights w [V] >= 0 (see module doc). -1 if no mass."""
    w = np.asarray(w, dtype=np.float64)
    V = w.shape[0]
    nt = -(-V // TILE)
    Wc = np.add.reduceat(w, np.arange(0, V, TILE)) if V else np.zeros(0)
    if not (Wc > 0).any():
        return -1
    with np.errstate(divide="ignore"):
        tk = np.log(Wc) - np.log(exponential(philox_bits(seed, step, row, PURPOSE_TILE,
                                                         np.arange(nt))))
    tk[~(Wc > 0)] = -np.inf
    c = int(np.argmax(tk))
    ids = np.arange(c * TILE, min(V, (c + 1) * TILE))
    wt = w[ids]
    with np.errstate(divide="ignore"):
        key = np.log(wt) - np.log(exponential(philox_bits(seed, step, row, PURPOSE_TOKEN, ids)))
    key[~(wt > 0)] = -np.inf
    return int(ids[int(np.argmax(key))])


# ----------------------------------------------------------------------------- the op
def request_filters(V, temperature, top_k, top_p, min_p):
    """True iff a request's target distribution is cut by top-k, top-p or min-p (greedy
    requests never are): what ``filters=False`` promises never happens."""
    if not (float(temperature) > 0):
        return False
    return 0 < int(top_k) < V or float(top_p) < 1.0 or float(min_p) > 0


@checked("spec_sample")
def spec_sample(logits, cu_q, draft_ids, temperature, top_k, top_p, min_p, seed, step,
                num_accepted, emitted, status, draft_probs=None, d2t=None,
                accepted_logprobs=None, *, filters=None):
    """Reference of ``specdec_lib.ops.spec_sample`` (see the module doc for the layout).

    Writes num_accepted / emitted / status (/ accepted_logprobs) and returns them.
    ``filters=False``: status 5 for sampled requests that filter (see the module doc).
    The arguments pass the op's contract first (``specdec_lib.contract.sampling``: a
    ``cu_q`` that decreases or does not end at T, or an ``emitted`` narrower than a block,
    is a ValueError); ``spec_sample.unchecked`` skips it and flags such blocks with status
    4, as the kernels do with ``check_indices=False``. ``step`` must advance between calls
    with the same seeds (``specdec_lib.ops.advance_step``): see the op's docstring.
    """
    T, V = logits.shape
    B = cu_q.shape[0] - 1
    W = emitted.shape[1]
    emitted[...] = -1
    num_accepted[...] = 0
    status[...] = STATUS_OK
    if accepted_logprobs is not None:
        accepted_logprobs[...] = 0.0
    for b in range(B):
        r0, r1 = int(cu_q[b]), int(cu_q[b + 1])
        q = r1 - r0
        if q < 1 or q > W or r0 < 0 or r1 > T or r0 - b < 0 or r1 - b - 1 > T - B:
            status[b] = STATUS_BAD_LAYOUT
            continue
        if filters is not None and not filters and request_filters(
                V, temperature[b], top_k[b], top_p[b], min_p[b]):
            status[b] = STATUS_FILTER_SKIPPED
            continue
        k = q - 1
        d0 = r0 - b
        drafts = [int(x) for x in draft_ids[d0:d0 + k]]
        res = sample_block(logits[r0:r1], drafts, float(temperature[b]), int(top_k[b]),
                           float(top_p[b]), float(min_p[b]), seed[b], step[b],
                           None if draft_probs is None else draft_probs[d0:d0 + k], d2t)
        st, n, toks, lps = res
        status[b] = st
        if toks is None:
            continue
        num_accepted[b] = n
        emitted[b, :n + 1] = toks
        if accepted_logprobs is not None:
            accepted_logprobs[b, :n + 1] = lps
    return num_accepted, emitted, status


def _draft_q(draft_row, d2t, V):
    """Draft distribution over the target vocabulary [V] (float64)."""
    qv = np.zeros(V)
    if d2t is None:
        qv[:] = draft_row
    else:
        qv[np.asarray(d2t, dtype=np.int64)] = draft_row
    return qv


def _draft_ok(x, V, d2t):
    if x < 0 or x >= V:
        return False
    if d2t is not None:
        j = int(np.searchsorted(d2t, x))
        return j < len(d2t) and int(d2t[j]) == x
    return True


def _status(block, drafts, V, d2t, greedy):
    bl = np.asarray(block, dtype=np.float64)
    nonfinite = bool(np.isnan(bl).any() or np.isposinf(bl).any())
    if greedy:
        empty = bool(np.isnan(bl).all(axis=1).any()) if V else True
    else:
        with np.errstate(invalid="ignore"):
            rowmax = np.where(np.isnan(bl), -np.inf, bl).max(axis=1) if V else np.full(len(bl), -np.inf)
        empty = bool((rowmax == -np.inf).any())
    bad = any(not _draft_ok(x, V, d2t) for x in drafts)
    st = STATUS_NONFINITE if nonfinite else STATUS_EMPTY if empty else \
        STATUS_BAD_DRAFT if bad else STATUS_OK
    invalid = (st in (STATUS_NONFINITE, STATUS_EMPTY)) if not greedy else empty
    return st, invalid


def sample_block(block, drafts, temperature, top_k, top_p, min_p, seed, step,
                 draft_rows=None, d2t=None):
    """One sequence: block [q, V] logits, drafts [k]. Returns (status, n, tokens, logprobs);
    tokens is None for an invalid block."""
    q, V = block.shape
    k = q - 1
    greedy = not (temperature > 0)
    st, invalid = _status(block, drafts, V, d2t, greedy)
    if invalid:
        return st, 0, None, None
    toks, lps = [], []
    if greedy:
        for i in range(q):
            a = greedy_argmax(block[i])
            lse = greedy_logprobs(block[i])
            if i < k and drafts[i] == a:
                toks.append(a)
                lps.append(float(block[i, a]) - lse)
                continue
            toks.append(a)
            lps.append(float(block[i, a]) - lse)
            return st, i, toks, lps
        raise AssertionError("unreachable")
    for i in range(q):
        p = filtered_probs(block[i], temperature, top_k, top_p, min_p)
        if i < k:
            x = drafts[i]
            qv = None if draft_rows is None else _draft_q(draft_rows[i], d2t, V)
            if _draft_ok(x, V, d2t):
                qx = 1.0 if qv is None else qv[x]
                u = uniform_accept(philox_bits(seed, step, i, PURPOSE_ACCEPT, 0))
                if u * qx < p[x]:
                    toks.append(x)
                    lps.append(float(np.log(p[x])))
                    continue
            # rejected at row i: sample the residual
            if qv is None:
                w = p.copy()
                if 0 <= x < V:
                    w[x] = 0.0
            else:
                w = np.maximum(0.0, p - qv)
            if not (w.sum() > 0):
                w = p
            t = race_sample(w, seed, step, i)
        else:
            t = race_sample(p, seed, step, i)
        toks.append(t)
        with np.errstate(divide="ignore"):
            lps.append(float(np.log(p[t])))
        return st, i, toks, lps
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------- many seeds
def sample_block_many(block, drafts, temperature, top_k, top_p, min_p, seeds, step,
                      draft_rows=None, d2t=None):
    """Vectorised ``sample_block`` for one sampled block over N seeds (statistics tests).

    block [q, V]; drafts [N, k] (per sample, e.g. drawn from the draft distribution);
    seeds [N]. Returns (num_accepted [N], emitted [N, q]). Valid blocks only.
    """
    q, V = block.shape
    k = q - 1
    seeds = np.asarray(seeds)
    N = seeds.shape[0]
    drafts = np.asarray(drafts, dtype=np.int64).reshape(N, k)
    assert temperature > 0
    P = np.stack([filtered_probs(block[i], temperature, top_k, top_p, min_p) for i in range(q)])
    Q = None if draft_rows is None else np.stack([_draft_q(draft_rows[i], d2t, V) for i in range(k)])
    n = np.full(N, k, dtype=np.int64)
    alive = np.ones(N, dtype=bool)
    for i in range(k):
        x = drafts[:, i]
        ok = (x >= 0) & (x < V)
        if d2t is not None:
            inv = np.zeros(V, dtype=bool)
            inv[np.asarray(d2t, dtype=np.int64)] = True
            ok &= inv[np.clip(x, 0, V - 1)]
        xc = np.clip(x, 0, V - 1)
        qx = np.ones(N) if Q is None else Q[i, xc]
        u = uniform_accept(philox_bits(seeds, step, i, PURPOSE_ACCEPT, 0))
        acc = ok & (u * qx < P[i, xc])
        rej = alive & ~acc
        n[rej] = i
        alive &= acc
    # weights of the sampling row: one vector per distinct (row, draft at that row)
    xr = np.where(n < k, drafts[np.arange(N), np.minimum(n, max(k - 1, 0))] if k else -1, -1)
    groups, gidx = np.unique(np.stack([n, xr], 1), axis=0, return_inverse=True)
    gidx = gidx.reshape(-1)
    Wg = np.empty((len(groups), V))
    for g, (i, x) in enumerate(groups):
        if i == k:
            w = P[i].copy()
        elif Q is None:
            w = P[i].copy()
            if 0 <= x < V:
                w[x] = 0.0
        else:
            w = np.maximum(0.0, P[i] - Q[i])
        Wg[g] = w if w.sum() > 0 else P[i]
    nt = -(-V // TILE)
    Wc = np.add.reduceat(Wg, np.arange(0, V, TILE), axis=1)[gidx]
    with np.errstate(divide="ignore"):
        tk = np.log(Wc) - np.log(exponential(philox_bits(seeds[:, None], step, n[:, None],
                                                         PURPOSE_TILE, np.arange(nt)[None])))
    tk[~(Wc > 0)] = -np.inf
    c = np.argmax(tk, axis=1)
    cols = np.flatnonzero((Wg > 0).any(0))          # only tokens that can win need noise
    Ws = Wg[:, cols][gidx]
    with np.errstate(divide="ignore"):
        key = np.log(Ws) - np.log(exponential(philox_bits(seeds[:, None], step, n[:, None],
                                                          PURPOSE_TOKEN, cols[None])))
    key[~(Ws > 0) | (cols[None] // TILE != c[:, None])] = -np.inf
    tok = cols[np.argmax(key, axis=1)]
    em = np.full((N, q), -1, dtype=np.int64)
    for j in range(k):
        em[n > j, j] = drafts[n > j, j]
    em[np.arange(N), n] = tok
    return n, em
