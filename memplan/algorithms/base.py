"""What every algorithm hands back to :func:`memplan.solve`, and the registry of algorithms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Sequence = list[tuple[str, int]]


@dataclass
class ChainPlan:
    """A chain algorithm's answer, before timing and simulation.

    ``sequence`` is None when the algorithm found no plan within the budget; ``min_memory`` is then
    the least activation memory (bytes, x[0] included, static memory excluded) that would fit, when
    the algorithm knows it. ``claimed_makespan`` is the algorithm's own value (a DP's optimum), which
    the simulator's replay must reproduce.
    """

    sequence: Sequence | None
    status: str
    claimed_makespan: float | None = None
    min_memory: int | None = None
    slots: int | None = None
    message: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SolveRequest:
    """What :func:`memplan.solve` hands the algorithms of the join, graph and pipeline families.

    Their ``run(profile, request)`` returns a finished :class:`memplan.schedule.Schedule` (feasible
    or not); :func:`memplan.solve` then replays it with the family's simulator and checks the
    makespan it states.
    """

    memory: int
    """The whole budget in bytes, static memory included (per GPU for the pipeline family)."""
    static_memory: int
    optimizer: str
    slots: int | None = None
    """As the user gave it (None: the family's default)."""
    bandwidth: float | None = None
    gpus: int | None = None
    time_limit: float | None = None
    progress: Callable[[str], None] | None = None
    """Where long solvers report live progress (one line at a time); None: silent."""
    link_bandwidth: float | None = None
    """Pipeline family: bytes/s of each GPU-to-GPU link (None: transfers are free)."""


@dataclass(frozen=True)
class AlgorithmInfo:
    """One entry of ``memplan algos``."""

    name: str
    family: str
    exact: bool
    needs: str
    summary: str
    reference: str
    run: Callable[..., ChainPlan] = field(repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "exact": self.exact,
            "needs": self.needs,
            "summary": self.summary,
            "reference": self.reference,
        }


Transfer = tuple[str, int, float, float, str, "str | None"]
"""``(op, stage, start, end, stream, tensor)``: one timed operation of an offloading schedule."""


@dataclass
class OffloadPlan:
    """An offloading algorithm's answer: a timed schedule (papers/004), before simulation.

    ``ops`` is None when no schedule of the algorithm fits; ``min_memory`` is then the least
    activation memory (bytes, static memory excluded) with which it finds one. ``lower_bound`` is
    LB of Proposition 3 at this budget and bandwidth, ``peak`` is M_peak (the memory without any
    offloading), ``offloaded`` the indices ``i`` of the offloaded activations ``a[i]``
    (docs/offload.md), ``claimed_makespan`` the makespan of the timed schedule, which the
    simulator's replay must reproduce.
    """

    ops: list[Transfer] | None
    status: str
    lower_bound: float
    peak: int
    claimed_makespan: float | None = None
    min_memory: int | None = None
    slots: int | None = None
    message: str | None = None
    offloaded: list[int] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
