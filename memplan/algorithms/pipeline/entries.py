"""The pipeline family (papers/001): its options and algorithms, declared once.

Cheap to import: the solvers load when first called. Each algorithm's
``solve(profile, request: SolveRequest) -> Schedule`` returns a finished schedule, which
:func:`memplan.solve` replays with the family's simulator. Budgets are per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memplan.algorithms.base import AlgorithmInfo, Family
from memplan.algorithms.options import option, positive_integer, rate, time_limit_option

REFERENCE = (
    "Beaumont, Eyraud-Dubois & Shilova 2021, Pipelined model parallelism: complexity results "
    "and memory considerations"
)


DEFAULT_TIME_LIMIT = 60.0
"""Seconds of ``pipeline-ilp``'s CP-SAT solves when ``--time-limit`` is not set."""


@dataclass(frozen=True)
class PipelineOptions:
    """Options of the pipeline family."""

    gpus: int | None = option(
        flag="--gpus",
        metavar="N",
        cli_type=int,
        help="Number of GPUs of the pipeline (--mem is then per GPU).",
        accepts="an integer >= 1",
        default=None,
        default_text="required",
        parse=positive_integer("--gpus"),
        commands=("solve", "compare"),
    )
    link_bandwidth: float | None = option(
        flag="--link-bandwidth",
        metavar="RATE",
        help="Bandwidth of each GPU-to-GPU link: 25GB/s.",
        accepts="a rate: 25GB/s, bytes/s",
        default=None,
        default_text="transfers are free",
        parse=rate("--link-bandwidth"),
        commands=("solve", "compare"),
    )
    time_limit: float = time_limit_option(DEFAULT_TIME_LIMIT)


def _instance(profile: Any, request: Any):
    from memplan.algorithms.pipeline.model import PipelineInstance

    options = request.options
    return PipelineInstance.from_profile(
        profile, options.gpus, options.link_bandwidth, request.optimizer
    )


def _no_plan_message(inst: Any, algo: str, least: int | None, memory: int) -> str:
    """Why no plan fits: the least simulated peak of the candidates, or the weights alone."""
    from memplan.units import format_size

    floor = inst.min_static()
    if memory < floor:
        return (
            f"the heaviest stage alone needs {format_size(floor)} of weights per GPU "
            f"({inst.optimizer}, 2 weight versions)"
        )
    if least is not None:
        return f"the least per-GPU peak of any {algo} candidate is {format_size(least)}"
    return f"no {algo} candidate"


def _heuristic(algo: str):
    def run(profile: Any, request: Any):
        import time

        from memplan.algorithms.pipeline.gpipe import solve_gpipe
        from memplan.algorithms.pipeline.pipedream import solve_pipedream
        from memplan.algorithms.pipeline.plan import to_schedule

        started = time.perf_counter()
        inst = _instance(profile, request)
        solver = solve_pipedream if algo == "pipedream" else solve_gpipe
        plan, peaks, least = solver(profile, inst, request.memory, request.optimizer)
        if plan is None:
            sched = to_schedule(
                profile,
                request,
                algo,
                inst,
                None,
                started=started,
                status="infeasible",
                message=_no_plan_message(inst, algo, least, request.memory),
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

    return run


def _ilp(profile: Any, request: Any):
    from memplan.algorithms.pipeline.ilp import run_ilp

    return run_ilp(profile, request, _instance(profile, request))


ALGORITHMS: list[AlgorithmInfo] = [
    AlgorithmInfo(
        name="pipeline-ilp",
        family="pipeline",
        exact=False,
        needs="profile, --gpus, --mem per GPU, --link-bandwidth, --time-limit",
        summary="period-minimizing ILP of §6 (any allocation, 1F1B pattern) with CP-SAT, "
        "warm-started from pipedream",
        short="period-minimizing ILP (CP-SAT, §6)",
        reference=REFERENCE + ", §6",
        solve=_ilp,
    ),
    AlgorithmInfo(
        name="pipedream",
        family="pipeline",
        exact=False,
        needs="profile, --gpus, --mem per GPU, --link-bandwidth",
        summary="contiguous DP partition + 1F1B, NOAM swept, judged by the simulated peak (§7)",
        short="contiguous DP partition + 1F1B (§7)",
        reference="Narayanan et al. 2019, PipeDream; evaluated as in " + REFERENCE + ", §7",
        solve=_heuristic("pipedream"),
    ),
    AlgorithmInfo(
        name="gpipe",
        family="pipeline",
        exact=False,
        needs="profile, --gpus, --mem per GPU, --link-bandwidth",
        summary="fill-drain rounds of M mini-batches on the DP partition (baseline)",
        short="fill-drain rounds on the DP partition",
        reference="Huang et al. 2019, GPipe",
        solve=_heuristic("gpipe"),
    ),
]

FAMILY = Family(
    name="pipeline",
    profile_kind="chain",
    options=PipelineOptions,
    algorithms=tuple(ALGORITHMS),
)
