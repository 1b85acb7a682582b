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
which one won is in ``details["source"]``.

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

from memplan.algorithms.base import OffloadPlan, Transfer
from memplan.algorithms.chain.problem import Chain
from memplan.algorithms.chain.rotor import chain_min_memory, plan_rotor
from memplan.algorithms.combined.fractional import MAX_SLOTS as FRACTIONAL_MAX_SLOTS
from memplan.algorithms.combined.fractional import FractionalDP
from memplan.algorithms.combined.pofo import PofoDP
from memplan.algorithms.combined.realize import plan_peak, realize
from memplan.algorithms.offload.dynprog import solve_dynprog

DEFAULT_SLOTS = 50
"""Slots of the pofo DP (Efficient Combination of Rematerialization and Offloading (NeurIPS 2021) §5: 50 values are enough in its experiments)."""
FINE_SLOTS = FRACTIONAL_MAX_SLOTS
"""With ``slots="auto"``, chains of at most :data:`FINE_STAGES` stages also run the Theorem 1 DP
on its finest grid (NOTE [ pofo slots auto ])."""
FINE_STAGES = 24
"""The longest chain on which ``slots="auto"`` runs the Theorem 1 DP at :data:`FINE_SLOTS` too:
0.2-0.4 s more on the bundled profiles of up to 19 stages, 1.5-3.3 s more on resnet101 (36).
Longer chains run it there only when the 50-slot grid gives no schedule."""
INF = float("inf")
WINDOW_STAGES = 16
"""The window DP runs on chains of at most this many stages (or when the Theorem 1 DP finds no
schedule): its Python recursion costs more than the Theorem 1 DP on long chains, where it never won
in benchmarks/bench_combined.py."""


def _timed(chain: Chain, sequence: list[tuple[str, int]]) -> list[Transfer]:
    ops: list[Transfer] = []
    clock = 0.0
    for name, k in sequence:
        d = chain.duration(name, k)
        ops.append((name, k, clock, clock + d, "compute", None))
        clock += d
    return ops


def solve_pofo(
    chain: Chain,
    memory: int,
    *,
    bandwidth: float,
    slots: int | str = "auto",
    rotor_slots: int | str | None = None,
    offload_instance=None,
    profile=None,
    dynprog_slots: int | str = "auto",
) -> OffloadPlan:
    """Fastest combined schedule found within ``memory`` activation bytes.

    Parameters
    ----------
    chain : Chain
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
        The same chain for the offloading family, to try dynprog's schedule too.
    dynprog_slots : int or "auto"
        Slots of the dynprog candidate (default ``"auto"``, dynprog's own default: finer grids
        while they are cheap, NOTE [ offload slots auto ]).
    profile : Profile, optional
        The chain's profile: the realized ``frac`` schedule is then replayed by
        :func:`memplan.simulator.simulate_combined` and dropped (``details["frac_rejected"]``) if the
        replay disagrees (a safety net; the tests check that it never triggers).

    Returns
    -------
    OffloadPlan
        Timed operations (``ops``) and ``claimed_makespan``; ``infeasible`` with ``min_memory`` the
        least budget at which rotor or dynprog fit (a budget at which pofo surely fits) otherwise.
    """
    lower = chain.lower_bound
    peak = chain.store_all_peak()
    candidates: list[tuple[float, str, list[Transfer]]] = []
    least = chain_min_memory(chain)
    details: dict = {}
    auto = slots == "auto"
    grid = DEFAULT_SLOTS if auto else int(slots)
    if rotor_slots is not None:
        rotor = plan_rotor(chain, memory, slots=rotor_slots)
    elif auto:
        rotor = plan_rotor(chain, memory)  # rotor's own default grid
    else:
        rotor = plan_rotor(chain, memory, slots=grid)
    if rotor.sequence is not None:
        candidates.append((rotor.claimed_makespan, "rotor", _timed(chain, rotor.sequence)))
    if memory - int(chain.x[0]) >= 0:
        # A plan that moves a tensor lasts at least its offload and its prefetch: when even the
        # smallest one cannot beat rotor that way, no transfer can help and pofo is rotor.
        sizes = [int(v) for v in (*chain.x, *chain.s) if v > 0]
        slowest = INF if bandwidth <= 0 or not sizes else 2 * min(sizes) / (bandwidth / 1000.0)
        found = []
        if slowest < (rotor.claimed_makespan if rotor.sequence is not None else INF):
            # Rounded up at a coarser grid than rotor's, the DP's plan is not worth a third run.
            finer_rotor = (
                auto
                or rotor_slots == "auto"
                or (isinstance(rotor_slots, int) and rotor_slots > grid)
            )
            short = chain.length <= FINE_STAGES
            found = _fractional_grids(
                chain,
                memory,
                bandwidth,
                [grid] + ([FINE_SLOTS] if auto and short else []),
                profile,
                details,
                round_up=not finer_rotor,
                fallback=FINE_SLOTS if auto and not short else None,
            )
            candidates += found
        # The window DP: on short chains (cheap there), or when the Theorem 1 DP gave nothing.
        if chain.length <= WINDOW_STAGES or not found:
            dp = PofoDP(chain, memory, bandwidth, grid)
            value = dp.solve()
            details["dp"] = value
            if value < float("inf"):
                candidates.append((value, "dp", dp.schedule()))
    if offload_instance is not None and bandwidth > 0:
        least = min(least, offload_instance.min_memory())
        plan = solve_dynprog(offload_instance, memory, slots=dynprog_slots)
        if plan.ops is not None:
            candidates.append((plan.claimed_makespan, "dynprog", list(plan.ops)))
    if not candidates:
        return OffloadPlan(
            ops=None,
            status="infeasible",
            lower_bound=lower,
            peak=peak,
            min_memory=least,
            slots=grid,
            message="no combined schedule fits: neither recomputing everything nor offloading "
            "every activation does",
        )
    # Ties go to the simpler plan: rotor (no transfers), then dynprog, then the DP's.
    rank = {"rotor": 0, "dynprog": 1, "dp": 2, "frac": 3}
    value, source, ops = min(candidates, key=lambda c: (round(c[0], 9), rank[c[1]]))
    details["source"] = source
    for v, name, _ in candidates:
        details[name] = v
    status = "optimal" if value <= lower * (1 + 1e-12) else "feasible"
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


