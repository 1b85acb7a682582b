"""The allocator's peak of one whole training iteration: what the budget promises to hold.

:func:`measure_step` runs one iteration of a training loop - the forward, ``backward()`` and the
optimizer's real ``step()`` - and returns the peak of the bytes the device's allocator held during
it, everything included: weights and buffers, gradients, optimizer state, activations,
temporaries, the input batch and the loss (docs/runtime.md, "The measured peak").

* CUDA: ``torch.cuda.reset_peak_memory_stats`` before the iteration and
  ``torch.cuda.max_memory_allocated`` after it (every block the caching allocator handed out,
  rounded as it rounds them).
* CPU: the allocator's events (``torch.profiler`` with ``profile_memory=True``), replayed in order
  on top of the bytes already allocated when the iteration starts (the storages of the parameters,
  buffers, gradients, optimizer state and input, each counted once).

:func:`make_optimizer` builds the optimizer of ``--optimizer`` the way memplan plans for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import memplan
from memplan.errors import InputError
from memplan.loop import Optimizer, TrainingLoop, parse_optimizer
from memplan.profile.memory import static_bytes
from memplan.torch.base.optimizers import build_optimizer
from memplan.torch.measure.probe import CpuProbe
from memplan.torch.runtime.checkpointed import CheckpointedChain, checkpointed
from memplan.torch.runtime.plan import planned_activation_peak
from memplan.torch.split.chunked_loss import chunk_loss, profile_loss_chunks
from memplan.torch.split.hf import hf_batch
from memplan.torch.split.linearize import linearize

__all__ = [
    "StepMeasurement",
    "make_optimizer",
    "measure_step",
    "train_under_plan",
]


def make_optimizer(
    name: str | Optimizer, params: Iterable[Tensor], lr: float = 0.01
) -> torch.optim.Optimizer:
    """The ``torch.optim`` optimizer of ``--optimizer NAME[:STEP]``, as memplan's budget counts it.

    ``sgd`` (and ``none``, whose budget leaves the weights out): ``SGD(lr)``; ``momentum``:
    ``SGD(lr, momentum=0.9)``; ``adam``: ``Adam(lr)``; ``adamw``: ``AdamW(lr)``; the step as
    named (``adamw:fused``: ``fused=True``, ``:foreach``, ``:for-loop``), PyTorch's default
    otherwise (:func:`memplan.torch.base.optimizers.build_optimizer`; the temporaries of each:
    NOTE [ optimizer step temporaries ] in memplan/loop.py).

    Raises
    ------
    InputError
        An unknown name (:class:`~memplan.errors.ArgumentError` naming ``optimizer``).
    """
    return build_optimizer(parse_optimizer(name), params, lr)


@dataclass(frozen=True)
class StepMeasurement:
    """What :func:`measure_step` measured (bytes of device memory as the allocator counts them).

    Attributes
    ----------
    peak : int
        The largest amount allocated at any time during the iteration, everything included.
    before : int
        Allocated when the iteration started (weights, buffers, gradients and optimizer state
        kept from the previous iteration, the input batch).
    after : int
        Allocated when it ended.
    loss : float
        The loss of the iteration.
    seconds : float
        Its wall time (CPU: under the profiler that records the allocator's events, slower).
    method : str
        How the peak was measured.
    """

    peak: int
    before: int
    after: int
    loss: float
    seconds: float
    method: str


_CPU_METHOD = "torch.profiler allocator events over the bytes allocated before"
_CUDA_METHOD = "torch.cuda.max_memory_allocated"


def _storages(tensors: Iterable[Any]) -> dict[int, int]:
    """Data pointer -> bytes of the distinct storages of ``tensors`` (non-tensors skipped)."""
    found: dict[int, int] = {}
    for tensor in tensors:
        if not isinstance(tensor, Tensor):
            continue
        try:
            storage = tensor.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            continue
        if ptr and nbytes:
            found[ptr] = nbytes
    return found


def _resident(model: nn.Module, x: Any, optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """The storages the iteration starts with: model, gradients, optimizer state, input."""
    inputs = list(x.values()) if isinstance(x, Mapping) else [x]
    tensors: list[Any] = [*model.parameters(), *model.buffers(), *inputs]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for group in optimizer.param_groups:
        for param in group["params"]:
            tensors.append(param)
            if param.grad is not None:
                tensors.append(param.grad)
    for state in optimizer.state.values():
        tensors += list(state.values())
    return _storages(tensors)


def replay_peak(events: Iterable[tuple[int, int]], resident: dict[int, int]) -> tuple[int, int]:
    """Peak and final bytes allocated, from allocator events over a starting set of blocks.

    Parameters
    ----------
    events : iterable of (address, bytes)
        Allocations (positive bytes) and frees (negative) in time order.
    resident : dict
        Address -> bytes of the blocks allocated when the events start.

    Returns
    -------
    (int, int)
        The largest total and the total at the end. A free counts when its block is an
        allocation of ``events`` or one of ``resident``; others (blocks the iteration never
        held) are ignored.
    """
    held = dict(resident)
    fresh: dict[int, int] = {}
    total = sum(held.values())
    peak = total
    for address, nbytes in events:
        if nbytes > 0:
            if address in fresh:  # the allocator never hands out a live block twice
                total -= fresh.pop(address)
            fresh[address] = nbytes
            total += nbytes
            peak = max(peak, total)
        elif address in fresh:
            total -= fresh.pop(address)
        elif address in held:
            total -= held.pop(address)
    return peak, total


Batch = Tensor | Mapping[str, Any]
"""A step's input: a tensor, or a Hugging Face batch (``input_ids``, ``labels``...)."""


def _loss(model: Callable[..., Any], batch: Batch) -> Tensor:
    """The loss of one step on ``batch``.

    ``model(x)``; for a batch mapping, ``model(x, labels)`` on a wrapped chain (its loss stage
    takes them), ``model(**batch).loss`` on a model.
    """
    if not isinstance(batch, Mapping):
        return model(batch)
    if isinstance(model, CheckpointedChain):
        x, labels = hf_batch(batch)
        return model(x, labels)
    out = model(**batch)
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", out)
    if not isinstance(loss, Tensor):
        raise InputError(
            f"{type(model).__name__}(**batch) returned no loss: give the batch its labels"
        )
    return loss


def _iteration(
    model: Callable[..., Any], x: Batch, optimizer: torch.optim.Optimizer
) -> Callable[[], Tensor]:
    def run() -> Tensor:
        loss = _loss(model, x)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return run


def _copy(batch: Batch) -> Batch:
    """A copy of the batch made while the profiler records memory (its frees are seen)."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ):
        if isinstance(batch, Mapping):
            return {k: v.clone() if isinstance(v, Tensor) else v for k, v in batch.items()}
        return batch.clone()


def _device(batch: Batch) -> torch.device:
    if isinstance(batch, Tensor):
        return batch.device
    found = next((v for v in batch.values() if isinstance(v, Tensor)), None)
    if found is None:
        raise InputError("measure_step: the batch holds no tensor")
    return found.device


def _measure_cpu(run: Callable[[], Tensor], resident: dict[int, int]) -> tuple[int, int, Tensor]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        loss = run()
    peak, after = replay_peak(CpuProbe.events(prof), resident)
    return peak, after, loss


def measure_step(
    model: Callable[..., Any],
    x: Batch,
    optimizer: torch.optim.Optimizer,
    *,
    set_to_none: bool = True,
) -> StepMeasurement:
    """Run one training iteration and measure the allocator's peak during it.

    The iteration is ``optimizer.zero_grad(set_to_none=...)``, then (measured) ``loss = model(x)``,
    ``loss.backward()``, ``optimizer.step()``. ``model`` is a module whose forward returns the
    scalar loss: a :class:`~memplan.torch.CheckpointedChain` (the iteration follows its plan) or
    any training module (plain training, to compare). With a Hugging Face batch, the loss is
    ``model(**batch).loss`` (a model under :func:`memplan.torch.enable`, or plain), or the
    wrapped chain's on the batch's input and labels.

    By default the loop is PyTorch's: ``zero_grad()`` sets the gradients to None, so each
    parameter's gradient appears during the backward, at the backward of the stage that owns it,
    and lives until the next ``zero_grad``. ``set_to_none=False`` is a loop that keeps its
    gradient buffers (zeroed in place): from the second call on they are allocated when the
    iteration starts, with the optimizer state (which appears in the first call's step). The
    plan's static memory counts the gradients for the whole iteration, the second loop's steady
    state; the default loop needs at most as much.

    Parameters
    ----------
    model : callable
        ``model(x)`` returns the loss (``model(**x).loss`` for a batch mapping).
    x : Tensor or mapping
        The input batch (on the device measured), or a Hugging Face batch (``input_ids``,
        ``labels``, ...).
    optimizer : torch.optim.Optimizer
        The optimizer of the parameters (see :func:`make_optimizer`).
    set_to_none : bool
        Passed to ``zero_grad`` before the iteration (PyTorch's default, True: the gradients
        are freed; False: kept and zeroed).

    Returns
    -------
    StepMeasurement
        ``peak``: bytes, everything included (see the module docstring for the method).
    """
    optimizer.zero_grad(set_to_none=set_to_none)
    device = _device(x)
    started = time.perf_counter()
    if device.type == "cuda":
        run = _iteration(model, x, optimizer)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        loss = run()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        after = torch.cuda.memory_allocated(device)
        method = _CUDA_METHOD
    else:
        CpuProbe.quiet()
        # The allocator reports the free of a block only when it saw its allocation (under a
        # profiler): the iteration reads a copy of the input made under one, so that a plan
        # offloading x[0] is seen freeing it.
        batch = _copy(x)
        run = _iteration(model, batch, optimizer)
        modules = model if isinstance(model, nn.Module) else nn.Module()
        resident = _resident(modules, batch, optimizer)
        before = sum(resident.values())
        peak, after, loss = _measure_cpu(run, resident)
        method = _CPU_METHOD
    seconds = time.perf_counter() - started
    return StepMeasurement(
        peak=int(peak),
        before=int(before),
        after=int(after),
        loss=float(loss),
        seconds=seconds,
        method=method,
    )


def _planned_offload_bytes(prof: Any, sched: Any) -> int:
    """Bytes the plan's offloads move, by the profile's tensor sizes (docs/combined.md)."""
    sizes = {"x[0]": prof.input_size}
    for k, stage in enumerate(prof.stages):
        sizes[f"x[{k + 1}]"] = stage.output_size
        sizes[f"s[{k}]"] = stage.saved_size
    return sum(
        sizes.get(op.tensor or f"s[{op.stage}]", 0) for op in sched.ops if op.op == "offload"
    )


def train_under_plan(
    module: nn.Module,
    x: Tensor,
    profile: Any,
    schedule: Any,
    *,
    steps: int = 2,
    lr: float = 0.01,
    set_to_none: bool | None = None,
) -> dict[str, Any]:
    """Train ``steps`` iterations of ``module`` under ``schedule`` and measure each one.

    What ``memplan run`` does once it has a plan (and what the benchmark of docs/benchmarks.md
    runs per point): the model, linearized on ``x``, is wrapped with
    :func:`~memplan.torch.checkpointed`, trained with :func:`make_optimizer` of the schedule's
    ``--optimizer`` and ``lr``, each iteration measured by :func:`measure_step`, by default in the
    loop the plan was made for (``budget.gradients``, docs/model.md): ``at-backward``, PyTorch's
    default ``zero_grad()`` (``set_to_none=True``); otherwise a loop that keeps its gradient
    buffers (``set_to_none=False``), the steady state whose static memory counts the gradients
    for the whole step.

    Returns
    -------
    dict
        The document ``memplan run --format json`` prints: ``budget``, ``planned_peak_memory``,
        ``measured_peak_memory`` (the largest over the steps: from the second one on, the
        optimizer state is allocated for the whole iteration, and with ``set_to_none=False``
        the gradients too), ``set_to_none`` (the loop's ``zero_grad``),
        ``measured_step_peaks``, ``measured_over_budget``, ``within_budget``, the activation
        bytes held (the runtime's own count, :class:`~memplan.torch.RuntimeCounters`), forward
        counts, transfers, losses, step times. With ``--optimizer none`` the budget leaves the
        weights and gradients out: the measure is compared with ``budget_measured`` = the budget
        plus the static memory of SGD.
    """
    loop = schedule.budget.loop
    optimizer_name = loop.optimizer.name
    if set_to_none is None:
        set_to_none = loop.gradients != "kept"
    module.train()
    prof = memplan.load_profile(profile)
    chain = chunk_loss(linearize(module, x), x, profile_loss_chunks(prof), prof.model)
    wrapped = checkpointed(chain, schedule, profile=prof, tally=True)  # the bytes held
    optimizer = build_optimizer(loop.optimizer, module.parameters(), lr=lr)
    measured = [measure_step(wrapped, x, optimizer, set_to_none=set_to_none) for _ in range(steps)]
    counters = wrapped.counters
    budget = schedule.budget.memory
    compared = budget
    if optimizer_name == "none" and budget is not None:
        compared = budget + static_bytes(prof, TrainingLoop(Optimizer("sgd")))
    peak = max(m.peak for m in measured)
    n = len(wrapped.names)
    return {
        "model": prof.model,
        "algorithm": schedule.algorithm,
        "device": x.device.type,
        "optimizer": loop.optimizer.text,
        "torch_optimizer": type(optimizer).__name__,
        "set_to_none": set_to_none,
        "steps": steps,
        "budget": budget,
        "budget_measured": compared,
        "planned_peak_memory": schedule.peak_memory,
        "static_memory": schedule.static_memory,
        "measured_peak_memory": peak,
        "measured_step_peaks": [m.peak for m in measured],
        "measured_before_step": [m.before for m in measured],
        "measured_over_budget": None if not compared else peak / compared,
        "measured_over_planned": None if not schedule.peak_memory else peak / schedule.peak_memory,
        "within_budget": compared is None or peak <= compared,
        "measured_what": measured[-1].method,
        "planned_activation_peak": planned_activation_peak(prof, schedule),
        "measured_activation_peak": counters.peak_live_bytes,
        "planned_makespan_ms": schedule.makespan,
        "step_ms": [m.seconds * 1000.0 for m in measured],
        "losses": [m.loss for m in measured],
        "stages": wrapped.names,
        "forwards_planned": wrapped.planned_forward_counts(),
        "forwards_measured": [counters.forward_count(k) for k in range(n)],
        "offloaded_bytes": counters.offloaded_bytes,
        "prefetched_bytes": counters.prefetched_bytes,
        "offloaded_bytes_planned": _planned_offload_bytes(prof, schedule),
    }
