"""SpeculativeDecoder: one chain-speculative round after another, on either backend.

The host stack supplies two objects:

``target``  ``reset(batch, max_len)``; ``forward(tokens, positions, cu_q, seq_lens,
            finished) -> (logits [T, V] float32, hidden [T, H] float32)`` (calls
            append_kv / verify_attention / conv1d_verify / gdn_verify; writes no
            recurrent state); ``commit(cu_q, accept_len)`` (gdn_commit / conv1d_commit).
``draft``   ``propose(carry [B, H], last_token [B], k) -> draft tokens [B, k]``; may be
            None when ``num_speculative_tokens == 0`` (target-only decoding).

Each round, on one stream and with no synchronisation inside it::

    seq_build_block -> target.forward -> spec_sample -> seq_stop -> target.commit
        -> seq_advance -> draft_carry -> draft.propose

The block of every sequence, finished ones included, is ``k + 1`` rows, so ``T`` is fixed
and the round needs no host value (graph-capturable); finished rows are computed and
never committed. After the round the host reads ``finished`` (one small copy) to know
whether to stop, and the per-round acceptance counts for the metrics.

Backends: ``"reference"`` (numpy arrays, ``specdec_lib.reference`` ops) and ``"cuda"``
(cupy arrays, ``specdec_lib.ops`` on cupy's current stream).
"""
from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from .reference import sequence as _seq_ref

MAX_BLOCK_ROWS = 16          # verify_attention's limit on rows per sequence
FINISH_REASONS = _seq_ref.FINISH_REASONS

_OPS = ("append_kv", "verify_attention", "conv1d_verify", "conv1d_commit", "gdn_verify",
        "gdn_commit", "spec_sample", "seq_stop", "seq_advance", "seq_build_block",
        "draft_carry", "capture_hidden", "draft_combine")


def reference_backend():
    """numpy arrays, reference ops (float64 math inside each op)."""
    import importlib
    mods = [importlib.import_module(f"specdec_lib.reference.{m}")   # (the package's
            for m in ("copy", "attention", "conv", "gdn", "sampling",  # `copy` is a function)
                      "sequence", "draft")]
    gdn = mods[3]
    ns = SimpleNamespace(name="reference", xp=np, kv_dtype=np.float32,
                         gdn_journal_width=gdn.gdn_journal_width,
                         to_host=np.asarray, synchronize=lambda: None)
    for op in _OPS:
        setattr(ns, op, next(getattr(m, op) for m in mods if hasattr(m, op)))
    return ns


def cuda_backend(device: int = 0):
    """cupy arrays, library kernels on cupy's current stream (raises if unavailable)."""
    import cupy  # noqa: F401  (the host model's dense math)
    from . import ops
    from .reference.gdn import gdn_journal_width
    cupy.cuda.Device(device).use()
    stream = cupy.cuda.get_current_stream()
    ns = SimpleNamespace(name="cuda", xp=cupy, kv_dtype=cupy.float16,
                         gdn_journal_width=gdn_journal_width, device=device,
                         to_host=cupy.asnumpy, synchronize=stream.synchronize)
    missing = [op for op in _OPS if not hasattr(ops, op)]
    if missing:
        raise RuntimeError("cuda backend: specdec_lib.ops lacks " + ", ".join(missing))
    for op in _OPS:
        fn = getattr(ops, op)
        kw = {"stream": stream.ptr}
        # host-side index checks copy to the host and synchronise: never inside a round
        # (the kernels skip or flag bad indices instead of faulting)
        if "check_indices" in inspect.signature(fn).parameters:
            kw["check_indices"] = False
        setattr(ns, op, functools.partial(fn, **kw))
    workspaces = {}   # spec_sample never allocates: the decoder owns one buffer per (T, V)

    def spec_sample(logits, *args, **kw):
        T, V = logits.shape
        ws = workspaces.get((T, V))
        if ws is None:
            ws = workspaces[(T, V)] = cupy.empty(ops.spec_sample_workspace_size(T, V), cupy.uint8)
        kw.setdefault("workspace", ws)
        kw.setdefault("stream", stream.ptr)
        return ops.spec_sample(logits, *args, **kw)
    ns.spec_sample = spec_sample
    return ns


def make_backend(name: str = "reference", device: int = 0):
    if name == "reference":
        return reference_backend()
    if name == "cuda":
        return cuda_backend(device)
    raise ValueError(f"backend: expected 'reference' or 'cuda', got {name!r}")


@dataclass
class Request:
    """One generation request. ``temperature <= 0`` is greedy. Stop sequences may span
    rounds (matched against the request's own output)."""
    prompt: Sequence[int]
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    stop_token_ids: Sequence[int] = ()
    stop_sequences: Sequence[Sequence[int]] = ()


@dataclass
class Result:
    tokens: list
    finish_reason: str


