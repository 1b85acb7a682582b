"""The five graph-family algorithms as schedules: ``olla``, ``olla-order``, ``olla-address``,
``framework`` and ``greedy-by-size`` (papers/002; docs/graph.md).

Every schedule holds the ``order`` (every node once), the ``addresses`` (byte offset of every
tensor of positive size), the ``arena`` (max offset + size, eq. 8: the memory the plan needs),
the ``peak_resident`` memory (eq. 13, no fragmentation) and the ``fragmentation``
``(arena - peak_resident) / arena`` (section 5.4). It is feasible when the arena fits the budget;
``min_memory`` is the arena (the budget the algorithm's plan needs). The makespan is the sum of
the node times: the order changes no time.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from memplan.algorithms.graph.entries import DEFAULT_TIME_LIMIT
from memplan.algorithms.graph.placement import (
    arena_of,
    first_fit,
    greedy_by_size,
    solve_placement,
)
from memplan.algorithms.graph.problem import GraphProblem
from memplan.schedule import Budget, ProfileRef, Schedule, SolverInfo


def run(which: str, profile: Any, request: Any) -> Schedule:
    """Run one graph algorithm (``which``) on a graph profile for a :class:`SolveRequest`."""
    began = time.perf_counter()
    problem = GraphProblem.from_profile(profile)
    limit = DEFAULT_TIME_LIMIT if request.time_limit is None else float(request.time_limit)
    progress = request.progress
    framework = problem.framework_order
    bound: int | None = None
    notes: list[str] = []
    if which == "framework":
        order = framework
        start, end = problem.lifetimes(order)
        offsets = first_fit(problem.sizes, start, end)
        status = "feasible"
    elif which == "greedy-by-size":
        order = framework
        start, end = problem.lifetimes(order)
        offsets = greedy_by_size(problem.sizes, start, end)
        status = "feasible"
    elif which in ("olla-order", "olla"):
        share = limit if which == "olla-order" else limit / 2
        order, bound, status, note = _reorder(problem, share, progress)
        notes.append(note)
        start, end = problem.lifetimes(order)
        if which == "olla-order":
            offsets = first_fit(problem.sizes, start, end)
        else:
            left = max(0.5, limit - (time.perf_counter() - began))
            placed = solve_placement(
                problem.sizes,
                start,
                end,
                problem.persistent,
                problem.peak_resident(order),
                time_limit=left,
                progress=progress,
                label="olla (placement)",
            )
            offsets = placed.offsets
            bound = None  # the arena's bound is the order's: reported in the message
            notes.append(f"placement {placed.status}, {placed.message}")
            if placed.status != "optimal":
                status = "feasible"
    elif which == "olla-address":
        order = framework
        start, end = problem.lifetimes(order)
        placed = solve_placement(
            problem.sizes,
            start,
            end,
            problem.persistent,
            problem.peak_resident(order),
            time_limit=limit,
            progress=progress,
        )
        offsets, bound, status = placed.offsets, placed.bound, placed.status
        notes.append(placed.message)
    else:  # pragma: no cover - the registry only names the five above
        raise ValueError(f"unknown graph algorithm {which!r}")
    return _schedule(
        profile,
        problem,
        request,
        which,
        order,
        offsets,
        status=status,
        seconds=time.perf_counter() - began,
        message="; ".join(n for n in notes if n) or None,
        bound=bound,
    )


def _reorder(problem: GraphProblem, limit: float, progress: Any) -> tuple[list[int], int, str, str]:
    """OLLA's reordering (eq. 14), never worse than the framework order."""
    from memplan.algorithms.graph.olla import early_update_edges, solve_order

    edges = early_update_edges(problem)
    result = solve_order(problem, time_limit=limit, extra_edges=edges, progress=progress)
    framework = problem.framework_order
    framework_peak = problem.peak_resident(framework)
    note = f"order {result.status}, {result.message}"
    if edges:
        note += f", {len(edges)} early-update control edges"
    if framework_peak < result.peak:
        note += "; the framework order was better and is kept"
        return framework, result.bound, "feasible", note
    return result.order, result.bound, result.status, note


def _schedule(
    profile: Any,
    problem: GraphProblem,
    request: Any,
    algorithm: str,
    order: list[int],
    offsets: np.ndarray,
    *,
    status: str,
    seconds: float,
    message: str | None,
    bound: int | None,
) -> Schedule:
    sizes = problem.sizes
    arena = arena_of(sizes, offsets)
    peak = problem.peak_resident(order)
    makespan = float(problem.times.sum())
    feasible = arena <= request.memory
    if not feasible:
        extra = f"the arena needs {arena} bytes"
        message = f"{message}; {extra}" if message else extra
    return Schedule(
        family="graph",
        algorithm=algorithm,
        profile=ProfileRef(model=profile.model, sha256=profile.sha256(), stages=problem.n_nodes),
        budget=Budget(memory=request.memory, optimizer=request.optimizer),
        feasible=feasible,
        makespan=makespan if feasible else None,
        lower_bound=makespan,
        overhead=1.0 if feasible else None,
        peak_memory=arena if feasible else None,
        static_memory=problem.persistent_bytes,
        min_memory=arena,
        solver=SolverInfo(
            seconds=seconds, status=status if feasible else "infeasible", message=message
        ),
        order=[problem.names[v] for v in order],
        addresses={
            problem.tensor_names[i]: int(offsets[i]) for i in range(len(sizes)) if sizes[i] > 0
        },
        arena=arena,
        peak_resident=peak,
        fragmentation=(arena - peak) / arena if arena else 0.0,
        memory_bound=bound,
    )
