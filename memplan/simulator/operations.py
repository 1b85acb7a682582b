"""The operations of a chain-model schedule, each checked on its own, and the families' rules.

Part of the chain-model simulator (:mod:`memplan.simulator.combined`): :func:`read_steps` checks
every operation of a chain, offloading or combined schedule on its own (its name, stage, stream and
tensor, under the family's :class:`Rules`) and gives its duration and the times the replay runs it
at; :func:`store_all_problem` and :func:`prefetch_problem` check the whole plan before the replay.
Independent of the solvers (imports nothing from :mod:`memplan.algorithms`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memplan.profile.model import Profile
from memplan.schedule import Op
from memplan.simulator.result import SimulationResult
from memplan.simulator.timing import back_to_back_problem, close, lasts

COMPUTE_OPS = ("F_all", "F_ck", "F_n", "B")
TRANSFER_OPS = ("offload", "prefetch")
_STORED = re.compile(r"^[xs]\[(\d+)\]$")


@dataclass(frozen=True)
class Rules:
    """What one family's schedules may hold; the model and its replay are the same for all."""

    family: str
    model: str
    """The model's name in messages (``... is not an operation of the offloading model``)."""
    operations: tuple[str, ...]
    back_to_back: bool = False
    """Computations run back to back in the schedule's order; the makespan is their sum."""
    store_all: bool = False
    """The compute stream is every ``F_all`` in stage order, then every ``B`` in reverse."""
    any_tensor: bool = True
    """A transfer may move any stored tensor; else only ``s[stage]`` (or ``x[0]`` at stage 0)."""


CHAIN = Rules("chain", "chain", COMPUTE_OPS, back_to_back=True)
OFFLOAD = Rules(
    "offload", "offloading", ("F_all", "B", *TRANSFER_OPS), store_all=True, any_tensor=False
)
COMBINED = Rules("combined", "combined", COMPUTE_OPS + TRANSFER_OPS)


@dataclass(slots=True)
class Step:
    """One operation of the schedule, checked on its own."""

    index: int
    name: str
    stage: int
    tensor: str | None  # the stored tensor a transfer moves; None for a computation
    compute: bool
    duration: float
    start: float  # when the replay runs it: the stated time (a chain's: laid back to back)
    end: float
    timing: str | None = None  # what is wrong with its stated times, reported when replayed
    option: int = 0  # an F_all's option (docs/model.md, "Options of a stage")

    @property
    def label(self) -> str:
        """``F_all stage 3``, ``offload s[2]``: the operation in messages."""
        return f"{self.name} " + (f"stage {self.stage}" if self.tensor is None else self.tensor)

    @property
    def where(self) -> str:
        return f"ops[{self.index}] {self.label}"


def stored_sizes(profile: Profile) -> dict[str, int]:
    """Bytes of every stored tensor: ``x[0]`` .. ``x[L]`` and ``s[0]`` .. ``s[L-1]``."""
    assert profile.input_size is not None  # a chain profile has one (Profile's validation)
    size = {"x[0]": profile.input_size}
    for k, st in enumerate(profile.chain_stages):
        size[f"x[{k + 1}]"] = st.output_size
        size[f"s[{k}]"] = st.saved_size
    return size


def _either(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1]


def _shape_problem(
    rules: Rules, name: str, stage: object, stream: str, tensor: str | None, length: int
) -> str | None:
    """What is wrong with one operation on its own (its name, stage, stream and tensor)."""
    if name not in COMPUTE_OPS + TRANSFER_OPS:
        return f"unknown operation (expected {_either(rules.operations)})"
    if name not in rules.operations:
        return (
            f"{name} is not an operation of the {rules.model} model ({', '.join(rules.operations)})"
        )
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < length:
        return f"no such stage (the profile has {length} stages, 0..{length - 1})"
    expected = "transfer" if name in TRANSFER_OPS else "compute"
    if stream != expected:
        return f"runs on stream {stream!r}, expected {expected!r}"
    if name in COMPUTE_OPS:
        return None if tensor is None else "only transfers name a tensor"
    name = tensor or f"s[{stage}]"
    match = _STORED.match(name)
    if match is None or int(match[1]) > length - (name[0] == "s"):
        return f"no such stored tensor {name!r} (x[0..{length}] or s[0..{length - 1}])"
    if not rules.any_tensor:
        allowed = {f"s[{stage}]"} | ({"x[0]"} if stage == 0 else set())
        if name not in allowed:
            return f"tensor {name!r}, expected {' or '.join(sorted(allowed))}"
    return None


