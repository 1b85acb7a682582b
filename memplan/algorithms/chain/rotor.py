"""``rotor``: optimal checkpointing of heterogeneous chains by dynamic programming.

Beaumont, Herrmann, Pallez, Shilova (2019), *Optimal checkpointing for heterogeneous chains: how to
train deep neural networks with limited memory*, the persistent dynamic program, in the memory model
of docs/model.md (the operations F_all / F_ck / F_n / B of Table 1 of papers/000, without offloading).

Complexity: O(L^3 S) time and O(L^2 S) memory for L stages and S slots, vectorized over the slots
and the split point with numpy (one numpy expression per sub-chain).

NOTE [ rotor recurrences ]
``opt[a][b][m]`` is the least time to run the backward of stages a..b (0-based, inclusive) when
``x[a]`` is in memory (counted by the caller), the gradient ``g[b+1]`` is held (counted here) and at
most ``m`` slots may be used besides ``x[a]``. Two ways to start:

* ``F_all a``, then stages a+1..b with ``m - s[a]`` slots, then ``B a``::

      opt = ft[a] + opt[a+1][b][m - s[a]] + bt[a]
      if m >= g[b+1] + s[a] + fo[a]            # the forward runs while g[b+1] is held (pitfall 1)
     and m >= g[a+1] + s[a] + g[a] + bo[a]     # the backward of stage a

* ``F_ck a, F_n a+1, ..., F_n j-1`` keeps the checkpoint ``x[j]`` (a < j <= b), then stages j..b
  with ``m - x[j]`` slots, then stages a..j-1 with ``m`` slots (now holding ``g[j]``)::

      opt = sum(ft[a..j-1]) + opt[j][b][m - x[j]] + opt[a][j-1][m]
      if m >= g[b+1] + max(x[a+1] + fo[a], max_{a<k<j} x[k] + x[k+1] + fo[k])

A single stage runs ``F_all a, B a``. The backward of every stage needs its input ``x[a]``, the loss
included (pitfall 2: the loss keeps its input alive).

NOTE [ rotor guarantees ]
Sizes are rounded up to slots (docs/model.md), so the DP's plan fits in bytes but may be slower than
the optimum in bytes by the rounding. Two exact plans complete it: store-all when it fits (its
makespan is the lower bound, so it is optimal) and the least-memory plan (:func:`chain_min_memory`,
exact in bytes) when the rounded DP finds nothing. The result is the fastest of the three, so rotor
is feasible exactly when some plan exists, and, each of the three being non-increasing in the budget,
so is rotor's makespan.
"""

from __future__ import annotations

import numpy as np

from memplan.algorithms.base import ChainPlan, Sequence
from memplan.algorithms.chain.problem import Chain
from memplan.errors import InputError

_F_ALL = -1  # choice code: start with F_all; j >= 1: start with F_ck and checkpoint x[j]
_NONE = -2
TABLE_LIMIT = 4 * 10**9
"""Bytes the DP tables may take (L^2 (S+1) values of 8 + 2 bytes); beyond, --slots is refused."""


