"""PyTorch optimizers as memplan counts them: what one is (:func:`describe_optimizer`), and the one
a name stands for (:func:`build_optimizer`).

memplan's budget counts an optimizer's state and its step's temporaries (NOTE [ optimizer step
temporaries ] in memplan/loop.py), which depend on its class (SGD, SGD with momentum, Adam,
AdamW), on how its step runs (for-loop, foreach, fused: PyTorch's default is foreach on CUDA, the
for-loop elsewhere) and on whether the step copies the gradients (Adam's or SGD's coupled weight
decay, Nesterov momentum).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from memplan.errors import MemplanWarning
from memplan.loop import Optimizer, StepKind, parse_optimizer

__all__ = ["MOMENTUM", "build_optimizer", "describe_optimizer", "optimizer_spec"]

MOMENTUM = 0.9
"""The momentum of the optimizer ``momentum`` stands for."""


def _step_kind(optimizer: torch.optim.Optimizer) -> StepKind:
    """How ``optimizer.step()`` runs: its ``fused``/``foreach`` flags, else PyTorch's default
    for its parameters' device (foreach on CUDA, the for-loop elsewhere).
    """
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused"
    foreach = defaults.get("foreach")
    if foreach is not None:
        return "foreach" if foreach else "for-loop"
    devices = {p.device.type for group in optimizer.param_groups for p in group["params"]}
    return "foreach" if devices == {"cuda"} else "for-loop"


def describe_optimizer(optimizer: torch.optim.Optimizer) -> Optimizer:
    """What memplan counts of a PyTorch optimizer.

    SGD (with momentum or not), Adam and AdamW are known exactly; another class is counted as
    AdamW with a foreach step (two states and one copy of the gradients during the step), with a
    :class:`~memplan.errors.MemplanWarning` that says so (its own figures are not known).
    """
    step = _step_kind(optimizer)
    groups = optimizer.param_groups
    decay = any(group.get("weight_decay", 0) for group in groups)
    if isinstance(optimizer, torch.optim.SGD):
        momentum = any(group.get("momentum", 0) for group in groups)
        nesterov = any(group.get("nesterov", False) for group in groups)
        return Optimizer("momentum" if momentum else "sgd", step, decay or nesterov)
    if isinstance(optimizer, torch.optim.Adam):  # AdamW too (a subclass since torch 2.6)
        decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(
            optimizer.defaults.get("decoupled_weight_decay")
        )
        if any(group.get("amsgrad", False) for group in groups):
            _warn_unknown(optimizer, "amsgrad keeps a third state")
        return Optimizer("adamw" if decoupled else "adam", step, decay and not decoupled)
    _warn_unknown(optimizer, "its state and step are not known to memplan")
    return Optimizer("adamw", "foreach")


def _warn_unknown(optimizer: torch.optim.Optimizer, why: str) -> None:
    warnings.warn(
        f"memplan: {type(optimizer).__name__} ({why}) is counted as AdamW with a foreach step: "
        "two states as large as the gradients, and one more copy of them during the step; the "
        "budget holds when it needs no more",
        MemplanWarning,
        stacklevel=3,
    )


def optimizer_spec(optimizer: Any, parameter: str = "optimizer") -> Optimizer:
    """The :class:`~memplan.loop.Optimizer` of a name (``adamw``, ``adam:fused``), an optimizer
    class (counted with PyTorch's default step) or an optimizer instance.
    """
    if isinstance(optimizer, torch.optim.Optimizer):
        return describe_optimizer(optimizer)
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        if issubclass(optimizer, torch.optim.AdamW):
            return Optimizer("adamw")
        if issubclass(optimizer, torch.optim.Adam):
            return Optimizer("adam")
        if issubclass(optimizer, torch.optim.SGD):
            return Optimizer("sgd")
        _warn_unknown_class(optimizer)
        return Optimizer("adamw", "foreach")
    return parse_optimizer(optimizer, parameter)


def _warn_unknown_class(cls: type) -> None:
    warnings.warn(
        f"memplan: {cls.__name__} is counted as AdamW with a foreach step (its state and step "
        "are not known to memplan)",
        MemplanWarning,
        stacklevel=3,
    )


def build_optimizer(
    spec: Optimizer, params: Iterable[Tensor], lr: float = 0.01
) -> torch.optim.Optimizer:
    """The PyTorch optimizer ``spec`` stands for: ``sgd`` (and ``none``, whose budget leaves the
    weights out) ``SGD(lr)``, ``momentum`` ``SGD(lr, momentum=0.9)``, ``adam`` ``Adam(lr)``,
    ``adamw`` ``AdamW(lr)``, with ``foreach``/``fused`` as ``spec.step`` says (PyTorch's default
    when it says nothing).
    """
    params = list(params)
    flags: dict[str, Any] = {}
    if spec.step == "fused":
        flags["fused"] = True
    elif spec.step is not None:
        flags["foreach"] = spec.step == "foreach"
    if spec.name in ("none", "sgd"):
        return torch.optim.SGD(params, lr=lr, **flags)
    if spec.name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM, **flags)
    if spec.name == "adam":
        return torch.optim.Adam(params, lr=lr, **flags)
    return torch.optim.AdamW(params, lr=lr, **flags)
