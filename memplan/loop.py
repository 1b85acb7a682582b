"""The training loop a plan is made for, named once: the optimizer, its step, the gradients.

Every name a user gives for the loop (``optimizer="adamw"``, ``--gradients kept``) is declared
here, below :mod:`memplan.schedule` and :mod:`memplan.profile`, and checked once, at the door, into
the typed values below (:class:`Optimizer`, :class:`TrainingLoop`); everything under the door
trusts them. What the terms count is docs/model.md ("Static memory and budgets", "The training
loop"); how a profile's fields give them, :mod:`memplan.profile.memory`.

NOTE [ optimizer step temporaries ]
-----------------------------------
``optimizer.step()`` holds, besides the weights, the gradients and its state, temporaries that
depend on how PyTorch runs it (measured with the allocator's events, torch 2.13, CPU; the same
kernels on CUDA):

==================  =============================  ======================================
step                Adam / AdamW                   SGD / SGD with momentum
==================  =============================  ======================================
``for-loop``        2 x the largest parameter      0
``foreach``         1 x all the parameters         0
``fused``           0                              0
==================  =============================  ======================================

``for-loop`` is PyTorch's default off CUDA, ``foreach`` on CUDA (``torch.optim``'s
``_default_to_fused_or_foreach``). A step that copies the gradients (``copies_grads``: Adam's or
SGD's coupled ``weight_decay``, Nesterov momentum) holds one more largest parameter (for-loop) or,
for SGD, all of them (foreach; Adam's foreach step reuses its buffer). The state (two moments for
Adam, one buffer for momentum) is made at the first step, as large as the gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeGuard

from memplan.errors import ArgumentError

OptimizerName = Literal["none", "sgd", "momentum", "adam", "adamw"]
"""What a budget's ``optimizer`` may say; ``none``: the budget is for activations alone."""
StepKind = Literal["for-loop", "foreach", "fused"]
"""How ``optimizer.step()`` runs (NOTE [ optimizer step temporaries ])."""
Gradients = Literal["at-backward", "kept", "step-in-backward"]
"""The training loops a chain plan is made for (docs/model.md, "The training loop")."""

STATE_COPIES: Final[dict[OptimizerName, int]] = {
    "none": 0,
    "sgd": 0,
    "momentum": 1,
    "adam": 2,
    "adamw": 2,
}
"""The optimizer's state, in copies of the gradients."""
OPTIMIZER_FACTORS: Final[dict[OptimizerName, int]] = {
    name: 0 if name == "none" else 2 + copies for name, copies in STATE_COPIES.items()
}
"""Static memory as a multiple of the weight bytes in the model before the loop's terms (the
families other than the chain's): weights + gradients + optimizer state."""
STEPS: Final[tuple[StepKind, ...]] = ("for-loop", "foreach", "fused")
GRADIENTS: Final[tuple[Gradients, ...]] = ("at-backward", "kept", "step-in-backward")
AUTO: Final = "auto"

_TEMPORARIES: Final[dict[tuple[bool, StepKind], tuple[int, int]]] = {
    # (Adam-like, step) -> (largest parameters, all parameters): NOTE [ optimizer step temporaries ]
    (True, "for-loop"): (2, 0),
    (True, "foreach"): (0, 1),
    (True, "fused"): (0, 0),
    (False, "for-loop"): (0, 0),
    (False, "foreach"): (0, 0),
    (False, "fused"): (0, 0),
}
_COPY: Final[dict[tuple[bool, StepKind], tuple[int, int]]] = {
    (True, "for-loop"): (1, 0),
    (False, "for-loop"): (1, 0),
    (False, "foreach"): (0, 1),
}
"""What a step that copies the gradients adds to :data:`_TEMPORARIES`."""


def _is_name(name: str) -> TypeGuard[OptimizerName]:
    return name in STATE_COPIES


def _is_step(step: str) -> TypeGuard[StepKind]:
    return step in STEPS


