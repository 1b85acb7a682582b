"""One rank of a DDP run (CPU, gloo) of a model under a memplan plan, beside plain DDP.

Run by tests/torch/test_enable_loops.py as ``python tests/torch/ddp_worker.py RANK WORLD PORT
OUT``. Every rank builds the same tiny models (gpt-tiny, whose chain replaces its forward, and a
model of repeated blocks, followed by hooks), enables a plan that recomputes, wraps it in
``DistributedDataParallel`` as a user would, and trains three steps on its own shard of each
batch next to a plain DDP copy; it writes the largest parameter difference per model to OUT.
"""

from __future__ import annotations

import copy
import json
import sys

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import memplan
from memplan.torch import build_model, enable, planned, profile_model
from tests.torch.ranks import gloo_rank


class Blocks(nn.Module):
    """A stem, four repeated blocks, a classifier: cut at its blocks (hooks)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(12, 32)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU(), nn.Dropout(0.1))
            for _ in range(4)
        )
        self.cls = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.cls(h)


def _least_budget(model: nn.Module, x: torch.Tensor) -> tuple[int, object]:
    """SGD's least memory, for the loop below: it holds its output (``out``) into the next step."""
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="ddp")
    return memplan.solve(prof, "rotor", 1, optimizer="sgd", output_held=True).min_memory, prof


def _case(name: str, rank: int) -> float:
    torch.manual_seed(0)
    if name == "gpt-tiny":
        model, _, _ = build_model("gpt-tiny", batch_size=2, input_shape=(16,))
        gen = torch.Generator().manual_seed(1)
        xs = [torch.randint(0, 128, (4, 16), generator=gen) for _ in range(3)]
        ys = [torch.randint(0, 128, (4, 16), generator=gen) for _ in range(3)]
    else:
        model = Blocks()
        gen = torch.Generator().manual_seed(1)
        # 64 positions per row: the activations, not the weights, set the least memory
        xs = [torch.randn(4, 64, 12, generator=gen) for _ in range(3)]
        ys = [torch.randint(0, 4, (4, 64), generator=gen) for _ in range(3)]
    shard = [x.chunk(2)[rank] for x in xs], [y.chunk(2)[rank] for y in ys]
    memory, prof = _least_budget(model, shard[0][0])
    plain = DistributedDataParallel(copy.deepcopy(model).train())
    under = enable(
        copy.deepcopy(model).train(), memory, example_input=shard[0][0], profile=prof,
        optimizer="sgd", output_held=True,
    )  # fmt: skip
    assert sum(planned(under).planned_forward_counts()) > prof.length
    ddp = DistributedDataParallel(under)
    for wrapped in (plain, ddp):
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        for step, (x, y) in enumerate(zip(*shard, strict=True)):
            opt.zero_grad()
            torch.manual_seed(10 * step + rank)
            out = wrapped(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
            opt.step()
    return max(
        (p - q).abs().max().item()
        for p, q in zip(plain.module.parameters(), ddp.module.parameters(), strict=True)
    )


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    result = gloo_rank(
        rank, world, port, lambda: {name: _case(name, rank) for name in ("gpt-tiny", "blocks")}
    )
    with open(out, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