@dataclass
class Metrics:
    num_speculative_tokens: int = 0
    rounds: int = 0
    row_rounds: int = 0              # (running sequence, round) pairs: target rows verified
    proposed: int = 0                # drafts proposed to running sequences
    accepted: int = 0                # drafts accepted (before stop conditions)
    accept_counts: list = field(default_factory=list)   # [j]: rounds with > j accepted
    emitted: int = 0                 # tokens committed to outputs
    wall_s: float = 0.0

    @property
    def acceptance_rate(self):
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def mean_accepted_length(self):
        """Tokens emitted per sequence per target pass (accepted drafts + 1)."""
        return (self.accepted + self.row_rounds) / self.row_rounds if self.row_rounds else 0.0

    @property
    def per_position_acceptance(self):
        """P(draft j accepted), j = 0..k-1, over running (sequence, round) pairs."""
        return [c / self.row_rounds if self.row_rounds else float("nan")
                for c in self.accept_counts]

    @property
    def tokens_per_s(self):
        return self.emitted / self.wall_s if self.wall_s > 0 else float("nan")


class SpeculativeDecoder:
    """Owns the round buffers and runs rounds until every request has finished."""

    def __init__(self, target, draft=None, *, num_speculative_tokens: int = 3,
                 backend="reference", max_stop_ids: int = 4, max_stop_sequences: int = 2,
                 max_stop_length: int = 4):
        k = int(num_speculative_tokens)
        if not 0 <= k < MAX_BLOCK_ROWS:
            raise ValueError(f"num_speculative_tokens: {k} outside 0..{MAX_BLOCK_ROWS - 1}")
        if k > 0 and draft is None:
            raise ValueError("draft: required when num_speculative_tokens > 0")
        self.target, self.draft, self.k = target, draft, k
        self.be = make_backend(backend) if isinstance(backend, str) else backend
        self.max_stop_ids = max_stop_ids
        self.max_stop_sequences = max_stop_sequences
        self.max_stop_length = max_stop_length
        self.metrics = Metrics(num_speculative_tokens=k, accept_counts=[0] * k)

    # ------------------------------------------------------------------ buffers
    def _buffers(self, reqs):
        xp, B, K = self.be.xp, len(reqs), self.k
        i32 = xp.int32
        h = {}
        cap = max(r.max_new_tokens for r in reqs)
        S = max([self.max_stop_ids] + [len(r.stop_token_ids) for r in reqs])
        NS = max([self.max_stop_sequences] + [len(r.stop_sequences) for r in reqs])
        M = max([self.max_stop_length] + [len(s) for r in reqs for s in r.stop_sequences])
        stop_ids = np.full((B, S), -1, np.int32)
        stop_seqs = np.full((B, NS, M), -1, np.int32)
        for b, r in enumerate(reqs):
            stop_ids[b, :len(r.stop_token_ids)] = r.stop_token_ids
            for j, s in enumerate(r.stop_sequences):
                if len(s):
                    stop_seqs[b, j, M - len(s):] = s
        dev = lambda a, dt=None: xp.asarray(a if dt is None else np.asarray(a, dt))  # noqa: E731
        h["stop_ids"] = dev(stop_ids)
        h["stop_seqs"] = dev(stop_seqs)
        h["max_new"] = dev([r.max_new_tokens for r in reqs], np.int32)
        h["temperature"] = dev([r.temperature for r in reqs], np.float32)
        h["top_k"] = dev([r.top_k for r in reqs], np.int32)
        h["top_p"] = dev([r.top_p for r in reqs], np.float32)
        h["min_p"] = dev([r.min_p for r in reqs], np.float32)
        h["seed"] = dev([r.seed for r in reqs], np.int64)
        h["step"] = xp.zeros(B, dtype=xp.int64)
        h["seq_lens"] = xp.zeros(B, dtype=i32)
        h["finished"] = xp.zeros(B, dtype=xp.uint8)
        h["out_tokens"] = xp.full((B, cap), -1, dtype=i32)
        h["out_lens"] = xp.zeros(B, dtype=i32)
        h["last_token"] = dev([r.prompt[-1] for r in reqs], np.int32)
        h["num_draft"] = xp.full(B, K, dtype=i32)
        h["draft_tokens"] = xp.zeros((B, K), dtype=i32)
        h["cu_q"] = xp.zeros(B + 1, dtype=i32)
        h["block_tokens"] = xp.zeros(B * (K + 1), dtype=i32)
        h["positions"] = xp.zeros(B * (K + 1), dtype=i32)
        h["draft_ids"] = xp.zeros(max(B * K, 1), dtype=i32)
        h["num_accepted"] = xp.zeros(B, dtype=i32)
        h["emitted"] = xp.full((B, K + 1), -1, dtype=i32)
        h["status"] = xp.zeros(B, dtype=i32)
        h["accept_len"] = xp.zeros(B, dtype=i32)
        return SimpleNamespace(**h)

    # ------------------------------------------------------------------ prefill
    def _prefill(self, reqs, buf, H):
        """Commit prompt[:-1] of every request in chunks of <= 16 rows; carry = hidden of
        the last prompt row (zeros for one-token prompts)."""
        xp, be = self.be.xp, self.be
        B = len(reqs)
        carry = xp.zeros((B, H), dtype=xp.float32)
        todo = [list(r.prompt[:-1]) for r in reqs]
        done = [0] * B
        while any(done[b] < len(todo[b]) for b in range(B)):
            qs = [min(MAX_BLOCK_ROWS, len(todo[b]) - done[b]) for b in range(B)]
            cu = np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)
            toks = np.concatenate([todo[b][done[b]:done[b] + qs[b]] for b in range(B)]).astype(np.int32)
            pos = np.concatenate([np.arange(done[b], done[b] + qs[b]) for b in range(B)]).astype(np.int32)
            cu_q = xp.asarray(cu)
            acc = xp.asarray(np.asarray(qs, np.int32))
            logits, hidden = self.target.forward(xp.asarray(toks), xp.asarray(pos), cu_q,
                                                 buf.seq_lens, buf.finished)
            self.target.commit(cu_q, acc)
            buf.seq_lens += acc
            new_carry = xp.empty_like(carry)
            be.draft_carry(hidden, cu_q, acc, new_carry)
            last = np.asarray([done[b] + qs[b] == len(todo[b]) and qs[b] > 0 for b in range(B)])
            rows = xp.asarray(np.flatnonzero(last))
            carry[rows] = new_carry[rows]
            done = [done[b] + qs[b] for b in range(B)]
        return carry

    # ------------------------------------------------------------------ rounds
    def generate(self, requests, *, progress=None):
        """Run every request to completion; returns [Result] in request order.

        ``progress(done_tokens, total_tokens)`` is called after every round if given.
        """
        reqs = [r if isinstance(r, Request) else Request(**r) for r in requests]
        if not reqs:
            return []
        for i, r in enumerate(reqs):
            if len(r.prompt) < 1:
                raise ValueError(f"requests[{i}].prompt: needs at least one token")
            if r.max_new_tokens < 1:
                raise ValueError(f"requests[{i}].max_new_tokens: must be >= 1")
        be, xp, K = self.be, self.be.xp, self.k
        B = len(reqs)
        max_len = max(len(r.prompt) + r.max_new_tokens for r in reqs) + K + 1
        self.target.reset(B, max_len)
        buf = self._buffers(reqs)
        t0 = time.perf_counter()
        carry = self._prefill(reqs, buf, self.target.hidden_size)
        m = self.metrics
        total = sum(r.max_new_tokens for r in reqs)
        if K:
            buf.draft_tokens[...] = self.draft.propose(carry, buf.last_token, K)
        T = B * (K + 1)
        while True:
            running_before = be.to_host(buf.finished) == 0
            be.seq_build_block(buf.last_token, buf.draft_tokens, buf.num_draft, buf.seq_lens,
                               buf.cu_q, buf.block_tokens, buf.positions, buf.draft_ids)
            logits, hidden = self.target.forward(buf.block_tokens, buf.positions, buf.cu_q,
                                                 buf.seq_lens, buf.finished)
            buf.step[...] = buf.seq_lens
            be.spec_sample(logits, buf.cu_q, buf.draft_ids[:T - B], buf.temperature, buf.top_k,
                           buf.top_p, buf.min_p, buf.seed, buf.step, buf.num_accepted,
                           buf.emitted, buf.status)
            be.seq_stop(buf.emitted, buf.num_accepted, buf.out_tokens, buf.out_lens,
                        buf.stop_ids, buf.stop_seqs, buf.max_new, buf.accept_len, buf.finished)
            self.target.commit(buf.cu_q, buf.accept_len)
            be.seq_advance(buf.emitted, buf.accept_len, buf.seq_lens, buf.out_tokens,
                           buf.out_lens, buf.last_token, buf.finished)
            be.draft_carry(hidden, buf.cu_q, buf.accept_len, carry)
            if K:
                buf.draft_tokens[...] = self.draft.propose(carry, buf.last_token, K)
            # --- end of the round: one small device->host read for control and metrics
            n = be.to_host(buf.num_accepted)[running_before]
            m.rounds += 1
            m.row_rounds += int(running_before.sum())
            m.proposed += K * int(running_before.sum())
            m.accepted += int(n.sum())
            for j in range(K):
                m.accept_counts[j] += int((n > j).sum())
            fin = be.to_host(buf.finished)
            if progress is not None:
                progress(int(be.to_host(buf.out_lens).sum()), total)
            if fin.all():
                break
        be.synchronize()
        m.wall_s += time.perf_counter() - t0
        out_tokens = be.to_host(buf.out_tokens)
        out_lens = be.to_host(buf.out_lens)
        m.emitted += int(out_lens.sum())
        return [Result(tokens=out_tokens[b, :out_lens[b]].tolist(),
                       finish_reason=FINISH_REASONS.get(int(fin[b]), str(int(fin[b]))))
                for b in range(B)]
