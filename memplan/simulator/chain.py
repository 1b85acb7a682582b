"""Replay a chain plan operation by operation, exactly per the memory model of docs/model.md.

This module is the independent check of every chain solver: it shares no code with
:mod:`memplan.algorithms` and must not import it. It tracks every tensor in memory with its bytes:

* the standalone checkpoints ``x[k]`` (``k = 0 .. L``; ``x[0]`` is the chain input),
* the saved tensors ``s[k]`` of the forwards run with ``F_all`` (``s[k]`` contains ``x[k+1]``),
* the one current gradient: ``g[L]`` at the start, then ``g[k]`` after ``B`` on stage ``k``.

For each operation it checks the inputs are present and the outputs are not already held, computes
the peak during the operation and applies the frees, keeping a running total of the bytes held, so a
replay costs O(1) per operation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from memplan.profile.model import Profile
from memplan.schedule import Op

FORWARD_OPS = ("F_all", "F_ck", "F_n")
"""Forward operations (duration ``forward_time``)."""

TRANSFER_OPS = ("offload", "prefetch")
"""Operations of the offloading model, not replayed by the chain simulator yet."""

TIME_TOLERANCE = 1e-6
"""Relative and absolute tolerance of the timing checks."""


@dataclass
class SimulationResult:
    """What a replay found.

    Attributes
    ----------
    valid : bool
        True when the plan obeys the model (and fits ``budget`` when one was given).
    makespan : float
        Sum of the profile durations of the operations replayed (ms).
    peak_memory : int
        Largest memory during any operation replayed, static memory included (bytes).
    static_memory : int
        Bytes present during the whole iteration (weights etc.), counted in every figure.
    budget : int or None
        The memory budget checked, static memory included; None when none was checked.
    violation : str or None
        The first problem found, one line naming the operation, e.g.
        ``ops[12] B stage 3: s[3] is not in memory``.
    violation_index : int or None
        Index in ``ops`` of the operation ``violation`` names (None for problems of the whole plan,
        e.g. an incomplete one).
    memory_curve : list of (float, int)
        Memory over time, static included: for each operation, one point at its start with the
        peak during it, and one at its end after its frees.
    op_peaks : list of int
        Peak during each operation replayed, static included.
    idle_time : float
        Time the compute stream waits (ms): makespan minus the compute time (offloading
        schedules; always 0 for chains, whose operations run back to back).
    """

    valid: bool = True
    makespan: float = 0.0
    peak_memory: int = 0
    static_memory: int = 0
    budget: int | None = None
    violation: str | None = None
    violation_index: int | None = None
    memory_curve: list[tuple[float, int]] = field(default_factory=list)
    op_peaks: list[int] = field(default_factory=list)
    idle_time: float = 0.0

    def fail(self, message: str, index: int | None = None) -> None:
        """Mark the plan invalid; only the first violation is kept.

        Parameters
        ----------
        message : str
            One line saying what is wrong and where.
        index : int, optional
            Index of the operation at fault.
        """
        self.valid = False
        if self.violation is None:
            self.violation = message
            self.violation_index = index

    @property
    def fits(self) -> bool:
        """Whether the peak is within the budget (True when no budget was given)."""
        return self.budget is None or self.peak_memory <= self.budget


class _ChainState:
    """The tensors in memory during a replay, with the running total of their bytes.

    Parameters
    ----------
    profile : Profile
        The chain; its sizes are copied into plain lists for speed.
    """

    def __init__(self, profile: Profile) -> None:
        stages = profile.stages
        self.length = len(stages)
        # x[0] .. x[L], s[0] .. s[L-1], g[0] .. g[L]
        self.x_size = [profile.input_size] + [st.output_size for st in stages]
        self.s_size = [st.saved_size for st in stages]
        self.g_size = [0] + [st.gradient_size for st in stages]
        self.forward_overhead = [st.forward_overhead for st in stages]
        self.backward_overhead = [st.backward_overhead for st in stages]
        self.forward_time = [st.forward_time for st in stages]
        self.backward_time = [st.backward_time for st in stages]
        self.x_held = [False] * (self.length + 1)
        self.s_held = [False] * self.length
        # Start state: x[0] and g[L] are held; the next backward is on the last stage (the loss).
        self.x_held[0] = True
        self.next_backward = self.length - 1
        self.held = self.x_size[0] + self.g_size[self.length]
        # k of the standalone x[k] the previous operation produced (memory persistency), or -1.
        self.fresh = -1

    def available(self, k: int) -> bool:
        """Whether ``x[k]`` is available: held standalone or inside ``s[k-1]``."""
        return self.x_held[k] or (k > 0 and self.s_held[k - 1])

    def duration(self, name: str, k: int) -> float:
        """Duration of operation ``name`` on stage ``k`` (ms)."""
        return self.backward_time[k] if name == "B" else self.forward_time[k]

    def problem(self, name: str, k: int) -> str | None:
        """Why operation ``name`` cannot run on stage ``k`` now, or None if it can."""
        if name == "B":
            if self.next_backward < 0:
                return "every backward has already run"
            if k != self.next_backward:
                return f"backward out of order: the next backward is B stage {self.next_backward}"
            # g[k+1] is held: it is g[L] at the start or the output of B stage k+1.
            if not self.s_held[k]:
                return f"s[{k}] is not in memory"
        elif name == "F_all":
            if self.s_held[k]:
                return f"s[{k}] is already in memory"
        elif self.x_held[k + 1]:
            return f"x[{k + 1}] is already in memory"
        elif name == "F_n" and self.x_held[k] and self.fresh != k:
            return (
                f"would free the stored checkpoint x[{k}] (memory persistency: F_n may only "
                "consume the activation the previous operation produced; use F_ck)"
            )
        if not self.available(k):
            return self._missing_input(k)
        return None

    def _missing_input(self, k: int) -> str:
        if k == 0:
            return "x[0] is not in memory (the chain input cannot be recomputed)"
        return f"x[{k}] is not in memory (neither x[{k}] nor s[{k - 1}] is held)"

    def peak(self, name: str, k: int) -> int:
        """Bytes during operation ``name`` on stage ``k`` (static memory excluded)."""
        if name == "B":
            return self.held + self.g_size[k] + self.backward_overhead[k]
        produced = self.s_size[k] if name == "F_all" else self.x_size[k + 1]
        return self.held + produced + self.forward_overhead[k]

    def apply(self, name: str, k: int) -> None:
        """Produce the outputs of a valid operation and free what it frees."""
        self.fresh = k + 1 if name in ("F_ck", "F_n") else -1
        if name == "F_all":
            self.s_held[k] = True
            self.held += self.s_size[k]
            return
        if name == "B":
            self.held += self.g_size[k] - self.g_size[k + 1] - self.s_size[k]
            self.s_held[k] = False
            self.next_backward -= 1
        else:  # F_ck, F_n
            self.x_held[k + 1] = True
            self.held += self.x_size[k + 1]
            if name == "F_ck":
                return
        # F_n and B free the standalone x[k] if it is held.
        if self.x_held[k]:
            self.x_held[k] = False
            self.held -= self.x_size[k]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TIME_TOLERANCE, abs_tol=TIME_TOLERANCE)


def same_instant(a: float, b: float) -> bool:
    """Whether two times are one instant: within TIME_TOLERANCE ms and the rounding of the times.

    Absolute, not relative to the times: at 1.8e7 ms (after transfers at a few bytes/s) a
    relative tolerance of 1e-6 would merge events 18 ms apart, a whole computation's start and end.
    """
    return abs(a - b) <= TIME_TOLERANCE + 4 * math.ulp(max(abs(a), abs(b)))


def back_to_back_problem(
    index: int,
    start: float,
    end: float,
    previous_end: float,
    duration: float,
    family: str,
    operation: str = "",
) -> str | None:
    """Why the timed ``ops[index]`` does not run right after the previous one for exactly its
    ``duration`` (a chain's or a join's operations run back to back), or None; ``operation``
    names the operation in the message on its duration."""
    if not _close(start, previous_end):
        before = f"the end {previous_end} of ops[{index - 1}]" if index else "time 0"
        if start < previous_end:
            return f"ops[{index}].start: {start} is before {before}"
        # the makespan is the sum of the durations: no idle time to hide
        return (
            f"ops[{index}].start: {start} leaves a gap after {before} ({family} "
            "operations run back to back)"
        )
    if not lasts(start, end, duration):
        named = f" of {operation}" if operation else ""
        return f"ops[{index}].end: {end} != start {start} + duration {duration}{named}"
    return None


def lasts(start: float, end: float, duration: float) -> bool:
    """Whether ``end - start`` is ``duration``, to TIME_TOLERANCE and to the rounding of the times.

    A 0.6 ms operation that starts at 1.4e11 ms (a transfer at a few bytes/s came before it) has
    ``end - start`` right only to float64's spacing there (3e-5 ms): that much is no violation.
    """
    slack = TIME_TOLERANCE * max(1.0, abs(duration)) + 4 * math.ulp(max(abs(start), abs(end)))
    return abs((end - start) - duration) <= slack


def simulate_chain(
    profile: Profile,
    ops: Sequence[Op | tuple[str, int]],
    *,
    static_memory: int = 0,
    memory: int | None = None,
) -> SimulationResult:
    """Replay a chain plan and report its makespan, its peak memory and its first violation.

    Parameters
    ----------
    profile : Profile
        The chain the plan was made for.
    ops : sequence of Op or of (str, int)
        The plan: :class:`memplan.schedule.Op` (then each op's ``start``/``end`` are checked
        against the profile durations) or ``(op_name, stage)`` pairs (laid back to back, no timing
        check).
    static_memory : int
        Bytes present all the time (weights, gradients, optimizer state), added to every figure.
    memory : int, optional
        Budget, static memory included; the first operation whose peak exceeds it is a violation.

    Returns
    -------
    SimulationResult
        ``valid`` and the first ``violation``. After a model violation (a missing input, an
        operation out of order, ...) the replay stops, so the figures cover the operations before
        it; after a timing or memory violation it goes on to the end, so ``peak_memory`` and
        ``makespan`` are those of the whole plan.

    Notes
    -----
    ``makespan`` is the sum of the profile durations of the operations; timed operations must run
    back to back from time 0 (a gap or an overlap is a violation). The memory curve uses the
    ``start``/``end`` of :class:`Op` inputs.
    """
    state = _ChainState(profile)
    result = SimulationResult(static_memory=static_memory, budget=memory)
    result.peak_memory = static_memory + state.held
    curve, op_peaks = result.memory_curve, result.op_peaks
    length = state.length
    makespan = 0.0
    previous_end = 0.0
    for index, item in enumerate(ops):
        timed = isinstance(item, Op)
        if timed:
            name, stage, stream = item.op, item.stage, item.stream
        else:
            name, stage = item
            stream = "compute"
        where = f"ops[{index}] {name} stage {stage}"
        if name in TRANSFER_OPS or stream != "compute":
            what = name if name in TRANSFER_OPS else f"stream {stream!r}"
            result.fail(f"{where}: {what} is not supported by the chain simulator yet", index)
            break
        if name != "B" and name not in FORWARD_OPS:
            result.fail(f"{where}: unknown operation (expected F_all, F_ck, F_n or B)", index)
            break
        if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < length:
            result.fail(
                f"{where}: no such stage (the profile has {length} stages, 0..{length - 1})",
                index,
            )
            break
        problem = state.problem(name, stage)
        if problem is not None:
            result.fail(f"{where}: {problem}", index)
            break

        duration = state.duration(name, stage)
        if timed:
            start, end = item.start, item.end
            problem = back_to_back_problem(
                index, start, end, previous_end, duration, "chain", f"{name} stage {stage}"
            )
            if problem is not None:
                result.fail(problem, index)
            previous_end = end
        else:
            start, end = makespan, makespan + duration
        makespan += duration

        peak = static_memory + state.peak(name, stage)
        if memory is not None and peak > memory:
            result.fail(f"{where}: needs {peak} bytes, budget {memory}", index)
        op_peaks.append(peak)
        if peak > result.peak_memory:
            result.peak_memory = peak
        curve.append((start, peak))
        state.apply(name, stage)
        curve.append((end, static_memory + state.held))
    else:
        if state.next_backward >= 0:
            result.fail(f"incomplete: B stage {state.next_backward} never ran")
    result.makespan = makespan
    return result
