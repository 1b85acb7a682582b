"""``pofo``: the fastest schedule of the combined model (Efficient Combination of Rematerialization and Offloading, NeurIPS 2021; docs/combined.md).

It returns the fastest of four valid combined schedules:

* ``frac``: the dynamic program of Theorem 1 of Efficient Combination of Rematerialization and Offloading (NeurIPS 2021) with Lemma 1's fractional transfers
  (:class:`FractionalDP`, NOTE [ pofo fractional recurrences ]), its decisions timed with whole
  tensors by :func:`realize` (its DP value is ``details["frac_value"]``, its simulated makespan
  ``details["frac"]``);
* ``dp``: the whole-tensor windowed DP (:class:`PofoDP`, NOTE [ pofo recurrences ]), exact in its
  own model, on chains of at most :data:`WINDOW_STAGES` stages or when ``frac`` has no schedule;
* ``rotor``'s plan (no transfers) and, when the bandwidth allows offloading and the budget fits,
  ``dynprog``'s (every forward ``F_all``).

Each is a schedule of the combined model, so the result is never slower than either technique alone;
which one won is in ``details["source"]``. They are computed in the order dynprog (where
store-all does not fit), rotor, then the DPs, so that ``--time-limit`` (a
:class:`~memplan.algorithms.timeline.Deadline`) returns the fastest found by then, and none after
one that reaches the lower bound (every forward and backward once: nothing is faster): where
dynprog reaches it pofo costs about dynprog (rotor, cubic in the stages, does not run), where
rotor does, at most both.

NOTE [ pofo loop terms ]
------------------------
rotor's and dynprog's candidates plan under the training loop's terms of the request exactly
(docs/model.md, "The training loop"; NOTE [ offload loop terms ]), so pofo is never slower than
either at any budget, whichever the loop. Its two DPs and the realization of their plans
(:mod:`.realize`) plan in the model before the terms on a chain that folds them in
(:func:`dp_chain`): the gradients held while a sub-chain runs include the weight gradients of the
stages after it (``g'[k] = g[k] + wh[k]``), ``B k``'s overhead is ``bo[k] - wh[k+1]`` (so that
its need ``g'[k+1] + s[k] + g'[k] + bo'[k]`` is exactly the loop's; at least ``-g'[k]``: a
backward that frees more than it makes needs the memory held before it, where a prefetch
overlapping it must fit too), ``F_all`` takes its own overhead in the Theorem 1 DP (the compiled
kernels' ``fa``) and the realization, the larger of both in the window DP (its rotor tables read
one), and autograd's frees are not counted (they only lower the memory) but the loss's, whose
``B`` always follows its ``F_all`` (``B L-1`` needs the freed input less): every plan of the DPs
fits in the loop's accounting, at worst a little above its least memory. The input of a segment that ``F_all`` frees is never offloaded
(T6 of docs/combined.md).

NOTE [ pofo on long chains ]
----------------------------
Chains of at most :data:`EXACT_STAGES` stages run the Theorem 1 DP in full, as Appendix B.4 of
*Efficient Combination of Rematerialization and Offloading for Training DNNs* (NeurIPS 2021)
does. Longer ones run it on a window (NOTE [ pofo window ]) sized by :data:`WINDOW_WORK` (about 7
stages at 100 stages, :data:`MIN_WINDOW` from about 300) and only look for plans faster than the
rotor and dynprog candidates (NOTE [ pofo pruning ]), rounding sizes up when the nearest slot
gives no plan that fits (:func:`_fractional`); when one of those candidates already reaches the
lower bound, the DP does not run at all, and the window DP (a Python recursion) never runs
there. The DP's tables stay within :data:`TABLE_LIMIT` bytes; a chain that needs more even at the
narrowest window is refused (InputError, exit 2, naming the limit and the ``--slots`` that fit).

NOTE [ pofo slots auto ]
------------------------
The Theorem 1 DP rounds sizes to slots of 2% of the budget at 50 slots, and its tables grow as
the cube of the slots (at most :data:`FINE_SLOTS`, 64). Against 64 slots, 50 lost up to 2.2% of
makespan on resnet34@a100 and 13.4% on resnet101@a100 at rotor's least memory, where 50 slots gave
it no schedule (benchmarks/bench_offload_slots.py, docs/benchmarks.md). ``slots="auto"`` (the
default) runs it at 50 slots and, on chains of at most :data:`FINE_STAGES` stages (or when 50 gives
no schedule), at 64 too, and keeps the faster realized schedule (the coarser on ties): never slower
than 50 slots alone, for 1.5-2x the DP's time where both run. The window DP stays at 50 slots,
rotor at its own default, dynprog at its own (``auto``, NOTE [ offload slots auto ]).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from memplan.algorithms.base import ChainPlan, OffloadPlan, Sequence, Transfer
from memplan.algorithms.chain.least_memory import least_memory_bounds
from memplan.algorithms.chain.problem import ChainInstance
from memplan.algorithms.chain.rotor import plan_rotor
from memplan.algorithms.combined.fractional import MAX_SLOTS as FRACTIONAL_MAX_SLOTS
from memplan.algorithms.combined.fractional import FractionalDP, table_bytes
from memplan.algorithms.combined.pofo import PofoDP
from memplan.algorithms.combined.realize import plan_peak, realize
from memplan.algorithms.offload.dynprog import solve_dynprog
from memplan.algorithms.offload.model import OffloadInstance
from memplan.algorithms.timeline import Deadline, TimeLimitReached
from memplan.errors import InputError
from memplan.schedule import Status

DEFAULT_SLOTS = 50
"""Slots of the pofo DP (Efficient Combination of Rematerialization and Offloading (NeurIPS 2021) §5: 50 values are enough in its experiments)."""
FINE_SLOTS = FRACTIONAL_MAX_SLOTS
"""With ``slots="auto"``, chains of at most :data:`FINE_STAGES` stages also run the Theorem 1 DP
on its finest grid (NOTE [ pofo slots auto ])."""
FINE_STAGES = 24
"""The longest chain on which ``slots="auto"`` runs the Theorem 1 DP at :data:`FINE_SLOTS` too:
0.2-0.4 s more on the bundled profiles of up to 19 stages, 1.5-3.3 s more on resnet101 (36).
Longer chains run it there only when the 50-slot grid gives no schedule."""
EXACT_STAGES = 50
"""Chains of at most this many stages run the Theorem 1 DP in full (every segment, every state
that may lead to its optimum); longer ones on a window (NOTE [ pofo window ])."""
WINDOW_WORK = 6_500_000
"""Entries of the backward tables' recurrences (about ``L window^2 (C + 1)^2 / 2``) that the
window of a long chain is sized for; the forward phase, whose states the window does not bound
(its options grow with it), takes most of the DP's time: 0.6-0.9 s per run at 100 stages."""
MIN_WINDOW = 4
"""The narrowest window (stages of a recomputed segment, the tail aside)."""
LONG_RETRIES = 3
"""On chains longer than :data:`EXACT_STAGES`, how many times the Theorem 1 DP runs again with the
excess of its plan kept aside (one on shorter chains): with hundreds of tensors of about a slot,
rounding to the nearest slot misses by several slots."""
TABLE_LIMIT = 2 * 10**9
"""Bytes the Theorem 1 DP's tables may take; beyond, even at :data:`MIN_WINDOW`, pofo refuses."""
INF = float("inf")
WINDOW_STAGES = 16
"""The window DP runs on chains of at most this many stages (or when the Theorem 1 DP finds no
schedule): its Python recursion costs more than the Theorem 1 DP on long chains, where it never won
in benchmarks/bench_combined.py."""


