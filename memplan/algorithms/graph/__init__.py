"""Operator-level training graphs (papers/002, OLLA): reordering and address assignment.

Algorithms (see :mod:`memplan.algorithms.graph.entries` and docs/graph.md): ``olla``,
``olla-order``, ``olla-address`` and the baselines ``framework`` and ``greedy-by-size``.
"""

from __future__ import annotations

from typing import Any


def describe_graph(profile: Any, static_memory: int) -> dict[str, Any]:
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
