"""A language model's head and loss as one stage, computed in chunks of tokens.

On a language model the largest tensors of a training step are the logits, ``batch x tokens x
vocabulary`` (205.9 MB for GPT-2's 50,257 tokens at batch 4 x 256), and what the loss makes of
them: the log-softmax it keeps for its backward, their gradient. No checkpointing of the blocks
removes them, so they set the least memory of every plan. :func:`chunk_loss` replaces the chain's
last two stages, ``head`` (final norm and output projection) and ``loss`` (cross-entropy over the
vocabulary), by one stage, ``head+loss`` (:class:`ChunkedLoss`), that computes both over ``c``
chunks of tokens, each chunk under ``torch.utils.checkpoint`` (non-reentrant): the forward keeps
only the stage's input (the last hidden state), its backward recomputes one chunk's logits at a
time. The profiler measures it like any stage; the solvers and the runtime need no change.

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
* the built-in GPTs (``gpt-small``...): the tokens shifted left (:class:`~memplan.torch.linearize.
  NextTokenLoss`).

The head must act on each token alone (a norm, a projection: every language model's); this is
checked when the stage is made: on the example's first sample, the chunked loss equals the plain
loss. What the user loses: the model's logits are never whole, so the chunked chain returns the
loss only (plain training's forward returns the logits too).

Examples
--------
>>> from memplan.torch.models import build_model                       # doctest: +SKIP
>>> model, x, _ = build_model("gpt-tiny", batch_size=2)                # doctest: +SKIP
>>> chain = chunk_loss(linearize(model, x), x, 4)                       # doctest: +SKIP
>>> chain.names[-1]                                                     # doctest: +SKIP
'head+loss'
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from memplan.errors import InputError
from memplan.torch.hf import HFLoss
from memplan.torch.linearize import (
    IGNORE_INDEX,
    Chain,
    NextTokenLoss,
    eval_mode,
    next_tokens,
    run_stages,
)

__all__ = [
    "CHUNKED_STAGE",
    "LOSS_CHUNKS",
    "ChunkedLoss",
    "chunk_loss",
    "profile_loss_chunks",
    "supports_chunked_loss",
]

CHUNKED_STAGE = "head+loss"
"""The name of the merged stage in the chain and its profile."""
LOSS_CHUNKS = "loss_chunks"
"""The key of ``measured.extra`` that records the chunks a profile was measured with."""


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
    :class:`~memplan.torch.linearize.NextTokenLoss`."""
    if isinstance(loss, HFLoss):
        return loss.task in ("causal-lm", "masked-lm")
    return isinstance(loss, NextTokenLoss)


class ChunkedLoss(nn.Module):
    """``loss(head(x))`` over ``chunks`` chunks of tokens, each recomputed in the backward.

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

    def __init__(self, head: nn.Module, loss: nn.Module, chunks: int) -> None:
        super().__init__()
        if not supports_chunked_loss(loss):
            raise InputError(f"chunked loss: {type(loss).__name__} is not a per-token loss")
        self.head = head
        self.loss = loss
        self.chunks = chunks
        self.upcast = isinstance(loss, HFLoss) and loss.task == "causal-lm"

    @property
    def labels_from_input(self) -> bool:
        """The loss predicts the tokens of the batch it is called on (no labels were given)."""
        return bool(getattr(self.loss, "labels_from_input", False))

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
        if self.upcast:
            logits = logits.float()
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )

    def forward(self, hidden: Tensor, labels: Tensor | None = None) -> Tensor:
        """The mean cross-entropy against ``labels`` (the batch's) or the stage's own."""
        return self.mean_loss(hidden, self.targets(labels).to(hidden.device))

    def mean_loss(self, hidden: Tensor, targets: Tensor) -> Tensor:
        """The mean cross-entropy of ``head(hidden)`` against the target of every position:
        the chunks' sums over the count of targets (each chunk checkpointed with gradients)."""
        count = (targets != IGNORE_INDEX).sum()
        total: Tensor | None = None
        parts = hidden.chunk(self.chunks, dim=1), targets.chunk(self.chunks, dim=1)
        pieces = zip(*parts, strict=True)
        for part, part_targets in pieces:
            if torch.is_grad_enabled():
                value = checkpoint(self.chunk_sum, part, part_targets, use_reentrant=False)
            else:
                value = self.chunk_sum(part, part_targets)
            total = value if total is None else total + value
        assert total is not None
        return total / count


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


def chunk_loss(chain: Chain, x: Tensor, chunks: int | None, kind: str = "the model") -> Chain:
    """``chain`` with its ``head`` and ``loss`` stages merged into one :class:`ChunkedLoss`.

    Parameters
    ----------
    chain : Chain
        A chain from :func:`~memplan.torch.linearize.linearize`, ending with ``head``, ``loss``.
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
    stage = ChunkedLoss(head, loss, chunks)
    body = chain.stages[:-2]
    with eval_mode(*chain.modules), torch.no_grad():
        head_input = run_stages(kind, body, x.clone())
        _check_exact(kind, stage, head_input)
    inplace = chain.inplace[:-2] + [False] if chain.inplace else []
    return Chain(stages=[*body, (CHUNKED_STAGE, stage)], inplace=inplace)
