"""Profiling join networks (Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans.
R. Soc. A 2020): each branch measured as a chain, the turn as one stage.

The join networks themselves (the bundled ones, the factory protocol) are in
:mod:`memplan.torch.models.join`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import torch
from torch import Tensor, nn

import memplan
from memplan.errors import InputError
from memplan.profile.model import Branch, Measured, Profile, Stage
from memplan.torch.base.device import describe_device, resolve_device
from memplan.torch.measure.runner import DTYPES, storage_bytes
from memplan.torch.measure.stage import measure_stage
from memplan.torch.profiler.chain import profile_chain
from memplan.torch.split.linearize import Chain, split_model


class _Turn(nn.Module):
    """The turn as one stage of one tensor: the flattened branch outputs, concatenated."""

    def __init__(self, turn: nn.Module, shapes: list[torch.Size]) -> None:
        super().__init__()
        self.turn = turn
        self.shapes = shapes

    def forward(self, flat: Tensor) -> Tensor:
        parts, start = [], 0
        for shape in self.shapes:
            n = int(torch.Size(shape).numel())
            parts.append(flat[start : start + n].view(shape))
            start += n
        return self.turn(*parts)


def _check(join: Any) -> list[tuple[str, nn.Module, Tensor]]:
    branches = list(getattr(join, "branches", []))
    if not branches or not isinstance(getattr(join, "turn", None), nn.Module):
        raise InputError(
            "join model: expected 'branches' (name, module, input) and a 'turn' module"
        )
    for item in branches:
        ok = isinstance(item, tuple) and len(item) == 3
        if not ok or not isinstance(item[1], nn.Module) or not isinstance(item[2], Tensor):
            raise InputError("join model: each branch must be (name, nn.Module, example input)")
    return branches


def profile_join(
    join: Any,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    repeats: int = 5,
    progress: Callable[[str, int, int], None] | None = None,
    name: str | None = None,
) -> Profile:
    """Measure every branch stage and the turn of a join network: a ``branches`` + ``turn`` profile.

    Each branch is cut into stages (:func:`memplan.torch.split.linearize.split_model`) and measured as a
    chain by :func:`memplan.torch.profiler.chain.profile_chain` (times, output, saved and temporary
    sizes); the turn is measured as one stage reading the branch outputs (flattened and
    concatenated: a view per branch, so no extra bytes are saved).
    """
    if dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    branches = _check(join)
    dev = resolve_device(device)
    torch_dtype = DTYPES[dtype]
    total = sum(len(split_model(module)) for _, module, _ in branches) + 1
    done = 0
    counted: set[int] = set()
    profiled: list[Branch] = []
    outputs: list[Tensor] = []

    def step(stage: str, *_: Any) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(stage, done, total)

    for branch_name, module, x in branches:
        module.to(device=dev, dtype=torch_dtype)
        x = x.to(device=dev, dtype=torch_dtype) if x.is_floating_point() else x.to(device=dev)
        chain = Chain(split_model(module))
        stages = profile_chain(chain, x, repeats=repeats, progress=step)
        fixed = []
        for (_, stage_module), st in zip(chain.stages, stages, strict=True):
            params = [p for p in stage_module.parameters() if id(p) not in counted]
            counted.update(id(p) for p in stage_module.parameters())
            weight = sum(p.numel() * p.element_size() for p in params)
            fixed.append(st.model_copy(update={"weight_size": weight}))
        with torch.no_grad():
            module.train()
            out = chain.forward(x)
        outputs.append(out.detach())
        profiled.append(Branch(name=branch_name, input_size=storage_bytes(x), stages=fixed))
    turn_module = join.turn.to(device=dev, dtype=torch_dtype)
    flat = torch.cat([o.reshape(-1) for o in outputs])
    m = measure_stage(
        _Turn(turn_module, [o.shape for o in outputs]), flat, input_grad=True, repeats=repeats
    )
    turn = Stage(
        name="turn",
        forward_time=m.forward_time,
        backward_time=m.backward_time,
        output_size=m.output_size,
        saved_size=m.saved_size,
        forward_overhead=m.forward_overhead,
        backward_overhead=m.backward_overhead,
        weight_size=sum(p.numel() * p.element_size() for p in turn_module.parameters()),
    )
    step("turn")
    first = branches[0][2]
    return Profile(
        model=name or getattr(join, "name", None) or type(join).__name__.lower(),
        batch_size=int(first.shape[0]) if first.dim() > 0 else None,
        dtype=dtype,
        device=describe_device(dev),
        measured=Measured(
            tool=f"memplan {memplan.__version__}",
            torch=torch.__version__,
            date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            repeats=repeats,
            extra={
                "threads": torch.get_num_threads(),
                "inputs": {n: list(x.shape) for n, _, x in branches},
            },
        ),
        branches=profiled,
        turn=turn,
    )
