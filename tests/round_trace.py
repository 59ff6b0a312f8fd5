"""What a decoder asks of its backend between rounds, recorded on the CPU.

``TracingBackend()`` is the reference backend with every call the orchestrator can make
logged: device->host reads (``to_host``; ``read``: ``to_host_async``), host->device conversions (``xp.asarray``), the ops,
synchronisations, a fake ``capture`` (so the decoder runs with ``cuda_graph=True`` on the
CPU: a capture records nothing and returns a replay that reruns the function, its calls
logged as one ``replay``) and a fake ``timer`` (its events logged; every interval
``GPU_SECONDS``). ``trace_calls(dec, reqs)`` serves each request alone (B=1, one
call each, as ``tools/perf/e2e_smollm2.py``'s ``one_at_a_time``) and returns the results and,
per call, the events before the first round, those of each round and those after the last,
every event a
``(kind, what, site)`` tuple (``site``: the orchestrator's file:function that made it), so two
decoders' traces can be compared event for event.

``fake_clock()`` makes ``serve``'s clock tick a fixed step per read, so a policy that measures
round times (``AutoK()`` without ``costs=``) sees the same time for every clean round and its
choices are reproducible.
"""
from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

from specdec_lib.orchestrator import backends as _backends

_OWN = ("specdec_lib/orchestrator/", "specdec_lib\\orchestrator\\")
GPU_SECONDS = 5e-4      # what every fake timer measures


def _site() -> str:
    """file:function of the innermost orchestrator frame calling into the backend."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if any(s in fn for s in _OWN):
            return f"{fn.rsplit('orchestrator', 1)[1][1:]}:{f.f_code.co_name}"
        f = f.f_back
    return "?"


class _Xp:
    """numpy, with ``asarray`` (the host->device copy of a GPU backend) logged."""

    def __init__(self, np, log):
        self._np, self._log = np, log

    def asarray(self, a, dtype=None):
        self._log("asarray", getattr(a, "shape", None))
        return self._np.asarray(a, dtype=dtype)

    def __getattr__(self, name):
        return getattr(self._np, name)


class TracingBackend(SimpleNamespace):
    """The reference backend, every orchestrator-visible call logged in ``events``; a fake
    ``capture`` whose replays rerun the recorded function (its calls kept out of the log:
    on a GPU they are one graph launch)."""

    def __init__(self):
        ref = _backends.reference_backend()
        super().__init__(**vars(ref))
        import numpy as np
        self.events: list = []
        self._quiet = 0
        self.replay_ids: dict = {}
        self.xp = _Xp(np, self._log)
        for name, _ in _backends._BACKEND_OPS:
            setattr(self, name, self._wrap("op", name, getattr(ref, name)))
        self.to_host = self._wrap("to_host", None, ref.to_host, shape=True)
        self.to_host_async = self._wrap("read", None, ref.to_host_async, shape=True)
        self.synchronize = self._wrap("sync", "stream", ref.synchronize)
        self.device_synchronize = self._wrap("sync", "device", ref.device_synchronize)
        self.capture = self._capture
        self.timer = self._timer

    def _log(self, kind, what):
        if not self._quiet:
            self.events.append((kind, what, _site()))

    def _wrap(self, kind, what, fn, shape=False):
        def call(*a, **kw):
            self._log(kind, getattr(a[0], "shape", None) if shape else what)
            return fn(*a, **kw)
        return call

    @contextlib.contextmanager
    def quiet(self):
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def _timer(self):
        return SimpleNamespace(start=lambda: self._log("timer", "start"),
                               stop=lambda: self._log("timer", "stop"),
                               seconds=lambda: GPU_SECONDS)

    def _capture(self, fn):
        self._log("capture", None)
        n = len(self.replay_ids)

        def replay():
            self._log("replay", self.replay_ids[replay])
            with self.quiet():
                fn()
        self.replay_ids[replay] = n
        return replay


@contextlib.contextmanager
def fake_clock(step: float = 1e-3):
    """``serve``'s (and the prefill's) ``time.perf_counter`` ticks ``step`` per read."""
    from specdec_lib.orchestrator import prefill as _prefill, serve as _serve
    t = [0.0]

    def perf_counter():
        t[0] += step
        return t[0]
    fake = SimpleNamespace(perf_counter=perf_counter)
    old = _serve.time, _prefill.time
    _serve.time = _prefill.time = fake
    try:
        yield
    finally:
        _serve.time, _prefill.time = old


def graph_keys(dec, be: TracingBackend) -> dict:
    """replay id -> the plan key (round graphs) or ("prefill", rows) of the decoder's state."""
    st = dec._state
    out = {be.replay_ids[r]: key for key, r in st.replays.items() if r in be.replay_ids}
    for nb, pb in st.prefills.items():
        if pb.replay in be.replay_ids:
            out[be.replay_ids[pb.replay]] = ("prefill", nb)
    return out


def trace_calls(dec, reqs, be: TracingBackend):
    """Serve each of ``reqs`` alone (slots=1): returns ([Result], [(start_events,
    [round_events], end_events)] per call), a round's events from its ``before_round`` to
    the next one's (so a round's read and its policy lesson, which run ahead comes after the
    next launch, fall in the next round's events; the end events are those after the last
    round's read of control); replays are named by their graph key, policy calls logged as
    ("policy", name)."""
    spec = dec.spec
    calls, results = [], []

    def hook(name):
        real = getattr(spec, name)

        def call(*a, **kw):
            be._log("policy", name)
            return real(*a, **kw)
        return call
    saved = {n: getattr(spec, n) for n in ("start", "admit", "before_round", "after_round")}
    for n in saved:
        object.__setattr__(spec, n, hook(n))      # (FixedK is a frozen dataclass)
    try:
        for r in reqs:
            first = len(be.events)
            results += dec.serve([r], slots=1)
            evs = be.events[first:]
            starts = [i for i, e in enumerate(evs) if e[:2] == ("policy", "before_round")]
            end = 1 + max(i for i, e in enumerate(evs) if e[0] == "read")
            rounds = [evs[a:b] for a, b in zip(starts, starts[1:] + [end])]
            calls.append((evs[:starts[0]], rounds, evs[end:]))
    finally:
        for n in saved:
            object.__delattr__(spec, n)
    keys = graph_keys(dec, be)

    def named(evs):
        return [(k, keys.get(w, w) if k == "replay" else w, s) for k, w, s in evs]
    return results, [(named(s), [named(e) for e in rs], named(tail)) for s, rs, tail in calls]
