"""One block called for every layer, its weights shared (ALBERT): each call is a stage, the
weights counted once (the first stage's backward makes their gradient, the later ones' add to
it: NOTE [ a gradient a later stage made ] in :mod:`memplan.torch.measure.tied`), and
``enable``'s hooks on the one module tell its calls apart by the stage the step is at.

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

import memplan  # noqa: E402
from memplan.api import describe  # noqa: E402
from memplan.torch import checkpointed, enable, linearize, planned, profile_model  # noqa: E402
from memplan.torch.runtime.plan import planned_forward_counts  # noqa: E402
from memplan.torch.split.linearize import NextTokenLoss  # noqa: E402
from memplan.torch.split.repeated import find_repeated_blocks  # noqa: E402
from tests.torch.test_enable_budget import (  # noqa: E402
    assert_rows_hold,
    assert_same_parameters,
    budget_between,
    train_measured,
    trained_plainly,
)

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

VOCAB, DIM, HEADS, SEQ, BATCH, LAYERS = 200, 32, 4, 32, 4, 4
STEPS = 3


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.drop = nn.Dropout(0.1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = self.qkv(self.norm(h)).view(b, t, 3, HEADS, DIM // HEADS).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.drop(attended.transpose(1, 2).reshape(b, t, DIM))
        return h + self.mlp(h)


class SharedLM(nn.Module):
    """ALBERT's loop: one layer group, called for each of the layers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.groups = nn.ModuleList([Block()])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for _ in range(LAYERS):
            h = self.groups[0](h)
        return self.head(h)


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _loss(m, b, kept):
    return F.cross_entropy(m(b[0]).flatten(0, 1), b[0].flatten())


@functools.cache
def _profile():
    return profile_model(SharedLM(), example_input=_ids(0), repeats=1, name="shared")


def _plain(model: nn.Module, batches, optimizer) -> nn.Module:
    torch.manual_seed(1)  # the same dropout draws
    return trained_plainly(model, batches, _loss, optimizer)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-4, fused=True)


def test_each_call_of_the_shared_block_is_a_stage_its_weights_counted_once():
    found = find_repeated_blocks(SharedLM(), _ids(0))
    names = [f"groups.0#{i + 1}" for i in range(LAYERS)]
    assert [name for name, _ in found.stages] == ["embedding", *names, "head"]
    prof = _profile()
    blocks = [s for s in prof.stages if s.name.startswith("groups.0#")]
    weights = sum(p.numel() * 4 for p in SharedLM().groups.parameters())
    assert blocks[0].weight_size >= weights and all(s.weight_size == 0 for s in blocks[1:])
    # the last call's backward, the first to run, makes the gradient; the others add to it
    assert [s.weight_grad_size for s in blocks] == [0] * (LAYERS - 1) + [weights]


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_a_shared_block_trains_as_plain_training_within_the_budget(share):
    """At the least memory, between it and store-all's, and at store-all's: every step within
    the budget, the parameters after three AdamW steps on different batches plain training's,
    the same dropout draws."""
    model, prof = SharedLM(), _profile()
    named = {"optimizer": "adamw:fused", "output_held": False}
    budget = budget_between(prof, share)
    got = enable(copy.deepcopy(model), budget, example_input=_ids(0), profile=prof, **named)
    if share == 0.0:
        counts = planned(got).planned_forward_counts()
        assert max(counts[1 : 1 + LAYERS]) > 1, "the budget forces a block's recomputation"
    batches = [(_ids(10 + s),) for s in range(STEPS)]
    torch.manual_seed(1)
    rows = train_measured(got, _adamw(got.parameters()), batches, _loss)
    assert_rows_hold(rows, budget, None)
    assert_same_parameters(_plain(model, batches, _adamw), got, rtol=1e-5, atol=1e-6)


def test_the_chain_api_trains_a_shared_block_as_plain_training():
    """One step of the chain under a plan that recomputes: the gradients of plain training."""
    model, prof, x = SharedLM(), _profile(), _ids(0)
    sched = memplan.solve(prof, "rotor", describe(prof)["min_memory"]["chain"])
    ref, got = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    torch.manual_seed(11)
    expected = NextTokenLoss(x)(ref(x))
    expected.backward()
    wrapped = checkpointed(linearize(got, x), sched, profile=prof)
    torch.manual_seed(11)
    loss = wrapped(x)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    counts = [wrapped.counters.forward_count(k) for k in range(prof.length)]
    assert counts == planned_forward_counts(sched, prof.length) and max(counts) > 1
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m, n=name: f"{n}: {m}")
