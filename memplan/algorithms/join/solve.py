"""``join`` and ``equiv-chain``: from a join profile and a budget to a finished schedule.

A profile whose branches are *uniform* (docs/join.md: every branch input, stage output, saved
tensor and gradient of one size ``s``, no overheads, one forward time ``u_f`` and one backward time
``u_b`` on every branch stage) is solved in the paper's pebble model with ``c = (M - static) // s``
slots, exactly as Optimal Memory-aware Backpropagation of Deep Join Networks (Phil. Trans. R. Soc. A 2020) (``join_model: pebble``). Any other join profile is solved in the
chain model of docs/model.md on every branch (``join_model: chain``), memory discretized in
``--slots`` (NOTE [ heterogeneous join recurrences ] in :mod:`memplan.algorithms.join.hetero`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from memplan.algorithms.base import SolveRequest
from memplan.algorithms.join.pebble import JoinOp
from memplan.algorithms.timeline import Deadline, TimeLimitReached, step_bound
from memplan.errors import ArgumentError
from memplan.loop import TrainingLoop
from memplan.profile.memory import stage_terms
from memplan.profile.model import Profile
from memplan.schedule import (
    Budget,
    Op,
    OpName,
    ProfileRef,
    Schedule,
    SolverInfo,
    Status,
    overhead_ratio,
)

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


def uniform(profile: Profile, loop: TrainingLoop | None = None) -> Uniform | None:
    """The pebble-model parameters when the profile is uniform (docs/join.md), else None.

    Under a training loop (``loop.gradients``) whose terms add memory to a stage (weight
    gradients, an overhead of ``F_all`` or of the backward), the profile is not uniform: the chain
    model plans it (NOTE [ join loop terms ]).
    """
    assert profile.branches is not None and profile.turn is not None
    if loop is not None and loop.gradients is not None:
        every = [st for b in profile.branches for st in b.stages] + [profile.turn]
        terms = stage_terms(every, loop)
        if any(terms.weight_grads) or any(terms.forward_all) or any(terms.backward):
            return None
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


def _durations(profile: Profile) -> Callable[[OpName, int | None, int], float]:
    assert profile.branches is not None and profile.turn is not None
    branches = profile.branches
    turn = profile.turn.forward_time + profile.turn.backward_time

    def duration(op: OpName, branch: int | None, stage: int) -> float:
        if op == "turn":
            return turn
        assert branch is not None, "only the turn has no branch"
        st = branches[branch].stages[stage]
        return st.backward_time if op == "B" else st.forward_time

    return duration


def _schedule(
    profile: Profile,
    request: SolveRequest,
    algorithm: str,
    model: Literal["pebble", "chain"],
    plan: list[JoinOp] | None,
    *,
    status: Status,
    claimed: float | None = None,
    min_memory: int | None = None,
    slots: int | None = None,
    join_slots: int | None = None,
    message: str | None = None,
    started: float,
) -> Schedule:
    ops: list[Op] = []
    makespan: float | None = None
    overhead: float | None = None
    bound = step_bound(profile, request, min_memory)  # the optimizer's step after the backward
    if plan is not None and bound.refusal is not None:
        plan, status, message = None, "infeasible", bound.refusal
    if plan is None:
        status = "unknown" if status == "unknown" else "infeasible"
    else:
        duration = _durations(profile)
        clock = 0.0
        for op, branch, stage in plan:
            end = clock + duration(op, branch, stage)
            ops.append(Op(op=op, stage=stage, start=clock, end=end, branch=branch))
            clock = end
        makespan = clock if claimed is None else claimed
        lower = profile.lower_bound
        overhead = overhead_ratio(makespan, lower)
    return Schedule(
        family="join",
        algorithm=algorithm,
        profile=ProfileRef(model=profile.model, sha256=profile.sha256(), stages=profile.length),
        budget=Budget.of(request.memory, request.loop),
        feasible=plan is not None,
        makespan=makespan,
        overhead=overhead,
        lower_bound=profile.lower_bound,
        static_memory=request.static_memory,
        min_memory=bound.least,
        join_model=model,
        join_slots=join_slots,
        solver=SolverInfo(
            seconds=time.perf_counter() - started, status=status, slots=slots, message=message
        ),
        ops=ops,
    )


def _pebble_slots(request: SolveRequest, u: Uniform) -> int:
    return max(0, request.memory - request.static_memory) // u.size


def _check_loop(request: SolveRequest) -> None:
    """Refuse what the join family cannot plan for: a caller that holds the model's output (the
    loss joins every branch: which of its inputs the caller keeps is not a join profile's field).

    Raises
    ------
    ArgumentError
        Naming ``output_held``.
    """
    if request.loop.output_held:
        raise ArgumentError(
            "output_held",
            "the join family cannot plan for a caller that holds the model's output (the loss "
            "reads every branch); plan without it, or with a chain profile",
            True,
        )


def run_join(profile: Profile, request: SolveRequest) -> Schedule:
    """``--algo join``: the optimal canonical schedule (Theorem 3; its generalization otherwise)."""
    _check_loop(request)
    started = time.perf_counter()
    u = uniform(profile, request.loop)
    if u is not None:
        return _join_pebble(profile, request, u, started)
    return _join_chain(profile, request, started)


def _join_pebble(profile: Profile, request: SolveRequest, u: Uniform, started: float) -> Schedule:
    from memplan.algorithms.join.pebble import c_min, cached_table

    c = _pebble_slots(request, u)
    least = c_min(u.lengths)
    finish = functools.partial(
        _schedule,
        profile,
        request,
        "join",
        "pebble",
        started=started,
        join_slots=c,
        min_memory=request.static_memory + least * u.size,
    )
    if c < least:
        return finish(
            None,
            status="infeasible",
            message=f"c_min = {least} slots of {u.size} bytes (Theorem 2 of Optimal Memory-aware Backpropagation of Deep Join Networks); "
            f"the budget gives c = {c}",
        )
    c_eff = min(c, sum(u.lengths) + len(u.lengths))  # store-all needs no more (sum l + k)
    table_bytes = math.prod(length + 1 for length in u.lengths) * (c_eff + 1) * 12
    if table_bytes > TABLE_LIMIT:
        raise ArgumentError(
            "memory",
            f"the Opt_join table for branches of {list(u.lengths)} stages and {c_eff} slots "
            f"would take {table_bytes / 1e9:.1f} GB; this join is too large for the exact DP",
        )
    table = cached_table(u.lengths, u.uf, u.ub, u.ut)
    table.grow(c_eff)
    return finish(
        table.sequence(c_eff),
        status="optimal",
        claimed=table.opt(c_eff),
        message=f"pebble model (uniform profile): c = {c} slots of {u.size} bytes, c_min = {least}",
    )


def _check_table_size(lengths: Sequence[int], chains: int, capacity: int, slots: object) -> None:
    """Refuse a heterogeneous join table beyond :data:`TABLE_LIMIT` bytes, naming the slots that
    fit (its states: every branch's progress and which chains are open, ``capacity + 1`` slots).
    """
    states = 2**chains * math.prod(length + 1 for length in lengths)
    table_bytes = states * (capacity + 1) * 12
    if table_bytes > TABLE_LIMIT:
        most = max(2, TABLE_LIMIT // (states * 12) - 1)
        raise ArgumentError(
            "slots",
            f"the join table for branches of {list(lengths)} stages would take "
            f"{table_bytes / 1e9:.1f} GB; use {most} slots or fewer",
            slots,
        )


def _join_chain(profile: Profile, request: SolveRequest, started: float) -> Schedule:
    from memplan.algorithms.join.hetero import HeteroJoin, JoinNet, min_memory_plan

    slots = request.options.slots
    deadline = Deadline.after(request.options.time_limit)
    net = JoinNet.from_profile(profile, request.loop)
    budget = request.memory - request.static_memory
    try:
        least, least_plan = min_memory_plan(net, deadline)
    except TimeLimitReached:
        return _schedule(
            profile,
            request,
            "join",
            "chain",
            None,
            status="unknown",
            message="the time limit passed before the least-memory canonical plan was found",
            started=started,
            slots=slots,
        )
    finish = functools.partial(
        _schedule,
        profile,
        request,
        "join",
        "chain",
        started=started,
        slots=slots,
        min_memory=request.static_memory + least,
    )
    if budget < least:
        return finish(
            None,
            status="infeasible",
            message="no canonical join plan fits: even recomputing everything needs more memory",
        )
    store_all = net.store_all()
    if net.peak(store_all) <= budget:
        return finish(
            store_all,
            status="optimal",
            message="store-all fits: no recomputation needed",
        )
    capacity, rounded = net.rounded(budget, slots)
    _check_table_size(net.lengths, len(net.chains), capacity, slots)
    value, plan = math.inf, None
    message = (
        "the slot grid is too coarse near the least memory: returned the least-memory canonical "
        "plan (more slots give a faster one)"
    )
    try:
        dp = HeteroJoin(rounded, capacity, deadline)
        value = dp.opt(capacity)
        if math.isfinite(value):
            plan = dp.sequence(capacity)
    except TimeLimitReached:
        message = (
            "the time limit passed during the join DP: returned the least-memory canonical plan"
        )
    if plan is None or net.makespan(least_plan) < value:
        return finish(
            least_plan,
            status="feasible",
            message=message,
        )
    return finish(
        plan,
        status="feasible",
        claimed=value,
        message=f"chain model (heterogeneous profile), {capacity} slots; optimal among "
        "canonical plans on the slot grid",
    )


def run_equiv_chain(profile: Profile, request: SolveRequest) -> Schedule:
    """``--algo equiv-chain``: the paper's baseline (Section 4, Figure 9)."""
    _check_loop(request)
    started = time.perf_counter()
    u = uniform(profile, request.loop)
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
    finish = functools.partial(
        _schedule,
        profile,
        request,
        "equiv-chain",
        "pebble",
        started=started,
        join_slots=c,
        min_memory=None if least is None else request.static_memory + least * u.size,
    )
    if best is None:
        return finish(
            None,
            status="infeasible",
            message=f"the equivalent chain needs {least} slots of {u.size} bytes; "
            f"the budget gives c = {c}",
        )
    cost, chain_slots, plan = best
    return finish(
        plan,
        status="feasible",
        claimed=cost,
        message=f"Revolve on the equivalent chain with {chain_slots} group slots (c = {c})",
    )


def _equiv_chain_model(profile: Profile, request: SolveRequest, started: float) -> Schedule:
    from memplan.algorithms.chain import plan_rotor
    from memplan.algorithms.join.equiv import equivalent_chain, expand
    from memplan.algorithms.join.hetero import JoinNet

    slots = request.options.slots
    net = JoinNet.from_profile(profile, request.loop)
    chain, starts, pinned = equivalent_chain(net)
    budget = request.memory - request.static_memory
    result = plan_rotor(chain, budget - pinned, slots=slots)
    least = None if result.min_memory is None else result.min_memory + pinned
    finish = functools.partial(
        _schedule,
        profile,
        request,
        "equiv-chain",
        "chain",
        started=started,
        slots=slots,
        min_memory=None if least is None else request.static_memory + least,
    )
    if result.sequence is None:
        return finish(
            None,
            status="infeasible",
            message="rotor finds no plan for the equivalent chain",
        )
    plan = expand(net, starts, result.sequence)
    return finish(
        plan,
        status="feasible",
        message="rotor on the equivalent chain (levels at equal distance from the turn)",
    )
