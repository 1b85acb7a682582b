"""Time as the simulators compare it: one tolerance, instants, durations, back-to-back runs."""

from __future__ import annotations

import math
from collections.abc import Iterable

TIME_TOLERANCE = 1e-6
"""Relative and absolute tolerance of the timing checks (ms)."""


def close(a: float, b: float) -> bool:
    """Whether two times agree within :data:`TIME_TOLERANCE` (relative and absolute)."""
    return math.isclose(a, b, rel_tol=TIME_TOLERANCE, abs_tol=TIME_TOLERANCE)


def same_instant(a: float, b: float) -> bool:
    """Whether two times are one instant: within TIME_TOLERANCE ms and the rounding of the times.

    Absolute, not relative to the times: at 1.8e7 ms (after transfers at a few bytes/s) a
    relative tolerance of 1e-6 would merge events 18 ms apart, a whole computation's start and end.
    """
    return abs(a - b) <= TIME_TOLERANCE + 4 * math.ulp(max(abs(a), abs(b)))


def instants(times: Iterable[float]) -> dict[float, float]:
    """Map each time to the first time of its cluster of times at one instant (:func:`same_instant`).

    Solvers compute times with float noise (``0.33333333333333326`` for ``1/3``); events closer
    than the tolerance happen at the same instant, in the order the model gives them.
    """
    instant: dict[float, float] = {}
    first: float | None = None
    for when in sorted(set(times)):
        if first is not None and same_instant(when, first):
            instant[when] = first
        else:
            instant[when] = first = when
    return instant


def lasts(start: float, end: float, duration: float) -> bool:
    """Whether ``end - start`` is ``duration``, to TIME_TOLERANCE and to the rounding of the times.

    A 0.6 ms operation that starts at 1.4e11 ms (a transfer at a few bytes/s came before it) has
    ``end - start`` right only to float64's spacing there (3e-5 ms): that much is no violation.
    """
    slack = TIME_TOLERANCE * max(1.0, abs(duration)) + 4 * math.ulp(max(abs(start), abs(end)))
    return abs((end - start) - duration) <= slack


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
    names the operation in the message on its duration.
    """
    if not close(start, previous_end):
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
