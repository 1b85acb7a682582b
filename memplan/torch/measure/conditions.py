"""What a profile's sizes depend on, recorded when it is measured and checked where it is used.

The same model and batch allocate different amounts of memory under different conditions: on a
CPU, oneDNN's convolutions take per-thread scratch buffers from PyTorch's allocator (ResNet-18 at
batch 2, 64x64, with oneDNN's AVX2 kernels: 47 MB of temporaries in a ``layer4`` backward on one
thread, 85 MB on two), and the kernels chosen depend on the CPU, ``ATEN_CPU_CAPABILITY``,
``DNNL_MAX_CPU_ISA``, the data type and the torch version. A profile therefore records these
conditions (``measured.conditions``, :func:`current_conditions`), and the commands that train
under a plan compare them with their own (:func:`differences`):

* :func:`training_as_profiled` (``memplan run``): trains on the profile's thread count (the
  intra-op threads are set for the run and restored after it) and reports every other difference
  (those cannot be set: the plan may not hold);
* :func:`check_conditions` (``memplan.torch.fit``, whose training happens later, in the caller's
  loop): warns (:class:`ConditionsWarning`) about every difference, threads included.

docs/profiling.md, "Conditions", has the measured figures.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from memplan.profile.model import Conditions, Profile
from memplan.torch.base.device import cpu_name

__all__ = [
    "KERNEL_VARIABLES",
    "ConditionsWarning",
    "check_conditions",
    "current_conditions",
    "differences",
    "intra_op_threads",
    "recorded_conditions",
    "training_as_profiled",
]

KERNEL_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_DEFAULT_FPMATH_MODE",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
)
"""Environment variables that change which CPU kernels run (recorded when set)."""


class ConditionsWarning(UserWarning):
    """A profile is used under other conditions than it was measured in."""


def _cpu_capability() -> str | None:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # pragma: no cover - old torch
        return None


def current_conditions(device: torch.device, dtype: str | None) -> Conditions:
    """The conditions of a measurement made now, in this process, on ``device`` in ``dtype``."""
    kernels = {name: os.environ[name] for name in KERNEL_VARIABLES if os.environ.get(name)}
    cuda = None
    where = "cpu"
    if device.type == "cuda":
        where = f"cuda: {torch.cuda.get_device_name(device)}"
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        cuda = f"CUDA {torch.version.cuda}" + (f", cuDNN {cudnn}" if cudnn else "")
    return Conditions(
        threads=torch.get_num_threads(),
        cpu=cpu_name(),
        cpu_capability=_cpu_capability(),
        kernels=kernels or None,
        mkldnn=bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
        torch=torch.__version__,
        dtype=dtype,
        device=where,
        cuda=cuda,
    )


def recorded_conditions(prof: Profile) -> Conditions | None:
    """A profile's conditions: ``measured.conditions``, or for a profile made before it was
    recorded, what it says elsewhere (``measured.extra.threads``, ``measured.torch``, ``dtype``,
    ``device``); None for a profile that says nothing (synthetic, hand-written).
    """
    measured = prof.measured
    if measured is not None and measured.conditions is not None:
        return measured.conditions
    if measured is None or prof.device is None or prof.device.kind not in ("cpu", "cuda"):
        return None
    threads = (measured.extra or {}).get("threads")
    where = "cpu" if prof.device.kind == "cpu" else f"cuda: {prof.device.name}"
    return Conditions(
        threads=threads if isinstance(threads, int) and threads > 0 else None,
        cpu=prof.device.name if prof.device.kind == "cpu" else None,
        torch=measured.torch,
        dtype=prof.dtype,
        device=where,
    )


def _describe(field: str, value: Any) -> str:
    if field == "kernels":
        return ", ".join(f"{k}={v}" for k, v in sorted((value or {}).items())) or "no variables"
    return str(value)


_CHECKED = ("device", "cpu", "cpu_capability", "kernels", "mkldnn", "torch", "cuda", "dtype")
_NAMES = {
    "device": "device",
    "cpu": "CPU",
    "cpu_capability": "ATen CPU kernels",
    "kernels": "kernel variables",
    "mkldnn": "oneDNN",
    "torch": "torch",
    "cuda": "CUDA",
    "dtype": "dtype",
}


def differences(prof: Profile, now: Conditions) -> dict[str, tuple[Any, Any]]:
    """``field -> (the profile's, now)`` for every recorded condition that differs.

    Only what both sides know is compared (an old profile without ``cpu_capability`` is not
    said to differ there); ``threads`` only for a profile measured on the CPU (the CPU's
    kernels run on them), ``kernels`` also when only one side sets a variable. Estimated
    profiles (``--estimate``) compare ``torch`` and ``dtype`` only.
    """
    was = recorded_conditions(prof)
    if was is None:
        return {}
    estimated = prof.device is not None and prof.device.kind == "estimated"
    found: dict[str, tuple[Any, Any]] = {}
    fields = ("torch", "dtype") if estimated else _CHECKED
    for name in fields:
        before, after = getattr(was, name), getattr(now, name)
        if name == "kernels":
            if (before or {}) != (after or {}) and was.cpu_capability is not None:
                found[name] = (before, after)
        elif before is not None and after is not None and before != after:
            found[name] = (before, after)
    on_cpu = (was.device or "cpu") == "cpu" and (now.device or "cpu") == "cpu"
    if not estimated and on_cpu and was.threads and now.threads and was.threads != now.threads:
        found["threads"] = (was.threads, now.threads)
    return found


def _sentence(found: dict[str, tuple[Any, Any]]) -> str:
    parts = [
        f"{_NAMES.get(name, name)} {_describe(name, a)} (now {_describe(name, b)})"
        for name, (a, b) in found.items()
    ]
    return "; ".join(parts)


@contextmanager
def intra_op_threads(threads: int | None) -> Iterator[int]:
    """Set torch's intra-op threads for the block (None: leave them); restored after it."""
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextmanager
def training_as_profiled(
    prof: Profile, device: torch.device, say: Callable[[str], None]
) -> Iterator[dict[str, tuple[Any, Any]]]:
    """Train under the conditions ``prof`` was measured in, as far as a process can set them.

    The intra-op threads are set to the profile's (CPU profiles; restored afterwards): a plan
    holds at the thread count it was measured at. Every other difference (CPU, kernels, torch,
    dtype, device) is said through ``say`` in one line: the plan may not hold there. Yields the
    differences found (threads included).
    """
    dtype = prof.dtype
    now = current_conditions(device, dtype)
    found = differences(prof, now)
    threads = found.pop("threads", None)
    if found:
        say(
            f"memplan: warning: the profile was measured under other conditions: "
            f"{_sentence(found)}; its sizes may not hold here (profile the model here instead)"
        )
    if threads is not None:
        say(
            f"memplan: training on {threads[0]} thread(s) as the profile was measured "
            f"(this process had {threads[1]}): the CPU kernels' scratch memory depends on it"
        )
        found["threads"] = threads
    with intra_op_threads(None if threads is None else threads[0]):
        yield found


def check_conditions(prof: Profile, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Warn (:class:`ConditionsWarning`) when ``prof`` was measured under other conditions than
    this process's (threads included: set ``torch.set_num_threads`` to the profile's before
    training). Returns the differences, ``field -> (the profile's, now)``.
    """
    dev = torch.device(device)
    found = differences(prof, current_conditions(dev, prof.dtype))
    if found:
        hint = ""
        if "threads" in found:
            hint = f"; call torch.set_num_threads({found['threads'][0]}) before training"
        warnings.warn(
            f"the profile of {prof.model} was measured under other conditions: "
            f"{_sentence(found)}{hint}",
            ConditionsWarning,
            stacklevel=2,
        )
    return found
