"""Python reference of the chain-model join DP's tables, which the compiled core
(src/join_fill.cpp) is tested against value for value and decision for decision
(tests/algorithms/join/test_join_core.py).

:func:`reference_least_memory` is the least-memory DP (the same recurrences with max/min), and
:class:`ReferenceJoinTables` fills ``row``, ``value``, ``branch`` and ``target`` of a
:class:`~memplan.algorithms.join.hetero.HeteroJoin` (NOTE [ heterogeneous join recurrences ] in
memplan/algorithms/join/hetero.py) in numpy, one state at a time, vectorized over the budgets and
the checkpoints: memplan's implementation before the compiled core.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from memplan.algorithms.chain import rotor
from memplan.algorithms.chain.least_memory import least_memory_sequence, least_memory_tables
from memplan.algorithms.join.hetero import JoinNet, StateIndex, join_states
from memplan.algorithms.join.pebble import JoinOp

INF = np.inf
_TURN, _NONE = -2, -1
_Decision = tuple[Literal["turn"]] | tuple[Literal["F_all"], int] | tuple[Literal["ck"], int, int]
_LeastTask = (
    tuple[Literal["ops"], list[JoinOp]] | tuple[Literal["solve"], tuple[int, ...], tuple[int, ...]]
)


class ReferenceJoinTables:
    """The tables of the join DP on ``net`` (rounded to slots) with ``capacity`` slots."""

    def __init__(self, net: JoinNet, capacity: int) -> None:
        self.net = net
        self.capacity = capacity
        self.k = len(net.chains)
        self.shape = tuple(length + 1 for length in net.lengths)
        width = capacity + 1
        self.tables = [
            rotor.dense_table(c, capacity, c.x, c.s, c.g, c.fo, c.bo) for c in net.chains
        ]
        self.fneeds = [net.forward_needs(j) for j in range(self.k)]
        self.ids = StateIndex(self.shape)
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
            need = held + net.turn_need()
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
            opts = self.tables[j].opt[a, targets - 1][:, np.clip(memory - seg, 0, width - 1)]
            cand = forward[:, None] + subs + opts
            cand[memory[None, :] < needs[:, None]] = INF
            pick = cand.argmin(axis=0)
            low = cand[pick, memory]
            better = low < val
            val[better], br[better], tg[better] = low[better], j, targets[pick[better]]


def reference_least_memory(net: JoinNet) -> tuple[int, list[JoinOp]]:
    """Least activation bytes of a canonical plan (exact, no slots), and that plan.

    The recurrences of :class:`HeteroJoin` with max/min instead of sum/min, the segments solved
    by the chain's own least-memory plan (one table per branch for all its segments,
    :func:`least_memory_tables`), the checkpoints of one branch compared at once.
    """
    k = len(net.chains)
    shape = tuple(c.length + 1 for c in net.chains)
    dtype = np.int64 if net.exact_int64() else object
    tables = [least_memory_tables(c) for c in net.chains]  # need[a, b] beyond x[a], pick[a, b]
    fneeds = [net.forward_needs(j, dtype) for j in range(k)]
    ids = StateIndex(shape)
    need = np.zeros(ids.size, dtype=dtype)
    how: dict[int, _Decision] = {}
    gT = net.g_turn
    for p, flags in join_states(shape):
        here = ids.id(p, flags)
        starts = [int(c.x[p[j]]) * flags[j] for j, c in enumerate(net.chains)]
        held = sum(starts)
        if all(p[j] == net.chains[j].length for j in range(k)):
            need[here], how[here] = held + net.turn_need(), ("turn",)
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
                mine + others + tables[j][0][a, a : c.length],
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
