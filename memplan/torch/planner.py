"""Plan a model's training in one call: profile it, solve for the budget, apply the plan.

NOTE [ one planning path ]
--------------------------
:func:`enable` (the plan installed on the model itself), :func:`fit` (a wrapped chain),
``memplan run`` and ``memplan bench`` plan through the same two functions, with one set of
defaults (:class:`PlanSettings`): :func:`profile_for_training` measures the model on the batch as
the training will run it (its device, its data type, the threads it trains on, under the caller's
autocast), and :func:`plan_training` solves for the budget with the training loop's terms
(docs/model.md): the optimizer's state and step, the gradients' loop, the output the caller
holds. The budget counts the same everywhere: everything the step holds on the device.
:func:`infeasible_message` says why a budget has no plan, in the units it was typed in.

The top floor of the torch layer with :mod:`memplan.torch.compare`: it orchestrates the profiler
(:mod:`memplan.torch.profiler`), memplan's solvers and the runtime (:mod:`memplan.torch.runtime`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

import memplan
from memplan.budget import MemoryBudget, check_memory
from memplan.errors import ArgumentError, InputError
from memplan.loop import AUTO, Optimizer, TrainingLoop, check_gradients
from memplan.profile.memory import loop_on, parameter_sizes
from memplan.profile.model import Profile
from memplan.schedule import Schedule
from memplan.torch.base.blame import FIRST_FORWARD, model_errors
from memplan.torch.base.optimizers import optimizer_spec
from memplan.torch.base.storage import distinct_bytes, tensors_of
from memplan.torch.measure.conditions import check_conditions
from memplan.torch.models.registry import build_model
from memplan.torch.profiler.chain import ProgressCallback
from memplan.torch.profiler.model import parameter_sizes as parameter_sizes_of
from memplan.torch.profiler.model import profile_model, with_batch
from memplan.torch.profiler.unreached import unreached_tensors
from memplan.torch.runtime import fsdp
from memplan.torch.runtime.checkpointed import CheckpointedChain, checkpointed
from memplan.torch.runtime.loop_watch import LoopWatch
from memplan.torch.runtime.planned import can_chunk_loss, planned, prepare, stage_modules
from memplan.torch.runtime.planned_model import describe_autocast
from memplan.torch.runtime.slots import autocast_state
from memplan.torch.runtime.step_in_backward import StepInBackward
from memplan.torch.split.chunked_loss import chunk_loss, profile_loss_chunks
from memplan.torch.split.hf import hf_batch
from memplan.torch.split.linearize import linearize
from memplan.torch.split.sub_blocks import cutting_sub_blocks

__all__ = [
    "PlanSettings",
    "enable",
    "fit",
    "infeasible_message",
    "plan_training",
    "profile_for_training",
]


CHUNKED_OUTPUT_BYTES = 8
"""What the output of a model with a chunked loss holds while training, until seen: its loss, a
scalar (float64 at most); the logits are None."""


SUB_BLOCKS_HINT = "; its blocks cut into the residual sub-blocks they run in sequence "
"""How the infeasible message of a model cut at its repeated blocks names the option, when
cutting them lowers the least memory (:func:`_sub_blocks_hint`)."""


@dataclass(frozen=True)
class PlanSettings:
    """The one set of defaults of :func:`enable`, :func:`fit`, ``memplan run`` and ``memplan
    bench`` (NOTE [ one planning path ]).
    """

    algo: str = "rotor"
    slots: int | str | None = None
    """As in :func:`memplan.solve` (None: the family's default)."""
    bandwidth: float | str | None = None
    """Host link of the offloading algorithms (None: the profile's)."""
    repeats: int = 3
    """Timed repetitions per stage when profiling."""
    loss_chunks: int | None = None
    """A language model's head and loss in this many chunks of tokens (None: the model's own)."""


def profile_for_training(
    module: nn.Module,
    x: Tensor,
    settings: PlanSettings,
    *,
    name: str | None = None,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    selective: bool = False,
) -> Profile:
    """The profile of ``module`` on the batch ``x`` as the training will run it.

    On ``x``'s device, in the module's data type, on ``threads`` (default: the caller's, those
    its loop trains on: the CPU kernels' scratch memory depends on them), with the caller's
    autocast recorded in ``measured.extra.autocast`` (what the sizes were measured in);
    ``progress(stage, done, total)`` after each stage; ``selective``: with the stages'
    selective checkpointing options.
    """
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    prof = profile_model(
        module, example_input=x, device=str(x.device), dtype=dtype_name,
        repeats=settings.repeats, name=name, loss_chunks=settings.loss_chunks,
        threads=torch.get_num_threads() if threads is None else threads, progress=progress,
        selective=selective,
    )  # fmt: skip
    autocast = describe_autocast(autocast_state(x.device))
    if autocast != "off" and prof.measured is not None:
        extra = {**(prof.measured.extra or {}), "autocast": autocast}
        prof = prof.model_copy(
            update={"measured": prof.measured.model_copy(update={"extra": extra})}
        )
    return prof


def plan_training(
    prof: Profile, memory: MemoryBudget, loop: TrainingLoop, settings: PlanSettings
) -> Schedule:
    """The plan of ``settings.algo`` for ``memory`` and the training loop ``loop`` on ``prof``:
    :func:`memplan.solve`, feasible or not (:func:`infeasible_message` says why not).
    """
    return memplan.solve(
        prof,
        settings.algo,
        memory,
        optimizer=loop.optimizer,
        gradients=loop.gradients or "kept",
        output_held=loop.output_bytes
        if loop.output_held and loop.output_bytes is not None
        else loop.output_held,
        slots=settings.slots,
        bandwidth=settings.bandwidth,
    )


def loss_chunks_hint(prof: Profile, chunkable: Callable[[], bool] | None = None) -> str:
    """What the infeasible message adds about the chunked loss, or ``""``.

    NOTE [ the chunked loss in the infeasible message ]: a language model's logits (tokens x
    vocabulary) are often the largest tensor of its step, and :func:`enable`'s ``loss_chunks``
    (its head and loss in chunks of tokens) never holds them whole. A profile measured with chunks
    says so; a model that could chunk its loss (``chunkable()``: a Hugging Face causal or masked
    LM, asked only when no plan fits) is told how. No least memory is promised for the chunked
    loss: that takes profiling the chunked head, which a caller does by passing ``loss_chunks``.
    """
    chunks = profile_loss_chunks(prof, None)
    if chunks is not None:
        return f" (the loss already in {chunks} chunks)"
    if chunkable is not None and chunkable():
        return (
            "; its loss in chunks of tokens never holds the whole logits and needs less: "
            "loss_chunks='auto'"
        )
    return ""


def infeasible_message(schedule: Schedule, memory: MemoryBudget, hint: str = "") -> str:
    """Why ``schedule`` (infeasible) has no plan, sizes in the units ``memory`` was typed in."""
    line = f"no {schedule.algorithm} plan fits in {memory.named}"
    loop = schedule.budget.loop
    if schedule.min_memory is not None:
        line += f"; the least memory that fits is {memory.size(schedule.min_memory, up=True)}"
    elif schedule.solver.message:
        line += f"; {' '.join(schedule.solver.message.split())}"
    line += f", counting the optimizer {loop.optimizer.text}"
    line += f", the gradients {loop.gradients}" if loop.gradients else ""
    line += ", the output the caller holds" if loop.output_held else ""
    return line + hint


def _feasible(
    prof: Profile,
    memory: MemoryBudget,
    loop: TrainingLoop,
    settings: PlanSettings,
    why: str | Callable[[], str] = "",
    chunkable: Callable[[], bool] | None = None,
) -> Schedule:
    """:func:`plan_training`; no plan is an :class:`InputError` saying the least memory (and,
    for a model that could chunk its loss, how: :func:`loss_chunks_hint`).
    """
    sched = plan_training(prof, memory, loop, settings)
    if not sched.feasible:
        hint = loss_chunks_hint(prof, chunkable)
        raise InputError(
            infeasible_message(sched, memory, hint) + (why if isinstance(why, str) else why())
        )
    return sched


Solver = Callable[[Profile, TrainingLoop, "str | Callable[[], str]"], Schedule]
"""``solve(profile, loop, why)``: a feasible plan for ``loop`` on ``profile`` (:func:`_feasible`
with the caller's budget and settings; ``why`` ends the infeasible message, or a function
giving it, asked only when no plan fits)."""


def _solver(
    budget: MemoryBudget,
    settings: PlanSettings,
    chunkable: Callable[[], bool] | None = None,
) -> Solver:
    def solve(prof: Profile, loop: TrainingLoop, why: str | Callable[[], str] = "") -> Schedule:
        return _feasible(prof, budget, loop, settings, why, chunkable)

    return solve


def _replanner(
    prof: Profile, solve: Solver, plan: Any = None, unreached: frozenset[int] = frozenset()
) -> Callable[[TrainingLoop, list[list[nn.Parameter]] | None], tuple[Schedule, Profile]]:
    """The re-solve of NOTE [ the loop seen ]: the same profile, budget and settings, for the loop
    seen, the parameters in the order of the optimizer seen but those in no stage (``unreached``,
    ids: no gradient, never stepped, NOTE [ weights outside every stage ]). Under FSDP2
    (``plan.sharding``) the plan is one rank's, agreed by every rank (NOTE [ Plans under FSDP2 ]).
    """
    seen_why = " (the training loop seen)"

    def replan(
        loop: TrainingLoop, groups: list[list[nn.Parameter]] | None
    ) -> tuple[Schedule, Profile]:
        seen = prof
        if groups:
            device = next(p.device for group in groups for p in group)
            stepped = [[p for p in group if id(p) not in unreached] for group in groups]
            sizes = parameter_sizes_of(stepped, device)
            seen = prof.model_copy(update={"parameter_sizes": sizes})
        sharding = getattr(plan, "sharding", None)
        if sharding is not None:
            rank_profile, schedule = sharding.plan_for(
                seen, loop, lambda p: solve(p, loop, seen_why)
            )
            return schedule, rank_profile
        return solve(seen, loop, seen_why), seen

    return replan


def _loop_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The optimizer the step in the backward steps: the loop's own, given."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ArgumentError(
            "optimizer",
            "gradients='step-in-backward' steps the loop's optimizer in the backward: give it "
            "(optimizer=<the torch.optim optimizer the loop steps>)",
            optimizer,
        )
    return optimizer


