"""The device a profile is measured on: ``--device`` resolved, and the profile's ``device:`` block.

:func:`resolve_device` turns ``auto``/``cpu``/``cuda[:N]`` into a ``torch.device`` (an
``InputError`` naming the option otherwise); :func:`describe_device` gives the device's name and
memory (the GPU's properties, or the CPU's model name and physical memory). Used by the profiler,
the join profiler and ``memplan run``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from memplan.errors import InputError
from memplan.profile.model import Device

__all__ = ["cpu_name", "describe_device", "resolve_device"]


def resolve_device(device: str) -> torch.device:
    """``--device``: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.

    Raises
    ------
    InputError
        Another device type, or CUDA asked for where none is available.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise InputError(f"--device {device!r}: expected auto, cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise InputError(f"--device {device!r}: expected auto, cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA device available (use --device cpu)")
    return dev


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cpu_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def describe_device(device: torch.device) -> Device:
    """The ``device:`` block of a profile measured on ``device``."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return Device(kind="cuda", name=props.name, memory=int(props.total_memory))
    return Device(kind="cpu", name=cpu_name(), memory=_cpu_memory())
