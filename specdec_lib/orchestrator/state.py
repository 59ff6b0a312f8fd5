"""The parts a round runs (``Parts``) and the one owner of a call's device state
(``CallState``: round buffers, carry, recorded graphs), made by ``fresh`` or kept by ``reuse``.

Everything above this module (round, prefill, serve, the decoder) reads and writes device
state only through a ``CallState``; nothing here imports them.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from ..reference import sequence as _seq_ref
from .backends import Backend
from .request import Request

MAX_BLOCK_ROWS = 16          # verify_attention's limit on rows per sequence
FINISH_REASONS = _seq_ref.FINISH_REASONS
SLOT_IDLE = 255              # finished[] of a slot with no request: never committed


class Parts:
    """The backend, the target, the draft and k (``k_max`` of the policy: what buffers are
    sized for), and how the draft is fed (read once)."""

    def __init__(self, be: Backend, target: Any, draft: Any, k: int):
        self.be, self.target, self.draft, self.k = be, target, draft, k
        # drafts with their own KV cache (trained heads) read the target's block rows
        self.block_draft = k > 0 and getattr(draft, "uses_target_block", False)
        # the carry (hidden of each sequence's last committed row) feeds only a draft that
        # proposes from it: not a head that reads the block, not prompt lookup, not k = 0
        self.uses_carry = (k > 0 and not self.block_draft
                           and not getattr(draft, "uses_context", False))
        # a target told the round's longest block plans its attention for it
        self.takes_max_q = bool(getattr(target, "takes_max_q", False))

    def propose(self, buf: SimpleNamespace, carry, k: Optional[int] = None) -> Any:
        """draft.propose of ``k`` (default k_max) tokens on the carry (and, for a draft that
        ``uses_context``, the context)."""
        k = self.k if k is None else k
        if getattr(self.draft, "uses_context", False):
            ctx = SimpleNamespace(prompt=buf.prompt, prompt_lens=buf.prompt_lens,
                                  output=buf.out_tokens, output_lens=buf.out_lens)
            return self.draft.propose(carry, buf.last_token, k, ctx)
        return self.draft.propose(carry, buf.last_token, k)

    def reset_parts(self) -> list:
        """What ``reset(batch, max_len)`` is called on: the target, and a draft with caches."""
        d = self.draft
        return [self.target] + ([d] if self.k and hasattr(d, "reset") else [])


class Shape(NamedTuple):
    """Everything the buffers, caches and graphs of a call depend on."""
    slots: int
    max_len: int               # positions per slot
    stop_ids: int
    stop_sequences: int
    stop_length: int
    out_width: int
    prompt_width: int
    filters: bool              # any sampled request filters (top-k/top-p/min-p)


def positions_needed(reqs: Sequence[Request], k: int) -> int:
    """Positions a slot needs for the longest of ``reqs`` at ``k`` drafts (prompt +
    max_new_tokens + a last block of k + 1 rows): the ``max_len`` that fits them."""
    return max(len(r.prompt) + r.max_new_tokens for r in reqs) + k + 1


def stop_widths(reqs: Sequence[Request], max_stop_ids: int, max_stop_sequences: int,
                max_stop_length: int) -> tuple[int, int, int]:
    """(stop ids, stop sequences, stop length) a call's buffers hold: the least widths,
    widened to the widest request."""
    return (max([max_stop_ids] + [len(r.stop_token_ids) for r in reqs]),
            max([max_stop_sequences] + [len(r.stop_sequences) for r in reqs]),
            max([max_stop_length] + [len(s) for r in reqs for s in r.stop_sequences]))


def call_shape(reqs: Sequence[Request], slots: int, k: int, max_len: Optional[int],
               max_stop_ids: int, max_stop_sequences: int, max_stop_length: int) -> Shape:
    """The ``Shape`` of a call; equal shapes let a call reuse the last one's state. With a
    fixed ``max_len`` the widths are that, else the requests' own."""
    need = [positions_needed([r], k) for r in reqs]
    if max_len is not None:
        i = int(np.argmax(need))
        if need[i] > max_len:
            raise ValueError(f"requests[{i}]: prompt + max_new_tokens + k + 1 = {need[i]} "
                             f"positions exceed max_len={max_len}")
    S, NS, M = stop_widths(reqs, max_stop_ids, max_stop_sequences, max_stop_length)
    out_w = max_len or max(r.max_new_tokens for r in reqs)
    prompt_w = max_len or max(len(r.prompt) for r in reqs)
    # known for the whole call (so one captured graph fits every round): when no
    # sampled request filters, spec_sample skips its two filter launches
    filters = any(r.temperature > 0 and (r.top_k > 0 or r.top_p < 1 or r.min_p > 0)
                  for r in reqs)
    return Shape(int(slots), max_len or max(need), S, NS, M, out_w, prompt_w, filters)