def _is_auto(optimizer: Any) -> bool:
    return isinstance(optimizer, str) and optimizer.strip().lower() == AUTO


def _why(optimizer: Any) -> str:
    """What the infeasible message adds under ``optimizer="auto"``."""
    if not _is_auto(optimizer):
        return ""
    return (
        "; until the loop's optimizer steps, optimizer='auto' counts AdamW's state and step: name "
        "yours (optimizer='sgd', torch.optim.SGD, or the optimizer itself) to plan for it from "
        "the start"
    )


def _conservative_optimizer(prof: Profile) -> Optimizer:
    """What ``optimizer="auto"`` plans for until the loop's optimizer is seen: AdamW (two
    states) with the step of the larger temporaries on this profile (PyTorch's for-loop step or
    its foreach one): no optimizer of :mod:`torch.optim` memplan knows needs more.
    """
    sizes = parameter_sizes(prof)
    steps = [Optimizer("adamw", step) for step in ("for-loop", "foreach")]  # type: ignore[arg-type]
    return max(steps, key=lambda opt: opt.step_temporaries(sizes))


# --------------------------------------------------------------------------------------------
# fit
# --------------------------------------------------------------------------------------------


def fit(
    model: str | nn.Module,
    example_input: Tensor | Mapping[str, Any] | None = None,
    memory: int | str = "8GB",
    algo: str = "rotor",
    *,
    profile: Any | None = None,
    slots: int | None = None,
    optimizer: Any = "auto",
    bandwidth: float | str | None = None,
    repeats: int = PlanSettings.repeats,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    labels: Tensor | None = None,
    config: str | Mapping[str, Any] | None = None,
    gradients: str = AUTO,
    loss_chunks: int | None = None,
) -> tuple[CheckpointedChain, Schedule]:
    """Profile a model, solve for a budget and wrap it: ``profile -> solve -> checkpointed``.

    Parameters
    ----------
    model : str or nn.Module
        A model name of :data:`memplan.torch.models.registry.MODELS`, ``hf:NAME``, ``timm:NAME``, or a
        module (a Hugging Face ``transformers`` model included).
    example_input : Tensor or mapping, optional
        The chain input (built from ``batch_size``/``input_shape`` for a name when omitted), or a
        Hugging Face batch: ``{"input_ids" or "pixel_values": ..., "labels": ...,
        "attention_mask": all ones}`` (:func:`memplan.torch.split.hf.hf_batch`).
    memory, algo, slots, bandwidth
        As in :func:`memplan.solve` (slots: 500 by default, pofo 50; bandwidth: the
        profile's by default, needed by the offloading algorithms and pofo).
    optimizer : str, optimizer class or instance
        The optimizer the chain trains with, as :func:`enable` takes it (``auto``: seen at its
        first step, NOTE [ the loop seen ]; the chain's ``watch`` watches the loop).
    profile : optional
        A profile of this model to use instead of profiling it.
    repeats : int
        Timed repetitions per stage when profiling.
    batch_size, input_shape
        For a model given by name without ``example_input``.
    labels : Tensor, optional
        Targets of the loss stage as the model's own loss takes them (HF ``labels``); a batch's
        ``labels`` otherwise. The wrapped chain's loss is then the model's training loss.
    config : str or mapping, optional
        Config values of an ``hf:`` model given by name.
    gradients : str
        The training loop, as in :func:`memplan.solve` (``auto``: PyTorch's default loop on a
        profile memplan measures).
    loss_chunks : int, optional
        A language model's head and loss in this many chunks of tokens, one stage
        (:mod:`memplan.torch.split.chunked_loss`; the wrapped chain returns the loss, never the
        logits); a given ``profile`` says its own.

    Returns
    -------
    (CheckpointedChain, Schedule)
        The wrapped chain and the plan it follows: ``wrapped(x).backward()`` trains one
        iteration with the gradients of plain training.

    Raises
    ------
    InputError
        Bad input, or no plan of ``algo`` fits ``memory`` (the message says the least memory).
    """
    budget = check_memory(memory)
    gradients = check_gradients(gradients)
    if gradients == "step-in-backward":
        _loop_optimizer(optimizer)  # checked before the model is profiled
    x: Tensor | None
    if isinstance(example_input, Mapping):
        x, batch_labels = hf_batch(example_input)
        labels = batch_labels if labels is None else labels
    else:
        x = example_input
    if isinstance(model, str):
        module, built, label = build_model(
            model, batch_size=batch_size, input_shape=input_shape, config=config
        )
        x = built if x is None else x
    else:
        if x is None:
            raise InputError("fit: example_input is required with a module")
        if config:
            raise InputError("fit: config applies to a model given by name (hf:NAME)")
        module, label = model, None
    settings = PlanSettings(algo, slots, bandwidth, repeats, loss_chunks)
    if profile is None:
        prof = profile_for_training(module, x, settings, name=label)
    else:
        prof = memplan.load_profile(profile)
        check_conditions(prof, x.device)  # a warning where it was measured otherwise
    chunks = profile_loss_chunks(prof, loss_chunks)
    auto_optimizer = _is_auto(optimizer)
    chosen = _conservative_optimizer(prof) if auto_optimizer else optimizer_spec(optimizer)
    solve = _solver(budget, settings)
    sched = solve(prof, loop_on(prof, chosen, gradients), _why(optimizer))
    kind = label or type(module).__name__
    with model_errors(kind, FIRST_FORWARD):  # NOTE [ whose error ]
        chain = chunk_loss(linearize(module, x, labels=labels), x, chunks, kind)
    wrapped = checkpointed(chain, sched, profile=prof)
    if gradients == "step-in-backward":  # NOTE [ step in the backward ]
        wrapped.stepper = StepInBackward(wrapped, _loop_optimizer(optimizer))
    replan = _replanner(prof, solve)
    wrapped.watch = LoopWatch(wrapped, replan, (auto_optimizer, gradients == AUTO, False))
    return wrapped, sched


