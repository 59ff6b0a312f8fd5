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
    S = max([max_stop_ids] + [len(r.stop_token_ids) for r in reqs])
    NS = max([max_stop_sequences] + [len(r.stop_sequences) for r in reqs])
    M = max([max_stop_length] + [len(s) for r in reqs for s in r.stop_sequences])
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
             finished=xp.full(B, SLOT_IDLE, dtype=xp.uint8),
             out_tokens=xp.full((B, shape.out_width), -1, dtype=i32),
             out_lens=xp.zeros(B, dtype=i32), last_token=xp.zeros(B, dtype=i32),
             # drafts per slot in the next block (policy.RoundPlan; serve writes them)
             num_draft=xp.full(B, K, dtype=i32), draft_tokens=xp.zeros((B, K), dtype=i32),
             cu_q=xp.zeros(B + 1, dtype=i32), block_tokens=xp.zeros(B * (K + 1), dtype=i32),
             positions=xp.zeros(B * (K + 1), dtype=i32),
             draft_ids=xp.zeros(max(B * K, 1), dtype=i32), num_accepted=xp.zeros(B, dtype=i32),
             emitted=xp.full((B, K + 1), -1, dtype=i32), status=xp.zeros(B, dtype=i32),
             accept_len=xp.zeros(B, dtype=i32),
             # the context prompt-lookup drafts search: prompt ++ out_tokens[:out_lens]
             prompt=xp.zeros((B, shape.prompt_width), dtype=i32),
             prompt_lens=xp.zeros(B, dtype=i32))
    return SimpleNamespace(**h)


class CallState:
    """The device state of one call shape, owned here and nowhere else: ``buf`` (the round's
    buffers), ``carry`` [B, H] (the draft's input), ``replays`` (``RoundPlan.key`` -> the
    recorded round), ``num_draft`` (the host copy of ``buf.num_draft``), ``row_gathers``
    (block rows -> the device index of ``round.emitted_rows``), ``prefills`` (bucket rows ->
    the bucket's buffers and recorded pass), ``used`` (slots that have held a request), and
    the ``epochs`` of the caches the graphs hold."""

    def __init__(self, shape: Shape, buf: SimpleNamespace, carry, carry_dtype, epochs: list):
        self.shape, self.buf, self.carry, self.epochs = shape, buf, carry, epochs
        self.carry_dtype = carry_dtype        # the target's hidden_dtype (default float32)
        self.replays: dict[tuple, Callable[[], None]] = {}
        self.num_draft: Optional[tuple] = None     # what buf.num_draft holds (None: k_max)
        self.row_gathers: dict[tuple, Any] = {}
        self.prefills: dict[int, SimpleNamespace] = {}
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
        p.reset(B, shape.max_len)
    carry_dtype = getattr(parts.target, "hidden_dtype", xp.float32)
    carry = xp.zeros((B, parts.target.hidden_size), dtype=carry_dtype)
    return CallState(shape, make_buffers(xp, shape, parts.k), carry, carry_dtype,
                     _epochs(parts))


# per-slot scalars an admission writes, in the order of the staging array
_I32_FIELDS = ("max_new", "top_k", "seq_lens", "out_lens", "last_token", "prompt_lens")
_F32_FIELDS = ("temperature", "top_p", "min_p")


