"""A stage's backward frees what autograd alone holds: the output's gradient ``g[k+1]``, which its
first node consumes, and the output ``x[k+1]`` when the stage saved it itself (a block ending in a
ReLU, as ResNet's and RegNet's do). The profile measures the backward so (NOTE [ The backward
owns what it frees ] in :mod:`memplan.torch.measure.stage`): store-all's plan is plain training's
measured peak, not two hidden states above it, and under ``enable`` a convolutional network of
one's own trains equal to plain training, every step within the budget, planned as measured.

The peaks are the allocator's own count (:func:`memplan.torch.measure.allocator_peak.loop_peaks`),
apart from memplan's runtime and planner; budgets come from the model's own profile.
"""

from __future__ import annotations

import copy
import functools

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from memplan.api import describe  # noqa: E402
from memplan.torch import enable, planned, profile_model  # noqa: E402
from memplan.torch.measure.allocator_peak import loop_peaks  # noqa: E402
from tests.torch.test_enable_budget import (  # noqa: E402
    assert_rows_hold,
    assert_same_parameters,
    budget_between,
    train_measured,
    trained_plainly,
)

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

CHANNELS, SIDE, BATCH, CLASSES, STEPS = 16, 16, 8, 10, 3
PLANNED = 0.02
"""Planned against measured, in both directions, once the loop is seen."""
NAMED = {"optimizer": "adamw:fused", "output_held": False}
"""The loop below, named from the start."""


class ReluBlock(nn.Module):
    """``relu(x + branch(x))``: the ReLU saves its output, the block's own output."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(CHANNELS, 2 * CHANNELS, 1)
        self.mix = nn.Conv2d(2 * CHANNELS, CHANNELS, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.mix(torch.tanh(self.expand(x))))


class ReluNet(nn.Module):
    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, CHANNELS, 3, padding=1)
        self.blocks = nn.ModuleList(ReluBlock() for _ in range(blocks))
        self.classifier = nn.Linear(CHANNELS, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.classifier(h.mean((2, 3)))


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(BATCH, 3, SIDE, SIDE, generator=gen)
    return images, torch.randint(0, CLASSES, (BATCH,), generator=gen)


def _loss(model: nn.Module, batch, kept) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


@functools.cache
def _profile():
    return profile_model(ReluNet(), example_input=_batch(0)[0], repeats=1, name="relu-net")


def _adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, fused=True)


def test_store_all_is_plain_trainings_peak():
    prof = _profile()
    block = next(st for st in prof.stages if st.name.startswith("blocks."))
    assert block.output_saved  # the ReLU's
    planned_peak = describe(prof, "adamw:fused", "at-backward")["store_all_memory"]
    model = ReluNet()
    rows = loop_peaks(
        model, _adamw(model.parameters()), [_batch(10 + s) for s in range(STEPS)], _loss
    )
    measured = max(peak for peak, _ in rows[1:])  # the optimizer's state made at the first
    # before: one block's output and its gradient above, for the whole backward of a block
    assert measured <= planned_peak < measured + block.output_size, (planned_peak, measured)


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_a_relu_network_trains_as_plain_training_within_the_budget(share):
    prof = _profile()
    budget = budget_between(prof, share)
    model = ReluNet()
    got = enable(copy.deepcopy(model), budget, example_input=_batch(0)[0], profile=prof, **NAMED)
    counts = planned(got).planned_forward_counts()
    assert sum(counts) > len(counts), "the budget forces recomputation"
    batches = [_batch(10 + s) for s in range(STEPS)]
    rows = train_measured(got, _adamw(got.parameters()), batches, _loss)
    assert_rows_hold(rows, budget, PLANNED)
    ref = trained_plainly(model, batches, _loss, _adamw)
    assert_same_parameters(ref, got, rtol=1e-5, atol=1e-6)