# --------------------------------------------------------------------------------------------
# enable
# --------------------------------------------------------------------------------------------


def enable(
    model: nn.Module,
    memory: int | str = "8GB",
    example_input: Any = None,
    *,
    algo: str = "rotor",
    profile: Any | None = None,
    optimizer: Any = "auto",
    bandwidth: float | str | None = None,
    slots: int | None = None,
    repeats: int = PlanSettings.repeats,
    gradients: str = AUTO,
    output_held: bool | None = None,
    loss_chunks: int | str | None = None,
    shards: int | None = None,
    sub_blocks: bool | str = False,
) -> nn.Module:
    """Plan the memory of a model's training and apply the plan: profile, solve, install.

    In place of ``model.gradient_checkpointing_enable()``: the model is returned, called exactly
    as before (``model(**batch).loss``, ``model(x)``), and trains under the plan in the caller's
    loop, in ``transformers.Trainer`` or in Lightning (docs/runtime.md). Without gradients
    (evaluation) it runs plainly.

    Parameters
    ----------
    model : nn.Module
        The model, in the device and data type it trains in (a Hugging Face model, any model
        with a run of repeated blocks, or one :func:`~memplan.torch.linearize` cuts).
    memory : int or str
        The budget (bytes or ``"8GB"``): everything the step holds on the device, the weights,
        the gradients, the optimizer's state and its step's temporaries, the activations, the
        loss's tensors, the output the caller keeps (docs/model.md). A plan installed never
        measures above it.
    example_input : Tensor, mapping or tuple
        The largest batch the model will train on (batches no larger in any dimension train
        under the plan: NOTE [ Smaller batches fit ]): a tensor, an HF batch (``input_ids``,
        ``labels``, ``attention_mask``...) or a tuple whose first element is the input. Call
        :func:`enable` inside ``torch.autocast`` when the training runs under it (the plan is
        profiled as the steps run).
    algo : str
        A chain, offloading or combined algorithm (``memplan algos``).
    profile : Profile, dict, path or name, optional
        A profile of this model on this batch, instead of profiling it.
    optimizer : str, optimizer class or instance
        ``auto`` (the default): the optimizer the loop steps, seen at its first step (NOTE [ the
        loop seen ] in :mod:`memplan.torch.runtime.loop_watch`); until then the plan counts the
        most any optimizer of :mod:`torch.optim` memplan knows needs (AdamW with the step of the
        larger temporaries), and it is re-solved before the next step for the one seen. Or what
        to plan for from the start: a name (``adamw``, ``adam``, ``sgd``, ``momentum``,
        ``none``; with the step, ``adamw:fused``), an optimizer class (PyTorch's default step)
        or the optimizer itself.
    bandwidth : float or str, optional
        Host link for the offloading algorithms (the profile's by default).
    slots : int, optional
        As in :func:`memplan.solve`.
    repeats : int
        Timed repetitions per stage when profiling.
    gradients : str
        The training loop (docs/model.md): ``auto`` (the default) sees it: PyTorch's default
        ``zero_grad()`` (``at-backward``: each stage's weight gradients appear at its backward)
        until a step starts with gradients held (``zero_grad(set_to_none=False)``, gradient
        accumulation: ``kept``, the gradients counted for the whole step); or one of them; or
        ``step-in-backward``: the optimizer (given as ``optimizer=``, the instance the loop
        steps) steps each parameter as its gradient is made, which frees the gradients at once
        (NOTE [ step in the backward ] in :mod:`memplan.torch.runtime.step_in_backward`: not
        with gradient clipping, accumulation, a ``GradScaler``, DDP or FSDP).
    output_held : bool, optional
        Whether the loop keeps the model's output (a language model's logits) until its next
        step: ``out = model(**batch)`` does, ``loss = model(**batch).loss`` and
        ``transformers.Trainer`` do not. None (the default): seen at the first step; until
        then counted as kept.
    loss_chunks : int or "auto", optional
        A Hugging Face causal or masked language model's head and own loss computed in this many
        chunks of tokens, one stage (:mod:`memplan.torch.split.chunked_loss`; ``"auto"``:
        :func:`~memplan.torch.split.chunked_loss.auto_loss_chunks`): ``model(**batch).loss`` is
        the same loss, and no step holds more than one chunk's logits; while training the
        output's ``logits`` are None (evaluation, without gradients, runs plainly).
    shards : int, optional
        Under FSDP2 (``fully_shard`` on each block and on the root, called after ``enable``),
        the ranks the model is sharded over: the budget is then one rank's (docs/sharding.md).
        None: one, or the default process group's size when the whole model fits in no plan;
        the first step plans again for the model's FSDP2 mesh (or the whole model) if it
        differs.
    sub_blocks : bool or "auto"
        Cut each repeated block into the residual sub-blocks its forward runs one after the
        other (a Llama or GPT-2 layer: attention with its residual, MLP with its residual), each
        a stage of the plan: its least memory is then below one whole block's backward (NOTE
        [ Sub-block stages ] in :mod:`memplan.torch.split.sub_blocks`). ``"auto"``: only when
        no plan of whole blocks fits the budget (the model is profiled again, cut), without
        ``profile``. Under FSDP2 each cut block is one ``fully_shard`` unit spanning its
        sub-blocks (docs/sharding.md); a block sharded inside is refused at the first step.

    Returns
    -------
    nn.Module
        ``model`` itself; :func:`planned` gives the plan, :func:`disable` removes it.

    Raises
    ------
    InputError
        A bad argument (naming the parameter), a model memplan cannot cut into a chain (the
        message says why), a profile of another model or batch, or no plan of ``algo`` fitting
        ``memory`` (the least memory that fits is in the message, in the units of ``memory``).
        At the start of a step, a loop seen that the budget cannot hold.
    """
    budget = check_memory(memory)
    gradients = check_gradients(gradients)
    auto_optimizer = _is_auto(optimizer)
    chosen = None if auto_optimizer else optimizer_spec(optimizer)
    in_backward = gradients == "step-in-backward"
    if in_backward:
        _loop_optimizer(optimizer)  # checked before the model is profiled
    ranks = fsdp.shard_count(model, shards)
    cut = _check_sub_blocks(sub_blocks)
    given = (algo, slots, bandwidth, repeats)
    target, profiled, settings = _profiled(
        model, example_input, given, loss_chunks, profile, cut is True
    )
    assert profiled is not None  # measured or given
    prof = profiled
    held = True if output_held is None else bool(output_held)  # counted until seen
    kept = None
    if held:  # a chunked loss's output holds no logits while training: the loss only
        kept = (
            CHUNKED_OUTPUT_BYTES
            if target.chunked is not None
            else _output_bytes(model, example_input, target.x0)
        )

    def loop_of(on: Profile) -> TrainingLoop:
        return loop_on(
            on, chosen or _conservative_optimizer(on), gradients, held, output_bytes=kept
        )

    first = loop_of(prof)
    cut_args = (model, example_input, given, loss_chunks, None, None)
    auto = cut is None and profile is None and _one_process(ranks) and target.how == "hooks"
    if auto and not plan_training(prof, budget, first, settings).feasible:
        found = _profiled(*cut_args)
        if found[1] is not None:  # NOTE [ Sub-block stages ]: below one block's backward
            target, prof, settings = found[0], found[1], found[2]
            first = loop_of(prof)
    chunkable = functools.partial(can_chunk_loss, target)
    solve = _solver(budget, settings, chunkable)

    def why() -> str:  # what the infeasible message adds: asked only when no plan fits
        text = _why(optimizer)
        if cut is False and profile is None and _one_process(ranks) and target.how == "hooks":
            text += _sub_blocks_hint(
                prof, budget, first, settings, lambda: _profiled(*cut_args), loop_of
            )
        return text + (
            step_in_backward_hint(prof, budget, first, settings) if _one_process(ranks) else ""
        )

    labels = isinstance(example_input, Mapping) and example_input.get("labels") is not None
    tried = auto or cut is not None or profile is not None
    target, prof, solve = _install_on_ranks(
        target, prof, (ranks, first, labels, tried), (solve, why), cut_args, budget, loop_of
    )
    plan = _installed(model)
    if in_backward:  # NOTE [ step in the backward ]
        plan._handles.append(StepInBackward(model, _loop_optimizer(optimizer)))

    watched = (auto_optimizer, gradients == AUTO, output_held is not False)
    unreached = frozenset(id(t) for t in unreached_tensors(model, stage_modules(target)))
    LoopWatch(plan, _replanner(prof, solve, plan, unreached), watched)
    return model


