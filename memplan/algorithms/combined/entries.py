"""The combined family (papers/000, POFO): its options, algorithm and simulator, declared once.

``pofo``'s ``solve(profile, request)`` resolves the bandwidth (the option, else the profile's), runs
:func:`memplan.algorithms.combined.solve_pofo` for the activation budget and wraps its timed plan
with :func:`memplan.algorithms.timeline.offload_schedule`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from memplan.algorithms.base import AlgorithmInfo, Family, SolveRequest
from memplan.algorithms.combined import MAX_SLOTS
from memplan.algorithms.options import bandwidth_option, slots_option, time_limit_option


@dataclass(frozen=True)
class CombinedOptions:
    """Options of the combined family (NOTE [ pofo slots auto ])."""

    slots: int | str = slots_option(
        "auto",
        MAX_SLOTS,
        words=("auto",),
        what=" for the combined family (pofo)",
        default_text="auto: 50 slots, and 64 on chains of at most 24 stages; its rotor and "
        "dynprog candidates at their own defaults",
    )
    bandwidth: float | None = bandwidth_option()
    time_limit: float | None = time_limit_option(None)


def solve_pofo(profile: Any, request: SolveRequest) -> Any:
    """``pofo``: the fastest of its DPs, rotor's and dynprog's plans (docs/combined.md)."""
    from memplan.algorithms import combined as family
    from memplan.algorithms.chain.problem import Chain
    from memplan.algorithms.offload import OffloadInstance
    from memplan.algorithms.options import resolve_bandwidth
    from memplan.algorithms.timeline import Deadline, offload_schedule

    rate = resolve_bandwidth(profile, "pofo", request.options.bandwidth)
    slots = request.options.slots
    started = time.perf_counter()
    deadline = Deadline.after(request.options.time_limit)
    plan = family.solve_pofo(
        Chain.from_profile(profile),
        request.activation_memory,
        bandwidth=rate,
        slots=slots,
        offload_instance=OffloadInstance.from_profile(profile, rate),
        profile=profile,
        deadline=deadline,
    )
    return offload_schedule(profile, request, "pofo", "combined", plan, rate, started)


FAMILY = Family(
    name="combined",
    profile_kind="chain",
    simulator="memplan.simulator.replay:replay_combined",
    options=CombinedOptions,
    algorithms=(
        AlgorithmInfo(
            name="pofo",
            family="combined",
            exact=False,
            needs="profile, --bandwidth, --slots, --time-limit",
            summary="recomputation + whole-tensor offloading DP (Theorem 1 structure), "
            "best of it, rotor and dynprog",
            short="DP: recomputation + offloading (Thm 1)",
            reference="Beaumont, Eyraud-Dubois, Shilova, Optimal GPU-CPU offloading strategies "
            "for DNN training (POFO), appendix B",
            solve=solve_pofo,
        ),
    ),
)
