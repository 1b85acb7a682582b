"""``join`` and ``equiv-chain``: from a join profile and a budget to a finished schedule.

A profile whose branches are *uniform* (docs/join.md: every branch input, stage output, saved
tensor and gradient of one size ``s``, no overheads, one forward time ``u_f`` and one backward time
``u_b`` on every branch stage) is solved in the paper's pebble model with ``c = (M - static) // s``
slots, exactly as Optimal Memory-aware Backpropagation of Deep Join Networks (Phil. Trans. R. Soc. A 2020) (``join_model: pebble``). Any other join profile is solved in the
chain model of docs/model.md on every branch (``join_model: chain``), memory discretized in
``--slots`` (NOTE [ heterogeneous join recurrences ] in :mod:`memplan.algorithms.join.hetero`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from memplan.algorithms.base import SolveRequest
from memplan.errors import InputError
from memplan.profile.model import Profile
from memplan.schedule import Budget, Op, ProfileRef, Schedule, SolverInfo

TABLE_LIMIT = 2 * 10**9
"""Bytes the chain-model join table may take (states x slots x 12); beyond, --slots is refused."""


@dataclass(frozen=True)
class Uniform:
    """The paper's parameters of a uniform join profile: slot size and unit costs."""

    size: int
    uf: float
    ub: float
    ut: float
    lengths: tuple[int, ...]


def uniform(profile: Profile) -> Uniform | None:
    """The pebble-model parameters when the profile is uniform (docs/join.md), else None."""
    assert profile.branches is not None and profile.turn is not None
    size = profile.branches[0].input_size
    stages = [st for b in profile.branches for st in b.stages]
    if size <= 0 or any(b.input_size != size for b in profile.branches):
        return None
    turn = profile.turn
    if turn.forward_overhead or turn.backward_overhead:
        return None
    uf, ub = stages[0].forward_time, stages[0].backward_time
    for st in stages:
        if {st.output_size, st.saved_size, st.gradient_size} != {size}:
            return None
        if st.forward_overhead or st.backward_overhead:
            return None
        if st.forward_time != uf or st.backward_time != ub:
            return None
    lengths = tuple(len(b.stages) for b in profile.branches)
    return Uniform(size, uf, ub, turn.forward_time + turn.backward_time, lengths)


def _durations(profile: Profile):
    assert profile.branches is not None and profile.turn is not None
    turn = profile.turn.forward_time + profile.turn.backward_time

    def duration(op: str, branch: int | None, stage: int) -> float:
        if op == "turn":
            return turn
        st = profile.branches[branch].stages[stage]
        return st.backward_time if op == "B" else st.forward_time

    return duration


def _schedule(
    profile: Profile,
    request: SolveRequest,
    algorithm: str,
    model: str,
    plan: list[tuple[str, int | None, int]] | None,
    *,
    status: str,
    claimed: float | None = None,
    min_memory: int | None = None,
    slots: int | None = None,
    join_slots: int | None = None,
    message: str | None = None,
    started: float,
) -> Schedule:
    common = dict(
        family="join",
        algorithm=algorithm,
        profile=ProfileRef(model=profile.model, sha256=profile.sha256(), stages=profile.length),
        budget=Budget(memory=request.memory, optimizer=request.optimizer),
        lower_bound=profile.lower_bound,
        static_memory=request.static_memory,
        min_memory=min_memory,
        join_model=model,
        join_slots=join_slots,
    )
    if plan is None:
        return Schedule(
            feasible=False,
            solver=SolverInfo(
                seconds=time.perf_counter() - started,
                status="infeasible",
                slots=slots,
                message=message,
            ),
            **common,
        )
    duration = _durations(profile)
    ops, clock = [], 0.0
    for op, branch, stage in plan:
        end = clock + duration(op, branch, stage)
        ops.append(Op(op=op, stage=stage, start=clock, end=end, branch=branch))
        clock = end
    makespan = clock if claimed is None else claimed
    lower = profile.lower_bound
    return Schedule(
        feasible=True,
        makespan=makespan,
        overhead=makespan / lower if lower > 0 else 1.0,
        solver=SolverInfo(
            seconds=time.perf_counter() - started, status=status, slots=slots, message=message
        ),
        ops=ops,
        **common,
    )


def _pebble_slots(request: SolveRequest, u: Uniform) -> int:
    return max(0, request.memory - request.static_memory) // u.size


def run_join(profile: Profile, request: SolveRequest) -> Schedule:
    """``--algo join``: the optimal canonical schedule (Theorem 3; its generalization otherwise)."""
    started = time.perf_counter()
    u = uniform(profile)
    if u is not None:
        return _join_pebble(profile, request, u, started)
    return _join_chain(profile, request, started)


def _join_pebble(profile: Profile, request: SolveRequest, u: Uniform, started: float) -> Schedule:
    from memplan.algorithms.join.pebble import c_min, cached_table

    c = _pebble_slots(request, u)
    least = c_min(u.lengths)
    common = dict(started=started, join_slots=c, min_memory=request.static_memory + least * u.size)
    if c < least:
        return _schedule(
            profile,
            request,
            "join",
            "pebble",
            None,
            status="infeasible",
            message=f"c_min = {least} slots of {u.size} bytes (Theorem 2 of papers/003); "
            f"the budget gives c = {c}",
            **common,
        )
    c_eff = min(c, sum(u.lengths) + len(u.lengths))  # store-all needs no more (sum l + k)
    table_bytes = math.prod(length + 1 for length in u.lengths) * (c_eff + 1) * 12
    if table_bytes > TABLE_LIMIT:
        raise InputError(
            f"--mem: the Opt_join table for branches of {list(u.lengths)} stages and {c_eff} "
            f"slots would take {table_bytes / 1e9:.1f} GB; this join is too large for the exact DP"
        )
    table = cached_table(u.lengths, u.uf, u.ub, u.ut)
    table.grow(c_eff)
    return _schedule(
        profile,
        request,
        "join",
        "pebble",
        table.sequence(c_eff),
        status="optimal",
        claimed=table.opt(c_eff),
        message=f"pebble model (uniform profile): c = {c} slots of {u.size} bytes, c_min = {least}",
        **common,
    )