def _timed(chain: ChainInstance, sequence: Sequence) -> list[Transfer]:
    ops: list[Transfer] = []
    clock = 0.0
    for name, k in sequence:
        d = chain.duration(name, k)
        ops.append((name, k, clock, clock + d, "compute", None))
        clock += d
    return ops


def dp_chain(chain: ChainInstance) -> tuple[ChainInstance, npt.NDArray[np.bool_]]:
    """The chain pofo's DPs and realization plan on, and the segment inputs they never offload
    (NOTE [ pofo loop terms ]); ``chain`` itself (nothing pinned) in the model before the loop's
    terms.
    """
    pinned = np.asarray(chain.freed > 0, dtype=bool)
    if chain.fa is None and chain.wh is None and chain.fr is None:
        return chain, pinned
    held = chain.held_grads  # wh[k], k = 0 .. L
    g = chain.g + held
    # B k reserves nothing below 0: the moment before it starts is then its peak
    bo = np.maximum(chain.bo - held[1:], -g[:-1])
    # The loss's F_all is always right before its B: where it frees its input (a language
    # model's logits), its backward finds that much less in memory, exactly.
    bo[-1] -= chain.freed[-1]
    folded = ChainInstance(
        x=chain.x,
        s=chain.s,
        g=g,
        fo=chain.fo,
        bo=bo,
        ft=chain.ft,
        bt=chain.bt,
        names=chain.names,
        fa=chain.fall,  # the Theorem 1 DP and the realization read F_all's own overhead
    )
    return folded, pinned


