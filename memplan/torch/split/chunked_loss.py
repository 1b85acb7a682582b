"""A language model's head and loss as one stage, computed in chunks of tokens.

On a language model the largest tensors of a training step are the logits, ``batch x tokens x
vocabulary`` (205.9 MB for GPT-2's 50,257 tokens at batch 4 x 256), and what the loss makes of
them: the log-softmax it keeps for its backward, their gradient. No checkpointing of the blocks
removes them, so they set the least memory of every plan. :func:`chunk_loss` replaces the chain's
last two stages, ``head`` (final norm and output projection) and ``loss`` (cross-entropy over the
vocabulary), by one stage, ``head+loss`` (:class:`ChunkedLoss`), that computes both over ``c``
chunks of tokens: no step holds more than one chunk's logits (NOTE [ Gradients in the forward ]).
The profiler measures it like any stage; the solvers and the runtime need no change.

NOTE [ Chunked loss ]
---------------------
The loss is exact: each chunk's summed cross-entropy (``reduction="sum"``, ``ignore_index``
-100) over the count of predicted tokens of the whole batch is the model's own mean, and every
gradient is plain training's up to the order of floating-point additions (the head's weight
gradient is a sum over chunks instead of one matrix product). The targets are the model's:

* Hugging Face causal LMs (``*ForCausalLM``, ``GPT2LMHeadModel``): the labels shifted left,
  ``-100`` at the last position, the logits upcast to float32 (``ForCausalLMLoss``);
* Hugging Face masked LMs (``*ForMaskedLM``): the labels as they are (``-100`` where no token is
  masked), the logits in the model's data type (``BertForMaskedLM.forward``);
* the built-in GPTs (``gpt-small``...): the tokens shifted left (:class:`~memplan.torch.split.
  linearize.NextTokenLoss`).

NOTE [ Gradients in the forward ]
----------------------------------
With gradients wanted, the stage's forward (:class:`_LossAndGradients`) runs, per chunk, the head,
the cross-entropy over the count of targets, and at once their backward
(``torch.autograd.grad``): the chunk's logits, their gradient written over them (NOTE [ One
chunk tensor ]), are freed before the next chunk. It adds the chunk's gradients into the gradient
of the input (the last hidden state, ``batch x tokens x hidden``) and of each head parameter,
and saves these for the backward, which scales them by the output's gradient (in place: 1 in a
plain loop) and returns them. The output projection's weight gradient (``vocab x hidden``: 51.5 MB on GPT-2, tied to the
token embedding) is the largest: where the head calls ``F.linear`` with that weight, the call is
replaced by :class:`_LinearIntoGradient` (a ``TorchFunctionMode``, :class:`_ProjectionInto`),
whose backward adds the chunk's weight gradient in place into the running sum
(``addmm_``), so that no chunk holds its own copy beside the sum; the gradients of the
projection's input and bias are autograd's as before. A head that uses the weight otherwise
(not through ``F.linear``) gets autograd's gradient, added as for every other parameter. The arithmetic is plain training's, nothing is
recomputed (the "fused linear cross-entropy" of Liger Kernel computes a linear head's gradients
in its forward the same way), where holding each chunk under ``torch.utils.checkpoint`` would
run the head's forward twice; many small products are slower than one large one on a CPU, so
fewer chunks are faster (docs/benchmarks.md). The chunks' graphs run under
identity ``saved_tensors_hooks``: they are the stage's temporaries, which the profiler measures as
its forward's peak, not tensors the stage keeps. The stage's gradients are made by its forward
(the loss's forward is followed by its backward in every plan); a second backward through the
same graph (``retain_graph``) is refused by autograd (the saved gradients were scaled in place).

NOTE [ One chunk tensor ]
-------------------------
A chunk's logits are not kept beside their log-softmax and their gradient (three chunk tensors,
as ``F.cross_entropy``'s forward and backward make them): the cross-entropy's value and its
gradient with respect to the logits, ``(softmax - one-hot) / count`` (0 on a position without a
target), are computed over the logits in place (:func:`_gradient_over_logits`, as Liger Kernel's
fused linear cross-entropy does), and the head's backward is run from that one tensor
(``torch.autograd.grad(logits, inputs, grad_outputs=logits)``). That is safe only where no
operation of the head saved its output for its backward (the projection's does not:
:class:`_LinearIntoGradient` saves its input and weight) and the output is none of the chunk's
inputs: the tensors the head's forward saves are seen by a ``saved_tensors_hooks``, and where the
output's storage is among them, or it is not a float32 or float64 contiguous tensor (a bfloat16
masked LM's logits keep autograd's arithmetic), the chunk's loss and gradients are autograd's,
from the same logits, and :attr:`ChunkedLoss.logits_in_place` is False. The gradients are plain
training's up to rounding (BERT's attention key bias, whose gradient is zero but for rounding,
compares at the model's scale: :func:`memplan.torch.compare.training.gradient_agreement`).

The backward scales the saved gradients in place. A parameter that an earlier stage uses too
(:attr:`ChunkedLoss.shared`: GPT-2's output projection is its token embedding) gets its
gradient in ``.grad`` directly where ``.grad`` is None (NOTE [ The tied gradient summed in place ]
in :mod:`memplan.torch.split.tied_lookup`: the token lookup then adds its rows into it in place),
and none is returned for it. Where ``.grad`` exists (a loop that keeps its gradients) the
gradient is returned as a new tensor, ``grad * grad_output``, as before
(:attr:`ChunkedLoss.tied_returned` counts these): autograd sums a tied parameter's gradients in
the backward's buffer, in place only into a tensor whose storage nothing else references, and
the saved tensors' storages have been seen by the saved-tensor hooks (the runtime's, the
profiler's), which keep a reference: the saved gradient itself would be summed out of place at
the embedding's backward, a third copy of the matrix that no profile measures.

The head must act on each token alone (a norm, a projection: every language model's); this is
checked when the stage is made: on the example's first sample, the chunked loss equals the plain
loss. What the user loses: the model's logits are never whole, so the chunked chain returns the
loss only (plain training's forward returns the logits too).

Examples
--------
>>> from memplan.torch import build_model, linearize                   # doctest: +SKIP
>>> model, x, _ = build_model("gpt-tiny", batch_size=2)                # doctest: +SKIP
>>> chain = chunk_loss(linearize(model, x), x, 4)                       # doctest: +SKIP
>>> chain.names[-1]                                                     # doctest: +SKIP
'head+loss'
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.graph import saved_tensors_hooks
from torch.overrides import TorchFunctionMode

from memplan.errors import InputError
from memplan.torch.split.hf import HFLoss
from memplan.torch.split.linearize import IGNORE_INDEX, Chain, NextTokenLoss, next_tokens
from memplan.torch.split.stages import eval_mode, run_stages
from memplan.torch.split.tied_lookup import (
    TiedLookups,
    accumulates,
    mark_tied_half,
    sparse_lookups,
    unmark,
)
from memplan.torch.split.wrappers import BlockCall, TapeStage, ViewStage

__all__ = [
    "CHUNKED_STAGE",
    "LOSS_CHUNKS",
    "ChunkedLoss",
    "auto_loss_chunks",
    "chunk_loss",
    "chunked_stage",
    "loss_chunks_extra",
    "profile_loss_chunks",
    "resolve_loss_chunks",
    "supports_chunked_loss",
]

CHUNKED_STAGE = "head+loss"
"""The name of the merged stage in the chain and its profile."""
LOSS_CHUNKS = "loss_chunks"
"""The key of ``measured.extra`` that records the chunks a profile was measured with."""


def loss_chunks_extra(chunks: int | None) -> dict[str, int]:
    """What a profile's ``measured.extra`` records of the chunks (nothing without chunks)."""
    return {} if chunks is None else {LOSS_CHUNKS: chunks}


