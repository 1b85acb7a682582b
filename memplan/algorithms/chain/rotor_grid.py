"""The rotor dynamic program on a slot grid, computing only what the requested budget can reach.

The recurrences are those of NOTE [ rotor recurrences ] (rotor.py), on sizes rounded up to slots
(:func:`memplan.algorithms.chain.rotor.slot_sizes`). Three things keep it fast and small:

* **Reachable slots only.** From the top problem ``(0, L-1, C)``, a sub-chain ``(a, b)`` is only
  ever asked about budgets up to ``reach[a, b]``: a left part ``(a, j-1)`` inherits its parent's
  budget, a right part ``(j, b)`` the parent's minus ``x[j]``, the rest after ``F_all a`` the
  parent's minus ``s[a]``. :func:`reachable_budgets` propagates these maxima in O(L^2); the table
  of ``(a, b)`` is computed from the sub-chain's least memory (a lower bound of it, ``lo``) to the
  smaller of its reach and its store-all need (above which the value is its lower bound).
* **Splits that cannot win are skipped.** Checkpointing ``x[j]`` costs at least the forwards
  ``a..j-1`` once more on top of the sub-chain's lower bound ``LB(a, b)`` (every forward and
  backward once). Where that exceeds a plan already known at the same budget (``F_all a`` or the
  checkpoint ``x[a+1]``, evaluated first), the split is left out; the forward times growing with
  ``j``, so does the cost, and the splits kept at a budget are a prefix ``j <= J(m)``.
* **No decision table.** Only the values are kept, on the triangle ``a <= b`` (``L (L+1) / 2``
  rows of ``C + 1`` float64). The plan is rebuilt by re-evaluating the options of the O(L)
  sub-problems it visits, with the same floating-point operations as the table, so the decision
  found is one the table took (or ties with it).

O(L^3 S) time in the worst case, O(L^2 S) memory (8 bytes per value: 500 stages and 500 slots take
0.5 GB).

rotor_kernel.py compiles the same DP (with the ``fast`` extra; rotor.py uses it when it loads):
any change to the operations here must be made there too, in the same order, as
tests/algorithms/chain/test_rotor_native.py checks value for value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memplan.algorithms.base import Sequence
from memplan.algorithms.chain.problem import Chain

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
    chain: Chain,
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
    chain: Chain,
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
