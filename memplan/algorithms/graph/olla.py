"""OLLA node reordering: the lifetime ILP of the OLLA paper (eq. 14) with CP-SAT.

Steiner et al., *OLLA: Optimizing the Lifetime and Location of Arrays to Reduce the Memory Usage of
Neural Networks*, section 3.2 (constraints 1-5), section 4.4 (eq. 13-14: peak resident memory
without fragmentation) and the simplifications of section 4:

- 4.1 spans: node ``v`` may only run at a step in ``[ASAP(v), ALAP(v)]``; tensor ``e`` may only be
  preserved in ``MUL(e)`` and must be preserved in ``PRES(e)`` (eqs. 10-12). One node runs per
  step, so ``ASAP(v)`` is the number of ancestors of ``v`` and ``ALAP(v) = T - 1 -`` its number of
  descendants (the paper's levels, tightened for sequential orders).
- 4.3 early weight updates: a control edge from each optimizer node to an anchor found by
  Functions 3-4 (levelization), so that updates, and the frees of the gradients they read, are not
  left to the end.

See NOTE [ OLLA order model ] in :func:`build_order_model` for the encoding. Weight nodes (parameters,
buffers, optimizer state) are resident during the whole step whatever the order: they run first,
in the framework order, and only the other nodes are ordered by the ILP.

Size: O(sum of spans) Boolean variables; a linear chain has spans of one step and is solved by
propagation alone, the flexible nodes of a training graph (weight gradients, updates, side
branches) are where the search happens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from memplan import interrupt
from memplan.algorithms.graph.cpsat import PeakProgress, workers
from memplan.algorithms.graph.problem import GraphProblem
from memplan.schedule import Status


def levels(
    problem: GraphProblem, nodes: Sequence[int], extra: Sequence[tuple[int, int]] = ()
) -> tuple[dict[int, int], dict[int, int], dict[int, list[int]]]:
    """Levelization of the subgraph on ``nodes`` (forward: longest path from a source; backward:
    longest path to a sink), as ``ComputeLevelization`` in Function 3 of the OLLA paper.
    """
    keep = set(nodes)
    succ = {v: [w for w in problem.succ[v] if w in keep] for v in nodes}
    for v, w in extra:
        succ[v].append(w)
    topo = _topo(nodes, succ)
    fwd = dict.fromkeys(nodes, 0)
    for v in topo:
        for w in succ[v]:
            fwd[w] = max(fwd[w], fwd[v] + 1)
    bwd = dict.fromkeys(nodes, 0)
    for v in reversed(topo):
        for w in succ[v]:
            bwd[v] = max(bwd[v], bwd[w] + 1)
    return fwd, bwd, succ


def _topo(nodes: Sequence[int], succ: dict[int, list[int]]) -> list[int]:
    indeg = dict.fromkeys(nodes, 0)
    for v in nodes:
        for w in succ[v]:
            indeg[w] += 1
    ready = [v for v in nodes if indeg[v] == 0]
    out: list[int] = []
    while ready:
        v = ready.pop()
        out.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return out


def early_update_edges(problem: GraphProblem) -> list[tuple[int, int]]:
    """Control edges ``(update node, anchor)`` of section 4.3 (Functions 3 and 4 of the OLLA paper).

    For each optimizer node ``v`` the search starts at the sources of its fanin and widens one
    hop at a time; an anchor is a node of forward level above ``v``'s (so the edge closes no
    cycle) with the highest backward level (it runs early). Nodes at or below ``v``'s level are
    searched through (``FindCandidate`` recurses into them).
    """
    nodes = [v for v in range(problem.n_nodes) if problem.kinds[v] != "weight"]
    fwd, bwd, succ = levels(problem, nodes)
    pred: dict[int, list[int]] = {v: [] for v in nodes}
    for v in nodes:
        for w in succ[v]:
            pred[w].append(v)
    edges: list[tuple[int, int]] = []
    for v in nodes:
        if problem.kinds[v] != "optimizer":
            continue
        min_level = fwd[v]
        visited: dict[int, tuple[int | None, int]] = {}

        starts = {v}
        anchor: tuple[int | None, int] = (None, -1)
        seen_starts: set[int] = set()
        while anchor[0] is None and starts:
            starts = {p for u in starts for p in pred[u]} - seen_starts
            seen_starts |= starts
            for src in starts:
                cand = _find_candidate(src, succ, fwd, bwd, min_level, visited)
                if cand[0] is not None and cand[1] > anchor[1] and cand[0] != v:
                    anchor = cand
        if anchor[0] is not None:
            edges.append((v, anchor[0]))
    return edges


def _find_candidate(
    start: int,
    succ: dict[int, list[int]],
    fwd: dict[int, int],
    bwd: dict[int, int],
    min_level: int,
    visited: dict[int, tuple[int | None, int]],
) -> tuple[int | None, int]:
    """Function 4 of the OLLA paper (``FindCandidate``), iteratively: the best anchor reachable from
    ``start`` through nodes of forward level ``<= min_level``, and its backward level.
    """
    stack = [start]
    while stack:
        u = stack[-1]
        if u in visited:
            stack.pop()
            continue
        pending = [s for s in succ[u] if fwd[s] <= min_level and s not in visited and s != u]
        if pending:
            stack.extend(pending)
            continue
        best: tuple[int | None, int] = (None, -1)
        for s in succ[u]:
            if bwd[s] <= best[1]:
                continue
            if fwd[s] <= min_level:
                cand = visited[s]
                if cand[1] > best[1]:
                    best = cand
            else:
                best = (s, bwd[s])
        visited[u] = best
        stack.pop()
    return visited[start]


@dataclass
class OrderResult:
    """An order found by :func:`solve_order` and what the solver proved."""

    order: list[int]
    peak: int
    bound: int
    status: Status
    seconds: float
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class OrderVars:
    nodes: list[int]
    x: dict[int, dict[int, Any]]
    peak: Any
    scale: int
    constant: int
    P: dict[int, dict[int, Any]] = field(default_factory=dict)  # noqa: N815 - the paper's name
    asap: dict[int, int] = field(default_factory=dict)
    alap: dict[int, int] = field(default_factory=dict)
    ancestors: dict[int, int] = field(default_factory=dict)  # bitsets over local indices
    local: dict[int, int] = field(default_factory=dict)


def solve_order(
    problem: GraphProblem,
    *,
    time_limit: float,
    extra_edges: Sequence[tuple[int, int]] = (),
    hint: Sequence[int] | None = None,
    progress: Callable[[str], None] | None = None,
    label: str = "olla-order",
) -> OrderResult:
    """Minimize the peak resident memory over the topological orders (eq. 14 of the OLLA paper).

    Parameters
    ----------
    problem : GraphProblem
        The training graph.
    time_limit : float
        Seconds (CP-SAT's ``max_time_in_seconds``).
    extra_edges : sequence of (int, int)
        Control edges the order must also respect (e.g. :func:`early_update_edges`).
    hint : sequence of int, optional
        A topological order (respecting ``extra_edges``) to warm-start from; default: the
        framework order bent by the control edges.
    progress : callable, optional
        Receives one line per improving solution: objective, bound, gap.

    Returns
    -------
    OrderResult
        ``peak`` is the peak resident memory of ``order`` (persistent tensors included); never
        worse than the hint, which is returned when CP-SAT finds nothing better in time.
    """
    began = time.perf_counter()
    extra = list(extra_edges)
    if hint is None:
        hint = problem.topological_order(extra=extra)
    hint = list(hint)
    hint_peak = problem.peak_resident(hint)
    nodes, succ = contract_nodes(problem, extra)
    model, var, stats = build_order_model(problem, nodes, succ, hint)
    stats["control_edges"] = len(extra)
    stats["contracted"] = problem.n_nodes - len(nodes)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, float(time_limit))
    solver.parameters.num_workers = workers()

    callback = PeakProgress(var.scale, var.constant, progress, label, began)
    status = interrupt.solve(solver, model, callback)
    seconds = time.perf_counter() - began
    details = {"hint_peak": hint_peak, **stats}
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        order = read_order(solver, var, problem, extra)
        peak = problem.peak_resident(order)
        bound = int(math.ceil(solver.best_objective_bound)) * var.scale + var.constant
        claimed = int(round(solver.objective_value)) * var.scale + var.constant
        # A solution cut short by the time limit may keep tensors preserved longer than their
        # uses need (eq. 2 bounds P from above only): the model's peak is then above the order's,
        # which the replay gives. Never below it.
        if peak > claimed:  # pragma: no cover - the model counts every resident tensor
            raise AssertionError(f"olla-order: model peak {claimed} < replayed peak {peak}")
        if peak > hint_peak:  # pragma: no cover - CP-SAT keeps the hint when it is better
            order, peak = hint, hint_peak
        state: Status = "optimal" if status == cp_model.OPTIMAL or peak <= bound else "feasible"
        gap = (peak - bound) / peak if peak else 0.0
        return OrderResult(order, peak, min(bound, peak), state, seconds, f"gap {gap:.2%}", details)
    bound = stats["lower_bound"]
    gap = (hint_peak - bound) / hint_peak if hint_peak else 0.0
    return OrderResult(
        hint,
        hint_peak,
        bound,
        "feasible",
        seconds,
        f"no CP-SAT solution in time (kept the warm start), gap {gap:.2%}",
        details,
    )


def contract_nodes(
    problem: GraphProblem, extra: Sequence[tuple[int, int]]
) -> tuple[list[int], dict[int, set[int]]]:
    """The nodes the ILP orders and the dependencies between them.

    Weight nodes run first and are left out; so are *memory-neutral* nodes, which read and write
    only persistent tensors or control edges (e.g. ``num_batches_tracked.add_(1)``): their
    position changes no lifetime. Dependencies through neutral nodes are kept transitively.
    """
    n = problem.n_nodes
    succ_all: list[set[int]] = [set(problem.succ[v]) for v in range(n)]
    for v, w in extra:
        succ_all[v].add(w)
    touches = [False] * n
    persistent = problem.persistent
    for i, size in enumerate(problem.sizes.tolist()):
        if size > 0 and not persistent[i]:
            touches[int(problem.producer[i])] = True
            for c in problem.consumers[i]:
                touches[c] = True
    nodes = [v for v in range(n) if problem.kinds[v] != "weight" and touches[v]]
    keep = set(nodes)
    succ: dict[int, set[int]] = {}
    for v in nodes:
        found: set[int] = set()
        stack, seen = list(succ_all[v]), set()
        while stack:
            w = stack.pop()
            if w in seen:
                continue
            seen.add(w)
            if w in keep:
                found.add(w)
            else:
                stack.extend(succ_all[w])
        succ[v] = found
    return nodes, succ


def build_order_model(
    problem: GraphProblem,
    nodes: list[int],
    succ: dict[int, set[int]],
    hint: list[int],
    minimize: bool = True,
) -> tuple[cp_model.CpModel, OrderVars, dict[str, int]]:
    """The CP-SAT model of eq. 14 (see NOTE [ OLLA order model ]).

    With ``minimize=False`` only the order part (constraints 1-5, 10-12) is built, without
    eq. 13 and the objective: the joint model of eq. 9 (:mod:`.joint`) adds the addresses.

    # NOTE [ OLLA order model ]
    # Steps t = 0..T-1, T the number of non-weight nodes, one node per step. For node v,
    # Booleans x[v][t] (t in SPAN(v)); x[v][t] is C[e][t] for every tensor e that v produces
    # (eq. 5 ties the siblings by sharing the variable). sum_t x[v][t] = 1 (eq. 3).
    # For a tensor e of producer p and sinks S, P[e][t] for t in MUL(e) = (ASAP(p),
    # max_s ALAP(s)], fixed to 1 on PRES(e) = [ALAP(p)+1, max_s ASAP(s)] (eqs. 11-12);
    # P[e][t] <= P[e][t-1] + x[p][t-1] (eq. 2); x[s][t] <= P[e][t] for each sink s (eq. 4);
    # eq. 1 (P + C <= 1) holds since P[e][t] = 1 needs p to have run before t.
    # Memory (eq. 13): for each t, sum_e size_e (x[p][t] + P[e][t]) <= peak. Tensors of size 0
    # (control edges) only order nodes: step(s) >= step(p) + 1, with step(v) = sum_t t x[v][t]
    # (also added for every dependency: it propagates better than eq. 4 alone).
    # Persistent tensors add a constant; sizes are divided by their gcd (exact).
    """
    T = len(nodes)  # noqa: N806 - the paper's name
    local, anc, asap, alap = _spans(nodes, succ)
    persistent = problem.persistent
    sizes = problem.sizes
    movable = [i for i in range(len(sizes)) if not persistent[i] and sizes[i] > 0]
    scale = math.gcd(*(int(sizes[i]) for i in movable)) if movable else 1
    scale = max(scale, 1)
    constant = int(sizes[persistent].sum())

    model = cp_model.CpModel()
    x, position = _node_steps(model, nodes, succ, asap, alap, hint, local)
    memory = _Residence(model, nodes, position)
    for i in movable:
        memory.add_tensor(problem, i, int(sizes[i]) // scale, x, asap, alap)
    lower = max(memory.node_lb.values(), default=0)
    stats = {
        "steps": T,
        "x_vars": sum(len(x[v]) for v in nodes),
        "p_vars": memory.n_p,
        "lower_bound": lower * scale + constant,
    }
    var = OrderVars(nodes, x, None, scale, constant, memory.all_p, asap, alap, anc, local)
    if not minimize:
        return model, var, stats
    hint_resident = problem.resident(hint)
    upper = int(hint_resident.max() - constant) // scale if len(hint) else 0
    peak = model.new_int_var(min(lower, upper), max(upper, 0), "peak_resident")
    for t in range(T):
        expr = sum(c * v for v, c in memory.terms[t].items())
        model.add(expr + int(memory.const[t]) <= peak)
    model.add_hint(peak, upper)
    model.minimize(peak)
    var.peak = peak
    return model, var, stats


def _spans(
    nodes: list[int], succ: dict[int, set[int]]
) -> tuple[dict[int, int], dict[int, int], dict[int, int], dict[int, int]]:
    """Section 4.1: each node's local index, its ancestors (a bitset over the local indices),
    ``ASAP`` (its number of ancestors) and ``ALAP`` (``T - 1 -`` its number of descendants).
    """
    local = {v: k for k, v in enumerate(nodes)}
    T = len(nodes)  # noqa: N806 - the paper's name
    topo = _topo(nodes, {v: sorted(s) for v, s in succ.items()})
    anc = dict.fromkeys(nodes, 0)
    for v in topo:
        for w in succ[v]:
            anc[w] |= anc[v] | (1 << local[v])
    desc = dict.fromkeys(nodes, 0)
    for v in reversed(topo):
        for w in succ[v]:
            desc[v] |= desc[w] | (1 << local[w])
    asap = {v: anc[v].bit_count() for v in nodes}
    alap = {v: T - 1 - desc[v].bit_count() for v in nodes}
    return local, anc, asap, alap


def _node_steps(
    model: cp_model.CpModel,
    nodes: list[int],
    succ: dict[int, set[int]],
    asap: dict[int, int],
    alap: dict[int, int],
    hint: list[int],
    local: dict[int, int],
) -> tuple[dict[int, dict[int, Any]], dict[int, int]]:
    """``x[v][t]`` over each node's span: one step per node (eq. 3), one node per step, every
    dependency one step or more later; hinted with the order ``hint`` (each node's step in it,
    returned too).
    """
    T = len(nodes)  # noqa: N806 - the paper's name
    x: dict[int, dict[int, Any]] = {}
    for v in nodes:
        x[v] = {t: model.new_bool_var(f"x_{v}_{t}") for t in range(asap[v], alap[v] + 1)}
        model.add_exactly_one(x[v].values())
    by_step: dict[int, list[Any]] = {}
    for v in nodes:
        for t, var in x[v].items():
            by_step.setdefault(t, []).append(var)
    for t in range(T):
        if len(by_step.get(t, [])) > 1:
            model.add_at_most_one(by_step[t])
    step = {}
    for v in nodes:
        step[v] = model.new_int_var(asap[v], alap[v], f"step_{v}")
        model.add(step[v] == sum(t * var for t, var in x[v].items()))
    for v in nodes:
        for w in succ[v]:
            model.add(step[w] >= step[v] + 1)
    position = {v: k for k, v in enumerate(w for w in hint if w in local)}
    for v in nodes:
        model.add_hint(step[v], position[v])
        for t, var in x[v].items():
            model.add_hint(var, t == position[v])
    return x, position


class _Residence:
    """The resident memory of each step as the tensors are added (eqs. 2, 4, 11-12, 13): constant
    bytes and ``(variable, coefficient)`` terms per step, in units of the sizes' gcd.
    """

    def __init__(self, model: cp_model.CpModel, nodes: list[int], position: dict[int, int]) -> None:
        steps = len(nodes)
        self.model = model
        self.position = position  # each node's step in the hint
        self.const = np.zeros(steps, dtype=np.int64)
        self.terms: dict[int, dict[Any, int]] = {t: {} for t in range(steps)}
        self.n_p = 0
        self.all_p: dict[int, dict[int, Any]] = {}
        self.node_lb = dict.fromkeys(nodes, 0)  # the bytes each node's step holds at least

    def add_tensor(
        self,
        problem: GraphProblem,
        i: int,
        size: int,
        x: dict[int, dict[int, Any]],
        asap: dict[int, int],
        alap: dict[int, int],
    ) -> None:
        """Tensor ``i`` of ``size`` units: created at its producer's step, preserved (``P``)
        until its last sink runs.
        """
        model, terms = self.model, self.terms
        p = int(problem.producer[i])
        sinks = problem.consumers[i]
        self.node_lb[p] += size
        for s in set(sinks):
            self.node_lb[s] += size
        for t, var in x[p].items():
            terms[t][var] = terms[t].get(var, 0) + size
        if not sinks:
            return
        last = max(alap[s] for s in sinks)
        must_from, must_to = alap[p] + 1, max(asap[s] for s in sinks)
        P: dict[int, Any] = {}  # noqa: N806 - the paper's name
        self.all_p[i] = P
        position = self.position
        for t in range(asap[p] + 1, last + 1):
            if must_from <= t <= must_to:
                P[t] = 1
                self.const[t] += size
            else:
                P[t] = model.new_bool_var(f"p_{i}_{t}")
                self.n_p += 1
                terms[t][P[t]] = terms[t].get(P[t], 0) + size
                model.add_hint(P[t], position[p] < t <= max(position[s] for s in sinks))
        for t in range(asap[p] + 1, last + 1):  # eq. 2
            prev = P.get(t - 1, 0)
            made = x[p].get(t - 1, 0)
            if isinstance(P[t], int) and (isinstance(prev, int) and prev == 1):
                continue
            if isinstance(P[t], int) and isinstance(prev, int) and isinstance(made, int):
                continue  # pragma: no cover - a fixed P right after the span cannot happen
            model.add(P[t] <= prev + made)
        for s in set(sinks):  # eq. 4
            for t, var in x[s].items():
                if not isinstance(P[t], int):
                    model.add_implication(var, P[t])


def read_order(
    solver: Any, var: OrderVars, problem: GraphProblem, extra: Sequence[tuple[int, int]]
) -> list[int]:
    """Function 1 of the OLLA paper: the ILP's nodes by step; weight and memory-neutral nodes as
    soon as their dependencies allow (they change no lifetime).
    """
    priority = [-1] * problem.n_nodes
    for v in var.nodes:
        priority[v] = next(t for t, x in var.x[v].items() if solver.boolean_value(x))
    return problem.topological_order(priority=priority, extra=extra)
