"""The five graph-family algorithms as schedules: ``olla``, ``olla-order``, ``olla-address``,
``framework`` and ``greedy-by-size`` (OLLA, Steiner et al. 2022; docs/graph.md).

Every schedule holds the ``order`` (every node once), the ``addresses`` (byte offset of every
tensor of positive size), the ``arena`` (max offset + size, eq. 8: the memory the plan needs),
the ``peak_resident`` memory (eq. 13, no fragmentation) and the ``fragmentation``
``(arena - peak_resident) / arena`` (section 5.4). It is feasible when the arena fits the budget;
``min_memory`` is the arena (the budget the algorithm's plan needs). The makespan is the sum of
the node times: the order changes no time.

``olla`` is the split of section 4.4 (eq. 14, then eq. 15 on that order), followed on small graphs
by the joint model of eq. 9 (:mod:`memplan.algorithms.graph.joint`) when the split is not proven
optimal.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

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
    limit = float(request.options.time_limit)
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
    elif which == "olla-order":
        order, bound, status, note, _ = _reorder(problem, limit, progress)
        notes.append(note)
        start, end = problem.lifetimes(order)
        offsets = first_fit(problem.sizes, start, end)
    elif which == "olla":
        order, offsets, bound, status, note = _olla(problem, limit, progress, began)
        notes.append(note)
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


def _reorder(
    problem: GraphProblem, limit: float, progress: Any
) -> tuple[list[int], int, str, str, list[tuple[int, int]] | None]:
    """OLLA's reordering (eq. 14), never worse than the framework order.

    Returns the order, the proven bound, the status, a note and the control edges the order
    respects (None when the framework order was kept).
    """
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
        return framework, result.bound, "feasible", note, None
    return result.order, result.bound, result.status, note, edges


def _olla(
    problem: GraphProblem, limit: float, progress: Any, began: float
) -> tuple[list[int], np.ndarray, int | None, str, str]:
    """``olla``: eq. 14 then eq. 15 on its order (section 4.4); on small graphs whose split
    solution is not proven optimal, the joint model of eq. 9 from there."""
    from memplan.algorithms.graph.joint import JOINT_MAX_NODES, joint_size, solve_joint

    order, order_bound, status, note, edges = _reorder(problem, limit / 2, progress)
    small = edges is not None and joint_size(problem, edges) <= JOINT_MAX_NODES
    start, end = problem.lifetimes(order)
    left = max(0.5, limit - (time.perf_counter() - began))
    placed = solve_placement(
        problem.sizes,
        start,
        end,
        problem.persistent,
        problem.peak_resident(order),
        time_limit=left / 2 if small else left,
        progress=progress,
        label="olla (placement)",
    )
    notes = [note, f"placement {placed.status}, {placed.message}"]
    offsets, arena = placed.offsets, placed.arena
    proven = status == "optimal" and arena <= order_bound  # zero fragmentation, optimal order
    if small and not proven:
        left = max(0.5, limit - (time.perf_counter() - began))
        joint = solve_joint(
            problem,
            time_limit=left,
            extra_edges=edges or [],
            hint_order=order,
            hint_offsets=offsets,
            lower_bound=order_bound,
            progress=progress,
        )
        if joint is not None:
            notes.append(f"joint model (eq. 9) {joint.status}, {joint.message}")
            if joint.arena < arena:
                order, offsets, arena = joint.order, joint.offsets, joint.arena
            return order, offsets, joint.bound, joint.status, "; ".join(notes)
    if not proven:
        status = "feasible"
    return order, offsets, order_bound if proven else None, status, "; ".join(notes)


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
