"""DYNPROG offloading schedule (Beaumont, Eyraud-Dubois & Shilova, Euro-Par 2020, Algorithm 1;
slots as in §5.3.2).

Algorithm 1 solves Problem 2 (transfers may be interrupted, so bytes leave and enter the GPU as they
move, but every activation is offloaded entirely or not at all) exactly, by a dynamic program over
the stages that decides, stage by stage, whether ``a[k]`` is offloaded. Its state after stage ``k``
is ``(N, Delta_F, Delta_B)``:

* ``N``: bytes of ``a[0..k-1]`` kept on the GPU (the paper's ``M_F - Delta_F^+ - |x_k|``);
* ``Delta_F``: offloading still to do at the end of ``F_{k-1}`` (eq. 2, 4), or minus the idle
  time of the channel times ``beta`` when it is idle;
* ``Delta_B``: prefetching to do before ``B_{k-1}`` starts, the backward phase being read from the
  end of the schedule (eq. 7, 8), or minus the channel's idle time.

For each state the table keeps the least idle time of the compute stream so far (forward waits,
eq. 1, and backward waits, eq. 6); the idle time between the phases (eq. 9, 10) is added at the
end, and backtracking gives the offloaded set. DYNPROG then runs the no-wait ordered schedule of
that set with real, non-interruptible transfers (Problem 1, :mod:`.nowait`): a heuristic for
Problem 1, which is strongly NP-hard (Theorem 1). docs/offload.md gives our reading of every
recurrence (the paper's text garbles several indices) and the proof sketch of the two shortcuts
used here (one expression for eq. 9 and 10, slack clamping).

Complexity: sizes are counted in ``S`` slots (``--slots``), so each coordinate of the state takes
``O(S)`` values and a stage costs ``O(T log T)`` for ``T`` live states (vectorized in numpy; a
hash table in the paper), ``T <= O(S^3)``; in practice ``T`` stays in the thousands after the
dominance pruning (tens of thousands with one byte per slot on the bundled profiles).
Memory: ``O(n T)`` for backtracking. The cost of a run is about proportional to its *work*, the
live states summed over the stages, which ``slots="auto"`` budgets (NOTE [ offload slots auto ]).

The table itself, its slots (NOTE [ offload slot discretization ]) and its dominance pruning are
:mod:`memplan.algorithms.offload.dynprog_table`.

NOTE [ offload slots auto ]
--------------------------
Rounding to 500 slots loses up to 20% of makespan on the bundled @a100 profiles against finer
grids (docs/benchmarks.md, "dynprog and pofo: rounding"), while the DP with one byte per slot (no
rounding of sizes at all: exact for Problem 2 up to the sub-byte transfer capacities) takes less
than a second on them. ``slots="auto"`` (the default) runs the grids of :func:`auto_grids` from the
coarsest: ``DEFAULT_SLOTS`` (500, always run to the end), 5000, 50000, then one byte per slot, each
finer one only while the work of the whole solve (every run, repairs included) stays within
``WORK_BUDGET`` live states summed over the stages (about 3 s on the 2-core Xeon of
docs/benchmarks.md): a finer grid is not started when ``GROWTH`` times the work of the previous
one exceeds what is left, and stops (its result unused) as soon as it exceeds it or holds more
than ``MAX_LIVE_STATES`` states at one stage. The bundled profiles reach one byte per slot; chains
of hundreds of stages keep 500 slots (random 2000-stage chains: about 5 million states of work).
The work is counted, not timed, so the result is the same on every machine.

Each grid gives a set that fits in bytes; their real (no-wait, Problem 1) schedules are compared
with that of GREEDY's set, and the fastest wins, the coarsest grid on ties and GREEDY last. The
result is therefore never slower than the 500-slot grid alone, nor than the byte-level DP whenever
it ran, nor than GREEDY. A finer grid does not always give a faster real schedule (the DP optimizes
Problem 2, whose optimal set is only a heuristic for Problem 1), hence the comparison. GREEDY's set
guards long chains, where 500 slots are far too coarse: on a random 2000-stage chain at half its
peak, a slot is 200 MB (activations are 0.4 slot, and one slot of waiting is 17 ms against
operations of 5 ms), and the 500-slot set runs 25% slower than GREEDY's, which is optimal there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from memplan.algorithms.base import OffloadPlan
from memplan.algorithms.offload.common import infeasible_plan, plan_from_set
from memplan.algorithms.offload.dynprog_table import (
    MAX_LIVE_STATES,
    Slots,
    discretize,
    run_dp,
)
from memplan.algorithms.offload.greedy import greedy_set
from memplan.algorithms.offload.lower_bound import lower_bound
from memplan.algorithms.offload.model import OffloadInstance
from memplan.algorithms.offload.nowait import no_wait_makespan
from memplan.algorithms.timeline import Deadline, TimeLimitReached

DEFAULT_SLOTS = 500
MAX_REPAIR_RUNS = 2
"""Repair runs of the DP per grid at most (NOTE [ offload slot discretization ])."""
WORK_BUDGET = 8_000_000
"""Live states summed over the stages, over every DP run of one solve, beyond which no repair run
and no finer grid is started (NOTE [ offload slots auto ]): about 3 to 6 s here."""
GROWTH = 2
"""A finer grid of ``slots="auto"`` is not started when ``GROWTH`` times the work of the previous
one exceeds what is left of :data:`WORK_BUDGET`: a grid 10 times finer took 1.5 to 7.5 times more
work on the bundled profiles and random chains (it would most likely be stopped)."""


def relaxation_bound(
    inst: OffloadInstance, memory: int, slots: int = DEFAULT_SLOTS
) -> float | None:
    """A lower bound (ms) on the makespan of any ordered offloading schedule, or None.

    Algorithm 1 on the instance rounded optimistically (:func:`discretize` with ``optimistic``):
    sizes, gradients and overheads rounded down, the budget and the transfer capacity of each
    operation rounded up. Every schedule of the true instance is then one of the rounded
    instance, whose Problem-2 optimum the DP computes exactly; Problem 2 relaxes Problem 1. The
    bound is at least LB (Proposition 3) and tightens it where whole activations must move (it
    reads the spikes of Figure 5). None when nothing fits even in the rounded instance.
    """
    base = lower_bound(inst, memory)
    if inst.peak() <= memory:
        return base
    sl = discretize(inst, memory, slots, optimistic=True)
    found = run_dp(sl)
    if not found.sets:
        return None
    return max(base, inst.compute_time + found.values[0] * sl.sigma / inst.beta)


def _repair_indices(inst: OffloadInstance, sl: Slots, mask: np.ndarray, memory: int) -> np.ndarray:
    """The activations whose slot counts one repair round raises (§5.3.2).

    Every activation rounded down (``a~[i] * sigma < a[i]``) that appears in a constraint the set
    violates in exact bytes (kept below stage ``k``, or ``a[k]``, ``a[k+1]``); if none appears
    there (cannot happen: a constraint that holds in slots and fails in bytes has one), every one
    rounded down. The paper raises one activation per run; raising all of them at once bounds the
    number of runs (NOTE [ offload slot discretization ]).
    """
    below = inst.a - sl.a * sl.sigma > 0
    forward, backward = inst.needs(inst.kept_prefix(mask))
    violated = np.flatnonzero((forward > memory) | (backward > memory))
    involved = np.zeros(inst.n + 1, dtype=bool)
    if len(violated):
        involved[: violated[-1]][~mask[: violated[-1]]] = True  # kept below a violated stage
        involved[violated] = True
        involved[violated + 1] = True
    pool = below & involved
    return np.flatnonzero(pool if pool.any() else below)


def fit_in_bytes(inst: OffloadInstance, offloaded: np.ndarray, memory: int) -> np.ndarray:
    """``offloaded`` with more activations offloaded until it fits ``memory`` in exact bytes.

    One pass over the stages: where the bytes kept below stage ``k`` exceed what ``F_k`` and
    ``B_k`` leave (:meth:`OffloadInstance.feasible`), the earliest kept activations are offloaded
    until they fit (the rule of GREEDY, Theorem 2: the first bytes are the cheapest to move). Never
    fails when ``memory >= inst.min_memory()`` (offloading every activation below ``k`` fits).
    O(n).
    """
    n = inst.n
    own = np.maximum(*inst.needs(np.zeros(n + 1, dtype=np.int64)))
    room = (memory - own).tolist()
    sizes = inst.ac.tolist()
    pinned = inst.pinned.tolist()
    mask = np.asarray(offloaded, dtype=bool) & ~inst.pinned  # a new array; pinned ones stay
    kept, earliest = 0, 0
    for k in range(n):
        while kept > room[k]:
            while earliest < k and (mask[earliest] or sizes[earliest] == 0 or pinned[earliest]):
                earliest += 1
            if earliest >= k:  # pragma: no cover - memory >= min_memory: everything below fits
                raise AssertionError("dynprog: no set fits although memory >= min_memory")
            mask[earliest] = True
            kept -= sizes[earliest]
        if not mask[k]:
            kept += sizes[k]
    return mask


@dataclass
class _GridResult:
    """The sets one grid gave (best first, each fitting in bytes) and what it cost."""

    slots: int
    sigma: float
    sets: list[np.ndarray]
    values: list[int | None]  # None: completed by fit_in_bytes
    runs: int
    work: int
    states: int
    aborted: bool = False
    fitted: bool = False  # the best set was completed by fit_in_bytes


def _solve_grid(
    inst: OffloadInstance,
    memory: int,
    slots: int,
    candidates: int,
    *,
    spent: int,
    work_limit: int | None,
    deadline: Deadline | None = None,
) -> _GridResult:
    """Algorithm 1 on one grid with the bounded repair loop of NOTE [ offload slot discretization ].

    At most ``1 + MAX_REPAIR_RUNS`` runs of the DP, a repair run only while ``spent`` plus the work
    so far plus the last run's work stays within :data:`WORK_BUDGET`; a best set that still does not
    fit in bytes is then completed by :func:`fit_in_bytes`. With ``work_limit``, the runs stop
    (``aborted``) once their work exceeds it.
    """
    bump = np.zeros(inst.n + 1, dtype=np.int64)
    result = _GridResult(slots=slots, sigma=1.0, sets=[], values=[], runs=0, work=0, states=0)
    while True:
        sl = discretize(inst, memory, slots, bump)
        limit = None if work_limit is None else work_limit - result.work
        states = None if limit is None else MAX_LIVE_STATES
        found = run_dp(
            sl, candidates=candidates, work_limit=limit, state_limit=states, deadline=deadline
        )
        result.runs += 1
        result.work += found.work
        result.states = max(result.states, found.states)
        result.sigma = sl.sigma
        if found.aborted:
            result.aborted = True
            return result
        if not found.sets:
            return result
        best = found.sets[0]
        if inst.feasible(best, memory):
            break
        room = WORK_BUDGET - spent - result.work
        if result.runs > MAX_REPAIR_RUNS or found.work > room:
            found.sets[0] = fit_in_bytes(inst, best, memory)
            result.fitted = True
            break
        bump[_repair_indices(inst, sl, best, memory)] += 1
    values: list[int | None] = list(found.values)
    if result.fitted:
        values[0] = None  # the DP's value was that of the set before completion
    result.sets = [m for m in found.sets if inst.feasible(m, memory)]
    result.values = [v for m, v in zip(found.sets, values, strict=True) if inst.feasible(m, memory)]
    return result


def auto_grids(memory: int) -> list[int]:
    """The grids of ``slots="auto"``, coarse to fine: :data:`DEFAULT_SLOTS`, 10 and 100 times
    finer, then one byte per slot (``memory`` slots: sizes are not rounded at all).
    """
    grids = [g for g in (DEFAULT_SLOTS, 10 * DEFAULT_SLOTS, 100 * DEFAULT_SLOTS) if g < memory]
    return grids + [max(int(memory), DEFAULT_SLOTS)]


def solve_dynprog(
    inst: OffloadInstance,
    memory: int,
    *,
    slots: int | str = "auto",
    candidates: int = 1,
    deadline: Deadline | None = None,
) -> OffloadPlan:
    """DYNPROG (§5.3): Algorithm 1 on slots, repaired to exact bytes, then the no-wait schedule.

    Parameters
    ----------
    inst : OffloadInstance
        The chain and its bandwidth.
    memory : int
        Bytes available to activations (static memory excluded).
    slots : int or "auto"
        ``S`` of §5.3.2 (NOTE [ offload slot discretization ]). ``"auto"`` (the default): the
        :data:`DEFAULT_SLOTS` grid, then finer grids up to one byte per slot while their work fits
        in :data:`WORK_BUDGET` (NOTE [ offload slots auto ]); the set with the fastest real
        (no-wait) schedule wins, GREEDY's set competing too.
    candidates : int
        1 (default): the paper's DYNPROG, the no-wait schedule of the DP's best set. ``K > 1``: the
        refinement ``dynprog-best``: backtrack the ``K`` best final states of the DP and keep the
        set whose real (Problem 1) no-wait schedule is the fastest.
    deadline : Deadline, optional
        ``--time-limit``: a grid still running when it passes is dropped, and the sets of the
        grids done by then compete (GREEDY's set alone if none was; ``details["stopped"]``).

    Returns
    -------
    OffloadPlan
        Infeasible (with ``min_memory``) only when even full offloading does not fit. When the slot
        grid is too coarse for any state to survive, the plan falls back to GREEDY's set (which
        fits whenever anything does) and says so in ``message``. ``details`` says how many DP runs
        (``dp_runs``, at most ``1 + MAX_REPAIR_RUNS`` per grid) and how much work it took.
    """
    auto = slots == "auto"
    reported = DEFAULT_SLOTS if auto else int(slots)
    if inst.min_memory() > memory:
        return infeasible_plan(inst, memory, reported)
    n = inst.n
    if inst.peak() <= memory:
        return plan_from_set(inst, np.zeros(n, dtype=bool), memory, slots=reported)
    grids = auto_grids(memory) if auto else [int(slots)]
    pool, details, tried, stopped = _run_grids(inst, memory, grids, candidates, deadline)
    if auto or stopped:
        details["grids"] = ", ".join(tried)
    if stopped:
        details["stopped"] = "time limit"
    if not pool:
        where = f"the grids tried ({details['grids']})" if auto else f"the {reported}-slot grid"
        message = (
            f"no offloading set fits on {where}; using GREEDY's set "
            "(a finer --slots may find a faster plan)"
        )
        if stopped and not any(not t.endswith("(time limit)") for t in tried):
            message = "the time limit passed during the first grid; using GREEDY's set"
        return plan_from_set(
            inst,
            greedy_set(inst, memory),
            memory,
            slots=reported,
            message=message,
            details=dict(details, fallback="greedy"),
        )
    if auto:  # GREEDY's set competes too (NOTE [ offload slots auto ])
        pool.append((greedy_set(inst, memory), None, None))
    chosen, value, origin = _fastest(inst, memory, pool)
    details["candidates"] = len(pool)
    if origin is None:
        details["set_from"] = "greedy"
        return plan_from_set(inst, chosen, memory, slots=reported, details=details)
    details.update(slot_bytes=origin.sigma, set_from=f"{origin.slots} slots")
    if value is None:
        details["fitted_in_bytes"] = True
    else:
        details["relaxed_makespan"] = inst.compute_time + value * origin.sigma / inst.beta
    return plan_from_set(inst, chosen, memory, slots=origin.slots, details=details)


_Candidate = tuple[npt.NDArray[np.bool_], int | None, _GridResult | None]
"""An offloaded set, the DP's value of it (None when completed in bytes or GREEDY's), and the
grid that gave it (None for GREEDY's set)."""


def _run_grids(
    inst: OffloadInstance,
    memory: int,
    grids: list[int],
    candidates: int,
    deadline: Deadline | None,
) -> tuple[list[_Candidate], dict[str, Any], list[str], bool]:
    """The grids of :func:`solve_dynprog` in turn, while their work fits :data:`WORK_BUDGET`.

    Returns the sets found (best first within each grid), the DP's figures for ``details``, the
    grids tried (as ``details["grids"]`` lists them) and whether the time limit stopped them.
    """
    pool: list[_Candidate] = []
    runs = work = states = 0
    tried: list[str] = []
    last = 0  # the work of the previous grid
    stopped = False
    for index, grid in enumerate(grids):
        limit = None if index == 0 else WORK_BUDGET - work
        if limit is not None and GROWTH * last > limit:
            tried.append(f"{grid} (skipped)")
            break
        try:
            found = _solve_grid(
                inst, memory, grid, candidates, spent=work, work_limit=limit, deadline=deadline
            )
        except TimeLimitReached:
            tried.append(f"{grid} (time limit)")
            stopped = True
            break
        last = found.work
        runs += found.runs
        work += found.work
        states = max(states, found.states)
        tried.append(f"{grid}{' (stopped)' if found.aborted else ''}")
        if found.aborted:
            break
        pool += [(m, v, found) for m, v in zip(found.sets, found.values, strict=True)]
    details: dict[str, Any] = {"dp_runs": runs, "dp_work": work, "dp_states": states}
    return pool, details, tried, stopped


def _fastest(inst: OffloadInstance, memory: int, pool: list[_Candidate]) -> _Candidate:
    """The candidate whose real (no-wait) schedule is the fastest, the first of equals."""
    chosen = pool[0]
    if len(pool) > 1:
        best_time = np.inf
        seen: set[bytes] = set()
        for candidate in pool:
            mask = candidate[0]
            key = (mask & (inst.a[: inst.n] > 0)).tobytes()
            if key in seen:
                continue
            seen.add(key)
            makespan = no_wait_makespan(inst, mask, memory)
            if makespan is not None and (best_time == np.inf or makespan < best_time - 1e-9):
                chosen, best_time = candidate, makespan
    return chosen
