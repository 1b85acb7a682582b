"""Which stages of a chain are identical, so that the profiler measures each kind once.

A transformer's blocks, and a ResNet's blocks within a layer after the first, are the same
computation on inputs of the same shape: the same operators on tensors of the same sizes, hence
the same memory and (up to noise) the same times. :func:`stage_signature` is a hashable summary
of everything those depend on: the module tree (classes, ``extra_repr``, training flags, plain
attributes such as a sliding window or a dropout rate), the shapes, data types and strides of
parameters and buffers, which parameters need gradients and which of them the stage counts or
creates the gradient of, and the input's shape, data type and strides. Two stages with the same
signature are measured once (docs/profiling.md, "Identical stages").

Left out: ``layer_idx`` (the position of a Hugging Face block in the stack, used to index a
key-value cache, which training does not use) and the values of tensors. A block whose
*computation* depends on its position through an attribute the signature cannot see, or whose
memory depends on its input's values (mixture-of-experts routing), should be profiled with
``dedupe=False``.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["IGNORED_ATTRIBUTES", "stage_signature"]

IGNORED_ATTRIBUTES = frozenset({"layer_idx", "training"})
"""Module attributes left out of the signature (``training`` is recorded separately)."""

_SIMPLE = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.Size)


def _frozen(value: Any, depth: int = 0) -> Hashable:
    """A hashable stand-in: plain values as they are, tensors by shape, others by type."""
    if isinstance(value, _SIMPLE):
        return value if not isinstance(value, (torch.dtype, torch.device)) else str(value)
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), tuple(value.stride()))
    if isinstance(value, (tuple, list)) and depth < 4:
        return tuple(_frozen(v, depth + 1) for v in value)
    return ("object", type(value).__qualname__)


def _attributes(module: nn.Module) -> tuple[Hashable, ...]:
    found = []
    for name, value in vars(module).items():
        if name in IGNORED_ATTRIBUTES or name in ("_parameters", "_buffers", "_modules"):
            continue
        if name.startswith("_") and not isinstance(value, (tuple, list, *_SIMPLE)):
            continue  # hooks, caches and other machinery
        if isinstance(value, (nn.Module, Tensor)):
            continue  # submodules and parameters are listed on their own
        found.append((name, _frozen(value)))
    return tuple(sorted(found, key=lambda item: item[0]))


def stage_signature(
    module: nn.Module,
    x: Tensor,
    *,
    input_grad: bool,
    counted: Collection[int],
    creates: Collection[int],
) -> Hashable:
    """A hashable summary of what a stage's measurement depends on (module docstring).

    Parameters
    ----------
    module : nn.Module
        The stage.
    x : Tensor
        Its input.
    input_grad : bool
        Whether its backward computes the input's gradient.
    counted : collection of int
        Ids of the parameters whose bytes this stage counts (``weight_size``).
    creates : collection of int
        Ids of the parameters whose gradients its backward creates.
    """
    tree = tuple(
        (
            name,
            type(m).__module__,
            type(m).__qualname__,
            m.extra_repr(),
            m.training,
            _attributes(m),
        )
        for name, m in module.named_modules()
    )
    params = tuple(
        (
            name,
            tuple(p.shape),
            str(p.dtype),
            tuple(p.stride()),
            p.requires_grad,
            id(p) in counted,
            id(p) in creates,
        )
        for name, p in module.named_parameters(remove_duplicate=False)
    )
    buffers = tuple(
        (name, tuple(b.shape), str(b.dtype), tuple(b.stride()))
        for name, b in module.named_buffers(remove_duplicate=False)
    )
    source = (tuple(x.shape), str(x.dtype), tuple(x.stride()), str(x.device), input_grad)
    return (tree, params, buffers, source)
