"""What a recomputation of a stage does: the same RNG draws, the buffers updated once.

:func:`recomputing` is the one definition shared by the runtime (:mod:`memplan.torch.runtime.iteration`
runs every later forward of a stage the plan runs more than once inside it, with the RNG state
:func:`rng_snapshot` kept at its first forward) and the profiler (:mod:`memplan.torch.profiler.model`
measures every forward inside it, so that what a recomputation holds is part of the stage's
``forward_overhead``). docs/runtime.md, "What the wrapper does".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from memplan.torch.split.stages import buffer_copies, restore_buffers

__all__ = ["RngSnapshot", "recomputing", "rng_snapshot"]

RngSnapshot = tuple[bytes, "bytes | None"]
"""The CPU generator's state and the CUDA device's (None on CPU), as host bytes."""


def rng_snapshot(device: torch.device) -> RngSnapshot:
    """The RNG state now, kept as host bytes (not as tensors: on CPU they would hold device
    memory for the whole iteration; on CUDA both states are host memory anyway).
    """
    cpu = torch.get_rng_state().numpy().tobytes()
    cuda = torch.cuda.get_rng_state(device).numpy().tobytes() if device.type == "cuda" else None
    return cpu, cuda


def _state_tensor(state: bytes) -> Tensor:
    return torch.frombuffer(bytearray(state), dtype=torch.uint8)


@contextmanager
def recomputing(
    module: nn.Module, snapshot: RngSnapshot | None, device: torch.device
) -> Iterator[None]:
    """Run a recomputation of a stage as the runtime does (docs/runtime.md).

    Inside, the RNG draws what it drew at the stage's first forward (``snapshot``; None: the
    current state), in ``torch.random.fork_rng`` (the global RNG is left as it was); afterwards
    the stage's buffers get back the values they had before (batch-norm running statistics are
    updated once per iteration, as in plain training; only those the stage changed are
    written back, so that a buffer it only read keeps its version counter). What it holds
    while the stage runs (the copies of the buffers, the forked RNG state on CPU) is part of the
    stage's forward overhead: the profiler measures every forward inside this context.
    """
    cuda = device.type == "cuda"
    buffers = buffer_copies([module])
    with torch.random.fork_rng(devices=[device] if cuda else []):
        if snapshot is not None:
            cpu_state, cuda_state = snapshot
            torch.set_rng_state(_state_tensor(cpu_state))
            if cuda_state is not None:
                torch.cuda.set_rng_state(_state_tensor(cuda_state), device)
        try:
            yield
        finally:  # also when the recomputation stops early (NOTE [ A recomputation stops at
            restore_buffers(buffers)  # its last saved tensor ] in runtime/iteration.py)
