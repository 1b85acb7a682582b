"""memplan.torch.profiler.identical: the stages the profiler measures once."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from memplan.torch.profiler.identical import stage_signature  # noqa: E402

pytestmark = pytest.mark.torch


class Block(nn.Module):
    def __init__(self, width: int = 8, p: float = 0.0, layer_idx: int = 0, window=None) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.drop = nn.Dropout(p)
        self.layer_idx = layer_idx  # a Hugging Face block's position: left out
        self.sliding_window = window  # changes the computation: kept

    def forward(self, x):
        return self.drop(self.fc(x)).relu() + x


def _sig(block: nn.Module, x=None, *, input_grad=True, counted=None, creates=None):
    x = torch.zeros(2, 8) if x is None else x
    ids = {id(p) for p in block.parameters()}
    return stage_signature(
        block,
        x,
        input_grad=input_grad,
        counted=ids if counted is None else counted,
        creates=ids if creates is None else creates,
    )


def test_identical_blocks_have_one_signature():
    assert _sig(Block(layer_idx=0)) == _sig(Block(layer_idx=7))
    assert hash(_sig(Block()))  # hashable


@pytest.mark.parametrize(
    "other",
    [
        lambda: _sig(Block(width=16), torch.zeros(2, 16)),
        lambda: _sig(Block(p=0.1)),
        lambda: _sig(Block(window=128)),
        lambda: _sig(Block(), torch.zeros(3, 8)),
        lambda: _sig(Block(), torch.zeros(2, 8, dtype=torch.float64)),
        lambda: _sig(Block(), input_grad=False),
        lambda: _sig(Block(), counted=set()),
        lambda: _sig(Block(), creates=set()),
        lambda: _sig(Block().eval()),
        lambda: _sig(Block().requires_grad_(False)),
        lambda: _sig(Block(), torch.zeros(8, 2).t()),
    ],
)
def test_what_changes_the_measurement_changes_the_signature(other):
    assert other() != _sig(Block())
