"""The chain-model simulator: one replay for chain, offloading and combined schedules.

This module is the independent check of the chain, offloading and combined algorithms: it shares
no code with :mod:`memplan.algorithms` and must not import it. The three families plan in one
model (docs/model.md, docs/offload.md, docs/combined.md): the computations ``F_all``, ``F_ck``,
``F_n`` and ``B`` of the chain with memory persistency, and transfers of the stored tensors
``x[k]`` and ``s[k]`` between GPU and host on one channel. A family's schedules are schedules of
that model with its restrictions, its :class:`~memplan.simulator.operations.Rules`:

* ``chain``: computations only, run back to back in the schedule's order (their stated times must
  be those durations laid end to end from time 0); the makespan is the sum of the durations;
* ``offload``: every forward once (``F_all``) in stage order, then every backward, at the stated
  times (the compute stream may wait for a transfer); transfers of ``x[0]`` and of ``s[k]``;
* ``combined``: every operation, at the stated times.

The replay checks every operation on its own (its name, stage, stream and tensor), the family's
order, then runs the events (every start and end) in time and checks the model at each one (the
rules T1-T5 of docs/combined.md). Violations are reported in that order; the first one is kept.
A violation of the model (an input missing, a tensor freed in flight, two computations at once)
stops the replay; a wrong stated time or a budget exceeded does not, so that ``makespan`` and
``peak_memory`` are those of the whole plan.

The bytes are counted in one place, :class:`~memplan.simulator.chain_memory.ChainMemory` (NOTE
[ chain-model memory ] there).
"""

from __future__ import annotations

from collections.abc import Sequence

from memplan.profile.model import Profile
from memplan.schedule import Budget, Op
from memplan.simulator.chain_memory import ChainMemory
from memplan.simulator.operations import (
    CHAIN,
    COMBINED,
    OFFLOAD,
    Rules,
    Step,
    prefetch_problem,
    read_steps,
    store_all_position,
    store_all_problem,
)
from memplan.simulator.result import SimulationResult, over_budget
from memplan.simulator.terms import step_temporaries
from memplan.simulator.timing import instants


