"""Replay a graph-family schedule: an execution order and an address for every tensor.

This is the independent check of the graph family (OLLA, Steiner et al. 2022): it shares no code with
:mod:`memplan.algorithms` and must not import it. From the profile's graph and the schedule's
``order`` and ``addresses`` alone it

1. checks the order runs every node exactly once and every producer before its consumers
   (control edges, tensors of size 0, included);
2. derives each tensor's lifetime ``[step of its producer, step of its last consumer]`` (both
   included; a tensor without consumers lives at its producer's step only; a tensor produced by a
   ``weight`` node lives during the whole step);
3. computes the resident bytes at every step, hence ``peak_resident`` (eq. 13 of OLLA (Steiner et al. 2022));
4. checks every tensor of positive size has an offset ``>= 0``, and that no two tensors whose
   lifetimes share a step overlap in memory (eqs. 6-7);
5. computes the arena ``max(offset + size)`` (eq. 8), which is the memory the plan needs: the
   replay's ``peak_memory``; it must fit the budget.

The memory curve has two points per step (the resident bytes); its time axis is the node times,
or 1 ms per node when the graph has no times (graphs captured with fake tensors).

The makespan is the sum of the node times: every node runs once, whatever the order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memplan.profile.model import Profile
from memplan.simulator.result import SimulationResult, over_budget

_PAIR_BLOCK = 1024
"""Tensors per block of the vectorized pairwise overlap check (bounds its memory)."""


def graph_lifetimes(profile: Profile, order: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Lifetimes ``(first step, last step)`` of every tensor for a valid ``order``."""
    graph = profile.graph
    assert graph is not None
    position = {name: k for k, name in enumerate(order)}
    kinds = {node.name: node.kind for node in graph.nodes}
    last = len(order) - 1
    start = np.zeros(len(graph.tensors), dtype=np.int64)
    end = np.zeros(len(graph.tensors), dtype=np.int64)
    for i, tensor in enumerate(graph.tensors):
        if kinds[tensor.producer] == "weight":
            start[i], end[i] = 0, last
            continue
        p = position[tensor.producer]
        start[i] = p
        end[i] = max([p, *(position[c] for c in tensor.consumers)])
    return start, end


def resident_per_step(
    sizes: np.ndarray, start: np.ndarray, end: np.ndarray, steps: int
) -> np.ndarray:
    """Bytes live at each step (a difference array over the lifetimes)."""
    delta = np.zeros(steps + 1, dtype=np.int64)
    np.add.at(delta, start, sizes)
    np.add.at(delta, end + 1, -sizes)
    return np.cumsum(delta[:-1])


def simulate_graph(profile: Profile, schedule: Any, memory: int | None = None) -> SimulationResult:
    """Replay ``schedule.order`` and ``schedule.addresses`` on ``profile.graph``.

    Parameters
    ----------
    profile : Profile
        A profile with a ``graph``.
    schedule : Schedule
        A graph-family schedule (``order``, ``addresses``; ``arena``, ``peak_resident`` and
        ``fragmentation`` are checked when stated).
    memory : int, optional
        The budget the arena must fit.

    Returns
    -------
    SimulationResult
        ``peak_memory`` is the arena; ``op_peaks`` the resident bytes at each step;
        ``violation`` names the first problem (``order[12] relu: ...``).
    """
    graph = profile.graph
    result = SimulationResult(budget=memory)
    if graph is None:
        result.fail("the profile has no graph")
        return result
    order = list(schedule.order or [])
    problem = _order_problem(graph, order)
    if problem is not None:
        result.fail(*problem)
        return result

    sizes = np.array([t.size for t in graph.tensors], dtype=np.int64)
    start, end = graph_lifetimes(profile, order)
    steps = len(order)
    resident = resident_per_step(sizes, start, end, steps)
    peak_resident = int(resident.max()) if steps else 0

    offsets = _offsets(graph, dict(schedule.addresses or {}))
    if isinstance(offsets, str):
        result.fail(offsets)
        return result
    clash = _first_overlap(sizes, offsets, start, end)
    if clash is not None:
        i, j = clash
        a, b = graph.tensors[i], graph.tensors[j]
        step = int(max(start[i], start[j]))
        result.fail(
            f"order[{step}] {order[step]}: tensors {a.name!r} [{offsets[i]}, "
            f"{offsets[i] + sizes[i]}) and {b.name!r} [{offsets[j]}, {offsets[j] + sizes[j]}) "
            "are live together and overlap in memory",
            step,
        )
        return result
    sized = sizes > 0
    arena = int((offsets[sized] + sizes[sized]).max()) if sized.any() else 0

    _replay_times(result, graph, order, resident)
    result.peak_memory = arena
    result.static_memory = graph.weight_size  # counted in the arena: reported, not added
    problem_text = _claims_problem(schedule, arena, peak_resident)
    if problem_text is not None:
        result.fail(problem_text)
        return result
    if memory is not None and arena > memory:
        result.fail(f"arena: {over_budget(arena, memory)}")
    return result


