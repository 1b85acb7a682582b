"""``rotor``: optimal checkpointing of heterogeneous chains by dynamic programming.

Beaumont, Herrmann, Pallez, Shilova (2019), *Optimal checkpointing for heterogeneous chains: how to
train deep neural networks with limited memory*, the persistent dynamic program, in the memory model
of docs/model.md (the operations F_all / F_ck / F_n / B of Table 1 of papers/000, without offloading).

Two solvers of the same recurrences: in bytes (rotor_exact.py, NOTE [ rotor in bytes ]; O(L^3 P)
for P steps per sub-chain) and on a slot grid (rotor_grid.py; O(L^3 S) time and O(L^2 S) memory for
L stages and S slots, vectorized over the slots and the split point, restricted to the budgets the
requested one reaches; compiled by rotor_kernel.py with the ``fast`` extra, the same plans). This
module picks one (``--slots``) and completes it.

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
``--slots auto`` (the default) runs the DP in bytes, the exact optimum of the model, unless it
would take more than :data:`EXACT_WORK` candidate points. Then, and with ``--slots N``, sizes are
rounded up to slots (docs/model.md), so the grid's plan fits in bytes but may be slower than the
optimum in bytes by the rounding. Under ``auto`` the grid is the finest :func:`auto_slots` allows
for the chain's length and is **tightened in bytes**: its table also covers :func:`_extra_slots`
more slots than its own budget, and the plans at those larger budgets, fastest first, are replayed
in bytes (:meth:`Chain.peak`); the first that fits wins, the grid's own plan always does. Two exact
plans complete a grid: store-all when it fits (its makespan is the lower bound, so it is optimal)
and a least-memory plan (NOTE [ least memory ], exact in bytes) when the grid finds nothing or
something slower. So rotor is feasible exactly when some plan exists; in bytes, and on a grid of N
slots, its makespan never grows with the budget (the three candidates each are non-increasing:
a slot grows with the budget, rounded sizes only shrink). The tightening keeps the fastest of a
few plans that fit, which need not be monotone: ``auto`` on long chains can be slightly faster at
one budget than at a larger one.
"""

from __future__ import annotations

import math

import numpy as np

from memplan.algorithms.base import ChainPlan, Sequence
from memplan.algorithms.chain import rotor_native
from memplan.algorithms.chain.least_memory import (  # noqa: F401 - chain_min_memory re-exported
    INT64_SAFE,
    chain_min_memory,
    least_memory_bounds,
    least_memory_plan,
    recompute_all_sequence,
)
from memplan.algorithms.chain.problem import Chain
from memplan.algorithms.chain.rotor_exact import WorkLimit, exact_backtrack, exact_frontiers
from memplan.algorithms.chain.rotor_grid import grid_backtrack, grid_table
from memplan.errors import InputError

_F_ALL = -1  # choice code: start with F_all; j >= 1: start with F_ck and checkpoint x[j]
_NONE = -2
AUTO = "auto"
TABLE_LIMIT = 4 * 10**9
"""Bytes the grid tables may take (L (L+1) / 2 rows of S+1 values); beyond, --slots is refused."""
EXACT_WORK = 5_000_000
"""Candidate points the byte-level DP may process under ``--slots auto`` (about 0.8 s here; every
bundled profile needs at most 2.2 million), before the slot grid takes over."""
AUTO_SLOTS = 500
"""The coarsest grid of ``--slots auto`` (where the byte-level DP is too costly)."""
MAX_AUTO_SLOTS = 20_000
AUTO_CELLS = 250_000_000
"""Grid cells (about L^3 S / 6) ``--slots auto`` spends beyond its coarsest grid: about 0.3 s."""
AUTO_TABLE_BYTES = 10**9
"""Memory of the values of the ``--slots auto`` grid (float32 when large)."""
FLOAT32_CELLS = 16_000_000
"""Grid tables with more values than this are kept in float32 (half the memory and time; the
makespan of the plan is recomputed exactly from its operations)."""
LEAST_PLAN_STAGES = 200
"""Up to this length, the least-memory fallback is the fastest least-memory plan (an O(L^3) DP,
0.05 s at 200 stages); beyond, the recompute-all plan (least memory when the bounds of
NOTE [ least memory ] meet)."""


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


def _min_memory_plan(chain: Chain) -> tuple[int, Sequence]:
    """Exact least-memory plan in bytes (ties broken by time): :func:`least_memory_plan`."""
    return least_memory_plan(chain)


