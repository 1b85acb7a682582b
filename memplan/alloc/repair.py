"""Local improvement of a placement by ruin and recreate (NOTE [ ruin and recreate ] in
src/alloc_repair.cpp): the least arena's other half (:mod:`memplan.alloc.least`), for the
instances of tens of thousands of buffers on which the exact search's probes below the first
guess run out of nodes.

After Schrimpf et al., *Record Breaking Optimization Results Using the Ruin and Recreate
Principle* (Journal of Computational Physics, 2000): a target below the best arena; moves that
take a buffer above it out with some of the buffers live at the same time and put them back one
by one at the lowest free address, kept when the sum of the tops above the target does not grow.
Every placement it keeps is valid by construction (and :func:`memplan.alloc.place` checks the
one it returns).
"""

from __future__ import annotations

import numpy as np

from memplan.core import kernels

__all__ = ["Repair"]

SEED = 1
"""The moves are drawn from a fixed seed: the same moves on every machine (what a time limit
lets run of them depends on the machine)."""


class Repair:
    """The repair of a placement ``offsets`` of buffers of positive size (``lower``, ``upper``,
    ``size``); ``step`` divides every size (their greatest common divisor).
    """

    def __init__(
        self,
        lower: np.ndarray,
        upper: np.ndarray,
        size: np.ndarray,
        offsets: np.ndarray,
        step: int = 1,
    ) -> None:
        def array(values: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(values, dtype=np.int64)

        self._core = kernels.AllocRepair(
            array(lower), array(upper), array(size), array(offsets), max(int(step), 1), SEED
        )

    def run(self, goal: int, seconds: float | None, moves: int | None = None) -> int:
        """Improve for ``seconds`` (None: no limit) or ``moves`` moves, or until the arena is
        at most ``goal``: the best arena found so far.
        """
        limit = -1.0 if seconds is None else max(float(seconds), 0.0)
        return int(self._core.run(int(goal), -1 if moves is None else int(moves), limit))

    def offer(self, offsets: np.ndarray) -> None:
        """Go on from ``offsets`` (a valid placement) when its arena is below the best."""
        self._core.offer(np.ascontiguousarray(offsets, dtype=np.int64))

    def best(self) -> np.ndarray:
        """The best placement found (the first one until a better one is)."""
        return np.asarray(self._core.best())

    @property
    def best_arena(self) -> int:
        return int(self._core.best_arena)

    @property
    def moves(self) -> int:
        return int(self._core.moves)
