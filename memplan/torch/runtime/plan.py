"""A schedule read as the runtime follows it: events in time order, counters, what is held.

:class:`RuntimePlan` turns a memplan :class:`~memplan.schedule.Schedule` (chain, offloading or
combined) into the sweeps that :class:`memplan.torch.runtime.iteration.PlannedIteration` runs;
:class:`RuntimeCounters` is what every iteration measures; :func:`planned_activation_peak` is
what the plan says the held activations peak at (the combined simulator's replay).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

import memplan
from memplan.errors import InputError
from memplan.schedule import Schedule
from memplan.simulator.combined import simulate_combined
from memplan.torch.runtime.selective import POLICIES

FORWARD_OPS = ("F_all", "F_ck", "F_n")
COMPUTE_OPS = (*FORWARD_OPS, "B")
RUNNABLE_FAMILIES = ("chain", "offload", "combined")
"""Schedule families :func:`checkpointed` runs."""

StageFunction = Callable[[Tensor], Tensor]
"""How a stage is recomputed: its output from its input."""


@dataclass
class RuntimeCounters:
    """What one planned iteration did (reset at every forward of the wrapped module).

    Attributes
    ----------
    forwards : list of dict
        ``forwards[k]`` counts the forward computations of stage ``k`` by kind
        (``{"F_all": 1, "F_ck": 2}``).
    backwards : list of int
        Backward computations per stage (1 each after a full iteration).
    saved_bytes : list of int
        ``saved_bytes[k]``: bytes of ``s[k]`` at its ``F_all`` (the storages autograd saved,
        each counted once, without the stage input, parameters and buffers, plus the output).
    live_bytes : int
        Bytes of device memory the activations held occupy now, as the plan counts them:
        ``x[0]``, standalone ``x[k]`` and ``s[k]`` (an offloaded tensor's storages are resized to
        0 bytes).
    peak_live_bytes : int
        Largest ``live_bytes`` during the iteration.
    live_curve : list of int
        ``live_bytes`` after each event of the plan (the start or end of an operation, in the
        simulator's order): a computation's output counts from its start, what it frees from
        its end, an offloaded tensor until its offload ends, a prefetched one from its start.
    offloaded_bytes : int
        Bytes copied to host memory by the plan's ``offload`` operations.
    prefetched_bytes : int
        Bytes copied back to device memory by its ``prefetch`` operations.
    """

    forwards: list[dict[str, int]] = field(default_factory=list)
    backwards: list[int] = field(default_factory=list)
    saved_bytes: list[int] = field(default_factory=list)
    live_bytes: int = 0
    peak_live_bytes: int = 0
    live_curve: list[int] = field(default_factory=list)
    offloaded_bytes: int = 0
    prefetched_bytes: int = 0

    @classmethod
    def for_stages(cls, n: int) -> RuntimeCounters:
        return cls(forwards=[{} for _ in range(n)], backwards=[0] * n, saved_bytes=[0] * n)

    def forward_count(self, stage: int) -> int:
        """Forward computations of one stage, every kind together."""
        return sum(self.forwards[stage].values())

    def record(self, live: int) -> None:
        self.live_bytes = live
        self.peak_live_bytes = max(self.peak_live_bytes, live)
        self.live_curve.append(live)


def planned_forward_counts(schedule: Schedule, stages: int) -> list[int]:
    """Forward operations per stage in a schedule (what the runtime should count)."""
    counts = [0] * stages
    for op in schedule.ops:
        if op.op in FORWARD_OPS:
            counts[op.stage] += 1
    return counts


TENSOR_NAME = re.compile(r"^([xs])\[(\d+)\]$")
_TIME_TOLERANCE = 1e-6  # as the simulators: closer instants are one instant


def _timeline(ops: Sequence[Any]) -> list[tuple[bool, Any]]:
    """The plan's operations as ``(is_end, op)`` events in time (docs/combined.md rule T5).

    Computations in the schedule's order; at one instant (within 1e-6) the ends of operations that
    lasted come before the starts (transfer ends before computation ends), and the starts take
    effect in schedule order, a zero-duration operation starting and ending in its place. This is
    the order of the combined simulator, which the runtime follows event by event.
    """
    compute = [op for op in ops if op.op in COMPUTE_OPS]
    channel = sorted((op for op in ops if op.op not in COMPUTE_OPS), key=lambda op: op.start)
    times = sorted({t for op in ops for t in (op.start, op.end)})
    instant: dict[float, float] = {}
    last: float | None = None
    for when in times:
        if last is not None and math.isclose(
            when, last, rel_tol=_TIME_TOLERANCE, abs_tol=_TIME_TOLERANCE
        ):
            instant[when] = last
        else:
            instant[when] = last = when
    listed = {id(op): index for index, op in enumerate(ops)}
    keyed = []
    for position, op in enumerate(compute + channel):
        start, end = instant[op.start], instant[op.end]
        index = listed[id(op)]
        keyed.append(((start, 1, index, 0, 0), False, op))
        if end == start:
            keyed.append(((start, 1, index, 1, 1), True, op))
        else:
            keyed.append(((end, 0, int(op.op in COMPUTE_OPS), position, 1), True, op))
    keyed.sort(key=lambda item: item[0])
    return [(is_end, op) for _, is_end, op in keyed]


def tensor_name(op: Any) -> str:
    return op.tensor if op.tensor is not None else f"s[{op.stage}]"


def stored_name(name: str, k: int) -> str:
    """What a forward of stage ``k`` stores: ``s[k]`` for ``F_all``, else ``x[k+1]``."""
    return f"s[{k}]" if name == "F_all" else f"x[{k + 1}]"


@dataclass(frozen=True)
class _Sweep:
    """The forward of one stage in the plan's forward phase: its kind and its two events."""

    op: str
    start: int
    end: int


class RuntimePlan:
    """A schedule prepared for the runtime: its events, its forward sweep, what it reads.

    Parameters
    ----------
    schedule : Schedule
        A feasible schedule (checked by :func:`check_schedule`).
    stages : int
        Stages of the chain, the loss included.
    input_transfers : bool
        Whether the plan's transfers of ``x[0]`` run (not under :func:`memplan.torch.enable`:
        the input is the caller's tensor, which the caller holds).

    Attributes
    ----------
    plain : list of bool
        ``plain[k]``: the plan computes stage ``k`` once, with ``F_all`` and no selective
        policy, and no transfer moves ``s[k]``: autograd keeps what it saves, as in plain
        training, and the runtime needs no ``saved_tensors_hooks`` for it (NOTE [ What the
        runtime skips ] in :mod:`memplan.torch.runtime.iteration`).
    watched : list of bool
        ``watched[k]``: the runtime must act when the backward reaches stage ``k`` (a
        recomputation or a transfer before ``B k``, a tensor it holds to hand over); otherwise
        the plan's events there are run at the next stage it watches, or after the backward.
    transfers : bool
        Whether the plan has transfers that run (then every stage is watched).
    passive : bool
        Every stage plain, nothing held for a recomputation, no transfer that runs: the plan
        keeps what plain training keeps, and the runtime only counts.

    Raises
    ------
    InputError
        When the plan's forward phase does not compute every stage once, in order, up to the
        loss (every plan memplan's algorithms make does: the runtime needs it, the model's own
        forward being that phase).
    """

    def __init__(self, schedule: Schedule, stages: int, input_transfers: bool = True) -> None:
        self.schedule = schedule
        self.stages = stages
        self.input_transfers = input_transfers
        self.events = _timeline(schedule.ops)
        self.forward_counts = planned_forward_counts(schedule, stages)
        starts: dict[int, int] = {}
        ends: dict[int, int] = {}
        for i, (is_end, op) in enumerate(self.events):
            (ends if is_end else starts)[id(op)] = i
        compute = [op for op in schedule.ops if op.op in COMPUTE_OPS]
        first_b = next((i for i, op in enumerate(compute) if op.op == "B"), len(compute))
        phase = compute[:first_b]
        if [op.stage for op in phase] != list(range(stages)) or phase[-1].op != "F_all":
            raise InputError(
                f"the {schedule.algorithm} schedule's forward phase computes stages "
                f"{[op.stage for op in phase]}: the runtime runs plans whose forward phase "
                f"computes every stage once, in order, the loss last with F_all"
            )
        self.sweep = [_Sweep(op.op, starts[id(op)], ends[id(op)]) for op in phase]
        self.backward_start = {op.stage: starts[id(op)] for op in compute[first_b:] if op.op == "B"}
        self.policies = _policies(schedule)
        self.keeps = self._reads()
        self.reread = self._read_after_f_all()
        self.plain, self.watched = self._lean()
        self.passive = all(self.plain) and not self.keeps and not self.transfers

    def _lean(self) -> tuple[list[bool], list[bool]]:
        """:attr:`plain` and :attr:`watched` (NOTE [ What the runtime skips ])."""
        moved = [
            op for op in self.schedule.ops
            if op.op not in COMPUTE_OPS and (self.input_transfers or op.tensor != "x[0]")
        ]  # fmt: skip
        self.transfers = bool(moved)
        names = {tensor_name(op) for op in moved}
        plain = [
            sweep.op == "F_all"
            and self.forward_counts[k] == 1
            and k not in self.policies
            and f"s[{k}]" not in names
            for k, sweep in enumerate(self.sweep)
        ]
        sweep_events = {i for s in self.sweep for i in (s.start, s.end)}
        last = self.sweep[-1].end  # the forward phase is run by the model's forward
        watched = [True] * self.stages
        for k in sorted(self.backward_start, key=self.backward_start.__getitem__):
            start = self.backward_start[k]  # the events since the previous B's start run here
            recomputes = any(
                self.events[i][1].op in FORWARD_OPS and i not in sweep_events
                for i in range(last + 1, start)
            )
            last = start
            watched[k] = (
                not plain[k] or self.sweep[k].start in self.keeps or self.transfers or recomputes
            )
        return plain, watched

    def _reads(self) -> set[int]:
        """The events producing a stored tensor the runtime must hold the data of: one a later
        recomputation reads, or one a transfer moves. The others are held by autograd or by the
        model's own code as long as they are needed, as in plain training.
        """
        held: dict[str, int] = {"x[0]": -1}
        keeps: set[int] = set()
        sweep_starts = {s.start for s in self.sweep}
        for i, (is_end, op) in enumerate(self.events):
            k = op.stage
            if op.op in FORWARD_OPS and not is_end:
                if i not in sweep_starts:
                    source = f"x[{k}]" if f"x[{k}]" in held else f"s[{k - 1}]"
                    if source in held:
                        keeps.add(held[source])
                held[stored_name(op.op, k)] = i
            elif op.op not in COMPUTE_OPS and not is_end:
                name = tensor_name(op)
                if name in held:
                    keeps.add(held[name])
            elif op.op == "B" and not is_end and k in self.policies:
                # a selective stage recomputes the rest of its forward from x[k] at its backward
                source = f"x[{k}]" if f"x[{k}]" in held else f"s[{k - 1}]"
                if source in held:
                    keeps.add(held[source])
            elif is_end and op.op == "F_n":
                held.pop(f"x[{k}]", None)
            elif is_end and op.op == "B":
                held.pop(f"s[{k}]", None)
                held.pop(f"x[{k}]", None)
        return keeps

    def _read_after_f_all(self) -> set[int]:
        """The stages ``k`` whose input an event after ``F_all k`` reads or moves (a forward of
        stage ``k``, a transfer of ``x[k]`` or ``s[k-1]``): the runtime keeps holding their
        input there (NOTE [ Planned iteration ], autograd's frees).
        """
        done: set[int] = set()
        found: set[int] = set()
        for is_end, op in self.events:
            k = op.stage
            if op.op == "F_all" and is_end:
                done.add(k)
            elif op.op in FORWARD_OPS and not is_end and k in done:
                found.add(k)
            elif op.op not in COMPUTE_OPS:
                match = TENSOR_NAME.match(tensor_name(op))
                if match is not None:
                    reader = int(match.group(2)) + (1 if match.group(1) == "s" else 0)
                    found.update({reader} & done)
        return found


def _policies(schedule: Schedule) -> dict[int, str]:
    """The selective policy of each stage whose ``F_all`` runs under an option (option ``i`` is
    :data:`memplan.torch.runtime.selective.POLICIES` ``[i - 1]``, the profiler's order).
    """
    names = list(POLICIES)
    chosen: dict[int, str] = {}
    for index, op in enumerate(schedule.ops):
        if op.op != "F_all" or not op.option:
            continue
        if op.option > len(names):
            raise InputError(
                f"ops[{index}].option: {op.option}, the runtime knows options 1..{len(names)} "
                f"({', '.join(names)})"
            )
        chosen[op.stage] = names[op.option - 1]
    return chosen


def _activation_replay(profile: Any, schedule: Schedule) -> Any:
    """The combined simulator's replay of ``schedule`` on the activations alone."""
    prof = memplan.load_profile(profile)
    data = prof.model_dump(exclude_none=True)
    for stage in data["stages"]:
        stage.update(forward_overhead=0, backward_overhead=0, grad_size=0)
    bare = memplan.load_profile(data)
    result = simulate_combined(
        bare, schedule.ops, static_memory=0, memory=None, bandwidth=schedule.budget.bandwidth or 1.0
    )
    if not result.valid:
        raise InputError(f"the schedule does not replay on this profile: {result.violation}")
    return result


def planned_activation_curve(profile: Any, schedule: Schedule) -> list[int]:
    """The plan's held activation bytes after each event: what ``RuntimeCounters.live_curve``
    measures on CPU, point for point.

    The combined simulator (docs/combined.md; chain and offloading plans are special cases of its
    model) replays the schedule on a copy of the profile without temporary memory
    (``forward_overhead = backward_overhead = 0``), without gradients (``grad_size = 0``) and
    without static memory. Its memory curve is then the total of ``x[0]``, the standalone
    ``x[k]`` and the ``s[k]`` in device memory, at the start of the iteration and after each
    event (the start or end of an operation), in the order the runtime follows them.
    """
    return [int(nbytes) for _, nbytes in _activation_replay(profile, schedule).memory_curve]


def planned_activation_peak(profile: Any, schedule: Schedule) -> int:
    """The plan's peak of held activations: the largest of :func:`planned_activation_curve`,
    what ``RuntimeCounters.peak_live_bytes`` measures on CPU (docs/runtime.md).
    """
    return int(_activation_replay(profile, schedule).peak_memory)
