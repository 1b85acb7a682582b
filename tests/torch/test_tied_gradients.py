"""A parameter two stages share: the profiler's answer to how autograd sums its two gradients
(NOTE [ a gradient a later stage made ] in memplan/torch/measure/tied.py) is what autograd does.

A token embedding tied to a head: the head's gradient waits in autograd's input buffer and the
embedding's is added to it, out of place for an ``nn.Linear`` head (its gradient is a view), in
place for a head that returns a tensor of its own. ``sums_in_place``, run on the head alone, is
checked against the allocator's events of the whole model's backward; the embedding stage's
figure carries the sum's copy exactly where autograd makes one.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from memplan.torch import profile_model  # noqa: E402
from memplan.torch.measure.runner import StageRunner  # noqa: E402
from memplan.torch.measure.tied import sums_in_place  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB, WIDTH = 500, 32


class _OwnGradient(torch.autograd.Function):
    """``h @ weight.T`` whose backward returns a new tensor for the weight."""

    @staticmethod
    def forward(ctx, h, weight):
        ctx.save_for_backward(h, weight)
        return h @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        h, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        return grad @ weight, rows.t().mm(h.reshape(-1, h.shape[-1]))


class _Head(nn.Module):
    def __init__(self, embedding: nn.Embedding, own: bool) -> None:
        super().__init__()
        self.embedding = embedding  # tied: the same weight
        self.own = own

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        weight = self.embedding.weight
        return _OwnGradient.apply(h, weight) if self.own else F.linear(h, weight)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.linear(h))


class _Tied(nn.Module):
    """A token embedding, a run of blocks and a head tied to the embedding."""

    def __init__(self, own: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(_Block() for _ in range(3))
        self.head = _Head(self.embedding, own)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embedding(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _autograd_sums_in_place(model: _Tied, ids: torch.Tensor) -> bool:
    """Whether the whole model's backward adds the embedding's gradient into the head's in
    place: no block of the weight's size allocated by an addition (the allocator's events)."""
    from torch._C._profiler import _EventType

    size = model.embedding.weight.numel() * model.embedding.weight.element_size()
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu, profile_memory=True) as prof:
        model(ids).sum().backward()
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.name == "aten::add" and any(
            c.tag == _EventType.Allocation and c.extra_fields.alloc_size == size
            for c in node.children
        ):
            return False
    return True


@pytest.mark.parametrize("own", [False, True])
def test_the_profiler_sees_how_autograd_sums_a_tied_gradient(own):
    model, ids = _Tied(own), torch.randint(0, VOCAB, (4, 16))
    expected = _autograd_sums_in_place(model, ids)
    assert expected == own  # nn.Linear's gradient is a view; the own head's is not
    h = model.embedding(ids).detach()
    runner = StageRunner(model.head, h, input_grad=True)
    weight = model.embedding.weight
    assert sums_in_place(runner, [weight]) == ({id(weight)} if expected else set())
    assert weight.grad is None


def test_the_embedding_stage_counts_the_sum_where_autograd_makes_it():
    """The embedding's backward holds one more copy of the tied gradient under an nn.Linear
    head (the sum, out of place) than under a head whose gradient autograd adds into."""
    ids = torch.randint(0, VOCAB, (4, 16))
    fresh = {}
    for own in (False, True):
        prof = profile_model(_Tied(own), example_input=ids, repeats=1, name="tied")
        fresh[own] = prof.stages[0].backward_overhead_fresh
    size = VOCAB * WIDTH * 4
    assert fresh[False] - fresh[True] >= size - 4 * 16 * WIDTH * 4  # the sum, less g[1] let go
