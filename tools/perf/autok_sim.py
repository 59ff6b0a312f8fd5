"""AutoK against every fixed k on a simulated batch, on the CPU: which k-policy finishes first.

Each request draws a per-draft acceptance p_i ~ Beta(a, b) (a draft lands with p_i given the
ones before it did) and a token budget; a round at (verify v, propose p) costs
(cost[v] + cost[p]) / 2 of the given table (one graph per pair; the verify half and the
draft half). A fixed batch runs until its slowest request ends; ``--stream N`` refills freed
slots from N requests. Prints each policy's time over target-only's (speed-up) per trial set.
``--table`` gives the auto policies a calibrated table that is not the true cost (as the
warm-up's replays priced the decoding rounds, s30): the "live" ones then learn the true
costs from the periods of the rounds they run (``probe_every``), the others keep the table.

  python tools/perf/autok_sim.py --costs 1230,1343,1424,1424,1460 --slots 32 --trials 40
  python tools/perf/autok_sim.py --costs 1083,1232,1350,1462,1560 --table 1203,1317,1399,1399,1433
  python tools/perf/autok_sim.py --suite          # AutoK against the best fixed k, per scenario

``--suite`` runs ``AutoK()`` (drain and live costs on, as ``"auto"``) and every fixed k through
three scenarios, each under a few (true costs, calibrated table, acceptance) cases, with
``serve``'s timing: a round is learned one round late (while the next runs), a round that
admitted or opened a call is no cost sample, and the policy object (its cost table) is kept
from call to call as a decoder keeps it: ``batch`` (B=32, calls of 32 requests with budgets
20..128: the drain objective, every slot busy only until the first request ends; the ratios
after 1, 3 and 10 calls), ``b1`` (B=1, calls of one request) and ``stream`` (128 requests
through 32 slots, 3 calls). Prints auto's speed-up over target-only and its ratio to the best
fixed k's.
"""
import argparse

import numpy as np

from specdec_lib.orchestrator import AutoK, FixedK


def _fill(owner, left, budgets, nxt):
    """Free slots take the next requests: (the slots filled, the next request's index)."""
    new = []
    for b in range(len(owner)):
        if owner[b] < 0 and nxt < len(budgets):
            owner[b], left[b] = nxt, budgets[nxt]
            new.append(b)
            nxt += 1
    return new, nxt


def _accepted(ps, owner, busy, v, rng, slots):
    """Drafts accepted per slot: each of the v lands with its request's p while the ones
    before it did."""
    acc = np.zeros(slots, np.int32)
    for b in np.flatnonzero(busy):
        n = 0
        while n < v and rng.random() < ps[owner[b]]:
            n += 1
        acc[b] = n
    return acc


def run(policy, ps, budgets, slots, costs, rng, noise=0.03, stall=(0.0, 0.0)) -> float:
    """Simulated time (cost units) for ``policy`` to emit every request's budget (a round's
    period, told to the policy, is its cost times 1 + ``noise`` x a standard normal, plus,
    with probability ``stall[0]``, ``stall[1]`` of its cost: a host stall)."""
    n_req = len(ps)
    policy.start(slots, graphs=True)
    owner = [-1] * slots
    left = np.zeros(slots)
    nxt, total = 0, 0.0

    def admit():
        nonlocal nxt
        new, nxt = _fill(owner, left, budgets, nxt)
        if new:
            policy.admit(new)
            if hasattr(policy, "budget"):
                policy.budget(new, [int(left[b]) for b in new], n_req - nxt)

    admit()
    while any(o >= 0 for o in owner):
        busy = np.asarray([o >= 0 for o in owner])
        plan = policy.before_round(busy)
        v = plan.verify
        cost = 0.5 * (costs[v] + costs[plan.propose])
        total += cost
        acc = _accepted(ps, owner, busy, v, rng, slots)
        jitter = noise * rng.standard_normal() + (stall[1] if rng.random() < stall[0] else 0.0)
        policy.after_round(acc, busy, cost * (1.0 + jitter))
        left -= (acc + 1) * busy
        for b in np.flatnonzero(busy & (left <= 0)):
            owner[b] = -1
        admit()
    return total


