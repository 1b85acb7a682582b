"""The ways of training that :func:`memplan.torch.compare.training.compare_training` measures.

Each way is a loss function of the batch over one model set up once (:class:`Setup`): plain
training, Hugging Face checkpointing (with the model's loss, or with a loss a user writes in
chunks of tokens), ``checkpoint_sequential``, ``torch.compile`` with an activation memory
budget, and memplan's plans, installed by :func:`memplan.torch.enable` as a user installs them
(with ``loss_chunks``: the language model's head and loss in chunks of tokens inside its own
forward). The list and the protocol: :mod:`memplan.torch.compare.training`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memplan.budget import check_memory
from memplan.errors import InputError
from memplan.loop import parse_optimizer
from memplan.profile.memory import loop_on
from memplan.torch.models.hf import hf_task, is_hf_model
from memplan.torch.models.registry import build_model
from memplan.torch.planner import PlanSettings, enable, plan_training
from memplan.torch.runtime.planned import disable, install, planned, prepare
from memplan.torch.split.hf import default_labels
from memplan.torch.split.linearize import Chain, linearize


@dataclass
class Outcome:
    """One way of training, measured (sizes in bytes).

    Attributes
    ----------
    name : str
        As the table shows it: ``plain``, ``checkpoint_sequential(4)``, ``memplan rotor``...
    family : str
        ``plain``, ``hf-checkpointing``, ``hf-chunked``, ``checkpoint_sequential``, ``compile``,
        ``memplan``; ``control``: plain training timed again (``compare_training(control=True)``).
    setting : str or None
        The way's parameter: ``k=4``, ``budget=0.2``, ``least memory``, ``at plain's peak``...
    peak : int or None
        Measured peak of the step, everything included (None when skipped).
    peak_ratio : float or None
        ``peak`` over plain training's.
    time_ratio : float or None
        Median over the rounds of the step time over plain training's in the same round.
    time_ratios : list of float
        Every round's ratio.
    step_ms : float or None
        Median step time (ms), for scale.
    grads : str
        ``equal``, ``close``, ``differ`` or ``n/a`` (see NOTE [ comparison protocol ]).
    grad_error : float or None
        The largest relative difference found.
    planned_peak : int or None
        memplan's planned peak (its schedule's ``peak_memory``).
    budget : int or None
        The budget memplan planned for (a store-all plan's: its own need).
    skipped : str or None
        Why the way was not measured.
    versus : str or None
        memplan's rows: the alternative they are compared with at equal memory (NOTE
        [ comparison protocol ] in :mod:`memplan.torch.compare.training`).
    versus_time : float or None
        Median over the rounds of the row's step time over ``versus``'s in the same round.
    versus_peak : float or None
        The row's measured peak over ``versus``'s.
    loss_chunks : int or None
        memplan's rows installed with ``enable(..., loss_chunks=N)``: N (None: the model's own
        loss).
    """

    name: str
    family: str
    setting: str | None = None
    peak: int | None = None
    peak_ratio: float | None = None
    time_ratio: float | None = None
    time_ratios: list[float] = field(default_factory=list)
    step_ms: float | None = None
    grads: str = "n/a"
    grad_error: float | None = None
    planned_peak: int | None = None
    budget: int | None = None
    skipped: str | None = None
    versus: str | None = None
    versus_time: float | None = None
    versus_peak: float | None = None
    loss_chunks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# The model, its batch and its plain step
# --------------------------------------------------------------------------------------------


@dataclass
class Setup:
    module: nn.Module
    x: Tensor
    labels: Tensor | None
    chain: Chain
    label: str
    hf: bool

    def plain_loss(self) -> Callable[[Tensor], Tensor]:
        if self.hf:
            return _hf_loss_call(self.module, self.labels)
        loss_stage = self.chain.stages[-1][1]
        module = self.module
        return lambda x: loss_stage(module(x))


def _hf_call(model: nn.Module, **kwargs: Any) -> Callable[[Tensor], Any]:
    """``model(input=x, **kwargs)``, without a KV cache where the model has one."""
    import inspect

    input_name = getattr(model, "main_input_name", "input_ids")
    extra = (
        {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
    )

    def call(x: Tensor) -> Any:
        return model(**{input_name: x}, **kwargs, **extra)

    return call


def _hf_loss_call(model: nn.Module, labels: Tensor | None) -> Callable[[Tensor], Tensor]:
    call = _hf_call(model, labels=labels)
    return lambda x: call(x).loss


def make_setup(
    model: str | nn.Module,
    example_input: Tensor | None,
    labels: Tensor | None,
    batch_size: int | None,
    input_shape: tuple[int, ...] | None,
    config: str | None,
    device: torch.device,
) -> Setup:
    if isinstance(model, str):
        module, x, label = build_model(
            model, batch_size=batch_size, input_shape=input_shape, config=config
        )
        x = x if example_input is None else example_input
    elif isinstance(model, nn.Module):
        if example_input is None:
            raise InputError("compare_training: give example_input with a module")
        module, x, label = model, example_input, type(model).__name__.lower()
    else:
        raise InputError(f"model: expected a name or an nn.Module, got {type(model).__name__}")
    module.to(device)
    x = x.to(device)
    hf = is_hf_model(module)
    if hf and labels is None:
        labels = default_labels(module, x)
    if labels is not None:
        labels = labels.to(device)
    module.train()
    chain = linearize(module, x, labels=labels)
    for _, stage in chain.stages:
        stage.to(device)
    return Setup(module, x, labels, chain, label, hf)


# --------------------------------------------------------------------------------------------
# The ways
# --------------------------------------------------------------------------------------------


@dataclass
class Way:
    outcome: Outcome
    loss: Callable[[Tensor], Tensor] | None = None
    holds: nn.Module | None = None  # what the step keeps besides the model (stage wrappers)
    active: Callable[[], Any] = nullcontext
    warmups: int = 1


def default_segments(stages: int) -> list[int]:
    """``checkpoint_sequential`` segment counts tried over a chain of ``stages`` stages before
    the loss: 2, 4, about the square root (the classic choice) and one segment per stage.
    """
    if stages < 2:
        return []
    found = {2, 4, max(2, round(math.sqrt(stages))), stages}
    return sorted(k for k in found if 2 <= k <= stages)


@contextmanager
def hf_checkpointing(model: nn.Module) -> Iterator[None]:
    """Hugging Face's checkpointing of every layer: ``activation_checkpointing_enable`` (the
    name since transformers 5.x), else ``gradient_checkpointing_enable``; non-reentrant.
    """
    kwargs = {"use_reentrant": False}
    hooked = bool(getattr(model, "_require_grads_hooks", None))
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    try:
        yield
    finally:
        if hasattr(model, "activation_checkpointing_disable"):
            model.activation_checkpointing_disable()
        else:
            model.gradient_checkpointing_disable()
        # enabling also hooks the input embeddings (their output requires grad), and disabling
        # leaves the hook: another hook at every step would make a compiled model recompile
        if not hooked and hasattr(model, "disable_input_require_grads"):
            model.disable_input_require_grads()


def hf_way(setup: Setup) -> Way:
    outcome = Outcome("hf checkpointing", "hf-checkpointing", "every layer")
    if not setup.hf:
        outcome.skipped = "not a Hugging Face model"
        return Way(outcome)
    if not getattr(setup.module, "supports_gradient_checkpointing", False):
        outcome.skipped = f"{type(setup.module).__name__} does not support gradient checkpointing"
        return Way(outcome)
    model = setup.module
    return Way(outcome, setup.plain_loss(), active=lambda: hf_checkpointing(model))


IGNORE_INDEX = -100
"""The label of a position without a target (Hugging Face's and ``F.cross_entropy``'s)."""


def _language_model_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, bool] | None:
    """The base model, the head (last hidden state to logits) and whether the loss predicts the
    next token, of a Hugging Face causal or masked LM whose head is one module (None else).
    """
    task = hf_task(model)
    if task == "causal-lm":
        head = model.get_output_embeddings()  # type: ignore[operator]
    elif task == "masked-lm":
        head = getattr(model, "cls", None)  # BertForMaskedLM: transform, then the decoder
    else:
        return None
    base = getattr(model, "base_model", None)
    if not isinstance(head, nn.Module) or not isinstance(base, nn.Module) or base is model:
        return None
    return base, head, task == "causal-lm"


def chunked_loss_way(setup: Setup, chunks: int) -> Way:
    """Hugging Face checkpointing and a loss computed over ``chunks`` chunks of tokens, as a
    user writes it without memplan (torchtune's and Liger Kernel's users do): the base model's
    last hidden state, then the head and the cross-entropy of each chunk under
    ``torch.utils.checkpoint(use_reentrant=False)`` (recomputed in the backward), summed and
    divided by the count of targets: the model's own mean loss, with its gradients.
    """
    from torch.utils.checkpoint import checkpoint

    outcome = Outcome(
        f"hf checkpointing + loss in {chunks} chunks", "hf-chunked", f"{chunks} chunks"
    )
    parts = _language_model_parts(setup.module) if setup.hf else None
    if parts is None or setup.labels is None:
        outcome.skipped = "not a Hugging Face causal or masked language model"
        return Way(outcome)
    if not getattr(setup.module, "supports_gradient_checkpointing", False):
        outcome.skipped = f"{type(setup.module).__name__} does not support gradient checkpointing"
        return Way(outcome)
    base, head, causal = parts
    labels = setup.labels
    targets = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:] if causal else labels
    call = _hf_call(base)

    def chunk_sum(hidden: Tensor, target: Tensor) -> Tensor:
        logits = head(hidden)
        if causal:  # the model's loss upcasts the logits (ForCausalLMLoss)
            logits = logits.float()
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
            ignore_index=IGNORE_INDEX, reduction="sum",
        )  # fmt: skip

    def loss(x: Tensor) -> Tensor:
        hidden = call(x).last_hidden_state
        total = hidden.new_zeros((), dtype=torch.float32 if causal else hidden.dtype)
        for part, target in zip(hidden.chunk(chunks, 1), targets.chunk(chunks, 1), strict=True):
            total = total + checkpoint(chunk_sum, part, target, use_reentrant=False)
        return total / (targets != IGNORE_INDEX).sum()

    model = setup.module
    return Way(outcome, loss, active=lambda: hf_checkpointing(model))


def sequential_way(setup: Setup, k: int) -> Way:
    from torch.utils.checkpoint import checkpoint_sequential

    body = nn.Sequential(*(module for _, module in setup.chain.stages[:-1]))
    loss_stage = setup.chain.stages[-1][1]

    def loss(x: Tensor) -> Tensor:
        return loss_stage(checkpoint_sequential(body, k, x, use_reentrant=False))

    holds = nn.ModuleList(module for _, module in setup.chain.stages)
    return Way(
        Outcome(f"checkpoint_sequential({k})", "checkpoint_sequential", f"k={k}"), loss, holds
    )


def compile_backend(budget: float) -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx

    def backend(graph: Any, example_inputs: Any) -> Any:
        with torch._functorch.config.patch(activation_memory_budget=budget):
            return compile_fx(graph, example_inputs)

    return backend


def compile_way(setup: Setup, budget: float) -> Way:
    outcome = Outcome(
        f"torch.compile, activation_memory_budget={budget:g}", "compile", f"budget={budget:g}"
    )
    plain = setup.plain_loss()
    compiled = torch.compile(plain, backend=compile_backend(budget))
    return Way(outcome, compiled, warmups=2)


def has_dropout(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


SAC = "+sac"
"""The suffix of memplan's plans that choose the stages' selective checkpointing options."""


def without_options(prof: Any) -> Any:
    """The profile without the stages' options (itself when it has none)."""
    if not any(st.options for st in prof.stages):
        return prof
    stages = [st.model_copy(update={"options": None}) for st in prof.stages]
    return prof.model_copy(update={"stages": stages})


