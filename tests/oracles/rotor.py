"""Python references of rotor's three tables, which the compiled core (src/rotor_*.cpp) is tested
against value for value and plan for plan (tests/algorithms/chain/test_rotor_core.py).

* :func:`dense_table`: ``opt[a, b, m]`` and ``choice[a, b, m]`` for every sub-chain and budget
  (numpy, vectorized over the budgets and the split points), what pofo and join read;
* :func:`grid_table` / :func:`grid_backtrack`: the slot grid restricted to the budgets the top
  problem asks (:func:`reachable_ranges`), and the plan re-decided from the values;
* :func:`exact_frontiers` / :func:`exact_backtrack`: the DP in bytes on step functions
  (NOTE [ rotor in bytes ], memplan/algorithms/chain/rotor.py).

These were memplan's numpy implementations before the compiled core; the recurrences are those of
NOTE [ rotor recurrences ] (memplan/algorithms/chain/rotor.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memplan.algorithms.base import Sequence
from memplan.algorithms.chain.problem import ChainInstance

_F_ALL = -1  # choice code: start with F_all; j >= 1: start with F_ck and checkpoint x[j]
_NONE = -2


def _pair_needs(x: np.ndarray, fo: np.ndarray) -> np.ndarray:
    """``x[k] + x[k+1] + fo[k]``: memory of ``F_n k`` besides the held gradient."""
    return x[:-1] + x[1:] + fo


def dense_table(
    chain: ChainInstance,
    capacity: int,
    x: np.ndarray,
    s: np.ndarray,
    g: np.ndarray,
    fo: np.ndarray,
    bo: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Fill ``opt[a, b, m]`` and ``choice[a, b, m]`` for m = 0..capacity (NOTE [ rotor recurrences ]).

    Only the slots between a lower bound of the sub-chain's least memory (``lo``: its own backward
    peaks and the forward of its last stage) and its store-all need (``hi``, above which the value is
    the sub-chain's lower bound, reached by F_all everywhere) are computed by the recurrence.
    """
    L = chain.length
    width = capacity + 1
    inf = np.inf
    opt = np.full((L, L, width), inf)
    choice = np.full((L, L, width), _NONE, dtype=np.int16 if L < 32000 else np.int32)
    mem = np.arange(width)
    fprefix = np.concatenate(([0.0], np.cumsum(chain.ft)))
    tprefix = np.concatenate(([0.0], np.cumsum(chain.ft + chain.bt)))
    pair = _pair_needs(x, fo)
    own_backward = g[1:] + s + g[:-1] + bo  # B a: g[a+1] + s[a] + g[a] + bo[a]
    hi = np.zeros((L, L), dtype=np.int64)  # store-all need of the sub-chain a..b
    shifted = np.full((L + 1, width), inf)  # [j, m]: opt[j][b][m - x[j]] + fprefix[j], current b
    buf = np.empty((L, width))
    for b in range(L):
        shifted.fill(inf)
        backward_floor = 0
        for a in range(b, -1, -1):
            backward_floor = max(backward_floor, int(own_backward[a]))
            need_fa = max(int(g[b + 1] + s[a] + fo[a]), int(own_backward[a]))
            hi[a, b] = need_fa if a == b else max(need_fa, int(s[a]) + hi[a + 1, b])
            lo = max(backward_floor, int(g[b + 1] + s[b] + fo[b]))
            top = min(int(hi[a, b]), width)
            if top < width:  # store-all of the sub-chain fits: its lower bound is optimal
                opt[a, b, top:] = tprefix[b + 1] - tprefix[a]
                choice[a, b, top:] = _F_ALL
            if a < b and lo < top:
                cols = slice(lo, top)
                # Option 1: F_all a, then a+1..b with m - s[a] slots.
                fa = np.full(top - lo, inf)
                first = max(lo, int(s[a]), need_fa)
                if first < top:
                    fa[first - lo :] = opt[a + 1, b, first - s[a] : top - s[a]]
                fa += chain.ft[a] + chain.bt[a]
                # Option 2: checkpoint x[j], j = a+1..b (rows r = j - a - 1). ``shifted`` already
                # holds + fprefix[j]; - fprefix[a] is added to the row minimum only.
                n = b - a
                cand = buf[:n, : top - lo]
                np.add(shifted[a + 1 : b + 1, cols], opt[a, a:b, cols], out=cand)
                fwd_need = g[b + 1] + np.maximum.accumulate(
                    np.concatenate(([x[a + 1] + fo[a]], pair[a + 1 : b]))
                )
                # fwd_need grows with j: only the rows from the first one above ``lo`` need a mask.
                first_masked = int(np.searchsorted(fwd_need, lo, side="right"))
                if first_masked < n:
                    np.putmask(
                        cand[first_masked:],
                        mem[None, cols] < fwd_need[first_masked:, None],
                        inf,
                    )
                best_row = cand.argmin(axis=0)
                best = cand[best_row, np.arange(top - lo)] - fprefix[a]
                take_fa = fa <= best
                opt[a, b, cols] = np.where(take_fa, fa, best)
                choice[a, b, cols] = np.where(
                    take_fa,
                    np.where(np.isfinite(fa), _F_ALL, _NONE),
                    np.where(np.isfinite(best), best_row + a + 1, _NONE),
                )
            if a >= 1 and x[a] < width:
                shifted[a, x[a] :] = opt[a, b, : width - x[a]] + fprefix[a]
    return opt, choice