def simulate_ops(
    profile: Profile,
    ops: Sequence[Op | tuple[str, int]],
    *,
    rules: Rules = COMBINED,
    static_memory: int = 0,
    memory: int | None = None,
    bandwidth: float | None = None,
    gradients: str | None = None,
    optimizer: str = "sgd",
    budget: Budget | None = None,
) -> SimulationResult:
    """Replay the operations of a chain, offloading or combined schedule (``rules``).

    Parameters
    ----------
    profile : Profile
        The chain the schedule was made for.
    ops : sequence of Op or of (str, int)
        Computations ``F_all``/``F_ck``/``F_n``/``B`` on stream ``compute`` and transfers
        ``offload``/``prefetch`` on stream ``transfer`` naming their tensor (``x[k]`` or ``s[k]``;
        default ``s[stage]``), with start and end times (ms); a chain's may be ``(op, stage)``
        pairs, laid back to back.
    rules : Rules
        The family's restrictions: :data:`CHAIN`, :data:`OFFLOAD` or :data:`COMBINED`.
    static_memory : int
        Bytes present all the time (weights, gradients, optimizer state), added to every figure.
    memory : int, optional
        Budget, static memory included; the first event that exceeds it is a violation.
    bandwidth : float, optional
        Host<->device bytes/s (a transfer of ``b`` bytes lasts ``b / bandwidth`` s); required by
        the families with transfers.
    gradients : {"at-backward", "kept", "step-in-backward"}, optional
        The training loop the plan was made for (NOTE [ training-loop memory terms ],
        memplan/profile/memory.py); None: the model before the loop's terms.
    optimizer : str
        With ``none`` the replay counts no weight gradients (the budget is for activations).
    budget : Budget, optional
        The schedule's budget, which replaces ``gradients`` and ``optimizer``: with its
        optimizer's step, the step after the backward is replayed too, and its loop's terms
        (NOTE [ simulator memory terms ] in :mod:`.terms`).

    Returns
    -------
    SimulationResult
        ``makespan``, ``idle_time``, ``peak_memory``, ``op_peaks`` (one per operation the replay
        started, in the schedule's order: every one when the replay ran to the end), the
        ``memory_curve`` and the first ``violation`` (see the module docstring for which stop
        the replay).
    """
    result = SimulationResult(static_memory=static_memory, budget=memory)
    if budget is None:
        budget = Budget(optimizer=optimizer, gradients=gradients)  # type: ignore[arg-type]
    transfers = "offload" in rules.operations
    if transfers and not (bandwidth is not None and bandwidth > 0):
        result.fail(f"bandwidth {bandwidth!r}: expected a positive rate")
        return result
    steps = read_steps(profile, ops, rules, bandwidth, result)
    if steps is None:
        return result
    if rules.back_to_back:  # computations only (checked per operation), in the schedule's order
        started = _replay(profile, _in_order(steps), [], result, memory, budget)
        result.makespan = started[-1].end if started else 0.0
        return result
    length = len(profile.chain_stages)
    instant = instants(t for step in steps for t in (step.start, step.end))
    by_time = sorted(steps, key=lambda s: (instant[s.start], s.index))
    compute = [s for s in by_time if s.compute]
    channel = [s for s in by_time if not s.compute]
    if rules.store_all:
        # the model fixes the order of computations at one instant (zero-duration ones)
        compute.sort(key=lambda s: (instant[s.start], store_all_position(s, length)))
        if store_all_problem(compute, length, result):
            return result
    if prefetch_problem(channel, result):
        return result
    _replay(profile, _in_time(compute, channel, instant), channel, result, memory, budget)
    result.makespan = max((s.end for s in steps), default=0.0)
    result.idle_time = max(0.0, result.makespan - sum(s.duration for s in compute))
    return result


Event = tuple[float, bool, Step]
"""``(time, is_end, operation)``: the start or the end of an operation."""


def _in_order(steps: list[Step]) -> list[Event]:
    """A chain's events: each computation starts and ends, in the schedule's order."""
    return [
        event for step in steps for event in ((step.start, False, step), (step.end, True, step))
    ]


def _in_time(compute: list[Step], channel: list[Step], instant: dict[float, float]) -> list[Event]:
    """Every start and end in time, at one instant in the order of rule T5: the ends of operations
    that lasted (transfers first) before the starts, which take effect in schedule order, a
    zero-duration operation starting and ending in its place (a prefetch too short to last an
    instant, listed before the backward that reads it, has arrived when that backward starts).

    The computations keep their order in ``compute`` (the model's, for the offloading family): they
    take the schedule positions of the computations in that order; a transfer keeps its own.
    """
    order = dict(zip((s.index for s in compute), sorted(s.index for s in compute), strict=True))
    order.update((s.index, s.index) for s in channel)
    keyed: list[tuple[float, int, int, int, int, Step]] = []
    for position, step in enumerate(compute + channel):
        start, end = instant[step.start], instant[step.end]
        keyed.append((start, 1, order[step.index], 0, 0, step))
        if end == start:
            keyed.append((start, 1, order[step.index], 1, 1, step))
        else:
            keyed.append((end, 0, int(step.compute), position, 1, step))
    keyed.sort(key=lambda event: event[:5])
    return [(when, bool(is_end), step) for when, _, _, _, is_end, step in keyed]