def _memplan_name(algo: str, setting: str, suffix: str, chunks: int | None = None) -> str:
    chunks_part = "" if chunks is None else f", loss_chunks={chunks}"
    setting_part = "" if setting == "no recomputation" else f" ({setting})"
    return f"memplan {algo}{suffix}{chunks_part}{setting_part}"


def _user_batch(setup: Setup) -> Tensor | dict[str, Tensor]:
    """The batch a user gives ``enable``: a Hugging Face model's ``{input: x, "labels": ...}``
    (the loss is the model's own), else the input tensor.
    """
    if not setup.hf or setup.labels is None:
        return setup.x
    input_name = getattr(setup.module, "main_input_name", "input_ids")
    return {input_name: setup.x, "labels": setup.labels}


def enable_way(
    setup: Setup,
    prof: Any,
    algo: str,
    memory: int | None,
    setting: str,
    optimizer: str,
    suffix: str = "",
    loss_chunks: int | None = None,
) -> Way:
    """Install memplan's plan as a user does: ``memplan.torch.enable(model, memory,
    example_input=batch, profile=prof, loss_chunks=loss_chunks)``, then the model's own step
    (``model(**batch).loss``: with ``loss_chunks``, the same loss computed in that many chunks of
    tokens inside the model's forward; ``prof`` then a profile measured with them).
    ``memory`` None: a store-all plan, given its own need as the budget.

    The loop is the one every way trains in, told to ``enable`` (nothing left to watch):
    PyTorch's default (``zero_grad()`` sets the gradients to None), the loss held, the output
    not. The plan is installed while the way runs (:attr:`Way.active`) and removed after, so that
    the other ways train the same model plainly; installing it is not part of the measured step.
    """
    name = _memplan_name(algo, setting, suffix, loss_chunks)
    outcome = Outcome(name, "memplan", setting, budget=memory, loss_chunks=loss_chunks)
    model = setup.module
    batch = _user_batch(setup)
    try:
        enable(
            model, STORE_ALL_PROBE if memory is None else memory, example_input=batch,
            algo=algo, profile=prof, optimizer=optimizer, gradients=GRADIENTS,
            output_held=False, loss_chunks=loss_chunks,
        )  # fmt: skip
    except InputError as exc:
        if not str(exc).startswith("no "):  # "no rotor plan fits in ...": a row without a plan
            raise
        outcome.skipped = str(exc)
        return Way(outcome)
    found = planned(model)
    assert found is not None
    sched, used = found.schedule, found.profile
    disable(model)
    outcome.planned_peak = sched.peak_memory
    if memory is None:
        outcome.budget = sched.peak_memory  # its own need
    target = prepare(model, batch, loss_chunks=loss_chunks)

    @contextmanager
    def installed() -> Iterator[None]:
        install(target, sched, used)
        try:
            yield
        finally:
            disable(model)

    return Way(outcome, setup.plain_loss(), active=installed)


STORE_ALL_PROBE = 2**50
"""A budget no store-all plan exceeds: what its need is read from (never shown as a budget)."""
GRADIENTS = "at-backward"
"""The loop every way trains in: PyTorch's default, ``zero_grad()`` sets the gradients to None."""


def _planned(prof: Any, algo: str, memory: int, optimizer: str) -> Any:
    """The plan :func:`enable_way`'s ``enable`` makes, without a model (NOTE [ one planning
    path ] in memplan/torch/planner.py): the same loop (:data:`GRADIENTS`, the output not held),
    the same settings.
    """
    loop = loop_on(prof, parse_optimizer(optimizer), GRADIENTS)
    return plan_training(prof, check_memory(memory), loop, PlanSettings(algo))


def least_memory(prof: Any, algo: str, optimizer: str) -> int | None:
    """The least memory of ``algo``'s plans, as :func:`enable_way` plans them."""
    return _planned(prof, algo, 1, optimizer).min_memory


def store_all_peak(prof: Any, optimizer: str) -> int | None:
    """The planned peak of the store-all plan (the budget above which nothing is recomputed)."""
    return _planned(prof, "store-all", STORE_ALL_PROBE, optimizer).peak_memory
