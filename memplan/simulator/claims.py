"""What a schedule claims, recomputed from the profile and checked against the replay.

NOTE [ schedule claims ]
``memplan simulate`` trusts nothing a schedule says about itself that it can recompute. A
schedule's fields fall in three groups (docs/formats.md, "What simulate checks"):

- **Inputs of the replay**: the plan itself (``ops``; a pipeline's ``assignment``, ``period``,
  ``pattern``, ``transfers``, ``batches_per_period``, ``weight_versions``, ``link_bandwidth``; a
  graph's ``order`` and ``addresses``; a join's ``join_model``), the budget (``budget.memory``,
  unless ``--mem`` replaces it; ``budget.bandwidth`` for offload and combined schedules) and
  ``budget.optimizer``, which says whose static memory the budget holds (``none``, ``sgd``,
  ``momentum``, ``adam``; a schedule without it is replayed as ``sgd``, the CLI's default).
- **Claims recomputed and compared**, where a difference makes the schedule invalid (exit 1):
  ``static_memory`` (from the profile's weights and ``budget.optimizer``: the replay counts the
  recomputed value, never the stated one, so a schedule cannot fit by claiming less),
  ``makespan`` and ``peak_memory``; for pipelines ``period`` (= ``makespan``), ``gpu_memory``
  (each GPU's peak) and ``throughput``; for graphs ``arena``, ``peak_resident`` and
  ``fragmentation`` (checked by the graph simulator). Chain and join operations run back to back
  (a gap on the compute stream is a violation), offloading ones may wait for a transfer.
- **Reports, not inputs, not checked**: ``lower_bound``, ``overhead``, ``min_memory``,
  ``memory_bound``, ``solver`` and ``profile.sha256`` (a different digest is a warning: the
  profile may have been re-measured).

This module belongs to the simulator: it shares no code with :mod:`memplan.algorithms`.
"""

from __future__ import annotations

import math
from typing import Any

from memplan.profile.model import Profile
from memplan.schedule import DEFAULT_OPTIMIZER, OptimizerName
from memplan.simulator import terms

_TOLERANCE = 1e-6


def optimizer_of(schedule: Any) -> OptimizerName:
    """``budget.optimizer``, or sgd when the schedule does not say (docs/model.md)."""
    return schedule.budget.optimizer or DEFAULT_OPTIMIZER


def replay_static_memory(profile: Profile, schedule: Any) -> int | None:
    """The static memory the replay counts, from the profile and ``budget.optimizer``.

    Chain, offload, combined and join schedules: the weights, the optimizer's state, the
    gradients unless ``budget.gradients`` makes them appear in the backward, the workspace and
    the output the caller holds (docs/model.md), computed by the simulator itself
    (:func:`memplan.simulator.terms.static_memory`, NOTE [ simulator memory terms ]). Graph
    schedules: the bytes of the graph's ``weight`` tensors, which the replay counts in the arena.
    Pipelines: None (the pipeline simulator adds each GPU's own weights, weight versions
    included, and reports their total).
    """
    if schedule.family == "pipeline":
        return None
    if schedule.family == "graph":
        return profile.graph.weight_size if profile.graph is not None else 0
    return terms.static_memory(profile, schedule.budget)


def with_replay_static_memory(profile: Profile, schedule: Any) -> Any:
    """The schedule with ``static_memory`` recomputed (the claim is checked by :func:`check`)."""
    static = replay_static_memory(profile, schedule)
    if static is None or static == schedule.static_memory:
        return schedule
    return schedule.model_copy(update={"static_memory": static})


def check(profile: Profile, schedule: Any, result: Any) -> None:
    """Compare what ``schedule`` (as loaded) claims with the replay; fail ``result`` on the first
    difference (see NOTE [ schedule claims ]).
    """
    if not (result.valid and schedule.feasible):
        return
    static = replay_static_memory(profile, schedule)
    if static is None:
        static = result.static_memory
    if schedule.static_memory != static:
        result.fail(
            f"static_memory: schedule says {schedule.static_memory}, the profile's weights with "
            f"optimizer {optimizer_of(schedule)} give {static}"
        )
        return
    if schedule.makespan is not None and not _close(schedule.makespan, result.makespan):
        result.fail(f"makespan: schedule says {schedule.makespan}, replay gives {result.makespan}")
        return
    if schedule.peak_memory is not None and schedule.peak_memory != result.peak_memory:
        result.fail(
            f"peak_memory: schedule says {schedule.peak_memory}, replay gives {result.peak_memory}"
        )
        return
    if schedule.family == "pipeline":
        _check_pipeline(profile, schedule, result)


def _check_pipeline(profile: Profile, schedule: Any, result: Any) -> None:
    period = schedule.period
    if schedule.makespan is not None and period is not None and schedule.makespan != period:
        result.fail(f"makespan: schedule says {schedule.makespan}, its period is {period}")
        return
    if schedule.gpu_memory is not None:
        replayed = list(getattr(result, "gpu_peaks", []))
        claimed = list(schedule.gpu_memory)
        width = max(len(replayed), len(claimed))
        replayed += [0] * (width - len(replayed))
        claimed += [0] * (width - len(claimed))
        for gpu, (said, found) in enumerate(zip(claimed, replayed, strict=True)):
            if said != found:
                result.fail(
                    f"gpu_memory[{gpu}]: schedule says {said}, replay gives {found} on GPU {gpu}"
                )
                return
    if schedule.throughput is not None and period:
        batches = (schedule.batches_per_period or 1) * (profile.batch_size or 1)
        samples = batches / period * 1e3
        if not _close(schedule.throughput, samples):
            result.fail(
                f"throughput: schedule says {schedule.throughput} samples/s, {batches} samples "
                f"every {period} ms are {samples}"
            )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_TOLERANCE, abs_tol=_TOLERANCE)
