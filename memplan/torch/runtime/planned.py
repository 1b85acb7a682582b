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
  ``labels``) or the caller's.
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
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.schedule import Schedule
from memplan.torch.split.linearize import traces_its_input
from memplan.torch.measure.probe import storage_key
from memplan.torch.split.repeated import (
    PrefixStage,
    RepeatedBlocks,
    ViewSpec,
    model_output,
    primary_key,
    primary_output,
    redo_view,
    replace_primary,
    view_relation,
)
from memplan.torch.runtime.iteration import (
    PlannedIteration,
    RuntimeCounters,
    RuntimePlan,
    autocast_state,
    check_schedule,
    planned_forward_counts,
    solve_feasible,
)

__all__ = ["PlannedModel", "apply_plan", "disable", "enable", "planned"]

_ATTRIBUTE = "_memplan_plan"


@dataclass
class _HeadCall:
    """A module call of the head during a step: what a recomputation of the head replays."""

    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    key: int | str
    view: ViewSpec | None


@dataclass
class _Step:
    """The state of one step's forward, between the model's call and its return."""

    iteration: PlannedIteration
    stage: int = 0  # the stage being computed (or next)
    open: bool = False  # between begin and end of ``stage``
    head: list[_HeadCall] = field(default_factory=list)
    head_input: Tensor | None = None
    head_exact: bool = True


