"""Speculation policies: how many drafts each round verifies and how many it proposes.

A policy answers two questions at every round boundary (``serve`` asks them):
``before_round(busy) -> RoundPlan`` and ``after_round(num_accepted, busy, seconds)`` (for
the oldest round not yet told: ``serve`` tells a round while the next one runs; a policy
whose ``measuring`` is true (read every round) is also given ``gpu_seconds``, its replay's
GPU time, and the round timed for it), and may
have ``prepare(busy)`` (called while a round runs: ready the next choice) and
``budget(slots, max_new, waiting)`` (called at each admission: the new requests' token
budgets, and how many requests wait for a slot) and ``graph_plans()`` (the plans whose
graphs ``serve`` records before a call's first round, where it records graphs).

``RoundPlan(verify, propose, num_draft)``: the round verifies ``verify`` drafts per slot (its
block is ``verify + 1`` rows a slot; ``num_draft``, when not None, gives each slot fewer:
ragged blocks, eager rounds only) and, at its end, the draft proposes ``propose`` tokens for
the next round (0: no draft pass at all). The drafts a round verifies were proposed by the
round before it (or by the prefill, which always proposes ``k_max``), so ``verify`` is the
last round's ``propose``: a choice made before round r decides round r + 1's block, one round
ahead. Buffers are sized for ``k_max``; a recorded graph is kept per (verify, propose) pair
(like the prefill buckets), so changing k costs one capture the first time, nothing after.

``FixedK(k)``: k every round (the decoder's ``num_speculative_tokens=int``).

``AutoK(k_max)`` (``num_speculative_tokens="auto"``), the design:

* Acceptance, per request and per draft position. ``a[i, j]`` estimates P(draft j + 1 of
  request i accepted | drafts 1..j were): a running mean over the request's rounds that
  proposed it (counts decayed by ``decay`` per round that tried the position, so a
  request's drift is tracked; a round that did not try it keeps its evidence, and the
  exploration rounds at k = 0, every ``explore_every`` = 8, refresh it: see Choice),
  shrunk toward a prior of ``prior_strength`` pseudo-rounds: the same per-position mean
  over every request so far (the pool, decayed by ``POOL_DECAY``), each position's shrunk
  toward the position before it (``CHAIN`` pseudo-rounds; the first toward a neutral 0.5), so
  a position never tried yet is expected to do as well as the last one tried (else a k once
  chosen could never grow: its next position would stay at 0.5 for want of trying); past the
  first position the pool's value is scaled by the request's own estimate at the position
  before over the pool's there (a request whose first drafts land less than most is
  expected to land less later too: its late positions are the ones tried least). A round
  updates only from ``num_accepted`` (accepted history): never
  the round's logits, so sampled output keeps the target's distribution (a k chosen from the
  past changes which random numbers verify a block, not their law) and greedy output is
  token-identical.
* Tokens a round yields: ``E_i(k) = 1 + sum_{j=1..k} prod_{m<=j} a[i, m]``.
* Cost of a round, ``cost(B, k)`` seconds at B slots (idle slots are computed too, so B is
  the call's slot count): from ``costs=`` (a dict ``{k: s}`` or ``{(B, k): s}``, or a callable
  ``(B, k) -> s``: reproducible choices, or numbers measured offline), else measured on
  clean rounds: a round that verified and proposed the same k with whole blocks, ran no
  admission, and replayed a recorded graph (or, without graphs, used a shape seen before).
  A clean round gives two numbers: its period (the host already waits for every round: it
  reads ``finished`` / ``num_accepted``, so the time from the last round's read to this
  one's; the host's work between rounds, the GPU idle, included) and, on a GPU backend, the
  GPU time of its replay (two events around it: ``gpu_seconds``). The GPU time is what
  depends on k; the rest of the period (reads, launch, host) does not, and it is what a
  host stall lengthens (s28: a k's mean period moved 10-15% between runs), so
  ``cost(B, k)`` is the median GPU time of k's
  last ``SAMPLES_KEPT`` samples plus the median host share of the period over every k's
  (where no GPU time is given, the median period). The medians are then fitted
  nondecreasing in k (weighted pool-adjacent-violators): a round at k + 1 does all of k's
  work and more, so a table where it is cheaper is noise. Once calibrated no round is
  timed on the GPU, and decoding prices the k's (*live costs*, ``probe_every`` > 0): a clean
  round with every slot busy (an idle slot's rows are cheaper, in a recorded graph too: its
  GEMM rows are computed but attention skips a finished slot; s29's samples from draining
  batches priced k = 4 below k = 3) and the same verify count as the round before gives its
  period; a k's cost is the median of its last ``LIVE_KEPT`` periods, a k without any its
  calibrated cost moved by the live-minus-calibrated gap at the nearest k that has them, or,
  where two k's have them and the two nearest's live costs rise more between them than the
  calibrated ones, the calibration's steps from the nearest scaled by that ratio (below
  them: cheaper, above: dearer), fitted nondecreasing. The
  calibration has underpriced each draft wherever checked (s30, s31; issue 29, H100 B=32: k =
  3 over k = 0 204 us calibrated, ~290 us decoding), and in a fixed batch every slot is busy
  only until the first request ends, so few k's get live samples: the gap alone priced k = 1
  from k = 2's and kept auto at k = 2 (autok_sim, true 1/1.15/1.35/1.55, calibrated
  1/1.03/1.06/1.10: 0.88x of target-only where k = 1 ran 0.99x). The steps are scaled, not
  drawn as a line through the two live k's (s42-s46's rule), because the calibration has the
  shape right where it misses the scale: a tensor-core GEMM costs by row groups of 8 (s47,
  H100, B=4: calibrated 571 / 644 / 776 / 839 / 951 us at k = 0..4, live 638 / 784 at k =
  1 / 2; the line priced k = 3 at 931, auto stayed at k = 1, 0.97x of k = 3). Live costs
  rising less than the calibration are taken for noise (a few periods of 3% jitter) and
  left out. Since the
  choice alone would only ever price the k that runs, after ``probe_every`` rounds at one k
  (``hold`` while it or the neighbour has no live cost) a probe proposes the neighbouring k
  whose live cost is oldest for ``PROBE_LEN`` rounds; a probe after which the choice
  returns doubles the interval (to ``PROBE_BACKOFF`` x). (s31, H200, B=32: the calibration
  priced k = 3 10% above k = 0, decoding rounds cost 27% more; the table alone kept auto at
  k = 3, 0.91x, where k = 1 ran 1.10x and auto live 1.09x.) Until every k has a sample at
  this B the policy *calibrates*: it proposes ``k_max, k_max - 1, ..., 0``, each for
  ``hold`` rounds (which also records each k's graph), then the same back up, ``0, 1, ...,
  k_max`` (the graphs recorded: every round of it but a switch is a sample), so each k is
  timed early and late in the sweep and a drift of the round's cost over it (contexts grow a
  few tokens a round) cancels in the median (a sweep a call leaves unfinished goes on in the
  next call over as many slots); then again over any k still without a sample
  (``CALIBRATION_REFILLS`` times; a k never measured is extrapolated from its neighbours);
  ``calibrated(B)`` says when every k has one. (s21, the hybrid at B=32: one down sweep of
  ``hold`` 4 gave two samples a k, and the policy chose k=4 where k=3 was 8% faster.)
* Choice: the batch-wide k in 0..k_max maximising ``sum_i E_i(k) / cost(B, k)`` over the
  running requests (ties to the smaller k); k = 0 (target-only rounds, no draft pass) when
  that wins. That is the rate of tokens while requests wait for a slot (a finished slot is
  refilled). When none waits (``budget``: a fixed batch, or a server's queue run dry), the
  call's time is its last request's: the choice then minimises the time the slowest one
  needs, ``cost(B, k) * max_i R_i / E_i(k)`` (``R_i``: request i's token budget left), since
  a round costs the same for every slot of a recorded graph whatever the others need. (s29,
  32 everyday prompts at B=32: k=4 lifted the mean accepted length 8% over k=3 and ran *more*
  rounds, 89 against 87, each dearer: the batch ends with its slowest request, whose drafts
  land least.) After ``explore_every`` rounds in a row at k = 0 one round proposes k = 1, so
  the estimates can recover when the text becomes predictable (a draft that is always wrong
  pays that one round in ``explore_every`` + 1). This, not time, is how a k = 0 request's
  estimate moves: counts decayed every round (the old rule) took a request whose drafts
  never land back to the pooled prior ~15 rounds after k = 0, and the drain objective up to
  k = 1-3 and down again, again and again (autok_sim --suite, B=32 batches, acceptance
  ~Beta(1, 3): 0.94-0.96x of target-only); evidence kept with one try in 32 rounds left a
  request whose estimate dipped below break-even by chance at k = 0 (B=1, acceptance 0.6:
  ``test_live_costs_correct_a_calibration_that_underprices_k``); with one in 8 the batches
  run 0.98-0.99x and that B=1 case keeps 0.98x of k = 1's rate, as with the decay. With
  graphs k moves one step a round (to the best k's side of the last round's): the
  calibration sweep recorded every (k, k) and (k, k +- 1) graph, and a jump would record a
  new one inside a timed call, with its first replay's upload (s29: auto's B=1 calls
  recorded graphs while timed).
* Per request: a fixed-shape round (a recorded graph) computes ``B * (k + 1)`` rows whatever
  the slots hold, so a draft left out saves nothing and loses its expected tokens: with
  graphs every slot verifies k. Without graphs rows are cheaper when fewer (``cu_q`` is
  ragged in every op), so a request verifies its first j drafts only while
  ``P_i(j) = prod_{m<=j} a[i, m]`` pays its row: ``P_i(j) * cost(B, k) >= row_cost *
  sum_i E_i(k)``, with ``row_cost = (cost(B, k) - cost(B, 0)) / (B k)`` (a row's share of
  what speculating adds); idle slots verify nothing.
* Host cost: ``serve`` tells the policy a round's result (``after_round``) just after it
  launched the next round, and then calls ``prepare(busy)``, which readies the next choice,
  so both run while the GPU works; between a round's read and the next launch only
  ``before_round`` runs, a lookup where the running slots did not change (s27: 3 us a round,
  against 41-76 us when all of it ran there with the GPU idle, 3-6% of a B=1 round). A
  choice therefore sees the history up to the round before last (an admission learns the
  last round first: it resets slots). A round's work is a few dozen numpy calls on a few
  dozen numbers each, so its cost is their count: every slot's numbers go to buffers reused
  a round, position-major, the counts take one lookup, decay and add, nothing is computed
  twice (issue 29, ``tools/perf/policy_cost.py``: B=32 k_max=3, ~75 -> ~45 us a round on
  the dev CPU), each number rounded as the formulas read (a test checks them bit for bit).
  With graphs a round of ``AutoK`` makes the same backend calls (copies, reads, replays) as
  one of ``FixedK`` at its k once calibrated (while calibrating, two timing events around a
  clean round's replay; a probe replays the neighbouring k's recorded graph and copies
  num_draft) (``tests/test_round_calls.py``).
* Everything is a function of the accepted history and the cost table: the same history and
  table give the same choices (``choices`` keeps the plans of the last ``CHOICES_KEPT``
  rounds or more: a server runs for ever). ``k_rounds`` in the
  decoder's metrics counts the rounds verified at each k.

Caveat (a draft head with its own KV cache, ``uses_target_block``): a k = 0 round runs no
draft pass, so the head's cache misses those rounds' rows; when speculation resumes its
attention reads stale rows there. Output stays lossless (the target verifies every token);
only its acceptance can dip, which the estimates then measure.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from .state import MAX_BLOCK_ROWS

SAMPLES_KEPT = 32       # a (B, k)'s cost: the median of its last this many clean samples
POOL_DECAY = 0.995      # decay of the pooled (all requests) acceptance counts per round
CALIBRATION_REFILLS = 2  # sweeps over the k's still unmeasured after the first
CHAIN = 2.0             # pseudo-rounds tying a position's pooled estimate to the one before
CHOICES_KEPT = 1 << 16  # AutoK.choices keeps at least the last this many rounds' plans
LIVE_KEPT = 16          # a k's live cost: the median of its last this many full rounds' periods
LIVE_MIN = 1            # live samples of a k before they replace its calibrated cost
PROBE_LEN = 3           # rounds a probe proposes its k (a switch, a new verify count, a sample)
PROBE_BACKOFF = 8       # a probe that changes nothing doubles the interval, up to this many x


@dataclass(frozen=True)
class RoundPlan:
    """One round: ``verify`` drafts per slot (``num_draft``: per slot, <= verify, when
    ragged), ``propose`` drafts for the next round. ``live`` > 0: ``live`` slots verify
    ``verify`` drafts and the others none (``serve``'s live-rows rounds); which slots they
    are is device data, so one recording serves every such round."""
    verify: int
    propose: int
    num_draft: Optional[tuple] = None
    live: int = 0

    @property
    def key(self) -> tuple:
        """What a recorded round depends on (one graph per key)."""
        return (self.verify, self.propose, ("live", self.live) if self.live else self.num_draft)


def live_counts(slots: int) -> tuple:
    """The live counts of ``slots`` slots' live-rows rounds, ascending: a half and an eighth
    of the slots (where that is a slot or more). Two, so that a plan's live-rows graphs are
    few enough to record with it (``live_variants``), not inside a decoding call (s50, H100,
    B=32 k=3: a round with 16 live slots 1,307-1,334 us, with 8 / 4 / 2 1,288-1,305 /
    1,273-1,287 / 1,269-1,280, with whole blocks 1,338-1,364: the rows matter little)."""
    return tuple(sorted({c for c in (slots // 8, slots // 2) if c > 0}))


def live_rows(plan: RoundPlan, busy) -> RoundPlan:
    """A round of whole blocks (``num_draft`` None) where at most half the slots are busy
    (``busy``, bool [slots]), as a live-rows plan: the busy slots, and as many idle ones as
    make the smallest live count that holds them (``live_counts``), verify ``plan.verify``
    drafts, every other idle slot none (one row: computed, never committed, as an idle
    slot's whole block was). The round's rows, what its GEMMs, attention, sampling and draft
    steps cost, then follow the live slots: B=32 at k=3 with 4 busy, 44 rows against 128.
    Other plans come back as they are."""
    busy = np.asarray(busy, bool)
    B, n = busy.size, int(busy.sum())
    if plan.num_draft is not None or plan.verify == 0 or n == 0:
        return plan
    live = next((c for c in live_counts(B) if n <= c), 0)
    if not live:
        return plan
    whole = busy.copy()
    whole[np.flatnonzero(~busy)[:live - n]] = True
    return RoundPlan(plan.verify, plan.propose,
                     tuple(plan.verify if w else 0 for w in whole.tolist()), live)


def live_variants(plan: RoundPlan, slots: int) -> list:
    """The live-rows plans ``live_rows`` may make of ``plan`` over ``slots`` slots, one per
    live count (none for a ragged or target-only plan): recorded with ``plan``."""
    return [q for q in (live_rows(plan, np.arange(slots) < c) for c in live_counts(slots))
            if q.live]


def _check_draft(draft: Any, k_max: int, what: str) -> None:
    """A draft exists, and (where it says how many tokens it can propose a round, as
    ``max_draft_tokens``) reaches ``k_max``."""
    if draft is None:
        raise ValueError(f"draft: required when {what}")
    steps = getattr(draft, "max_draft_tokens", None)
    if steps is not None and int(steps) < k_max:
        raise ValueError(f"draft: proposes at most {int(steps)} tokens a round "
                         f"(max_draft_tokens), below k_max={k_max}")


@dataclass(frozen=True)
class FixedK:
    """``k`` drafts for every slot and round (0: target-only decoding, no draft)."""
    k: int

    name = "fixed"

    def __post_init__(self):
        if not 0 <= self.k < MAX_BLOCK_ROWS:
            raise ValueError(f"num_speculative_tokens: {self.k} outside 0..{MAX_BLOCK_ROWS - 1}")
        object.__setattr__(self, "_plan", RoundPlan(self.k, self.k))   # every round's

    @property
    def k_max(self) -> int:
        return self.k

    def check(self, draft: Any) -> None:
        if self.k > 0:
            _check_draft(draft, self.k, "num_speculative_tokens > 0")

    def start(self, slots: int, graphs: bool) -> None:
        """A call begins (nothing to reset)."""

    def graph_plans(self) -> list:
        """Plans to record before a call's first round: none (its one plan is recorded
        there)."""
        return []

    def admit(self, slots: Sequence[int]) -> None:
        """New requests in ``slots`` (nothing to learn)."""

    def before_round(self, busy) -> RoundPlan:
        return self._plan

    def after_round(self, num_accepted, busy, seconds: Optional[float] = None,
                    gpu_seconds: Optional[float] = None) -> None:
        """Nothing to learn from ``num_accepted`` (host int32 [slots])."""


Costs = Union[None, Mapping, Callable[[int, int], float]]


class AutoK:
    """k chosen every round in 0..``k_max`` from each request's running acceptance per
    position and the cost of a round at each k (see the module docstring).

    k_max           1..15: buffers and blocks are sized for it
    costs           None (measure), ``{k: s}``, ``{(B, k): s}`` or ``(B, k) -> s``
    prior_strength  pseudo-rounds of the pooled prior in a request's estimate
    decay           per-round decay of a request's counts (1: a plain running mean)
    explore_every   rounds in a row at k = 0 before one round tries k = 1 (0: never)
    hold            rounds per k while calibrating (measured costs only)
    ragged          per-request draft counts on rounds without graphs
    drain           when no request waits (``budget``), k for the slowest request to finish
    probe_every     measured costs: rounds at one k before a neighbouring k is tried for a
                    few rounds, so every k the choice moves between is priced by decoding
                    rounds (live costs); 0: the calibrated table only
    """
    name = "auto"

    def __init__(self, k_max: int = 4, *, costs: Costs = None, prior_strength: float = 4.0,
                 decay: float = 0.9, explore_every: int = 8, hold: int = 4,
                 ragged: bool = True, drain: bool = True, probe_every: int = 24):
        if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) \
                or not 1 <= int(k_max) < MAX_BLOCK_ROWS:
            raise ValueError(f"k_max: {k_max!r} outside 1..{MAX_BLOCK_ROWS - 1} "
                             "(num_speculative_tokens='auto')")
        if not 0 < decay <= 1 or prior_strength <= 0 or hold < 2 or explore_every < 0 \
                or probe_every < 0:
            raise ValueError("AutoK: needs 0 < decay <= 1, prior_strength > 0, hold >= 2, "
                             "explore_every >= 0, probe_every >= 0")
        self.k_max = int(k_max)
        self.fixed_costs = costs
        self.prior_strength, self.decay = float(prior_strength), float(decay)
        self.explore_every, self.hold, self.ragged = int(explore_every), int(hold), bool(ragged)
        self.drain = bool(drain)
        self.probe_every = int(probe_every)
        self.measured: dict[tuple[int, int], float] = {}      # (B, k) -> seconds (fitted)
        self._samples: dict[tuple[int, int], deque] = {}      # (B, k) -> recent GPU times
        self._host: dict[int, deque] = {}                     # B -> recent host shares
        # live costs: (B, k) -> the periods of recent decoding rounds at k, every slot busy;
        # and the round count of each (B, k)'s last one (which neighbour a probe tries)
        self._live: dict[tuple[int, int], deque] = {}
        self._live_at: dict[tuple[int, int], int] = {}
        self._live_median: dict[tuple[int, int], float] = {}  # (B, k) -> _median(_live[...])
        self._tables: dict[int, list] = {}                    # B -> cost(B, k), k = 0..k_max
        self._rounds = 0
        self._interval = self.probe_every
        K = self.k_max
        # each k's other k's, nearest first (the lower one at a tie): _table's reference
        self._nearest = [sorted(range(K + 1), key=lambda kk: (abs(kk - k), kk))
                         for k in range(K + 1)]
        # pooled counts, [0] accepted and [1] tried per position (kept across calls: start()
        # moves them into the last row of the counts' array)
        self._pool = np.zeros((2, K))
        # what a round adds to a slot's counts, [q, c]: [0] accepted, [1] tried per position,
        # for q drafts verified and c = num_accepted + 1 (clipped to 0..K + 1; 0: idle): draft
        # j is accepted where j <= min(c - 1, q), tried where j <= min(c, q)
        q, c = np.arange(K + 1)[:, None], np.arange(K + 2)[None, :]
        reach = np.stack([np.clip(c - 1, 0, q), np.minimum(c, q)], axis=-1)   # [q, c, 2]
        self._steps = (np.arange(1, K + 1) <= reach[..., None]).astype(float)  # [q, c, 2, K]
        # and the decay of a slot's counts there: ``decay`` at each position tried, else 1
        # (a position not tried keeps its evidence: see the module docstring)
        self._slot_decays = np.where(self._steps[:, :, 1:2] > 0, self.decay, 1.0).repeat(2, 2)
        self._plans: dict[tuple[int, int], RoundPlan] = {}     # whole-block plans, shared
        self.choices: list[RoundPlan] = []
        self.B: Optional[int] = None            # no call yet
        self.sweep: list[int] = []              # the calibration's k's still to propose
        self.start(1, False)

    # ------------------------------------------------------------------ protocol
    @property
    def measuring(self) -> bool:
        """Whether the round of the plan just handed out is a cost sample if clean (``serve``
        times its replay on the GPU then): costs measured, and calibrating at this slot count."""
        return self._measure

    def check(self, draft: Any) -> None:
        _check_draft(draft, self.k_max, "num_speculative_tokens='auto'")

    def start(self, slots: int, graphs: bool) -> None:
        """A call over ``slots`` slots begins; every slot's drafts come from the prefill
        (``k_max`` of them)."""
        B, K = int(slots), self.k_max
        # the way back up of a sweep that the last call (same slots) left unfinished
        pending = self.sweep if self.B == B else []
        self.B, self.graphs = B, bool(graphs)
        # the counts, [b, 0] accepted and [b, 1] tried per position: rows 0..B-1 per request
        # (views: acc, tries), row B pooled (views: pool_acc, pool_tries), so that a round's
        # update is one multiply by each row's decay and one add (after_round)
        self._counts = np.zeros((B + 1, 2, K))
        self._counts[B] = self._pool
        self._pool = self._counts[B]
        self.acc, self.tries = self._counts[:B, 0], self._counts[:B, 1]
        self.pool_acc, self.pool_tries = self._pool[0], self._pool[1]
        self._decays = np.full((B + 1, 2, K), self.decay)     # (whole: broadcasting is slower)
        self._decays[B] = POOL_DECAY            # (the slots' rows set a round: after_round)
        # a round's increments (after_round): the slots' rows, the pool's their sum
        self._added = np.empty_like(self._counts)
        self._ones, self._summed = np.ones(B), self._added[B].reshape(-1)
        self._rows = self._added[:B].reshape(B, -1)
        # The choice's numbers per slot are position-major, [j, b] (a position's numbers over
        # the slots contiguous: numpy's calls are cheapest so, and they are what a round costs
        # here, tens of calls on a few dozen numbers each): every slot's a[j, i], tries +
        # prior_strength, P_i(j) (prepare: readied with the choice) and E_i(k), row 0 staying
        # 0 (_slowest_rate); buffers reused a round
        self._a, self._den, self._P = np.empty((K, B)), np.empty((K, B)), np.empty((K, B))
        self._E, self._rate = np.zeros((K + 1, B)), np.empty((K + 1, B))
        self._budget = np.empty(B)              # max(_left, 1) (_slowest_rate)
        # what _acceptance works on a position at a time: a[j], acc[:, j], den[j] (views)
        self._cols = [(self._a[j], self.acc[:, j], self._den[j]) for j in range(K)]
        # tokens each slot may still emit (``budget``; told a round late) and whether any
        # request waits for a slot (False: the call drains, see the module docstring)
        self._left = np.ones(B)
        self._draining = False
        self._costs: Optional[list] = None
        self.ready: Optional[int] = None        # drafts the last round proposed (None: prefill)
        # plans handed out whose round is not learned yet (serve learns from a round while
        # the next one runs), oldest first; and the choice prepare() readied, by busy mask
        self._inflight: deque = deque()
        self._prepared: Optional[tuple] = None
        self._rated: Optional[np.ndarray] = None    # the P whose rates _rate holds
        self._measure = False
        self.zero_run = 0
        # a probe: the k's it still proposes, and the k it left (see before_round)
        self._probe: list = []
        self._probe_from: Optional[int] = None
        self._steady = 0
        self._last_verify: Optional[int] = None
        self.refills = CALIBRATION_REFILLS
        # calibrated(B) stays true once true (costs are only ever added): asked once then
        self._done = self.calibrated(B)
        if not self._done:      # down, then back up (see the module docstring)
            down = [k for k in range(K, -1, -1) for _ in range(self.hold)]
            self.sweep = down + down[::-1]
        else:
            self.sweep = pending

    def graph_plans(self) -> list:
        """The plans a call may run once calibrated (recorded before its first round, so no
        graph is recorded inside a decoding call: s31, a capture mid-run of a B=64 batch
        took 16 ms of a 170 ms call): k moves one step a round, so every (k, k) and
        (k, k +- 1). None while calibrating (the sweep records its own)."""
        if not self.graphs or not self._done:
            return []
        K = self.k_max
        return [self._plan(v, p) for v in range(K + 1) for p in (v - 1, v, v + 1)
                if 0 <= p <= K]

    def _plan(self, verify: int, propose: int) -> RoundPlan:
        plan = self._plans.get((verify, propose))
        if plan is None:
            plan = self._plans[(verify, propose)] = RoundPlan(verify, propose)
        return plan

    def admit(self, slots: Sequence[int]) -> None:
        """New requests start from the pooled prior."""
        for b in slots:
            self.acc[b] = self.tries[b] = 0.0
        self._learned()

    def budget(self, slots: Sequence[int], max_new: Sequence[int], waiting: int) -> None:
        """The token budgets (``max_new_tokens``) of the requests just admitted to ``slots``,
        and how many requests wait for a slot after them (0: no slot will be refilled, so the
        call's time is its slowest request's; ``serve`` tells it at every admission)."""
        for b, n in zip(slots, max_new):
            self._left[b] = float(n)
        self._draining = self.drain and int(waiting) == 0
        self._learned()

    def prepare(self, busy) -> None:
        """Ready the next round's choice for these running slots (``serve`` calls it while
        the GPU runs a round, so ``before_round`` is a lookup when the slots stay the same,
        and a sum over the running slots' rows of the readied per-request table when some
        finished meanwhile); the same choice ``before_round`` would make from the same
        history."""
        busy = np.asarray(busy, bool)
        if self.sweep:
            self._prepared = None
            return
        P = self._paths(self._P)        # [slots, K]: P_i(j), every slot (valid until the
        # history changes: after_round, admit, budget and forget_acceptance drop _prepared)
        self._prepared = (busy.tobytes(), self._best(busy, P), P,
                          np.count_nonzero(busy) == busy.size)

    def before_round(self, busy) -> RoundPlan:
        busy = np.asarray(busy, bool)
        if not self.sweep and self.refills and not self._done:
            self._done = self.calibrated(self.B)
            if not self._done:
                self.refills -= 1           # a k still without a clean sample: again
                self.sweep = [k for k in range(self.k_max, -1, -1)
                              if (self.B, k) not in self.measured for _ in range(self.hold)]
        calibrating = bool(self.sweep)
        ready = self._prepared
        same = ready is not None and ready[0] == busy.tobytes()
        full = ready[3] if same else np.count_nonzero(busy) == busy.size   # every slot busy
        P = None
        if calibrating:
            propose = self.sweep.pop(0)
        else:
            if ready is None:
                P = self._paths(self._P)
                propose = self._best(busy, P)
            else:       # the acceptance is the readied one: only the running slots differ
                P = ready[2]
                propose = ready[1] if same else self._best(busy, P)
            if propose == 0 and self.explore_every and self.zero_run >= self.explore_every:
                propose = 1
            if self.ready is not None and self.graphs:      # one step a round
                propose = min(max(propose, self.ready - 1), self.ready + 1)
            propose = self._probed(propose, full)
        self.zero_run = self.zero_run + 1 if propose == 0 else 0
        verify = propose if self.ready is None else self.ready
        num_draft = None
        if self.ragged and not self.graphs and verify > 0 and not calibrating:
            num_draft = self._trim(busy, verify, P)
        if num_draft is None:           # (plans are immutable: one object per shape)
            plan = self._plan(verify, propose)
        else:
            plan = RoundPlan(verify, propose, num_draft)
        self.ready = propose
        self._rounds += 1
        self._measure = self.fixed_costs is None and (calibrating or not self._done)
        # a cost sample if clean: "cal" (calibrating: GPU time and host share) or "live"
        # (calibrated: the period of a decoding round with every slot busy, see _probed)
        # (not the first round of a new verify count: serve copies num_draft to the device in
        # it, a cost of the switch, not of the k)
        kind = "cal" if self._measure else (
            "live" if self.fixed_costs is None and self.probe_every and full
            and verify == self._last_verify else None)
        self._last_verify = verify
        self._inflight.append((plan, kind))
        self.choices.append(plan)
        if len(self.choices) > 2 * CHOICES_KEPT:        # bounded: a server runs forever
            del self.choices[:-CHOICES_KEPT]
        return plan

    def after_round(self, num_accepted, busy, seconds: Optional[float] = None,
                    gpu_seconds: Optional[float] = None) -> None:
        """Learn from the oldest round not learned yet (the one just run, or the one before it
        when ``serve`` learns while the next runs): ``num_accepted`` [slots] (host; read only
        where ``busy``) and, for a clean sample, its period ``seconds`` and (GPU backends)
        the GPU time of its replay ``gpu_seconds``."""
        if not self._inflight:
            return
        plan, kind = self._inflight.popleft()
        self._learned()
        n = np.asarray(num_accepted)
        busy = np.asarray(busy, bool)
        emitted = (n + 1) * busy                # tokens the round emitted, where running
        self._left -= emitted
        # draft j was accepted where j <= min(n, q), and tried where drafts 1..j-1 were
        # (j <= min(n + 1, q)): _steps[q, n + 1] (an idle slot's row: [q, 0], nothing)
        slots, decays = self._added[:-1], self._decays[:-1]
        if plan.num_draft is None:
            self._steps[plan.verify].take(emitted, axis=0, out=slots, mode="clip")
            self._slot_decays[plan.verify].take(emitted, axis=0, out=decays, mode="clip")
        else:
            q, c = np.asarray(plan.num_draft), np.clip(emitted, 0, self.k_max + 1)
            slots[...] = self._steps[q, c]
            decays[...] = self._slot_decays[q, c]
        # the pool adds every slot's: sums of 0 / 1, exact in any order (so a dot product)
        np.dot(self._ones, self._rows, out=self._summed)
        self._counts *= self._decays            # acc, tries (decay where tried), pool
        self._counts += self._added
        if (seconds is not None and kind
                and plan.num_draft is None and plan.verify == plan.propose):
            if kind == "cal":
                self._sample(plan.verify, seconds, gpu_seconds)
            else:
                self._live_sample(plan.verify, seconds)

    def _probed(self, propose: int, full: bool) -> int:
        """The k to propose once calibrated, live costs on: ``propose`` (the choice), or a
        probe's. After ``probe_every`` rounds at one k with every slot busy (only those
        rounds price a k: an idle slot's rows are cheaper), a probe proposes the neighbouring
        k (one step: its graph is recorded) whose live cost is oldest for ``PROBE_LEN``
        rounds: a switch round, then clean rounds whose periods price it (the module
        docstring has why: s31's calibrated table mispriced the k's). A probe after
        which the choice returns to where it was doubles the interval (up to
        ``PROBE_BACKOFF`` x); one after which it moves resets it."""
        if self.fixed_costs is not None or not self.probe_every or not self._done:
            return propose
        if self._probe:
            return self._probe.pop(0)
        if self._probe_from is not None:        # the first choice after a probe
            self._interval = (min(2 * self._interval, PROBE_BACKOFF * self.probe_every)
                              if propose == self._probe_from else self.probe_every)
            self._probe_from = None
        cur = self.ready
        if cur is None or propose != cur or not full:
            self._steady = 0
            return propose
        self._steady += 1
        if self._steady < min(self.hold, self._interval):     # (before_round's hot path)
            return propose
        B = self.B
        near = [k for k in (cur - 1, cur + 1) if 0 <= k <= self.k_max]
        k = min(near, key=lambda kk: (self._live_at.get((B, kk), -1), kk))
        # a neighbour never priced live (or the running k itself) is probed after ``hold``
        # rounds: a fixed batch keeps every slot busy only until its first request ends
        unpriced = any(len(self._live.get((B, kk), ())) < LIVE_MIN for kk in (k, cur))
        if not unpriced and self._steady < self._interval:
            return propose
        self._probe = [k] * (PROBE_LEN - 1)
        self._probe_from, self._steady = cur, 0
        return k

    def _live_sample(self, k: int, seconds: float) -> None:
        """One decoding round's period at k, every slot busy."""
        key = (self.B, k)
        live = self._live.setdefault(key, deque(maxlen=LIVE_KEPT))
        n = len(live)
        live.append(seconds)
        self._live_at[key] = self._rounds
        median = _median(live)
        if len(live) != n or median != self._live_median.get(key):
            # (the table reads a k's median and count: else it stands, as about half the
            # time once the window is full)
            self._live_median[key] = median
            self._tables.pop(self.B, None)
            self._costs = None

    def _sample(self, k: int, seconds: float, gpu_seconds: Optional[float]) -> None:
        """One clean round at k: its GPU time (else its period) joins k's window, the
        period's host share the slot count's; the table at B is fitted again."""
        B = self.B
        x = seconds
        if gpu_seconds is not None:
            x = gpu_seconds
            self._host.setdefault(B, deque(maxlen=2 * SAMPLES_KEPT)).append(
                max(seconds - gpu_seconds, 0.0))
        self._samples.setdefault((B, k), deque(maxlen=SAMPLES_KEPT)).append(x)
        ks = sorted(kk for bb, kk in self._samples if bb == B)
        host = _median(self._host[B]) if B in self._host else 0.0
        fit = _nondecreasing([_median(self._samples[(B, kk)]) for kk in ks],
                             [len(self._samples[(B, kk)]) for kk in ks])
        for kk, c in zip(ks, fit):
            self.measured[(B, kk)] = c + host
        self._tables.pop(B, None)
        self._costs = None

    def forget_acceptance(self) -> None:
        """Drop every acceptance count, pooled and per request (the cost table stays): after
        a warm-up on text that is not the requests' (``SpeculativeDecoder.calibrate``)."""
        self._counts[...] = 0.0                  # (the pool's row too)
        self._learned()

    def _learned(self) -> None:
        """The history changed (a round told, requests admitted or given budgets, counts
        forgotten): the choice prepare readied, and the rates kept for it, are stale."""
        self._prepared = self._rated = None

    # ------------------------------------------------------------------ model
    def calibrated(self, slots: int) -> bool:
        """Whether every k has a cost at ``slots`` slots (given, or measured)."""
        return self.fixed_costs is not None or all(
            (int(slots), k) in self.measured for k in range(self.k_max + 1))

    def cost(self, slots: int, k: int) -> float:
        """Seconds of a round at ``slots`` slots and k drafts."""
        c = self.fixed_costs
        if c is None:
            return self._table_at(int(slots))[int(k)]
        if callable(c):
            return float(c(int(slots), int(k)))
        return float(c[(int(slots), int(k))] if (int(slots), int(k)) in c else c[int(k)])

    def _table_at(self, B: int) -> list:
        """``_table(B)``, kept until a new sample at B drops it."""
        table = self._tables.get(B)
        if table is None:
            table = self._tables[B] = self._table(B)
        return table

    def _table(self, B: int) -> list:
        """cost(B, k), k = 0..k_max, from measurements: a k with ``LIVE_MIN`` live samples
        costs their median; any other its calibrated cost moved by the gap between live and
        calibrated cost at the nearest k that has live samples (what the calibration
        misses, a host share or the GPU's state while decoding, is partly the same at every
        k), or, where two k's have live samples and the two nearest's costs rise more between
        them than the calibration's, the nearest's live cost plus the calibration's step
        from it scaled by that ratio (the calibration underprices each draft: issue 29; a
        straight line through the two, s42's rule, missed the steps of a tensor-core GEMM's
        row groups, s47), a flat calibration the line; then fitted nondecreasing in k, a
        live cost weighted by its sample count."""
        K = self.k_max
        cal = [self.measured.get((B, k)) for k in range(K + 1)]
        cal = [self._extrapolated(B, k) if c is None else c for k, c in enumerate(cal)]
        n = [len(self._live.get((B, k), ())) for k in range(K + 1)]
        live = [self._live_median[(B, k)] if n[k] >= LIVE_MIN else None for k in range(K + 1)]
        if live.count(None) == len(live):
            return cal
        est, w = [], []
        for k in range(K + 1):
            if live[k] is not None:
                est.append(live[k])
                w.append(float(n[k]))
            else:   # the nearest k's with live samples (the lower one at a tie)
                ref, *other = [kk for kk in self._nearest[k] if live[kk] is not None][:2]
                c = cal[k] + live[ref] - cal[ref]       # the gap rule
                if other:       # the calibration's steps scaled to the live ones (see above)
                    lo, hi = sorted((ref, other[0]))
                    step, live_step = cal[hi] - cal[lo], live[hi] - live[lo]
                    if live_step > max(step, 0.0):
                        c = (live[ref] + live_step * (k - ref) / (hi - lo) if step <= 0.0
                             else live[ref] + (cal[k] - cal[ref]) * live_step / step)
                est.append(c)
                w.append(1.0)
        return _nondecreasing(est, w)

    def _extrapolated(self, B: int, k: int) -> float:
        """A k without a sample (calibration gave up: no clean round): the straight line
        through the nearest measured k's at B; a round at k + 1 costs 15% more than at k where
        only one is measured (and 1 s at k = 0 where none is: any scale)."""
        have = sorted(kk for bb, kk in self.measured if bb == B)
        if not have:
            return 1.0 + 0.15 * k
        if len(have) == 1:
            return self.measured[(B, have[0])] * (1.0 + 0.15 * (k - have[0]))
        lo, hi = sorted(have, key=lambda kk: (abs(kk - k), kk))[:2]
        clo, chi = self.measured[(B, lo)], self.measured[(B, hi)]
        return max(clo + (chi - clo) * (k - lo) / (hi - lo), 1e-9)

    def acceptance(self, slots=None) -> np.ndarray:
        """a[i, j]: P(draft j + 1 accepted | drafts before it were), [slots, k_max]."""
        a = self._acceptance().T
        return a.copy() if slots is None else a[slots]

    def _acceptance(self) -> np.ndarray:
        """``acceptance()`` of every slot, position-major [k_max, B], in a buffer reused a
        round: a position at a time over the slots, each element rounded as the formula
        reads (so a choice is the same whichever slots it was computed with)."""
        prior, prev = [], 0.5
        for pa, pt in zip(*self._pool.tolist()):
            prev = (pa + CHAIN * prev) / (pt + CHAIN)   # shrunk toward the position before
            prior.append(prev)
        s = self.prior_strength
        np.add(self.tries, s, out=self._den.T)
        (a, acc, den), *later = self._cols
        np.add(acc, s * prior[0], out=a)
        np.divide(a, den, out=a)
        for j, (pj, acc, den) in enumerate(later, 1):
            # the request's prior at j: the pool's, scaled as the request's own estimate at
            # j - 1 stands to the pool's there (a request whose early drafts land less than
            # most lands less later too; its late positions are tried least)
            r = prior[j] / prior[j - 1]
            np.multiply(a, r, out=pj)
            if not 0.0 <= r <= 1.0:     # (else a * r <= 1 already: a <= 1, as acc <= tries)
                np.minimum(pj, 1.0, out=pj)
            np.multiply(pj, s, out=pj)          # a = (acc + s * pj) / (tries + s)
            np.add(pj, acc, out=pj)
            a = np.divide(pj, den, out=pj)
        return self._a

    def _paths(self, out: Optional[np.ndarray] = None) -> np.ndarray:
        """P_i(j) = prod_{m<=j} a[i, m], every slot [B, k_max] (a view of the position-major
        product, into ``out`` [k_max, B] where given)."""
        return np.multiply.accumulate(self._acceptance(), axis=0, out=out).T

    def expected_tokens(self, busy, P_all: Optional[np.ndarray] = None) -> list:
        """sum over the running requests of E_i(k), k = 0..k_max (``P_all``: ``_paths()``,
        when already made)."""
        busy = np.asarray(busy, bool)
        P = self._paths() if P_all is None else P_all
        # summed over the running slots' rows [slots, K] (a C-ordered copy: numpy sums them
        # in slot order, or pairwise where K = 1, as it did the rows it was always given)
        P = np.add.reduce(P[busy], axis=0).tolist()     # [K]
        E = [float(np.count_nonzero(busy))]
        for x in P:
            E.append(E[-1] + x)
        return E

    def costs(self) -> list:
        """cost(B, k) for k = 0..k_max at this call's B (cached until a new sample)."""
        if self._costs is None:
            B = self.B
            if self.fixed_costs is None:        # (cost(B, k) for each k: the table's)
                self._costs = list(self._table_at(B))
            else:
                self._costs = [self.cost(B, k) for k in range(self.k_max + 1)]
        return self._costs

    def _best(self, busy, P_all: Optional[np.ndarray] = None) -> int:
        busy = np.asarray(busy, bool)
        c = self.costs()
        if self._draining and np.count_nonzero(busy) > 1:
            score = [r / ck for r, ck in zip(self._slowest_rate(busy, P_all), c)]
        else:
            score = [e / ck for e, ck in zip(self.expected_tokens(busy, P_all), c)]
        return score.index(max(score))          # first maximum: ties to the smaller k

    def _slowest_rate(self, busy, P_all: Optional[np.ndarray] = None) -> list:
        """min over the running requests of E_i(k) / R_i, k = 0..k_max: the rounds the
        slowest of them needs to spend its budget left R_i (at least a token) are
        1 / this (``P_all`` as in ``expected_tokens``)."""
        P = self._paths() if P_all is None else P_all
        # every slot's E_i(k) / R_i, [k, b], kept until the history changes (when slots
        # finish after prepare, before_round takes the min over fewer of the same rows)
        rate = self._rate
        if self._rated is not P:
            E = self._E                         # E[0] stays 0
            np.add.accumulate(P.T, axis=0, out=E[1:])
            np.add(E, 1.0, out=rate)
            np.divide(rate, np.maximum(self._left, 1.0, out=self._budget), out=rate)
            self._rated = P
        return np.minimum.reduce(rate, axis=1, where=np.asarray(busy, bool),
                                 initial=np.inf).tolist()

    def _trim(self, busy, k: int, P_all: Optional[np.ndarray] = None) -> tuple:
        """Per-slot drafts <= k where a draft's expected tokens pay its row (no graphs)."""
        c, c0 = self.costs()[k], self.costs()[0]
        row = max(c - c0, 0.0) / (self.B * k)
        P = self._paths() if P_all is None else P_all
        E = self.expected_tokens(busy, P)[k]
        keep = (P[:, :k] * c >= row * E).sum(axis=1) * np.asarray(busy, bool)
        q = tuple(keep.tolist())
        return None if q == (k,) * self.B else q


