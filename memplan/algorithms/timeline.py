"""What the chain-model families share: static memory, timing a sequence, wrapping a plan.

The chain, offloading and combined solvers compute a :class:`~memplan.algorithms.base.ChainPlan`
(an operation sequence) or an :class:`~memplan.algorithms.base.OffloadPlan` (timed operations on
two streams) for the activation budget ``request.memory - request.static_memory``; their
``solve(profile, request)`` turns it into a :class:`~memplan.schedule.Schedule` here: the
operations timed, the static memory added back to ``min_memory``, the solver's own value kept
(:meth:`~memplan.schedule.Schedule.with_solver_makespan`) for :func:`memplan.solve` to compare
with the simulator's replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memplan.algorithms.base import ChainPlan, OffloadPlan, SolveRequest
from memplan.errors import InputError
from memplan.profile.memory import static_bytes
from memplan.profile.model import Profile
from memplan.schedule import Budget, Op, ProfileRef, Schedule, SolverInfo

OPTIMIZER_FACTORS = {"none": 0, "sgd": 2, "momentum": 3, "adam": 4}
"""Static memory as a multiple of the weight bytes: weights + gradients + optimizer state."""


def check_optimizer(optimizer: str) -> None:
    """An input error unless ``optimizer`` is one of :data:`OPTIMIZER_FACTORS`."""
    if optimizer not in OPTIMIZER_FACTORS:
        raise InputError(
            f"--optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZER_FACTORS)}"
        )


def static_memory(profile: Profile, optimizer: str = "sgd", gradients: str | None = None) -> int:
    """Bytes present during the whole iteration: weights, their gradients, optimizer state.

    With ``gradients`` ``at-backward`` the gradients are not static: each stage's appear at its
    backward (NOTE [ training-loop memory terms ], memplan/profile/memory.py). A graph profile
    holds its own weights, gradients and optimizer state (docs/graph.md): its static memory is its
    ``weight_size`` whatever the optimizer.
    """
    check_optimizer(optimizer)
    if profile.kind == "graph":
        return profile.weight_size
    return static_bytes(profile.weight_size, optimizer, gradients)


def timed_ops(profile: Profile, sequence: Iterable[tuple[str, int]]) -> list[Op]:
    """Lay an operation sequence back to back on the compute stream."""
    ops, clock = [], 0.0
    for name, stage in sequence:
        st = profile.stages[stage]
        duration = st.backward_time if name == "B" else st.forward_time
        ops.append(Op(op=name, stage=stage, start=clock, end=clock + duration))
        clock += duration
    return ops


def profile_ref(profile: Profile) -> ProfileRef:
    return ProfileRef(model=profile.model, sha256=profile.sha256(), stages=profile.length)


def _with_static(least: int | None, request: SolveRequest) -> int | None:
    """An activation-memory figure of a solver as a whole budget (static memory added)."""
    return None if least is None else least + request.static_memory


def chain_schedule(profile: Profile, request: SolveRequest, plan: ChainPlan) -> Schedule:
    """The schedule of a chain solver's plan, its operations laid back to back."""
    common = dict(
        family=request.family,
        algorithm=request.algorithm,
        profile=profile_ref(profile),
        budget=Budget(
            memory=request.memory, optimizer=request.optimizer, gradients=request.gradients
        ),
        lower_bound=profile.lower_bound,
        static_memory=request.static_memory,
        min_memory=_with_static(plan.min_memory, request),
    )
    ops = None if plan.sequence is None else timed_ops(profile, plan.sequence)
    return _schedule(plan, ops, common)


def offload_schedule(
    profile: Profile, request: SolveRequest, plan: OffloadPlan, bandwidth: float
) -> Schedule:
    """The schedule of an offloading or combined solver's timed plan at ``bandwidth`` bytes/s."""
    common = dict(
        family=request.family,
        algorithm=request.algorithm,
        profile=profile_ref(profile),
        budget=Budget(memory=request.memory, bandwidth=bandwidth, optimizer=request.optimizer),
        lower_bound=plan.lower_bound,
        static_memory=request.static_memory,
        min_memory=_with_static(plan.min_memory, request),
    )
    ops = None
    if plan.ops is not None:
        ops = [
            Op(op=name, stage=stage, start=start, end=end, stream=stream, tensor=tensor)
            for name, stage, start, end, stream, tensor in plan.ops
        ]
    return _schedule(plan, ops, common)


def _schedule(
    plan: ChainPlan | OffloadPlan, ops: list[Op] | None, common: dict[str, Any]
) -> Schedule:
    """The schedule of a plan's timed ``ops`` (None: no plan fits), with the solver's own value
    for :func:`memplan.solve` to check; ``common`` holds the fields both outcomes share
    (``lower_bound`` among them). ``solver.seconds`` is left for :func:`memplan.solve` to time."""
    solver = dict(slots=plan.slots, message=plan.message)
    if ops is None:
        return Schedule(feasible=False, solver=SolverInfo(status="infeasible", **solver), **common)
    makespan = max((op.end for op in ops), default=0.0)
    lower = common["lower_bound"]
    schedule = Schedule(
        feasible=True,
        makespan=makespan,
        overhead=makespan / lower if lower > 0 else 1.0,
        solver=SolverInfo(status=plan.status, **solver),
        ops=ops,
        **common,
    )
    return schedule.with_solver_makespan(plan.claimed_makespan)
