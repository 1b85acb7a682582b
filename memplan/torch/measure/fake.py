"""Sizes and operator counts of a chain's stages from fake tensors: no computation at all.

An estimate (``memplan profile MODEL --estimate GPU``, docs/estimation.md) needs each stage's
sizes and its operators' FLOP and byte counts, not its values. Under PyTorch's
``FakeTensorMode`` every operator computes only the shape, strides, data type and storage of its
result (meta kernels), so a ResNet-50 at batch 64 "runs" forward and backward in about a second
instead of minutes. The stage runs exactly as :func:`memplan.torch.measure.stage.measure_stage`'s
instrumented iteration does (same fresh input copy, same ``saved_tensors_hooks``, same gradient
of ones), with:

* the same definitions of ``output_size``, ``grad_size`` and ``saved_size`` (docs/profiling.md),
  storages told apart by their identity instead of their data pointer (fake storages have none):
  the same numbers, byte for byte (``tests/torch/test_estimate_fake.py`` compares them with a real CPU
  profile's);
* :class:`~memplan.torch.estimate.roofline.OpCounter` around the forward and the backward: the same
  operators as the real run's warm-up iteration, hence the same estimated times;
* ``forward_overhead`` as the profiler defines it: the larger of the forward with autograd and
  without (as ``F_ck`` / ``F_n`` run), plus the copies of the stage's buffers that
  :func:`memplan.torch.runtime.recompute.recomputing` holds; not the forked CPU RNG state a CPU run also
  counts (on a GPU it is host memory);
* ``forward_overhead`` / ``backward_overhead`` from :class:`AllocationTracker`: the storages the
  operators allocate and free, replayed as the CPU probe replays the allocator's events. It sees
  every tensor PyTorch's operators create, but not the buffers a kernel allocates for itself
  (oneDNN's reordered copies of convolution weights on CPU, cuDNN workspaces on CUDA), which
  depend on the machine: NOTE [ fake overheads ].

NOTE [ fake overheads ]
The CPU probe of a real profile counts every allocation of PyTorch's CPU allocator, including
those made inside a kernel: on CPU, oneDNN's blocked copies of the convolution weights (about the
weight bytes of the stage), buffers as large as an activation in convolution backward passes,
the 0-d tensor a Python number becomes (``x * 2``). Those are specific to the CPU's kernels and
say nothing about a GPU. The tracker counts the tensors the operators return, which is what every
device allocates for the stage; a real run gives the same numbers when measured the same way
(:class:`AllocationTracker` on real tensors, checked by the tests), on any machine. On the
built-in models they are at most the CPU profile's (docs/benchmarks.md, "Profiling cost").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from memplan.errors import InputError
from memplan.torch.estimate.roofline import OpCounter
from memplan.torch.measure.probe import CpuProbe
from memplan.torch.measure.runner import StageMeasurement

__all__ = ["OVERHEADS_METHOD", "AllocationTracker", "TensorLevelRun", "storage_id"]

OVERHEADS_METHOD = "tensor allocations of the operators under FakeTensorMode (no kernel buffers)"
"""What ``measured.extra.overheads`` says of a profile whose sizes come from fake tensors."""


def storage_id(tensor: Tensor) -> tuple[int, int]:
    """(identity of the storage, its bytes): fake and real tensors alike."""
    storage = tensor.untyped_storage()
    return storage._cdata, storage.nbytes()


def _tensors(tree: Any) -> list[Tensor]:
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, Tensor)]


class AllocationTracker(TorchDispatchMode):
    """The storages operators allocate and free, in order: ``events`` of (storage, +/-bytes).

    An operator's result whose storage is none of its inputs' is an allocation (views and
    in-place results are not); a storage is freed when no tensor holds it any more (a weak
    reference to it expires), noticed before the next operator runs and at :meth:`mark`.
    ``events[a:b]`` between two marks is the window of one phase, replayed like the CPU probe's
    allocator events (:meth:`memplan.torch.measure.probe.CpuProbe.replay`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.events: list[tuple[int, int]] = []

    def _sweep(self) -> None:
        dead = [key for key, (ref, _) in self.live.items() if ref.expired()]
        for key in dead:
            _, nbytes = self.live.pop(key)
            self.events.append((key, -nbytes))

    def mark(self) -> int:
        """Notice the frees so far; the index of the next event."""
        self._sweep()
        return len(self.events)

    def _allocated(self, tensor: Tensor) -> None:
        storage = tensor.untyped_storage()
        key, nbytes = storage._cdata, storage.nbytes()
        if key in self.live or nbytes == 0:
            return
        self.live[key] = (StorageWeakRef(storage), nbytes)
        self.events.append((key, nbytes))

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self._sweep()
        inputs = {storage_id(t)[0] for t in _tensors((args, kwargs))}
        out = func(*args, **kwargs)
        for tensor in _tensors(out):
            if storage_id(tensor)[0] not in inputs:
                self._allocated(tensor)
        return out


def _replay(events: list[tuple[int, int]], ignore: list[int]) -> int:
    return CpuProbe.replay(events, ignore)


class TensorLevelRun:
    """Runs stages one instrumented iteration each, measured at the tensor level.

    With ``fake`` (the default) the stages run on fake tensors: the parameters and buffers stay
    real and each stage runs through ``torch.func.functional_call`` on their fake copies, so the
    model is left untouched (no gradients, batch-norm statistics unchanged). With
    ``fake=False`` the same measurement runs on the real tensors (the tests compare the two).
    """

    def __init__(self, fake: bool = True) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.mode: Any = FakeTensorMode(allow_non_fake_inputs=True) if fake else None

    def fake(self, tensor: Tensor) -> Tensor:
        """The fake copy of a real tensor (the same one each time, gradients included)."""
        return tensor if self.mode is None else self.mode.from_tensor(tensor)

    def measure_stage(
        self, module: nn.Module, x: Tensor, *, input_grad: bool, counter: OpCounter | None = None
    ) -> Any:
        """One instrumented iteration of ``module`` on the fake input ``x``.

        Returns a :class:`memplan.torch.measure.runner.StageMeasurement` with times 0 and ``output``
        the fake, detached stage output. With ``counter``, the forward and the backward run under
        ``counter.counting("forward")`` and ``counter.counting("backward")``.
        """
        buffers = {name: self.fake(b) for name, b in module.named_buffers()}
        state = {name: self.fake(p) for name, p in module.named_parameters()}
        state.update(buffers)
        static = {storage_id(t)[0] for t in state.values()}
        buffer_bytes = sum(storage_id(b)[1] for b in buffers.values())
        params = [t for name, t in state.items() if isinstance(t, Tensor) and t.requires_grad]
        for p in params:
            p.grad = None
        input_grad = input_grad and x.is_floating_point()
        tracker = AllocationTracker()

        def phase(name: str) -> Any:
            return counter.counting(name) if counter is not None else _nothing()

        with self.mode or _nothing(), tracker:
            leaf = x.detach().requires_grad_(True) if input_grad else None
            inp = leaf.clone() if leaf is not None else x.clone()
            saved: dict[int, int] = {}

            def pack(tensor: Tensor) -> Tensor:
                saved.setdefault(*storage_id(tensor))
                return tensor

            # As F_ck / F_n run (memplan.torch.runtime.recompute.recomputing): without autograd.
            plain_input = x.clone()
            begin = tracker.mark()
            with torch.no_grad():
                plain = torch.func.functional_call(module, state, (plain_input,))
            end = tracker.mark()
            same = storage_id(plain)[0] == storage_id(plain_input)[0]  # a view of its input
            plain_output = 0 if same else storage_id(plain)[1]
            plain_overhead = _replay(tracker.events[begin:end], []) - plain_output
            del plain, plain_input
            begin = tracker.mark()
            with phase("forward"), torch.autograd.graph.saved_tensors_hooks(pack, _identity):
                out = torch.func.functional_call(module, state, (inp,))
            end = tracker.mark()
            if not isinstance(out, Tensor):
                raise InputError(
                    f"stage {type(module).__name__} returns {type(out).__name__}, not a tensor"
                )
            forward_peak = _replay(tracker.events[begin:end], [])
            excluded = static | {storage_id(t)[0] for t in (inp, leaf) if t is not None}
            kept = {key: nbytes for key, nbytes in saved.items() if key not in excluded}
            out_key, output_size = storage_id(out)
            saved_size = sum(kept.values()) + (output_size if out_key not in kept else 0)
            grad_size = out.numel() * out.element_size()
            backward_overhead = 0
            if out.requires_grad:
                grad = torch.ones_like(out)
                begin = tracker.mark()
                with phase("backward"):
                    out.backward(grad)
                end = tracker.mark()
                weight_grads = [storage_id(p.grad)[0] for p in params if p.grad is not None]
                backward_peak = _replay(tracker.events[begin:end], weight_grads)
                input_grad_size = 0
                if leaf is not None and leaf.grad is not None:
                    input_grad_size = storage_id(leaf.grad)[1]
                backward_overhead = max(0, backward_peak - input_grad_size)
        for p in params:
            p.grad = None
        return StageMeasurement(
            forward_time=0.0,
            backward_time=0.0,
            output_size=output_size,
            grad_size=grad_size,
            saved_size=saved_size,
            # the runtime's copies of the buffers, held while a stage (re)computes
            forward_overhead=max(0, forward_peak - saved_size, plain_overhead) + buffer_bytes,
            backward_overhead=backward_overhead,
            output=out.detach(),
        )


def _identity(tensor: Tensor) -> Tensor:
    return tensor


@contextmanager
def _nothing() -> Iterator[None]:
    yield
