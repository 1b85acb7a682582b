"""The simulator: replays a plan independently of the solvers (see docs/model.md)."""

from memplan.simulator.chain import SimulationResult, simulate_chain
from memplan.simulator.combined import simulate_combined
from memplan.simulator.offload import simulate_offload

__all__ = ["SimulationResult", "simulate_chain", "simulate_combined", "simulate_offload"]
