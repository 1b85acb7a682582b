"""A stage whose forward makes a tensor of its own that requires a gradient (not a parameter, not
its input: MRA's attention without its CUDA kernel returns ``torch.zeros_like(query)
.requires_grad_()``) is refused, naming the stage and the way out (NOTE [ a leaf the forward
makes ] in :mod:`memplan.torch.measure.stage`). The graph holds the tensor and the gradient the
backward accumulates into it until the loop lets go of the loss; no stage term counts either, and
before the refusal ``enable``'s plan for this model measured 22% above its budget.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from memplan.errors import InputError  # noqa: E402
from memplan.torch import enable  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

WIDE = 512
"""The leaf's width: its gradient is the largest tensor of a block's backward."""


class _LeafBlock(nn.Module):
    """MRA's block without its kernel: the attention's result is a fresh leaf that requires a
    gradient, read by the output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(64, WIDE)
        self.out = nn.Linear(WIDE, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        context = torch.zeros_like(self.query(h)).requires_grad_()
        h = h + self.out(context)
        return h + self.mlp(h)


class _LeafModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Linear(32, 64)
        self.blocks = nn.ModuleList(_LeafBlock() for _ in range(4))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(64, 32, generator=generator), torch.randint(
        0, 10, (64,), generator=generator
    )


@pytest.mark.parametrize("budget", ["0.01MB", "100MB"])
def test_a_stage_that_makes_a_leaf_is_refused_naming_it(budget):
    model = _LeafModel()
    x = _batch(0)[0]
    with pytest.raises(
        InputError, match=r"stage 1 \(blocks.0\): its forward makes a tensor of shape \(64, 512\)"
    ):
        enable(copy.deepcopy(model), budget, example_input=x, optimizer="adamw:fused")


def test_the_same_block_with_its_leaf_a_parameter_trains():
    """The way out the message names: the tensor as a parameter of the block."""

    class _ParameterBlock(_LeafBlock):
        def __init__(self) -> None:
            super().__init__()
            self.context = nn.Parameter(torch.zeros(64, WIDE))

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            h = h + self.out(self.context.expand(*h.shape[:-1], WIDE))
            return h + self.mlp(h)

    model = _LeafModel()
    model.blocks = nn.ModuleList(_ParameterBlock() for _ in range(4))
    x, y = _batch(0)
    got = enable(copy.deepcopy(model), "100MB", example_input=x, optimizer="adamw:fused")
    F.cross_entropy(got(x), y).backward()
    assert all(p.grad is not None for p in got.blocks[0].out.parameters())
