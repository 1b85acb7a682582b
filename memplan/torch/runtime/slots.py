"""What autograd holds for a stage whose forward dropped its saved tensors, and what a
recomputation of the stage re-enters (NOTE [ Planned iteration ] in
:mod:`memplan.torch.runtime.iteration`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from memplan.torch.runtime.plan import StageFunction
from memplan.torch.runtime.recompute import RngSnapshot
from memplan.torch.runtime.selective import contexts


class Slot:
    """What autograd holds, in place of a saved tensor, for a stage whose forward dropped it:
    the recomputation of the stage (``F_all``) puts the tensor back (NOTE [ Planned
    iteration ]).
    """

    __slots__ = ("stage", "value", "__weakref__")

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.value: Tensor | None = None


def unpack_slot(packed: Any) -> Any:
    if not isinstance(packed, Slot):
        return packed
    value = packed.value
    if value is None:
        k = packed.stage
        raise RuntimeError(
            f"B {k}: a tensor stage {k} saved for its backward was not recomputed (the plan "
            "runs no F_all on it before B, or the graph is used twice: memplan's plans are for "
            "one backward per forward)"
        )
    packed.value = None  # autograd holds it while its node runs, as in plain training
    return value


def autocast_state(device: torch.device) -> list[tuple[str, bool, torch.dtype, bool]]:
    """Autocast of the device type and of the CPU now (what a recomputation re-enters)."""
    kinds = [device.type] if device.type == "cpu" else [device.type, "cpu"]
    cache = torch.is_autocast_cache_enabled()
    return [
        (kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind), cache)
        for kind in kinds
    ]


@dataclass
class StageRun:
    """What the first forward of a stage left for the recomputations of its iteration."""

    function: StageFunction | None = None
    module: nn.Module | None = None
    requires_grad: bool = False
    autocast: list[tuple[str, bool, torch.dtype, bool]] = field(default_factory=list)
    rng: RngSnapshot | None = None
    slots: list[weakref.ref[Slot]] = field(default_factory=list)
    """The slots of the first forward, in the order autograd packed them, held weakly: a slot
    whose node autograd let go (a branch of the forward nothing reads) is gone by the
    recomputation, which then keeps nothing for it."""
    recompute: Any = None  # a selective stage: the SAC context that replays its forward
    last_saved: weakref.ref[torch.UntypedStorage] | None = None
    """The storage of the last tensor the first forward saved, held weakly (NOTE [ A
    recomputation stops at its last saved tensor ] in :mod:`memplan.torch.runtime.iteration`):
    its address alone could be a freed one the output took."""
    output_bytes: int = 0
    """The bytes of the first forward's output that ``s[k]`` counts besides its saved tensors:
    what the counters count for the output a recomputation that stops early does not make."""


class SelectiveForward:
    """A forward of a stage under a selective policy: autograd's saved tensors go to ``pack``
    (the slots), the policy's outputs to the SAC cache, whose recomputation context the stage's
    run keeps (:mod:`memplan.torch.runtime.selective`).
    """

    def __init__(self, policy: str, pack: Callable[[Tensor], Any], run: StageRun) -> None:
        self.caching, recompute = contexts(policy)
        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack_slot)
        run.recompute = SelectiveRecompute(self.caching, recompute)

    def __enter__(self) -> None:
        self.hooks.__enter__()
        self.caching.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.caching.__exit__(*exc)
        self.hooks.__exit__(*exc)


@dataclass
class SelectiveRecompute:
    """The two SAC contexts of a selective stage's iteration: the cache is the first's."""

    forward: Any
    recompute: Any