_REACH_CELLS = 5_000_000
"""Below about this many L^3 S, the table covers every budget of every sub-chain: propagating the
reachable budgets would cost more than the cells it saves."""


def sub_chain_bounds(
    length: int, x: np.ndarray, s: np.ndarray, g: np.ndarray, fo: np.ndarray, bo: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``lo[a, b]``, a lower bound of the least memory of ``(a, b)`` (below it the value is
    infinite: its own backward peaks and the forward of its last stage), and ``hi[a, b]``, its
    store-all need (from which its value is its lower bound, every forward and backward once)."""
    xl, sl, gl, fol = x.tolist(), s.tolist(), g.tolist(), fo.tolist()
    own = (g[1:] + s + g[:-1] + bo).tolist()
    lo = np.zeros((length, length), dtype=np.int64)
    hi = np.zeros((length, length), dtype=np.int64)
    for b in range(length):
        floor = 0
        last = gl[b + 1] + sl[b] + fol[b]
        above = 0
        for a in range(b, -1, -1):
            floor = max(floor, own[a])
            need_fa = max(gl[b + 1] + sl[a] + fol[a], own[a])
            above = need_fa if a == b else max(need_fa, sl[a] + above)
            lo[a, b] = max(floor, last)
            hi[a, b] = above
    del xl
    return lo, hi


def reachable_ranges(
    length: int,
    capacity: int,
    x: np.ndarray,
    s: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    asked_from: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``first[a, b]``, ``last[a, b]``: the least and largest budgets (slots) within ``[lo, hi)``
    with which the top problem ``(0, L-1)`` at the budgets ``asked_from..capacity`` (default: at
    ``capacity`` only) asks for ``(a, b)``; ``first > last`` if none.

    Only a budget in ``[lo, hi)`` makes a sub-chain ask its parts (below it is infeasible, above
    its store-all plan is optimal). ``(a, b)`` is asked by ``(a, b')``, ``b' > b``, with the same
    budget (the part before the checkpoint ``x[b + 1]``), by ``(a', b)``, ``a' < a``, with ``x[a]``
    less (the part after the checkpoint ``x[a]``) and by ``(a - 1, b)`` with ``s[a - 1]`` less
    (after ``F_all a - 1``). The sets are propagated exactly, as boolean rows over the budgets, row
    ``a`` by row: with ``base[b]`` the budgets asked by the rows above and ``W[b] = [lo, hi)``,
    ``(a, b)`` asks with ``(base[b] | union over b' > b of base[b'] & W[b']) & W[b]`` (an induction
    on ``b`` from ``L - 1`` down shows that the inherited part needs no deeper nesting). O(L^2 S)
    boolean operations, O(L S) memory.
    """
    width = capacity + 1
    budgets = np.arange(width)
    first = np.full((length, length), width, dtype=np.int64)
    last = np.full((length, length), -1, dtype=np.int64)
    asking_before = np.zeros((length, width), dtype=bool)  # union over a' < a, per b
    asking = np.zeros((length, width), dtype=bool)  # row a - 1, then row a (b >= a only)
    for a in range(length):
        base = np.zeros((length - a, width), dtype=bool)  # b = a .. L-1
        if a == 0:
            base[length - 1, capacity if asked_from is None else asked_from : capacity + 1] = True
        else:
            xa, sa = int(x[a]), int(s[a - 1])
            if xa < width:
                base[:, : width - xa] = asking_before[a:, xa:]
            if sa < width:
                base[:, : width - sa] |= asking[1:, sa:]
        window = (budgets[None, :] >= lo[a, a:, None]) & (budgets[None, :] < hi[a, a:, None])
        direct = base & window
        inherited = np.zeros_like(direct)
        inherited[:-1] = np.logical_or.accumulate(direct[::-1], axis=0)[::-1][1:]
        asking = (base | inherited) & window
        any_asked = asking.any(axis=1)
        first[a, a:] = np.where(any_asked, asking.argmax(axis=1), width)
        last[a, a:] = np.where(any_asked, width - 1 - asking[:, ::-1].argmax(axis=1), -1)
        asking_before[a:] |= asking
    return first, last


@dataclass
class GridTable:
    """``opt(a, b)(m)`` for ``a <= b``: row ``offset[a] + b - a`` of ``values``."""

    values: np.ndarray
    offset: np.ndarray
    fprefix: np.ndarray
    tprefix: np.ndarray
    hi: np.ndarray
    """``hi[a, b]``: the store-all need of ``(a, b)``, from which its value is its lower bound."""

    def row(self, a: int, b: int) -> np.ndarray:
        return self.values[int(self.offset[a]) + b - a]


def grid_table(
    chain: ChainInstance,
    capacity: int,
    x: np.ndarray,
    s: np.ndarray,
    g: np.ndarray,
    fo: np.ndarray,
    bo: np.ndarray,
    *,
    dtype: type = np.float64,
    asked_from: int | None = None,
) -> GridTable:
    """Fill ``opt(a, b)(m)`` for the budgets the top problem ``(0, L-1, capacity)`` can reach
    (at every top budget from ``asked_from`` to ``capacity`` when given).

    Values at budgets nobody asks for are left infinite, or hold a value no better than the true
    one (an upper bound): the table is exact where it is read.
    """
    L = chain.length
    width = capacity + 1
    inf = np.inf
    offset = np.concatenate(([0], np.cumsum(np.arange(L, 0, -1))))[:L].astype(np.int64)
    values = np.full((L * (L + 1) // 2, width), inf, dtype=dtype)
    fprefix = np.concatenate(([0.0], np.cumsum(chain.ft))).astype(dtype)
    tprefix = np.concatenate(([0.0], np.cumsum(chain.ft + chain.bt)))
    lo, hi = sub_chain_bounds(L, x, s, g, fo, bo)
    if L**3 * width < _REACH_CELLS:  # small table: every budget, cheaper than finding the few
        first_asked, last_asked = lo, np.minimum(hi, width) - 1
    else:
        first_asked, last_asked = reachable_ranges(L, capacity, x, s, lo, hi, asked_from)
    first_list, last_list, hi_list = first_asked.tolist(), last_asked.tolist(), hi.tolist()
    x_list, s_list, g_list, fo_list = x.tolist(), s.tolist(), g.tolist(), fo.tolist()
    own_backward = (g[1:] + s + g[:-1] + bo).tolist()
    offsets = offset.tolist()
    fa_times = (chain.ft + chain.bt).astype(dtype)
    # forward[a, r]: memory of F_ck a, F_n a+1 .. F_n a+r besides the held gradient (split a+1+r)
    pair = x[:-1] + x[1:] + fo
    forward = np.zeros((L, L), dtype=np.int64)
    for a in range(L - 1):
        steps = np.concatenate(([pair[a] - x[a]], pair[a + 1 : L - 1]))
        forward[a, : L - 1 - a] = np.maximum.accumulate(steps)
    shifted = np.full((L + 1, width), inf, dtype=dtype)  # opt(j, b)(m - x[j]) + fprefix[j]
    buf = np.empty(L * width, dtype=dtype)
    budgets = np.arange(width)
    for b in range(L):
        shifted.fill(inf)
        grad = g_list[b + 1]
        for a in range(b, -1, -1):
            row = values[offsets[a] + b - a]
            top = min(hi_list[a][b], width)
            if top < width:  # store-all of the sub-chain fits: its lower bound is optimal
                row[top:] = tprefix[b + 1] - tprefix[a]
            start, end = first_list[a][b], last_list[a][b] + 1
            if a < b and start < end:
                w = end - start
                out = row[start:end]
                # Option 1: F_all a, then a+1..b with m - s[a] slots.
                s_a = s_list[a]
                fa_from = max(start, s_a, grad + s_a + fo_list[a], own_backward[a])
                if fa_from < end:
                    np.add(
                        values[offsets[a + 1] + b - a - 1, fa_from - s_a : end - s_a],
                        fa_times[a],
                        out=out[fa_from - start :],
                    )
                # Option 2: checkpoint x[j], j = a+1..b (row r = j - a - 1): ``shifted`` holds
                # the j..b part plus fprefix[j], rows offset[a] + r of ``values`` the a..j-1
                # part; - fprefix[a] comes after the minimum.
                n = b - a
                cand = buf[: n * w].reshape(n, w)
                np.add(
                    shifted[a + 1 : b + 1, start:end],
                    values[offsets[a] : offsets[a] + n, start:end],
                    out=cand,
                )
                fwd = forward[a, :n] + grad
                masked = int(np.searchsorted(fwd, start, side="right"))
                if masked < n:  # splits whose forward does not fit the lowest budgets
                    np.putmask(cand[masked:], budgets[None, start:end] < fwd[masked:, None], inf)
                found = cand.min(axis=0)
                found -= fprefix[a]
                np.minimum(out, found, out=out)
            if a >= 1 and x_list[a] < width:
                np.add(row[: width - x_list[a]], fprefix[a], out=shifted[a, x_list[a] :])
    return GridTable(values, offset, fprefix, tprefix, hi)


def grid_backtrack(
    chain: ChainInstance,
    table: GridTable,
    x: np.ndarray,
    s: np.ndarray,
    g: np.ndarray,
    fo: np.ndarray,
    bo: np.ndarray,
    budget: int,
) -> Sequence:
    """The operation sequence of ``opt(0, L-1)(budget)``, re-deciding each visited sub-problem.

    At ``(a, b, m)`` the options are evaluated at ``m`` exactly as :func:`grid_table` did (same
    operations in the same order, in the table's precision); the first one reaching the stored
    value is taken (``F_all a`` first, then the smallest ``j``, the table's own tie-breaking).
    Iterative: no recursion limit.
    """
    values, offset, fprefix = table.values, table.offset, table.fprefix
    dtype = values.dtype.type
    L = chain.length
    x_list, s_list, g_list, fo_list = x.tolist(), s.tolist(), g.tolist(), fo.tolist()
    own_backward = (g[1:] + s + g[:-1] + bo).tolist()
    pair = x[:-1] + x[1:] + fo
    fa_times = (chain.ft + chain.bt).astype(dtype)
    hi = table.hi
    sequence: Sequence = []
    stack: list[tuple[str, int, int, int]] = [("solve", 0, L - 1, budget)]
    while stack:
        kind, a, b, m = stack.pop()
        if kind == "op":
            sequence.append(("B", a))
            continue
        if a == b:
            sequence += [("F_all", a), ("B", a)]
            continue
        if m >= hi[a, b]:  # the sub-chain's store-all fits: F_all throughout
            sequence += [("F_all", k) for k in range(a, b + 1)]
            sequence += [("B", k) for k in range(b, a - 1, -1)]
            continue
        target = values[int(offset[a]) + b - a, m]
        need_fa = max(g_list[b + 1] + s_list[a] + fo_list[a], own_backward[a])
        if m >= need_fa and m >= s_list[a]:
            fa = values[int(offset[a + 1]) + b - a - 1, m - s_list[a]] + fa_times[a]
            if fa == target:
                sequence.append(("F_all", a))
                stack.append(("op", a, a, 0))
                stack.append(("solve", a + 1, b, m - s_list[a]))
                continue
        j = np.arange(a + 1, b + 1)
        fwd = np.maximum.accumulate(np.concatenate(([pair[a] - x[a]], pair[a + 1 : b]))) + g[b + 1]
        right_budget = m - x[j]
        usable = (fwd <= m) & (right_budget >= 0)
        rows = offset[j] + b - j
        right = values[rows, np.maximum(right_budget, 0)] + fprefix[j]
        option = right + values[int(offset[a]) + j - 1 - a, m] - fprefix[a]
        hits = np.flatnonzero(usable & (option == target))
        if len(hits) == 0:  # pragma: no cover - the table holds one of the options' values
            raise AssertionError(f"rotor: no option reaches opt({a}, {b})({m}) = {target}")
        split = a + 1 + int(hits[0])
        sequence.append(("F_ck", a))
        sequence += [("F_n", k) for k in range(a + 1, split)]
        stack.append(("solve", a, split - 1, m))
        stack.append(("solve", split, b, m - x_list[split]))
    return sequence


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


def exact_frontiers(
    chain: ChainInstance, budget: int, work_limit: float = np.inf
) -> list[list[Frontier]]:
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
            # F_all a under each of its options (option 0: s, fo, bo, bt)
            fall = [(s[a], max(g[b + 1] + s[a] + fo[a], own[a]), fa_times[a], _F_ALL)]
            for o in range(1, chain.option_count(a)):
                so, foo, boo, bto = chain.option_sizes(a, o)
                need = max(g[b + 1] + so + foo, g[a + 1] + so + g[a] + boo)
                fall.append((so, need, chain.ft[a] + bto, _fall_choice(o)))
            if a == b and len(fall) == 1:
                front = _single(fall[0][1], fall[0][2], budget)
            elif a == b:
                front = _envelope(
                    np.array([f[1] for f in fall], np.int64),
                    np.array([f[2] for f in fall]),
                    np.array([f[3] for f in fall], np.int64),
                    budget,
                )
            else:
                nxt = frontiers[a + 1][b - a - 1]
                parts_m = [np.maximum(nxt.memory + so, need) for so, need, _, _ in fall]
                parts_t = [nxt.time + time for _, _, time, _ in fall]
                parts_c = [np.full(len(nxt.memory), code, np.int64) for *_, code in fall]
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
                work += len(cand_m) + len(nxt.memory) * len(fall)
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
    # ties: least time, then F_all under option 0, then its other options, then least j
    rank = np.where(choice == _F_ALL, np.iinfo(np.int64).min, choice)
    order = np.lexsort((rank, time, memory))
    memory, time, choice = memory[order], time[order], choice[order]
    best_before = np.minimum.accumulate(time)
    step = np.empty(len(time), dtype=bool)
    step[0] = True
    step[1:] = time[1:] < best_before[:-1]
    return Frontier(memory[step], time[step], choice[step])


def _fall_choice(option: int) -> int:
    """The choice code of ``F_all`` under ``option`` (as the core's: -1, then -3, -4, ...)."""
    return _F_ALL if option == 0 else -2 - option


def exact_backtrack(
    chain: ChainInstance,
    frontiers: list[list[Frontier]],
    budget: int,
    options: dict[int, int] | None = None,
) -> Sequence:
    """The operation sequence of ``opt(0, L-1)(budget)`` from the steps' recorded options;
    ``options`` (when given) receives the nonzero option of each stage's ``F_all``."""
    x = chain.x.tolist()
    options = {} if options is None else options
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
        option = 0 if choice == _F_ALL else -2 - choice
        if choice < 0 and option:
            options[a] = option
        if a == b:
            sequence += [("F_all", a), ("B", a)]
        elif choice < 0:
            sequence.append(("F_all", a))
            stack.append(("op", a, a, 0))
            stack.append(("solve", a + 1, b, m - chain.option_sizes(a, option)[0]))
        else:
            j = choice
            sequence.append(("F_ck", a))
            sequence += [("F_n", k) for k in range(a + 1, j)]
            stack.append(("solve", a, j - 1, m))
            stack.append(("solve", j, b, m - x[j]))
    return sequence