def _sub_blocks_hint(
    prof: Profile,
    budget: MemoryBudget,
    loop: TrainingLoop,
    settings: PlanSettings,
    cut: Callable[[], tuple[Any, Profile | None, PlanSettings]],
    loop_of: Callable[[Profile], TrainingLoop],
) -> str:
    """What the infeasible message of whole blocks adds about ``sub_blocks``: ``""`` when a plan
    fits ``budget`` on ``prof`` (nothing to say), when no block can be cut, or when cutting them
    does not lower the least memory; else the option, with the least memory it needs.

    ``cut()`` profiles the model with its blocks cut (:func:`_profiled`; None: none can be), as
    ``sub_blocks="auto"`` would: only on the way to a refusal. The message stays true: it names
    the option where the cut chain was planned and needs less (NOTE [ Sub-block stages ] in
    :mod:`memplan.torch.split.sub_blocks`), not for a block memplan cannot cut (RegNet's, a
    mixture of experts) nor for one whose backward does not bound the least memory.
    """
    whole = plan_training(prof, budget, loop, settings)
    if whole.feasible:
        return ""
    _, halves, cut_settings = cut()
    if halves is None:
        return ""
    sched = plan_training(halves, budget, loop_of(halves), cut_settings)
    if sched.feasible:
        return SUB_BLOCKS_HINT + "(attention, MLP) fit: sub_blocks=True"
    if sched.min_memory is None or whole.min_memory is None:
        return ""
    if sched.min_memory >= whole.min_memory:
        return ""
    least = budget.size(sched.min_memory, up=True)
    return SUB_BLOCKS_HINT + f"(attention, MLP) need less, {least}: sub_blocks=True"