def _join_chain(profile: Profile, request: SolveRequest, started: float) -> Schedule:
    from memplan.algorithms.join.hetero import HeteroJoin, JoinNet, min_memory_plan

    slots = request.options.slots
    net = JoinNet.from_profile(profile)
    budget = request.memory - request.static_memory
    least, least_plan = min_memory_plan(net)
    common = dict(started=started, slots=slots, min_memory=request.static_memory + least)
    if budget < least:
        return _schedule(
            profile,
            request,
            "join",
            "chain",
            None,
            status="infeasible",
            message="no canonical join plan fits: even recomputing everything needs more memory",
            **common,
        )
    store_all = net.store_all()
    if net.peak(store_all) <= budget:
        return _schedule(
            profile,
            request,
            "join",
            "chain",
            store_all,
            status="optimal",
            message="store-all fits: no recomputation needed",
            **common,
        )
    capacity, rounded = net.rounded(budget, slots)
    states = 2 ** len(net.chains) * math.prod(length + 1 for length in net.lengths)
    table_bytes = states * (capacity + 1) * 12
    if table_bytes > TABLE_LIMIT:
        most = max(2, TABLE_LIMIT // (states * 12) - 1)
        raise InputError(
            f"--slots {slots}: the join table for branches of {list(net.lengths)} stages would "
            f"take {table_bytes / 1e9:.1f} GB; use --slots {most} or fewer"
        )
    dp = HeteroJoin(rounded, capacity)
    value, plan = dp.opt(capacity), None
    if math.isfinite(value):
        plan = dp.sequence(capacity)
    fallback = net.makespan(least_plan)
    if plan is None or fallback < value:
        return _schedule(
            profile,
            request,
            "join",
            "chain",
            least_plan,
            status="feasible",
            message="the slot grid is too coarse near the least memory: returned the "
            "least-memory canonical plan (raise --slots for a faster one)",
            **common,
        )
    return _schedule(
        profile,
        request,
        "join",
        "chain",
        plan,
        status="feasible",
        claimed=value,
        message=f"chain model (heterogeneous profile), {capacity} slots; optimal among "
        "canonical plans on the slot grid",
        **common,
    )


def run_equiv_chain(profile: Profile, request: SolveRequest) -> Schedule:
    """``--algo equiv-chain``: the paper's baseline (Section 4, Figure 9)."""
    started = time.perf_counter()
    u = uniform(profile)
    if u is not None:
        return _equiv_pebble(profile, request, u, started)
    return _equiv_chain_model(profile, request, started)


def _equiv_pebble(profile: Profile, request: SolveRequest, u: Uniform, started: float) -> Schedule:
    from memplan.algorithms.join.pebble import equiv_chain_plans, plan_cost, plan_peak

    c = _pebble_slots(request, u)
    best = None
    least = None
    for chain_slots, plan in equiv_chain_plans(u.lengths):
        peak = plan_peak(u.lengths, plan)
        assert peak is not None, "equiv-chain built an invalid plan"
        least = peak if least is None else min(least, peak)
        if peak <= c:
            cost = plan_cost(plan, u.uf, u.ub, u.ut)
            if best is None or cost < best[0]:
                best = (cost, chain_slots, plan)
    common = dict(
        started=started,
        join_slots=c,
        min_memory=None if least is None else request.static_memory + least * u.size,
    )
    if best is None:
        return _schedule(
            profile,
            request,
            "equiv-chain",
            "pebble",
            None,
            status="infeasible",
            message=f"the equivalent chain needs {least} slots of {u.size} bytes; "
            f"the budget gives c = {c}",
            **common,
        )
    cost, chain_slots, plan = best
    return _schedule(
        profile,
        request,
        "equiv-chain",
        "pebble",
        plan,
        status="feasible",
        claimed=cost,
        message=f"Revolve on the equivalent chain with {chain_slots} group slots (c = {c})",
        **common,
    )


def _equiv_chain_model(profile: Profile, request: SolveRequest, started: float) -> Schedule:
    from memplan.algorithms.chain import plan_rotor
    from memplan.algorithms.join.equiv import equivalent_chain, expand
    from memplan.algorithms.join.hetero import JoinNet

    slots = request.options.slots
    net = JoinNet.from_profile(profile)
    chain, starts, pinned = equivalent_chain(net)
    budget = request.memory - request.static_memory
    result = plan_rotor(chain, budget - pinned, slots=slots)
    least = None if result.min_memory is None else result.min_memory + pinned
    common = dict(
        started=started,
        slots=slots,
        min_memory=None if least is None else request.static_memory + least,
    )
    if result.sequence is None:
        return _schedule(
            profile,
            request,
            "equiv-chain",
            "chain",
            None,
            status="infeasible",
            message="rotor finds no plan for the equivalent chain",
            **common,
        )
    plan = expand(net, starts, result.sequence)
    return _schedule(
        profile,
        request,
        "equiv-chain",
        "chain",
        plan,
        status="feasible",
        message="rotor on the equivalent chain (levels at equal distance from the turn)",
        **common,
    )
