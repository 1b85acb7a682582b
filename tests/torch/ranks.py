"""Several ranks of a gloo process group on CPU, one process each, as the multi-rank tests run
them (DDP, FSDP2, pipelines): :func:`run_ranks` starts a worker script once per rank and checks
that every rank ended well; a worker runs its rank with :func:`gloo_rank`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from tests.paths import ROOT

T = TypeVar("T")


def free_port() -> int:
    """A TCP port free on this machine now (the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    script: Path, world: int, args: Callable[[int], Sequence[str]], timeout: float = 300
) -> None:
    """Run ``python SCRIPT RANK *args(rank)`` for every rank at once and wait for them all.

    The workers import memplan and ``tests`` from this checkout; a rank that fails (or outlives
    ``timeout`` seconds) fails the test with the end of its output.
    """
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), *map(str, args(rank))],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        for rank in range(world)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    failed = [
        f"rank {rank} (exit {proc.returncode}): {log[-3000:]}"
        for rank, (proc, log) in enumerate(zip(procs, logs, strict=True))
        if proc.returncode != 0
    ]
    # a rank that crashed first, not one that lost its peer ("Connection closed by peer")
    failed.sort(key=lambda text: "Connection closed by peer" in text)
    assert not failed, failed[0]


def gloo_rank(rank: int, world: int, port: str, run: Callable[[], T]) -> T:
    """Join the gloo process group as ``rank`` of ``world`` (one torch thread), ``run()``, leave.

    Called by a worker script in a process of its own.
    """
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        return run()
    finally:
        dist.destroy_process_group()
