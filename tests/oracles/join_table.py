"""Python reference of the chain-model join DP's tables, which the compiled core
(src/join_fill.cpp) is tested against value for value and decision for decision
(tests/algorithms/join/test_join_core.py).

:func:`reference_least_memory` is the least-memory DP (the same recurrences with max/min), and
:class:`ReferenceJoinTables` fills ``row``, ``value``, ``branch`` and ``target`` of
memplan's ``HeteroJoin`` (NOTE [ heterogeneous join recurrences ] in
memplan/algorithms/join/hetero.py) in numpy, one state at a time, vectorized over the budgets and
the checkpoints: memplan's implementation before the compiled core.

It reads the join net (its chains' sizes and times, the turn's) and nothing else of memplan's join
code: the states, their ids in the core's layout, the forward needs, the turn's need, rotor's
tables of each branch (the numpy reference, tests/oracles/rotor.py) and the chain's least-memory
plans are computed here.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Literal

import numpy as np

from tests.oracles import rotor

INF = np.inf
_TURN, _NONE = -2, -1
_F_ALL = -1
JoinOp = tuple[str, int | None, int]
"""One operation of a join plan: (operation, branch or None for the turn, stage)."""
_Decision = tuple[Literal["turn"]] | tuple[Literal["F_all"], int] | tuple[Literal["ck"], int, int]
_LeastTask = (
    tuple[Literal["ops"], list[JoinOp]] | tuple[Literal["solve"], tuple[int, ...], tuple[int, ...]]
)


def join_states(shape: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every state ``(p, flags)`` in the core's row order: ``p`` from the last position back
    (sub-states first), flags in binary order; a branch at its input keeps it standalone."""
    k = len(shape)
    found = []
    for p in sorted(itertools.product(*(range(n) for n in shape)), reverse=True):
        for flags in itertools.product((0, 1), repeat=k):
            if all(flags[j] or p[j] > 0 for j in range(k)):
                found.append((p, flags))
    return found


class StateIds:
    """The core's dense ids of the states: the position of ``p`` in C order, times ``2^k``, plus
    bit ``j`` for ``flags[j]``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape, self.k = shape, len(shape)
        self.size = math.prod(shape) << self.k

    def id(self, p: tuple[int, ...], flags: tuple[int, ...]) -> int:
        bits = sum(1 << j for j, f in enumerate(flags) if f)
        return (int(np.ravel_multi_index(p, self.shape)) << self.k) | bits

    def moved(
        self, p: tuple[int, ...], flags: tuple[int, ...], j: int, targets: np.ndarray, flag: int
    ) -> np.ndarray:
        """Ids of ``(p with p[j] = q, flags with flags[j] = flag)`` for each ``q`` of
        ``targets``."""
        return np.array(
            [
                self.id(p[:j] + (int(q),) + p[j + 1 :], flags[:j] + (flag,) + flags[j + 1 :])
                for q in targets
            ],
            dtype=np.int64,
        )


def forward_needs(chain: Any, dtype: Any = np.int64) -> np.ndarray:
    """``[p, q]``: the peak of ``F_ck p, F_n p+1 .. q-1`` on a branch beyond ``x[p]`` (0 for
    ``q <= p``): ``x[p+1] + fo[p]``, and ``x[r] + x[r+1] + fo[r]`` for each later forward."""
    x, fo = [int(v) for v in chain.x], [int(v) for v in chain.fo]
    length = chain.length
    table = np.zeros((length + 1, length + 1), dtype=dtype)
    for p in range(length):
        for q in range(p + 1, length + 1):
            steps = [x[p + 1] + fo[p]] + [x[r] + x[r + 1] + fo[r] for r in range(p + 1, q)]
            table[p, q] = max(steps)
    return table


def turn_need(net: Any) -> int:
    """The turn's peak: its gradient and saved tensor, and the larger of its forward overhead
    and every branch's last gradient with its backward overhead."""
    grads = sum(int(c.g[c.length]) for c in net.chains)
    return int(net.g_turn + net.s_turn + max(net.fo_turn, grads + net.bo_turn))


def exact_int64(net: Any) -> bool:
    """Whether every sum of the net's sizes stays below 2^62."""
    total = sum(
        int(sum(int(v) for v in getattr(c, name)))
        for c in net.chains
        for name in ("x", "s", "g", "fo", "bo")
    )
    return total + int(net.s_turn + net.fo_turn + net.bo_turn + net.g_turn) < 2**62