def _stage(buf: SimpleNamespace, carry, admitted: Sequence[tuple[int, Request]]):
    """Every per-slot value an admission writes, for the ``n`` admitted slots, on the host in
    one int32 array of words (``host``), and ``fields``: name -> (offset, words, dtype name,
    shape) of each block in it. Every block starts on a 16-byte boundary (so the device
    copy's views of it are aligned, 8-byte values included); dtypes other than int32 are the
    same bytes read as that dtype (int64 seeds and slot index, float32 parameters, the uint8
    ``finished``, the carry's zero rows)."""
    n = len(admitted)
    S, (NS, M), P, O = (buf.stop_ids.shape[1], buf.stop_seqs.shape[1:], buf.prompt.shape[1],
                        buf.out_tokens.shape[1])
    H, csize = carry.shape[1], int(carry.itemsize)
    blocks = [("index", 2 * n, "int64", (n,)), ("seed", 2 * n, "int64", (n,)),
              ("stop_ids", n * S, "int32", (n, S)),
              ("stop_seqs", n * NS * M, "int32", (n, NS, M)), ("prompt", n * P, "int32", (n, P)),
              ("out_tokens", n * O, "int32", (n, O))]
    blocks += [(f, n, "int32", (n,)) for f in _I32_FIELDS]
    blocks += [(f, n, "float32", (n,)) for f in _F32_FIELDS]
    blocks += [("finished", -(-n // 4), "uint8", (n,)),
               ("carry", -(-n * H * csize // 4), "carry", (n, H))]
    fields, off = {}, 0
    for name, words, dt, shape in blocks:
        fields[name] = (off, words, dt, shape)
        off += -(-words // 4) * 4             # every block 16-byte aligned
    host = np.zeros(off, np.int32)

    def view(name):                       # (the carry's block stays zero words)
        o, words, dt, shape = fields[name]
        return host[o:o + words].view(np.dtype(dt))[:int(np.prod(shape))].reshape(shape)
    view("index")[:] = [b for b, _ in admitted]
    view("seed")[:] = [r.seed for _, r in admitted]
    ids, seqs, prompt = view("stop_ids"), view("stop_seqs"), view("prompt")
    ids[:] = -1
    seqs[:] = -1
    view("out_tokens")[:] = -1
    for i, (_, r) in enumerate(admitted):
        ids[i, :len(r.stop_token_ids)] = r.stop_token_ids
        for j, sq in enumerate(r.stop_sequences):
            if len(sq):
                seqs[i, j, M - len(sq):] = sq
        prompt[i, :len(r.prompt)] = r.prompt
    per = dict(max_new=[r.max_new_tokens for _, r in admitted],
               top_k=[r.top_k for _, r in admitted], seq_lens=0, out_lens=0,
               last_token=[r.prompt[-1] for _, r in admitted],
               prompt_lens=[len(r.prompt) for _, r in admitted],
               temperature=[r.temperature for _, r in admitted],
               top_p=[r.top_p for _, r in admitted], min_p=[r.min_p for _, r in admitted])
    for name, v in per.items():
        view(name)[:] = v
    # finished (0) and the carry's rows (zero bits in every dtype) are the zeros already there
    return host, fields


def admit(parts: Parts, st: CallState, admitted: Sequence[tuple[int, Request]]) -> None:
    """Put requests into free slots: per-slot parameters, fresh recurrent state, a zero
    carry, and running status. ``admitted`` is [(slot, Request)], slots distinct.

    Every value is staged on the host (``_stage``) and goes to the device in one copy; then
    one write a buffer for all the admitted slots (a slice where they are a run of
    consecutive slots, else the device index of them), and ``target.reset_slots`` gets that
    index (int64). No python scalar is written through a device index (torch would copy it to
    the device first, and wait)."""
    xp, buf = parts.be.xp, st.buf
    slots = [int(b) for b, _ in admitted]
    reset = getattr(parts.target, "reset_slots", None)
    if reset is None and any(st.used[b] for b in slots):
        raise TypeError("target: reusing a slot needs target.reset_slots(slot_ids)")
    if not admitted:
        return
    host, fields = _stage(buf, st.carry, admitted)
    dev = xp.asarray(host)                # the admission's one host->device copy
    dtypes = dict(int32=xp.int32, int64=xp.int64, float32=xp.float32, uint8=xp.uint8,
                  carry=st.carry.dtype)

    def part(name):
        o, words, dt, shape = fields[name]
        n = 1
        for x in shape:
            n *= x
        return dev[o:o + words].view(dtypes[dt])[:n].reshape(shape)
    index = part("index")
    if reset is not None:
        reset(index)
    b0, n = slots[0], len(slots)
    rows = slice(b0, b0 + n) if slots == list(range(b0, b0 + n)) else index
    for name in ("stop_ids", "stop_seqs", "prompt", "out_tokens", "seed", "finished",
                 *_I32_FIELDS, *_F32_FIELDS):
        getattr(buf, name)[rows] = part(name)
    st.carry[rows] = part("carry")
    for b in slots:
        st.used[b] = True
