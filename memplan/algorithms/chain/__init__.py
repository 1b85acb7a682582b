"""Rematerialization (checkpointing) of chains: store-all, periodic, revolve, rotor."""

from memplan.algorithms.chain.periodic import periodic_sequence, solve_periodic
from memplan.algorithms.chain.problem import Chain
from memplan.algorithms.chain.revolve import extra_forwards, revolve_sequence, solve_revolve
from memplan.algorithms.chain.rotor import chain_min_memory, plan_rotor
from memplan.algorithms.chain.store_all import solve_store_all

__all__ = [
    "Chain",
    "chain_min_memory",
    "extra_forwards",
    "periodic_sequence",
    "revolve_sequence",
    "plan_rotor",
    "solve_periodic",
    "solve_revolve",
    "solve_store_all",
]