def least_memory_tables(chain: Any) -> tuple[list[list[int]], list[list[int]]]:
    """``need[a][b]``: the least memory of stages ``a..b`` of a branch beyond ``x[a]`` with
    ``g[b+1]`` held, and the choice reaching it, ``pick[a][b]`` (``-1``: ``F_all a``; ``j``:
    checkpoint ``x[j]``): rotor's recurrences with memory in place of time, ties broken by the
    time (the least, then the first checkpoint). Plain loops, exact integers."""
    L = chain.length
    x, s, g = [int(v) for v in chain.x], [int(v) for v in chain.s], [int(v) for v in chain.g]
    fo, bo = [int(v) for v in chain.fo], [int(v) for v in chain.bo]
    ft, bt = [float(v) for v in chain.ft], [float(v) for v in chain.bt]
    fp = [0.0, *itertools.accumulate(ft)]
    need = [[0] * L for _ in range(L)]
    cost = [[0.0] * L for _ in range(L)]
    pick = [[_F_ALL] * L for _ in range(L)]
    for d in range(L):
        for a in range(L - d):
            b = a + d
            alone = max(g[b + 1] + s[a] + fo[a], g[a + 1] + s[a] + g[a] + bo[a])
            if d == 0:
                need[a][b], cost[a][b] = alone, ft[a] + bt[a]
                continue
            checkpoint: tuple[int, float, int] | None = None  # least peak, then time
            forward = x[a + 1] + fo[a]
            for j in range(a + 1, b + 1):
                if j > a + 1:
                    forward = max(forward, x[j - 1] + x[j] + fo[j - 1])
                peak = max(g[b + 1] + forward, x[j] + need[j][b], need[a][j - 1])
                time = fp[j] - fp[a] + cost[j][b] + cost[a][j - 1]
                if checkpoint is None or (peak, time) < checkpoint[:2]:
                    checkpoint = (peak, time, j)
            assert checkpoint is not None
            best = (max(alone, s[a] + need[a + 1][b]), ft[a] + bt[a] + cost[a + 1][b], _F_ALL)
            if checkpoint[:2] < best[:2]:
                best = checkpoint
            need[a][b], cost[a][b], pick[a][b] = best
    return need, pick


def least_memory_sequence(pick: list[list[int]], first: int, last: int) -> list[tuple[str, int]]:
    """The plan of stages ``first..last`` that :func:`least_memory_tables` chose."""
    if first == last:
        return [("F_all", first), ("B", first)]
    j = pick[first][last]
    if j == _F_ALL:
        return [("F_all", first), *least_memory_sequence(pick, first + 1, last), ("B", first)]
    forwards = [("F_ck", first)] + [("F_n", k) for k in range(first + 1, j)]
    return (
        forwards + least_memory_sequence(pick, j, last) + least_memory_sequence(pick, first, j - 1)
    )


class ReferenceJoinTables:
    """The tables of the join DP on ``net`` (rounded to slots) with ``capacity`` slots."""

    def __init__(self, net: Any, capacity: int) -> None:
        self.net = net
        self.capacity = capacity
        self.k = len(net.chains)
        self.shape = tuple(length + 1 for length in net.lengths)
        width = capacity + 1
        self.tables = [
            rotor.dense_table(c, capacity, c.x, c.s, c.g, c.fo, c.bo)[0] for c in net.chains
        ]
        self.fneeds = [forward_needs(c) for c in net.chains]
        self.ids = StateIds(self.shape)
        states = join_states(self.shape)
        self.row = np.full(self.ids.size, -1, dtype=np.int64)  # dense id -> row of the tables
        for n, (p, flags) in enumerate(states):
            self.row[self.ids.id(p, flags)] = n
        self.value = np.full((len(states), width), INF)
        self.branch = np.full((len(states), width), _NONE, dtype=np.int16)
        self.target = np.zeros((len(states), width), dtype=np.int16)  # q, or 0 for F_all
        for p, flags in states:
            self._fill(p, flags)

    def _index(self, p: tuple[int, ...], flags: tuple[int, ...]) -> int:
        return int(self.row[self.ids.id(p, flags)])

    def _fill(self, p: tuple[int, ...], flags: tuple[int, ...]) -> None:
        net, width = self.net, self.capacity + 1
        gT = net.g_turn
        idx = self._index(p, flags)
        val, br, tg = self.value[idx], self.branch[idx], self.target[idx]
        starts = [int(c.x[p[j]]) * flags[j] for j, c in enumerate(net.chains)]
        held = sum(starts)
        if all(p[j] == net.chains[j].length for j in range(self.k)):
            need = held + turn_need(net)
            if need < width:
                val[need:] = net.t_turn
                br[need:] = _TURN
            return
        grads = [int(c.g[p[j]]) for j, c in enumerate(net.chains)]
        total_g = sum(grads)
        memory = np.arange(width)
        for j, c in enumerate(net.chains):
            a = p[j]
            if a == c.length:
                continue
            others = total_g - grads[j]
            mine = starts[j]
            # (a) F_all a, the rest (branch j starting inside s[a]), B a
            s = int(c.s[a])
            need = max(
                held + gT + s + int(c.fo[a]),
                mine + s + others + int(c.g[a + 1] + c.g[a] + c.bo[a]),
                mine + s,
            )
            if need < width:
                sub = self.value[
                    self._index(p[:j] + (a + 1,) + p[j + 1 :], flags[:j] + (0,) + flags[j + 1 :])
                ]
                shift = mine + s
                cand = np.full(width, INF)
                cand[need:] = sub[need - shift : width - shift] + float(c.ft[a] + c.bt[a])
                better = cand < val
                val[better], br[better], tg[better] = cand[better], j, 0
            # (b) F_ck a, F_n .. up to the checkpoint x[q], q = a+1 .. l_j, every q at once
            seg = mine + others  # held while rotor runs the segment a..q-1
            targets = np.arange(a + 1, c.length + 1)
            needs = np.maximum(np.maximum(held + gT + self.fneeds[j][a, a + 1 :], mine), seg)
            keep = needs < width
            if not keep.any():
                continue
            targets, needs = targets[keep], needs[keep]
            forward = np.cumsum(c.ft[a:])[targets - a - 1]  # sum ft[a..q-1], as a running sum
            rows = self.row[self.ids.moved(p, flags, j, targets, 1)]
            subs = self.value[rows][:, np.clip(memory - mine, 0, width - 1)]
            opts = self.tables[j][a, targets - 1][:, np.clip(memory - seg, 0, width - 1)]
            cand = forward[:, None] + subs + opts
            cand[memory[None, :] < needs[:, None]] = INF
            pick = cand.argmin(axis=0)
            low = cand[pick, memory]
            better = low < val
            val[better], br[better], tg[better] = low[better], j, targets[pick[better]]