def step_in_backward_hint(
    prof: Profile, budget: MemoryBudget, loop: TrainingLoop, settings: PlanSettings
) -> str:
    """What the infeasible message adds about ``gradients="step-in-backward"``: ``""`` when a
    plan fits ``budget`` in ``loop`` (nothing to say), when the loop is not PyTorch's default
    (``at-backward``: a loop that keeps its gradients accumulates them, which the step in the
    backward cannot serve), or when stepping in the backward does not lower the least memory;
    else the option, with the least memory it needs.

    NOTE [ step in the backward ] in :mod:`memplan.torch.runtime.step_in_backward`: PyTorch's loop
    holds every gradient at the end of the backward, beside the weights and the optimizer's state,
    a floor no plan of the activations goes below (a model whose weights outweigh its
    activations: a small image classifier's). The message names the option only where it was
    planned and needs less, and says what the loop must not do.
    """
    if loop.gradients != "at-backward":
        return ""
    held = plan_training(prof, budget, loop, settings)
    if held.feasible or held.min_memory is None:
        return ""
    stepped = replace(loop, gradients="step-in-backward")
    sched = plan_training(prof, budget, stepped, settings)
    if sched.feasible:
        need = "fits"
    elif sched.min_memory is not None and sched.min_memory < held.min_memory:
        need = f"needs less, {budget.size(sched.min_memory, up=True)}"
    else:
        return ""
    return (
        f"; the optimizer stepped in the backward, each gradient freed as it is made, {need} "
        "(for a loop that neither clips, scales nor accumulates gradients): "
        "gradients='step-in-backward', optimizer=<the optimizer the loop steps>"
    )


