"""Cut a Hugging Face ``transformers`` model into a chain, and its loss stage (the ``hf`` extra).

How the model is built and what its stages are: :mod:`memplan.torch.models.hf`. The blocks are
found by :func:`memplan.torch.split.repeated.find_repeated_blocks`; the loss stage computes what
the model's own ``forward(..., labels=labels)`` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.torch.models.hf import (
    IGNORE_INDEX,
    MASKED_FRACTION,
    hf_task,
    import_transformers,
    quiet_transformers,
)
from memplan.torch.split.repeated import find_repeated_blocks
from memplan.torch.split.stages import eval_mode

__all__ = ["HFLoss", "default_labels", "hf_batch", "hf_loss", "hf_stages", "own_loss_matches"]


def _call(model: nn.Module) -> Any:
    input_name = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    extra = {"use_cache": False} if "use_cache" in params else {}

    def call(m: nn.Module, x: Tensor) -> Any:
        return m(**{input_name: x}, **extra)

    return call


def _logits(output: Any) -> Any:
    logits = getattr(output, "logits", None)
    return logits if logits is not None else output


def hf_stages(model: nn.Module, example_input: Tensor) -> Any:
    """Cut an HF model with :func:`memplan.torch.split.repeated.find_repeated_blocks`.

    An encoder-decoder that makes its decoder's input from the input ids (BART, mBART, MVP
    shift them right) is cut at its decoder's blocks: the part before them (the embeddings and
    the whole encoder) is the first stage, and the encoder's output, which every decoder block
    reads besides the previous block's output, is a side input with a gradient (NOTE [ A side
    input with a gradient ] in :mod:`memplan.torch.split.repeated`).

    Returns
    -------
    RepeatedBlocks
        ``embedding``/``stem``, one stage per block, ``head``; checked against the model's logits.

    Raises
    ------
    InputError
        An encoder-decoder that needs decoder inputs besides the input ids (T5), or a model the
        generic linearizer cannot cut.
    """
    kind = type(model).__name__
    try:
        return find_repeated_blocks(model, example_input, call=_call(model), output=_logits)
    except InputError as exc:
        if not getattr(model.config, "is_encoder_decoder", False) or not str(exc).startswith(
            f"{kind} fails on the example input"
        ):
            raise
        raise InputError(
            f"cannot linearize {kind}: an encoder-decoder whose forward needs decoder inputs "
            "besides the input ids (decoder_input_ids or labels), where memplan cuts a model "
            f"called on its input ids alone ({exc}); train it as it is, or its encoder or "
            "decoder alone"
        ) from None


def default_labels(model: nn.Module, example_input: Tensor, seed: int = 0) -> Tensor | None:
    """The labels of the loss stage when none are given (see the module docstring)."""
    task = hf_task(model)
    generator = torch.Generator().manual_seed(seed)
    if task == "causal-lm":
        return example_input.clone()
    if task == "masked-lm":
        picked = torch.rand(example_input.shape, generator=generator) < MASKED_FRACTION
        picked.view(-1)[0] = True  # at least one position
        return torch.where(picked.to(example_input.device), example_input, IGNORE_INDEX)
    if task == "image-classification":
        labels = torch.randint(
            0, model.config.num_labels, (example_input.shape[0],), generator=generator
        )
        return labels.to(example_input.device)
    return None


class HFLoss(nn.Module):
    """The loss an HF model's ``forward(..., labels=labels)`` computes, as the last stage.

    The model is held without being registered (the loss owns no parameters).
    """

    def __init__(
        self, model: nn.Module, labels: Tensor, task: str, from_input: bool = False
    ) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)
        self.task = task
        self.labels_from_input = from_input  # causal LM without labels: the batch's own tokens
        self.register_buffer("labels", labels, persistent=False)
        self._loss_function = None
        if task != "masked-lm":
            with quiet_transformers(import_transformers()):  # "loss_type=None ... default loss"
                self._loss_function = model.loss_function

    def follow_input(self, tokens: Tensor) -> None:
        """A causal LM without labels: its labels are the tokens of this batch from now on (in
        place when the shape is the same: the labels stay the buffer the profile counted).
        """
        if tokens.shape == self.labels.shape:
            self.labels.copy_(tokens)
        else:
            self.labels = tokens.clone()

    def forward(self, logits: Tensor, labels: Tensor | None = None) -> Tensor:
        """The model's loss against ``labels`` (the batch's) or the fixed ones."""
        model = self._model
        labels = self.labels if labels is None else labels
        if self.task == "causal-lm":
            return self._loss_function(logits=logits, labels=labels, vocab_size=logits.shape[-1])
        if self.task == "masked-lm":  # BertForMaskedLM.forward: CrossEntropyLoss on the scores
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return self._loss_function(labels, logits, model.config)


def hf_loss(model: nn.Module, example_input: Tensor, labels: Tensor | None) -> nn.Module | None:
    """The loss stage of an HF model (None when its head is not one memplan knows)."""
    task = hf_task(model)
    if task is None:
        return None
    from_input = labels is None and task == "causal-lm"
    if labels is None:
        labels = default_labels(model, example_input)
    assert labels is not None
    return HFLoss(model, labels.to(example_input.device), task, from_input)


def own_loss_matches(model: nn.Module, loss: HFLoss, example_input: Tensor) -> bool:
    """Whether ``loss`` (the per-token cross-entropy of the model's task, which
    ``loss_chunks`` computes in chunks) is the loss the model's own ``forward(...,
    labels=...)`` computes, on the example input in eval mode: XLM's and FlauBERT's heads score
    every position against the labels unshifted where a causal language model's loss shifts
    them. True where the model returns no loss or logits to compare.
    """
    input_name = getattr(model, "main_input_name", "input_ids")
    with eval_mode(model), torch.no_grad():
        out = model(**{input_name: example_input, "labels": loss.labels})
        own, logits = getattr(out, "loss", None), getattr(out, "logits", None)
        if not isinstance(own, Tensor) or not isinstance(logits, Tensor):
            return True
        return bool(torch.allclose(loss(logits), own, rtol=1e-4, atol=1e-6))


def hf_batch(batch: Mapping[str, Any]) -> tuple[Tensor, Tensor | None]:
    """``(input, labels)`` from an HF-style batch (``input_ids`` or ``pixel_values``, ``labels``).

    Raises
    ------
    InputError
        No input, an attention mask with zeros (padding), or other inputs the chain cannot pass.
    """
    names = [k for k in ("input_ids", "pixel_values") if batch.get(k) is not None]
    if len(names) != 1:
        raise InputError("batch: expected one of input_ids or pixel_values")
    x = batch[names[0]]
    mask = batch.get("attention_mask")
    if mask is not None and not bool(torch.as_tensor(mask).all()):
        raise InputError(
            "batch.attention_mask: padding (zeros) is not supported by the chain API: its stage "
            "wrappers hold one mask for every batch; train with memplan.torch.enable(model, "
            "memory, example_input=batch), which takes each batch's mask"
        )
    token_types = batch.get("token_type_ids")
    if token_types is not None and bool(torch.as_tensor(token_types).any()):
        raise InputError("batch.token_type_ids: only all-zero token types are supported")
    known = {"input_ids", "pixel_values", "attention_mask", "token_type_ids", "labels"}
    for key, value in batch.items():
        if key not in known and value is not None:
            raise InputError(
                f"batch.{key}: not supported (a chain stage reads one tensor); give "
                "input_ids or pixel_values, labels, and an all-ones attention_mask"
            )
    return x, batch.get("labels")