def _one_overhead(chain: ChainInstance) -> ChainInstance:
    """``chain`` with one forward overhead, the larger of ``fo`` and ``fa``, for the window DP,
    whose rotor tables read one (NOTE [ pofo loop terms ]).
    """
    if chain.fa is None:
        return chain
    return ChainInstance(
        chain.x, chain.s, chain.g, np.maximum(chain.fo, chain.fa), chain.bo, chain.ft, chain.bt,
        chain.names,
    )  # fmt: skip


def solve_pofo(
    chain: ChainInstance,
    memory: int,
    *,
    bandwidth: float,
    slots: int | str = "auto",
    rotor_slots: int | str | None = None,
    offload_instance: OffloadInstance | None = None,
    dynprog_slots: int | str = "auto",
    deadline: Deadline | None = None,
) -> OffloadPlan:
    """Fastest combined schedule found within ``memory`` activation bytes.

    Parameters
    ----------
    chain : ChainInstance
        The chain, under the training loop's terms the plan is for (NOTE [ pofo loop terms ]).
    memory : int
        Bytes for activations, ``x[0]`` included (budget minus static memory).
    bandwidth : float
        Host<->device bytes/s; 0 forbids transfers.
    slots : int or "auto"
        Slots of the DPs (2 to 10000). ``"auto"`` (the default): 50 as in Efficient Combination of Rematerialization and Offloading (NeurIPS 2021) §5, and on
        chains of at most :data:`FINE_STAGES` stages the Theorem 1 DP on its finest grid
        (:data:`FINE_SLOTS`) too, the faster schedule kept (NOTE [ pofo slots auto ]).
    rotor_slots : int or "auto", optional
        Slots of the rotor candidate (default: ``slots`` when it is a number, rotor's own default,
        ``"auto"``, with ``"auto"``, so that pofo is never slower than rotor run with its defaults).
    offload_instance : OffloadInstance, optional
        The same chain for the offloading family (under the same loop), to try dynprog's schedule
        too.
    dynprog_slots : int or "auto"
        Slots of the dynprog candidate (default ``"auto"``, dynprog's own default: finer grids
        while they are cheap, NOTE [ offload slots auto ]).
    deadline : Deadline, optional
        When to stop (``--time-limit``): the candidates are computed dynprog first (where
        store-all does not fit), then rotor, then the DPs, and the fastest found by then is
        returned (``details["stopped"]``).

    Returns
    -------
    OffloadPlan
        Timed operations (``ops``) and ``claimed_makespan``; ``infeasible`` with ``min_memory`` the
        least budget at which rotor or dynprog fit (a budget at which pofo surely fits) otherwise.
        A candidate that reaches the lower bound ends the search (``details["bound_reached"]``
        names it).

    Raises
    ------
    InputError
        When the Theorem 1 DP's tables would exceed :data:`TABLE_LIMIT` bytes even with the
        narrowest window (NOTE [ pofo window ]).
    """
    deadline = deadline or Deadline()
    lower = chain.lower_bound
    peak = chain.store_all_peak()
    auto = slots == "auto"
    grid = DEFAULT_SLOTS if auto else int(slots)
    offload = offload_instance if bandwidth > 0 else None
    found = _Candidates(lower)
    try:
        _search(
            found,
            chain,
            memory,
            bandwidth,
            grid,
            auto,
            rotor_slots,
            offload,
            dynprog_slots,
            deadline,
        )
    except TimeLimitReached:
        found.details["stopped"] = "time limit"
    least = _least_memory(chain, found.rotor, offload)
    if not found.plans:
        stopped = "stopped" in found.details
        return OffloadPlan(
            ops=None,
            status="unknown" if stopped else "infeasible",
            lower_bound=lower,
            peak=peak,
            min_memory=None if stopped else least,
            slots=grid,
            message="the time limit passed before any combined schedule was found"
            if stopped
            else "no combined schedule fits: neither recomputing everything nor offloading "
            "every activation does",
        )
    details = found.details
    # Ties go to the simpler plan: rotor (no transfers), then dynprog, then the DP's.
    rank = {"rotor": 0, "dynprog": 1, "dp": 2, "frac": 3}
    value, source, ops = min(found.plans, key=lambda c: (round(c[0], 9), rank[c[1]]))
    details["source"] = source
    for v, name, _ in found.plans:
        details[name] = v
    status: Status = "optimal" if value <= lower * (1 + 1e-12) else "feasible"
    return OffloadPlan(
        ops=ops,
        status=status,
        lower_bound=lower,
        peak=peak,
        claimed_makespan=value,
        min_memory=least,
        slots=details["frac_slots"] if auto and source == "frac" else grid,
        message=_summary(source, details),
        details=details,
    )


