"""GREEDY offloading (Beaumont, Eyraud-Dubois & Shilova, Euro-Par 2020, §4.2, Theorem 2).

In the fractional relaxation (an activation may be partly offloaded), the no-wait, eager, ordered
schedule that offloads exactly ``M_peak - M_GPU`` bytes is optimal (Theorem 2). Rounding the amount
up to whole activations gives GREEDY: offload (entirely) the first ``k + 1`` activations
``a[0] .. a[k]``, ``k`` the smallest index with ``a[0] + .. + a[k] >= M_peak - M_GPU``, and run the
no-wait ordered schedule of that set (:mod:`memplan.algorithms.offload.nowait`).

Cost: ``O(n)`` for the set, ``O(n^2)`` at worst for the schedule.

GREEDY runs whenever any offloading schedule does: the activations after ``a[k]`` fit by the
choice of ``k``, and an operation on ``a[j]``, ``j <= k``, has every activation before it
offloaded, as with full offloading (see :meth:`OffloadInstance.min_memory`).
"""

from __future__ import annotations

import numpy as np

from memplan.algorithms.base import OffloadPlan
from memplan.algorithms.offload.common import infeasible_plan, plan_from_set
from memplan.algorithms.offload.model import OffloadInstance


def greedy_set(inst: OffloadInstance, memory: int) -> np.ndarray:
    """The offloaded activations of GREEDY: the smallest prefix covering ``M_peak - memory``.

    Returns
    -------
    ndarray of bool, shape (n,)
        Empty when nothing must be offloaded; every movable activation ``a[0] .. a[n-1]`` when no
        prefix covers the excess (pinned ones never move: NOTE [ offload loop terms ]).
    """
    n = inst.n
    excess = inst.peak() - memory
    mask = np.zeros(n, dtype=bool)
    if excess <= 0:
        return mask
    movable = inst.movable(np.ones(n, dtype=bool))  # pinned ones stay (NOTE [ offload loop terms ])
    prefix = np.cumsum(np.where(movable, inst.a[:n], 0))
    covering = np.flatnonzero(prefix >= excess)
    k = int(covering[0]) if len(covering) else n - 1
    mask[: k + 1] = movable[: k + 1]
    return mask


def solve_greedy(inst: OffloadInstance, memory: int) -> OffloadPlan:
    """GREEDY (§4.2): offload the first activations entirely, then the no-wait ordered schedule.

    Parameters
    ----------
    inst : OffloadInstance
        The chain and its bandwidth.
    memory : int
        Bytes available to activations (static memory excluded).

    Returns
    -------
    OffloadPlan
        Infeasible (with ``min_memory``) only when even full offloading does not fit.
    """
    if inst.min_memory() > memory:
        return infeasible_plan(inst, memory)
    return plan_from_set(inst, greedy_set(inst, memory), memory)
