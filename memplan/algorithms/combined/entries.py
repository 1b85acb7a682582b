"""The combined family (Efficient Combination of Rematerialization and Offloading, NeurIPS 2021: POFO): its options and algorithm, declared once.

One adapter per algorithm, as in every family (:mod:`memplan.algorithms.chain.entries`):
``solve_pofo`` resolves the bandwidth (the option, else the profile's), runs
:func:`memplan.algorithms.combined.solve.solve_pofo` for the activation budget and wraps its timed
plan with :func:`memplan.algorithms.timeline.offload_schedule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memplan.algorithms.base import AlgorithmInfo, Family, SolveRequest
from memplan.algorithms.options import (
    bandwidth_option,
    resolve_bandwidth,
    slots_option,
    time_limit_option,
)

if TYPE_CHECKING:  # annotations only: declaring the family loads no model
    from memplan.loop import TrainingLoop
    from memplan.profile.model import Profile
    from memplan.schedule import Schedule

MAX_SLOTS = 10_000


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


def solve_pofo(profile: Profile, request: SolveRequest) -> Schedule:
    """``pofo``: the fastest of its DPs, rotor's and dynprog's plans (docs/combined.md)."""
    from memplan.algorithms.chain.problem import ChainInstance
    from memplan.algorithms.combined import solve
    from memplan.algorithms.offload.model import OffloadInstance
    from memplan.algorithms.timeline import Deadline, offload_schedule

    rate = resolve_bandwidth(profile, request.algorithm, request.options.bandwidth)
    loop = request.loop  # NOTE [ pofo loop terms ]
    plan = solve.solve_pofo(
        ChainInstance.from_profile(profile, loop),
        request.activation_memory,
        bandwidth=rate,
        slots=request.options.slots,
        offload_instance=OffloadInstance.from_profile(profile, rate, loop),
        deadline=Deadline.after(request.options.time_limit),
    )
    return offload_schedule(profile, request, plan, rate)


def describe_combined(profile: Profile, static_memory: int, loop: TrainingLoop) -> dict[str, Any]:
    """What ``memplan info`` adds: pofo's least memory, the least of rotor's and dynprog's (its
    candidates: NOTE [ pofo loop terms ]), for the training loop ``loop``; the optimizer's step
    after the backward counts in it.
    """
    from memplan.algorithms.chain.least_memory import chain_min_memory
    from memplan.algorithms.chain.problem import ChainInstance
    from memplan.algorithms.offload.model import OffloadInstance
    from memplan.algorithms.timeline import step_peak

    chain = ChainInstance.from_profile(profile, loop)
    offload = OffloadInstance.from_profile(profile, profile.bandwidth or 1.0, loop)
    least = min(chain_min_memory(chain), offload.min_memory())  # neither depends on the bandwidth
    return {
        "min_memory": {
            "combined": max(static_memory + least, step_peak(profile, loop, static_memory))
        }
    }


FAMILY = Family(
    name="combined",
    profile_kind="chain",
    options=CombinedOptions,
    describe=describe_combined,
    loop_terms=True,
    algorithms=(
        AlgorithmInfo(
            name="pofo",
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