class PlannedModel:
    """A plan installed on a model (:func:`enable`); ``planned(model)`` returns it.

    Attributes
    ----------
    schedule : Schedule
        The plan.
    profile : Profile
        The profile it was made from (``batch_size``, ``input_shape``: the largest batch it
        serves).
    names : list of str
        The chain's stages, the loss last.
    counters : RuntimeCounters
        What the last training step did (forward computations per stage, bytes held).
    how : str
        ``hooks`` or ``stages`` (NOTE [ Following the model's own forward ]).
    """

    def __init__(
        self,
        model: nn.Module,
        schedule: Schedule,
        profile: Any,
        names: list[str],
        inplace: list[bool],
    ) -> None:
        self.model = model
        self.schedule = schedule
        self.profile = profile
        self.names = names
        self.plan = RuntimePlan(schedule, len(names))
        self.inplace = inplace
        self.counters = RuntimeCounters()
        self.how = "stages"
        self._handles: list[Any] = []
        self._streams: dict[Any, Any] = {}
        self._recomputing = 0
        self._autocast = autocast_state(_device_of(model))
        measured = getattr(profile, "measured", None)
        recorded = (getattr(measured, "extra", None) or {}).get("autocast")
        self._profiled = recorded or _describe(self._autocast)
        self._warned = False

    def planned_forward_counts(self) -> list[int]:
        """Forward operations per stage in the plan."""
        return planned_forward_counts(self.schedule, len(self.names))

    def remove(self) -> None:
        """Uninstall the plan: the model trains plainly again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if "forward" in vars(self.model):
            del self.model.forward
        if getattr(self.model, _ATTRIBUTE, None) is self:
            delattr(self.model, _ATTRIBUTE)

    # -- a step ----------------------------------------------------------------------------
    def _check_batch(self, x0: Tensor) -> None:
        prof = self.profile
        planned = (prof.batch_size, *prof.input_shape) if prof.batch_size else None
        if planned is None:
            return
        shape = tuple(x0.shape)
        if len(shape) != len(planned) or any(a > b for a, b in zip(shape, planned, strict=True)):
            raise InputError(
                f"batch of shape {list(shape)}: the plan was made for {list(planned)} "
                f"({prof.model}), and a larger batch or sequence needs more memory than planned; "
                "call memplan.torch.enable(model, ..., example_input=<the largest batch>) again"
            )
        now = _describe(autocast_state(x0.device))
        if now != self._profiled and not self._warned:
            self._warned = True
            warnings.warn(
                f"memplan: the plan was profiled with autocast {self._profiled} and this step "
                f"runs with {now}: the sizes differ from the plan's; call "
                "memplan.torch.enable inside the same torch.autocast context as the training",
                stacklevel=4,
            )

    def _iteration(self, x0: Tensor) -> PlannedIteration:
        self._check_batch(x0)
        self.counters = RuntimeCounters.for_stages(len(self.names))
        keys = (storage_key(t) for t in [*self.model.parameters(), *self.model.buffers()])
        static = {key[0] for key in keys if key is not None}
        return PlannedIteration(
            self.plan, x0, static, self.counters, self._streams,
            virtual={len(self.names) - 1}, input_transfers=False, inplace=self.inplace,
            names=self.names,
        )  # fmt: skip

    def _recompute(self, function: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        """A stage function that the hooks let through (a recomputation is not a step)."""

        def run(x: Tensor) -> Tensor:
            self._recomputing += 1
            try:
                return function(x)
            finally:
                self._recomputing -= 1

        return run


def _describe(state: list[tuple[str, bool, torch.dtype, bool]]) -> str:
    on = [
        f"{kind}:{str(dtype).removeprefix('torch.')}"
        for kind, enabled, dtype, _ in state
        if enabled
    ]
    return ", ".join(on) if on else "off"


def _device_of(model: nn.Module) -> torch.device:
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


# ------------------------------------------------------------------------------------------------
# Stages: the chain replaces the model's forward
# ------------------------------------------------------------------------------------------------


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
        return x

    object.__setattr__(model, "forward", forward)


# ------------------------------------------------------------------------------------------------
# Hooks: the model's own forward, stage boundaries at module calls
# ------------------------------------------------------------------------------------------------


class _Hooks:
    """The module hooks of NOTE [ Following the model's own forward ]."""

    def __init__(self, planned: PlannedModel, found: RepeatedBlocks, input_key: int | str) -> None:
        self.planned = planned
        self.found = found
        self.input_key = input_key
        self.step: _Step | None = None
        self.first_block = 1 if found.prefix else 0
        self.blocks = len(found.block_modules)
        self.head = self.first_block + self.blocks if found.head_by != "none" else None
        self.prefix_stage = found.stages[0][1] if found.prefix else None
        self.head_stage = found.stages[-1][1] if self.head is not None else None
        model = planned.model
        add = planned._handles.append
        add(model.register_forward_pre_hook(self.model_pre, with_kwargs=True))
        add(model.register_forward_hook(self.model_post, with_kwargs=True, always_call=True))
        for i, block in enumerate(found.block_modules):
            add(block.register_forward_pre_hook(self.block_pre(i), with_kwargs=True))
            add(block.register_forward_hook(self.block_post(i), with_kwargs=True))
        if found.head_by == "calls":
            for module in found.head_modules:
                add(module.register_forward_pre_hook(self.head_pre, with_kwargs=True))
                add(module.register_forward_hook(self.head_post, with_kwargs=True))

    def active(self) -> _Step | None:
        return None if self.planned._recomputing else self.step

    # -- the model -------------------------------------------------------------------------
    def model_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        if not torch.is_grad_enabled() or self.planned._recomputing or self.step is not None:
            return None
        key = self.input_key
        x0 = kwargs.get(key) if isinstance(key, str) else None
        if x0 is None:
            found = primary_key(args, kwargs)
            x0 = (
                None
                if found is None
                else (args[found] if isinstance(found, int) else kwargs[found])
            )
            key = found if found is not None else key
        if not isinstance(x0, Tensor):
            raise InputError(
                f"{type(module).__name__} under a memplan plan: no {self.input_key} tensor in "
                "the call (the input it was profiled with)"
            )
        given = kwargs
        if kwargs.get("use_cache"):  # a KV cache grows at every call of a block: no cache in
            kwargs = {**kwargs, "use_cache": False}  # training (as HF's checkpointing does)
        it = self.planned._iteration(x0)
        self.step = step = _Step(it)
        x = x0
        if self.prefix_stage is not None:
            rest, others = replace_primary(args, kwargs, key, None)
            prefix = self._prefix_function(rest, others, key)
            try:
                x = it.begin(0, x0, prefix, self.prefix_stage)
            except BaseException:
                self._abort()
                raise
            step.open = True
        if x is not x0 or kwargs is not given:
            return replace_primary(args, kwargs, key, x)
        return None

    def _prefix_function(self, args: tuple, kwargs: dict, key: int | str) -> Callable:
        stage = self.prefix_stage
        assert isinstance(stage, PrefixStage)
        forward = type(self.planned.model).forward

        def call(model: nn.Module, x: Tensor) -> Any:
            a, kw = replace_primary(args, kwargs, key, x)
            return forward(model, *a, **kw)

        def prefix(x: Tensor) -> Tensor:
            with stage.calling(call):
                return stage(x)

        return self.planned._recompute(prefix)

    def model_post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        step = self.active()
        if step is None:
            return None
        self.step = None
        it = step.iteration
        try:
            if output is None:  # the forward raised
                it.abort()
                return None
            if step.open and step.stage == self.head:
                out = model_output(output)
                if out is None:
                    raise RuntimeError(
                        f"{type(module).__name__} returned no tensor memplan recognizes as its "
                        "output (a tensor, a dict with logits, a tuple starting with one)"
                    )
                self._end(step, out)
            last = self.head if self.head is not None else self.first_block + self.blocks - 1
            if step.stage != last + 1 or step.open:
                raise RuntimeError(
                    f"memplan: the forward of {type(module).__name__} ended at stage "
                    f"{step.stage} ({self.planned.names[step.stage]}), not after its last "
                    "stage: the model did not run as it did when it was profiled"
                )
        except BaseException:
            it.abort()
            raise
        return None

    def _abort(self) -> None:
        if self.step is not None:
            self.step.iteration.abort()
            self.step = None

    def _end(self, step: _Step, out: Tensor) -> None:
        step.iteration.end(step.stage, out)
        step.open = False
        step.stage += 1

    # -- the blocks ------------------------------------------------------------------------
    def block_pre(self, i: int) -> Callable:
        k = self.first_block + i
        key = self.found.block_keys[i]

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            step = self.active()
            if step is None:
                return None
            it = step.iteration
            try:
                x = args[key] if isinstance(key, int) else kwargs[key]
                if step.open and step.stage == 0 and i == 0 and self.prefix_stage is not None:
                    self._end(step, x)  # the part before the first block ends here
                if step.open or step.stage != k:
                    raise RuntimeError(
                        f"memplan: block {self.found.blocks[i]} was called out of the order it "
                        "was profiled in (or twice in one forward)"
                    )

                # The call's other arguments, for a recomputation; not its hidden state (the
                # plan decides which copy of x[k] a recomputation reads, and how long it lives).
                rest = replace_primary(args, kwargs, key, None)

                def block(x: Tensor, a: tuple = rest[0], kw: dict = rest[1]) -> Tensor:
                    a, kw = replace_primary(a, kw, key, x)
                    out = primary_output(module(*a, **kw))
                    if out is None:
                        raise RuntimeError(f"block {self.found.blocks[i]} returned no tensor")
                    return out

                y = it.begin(k, x, self.planned._recompute(block), module)
                step.open = True
            except BaseException:
                self._abort()
                raise
            if y is not x:
                return replace_primary(args, kwargs, key, y)
            return None

        return hook

    def block_post(self, i: int) -> Callable:
        k = self.first_block + i

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            step = self.active()
            if step is None or step.stage != k or not step.open:
                return None
            it = step.iteration
            try:
                out = primary_output(output)
                if out is None:
                    raise RuntimeError(f"block {self.found.blocks[i]} returned no tensor")
                self._end(step, out)
                if self.head is None or i != self.blocks - 1:
                    return None
                step.head_input = out
                step.head = []
                y = it.begin(self.head, out, self._head_function(step), self.head_stage)
                step.open = True
            except BaseException:
                self._abort()
                raise
            if y is not out:
                return _with_primary(output, y)
            return None

        return hook

    # -- the head --------------------------------------------------------------------------
    def _head_function(self, step: _Step) -> Callable[[Tensor], Tensor]:
        if self.found.head_by != "calls":
            stage = self.head_stage
            assert stage is not None
            return self.planned._recompute(stage)

        def head(x: Tensor) -> Tensor:
            if not step.head_exact or not step.head:
                raise RuntimeError(
                    "memplan: the head of the model did not run as a sequence of module calls "
                    "in this step; it cannot be recomputed"
                )
            for call in step.head:
                a, kw = replace_primary(call.args, call.kwargs, call.key, redo_view(x, call.view))
                out = primary_output(call.module(*a, **kw))
                if out is None:
                    raise RuntimeError(f"{type(call.module).__name__} returned no tensor")
                x = out
            return x

        return self.planned._recompute(head)

    def head_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        step = self.active()
        if step is None or step.stage != self.head or not step.open:
            return
        key = primary_key(args, kwargs)
        previous = step.head_input
        if key is None or previous is None:
            step.head_exact = False
            return
        x = args[key] if isinstance(key, int) else kwargs[key]
        related, view = view_relation(previous, x)
        step.head_exact = step.head_exact and related
        rest, kw = replace_primary(args, kwargs, key, None)  # not the tensor: the replay's own
        step.head.append(_HeadCall(module, rest, kw, key, view))

    def head_post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        step = self.active()
        if step is None or step.stage != self.head or not step.open:
            return
        out = primary_output(output)
        step.head_input = out
        if module is self.found.output_module and out is not None:
            try:
                self._end(step, out)
            except BaseException:
                self._abort()
                raise
            step.head_input = None


def _with_primary(output: Any, value: Tensor) -> Any:
    """A module's output with its primary tensor replaced."""
    if isinstance(output, Tensor):
        return value
    if isinstance(output, tuple):
        return (value, *output[1:])
    if isinstance(output, list):
        return [value, *output[1:]]
    raise RuntimeError(f"cannot replace the output of type {type(output).__name__}")


# ------------------------------------------------------------------------------------------------
# enable
# ------------------------------------------------------------------------------------------------


def _example(model: nn.Module, example_input: Any) -> tuple[Tensor, Tensor | None, int | str]:
    """The chain input, the labels and where the model takes its input, from an example."""
    from memplan.torch.models.hf import is_hf_model

    main = getattr(model, "main_input_name", None) if is_hf_model(model) else None
    if isinstance(example_input, Tensor):
        return example_input, None, main or 0
    if isinstance(example_input, Mapping):
        names = [main] if main else [k for k, v in example_input.items() if isinstance(v, Tensor)]
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
    ...)``, with the chain's stage names (the loss last) and in-place flags."""
    from memplan.torch.split.linearize import linearize

    if traces_its_input(model):
        from memplan.torch.models.hf import hf_stages, is_hf_model
        from memplan.torch.split.repeated import find_repeated_blocks

        found = hf_stages(model, x0) if is_hf_model(model) else find_repeated_blocks(model, x0)
        names = [name for name, _ in found.stages] + ["loss"]
        return "hooks", found, names, [*found.inplace, False]
    chain = linearize(model, x0)
    stages = chain.stages[:-1]
    return "stages", stages, chain.names, chain.inplace or [False] * len(chain.names)