def _install_on_ranks(
    target: Any,
    prof: Profile,
    given: tuple[int | None, TrainingLoop, bool, bool],
    solver: tuple[Solver, str | Callable[[], str]],
    cut_args: tuple[Any, ...],
    budget: Any,
    loop_of: Callable[[Profile], TrainingLoop],
) -> tuple[Any, Profile, Solver]:
    """Install the plan of one rank (:func:`memplan.torch.runtime.fsdp.install_sharded`) and
    return the target, profile and solver it was made with.

    ``given``: the shard count, the first loop, whether the model computes its loss, whether
    the blocks were cut or kept already (``tried``); ``solver``: the solver and its reason.
    Where no plan fits on several ranks, FSDP2's backward prefetch is given up last
    (docs/sharding.md): with ``sub_blocks="auto"`` the blocks are cut first (with the
    prefetch), then, where none can be cut, whole blocks are planned without it.
    """
    ranks, first, labels, tried = given
    solve, why = solver
    chosen = [solve]  # the cut's solver, once cut: the plan's re-solves use it

    def plan_for(plan_profile: Profile, loop: TrainingLoop) -> Schedule:
        return chosen[0](plan_profile, loop, why)

    try:
        fsdp.install_sharded(target, prof, ranks, first, plan_for, labels, tried)
    except InputError as error:  # "auto" on several ranks: cut where no rank's plan fits
        try:
            target, prof, chosen[0] = _cut_for_ranks(error, tried, *cut_args[:4], budget)
        except InputError:
            if tried:
                raise
            fsdp.install_sharded(target, prof, ranks, first, plan_for, labels)  # whole blocks
        else:
            fsdp.install_sharded(target, prof, ranks, loop_of(prof), plan_for, labels)
    return target, prof, chosen[0]