def read_steps(
    profile: Profile,
    ops: Sequence[Op | tuple[str, int]],
    rules: Rules,
    bandwidth: float | None,
    result: SimulationResult,
) -> list[Step] | None:
    """Every operation checked on its own, with its duration and the times the replay runs it
    at; None after the first malformed one (``result`` says which).
    """
    stages = profile.chain_stages
    length = len(stages)
    size = stored_sizes(profile)
    steps: list[Step] = []
    clock = previous_end = 0.0
    chosen = [0] * length  # the option of each stage's latest F_all: its B's time
    for index, item in enumerate(ops):
        name: str
        stage: int
        if isinstance(item, Op):
            name, stage, stream, tensor = item.op, item.stage, item.stream, item.tensor
            option = item.option or 0
        else:
            (name, stage), stream, tensor, option = item, "compute", None, 0
        problem = _shape_problem(rules, name, stage, stream, tensor, length)
        if problem is None and option and option >= stages[stage].option_count:
            problem = (
                f"no such option {option} (the stage has {stages[stage].option_count - 1} "
                "options beyond 0)"
            )
        if problem is not None:
            result.fail(f"ops[{index}] {name} stage {stage}: {problem}", index)
            return None
        if name in TRANSFER_OPS:
            tensor = tensor or f"s[{stage}]"
            assert bandwidth is not None  # the rules transfer: the caller checked it is positive
            duration = size[tensor] / (bandwidth / 1000.0)
        else:
            st = stages[stage]
            if name == "F_all":
                chosen[stage] = option
            if name != "B":
                duration = st.forward_time
            elif chosen[stage]:
                duration = st.option(chosen[stage]).backward_time
            else:
                duration = st.backward_time
        step = Step(index, name, stage, tensor, tensor is None, duration, clock, clock + duration)
        step.option = option
        if isinstance(item, Op):
            start, end = item.start, item.end
            if rules.back_to_back:
                step.timing = back_to_back_problem(
                    index, start, end, previous_end, duration, rules.family, f"{name} stage {stage}"
                )
                previous_end = end
            else:
                step.start, step.end = start, end
                if start < 0 and not close(start, 0.0):
                    step.timing = f"ops[{index}].start: {start} is before time 0"
                elif not lasts(start, end, duration):
                    step.timing = (
                        f"ops[{index}].end: {end} != start {start} + duration {duration} "
                        f"of {step.label}"
                    )
        clock += duration
        steps.append(step)
    return steps


def store_all_position(step: Step, length: int) -> int:
    """Place of a computation in the offloading model's sequence: F_all 0 .. L-1, B L-1 .. 0."""
    return step.stage if step.name == "F_all" else 2 * length - 1 - step.stage


def store_all_problem(compute: list[Step], length: int, result: SimulationResult) -> bool:
    """Whether the compute stream is not every ``F_all`` in order, then every ``B`` (offload)."""
    expected = [("F_all", k) for k in range(length)] + [("B", k) for k in reversed(range(length))]
    for place, step in enumerate(compute):
        if place >= len(expected):
            result.fail(f"{step.where}: runs twice", step.index)
            return True
        want = expected[place]
        if (step.name, step.stage) != want:
            result.fail(
                f"{step.where}: expected {want[0]} stage {want[1]} (the offloading model runs "
                "every forward once, in order, then every backward)",
                step.index,
            )
            return True
    if len(compute) < len(expected):
        missing = expected[len(compute)]
        result.fail(f"incomplete: {missing[0]} stage {missing[1]} never ran")
        return True
    return False


def prefetch_problem(channel: list[Step], result: SimulationResult) -> bool:
    """Whether a prefetch has no offload of its tensor before it (only an offload puts a tensor
    on the host).
    """
    offloaded: dict[str, int] = {}
    pending: dict[str, int] = {}
    for step in channel:
        name = step.tensor or ""
        if step.name == "offload":
            offloaded[name] = offloaded.get(name, 0) + 1
            pending[name] = pending.get(name, 0) + 1
        elif not pending.get(name):
            said = "twice after one offload" if offloaded.get(name) else "but never offloaded"
            result.fail(f"{step.where}: {name} is prefetched {said}", step.index)
            return True
        else:
            pending[name] -= 1
    return False
