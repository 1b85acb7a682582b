"""The join family's entries in the algorithm registry (cheap to import: solvers load lazily).

Each entry's ``run(profile, request: SolveRequest) -> Schedule`` returns a finished schedule,
which :func:`memplan.solve` replays with the family's simulator.
"""

from __future__ import annotations

from typing import Any

from memplan.algorithms.base import AlgorithmInfo

REFERENCE = "Beaumont, Herrmann, Pallez & Shilova, Optimal memory-aware backpropagation of deep join networks"


def _run_join(profile: Any, request: Any) -> Any:
    from memplan.algorithms.join.solve import run_join

    return run_join(profile, request)


def _run_equiv_chain(profile: Any, request: Any) -> Any:
    from memplan.algorithms.join.solve import run_equiv_chain

    return run_equiv_chain(profile, request)


ALGORITHMS: list[AlgorithmInfo] = [
    AlgorithmInfo(
        name="join",
        family="join",
        exact=True,
        needs="join profile (branches + turn); --slots if not uniform",
        summary="optimal canonical schedule of k chains joined by the loss (Opt_join DP; "
        "exact in slots for uniform profiles, rotor segments otherwise)",
        reference=REFERENCE + ", Theorem 3",
        run=_run_join,
    ),
    AlgorithmInfo(
        name="equiv-chain",
        family="join",
        exact=False,
        needs="join profile (branches + turn); --slots if not uniform",
        summary="baseline: steps at equal distance from the turn grouped into one chain, "
        "solved by Revolve (uniform) or rotor",
        reference=REFERENCE + ", Section 4 (EQUIV-CHAIN)",
        run=_run_equiv_chain,
    ),
]
