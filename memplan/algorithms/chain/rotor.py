"""``rotor``: optimal checkpointing of heterogeneous chains by dynamic programming.

Beaumont, Herrmann, Pallez, Shilova (2019), *Optimal checkpointing for heterogeneous chains: how to
train deep neural networks with limited memory*, the persistent dynamic program, in the memory model
of docs/model.md (the operations F_all / F_ck / F_n / B of Table 1 of Efficient Combination of Rematerialization and Offloading (NeurIPS 2021), without offloading).

This module is rotor's one public solver API: :func:`plan_rotor` (the plan within a budget),
:func:`dense_table` (the table of every sub-chain at every budget, which pofo and join read),
:func:`least_memory_plan` and :func:`chain_min_memory`. The tables are filled by the compiled core
(:mod:`memplan.core`, src/rotor_*.cpp; NOTE [ rotor in C++ ] there): in bytes (NOTE [ rotor in
bytes ]; O(L^3 P) for P steps per sub-chain), on a slot grid restricted to the budgets the
requested one reaches (O(L^3 S) time and O(L^2 S) memory for L stages and S slots), and dense on
a slot grid. :func:`plan_rotor` picks one (``--slots``) and completes it. The Python references
of the three, which the core is tested against plan for plan, are in tests/oracles/rotor.py.

NOTE [ rotor in bytes ]
``opt(a, b)(m)`` is a non-increasing step function of the budget ``m``. Instead of sampling it at
every slot, the DP in bytes keeps its steps: the **frontier** of ``(a, b)``, the budgets
``M_0 < M_1 < ...`` (bytes) at which the least makespan drops, with those makespans (infinite
below ``M_0``, the least memory of the sub-chain; the last step is its store-all need). ``F_all a``
shifts the frontier of ``(a+1, b)`` by ``s[a]``; the checkpoint ``x[j]`` adds two step functions,
whose sum can only drop at a step of one of them; the minimum over the options is the lower
envelope of all those points. The work grows with the number of steps (about L^3 P); the DP
counts its candidate points and gives up past :data:`EXACT_WORK`, for the slot grid to take over.

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
in bytes (:meth:`ChainInstance.peak`); the first that fits wins, the grid's own plan always does. Two exact
plans complete a grid: store-all when it fits (its makespan is the lower bound, so it is optimal)
and a least-memory plan (NOTE [ least memory ], exact in bytes) when the grid finds nothing or
something slower. So rotor is feasible exactly when some plan exists; in bytes, and on a grid of N
slots, its makespan never grows with the budget (the three candidates each are non-increasing:
a slot grows with the budget, rounded sizes only shrink). The tightening keeps the fastest of a
few plans that fit, which need not be monotone: ``auto`` on long chains can be slightly faster at
one budget than at a larger one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import numpy.typing as npt

from memplan.algorithms.base import ChainPlan, Sequence
from memplan.algorithms.chain.least_memory import (
    INT64_SAFE,
    chain_min_memory,
    least_memory_bounds,
    least_memory_plan,
    recompute_all_sequence,
)
from memplan.algorithms.chain.problem import ChainInstance
from memplan.core import kernels
from memplan.errors import ArgumentError
from memplan.schedule import OpName

__all__ = [
    "AUTO",
    "F_ALL",
    "NONE",
    "DenseTable",
    "auto_slots",
    "chain_min_memory",
    "dense_table",
    "least_memory_plan",
    "plan_rotor",
    "slot_sizes",
]

F_ALL = int(kernels.CHOICE_F_ALL)
"""Choice code of :class:`DenseTable`: start with ``F_all``; j >= 1: ``F_ck`` up to ``x[j]``."""
NONE = int(kernels.CHOICE_NONE)
"""Choice code of :class:`DenseTable`: no plan at that budget."""
AUTO = "auto"
TABLE_LIMIT = 4 * 10**9
"""Bytes the grid tables may take (L (L+1) / 2 rows of S+1 values); beyond, ``slots`` is refused."""
EXACT_WORK = 5_000_000
"""Candidate points the byte-level DP may process under ``--slots auto`` (every bundled profile
needs at most 2.2 million), before the slot grid takes over."""
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
_OPERATIONS: tuple[OpName, ...] = ("F_all", "F_ck", "F_n", "B")
"""Operation names by the core's code: operation ``code`` on ``stage`` is ``4 * stage + code``."""


