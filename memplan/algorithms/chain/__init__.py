"""Rematerialization (checkpointing) of chains: store-all, periodic, revolve, rotor."""

from memplan.algorithms.chain.problem import Chain, Sequence
from memplan.algorithms.chain.store_all import solve_store_all

__all__ = ["Chain", "Sequence", "solve_store_all"]
