"""The pipeline family's heuristics as schedules: ``pipedream`` and ``gpipe`` (Pipelined Model Parallelism (Euro-Par 2021) §7).

:func:`run` builds the instance of a request (the GPUs, link bandwidth and optimizer of its
options), runs one heuristic (``solve(profile, instance, memory, optimizer) -> (plan or None,
simulated GPU peaks, least simulated peak)``) and wraps the plan with
:func:`memplan.algorithms.pipeline.plan.to_schedule`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from memplan.algorithms.base import SolveRequest
from memplan.algorithms.pipeline.model import PipelineInstance
from memplan.algorithms.pipeline.plan import to_schedule
from memplan.profile.model import Profile
from memplan.schedule import Schedule
from memplan.units import format_size


def instance(profile: Profile, request: SolveRequest) -> PipelineInstance:
    """The pipeline instance of ``profile`` for the request's GPUs, links and optimizer."""
    options = request.options
    return PipelineInstance.from_profile(
        profile, options.gpus, options.link_bandwidth, request.optimizer
    )


def no_plan_message(inst: PipelineInstance, algo: str, least: int | None, memory: int) -> str:
    """Why no plan fits: the least simulated peak of the candidates, or the weights alone."""
    floor = inst.min_static()
    if memory < floor:
        return (
            f"the heaviest stage alone needs {format_size(floor)} of weights per GPU "
            f"({inst.optimizer}, 2 weight versions)"
        )
    if least is not None:
        return f"the least per-GPU peak of any {algo} candidate is {format_size(least)}"
    return f"no {algo} candidate"


def run(profile: Profile, request: SolveRequest, solve: Callable[..., Any]) -> Schedule:
    """The schedule of one heuristic (``solve``) for ``request``."""
    algo = request.algorithm
    started = time.perf_counter()
    inst = instance(profile, request)
    plan, peaks, least = solve(profile, inst, request.memory, request.optimizer)
    if plan is None:
        sched = to_schedule(
            profile,
            request,
            algo,
            inst,
            None,
            started=started,
            status="infeasible",
            message=no_plan_message(inst, algo, least, request.memory),
        )
        return sched.model_copy(update={"min_memory": least})
    detail = (
        f"NOAM {plan.details['noam']}"
        if algo == "pipedream"
        else f"{plan.r} mini-batches per round"
    )
    used = len(set(plan.assignment))
    return to_schedule(
        profile,
        request,
        algo,
        inst,
        plan,
        started=started,
        status="feasible",
        message=f"{used} of {inst.gpus} GPUs, {detail}",
        gpu_memory=peaks,
    )