def make_buffers(xp, shape: Shape, k: int) -> SimpleNamespace:
    """Device buffers of a call's ``shape``; every slot starts idle (``finished =
    SLOT_IDLE``: computed each round, never committed)."""
    B, K, i32 = shape.slots, k, xp.int32
    S, NS, M = shape.stop_ids, shape.stop_sequences, shape.stop_length
    h = dict(stop_ids=xp.full((B, S), -1, dtype=i32), stop_seqs=xp.full((B, NS, M), -1, dtype=i32),
             max_new=xp.ones(B, dtype=i32), temperature=xp.zeros(B, dtype=xp.float32),
             top_k=xp.zeros(B, dtype=i32), top_p=xp.ones(B, dtype=xp.float32),
             min_p=xp.zeros(B, dtype=xp.float32), seed=xp.zeros(B, dtype=xp.int64),
             step=xp.zeros(B, dtype=xp.int64), seq_lens=xp.zeros(B, dtype=i32),

             out_tokens=xp.full((B, shape.out_width), -1, dtype=i32),
             last_token=xp.zeros(B, dtype=i32),
             # drafts per slot in the next block (policy.RoundPlan; serve writes them)
             num_draft=xp.full(B, K, dtype=i32), draft_tokens=xp.zeros((B, K), dtype=i32),
             cu_q=xp.zeros(B + 1, dtype=i32), block_tokens=xp.zeros(B * (K + 1), dtype=i32),
             positions=xp.zeros(B * (K + 1), dtype=i32),
             draft_ids=xp.zeros(max(B * K, 1), dtype=i32),
             emitted=xp.full((B, K + 1), -1, dtype=i32), status=xp.zeros(B, dtype=i32),
             accept_len=xp.zeros(B, dtype=i32),
             # the context prompt-lookup drafts search: prompt ++ out_tokens[:out_lens]
             prompt=xp.zeros((B, shape.prompt_width), dtype=i32),
             prompt_lens=xp.zeros(B, dtype=i32))
    # what the host reads after every round, one buffer so it is one copy: num_accepted
    # (int32 [B]), out_lens (int32 [B]), then finished (uint8 [B], in the int32 words after
    # them), typed views
    h["control"] = control = xp.zeros(2 * B + (B + 3) // 4, dtype=i32)
    h["num_accepted"] = control[:B]
    h["out_lens"] = control[B:2 * B]
    h["finished"] = control[2 * B:].view(xp.uint8)[:B]
    h["finished"][...] = SLOT_IDLE
    return SimpleNamespace(**h)


def split_control(control, slots: int):
    """(num_accepted, out_lens, finished) of a host copy of ``buf.control``."""
    return (control[:slots], control[slots:2 * slots],
            control[2 * slots:].view(np.uint8)[:slots])


class CallState:
    """The device state of one call shape, owned here and nowhere else: ``buf`` (the round's
    buffers), ``carry`` [B, H] (the draft's input), ``replays`` (``RoundPlan.key`` -> the
    recorded round), ``num_draft`` (the host copy of ``buf.num_draft``; ``uniform_drafts``:
    k -> a device row of B k's, what a whole-block plan copies into it), ``row_gathers``
    (block rows -> the device index of ``round.emitted_rows``; ``live_rows``: the split a
    live-rows index holds), ``prefills`` ((bucket rows, prompts) -> the pass's buffers and
    recording), ``used`` (slots that have held a request), and
    the ``epochs`` of the caches the graphs hold."""

    def __init__(self, shape: Shape, buf: SimpleNamespace, carry, carry_dtype, epochs: list):
        self.shape, self.buf, self.carry, self.epochs = shape, buf, carry, epochs
        self.carry_dtype = carry_dtype        # the target's hidden_dtype (default float32)
        self.replays: dict[tuple, Callable[[], None]] = {}
        self.num_draft: Optional[tuple] = None     # what buf.num_draft holds (None: k_max)
        self.uniform_drafts: dict[int, Any] = {}
        self.row_gathers: dict[tuple, Any] = {}
        self.live_rows: dict[tuple, tuple] = {}    # live-rows gather -> the split it holds
        self.prefills: dict[tuple, SimpleNamespace] = {}
        self.used = [False] * shape.slots

    @property
    def filters(self) -> bool:
        return self.shape.filters


def _epochs(parts: Parts) -> list:
    return [getattr(p, "cache_epoch", None) for p in parts.reset_parts()]


def reuse(parts: Parts, last: Optional[CallState], shape: Shape) -> Optional[CallState]:
    """``last``, every slot idle again, when its shape repeats and nobody reset the target or
    the draft since (their ``cache_epoch`` unchanged: the graphs hold their caches); else
    None. A target without ``cache_epoch`` and ``reset_slots`` never reuses state."""
    if (last is not None and last.shape == shape and hasattr(parts.target, "reset_slots")
            and last.epochs == _epochs(parts) and None not in last.epochs):
        last.buf.finished[...] = SLOT_IDLE        # caches stay
        return last
    return None


def fresh(parts: Parts, shape: Shape) -> CallState:
    """A new state for ``shape``: the target's (and draft's) caches reset, buffers made, no
    graphs yet. (Drop the last state first: its graphs go before the new caches.)"""
    xp, B = parts.be.xp, shape.slots
    parts.be.device_synchronize()                 # weights/caches made on other streams are ready
    for p in parts.reset_parts():
        # (a target that sizes buffers by its verify blocks is told the rounds' rows a slot)
        rows = dict(block_rows=parts.k + 1) if getattr(p, "takes_block_rows", False) else {}
        p.reset(B, shape.max_len, **rows)
    carry_dtype = getattr(parts.target, "hidden_dtype", xp.float32)
    carry = xp.zeros((B, parts.target.hidden_size), dtype=carry_dtype)
    return CallState(shape, make_buffers(xp, shape, parts.k), carry, carry_dtype,
                     _epochs(parts))


# admissions' copies through the backend's page-locked staging ring (``to_device_async``), so
# that an admission does not wait for the round run ahead (s49, H100, served 128/32 with
# grouped prefills: +4-6% tok/s with a head, +3.6% target-only; False: pageable copies)
ASYNC_UPLOAD = True


def device_copy(be):
    """The host->device copy of ``upload``: the backend's ``to_device_async`` where
    ``ASYNC_UPLOAD`` and the backend has one, else None (``xp.asarray``)."""
    return getattr(be, "to_device_async", None) if ASYNC_UPLOAD else None


def upload_to(be, arrays: dict) -> dict:
    """``upload`` onto backend ``be``'s device, through its staging ring where
    ``ASYNC_UPLOAD`` (``device_copy``): what every admission, prefill and round plan sends."""
    return upload(be.xp, arrays, device_copy(be))


def upload(xp, arrays: dict, copy=None) -> dict:
    """Several host arrays to the device in one host->device copy: ``arrays`` maps a name to
    a numpy array (the device array gets the dtype of the same name on ``xp``), or to
    (array, device dtype) of the same item size (the bytes read as that dtype). Returns name
    -> the device array (a view of the one copy, every block 16-byte aligned, so views of
    8-byte values are aligned too). One copy, so one wait where a copy from pageable host
    memory waits for the stream (torch does), instead of one an array; none with ``copy``
    (int32 words -> a device array: ``device_copy``)."""
    if not arrays:
        return {}
    blocks, off = [], 0
    for name, v in arrays.items():
        a, dt = v if isinstance(v, tuple) else (v, None)
        a = np.ascontiguousarray(a)
        words = -(-a.nbytes // 4)
        blocks.append((name, a, dt, off, words))
        off += -(-words // 4) * 4
    host = np.zeros(off, np.int32)
    for name, a, dt, o, words in blocks:
        host[o:o + words].view(np.uint8)[:a.nbytes] = a.reshape(-1).view(np.uint8)
    dev = xp.asarray(host) if copy is None else copy(host)
    return {name: dev[o:o + words].view(getattr(xp, a.dtype.name) if dt is None else dt)
            [:a.size].reshape(a.shape) for name, a, dt, o, words in blocks}


# per-slot scalars an admission writes
_I32_FIELDS = ("max_new", "top_k", "seq_lens", "out_lens", "last_token", "prompt_lens")
_F32_FIELDS = ("temperature", "top_p", "min_p")
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _stage(buf: SimpleNamespace, carry, admitted: Sequence[tuple[int, Request]]) -> dict:
    """Every per-slot value an admission writes, for the ``n`` admitted slots, as host arrays
    for ``upload``: name -> [n, ...] (the slots' int64 index, their buffers' rows, the
    carry's zero rows in its dtype)."""
    n = len(admitted)
    S, (NS, M), P, O = (buf.stop_ids.shape[1], buf.stop_seqs.shape[1:], buf.prompt.shape[1],
                        buf.out_tokens.shape[1])
    ids = np.full((n, S), -1, np.int32)
    seqs = np.full((n, NS, M), -1, np.int32)
    prompt = np.zeros((n, P), np.int32)
    for i, (_, r) in enumerate(admitted):
        ids[i, :len(r.stop_token_ids)] = r.stop_token_ids
        for j, sq in enumerate(r.stop_sequences):
            if len(sq):
                seqs[i, j, M - len(sq):] = sq
        prompt[i, :len(r.prompt)] = r.prompt
    reqs = [r for _, r in admitted]

    def col(values, dt):
        return np.asarray(values, dt).reshape(n)
    return dict(
        index=col([b for b, _ in admitted], np.int64), seed=col([r.seed for r in reqs], np.int64),
        stop_ids=ids, stop_seqs=seqs, prompt=prompt, out_tokens=np.full((n, O), -1, np.int32),
        max_new=col([r.max_new_tokens for r in reqs], np.int32),
        top_k=col([r.top_k for r in reqs], np.int32), seq_lens=np.zeros(n, np.int32),
        out_lens=np.zeros(n, np.int32), last_token=col([r.prompt[-1] for r in reqs], np.int32),
        prompt_lens=col([len(r.prompt) for r in reqs], np.int32),
        temperature=col([r.temperature for r in reqs], np.float32),
        top_p=col([r.top_p for r in reqs], np.float32),
        min_p=col([r.min_p for r in reqs], np.float32), finished=np.zeros(n, np.uint8),
        carry=(np.zeros((n, carry.shape[1]), _UINT[int(carry.itemsize)]), carry.dtype))


def admit(parts: Parts, st: CallState, admitted: Sequence[tuple[int, Request]]) -> None:
    """Put requests into free slots: per-slot parameters, fresh recurrent state, a zero
    carry, and running status. ``admitted`` is [(slot, Request)], slots distinct.

    Every value is staged on the host (``_stage``) and goes to the device in one copy
    (``upload_to``); then one write a buffer for all the admitted slots (a slice where they are
    a run of consecutive slots, else the device index of them), and ``target.reset_slots``
    gets that index (int64). No python scalar is written to a device array: torch copies it
    to the device first and waits (for an element, or through a device index)."""
    buf = st.buf
    slots = [int(b) for b, _ in admitted]
    reset = getattr(parts.target, "reset_slots", None)
    if reset is None and any(st.used[b] for b in slots):
        raise TypeError("target: reusing a slot needs target.reset_slots(slot_ids)")
    if not admitted:
        return
    dev = upload_to(parts.be, _stage(buf, st.carry, admitted))     # one copy
    index = dev["index"]
    if reset is not None:
        reset(index)
    b0, n = slots[0], len(slots)
    rows = slice(b0, b0 + n) if slots == list(range(b0, b0 + n)) else index
    for name in ("stop_ids", "stop_seqs", "prompt", "out_tokens", "seed", "finished",
                 *_I32_FIELDS, *_F32_FIELDS):
        getattr(buf, name)[rows] = dev[name]
    st.carry[rows] = dev["carry"]
    for b in slots:
        st.used[b] = True