def _cut_for_ranks(
    error: InputError,
    tried: bool,
    model: nn.Module,
    example_input: Any,
    given: tuple[str, int | None, float | str | None, int],
    loss_chunks: int | str | None,
    budget: Any,
) -> tuple[Any, Profile, Callable[..., Schedule]]:
    """``sub_blocks="auto"`` where no plan of one rank of several fits with whole blocks: the
    model cut into sub-blocks, its profile and its solver; ``error`` raised again where the
    blocks were cut or kept already (``tried``) or none can be cut.
    """
    if tried:
        raise error
    target, prof, settings = _profiled(model, example_input, given, loss_chunks, None, None)
    if prof is None:
        raise error
    return target, prof, _solver(budget, settings, functools.partial(can_chunk_loss, target))


def _check_sub_blocks(sub_blocks: bool | str) -> bool | None:
    """``enable``'s ``sub_blocks``: True, False, or None for ``"auto"``."""
    if isinstance(sub_blocks, bool):
        return sub_blocks
    if isinstance(sub_blocks, str) and sub_blocks.strip().lower() == AUTO:
        return None
    raise ArgumentError("sub_blocks", "expected True, False or 'auto'", sub_blocks)


def _one_process(ranks: int | None) -> bool:
    """Whether the model trains on one process: no shard count above one, no process group of
    several ranks (``sub_blocks="auto"`` then checks the plan of one rank, which it installs).
    """
    import torch.distributed as dist

    group = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return (ranks or 1) == 1 and not group


