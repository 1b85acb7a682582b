"""A recomputation stops at the last tensor its stage saves for the backward (NOTE [ A
recomputation stops at its last saved tensor ] in :mod:`memplan.torch.runtime.iteration`):
what a block computes after that (a residual sum, a scaling, the last matrix product, which
saves its input before it computes) is not computed again when nothing reads the block's output,
as ``torch.utils.checkpoint`` does by default. Training is plain training's, the steps within
their budget.

The peaks are the allocator's own count (:func:`memplan.torch.measure.allocator_peak.loop_peaks`),
apart from memplan's runtime and planner; budgets come from the model's own profile.
"""

from __future__ import annotations

import copy
import functools

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from memplan.torch import enable, planned, profile_model  # noqa: E402
from tests.torch.test_enable_budget import (  # noqa: E402
    StemBlocksHead,
    assert_rows_hold,
    assert_same_parameters,
    budget_between,
    classifier_batch,
    classifier_loss,
    fused_adamw,
    train_measured,
    trained_plainly,
)

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

BATCH, WIDTH, BLOCKS, STEPS = 256, 64, 4, 3


class _Tail(nn.Module):
    """What a block computes after its last saved tensor, counting its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return h * 0.5  # a product by a number saves nothing


class _Block(nn.Module):
    """An MLP, a dropout (its mask saved), the residual sum and the tail; with ``relu_last``
    the block ends in a ReLU, which saves its output: the recomputation stops once the output
    is made."""

    def __init__(self, relu_last: bool) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )
        self.drop = nn.Dropout(0.1)
        self.tail = _Tail()
        self.relu_last = relu_last

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.tail(h + self.drop(self.mlp(h)))
        return torch.relu(out) if self.relu_last else out


def _model(relu_last: bool) -> StemBlocksHead:
    return StemBlocksHead(lambda: _Block(relu_last), BLOCKS, WIDTH)


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return classifier_batch((BATCH, 32), 10, seed)


@functools.cache
def _profile(relu_last: bool):
    return profile_model(_model(relu_last), example_input=_batch(0)[0], repeats=1, name="tail")


def _tails(ops: list[tuple[str, int]], k: int, stops: bool) -> int:
    """The calls of stage ``k``'s tail in one step of a plan of ``ops``: each forward, but a
    recomputation right before the stage's backward (``F_all k``, ``B k``: nothing reads its
    output) when it ``stops`` before its tail."""
    forwards = [i for i, (op, stage) in enumerate(ops) if stage == k and op != "B"]
    last = [i for i in forwards[1:] if ops[i] == ("F_all", k) and ops[i + 1] == ("B", k)]
    return len(forwards) - (len(last) if stops else 0)


@pytest.mark.parametrize("relu_last", [False, True])
def test_a_recomputed_block_stops_at_its_last_saved_tensor(relu_last):
    """At the least memory (blocks recomputed in the backward, right before their own): the
    blocks' tails do not run again in those recomputations, but where the block's last
    operation saves its output (the ReLU); the parameters after several AdamW steps with
    dropout are plain training's, every step within the budget, the plan within 2% of the
    measured peak from the second step on."""
    model, prof = _model(relu_last), _profile(relu_last)
    budget = budget_between(prof, 0.0)
    named = {"optimizer": "adamw:fused", "output_held": False}
    got = enable(copy.deepcopy(model), budget, example_input=_batch(0)[0], profile=prof, **named)
    plan = planned(got)
    assert plan is not None
    ops = [(op.op, op.stage) for op in plan.schedule.ops]
    blocks = [plan.names.index(f"blocks.{i}") for i in range(BLOCKS)]
    stopped = [_tails(ops, k, stops=True) for k in blocks]
    every = [_tails(ops, k, stops=False) for k in blocks]
    assert stopped != every, "blocks are recomputed right before their backward"
    tails = every if relu_last else stopped
    for block in got.blocks:
        block.tail.calls = 0  # enable ran the model to find its chain
    batches = [_batch(10 + s) for s in range(STEPS)]
    torch.manual_seed(1)
    rows = train_measured(got, fused_adamw(got.parameters()), batches, classifier_loss)
    assert_rows_hold(rows, budget)
    assert [block.tail.calls for block in got.blocks] == [STEPS * n for n in tails]
    torch.manual_seed(1)
    ref = trained_plainly(model, batches, classifier_loss, fused_adamw)
    assert_same_parameters(ref, got)
