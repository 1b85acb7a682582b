"""A profile timed as a schedule's own operations: checking a plan on a re-measured profile.

NOTE [ re-measured profiles ]
A profile measured again on the same model (a CI job that runs ``memplan profile`` before
``memplan simulate``) has the same sizes and other times: a machine is a little slower or faster
each run. A plan made on the first profile, replayed on the second, has operations that last other
than the profile says, and the replay's timing checks fail at its first operation, while every byte
the plan holds is the same. Memory violations make a plan unusable; time differences are
information.

:func:`timed_as_schedule` makes the profile *timed as the schedule*: the profile's sizes, each
stage's forward and backward times read from the schedule's own operations (a chain, offloading or
combined schedule's ``F_*`` and ``B``, a join's operations and its turn, a pipeline's pattern). A
replay against it checks everything but the profile's times: the model's rules, the budget, the
static memory and peak the schedule claims, and the schedule's consistency with itself (the runs of
one stage's forward must last alike, else there is no such profile: None). The differences between
the two sets of times are returned beside it, for the caller to report (``memplan simulate`` prints
them as a note and exits 0 when that replay is valid and fits; ``--strict`` keeps the strict
verdict). A graph schedule gives no time per node: only its stated makespan is set aside.

Belongs to the simulator: reads the schedule and the profile, shares nothing with the solvers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memplan.profile.model import Profile, Stage
from memplan.schedule import Schedule
from memplan.simulator.timing import close, lasts

_FORWARD_OPS = ("F_all", "F_ck", "F_n")


@dataclass(frozen=True)
class TimeDifference:
    """One time of the profile that the schedule's operations give otherwise (ms)."""

    where: str
    """The profile's field: ``stages[3].forward_time``, ``branches[1].stages[0].backward_time``,
    ``turn`` (forward and backward together), ``graph`` (every node together)."""
    profile: float
    schedule: float


@dataclass(frozen=True)
class Retimed:
    """What :func:`timed_as_schedule` returns."""

    profile: Profile
    """The profile with the schedule's times (its sizes unchanged)."""
    schedule: Schedule
    """The schedule to replay against it (a graph schedule without its stated makespan)."""
    differences: list[TimeDifference]
    """Every time that differs (beyond the simulator's tolerance), in the profile's order."""
    fields: int
    """How many times of the profile the schedule's operations give."""
    schedule_ms: float
    """The plan's computations as the schedule times them (ms, summed)."""
    profile_ms: float
    """The same computations timed by the profile (ms, summed)."""


class _Times:
    """The times the operations give, field by field; ``consistent`` turns False on a clash."""

    def __init__(self) -> None:
        self.given: dict[tuple[object, ...], float] = {}
        self.consistent = True
        self.schedule_ms = 0.0

    def add(self, key: tuple[object, ...], start: float, end: float) -> None:
        duration = max(0.0, end - start)
        self.schedule_ms += duration
        first = self.given.get(key)
        if first is None:
            self.given[key] = duration
        elif not lasts(start, end, first):
            self.consistent = False

    def of(self, key: tuple[object, ...], default: float) -> float:
        return self.given.get(key, default)


def timed_as_schedule(profile: Profile, schedule: Schedule) -> Retimed | None:
    """``profile`` timed as ``schedule``'s operations (NOTE [ re-measured profiles ]).

    Returns None when the operations give no single time per stage (two runs of one forward that
    last differently, a stage the profile does not have, an infeasible schedule): there is no
    such profile, and the strict replay's verdict stands.
    """
    if not schedule.feasible:
        return None
    if schedule.family == "graph":
        return _graph(profile, schedule)
    if schedule.family == "pipeline":
        return _pipeline(profile, schedule)
    if schedule.family == "join":
        return _join(profile, schedule)
    if profile.stages is None:
        return None
    return _chain_model(profile, schedule)


def _chain_model(profile: Profile, schedule: Schedule) -> Retimed | None:
    """Chain, offloading and combined schedules: ``F_*`` give the forward time, ``B`` the backward
    time of the option of the stage's latest ``F_all`` (transfers last as the bandwidth says).
    """
    stages = profile.chain_stages
    times = _Times()
    profile_ms = 0.0
    chosen = [0] * len(stages)
    for op in schedule.ops:
        if op.op not in (*_FORWARD_OPS, "B"):
            continue
        if not 0 <= op.stage < len(stages):
            return None
        stage = stages[op.stage]
        if op.op == "F_all":
            chosen[op.stage] = op.option or 0
        option = chosen[op.stage] if op.op == "B" else 0
        if option >= stage.option_count:
            return None
        times.add((op.op == "B", op.stage, option), op.start, op.end)
        profile_ms += stage.option(option).backward_time if op.op == "B" else stage.forward_time
    if not times.consistent:
        return None
    retimed = [_stage_as(stage, k, times) for k, stage in enumerate(stages)]
    differences = _differences("stages", stages, retimed)
    return Retimed(
        profile.model_copy(update={"stages": retimed}),
        schedule,
        differences,
        len(times.given),
        times.schedule_ms,
        profile_ms,
    )