def solve_rotor(chain: Chain, memory: int, *, slots: int | str | None = AUTO) -> ChainPlan:
    """Optimal checkpointing plan within ``memory`` activation bytes.

    Parameters
    ----------
    chain : Chain
    memory : int
        Bytes for activations, the chain input x[0] included (the budget minus static memory).
    slots : int or "auto"
        ``"auto"`` (default, also None): exact in bytes when the byte-level DP
        (NOTE [ rotor in bytes ]) stays within :data:`EXACT_WORK`, else the finest slot grid that
        :func:`auto_slots` allows for the chain's length, tightened in bytes
        (NOTE [ rotor guarantees ]). An integer: that many slots (docs/model.md), as is.

    Returns
    -------
    ChainPlan
        Status ``optimal`` when the plan is optimal in bytes (the byte-level DP, an exact grid, or
        store-all), ``feasible`` when it is optimal among plans on the slot grid (or the
        least-memory fallback), ``infeasible`` with ``min_memory`` (exact, bytes) when no plan
        exists. ``slots`` is the budget in slots of the grid used, None for the byte-level DP.
    """
    auto = slots is None or slots == AUTO
    fused = None if auto else _compiled_at_once(chain, memory, slots)
    if fused is not None:  # the bounds and the grid, in one call
        lower, upper, store_all = fused.bounds
    else:
        lower, upper = least_memory_bounds(chain)
        store_all = None
    least_plan = None if lower == upper else least_memory_plan(chain)
    min_memory = lower if least_plan is None else least_plan[0]
    if memory < min_memory:
        return ChainPlan(
            sequence=None,
            status="infeasible",
            min_memory=min_memory,
            message="no checkpointing plan fits: even recomputing everything needs more memory",
        )
    if (chain.store_all_peak() if store_all is None else store_all) <= memory:
        sequence = chain.store_all_sequence()
        return ChainPlan(
            sequence,
            "optimal",
            chain.makespan(sequence),
            min_memory,
            message="store-all fits: no recomputation needed",
        )
    budget = memory - int(chain.x[0])
    if auto:
        try:
            frontiers = exact_frontiers(chain, budget, work_limit=EXACT_WORK)
        except WorkLimit:
            frontiers = None
        if frontiers is not None:
            sequence = exact_backtrack(chain, frontiers, budget)
            return ChainPlan(
                sequence,
                "optimal",
                chain.makespan(sequence),
                min_memory,
                message="exact in bytes (no slots)",
            )
        slots = auto_slots(chain.length)
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise InputError(f"--slots {slots!r}: expected an integer or auto")
    if fused is not None:
        assert fused.sequence is not None or fused.status == rotor_native.INFEASIBLE
        found = (
            None if fused.sequence is None else (fused.sequence, fused.capacity, budget <= slots)
        )
    else:
        found = _on_grid(chain, memory, budget, slots, tighten=auto)
    if found is not None:
        sequence, capacity, exact = found
        value = chain.makespan(sequence) if fused is None else fused.makespan  # the same sum
    else:
        capacity = budget if budget <= slots else slots  # as slot_sizes
        value, exact = np.inf, False
    # A least-memory plan, in case the grid finds nothing or something slower: the fastest one
    # (an O(L^3) DP) on shorter chains, else the recompute-all plan (least memory when the bounds
    # meet; its makespan has a closed form, so it is built only if it wins). Every least-memory
    # plan fits the grid, so cannot beat it, when the grid's budget exceeds the least memory in
    # slots by more than the sizes one peak can add up (each rounds up by less than a slot).
    x0 = int(chain.x[0])
    unit = max(1.0, budget / slots)
    fits_grid = capacity - (min_memory - x0) / unit >= 2 * chain.length + 4
    fallback: Sequence | None = None
    if found is not None and fits_grid:
        pass
    elif least_plan is not None:
        fallback = least_plan[1]
    elif chain.length <= LEAST_PLAN_STAGES:
        fallback = least_memory_plan(chain)[1]
    else:
        fprefix = np.concatenate(([0.0], np.cumsum(chain.ft)))
        slowest = float(fprefix[:-1].sum()) + chain.lower_bound
        fallback = recompute_all_sequence(chain) if slowest < value else None
    if fallback is not None and chain.makespan(fallback) < value:
        return ChainPlan(
            fallback,
            "feasible",
            chain.makespan(fallback),
            min_memory,
            capacity,
            message="the slot grid is too coarse near the least memory: returned the least-memory "
            "plan (raise --slots for a faster one)",
        )
    return ChainPlan(sequence, "optimal" if exact else "feasible", value, min_memory, capacity)