def planned(model: nn.Module) -> PlannedModel | None:
    """The plan :func:`enable` installed on ``model`` (None when there is none)."""
    return getattr(model, _ATTRIBUTE, None)


def disable(model: nn.Module) -> nn.Module:
    """Remove the plan :func:`enable` installed; the model trains plainly again."""
    found = planned(model)
    if found is not None:
        found.remove()
    return model


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
    import memplan
    from memplan.torch.profiler.model import profile_model

    _check_model(model)
    disable(model)
    if example_input is None:
        raise InputError("enable: example_input (the largest batch) is required")
    x0, _, input_key = _example(model, example_input)
    how, layout, names, inplace = _layout(model, x0)
    if profile is None:
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
        prof = profile_model(
            model, example_input=x0, device=str(x0.device), dtype=dtype_name, repeats=repeats
        )
        autocast = _describe(autocast_state(x0.device))
        if autocast != "off" and prof.measured is not None:  # what the sizes were measured in
            extra = {**(prof.measured.extra or {}), "autocast": autocast}
            prof = prof.model_copy(
                update={"measured": prof.measured.model_copy(update={"extra": extra})}
            )
    else:
        prof = memplan.load_profile(profile)
    _check_profile(prof, names)
    sched = solve_feasible(prof, algo, memory, slots, optimizer, bandwidth, gradients)
    return _install(model, sched, prof, how, layout, names, inplace, input_key)