def slot_sizes(chain: Chain, budget: int, slots: int) -> tuple[int, dict[str, np.ndarray]]:
    """Round every size up to whole slots of ``max(1, budget / slots)`` bytes.

    Returns the budget in slots and the rounded arrays ``x, s, g, fo, bo``.
    """
    if budget <= slots:
        unit_num, unit_den, capacity = 1, 1, budget
    else:
        unit_num, unit_den, capacity = budget, slots, slots

    def up(values: np.ndarray) -> np.ndarray:
        # ceil(v / (unit_num / unit_den)) in exact integer arithmetic (Python ints: no overflow)
        return np.array([-(-int(v) * unit_den // unit_num) for v in values], dtype=np.int64)

    rounded = {name: up(getattr(chain, name)) for name in ("x", "s", "g", "fo", "bo")}
    return capacity, rounded


def _pair_needs(x: np.ndarray, fo: np.ndarray) -> np.ndarray:
    """``x[k] + x[k+1] + fo[k]``: memory of ``F_n k`` besides the held gradient."""
    return x[:-1] + x[1:] + fo


def _solve_table(
    chain: Chain,
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


def _backtrack(chain: Chain, choice: np.ndarray, x: np.ndarray, s: np.ndarray, m: int) -> Sequence:
    """Rebuild the operation sequence of ``opt[0][L-1][m]`` (iteratively: no recursion limit)."""
    sequence: Sequence = []
    stack: list[tuple[str, int, int, int]] = [("solve", 0, chain.length - 1, m)]
    while stack:
        kind, a, b, budget = stack.pop()
        if kind == "op":
            sequence.append(("B", a))
            continue
        if a == b:
            sequence += [("F_all", a), ("B", a)]
            continue
        c = int(choice[a, b, budget])
        if c == _F_ALL:
            sequence.append(("F_all", a))
            stack.append(("op", a, a, 0))
            stack.append(("solve", a + 1, b, budget - int(s[a])))
        elif c >= 1:
            j = c
            sequence.append(("F_ck", a))
            sequence += [("F_n", k) for k in range(a + 1, j)]
            stack.append(("solve", a, j - 1, budget))
            stack.append(("solve", j, b, budget - int(x[j])))
        else:  # pragma: no cover - the caller checked feasibility
            raise AssertionError(f"rotor: no choice recorded for stages {a}..{b} at {budget} slots")
    return sequence


def chain_min_memory(chain: Chain) -> int:
    """The least activation memory (bytes, x[0] included) with which any plan exists."""
    return _min_memory_plan(chain)[0]


def _min_memory_plan(chain: Chain) -> tuple[int, Sequence]:
    """Exact least-memory plan in bytes (ties broken by time), by the same recurrences as rotor.

    ``need[a][b]`` is the least memory (beyond x[a]) to run stages a..b with g[b+1] held.
    """
    L = chain.length
    x, s, g, fo, bo = chain.x, chain.s, chain.g, chain.fo, chain.bo
    pair = _pair_needs(x, fo)
    own_backward = g[1:] + s + g[:-1] + bo
    fprefix = np.concatenate(([0.0], np.cumsum(chain.ft)))
    need = np.zeros((L, L), dtype=np.int64)
    cost = np.zeros((L, L))
    pick = np.full((L, L), _F_ALL, dtype=np.int64)
    # Sub-chains of equal length d = b - a are independent: solve one diagonal at a time.
    for d in range(L):
        a = np.arange(L - d)
        b = a + d
        need_fa = np.maximum(g[b + 1] + s[a] + fo[a], own_backward[a])
        if d == 0:
            need[a, b], cost[a, b] = need_fa, chain.ft[a] + chain.bt[a]
            continue
        fa_need = np.maximum(need_fa, s[a] + need[a + 1, b])
        fa_cost = chain.ft[a] + chain.bt[a] + cost[a + 1, b]
        A, R = a[:, None], np.arange(d)[None, :]
        J, Bm = A + 1 + R, b[:, None]
        steps = pair[np.minimum(A + R, L - 1)]  # pair[a+r] for r >= 1
        steps[:, 0] = x[a + 1] + fo[a]
        fwd_need = g[b + 1][:, None] + np.maximum.accumulate(steps, axis=1)
        needs = np.maximum(np.maximum(fwd_need, x[J] + need[J, Bm]), need[A, J - 1])
        costs = fprefix[J] - fprefix[A] + cost[J, Bm] + cost[A, J - 1]
        low = needs.min(axis=1)
        r = np.where(needs == low[:, None], costs, np.inf).argmin(axis=1)
        ck_cost = costs[a, r]
        take = (low < fa_need) | ((low == fa_need) & (ck_cost < fa_cost))
        need[a, b] = np.where(take, low, fa_need)
        cost[a, b] = np.where(take, ck_cost, fa_cost)
        pick[a, b] = np.where(take, a + 1 + r, _F_ALL)
    # Rebuild the sequence.
    sequence: Sequence = []
    stack: list[tuple[str, int, int]] = [("solve", 0, L - 1)]
    while stack:
        kind, a, b = stack.pop()
        if kind == "op":
            sequence.append(("B", a))
        elif a == b:
            sequence += [("F_all", a), ("B", a)]
        elif pick[a, b] == _F_ALL:
            sequence.append(("F_all", a))
            stack += [("op", a, a), ("solve", a + 1, b)]
        else:
            j = int(pick[a, b])
            sequence.append(("F_ck", a))
            sequence += [("F_n", k) for k in range(a + 1, j)]
            stack += [("solve", a, j - 1), ("solve", j, b)]
    return int(x[0] + need[0, L - 1]), sequence


def solve_rotor(chain: Chain, memory: int, *, slots: int = 500) -> ChainPlan:
    """Optimal (within ``slots``) checkpointing plan within ``memory`` activation bytes.

    Parameters
    ----------
    chain : Chain
    memory : int
        Bytes for activations, the chain input x[0] included (the budget minus static memory).
    slots : int
        Number of slots the activation budget is divided into (docs/model.md).

    Returns
    -------
    ChainPlan
        Status ``optimal`` when the plan is optimal in bytes (exact discretization or store-all),
        ``feasible`` when it is optimal among plans on the slot grid (or the least-memory fallback),
        ``infeasible`` with ``min_memory`` (exact, bytes) when no plan exists.
    """
    min_memory, min_plan = _min_memory_plan(chain)
    if memory < min_memory:
        return ChainPlan(
            sequence=None,
            status="infeasible",
            min_memory=min_memory,
            slots=slots,
            message="no checkpointing plan fits: even recomputing everything needs more memory",
        )
    if chain.store_all_peak() <= memory:
        sequence = chain.store_all_sequence()
        return ChainPlan(
            sequence,
            "optimal",
            chain.makespan(sequence),
            min_memory,
            slots,
            message="store-all fits: no recomputation needed",
        )
    budget = memory - int(chain.x[0])
    capacity, r = slot_sizes(chain, budget, slots)
    table_bytes = chain.length**2 * (capacity + 1) * (8 + 2)
    if table_bytes > TABLE_LIMIT:
        most = max(2, TABLE_LIMIT // (chain.length**2 * 10) - 1)
        raise InputError(
            f"--slots {slots}: the rotor table for {chain.length} stages would take "
            f"{table_bytes / 1e9:.1f} GB; use --slots {most} or fewer"
        )
    opt, choice = _solve_table(chain, capacity, r["x"], r["s"], r["g"], r["fo"], r["bo"])
    value = float(opt[0, chain.length - 1, capacity])
    exact = budget <= slots
    fallback = chain.makespan(min_plan)
    if np.isfinite(value) and value <= fallback:
        sequence = _backtrack(chain, choice, r["x"], r["s"], capacity)
        return ChainPlan(sequence, "optimal" if exact else "feasible", value, min_memory, capacity)
    return ChainPlan(
        min_plan,
        "feasible",
        fallback,
        min_memory,
        capacity,
        message="the slot grid is too coarse near the least memory: returned the least-memory "
        "plan (raise --slots for a faster one)",
    )