def reference_least_memory(net: Any) -> tuple[int, list[JoinOp]]:
    """Least activation bytes of a canonical plan (exact, no slots), and that plan.

    The recurrences of :class:`HeteroJoin` with max/min instead of sum/min, the segments solved
    by the chain's own least-memory plan (one table per branch for all its segments,
    :func:`least_memory_tables`), the checkpoints of one branch compared at once.
    """
    k = len(net.chains)
    shape = tuple(c.length + 1 for c in net.chains)
    dtype = np.int64 if exact_int64(net) else object
    tables = [least_memory_tables(c) for c in net.chains]  # need[a][b] beyond x[a], pick[a][b]
    needs = [np.array(need, dtype=dtype) for need, _ in tables]
    fneeds = [forward_needs(c, dtype) for c in net.chains]
    ids = StateIds(shape)
    need = np.zeros(ids.size, dtype=dtype)
    how: dict[int, _Decision] = {}
    gT = net.g_turn
    for p, flags in join_states(shape):
        here = ids.id(p, flags)
        starts = [int(c.x[p[j]]) * flags[j] for j, c in enumerate(net.chains)]
        held = sum(starts)
        if all(p[j] == net.chains[j].length for j in range(k)):
            need[here], how[here] = held + turn_need(net), ("turn",)
            continue
        grads = [int(c.g[p[j]]) for j, c in enumerate(net.chains)]
        best: tuple[int, _Decision] | None = None
        for j, c in enumerate(net.chains):
            a = p[j]
            if a == c.length:
                continue
            others = sum(grads) - grads[j]
            mine = starts[j]
            s = int(c.s[a])
            nxt = ids.id(p[:j] + (a + 1,) + p[j + 1 :], flags[:j] + (0,) + flags[j + 1 :])
            n_a = max(
                held + gT + s + int(c.fo[a]),
                mine + s + int(need[nxt]),
                mine + s + others + int(c.g[a + 1] + c.g[a] + c.bo[a]),
            )
            if best is None or n_a < best[0]:
                best = (n_a, ("F_all", j))
            targets = np.arange(a + 1, c.length + 1)
            n_b = np.maximum(
                np.maximum(
                    held + gT + fneeds[j][a, a + 1 :],
                    mine + need[ids.moved(p, flags, j, targets, 1)],
                ),
                mine + others + needs[j][a, a : c.length],
            )
            r = int(np.argmin(n_b))
            if best is None or n_b[r] < best[0]:
                best = (int(n_b[r]), ("ck", j, a + 1 + r))
        assert best is not None
        need[here], how[here] = best
    plan: list[JoinOp] = []
    stack: list[_LeastTask] = [("solve", (0,) * k, (1,) * k)]
    while stack:
        item = stack.pop()
        if item[0] == "ops":
            plan += item[1]
            continue
        _, p, flags = item
        decision = how[ids.id(p, flags)]
        if decision[0] == "turn":
            plan.append(("turn", None, 0))
        elif decision[0] == "F_all":
            j = decision[1]
            a = p[j]
            plan.append(("F_all", j, a))
            backward: list[JoinOp] = [("B", j, a)]
            stack.append(("ops", backward))
            stack.append(
                ("solve", p[:j] + (a + 1,) + p[j + 1 :], flags[:j] + (0,) + flags[j + 1 :])
            )
        else:
            _, j, q = decision
            a = p[j]
            plan.append(("F_ck", j, a))
            plan += [("F_n", j, r) for r in range(a + 1, q)]
            segment = least_memory_sequence(tables[j][1], a, q - 1)
            ops: list[JoinOp] = [(op, j, st) for op, st in segment]
            stack.append(("ops", ops))
            stack.append(("solve", p[:j] + (q,) + p[j + 1 :], flags[:j] + (1,) + flags[j + 1 :]))
    return int(need[ids.id((0,) * k, (1,) * k)]), plan
