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
dominance pruning below (tens of thousands with one byte per slot on the bundled profiles).
Memory: ``O(n T)`` for backtracking. The cost of a run is about proportional to its *work*, the
live states summed over the stages, which ``slots="auto"`` budgets (NOTE [ offload slots auto ]).

NOTE [ offload slot discretization ]
------------------------------------
As in §5.3.2, with ``sigma = max(1, M / S)`` bytes per slot (``M`` the activation budget) and a
budget of ``floor(M / sigma)`` slots:

* ``ex^F``, ``ex^B`` and the gradients ``|y|`` are rounded **up** (the plan may only overestimate
  what it needs);
* the transfer capacities ``u_F beta`` and ``u_B beta`` are rounded **down** through their partial
  sums: ``c[k] = floor(sum_{j<=k} u_j beta / sigma) - floor(sum_{j<k} u_j beta / sigma)``, so that
  rounding errors do not add up along the chain;
* the activations ``|x|`` are rounded *optimistically* through their partial sums
  (``ceil(sum_{j<=k} a_j / sigma) - ceil(sum_{j<k} a_j / sigma)``, which may round an individual
  activation down), so that eager sets (the first activations, the common optimum) are priced
  right. If the set the DP returns does not fit in exact bytes, the repair loop adds one slot to
  every activation rounded down that appears in a constraint that fails (the paper adds one slot
  to one of them, the closest to its true size, per run: up to ``n`` runs, 14 on a 60-stage chain
  of the tests, 75 and more on 2000 stages) and runs the DP again. The loop is bounded: at most
  ``MAX_REPAIR_RUNS`` (2) repair runs per grid, and a repair run only while the work of the solve
  stays within ``WORK_BUDGET``. A set that still does not fit is completed in bytes by
  :func:`fit_in_bytes` (offload the earliest kept activations where a stage overflows, GREEDY's
  rule; it always fits when anything does). So a grid costs at most ``1 + MAX_REPAIR_RUNS`` runs
  of the DP and one ``O(n)`` pass.

With ``sigma = 1`` (a budget of at most ``S`` bytes) and ``u beta`` whole bytes for every
operation, the DP is exact: its value is the optimum of Problem 2 (checked against an exhaustive
search in ``tests/algorithms/offload/test_dynprog.py``).

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

Dominance pruning (not in the paper): the idle time still to come only grows with ``N``,
``Delta_F`` and ``Delta_B`` (a state with less memory held and less transfer backlog can mimic the
other by waiting, and a no-wait schedule is never worse than a waiting one, Proposition 1), so a
state is dropped when another one at the same stage is no worse in all four values. Pruning is
done exactly on ``(N, Delta_F)`` groups along ``Delta_B`` and across groups along ``N``, which
removes almost every dominated state at ``O(T log T)`` cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from memplan.algorithms.base import OffloadPlan
from memplan.algorithms.offload.common import infeasible_plan, plan_from_set
from memplan.algorithms.offload.greedy import greedy_set
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
MAX_LIVE_STATES = 500_000
"""Live states at one stage beyond which a run on a finer grid of ``slots="auto"`` stops."""
_EPS = 1e-9
MAX_MOVED = 2**48
"""Slots the channel moves during one operation, at most: more is the same for every budget below
it, a safe underestimate above (capacities are rounded down anyway), and the clamped values of up
to 10,000 stages add up in int64 without overflow."""


@dataclass(frozen=True)
class Slots:
    """An instance in slots (NOTE [ offload slot discretization ]); every field is int64."""

    sigma: float
    budget: int
    a: np.ndarray  # (n + 1,)
    g: np.ndarray  # (n + 1,)
    ef: np.ndarray  # (n,)
    eb: np.ndarray  # (n,)
    cf: np.ndarray  # (n,) slots the channel moves during F_k
    cb: np.ndarray  # (n,)
    fo: np.ndarray  # (n,) ceil(fo / sigma), for eq. (10)

    @property
    def n(self) -> int:
        return len(self.ef)


