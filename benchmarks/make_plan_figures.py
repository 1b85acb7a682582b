"""The two plan figures of the README: a rotor plan and a pofo plan.

* ``docs/plan_rotor_resnet50.png``: rotor on the bundled ``resnet50`` at 1 GB (recomputation only,
  one compute strip);
* ``docs/plan_pofo_resnet50.png``: pofo on ``resnet50@a100`` at 12 GB/s, at the budget given
  (default 2.1 GB, SGD static memory included, pofo's default 50 slots), where its plan both
  recomputes and offloads. If the plan at that budget does not do both (the pofo DP may change), the script scans
  budgets from rotor's least memory to the store-all need and draws the first that does, and
  says which.

Both are replayed by the simulator of their family (``memplan.solve``) and drawn by
``memplan.views.plot.plot_schedule``, as ``memplan plot`` does.

Usage: ``python benchmarks/make_plan_figures.py [--pofo-mem 2.1GB] [--out docs]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import memplan
from memplan.api import describe
from memplan.units import format_size, parse_size
from memplan.views.plot import plot_schedule

BANDWIDTH = 12e9
SLOTS = None
"""pofo's default (50 slots, as in Efficient Combination of Rematerialization and Offloading (NeurIPS 2021))."""


def _mixes(sched: memplan.Schedule) -> bool:
    return sched.feasible and sched.count("offload") > 0 and sched.count("F_ck") > 0


def pofo_plan(memory: int) -> memplan.Schedule:
    """pofo on resnet50@a100 at ``memory``, or the first scanned budget where it mixes."""
    prof = memplan.load_profile("resnet50@a100")
    sched = memplan.solve(prof, "pofo", memory, bandwidth=BANDWIDTH, slots=SLOTS)
    if _mixes(sched):
        return sched
    desc = describe(prof)
    lo, hi = desc["min_memory"]["chain"], desc["store_all_memory"]
    for i in range(20):
        budget = lo + (hi - lo) * i // 20
        sched = memplan.solve(prof, "pofo", budget, bandwidth=BANDWIDTH, slots=SLOTS)
        if _mixes(sched):
            print(f"pofo at {format_size(memory)} does not mix; drawing {sched.budget.memory} B")
            return sched
    raise SystemExit("no budget where pofo both recomputes and offloads on resnet50@a100")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pofo-mem", default="2.1GB")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    for name, profile, sched in (
        ("plan_rotor_resnet50.png", "resnet50", memplan.solve("resnet50", "rotor", "1GB")),
        ("plan_pofo_resnet50.png", "resnet50@a100", pofo_plan(parse_size(args.pofo_mem))),
    ):
        prof = memplan.load_profile(profile)
        curve = memplan.simulate(prof, sched).memory_curve
        plot_schedule(args.out / name, sched, prof, curve)
        print(
            f"{args.out / name}: {sched.algorithm} {profile} at {format_size(sched.budget.memory)}: "
            f"makespan {sched.makespan:.2f} ms, peak {format_size(sched.peak_memory)}, "
            f"{sched.count('F_ck') + sched.count('F_n')} recomputing forwards, "
            f"{sched.count('offload')} offloads ({(sched.solver.message or '').strip()})"
        )


if __name__ == "__main__":
    main()
