"""The pipeline family's entries in the algorithm registry (cheap to import: solvers load lazily).

Each entry's ``run(profile, request: SolveRequest) -> Schedule`` returns a finished schedule,
which :func:`memplan.solve` replays with the family's simulator.
"""

from __future__ import annotations

from typing import Any

from memplan.algorithms.base import AlgorithmInfo

REFERENCE = (
    "Beaumont, Eyraud-Dubois & Shilova 2021, Pipelined model parallelism: complexity results "
    "and memory considerations"
)


def _instance(profile: Any, request: Any):
    from memplan.algorithms.pipeline.model import PipelineInstance

    return PipelineInstance.from_profile(
        profile, request.gpus, request.link_bandwidth, request.optimizer
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
        reference=REFERENCE + ", §6",
        run=_ilp,
    ),
    AlgorithmInfo(
        name="pipedream",
        family="pipeline",
        exact=False,
        needs="profile, --gpus, --mem per GPU, --link-bandwidth",
        summary="contiguous DP partition + 1F1B, NOAM swept, judged by the simulated peak (§7)",
        reference="Narayanan et al. 2019, PipeDream; evaluated as in " + REFERENCE + ", §7",
        run=_heuristic("pipedream"),
    ),
    AlgorithmInfo(
        name="gpipe",
        family="pipeline",
        exact=False,
        needs="profile, --gpus, --mem per GPU, --link-bandwidth",
        summary="fill-drain rounds of M mini-batches on the DP partition (baseline)",
        reference="Huang et al. 2019, GPipe",
        run=_heuristic("gpipe"),
    ),
]
