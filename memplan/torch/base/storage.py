"""A tensor's storage: its identity and size, as the probes and the runtime count tensors."""

from __future__ import annotations

import torch

__all__ = ["storage_key"]


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