def slot_sizes(chain: ChainInstance, budget: int, slots: int) -> tuple[int, dict[str, np.ndarray]]:
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


@functools.lru_cache(maxsize=32)
def _operation_names(length: int) -> Sequence:
    """The core's operation ``4 * stage + code`` as ``(name, stage)``."""
    return [(name, stage) for stage in range(length) for name in _OPERATIONS]


def _sequence(codes: npt.NDArray[np.int64], length: int) -> Sequence:
    names = _operation_names(length)
    return [names[code] for code in codes.tolist()]


_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float64]
_ChainArrays = tuple[_Ints, _Ints, _Ints, _Ints, _Ints, _Floats, _Floats]
"""The arrays :func:`_chain_arrays` returns: ``x, s, g, fo, bo, ft, bt``."""


class _ChainTerms(TypedDict, total=False):
    """The training loop's terms as the core's keywords (all three or none)."""

    fa: _Ints
    wh: _Ints
    fr: _Ints


def _chain_arrays(
    chain: ChainInstance,
    sizes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> _ChainArrays:
    """The arrays the core reads: sizes ``x, s, g, fo, bo`` (int64; the chain's unless given) and
    times ``ft, bt`` (float64), contiguous.
    """
    x, s, g, fo, bo = (
        sizes if sizes is not None else (chain.x, chain.s, chain.g, chain.fo, chain.bo)
    )
    x, s, g, fo, bo = (np.ascontiguousarray(a, dtype=np.int64) for a in (x, s, g, fo, bo))
    ft, bt = (np.ascontiguousarray(a, dtype=np.float64) for a in (chain.ft, chain.bt))
    return x, s, g, fo, bo, ft, bt


def _chain_terms(chain: ChainInstance) -> _ChainTerms:
    """The training loop's terms as the core's keywords ``fa, wh, fr`` (int64, contiguous), or
    none when the chain has none (the model before them, NOTE [ training-loop memory terms ]).
    """
    if not chain.has_terms:
        return {}
    return _ChainTerms(
        fa=np.ascontiguousarray(chain.fall, dtype=np.int64),
        wh=np.ascontiguousarray(chain.held_grads, dtype=np.int64),
        fr=np.ascontiguousarray(chain.freed, dtype=np.int64),
    )


@dataclass(frozen=True)
class DenseTable:
    """rotor's table on a slot grid, for every sub-chain and every budget (what pofo and join read).

    ``opt[a, b, m]`` is the least time to run the backward of stages ``a..b`` with ``x[a]`` held
    (by the caller), ``g[b+1]`` held and at most ``m`` slots besides ``x[a]`` (NOTE [ rotor
    recurrences ]); ``choice[a, b, m]`` the option reaching it: :data:`F_ALL`, the checkpoint
    ``j >= 1``, or :data:`NONE` (infeasible). ``x`` and ``s`` are the sizes in slots.
    """

    opt: np.ndarray
    choice: np.ndarray
    x: np.ndarray
    s: np.ndarray

    def plan(self, a: int, b: int, m: int) -> Sequence:
        """The operations of ``opt[a, b, m]`` (stages ``a..b``, ``m`` slots), from the choices."""
        x, s = self.x.tolist(), self.s.tolist()
        choice = self.choice
        sequence: Sequence = []
        stack: list[tuple[str, int, int, int]] = [("solve", a, b, m)]
        while stack:
            kind, lo, hi, budget = stack.pop()
            if kind == "op":
                sequence.append(("B", lo))
            elif lo == hi:
                sequence += [("F_all", lo), ("B", lo)]
            else:
                pick = int(choice[lo, hi, budget])
                if pick == F_ALL:
                    sequence.append(("F_all", lo))
                    stack += [("op", lo, lo, 0), ("solve", lo + 1, hi, budget - s[lo])]
                elif pick >= 1:
                    sequence.append(("F_ck", lo))
                    sequence += [("F_n", k) for k in range(lo + 1, pick)]
                    stack += [
                        ("solve", lo, pick - 1, budget),
                        ("solve", pick, hi, budget - x[pick]),
                    ]
                else:
                    raise ValueError(f"rotor: no plan for stages {lo}..{hi} at {budget} slots")
        return sequence


def dense_table(
    chain: ChainInstance,
    capacity: int,
    x: np.ndarray,
    s: np.ndarray,
    g: np.ndarray,
    fo: np.ndarray,
    bo: np.ndarray,
) -> DenseTable:
    """The dense table of rotor (:class:`DenseTable`) for budgets ``0..capacity`` slots, the sizes
    ``x, s, g, fo, bo`` in slots (:func:`slot_sizes`) and the chain's times.

    Only the budgets between a lower bound of each sub-chain's least memory and its store-all need
    are computed by the recurrence (above, the value is the sub-chain's lower bound, F_all
    everywhere). O(L^3 S) time, O(L^2 S) memory.
    """
    if capacity < 0:
        raise ValueError(f"rotor: capacity {capacity} < 0")
    opt, choice = kernels.rotor_dense(*_chain_arrays(chain, (x, s, g, fo, bo)), capacity)
    return DenseTable(opt, choice, np.asarray(x, dtype=np.int64), np.asarray(s, dtype=np.int64))


def plan_rotor(chain: ChainInstance, memory: int, *, slots: int | str | None = AUTO) -> ChainPlan:
    """Optimal checkpointing plan within ``memory`` activation bytes.

    Parameters
    ----------
    chain : ChainInstance
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
    if chain.options is not None:
        chosen = _plan_with_options(chain, memory) if auto else None
        if chosen is not None:
            return chosen
        chain = chain.without_options()
    fused = None if auto else _grid_with_bounds(chain, memory, slots)
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
        in_bytes = _exact_in_bytes(chain, budget, min_memory)
        if in_bytes is not None:
            return in_bytes
        slots = auto_slots(chain.length)
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ArgumentError("slots", "expected an integer or 'auto'", slots)
    if fused is not None:
        found = None
        if fused.ops is not None:
            found = (_sequence(fused.ops, chain.length), fused.capacity, budget <= slots)
    else:
        found = _on_grid(chain, memory, budget, slots, tighten=auto)
    if found is not None:
        sequence, capacity, exact = found
        value = chain.makespan(sequence)
    else:
        capacity = budget if budget <= slots else slots  # as slot_sizes
        value, exact = np.inf, False
    fallback = _least_memory_fallback(
        chain, found is not None, capacity, min_memory, budget / slots, least_plan, value
    )
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


def _exact_in_bytes(chain: ChainInstance, budget: int, min_memory: int) -> ChainPlan | None:
    """The byte-level DP (NOTE [ rotor in bytes ]) within :data:`EXACT_WORK`: its optimal plan,
    or None (too much work, or no plan within ``budget``).
    """
    status, codes, _ = kernels.rotor_exact(
        *_chain_arrays(chain), budget, float(EXACT_WORK), **_chain_terms(chain)
    )
    if status != 0 or not len(codes):
        return None
    sequence = _sequence(codes, chain.length)
    return ChainPlan(
        sequence,
        "optimal",
        chain.makespan(sequence),
        min_memory,
        message="exact in bytes (no slots)",
    )


def _least_memory_fallback(
    chain: ChainInstance,
    on_grid: bool,
    capacity: int,
    min_memory: int,
    slot_bytes: float,
    least_plan: tuple[int, Sequence] | None,
    value: float,
) -> Sequence | None:
    """A least-memory plan, in case the grid finds nothing or something slower: the fastest one
    (an O(L^3) DP) on shorter chains, else the recompute-all plan (least memory when the bounds
    meet; its makespan has a closed form, so it is built only if it wins). None where every
    least-memory plan fits the grid, so cannot beat it: where the grid's budget (``capacity``
    slots of ``slot_bytes``) exceeds the least memory in slots by more than the sizes one peak
    can add up (each rounds up by less than a slot).
    """
    x0 = int(chain.x[0])
    unit = max(1.0, slot_bytes)
    fits_grid = capacity - (min_memory - x0) / unit >= 2 * chain.length + 4
    if on_grid and fits_grid:
        return None
    if least_plan is not None:
        return least_plan[1]
    if chain.length <= LEAST_PLAN_STAGES:
        return least_memory_plan(chain)[1]
    fprefix = np.concatenate(([0.0], np.cumsum(chain.ft)))
    slowest = float(fprefix[:-1].sum()) + chain.lower_bound
    return recompute_all_sequence(chain) if slowest < value else None


def _exact_with_options(
    chain: ChainInstance, budget: int
) -> tuple[int, Sequence, dict[int, int], int]:
    """The DP in bytes with the options of every ``F_all``: its status, the plan (empty: none
    within ``budget``), the option of each stage's ``F_all`` (the nonzero ones) and the least
    budget of the chain (-1: above ``budget``).
    """
    options = chain.options
    assert options is not None
    start, option_s, option_fo, option_bo = (
        np.ascontiguousarray(a, dtype=np.int64)
        for a in (options.start, options.s, options.fo, options.bo)
    )
    option_bt = np.ascontiguousarray(options.bt, dtype=np.float64)
    status, codes, chosen, _, least = kernels.rotor_exact_options(
        *_chain_arrays(chain),
        start,
        option_s,
        option_fo,
        option_bo,
        option_bt,
        budget,
        float(EXACT_WORK),
        **_chain_terms(chain),
    )
    sequence = _sequence(codes, chain.length)
    per_stage = {k: int(o) for (name, k), o in zip(sequence, chosen.tolist(), strict=True) if o}
    return int(status), sequence, per_stage, int(least)


def _plan_with_options(chain: ChainInstance, memory: int) -> ChainPlan | None:
    """The rotor plan with the options of every stage's ``F_all`` (selective checkpointing,
    docs/model.md "Options of a stage"): the DP in bytes, each ``F_all a`` taking the best of its
    options (NOTE [ rotor in bytes ]: the frontier of ``(a+1, b)`` shifted by each option's saved
    bytes). None where that DP is past :data:`EXACT_WORK` (the caller then plans with option 0
    only).
    """
    if chain.total_bytes >= INT64_SAFE:
        return None
    x0 = int(chain.x[0])
    budget = memory - x0
    status, sequence, options, least = _exact_with_options(chain, max(budget, 0))
    if status != 0:
        return None
    if sequence:
        return ChainPlan(
            sequence,
            "optimal",
            chain.makespan(sequence, options),
            least + x0,
            message="exact in bytes (no slots), with the options of F_all",
            options=options,
        )
    # No plan within the budget: the least one, from the frontier up to the store-all need.
    status, _, _, least = _exact_with_options(chain, chain.store_all_peak() - x0)
    if status != 0 or least < 0:
        return None
    return ChainPlan(
        sequence=None,
        status="infeasible",
        min_memory=least + x0,
        message="no checkpointing plan fits: even recomputing everything needs more memory",
    )


def auto_slots(length: int) -> int:
    """The slots of ``--slots auto`` when the byte-level DP is too costly: the finest grid whose
    table (about L^3 S / 6 cells) stays within :data:`AUTO_CELLS`, between :data:`AUTO_SLOTS` and
    :data:`MAX_AUTO_SLOTS`, and whose values fit in :data:`AUTO_TABLE_BYTES`.
    """
    by_time = int(AUTO_CELLS * 6 // max(1, length**3))
    pairs = length * (length + 1) // 2
    by_memory = int(AUTO_TABLE_BYTES // (4 * pairs)) - 1
    return max(2, min(max(AUTO_SLOTS, by_time), MAX_AUTO_SLOTS, by_memory))


def _grid_shape(
    chain: ChainInstance, budget: int, slots: int, tighten: bool
) -> tuple[int, bool, int, type, ArgumentError | None]:
    """The grid of :func:`_on_grid`: its budget in slots, whether it is exact, the extra slots
    of tightening, the table's dtype, and why the table is refused (None: it is not).
    """
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
        refused = ArgumentError(
            "slots",
            f"the rotor table for {chain.length} stages would take {table_bytes / 1e9:.1f} GB; "
            f"use {most} slots or fewer",
            slots,
        )
    return capacity, exact, extra, dtype, refused


def _grid_with_bounds(chain: ChainInstance, memory: int, slots: object) -> kernels.RotorGrid | None:
    """With ``--slots N``: the chain's least-memory bounds, its store-all peak and the grid's plan,
    in one call of the core (the grid only when the bounds do not settle the answer), or None where
    :func:`plan_rotor` takes the usual path (an invalid or too large grid, or sizes too large for
    exact int64 sums).
    """
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        return None
    if not 0 <= memory < INT64_SAFE or chain.has_terms:
        return None
    budget = memory - int(chain.x[0])
    _, _, _, dtype, refused = _grid_shape(chain, max(budget, 0), slots, tighten=False)
    if refused is not None:
        return None
    fused = kernels.rotor_grid(
        *_chain_arrays(chain), budget, slots, single=dtype is np.float32, memory=memory
    )
    return None if fused.status == kernels.ROTOR_UNBOUNDED else fused


def _on_grid(
    chain: ChainInstance, memory: int, budget: int, slots: int, tighten: bool
) -> tuple[Sequence, int, bool] | None:
    """The grid DP's plan, its budget in slots and whether the grid is exact (one byte per slot).

    With ``tighten``, the table is also filled for :func:`_extra_slots` budgets above the grid's
    own, and the plan returned is the fastest of those at the top budgets, tried from the fastest
    down, that fits in bytes (NOTE [ rotor guarantees ]); the grid's own budget always does.
    """
    capacity, exact, extra, dtype, refused = _grid_shape(chain, budget, slots, tighten)
    if refused is not None:
        raise refused
    grid = kernels.rotor_grid(
        *_chain_arrays(chain),
        budget,
        slots,
        extra=extra,
        single=dtype is np.float32,
        trace=extra == 0,
        **_chain_terms(chain),
    )
    if extra == 0:  # the core traced the grid's own budget already
        return None if grid.ops is None else (_sequence(grid.ops, chain.length), capacity, exact)
    top = grid.top_values()  # at capacity .. capacity + extra
    if not math.isfinite(top[extra]):
        return None
    tried: set[float] = set()
    for c in range(capacity + extra, capacity - 1, -1):
        value = top[c - capacity]
        if c > capacity and (value in tried or (c > 0 and top[c - 1 - capacity] == value)):
            continue  # the least budget of each value is tried: its plan is the likeliest to fit
        tried.add(value)
        codes = grid.trace(c)
        assert codes is not None  # its top value is finite
        sequence = _sequence(codes, chain.length)
        if c == capacity:
            return sequence, capacity, exact
        peak = chain.peak(sequence)
        if peak is not None and peak <= memory:
            return sequence, capacity, False
    return None  # pragma: no cover - the grid's own budget returns above


def _extra_slots(capacity: int) -> int:
    """Slots above the grid's own budget tried when tightening: 2% (at least 2)."""
    return max(2, capacity // 50)
