"""VDNN offloading, as the paper's variant of vDNN++ (Beaumont, Eyraud-Dubois & Shilova, §6.1).

vDNN++ offloads the inputs of convolutions, the layers whose long compute hides the transfers,
either all of them or every other one. Without layer types, the paper ranks the activations by
``u_{F_i} / |x_i|`` (compute time of the forward that reads ``a[i]`` per byte of ``a[i]``) and, for
every threshold, builds the no-wait ordered schedule that offloads every activation whose ratio is
at least the threshold, and the one that offloads every other one of them (the first, third, ...
in chain order). VDNN returns the fastest of all these schedules (and of no offloading at all,
when that fits).

Cost: ``O(n)`` thresholds, two schedules each, ``O(n^2)`` at worst per schedule.
"""

from __future__ import annotations

import numpy as np

from memplan.algorithms.base import OffloadPlan
from memplan.algorithms.offload.common import infeasible_plan, plan_from_set
from memplan.algorithms.offload.model import OffloadInstance
from memplan.algorithms.offload.nowait import no_wait_makespan


def vdnn_candidates(inst: OffloadInstance) -> list[np.ndarray]:
    """Every set VDNN tries: per threshold on ``u_F / |x|``, all above it or every other one."""
    n = inst.n
    sizes = inst.a[:n].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(sizes > 0, inst.uf / np.where(sizes > 0, sizes, 1.0), np.inf)
    sets: list[np.ndarray] = [np.zeros(n, dtype=bool)]
    seen = {sets[0].tobytes()}
    movable = ~inst.pinned  # pinned ones stay (NOTE [ offload loop terms ])
    for threshold in np.unique(ratio[movable])[::-1]:
        chosen = np.flatnonzero((ratio >= threshold) & movable)
        for picked in (chosen, chosen[::2]):
            mask = np.zeros(n, dtype=bool)
            mask[picked] = True
            if mask.tobytes() not in seen:
                seen.add(mask.tobytes())
                sets.append(mask)
    return sets


def solve_vdnn(inst: OffloadInstance, memory: int) -> OffloadPlan:
    """VDNN (§6.1): the fastest no-wait ordered schedule among the threshold sets.

    Parameters
    ----------
    inst : OffloadInstance
        The chain and its bandwidth.
    memory : int
        Bytes available to activations (static memory excluded).

    Returns
    -------
    OffloadPlan
        Infeasible when none of the sets fits (the lowest threshold offloads everything, so only
        when full offloading does not fit either).
    """
    best, best_time = None, np.inf
    candidates = vdnn_candidates(inst)
    for mask in candidates:
        makespan = no_wait_makespan(inst, mask, memory)
        if makespan is not None and makespan < best_time:
            best, best_time = mask, makespan
    if best is None:
        return infeasible_plan(inst, memory)
    return plan_from_set(inst, best, memory, details={"candidates": len(candidates)})