def _profiled(
    model: nn.Module,
    example_input: Any,
    given: tuple[str, int | None, float | str | None, int],
    loss_chunks: int | str | None,
    profile: Any,
    sub_blocks: bool | None,
) -> tuple[Any, Profile | None, PlanSettings]:
    """The prepared model, its profile (``profile``'s when given) and the settings; its blocks
    cut into sub-blocks when ``sub_blocks`` is True (refused where none can be) or None (where
    some can be: when none can, no profile is measured: None).
    """
    with cutting_sub_blocks(sub_blocks is not False):
        target = prepare(model, example_input, required=True, loss_chunks=loss_chunks)
        settings = PlanSettings(*given, target.loss_chunks)
        cut = target.how == "hooks" and bool(target.layout.parts)
        if sub_blocks and not cut:
            raise InputError(
                f"sub_blocks: no block of {type(model).__name__} could be cut into sub-blocks "
                "(a sequence of residual sub-calls, one tensor handed from one to the next, each "
                "with parameters, reading no tensor values into its control flow as a mixture of "
                "experts does); enable it without sub_blocks"
            )
        if profile is not None:
            prof = memplan.load_profile(profile)
            profile_loss_chunks(prof, target.loss_chunks)  # the profile's chain is the target's
        elif sub_blocks is None and not cut:
            prof = None
        else:
            measured = profile_for_training(model, target.x0, settings)
            prof = with_batch(measured, example_input, target.x0)
    return target, prof, settings


def _output_bytes(model: nn.Module, example_input: Any, x0: Tensor) -> int:
    """What the model's output holds on the example batch: every tensor of it (a dict, a Hugging
    Face output, a tuple), each storage once, as a loop that keeps the output keeps it.

    One forward without autograd, in eval mode (no buffer updated, no dropout), the random
    generators' states kept: what the caller holds is known before the first step.
    """
    flags = [(m, m.training) for m in model.modules()]
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False):
        config.use_cache = False  # as the plan trains it (planned.install does the same)
    devices = [x0.device] if x0.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            model.eval()
            # a batch mapping; else a tensor, or a tuple whose first element is the input
            out = model(**example_input) if isinstance(example_input, Mapping) else model(x0)
    finally:
        for module, training in flags:
            module.training = training
    return distinct_bytes(tensors_of(out))


def _installed(model: nn.Module) -> Any:
    found = planned(model)
    assert found is not None  # install() just put it there
    return found