def _stage_as(stage: Stage, key: object, times: _Times) -> Stage:
    """``stage`` with the forward and backward times (its options' too) that ``times`` give."""
    update: dict[str, object] = {
        "forward_time": times.of((False, key, 0), stage.forward_time),
        "backward_time": times.of((True, key, 0), stage.backward_time),
    }
    if stage.options:
        update["options"] = [
            option.model_copy(
                update={"backward_time": times.of((True, key, i), option.backward_time)}
            )
            for i, option in enumerate(stage.options, start=1)
        ]
    return stage.model_copy(update=update)


def _differences(
    where: str, before: Iterable[Stage], after: Iterable[Stage]
) -> list[TimeDifference]:
    found = []
    for k, (old, new) in enumerate(zip(before, after, strict=True)):
        pairs = [("forward_time", old.forward_time, new.forward_time)]
        pairs.append(("backward_time", old.backward_time, new.backward_time))
        for i, (was, now) in enumerate(zip(old.options or (), new.options or (), strict=True)):
            pairs.append((f"options[{i}].backward_time", was.backward_time, now.backward_time))
        for field, was_ms, now_ms in pairs:
            if not close(was_ms, now_ms):
                found.append(TimeDifference(f"{where}[{k}].{field}", was_ms, now_ms))
    return found


def _join(profile: Profile, schedule: Schedule) -> Retimed | None:
    """Join schedules: each branch's ``F_*`` and ``B``, and the turn (its forward and backward
    in one operation: the two keep their ratio).
    """
    if profile.branches is None or profile.turn is None:
        return None
    times = _Times()
    profile_ms = 0.0
    turn = profile.turn
    for op in schedule.ops:
        if op.op == "turn":
            times.add(("turn",), op.start, op.end)
            profile_ms += turn.forward_time + turn.backward_time
            continue
        if op.op not in (*_FORWARD_OPS, "B") or op.branch is None:
            continue
        if not 0 <= op.branch < len(profile.branches):
            return None
        stages = profile.branches[op.branch].stages
        if not 0 <= op.stage < len(stages):
            return None
        times.add((op.op == "B", (op.branch, op.stage), 0), op.start, op.end)
        stage = stages[op.stage]
        profile_ms += stage.backward_time if op.op == "B" else stage.forward_time
    if not times.consistent:
        return None
    branches = []
    differences = []
    for j, branch in enumerate(profile.branches):
        retimed = [_stage_as(stage, (j, i), times) for i, stage in enumerate(branch.stages)]
        differences += _differences(f"branches[{j}].stages", branch.stages, retimed)
        branches.append(branch.model_copy(update={"stages": retimed}))
    both = turn.forward_time + turn.backward_time
    given = times.of(("turn",), both)
    share = turn.forward_time / both if both > 0 else 0.5
    new_turn = turn.model_copy(
        update={"forward_time": given * share, "backward_time": given - given * share}
    )
    if not close(both, given):
        differences.append(TimeDifference("turn", both, given))
    update = {"branches": branches, "turn": new_turn}
    return Retimed(
        profile.model_copy(update=update),
        schedule,
        differences,
        len(times.given),
        times.schedule_ms,
        profile_ms,
    )


def _pipeline(profile: Profile, schedule: Schedule) -> Retimed | None:
    """Pipeline schedules: each pattern operation ``F k`` or ``B k`` gives stage k's time."""
    if profile.stages is None or schedule.pattern is None:
        return None
    stages = profile.chain_stages
    times = _Times()
    profile_ms = 0.0
    for gpu in schedule.pattern:
        for op in gpu.ops:
            if not 0 <= op.stage < len(stages):
                return None
            times.add((op.op == "B", op.stage, 0), op.start, op.end)
            stage = stages[op.stage]
            profile_ms += stage.backward_time if op.op == "B" else stage.forward_time
    if not times.consistent:
        return None
    retimed = [_stage_as(stage, k, times) for k, stage in enumerate(stages)]
    return Retimed(
        profile.model_copy(update={"stages": retimed}),
        schedule,
        _differences("stages", stages, retimed),
        len(times.given),
        times.schedule_ms,
        profile_ms,
    )


def _graph(profile: Profile, schedule: Schedule) -> Retimed:
    """Graph schedules state a makespan and no time per node: that makespan is set aside."""
    compute = profile.graph.compute_time if profile.graph is not None else 0.0
    stated = schedule.makespan
    differences = []
    if stated is not None and not close(stated, compute):
        differences.append(TimeDifference("graph", compute, stated))
    return Retimed(
        profile,
        schedule.model_copy(update={"makespan": None}),
        differences,
        0 if stated is None else 1,
        compute if stated is None else stated,
        compute,
    )