class _Candidates:
    """The plans :func:`solve_pofo` found so far, ``(makespan, source, operations)``, what the
    search noted (``details``), and rotor's plan once it is made.
    """

    def __init__(self, lower: float) -> None:
        self.lower = lower
        self.plans: list[tuple[float, str, list[Transfer]]] = []
        self.details: dict[str, Any] = {}
        self.rotor: ChainPlan | None = None

    def reached(self) -> bool:
        """Whether a candidate reaches the lower bound: nothing can beat it."""
        best = min((c[0] for c in self.plans), default=INF)
        if best <= self.lower * (1 + 1e-12):
            self.details["bound_reached"] = min(self.plans)[1]
            return True
        return False


def _search(
    found: _Candidates,
    chain: ChainInstance,
    memory: int,
    bandwidth: float,
    grid: int,
    auto: bool,
    rotor_slots: int | str | None,
    offload: OffloadInstance | None,
    dynprog_slots: int | str,
    deadline: Deadline,
) -> None:
    """The candidates in the order of :func:`solve_pofo`'s ``deadline``: dynprog (where store-all
    does not fit), rotor, then the DPs, until one reaches the lower bound.
    """
    if offload is not None and chain.store_all_peak() > memory:
        # dynprog first where store-all does not fit: cheap, and where it reaches the lower
        # bound, rotor (cubic in the stages) is not needed
        plan = solve_dynprog(offload, memory, slots=dynprog_slots, deadline=deadline)
        if plan.ops is not None:
            assert plan.claimed_makespan is not None, "a dynprog plan states its makespan"
            found.plans.append((plan.claimed_makespan, "dynprog", list(plan.ops)))
    if not found.reached():
        rotor = found.rotor = _rotor_plan(chain, memory, rotor_slots, grid if not auto else None)
        if rotor.sequence is not None:
            assert rotor.claimed_makespan is not None, "a rotor plan states its makespan"
            found.plans.append((rotor.claimed_makespan, "rotor", _timed(chain, rotor.sequence)))
    if found.rotor is not None and memory - int(chain.x[0]) >= 0 and not found.reached():
        exact = chain.length <= EXACT_STAGES
        folded, pinned = dp_chain(chain)
        window = None if exact else pofo_window(folded, memory, grid)
        if window is not None:
            found.details["window"] = window
        _dynamic_programs(
            folded,
            pinned,
            memory,
            bandwidth,
            grid,
            auto,
            found.rotor,
            rotor_slots,
            found.details,
            found.plans,
            window,
            deadline,
        )


def _rotor_plan(
    chain: ChainInstance, memory: int, rotor_slots: int | str | None, grid: int | None
) -> ChainPlan:
    """Rotor's candidate: at ``rotor_slots`` when given, else on pofo's ``grid`` when given, else
    at rotor's own default (so that pofo is never slower than rotor run with its defaults).
    """
    if rotor_slots is not None:
        return plan_rotor(chain, memory, slots=rotor_slots)
    if grid is None:
        return plan_rotor(chain, memory)
    return plan_rotor(chain, memory, slots=grid)


def _least_memory(
    chain: ChainInstance, rotor: ChainPlan | None, offload: OffloadInstance | None
) -> int:
    """Pofo's ``min_memory``: the least of rotor's and dynprog's, a budget where pofo surely
    fits. Where rotor did not run (dynprog reached the lower bound) and the chain's least memory
    is not settled by its bounds, the chain's is the upper bound (the recompute-all plan's peak:
    NOTE [ least memory ]), so as not to run the cubic least-memory DP for a plan that needs none.
    """
    if rotor is not None and rotor.min_memory is not None:
        least = rotor.min_memory
    else:
        least = least_memory_bounds(chain)[1]
    return least if offload is None else min(least, offload.min_memory())