def _summary(source: str, details: dict) -> str:
    """``solver.message``: the winner, then every candidate's value (ms; '-' when none)."""

    def ms(key: str) -> str:
        v = details.get(key)
        return "-" if v is None or v == float("inf") else f"{v:.3f} ms"

    return (
        f"{source}: Theorem 1 DP {ms('frac_value')}, its whole-tensor schedule {ms('frac')}; "
        f"window DP {ms('dp')}; rotor {ms('rotor')}; dynprog {ms('dynprog')}"
    )


def _fractional_grids(
    chain: Chain,
    memory: int,
    bandwidth: float,
    grids: list[int],
    profile,
    details: dict,
    *,
    round_up: bool = True,
    fallback: int | None = None,
) -> list[tuple[float, str, list[Transfer]]]:
    """:func:`_fractional` on each grid; the fastest realized schedule (the first on ties).

    ``fallback``: one more grid, tried only when none of ``grids`` gave a schedule. ``details``
    gets the ``frac_*`` entries of the grid that won (of the first grid when none gave a
    schedule) and ``frac_grids``, the grids tried.
    """
    best: list[tuple[float, str, list[Transfer]]] = []
    best_details: dict | None = None
    grids = list(grids)
    for grid in grids:
        own: dict = {}
        found = _fractional(chain, memory, bandwidth, grid, profile, own, round_up=round_up)
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
    chain: Chain,
    memory: int,
    bandwidth: float,
    slots: int,
    profile,
    details: dict,
    *,
    round_up: bool = True,
) -> list[tuple[float, str, list[Transfer]]]:
    """The fractional DP's value and its whole-tensor realization (a candidate, if it replays).

    Roundings (docs/algorithms.md, pofo): sizes rounded to the nearest slot with 2% of the slots
    kept aside (less lost to rounding; the realization checks the bytes exactly); if that plan
    needs more bytes than the budget, once more with the excess kept aside too; then, if
    ``round_up``, sizes rounded up (the DP's plan then fits by construction).
    """
    margin = max(1, round(0.02 * slots))
    attempts: list[int | None] = [margin]  # a margin (nearest rounding), None: rounded up
    if round_up:
        attempts.append(None)
    while attempts:
        margin = attempts.pop(0)
        nearest = margin is not None
        dp = FractionalDP(chain, memory, bandwidth, slots, nearest=nearest, margin=margin or 0)
        value = dp.solve()
        details["frac_value"] = value
        details["frac_slots"] = dp.slots
        details["frac_rounding"] = f"nearest, {margin} slots aside" if nearest else "up"
        if value == float("inf"):
            continue
        plan = dp.plan()
        need = plan_peak(chain, plan.sequence, plan.offloads, plan.prefetches)
        if need is None or need > memory:
            if nearest and margin == max(1, round(0.02 * slots)) and need is not None:
                attempts.insert(0, margin + int(math.ceil((need - memory) / dp.unit)) + 1)
            continue
        ops = realize(chain, plan.sequence, plan.offloads, plan.prefetches, memory, bandwidth)
        if ops is None:  # pragma: no cover - the realization waits rather than fails
            continue
        makespan = max(op[3] for op in ops)
        if profile is not None:
            from memplan.schedule import Op
            from memplan.simulator import simulate_combined

            replay = simulate_combined(
                profile,
                [Op(op=n, stage=k, start=a, end=b, stream=s, tensor=t) for n, k, a, b, s, t in ops],
                memory=memory,
                bandwidth=bandwidth,
            )
            if not replay.valid:  # pragma: no cover - safety net, see solve_pofo
                details["frac_rejected"] = replay.violation
                continue
            makespan = replay.makespan
        return [(makespan, "frac", ops)]
    return []


__all__ = ["DEFAULT_SLOTS", "FINE_SLOTS", "FINE_STAGES", "WINDOW_STAGES", "solve_pofo"]
