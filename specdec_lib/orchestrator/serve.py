"""The serving loop: continuous batching of requests over a fixed set of slots.

``Scheduler`` owns the queues (waiting requests, free slots, which request holds which
slot); ``serve`` runs rounds until every request has finished: admissions and their prefill
at a round boundary, the round (eager, or replayed as one recorded graph), then one small
device->host read (``buf.control``: ``num_accepted``, ``out_lens``, ``finished``) for control
and metrics, made after the next round's launch where it may (``_Reader``: run ahead). The
speculation policy picks every round's plan (``policy``); one recorded graph per plan. A policy with
``budget`` is told, at each admission, the admitted requests' token budgets and how many
requests still wait (none: the call now ends with its slowest request).
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Callable, Optional, Sequence

import numpy as np

from .backends import immediate_read
from .prefill import PrefillPolicy, prefill
from .request import Metrics, Request, Result
from .policy import RoundPlan, live_rows, live_variants
from .round import block_rows, emitted_rows, run_round, write_live_rows
from .state import FINISH_REASONS, CallState, Parts, admit, split_control, upload_to

# rounds with at most half the slots busy (a stream's tail, slots held for a prefill group)
# verify one row for each idle slot beyond the smallest live count (an eighth or a half of
# the slots) that holds the busy ones (``policy.live_rows``): fewer rows for the same tokens.
# s50 (H100, served 128 requests through 32 slots, EAGLE3 k=3, 7 runs each): median 30,610
# tok/s against 29,330 with whole blocks (+4%, and 30,061-31,288 against 25,388-31,349), tail
# rounds 1,270-1,320 us against 1,340-1,350; lossless under rescoring; its GPU tests pass.
# False: whole blocks always
LIVE_ROWS = True


class Scheduler:
    """First come first served over ``slots`` slots: request i waits until round
    ``arrivals[i]``, then takes the first free slot at a round boundary; with ``hold``,
    free slots may wait up to ``hold`` rounds for ``group`` of them to be free (so the
    admitted prompts share a prefill pass), unless every arrived request fits or no slot
    is busy."""

    def __init__(self, arrivals: Sequence[int], slots: int, group: int = 1, hold: int = 0):
        self.arrivals = list(arrivals)
        self.waiting = sorted(range(len(arrivals)), key=lambda i: arrivals[i])
        self.free = list(range(slots))
        self.owner: list[Optional[int]] = [None] * slots     # slot -> request index
        self.freed_at = [0] * slots     # the first round each slot could take a request again
        self.group, self.hold = int(group), int(hold)
        self.stats = {"admitted": 0, "released": 0, "max_busy": 0, "held_rounds": 0}

    def pending(self) -> bool:
        return bool(self.waiting) or any(o is not None for o in self.owner)

    def _holds(self, now: int) -> bool:
        """Whether the free slots wait a round more for others (``hold``)."""
        if not self.hold or not self.free or not any(o is not None for o in self.owner):
            return False
        ready = sum(1 for i in self.waiting[:self.group] if self.arrivals[i] <= now)
        oldest = min(self.freed_at[b] for b in self.free)
        return 0 < len(self.free) < min(self.group, ready) and now - oldest < self.hold

    def admit(self, now: int) -> list[tuple[int, int]]:
        """[(slot, request index)] of the requests that start at round ``now``."""
        if self._holds(now):
            self.stats["held_rounds"] += 1
            return []
        out = []
        while self.free and self.waiting and self.arrivals[self.waiting[0]] <= now:
            i, b = self.waiting.pop(0), self.free.pop(0)
            self.owner[b] = i
            out.append((b, i))
        self.stats["admitted"] += len(out)
        return out

    def next_arrival(self) -> int:
        return self.arrivals[self.waiting[0]]

    def busy(self) -> list[bool]:
        return [o is not None for o in self.owner]

    def release(self, b: int, now: int = 0) -> int:
        """Free slot ``b`` for the requests that start from round ``now``; returns the index
        of the request it held."""
        i, self.owner[b] = self.owner[b], None
        self.free.append(b)
        self.freed_at[b] = now
        self.stats["released"] += 1
        return i


def serve(p: Parts, st: CallState, reqs: Sequence[Request], arrivals: Sequence[int], *,
          spec, policy: PrefillPolicy, can_capture: bool, capture_first: bool,
          metrics: Metrics, run_ahead: bool = True,
          progress: Optional[Callable[[int, int], None]] = None,
          on_round: Optional[Callable[[int], None]] = None) -> tuple[list[Result], dict]:
    """Run ``reqs`` to completion over the slots of ``st``; returns the results in request
    order and the scheduler's slot counts (admitted, released, max_busy). ``spec`` is the
    speculation policy (``policy.FixedK`` / ``policy.AutoK``): asked for a ``RoundPlan``
    before every round and told the round's acceptance (and time) after it. ``run_ahead``
    (on a backend with ``to_host_async``): the next round is launched before this one's
    control is read (``_Reader``)."""
    be, buf, m = p.be, st.buf, metrics
    B = st.shape.slots
    sched = Scheduler(arrivals, B, policy.group, policy.hold_rounds)
    results: list[Optional[Result]] = [None] * len(reqs)
    total = sum(r.max_new_tokens for r in reqs)
    now, emitted = 0, 0
    spec.start(B, can_capture)

    def record(plan, with_live=False):
        """The round of ``plan`` as a graph, and with ``with_live`` (a process whose rounds
        are recorded before they first run: ``capture_first``), where live rows apply, its
        live-rows plans' too (s50: recorded one by one as a stream's tail reached them, they
        stalled decoding); the recording time is kept apart from decoding."""
        live = with_live and LIVE_ROWS and not getattr(spec, "measuring", False)
        for q in [plan] + (live_variants(plan, B) if live and not plan.live else []):
            if q.key in st.replays:
                continue
            if p.block_draft and q.propose:
                emitted_rows(p, st, q)      # its device index made before the recording
            tc = time.perf_counter()
            st.replays[q.key] = be.capture(lambda q=q: run_round(p, st, q))
            m.capture_s += time.perf_counter() - tc
            m.graph_captured = True
    if can_capture and capture_first:
        # every plan the policy may switch to, recorded before decoding starts (a graph
        # recorded mid-call stalls every running request for its capture and first upload)
        for plan in getattr(spec, "graph_plans", lambda: ())():
            record(plan, with_live=True)
    t0 = time.perf_counter()
    first_round = True
    seen: set = set()           # plans run eagerly in this call (their shapes compiled)
    reader = _Reader(be, B, run_ahead)
    # The policy learns from a round (and the metrics count it) while the GPU runs the next
    # one: its after_round comes just after the next launch (before an admission, which
    # resets the slots it learns about), and prepare(busy) then readies the next choice, so
    # the host's work between a round's read and the next launch is a lookup (AutoK's numpy
    # work was 41-76 us a round there, the GPU idle: 3-6% of a B=1 round). A choice thus
    # sees the history up to the round before last (run ahead or not): accepted history only.
    # (num_accepted copy, busy, seconds, timer, the metrics' counts) not yet told
    learn: Optional[tuple] = None
    prepare = getattr(spec, "prepare", None)
    budget = getattr(spec, "budget", None)
    # A policy that measures round costs (AutoK calibrating: ``measuring``) has a clean
    # round's replay timed by two events (a host stall lengthens a round's period, not its
    # GPU time); two timers alternate, since a round's is read (when it is told) after the
    # next round's are recorded
    timers = [be.timer(), be.timer()] \
        if hasattr(spec, "measuring") and getattr(be, "timer", None) else None
    flip = 0
    inflight: Optional[SimpleNamespace] = None      # the last launched round, unread
    outputs: list = []          # (read handle of out_tokens, [(request, slot, length, reason)])
    last_end: Optional[float] = None     # when the last round read ended

    def tell(lesson):
        n_acc, was_busy, seconds, timer, counted = lesson
        m.count_round(*counted)        # the metrics too, off the host's critical path
        if timers is None:
            spec.after_round(n_acc, was_busy, seconds)
        else:
            spec.after_round(n_acc, was_busy, seconds,
                             None if timer is None else timer.seconds())

    def collect():
        """The results of the requests that finished (their out_tokens rows read)."""
        for handle, ended in outputs:
            out_tokens = handle()
            for i, b, n, reason in ended:
                results[i] = Result(tokens=out_tokens[b, :n].tolist(),
                                    finish_reason=FINISH_REASONS.get(reason, str(reason)))
        outputs.clear()

    def finish(r: SimpleNamespace, later: Optional[SimpleNamespace]) -> Optional[tuple]:
        """The end of round ``r``: its control read, finished slots released (and masked
        out of ``later``, a round launched after it), progress; returns its lesson."""
        nonlocal emitted, last_end
        n_all, out_lens, fin = split_control(r.control(), B)
        # the round's period: from the last round's end to this one's (the host's work
        # between rounds, GPU idle time, included), for a round whose shape was warm
        t_end = time.perf_counter()
        seconds = t_end - last_end if r.clean and last_end is not None else None
        last_end = t_end
        collect()
        live = r.busy
        reader.known[live] = out_lens[live]
        done = [b for b in range(B) if live[b] and fin[b] != 0]
        if done:
            ended = []
            for b in done:
                ended.append((sched.release(b, now + 1), b, int(out_lens[b]), int(fin[b])))
                emitted += int(out_lens[b])
                if later is not None:
                    later.busy[b] = False       # computed there as a finished row, not run
            outputs.append((reader.read(buf.out_tokens), ended))
        if on_round is not None:
            on_round(r.index)
        if progress is not None:
            progress(emitted + sum(int(out_lens[b]) for b in range(B)
                                   if sched.owner[b] is not None), total)
        if not live.any():              # run ahead past the last finish: nothing to learn
            m.overrun_rounds += 1
            return None
        plan = r.plan
        counted = (n_all[live], plan.verify,
                   None if plan.num_draft is None else np.asarray(plan.num_draft)[live])
        return (n_all, live, seconds, r.timer if seconds is not None else None, counted)

    while sched.pending():
        admitted = [(b, reqs[i]) for b, i in sched.admit(now)]
        busy = sched.busy()
        if not any(busy):                  # nobody running: skip to the next arrival
            now = sched.next_arrival()
            continue
        if admitted and learn is not None:
            tell(learn)
            learn = None
        if admitted:
            tp = time.perf_counter()
            admit(p, st, admitted)
            m.admit_s += time.perf_counter() - tp
            m.admissions += 1
            m.admitted += len(admitted)
            prefill(p, st, admitted, policy, can_capture, m)
            m.prefill_s += time.perf_counter() - tp
            spec.admit([b for b, _ in admitted])
            reader.admit(admitted)
            if budget is not None:      # (a policy that chooses k for the slowest request)
                budget([b for b, _ in admitted], [r.max_new_tokens for _, r in admitted],
                       len(sched.waiting))
        sched.stats["max_busy"] = max(sched.stats["max_busy"], sum(busy))
        busy_np = np.asarray(busy)
        plan = spec.before_round(busy_np)
        if LIVE_ROWS and not getattr(spec, "measuring", False):    # (costs measured whole)
            plan = live_rows(plan, busy_np)
        _set_num_draft(p, st, plan)
        if p.block_draft and plan.propose:
            emitted_rows(p, st, plan)      # its device index made before any recording
            write_live_rows(p, st, plan)
        key = plan.key
        if can_capture and capture_first and key not in st.replays:
            record(plan, with_live=True)
        replay = st.replays.get(key)
        clean = not admitted and (replay is not None or (not can_capture and key in seen))
        timer = None
        if timers is not None and clean and spec.measuring:
            timer, flip = timers[flip], flip ^ 1
            timer.start()
        tl = time.perf_counter()
        if replay is not None:
            replay()
        else:
            run_round(p, st, plan)
            seen.add(key)
        if timer is not None:
            timer.stop()
        # --- the round's end: one small device->host read (control: num_accepted, out_lens,
        # finished) for control and metrics, waited for below or after the next launch
        launched = SimpleNamespace(plan=plan, busy=busy_np.copy(), index=now, timer=timer,
                                   clean=clean, control=reader.read(buf.control))
        if not first_round:   # steady state only: the first round compiles and allocates
            m.launch_s += time.perf_counter() - tl
            m.launched_rounds += 1
        first_round = False
        if inflight is not None:           # the round before, read while this one runs
            learn = finish(inflight, launched)     # (learn was told: None here)
            inflight = None
        if learn is not None:             # the last round's lesson, the GPU busy meanwhile
            tell(learn)
            learn = None
            if prepare is not None:         # (the slots of the next round, as known now)
                prepare(np.asarray(sched.busy()))
        if can_capture and replay is None:
            # the plan's first round ran eagerly (cupy kernels compiled, pools and the sampling
            # workspace allocated); every later round of it replays its graph
            record(plan)
        if reader.may_run_ahead(launched, block_rows(plan, B)):
            inflight = launched
        else:
            learn = finish(launched, None)
        now += 1
    if inflight is not None:            # (then the last lesson was told)
        learn = finish(inflight, None)
    if learn is not None:
        tell(learn)
    collect()
    be.synchronize()
    m.wall_s += time.perf_counter() - t0
    m.emitted += emitted
    return results, sched.stats


class _Reader:
    """The host's reads of round outputs, and whether a round may stay unread while the
    next one is planned and launched (run ahead).

    A read is a handle: ``read(a)()`` is a host copy of ``a`` as it was when ``read`` was
    called (stream order), made by the backend's ``to_host_async`` (a copy into pinned
    memory and an event) or, without it, at once by ``to_host``. Running ahead takes the
    host's work between rounds (the read, the policy, serve's bookkeeping, the next graph
    launch: 40-80 us a B=1 SmolLM2 round on an H100, s42, the GPU idle) off the GPU's
    critical path. Its price is a round launched after a request's last: computed for its
    finished rows and never committed (like an idle slot), so harmless but not free. So a
    round stays unread only while fewer than a quarter of its running slots may finish in
    it by length (``known`` out_lens at the last read + the round's block rows reach
    max_new): at B=1 the round that may end a request is read before the next launch,
    while at B=32 a slot that may end idles one round at worst. A finish by a stop id or
    sequence is not foreseen (one round over at B=1: ~2-3% of a 128-token reply)."""

    def __init__(self, be, slots: int, run_ahead: bool):
        self.ahead = bool(run_ahead) and getattr(be, "to_host_async", None) is not None
        self.read = be.to_host_async if self.ahead else immediate_read(be.to_host)
        self.known = np.zeros(slots, np.int64)      # out_lens at the last read
        self.limit = np.zeros(slots, np.int64)      # max_new_tokens of each slot's request

    def admit(self, admitted) -> None:
        for b, r in admitted:
            self.known[b], self.limit[b] = 0, r.max_new_tokens

    def may_run_ahead(self, r: SimpleNamespace, rows: Sequence[int]) -> bool:
        if not self.ahead:
            return False
        live = r.busy
        may_end = live & (self.known + np.asarray(rows) >= self.limit)
        return 4 * int(may_end.sum()) < int(live.sum())


def _set_num_draft(p: Parts, st: CallState, plan: RoundPlan) -> None:
    """``buf.num_draft`` = the plan's per-slot counts (one small copy, only when they change:
    never under a fixed k). A whole-block plan's row is copied device to device from one
    made once per k (a switch of k then costs the host a launch, not a pageable upload with
    the GPU idle: auto switches often)."""
    B = st.shape.slots
    want = plan.num_draft if plan.num_draft is not None else (plan.verify,) * B
    have = st.num_draft if st.num_draft is not None else (p.k,) * B
    if want != have:
        src = st.uniform_drafts.get(plan.verify) if plan.num_draft is None else None
        if src is None and plan.num_draft is None:      # once per k
            src = st.uniform_drafts[plan.verify] = p.be.xp.asarray(np.asarray(want, np.int32))
        elif src is None:       # stream-ordered (a live-rows split changes every few rounds)
            src = upload_to(p.be, {"n": np.asarray(want, np.int32)})["n"]
        st.buf.num_draft[...] = src
    st.num_draft = want
