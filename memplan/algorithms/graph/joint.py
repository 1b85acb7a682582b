"""OLLA's joint ILP (eq. 9 of the OLLA paper): order and addresses in one CP-SAT model.

Section 3 of the paper: the lifetime variables of section 3.2 (built by
:func:`memplan.algorithms.graph.olla.build_order_model`, with the spans of section 4.1 and the control
edges of section 4.3) plus, for every tensor ``e``, an address ``A_e`` (section 3.3) and, for every
pair of tensors that may be live together, two Booleans ``a_ij`` and ``b_ij``:

- ``a_ij + b_ij <= 1`` and ``a_ij + b_ij >= live_i,t + live_j,t - 1`` at every common step
  (eq. 6, ``live = C + P``);
- ``a_ij => A_i + S_i <= A_j`` and ``b_ij => A_j + S_j <= A_i`` (eqs. 7a and 7b, with enforcement
  literals instead of the big-M);
- ``arena >= A_e + S_e`` (eq. 8), minimized (eq. 9).

Section 4.2 prunes the pairs that can never be resident together: their maximum useful lifetimes
do not intersect, or every sink of one is a strict ancestor of the other's source (``e1 <_prec
e2``). Persistent tensors are fixed at the bottom of the arena. The model has O(pairs x common
steps) constraints, so :func:`memplan.algorithms.graph.solvers.run` uses it for small graphs only
(``olla`` on larger ones is the split of section 4.4), warm-started from the split solution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from memplan import interrupt
from memplan.algorithms.graph.cpsat import PeakProgress, workers
from memplan.algorithms.graph.olla import OrderVars, build_order_model, contract_nodes, read_order
from memplan.algorithms.graph.placement import (
    arena_of,
    greedy_by_size,
    stack_persistent,
)
from memplan.algorithms.graph.problem import GraphProblem
from memplan.schedule import Status

JOINT_MAX_NODES = 60
"""Largest number of ordered nodes for which ``olla`` also tries the joint model."""
JOINT_MAX_PAIRS = 20_000
"""Largest number of (pair, step) constraints of eq. 6 for which the joint model is built."""


@dataclass
class JointResult:
    """An order and addresses found by :func:`solve_joint`, and what the solver proved."""

    order: list[int]
    offsets: np.ndarray
    arena: int
    bound: int
    status: Status
    seconds: float
    message: str


def joint_size(problem: GraphProblem, extra: Sequence[tuple[int, int]]) -> int:
    """How many nodes the joint model would order (weight and memory-neutral nodes left out)."""
    nodes, _ = contract_nodes(problem, extra)
    return len(nodes)


def solve_joint(
    problem: GraphProblem,
    *,
    time_limit: float,
    extra_edges: Sequence[tuple[int, int]] = (),
    hint_order: Sequence[int] | None = None,
    hint_offsets: np.ndarray | None = None,
    lower_bound: int = 0,
    progress: Callable[[str], None] | None = None,
    label: str = "olla (joint)",
) -> JointResult | None:
    """Minimize the arena over the orders and the addresses together (eq. 9 of the OLLA paper).

    Returns None when the model would exceed :data:`JOINT_MAX_PAIRS` constraints of eq. 6.
    The result is never worse than the hint (order and offsets), which is returned when CP-SAT
    finds nothing better in time. ``lower_bound`` (e.g. the least peak resident memory) lets the
    solver stop as soon as it reaches it.
    """
    began = time.perf_counter()
    extra = list(extra_edges)
    order = list(hint_order) if hint_order is not None else problem.topological_order(extra=extra)
    sizes = problem.sizes
    fixed, offsets = _hint_placement(problem, order, hint_offsets)
    upper = arena_of(sizes, offsets)
    nodes, succ = contract_nodes(problem, extra)
    model, var, _ = build_order_model(problem, nodes, succ, order, minimize=False)
    movable = [i for i in range(len(sizes)) if sizes[i] > 0 and not problem.persistent[i]]
    pairs = _pairs(problem, var, movable)
    if sum(hi - lo + 1 for _, _, lo, hi in pairs) > JOINT_MAX_PAIRS:
        return None
    base = int(sizes[problem.persistent].sum())
    arena = model.new_int_var(max(base, lower_bound), max(upper, base), "arena")
    address = _addresses(model, var, problem, movable, pairs, offsets, arena, base, upper)
    model.add_hint(arena, upper)
    model.minimize(arena)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, float(time_limit))
    solver.parameters.num_workers = workers()
    status = interrupt.solve(solver, model, PeakProgress(1, 0, progress, label, began))
    seconds = time.perf_counter() - began
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        found_order = read_order(solver, var, problem, extra)
        found = np.zeros(len(sizes), dtype=np.int64)
        for i, off in fixed.items():
            found[i] = off
        for i in movable:
            found[i] = solver.value(address[i])
        value = arena_of(sizes, found)
        bound = max(lower_bound, int(solver.best_objective_bound))
        if value <= upper:
            state: Status = (
                "optimal" if status == cp_model.OPTIMAL or value <= bound else "feasible"
            )
            gap = (value - bound) / value if value else 0.0
            return JointResult(
                found_order, found, value, min(bound, value), state, seconds, f"gap {gap:.2%}"
            )
    gap = (upper - lower_bound) / upper if upper else 0.0
    return JointResult(
        order,
        offsets,
        upper,
        lower_bound,
        "feasible",
        seconds,
        f"no better CP-SAT solution in time, gap {gap:.2%}",
    )


def _hint_placement(
    problem: GraphProblem, order: list[int], hint_offsets: np.ndarray | None
) -> tuple[dict[int, int], np.ndarray]:
    """The persistent tensors' fixed offsets (at the bottom), and the addresses the model is
    hinted with: the greedy placement of ``order``, or ``hint_offsets`` when they keep the fixed
    offsets and are no worse.
    """
    sizes = problem.sizes
    fixed = stack_persistent(sizes, problem.persistent)
    start, end = problem.lifetimes(order)
    offsets = greedy_by_size(sizes, start, end, fixed=fixed)
    if (
        hint_offsets is not None
        and all(hint_offsets[i] == o for i, o in fixed.items())
        and arena_of(sizes, hint_offsets) <= arena_of(sizes, offsets)
    ):
        offsets = np.asarray(hint_offsets, dtype=np.int64)
    return fixed, offsets


def _pairs(
    problem: GraphProblem, var: OrderVars, movable: list[int]
) -> list[tuple[int, int, int, int]]:
    """The pairs ``(i, j, lo, hi)`` of tensors that may be resident together, at steps
    ``lo..hi``: section 4.2 prunes those whose useful lifetimes never meet and those ordered by
    the graph (every sink of one a strict ancestor of the other's source).
    """
    live_range: dict[int, tuple[int, int]] = {}
    for i in movable:
        p = int(problem.producer[i])
        sinks = problem.consumers[i]
        last = max([var.alap[p], *(var.alap[s] for s in sinks)])
        live_range[i] = (var.asap[p], last)

    def precedes(i: int, j: int) -> bool:  # section 4.2: e_i <_prec e_j
        src_j = int(problem.producer[j])
        sinks = problem.consumers[i] or [int(problem.producer[i])]
        anc = var.ancestors[src_j]
        return all(s != src_j and (anc >> var.local[s]) & 1 for s in sinks)

    pairs: list[tuple[int, int, int, int]] = []
    for k, i in enumerate(movable):
        for j in movable[k + 1 :]:
            lo = max(live_range[i][0], live_range[j][0])
            hi = min(live_range[i][1], live_range[j][1])
            if lo > hi or precedes(i, j) or precedes(j, i):
                continue
            pairs.append((i, j, lo, hi))
    return pairs


def _addresses(
    model: cp_model.CpModel,
    var: OrderVars,
    problem: GraphProblem,
    movable: list[int],
    pairs: list[tuple[int, int, int, int]],
    offsets: np.ndarray,
    arena: Any,
    base: int,
    upper: int,
) -> dict[int, Any]:
    """The addresses ``A_e`` above the persistent tensors (eq. 8 with ``arena``) and, per pair,
    ``a_ij`` and ``b_ij`` (eqs. 6, 7a, 7b), hinted with ``offsets``.
    """
    sizes = problem.sizes
    address = {}
    for i in movable:
        address[i] = model.new_int_var(base, max(base, upper - int(sizes[i])), f"address_{i}")
        model.add(arena >= address[i] + int(sizes[i]))
        model.add_hint(address[i], int(offsets[i]))
    for i, j, lo, hi in pairs:
        a = model.new_bool_var(f"a_{i}_{j}")
        b = model.new_bool_var(f"b_{i}_{j}")
        model.add(a + b <= 1)  # eq. 6, first line
        for t in range(lo, hi + 1):  # eq. 6: a + b >= live_i,t + live_j,t - 1
            li, lj = _live(problem, var, i, t), _live(problem, var, j, t)
            if li and lj:
                model.add(a + b >= sum(li) + sum(lj) - 1)
        model.add(address[i] + int(sizes[i]) <= address[j]).only_enforce_if(a)  # eq. 7a
        model.add(address[j] + int(sizes[j]) <= address[i]).only_enforce_if(b)  # eq. 7b
        below = bool(offsets[i] + sizes[i] <= offsets[j])
        model.add_hint(a, below)
        model.add_hint(b, not below and bool(offsets[j] + sizes[j] <= offsets[i]))
    return address


def _live(problem: GraphProblem, var: OrderVars, i: int, t: int) -> list[Any]:
    """``live_i,t = C + P``: tensor ``i`` created (its producer runs) or preserved at step ``t``."""
    p = int(problem.producer[i])
    terms = []
    if t in var.x[p]:
        terms.append(var.x[p][t])
    if t in var.P.get(i, {}):
        terms.append(var.P[i][t])
    return terms
