"""A tensor's storage: its identity and size, as the probes and the runtime count tensors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["storage_key", "tensors_of"]


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors of a value: itself, or those of a mapping (a dict, a Hugging Face output), a
    tuple or a list, at any depth (a model's output, what a loop keeps of it).
    """
    found: list[torch.Tensor] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
    return found


def storage_key(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of a tensor's storage; None for tensors without real storage (fake
    and meta tensors, tensor subclasses without one).
    """
    try:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    return (ptr, storage.nbytes()) if ptr else None
