"""One stage's measurement and the runner that iterates it: what the stage probes share.

:class:`StageMeasurement` is what :func:`memplan.torch.measure.stage.measure_stage` (and the
fake-tensor run of :mod:`memplan.torch.measure.fake`) returns; :class:`StageRunner` runs the
stage's forward and backward on its input; :func:`kept_bytes` is what a stage keeps between
iterations.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.profile.model import StageOption
from memplan.torch.base.storage import StaticStorages, storage_key
from memplan.torch.estimate.roofline import OpCounter
from memplan.torch.measure.probe import (
    allocation_bytes,
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The data types ``--dtype`` accepts."""

# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def storage_bytes(tensor: Tensor | None) -> int:
    key = None if tensor is None else storage_key(tensor)
    return 0 if key is None else key[1]


def static_pointers(module: nn.Module) -> StaticStorages:
    """Storage pointers of a module's parameters and buffers (static memory, never 'saved'),
    each while its storage lives (:class:`~memplan.torch.base.storage.StaticStorages`).
    """
    return StaticStorages([*module.parameters(), *module.buffers()])


def clear_grads(module: nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def median_ms(samples: Iterable[float]) -> float:
    return round(statistics.median(samples) * 1000.0, 6)


def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


# --------------------------------------------------------------------------------------------
# One stage
# --------------------------------------------------------------------------------------------


LONG_ITERATION_S = 2.0
LONG_REPEATS = 3
"""A stage whose warm-up iteration takes at least ``LONG_ITERATION_S`` seconds is timed at most
``LONG_REPEATS`` times: the jitter that repeats average out is small beside such an iteration,
and a language model's head at 128,256 tokens takes tens of seconds per iteration on a CPU."""


@dataclass
class StageMeasurement:
    """What :func:`measure_stage` finds for one stage (sizes in bytes, times in ms).

    Attributes
    ----------
    output : Tensor
        The stage output, detached: the next stage's input.
    grad_size : int
        Bytes of the gradient of the output (dense, the output's shape and data type).
    weight_grad_size : int or None
        Bytes of the parameter gradients the backward creates when they are None before it
        (``creates_grads`` of :func:`measure_stage`; None when not measured).
    backward_overhead_fresh : int or None
        The backward's temporary bytes in that case, beyond the input gradient and them.
    backward_overhead_summed : int or None
        The same with the gradients of the parameters shared with a later stage summed out of
        place, as autograd sums them when it cannot reuse the later stage's (NOTE [ a gradient
        a later stage made ] in :mod:`memplan.torch.measure.tied`); None without such
        parameters.
    sums_in_place : set of int
        Ids of the parameters whose gradient, as this stage makes it, autograd could add an
        earlier stage's into in place.
    forward_overhead_all : int or None
        The temporary bytes of the forward with autograd alone (``F_all``), beyond what it saves.
    input_saved, output_saved : bool or None
        Whether autograd saved the storage of the stage's input (output) for the backward.
    made_leaf_size : int
        Bytes of the tensors the forward makes that require a gradient and are not parameters,
        and of their gradients: held from the stage to the step's end (NOTE [ a leaf the
        forward makes ] in :mod:`memplan.torch.measure.stage`).
    iteration_times : list of float
        Seconds of each timed iteration (forward + backward).
    """

    forward_time: float
    backward_time: float
    output_size: int
    grad_size: int
    saved_size: int
    forward_overhead: int
    backward_overhead: int
    output: Tensor
    weight_grad_size: int | None = None
    backward_overhead_fresh: int | None = None
    backward_overhead_summed: int | None = None
    sums_in_place: set[int] = field(default_factory=set)
    forward_overhead_all: int | None = None
    input_saved: bool | None = None
    output_saved: bool | None = None
    made_leaf_size: int = 0
    iteration_times: list[float] = field(default_factory=list)
    options: list[StageOption] | None = None


class StageRunner:
    """Runs one stage, forward then backward, each time on a fresh copy of its input."""

    def __init__(self, module: nn.Module, x: Tensor, input_grad: bool) -> None:
        self.module = module
        self.x = x
        self.input_grad = input_grad and x.is_floating_point()
        self.sync = synchronizer(x.device)

    def fresh_input(self) -> tuple[Tensor | None, Tensor]:
        """(leaf receiving the input gradient or None, the tensor the stage reads)."""
        clear_grads(self.module)
        if self.input_grad:
            leaf = self.x.detach().requires_grad_(True)
            return leaf, leaf.clone()  # a stage may work in place on its input
        return None, self.x.clone()

    def forward(self, inp: Tensor) -> Tensor:
        out = self.module(inp)
        if not isinstance(out, Tensor):
            raise InputError(
                f"stage {type(self.module).__name__} returns {type(out).__name__}, not a tensor"
            )
        return out

    @staticmethod
    def output_gradient(out: Tensor) -> Tensor | None:
        return torch.ones_like(out) if out.requires_grad else None

    def timed(self, counter: OpCounter | None = None) -> tuple[float, float, Tensor]:
        """One iteration: (forward seconds, backward seconds, detached output).

        With ``counter``, the forward and the backward run under ``counter.counting("forward")``
        and ``counter.counting("backward")`` (the input copy and the output gradient do not).
        """

        def phase(name: str) -> Any:
            return nullcontext() if counter is None else counter.counting(name)

        _, inp = self.fresh_input()
        self.sync()
        start = time.perf_counter()
        with phase("forward"):
            out = self.forward(inp)
        self.sync()
        forward = time.perf_counter() - start
        grad = self.output_gradient(out)
        backward = 0.0
        if grad is not None:
            self.sync()
            start = time.perf_counter()
            with phase("backward"):
                out.backward(grad)
            self.sync()
            backward = time.perf_counter() - start
        return forward, backward, out.detach()


def kept_bytes(params: list[Tensor], buffers: list[Tensor], device: torch.device) -> int:
    """``weight_size`` of a stage: the bytes it keeps in device memory from one iteration to
    the next, per copy the optimizer makes (docs/runtime.md).

    Its parameters (``params``: those no earlier stage counted), its buffers (``buffers``: those
    no earlier stage counted, :func:`new_buffers`; batch-norm statistics, the loss targets, the
    side inputs every block of a run reads: no gradient or optimizer state, counted like the
    weights, a little more than needed) and, per parameter tensor, a 4-byte scalar: the step
    count ``torch.optim.Adam`` keeps in device memory beside each parameter's moments.
    """
    total = sum(allocation_bytes(p.numel() * p.element_size(), device) for p in params)
    total += len(params) * allocation_bytes(4, device)
    return total + sum(allocation_bytes(b.numel() * b.element_size(), device) for b in buffers)


def new_buffers(module: nn.Module, counted: set[int]) -> list[Tensor]:
    """The buffers of ``module`` whose storage no earlier stage counted (``counted``: storage
    pointers, updated; a tensor without a storage, fake or meta, by its id).

    The side inputs of a run of blocks (a Llama's rotary ``cos`` and ``sin``, its position ids,
    an attention mask) are the same tensors in every block's stage (the
    :class:`~memplan.torch.split.wrappers.BlockCall` buffers): the model computes them once per
    step, so one stage counts them.
    """
    found = []
    for buffer in module.buffers():
        key = storage_key(buffer)
        mark = id(buffer) if key is None else key[0]
        if mark not in counted:
            counted.add(mark)
            found.append(buffer)
    return found