def _median(xs) -> float:
    """The median (the mean of the middle two of an even count: a linear drift over a sweep
    down and back up gives every k the same)."""
    v = sorted(xs)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def _nondecreasing(ys: Sequence[float], ws: Sequence[float]) -> list:
    """The weighted least-squares nondecreasing fit of ``ys`` (pool adjacent violators)."""
    if all(a <= b for a, b in zip(ys, ys[1:])):        # (no violator: ys itself)
        return [float(y) for y in ys]
    blocks: list = []               # [mean, weight, count]
    for y, w in zip(ys, ws):
        blocks.append([float(y), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            y2, w2, n2 = blocks.pop()
            y1, w1, n1 = blocks[-1]
            blocks[-1] = [(y1 * w1 + y2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [y for y, _, n in blocks for _ in range(n)]


def make_policy(num_speculative_tokens: Any):
    """The policy ``num_speculative_tokens`` names: an int (``FixedK``), ``"auto"``
    (``AutoK()``, k_max 4) or a policy object (kept)."""
    v = num_speculative_tokens
    if isinstance(v, str):
        if v != "auto":
            raise ValueError(f"num_speculative_tokens: expected an int 0..15, 'auto' or a "
                             f"policy, got {v!r}")
        return AutoK()
    if hasattr(v, "before_round") and hasattr(v, "k_max"):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"num_speculative_tokens: expected an int 0..15, 'auto' or a "
                         f"policy, got {v!r}")
    return FixedK(int(v))
