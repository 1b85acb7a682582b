"""The module hooks that mark a plan's stages in the model's own forward (NOTE [ Following the
model's own forward ] in :mod:`memplan.torch.runtime.planned`).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.torch.runtime.iteration import PlannedIteration
from memplan.torch.runtime.planned_model import PlannedModel
from memplan.torch.split.repeated import RepeatedBlocks
from memplan.torch.split.trace import (
    ViewSpec,
    model_output,
    primary_key,
    primary_output,
    replace_primary,
    view_relation,
)
from memplan.torch.split.wrappers import PrefixStage, redo_view


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


# ------------------------------------------------------------------------------------------------
# Hooks: the model's own forward, stage boundaries at module calls
# ------------------------------------------------------------------------------------------------


class ModelHooks:
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
                return with_primary(output, y)
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


def with_primary(output: Any, value: Tensor) -> Any:
    """A module's output with its primary tensor replaced."""
    if isinstance(output, Tensor):
        return value
    if isinstance(output, tuple):
        return (value, *output[1:])
    if isinstance(output, list):
        return [value, *output[1:]]
    raise RuntimeError(f"cannot replace the output of type {type(output).__name__}")
