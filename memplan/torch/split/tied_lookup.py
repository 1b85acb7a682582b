"""A token lookup whose gradient is added sparsely into the tied gradient the head wrote.

NOTE [ The tied gradient summed in place ]
------------------------------------------
GPT-2's token embedding is its output projection: one parameter, two halves of its gradient
(51.5 MB each at a vocabulary of 50,257 and a width of 256). Autograd makes both and sums them:
the head's half waits in the parameter's input buffer, the lookup's backward makes a dense
matrix of zeros with the batch's rows added, and the two are in memory at once (the least memory
of GPT-2's chunked plans, docs/benchmarks.md). Two changes remove the second copy:

* the chunked head and loss (:class:`~memplan.torch.split.chunked_loss.ChunkedLoss`) writes its
  half into the parameter's ``.grad`` in its backward and returns none for it, where ``.grad``
  is None (a loop that sets its gradients to None: PyTorch's default, Hugging Face's
  ``Trainer``, the optimizer step in the backward), and marks it (:func:`mark_tied_half`);
* the token lookup (an ``nn.Embedding`` of an earlier stage on that parameter, its ``forward``
  replaced by :class:`_SparseLookup` while the chain exists: :func:`sparse_lookups`) returns its
  half as a sparse tensor, the rows of the batch's tokens (``tokens x width``, 1 MB at 4 x 256),
  when ``.grad`` is a dense tensor so marked: autograd's ``AccumulateGrad`` adds it into
  ``.grad`` in place (its ``post_accumulate_grad`` hooks then run as always), and the mark is
  consumed.

The sparse tensor never becomes a gradient: ``.grad`` stays the dense tensor plain training gives
(``clip_grad_norm_``, every optimizer). Elsewhere it is today's way, dense: a loop that keeps its
gradients across steps (``zero_grad(set_to_none=False)``, gradient accumulation: ``.grad`` exists
at the head's backward, and the head returns its half, counted in
:attr:`~memplan.torch.split.chunked_loss.ChunkedLoss.tied_returned`), ``torch.autograd.grad``
(which returns gradients and leaves ``.grad`` alone: :func:`accumulates`), a backward that builds
a graph (``create_graph``), an ``nn.Embedding`` with ``max_norm`` or ``scale_grad_by_freq``. What a
hook on the parameter (``register_hook``) sees: the lookup's half only, sparse; a
``post_accumulate_grad`` hook sees the whole gradient. The profiler measures both stages so
(:mod:`memplan.torch.measure.tied`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "TiedLookups",
    "accumulates",
    "mark_tied_half",
    "sparse_lookups",
    "takes_tied_half",
    "unmark",
]

_MARK = "_memplan_tied_half"


def mark_tied_half(grad: Tensor) -> None:
    """Mark ``grad`` (a parameter's ``.grad``) as holding the head's half of a tied gradient."""
    setattr(grad, _MARK, True)


def unmark(grad: Tensor | None) -> None:
    """Remove :func:`mark_tied_half`'s mark from ``grad`` (if any)."""
    if grad is not None and getattr(grad, _MARK, False):
        delattr(grad, _MARK)


def accumulates(node: Any, param: Tensor) -> bool:
    """Whether the backward under way accumulates into ``param.grad`` the gradient that
    ``node`` (an autograd node: a custom function's ``ctx``) gives it: a ``backward()`` that
    reaches the parameter, not ``torch.autograd.grad`` (which returns gradients, ``.grad``
    untouched) nor a ``backward(inputs=...)`` without it.
    """
    will_execute = getattr(torch._C, "_will_engine_execute_node", None)
    if will_execute is None:  # a PyTorch without it: the dense way, always right
        return False
    for edge, _ in node.next_functions:
        if getattr(edge, "variable", None) is param:
            try:  # PyTorch's own test (torch.autograd.graph's multi-grad hooks use it)
                return bool(will_execute(edge))
            except RuntimeError:  # torch.autograd.grad: a leaf's gradient is returned
                return False
    return False


def takes_tied_half(param: Tensor, rows: Tensor) -> bool:
    """Whether the lookup's gradient rows ``rows`` may be added sparsely into ``param.grad``: a
    dense tensor of their device and data type marked by :func:`mark_tied_half`, outside a
    backward that builds a graph.
    """
    grad = param.grad
    return (
        grad is not None
        and not torch.is_grad_enabled()
        and grad.layout == torch.strided
        and grad.device == rows.device
        and grad.dtype == rows.dtype
        and bool(getattr(grad, _MARK, False))
    )


class _Lookup(torch.autograd.Function):  # type: ignore[misc]
    """``F.embedding(ids, weight, padding_idx)``, its weight's gradient sparse where
    :func:`takes_tied_half` (NOTE [ The tied gradient summed in place ]).
    """

    @staticmethod
    def forward(ctx: Any, ids: Tensor, weight: Tensor, padding_idx: int | None) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.param = weight
        ctx.padding_idx = padding_idx
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        (ids,) = ctx.saved_tensors
        param, padding = ctx.param, ctx.padding_idx
        if not (takes_tied_half(param, grad_output) and accumulates(ctx, param)):
            dense = torch.ops.aten.embedding_backward(
                grad_output, ids, param.shape[0], -1 if padding is None else padding, False, False
            )
            return None, dense, None
        unmark(param.grad)
        index = ids.reshape(-1)
        rows = grad_output.reshape(index.numel(), -1)
        if padding is not None:  # the padding row gets no gradient
            rows = rows * (index != padding).unsqueeze(1).to(rows.dtype)
        sparse = torch.sparse_coo_tensor(
            index.unsqueeze(0), rows, param.shape, check_invariants=False
        )  # the batch's token ids: rows of the matrix
        return None, sparse, None


class _SparseLookup:
    """An ``nn.Embedding``'s ``forward`` as :class:`_Lookup` while gradients are on; ``users``
    counts the chains that asked for it (:func:`sparse_lookups`).
    """

    def __init__(self, module: nn.Embedding) -> None:
        self.module = module
        self.users = 1

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        module = self.module
        if not (torch.is_grad_enabled() and module.weight.requires_grad):
            return nn.Embedding.forward(module, *args, **kwargs)
        ids = args[0] if args else kwargs["input"]  # nn.Embedding.forward(input)
        out: Tensor = _Lookup.apply(ids, module.weight, module.padding_idx)
        return out


def _replaceable(module: nn.Module, tied: Collection[int]) -> bool:
    return (
        isinstance(module, nn.Embedding)
        and type(module).forward is nn.Embedding.forward
        and id(module.weight) in tied
        and module.max_norm is None
        and not module.scale_grad_by_freq
        and not module.sparse
    )


class TiedLookups:
    """The lookups :func:`sparse_lookups` replaced; :meth:`remove` puts each ``forward`` back
    once no chain uses it.
    """

    def __init__(self, lookups: list[_SparseLookup]) -> None:
        self.lookups = lookups

    def __len__(self) -> int:
        return len(self.lookups)

    def remove(self) -> None:
        """Give the lookups back (the last user restores the module's own ``forward``)."""
        for lookup in self.lookups:
            lookup.users -= 1
            if lookup.users == 0 and vars(lookup.module).get("forward") is lookup:
                del lookup.module.forward
        self.lookups = []


def sparse_lookups(modules: Iterable[nn.Module], tied: Collection[int]) -> TiedLookups:
    """Replace the ``forward`` of every ``nn.Embedding`` among ``modules`` (and their submodules)
    whose weight's id is in ``tied`` by :class:`_SparseLookup` (NOTE [ The tied gradient summed
    in place ]); a module whose ``forward`` someone else replaced is left as it is.
    """
    found: list[_SparseLookup] = []
    seen: set[int] = set()
    for top in modules:
        for module in top.modules():
            if id(module) in seen or not _replaceable(module, tied):
                continue
            seen.add(id(module))
            own = vars(module).get("forward")
            if isinstance(own, _SparseLookup) and own.module is module:
                own.users += 1
                found.append(own)
            elif own is None:
                lookup = _SparseLookup(module)
                module.forward = lookup
                found.append(lookup)
    return TiedLookups(found)
