"""The table of DYNPROG's dynamic program (Beaumont, Eyraud-Dubois & Shilova, Euro-Par 2020,
Algorithm 1), in slots: the discretization, the states stage by stage with dominance pruning, the
backtracking, and the relaxation bound. :mod:`memplan.algorithms.offload.dynprog` runs it on its grids
and turns its sets into schedules.

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
import numpy.typing as npt

from memplan.algorithms.offload.model import OffloadInstance
from memplan.algorithms.timeline import Deadline

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
    a: npt.NDArray[np.int64]  # (n + 1,)
    ac: npt.NDArray[np.int64]  # (n + 1,) a less what autograd frees (NOTE [ offload loop terms ])
    pinned: npt.NDArray[np.bool_]  # (n,) never offloaded
    g: npt.NDArray[np.int64]  # (n + 1,)
    ef: npt.NDArray[np.int64]  # (n,)
    eb: npt.NDArray[np.int64]  # (n,)
    cf: npt.NDArray[np.int64]  # (n,) slots the channel moves during F_k
    cb: npt.NDArray[np.int64]  # (n,)
    fo: npt.NDArray[np.int64]  # (n,) ceil(fo / sigma), for eq. (10)

    @property
    def n(self) -> int:
        return len(self.ef)


def discretize(
    inst: OffloadInstance,
    memory: int,
    slots: int,
    bump: npt.NDArray[np.int64] | None = None,
    *,
    optimistic: bool = False,
) -> Slots:
    """The slot instance of NOTE [ offload slot discretization ], ``bump`` slots added to ``a``.

    With ``optimistic``, every quantity is rounded the other way (sizes and overheads down, the
    budget and the transfer capacities up): the DP's value on that instance is then a lower bound
    of Problem 2 (:func:`relaxation_bound`).
    """
    sigma = max(1.0, memory / slots)
    freed = inst.a - inst.ac  # what autograd frees: ac = a - freed errs as the other sizes do
    if optimistic:
        a = np.floor(inst.a / sigma + _EPS).astype(np.int64)
        return Slots(
            sigma=sigma,
            budget=int(math.ceil(memory / sigma - _EPS)),
            a=a,
            ac=a - np.ceil(freed / sigma - _EPS).astype(np.int64),
            pinned=inst.pinned,
            g=np.floor(inst.g / sigma + _EPS).astype(np.int64),
            ef=np.floor(inst.ef / sigma + _EPS).astype(np.int64),
            eb=np.floor(inst.bo / sigma + _EPS).astype(np.int64),
            cf=np.minimum(np.ceil(inst.uf * inst.beta / sigma - _EPS), MAX_MOVED).astype(np.int64),
            cb=np.minimum(np.ceil(inst.ub * inst.beta / sigma - _EPS), MAX_MOVED).astype(np.int64),
            fo=np.floor(inst.fo / sigma + _EPS).astype(np.int64),
        )
    if bump is None:
        bump = np.zeros(inst.n + 1, dtype=np.int64)

    def up(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return np.ceil(values / sigma - _EPS).astype(np.int64)

    def down_partial(times: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
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
        ac=a - np.floor(freed / sigma + _EPS).astype(np.int64),
        pinned=inst.pinned,
        g=up(inst.g),
        ef=up(inst.ef),
        eb=up(inst.bo),
        cf=down_partial(inst.uf),
        cb=down_partial(inst.ub),
        fo=up(inst.fo),
    )


def _group_running_min(
    values: npt.NDArray[np.int64], group_start: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int64]:
    """For each position, the least of ``values`` at earlier positions of its group.

    Groups are runs that begin where ``group_start`` is True; positions with no earlier member get
    a value above every value. Values must be non-negative. One cumulative minimum over values
    lifted by a per-group offset that decreases from group to group, so that no minimum leaks from
    one group into the next.
    """
    if len(values) == 0:
        empty: npt.NDArray[np.int64] = values.copy()
        return empty
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
        by_rank: npt.NDArray[np.int64] = np.append(unique, unique[-1] + 1)[least]
        return by_rank
    lift = (groups - group_id) * span
    running: npt.NDArray[np.int64] = np.minimum.accumulate(shifted + lift) - lift
    return running


def _lex_order(*keys: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
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


def prune(
    n_kept: npt.NDArray[np.int64],
    delta_f: npt.NDArray[np.int64],
    delta_b: npt.NDArray[np.int64],
    idle: npt.NDArray[np.int64],
) -> npt.NDArray[np.intp]:
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
    a, ac, g, ef, eb = sl.a, sl.ac, sl.g, sl.ef, sl.eb
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
        need_b = g[k] + ac[k] + n_kept + pb + ac[k + 1] + g[k + 1] + eb[k] - budget
        ok = (need_f <= pf) & (need_b <= pb)
        if not ok.all():
            keep = np.flatnonzero(ok)
            n_kept, delta_f, delta_b, idle = n_kept[keep], delta_f[keep], delta_b[keep], idle[keep]
            pf, pb, need_f, need_b = pf[keep], pb[keep], need_f[keep], need_b[keep]
            if tables:
                tables[-1] = (tables[-1][0][keep], tables[-1][1][keep])
        if len(idle) == 0:
            return DPResult(sets=[], values=[], states=most, work=work)
        parent, choice, n_kept, delta_f, delta_b, idle = _successors(
            sl, k, n_kept, delta_f, delta_b, idle, pf, pb, need_f, need_b
        )
        # States that cannot fit the next operations are dropped now (they would fail there).
        fits = np.flatnonzero(
            (n_kept + a[k + 1] + np.maximum(delta_f, 0) <= budget)
            & (g[k + 1] + ac[k + 1] + n_kept + np.maximum(delta_b, 0) <= budget)
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
    sets, values = _best_sets(tables, total, n_kept, candidates, n)
    return DPResult(sets=sets, values=values, states=most, work=work)


def _successors(
    sl: Slots,
    k: int,
    n_kept: npt.NDArray[np.int64],
    delta_f: npt.NDArray[np.int64],
    delta_b: npt.NDArray[np.int64],
    idle: npt.NDArray[np.int64],
    pf: npt.NDArray[np.int64],
    pb: npt.NDArray[np.int64],
    need_f: npt.NDArray[np.int64],
    need_b: npt.NDArray[np.int64],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The states after stage ``k``: each state's successor with ``x_k`` kept (eqs. 4, 5, 8),
    then, unless ``a[k]`` is pinned, with it offloaded (eqs. 2, 3, 7); ``(parent, choice,
    n_kept, delta_f, delta_b, idle)``, ``choice`` True where offloaded.
    """
    a, ac, cf, cb, cap = (
        sl.a,
        sl.ac,
        sl.cf,
        sl.cb,
        sl.budget,
    )  # slack beyond the budget never matters (docs/offload.md)
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
    copies = 1 if sl.pinned[k] else 2  # a pinned a[k] is only kept
    parent = np.tile(np.arange(count), copies)
    choice = np.repeat(np.array([False, True])[:copies], count)
    return (
        parent,
        choice,
        np.concatenate((n_kept + ac[k], n_kept)[:copies]),
        np.concatenate((kept_f, off_f)[:copies]),
        np.concatenate((kept_b, off_b)[:copies]),
        np.tile(new_idle, copies),
    )