def auto_slots(length: int) -> int:
    """The slots of ``--slots auto`` when the byte-level DP is too costly: the finest grid whose
    table (about L^3 S / 6 cells) stays within :data:`AUTO_CELLS`, between :data:`AUTO_SLOTS` and
    :data:`MAX_AUTO_SLOTS`, and whose values fit in :data:`AUTO_TABLE_BYTES`."""
    by_time = int(AUTO_CELLS * 6 // max(1, length**3))
    pairs = length * (length + 1) // 2
    by_memory = int(AUTO_TABLE_BYTES // (4 * pairs)) - 1
    return max(2, min(max(AUTO_SLOTS, by_time), MAX_AUTO_SLOTS, by_memory))


def _grid_shape(
    chain: Chain, budget: int, slots: int, tighten: bool
) -> tuple[int, bool, int, type, str | None]:
    """The grid of :func:`_on_grid`: its budget in slots, whether it is exact, the extra slots
    of tightening, the table's dtype, and why the table is refused (None: it is not)."""
    exact = budget <= slots
    capacity = budget if exact else slots
    extra = _extra_slots(capacity) if tighten and not exact else 0
    width = capacity + extra + 1
    pairs = chain.length * (chain.length + 1) // 2
    dtype = np.float32 if pairs * width > FLOAT32_CELLS else np.float64
    table_bytes = pairs * width * np.dtype(dtype).itemsize + 4 * chain.length * width
    refused = None
    if table_bytes > TABLE_LIMIT:
        most = max(2, TABLE_LIMIT // (pairs * 4) - 2)
        refused = (
            f"--slots {slots}: the rotor table for {chain.length} stages would take "
            f"{table_bytes / 1e9:.1f} GB; use --slots {most} or fewer"
        )
    return capacity, exact, extra, dtype, refused


def _compiled_at_once(chain: Chain, memory: int, slots: object) -> rotor_native.CompiledGrid | None:
    """With ``--slots N`` and the compiled kernel: the chain's least-memory bounds, its store-all
    peak and the grid's plan, in one call (rotor_native.py; the grid only when the bounds do not
    settle the answer), or None where :func:`solve_rotor` takes the usual path (no kernel, an
    invalid or too large grid, or sizes too large for exact int64 sums)."""
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        return None
    if not 0 <= memory < INT64_SAFE or not rotor_native.available():
        return None
    budget = memory - int(chain.x[0])
    _, _, _, dtype, refused = _grid_shape(chain, max(budget, 0), slots, tighten=False)
    if refused is not None:
        return None
    fused = rotor_native.solve_grid(chain, budget, slots, dtype=dtype, memory=memory)
    return None if fused.status == rotor_native.UNBOUNDED else fused


def _on_grid(
    chain: Chain, memory: int, budget: int, slots: int, tighten: bool
) -> tuple[Sequence, int, bool] | None:
    """The grid DP's plan, its budget in slots and whether the grid is exact (one byte per slot).

    With ``tighten``, the table is also filled for :func:`_extra_slots` budgets above the grid's
    own, and the plan returned is the fastest of those at the top budgets, tried from the fastest
    down, that fits in bytes (NOTE [ rotor guarantees ]); the grid's own budget always does.

    The compiled kernel (rotor_native.py) fills the table when it is available, else numpy
    (rotor_grid.py): the same values where they are read, so the same plans.
    """
    capacity, exact, extra, dtype, refused = _grid_shape(chain, budget, slots, tighten)
    if refused is not None:
        raise InputError(refused)
    if rotor_native.available():
        compiled = rotor_native.solve_grid(
            chain, budget, slots, extra=extra, dtype=dtype, trace=extra == 0
        )
        if extra == 0:  # the kernel traced the grid's own budget already
            found = compiled.sequence
            return None if found is None else (found, capacity, exact)
        top = compiled.top_values()  # at capacity .. capacity + extra

        def backtrack(c: int) -> Sequence:
            found = compiled.backtrack(c)
            assert found is not None  # its top value is finite
            return found
    else:
        capacity, r = slot_sizes(chain, budget, slots)
        x, s, g, fo, bo = (r[k] for k in ("x", "s", "g", "fo", "bo"))
        table = grid_table(
            chain,
            capacity + extra,
            x,
            s,
            g,
            fo,
            bo,
            dtype=dtype,
            asked_from=capacity if extra else None,
        )
        top = table.row(0, chain.length - 1)[capacity:].tolist()

        def backtrack(c: int) -> Sequence:
            return grid_backtrack(chain, table, x, s, g, fo, bo, c)

    if not math.isfinite(top[extra]):
        return None
    tried: set[float] = set()
    for c in range(capacity + extra, capacity - 1, -1):
        value = top[c - capacity]
        if c > capacity and (value in tried or (c > 0 and top[c - 1 - capacity] == value)):
            continue  # the least budget of each value is tried: its plan is the likeliest to fit
        tried.add(value)
        sequence = backtrack(c)
        if c == capacity:
            return sequence, capacity, exact
        peak = chain.peak(sequence)
        if peak is not None and peak <= memory:
            return sequence, capacity, False
    return None  # pragma: no cover - the grid's own budget returns above


def _extra_slots(capacity: int) -> int:
    """Slots above the grid's own budget tried when tightening: 2% (at least 2)."""
    return max(2, capacity // 50)
