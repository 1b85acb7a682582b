"""``store-all``: every forward saves everything its backward needs; no recomputation.

It needs the most memory of all chain plans and is the fastest: its makespan is the lower bound
(every forward and backward once). It tells the peak it needs when the budget is too small.
"""

from __future__ import annotations

from memplan.algorithms.base import ChainPlan
from memplan.algorithms.chain.problem import ChainInstance


def solve_store_all(chain: ChainInstance, memory: int) -> ChainPlan:
    """Plan store-all within ``memory`` activation bytes (x[0] included, static memory excluded)."""
    peak = chain.store_all_peak()
    if peak > memory:
        return ChainPlan(
            sequence=None,
            status="infeasible",
            min_memory=peak,
            message="store-all keeps every activation: it needs more memory",
        )
    sequence = chain.store_all_sequence()
    return ChainPlan(
        sequence=sequence,
        status="optimal",
        claimed_makespan=chain.makespan(sequence),
        min_memory=peak,
    )
