"""The graph family (OLLA, Steiner et al.): its options and algorithms, declared once.

One adapter per algorithm, as in every family (:mod:`memplan.algorithms.chain.entries`); the
graph solvers (:func:`.solvers.run`) return finished schedules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memplan.algorithms.base import AlgorithmInfo, Family, SolveRequest
from memplan.algorithms.options import time_limit_option

if TYPE_CHECKING:  # annotations only: declaring the family loads no model
    from memplan.profile.model import Profile
    from memplan.schedule import Schedule

DEFAULT_TIME_LIMIT = 60.0
"""Seconds given to each CP-SAT solve when ``--time-limit`` is not set."""


@dataclass(frozen=True)
class GraphOptions:
    """Options of the graph family."""

    time_limit: float = time_limit_option(DEFAULT_TIME_LIMIT)


REFERENCE = "Steiner et al., OLLA"


def solve_olla(profile: Profile, request: SolveRequest) -> Schedule:
    """``olla``: reorder, then place (:func:`.solvers.run`)."""
    from memplan.algorithms.graph import solvers

    return solvers.run("olla", profile, request)


def solve_olla_order(profile: Profile, request: SolveRequest) -> Schedule:
    """``olla-order``: the order of least peak resident memory (:func:`.solvers.run`)."""
    from memplan.algorithms.graph import solvers

    return solvers.run("olla-order", profile, request)


def solve_olla_address(profile: Profile, request: SolveRequest) -> Schedule:
    """``olla-address``: the least arena for PyTorch's order (:func:`.solvers.run`)."""
    from memplan.algorithms.graph import solvers

    return solvers.run("olla-address", profile, request)


def solve_framework(profile: Profile, request: SolveRequest) -> Schedule:
    """``framework``: PyTorch's order, first-fit placement (:func:`.solvers.run`)."""
    from memplan.algorithms.graph import solvers

    return solvers.run("framework", profile, request)


def solve_greedy_by_size(profile: Profile, request: SolveRequest) -> Schedule:
    """``greedy-by-size``: PyTorch's order, greedy-by-size placement (:func:`.solvers.run`)."""
    from memplan.algorithms.graph import solvers

    return solvers.run("greedy-by-size", profile, request)


def describe_graph(profile: Profile, static_memory: int, *_loop: Any) -> dict[str, Any]:
    """What ``memplan info`` adds for a graph profile.

    ``store_all_memory`` is the arena of the ``framework`` baseline (PyTorch's order and a
    first-fit allocator): the memory the step needs without any planning. ``graph`` holds the
    node and tensor counts, the persistent bytes, the framework order's peak resident memory and
    a lower bound on any order's (the largest working set of one node: its inputs and outputs,
    plus the persistent tensors). The graph family has no ``min_memory``: the least arena over
    all orders is what ``olla`` searches for.
    """
    from collections import Counter

    from memplan.algorithms.graph.placement import arena_of, first_fit
    from memplan.algorithms.graph.problem import GraphProblem

    problem = GraphProblem.from_profile(profile)
    order = problem.framework_order
    start, end = problem.lifetimes(order)
    arena = arena_of(problem.sizes, first_fit(problem.sizes, start, end))
    peak = problem.peak_resident(order)
    persistent = problem.persistent
    working = [0] * problem.n_nodes
    for i, size in enumerate(problem.sizes.tolist()):
        if persistent[i] or size == 0:
            continue
        working[int(problem.producer[i])] += size
        for c in set(problem.consumers[i]):
            working[c] += size
    inputs = sum(
        int(problem.sizes[i])
        for i in range(len(problem.sizes))
        if problem.kinds[int(problem.producer[i])] == "input"
    )
    kinds = Counter(problem.kinds)
    return {
        "min_memory": {},
        "input_size": inputs,
        "store_all_memory": arena,
        "graph": {
            "nodes": problem.n_nodes,
            "tensors": int((problem.sizes > 0).sum()),
            "control_edges": int((problem.sizes == 0).sum()),
            "kinds": dict(sorted(kinds.items())),
            "persistent_bytes": problem.persistent_bytes,
            "framework_peak_resident": peak,
            "framework_arena": arena,
            "framework_fragmentation": (arena - peak) / arena if arena else 0.0,
            "peak_resident_lower_bound": problem.persistent_bytes + max(working, default=0),
        },
    }


FAMILY = Family(
    name="graph",
    profile_kind="graph",
    options=GraphOptions,
    describe=describe_graph,
    algorithms=(
        AlgorithmInfo(
            name="olla",
            exact=True,
            needs="graph profile; --time-limit",
            summary="OLLA: reorder the nodes (eq. 14), then place the tensors (eq. 15), CP-SAT; "
            "the joint ILP (eq. 9) on small graphs",
            short="CP-SAT: reorder, then place (eq. 14, 15)",
            reference=f"{REFERENCE}, sections 3-4",
            solve=solve_olla,
        ),
        AlgorithmInfo(
            name="olla-order",
            exact=True,
            needs="graph profile; --time-limit",
            summary="OLLA lifetimes only: the order of least peak resident memory (eq. 14); "
            "first-fit placement",
            short="CP-SAT order of least peak (eq. 14)",
            reference=f"{REFERENCE}, sections 3.2, 4.1, 4.3, 4.4",
            solve=solve_olla_order,
        ),
        AlgorithmInfo(
            name="olla-address",
            exact=True,
            needs="graph profile; --time-limit",
            summary="OLLA placement for the framework order: least arena (eq. 15), CP-SAT",
            short="CP-SAT least arena, PyTorch's order",
            reference=f"{REFERENCE}, sections 3.3, 4.2, 4.4, 4.5",
            solve=solve_olla_address,
        ),
        AlgorithmInfo(
            name="framework",
            exact=False,
            needs="graph profile",
            summary="baseline: PyTorch's order, caching-allocator-like first-fit placement",
            short="baseline: PyTorch's order, first fit",
            reference=f"{REFERENCE}, section 5 (the PyTorch baseline)",
            solve=solve_framework,
        ),
        AlgorithmInfo(
            name="greedy-by-size",
            exact=False,
            needs="graph profile",
            summary="baseline: PyTorch's order, TFLite/XLA greedy-by-size offline placement",
            short="baseline: PyTorch's order, greedy by size",
            reference="TFLite's GreedyBySize memory planner; Pisarchyk & Lee 2020",
            solve=solve_greedy_by_size,
        ),
    ),
)
