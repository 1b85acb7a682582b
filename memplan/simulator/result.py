"""What every replay returns: :class:`SimulationResult`."""

from __future__ import annotations

from dataclasses import dataclass, field

from memplan.units import format_size


def _bytes(nbytes: int | float) -> str:
    exact = f"{int(nbytes)} bytes"
    return exact if abs(nbytes) < 10_000 else f"{exact} ({format_size(nbytes)})"


def over_budget(needs: int | float, budget: int | float | None) -> str:
    """``needs N bytes, budget B bytes``, each with its size for people when it is large
    (``123456789 bytes (123.46 MB)``): a violation's memory, exact and readable.
    """
    return f"needs {_bytes(needs)}, budget {'-' if budget is None else _bytes(budget)}"


@dataclass
class SimulationResult:
    """What a replay found.

    Attributes
    ----------
    valid : bool
        True when the plan obeys the model (and fits ``budget`` when one was given).
    makespan : float
        Time of the iteration (ms): the end of the last operation (for a chain, whose operations
        run back to back, the sum of the profile durations of the operations replayed).
    peak_memory : int
        Largest memory at any instant of the replay, static memory included (bytes).
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
        Memory over time, static included: the memory at the start of the iteration, then one
        point after each event (the start or the end of an operation).
    op_peaks : list of int
        The most memory while each operation runs, static included: one per operation the replay
        started, in the schedule's order (every one when it ran to the end).
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
