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

==================  ========================================  ===========================
step                Adam / AdamW                              SGD / SGD with momentum
==================  ========================================  ===========================
``for-loop``        2 x a parameter + the one before it       0
``foreach``         1 x all the parameters of a group         0
``fused``           0                                         0
==================  ========================================  ===========================

``for-loop`` is PyTorch's default off CUDA, ``foreach`` on CUDA (``torch.optim``'s
``_default_to_fused_or_foreach``). The for-loop step goes through the parameters of a group in
order; Adam's holds, while it steps parameter ``i``, two buffers of its size (the square root
and the denominator) and the denominator of parameter ``i - 1`` (a variable of the loop, freed
when it is rebound): the largest of ``2 P[i] + P[i-1]`` over the parameters, in the order the
optimizer steps them (a profile's ``parameter_sizes``). A step that copies the gradients
(``copies_grads``: Adam's or SGD's coupled ``weight_decay``, Nesterov momentum) holds one more
``P[i]`` (for-loop) or, for SGD, all of a group (foreach; Adam's foreach step reuses its buffer).
The state (two moments for Adam, one buffer for momentum) is made at the first step, as large as
the gradients. Adam's steps also hold :data:`STEP_SCALARS` bytes of scalar tensors with their
buffers; momentum's but the fused one hold them alone.
"""

from __future__ import annotations

from collections.abc import Sequence
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

_TEMPORARIES: Final[dict[tuple[bool, StepKind], tuple[int, int, int]]] = {
    # (Adam-like, step) -> copies of (a parameter, the one before it, all of its group):
    # NOTE [ optimizer step temporaries ]
    (True, "for-loop"): (2, 1, 0),
    (True, "foreach"): (0, 0, 1),
    (True, "fused"): (0, 0, 0),
    (False, "for-loop"): (0, 0, 0),
    (False, "foreach"): (0, 0, 0),
    (False, "fused"): (0, 0, 0),
}
STEP_SCALARS: Final = 12
"""Bytes of the scalar tensors an Adam step (any kind) holds during the step besides its buffers,
and a momentum step (not fused) at a moment it holds none (measured: a 4-byte and an 8-byte
tensor)."""
_COPY: Final[dict[tuple[bool, StepKind], tuple[int, int, int]]] = {
    (True, "for-loop"): (1, 0, 0),
    (False, "for-loop"): (1, 0, 0),
    (False, "foreach"): (0, 0, 1),
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

    def step_temporaries(self, sizes: Sequence[int]) -> int:
        """Bytes the step holds beyond the weights, the gradients and the state.

        ``sizes``: the parameters' gradients in the order the step goes through them, a 0
        between two parameter groups (NOTE [ optimizer step temporaries ]).
        """
        if self.step is None or self.name == "none":
            return 0
        key = (self.state_copies == 2, self.step)
        own, before, group = _TEMPORARIES[key]
        if self.copies_grads:
            more = _COPY.get(key, (0, 0, 0))
            own, before, group = own + more[0], before + more[1], group + more[2]
        pairs = zip(sizes, [0, *sizes[:-1]], strict=True)
        most = max((own * size + before * previous for size, previous in pairs), default=0)
        groups, running = 0, 0
        for size in sizes:
            running = 0 if size == 0 else running + size
            groups = max(groups, running)
        buffers = max(most, group * groups)
        if self.state_copies == 2:  # Adam's scalars are there with its buffers
            return buffers + STEP_SCALARS
        if self.state_copies == 1 and self.step != "fused":  # momentum's, not with a copy
            return max(buffers, STEP_SCALARS)
        return buffers

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

    ``gradients`` None: the model before the loop's terms (graph and pipeline plans, and
    schedules written before them). ``output_held``: the caller holds
    the model's output (the loss stage's input, a language model's logits) until its next step
    (``out = model(**batch)`` in a loop).
    """

    optimizer: Optimizer
    gradients: Gradients | None = None
    output_held: bool = False
    output_bytes: int | None = None
    """The bytes the caller holds of the model's output, as seen (every tensor of a dict or
    tuple it keeps); None: the loss stage's input ``x[L-1]``."""

    @property
    def counts_step(self) -> bool:
        """Whether the optimizer's step after the backward is part of the plan's peak."""
        return (
            self.optimizer.step is not None
            and self.optimizer.name != "none"
            and self.gradients in ("at-backward", "kept")
        )
