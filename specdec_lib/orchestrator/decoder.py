"""``SpeculativeDecoder``: the façade that wires the parts (backend, target, draft, k), the
call's device state, the prefill policy and the serving loop together."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from .backends import Backend, make_backend
from .prefill import PrefillPolicy
from .request import Metrics, Request, RequestLike, Result, check_requests
from .policy import make_policy
from .serve import serve as _serve
from .state import (CallState, Parts, call_shape, fresh, positions_needed, reuse,
                    stop_widths)


class SpeculativeDecoder:
    """Owns the round buffers and runs rounds until every request has finished.

    target, draft            the host model's passes (the protocol: ``specdec_lib.orchestrator``)
    num_speculative_tokens   k, 0..15 drafts per round (0: target-only decoding, no draft);
                             ``"auto"`` (``policy.AutoK()``: k in 0..4 chosen every round from
                             the running acceptance and the measured cost of a round), or a
                             policy object (``AutoK(k_max, costs=...)``, ``FixedK(k)``); buffers
                             are sized for its ``k_max``
    backend                  ``"reference"``, ``"cuda"``, ``"torch"`` or a backend namespace
    max_stop_ids, max_stop_sequences, max_stop_length
                             the least widths of the stop buffers (wider requests widen them)
    cuda_graph               record the round (target pass, ops, draft pass) once per call
                             shape and replay it; the target/draft must then enqueue work
                             without host syncs. Ignored on backends that cannot capture.
    capture_first            record the graph before the first round instead of after an eager
                             one (for a process that already ran a round of the same shapes:
                             libraries loaded, lazy allocations made). Capture runs nothing, so
                             the first replay is round one.
    prefill                  ``"auto"``, ``"batched"``, ``"bucketed"`` or a ``PrefillPolicy``
                             (its ``batched_from`` overridable)
    max_len                  positions per slot (prompt + max_new_tokens + k + 1) for every
                             call; with it the buffers, caches and graphs of one call serve the
                             next call of the same batch (no re-capture); without it they are
                             sized per call (and kept while sizes repeat)
    run_ahead                launch each round before reading the last one's outcome, so the
                             host's work between rounds overlaps the GPU's (a round past a
                             reply's end is then computed and thrown away, foreseen where the
                             end comes by max_new_tokens; ``metrics.overrun_rounds``). Outputs
                             are the same either way. Needs the backend's ``to_host_async``.
    """

    def __init__(self, target: Any, draft: Any = None, *,
                 num_speculative_tokens: Union[int, str, Any] = 3,
                 backend: Union[str, Backend] = "reference", max_stop_ids: int = 4,
                 max_stop_sequences: int = 2, max_stop_length: int = 4,
                 cuda_graph: bool = False, capture_first: bool = False,
                 prefill: Union[str, PrefillPolicy] = "auto", max_len: Optional[int] = None,
                 run_ahead: bool = True):
        # refused here, before any launch: a bad k / k_max, no draft, a draft too short
        self.spec = make_policy(num_speculative_tokens)
        k = self.spec.k_max
        self.spec.check(draft)
        self.target, self.draft, self.k = target, draft, k
        self.be = make_backend(backend) if isinstance(backend, str) else backend
        self._parts = Parts(self.be, target, draft, k)
        self.max_stop_ids = max_stop_ids
        self.max_stop_sequences = max_stop_sequences
        self.max_stop_length = max_stop_length
        self.cuda_graph = bool(cuda_graph)
        self.capture_first = bool(capture_first)
        self.run_ahead = bool(run_ahead)
        policy = prefill if isinstance(prefill, PrefillPolicy) else PrefillPolicy(prefill)
        policy.check(target)
        self.prefill_policy = policy
        if max_len is not None and int(max_len) < k + 2:
            raise ValueError(f"max_len: {max_len} leaves no room for a prompt and k + 1 rows")
        self.max_len = None if max_len is None else int(max_len)
        self._state: Optional[CallState] = None
        self.slot_stats: dict = {}
        self.reset_metrics()

    def reset_metrics(self) -> None:
        """Start counting afresh (e.g. after a warm-up call; buffers and graphs are kept)."""
        self.metrics = Metrics(num_speculative_tokens=self.k, accept_counts=[0] * self.k,
                               position_rows=[0] * self.k, policy=self.spec.name)

    @property
    def prefill(self) -> str:
        """The prefill policy's mode (``"auto"``, ``"batched"`` or ``"bucketed"``)."""
        return self.prefill_policy.mode

    @prefill.setter
    def prefill(self, mode: str) -> None:
        policy = replace(self.prefill_policy, mode=mode)
        policy.check(self.target)
        self.prefill_policy = policy

    positions_needed = staticmethod(positions_needed)
    prefill_bucket = staticmethod(PrefillPolicy.bucket)

    @property
    def _can_capture(self) -> bool:
        """Rounds and prefill buckets are recorded as graphs (cuda_graph on a backend that can)."""
        return self.cuda_graph and self.be.capture is not None

    def generate(self, requests: Iterable[RequestLike], *,
                 progress: Optional[Callable[[int, int], None]] = None) -> list[Result]:
        """Run every request to completion, all in one batch (one slot each); returns
        [Result] in request order. ``progress(done_tokens, total_tokens)`` is called after
        every round if given."""
        reqs = check_requests(requests)
        return self.serve(reqs, slots=len(reqs), progress=progress) if reqs else []

    def calibrate(self, requests: Iterable[RequestLike], *, slots: Optional[int] = None,
                  max_calls: int = 4) -> bool:
        """Warm-up for a policy that measures its costs (``AutoK()`` without ``costs=``):
        serve ``requests`` over ``slots`` slots (default one each) up to ``max_calls`` times,
        until the policy has the cost of a round at every k for that slot count (each k's
        graph recorded on the way), then reset the metrics. The requests need enough new
        tokens for about ``2 * (k_max + 1) * hold`` rounds (the sweep down and back up; a
        sweep a call leaves unfinished goes on in the next); they run without their stop ids
        and sequences (the replies are discarded), and the acceptance the policy saw on them
        is forgotten after (``forget_acceptance``: it was not the requests' own text). Returns
        whether it is calibrated (True at once for a fixed k or given costs)."""
        reqs = check_requests(requests)
        slots = len(reqs) if slots is None else int(slots)
        done = getattr(self.spec, "calibrated", lambda B: True)
        # A warm-up's replies are thrown away, so they run without their stops: each takes its
        # max_new_tokens, and a short reply cannot end the sweep early (s26: B=1 calibrated on
        # one request whose EOS came first left k's unmeasured). The stop buffers keep the
        # requests' widths, so the call's shape, buffers and graphs are the timed calls'.
        widths = (self.max_stop_ids, self.max_stop_sequences, self.max_stop_length)
        self.max_stop_ids, self.max_stop_sequences, self.max_stop_length = \
            stop_widths(reqs, *widths)
        runs = [replace(r, stop_token_ids=(), stop_sequences=()) for r in reqs]
        try:
            for _ in range(max_calls if runs else 0):
                if done(slots) and not getattr(self.spec, "sweep", None):   # the sweep ended too
                    break
                self.serve(runs, slots=slots)
        finally:
            self.max_stop_ids, self.max_stop_sequences, self.max_stop_length = widths
        # what the drafts accepted on text past the stops is not the requests': costs only
        forget = getattr(self.spec, "forget_acceptance", None)
        if forget is not None:
            forget()
        self.reset_metrics()
        return bool(done(slots))

    def serve(self, requests: Iterable[RequestLike], *, slots: int,
              arrivals: Optional[Sequence[int]] = None,
              progress: Optional[Callable[[int, int], None]] = None,
              on_round: Optional[Callable[[int], None]] = None) -> list[Result]:
        """Continuous batching over ``slots`` slots. Request i may start at round
        ``arrivals[i]`` (default 0); waiting requests take free slots first come first
        served at a round boundary (prefilled there, eagerly), run with the others, and
        free their slot in the round they finish. Every round has the same shape (idle
        slots are computed, never committed), so one captured graph serves all of them.
        Returns [Result] in request order; ``self.slot_stats`` counts admissions/releases.
        ``on_round(round_index)`` is called after every round if given (monitoring).
        """
        reqs = check_requests(requests)
        if not reqs:
            return []
        slots = int(slots)
        if slots < 1:
            raise ValueError(f"slots: must be >= 1, got {slots}")
        arrivals = [0] * len(reqs) if arrivals is None else [int(a) for a in arrivals]
        if len(arrivals) != len(reqs) or min(arrivals) < 0:
            raise ValueError("arrivals: one round index >= 0 per request")
        with self.be.stream_scope():
            st = self._call_state(reqs, slots)
            results, self.slot_stats = _serve(
                self._parts, st, reqs, arrivals, spec=self.spec, policy=self.prefill_policy,
                can_capture=self._can_capture, capture_first=self.capture_first,
                metrics=self.metrics, run_ahead=self.run_ahead, progress=progress,
                on_round=on_round)
        return results

    def _call_state(self, reqs: Sequence[Request], slots: int) -> CallState:
        """The last call's state when its shape repeats and the caches are still its own;
        fresh otherwise (``state.reuse`` / ``state.fresh``)."""
        shape = call_shape(reqs, slots, self.k, self.max_len, self.max_stop_ids,
                           self.max_stop_sequences, self.max_stop_length)
        st = reuse(self._parts, self._state, shape)
        if st is None:
            self._state = None                    # the old graphs go before the new caches
            st = fresh(self._parts, shape)
        self._state = st
        return st
