"""What a call takes (``Request``), returns (``Result``) and counts (``Metrics``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence, Union

import numpy as np


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
    tokens: list[int]
    finish_reason: str


RequestLike = Union[Request, Mapping]     # a Request, or the keyword arguments of one


def check_requests(requests: Iterable[RequestLike]) -> list[Request]:
    """Requests (or dicts of their fields) as ``Request``s; a prompt needs a token, a request
    at least one new token."""
    reqs = [r if isinstance(r, Request) else Request(**r) for r in requests]
    for i, r in enumerate(reqs):
        if len(r.prompt) < 1:
            raise ValueError(f"requests[{i}].prompt: needs at least one token")
        if r.max_new_tokens < 1:
            raise ValueError(f"requests[{i}].max_new_tokens: must be >= 1")
    return reqs


@dataclass
class Metrics:
    num_speculative_tokens: int = 0
    rounds: int = 0
    row_rounds: int = 0              # (running sequence, round) pairs: target rows verified
    proposed: int = 0                # drafts proposed to running sequences
    accepted: int = 0                # drafts accepted (before stop conditions)
    accept_counts: list[int] = field(default_factory=list)   # [j]: rounds with > j accepted
    emitted: int = 0                 # tokens committed to outputs
    wall_s: float = 0.0
    launch_s: float = 0.0            # host time enqueueing rounds 2.. (no syncs inside)
    launched_rounds: int = 0
    graph_captured: bool = False
    capture_s: float = 0.0           # time spent recording the round graph (not decoding)
    prefill_s: float = 0.0           # host time of admissions and prefill passes (admit_s
    #                                  included; the passes' GPU work overlaps)
    admit_s: float = 0.0             # of prefill_s: host time of admit (buffers, reset_slots)
    admissions: int = 0              # round boundaries that admitted requests (admit calls)
    admitted: int = 0                # requests admitted
    overrun_rounds: int = 0          # rounds run ahead past every request's finish

    position_rows: list[int] = field(default_factory=list)   # [j]: rows with draft j proposed
    k_rounds: dict = field(default_factory=dict)             # k -> rounds that verified k
    policy: str = "fixed"            # the speculation policy ("fixed" or "auto")

    def count_round(self, num_accepted, k: int, num_draft=None) -> None:
        """One round's acceptance: ``num_accepted`` holds the running slots' counts (host);
        the round verified ``k`` drafts a slot (``num_draft``: per running slot, if ragged)."""
        running = len(num_accepted)
        q = np.full(running, k) if num_draft is None else np.asarray(num_draft)
        self.rounds += 1
        self.row_rounds += running
        self.proposed += int(q.sum())
        self.accepted += int(num_accepted.sum())
        self.k_rounds[k] = self.k_rounds.get(k, 0) + 1
        for j in range(len(self.accept_counts)):
            self.accept_counts[j] += int((num_accepted > j).sum())
            if len(self.position_rows) > j:
                self.position_rows[j] += int((q > j).sum())

    @property
    def k_histogram(self) -> str:
        """The rounds verified at each k, e.g. ``"k=0 x12, k=2 x40, k=3 x88"``."""
        return ", ".join(f"k={k} x{n}" for k, n in sorted(self.k_rounds.items()))

    @property
    def host_us_per_round(self) -> float:
        """Mean host time to enqueue one round (eager ops, or one graph launch)."""
        return 1e6 * self.launch_s / self.launched_rounds if self.launched_rounds else float("nan")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per sequence per target pass (accepted drafts + 1)."""
        return (self.accepted + self.row_rounds) / self.row_rounds if self.row_rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft j accepted), j = 0..k-1, over the running (sequence, round) pairs that
        proposed draft j (every pair under a fixed k)."""
        rows = self.position_rows or [self.row_rounds] * len(self.accept_counts)
        return [c / r if r else float("nan") for c, r in zip(self.accept_counts, rows)]

    @property
    def tokens_per_s(self) -> float:
        """Tokens emitted per second of decoding: prefill included, graph capture not."""
        t = self.wall_s - self.capture_s
        return self.emitted / t if t > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens emitted per second with the prefill's host time left out too (its GPU work
        runs behind the enqueueing, so this is decoding alone, up to that tail)."""
        t = self.wall_s - self.capture_s - self.prefill_s
        return self.emitted / t if t > 0 else float("nan")
