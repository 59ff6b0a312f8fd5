"""AutoK against every fixed k on a simulated batch, on the CPU: which k-policy finishes first.

Each request draws a per-draft acceptance p_i ~ Beta(a, b) (a draft lands with p_i given the
ones before it did) and a token budget; a round at (verify v, propose p) costs
(cost[v] + cost[p]) / 2 of the given table (one graph per pair; the verify half and the
draft half). A fixed batch runs until its slowest request ends; ``--stream N`` refills freed
slots from N requests. Prints each policy's time over target-only's (speed-up) per trial set.

  python tools/perf/autok_sim.py --costs 1230,1343,1424,1424,1460 --slots 32 --trials 40
"""
import argparse

import numpy as np

from specdec_lib.orchestrator import AutoK, FixedK


def run(policy, ps, budgets, slots, costs, rng) -> float:
    """Simulated time (cost units) for ``policy`` to emit every request's budget."""
    n_req = len(ps)
    policy.start(slots, graphs=True)
    owner = [-1] * slots
    left = np.zeros(slots)
    nxt, total = 0, 0.0

    def admit():
        nonlocal nxt
        new = []
        for b in range(slots):
            if owner[b] < 0 and nxt < n_req:
                owner[b], left[b] = nxt, budgets[nxt]
                new.append(b)
                nxt += 1
        if new:
            policy.admit(new)
            if hasattr(policy, "budget"):
                policy.budget(new, [int(left[b]) for b in new], n_req - nxt)

    admit()
    while any(o >= 0 for o in owner):
        busy = np.asarray([o >= 0 for o in owner])
        plan = policy.before_round(busy)
        v = plan.verify
        total += 0.5 * (costs[v] + costs[plan.propose])
        acc = np.zeros(slots, np.int32)
        for b in np.flatnonzero(busy):
            p = ps[owner[b]]
            n = 0
            while n < v and rng.random() < p:
                n += 1
            acc[b] = n
        policy.after_round(acc, busy)
        left -= (acc + 1) * busy
        for b in np.flatnonzero(busy & (left <= 0)):
            owner[b] = -1
        admit()
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--costs", default="1230,1343,1424,1424,1460",
                    help="a round's cost at k = 0, 1, ... (any unit; k_max = count - 1)")
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--stream", type=int, default=0, help="requests through the slots (0: one batch)")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--beta", default="2.5,1.5", help="Beta(a, b) of a request's acceptance")
    ap.add_argument("--budget", default="20,128", help="token budgets uniform in lo..hi; "
                    "half the requests take hi (the long answers)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    costs = [float(c) for c in args.costs.split(",")]
    K = len(costs) - 1
    a, b = (float(x) for x in args.beta.split(","))
    lo, hi = (int(x) for x in args.budget.split(","))
    n_req = args.stream or args.slots
    policies = {f"k{k}": (lambda k=k: FixedK(k)) for k in range(K + 1)}
    policies["auto"] = lambda: AutoK(K, costs=dict(enumerate(costs)), drain=False)
    policies["auto-drain"] = lambda: AutoK(K, costs=dict(enumerate(costs)))
    times = {name: [] for name in policies}
    for t in range(args.trials):
        rng = np.random.default_rng([args.seed, t])
        ps = rng.beta(a, b, n_req)
        budgets = np.where(rng.random(n_req) < 0.5, hi, rng.integers(lo, hi + 1, n_req))
        for name, make in policies.items():
            times[name].append(run(make(), ps, budgets, args.slots, costs,
                                   np.random.default_rng([args.seed, t, 1])))
    base = np.sum(times["k0"])
    for name, ts in times.items():
        print(f"{name:>10}  speed-up {base / np.sum(ts):.3f}")


if __name__ == "__main__":
    main()
