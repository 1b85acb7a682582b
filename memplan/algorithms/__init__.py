"""All algorithms, grouped by family, behind one registry used by :func:`memplan.solve`."""

from __future__ import annotations

from typing import Any

from memplan.algorithms.base import AlgorithmInfo, ChainPlan, OffloadPlan, SolveRequest
from memplan.algorithms.chain.problem import Chain
from memplan.algorithms.graph.entries import ALGORITHMS as GRAPH_ALGORITHMS
from memplan.algorithms.join.entries import ALGORITHMS as JOIN_ALGORITHMS
from memplan.algorithms.pipeline.entries import ALGORITHMS as PIPELINE_ALGORITHMS
from memplan.profile.model import Profile


def _chain(solver_name: str):
    """Adapt a chain solver ``f(chain, memory, **options)`` to the registry's calling convention."""

    def run(
        profile: Profile,
        memory: int,
        *,
        slots: int,
        time_limit: Any = None,
        bandwidth: float | None = None,
    ) -> ChainPlan:
        from memplan.algorithms import chain as family

        solver = getattr(family, solver_name)
        kwargs = {"slots": slots} if solver_name == "solve_rotor" else {}
        return solver(Chain.from_profile(profile), memory, **kwargs)

    return run


def _offload(solver_name: str, **options: Any):
    """Adapt an offloading solver ``f(instance, memory, **options)`` (bandwidth in bytes/s)."""

    def run(
        profile: Profile,
        memory: int,
        *,
        slots: int,
        time_limit: Any = None,
        bandwidth: float | None = None,
    ) -> OffloadPlan:
        from memplan.algorithms import offload as family

        if bandwidth is None:  # pragma: no cover - memplan.solve resolves it first
            raise ValueError("offloading algorithms need a bandwidth")
        solver = getattr(family, solver_name)
        kwargs = dict(options)
        if solver_name == "solve_dynprog":
            kwargs["slots"] = slots
        return solver(family.OffloadInstance.from_profile(profile, bandwidth), memory, **kwargs)

    return run


def _combined(solver_name: str):
    """Adapt a combined solver ``f(chain, memory, bandwidth=, slots=, offload_instance=)``."""

    def run(
        profile: Profile,
        memory: int,
        *,
        slots: int,
        time_limit: Any = None,
        bandwidth: float | None = None,
        rotor_slots: int | str | None = None,
    ) -> OffloadPlan:
        from memplan.algorithms import combined as family
        from memplan.algorithms.offload import OffloadInstance

        if bandwidth is None:  # pragma: no cover - memplan.solve resolves it first
            raise ValueError("combined algorithms need a bandwidth")
        solver = getattr(family, solver_name)
        return solver(
            Chain.from_profile(profile),
            memory,
            bandwidth=bandwidth,
            slots=slots,
            rotor_slots=rotor_slots,
            offload_instance=OffloadInstance.from_profile(profile, bandwidth),
            profile=profile,
        )

    return run


OFFLOAD_REFERENCE = (
    "Beaumont, Eyraud-Dubois & Shilova 2020, Optimal GPU-CPU offloading strategies for DNN training"
)
REFINED_CANDIDATES = 8
"""How many of the DP's best final states ``dynprog-best`` tries in the real schedule."""

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
        AlgorithmInfo(
            name="greedy",
            family="offload",
            exact=False,
            needs="profile, --bandwidth",
            summary="offload the first activations (optimal if they could be split, Theorem 2)",
            reference=OFFLOAD_REFERENCE + ", §4",
            run=_offload("solve_greedy"),
        ),
        AlgorithmInfo(
            name="dynprog",
            family="offload",
            exact=False,
            needs="profile, --bandwidth, --slots",
            summary="DP optimal with interruptible transfers (Algorithm 1, slots), then no-wait",
            reference=OFFLOAD_REFERENCE + ", §5",
            run=_offload("solve_dynprog"),
        ),
        AlgorithmInfo(
            name="dynprog-best",
            family="offload",
            exact=False,
            needs="profile, --bandwidth, --slots",
            summary=f"dynprog trying its {REFINED_CANDIDATES} best DP sets in the real schedule",
            reference="memplan's refinement of " + OFFLOAD_REFERENCE,
            run=_offload("solve_dynprog", candidates=REFINED_CANDIDATES),
        ),
        AlgorithmInfo(
            name="pofo",
            family="combined",
            exact=False,
            needs="profile, --bandwidth, --slots",
            summary="recomputation + whole-tensor offloading DP (Theorem 1 structure), "
            "best of it, rotor and dynprog",
            reference="Beaumont, Eyraud-Dubois, Shilova, Optimal GPU-CPU offloading strategies "
            "for DNN training (POFO), appendix B",
            run=_combined("solve_pofo"),
        ),
        AlgorithmInfo(
            name="vdnn",
            family="offload",
            exact=False,
            needs="profile, --bandwidth",
            summary="vDNN++-style thresholds on compute time per byte, all or every other one",
            reference=OFFLOAD_REFERENCE + ", §6.1 (after vDNN++, Shriram et al. 2019)",
            run=_offload("solve_vdnn"),
        ),
    ]
    + JOIN_ALGORITHMS
    + GRAPH_ALGORITHMS
    + PIPELINE_ALGORITHMS
}

SCHEDULE_FAMILIES = ("join", "graph", "pipeline")
"""Families whose ``run(profile, request)`` returns a whole Schedule (see SolveRequest)."""

__all__ = [
    "REGISTRY",
    "SCHEDULE_FAMILIES",
    "AlgorithmInfo",
    "ChainPlan",
    "OffloadPlan",
    "SolveRequest",
]
