"""``replay(profile, schedule, memory)`` of the chain, offloading and combined families.

Every family's simulator has this one signature (the join, graph and pipeline simulators have it
already); these three read the schedule's operations, static memory and bandwidth and call the
replays of :mod:`.chain`, :mod:`.offload` and :mod:`.combined`.
"""

from __future__ import annotations

from memplan.errors import InputError
from memplan.profile.model import Profile
from memplan.schedule import Schedule
from memplan.simulator.chain import SimulationResult, simulate_chain


def replay_chain(profile: Profile, schedule: Schedule, memory: int | None) -> SimulationResult:
    """Replay a chain (rematerialization) schedule."""
    return simulate_chain(
        profile, schedule.ops, static_memory=schedule.static_memory, memory=memory
    )


def _bandwidth(schedule: Schedule, what: str) -> float:
    bandwidth = schedule.budget.bandwidth
    if bandwidth is None or not bandwidth > 0:
        raise InputError(
            f"budget.bandwidth: {what} schedule must state its bandwidth (bytes/s), "
            "e.g. 12000000000"
        )
    return bandwidth


def replay_offload(profile: Profile, schedule: Schedule, memory: int | None) -> SimulationResult:
    """Replay an offloading schedule at its ``budget.bandwidth``."""
    from memplan.simulator.offload import simulate_offload

    return simulate_offload(
        profile,
        schedule.ops,
        static_memory=schedule.static_memory,
        memory=memory,
        bandwidth=_bandwidth(schedule, "an offloading"),
    )


def replay_combined(profile: Profile, schedule: Schedule, memory: int | None) -> SimulationResult:
    """Replay a combined (recomputation and offloading) schedule at its ``budget.bandwidth``."""
    from memplan.simulator.combined import simulate_combined

    return simulate_combined(
        profile,
        schedule.ops,
        static_memory=schedule.static_memory,
        memory=memory,
        bandwidth=_bandwidth(schedule, "a combined"),
    )
