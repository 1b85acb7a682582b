"""A chain of stages trained under a schedule: :class:`CheckpointedChain` and :func:`checkpointed`.

The chain's forward runs its stages one after the other between the brackets of
:class:`memplan.torch.runtime.iteration.PlannedIteration` (NOTE [ Planned iteration ] there);
:func:`check_schedule` checks that a schedule fits the chain before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

import memplan
from memplan.errors import InputError
from memplan.profile.io import load_profile
from memplan.schedule import Schedule, load_schedule
from memplan.torch.base.storage import StaticStorages
from memplan.torch.runtime.iteration import PassiveIteration, PlannedIteration, static_pointers
from memplan.torch.runtime.plan import (
    COMPUTE_OPS,
    RUNNABLE_FAMILIES,
    TENSOR_NAME,
    RuntimeCounters,
    RuntimePlan,
    StageFunction,
    planned_forward_counts,
    tensor_name,
)
from memplan.torch.split.hf import hf_batch
from memplan.torch.split.linearize import Chain, linearize


class CheckpointedChain(nn.Module):
    """A chain of stages (the last one the loss) that trains as a schedule says.

    ``module(x)`` runs the stages and returns the scalar loss of the chain's loss stage;
    ``module(x, target)`` gives ``target`` to the loss stage: the batch's own labels (a language
    model's loss built without labels predicts the tokens of the batch it is called on; the
    other losses of :func:`~memplan.torch.split.linearize.make_loss` otherwise use the targets fixed
    when the chain was made, which is what ``memplan run`` measures with). ``loss.backward()``
    follows the plan. Without gradients (evaluation), the stages run plainly.
    :func:`memplan.torch.enable` is the way to train a model in one's own loop.

    Attributes
    ----------
    schedule : Schedule
        The plan followed.
    names : list of str
        Stage names.
    counters : RuntimeCounters
        What the last iteration did.
    tally : bool
        Count the bytes the plan holds too (``saved_bytes``, ``live_bytes``,
        ``peak_live_bytes``, ``live_curve``; what ``memplan run`` prints): off by default, it
        looks at every tensor autograd saves (NOTE [ What the runtime skips ] in
        :mod:`memplan.torch.runtime.iteration`).
    """

    def __init__(
        self,
        stages: Sequence[tuple[str, nn.Module]],
        schedule: Schedule,
        inplace: Sequence[bool] | None = None,
        tally: bool = False,
    ) -> None:
        super().__init__()
        for _, module in stages:  # a stage made to be measured, not trained (its reason)
            if getattr(module, "chain_refusal", None):
                raise InputError(module.chain_refusal)
        self.names = [name for name, _ in stages]
        self.modules_ = nn.ModuleList([module for _, module in stages])
        self.schedule = schedule
        self.plan = RuntimePlan(schedule, len(self.modules_))
        self.inplace = list(inplace) if inplace is not None else [False] * len(self.names)
        self._side_streams: dict[Any, Any] = {}  # CUDA: the transfer stream of each device
        self.counters = RuntimeCounters()
        self.tally = tally
        self._every: list[nn.Module] | None = None  # the modules, for the static pointers

    def planned_forward_counts(self) -> list[int]:
        """Forward operations per stage in the schedule."""
        return planned_forward_counts(self.schedule, len(self.modules_))

    def _static_pointers(self) -> StaticStorages:
        if self._every is None:
            self._every = list(self.modules())
        return static_pointers(self._every)

    def _iteration(self, x: Tensor) -> PlannedIteration | PassiveIteration:
        self.counters = RuntimeCounters.for_stages(len(self.modules_))
        if self.plan.passive and not self.tally:
            return PassiveIteration(self.plan, self.counters)
        return PlannedIteration(
            self.plan, x, self._static_pointers, self.counters, self._side_streams,
            tally=self.tally, inplace=self.inplace, names=self.names,
        )  # fmt: skip

    def forward(self, x: Tensor, target: Any = None) -> Tensor:
        """Run the stages under the plan; returns the loss (a scalar tensor)."""
        last = len(self.modules_) - 1
        loss = self.modules_[last]
        if target is None and getattr(loss, "labels_from_input", False):
            with torch.no_grad():  # next-token prediction of this batch, not of the example
                loss.follow_input(x)  # (before the plan may move x[0] to the host)
        if not torch.is_grad_enabled():
            for k, module in enumerate(self.modules_):
                x = module(x) if k < last or target is None else module(x, target)
            return x
        it = self._iteration(x)
        try:
            for k, module in enumerate(self.modules_):
                function: StageFunction = module
                if k == last and target is not None:
                    function = _with_target(module, target)
                x = function(it.begin(k, x, function, module))
                it.end(k, x)
        except BaseException:
            it.abort()
            raise
        it.finished(x)
        return x


def _with_target(module: nn.Module, target: Any) -> StageFunction:
    def loss(x: Tensor) -> Tensor:
        return module(x, target)

    return loss


# ------------------------------------------------------------------------------------------------


def _stages_of(model: Chain | nn.Module | Sequence[Any]) -> list[tuple[str, nn.Module]]:
    if isinstance(model, Chain):
        return list(model.stages)
    if isinstance(model, nn.Sequential):
        return [
            (f"stage{name}" if name.isdigit() else name, module)
            for name, module in model.named_children()
        ]
    out: list[tuple[str, nn.Module]] = []
    for i, item in enumerate(model):
        if isinstance(item, nn.Module):
            out.append((f"stage{i}", item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], nn.Module):
            out.append((str(item[0]), item[1]))
        else:
            raise InputError(f"stages[{i}]: expected an nn.Module or a (name, nn.Module) pair")
    return out


def check_schedule(  # noqa: C901 - the checks in its docstring's order, one error each
    schedule: Schedule, names: Sequence[str], profile: Any | None = None
) -> None:
    """Check that a schedule was made for this chain (and this profile, when given).

    Raises
    ------
    InputError
        Infeasible schedule, a family the runtime cannot run, a different number of stages,
        transfers naming no stored tensor, or a profile whose sha256, model name or stage names
        differ from the schedule's, or on which the schedule does not replay (simulator).
    """
    if not schedule.feasible:
        raise InputError(
            f"the {schedule.algorithm} schedule is infeasible (feasible: false): nothing to run"
        )
    if schedule.family not in RUNNABLE_FAMILIES:
        raise InputError(
            f"schedule family {schedule.family!r}: the runtime runs "
            f"{', '.join(RUNNABLE_FAMILIES)} schedules"
        )
    stages = schedule.profile.stages
    if stages is not None and stages != len(names):
        raise InputError(
            f"the schedule was made for {stages} stages ({schedule.profile.model}), "
            f"the model has {len(names)}"
        )
    for index, op in enumerate(schedule.ops):
        if op.stage >= len(names):
            raise InputError(f"ops[{index}]: stage {op.stage} out of range for {len(names)} stages")
        if op.op in COMPUTE_OPS:
            if op.stream != "compute" or op.tensor is not None:
                raise InputError(f"ops[{index}]: {op.op} runs on stream compute, names no tensor")
            continue
        if schedule.family == "chain" or op.stream != "transfer":
            raise InputError(
                f"ops[{index}]: {op.op} in a {schedule.family} schedule, stream {op.stream}"
            )
        name = tensor_name(op)
        match = TENSOR_NAME.match(name)
        limit = len(names) if match and match.group(1) == "x" else len(names) - 1
        if match is None or int(match.group(2)) > limit:
            raise InputError(
                f"ops[{index}].tensor: {name!r}, expected x[0..{len(names)}] or "
                f"s[0..{len(names) - 1}]"
            )
    if profile is None:
        return

    prof = load_profile(profile)
    if prof.sha256() != schedule.profile.sha256:
        raise InputError(
            f"the schedule was made for profile sha256 {schedule.profile.sha256[:12]}... "
            f"({schedule.profile.model}), this profile has {prof.sha256()[:12]}... ({prof.model})"
        )
    if prof.model != schedule.profile.model:
        raise InputError(
            f"the schedule names model {schedule.profile.model!r}, the profile {prof.model!r}"
        )
    if prof.length != len(names):
        raise InputError(f"the profile has {prof.length} stages, the model {len(names)}")
    profiled = [s.name for s in prof.stages]
    if profiled != list(names) and not all(n.startswith("stage") for n in names):
        raise InputError(f"stage names differ: the profile has {profiled}, the model {list(names)}")
    # The plan must replay on its profile (a hand-edited file may not): its family's simulator.

    result = memplan.simulate(prof, schedule, memory=None, check_claims=False)
    if not result.valid:
        raise InputError(f"the schedule does not replay on its profile: {result.violation}")


def checkpointed(
    model: Chain | nn.Module | Sequence[Any],
    schedule: Schedule | dict[str, Any] | str,
    *,
    example_input: Tensor | Mapping[str, Any] | None = None,
    profile: Any | None = None,
    tally: bool = False,
) -> CheckpointedChain:
    """Wrap a chain of stages so that one forward + backward follows ``schedule`` exactly.

    Parameters
    ----------
    model : Chain, nn.Module or sequence
        A :class:`memplan.torch.Chain` (from :func:`~memplan.torch.linearize`), a model to
        linearize (needs ``example_input``), an ``nn.Sequential`` whose children are the stages, or
        a list of modules / ``(name, module)`` pairs. The last stage is the loss: it returns a
        scalar.
    schedule : Schedule, dict or path
        A feasible ``chain`` or ``offload`` schedule for this chain.
    example_input : Tensor or mapping, optional
        Input used to linearize ``model`` when it is a plain module, or a Hugging Face batch
        (:func:`memplan.torch.split.hf.hf_batch`: its labels are the loss stage's targets).
    profile : Profile, dict, path or name, optional
        The profile the schedule was made from: its sha256, model name, stage count and names are
        checked against the schedule and the chain.
    tally : bool
        Count the bytes the plan holds in :attr:`CheckpointedChain.counters` too (what
        ``memplan run`` compares with the plan); costs a Python call per saved tensor.

    Returns
    -------
    CheckpointedChain
        ``wrapped(x)`` returns the loss; ``loss.backward()`` follows the plan.

    Raises
    ------
    InputError
        When the schedule does not match the chain or the profile.
    """
    sched = load_schedule(schedule)
    plain_sequential = isinstance(model, nn.Sequential) and example_input is None
    if isinstance(model, nn.Module) and not plain_sequential:
        if example_input is None:
            raise InputError(
                "checkpointed: give example_input to linearize the model, or pass a "
                "memplan.torch.Chain (linearize(model, x)) or a list of stages ending with the loss"
            )
        labels = None
        if isinstance(example_input, Mapping):
            example_input, labels = hf_batch(example_input)
        model = linearize(model, example_input, labels=labels)
    stages = _stages_of(model)
    check_schedule(sched, [name for name, _ in stages], profile)
    inplace = model.inplace if isinstance(model, Chain) and model.inplace else None
    return CheckpointedChain(stages, sched, inplace=inplace, tally=tally)
