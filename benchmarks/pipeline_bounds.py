"""Where can pipeline-ilp find plans PipeDream has none? Per-GPU memory bounds (Pipelined Model Parallelism, Euro-Par 2021; §6.2).

For the bundled ResNet A100 profiles on 4 and 8 GPUs (SGD, 100 GB/s links), prints:

* ``single``: the heaviest stage alone (3 weight copies + its stash + its larger overhead): no
  allocation needs less on the GPU holding it;
* ``packed``: the least, over *any* allocation, of the largest per-GPU sum of ``3 W_k + stash_k``
  (exact by CP-SAT): every pattern holds one mini-batch's stashes of a GPU at once, at the start
  of that GPU's last backward, so no plan needs less (``contiguous``: the same over contiguous
  allocations, for comparison);
* the lower bound ``max(single, packed)``, PipeDream's least simulated peak (every candidate,
  with no memory cap and with caps on a grid: the capped partitions differ), and
  the least simulated peak of the feasibility-first plans (NOTE [ pipeline feasibility first ]).

Only where the bound is below PipeDream's least can any plan fit where PipeDream has none.
Usage: ``python benchmarks/pipeline_bounds.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memplan  # noqa: E402
from benchmarks._common import machine  # noqa: E402
from memplan.algorithms.pipeline.feasible import least_memory_plan  # noqa: E402
from memplan.algorithms.pipeline.model import PipelineInstance, static_factor  # noqa: E402
from memplan.algorithms.pipeline.pipedream import candidates  # noqa: E402
from memplan.units import parse_rate  # noqa: E402


def packed(items: list[int], parts: int) -> int:
    """Least largest bin over any split of ``items`` into ``parts`` bins (CP-SAT, proven)."""
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    x = [[m.new_bool_var("") for _ in range(parts)] for _ in items]
    for row in x:
        m.add_exactly_one(row)
    top = m.new_int_var(0, sum(items), "top")
    for g in range(parts):
        m.add(sum(items[k] * x[k][g] for k in range(len(items))) <= top)
    m.minimize(top)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 30
    solver.solve(m)
    return int(solver.best_objective_bound)


def contiguous(items: list[int], parts: int) -> int:
    """Least largest group over contiguous splits into at most ``parts`` groups (DP)."""
    c = np.concatenate([[0], np.cumsum(items)])
    n = len(items)
    best = [[float("inf")] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for s in range(1, parts + 1):
        for j in range(1, n + 1):
            best[s][j] = min(max(best[s - 1][i], c[j] - c[i]) for i in range(j))
    return int(min(best[s][n] for s in range(1, parts + 1)))


def pipedream_least(prof, inst: PipelineInstance, bound: int) -> int:
    """PipeDream's least simulated peak: its candidates with no cap and with caps (the
    memory-capped partitions differ) on a grid from ``bound`` up."""
    least = min(r.peak_memory for _, r in candidates(prof, inst, None, "sgd") if r.valid)
    for cap in np.linspace(bound, least, 25):
        for _, r in candidates(prof, inst, int(cap), "sgd"):
            if r.valid:
                least = min(least, r.peak_memory)
    return int(least)


def main() -> None:
    print(machine())
    rate = parse_rate("100GB/s")
    print(
        "| profile | GPUs | single stage (GB) | packed, any allocation (GB) | packed, contiguous (GB) "
        "| lower bound (GB) | pipedream least (GB) | feasibility-first least (GB) | gap? |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("resnet18@a100", "resnet34@a100", "resnet50@a100"):
        prof = memplan.load_profile(name)
        for gpus in (4, 8):
            inst = PipelineInstance.from_profile(prof, gpus, rate, "sgd")
            per = static_factor("sgd", 2)
            over = np.maximum(inst.f_overhead, inst.b_overhead)
            single = int((per * inst.weights + inst.stash + over).max())
            items = [int(v) for v in per * inst.weights + inst.stash]
            pack = packed(items, min(gpus, inst.length))
            cont = contiguous(items, min(gpus, inst.length))
            bound = max(single, pack)
            pd = pipedream_least(prof, inst, bound)
            _, _, first = least_memory_plan(prof, inst, None)
            gap = "yes" if first is not None and first < pd else "no"
            print(
                f"| {name} | {gpus} | {single / 1e9:.3f} | {pack / 1e9:.3f} | {cont / 1e9:.3f} | "
                f"{bound / 1e9:.3f} | {pd / 1e9:.3f} | {first / 1e9:.3f} | {gap} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