def _best_sets(
    tables: list[tuple[np.ndarray, np.ndarray]],
    total: npt.NDArray[np.int64],
    n_kept: npt.NDArray[np.int64],
    candidates: int,
    n: int,
) -> tuple[list[np.ndarray], list[int]]:
    """Up to ``candidates`` distinct offloaded sets of the final states, best first (among equal
    idle times, the one that keeps more activations: fewer transfers), and their idle times.
    """
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
    return sets, values


def _distinct(
    n_kept: npt.NDArray[np.int64],
    delta_f: npt.NDArray[np.int64],
    delta_b: npt.NDArray[np.int64],
    idle: npt.NDArray[np.int64],
) -> npt.NDArray[np.intp]:
    """Indices of one least-idle state per distinct ``(N, Delta_F, Delta_B)``: a hash table."""
    order = np.lexsort((idle, delta_b, delta_f, n_kept))
    same = np.ones(max(0, len(order) - 1), dtype=bool)
    for values in (n_kept, delta_f, delta_b):
        ordered = values[order]
        same &= ordered[1:] == ordered[:-1]
    first = np.ones(len(order), dtype=bool)
    first[1:] = ~same
    return order[first]


def _between_phases(
    sl: Slots,
    n_kept: npt.NDArray[np.int64],
    delta_f: npt.NDArray[np.int64],
    delta_b: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """``eps_G``, the idle time between ``F_{n-1}`` and ``B_{n-1}`` (eq. 9 and 10, docs/offload.md).

    ``max(0, Delta_F + Delta_B, M_F + max_j (R^B_j - U^B_j) - S, M_B + max_j (R^F_j - U^F_j) - S)``
    with signed ``Delta``s (a negative one is the channel's idle time): the channel finishes the
    offloads before the prefetches; a backward that starts while offloads are pending waits for
    room (eq. 9); a forward that runs while prefetches have begun must still fit (eq. 10). Taking
    the maxima over every ``j`` instead of the windows ``U_j < Av`` of the paper gives the same
    value (the terms outside the windows never exceed the others).
    """
    n, budget = sl.n, sl.budget
    a, ac, g = sl.a, sl.ac, sl.g
    after = np.concatenate((np.cumsum(ac[::-1])[::-1], [0]))  # after[j] = ac[j] + .. + ac[n]
    later = after[np.arange(n) + 2]  # sum_{i >= j+2} ac[i]
    u_b = np.concatenate((np.cumsum(sl.cb[::-1])[::-1], [0]))[1:]  # sum_{i > j} cb[i]
    u_f = np.concatenate((np.cumsum(sl.cf[::-1])[::-1], [0]))[1:]
    r_b = sl.eb + g[:-1] + g[1:] - later
    cut = a - ac  # F_j holds a[j] and a[j+1] whole (NOTE [ offload loop terms ])
    r_f = sl.fo + cut[:-1] + cut[1:] - later
    m_f = a[n] + n_kept + np.maximum(delta_f, 0)
    m_b = g[n] + a[n] + n_kept + np.maximum(delta_b, 0)
    eps_g: npt.NDArray[np.int64] = np.maximum.reduce(
        [
            np.zeros_like(m_f),
            delta_f + delta_b,
            m_f + int((r_b - u_b).max()) - budget,
            m_b + int((r_f - u_f).max()) - budget,
        ]
    )
    return eps_g


def _backtrack(tables: list[tuple[np.ndarray, np.ndarray]], index: int, n: int) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    for k in range(n - 1, -1, -1):
        parent, choice = tables[k]
        mask[k] = choice[index]
        index = int(parent[index])
    return mask
