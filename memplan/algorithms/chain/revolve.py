"""``revolve``: binomial checkpointing (Griewank & Walther 2000, Algorithm 799), unit steps.

Revolve is optimal for homogeneous chains: with ``c`` checkpoint slots (the chain input x[0] takes
one) it reverses ``l`` steps with the least number of extra forward steps,
``t(l, c) = r*l - C(c+r, c+1)`` where ``r`` is the least integer with ``C(c+r, c) >= l``.
Every stage is treated as one unit step whatever its real cost; the "working" activation from which
a step is reversed (``F_all`` then ``B``) is not a checkpoint slot, as in Griewank's model.

The plan is computed by the recursion ``T(l, c) = min_j j + T(l-j, c-1) + T(j, c)``,
``T(1, c) = 0`` (advance ``j`` steps, store a checkpoint, reverse the right part with one slot less,
then the left part), which reaches the closed form above (checked in the tests).

Mapping to bytes: the slot count is derived from the budget. Every ``c`` from 1 to L is laid out as
a plan, its peak computed with the real sizes, and the fastest plan that fits is returned (so the
result never gets slower when the budget grows).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from memplan.algorithms.base import ChainPlan, Sequence
from memplan.algorithms.chain.problem import ChainInstance, fastest_fitting


def _revolve_table(length: int, checkpoints: int) -> tuple[np.ndarray, np.ndarray]:
    """``cost[l, c]`` extra forwards and ``split[l, c]`` first advance, l <= length, c <= checkpoints."""
    size = max(length, checkpoints)
    size = 1 << max(size - 1, 1).bit_length()  # share one table between nearby sizes
    return _table(size)


@lru_cache(maxsize=4)
def _table(size: int) -> tuple[np.ndarray, np.ndarray]:
    length = checkpoints = size
    inf = np.iinfo(np.int64).max // 4
    cost = np.full((length + 1, checkpoints + 1), inf, dtype=np.int64)
    split = np.zeros((length + 1, checkpoints + 1), dtype=np.int64)
    cost[1, :] = 0
    for c in range(1, checkpoints + 1):
        short = min(c + 1, length)  # l <= c + 1: a slot for every step, advance one at a time
        cost[2 : short + 1, c] = np.arange(1, short)
        split[2 : short + 1, c] = 1
        for l in range(short + 1, length + 1):
            j = np.arange(1, l)
            total = j + cost[l - j, c - 1] + cost[j, c]
            best = int(total.argmin())
            cost[l, c], split[l, c] = total[best], j[best]
    return cost, split


def extra_forwards(length: int, checkpoints: int) -> int:
    """Least number of extra forward steps to reverse ``length`` unit steps with ``checkpoints``."""
    if length < 1 or checkpoints < 1:
        raise ValueError("length and checkpoints must be >= 1")
    return int(_revolve_table(length, checkpoints)[0][length, checkpoints])


def revolve_sequence(length: int, checkpoints: int) -> Sequence:
    """The Revolve plan of a chain of ``length`` stages with ``checkpoints`` slots (x[0] included).

    Forward operations beyond one per stage (the extra forwards) are exactly
    :func:`extra_forwards`.
    """
    if length < 1 or checkpoints < 1:
        raise ValueError("length and checkpoints must be >= 1")
    _, split = _revolve_table(length, checkpoints)
    sequence: Sequence = []
    stack: list[tuple[str, int, int, int]] = [("reverse", 0, length - 1, checkpoints)]
    while stack:
        kind, a, b, c = stack.pop()
        if kind == "B":
            sequence.append(("B", a))
        elif a == b:
            sequence += [("F_all", a), ("B", a)]
        else:
            j = int(split[b - a + 1, c])
            sequence.append(("F_ck", a))
            sequence += [("F_n", k) for k in range(a + 1, a + j)]
            stack.append(("reverse", a, a + j - 1, c))
            stack.append(("reverse", a + j, b, c - 1))
    return sequence


def solve_revolve(chain: ChainInstance, memory: int) -> ChainPlan:
    """Fastest Revolve plan (over the checkpoint slot count) within ``memory`` activation bytes."""
    L = chain.length
    candidates = ((c, revolve_sequence(L, c)) for c in range(1, L + 1))
    plan, slots = fastest_fitting(chain, memory, candidates, "revolve")
    if slots is None:
        plan.message = "no revolve plan fits, even with a single checkpoint slot"
    else:
        plan.slots = slots
        plan.message = f"{slots} checkpoint slots (the input included)"
    return plan