def serve_like(policy, ps, budgets, slots, costs, rng, noise=0.03, told=None) -> float:
    """Like ``run``, with ``serve``'s timing: a round is told to the policy just after the
    next one is chosen (then ``prepare``), before an admission at once; a round that admitted
    requests, and a call's first round, give no period (not clean). ``told``: the budgets the
    policy is given where they are not the lengths (a request that stops at EOS before its
    max_new_tokens: the policy knows only the latter)."""
    n_req = len(ps)
    policy.start(slots, graphs=True)
    owner = [-1] * slots
    left = np.zeros(slots)
    nxt, total, learn, first = 0, 0.0, None, True
    prepare = getattr(policy, "prepare", None)

    def admit():
        nonlocal nxt
        new, nxt = _fill(owner, left, budgets, nxt)
        return new

    new = admit()
    while any(o >= 0 for o in owner):
        if new:
            if learn is not None:
                policy.after_round(*learn)
                learn = None
            policy.admit(new)
            if hasattr(policy, "budget"):
                policy.budget(new, [int(left[b] if told is None else told[owner[b]])
                                    for b in new], n_req - nxt)
        busy = np.asarray([o >= 0 for o in owner])
        plan = policy.before_round(busy)
        v = plan.verify
        cost = 0.5 * (costs[v] + costs[plan.propose])
        total += cost
        if learn is not None:
            policy.after_round(*learn)
            learn = None
            if prepare is not None:
                prepare(busy)
        acc = _accepted(ps, owner, busy, v, rng, slots)
        seconds = None if (new or first) else cost * (1.0 + noise * rng.standard_normal())
        first = False
        learn = (acc, busy, seconds)
        left -= (acc + 1) * busy
        for b in np.flatnonzero(busy & (left <= 0)):
            owner[b] = -1
        new = admit()
    if learn is not None:
        policy.after_round(*learn)
    return total


# (name, true costs, calibrated table): per slot count (B=32: the H100 SmolLM2 wall per round
# of issue 29 and its calibration; the s30 H200 case; a calibration that overprices k; an
# exact one. B=1: a round nearly flat in k, and one whose calibration underprices k. B=4: the
# H100 SmolLM2 GPU time per round of s47, tensor-core GEMMs by row groups of 8, and its table)
SUITE_COSTS = {
    32: [("h100-i29", [1030, 1130, 1232, 1317], [1155.8, 1253.9, 1296.2, 1359.6]),
         ("steep", [1.0, 1.15, 1.35, 1.55], [1.0, 1.03, 1.06, 1.10]),
         ("h200-s30", [1083, 1232, 1350, 1462, 1560], [1203, 1317, 1399, 1399, 1433]),
         ("over", [1.0, 1.03, 1.06, 1.10], [1.0, 1.15, 1.35, 1.55]),
         ("exact", [1230, 1343, 1424, 1424, 1460], [1230, 1343, 1424, 1424, 1460])],
    1: [("flat", [850, 880, 905, 934, 975], [850, 880, 905, 934, 975]),
        ("flat-under", [850, 900, 950, 1000, 1050], [850, 860, 870, 880, 890]),
        ("flat-over", [850, 860, 870, 880, 890], [850, 900, 950, 1000, 1050])],
    4: [("h100-s47", [554, 637, 773, 822, 941], [571, 644, 776, 839, 951])],
}
SUITE_BETA = [("p.25", (1.0, 3.0)), ("p.62", (2.5, 1.5))]


