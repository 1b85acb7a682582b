"""How well the CP-SAT algorithms keep to ``--time-limit`` (docs/benchmarks.md).

Usage: ``python benchmarks/bench_time_limits.py [--limits 2,10]``

For each instance and limit, times ``memplan.solve(...)`` (everything but reading the profile and
importing OR-Tools, which imports pandas: about 1 s, 3 s on a loaded machine, done once before:
warm starts, model building, CP-SAT, the replay) and prints the wall time and the overrun past
the limit. Run it with another checkout's interpreter (``cd ../main && .venv/bin/python
../i17-hostile/benchmarks/bench_time_limits.py``) to compare.
"""

from __future__ import annotations

import argparse
import time

from _common import machine

import memplan

INSTANCES = [
    ("resnet50", "pipeline-ilp", "2GB", {"gpus": 4}),
    ("resnet152@a100", "pipeline-ilp", "8GB", {"gpus": 8}),
    ("resnet152@a100", "pipeline-ilp", "3GB", {"gpus": 8}),  # below PipeDream: feasibility first
    ("gpt-small-graph-b32", "olla", "100GB", {}),
    ("gpt-small-graph-b32", "olla-order", "100GB", {}),
    ("mobilenet_v2-graph-b32", "olla-address", "100GB", {}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="2,10")
    args = parser.parse_args()
    from ortools.sat.python import cp_model  # noqa: F401 - the import is start-up, not solving

    print(f"machine: {machine()}")
    print("| profile | algorithm | budget | limit s | wall s | overrun s | status |")
    print("|---|---|---|---:|---:|---:|---|")
    for name, algo, memory, options in INSTANCES:
        prof = memplan.load_profile(name)
        for limit in (float(x) for x in args.limits.split(",")):
            started = time.perf_counter()
            sched = memplan.solve(prof, algo, memory, time_limit=limit, **options)
            wall = time.perf_counter() - started
            status = sched.solver.status if sched.feasible else "infeasible"
            print(
                f"| {name} | {algo}{' ' + str(options['gpus']) + ' GPUs' if options else ''} | "
                f"{memory} | {limit:g} | {wall:.2f} | {max(0.0, wall - limit):.2f} | {status} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
