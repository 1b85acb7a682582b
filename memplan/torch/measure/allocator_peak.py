"""The peak of a training step from the allocator's own running total, for comparisons.

:func:`allocator_peak` is the meter of :mod:`memplan.torch.compare.training`. It shares no code with the
profiler's probes nor with :func:`memplan.torch.measure.step.measure_step` (which replays the
allocator's events by address): a benchmark that pits memplan against other ways of training
should not measure them with memplan's own bookkeeping.

* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (the caching
  allocator's count of every block handed out).
* CPU: the CPU allocator reports, with every allocation and free made while ``torch.profiler``
  records memory, its running total of the bytes it has handed out (``total_allocated``, kept by
  c10's ``ProfiledCPUMemoryReporter``). The step's peak is the largest of these totals less the
  total just before the step's first event, plus the bytes held when the step starts (the
  distinct storages of the tensors the caller names: weights, buffers, the batch).

Blocks allocated while no profiler recorded memory and freed during the step are not reported to
the reporter: the CPU meter then over-counts from their free on. Give the step a batch copied
under the profiler (:func:`profiled_copy`) and free the gradients before the step
(``zero_grad(set_to_none=True)``): what a step frees is then either made during it or reported.
A block freed on a thread the profiler does not record (gloo's worker threads release the
tensors of the collectives they ran) is not subtracted from the running total either, unless
:func:`count_every_thread` was called first (multi-process steps: FSDP2, DDP over gloo).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from torch import Tensor

from memplan.torch.base.storage import distinct_bytes, tensors_of

__all__ = ["allocator_peak", "count_every_thread", "loop_peaks", "profiled_copy"]

T = TypeVar("T")


def count_every_thread() -> None:
    """Make the CPU allocator's running total count the allocations of every thread.

    c10's reporter keeps its total (and the sizes it subtracts at each free) only while a thread
    records memory, or always under its flag ``caffe2_report_cpu_memory_usage``, which this sets
    (a global of libc10, set once per process, before the tensors to count are allocated).
    Without it, a block freed on another thread (gloo's worker, releasing an all-gather's output)
    stays in the total: the same step measures up to that block more, by the threads' timing.
    """
    import ctypes
    from pathlib import Path

    found = sorted((Path(torch.__file__).parent / "lib").glob("*c10.*"))
    libraries = [p for p in found if p.suffix in (".so", ".dylib", ".dll")]
    if not libraries:
        raise RuntimeError(f"no c10 library in {Path(torch.__file__).parent / 'lib'}")
    library = ctypes.CDLL(str(libraries[0]))
    ctypes.c_bool.in_dll(library, "FLAGS_caffe2_report_cpu_memory_usage").value = True


def _recording() -> torch.profiler.profile:
    import os

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # Kineto's two lines per session, silenced
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    )


def profiled_copy(tensor: Tensor) -> Tensor:
    """A copy of ``tensor`` allocated while the profiler records memory (its free is reported)."""
    with _recording():
        return tensor.clone()


def _allocation_totals(prof: torch.profiler.profile) -> list[tuple[int, int, int]]:
    """(time ns, +/- bytes, running total after it) of every CPU allocation event."""
    from torch._C._profiler import _EventType

    found = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag != _EventType.Allocation:
            continue
        fields = node.extra_fields
        if fields.device.type != "cpu":
            continue
        found.append((int(node.start_time_ns), int(fields.alloc_size), int(fields.total_allocated)))
    found.sort(key=lambda event: event[0])
    return found


def allocator_peak(
    step: Callable[[], T], held: Iterable[Any], device: torch.device
) -> tuple[int, T]:
    """Run ``step`` and return ``(peak bytes, its result)`` by the allocator's own count.

    Parameters
    ----------
    step : callable
        One training step (forward, backward, optimizer step).
    held : iterable of Tensor
        On CPU: what is in memory when the step starts (weights, buffers, gradients and optimizer
        state if any, the batch); each storage counted once. Ignored on CUDA, where the allocator
        counts everything on the device.
    device : torch.device
        Where the step runs.

    The garbage collector runs first: a cycle of tensors left by an earlier step (made while the
    profiler recorded) and collected during this one would lower the CPU allocator's running
    total below the step's start, and the step would measure that much less.
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device)), result
    start = distinct_bytes(held)
    with _recording() as prof:
        result = step()
    events = _allocation_totals(prof)
    if not events:
        return start, result
    _, first_bytes, first_total = events[0]
    before = first_total - first_bytes
    return start + max(0, max(total for _, _, total in events) - before), result


def loop_peaks(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Any],
    loss: Callable[[torch.nn.Module, Any, dict[str, Any]], Tensor],
    *,
    set_to_none: bool = True,
    after: Callable[[], T] | None = None,
) -> list[tuple[int, T | None]]:
    """A user's training loop, each step's peak by the allocator's own count: ``[(peak,
    after())]``.

    Each step: ``optimizer.zero_grad(set_to_none=...)``, ``loss(model, batch, kept).backward()``,
    ``optimizer.step()``, where ``loss`` computes the loss as the user does and may keep what the
    user keeps until the next step in ``kept`` (``kept["out"] = model(x)``). Resident at a step's
    start: the weights and buffers, the gradients kept, the optimizer's state, the batch (copied
    under the profiler, :func:`profiled_copy`) and what was kept from the step before (counted by
    its bytes). The garbage collector runs before each step: a cycle freed during a step (the
    caller's, not the loop's) would lower the allocator's running total. ``after`` is called after
    each step (what memplan planned for it, for a comparison).
    """
    import gc

    kept: dict[str, Any] = {}
    rows: list[tuple[int, T | None]] = []
    for batch in batches:
        optimizer.zero_grad(set_to_none=set_to_none)
        if isinstance(batch, dict):
            copied: Any = {k: profiled_copy(v) for k, v in batch.items()}
            inputs = list(copied.values())
        else:
            copied = tuple(profiled_copy(t) for t in batch)
            inputs = list(copied)
        held: list[Any] = [*model.parameters(), *model.buffers(), *inputs]
        held += [p.grad for p in model.parameters() if p.grad is not None]
        held += [t for state in optimizer.state.values() for t in state.values()]
        before = distinct_bytes(tensors_of(kept))
        gc.collect()

        def step(copied: Any = copied) -> None:
            loss(model, copied, kept).backward()
            optimizer.step()

        peak, _ = allocator_peak(step, held, _device(model))
        rows.append((peak + before, None if after is None else after()))
    return rows


def _device(model: torch.nn.Module) -> torch.device:
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")