def _order_problem(graph: Any, order: list[str]) -> tuple[str, int | None] | None:
    """Check 1: the first problem of ``order`` (an unknown node, one run twice or never, a
    tensor read before its producer runs) and the index it is at, or None.
    """
    nodes = {node.name for node in graph.nodes}
    position: dict[str, int] = {}
    for k, name in enumerate(order):
        if name not in nodes:
            return f"order[{k}]: unknown node {name!r}", k
        if name in position:
            return f"order[{k}] {name}: runs twice (also order[{position[name]}])", k
        position[name] = k
    missing = [node.name for node in graph.nodes if node.name not in position]
    if missing:
        return f"order: {len(missing)} node(s) never run, e.g. {missing[0]!r}", None
    for tensor in graph.tensors:
        p = position[tensor.producer]
        for consumer in tensor.consumers:
            c = position[consumer]
            if c <= p:
                return (
                    f"order[{c}] {consumer}: reads tensor {tensor.name!r} before its producer "
                    f"{tensor.producer!r} (order[{p}]) runs",
                    c,
                )
    return None


def _offsets(graph: Any, addresses: dict[str, Any]) -> np.ndarray | str:
    """Check 4's first half: every tensor of positive size at a byte offset >= 0, and no address
    of an unknown tensor; the offsets, or the first problem.
    """
    known = {t.name for t in graph.tensors}
    for name in addresses:
        if name not in known:
            return f"addresses: unknown tensor {name!r}"
    offsets = np.zeros(len(graph.tensors), dtype=np.int64)
    for i, tensor in enumerate(graph.tensors):
        if tensor.size == 0:
            continue
        if tensor.name not in addresses:
            return f"addresses: tensor {tensor.name!r} ({tensor.size} bytes) has no offset"
        offset = addresses[tensor.name]
        if not isinstance(offset, int) or offset < 0:
            return f"addresses.{tensor.name}: expected a byte offset >= 0, got {offset!r}"
        offsets[i] = offset
    return offsets


def _replay_times(
    result: SimulationResult, graph: Any, order: list[str], resident: np.ndarray
) -> None:
    """The makespan (the node times summed), the resident bytes per step and the memory curve
    (two points per step; 1 ms per node when the graph has no times).
    """
    nodes = {node.name: node for node in graph.nodes}
    times = np.array([nodes[name].time for name in order], dtype=float)
    result.makespan = float(times.sum())
    if not times.any():  # no times (a captured graph): the memory curve is drawn per step
        times = np.ones(len(order))
    clock = np.concatenate([[0.0], np.cumsum(times)])
    result.op_peaks = [int(v) for v in resident]
    curve: list[tuple[float, int]] = []
    for k in range(len(order)):
        curve += [(float(clock[k]), int(resident[k])), (float(clock[k + 1]), int(resident[k]))]
    result.memory_curve = curve


def _claims_problem(schedule: Any, arena: int, peak_resident: int) -> str | None:
    """Check 5's claims: the schedule's ``arena``, ``peak_resident`` and ``fragmentation``,
    where stated, against the replay's; the first that differs, or None.
    """
    claims = (
        ("arena", schedule.arena, arena),
        ("peak_resident", schedule.peak_resident, peak_resident),
    )
    for field, claimed, replayed in claims:
        if claimed is not None and claimed != replayed:
            return f"{field}: schedule says {claimed}, replay gives {replayed}"
    fragmentation = (arena - peak_resident) / arena if arena else 0.0
    if schedule.fragmentation is not None and abs(schedule.fragmentation - fragmentation) > 1e-9:
        return (
            f"fragmentation: schedule says {schedule.fragmentation}, replay gives {fragmentation}"
        )
    return None


def _first_overlap(
    sizes: np.ndarray, offsets: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[int, int] | None:
    """A pair of sized tensors live at a common step whose byte ranges intersect, or None."""
    idx = np.flatnonzero(sizes > 0)
    lo, hi = offsets[idx], offsets[idx] + sizes[idx]
    s, e = start[idx], end[idx]
    n = len(idx)
    for b0 in range(0, n, _PAIR_BLOCK):
        rows = slice(b0, min(n, b0 + _PAIR_BLOCK))
        live = (s[rows, None] <= e[None, :]) & (s[None, :] <= e[rows, None])
        mem = (lo[rows, None] < hi[None, :]) & (lo[None, :] < hi[rows, None])
        upper = np.arange(rows.start, rows.stop)[:, None] < np.arange(n)[None, :]
        hits = np.argwhere(live & mem & upper)
        if len(hits):
            r, c = hits[0]
            return int(idx[rows.start + r]), int(idx[c])
    return None
