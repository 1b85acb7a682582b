"""Selective checkpointing policies: what an ``F_all`` under an option keeps of its stage.

A stage's ``F_all`` may run under an option (docs/model.md, "Options of a stage"): PyTorch's
selective activation checkpointing (``torch.utils.checkpoint.create_selective_checkpoint_contexts``)
with one of the policies below, decided per ATen operator. The first forward of the stage keeps
the outputs of the operators the policy saves (in the contexts' cache) and none of what autograd
saves; when the backward reaches the stage, its forward runs again under the recomputation
context, which takes the saved outputs from the cache instead of computing them, and fills what
autograd saved. The stage then saves less (the cache and its output) and its backward takes the
recomputation's time; the recomputed tensors live during its backward.

Option ``i >= 1`` of a profile measured by memplan is :data:`POLICIES` ``[i - 1]`` (the profiler
measures each, in this order); the runtime reads the option's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from memplan.torch.base.storage import storage_key

__all__ = ["POLICIES", "cached_storages", "contexts", "policy_of"]

_aten = torch.ops.aten
_MATMULS = (
    _aten.mm.default,
    _aten.bmm.default,
    _aten.addmm.default,
    _aten.baddbmm.default,
    _aten.convolution.default,
)
_ATTENTION = tuple(
    getattr(_aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(_aten, name)
)

POLICIES: dict[str, frozenset[Any]] = {
    "save-matmuls": frozenset(_MATMULS + _ATTENTION),
    "save-projections": frozenset(_MATMULS),
}
"""Each policy's saved operators, in option order: the outputs of the compute-heavy operators
(matrix products, convolutions, attention), everything else recomputed (pointwise, norms,
softmax, dropout); then the same but attention recomputed too."""


def policy_of(name: str) -> Callable[..., CheckpointPolicy]:
    """The SAC policy function of :data:`POLICIES` ``[name]``."""
    saved = POLICIES[name]

    def policy(_ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> CheckpointPolicy:
        if op in saved:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def contexts(name: str) -> tuple[Any, Any]:
    """``(forward, recompute)`` contexts of one selective stage run under policy ``name``."""
    return create_selective_checkpoint_contexts(policy_of(name))


def cached_storages(forward: Any) -> dict[int, torch.UntypedStorage]:
    """The storages the forward context's cache holds (the policy's saved outputs), by pointer."""
    found: dict[int, torch.UntypedStorage] = {}

    def visit(item: Any) -> None:
        if isinstance(item, dict):
            for value in item.values():
                visit(value)
        elif isinstance(item, list | tuple):
            for value in item:
                visit(value)
        else:
            tensor = getattr(item, "val", None)
            if isinstance(tensor, torch.Tensor):
                key = storage_key(tensor)
                if key is not None:
                    found.setdefault(key[0], tensor.untyped_storage())

    visit(getattr(forward, "storage", {}))
    return found
