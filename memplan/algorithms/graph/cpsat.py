"""What the graph family's CP-SAT solvers share: the worker count and the progress callbacks.

Imported by the solvers only when they run (``import memplan`` loads no ortools).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ortools.sat.python import cp_model

Progress = Callable[[str], None]
"""Where a solver reports one line per improving solution."""


def workers() -> int:
    """CP-SAT search workers: the machine's cores, at least 1 and at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


class ArenaProgress(cp_model.CpSolverSolutionCallback):
    """Reports each improving arena (objective, bound, gap) to ``sink``."""

    def __init__(self, label: str, sink: Progress | None, began: float) -> None:
        super().__init__()
        self._label, self._sink, self._began = label, sink, began
        self.solutions = 0

    def on_solution_callback(self) -> None:
        self.solutions += 1
        if self._sink is None:
            return
        value, bound = self.objective_value, self.best_objective_bound
        gap = (value - bound) / value if value else 0.0
        self._sink(
            f"{self._label}: {time.perf_counter() - self._began:6.1f} s  "
            f"objective {value / 1e6:,.3f} MB  bound {bound / 1e6:,.3f} MB  gap {gap:.2%}"
        )


class PeakProgress(cp_model.CpSolverSolutionCallback):
    """Reports each improving peak resident memory in bytes to ``sink`` (the model counts in
    units of ``scale`` above ``constant``).
    """

    def __init__(
        self, scale: int, constant: int, sink: Progress | None, label: str, began: float
    ) -> None:
        super().__init__()
        self._scale, self._constant = scale, constant
        self._sink, self._label, self._began = sink, label, began

    def on_solution_callback(self) -> None:
        if self._sink is None:
            return
        value = self.objective_value * self._scale + self._constant
        bound = self.best_objective_bound * self._scale + self._constant
        gap = (value - bound) / value if value else 0.0
        self._sink(
            f"{self._label}: {time.perf_counter() - self._began:6.1f} s  peak resident "
            f"{value / 1e6:,.3f} MB  bound {bound / 1e6:,.3f} MB  gap {gap:.2%}"
        )