def suite(seed: int, noise: float, trials: int) -> None:
    """Every scenario x cost case x acceptance: auto's speed-up over k = 0 and its ratio to
    the best fixed k (the mean over ``trials`` seeds of the summed times)."""
    scen = [("batch", 32, 32, 10), ("b1", 1, 1, 32), ("b4", 4, 16, 3), ("stream", 32, 128, 3)]
    print(f"{'scenario':<8} {'costs':<10} {'acc':<5} {'best':>9} {'auto/k0':>8} "
          f"{'auto/best':>9}  (batch: after 1 / 3 / 10 calls)")
    for sname, B, n_req, calls in scen:
        for cname, costs, table in SUITE_COSTS[B]:
            K = len(costs) - 1
            for bname, (a, b) in SUITE_BETA:
                times = {}              # name -> [call] summed over trials
                for t in range(trials):
                    pols = {f"k{k}": FixedK(k) for k in range(K + 1)}
                    auto = AutoK(K)
                    auto.measured.update({(B, k): c for k, c in enumerate(table)})
                    pols["auto"] = auto
                    for c in range(calls):
                        rng = np.random.default_rng([seed, t, c])
                        ps = rng.beta(a, b, n_req)
                        budgets = np.where(rng.random(n_req) < 0.5, 128,
                                           rng.integers(20, 129, n_req))
                        for name, pol in pols.items():
                            ts = times.setdefault(name, np.zeros(calls))
                            ts[c] += serve_like(pol, ps, budgets, B, costs,
                                                np.random.default_rng([seed, t, c, 1]), noise)
                marks = [1, 3, 10] if sname == "batch" else [calls]
                cells_k0, cells_best, best = [], [], None
                for m in marks:
                    tot = {name: ts[:m].sum() for name, ts in times.items()}
                    fixed = {n: v for n, v in tot.items() if n != "auto"}
                    best = min(fixed, key=fixed.get)
                    cells_k0.append(f"{tot['k0'] / tot['auto']:.3f}")
                    cells_best.append(f"{fixed[best] / tot['auto']:.3f}")
                print(f"{sname:<8} {cname:<10} {bname:<5} {best:>4} "
                      f"{tot['k0'] / fixed[best]:.3f}  {'/'.join(cells_k0):>8}  "
                      f"{'/'.join(cells_best):>9}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="store_true", help="every scenario (see above)")
    ap.add_argument("--costs", default="1230,1343,1424,1424,1460",
                    help="a round's cost at k = 0, 1, ... (any unit; k_max = count - 1)")
    ap.add_argument("--table", default=None, help="the auto policies' calibrated costs "
                    "(default: the true ones)")
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--noise", type=float, default=0.03, help="a period's relative jitter")
    ap.add_argument("--stall", default="0,0", help="P,F: a period is F longer with "
                    "probability P (host stalls)")
    ap.add_argument("--stream", type=int, default=0, help="requests through the slots (0: one batch)")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--beta", default="2.5,1.5", help="Beta(a, b) of a request's acceptance")
    ap.add_argument("--budget", default="20,128", help="token budgets uniform in lo..hi; "
                    "half the requests take hi (the long answers)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.suite:
        suite(args.seed, args.noise, min(args.trials, 4))
        return
    costs = [float(c) for c in args.costs.split(",")]
    K = len(costs) - 1
    a, b = (float(x) for x in args.beta.split(","))
    lo, hi = (int(x) for x in args.budget.split(","))
    n_req = args.stream or args.slots
    policies = {f"k{k}": (lambda k=k: FixedK(k)) for k in range(K + 1)}
    table = [float(c) for c in args.table.split(",")] if args.table else costs

    def calibrated(**kw):
        """An AutoK whose calibration measured ``table`` at this slot count."""
        pol = AutoK(K, **kw)
        pol.measured.update({(args.slots, k): c for k, c in enumerate(table)})
        return pol
    for drain in (False, True):
        name = "auto" + ("-drain" if drain else "")
        policies[name] = lambda d=drain: calibrated(drain=d, probe_every=0)
        policies[name + "-live"] = lambda d=drain: calibrated(drain=d)
    times = {name: [] for name in policies}
    # one policy object per name for every trial, as a server keeps its decoder's: what it
    # learns of the costs carries from one batch to the next (acceptance is reset per request)
    policies = {name: (lambda p=make(): p) for name, make in policies.items()}
    for t in range(args.trials):
        rng = np.random.default_rng([args.seed, t])
        ps = rng.beta(a, b, n_req)
        budgets = np.where(rng.random(n_req) < 0.5, hi, rng.integers(lo, hi + 1, n_req))
        for name, make in policies.items():
            times[name].append(run(make(), ps, budgets, args.slots, costs,
                                   np.random.default_rng([args.seed, t, 1]), args.noise,
                                   tuple(float(x) for x in args.stall.split(","))))
    base = np.sum(times["k0"])
    for name, ts in times.items():
        print(f"{name:>10}  speed-up {base / np.sum(ts):.3f}")


if __name__ == "__main__":
    main()