@dataclass(frozen=True)
class Optimizer:
    """The optimizer a plan counts: its state, and its step's temporaries when ``step`` is set.

    ``step`` None: the step's temporaries are not counted (a schedule written before they were).
    """

    name: OptimizerName
    step: StepKind | None = None
    copies_grads: bool = False

    @property
    def text(self) -> str:
        """``adamw:foreach`` (``+copy`` when the step copies the gradients): what it parses from."""
        if self.step is None or self.name == "none":
            return self.name
        return f"{self.name}:{self.step}" + ("+copy" if self.copies_grads else "")

    @property
    def state_copies(self) -> int:
        """The state, in copies of the gradients (Adam's two moments: 2)."""
        return STATE_COPIES[self.name]

    def step_temporaries(self, gradients: int, largest: int) -> int:
        """Bytes the step holds beyond the weights, the gradients and the state.

        For gradients of ``gradients`` bytes whose largest is ``largest`` (NOTE [ optimizer step
        temporaries ]).
        """
        if self.step is None or self.name == "none":
            return 0
        key = (self.state_copies == 2, self.step)
        per_largest, per_all = _TEMPORARIES[key]
        if self.copies_grads:
            more = _COPY.get(key, (0, 0))
            per_largest, per_all = per_largest + more[0], per_all + more[1]
        return per_largest * largest + per_all * gradients

    def with_default_step(self, device_kind: str | None) -> Optimizer:
        """``step`` as PyTorch defaults to it on that device, when not given.

        ``for-loop`` on a CPU, ``foreach`` on a GPU (and on a device not known: memplan plans GPU
        memory).
        """
        if self.step is not None or self.name == "none":
            return self
        step: StepKind = "for-loop" if device_kind == "cpu" else "foreach"
        return Optimizer(self.name, step, self.copies_grads)


def parse_optimizer(value: object, parameter: str = "optimizer") -> Optimizer:
    """An :class:`Optimizer` from ``NAME[:STEP[+copy]]`` (``adamw``, ``adam:fused``) or one.

    Raises
    ------
    ArgumentError
        Naming ``parameter``: an unknown name or step.
    """
    if isinstance(value, Optimizer):
        return value
    expected = (
        f"one of {', '.join(STATE_COPIES)}, optionally with the step PyTorch runs "
        f"({', '.join(STEPS)}), e.g. adamw:fused"
    )
    text = value.strip().lower() if isinstance(value, str) else ""
    name, _, rest = text.partition(":")
    step = rest.removesuffix("+copy")
    if not _is_name(name):
        raise ArgumentError(parameter, f"expected {expected}", value)
    if not rest:
        return Optimizer(name)
    if not _is_step(step):
        raise ArgumentError(parameter, f"expected {expected}", value)
    return Optimizer(name, step, rest.endswith("+copy"))


def check_gradients(value: object, parameter: str = "gradients") -> str:
    """``auto`` (also None) or one of :data:`GRADIENTS`."""
    if value is None:
        return AUTO
    if value not in (AUTO, *GRADIENTS):
        raise ArgumentError(
            parameter,
            "expected auto, at-backward (zero_grad(set_to_none=True), PyTorch's default), kept "
            "(zero_grad(set_to_none=False), gradient accumulation) or step-in-backward (the "
            "optimizer steps each parameter as its gradient is made)",
            value,
        )
    return str(value)


@dataclass(frozen=True)
class TrainingLoop:
    """What the user's loop holds besides the model's activations (docs/model.md).

    ``gradients`` None: the model before the loop's terms (offloading, combined, join and
    pipeline plans, and chain schedules written before them). ``output_held``: the caller holds
    the model's output (the loss stage's input, a language model's logits) until its next step
    (``out = model(**batch)`` in a loop).
    """

    optimizer: Optimizer
    gradients: Gradients | None = None
    output_held: bool = False

    @property
    def counts_step(self) -> bool:
        """Whether the optimizer's step after the backward is part of the plan's peak."""
        return (
            self.optimizer.step is not None
            and self.optimizer.name != "none"
            and self.gradients in ("at-backward", "kept")
        )
