"""Running the stages of a cut: eval mode, one floating-point tensor per stage, outputs compared.

The checks that every cut of :mod:`memplan.torch.split` makes (:mod:`~memplan.torch.split.linearize`
for the fixed architectures, :mod:`~memplan.torch.split.repeated` while it searches).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError

__all__ = [
    "BufferCopy",
    "buffer_copies",
    "eval_mode",
    "first_line",
    "output_mismatch",
    "outputs_match",
    "restore_buffers",
    "run_stages",
    "train_mode",
]


@contextmanager
def eval_mode(*modules: nn.Module) -> Iterator[None]:
    """Put modules in eval mode and restore each submodule's own training flag afterwards."""
    flags = [(m, m.training) for module in modules for m in module.modules()]
    try:
        for module in modules:
            module.eval()
        yield
    finally:
        for m, training in flags:
            m.training = training


@contextmanager
def train_mode(*modules: nn.Module) -> Iterator[None]:
    """Put modules in training mode; restore each submodule's training flag and the buffers the
    forward changes (batch-norm statistics) afterwards.
    """
    flags = [(m, m.training) for module in modules for m in module.modules()]
    buffers = buffer_copies(list(modules))
    try:
        for module in modules:
            module.train()
        yield
    finally:
        for m, training in flags:
            m.training = training
        restore_buffers(buffers)


def _writable(tensor: Tensor) -> bool:
    """Whether an in-place write can change ``tensor``: not when elements share memory (an
    expanded attention mask, stride 0), which PyTorch refuses to write in place, so that the
    model cannot have changed it either.
    """
    return bool(torch._debug_has_internal_overlap(tensor) != 1)  # 1: MemOverlap::Yes


BufferCopy = tuple[nn.Module, str, Tensor, int, Tensor]
"""A buffer's module, name, tensor, version counter and a copy of its value
(:func:`buffer_copies`)."""


def buffer_copies(modules: list[nn.Module]) -> list[BufferCopy]:
    """A copy of every distinct buffer of ``modules`` that the forward can change (batch-norm
    running statistics, I-BERT's observed ranges), for :func:`restore_buffers`.
    """
    seen: set[int] = set()
    found = []
    for module in modules:
        for owner in module.modules():
            for name, buffer in owner._buffers.items():
                if buffer is not None and id(buffer) not in seen and _writable(buffer):
                    seen.add(id(buffer))
                    found.append((owner, name, buffer, buffer._version, buffer.detach().clone()))
    return found


def restore_buffers(copies: list[BufferCopy]) -> None:
    """Give each buffer of :func:`buffer_copies` back the value it had: in place, or as the
    module's buffer again where the forward put another tensor in its place (``self.x_min =
    x.min()``). A buffer the forward only read (a mask, rotary tables shared by the blocks) is
    not written: it keeps its version counter, which autograd checks where another stage saved
    it; one it changed (batch-norm statistics, which the kernel writes without bumping the
    version) is.
    """
    with torch.no_grad():
        for owner, name, buffer, version, value in copies:
            if owner._buffers.get(name) is buffer:
                if buffer._version != version or not torch.equal(buffer, value):
                    buffer.copy_(value)
            else:
                owner._buffers[name] = value


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# torch.testing.assert_close's default tolerances (rtol, atol) per dtype. assert_close itself is
# not called: its first call imports torch.distributed.tensor, 1-2 s of every `memplan profile`,
# for the same test that torch.allclose makes with these tolerances.
_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def outputs_match(actual: Tensor, expected: Tensor) -> bool:
    """Whether ``actual`` equals ``expected`` as ``torch.testing.assert_close`` judges it by
    default (same dtype and shape, ``|a - e| <= atol + rtol * |e|``, NaN equal to NaN).
    """
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    rtol, atol = _TOLERANCES.get(expected.dtype, _TOLERANCES[torch.float32])
    return bool(torch.allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True))


def output_mismatch(kind: str, actual: Tensor, expected: Any) -> InputError | None:
    """Why a chain whose output is ``actual`` is not the model ``kind`` whose output is
    ``expected`` (another shape, or values :func:`outputs_match` does not accept), or None.
    """
    if not isinstance(expected, Tensor) or expected.shape != actual.shape:
        shape = tuple(expected.shape) if isinstance(expected, Tensor) else type(expected)
        return InputError(
            f"cannot linearize {kind}: the chain's output {tuple(actual.shape)} differs from "
            f"the model's {shape}"
        )
    if not outputs_match(actual, expected):
        diff = (actual.double() - expected.double()).abs().max().item()
        return InputError(
            f"cannot linearize {kind}: the chain does not reproduce the model's output "
            f"(max abs difference {diff:.3g})"
        )
    return None


def run_stages(
    kind: str,
    stages: list[tuple[str, nn.Module]],
    x: Tensor,
    inplace: list[bool] | None = None,
) -> Tensor:
    """Run ``stages`` one after the other on ``x`` (the caller sets eval mode and no_grad); each
    must return one floating-point tensor, else an :class:`InputError` names the stage. With
    ``inplace``, append for each stage whether it modified its input in place (its version
    counter moved).
    """
    for name, module in stages:
        version = x._version
        try:
            out = module(x)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise InputError(
                f"cannot linearize {kind}: stage {name!r} failed: {first_line(exc)}"
            ) from None
        if inplace is not None:
            inplace.append(x._version != version)
        x = out
        if not isinstance(x, Tensor) or not x.is_floating_point():
            what = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise InputError(
                f"cannot linearize {kind}: stage {name!r} returns {what}; every stage must "
                "return one floating-point tensor"
            )
    return x
