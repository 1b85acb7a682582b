"""GPU-CPU activation offloading (Beaumont, Eyraud-Dubois & Shilova, Euro-Par 2020, papers/004).

The model of §3 (:mod:`.model`), its lower bound (:mod:`.lower_bound`), the no-wait ordered
schedule of a chosen set (:mod:`.nowait`) and the three algorithms that choose the set:
GREEDY (:mod:`.greedy`), DYNPROG (:mod:`.dynprog`) and VDNN (:mod:`.vdnn`).
"""

from memplan.algorithms.offload.dynprog import (
    DEFAULT_SLOTS,
    discretize,
    relaxation_bound,
    run_dp,
    solve_dynprog,
)
from memplan.algorithms.offload.greedy import greedy_set, solve_greedy
from memplan.algorithms.offload.lower_bound import lower_bound, peak_memory
from memplan.algorithms.offload.model import OffloadInstance, offload_mask
from memplan.algorithms.offload.nowait import NoWaitSchedule, no_wait_makespan, no_wait_schedule
from memplan.algorithms.offload.vdnn import solve_vdnn, vdnn_candidates

__all__ = [
    "DEFAULT_SLOTS",
    "NoWaitSchedule",
    "OffloadInstance",
    "discretize",
    "greedy_set",
    "lower_bound",
    "no_wait_makespan",
    "no_wait_schedule",
    "offload_mask",
    "peak_memory",
    "relaxation_bound",
    "run_dp",
    "solve_dynprog",
    "solve_greedy",
    "solve_vdnn",
    "vdnn_candidates",
]
