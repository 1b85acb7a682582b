"""The graph family (papers/002, OLLA): its options and algorithms, declared once.

Cheap to import: the solvers load when first called. Each algorithm's
``solve(profile, request: SolveRequest) -> Schedule`` returns a finished schedule, which
:func:`memplan.solve` replays with the family's simulator (memplan.simulator.graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memplan.algorithms.base import AlgorithmInfo, Family
from memplan.algorithms.options import time_limit_option

DEFAULT_TIME_LIMIT = 60.0
"""Seconds given to each CP-SAT solve when ``--time-limit`` is not set."""


@dataclass(frozen=True)
class GraphOptions:
    """Options of the graph family."""

    time_limit: float = time_limit_option(DEFAULT_TIME_LIMIT)


REFERENCE = "Steiner et al., OLLA (papers/002)"


def _run(which: str):
    def run(profile: Any, request: Any) -> Any:
        from memplan.algorithms.graph import solvers

        return solvers.run(which, profile, request)

    return run


def _describe(profile: Any, static_memory: int) -> dict[str, Any]:
    from memplan.algorithms.graph import describe_graph

    return describe_graph(profile, static_memory)


ALGORITHMS: list[AlgorithmInfo] = [
    AlgorithmInfo(
        name="olla",
        family="graph",
        exact=True,
        needs="graph profile; --time-limit",
        summary="OLLA: reorder the nodes (eq. 14), then place the tensors (eq. 15), CP-SAT; "
        "the joint ILP (eq. 9) on small graphs",
        short="CP-SAT: reorder, then place (eq. 14, 15)",
        reference=f"{REFERENCE}, sections 3-4",
        solve=_run("olla"),
    ),
    AlgorithmInfo(
        name="olla-order",
        family="graph",
        exact=True,
        needs="graph profile; --time-limit",
        summary="OLLA lifetimes only: the order of least peak resident memory (eq. 14); "
        "first-fit placement",
        short="CP-SAT order of least peak (eq. 14)",
        reference=f"{REFERENCE}, sections 3.2, 4.1, 4.3, 4.4",
        solve=_run("olla-order"),
    ),
    AlgorithmInfo(
        name="olla-address",
        family="graph",
        exact=True,
        needs="graph profile; --time-limit",
        summary="OLLA placement for the framework order: least arena (eq. 15), CP-SAT",
        short="CP-SAT least arena, PyTorch's order",
        reference=f"{REFERENCE}, sections 3.3, 4.2, 4.4, 4.5",
        solve=_run("olla-address"),
    ),
    AlgorithmInfo(
        name="framework",
        family="graph",
        exact=False,
        needs="graph profile",
        summary="baseline: PyTorch's order, caching-allocator-like first-fit placement",
        short="baseline: PyTorch's order, first fit",
        reference=f"{REFERENCE}, section 5 (the PyTorch baseline)",
        solve=_run("framework"),
    ),
    AlgorithmInfo(
        name="greedy-by-size",
        family="graph",
        exact=False,
        needs="graph profile",
        summary="baseline: PyTorch's order, TFLite/XLA greedy-by-size offline placement",
        short="baseline: PyTorch's order, greedy by size",
        reference="TFLite's GreedyBySize memory planner; Pisarchyk & Lee 2020",
        solve=_run("greedy-by-size"),
    ),
]

FAMILY = Family(
    name="graph",
    profile_kind="graph",
    options=GraphOptions,
    describe=_describe,
    algorithms=tuple(ALGORITHMS),
)
