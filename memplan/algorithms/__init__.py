"""All algorithms, grouped by family, behind one registry used by :func:`memplan.solve`."""

from __future__ import annotations

from typing import Any

from memplan.algorithms.base import AlgorithmInfo, ChainPlan
from memplan.algorithms.chain.problem import Chain
from memplan.profile.model import Profile


def _chain(solver_name: str):
    """Adapt a chain solver ``f(chain, memory, **options)`` to the registry's calling convention."""

    def run(profile: Profile, memory: int, *, slots: int, time_limit: Any = None) -> ChainPlan:
        from memplan.algorithms import chain as family

        solver = getattr(family, solver_name)
        kwargs = {"slots": slots} if solver_name == "solve_rotor" else {}
        return solver(Chain.from_profile(profile), memory, **kwargs)

    return run


REGISTRY: dict[str, AlgorithmInfo] = {
    info.name: info
    for info in [
        AlgorithmInfo(
            name="store-all",
            family="chain",
            exact=True,
            needs="profile",
            summary="no recomputation: fastest, needs the most memory (tells how much)",
            reference="-",
            run=_chain("solve_store_all"),
        ),
        AlgorithmInfo(
            name="periodic",
            family="chain",
            exact=False,
            needs="profile",
            summary="equal segments as torch checkpoint_sequential; fastest segment count that fits",
            reference="Chen et al. 2016, Training deep nets with sublinear memory cost",
            run=_chain("solve_periodic"),
        ),
        AlgorithmInfo(
            name="revolve",
            family="chain",
            exact=False,
            needs="profile",
            summary="binomial checkpointing, optimal for homogeneous chains (unit steps)",
            reference="Griewank & Walther 2000, Algorithm 799: Revolve",
            run=_chain("solve_revolve"),
        ),
        AlgorithmInfo(
            name="rotor",
            family="chain",
            exact=True,
            needs="profile, --slots",
            summary="optimal DP for heterogeneous chains (memory discretized in --slots)",
            reference="Beaumont et al. 2019, Optimal checkpointing for heterogeneous chains",
            run=_chain("solve_rotor"),
        ),
    ]
}

__all__ = ["REGISTRY", "AlgorithmInfo", "ChainPlan"]
