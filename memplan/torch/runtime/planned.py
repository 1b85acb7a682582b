"""``memplan.torch.enable``: train a model under a plan, called exactly as before.

``model = memplan.torch.enable(model, memory="8GB", example_input=batch)`` profiles the model on
the example batch (or takes ``profile=``), solves for the budget, and installs the plan on the
model itself, which is returned: ``model(**batch).loss``, ``model(x)`` and any loop around them
(gradient accumulation, ``torch.autocast`` with a ``GradScaler``, DDP, ``transformers.Trainer``,
Lightning) train under the plan, with every batch's own inputs, labels and loss.

NOTE [ Following the model's own forward ]
------------------------------------------
The runtime (:class:`memplan.torch.runtime.iteration.PlannedIteration`) needs the boundaries of the chain's
stages in the model's forward. Two ways, chosen by how the model was cut
(:func:`memplan.torch.split.linearize.linearize`):

* **Hooks** (Hugging Face models and every model cut at a run of repeated blocks,
  :mod:`memplan.torch.split.repeated`): the model's own ``forward`` runs, with every argument the
  caller gives (attention masks with padding, position ids, labels, ``num_items_in_batch``...);
  module hooks mark the stages: the part before the first block (``embedding``/``stem``: from
  the model's call to the first block's), each block (its call), the head (from the last
  block's return to the return of the module giving the model's output, ``lm_head``). What a
  block reads besides its hidden state (masks, rotary embeddings) is the model's own for that
  batch; a recomputation calls the block again with those same arguments, the part before the
  first block by the model's own ``forward`` with the step's arguments (stopped at the first
  block), the head by the module calls recorded during the step. The loss is the model's (HF
  ``labels``) or the caller's. A block cut into sub-blocks (``enable(..., sub_blocks=True)``)
  is several stages: its operations are counted, and a cut's count ends one and begins the
  next (NOTE [ Sub-block stages ] in :mod:`memplan.torch.split.sub_blocks`).
* **Stages** (the models :func:`linearize` cuts by their structure: ResNets, DenseNets,
  Inception, VGG/MobileNetV2, ``nn.Sequential``, ``memplan_stages()``): ``model.forward`` is
  replaced by the chain of stages (checked, when cut, to give the model's output), which takes
  the model's one input and returns its output; the loss is the caller's.

Either way the model's class, parameters, buffers and ``state_dict`` are untouched;
:func:`disable` removes the hooks.

NOTE [ Smaller batches fit ]
----------------------------
A plan is made for the profiled batch (the profile records ``batch_size`` and ``input_shape``).
Every tensor a stage stores or allocates grows with the batch and with the sequence (linearly,
or quadratically for attention scores), so the same operations on a batch no larger in any
dimension hold no more at any instant, and the plan's peak bounds them: a smaller last batch, or
shorter sequences, train under the plan. A larger batch is refused before the step starts (an
:class:`~memplan.InputError` naming both shapes): profile and plan for the largest batch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import memplan
from memplan.errors import InputError
from memplan.schedule import Schedule, load_schedule
from memplan.torch.models.hf import hf_task, is_hf_model, without_kv_cache
from memplan.torch.runtime.checkpointed import check_schedule
from memplan.torch.runtime.hooks import ModelHooks
from memplan.torch.runtime.planned_model import PLAN_ATTRIBUTE, PlannedModel
from memplan.torch.split.chunked_loss import (
    CHUNKED_STAGE,
    ChunkedLoss,
    chunked_stage,
    head_reads_batch,
    profile_loss_chunks,
    resolve_loss_chunks,
)
from memplan.torch.split.hf import hf_loss, hf_stages, own_loss_matches
from memplan.torch.split.linearize import linearize, traces_its_input
from memplan.torch.split.repeated import find_repeated_blocks

# ------------------------------------------------------------------------------------------------
# Stages: the chain replaces the model's forward
# ------------------------------------------------------------------------------------------------

__all__ = ["Target", "apply_plan", "disable", "install", "planned", "prepare", "stage_modules"]


def _install_stages(planned: PlannedModel, stages: list[tuple[str, nn.Module]]) -> None:
    model = planned.model
    original = model.forward
    modules = [module for _, module in stages]

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled() or planned._recomputing:
            return original(*args, **kwargs)
        if len(args) != 1 or kwargs or not isinstance(args[0], Tensor):
            raise InputError(
                f"{type(model).__name__} under a memplan plan takes one tensor (its chain's "
                "input), as when it was profiled"
            )
        x = args[0]
        it = planned._iteration(x)
        try:
            for k, module in enumerate(modules):
                x = module(it.begin(k, x, planned._recompute(module), module))
                it.end(k, x)
        except BaseException:
            it.abort()
            raise
        it.finished(x)
        return x

    object.__setattr__(model, "forward", forward)


# ------------------------------------------------------------------------------------------------
# enable
# ------------------------------------------------------------------------------------------------


def _example(model: nn.Module, example_input: Any) -> tuple[Tensor, Tensor | None, int | str]:
    """The chain input, the labels and where the model takes its input, from an example."""
    main = getattr(model, "main_input_name", None) if is_hf_model(model) else None
    if isinstance(example_input, Tensor):
        return example_input, None, main or 0
    if isinstance(example_input, Mapping):
        names = (  # the model's main input, or the name its processor gives it (Perceiver)
            [main, "input_ids", "pixel_values"]
            if main
            else [k for k, v in example_input.items() if isinstance(v, Tensor)]
        )
        name = next((n for n in names if isinstance(example_input.get(n), Tensor)), None)
        if name is None:
            raise InputError(
                f"example_input: no {main or 'tensor'} in the batch (keys: "
                f"{', '.join(map(str, example_input))})"
            )
        return example_input[name], example_input.get("labels"), name
    if (
        isinstance(example_input, Sequence)
        and example_input
        and isinstance(example_input[0], Tensor)
    ):
        return example_input[0], None, 0
    raise InputError(
        "example_input: expected a tensor, a batch mapping (input_ids, labels...) or a tuple "
        f"whose first element is the input, got {type(example_input).__name__}"
    )


def _layout(model: nn.Module, x0: Tensor) -> tuple[str, Any, list[str], list[bool]]:
    """How to follow the model: ``("hooks", RepeatedBlocks, ...)`` or ``("stages", stages,
    ...)``, with the chain's stage names (the loss last) and in-place flags.
    """
    if traces_its_input(model):
        found = hf_stages(model, x0) if is_hf_model(model) else find_repeated_blocks(model, x0)
        names = [name for name, _ in found.stages] + ["loss"]
        return "hooks", found, names, [*found.inplace, False]
    chain = linearize(model, x0)
    stages = chain.stages[:-1]
    return "stages", stages, chain.names, chain.inplace or [False] * len(chain.names)


def _chunked(target: Target, chunks: int) -> ChunkedLoss:
    """The model's head and own loss in ``chunks`` chunks of tokens, one stage
    (:mod:`memplan.torch.split.chunked_loss`); the target's last two stages become it.

    Raises
    ------
    InputError
        Not a Hugging Face causal or masked language model, or a head that mixes tokens.
    """
    model, kind = target.model, type(target.model).__name__
    loss = hf_loss(model, target.x0, None) if can_chunk_loss(target) else None
    if loss is None:
        raise InputError(
            f"loss_chunks: {kind} computes no loss of its own in chunks of tokens; the chunked "
            "loss applies to Hugging Face causal and masked language models (model(**batch)"
            ".loss) whose loss is the per-token cross-entropy of their task, such as GPT-2, "
            "Llama or BERT (not XLM's, which scores every position unshifted)"
        )
    stage = chunked_stage(target.layout.stages, loss, target.x0, chunks, kind)
    target.names[-2:] = [CHUNKED_STAGE]
    target.inplace[-2:] = [False]
    return stage


def can_chunk_loss(target: Target) -> bool:
    """Whether ``target`` (not chunked) could compute its head and own loss in chunks of tokens
    (``loss_chunks``): a Hugging Face causal or masked language model whose head memplan follows
    and whose own loss is the per-token cross-entropy of its task (not XLM's).
    """
    model, found = target.model, target.layout
    if target.chunked is not None or target.how != "hooks" or found.head_by == "none":
        return False
    if head_reads_batch(found.stages[-1][1]):
        return False
    if not is_hf_model(model) or hf_task(model) not in ("causal-lm", "masked-lm"):
        return False
    loss = hf_loss(model, target.x0, None)
    return loss is not None and own_loss_matches(model, loss, target.x0)


def planned(model: nn.Module) -> PlannedModel | None:
    """The plan :func:`enable` installed on ``model`` (None when there is none)."""
    return getattr(model, PLAN_ATTRIBUTE, None)


def disable(model: nn.Module) -> nn.Module:
    """Remove the plan :func:`enable` installed; the model trains plainly again."""
    found = planned(model)
    if found is not None:
        found.remove()
    return model


@dataclass
class Target:
    """A model made ready for a plan: its chain input, how the plan follows it, its stages."""

    model: nn.Module
    x0: Tensor
    input_key: int | str
    how: str
    layout: Any
    names: list[str]
    inplace: list[bool]
    chunked: ChunkedLoss | None = None

    @property
    def loss_chunks(self) -> int | None:
        """The chunks of tokens of the model's head and loss (None: not chunked)."""
        return None if self.chunked is None else self.chunked.chunks


def stage_modules(target: Target) -> list[nn.Module]:
    """The modules of the target's stages, the loss apart (what the batch reaches of the model:
    NOTE [ weights outside every stage ] in :mod:`memplan.torch.profiler.unreached`).
    """
    found = target.layout.stages if target.how == "hooks" else target.layout
    return [module for _, module in found]


def prepare(
    model: nn.Module,
    example_input: Any,
    *,
    required: bool = False,
    loss_chunks: int | str | None = None,
) -> Target:
    """Check the model, remove a plan installed before, and find how a plan follows it: with
    ``loss_chunks`` (a count or ``"auto"``: :func:`~memplan.torch.split.chunked_loss.
    resolve_loss_chunks`), its head and own loss are one stage computed in chunks of tokens.

    Raises
    ------
    InputError
        Not an ``nn.Module``, Hugging Face checkpointing on, no ``example_input`` (when
        ``required``) or one the model does not take, a model memplan cannot cut, or chunks
        for a model that is not a Hugging Face language model.
    """
    _check_model(model)
    disable(model)
    if required and example_input is None:
        raise InputError("enable: example_input (the largest batch) is required")
    x0, _, input_key = _example(model, example_input)
    how, layout, names, inplace = _layout(model, x0)
    target = Target(model, x0, input_key, how, layout, names, inplace)
    if loss_chunks is not None:
        head = model.get_output_embeddings() if is_hf_model(model) else None
        vocab, width = head.weight.shape if isinstance(head, nn.Linear) else (1, 1)
        chunks = resolve_loss_chunks(loss_chunks, vocab, width, x0.numel(), x0.shape[-1])
        target.chunked = None if chunks is None else _chunked(target, chunks)
    return target


def install(target: Target, schedule: Schedule, profile: Any) -> nn.Module:
    """Install ``schedule`` (made from ``profile``) on the prepared model, which is returned.

    Raises
    ------
    InputError
        The profile's stages are not the model's, or the schedule does not fit them.
    """
    _check_profile(profile, target.names)
    return _install(
        target.model, schedule, profile, target.how, target.layout, target.names,
        target.inplace, target.input_key, target.chunked,
    )  # fmt: skip


def apply_plan(
    model: nn.Module, schedule: Schedule | Mapping[str, Any] | str, profile: Any, example_input: Any
) -> nn.Module:
    """Install a plan made already (``memplan solve``'s) on ``model``: :func:`enable` without
    the profiling and the solving. ``profile`` is the one the plan was made from, on a batch
    like ``example_input`` (with its loss in chunks of tokens when it was measured so).

    Raises
    ------
    InputError
        The schedule, the profile and the model's chain do not match (stages, sha256), or the
        schedule does not replay on the profile.
    """
    prof = memplan.load_profile(profile)
    target = prepare(model, example_input, loss_chunks=profile_loss_chunks(prof))
    return install(target, load_schedule(schedule), prof)


def _check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise InputError(f"enable: expected an nn.Module, got {type(model).__name__}")
    flag = "is_activation_checkpointing"  # transformers >= 5 (is_gradient_checkpointing before)
    flag = flag if hasattr(type(model), flag) else "is_gradient_checkpointing"
    if getattr(model, flag, False):
        raise InputError(
            f"{type(model).__name__} has Hugging Face gradient checkpointing on: memplan's plan "
            "replaces it; call model.gradient_checkpointing_disable() first"
        )


def _check_profile(prof: Any, names: list[str]) -> None:
    if [s.name for s in prof.stages] != names:
        raise InputError(
            f"the profile ({prof.model}) has stages {[s.name for s in prof.stages]}, the model "
            f"{names}: profile this model"
        )


def _install(
    model: nn.Module,
    sched: Schedule,
    prof: Any,
    how: str,
    layout: Any,
    names: list[str],
    inplace: list[bool],
    input_key: int | str,
    chunked: ChunkedLoss | None = None,
) -> nn.Module:
    check_schedule(sched, names, prof)
    plan = PlannedModel(model, sched, prof, names, inplace)
    plan.loss_virtual = chunked is None  # the chunked loss is the runtime's stage
    if chunked is not None:  # its token lookups, given back by disable
        plan.chunked = chunked
        plan._handles.append(chunked.lookups)
    without_kv_cache(model)
    if how == "hooks":
        plan.how = "hooks"
        ModelHooks(plan, layout, input_key, chunked)
    else:
        _install_stages(plan, layout)
    object.__setattr__(model, PLAN_ATTRIBUTE, plan)
    return model
