"""Host<->device bandwidth of a profile: the copy the runtime makes when it offloads.

A profile's ``bandwidth`` (bytes/s) is what the offloading and combined algorithms divide the
bytes of a transfer by (Optimal GPU-CPU Offloading Strategies, Euro-Par 2020; assumption C: transferring x_i takes |x_i| / beta). It is
measured on the device that profiles:

* **CUDA**: copies between a pinned host buffer and a device buffer of 256 MiB (capped at a
  quarter of the free device memory), ``non_blocking`` then ``torch.cuda.synchronize``;
* **CPU**: the copy :mod:`memplan.torch.runtime` makes for an ``offload`` and a ``prefetch`` on a
  CPU (its :class:`~memplan.torch.runtime.transfers.Mover`): an offload allocates a host buffer and copies the tensor's storage into it
  (``torch.empty`` + ``copy_``), a prefetch gives the storage its bytes back and copies the data in
  (``resize_`` + ``copy_``). Both allocate fresh memory, so the rate includes the first touch of
  its pages, as every offload of a plan does. The buffer is the largest tensor the plan could move
  (the largest ``saved_size``), clamped to 1-64 MiB.

Either way: one warm-up copy, then the median of ``repeats`` copies in each direction, and the
slower direction's rate. :func:`profile_bandwidth` also says how, in words, for the profile's
``measured.extra.bandwidth``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from memplan.torch.runtime.transfers import Mover, make_stored

__all__ = [
    "CPU_BANDWIDTH_BYTES",
    "CUDA_BANDWIDTH_BYTES",
    "measure_bandwidth",
    "offload_copy_bytes",
    "profile_bandwidth",
]

CUDA_BANDWIDTH_BYTES = 256 * 2**20
"""Bytes of the pinned-memory copies timed on CUDA (capped at a quarter of the free memory)."""

CPU_BANDWIDTH_BYTES = (2**20, 64 * 2**20)
"""Least and most bytes of the runtime's offload copy timed on CPU."""


def offload_copy_bytes(largest_tensor: int) -> int:
    """Bytes of the CPU copy to time: the largest tensor a plan could move, clamped to 1-64 MiB."""
    low, high = CPU_BANDWIDTH_BYTES
    return int(min(high, max(low, largest_tensor)))


def _median_rate(nbytes: int, copy: Callable[[], None], repeats: int) -> float:
    copy()  # warm-up
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        copy()
        times.append(time.perf_counter() - start)
    return nbytes / max(statistics.median(times), 1e-9)


def _pinned_copy_rate(device: torch.device, nbytes: int, repeats: int) -> tuple[float, int]:
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = max(2**20, min(nbytes, free // 4))
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    rates = []
    for src, dst in ((host, dev), (dev, host)):

        def copy(src: torch.Tensor = src, dst: torch.Tensor = dst) -> None:
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(device)

        rates.append(_median_rate(nbytes, copy, repeats))
    del host, dev
    return float(min(rates)), nbytes


def _runtime_copy_rate(device: torch.device, nbytes: int, repeats: int) -> float:
    """The runtime's own offload and prefetch of one ``nbytes`` tensor (its :class:`~memplan.torch.runtime.transfers.Mover`)."""
    tensor = torch.ones(nbytes, dtype=torch.uint8, device=device)
    stored = make_stored("x[0]", tensor, [tensor.untyped_storage()])
    mover = Mover(device, {})
    offload_times, prefetch_times = [], []
    for _ in range(max(1, repeats) + 1):  # the first round warms up
        start = time.perf_counter()
        mover.offload(stored)
        offloaded = time.perf_counter()
        mover.release(stored)
        fetching = time.perf_counter()
        mover.prefetch(stored)
        mover.arrived(stored)
        done = time.perf_counter()
        offload_times.append(offloaded - start)
        prefetch_times.append(done - fetching)
    slower = max(statistics.median(offload_times[1:]), statistics.median(prefetch_times[1:]))
    return nbytes / max(slower, 1e-9)


def measure_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Host<->device bandwidth in bytes/s: the slower direction's median rate (module docstring).

    Parameters
    ----------
    device : torch.device
        ``cuda`` (pinned-memory copies) or ``cpu`` (the runtime's offload copy).
    nbytes : int, optional
        Bytes copied: default 256 MiB on CUDA (capped at a quarter of the free memory), 64 MiB
        on CPU.
    repeats : int
        Timed copies in each direction, after one warm-up copy.
    """
    return profile_bandwidth(device, nbytes, repeats)[0]


def profile_bandwidth(
    device: torch.device, nbytes: int | None = None, repeats: int = 5
) -> tuple[float, str]:
    """:func:`measure_bandwidth` and how it measured, in words (``measured.extra.bandwidth``)."""
    if device.type == "cuda":
        rate, nbytes = _pinned_copy_rate(device, nbytes or CUDA_BANDWIDTH_BYTES, repeats)
        what = f"pinned host <-> device copies of {_mib(nbytes)} (non_blocking)"
    else:
        nbytes = nbytes or CPU_BANDWIDTH_BYTES[1]
        rate = _runtime_copy_rate(device, nbytes, repeats)
        what = (
            f"the runtime's CPU offload copy of {_mib(nbytes)} (memplan.torch.runtime: "
            "torch.empty + copy_ to offload, resize_ + copy_ to prefetch)"
        )
    return float(rate), f"{what}, median of {max(1, repeats)} each way, the slower direction"


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.4g} MiB"
