"""The simulator: replays a plan independently of the solvers (see docs/model.md).

:func:`memplan.simulator.replay.replay` replays a schedule with its family's simulator; the
chain, offloading and combined families share one (:mod:`memplan.simulator.combined`).
"""

from memplan.simulator.combined import simulate_chain, simulate_combined, simulate_offload
from memplan.simulator.result import SimulationResult

__all__ = ["SimulationResult", "simulate_chain", "simulate_combined", "simulate_offload"]
