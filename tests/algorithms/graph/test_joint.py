"""OLLA's joint ILP (eq. 9: order and addresses together) against an exhaustive search."""

from __future__ import annotations

import random

import pytest

import memplan
from memplan.algorithms.graph.joint import solve_joint
from memplan.algorithms.graph.problem import GraphProblem
from tests.oracles.graph import best_arena, best_order, graph_profile, overlaps

BIG = 10**12


def tiny_dag(seed: int, n: int = 5):
    """``n`` nodes, one tensor each (sizes 1-9, some read by nobody), one weight."""
    rng = random.Random(seed)
    nodes = [("w", "weight")] + [(f"v{k}", "forward") for k in range(n)]
    tensors = [("W", rng.randint(1, 5), "w", [f"v{rng.randrange(n)}"])]
    for k in range(n):
        later = list(range(k + 1, n))
        count = min(len(later), rng.choice((0, 1, 1, 2)))
        readers = [f"v{r}" for r in sorted(rng.sample(later, count))] if count else []
        tensors.append((f"t{k}", rng.randint(1, 9), f"v{k}", readers))
    return graph_profile(nodes, tensors, model=f"tiny{seed}")


@pytest.mark.parametrize("seed", range(10))
def test_joint_model_equals_exhaustive_search(seed):
    prof = tiny_dag(seed)
    problem = GraphProblem.from_profile(prof)
    result = solve_joint(problem, time_limit=20)
    assert result is not None and result.status == "optimal"
    assert result.arena == best_arena(prof)
    order = [problem.names[v] for v in result.order]
    addresses = {
        problem.tensor_names[i]: int(result.offsets[i])
        for i in range(len(problem.sizes))
        if problem.sizes[i] > 0
    }
    assert overlaps(prof, order, addresses) == []
    assert problem.is_topological(result.order)


@pytest.mark.parametrize("seed", range(10))
def test_olla_on_small_graphs_is_optimal(seed):
    prof = tiny_dag(100 + seed)
    sched = memplan.solve(prof, "olla", BIG, time_limit=20)
    assert sched.arena == best_arena(prof)
    assert sched.peak_resident >= best_order(prof)[0]
    assert memplan.simulate(prof, sched).valid


def test_olla_falls_back_on_the_joint_model(monkeypatch):
    """When the split (order, then placement) is not proven optimal, ``olla`` runs eq. 9."""
    from memplan.algorithms.graph import placement, solvers

    prof = graph_profile(
        [("n0", "forward"), ("n1", "forward"), ("n2", "forward"), ("n3", "backward")],
        [
            ("A", 1024, "n0", ["n1"]),
            ("B", 1024, "n0", ["n3"]),
            ("ctl", 0, "n1", ["n2"]),
            ("C", 2048, "n2", ["n3"]),
        ],
    )

    def first_fit_only(sizes, start, end, persistent, lower_bound, **_):
        offsets = placement.first_fit(sizes, start, end)
        arena = placement.arena_of(sizes, offsets)
        return placement.PlacementResult(offsets, arena, lower_bound, "feasible", 0.0, "stub")

    monkeypatch.setattr(solvers, "solve_placement", first_fit_only)
    sched = memplan.solve(prof, "olla", BIG, time_limit=10)
    assert "joint model" in sched.solver.message
    assert sched.arena == best_arena(prof) == 3072 and sched.solver.status == "optimal"
    assert memplan.simulate(prof, sched).valid