def apply_plan(
    model: nn.Module, schedule: Schedule | Mapping[str, Any] | str, profile: Any, example_input: Any
) -> nn.Module:
    """Install a plan made already (``memplan solve``'s) on ``model``: :func:`enable` without
    the profiling and the solving. ``profile`` is the one the plan was made from, on a batch
    like ``example_input``.

    Raises
    ------
    InputError
        The schedule, the profile and the model's chain do not match (stages, sha256), or the
        schedule does not replay on the profile.
    """
    import memplan
    from memplan.schedule import load_schedule

    _check_model(model)
    disable(model)
    x0, _, input_key = _example(model, example_input)
    how, layout, names, inplace = _layout(model, x0)
    prof = memplan.load_profile(profile)
    _check_profile(prof, names)
    return _install(model, load_schedule(schedule), prof, how, layout, names, inplace, input_key)


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
) -> nn.Module:
    check_schedule(sched, names, prof)
    plan = PlannedModel(model, sched, prof, names, inplace)
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False):
        config.use_cache = False  # a KV cache is for generation (HF's checkpointing does this too)
    if how == "hooks":
        if layout.head_by == "fx" and sched_recomputes(sched, len(names) - 2):
            raise InputError(
                f"the {sched.algorithm} plan recomputes the head of {type(model).__name__}, "
                "which its forward computes with other code than module calls: give a larger "
                "budget"
            )
        plan.how = "hooks"
        _Hooks(plan, layout, input_key)
    else:
        _install_stages(plan, layout)
    object.__setattr__(model, _ATTRIBUTE, plan)
    return model


def sched_recomputes(schedule: Schedule, stage: int) -> bool:
    """Whether the plan computes ``stage`` more than once."""
    return sum(op.stage == stage and op.op.startswith("F") for op in schedule.ops) > 1
