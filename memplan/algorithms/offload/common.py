"""What the offloading algorithms share: a plan from a chosen set of activations."""

from __future__ import annotations

from typing import Any

import numpy as np

from memplan.algorithms.base import OffloadPlan
from memplan.algorithms.offload.lower_bound import lower_bound
from memplan.algorithms.offload.model import OffloadInstance
from memplan.algorithms.offload.nowait import no_wait_schedule

_OPTIMAL_TOLERANCE = 1e-9


def infeasible_plan(inst: OffloadInstance, memory: int, slots: int | None = None) -> OffloadPlan:
    """No schedule fits: say the least memory of full offloading (exact for this model)."""
    least = inst.min_memory()
    return OffloadPlan(
        ops=None,
        status="infeasible",
        lower_bound=lower_bound(inst, memory),
        peak=inst.peak(),
        min_memory=least,
        slots=slots,
        message=None,
    )


def plan_from_set(
    inst: OffloadInstance,
    offloaded: np.ndarray,
    memory: int,
    *,
    slots: int | None = None,
    message: str | None = None,
    details: dict[str, Any] | None = None,
) -> OffloadPlan:
    """The no-wait ordered schedule of ``offloaded`` (Proposition 1) as a plan.

    The status is ``optimal`` when the makespan reaches the lower bound, ``feasible`` otherwise,
    ``infeasible`` when the set does not fit (then ``min_memory`` is set).
    """
    # Moving zero bytes changes nothing: such activations stay (and the schedule has no empty
    # transfers); pinned ones cannot move (NOTE [ offload loop terms ]).
    offloaded = inst.movable(offloaded)
    schedule = no_wait_schedule(inst, offloaded, memory)
    if schedule is None:
        return infeasible_plan(inst, memory, slots)
    bound = lower_bound(inst, memory)
    makespan = schedule.makespan
    optimal = makespan <= bound * (1 + _OPTIMAL_TOLERANCE) + _OPTIMAL_TOLERANCE
    return OffloadPlan(
        ops=schedule.operations(),
        status="optimal" if optimal else "feasible",
        lower_bound=bound,
        peak=inst.peak(),
        claimed_makespan=makespan,
        min_memory=inst.min_memory(),
        slots=slots,
        message=message,
        offloaded=[int(i) for i in np.flatnonzero(offloaded)],
        details=dict(details or {}, idle_time=makespan - inst.compute_time, gap=schedule.gap),
    )
