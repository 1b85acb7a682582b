"""A parameter two stages share: how autograd sums its two gradients, for the profiler.

NOTE [ a gradient a later stage made ]
--------------------------------------
A parameter a stage shares with a later stage (a language model's token embedding, tied to its
head) has one gradient node in the model's graph. The later stage's backward runs first: its
gradient for the parameter waits in that node's input buffer, and when the earlier stage's
gradient arrives autograd adds the two. In place into the waiting gradient when it can reuse it
(a tensor of its own that nothing else references: memplan's chunked head returns one), out of
place otherwise: a tied ``nn.Linear`` head's gradient is a view (GPT-2's and BERT's heads,
measured with the allocator's events on torch 2.13), and then the waiting gradient, the earlier
stage's and their sum are in memory at once before the sum becomes ``.grad``.

Measured alone, the earlier stage adds into a gradient already in ``.grad``, in place: one copy
short of the model's graph in the second case. The profiler measures such a stage twice: as it
does every stage, and with the later stage's gradient made beforehand and added to the stage's
out of place by a hook on the parameter (:func:`sum_out_of_place`), the backward seeded so that
autograd alone holds the output's gradient and frees it once used (:func:`backward_owning`), as
in the model's graph. The later stage's own measurement says which it is
(:func:`sums_in_place`: whether autograd sums into the gradient it makes in place, or the stage
wrote its gradient into ``.grad`` itself, where the sum is then made: memplan's chunked head,
NOTE [ The tied gradient summed in place ] in :mod:`memplan.torch.split.tied_lookup`), and the
profiler keeps the figure of the case the model's graph is in (``backward_overhead_fresh``).
Measured alone, the earlier stage finds the later one's gradient in ``.grad`` marked as that
stage marks it (:func:`prepare_shared`): a token lookup that adds its rows sparsely into it does
so there as in the model's graph.
Not covered: the loop that keeps its gradients (``backward_overhead``), where the later stage's
gradient also waits in the buffer from its backward to the earlier stage's, which the chain
model has no term for.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import Tensor, nn

from memplan.torch.base.autograd import graph_nodes
from memplan.torch.measure.probe import MemoryProbe
from memplan.torch.runtime.recompute import recomputing
from memplan.torch.split.tied_lookup import mark_tied_half, unmark

__all__ = [
    "backward_owning",
    "prepare_shared",
    "shared_parameters",
    "sum_out_of_place",
    "sums_in_place",
]


def shared_parameters(module: nn.Module, creates: Collection[int]) -> list[nn.Parameter]:
    """The stage's trainable parameters whose gradient a later stage makes (not in ``creates``)."""
    return [p for p in module.parameters() if p.requires_grad and id(p) not in creates]


def prepare_shared(params: list[nn.Parameter]) -> None:
    """Mark the gradients a later stage made for ``params`` (already in ``.grad``) as the chunked
    head marks those it writes, which the token lookup adds into in place (NOTE [ The tied
    gradient summed in place ] in :mod:`memplan.torch.split.tied_lookup`).
    """
    for param in params:
        if param.grad is not None:
            mark_tied_half(param.grad)


def sum_out_of_place(params: list[nn.Parameter], probe: MemoryProbe) -> list[Any]:
    """Make the gradients a later stage made for ``params`` (zeros, under ``probe``: its CPU
    events then see them freed) and hook each parameter to add its own to it out of place, then
    let it go; the hooks' handles, to remove after the backward.
    """
    made: list[Tensor] = []

    def make() -> None:
        with torch.no_grad():
            made.extend(torch.zeros_like(p) for p in params)

    probe.peak(make, dict)
    handles = []
    for param, pending in zip(params, made, strict=True):
        box = [pending]

        def add(grad: Tensor, box: list[Tensor] = box) -> Tensor:
            return grad + box.pop() if box else grad

        handles.append(param.register_hook(add))
    made.clear()
    return handles


class _Owning(torch.autograd.Function):  # type: ignore[misc]
    """A root whose backward hands the output the gradient in ``box`` and keeps no reference to
    it.
    """

    @staticmethod
    def forward(ctx: Any, out: Tensor, box: list[Tensor]) -> Tensor:
        ctx.box = box
        return out.new_zeros(())

    @staticmethod
    def backward(ctx: Any, _grad: Tensor) -> tuple[Tensor, None]:
        return ctx.box.pop(), None


def backward_owning(out: Tensor, box: list[Tensor]) -> Any:
    """``out.backward(box[0])`` with autograd holding the gradient alone: the caller passes it
    in ``box`` and keeps no other reference. Returns the call to run (under the probe).
    """
    root = _Owning.apply(out, box)
    seed = torch.ones((), dtype=root.dtype, device=root.device)
    return lambda: root.backward(seed)


def sums_in_place(runner: Any, params: list[nn.Parameter]) -> set[int]:
    """Ids of ``params`` (whose gradient the stage of ``runner`` makes, an earlier stage using
    them too) whose gradient autograd adds an earlier stage's into in place.

    One more forward and backward of the stage, not measured, with a second use of each
    parameter made before the stage's forward: its gradient reaches the parameter's input
    buffer after the stage's, and autograd sums the two as it sums the earlier stage's. In
    place when the buffer's tensor is still the one the stage's backward gave.
    """
    if not params:
        return set()
    _, inp = runner.fresh_input()
    with torch.enable_grad(), recomputing(runner.module, None, inp.device):  # buffers kept
        later = [p * 1.0 for p in params]  # made first: their backward runs last
        out = runner.forward(inp)
    grad = runner.output_gradient(out)
    if grad is None:
        return set()
    given: dict[int, set[int]] = {id(p): set() for p in params}
    received: dict[int, int] = {}
    remove = _record_given(out.grad_fn, params, given)  # or the .grad the stage wrote
    handles = [p.register_hook(_record(received, id(p))) for p in params]
    try:
        torch.autograd.backward([out, *later], [grad, *(torch.ones_like(t) for t in later)])
    finally:
        remove()
        for handle in handles:
            handle.remove()
    summed = {id(p): None if p.grad is None else p.grad.data_ptr() for p in params}
    for p in params:
        unmark(p.grad)
        p.grad = None
    return {key for key, ptrs in given.items() if received.get(key) in ptrs or summed[key] in ptrs}


def _record(found: dict[int, int], key: int) -> Any:
    def hook(grad: Tensor) -> None:
        found[key] = grad.data_ptr()

    return hook


def _record_given(root: Any, params: list[nn.Parameter], given: dict[int, set[int]]) -> Any:
    """Hook the nodes of the graph from ``root`` that give ``params`` their gradient (their
    data pointers into ``given``); the function that removes the hooks.
    """
    wanted = {id(p): id(p) for p in params}
    handles = []
    for node in graph_nodes(root):
        for index, (nxt, _) in enumerate(node.next_functions):
            variable = getattr(nxt, "variable", None)
            if variable is not None and id(variable) in wanted:
                handles.append(node.register_hook(_given(given[id(variable)], index, variable)))

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


def _given(ptrs: set[int], index: int, param: Tensor) -> Any:
    def hook(grad_inputs: Any, _grad_outputs: Any) -> None:
        grad = grad_inputs[index]
        if grad is None:  # none given: the node may have written it into .grad itself
            grad = param.grad
        if grad is not None:
            ptrs.add(grad.data_ptr())

    return hook