def _dynamic_programs(
    chain: ChainInstance,
    pinned: npt.NDArray[np.bool_],
    memory: int,
    bandwidth: float,
    grid: int,
    auto: bool,
    rotor: ChainPlan,
    rotor_slots: int | str | None,
    details: dict[str, Any],
    candidates: list[tuple[float, str, list[Transfer]]],
    window: int | None,
    deadline: Deadline,
) -> None:
    """The candidates of the Theorem 1 DP (``frac``) and of the window DP (``dp``), added to
    ``candidates``; ``chain`` is :func:`dp_chain`'s, ``pinned`` the segment inputs never
    offloaded. On chains longer than :data:`EXACT_STAGES`, the Theorem 1 DP runs on a ``window``
    and only looks for plans faster than the candidates already found (NOTE [ pofo window ]); the
    window DP does not run there.
    """
    # A plan that moves a tensor lasts at least its offload and its prefetch: when even the
    # smallest one cannot beat rotor that way, no transfer can help and pofo is rotor.
    sizes = [int(v) for v in (*chain.x, *chain.s) if v > 0]
    slowest = INF if bandwidth <= 0 or not sizes else 2 * min(sizes) / (bandwidth / 1000.0)
    found: list[tuple[float, str, list[Transfer]]] = []
    rotor_time = rotor.claimed_makespan if rotor.sequence is not None else None
    if slowest < (INF if rotor_time is None else rotor_time):
        # Rounded up at a coarser grid than rotor's, the DP's plan is not worth a third run.
        finer_rotor = (
            auto or rotor_slots == "auto" or (isinstance(rotor_slots, int) and rotor_slots > grid)
        )
        short = chain.length <= FINE_STAGES
        exact = window is None
        bound = INF if exact else min((c[0] for c in candidates), default=INF)
        found = _fractional_grids(
            chain,
            memory,
            bandwidth,
            [grid] + ([FINE_SLOTS] if auto and short else []),
            pinned,
            details,
            round_up=not finer_rotor,
            fallback=FINE_SLOTS if auto and not short and exact else None,
            window=window,
            bound=bound,
            deadline=deadline,
        )
        candidates += found
    # The window DP: on short chains (cheap there), or when the Theorem 1 DP gave nothing.
    if chain.length <= WINDOW_STAGES or (not found and window is None):
        dp = PofoDP(_one_overhead(chain), memory, bandwidth, grid, pinned=pinned)
        value = dp.solve()
        details["dp"] = value
        if value < float("inf"):
            candidates.append((value, "dp", dp.schedule()))


def pofo_window(chain: ChainInstance, memory: int, slots: int) -> int:
    """The window of the Theorem 1 DP on a chain longer than :data:`EXACT_STAGES` (NOTE [ pofo
    window ]): as wide as :data:`WINDOW_WORK` allows, at least :data:`MIN_WINDOW`, and within
    :data:`TABLE_LIMIT` bytes of tables (else :class:`InputError`).
    """
    L = chain.length
    width = _dp_width(chain, memory, slots)
    work = int(math.sqrt(2 * WINDOW_WORK / (L * width * width)))
    window = max(MIN_WINDOW, min(L, work))
    while window > MIN_WINDOW and table_bytes(L, window, width) > TABLE_LIMIT:
        window -= 1
    need = table_bytes(L, window, width)
    if need > TABLE_LIMIT:
        most = slots
        while most > 2 and table_bytes(L, window, _dp_width(chain, memory, most)) > TABLE_LIMIT:
            most -= 1
        hint = (
            f"use --slots {most} or fewer"
            if most < slots
            and table_bytes(L, window, _dp_width(chain, memory, most)) <= TABLE_LIMIT
            else "use rotor or dynprog"
        )
        raise InputError(
            f"pofo: the DP tables for {L} stages would take {need / 1e9:.3g} GB at {slots} slots, "
            f"above the limit of {TABLE_LIMIT / 1e9:g} GB; {hint}"
        )
    return window


def _dp_width(chain: ChainInstance, memory: int, slots: int) -> int:
    """``C + 1`` of :class:`FractionalDP` at ``slots`` (its tables are ``(C + 1)^2`` per pair)."""
    return FractionalDP(chain, memory, 1.0, slots).W


def _summary(source: str, details: dict[str, Any]) -> str:
    """``solver.message``: the winner, then every candidate's value (ms; '-' when none)."""

    def ms(key: str) -> str:
        v = details.get(key)
        return "-" if v is None or v == float("inf") else f"{v:.3f} ms"

    return (
        f"{source}: Theorem 1 DP {ms('frac_value')}, its whole-tensor schedule {ms('frac')}; "
        f"window DP {ms('dp')}; rotor {ms('rotor')}; dynprog {ms('dynprog')}"
    )