def profile_loss_chunks(profile: Any, given: int | None = None) -> int | None:
    """The chunks of tokens a profile's ``head+loss`` stage was measured with (None: none).

    Raises
    ------
    InputError
        ``given`` differs from the profile's: a plan is for the chain it was profiled on.
    """
    extra = profile.measured.extra if profile.measured is not None else None
    found = (extra or {}).get(LOSS_CHUNKS)
    if given is not None and found != given:
        was = f"in {found} chunks" if found else "without chunks"
        raise InputError(
            f"--loss-chunks {given}: the profile was measured with the loss {was}; profile "
            "again with the same --loss-chunks"
        )
    return found


def supports_chunked_loss(loss: nn.Module) -> bool:
    """Whether ``loss`` (a chain's loss stage) is a per-token cross-entropy that
    :class:`ChunkedLoss` computes exactly: a Hugging Face causal or masked LM's, or
    :class:`~memplan.torch.split.linearize.NextTokenLoss`.
    """
    if isinstance(loss, HFLoss):
        return loss.task in ("causal-lm", "masked-lm")
    return isinstance(loss, NextTokenLoss)


class ChunkedLoss(nn.Module):
    """``loss(head(x))`` over ``chunks`` chunks of tokens (NOTE [ Gradients in the forward ]).

    Parameters
    ----------
    head : nn.Module
        The chain's head stage, acting on each token alone: ``(batch, seq, hidden) -> (batch,
        seq, vocab)``.
    loss : nn.Module
        The chain's loss stage (:func:`supports_chunked_loss`); its labels are the stage's.
    chunks : int
        Chunks of tokens (along the sequence); fewer when the sequence is shorter.
    """

    write_over_logits = True
    """Whether a chunk's logits' gradient may be written over them (NOTE [ One chunk tensor ]);
    False: autograd's, beside them."""

    def __init__(self, head: nn.Module, loss: nn.Module, chunks: int) -> None:
        super().__init__()
        if not supports_chunked_loss(loss):
            raise InputError(f"chunked loss: {type(loss).__name__} is not a per-token loss")
        self.head = head
        self.loss = loss
        self.chunks = chunks
        self.upcast = isinstance(loss, HFLoss) and loss.task == "causal-lm"
        # the head's parameters an earlier stage uses (tied), by name in the head: FSDP2
        # (``fully_shard``) registers other tensors in their places at every step
        self.shared: set[str] = set()
        # whether the last chunk's logits' gradient was written over its logits
        self.logits_in_place = False
        # backwards that wrote a tied gradient into ``.grad`` / returned it (it existed)
        self.tied_into_grad = 0
        self.tied_returned = 0
        # the token lookups that add into the tied gradient in place (:func:`chunk_loss`)
        self.lookups = TiedLookups([])

    @property
    def labels_from_input(self) -> bool:
        """The loss predicts the tokens of the batch it is called on (no labels were given)."""
        return bool(getattr(self.loss, "labels_from_input", False))

    def release(self) -> None:
        """Give the token lookups :func:`chunk_loss` replaced back (NOTE [ The tied gradient
        summed in place ] in :mod:`memplan.torch.split.tied_lookup`).
        """
        self.lookups.remove()

    def tied_gradient(self, param: Tensor, grad: Tensor, scale: Tensor, node: Any) -> Tensor | None:
        """The backward's gradient for ``param``, a parameter an earlier stage uses too: written
        into ``param.grad`` (None: nothing returned) where that is None and the backward under
        way (``node``: the stage's) accumulates into it, else ``grad * scale`` (NOTE [ Gradients
        in the forward ]).
        """
        fresh = (
            param.grad is None
            and accumulates(node, param)
            and param.is_leaf
            and not torch.is_grad_enabled()
            and type(param.data) is Tensor
            and (grad.shape, grad.dtype, grad.device) == (param.shape, param.dtype, param.device)
        )
        if not fresh:
            self.tied_returned += 1
            unmark(param.grad)
            return grad * scale
        if grad.stride() != param.stride():
            # autograd's gradient layout contract, which AccumulateGrad keeps and an optimizer
            # may rely on: ``.grad`` strided as its parameter. A head reading the weight
            # transposed (MobileBERT's ``decoder.weight.t()``) is given a transposed gradient,
            # which fused AdamW stepped element by element in the wrong places
            grad = torch.empty_like(param).copy_(grad)
        param.grad = grad.mul_(scale)
        mark_tied_half(param.grad)
        self.tied_into_grad += 1
        return None

    def follow_input(self, tokens: Tensor) -> None:
        """Predict the tokens of this batch from now on (the loss stage's own rule)."""
        self.loss.follow_input(tokens)

    def targets(self, labels: Tensor | None) -> Tensor:
        """The target token of every position, ``-100`` where none (NOTE [ Chunked loss ])."""
        loss = self.loss
        if isinstance(loss, NextTokenLoss):
            return loss.targets if labels is None else next_tokens(labels)
        labels = loss.labels if labels is None else labels
        if loss.task == "causal-lm":  # position t predicts labels[t + 1], as ForCausalLMLoss
            return F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        return labels

    def chunk_sum(self, hidden: Tensor, targets: Tensor) -> Tensor:
        logits = self.head(hidden)
        return _cross_entropy_sum(logits.float() if self.upcast else logits, targets)

    def chunk_gradients(
        self, hidden: Tensor, targets: Tensor, count: Tensor, inputs: list[Tensor]
    ) -> tuple[Tensor, list[Tensor | None]]:
        """``chunk_sum(hidden, targets) / count`` and its gradients for ``inputs``, the logits'
        gradient written over the logits where that is safe, else autograd's (NOTE [ One chunk
        tensor ]); :attr:`logits_in_place` says which way the chunk took.
        """
        saved: set[int] = set()

        def pack(tensor: Tensor) -> Tensor:
            saved.add(_storage(tensor))
            return tensor

        with saved_tensors_hooks(pack, _same):
            out = self.head(hidden)
            if self.upcast:
                out = out.float()
        ours = {_storage(t) for t in (hidden, *inputs)}
        self.logits_in_place = (
            self.write_over_logits
            and out.requires_grad
            and out.is_contiguous()
            and out.dtype in (torch.float32, torch.float64)
            and _storage(out) not in saved | ours
        )
        if not self.logits_in_place:  # autograd's way, from the same logits
            value = _cross_entropy_sum(out, targets) / count
            found = torch.autograd.grad(value, inputs, allow_unused=True)
            return value.detach(), list(found)
        value = _gradient_over_logits(out.detach().view(-1, out.shape[-1]), targets, count)
        found = torch.autograd.grad(out, inputs, grad_outputs=out, allow_unused=True)
        return value, list(found)

    def forward(self, hidden: Tensor, labels: Tensor | None = None, count: Any = None) -> Tensor:
        """The mean cross-entropy against ``labels`` (the batch's) or the stage's own; over
        ``count`` targets when given (``num_items_in_batch``, as a causal LM's loss takes it
        under gradient accumulation), else over the batch's own.
        """
        return self.mean_loss(hidden, self.targets(labels).to(hidden.device), count)

    def mean_loss(self, hidden: Tensor, targets: Tensor, count: Any = None) -> Tensor:
        """The mean cross-entropy of ``head(hidden)`` against the target of every position
        (NOTE [ Gradients in the forward ] when gradients are wanted), over ``count`` targets
        (by default the positions with a target).
        """
        if count is None:
            count = (targets != IGNORE_INDEX).sum()
        count = torch.as_tensor(count, device=hidden.device)
        named = [(n, p) for n, p in self.head.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        if torch.is_grad_enabled() and (hidden.requires_grad or params):
            tied = [n in self.shared for n, _ in named]
            return _LossAndGradients.apply(self, hidden, targets, count, tied, *params)
        total = hidden.new_zeros((), dtype=self.loss_dtype(hidden))
        for part, part_targets in self.pieces(hidden, targets):
            total = total + self.chunk_sum(part, part_targets) / count
        return total

    def loss_dtype(self, hidden: Tensor) -> torch.dtype:
        """The loss's data type: float32 where the logits are upcast, else the model's."""
        return torch.float32 if self.upcast else hidden.dtype

    def pieces(self, hidden: Tensor, targets: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
        """The chunks of tokens: ``(hidden, targets)`` slices along the sequence."""
        parts = hidden.chunk(self.chunks, dim=1), targets.chunk(self.chunks, dim=1)
        return zip(*parts, strict=True)


class _LossAndGradients(torch.autograd.Function):
    """The chunked loss, its gradients computed in the forward (NOTE [ Gradients in the forward ])."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        stage: ChunkedLoss,
        hidden: Tensor,
        targets: Tensor,
        count: Tensor,
        tied: list[bool],
        *params: Tensor,
    ) -> Tensor:
        wants_input = hidden.requires_grad
        grad_input = torch.empty_like(hidden) if wants_input else None
        grads: list[Tensor | None] = [None] * len(params)
        total = hidden.new_zeros((), dtype=stage.loss_dtype(hidden))
        start = 0
        projection = _ProjectionInto.of(params)
        # the chunks' graphs are this stage's temporaries: outer hooks (the profiler's, the
        # runtime's) must not take their saved tensors for the stage's
        with torch.enable_grad(), saved_tensors_hooks(_same, _same), projection:
            for part, part_targets in stage.pieces(hidden, targets):
                leaf = part.detach().requires_grad_(wants_input)
                inputs = [leaf, *params] if wants_input else list(params)
                value, found = stage.chunk_gradients(leaf, part_targets, count, inputs)
                if grad_input is not None:
                    width = part.shape[1]
                    grad_input[:, start : start + width].copy_(found.pop(0))
                    start += width
                for j, grad in enumerate(found):
                    if grad is not None:  # None: a parameter the head does not use
                        grads[j] = grad if grads[j] is None else grads[j].add_(grad)
                total += value
                del value, found
        if projection.used:  # its weight's gradient is the buffer, plus what autograd gave
            j = projection.index
            grads[j] = projection.grad if grads[j] is None else projection.grad.add_(grads[j])
        ctx.has = [g is not None for g in (grad_input, *grads)]
        ctx.tied = [False, *tied]
        ctx.stage, ctx.params = stage, (None, *params)
        ctx.save_for_backward(*(g for g in (grad_input, *grads) if g is not None))
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        saved = iter(ctx.saved_tensors)
        found = [next(saved) if has else None for has in ctx.has]
        # scaled in place: no second copy (the output's gradient is 1 in a plain loop, the loss
        # scale under a GradScaler); a tied parameter's into its .grad, or as a new tensor
        # (NOTE [ Gradients in the forward ])
        found = [
            None
            if grad is None
            else ctx.stage.tied_gradient(param, grad, grad_output, ctx)
            if tied
            else grad.mul_(grad_output)
            for grad, tied, param in zip(found, ctx.tied, ctx.params, strict=True)
        ]
        return (None, found[0], None, None, None, *found[1:])


def _same(tensor: Tensor) -> Tensor:
    return tensor


def _storage(tensor: Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _cross_entropy_sum(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


@torch.no_grad()
def _gradient_over_logits(logits: Tensor, targets: Tensor, count: Tensor) -> Tensor:
    """The summed cross-entropy of ``logits`` (``tokens x vocab``) against ``targets`` over
    ``count``, returned, and its gradient, ``(softmax - one-hot) / count`` (0 on a row without a
    target), written over ``logits`` (NOTE [ One chunk tensor ]).
    """
    target = targets.reshape(-1)
    valid = target != IGNORE_INDEX
    weight = valid.to(logits.dtype) / count.to(logits.dtype)
    safe = target.clamp(min=0)[:, None]
    picked = logits.gather(1, safe).squeeze(1)
    top = logits.amax(1, keepdim=True)
    logits.sub_(top).exp_()  # exp(logit - max), in place
    sums = logits.sum(1, keepdim=True)
    rows = sums.log().squeeze(1) + top.squeeze(1) - picked  # each row's cross-entropy
    logits.div_(sums).scatter_add_(1, safe, -valid[:, None].to(logits.dtype))
    logits.mul_(weight[:, None])
    return (rows * weight).sum()


class _LinearIntoGradient(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` whose backward adds the weight's gradient in place into
    ``into`` and returns none for it (NOTE [ Gradients in the forward ]).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, into: Tensor
    ) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.into = into
        product = F.linear(x.reshape(-1, x.shape[-1]), weight, bias)
        # not a view of the 2-D product for autograd (as torch.matmul returns it): the chunk's
        # logits are written over in place (NOTE [ One chunk tensor ])
        return torch.ops.aten._unsafe_view(product, (*x.shape[:-1], product.shape[-1]))

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        into = ctx.into
        rows = grad_output.reshape(-1, grad_output.shape[-1])
        into.addmm_(rows.t().to(into.dtype), x.reshape(-1, x.shape[-1]).to(into.dtype))
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_output @ weight.to(grad_output.dtype)).to(x.dtype)
        grad_bias = rows.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, None, grad_bias, None


class _ProjectionInto(TorchFunctionMode):
    """While active, ``F.linear`` with ``weight`` runs as :class:`_LinearIntoGradient` into
    ``grad`` (zeros until the first chunk's backward).

    Parameters
    ----------
    weight : Tensor or None
        The output projection's weight: the head's largest matrix; None intercepts nothing.
    index : int
        Its position among the stage's parameters.
    """

    def __init__(self, weight: Tensor | None, index: int) -> None:
        super().__init__()
        self.weight = weight
        self.index = index
        self.grad = torch.zeros_like(weight) if weight is not None else None
        self.used = False

    @classmethod
    def of(cls, params: tuple[Tensor, ...]) -> _ProjectionInto:
        """The mode for the largest matrix of ``params`` (those that need a gradient)."""
        matrices = [j for j, p in enumerate(params) if p.dim() == 2 and p.requires_grad]
        if not matrices:
            return cls(None, -1)
        index = max(matrices, key=lambda j: params[j].numel())
        return cls(params[index], index)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear and self.grad is not None:
            given = dict(zip(("input", "weight", "bias"), args, strict=False)) | kwargs
            if given.get("weight") is self.weight:
                self.used = True
                return _LinearIntoGradient.apply(
                    given["input"], self.weight, given.get("bias"), self.grad
                )
        return func(*args, **kwargs)


def _check_exact(kind: str, stage: ChunkedLoss, head_input: Tensor) -> None:
    """On the first sample: the chunked loss is the plain one (the head acts on each token)."""
    first = head_input[:1]
    loss = stage.loss
    logits = stage.head(first)
    if isinstance(loss, NextTokenLoss):
        targets = loss.targets[:1]
        flat = logits.reshape(-1, logits.shape[-1])
        whole = F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX)
    else:
        whole = loss(logits, loss.labels[:1])
        targets = stage.targets(loss.labels[:1])
    chunked = stage.mean_loss(first, targets)
    if not torch.allclose(chunked.double(), whole.double(), rtol=1e-4, atol=1e-6):
        raise InputError(
            f"--loss-chunks: the head of {kind} does not act on each token alone (the loss in "
            f"chunks is {float(chunked):.6g}, the model's {float(whole):.6g}); train without it"
        )


def auto_loss_chunks(vocab: int, width: int, tokens: int, seq: int) -> int:
    """The chunks of tokens ``loss_chunks="auto"`` takes: ``ceil(min(tokens, vocab) / width)``,
    at most one per position of the sequence (the chunks are along it).

    That is the fewest chunks whose logits (``tokens / chunks x vocab``) are each no larger than
    the larger of two tensors the head and loss stage holds whatever the count: the head's
    weight gradient (``vocab x width``) and the hidden states' gradient (``tokens x width``).
    The stage's peak is then within a small factor of that floor (a chunk's logits, their
    gradient written over them: NOTE [ One chunk tensor ]), and more chunks would save little
    more while making the products smaller, which is slower: on issue 35's tiny GPT-2 and Llama
    (vocabulary 8,000, width 128, 512 tokens: 4 chunks) 4, 8, 12 and 16 chunks measured the
    same least memory through ``enable``, and 63 chunks 1.5x the step time of 8 (docs/profiling.md). GPT-2 at
    4 x 1,024 tokens takes 6 chunks; Llama-3.2-1B at 2,048 tokens 1, where its head's weight
    gradient is as large as the logits.
    """
    return max(1, min(seq, -(-min(tokens, vocab) // width)))


def resolve_loss_chunks(
    chunks: int | str | None, vocab: int, width: int, tokens: int, seq: int
) -> int | None:
    """``loss_chunks`` as a count: ``"auto"`` by :func:`auto_loss_chunks`, a positive integer as
    it is, None for none.

    Raises
    ------
    InputError
        Anything else.
    """
    if chunks is None:
        return None
    if chunks == "auto":
        return auto_loss_chunks(vocab, width, tokens, seq)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise InputError(f"loss_chunks {chunks!r}: expected a positive integer or 'auto'")
    return chunks


def chunked_stage(
    stages: list[tuple[str, nn.Module]], loss: nn.Module, x: Tensor, chunks: int, kind: str
) -> ChunkedLoss:
    """The ``head+loss`` stage of a chain made of ``stages`` (the last one its head) and
    ``loss``, checked by :func:`chunk_loss`.
    """
    chain = chunk_loss(Chain(stages=[*stages, ("loss", loss)]), x, chunks, kind)
    stage = chain.modules[-1]
    assert isinstance(stage, ChunkedLoss)
    return stage


def head_reads_batch(head: nn.Module) -> bool:
    """Whether ``head`` (a chain's head stage) runs on hidden states of the example batch's shape
    only, not on a chunk of its tokens: it was traced reading tensors computed for that batch
    besides its input (a head replayed from a tape that read an attention mask or a tensor an
    earlier block made, :class:`~memplan.torch.split.wrappers.TapeStage`: Inkling-2's; a module
    call holding such tensors, :class:`~memplan.torch.split.wrappers.BlockCall`), or a view of
    its input of the traced geometry (CPM-Ant's head reads the hidden states past its prompt).
    """
    for m in head.modules():
        if isinstance(m, TapeStage) and m.batch_data:
            return True
        if isinstance(m, BlockCall) and (m.view is not None or m.holds_batch_tensors):
            return True
        if isinstance(m, ViewStage):
            return True
    return False


def chunk_loss(chain: Chain, x: Tensor, chunks: int | None, kind: str = "the model") -> Chain:
    """``chain`` with its ``head`` and ``loss`` stages merged into one :class:`ChunkedLoss`.

    Parameters
    ----------
    chain : Chain
        A chain from :func:`~memplan.torch.split.linearize.linearize`, ending with ``head``, ``loss``.
    x : Tensor
        Its example input (the chain is run once on it, without gradients, to check the stage).
    chunks : int or None
        Chunks of tokens; None returns ``chain`` itself.
    kind : str
        The model's name, for errors.

    Returns
    -------
    Chain
        The same stages but the last, ``head+loss``.

    Raises
    ------
    InputError
        ``chunks`` not a positive integer, a chain whose loss is not a language model's
        per-token cross-entropy or has no ``head`` stage, or a head that mixes tokens.
    """
    if chunks is None:
        return chain
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise InputError(f"--loss-chunks {chunks!r}: expected a positive integer")
    names = chain.names
    loss = chain.modules[-1]
    if not supports_chunked_loss(loss):
        raise InputError(
            f"--loss-chunks: {kind} is not a language model (its loss is "
            f"{type(loss).__name__}); chunks of tokens apply to Hugging Face causal and masked "
            "language models (hf:gpt2, hf:llama, hf:bert...) and the built-in GPTs"
        )
    if len(names) < 3 or names[-2] != "head":
        raise InputError(f"--loss-chunks: {kind}'s chain has no head stage before its loss")
    head = chain.modules[-2]
    if head_reads_batch(head):
        raise InputError(
            f"--loss-chunks: {kind}'s head was traced for the whole batch (it reads tensors "
            "computed for that batch besides the hidden states, or a view of their traced "
            "shape): it cannot run on a chunk of tokens; train it without loss_chunks"
        )
    stage = ChunkedLoss(head, loss, chunks)
    earlier = {id(p) for _, module in chain.stages[:-2] for p in module.parameters()}
    stage.shared = {n for n, p in head.named_parameters() if id(p) in earlier}
    body = chain.stages[:-2]
    tied = {id(p) for n, p in head.named_parameters() if n in stage.shared}
    stage.lookups = sparse_lookups((module for _, module in body), tied)
    with eval_mode(*chain.modules), torch.no_grad():
        head_input = run_stages(kind, body, x.clone())
        _check_exact(kind, stage, head_input)
    inplace = chain.inplace[:-2] + [False] if chain.inplace else []
    return Chain(stages=[*body, (CHUNKED_STAGE, stage)], inplace=inplace)
