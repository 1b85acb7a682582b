"""The runtime's offload copy engine: moves stored tensors between device and host memory.

:class:`Mover` carries out the plan's ``offload`` and ``prefetch`` operations for
:mod:`memplan.torch.runtime.iteration` (and :mod:`memplan.torch.measure.bandwidth` times it, as the CPU profile's
bandwidth): each storage of a stored tensor (:class:`Stored`, ``x[k]`` or ``s[k]``) is copied whole
to a host buffer and resized to 0 bytes (freed, every tensor on it stays valid); a prefetch resizes
it back and copies the data in. On CUDA the host buffers are pinned, the copies run on a side
stream and events order the streams (docs/runtime.md, "CUDA"); on CPU every copy is synchronous.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch
from torch import Tensor

__all__ = [
    "GPU",
    "HOST",
    "LEAVING",
    "OFFLOADING",
    "PREFETCHING",
    "RESIDENT",
    "Mover",
    "Stored",
    "as_bytes",
    "make_stored",
]

# Places of a stored tensor during an iteration (docs/combined.md, table "place").
GPU, OFFLOADING, LEAVING, HOST, PREFETCHING = "gpu", "offloading", "leaving", "host", "prefetching"
RESIDENT = (GPU, OFFLOADING, LEAVING)  # the data are in device memory


def as_bytes(storage: torch.UntypedStorage) -> Tensor:
    """A flat ``uint8`` tensor over a whole storage (no copy)."""
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return flat.set_(storage, 0, (storage.nbytes(),), (1,))


@dataclass(eq=False)
class Stored:
    """A stored tensor of the plan, ``x[k]`` or ``s[k]``, and where its data are.

    ``storages`` are the device storages the runtime holds for it (``s[k]``: what autograd saved,
    without the stage input, parameters and buffers, and the output when the runtime keeps it;
    ``x[k]``: the tensor's storage). An offload copies them to host buffers and resizes them to
    0 bytes (the memory is freed, every tensor and autograd saved tensor on them stays valid); a
    prefetch resizes them back and copies the data in. ``ready`` (CUDA) is the event after which
    the data are in device memory. ``counted`` are the bytes the plan counts for it that the
    runtime does not hold (an output that neither autograd nor a later recomputation needs:
    freed as in plain training, counted as the plan counts it).

    ``B k`` hands ``s[k]`` over to autograd (:meth:`hand_over`): the runtime drops its references to
    the storages, so that the backward frees each saved tensor as soon as its node has run, as
    in plain training and as the profiler measured ``backward_overhead`` (docs/runtime.md, "What
    the wrapper does"). ``handed`` keeps their pointers and sizes for the counters, which follow
    the plan (``s[k]`` counts until the end of ``B k``).
    """

    name: str
    tensor: Tensor | None  # x[k]: the activation; s[k]: the output x[k+1]; None: not held
    storages: list[torch.UntypedStorage]
    sizes: list[int]
    counted: int = 0
    version: int = 0  # the tensor's version counter when stored (an in-place change shows)
    place: str = GPU
    host: list[Tensor] = field(default_factory=list)
    ready: Any = None
    handed: list[tuple[int, int]] = field(default_factory=list)

    def hand_over(self) -> None:
        """Drop the references to the storages (autograd frees them during the backward)."""
        self.handed = [(s.data_ptr(), s.nbytes()) for s in self.storages]
        if self.counted:
            self.handed.append((0, self.counted))
        self.storages = []
        self.sizes = []
        self.tensor = None


def make_stored(
    name: str,
    tensor: Tensor | None,
    owned: Sequence[torch.UntypedStorage],
    counted: int = 0,
    **kw: Any,
) -> Stored:
    """A :class:`Stored` over the non-empty storages of ``owned`` (their sizes now)."""
    storages = [s for s in owned if s.nbytes() > 0]
    version = tensor._version if tensor is not None else 0
    return Stored(name, tensor, storages, [s.nbytes() for s in storages], counted, version, **kw)


class Mover:
    """Moves stored tensors between device and host memory, for CPU and CUDA alike.

    One code path: each storage of the tensor is copied whole to a host buffer and resized to
    0 bytes (freed); a prefetch resizes it back and copies the data in. On CUDA (only there) the
    host buffers are pinned, the copies are non-blocking on a side stream, and events order the
    streams (docs/runtime.md, "CUDA"):

    * an offload waits (side stream) for the event recorded after the computation that produced
      the tensor, and ``record_stream(side)`` keeps the caching allocator from reusing the device
      block before the copy has read it, although the block is freed (``resize_(0)``) at the
      plan's offload end, host-side;
    * a prefetch allocates (``resize_``) and copies on the side stream and records an event; at
      the plan's prefetch end the compute stream waits for that event, and ``record_stream``
      marks the block as used by the compute stream (it was allocated on the side stream);
    * at the end of the iteration the compute stream waits for the side stream.

    On CPU every copy is synchronous and there are no streams or events.
    """

    def __init__(self, device: torch.device, streams: dict[Any, Any]) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        # One side stream per device for the wrapped module's lifetime (``streams``, its cache).
        if self.cuda and device not in streams:
            streams[device] = torch.cuda.Stream(device)
        self.side = streams.get(device)

    @property
    def compute(self) -> Any:
        """The stream the computations run on (the current one: autograd runs the backward on
        the stream of the forward).
        """
        return torch.cuda.current_stream(self.device)

    def _host_buffer(self, nbytes: int) -> Tensor:
        """A host buffer: pinned on CUDA. On CPU, memory numpy allocates: the copy is real, and
        it lives outside torch's CPU allocator, which stands for the device's (the allocator
        measure of :func:`memplan.torch.measure_step` does not count it, as the CUDA
        allocator does not count pinned host memory).
        """
        if self.cuda:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return torch.from_numpy(numpy.empty(nbytes, dtype=numpy.uint8))

    def _on_side(self) -> Any:
        return torch.cuda.stream(self.side) if self.cuda else nullcontext()

    def produced(self) -> Any:
        """CUDA: an event after the work issued so far on the compute stream. CPU: None."""
        return self.compute.record_event() if self.cuda else None

    def offload(self, stored: Stored) -> int:
        """Start copying ``stored`` to host memory; returns the bytes copied."""
        if self.cuda and stored.ready is not None:
            self.side.wait_event(stored.ready)
        hosts = []
        with self._on_side(), torch.no_grad():
            for storage, nbytes in zip(stored.storages, stored.sizes, strict=True):
                host = self._host_buffer(nbytes)
                view = as_bytes(storage)
                host.copy_(view, non_blocking=self.cuda)
                if self.cuda:
                    view.record_stream(self.side)
                hosts.append(host)
        stored.host = hosts
        return sum(stored.sizes)

    def release(self, stored: Stored) -> None:
        """End of an offload: free the device copy (the tensors on it stay valid, empty)."""
        for storage in stored.storages:
            storage.resize_(0)

    def prefetch(self, stored: Stored) -> int:
        """Start copying ``stored`` back to device memory; returns the bytes copied."""
        with self._on_side(), torch.no_grad():
            for storage, nbytes, host in zip(
                stored.storages, stored.sizes, stored.host, strict=True
            ):
                storage.resize_(nbytes)
                as_bytes(storage).copy_(host, non_blocking=self.cuda)
            if self.cuda:
                stored.ready = self.side.record_event()
        # CUDA: the pinned host allocator keeps the buffers until the copies that read them end.
        stored.host = []
        return sum(stored.sizes)

    def arrived(self, stored: Stored) -> None:
        """End of a prefetch: later computations see the data."""
        if self.cuda:
            compute = self.compute
            compute.wait_event(stored.ready)
            for storage in stored.storages:
                as_bytes(storage).record_stream(compute)

    def restore(self, stored: Stored) -> None:
        """Bring a tensor back to device memory whatever its transfers (after an error)."""
        if stored.host and any(s.nbytes() == 0 for s in stored.storages):
            self.prefetch(stored)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        stored.place = GPU

    def finish(self) -> None:
        """End of the iteration: later work on the compute stream follows every transfer."""
        if self.cuda:
            self.compute.wait_stream(self.side)
