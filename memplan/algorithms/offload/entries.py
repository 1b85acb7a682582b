"""The offloading family (Optimal GPU-CPU Offloading Strategies, Euro-Par 2020): its options and algorithms, declared once.

One adapter per algorithm, as in every family (:mod:`memplan.algorithms.chain.entries`): it
resolves the bandwidth (the option, else the profile's), runs its solver on the offloading
instance for the activation budget (an ``OffloadPlan``: timed operations on the compute and
transfer streams) and wraps the plan with :func:`memplan.algorithms.timeline.offload_schedule`.
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


def _instance(profile: Profile, request: SolveRequest) -> tuple[Any, float]:
    """The offloading instance of ``profile`` under the request's training loop (NOTE
    [ offload loop terms ]) and its bandwidth (bytes/s): the option, else the profile's.
    """
    from memplan.algorithms.offload.model import OffloadInstance

    rate = resolve_bandwidth(profile, request.algorithm, request.options.bandwidth)
    instance = OffloadInstance.from_profile(profile, rate, request.loop)
    return instance, rate


def solve_greedy(profile: Profile, request: SolveRequest) -> Schedule:
    """``greedy``: offload the first activations (:mod:`.greedy`)."""
    from memplan.algorithms.offload import greedy
    from memplan.algorithms.timeline import offload_schedule

    instance, rate = _instance(profile, request)
    plan = greedy.solve_greedy(instance, request.activation_memory)
    return offload_schedule(profile, request, plan, rate)


def solve_dynprog(profile: Profile, request: SolveRequest) -> Schedule:
    """``dynprog``: the DP over the offloaded set on ``request.options.slots`` (:mod:`.dynprog`)."""
    from memplan.algorithms.offload import dynprog
    from memplan.algorithms.timeline import Deadline, offload_schedule

    instance, rate = _instance(profile, request)
    plan = dynprog.solve_dynprog(
        instance,
        request.activation_memory,
        slots=request.options.slots,
        deadline=Deadline.after(request.options.time_limit),
    )
    return offload_schedule(profile, request, plan, rate)


def solve_dynprog_best(profile: Profile, request: SolveRequest) -> Schedule:
    """``dynprog-best``: dynprog trying its best DP sets in the real schedule (:mod:`.dynprog`)."""
    from memplan.algorithms.offload import dynprog
    from memplan.algorithms.timeline import Deadline, offload_schedule

    instance, rate = _instance(profile, request)
    plan = dynprog.solve_dynprog(
        instance,
        request.activation_memory,
        slots=request.options.slots,
        candidates=REFINED_CANDIDATES,
        deadline=Deadline.after(request.options.time_limit),
    )
    return offload_schedule(profile, request, plan, rate)


def solve_vdnn(profile: Profile, request: SolveRequest) -> Schedule:
    """``vdnn``: vDNN++-style thresholds on compute time per byte (:mod:`.vdnn`)."""
    from memplan.algorithms.offload import vdnn
    from memplan.algorithms.timeline import offload_schedule

    instance, rate = _instance(profile, request)
    plan = vdnn.solve_vdnn(instance, request.activation_memory)
    return offload_schedule(profile, request, plan, rate)


def describe_offload(profile: Profile, static_memory: int, loop: TrainingLoop) -> dict[str, Any]:
    """What ``memplan info`` adds: the least memory with every activation offloaded, M_peak,
    for the training loop ``loop`` (NOTE [ offload loop terms ]); the optimizer's step after the
    backward counts in both figures.
    """
    from memplan.algorithms.offload.model import OffloadInstance
    from memplan.algorithms.timeline import step_peak

    offload = OffloadInstance.from_profile(profile, profile.bandwidth or 1.0, loop)
    step = step_peak(profile, loop, static_memory)
    return {
        "min_memory": {"offload": max(static_memory + offload.min_memory(), step)},
        "offload_peak": max(static_memory + offload.peak(), step),
    }


FAMILY = Family(
    name="offload",
    profile_kind="chain",
    options=OffloadOptions,
    describe=describe_offload,
    loop_terms=True,
    algorithms=(
        AlgorithmInfo(
            name="greedy",
            exact=False,
            needs="profile, --bandwidth",
            summary="offload the first activations (optimal if they could be split, Theorem 2)",
            short="offload the first activations",
            reference=OFFLOAD_REFERENCE + ", §4",
            solve=solve_greedy,
        ),
        AlgorithmInfo(
            name="dynprog",
            exact=False,
            needs="profile, --bandwidth, --slots, --time-limit",
            summary="DP optimal with interruptible transfers (Algorithm 1, slots), then no-wait",
            short="DP over the offloaded set (Algorithm 1)",
            reference=OFFLOAD_REFERENCE + ", §5",
            solve=solve_dynprog,
        ),
        AlgorithmInfo(
            name="dynprog-best",
            exact=False,
            needs="profile, --bandwidth, --slots, --time-limit",
            summary=f"dynprog trying its {REFINED_CANDIDATES} best DP sets in the real schedule",
            short="dynprog, its 8 best sets replayed",
            reference="memplan's refinement of " + OFFLOAD_REFERENCE,
            solve=solve_dynprog_best,
        ),
        AlgorithmInfo(
            name="vdnn",
            exact=False,
            needs="profile, --bandwidth",
            summary="vDNN++-style thresholds on compute time per byte, all or every other one",
            short="vDNN++ thresholds on time per byte",
            reference=OFFLOAD_REFERENCE + ", §6.1 (after vDNN++, Shriram et al. 2019)",
            solve=solve_vdnn,
        ),
    ),
)
