"""The graph family's entries in the algorithm registry (cheap to import: solvers load lazily).

Each entry's ``run(profile, request: SolveRequest) -> Schedule`` returns a finished schedule,
which :func:`memplan.solve` replays with the family's simulator.
"""

from __future__ import annotations

from memplan.algorithms.base import AlgorithmInfo

ALGORITHMS: list[AlgorithmInfo] = []