def discretize(
    inst: OffloadInstance,
    memory: int,
    slots: int,
    bump: np.ndarray | None = None,
    *,
    optimistic: bool = False,
) -> Slots:
    """The slot instance of NOTE [ offload slot discretization ], ``bump`` slots added to ``a``.

    With ``optimistic``, every quantity is rounded the other way (sizes and overheads down, the
    budget and the transfer capacities up): the DP's value on that instance is then a lower bound
    of Problem 2 (:func:`relaxation_bound`).
    """
    sigma = max(1.0, memory / slots)
    if optimistic:
        return Slots(
            sigma=sigma,
            budget=int(math.ceil(memory / sigma - _EPS)),
            a=np.floor(inst.a / sigma + _EPS).astype(np.int64),
            g=np.floor(inst.g / sigma + _EPS).astype(np.int64),
            ef=np.floor(inst.ef / sigma + _EPS).astype(np.int64),
            eb=np.floor(inst.bo / sigma + _EPS).astype(np.int64),
            cf=np.minimum(np.ceil(inst.uf * inst.beta / sigma - _EPS), MAX_MOVED).astype(np.int64),
            cb=np.minimum(np.ceil(inst.ub * inst.beta / sigma - _EPS), MAX_MOVED).astype(np.int64),
            fo=np.floor(inst.fo / sigma + _EPS).astype(np.int64),
        )
    if bump is None:
        bump = np.zeros(inst.n + 1, dtype=np.int64)

    def up(values: np.ndarray) -> np.ndarray:
        return np.ceil(values / sigma - _EPS).astype(np.int64)

    def down_partial(times: np.ndarray) -> np.ndarray:
        sums = np.concatenate(([0.0], np.cumsum(times * inst.beta)))
        moved = np.diff(np.floor(sums / sigma * (1 + _EPS) + _EPS))
        # A 1e12 ms operation at 1e14 B/s moves 1e23 bytes, beyond int64 (MAX_MOVED).
        return np.minimum(moved, MAX_MOVED).astype(np.int64)

    partial = np.concatenate(([0], np.cumsum(inst.a)))
    a = np.diff(np.ceil(partial / sigma - _EPS)).astype(np.int64) + bump
    return Slots(
        sigma=sigma,
        budget=int(math.floor(memory / sigma + _EPS)),
        a=a,
        g=up(inst.g),
        ef=up(inst.ef),
        eb=up(inst.bo),
        cf=down_partial(inst.uf),
        cb=down_partial(inst.ub),
        fo=up(inst.fo),
    )


def _group_running_min(values: np.ndarray, group_start: np.ndarray) -> np.ndarray:
    """For each position, the least of ``values`` at earlier positions of its group.

    Groups are runs that begin where ``group_start`` is True; positions with no earlier member get
    a value above every value. Values must be non-negative. One cumulative minimum over values
    lifted by a per-group offset that decreases from group to group, so that no minimum leaks from
    one group into the next.
    """
    if len(values) == 0:
        return values.copy()
    span = int(values.max()) + 2  # every value < span - 1, the sentinel
    shifted = np.empty_like(values)
    shifted[0] = span - 1
    shifted[1:] = values[:-1]
    shifted[group_start] = span - 1
    group_id = np.cumsum(group_start) - 1
    groups = int(group_id[-1]) + 1
    if groups * span >= 2**62:  # int64 would overflow: the same on the ranks of the values
        unique, ranks = np.unique(values, return_inverse=True)
        least = _group_running_min(ranks.reshape(-1).astype(np.int64), group_start)
        return np.append(unique, unique[-1] + 1)[least]
    lift = (groups - group_id) * span
    return np.minimum.accumulate(shifted + lift) - lift


def _lex_order(*keys: np.ndarray) -> np.ndarray:
    """A stable argsort by ``keys``, the first one most significant (as ``np.lexsort(keys[::-1])``).

    When the ranges of the keys multiply to less than 2**62, the keys are packed into one int64 and
    sorted once (about 5 times faster than a lexsort of four keys on a few thousand states).
    """
    span = 1
    lows = []
    for key in keys:
        low, high = int(key.min()), int(key.max())
        lows.append((low, high - low + 1))
        span *= high - low + 1
    if span >= 2**62:
        return np.lexsort(keys[::-1])
    packed = np.zeros(len(keys[0]), dtype=np.int64)
    for key, (low, width) in zip(keys, lows, strict=True):
        packed *= width
        packed += key - low
    return np.argsort(packed, kind="stable")


