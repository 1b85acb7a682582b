"""Time the rotor DP on long synthetic chains (the figures of docs/benchmarks.md).

Usage: ``python benchmarks/bench_rotor.py [--slots 500] [--repeats 3] [--lengths 50,100,200]``

Each chain is ``random_chain(L, seed=L, max_size=1000)``; the budget is one third of the way from
the least memory to the store-all peak (a budget that forces a lot of recomputation). The time is
the whole :func:`memplan.solve` call, simulator replay included, median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import machine

import memplan
from memplan.algorithms.chain import Chain, chain_min_memory
from memplan.profile import bundled_profiles
from memplan.profile.synthetic import random_chain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lengths", default="50,100,200")
    parser.add_argument("--algos", default="rotor")
    parser.add_argument(
        "--bundled", action="store_true", help="time the bundled profiles instead of random chains"
    )
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(
        f"{'algo':>9} {'chain':>11} {'stages':>6} {'slots':>5} {'median s':>9} {'min s':>7} "
        f"{'overhead':>8}"
    )
    if args.bundled:
        cases = [(name, memplan.load_profile(name)) for name in bundled_profiles()]
    else:
        cases = [
            (str(n), random_chain(n, seed=n, max_size=1000))
            for n in (int(v) for v in args.lengths.split(","))
        ]
    for algo in args.algos.split(","):
        for label, prof in cases:
            chain = Chain.from_profile(prof)
            low, high = chain_min_memory(chain), chain.store_all_peak()
            budget = low + (high - low) // 3
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                sched = memplan.solve(prof, algo, budget, slots=args.slots, optimizer="none")
                times.append(time.perf_counter() - start)
            assert sched.feasible
            print(
                f"{algo:>9} {label:>11} {prof.length:>6} {args.slots:>5} "
                f"{statistics.median(times):>9.3f} "
                f"{min(times):>7.3f} {sched.overhead:>8.3f}"
            )


if __name__ == "__main__":
    main()
