"""Join networks (Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans. R. Soc. A
2020): several branches, each a chain, joined by a loss; the bundled ones and user factories.

The protocol (docs/profiling.md): a factory (a name of :data:`JOIN_MODELS` or a
``package.module:factory`` spec) returns a :class:`JoinModel`, or any object with

* ``branches``: a list of ``(name, module, example_input)``, each module cut into stages like a
  chain model (:func:`memplan.torch.split.linearize.split_model`: ResNet, ``nn.Sequential``, or a
  ``memplan_stages()`` method), without a loss;
* ``turn``: a module called as ``turn(out_0, out_1, ...)`` on the branch outputs, returning the
  scalar loss.

Branches that share parameters (Siamese networks) count their weights once, on the first branch.
A factory may take a ``batch_size`` keyword (used by ``--batch-size``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.torch.base.blame import BUILDING, model_errors
from memplan.torch.models.registry import import_factory
from memplan.torch.zoo.resnet import BasicBlock, ResNet

DEFAULT_JOIN_BATCH = 8


@dataclass
class JoinModel:
    """A join network to profile: named branches with their inputs, and the turn (the loss)."""

    branches: list[tuple[str, nn.Module, Tensor]]
    turn: nn.Module
    name: str | None = None


# ----------------------------------------------------------------------------- bundled models


def _resnet18_trunk(embedding: int) -> nn.Module:
    """ResNet-18 whose classifier is an embedding layer (the usual Siamese/CLIP image trunk)."""
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes=embedding)


class TripletLoss(nn.Module):
    """Triplet margin loss of (anchor, positive, negative) embeddings (Hoffer & Ailon 2015)."""

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__()
        self.loss = nn.TripletMarginLoss(margin=margin)

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return self.loss(anchor, positive, negative)


class ContrastiveLoss(nn.Module):
    """Symmetric InfoNCE of matching (image, text) pairs on cosine similarities (CLIP-style)."""

    def __init__(self, temperature: float = 0.07) -> None:
        super().__init__()
        self.temperature = temperature

    def forward(self, image: Tensor, text: Tensor) -> Tensor:
        a = nn.functional.normalize(image, dim=1)
        b = nn.functional.normalize(text, dim=1)
        logits = a @ b.t() / self.temperature
        target = torch.arange(len(a), device=a.device)
        ce = nn.functional.cross_entropy
        return (ce(logits, target) + ce(logits.t(), target)) / 2


class TextEncoder(nn.Module):
    """A small text branch: token embedding, Transformer encoder layers, mean pool, projection."""

    def __init__(
        self, vocab: int = 8192, width: int = 256, layers: int = 4, heads: int = 4, out: int = 256
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True)
            for _ in range(layers)
        )
        self.head = nn.Sequential(_MeanPool(), nn.Linear(width, out))

    def memplan_stages(self) -> list[tuple[str, nn.Module]]:
        return [
            ("embed", self.embed),
            *((f"layer{i}", layer) for i, layer in enumerate(self.layers)),
            ("head", self.head),
        ]

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class _MeanPool(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.mean(dim=1)


def _images(batch: int, seed: int, size: int = 224) -> Tensor:
    return torch.randn((batch, 3, size, size), generator=torch.Generator().manual_seed(seed))


def siamese_resnet18(batch_size: int | None = None) -> JoinModel:
    """Three copies of one ResNet-18 trunk (shared weights, 128-d embeddings), triplet loss."""
    batch = batch_size or DEFAULT_JOIN_BATCH
    trunk = _resnet18_trunk(128)
    return JoinModel(
        branches=[
            (role, trunk, _images(batch, k))
            for k, role in enumerate(("anchor", "positive", "negative"))
        ],
        turn=TripletLoss(),
        name="siamese-resnet18",
    )


def cross_modal(batch_size: int | None = None, seq_len: int = 64) -> JoinModel:
    """A ResNet-18 image branch and a 4-layer Transformer text branch, contrastive loss."""
    batch = batch_size or DEFAULT_JOIN_BATCH
    tokens = torch.randint(0, 8192, (batch, seq_len), generator=torch.Generator().manual_seed(1))
    return JoinModel(
        branches=[
            ("image", _resnet18_trunk(256), _images(batch, 0)),
            ("text", TextEncoder(), tokens),
        ],
        turn=ContrastiveLoss(),
        name="cross-modal-resnet18",
    )


def tiny_join(batch_size: int | None = None) -> JoinModel:
    """Two small MLP branches and an MSE-like turn: for tests (profiles in a second)."""
    batch = batch_size or 4
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    b = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 24), nn.Linear(24, 8))
    gen = torch.Generator().manual_seed(2)
    return JoinModel(
        branches=[
            ("left", a, torch.randn((batch, 16), generator=gen)),
            ("right", b, torch.randn((batch, 12), generator=gen)),
        ],
        turn=ContrastiveLoss(),
        name="tiny-join",
    )


JOIN_MODELS: dict[str, Callable[..., JoinModel]] = {
    "siamese-resnet18": siamese_resnet18,
    "cross-modal-resnet18": cross_modal,
    "tiny-join": tiny_join,
}
"""Name -> factory of the bundled join networks (``memplan profile NAME``)."""


# ----------------------------------------------------------------------------- a spec's join network


def resolve_join(spec: str, batch_size: int | None = None) -> Any | None:
    """The join network a model spec names, or None when it is not a join network."""
    if spec in JOIN_MODELS:
        factory: Callable[..., Any] = JOIN_MODELS[spec]
    elif spec.startswith(("hf:", "timm:")):  # Hugging Face and timm models are chains
        return None
    elif ":" in spec:
        with model_errors(spec, BUILDING):  # the user's module: NOTE [ whose error ]
            factory = import_factory(spec)
    else:
        return None
    kwargs = {}
    if batch_size is not None:
        try:
            accepts = "batch_size" in inspect.signature(factory).parameters
        except (TypeError, ValueError):
            accepts = False
        if not accepts:
            if spec in JOIN_MODELS:
                raise InputError(f"model {spec!r}: its factory takes no batch size")
            return None
        kwargs["batch_size"] = batch_size
    with torch.random.fork_rng(devices=[]), model_errors(spec, BUILDING):
        torch.manual_seed(0)
        built = factory(**kwargs)
    if hasattr(built, "branches") and hasattr(built, "turn"):
        return built
    if spec in JOIN_MODELS:  # pragma: no cover - the bundled factories return joins
        raise InputError(f"model {spec!r}: not a join network")
    return None
