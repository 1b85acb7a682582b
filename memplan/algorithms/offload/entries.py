"""The offloading family (papers/004): its options, algorithms and simulator, declared once.

Each algorithm's ``solve(profile, request)`` resolves the bandwidth (the option, else the
profile's), runs its solver on the offloading instance for the activation budget (an
``OffloadPlan``: timed operations on the compute and transfer streams) and wraps the plan with
:func:`memplan.algorithms.timeline.offload_schedule`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from memplan.algorithms.base import AlgorithmInfo, Family, SolveRequest
from memplan.algorithms.options import bandwidth_option, slots_option, time_limit_option

MAX_SLOTS = 100_000
OFFLOAD_REFERENCE = (
    "Beaumont, Eyraud-Dubois & Shilova 2020, Optimal GPU-CPU offloading strategies for DNN training"
)
REFINED_CANDIDATES = 8
"""How many of the DP's best final states ``dynprog-best`` tries in the real schedule."""


@dataclass(frozen=True)
class OffloadOptions:
    """Options of the offloading family."""

    slots: int | str = slots_option(
        "auto",
        MAX_SLOTS,
        words=("auto",),
        default_text="auto: 500 slots, then finer grids while they are cheap",
    )
    bandwidth: float | None = bandwidth_option()
    time_limit: float | None = time_limit_option(None)


def _solver(solver_name: str, algorithm: str, **fixed: Any):
    """``solve(profile, request)`` of an offloading solver ``f(instance, memory, **options)``."""

    def solve(profile: Any, request: SolveRequest) -> Any:
        from memplan.algorithms import offload as family
        from memplan.algorithms.options import resolve_bandwidth
        from memplan.algorithms.timeline import Deadline, offload_schedule

        rate = resolve_bandwidth(profile, algorithm, request.options.bandwidth)
        kwargs = dict(fixed)
        started = time.perf_counter()
        if solver_name == "solve_dynprog":
            kwargs["slots"] = request.options.slots
            kwargs["deadline"] = Deadline.after(request.options.time_limit)
        instance = family.OffloadInstance.from_profile(profile, rate)
        plan = getattr(family, solver_name)(instance, request.activation_memory, **kwargs)
        return offload_schedule(profile, request, algorithm, "offload", plan, rate, started)

    return solve


def describe_offload(profile: Any, static_memory: int) -> dict[str, Any]:
    """What ``memplan info`` adds: the least memory with every activation offloaded, M_peak."""
    from memplan.algorithms.offload import OffloadInstance

    offload = OffloadInstance.from_profile(profile, profile.bandwidth or 1.0)
    return {
        "min_memory": {"offload": static_memory + offload.min_memory()},
        "offload_peak": static_memory + offload.peak(),
    }


FAMILY = Family(
    name="offload",
    profile_kind="chain",
    simulator="memplan.simulator.replay:replay_offload",
    options=OffloadOptions,
    describe=describe_offload,
    algorithms=(
        AlgorithmInfo(
            name="greedy",
            family="offload",
            exact=False,
            needs="profile, --bandwidth",
            summary="offload the first activations (optimal if they could be split, Theorem 2)",
            short="offload the first activations",
            reference=OFFLOAD_REFERENCE + ", §4",
            solve=_solver("solve_greedy", "greedy"),
        ),
        AlgorithmInfo(
            name="dynprog",
            family="offload",
            exact=False,
            needs="profile, --bandwidth, --slots, --time-limit",
            summary="DP optimal with interruptible transfers (Algorithm 1, slots), then no-wait",
            short="DP over the offloaded set (Algorithm 1)",
            reference=OFFLOAD_REFERENCE + ", §5",
            solve=_solver("solve_dynprog", "dynprog"),
        ),
        AlgorithmInfo(
            name="dynprog-best",
            family="offload",
            exact=False,
            needs="profile, --bandwidth, --slots, --time-limit",
            summary=f"dynprog trying its {REFINED_CANDIDATES} best DP sets in the real schedule",
            short="dynprog, its 8 best sets replayed",
            reference="memplan's refinement of " + OFFLOAD_REFERENCE,
            solve=_solver("solve_dynprog", "dynprog-best", candidates=REFINED_CANDIDATES),
        ),
        AlgorithmInfo(
            name="vdnn",
            family="offload",
            exact=False,
            needs="profile, --bandwidth",
            summary="vDNN++-style thresholds on compute time per byte, all or every other one",
            short="vDNN++ thresholds on time per byte",
            reference=OFFLOAD_REFERENCE + ", §6.1 (after vDNN++, Shriram et al. 2019)",
            solve=_solver("solve_vdnn", "vdnn"),
        ),
    ),
)
