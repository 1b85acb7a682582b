"""Rematerialization (checkpointing) of chains: store-all, periodic, revolve, rotor.

The names below are imported when first used (PEP 562, as NOTE [ lazy package ] in
memplan/__init__.py): the family's declaration (:mod:`.entries`) is read without its solvers, so
that ``memplan algos`` loads neither numpy nor the compiled core.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "periodic_sequence": "periodic",
    "solve_periodic": "periodic",
    "ChainInstance": "problem",
    "extra_forwards": "revolve",
    "revolve_sequence": "revolve",
    "solve_revolve": "revolve",
    "chain_min_memory": "rotor",
    "plan_rotor": "rotor",
    "solve_store_all": "store_all",
}
"""Public name -> the module of this package that defines it."""

__all__ = [
    "ChainInstance",
    "chain_min_memory",
    "extra_forwards",
    "periodic_sequence",
    "revolve_sequence",
    "plan_rotor",
    "solve_periodic",
    "solve_revolve",
    "solve_store_all",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from memplan.algorithms.chain.periodic import periodic_sequence, solve_periodic
    from memplan.algorithms.chain.problem import ChainInstance
    from memplan.algorithms.chain.revolve import extra_forwards, revolve_sequence, solve_revolve
    from memplan.algorithms.chain.rotor import chain_min_memory, plan_rotor
    from memplan.algorithms.chain.store_all import solve_store_all


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next access is a plain lookup
    return value
