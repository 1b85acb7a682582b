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

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TypedDict

from memplan.algorithms.base import ChainPlan, OffloadPlan, SolveRequest
from memplan.loop import TrainingLoop
from memplan.profile.memory import gradient_bytes, parameter_sizes, static_bytes
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


class TimeLimitReached(Exception):
    """A solver's :class:`Deadline` passed; the solver catches it and returns its best plan so
    far (or an infeasible answer that says so).
    """


@dataclass(frozen=True)
class Deadline:
    """When a solver must stop (``time.monotonic()`` seconds; None: never), from ``--time-limit``.

    The long loops call :meth:`check` once per row of their tables (a few milliseconds), so a run
    stops within about that much of the limit.
    """

    at: float | None = None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        return cls(None if seconds is None else time.monotonic() + float(seconds))

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def check(self) -> None:
        """Raise :class:`TimeLimitReached` once the deadline has passed."""
        if self.passed():
            raise TimeLimitReached

    def left(self) -> float | None:
        """Seconds left (0 when passed); None without a deadline."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())


def static_memory(profile: Profile, loop: TrainingLoop) -> int:
    """Bytes present during the whole iteration: weights, optimizer state, kept gradients.

    The profile's ``workspace_size`` (the math libraries' workspaces on a GPU) is static too.
    With ``gradients`` ``at-backward`` (or ``step-in-backward``) the gradients are not static:
    each stage's appear at its backward (NOTE [ training-loop memory terms ],
    memplan/profile/memory.py). A graph profile holds its own weights, gradients and optimizer
    state (docs/graph.md): its static memory is its ``weight_size`` whatever the optimizer.
    """
    if profile.kind == "graph":
        return profile.weight_size
    return static_bytes(profile, loop)


def step_peak(profile: Profile, loop: TrainingLoop, static: int) -> int:
    """The peak of the optimizer's step after the backward, static memory included (0 when the
    plan does not count it: NOTE [ training-loop memory terms ]).

    When the last ``B`` has run, the plan holds the batch (a chain's ``x[0]``, every branch input
    of a join) and, under ``at-backward``, every gradient; the step adds its temporaries (NOTE
    [ optimizer step temporaries ], memplan/loop.py). No plan changes this figure: a budget below
    it has no plan, whichever the family.
    """
    if not loop.counts_step or profile.kind == "graph":
        return 0
    if profile.input_size is not None:
        batch = profile.input_size
    else:
        batch = sum(branch.input_size for branch in profile.branches or ())
    temporaries = loop.optimizer.step_temporaries(parameter_sizes(profile))
    held = gradient_bytes(profile) if loop.gradients == "at-backward" else 0
    return static + batch + held + temporaries


@dataclass(frozen=True)
class StepBound:
    """What the optimizer's step after the backward does to a plan of any family
    (:func:`step_bound`).
    """

    least: int | None
    """The family's least memory (static memory included), raised to the step's peak."""
    refusal: str | None
    """Why a plan that fits without the step does not fit with it; None when it does."""


def step_bound(profile: Profile, request: SolveRequest, least: int | None) -> StepBound:
    """The step after the backward (:func:`step_peak`) applied to a plan of ``request``: its least
    memory ``least`` (static memory included) is at least the step's peak, and a budget below
    that peak has no plan. Every family that plans in the loop's terms (chain, offloading,
    combined, join) calls it, so that a budget means the same bytes in each.
    """
    step = step_peak(profile, request.loop, request.static_memory)
    raised = None if least is None else max(least, step)
    if step <= request.memory:
        return StepBound(raised, None)
    refusal = (
        f"the optimizer's step ({request.loop.optimizer.text}) needs {step} bytes with the "
        "weights, the state and the gradients, more than the budget"
    )
    return StepBound(raised, refusal)


def timed_ops(
    profile: Profile,
    sequence: Iterable[tuple[OpName, int]],
    options: Mapping[int, int] | None = None,
) -> list[Op]:
    """Lay an operation sequence back to back on the compute stream; ``options``: the option of
    the ``F_all`` of each stage listed (its ``option`` field; its ``B`` takes the option's time).
    """
    ops: list[Op] = []
    clock = 0.0
    stages = profile.chain_stages
    chosen_options = options or {}
    for name, stage in sequence:
        st = stages[stage]
        option = chosen_options.get(stage, 0)
        duration = st.option(option).backward_time if name == "B" else st.forward_time
        chosen = option if name == "F_all" and option else None
        ops.append(Op(op=name, stage=stage, start=clock, end=clock + duration, option=chosen))
        clock += duration
    return ops


def profile_ref(profile: Profile) -> ProfileRef:
    return ProfileRef(model=profile.model, sha256=profile.sha256(), stages=profile.length)


def _with_static(least: int | None, request: SolveRequest) -> int | None:
    """An activation-memory figure of a solver as a whole budget (static memory added)."""
    return None if least is None else least + request.static_memory


class _Common(TypedDict):
    """The fields of a schedule that a feasible and an infeasible outcome share."""

    family: str
    algorithm: str
    profile: ProfileRef
    budget: Budget
    lower_bound: float
    static_memory: int
    min_memory: int | None


def chain_schedule(profile: Profile, request: SolveRequest, plan: ChainPlan) -> Schedule:
    """The schedule of a chain solver's plan, its operations laid back to back.

    The optimizer's step after the backward (:func:`step_bound`) is part of the plan's need: no
    plan fits a budget below it, and the least memory is at least it.
    """
    bound = step_bound(profile, request, _with_static(plan.min_memory, request))
    common = _Common(
        family=request.family,
        algorithm=request.algorithm,
        profile=profile_ref(profile),
        budget=Budget.of(request.memory, request.loop),
        lower_bound=profile.lower_bound,
        static_memory=request.static_memory,
        min_memory=bound.least,
    )
    if plan.sequence is not None and bound.refusal is not None:
        plan = ChainPlan(None, "infeasible", min_memory=plan.min_memory, message=bound.refusal)
    ops = None if plan.sequence is None else timed_ops(profile, plan.sequence, plan.options)
    return _schedule(plan, ops, common)


def offload_schedule(
    profile: Profile, request: SolveRequest, plan: OffloadPlan, bandwidth: float
) -> Schedule:
    """The schedule of an offloading or combined solver's timed plan at ``bandwidth`` bytes/s.

    The optimizer's step after the backward bounds it as a chain plan (:func:`step_bound`).
    """
    bound = step_bound(profile, request, _with_static(plan.min_memory, request))
    common = _Common(
        family=request.family,
        algorithm=request.algorithm,
        profile=profile_ref(profile),
        budget=Budget.of(request.memory, request.loop, bandwidth=bandwidth),
        lower_bound=plan.lower_bound,
        static_memory=request.static_memory,
        min_memory=bound.least,
    )
    ops = None
    if plan.ops is not None and bound.refusal is not None:
        plan = replace(plan, ops=None, status="infeasible", message=bound.refusal)
    if plan.ops is not None:
        ops = [
            Op(op=name, stage=stage, start=start, end=end, stream=stream, tensor=tensor)
            for name, stage, start, end, stream, tensor in plan.ops
        ]
    return _schedule(plan, ops, common)


def _schedule(plan: ChainPlan | OffloadPlan, ops: list[Op] | None, common: _Common) -> Schedule:
    """The schedule of a plan's timed ``ops`` (None: no plan fits), with the solver's own value
    for :func:`memplan.solve` to check; ``common`` holds the fields both outcomes share
    (``lower_bound`` among them). ``solver.seconds`` is left for :func:`memplan.solve` to time.
    """
    if ops is None:
        status: Status = "unknown" if plan.status == "unknown" else "infeasible"  # stopped early
        solver = SolverInfo(status=status, slots=plan.slots, message=plan.message)
        return Schedule(feasible=False, solver=solver, **common)
    makespan = max((op.end for op in ops), default=0.0)
    lower = common["lower_bound"]
    schedule = Schedule(
        feasible=True,
        makespan=makespan,
        overhead=overhead_ratio(makespan, lower),
        solver=SolverInfo(status=plan.status, slots=plan.slots, message=plan.message),
        ops=ops,
        **common,
    )
    return schedule.with_solver_makespan(plan.claimed_makespan)
