"""Prototype: a causal language model's head and loss computed in chunks of tokens.

Usage::

    nice -n 10 python benchmarks/chunked_loss.py --models gpt2 llama --chunks 4 8 16

On the small-width language models of ``bench_alternatives.MODELS`` (batch 4 x 256 tokens) the
logits (batch x tokens x vocabulary) dominate a training step's memory: the loss keeps their
log-softmax, its backward makes their gradient and a temporary as large. Computed in ``c`` chunks of
tokens, each chunk's head (the output projection) and cross-entropy run under
``torch.utils.checkpoint`` (recomputed in the backward), the step never holds more than one
chunk's logits. The loss is exact: the sum of the chunks' summed cross-entropies over the number
of predicted tokens, as the model's own mean (its gradients are compared with plain training's).

Measured per model (one thread, SGD, ``zero_grad(set_to_none=True)``, the allocator's own count:
:func:`memplan.torch.measure.allocator_peak.allocator_peak`): plain training; Hugging Face checkpointing of
every layer with the model's own loss; every layer checkpointed with the chunked loss (what a
memplan plan with a chunked loss stage could reach, recomputing every block); every layer kept
with the chunked loss. Not part of memplan: a measurement for the model change it would need.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import machine
from bench_alternatives import MODELS
from torch.utils.checkpoint import checkpoint

from memplan.torch.measure.allocator_peak import allocator_peak, profiled_copy
from memplan.torch.models.registry import build_model
from memplan.torch.split.hf import default_labels


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
    )


def chunked_loss(
    hidden: torch.Tensor, head: torch.nn.Linear, labels: torch.Tensor, chunks: int
) -> torch.Tensor:
    """Next-token cross-entropy of ``head(hidden)`` against ``labels``, ``chunks`` chunks of
    tokens at a time, each recomputed in the backward (the model's mean, exactly)."""
    assert head.bias is None, "a language-model head without bias"
    targets = F.pad(labels, (0, 1), value=-100)[:, 1:]  # position t predicts token t+1
    count = (targets != -100).sum()
    total = hidden.new_zeros((), dtype=torch.float32)
    for part_h, part_t in zip(
        hidden.chunk(chunks, dim=1), targets.chunk(chunks, dim=1), strict=True
    ):
        total = total + checkpoint(_chunk_loss, part_h, head.weight, part_t, use_reentrant=False)
    return total / count


def _checkpointing(model: torch.nn.Module, on: bool) -> None:
    kwargs = {"use_reentrant": False}
    if on:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.activation_checkpointing_disable()


def measure(key: str, chunk_counts: list[int]) -> dict[str, Any]:
    spec = MODELS[key]
    torch.set_num_threads(1)
    model, x, label = build_model(
        spec["model"], batch_size=spec["batch_size"], input_shape=spec["input_shape"],
        config=spec["config"],
    )  # fmt: skip
    model.train()
    labels = default_labels(model, x)
    head = model.get_output_embeddings()
    base = model.base_model
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.0)  # the weights stay: every way sees the same

    def plain(batch: torch.Tensor) -> torch.Tensor:
        return model(input_ids=batch, labels=labels, use_cache=False).loss

    def chunked(c: int):
        def loss(batch: torch.Tensor) -> torch.Tensor:
            hidden = base(input_ids=batch, use_cache=False).last_hidden_state
            return chunked_loss(hidden, head, labels, c)

        return loss

    ways: list[tuple[str, Any, bool]] = [("plain", plain, False), ("hf checkpointing", plain, True)]
    for c in chunk_counts:
        ways.append((f"every layer checkpointed, loss in {c} chunks", chunked(c), True))
        ways.append((f"every layer kept, loss in {c} chunks", chunked(c), False))
    found: dict[str, Any] = {"model": label, "ways": []}
    reference = None
    for name, loss_fn, ckpt in ways:
        _checkpointing(model, ckpt)
        for _ in range(2):  # a warm-up, then the measured step
            optimizer.zero_grad(set_to_none=True)
            torch.manual_seed(0)
            batch = profiled_copy(x)

            def step(batch: torch.Tensor = batch, loss_fn: Any = loss_fn) -> float:
                loss = loss_fn(batch)
                loss.backward()
                optimizer.step()
                return float(loss)

            held = [*model.parameters(), *model.buffers(), batch, labels]
            peak, value = allocator_peak(step, held, x.device)
        grads = [p.grad.detach().clone() for p in params]
        if reference is None:
            reference, error = grads, 0.0
        else:
            error = max(
                float((g - r).abs().max()) / (float(r.abs().max()) or 1.0)
                for g, r in zip(grads, reference, strict=True)
            )
        found["ways"].append({"name": name, "peak": peak, "loss": value, "grad_error": error})
        print(f"  {key}: {name}: {peak / 1e6:.1f} MB, loss {value:.6f}, grads {error:.1e}")
    _checkpointing(model, False)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    parser.add_argument("--chunks", nargs="+", type=int, default=[4, 8, 16])
    parser.add_argument("--out", type=Path, default=Path("chunked_loss.json"))
    args = parser.parse_args()
    print(f"# {machine()}; one thread", flush=True)
    found = {key: measure(key, args.chunks) for key in args.models}
    args.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    sys.exit(main())
