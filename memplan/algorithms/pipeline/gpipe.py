"""GPipe: fill-drain pipelining of M mini-batches per round (Huang et al. 2019), the baseline.

Each round, every GPU runs the forwards of the ``M`` mini-batches of the round, then their
backwards, and updates its weights (one weight version: no stashing across rounds). The partition
is PipeDream's contiguous dynamic program (:func:`pipedream.partition`); ``M`` (1 to ``2 P' + 2``)
and the number of GPUs used are swept, each candidate timed with the fixed fill-drain orders
(NOTE [ periodic timing with fixed orders ]) and replayed by the simulator; the fastest (least
period per mini-batch) whose simulated per-GPU peak fits is kept. The pattern holds ``M`` copies
of every operation (``batches_per_period = M``; copy ``j`` has shift ``-j``).
"""

from __future__ import annotations

from collections.abc import Iterator

from memplan.algorithms.pipeline.model import PipelineInstance
from memplan.algorithms.pipeline.pipedream import Fitting, Replayed, fastest_fitting, partition
from memplan.algorithms.pipeline.plan import PipelinePlan, evaluate, timed_groups
from memplan.profile.model import Profile


def fill_drain(inst: PipelineInstance, assignment: list[int], rounds: int) -> PipelinePlan | None:
    """Time the fill-drain pattern of ``rounds`` mini-batches on a contiguous assignment."""
    zero = [0] * inst.length
    plan = timed_groups(
        inst, assignment, zero, zero, r=rounds, micro_shifts=[-j for j in range(rounds)], versions=1
    )
    if plan is not None:
        plan.details["micro_batches"] = rounds
    return plan


def solve_gpipe(profile: Profile, inst: PipelineInstance, memory: int) -> Fitting:
    """``(plan or None, simulated GPU peaks, least simulated peak)`` as :func:`solve_pipedream`."""
    return fastest_fitting(_replayed_candidates(profile, inst, memory), memory)


def _replayed_candidates(
    profile: Profile, inst: PipelineInstance, memory: int
) -> Iterator[Replayed]:
    """Every partition and round size, replayed; per partition, the round sizes stop after the
    first that does not fit (more mini-batches per round only need more memory).
    """
    for parts in range(1, min(inst.gpus, inst.length) + 1):
        assignment = partition(inst, parts)
        if assignment is None:
            continue
        for rounds in range(1, 2 * parts + 3):
            plan = fill_drain(inst, assignment, rounds)
            if plan is None:
                continue
            result = evaluate(profile, inst, plan)
            if not result.valid:  # pragma: no cover
                continue
            yield plan, result
            if result.peak_memory > memory:
                break
