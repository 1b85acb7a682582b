"""The optimizer step applied in the backward: each parameter stepped as its gradient is made.

NOTE [ step in the backward ]
-----------------------------
PyTorch's loop holds every gradient from the backward that makes it to ``optimizer.step()``: at
the end of the backward, all of them at once, a floor no plan of the activations goes below.
PyTorch's recipe "optimizer step in backward" (``Tensor.register_post_accumulate_grad_hook``)
steps each parameter as soon as its gradient is complete, then frees the gradient: the gradients
are never all there (docs/model.md, ``step-in-backward``).

:class:`StepInBackward` does it for the user's own optimizer: for every parameter it steps, a
hook steps that parameter alone with an optimizer of the same class and settings, whose state is
the user's optimizer's (``optimizer.state``: its ``state_dict()`` and checkpoints stay whole), its
hyperparameters read from the user's parameter group at every step (a learning-rate scheduler
stepping the user's optimizer changes them), and frees the gradient. The user's
``optimizer.step()`` then finds no gradient and does nothing, nor does ``zero_grad()``.

What it cannot serve (the caller opts in: ``enable(..., gradients="step-in-backward")``): a loop
that clips the gradients (``clip_grad_norm_`` finds none), accumulates them over several
backwards before a step (each backward steps), scales them (``GradScaler``) or reduces them
across ranks (DDP, FSDP): each needs every gradient at once, which this frees. A loop that steps
its optimizer less often than it runs backwards is refused at its step.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError

__all__ = ["INTERNAL", "StepInBackward"]

INTERNAL = "_memplan_step_in_backward"
"""The attribute that marks the one-parameter optimizers of :class:`StepInBackward`."""


class StepInBackward:
    """The hooks of NOTE [ step in the backward ] for ``optimizer`` over ``model``'s parameters.

    Parameters
    ----------
    model : nn.Module
        The model; the parameters of ``optimizer`` among its own are stepped in the backward.
    optimizer : torch.optim.Optimizer
        The user's optimizer.

    Raises
    ------
    InputError
        ``optimizer`` steps none of the model's parameters.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        own = {id(p) for p in model.parameters()}
        self.handles: list[Any] = []
        self.pending = False  # stepped in a backward, and the user's step has not come yet
        self.steps: dict[int, tuple[torch.optim.Optimizer, dict[str, Any]]] = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) in own and param.requires_grad:
                    self.steps[id(param)] = (self._one(param, group), group)
                    self.handles.append(param.register_post_accumulate_grad_hook(self._step))
        if not self.steps:
            raise InputError(
                f"gradients='step-in-backward': the {type(optimizer).__name__} given steps none "
                f"of {type(model).__name__}'s parameters"
            )
        self.handles.append(optimizer.register_step_pre_hook(self._user_steps))
        self.handles.append(model.register_forward_pre_hook(self._step_starts))

    def _one(self, param: Tensor, group: dict[str, Any]) -> torch.optim.Optimizer:
        cls = type(self.optimizer)
        taken = inspect.signature(cls.__init__).parameters
        settings = {key: value for key, value in group.items() if key != "params"}
        one = cls([param], **{key: value for key, value in settings.items() if key in taken})
        one.param_groups[0].update(settings)  # every setting, those made by the class too
        one.state = self.optimizer.state  # one state, the user's optimizer's
        setattr(one, INTERNAL, True)
        return one

    def _step(self, param: Tensor) -> None:
        one, group = self.steps[id(param)]
        mine = one.param_groups[0]
        for key, value in group.items():
            if key != "params":
                mine[key] = value  # the user's current hyperparameters (an LR scheduler's)
        with torch.no_grad():
            one.step()
        param.grad = None
        self.pending = True

    def _user_steps(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The user's ``optimizer.step()``: nothing left to step (the gradients are gone)."""
        self.pending = False

    def _step_starts(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and self.pending:
            raise InputError(
                f"gradients='step-in-backward': a step of {type(module).__name__} starts before "
                f"the {type(self.optimizer).__name__}'s step() of the last one (gradient "
                "accumulation?): the optimizer stepped in that backward already; accumulate with "
                "gradients='auto', and keep optimizer.step() in the loop (it does nothing here)"
            )

    def remove(self) -> None:
        """Remove the hooks: the optimizer steps as before."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
