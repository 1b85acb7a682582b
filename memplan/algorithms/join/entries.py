"""The join family (papers/003): its options, algorithms and simulator, declared once.

Cheap to import: the solvers load when first called. Each algorithm's
``solve(profile, request: SolveRequest) -> Schedule`` returns a finished schedule, which
:func:`memplan.solve` replays with the family's simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memplan.algorithms.base import AlgorithmInfo, Family
from memplan.algorithms.options import slots_option, time_limit_option

REFERENCE = "Beaumont, Herrmann, Pallez & Shilova, Optimal memory-aware backpropagation of deep join networks"


DEFAULT_SLOTS = 500
MAX_SLOTS = 100_000


@dataclass(frozen=True)
class JoinOptions:
    """Options of the join family (``slots``: the chain model of non-uniform profiles)."""

    slots: int = slots_option(DEFAULT_SLOTS, MAX_SLOTS)
    time_limit: float | None = time_limit_option(None)


def _run_join(profile: Any, request: Any) -> Any:
    from memplan.algorithms.join.solve import run_join

    return run_join(profile, request)


def _run_equiv_chain(profile: Any, request: Any) -> Any:
    from memplan.algorithms.join.solve import run_equiv_chain

    return run_equiv_chain(profile, request)


def _describe(profile: Any, static_memory: int) -> dict[str, Any]:
    from memplan.algorithms.join import describe_join

    return {"min_memory": {}, **describe_join(profile, static_memory)}


ALGORITHMS: list[AlgorithmInfo] = [
    AlgorithmInfo(
        name="join",
        family="join",
        exact=True,
        needs="join profile (branches + turn); --slots if not uniform; --time-limit",
        summary="optimal canonical schedule of k chains joined by the loss (Opt_join DP; "
        "exact in slots for uniform profiles, rotor segments otherwise)",
        short="optimal canonical schedule (Opt_join)",
        reference=REFERENCE + ", Theorem 3",
        solve=_run_join,
    ),
    AlgorithmInfo(
        name="equiv-chain",
        family="join",
        exact=False,
        needs="join profile (branches + turn); --slots if not uniform; --time-limit",
        summary="baseline: steps at equal distance from the turn grouped into one chain, "
        "solved by Revolve (uniform) or rotor",
        short="baseline: equal-distance steps, one chain",
        reference=REFERENCE + ", Section 4 (EQUIV-CHAIN)",
        solve=_run_equiv_chain,
    ),
]

FAMILY = Family(
    name="join",
    profile_kind="join",
    simulator="memplan.simulator.join:simulate_join",
    options=JoinOptions,
    describe=_describe,
    algorithms=tuple(ALGORITHMS),
)
