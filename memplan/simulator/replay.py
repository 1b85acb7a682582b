"""``replay(profile, schedule, memory)``: a schedule replayed by its family's simulator.

:data:`REPLAYS` is the one table from a schedule's ``family`` to its replay, each
``(profile, schedule, memory) -> SimulationResult``: the chain, offloading and combined families
share the chain-model simulator (:mod:`.combined`, at the schedule's ``budget.bandwidth`` where
there are transfers), the join, graph and pipeline families have their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memplan.errors import InputError
from memplan.profile.model import Profile
from memplan.schedule import Schedule
from memplan.simulator import terms
from memplan.simulator.combined import simulate_ops
from memplan.simulator.graph import simulate_graph
from memplan.simulator.join import simulate_join
from memplan.simulator.operations import CHAIN, COMBINED, OFFLOAD, Rules
from memplan.simulator.pipeline import simulate_pipeline
from memplan.simulator.result import SimulationResult

Replay = Callable[[Profile, Any, "int | None"], SimulationResult]


def _chain_model(rules: Rules) -> Replay:
    """The replay of a chain-model family's schedules: its ops, static memory and bandwidth."""

    def replay(profile: Profile, schedule: Schedule, memory: int | None) -> SimulationResult:
        bandwidth = None
        if "offload" in rules.operations:
            bandwidth = schedule.budget.bandwidth
            if bandwidth is None or not bandwidth > 0:
                raise InputError(
                    f"budget.bandwidth: {'an' if rules.family == 'offload' else 'a'} "
                    f"{rules.model} schedule must state its bandwidth (bytes/s), e.g. 12000000000"
                )
        return simulate_ops(
            profile,
            schedule.ops,
            rules=rules,
            static_memory=terms.static_memory(profile, schedule.budget) or 0,  # never the claim
            memory=memory,
            bandwidth=bandwidth,
            budget=schedule.budget,
        )

    replay.__doc__ = f"Replay a {rules.family} schedule (:func:`.combined.simulate_ops`)."
    return replay


REPLAYS: dict[str, Replay] = {
    "chain": _chain_model(CHAIN),
    "offload": _chain_model(OFFLOAD),
    "combined": _chain_model(COMBINED),
    "join": simulate_join,
    "graph": simulate_graph,
    "pipeline": simulate_pipeline,
}
"""Every family's replay, by the ``family`` its schedules name."""


def replay(profile: Profile, schedule: Schedule, memory: int | None) -> SimulationResult:
    """Replay ``schedule`` with its family's simulator against ``memory`` (None: no budget)."""
    found = REPLAYS.get(schedule.family)
    if found is None:
        raise InputError(f"schedule family {schedule.family!r} cannot be simulated yet")
    return found(profile, schedule, memory)
