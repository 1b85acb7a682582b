"""The allocator's peak while a function runs: the memory probes of the profiler.

Temporary memory (``forward_overhead``, ``backward_overhead``) is what the device's allocator
allocates beyond what a stage keeps, so the profiler asks the allocator, not its own count of
tensors (docs/profiling.md):

* :class:`CpuProbe` replays the CPU allocator's events that ``torch.profiler`` records with
  ``profile_memory=True`` (:meth:`CpuProbe.events`, :meth:`CpuProbe.replay`); the whole-step
  measure of :mod:`memplan.torch.measure.step` and the fake-tensor tracker of :mod:`memplan.torch.measure.fake`
  use the same reading and replay;
* :class:`CudaProbe` reads ``torch.cuda.max_memory_allocated`` around the call;
* :func:`allocation_bytes` is the size the allocator counts for a block (CUDA rounds every block
  up to :data:`CUDA_BLOCK` bytes);
* :func:`memplan.torch.base.storage.storage_key` names the storage a tensor holds (shared by views), for counting it once.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

__all__ = [
    "CUDA_BLOCK",
    "CpuProbe",
    "CudaProbe",
    "MemoryProbe",
    "allocation_bytes",
]

CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block up to this


class MemoryProbe:
    """Peak of the bytes allocated while ``fn`` runs, relative to the start.

    ``ignore`` (called after ``fn``) maps the storage pointers to the sizes of the tensors that
    ``fn`` allocated and that are not temporary (the weight gradients, static memory): they are
    left out of the peak.
    """

    method = ""

    def peak(self, fn: Callable[[], object], ignore: Callable[[], dict[int, int]]) -> int:
        raise NotImplementedError


class CpuProbe(MemoryProbe):
    """``torch.profiler`` allocator events (``profile_memory=True``), replayed in order."""

    method = "torch.profiler memory events"

    @staticmethod
    def quiet() -> None:
        """Kineto logs two lines per session on stderr, below every log level but the highest;
        the variable is read when the profiler first starts in the process.
        """
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")

    def peak(self, fn: Callable[[], object], ignore: Callable[[], dict[int, int]]) -> int:
        self.quiet()
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
            fn()
        return self.replay(self.events(prof), ignore())

    @staticmethod
    def events(prof: torch.profiler.profile) -> list[tuple[int, int]]:
        """(address, +bytes or -bytes) of every CPU allocation and free, in time order."""
        with tempfile.TemporaryDirectory(prefix="memplan-") as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            trace = json.loads(path.read_text(encoding="utf-8"))
        events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
        memory = []
        for event in events:
            args = event.get("args") or {}
            if event.get("name") != "[memory]" or args.get("Device Type", 0) != 0:
                continue
            order = (float(event.get("ts", 0.0)), int(args.get("Ev Idx", 0)))
            memory.append((order, int(args.get("Addr", 0)), int(args.get("Bytes", 0))))
        memory.sort(key=lambda item: item[0])
        return [(addr, nbytes) for _, addr, nbytes in memory]

    @staticmethod
    def replay(events: list[tuple[int, int]], ignore: Iterable[int]) -> int:
        """Peak of the running total of ``events`` (in order), leaving out the allocations at the
        ``ignore`` addresses that are still live at the end (not temporary).
        """
        live: dict[int, int] = {}  # address -> index of the allocation still live
        for i, (addr, nbytes) in enumerate(events):
            if nbytes > 0:
                live[addr] = i
            else:
                live.pop(addr, None)
        skipped = {live[addr] for addr in ignore if addr in live}
        total = peak = 0
        for i, (_, nbytes) in enumerate(events):
            if i not in skipped:
                total += nbytes
                peak = max(peak, total)
        return peak


class CudaProbe(MemoryProbe):
    """``torch.cuda.max_memory_allocated`` around the call, minus the ignored storages.

    All the ignored storages are subtracted from the peak, even those allocated after it: an
    underestimate when the weight gradients are not all allocated by the time of the peak.
    """

    method = "torch.cuda.max_memory_allocated"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def peak(self, fn: Callable[[], object], ignore: Callable[[], dict[int, int]]) -> int:
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        fn()
        torch.cuda.synchronize(self.device)
        peak = int(torch.cuda.max_memory_allocated(self.device)) - int(base)
        return max(0, peak - sum(ignore().values()))


def allocation_bytes(nbytes: int, device: torch.device) -> int:
    """Bytes the device's allocator counts for a block of ``nbytes``.

    CUDA's caching allocator rounds every block up to a multiple of 512 bytes (what
    ``torch.cuda.max_memory_allocated`` counts); the CPU allocator's events give the bytes asked
    for (docs/runtime.md, the table of terms).
    """
    if nbytes <= 0 or device.type != "cuda":
        return max(0, nbytes)
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