def prune(n_kept, delta_f, delta_b, idle) -> np.ndarray:
    """Indices of the states to keep: distinct and not dominated (module docstring).

    A state is dropped when another has the same ``N`` and ``Delta_F``, a ``Delta_B`` no larger and
    an idle time no larger (first pass), or the same ``Delta_F`` and ``Delta_B``, an ``N`` no
    larger and an idle time no larger (second pass). Exact duplicates keep one copy.
    """
    if len(idle) == 0:
        return np.zeros(0, dtype=np.int64)
    order = _lex_order(n_kept, delta_f, delta_b, idle)
    n_s, f_s, i_s = n_kept[order], delta_f[order], idle[order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = (n_s[1:] != n_s[:-1]) | (f_s[1:] != f_s[:-1])
    order = order[i_s < _group_running_min(i_s, start)]

    second = order[_lex_order(delta_f[order], delta_b[order], n_kept[order], idle[order])]
    f_s, b_s, i_s = delta_f[second], delta_b[second], idle[second]
    start = np.ones(len(second), dtype=bool)
    start[1:] = (f_s[1:] != f_s[:-1]) | (b_s[1:] != b_s[:-1])
    return second[i_s < _group_running_min(i_s, start)]


@dataclass
class DPResult:
    """What one run of Algorithm 1 found, in slots.

    ``sets`` are the offloaded sets of the best final states, best first (several with
    ``candidates > 1``), ``values`` their total idle times in slot units (one slot unit of time is
    ``sigma / beta`` ms); ``states`` the largest number of live states at any stage.
    """

    sets: list[np.ndarray]
    values: list[int]
    states: int
    work: int = 0
    aborted: bool = False


def run_dp(
    sl: Slots,
    *,
    candidates: int = 1,
    pruning: bool = True,
    work_limit: int | None = None,
    state_limit: int | None = None,
    deadline: Deadline | None = None,
) -> DPResult:
    """Algorithm 1 on a slot instance: the least total idle time and its offloaded set.

    Parameters
    ----------
    sl : Slots
        The discretized instance.
    candidates : int
        How many of the best final states to backtrack (distinct sets, best first).
    pruning : bool
        Drop dominated states (exact, see the module docstring); False keeps every distinct state,
        as the paper's hash tables do (for tests).
    work_limit : int, optional
        Stop (``aborted``) once the live states summed over the stages done exceed it: the cost of
        a run is about proportional to that sum (``work``), whatever the machine.
    state_limit : int, optional
        Stop (``aborted``) once more states than this are live at one stage (memory).
    deadline : Deadline, optional
        Checked at every stage (:class:`TimeLimitReached` once it has passed).

    Returns
    -------
    DPResult
        ``sets`` is empty when no state survives (no set fits in slots) or the run was aborted.
    """
    n, budget = sl.n, sl.budget
    a, g, ef, eb, cf, cb = sl.a, sl.g, sl.ef, sl.eb, sl.cf, sl.cb
    cap = budget  # slack beyond the budget never matters (docs/offload.md)
    zero = np.zeros(1, dtype=np.int64)
    n_kept, delta_f, delta_b, idle = zero, zero.copy(), zero.copy(), zero.copy()
    tables: list[tuple[np.ndarray, np.ndarray]] = []
    most, work = 1, 0
    deadline = deadline or Deadline()
    for k in range(n):
        deadline.check()
        pf = np.maximum(delta_f, 0)
        pb = np.maximum(delta_b, 0)
        # eq. (1): F_k waits until enough backlog of a[0..k-1] has left; a[k] stays for F_k.
        need_f = a[k] + n_kept + pf + a[k + 1] + ef[k] - budget
        # eq. (6): B_k (read backwards) waits until enough lower prefetching has been pushed later.
        need_b = g[k] + a[k] + n_kept + pb + a[k + 1] + g[k + 1] + eb[k] - budget
        ok = (need_f <= pf) & (need_b <= pb)
        if not ok.all():
            keep = np.flatnonzero(ok)
            n_kept, delta_f, delta_b, idle = n_kept[keep], delta_f[keep], delta_b[keep], idle[keep]
            pf, pb, need_f, need_b = pf[keep], pb[keep], need_f[keep], need_b[keep]
            if tables:
                tables[-1] = (tables[-1][0][keep], tables[-1][1][keep])
        if len(idle) == 0:
            return DPResult(sets=[], values=[], states=most, work=work)
        wait_f = np.maximum(need_f, 0)
        wait_b = np.maximum(need_b, 0)
        moved_f = wait_f + cf[k]
        moved_b = wait_b + cb[k]
        new_idle = idle + wait_f + wait_b
        # x_k kept: eq. (4), (5), (8).
        kept_f = np.maximum(delta_f - moved_f, -cap)
        kept_b = np.maximum(delta_b - moved_b, -cap)
        # x_k offloaded: eq. (2), (3), (7).
        off_f = np.maximum(pf + a[k] - moved_f, -cap)
        off_b = a[k] + np.maximum(delta_b - moved_b, 0)
        count = len(idle)
        parent = np.concatenate((np.arange(count), np.arange(count)))
        choice = np.concatenate((np.zeros(count, dtype=bool), np.ones(count, dtype=bool)))
        n_kept = np.concatenate((n_kept + a[k], n_kept))
        delta_f = np.concatenate((kept_f, off_f))
        delta_b = np.concatenate((kept_b, off_b))
        idle = np.concatenate((new_idle, new_idle))
        # States that cannot fit the next operations are dropped now (they would fail there).
        fits = np.flatnonzero(
            (n_kept + a[k + 1] + np.maximum(delta_f, 0) <= budget)
            & (g[k + 1] + a[k + 1] + n_kept + np.maximum(delta_b, 0) <= budget)
        )
        if pruning:
            keep_idx = fits[prune(n_kept[fits], delta_f[fits], delta_b[fits], idle[fits])]
        else:
            keep_idx = fits[_distinct(n_kept[fits], delta_f[fits], delta_b[fits], idle[fits])]
        n_kept, delta_f, delta_b, idle = (
            n_kept[keep_idx],
            delta_f[keep_idx],
            delta_b[keep_idx],
            idle[keep_idx],
        )
        tables.append((parent[keep_idx], choice[keep_idx]))
        most = max(most, len(idle))
        work += len(idle)
        if (work_limit is not None and work > work_limit) or (
            state_limit is not None and len(idle) > state_limit
        ):
            return DPResult(sets=[], values=[], states=most, work=work, aborted=True)
    if len(idle) == 0:
        return DPResult(sets=[], values=[], states=most, work=work)
    total = idle + _between_phases(sl, n_kept, delta_f, delta_b)
    # Best first; among equal idle times, keep more activations (fewer transfers).
    order = np.lexsort((-n_kept, total))
    sets: list[np.ndarray] = []
    values: list[int] = []
    seen: set[bytes] = set()
    for index in order:
        if len(sets) >= candidates:
            break
        mask = _backtrack(tables, int(index), n)
        if mask.tobytes() in seen:
            continue
        seen.add(mask.tobytes())
        sets.append(mask)
        values.append(int(total[index]))
    return DPResult(sets=sets, values=values, states=most, work=work)


def _distinct(n_kept, delta_f, delta_b, idle) -> np.ndarray:
    """Indices of one least-idle state per distinct ``(N, Delta_F, Delta_B)``: a hash table."""
    order = np.lexsort((idle, delta_b, delta_f, n_kept))
    same = np.ones(max(0, len(order) - 1), dtype=bool)
    for values in (n_kept, delta_f, delta_b):
        ordered = values[order]
        same &= ordered[1:] == ordered[:-1]
    first = np.ones(len(order), dtype=bool)
    first[1:] = ~same
    return order[first]


def _between_phases(sl: Slots, n_kept, delta_f, delta_b) -> np.ndarray:
    """``eps_G``, the idle time between ``F_{n-1}`` and ``B_{n-1}`` (eq. 9 and 10, docs/offload.md).

    ``max(0, Delta_F + Delta_B, M_F + max_j (R^B_j - U^B_j) - S, M_B + max_j (R^F_j - U^F_j) - S)``
    with signed ``Delta``s (a negative one is the channel's idle time): the channel finishes the
    offloads before the prefetches; a backward that starts while offloads are pending waits for
    room (eq. 9); a forward that runs while prefetches have begun must still fit (eq. 10). Taking
    the maxima over every ``j`` instead of the windows ``U_j < Av`` of the paper gives the same
    value (the terms outside the windows never exceed the others).
    """
    n, budget = sl.n, sl.budget
    a, g = sl.a, sl.g
    after = np.concatenate((np.cumsum(a[::-1])[::-1], [0]))  # after[j] = a[j] + .. + a[n]
    later = after[np.arange(n) + 2]  # sum_{i >= j+2} a[i]
    u_b = np.concatenate((np.cumsum(sl.cb[::-1])[::-1], [0]))[1:]  # sum_{i > j} cb[i]
    u_f = np.concatenate((np.cumsum(sl.cf[::-1])[::-1], [0]))[1:]
    r_b = sl.eb + g[:-1] + g[1:] - later
    r_f = sl.fo - later
    m_f = a[n] + n_kept + np.maximum(delta_f, 0)
    m_b = g[n] + a[n] + n_kept + np.maximum(delta_b, 0)
    return np.maximum.reduce(
        [
            np.zeros_like(m_f),
            delta_f + delta_b,
            m_f + int((r_b - u_b).max()) - budget,
            m_b + int((r_f - u_f).max()) - budget,
        ]
    )


def _backtrack(tables: list[tuple[np.ndarray, np.ndarray]], index: int, n: int) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    for k in range(n - 1, -1, -1):
        parent, choice = tables[k]
        mask[k] = choice[index]
        index = int(parent[index])
    return mask


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
    from memplan.algorithms.offload.lower_bound import lower_bound

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
    a, g = inst.a, inst.g
    kept = inst.kept_prefix(mask)
    forward = kept[:-1] + a[:-1] + a[1:] + inst.ef
    backward = kept[:-1] + a[:-1] + a[1:] + g[:-1] + g[1:] + inst.bo
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
    a, g, n = inst.a, inst.g, inst.n
    own = np.maximum(a[:-1] + a[1:] + inst.ef, a[:-1] + a[1:] + g[:-1] + g[1:] + inst.bo)
    room = (memory - own).tolist()
    sizes = a.tolist()
    mask = np.array(offloaded, dtype=bool, copy=True)
    kept, earliest = 0, 0
    for k in range(n):
        while kept > room[k]:
            while earliest < k and (mask[earliest] or sizes[earliest] == 0):
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
            found.values[0] = None  # the DP's value was that of the set before completion
            result.fitted = True
            break
        bump[_repair_indices(inst, sl, best, memory)] += 1
    result.sets = [m for m in found.sets if inst.feasible(m, memory)]
    result.values = [
        v for m, v in zip(found.sets, found.values, strict=True) if inst.feasible(m, memory)
    ]
    return result


def auto_grids(memory: int) -> list[int]:
    """The grids of ``slots="auto"``, coarse to fine: :data:`DEFAULT_SLOTS`, 10 and 100 times
    finer, then one byte per slot (``memory`` slots: sizes are not rounded at all)."""
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
    pool: list[tuple[np.ndarray, int | None, _GridResult | None]] = []
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
    details: dict = {"dp_runs": runs, "dp_work": work, "dp_states": states}
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
    chosen, value, grid = pool[0]
    if len(pool) > 1:
        best_time, seen = np.inf, set()
        for mask, total, source in pool:
            key = (mask & (inst.a[:n] > 0)).tobytes()
            if key in seen:
                continue
            seen.add(key)
            makespan = no_wait_makespan(inst, mask, memory)
            if makespan is not None and (best_time == np.inf or makespan < best_time - 1e-9):
                chosen, value, grid, best_time = mask, total, source, makespan
    details["candidates"] = len(pool)
    if grid is None:
        details["set_from"] = "greedy"
        return plan_from_set(inst, chosen, memory, slots=reported, details=details)
    details.update(slot_bytes=grid.sigma, set_from=f"{grid.slots} slots")
    if value is None:
        details["fitted_in_bytes"] = True
    else:
        details["relaxed_makespan"] = inst.compute_time + value * grid.sigma / inst.beta
    return plan_from_set(inst, chosen, memory, slots=grid.slots, details=details)
