"""A tensor's storage: its identity and size, as the probes and the runtime count tensors."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["StaticStorages", "distinct_bytes", "storage_key", "tensors_of"]


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


def distinct_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages of ``tensors``, each once (non-tensors, ``None`` and
    tensors without real storage skipped): what holding them all holds.
    """
    seen: dict[int, int] = {}
    for tensor in tensors:
        key = storage_key(tensor) if isinstance(tensor, torch.Tensor) else None
        if key is not None:
            seen[key[0]] = key[1]
    return sum(seen.values())


class StaticStorages:
    """The data pointers of some tensors' storages (a module's parameters and buffers), each
    counted for as long as its storage lives at that address.

    The runtime and the probes tell a saved tensor from a weight by its storage's address. A
    module that replaces a buffer during the step (``self.calls = self.calls + 1``) frees the
    old storage, whose address the allocator may give to an activation next: a plain set of
    addresses would take that activation for a weight, and a stage would then save one tensor
    less in one forward than in its recomputation, depending on where the allocator happened
    to put it. Each address is kept with a weak reference to its storage (PyTorch keeps a
    storage's Python object for as long as the storage lives), so it stops counting when the
    storage is freed or resized away from it (FSDP2's unsharded parameters); the storages
    themselves are not kept alive.
    """

    def __init__(self, tensors: Iterable[torch.Tensor] = ()) -> None:
        self._storages: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        for tensor in tensors:
            self.add(tensor)

    def add(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage (nothing for a tensor without real storage)."""
        if storage_key(tensor) is None:
            return
        storage = tensor.untyped_storage()
        self._storages[storage.data_ptr()] = weakref.ref(storage)

    def without(self, pointers: Iterable[int]) -> StaticStorages:
        """These storages but those at ``pointers``."""
        left = StaticStorages()
        dropped = set(pointers)
        left._storages = {p: s for p, s in self._storages.items() if p not in dropped}
        return left

    def __contains__(self, ptr: object) -> bool:
        ref = self._storages.get(ptr) if isinstance(ptr, int) else None
        storage = None if ref is None else ref()
        return storage is not None and storage.data_ptr() == ptr

    def __iter__(self) -> Iterator[int]:
        return (ptr for ptr in list(self._storages) if ptr in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)
