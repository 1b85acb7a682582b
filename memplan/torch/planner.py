"""Plan a model's training in one call: profile it, solve for the budget, apply the plan.

:func:`enable` installs the plan on the model itself (:mod:`memplan.torch.runtime.planned`);
:func:`fit` returns a :class:`~memplan.torch.runtime.checkpointed.CheckpointedChain`. The top
floor of the torch layer with :mod:`memplan.torch.compare`: it orchestrates the profiler
(:mod:`memplan.torch.profiler`), memplan's solvers and the runtime (:mod:`memplan.torch.runtime`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

import memplan
from memplan.errors import InputError
from memplan.schedule import Schedule
from memplan.torch.base.blame import FIRST_FORWARD, model_errors
from memplan.torch.measure.conditions import check_conditions
from memplan.torch.models.registry import build_model
from memplan.torch.profiler.model import profile_model
from memplan.torch.runtime import fsdp
from memplan.torch.runtime.checkpointed import CheckpointedChain, checkpointed
from memplan.torch.runtime.planned import prepare
from memplan.torch.runtime.planned_model import describe_autocast
from memplan.torch.runtime.slots import autocast_state
from memplan.torch.split.chunked_loss import chunk_loss, profile_loss_chunks
from memplan.torch.split.hf import hf_batch
from memplan.torch.split.linearize import linearize

__all__ = ["enable", "fit", "solve_feasible"]


def solve_feasible(
    profile: Any,
    algo: str,
    memory: int | str,
    slots: int | None = None,
    optimizer: str = "sgd",
    bandwidth: float | str | None = None,
    gradients: str = "at-backward",
) -> Schedule:
    """:func:`memplan.solve`, with no plan as an :class:`InputError` that says the least memory
    that fits (what :func:`fit` and :func:`memplan.torch.enable` need: a plan to run). The
    training loop is PyTorch's default (``gradients``, docs/model.md) unless said otherwise.
    """
    sched = memplan.solve(
        profile,
        algo=algo,
        memory=memory,
        slots=slots,
        optimizer=optimizer,
        bandwidth=bandwidth,
        gradients=gradients,
    )
    if not sched.feasible:
        least = "" if sched.min_memory is None else "; the least memory that fits is "
        least += "" if sched.min_memory is None else f"{sched.min_memory} bytes"
        raise InputError(f"no {algo} plan fits in {memory}{least}")
    return sched


def fit(
    model: str | nn.Module,
    example_input: Tensor | Mapping[str, Any] | None = None,
    memory: int | str = "8GB",
    algo: str = "rotor",
    *,
    profile: Any | None = None,
    slots: int | None = None,
    optimizer: str = "sgd",
    bandwidth: float | str | None = None,
    repeats: int = 3,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    labels: Tensor | None = None,
    config: str | Mapping[str, Any] | None = None,
    gradients: str = "at-backward",
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
    memory, algo, slots, optimizer, bandwidth
        As in :func:`memplan.solve` (slots: 500 by default, pofo 50; bandwidth: the
        profile's by default, needed by the offloading algorithms and pofo).
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
    if profile is None:  # measured on the threads the caller's loop will train on
        prof = profile_model(
            module, example_input=x, device=str(x.device), repeats=repeats, name=label,
            threads=torch.get_num_threads(), loss_chunks=loss_chunks,
        )  # fmt: skip
    else:
        prof = memplan.load_profile(profile)
        check_conditions(prof, x.device)  # a warning where it was measured otherwise
    chunks = profile_loss_chunks(prof, loss_chunks)
    sched = solve_feasible(prof, algo, memory, slots, optimizer, bandwidth, gradients)
    kind = label or type(module).__name__
    with model_errors(kind, FIRST_FORWARD):  # NOTE [ whose error ]
        chain = chunk_loss(linearize(module, x, labels=labels), x, chunks, kind)
    return checkpointed(chain, sched, profile=prof), sched


def enable(
    model: nn.Module,
    memory: int | str = "8GB",
    example_input: Any = None,
    *,
    algo: str = "rotor",
    profile: Any | None = None,
    optimizer: str = "sgd",
    bandwidth: float | str | None = None,
    slots: int | None = None,
    repeats: int = 3,
    gradients: str = "at-backward",
    shards: int | None = None,
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
        The budget (bytes or ``"8GB"``), everything the step holds: weights, gradients,
        optimizer state (``optimizer``) and activations.
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
    optimizer : str
        ``sgd``, ``momentum``, ``adam`` or ``none``: the static memory counted in the budget.
    bandwidth : float or str, optional
        Host link for the offloading algorithms (the profile's by default).
    slots : int, optional
        As in :func:`memplan.solve`.
    repeats : int
        Timed repetitions per stage when profiling.
    gradients : str
        The training loop (docs/model.md): ``at-backward`` (PyTorch's default
        ``zero_grad()``, each stage's weight gradients appear at its backward), ``kept``
        (``zero_grad(set_to_none=False)``, gradient accumulation: the gradients are counted for
        the whole step) or ``auto`` (``at-backward`` when the profile has ``weight_grad_size``).
    shards : int, optional
        Under FSDP2 (``fully_shard`` on each block and on the root, called after ``enable``),
        the ranks the model is sharded over: the budget is then one rank's (docs/sharding.md).
        None: one, or the default process group's size when the whole model fits in no plan;
        the first step plans again for the model's FSDP2 mesh (or the whole model) if it
        differs.

    Returns
    -------
    nn.Module
        ``model`` itself; :func:`planned` gives the plan, :func:`disable` removes it.

    Raises
    ------
    InputError
        A model memplan cannot cut into a chain (the message says why), a profile of another
        model or batch, or no plan of ``algo`` fitting ``memory`` (the least memory that fits is
        in the message).
    """
    ranks = fsdp.shard_count(model, shards)
    target = prepare(model, example_input, required=True)
    x0 = target.x0
    if profile is None:
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
        prof = profile_model(
            model, example_input=x0, device=str(x0.device), dtype=dtype_name, repeats=repeats
        )
        autocast = describe_autocast(autocast_state(x0.device))
        if autocast != "off" and prof.measured is not None:  # what the sizes were measured in
            extra = {**(prof.measured.extra or {}), "autocast": autocast}
            prof = prof.model_copy(
                update={"measured": prof.measured.model_copy(update={"extra": extra})}
            )
    else:
        prof = memplan.load_profile(profile)

    def solve(plan_profile: Any) -> Schedule:
        return solve_feasible(plan_profile, algo, memory, slots, optimizer, bandwidth, gradients)

    labels = isinstance(example_input, Mapping) and example_input.get("labels") is not None
    return fsdp.install_sharded(target, prof, ranks, gradients, solve, loss_in_model=labels)
