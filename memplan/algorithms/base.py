"""The protocol every family follows: :class:`Family`, :class:`AlgorithmInfo`, :class:`SolveRequest`.

Each algorithm is ``solve(profile, request: SolveRequest) -> Schedule``; each family declares its
algorithms and its options once (``memplan/algorithms/<family>/entries.py``), and
:func:`memplan.solve` only loads, checks the family, builds the request, calls, replays and compares
(docs/algorithms.md, "How to add an algorithm"). :class:`ChainPlan` and :class:`OffloadPlan` are
what the chain-model solvers compute before :mod:`memplan.algorithms.timeline` turns them into
schedules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the registry (`memplan algos`) loads no pydantic model
    from memplan.loop import Gradients, OptimizerName, TrainingLoop
    from memplan.schedule import OpName, Status, Stream

Sequence = list[tuple["OpName", int]]
"""``(op, stage)`` in execution order: a chain algorithm's operation sequence."""


@dataclass
class ChainPlan:
    """A chain algorithm's answer, before timing and simulation.

    ``sequence`` is None when the algorithm found no plan within the budget; ``min_memory`` is then
    the least activation memory (bytes, x[0] included, static memory excluded) that would fit, when
    the algorithm knows it. ``claimed_makespan`` is the algorithm's own value (a DP's optimum), which
    the simulator's replay must reproduce.
    """

    sequence: Sequence | None
    status: Status
    claimed_makespan: float | None = None
    min_memory: int | None = None
    slots: int | None = None
    message: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    options: dict[int, int] = field(default_factory=dict)
    """The option of the ``F_all`` of each stage that runs it under one (selective checkpointing,
    docs/model.md "Options of a stage"); a stage not listed runs option 0."""


@dataclass(frozen=True)
class SolveRequest:
    """What :func:`memplan.solve` hands every algorithm: ``solve(profile, request) -> Schedule``.

    The algorithm returns a finished :class:`memplan.schedule.Schedule` (feasible or not);
    :func:`memplan.solve` then replays it with the family's simulator, checks the makespan it
    states and records the replay's peak memory.
    """

    memory: int
    """The whole budget in bytes, static memory included (per GPU for the pipeline family)."""
    algorithm: str
    """The name of the algorithm asked for (``rotor``): the schedule's ``algorithm``."""
    family: str
    """Its family's name (``chain``): the schedule's ``family``."""
    static_memory: int
    """Bytes present during the whole iteration (:func:`memplan.algorithms.timeline.static_memory`)."""
    loop: TrainingLoop
    """The training loop the plan is made for: the optimizer (its state, and its step after the
    backward) and, for the families that plan in the loop's terms (``Family.loop_terms``: chain,
    offloading, combined, join), the gradients' loop and the caller's output (NOTE
    [ training-loop memory terms ], memplan/profile/memory.py); graph and pipeline get a loop
    without ``gradients``."""
    options: Any
    """The family's own options, one typed object (its ``Family.options`` dataclass), parsed and
    defaulted from its declaration (:mod:`memplan.algorithms.options`)."""
    progress: Callable[[str], None] | None = None
    """Where long solvers report live progress (one line at a time); None: silent."""

    @property
    def optimizer(self) -> OptimizerName:
        """The optimizer's name (``budget.optimizer``)."""
        return self.loop.optimizer.name

    @property
    def gradients(self) -> Gradients | None:
        """The gradients' loop (None for graph and pipeline plans)."""
        return self.loop.gradients

    @property
    def activation_memory(self) -> int:
        """The budget left for activations: ``memory - static_memory`` (may be negative)."""
        return self.memory - self.static_memory


@dataclass(frozen=True)
class AlgorithmInfo:
    """One algorithm: what ``memplan algos`` lists, and its ``solve(profile, request)``.

    ``family`` is its :class:`Family`'s name, filled in by the family that lists it (a family's
    name is declared once, in its ``Family(name=...)``).
    """

    name: str
    exact: bool
    needs: str
    summary: str
    reference: str
    solve: Callable[[Any, SolveRequest], Any] = field(repr=False, compare=False)
    """``solve(profile, request: SolveRequest) -> Schedule``."""
    short: str = ""
    """The summary in at most :data:`SHORT_SUMMARY` characters, for ``memplan algos``' one line per
    algorithm within 80 columns (empty: ``summary``, cut to fit)."""
    family: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "exact": self.exact,
            "needs": self.needs,
            "summary": self.summary,
            "short": self.short or self.summary,
            "reference": self.reference,
        }


SHORT_SUMMARY = 41
"""The longest :attr:`AlgorithmInfo.short`: what ``memplan algos`` has left of 80 columns."""


PROFILE_SHAPES = {
    "chain": "a chain profile (stages)",
    "join": "a join profile (branches and turn)",
    "graph": "a graph profile (graph)",
}
"""A profile's ``kind`` in words, for messages (``Profile.kind``)."""


@dataclass(frozen=True)
class Family:
    """A family of algorithms, declared once in its package's ``entries`` module.

    ``algorithms`` each have ``solve(profile, request) -> Schedule`` (the family's schedules are
    replayed by its simulator, :data:`memplan.simulator.replay.REPLAYS`); ``options`` is the frozen
    dataclass of the family's options (:func:`memplan.algorithms.options.option` fields), the
    ``options`` of every :class:`SolveRequest` of the family. ``describe`` adds the family's figures
    to ``memplan info`` (``describe(profile, static_memory) -> dict``; its ``min_memory`` entries are
    merged).
    """

    name: str
    profile_kind: str
    """The profile shape it serves: a key of :data:`PROFILE_SHAPES` (``Profile.families``)."""
    algorithms: tuple[AlgorithmInfo, ...]
    options: type
    describe: Callable[..., dict[str, Any]] | None = field(default=None, compare=False)
    """``describe(profile, static_memory, loop) -> dict`` (``loop``: the :class:`TrainingLoop`
    the family plans for)."""
    loop_terms: bool = False
    """Whether its plans follow the training loop's terms (``--gradients``, NOTE [ training-loop
    memory terms ] in memplan/profile/memory.py); the others plan with the gradients kept."""

    def __post_init__(self) -> None:
        stamped = tuple(dataclasses.replace(info, family=self.name) for info in self.algorithms)
        object.__setattr__(self, "algorithms", stamped)  # frozen: set once, here


Transfer = tuple["OpName", int, float, float, "Stream", "str | None"]
"""``(op, stage, start, end, stream, tensor)``: one timed operation of an offloading schedule."""


@dataclass
class OffloadPlan:
    """An offloading algorithm's answer: a timed schedule (Beaumont, Eyraud-Dubois & Shilova, Euro-Par 2020), before simulation.

    ``ops`` is None when no schedule of the algorithm fits; ``min_memory`` is then the least
    activation memory (bytes, static memory excluded) with which it finds one. ``lower_bound`` is
    LB of Proposition 3 at this budget and bandwidth, ``peak`` is M_peak (the memory without any
    offloading), ``offloaded`` the indices ``i`` of the offloaded activations ``a[i]``
    (docs/offload.md), ``claimed_makespan`` the makespan of the timed schedule, which the
    simulator's replay must reproduce.
    """

    ops: list[Transfer] | None
    status: Status
    lower_bound: float
    peak: int
    claimed_makespan: float | None = None
    min_memory: int | None = None
    slots: int | None = None
    message: str | None = None
    offloaded: list[int] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
