"""The weights outside every stage: what a model holds that its chain never runs.

NOTE [ weights outside every stage ]
------------------------------------
A multimodal language model trained on text (Gemma-3, GOT-OCR2, ModernVBERT...) holds a vision or
audio tower that a text batch never reaches: its parameters and buffers belong to no stage of the
chain, so no stage's ``weight_size`` counts them, yet they stay in device memory for the whole
step. The backward never reaches them, so their gradients stay None (``zero_grad(
set_to_none=False)`` leaves a None gradient as it is), and every optimizer of ``torch.optim``
skips a parameter without a gradient, for-loop, foreach and fused steps alike: no state, no step
count, no step temporaries. Their bytes are static memory, once, whatever the optimizer and the
loop: the profile records them as ``unreached_weight_size`` (docs/model.md, "Static memory and
budgets"), and the optimizer's order (``parameter_sizes``, the re-solve of NOTE [ the loop seen ])
leaves them out.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from memplan.torch.base.storage import storage_key
from memplan.torch.measure.probe import allocation_bytes

__all__ = ["unreached_bytes", "unreached_tensors"]


def unreached_tensors(model: nn.Module, stages: Iterable[nn.Module]) -> list[Tensor]:
    """The parameters and buffers of ``model`` that none of ``stages`` holds, each storage once.

    A tensor a stage holds (itself, or a view of its storage: a tied weight) is the stage's;
    tensors without a real storage (meta, fake) are left out.
    """
    staged: set[int] = set()
    storages: set[tuple[int, int]] = set()
    for stage in stages:
        for tensor in (*stage.parameters(), *stage.buffers()):
            staged.add(id(tensor))
            key = storage_key(tensor)
            if key is not None:
                storages.add(key)
    found: list[Tensor] = []
    for tensor in (*model.parameters(), *model.buffers()):
        key = storage_key(tensor)
        if id(tensor) in staged or key is None or key in storages:
            continue
        storages.add(key)
        found.append(tensor)
    return found


def unreached_bytes(tensors: Iterable[Tensor], device: torch.device) -> int:
    """Bytes the device's allocator holds for ``tensors`` (:func:`unreached_tensors`'s)."""
    total = 0
    for tensor in tensors:
        key = storage_key(tensor)
        total += allocation_bytes(key[1] if key is not None else 0, device)
    return total
