"""The rotor dynamic program in bytes: no slots, no rounding, the exact optimum of the model.

NOTE [ rotor in bytes ]
``opt(a, b)(m)`` (NOTE [ rotor recurrences ], rotor.py) is a non-increasing step function of the
budget ``m``. Instead of sampling it at every slot, this DP keeps its steps: the **frontier** of
``(a, b)``, the budgets ``M_0 < M_1 < ...`` (bytes) at which the least makespan drops, with those
makespans ``T_0 > T_1 > ...`` (``opt = T_i`` on ``[M_i, M_{i+1})``, infinite below ``M_0``, the
least memory of the sub-chain; the last step is its store-all need, at its lower bound). Steps
above the budget asked for are dropped.

The recurrences act on frontiers exactly:

* ``F_all a`` shifts the frontier of ``(a+1, b)`` by ``s[a]`` bytes (and raises it to the budget
  that the forward and the backward of stage ``a`` need) and adds ``ft[a] + bt[a]``;
* the checkpoint ``x[j]`` adds two step functions, ``opt(j, b)(m - x[j])`` and ``opt(a, j-1)(m)``:
  their sum can only drop at a step of one of them, so it is evaluated at the steps of both
  (raised to the budget its forward chain needs), plus the forwards ``a..j-1``;
* the minimum over the options is the lower envelope of all those points: sorted by budget, a point
  is a step when its makespan is below every point at a smaller or equal budget.

Every split of a sub-chain is handled in one vectorized pass: the frontiers of the right parts
``(j, b)`` and of the left parts ``(a, j-1)`` are kept concatenated, keyed ``segment * K + budget``,
so that one ``searchsorted`` evaluates every left part at its right part's steps and back.

The cost follows the frontiers' sizes ``P``: O(L^3 P log) time, O(L^2 P) memory. Bundled profiles
(10 to 53 stages) have tens to a few hundred steps per sub-chain and solve in well under a second;
random chains of 100 stages with thousands of distinct sizes reach 1000-2000 steps. The DP takes a
work limit (candidate points) and gives up when it is reached, for the slot grid to take over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memplan.algorithms.base import Sequence
from memplan.algorithms.chain.problem import Chain

_F_ALL = -1


@dataclass
class Frontier:
    """The steps of one sub-chain: budgets (bytes), makespans, and the option taken at each."""

    memory: np.ndarray
    time: np.ndarray
    choice: np.ndarray

    def at(self, budget: int) -> int:
        """Index of the step in force at ``budget`` (-1: infeasible)."""
        return int(np.searchsorted(self.memory, budget, side="right")) - 1


class WorkLimit(Exception):
    """The DP processed more candidate points than it was allowed."""


def exact_frontiers(chain: Chain, budget: int, work_limit: float = np.inf) -> list[list[Frontier]]:
    """Frontiers of every sub-chain, steps above ``budget`` (bytes besides ``x[0]``) dropped.

    ``frontiers[a][b - a]`` is the frontier of ``(a, b)``. Raises :class:`WorkLimit` after
    ``work_limit`` candidate points.
    """
    L = chain.length
    x, s, g, fo = (v.tolist() for v in (chain.x, chain.s, chain.g, chain.fo))
    own = (chain.g[1:] + chain.s + chain.g[:-1] + chain.bo).tolist()
    pair = (chain.x[:-1] + chain.x[1:] + chain.fo).tolist()
    fprefix = np.concatenate(([0.0], np.cumsum(chain.ft)))
    fa_times = chain.ft + chain.bt
    key = budget + 1  # segment * key + budget orders (segment, budget) lexicographically
    if key * (L + 2) >= 2**62:
        raise WorkLimit("budgets too large for int64 keys")
    frontiers: list[list[Frontier]] = [[] for _ in range(L)]
    # Row store of a: frontiers (a, a..b-1) concatenated, keyed c * key + M (c = end stage).
    row_keys: list[np.ndarray] = [np.empty(0, np.int64) for _ in range(L)]
    row_time: list[np.ndarray] = [np.empty(0) for _ in range(L)]
    work = 0.0
    for b in range(L):
        # The work of the columns up to b grows about as b^3 (faster: the frontiers grow too):
        # give up early when the projection to the whole chain is past the limit, as soon as it
        # is well past it, or past it at all once a third of the columns are done.
        projected = work * (L / max(b, 1)) ** 3
        if (b >= 8 and projected > 2 * work_limit) or (3 * b >= L and projected > work_limit):
            raise WorkLimit(f"projected beyond {work_limit:.0f} candidate points")
        # Column store of b: frontiers (j, b), j = b, b-1, .., shifted by x[j], with fprefix[j]
        # added, keyed (L - j) * key + M + x[j].
        col_keys = np.empty(0, np.int64)
        col_time = np.empty(0)
        col_seg = np.empty(0, np.int64)
        for a in range(b, -1, -1):
            need_fa = max(g[b + 1] + s[a] + fo[a], own[a])
            if a == b:
                front = _single(need_fa, fa_times[a], budget)
            else:
                nxt = frontiers[a + 1][b - a - 1]
                parts_m = [np.maximum(nxt.memory + s[a], need_fa)]
                parts_t = [nxt.time + fa_times[a]]
                parts_c = [np.full(len(nxt.memory), _F_ALL, np.int64)]
                # Checkpoint splits j = a+1..b.
                lk, lt = row_keys[a], row_time[a]  # segments c = j - 1 = a..b-1
                l_seg = lk // key
                l_mem = lk - l_seg * key
                r_seg = col_seg  # j
                r_mem = col_keys - (L - r_seg) * key
                # forward need of split j: g[b+1] + max(x[a+1] + fo[a], pair[a+1..j-1])
                steps = np.array([pair[a] - x[a]] + pair[a + 1 : b], dtype=np.int64)
                fwd = np.maximum.accumulate(steps) + g[b + 1]  # index j - a - 1
                # left parts at the right parts' steps, right parts at the left parts' steps
                v1 = _lookup(lk, lt, l_seg, (r_seg - 1) * key + r_mem, r_seg - 1) + col_time
                v2 = _lookup(col_keys, col_time, col_seg, (L - l_seg - 1) * key + l_mem, l_seg + 1)
                v2 += lt
                cand_m = np.concatenate((r_mem, l_mem))
                cand_j = np.concatenate((r_seg, l_seg + 1))
                cand_t = np.concatenate((v1, v2)) - fprefix[a]
                cand_m = np.maximum(cand_m, fwd[cand_j - a - 1])
                parts_m.append(cand_m)
                parts_t.append(cand_t)
                parts_c.append(cand_j)
                front = _envelope(
                    np.concatenate(parts_m),
                    np.concatenate(parts_t),
                    np.concatenate(parts_c),
                    budget,
                )
                work += len(cand_m) + len(nxt.memory)
                if work > work_limit:
                    raise WorkLimit(f"more than {work_limit:.0f} candidate points")
            frontiers[a].append(front)
            if a >= 1 and len(front.memory):
                shifted = front.memory + x[a]
                keep = shifted <= budget
                col_keys = np.concatenate((col_keys, (L - a) * key + shifted[keep]))
                col_time = np.concatenate((col_time, front.time[keep] + fprefix[a]))
                col_seg = np.concatenate((col_seg, np.full(int(keep.sum()), a, np.int64)))
            row_keys[a] = np.concatenate((row_keys[a], b * key + front.memory))
            row_time[a] = np.concatenate((row_time[a], front.time))
    return frontiers


def _lookup(
    keys: np.ndarray, times: np.ndarray, segments: np.ndarray, query: np.ndarray, want: np.ndarray
) -> np.ndarray:
    """Each query's step value in its own segment ``want`` (inf below the segment's first step)."""
    if len(keys) == 0:
        return np.full(len(query), np.inf)
    i = np.searchsorted(keys, query, side="right") - 1
    safe = np.maximum(i, 0)
    return np.where((i >= 0) & (segments[safe] == want), times[safe], np.inf)


def _single(need: int, time: float, budget: int) -> Frontier:
    if need > budget:
        return Frontier(np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64))
    return Frontier(np.array([need], np.int64), np.array([time]), np.array([_F_ALL], np.int64))


def _envelope(memory: np.ndarray, time: np.ndarray, choice: np.ndarray, budget: int) -> Frontier:
    """The steps of the lower envelope of the points ``(memory, time)`` up to ``budget``."""
    keep = (memory <= budget) & np.isfinite(time)
    memory, time, choice = memory[keep], time[keep], choice[keep]
    if len(memory) == 0:
        return Frontier(memory, time, choice)
    order = np.lexsort((choice, time, memory))  # ties: least time, then F_all, then least j
    memory, time, choice = memory[order], time[order], choice[order]
    best_before = np.minimum.accumulate(time)
    step = np.empty(len(time), dtype=bool)
    step[0] = True
    step[1:] = time[1:] < best_before[:-1]
    return Frontier(memory[step], time[step], choice[step])


def exact_backtrack(chain: Chain, frontiers: list[list[Frontier]], budget: int) -> Sequence:
    """The operation sequence of ``opt(0, L-1)(budget)`` from the steps' recorded options."""
    x, s = chain.x.tolist(), chain.s.tolist()
    sequence: Sequence = []
    stack: list[tuple[str, int, int, int]] = [("solve", 0, chain.length - 1, budget)]
    while stack:
        kind, a, b, m = stack.pop()
        if kind == "op":
            sequence.append(("B", a))
            continue
        front = frontiers[a][b - a]
        i = front.at(m)
        if i < 0:  # pragma: no cover - the caller checked feasibility
            raise AssertionError(f"rotor: no plan for stages {a}..{b} within {m} bytes")
        choice = int(front.choice[i])
        if a == b:
            sequence += [("F_all", a), ("B", a)]
        elif choice == _F_ALL:
            sequence.append(("F_all", a))
            stack.append(("op", a, a, 0))
            stack.append(("solve", a + 1, b, m - s[a]))
        else:
            j = choice
            sequence.append(("F_ck", a))
            sequence += [("F_n", k) for k in range(a + 1, j)]
            stack.append(("solve", a, j - 1, m))
            stack.append(("solve", j, b, m - x[j]))
    return sequence