def _replay(  # noqa: C901 - one event loop (T1-T4) over shared state
    profile: Profile,
    events: list[Event],
    channel: list[Step],
    result: SimulationResult,
    memory: int | None,
    budget: Budget,
) -> list[Step]:
    """Run the events on :class:`ChainMemory` (``channel``: the transfers in time), then the
    optimizer's step when the budget counts it; the operations that started.
    """
    state = ChainMemory(profile, channel, budget)
    static = result.static_memory
    peak = level = static + state.held
    curve = result.memory_curve
    curve.append((0.0, level))
    running: dict[int, int] = {}  # op index -> the most memory since it started
    peaks: dict[int, int] = {}
    in_flight: list[Step] = []
    started: list[Step] = []
    for when, is_end, step in events:
        if is_end:
            if step.compute:
                problem = state.finish(step)
            else:
                state.transfer_end(step)  # a transfer always ends
                problem = None
        elif step.compute:
            problem = state.start(step, when)
        else:
            if in_flight:  # T1: one transfer at a time
                other = in_flight[0]
                result.fail(
                    f"{step.where}: starts at {step.start} while ops[{other.index}] still "
                    f"transfers (until {other.end}); one transfer at a time",
                    step.index,
                )
            problem = state.transfer_start(step)
        if problem is not None:
            result.fail(f"{step.where}: {problem}", step.index)
            break
        level = static + state.held
        curve.append((when, level))
        if is_end:
            peaks[step.index] = running.pop(step.index)
            if not step.compute:
                in_flight.remove(step)
        else:
            started.append(step)
            if not step.compute:
                in_flight.append(step)
            if step.timing is not None:
                result.fail(step.timing, step.index)
            if memory is not None and level > memory:
                result.fail(f"{step.where}: {over_budget(level, memory)}", step.index)
            running[step.index] = level
        for index, most in running.items():
            if level > most:
                running[index] = level
        if level > peak:
            peak = level
    else:
        if state.next_backward >= 0:
            result.fail(f"incomplete: B stage {state.next_backward} never ran")
        temporaries = step_temporaries(profile, budget)
        if temporaries is not None and result.valid:
            # the caller's batch x[0], which the chain lets go at B 0, is its until the step ends
            batch = 0 if state.place["x[0]"] is not None else state.size["x[0]"]
            stepping = static + state.held + batch + temporaries
            if memory is not None and stepping > memory:
                result.fail(f"the optimizer's step {over_budget(stepping, memory)}")
            if events:  # the step, at the end of the last operation
                curve += [(events[-1][0], stepping), (events[-1][0], level)]
            peak = max(peak, stepping)
    result.peak_memory = peak
    peaks.update(running)
    result.op_peaks = [peaks[index] for index in sorted(peaks)]
    return started


def simulate_chain(
    profile: Profile,
    ops: Sequence[Op | tuple[str, int]],
    *,
    static_memory: int = 0,
    memory: int | None = None,
    gradients: str | None = None,
    optimizer: str = "sgd",
    budget: Budget | None = None,
) -> SimulationResult:
    """Replay a chain (rematerialization) plan: :func:`simulate_ops` with :data:`CHAIN`.

    ``ops`` may be :class:`memplan.schedule.Op` (their times are checked: back to back from time
    0, each lasting its profile duration) or ``(op_name, stage)`` pairs (laid back to back).
    """
    return simulate_ops(
        profile,
        ops,
        rules=CHAIN,
        static_memory=static_memory,
        memory=memory,
        gradients=gradients,
        optimizer=optimizer,
        budget=budget,
    )


def simulate_offload(
    profile: Profile,
    ops: Sequence[Op],
    *,
    static_memory: int = 0,
    memory: int | None = None,
    bandwidth: float,
) -> SimulationResult:
    """Replay an offloading schedule: :func:`simulate_ops` with :data:`OFFLOAD`."""
    return simulate_ops(
        profile, ops, rules=OFFLOAD, static_memory=static_memory, memory=memory, bandwidth=bandwidth
    )


def simulate_combined(
    profile: Profile,
    ops: Sequence[Op],
    *,
    static_memory: int = 0,
    memory: int | None = None,
    bandwidth: float,
) -> SimulationResult:
    """Replay a combined schedule: :func:`simulate_ops` with :data:`COMBINED`."""
    return simulate_ops(
        profile,
        ops,
        rules=COMBINED,
        static_memory=static_memory,
        memory=memory,
        bandwidth=bandwidth,
    )