def _fractional_grids(
    chain: ChainInstance,
    memory: int,
    bandwidth: float,
    grids: list[int],
    pinned: npt.NDArray[np.bool_],
    details: dict[str, Any],
    *,
    round_up: bool = True,
    fallback: int | None = None,
    window: int | None = None,
    bound: float = INF,
    deadline: Deadline | None = None,
) -> list[tuple[float, str, list[Transfer]]]:
    """:func:`_fractional` on each grid; the fastest realized schedule (the first on ties).

    ``fallback``: one more grid, tried only when none of ``grids`` gave a schedule. ``details``
    gets the ``frac_*`` entries of the grid that won (of the first grid when none gave a
    schedule) and ``frac_grids``, the grids tried.
    """
    best: list[tuple[float, str, list[Transfer]]] = []
    best_details: dict[str, Any] | None = None
    grids = list(grids)
    for grid in grids:
        own: dict[str, Any] = {}
        found = _fractional(
            chain,
            memory,
            bandwidth,
            grid,
            pinned,
            own,
            round_up=round_up,
            window=window,
            bound=bound,
            deadline=deadline,
        )
        if best_details is None or (found and (not best or found[0][0] < best[0][0] - 1e-9)):
            best_details = own
            best = found or best
        if not best and fallback is not None and grid == grids[-1]:
            grids.append(fallback)
            fallback = None
    details.update(best_details or {})
    if len(grids) > 1:
        details["frac_grids"] = ", ".join(str(g) for g in grids)
    return best


def _fractional(
    chain: ChainInstance,
    memory: int,
    bandwidth: float,
    slots: int,
    pinned: npt.NDArray[np.bool_],
    details: dict[str, Any],
    *,
    round_up: bool = True,
    window: int | None = None,
    bound: float = INF,
    deadline: Deadline | None = None,
) -> list[tuple[float, str, list[Transfer]]]:
    """The fractional DP's value and its whole-tensor realization (a candidate, if it replays).

    Roundings (docs/algorithms.md, pofo): sizes rounded to the nearest slot with 2% of the slots
    kept aside (less lost to rounding; the realization checks the bytes exactly); if that plan
    needs more bytes than the budget, once more with the excess kept aside too (on a ``window``,
    a long chain of many small tensors, up to :data:`LONG_RETRIES` times); then, if
    ``round_up`` or on a ``window``, sizes rounded up (the DP's plan then fits by construction).
    On a window the last matters: where tensors are about half a slot (500 stages at 50 slots),
    rounding to the nearest slot counts half of them as free, and the plans it finds need up to
    twice the budget whatever is kept aside; rounded up, they fit.
    """
    margin = max(1, round(0.02 * slots))
    retries = 1 if window is None else LONG_RETRIES
    attempts: list[int | None] = [margin]  # a margin (nearest rounding), None: rounded up
    if round_up or window is not None:
        attempts.append(None)
    while attempts:
        attempt = attempts.pop(0)
        nearest = attempt is not None
        dp = FractionalDP(
            chain,
            memory,
            bandwidth,
            slots,
            nearest=nearest,
            margin=attempt or 0,
            window=window,
            bound=bound,
            deadline=deadline,
            pinned=pinned,
        )
        value = dp.solve()
        details["frac_value"] = value
        details["frac_slots"] = dp.slots
        details["frac_rounding"] = f"nearest, {attempt} slots aside" if nearest else "up"
        if value == float("inf"):
            continue
        plan = dp.plan()
        need = plan_peak(chain, plan.sequence, plan.offloads, plan.prefetches)
        if need is None or need > memory:
            if attempt is not None and retries > 0 and need is not None:
                retries -= 1
                attempts.insert(0, attempt + int(math.ceil((need - memory) / dp.unit)) + 1)
            continue
        ops = realize(chain, plan.sequence, plan.offloads, plan.prefetches, memory, bandwidth)
        if ops is None:  # pragma: no cover - the realization waits rather than fails
            continue
        return [(max(op[3] for op in ops), "frac", ops)]
    return []


__all__ = ["DEFAULT_SLOTS", "FINE_SLOTS", "FINE_STAGES", "WINDOW_STAGES", "solve_pofo"]
