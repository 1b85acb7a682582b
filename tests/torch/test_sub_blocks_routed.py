"""Sub-blocks of a block whose experts are chosen by a router (``enable(..., sub_blocks=True)``,
NOTE [ Sub-block stages ] in :mod:`memplan.torch.split.sub_blocks`).

The block is MiniMax's shape, of one's own: a norm, an attention that mixes the positions with a
decay table held as a buffer (MiniMax's lightning attention's ``diagonal_decay``) and its
residual, a norm, and a mixture of experts and its residual. The experts run as transformers
runs them: the token-expert pairs sorted by expert (``sort``), counted per expert (``histc``)
and multiplied by each expert's weights at once (``grouped_mm``), so that no value of the
routing reaches Python and the block is cut into its four parts. A recomputation of a part
restores the buffers that part reads (batch-norm statistics), and holds a copy of them while it
runs: the plan counts that of the part's own buffers; a recomputation of the mixture of experts
that copied the attention's decay table too measured that table above the plan (MiniMax's tiny
model, 5-11% over its budget). Budgets come from the model's own profile.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from memplan.errors import InputError  # noqa: E402
from memplan.torch import enable, planned, profile_model  # noqa: E402
from memplan.torch.measure.allocator_peak import loop_peaks  # noqa: E402
from memplan.torch.runtime import iteration  # noqa: E402
from memplan.torch.split.sub_blocks import cutting_sub_blocks  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

PLANNED = 0.02
"""Planned against measured, in both directions, once the loop is seen."""
WIDTH, HEADS, EXPERTS, TOP, SEQUENCE, VOCAB, STEPS = 32, 4, 4, 2, 96, 40, 3


class _Mixing(nn.Module):
    """Each head's values mixed over the positions by a fixed decay table (a buffer, as
    MiniMax's lightning attention's), then projected out."""

    def __init__(self) -> None:
        super().__init__()
        self.values = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        steps = torch.arange(SEQUENCE, dtype=torch.float32)
        rates = torch.linspace(0.05, 0.5, HEADS)[:, None, None]
        distance = (steps[:, None] - steps[None, :]).clamp(min=0)
        causal = steps[:, None] >= steps[None, :]
        self.register_buffer("decay", torch.where(causal, torch.exp(-rates * distance), 0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        v = self.values(x).view(b, s, HEADS, WIDTH // HEADS).transpose(1, 2)
        mixed = self.decay @ v  # (b, heads, s, head width)
        # the state a next chunk of the sequence would start from (MiniMax's lightning attention
        # computes it for its cache): nothing reads it in training, autograd lets it go
        state = (v * self.decay[:, -1, :, None]).transpose(-1, -2) @ v
        del state
        return self.out(mixed.transpose(1, 2).reshape(b, s, WIDTH))


class _Experts(nn.Module):
    """A router's top experts per token, computed grouped by expert (transformers'
    ``grouped_mm_experts_forward``): no value of the routing is read into Python."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.gate_up = nn.Parameter(torch.randn(EXPERTS, 2 * WIDTH, WIDTH) / WIDTH**0.5)
        self.down = nn.Parameter(torch.randn(EXPERTS, WIDTH, WIDTH) / WIDTH**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        tokens = x.reshape(-1, WIDTH)
        probs = F.softmax(self.router(tokens), dim=-1)
        weights, experts = torch.topk(probs, TOP, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        order_experts, order = torch.sort(experts.reshape(-1))
        chosen = tokens[order // TOP]
        counts = torch.histc(order_experts.float(), bins=EXPERTS, min=0, max=EXPERTS - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        gate, up = F.grouped_mm(chosen, self.gate_up.transpose(-2, -1), offs=offsets).chunk(2, -1)
        out = F.grouped_mm(F.silu(gate) * up, self.down.transpose(-2, -1), offs=offsets)
        out = out * weights.reshape(-1)[order, None]
        summed = torch.zeros_like(tokens).index_add(0, order // TOP, out)
        return summed.view(b, s, WIDTH)


class _Block(nn.Module):
    """MiniMax's decoder layer's order: norm, mixing and residual, norm, experts and residual
    (the residual is the normed hidden state)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.mixing = _Mixing()
        self.norm2 = nn.LayerNorm(WIDTH)
        self.experts = _Experts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        h = h + self.mixing(h)
        h = self.norm2(h)
        return h + self.experts(h)


class _TokenLM(nn.Module):
    """An embedding, ``count`` blocks made by ``block()``, a head: the repeated blocks memplan
    cuts."""

    def __init__(self, block: Callable[[], nn.Module], count: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(block() for _ in range(count))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, SEQUENCE), generator=gen)
    return ids, torch.roll(ids, -1, dims=1)


def _loss(model: nn.Module, batch, kept) -> torch.Tensor:
    ids, labels = batch
    return F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())


NAMED = {"optimizer": "adamw", "output_held": False}
RECOMPUTATION_SLACK = 8192
"""What a recomputation holds besides its forward: the forked RNG state (5,056 bytes on CPU)."""


def _least(model: nn.Module, prof) -> int:
    """The least memory ``enable`` states when it refuses 0.01 MB, in bytes."""
    with pytest.raises(InputError, match="the least memory that fits is") as caught:
        enable(
            copy.deepcopy(model), "0.01MB", example_input=_batch(0)[0], profile=prof,
            sub_blocks=True, **NAMED,
        )  # fmt: skip
    found = re.search(r"fits is [\d.]+ [KMG]?B \((\d+) bytes\)", str(caught.value))
    assert found, str(caught.value)
    return int(found.group(1))


def test_a_routed_block_cut_into_sub_blocks_trains_within_its_budget(monkeypatch):
    """At the least memory of the cut chain and halfway to the plain peak, every step measures
    within the budget and within 2% of the plan, and the parameters after AdamW steps on
    different batches are plain training's."""
    model = _TokenLM(_Block, 2)
    with cutting_sub_blocks(True):
        prof = profile_model(copy.deepcopy(model), example_input=_batch(0)[0], repeats=1)
    least = _least(model, prof)
    got = enable(
        copy.deepcopy(model), least, example_input=_batch(0)[0], profile=prof, sub_blocks=True,
        **NAMED,
    )  # fmt: skip
    plan = planned(got)
    assert plan is not None
    assert [n for n in plan.names if n.startswith("blocks.0")] == [
        f"blocks.0[{p}/4]" for p in range(1, 5)
    ]
    counts = dict(zip(plan.names, plan.plan.forward_counts, strict=True))
    assert counts["blocks.0[4/4]"] > 1  # the experts of a block with a buffer are recomputed
    restored: list[tuple[set[int], list[str]]] = []  # per recomputation: parameters, buffers
    recomputing = iteration.recomputing

    def noted(module: nn.Module, *args):
        buffers = [name for name, _ in module.named_buffers()]
        restored.append(({id(p) for p in module.parameters()}, buffers))
        return recomputing(module, *args)

    monkeypatch.setattr(iteration, "recomputing", noted)
    reference = copy.deepcopy(model)
    batches = [_batch(seed) for seed in range(1, STEPS + 1)]

    torch.manual_seed(1)
    optimizer = torch.optim.AdamW(got.parameters(), lr=1e-2, eps=1e-4)
    rows = loop_peaks(got, optimizer, batches, _loss, after=lambda: plan.schedule.peak_memory)
    torch.manual_seed(1)
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2, eps=1e-4)
    for batch in batches:
        plain.zero_grad()
        _loss(reference, batch, {}).backward()
        plain.step()

    for i, (measured, planned_peak) in enumerate(rows):
        assert measured <= least, (i, measured, least)
        if i >= 1:  # the loop seen at the first step
            assert planned_peak is not None
            assert abs(planned_peak - measured) <= PLANNED * measured, (i, planned_peak, measured)
    for (name, ours), theirs in zip(got.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)
    # what each recomputation of the experts restores (and copies while it runs): not the table
    experts = [names for ids, names in restored if id(got.blocks[0].experts.gate_up) in ids]
    assert experts and not any(experts), experts


class _Branching(nn.Module):
    """A residual block that also computes a state nothing reads (MiniMax's lightning attention
    computes the key-value state of a next chunk for its cache): autograd lets the branch go,
    with what it saved, at the end of the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.state = nn.Linear(WIDTH, 8 * WIDTH)
        self.up = nn.Linear(WIDTH, 8 * WIDTH)
        self.down = nn.Linear(8 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = torch.sigmoid(self.state(x))  # saved by sigmoid's backward: 8 x the width
        del state
        return x + self.down(F.gelu(self.up(x)))


def test_a_recomputation_holds_nothing_for_a_branch_autograd_let_go(monkeypatch):
    """Each recomputation (``F_all``) of a block peaks as the block's own forward does, not above
    it by the branch's state, which a recomputation that kept a tensor for every slot of the
    first forward held to its end (MiniMax's: 64 KB above its plan); and training equals plain
    training's."""
    from memplan.torch.measure.allocator_peak import allocator_peak

    model = _TokenLM(_Branching, 4)
    prof = profile_model(copy.deepcopy(model), example_input=_batch(0)[0], repeats=1)
    got = enable(copy.deepcopy(model), _least_plain(model, prof), example_input=_batch(0)[0],
                 profile=prof, **NAMED)  # fmt: skip
    plan = planned(got)
    assert plan is not None
    peaks: list[tuple[str, int]] = []
    fill = iteration.PlannedIteration._fill_slots

    def measured(self, k, inp, pack, packed, stop=False):  # type: ignore[no-untyped-def]
        peak, out = allocator_peak(
            lambda: fill(self, k, inp, pack, packed, stop), [], torch.device("cpu")
        )
        peaks.append((self.names[k], peak))
        return out

    monkeypatch.setattr(iteration.PlannedIteration, "_fill_slots", measured)
    reference = copy.deepcopy(model)
    torch.manual_seed(1)
    optimizer = torch.optim.AdamW(got.parameters(), lr=1e-2, eps=1e-4)
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2, eps=1e-4)
    for seed in range(1, STEPS + 1):
        for m, opt in ((got, optimizer), (reference, plain)):
            opt.zero_grad(set_to_none=True)
            _loss(m, _batch(seed), {}).backward()
            opt.step()

    # the block's own forward with gradients, its output kept: the branch's state freed
    block, x, kept = copy.deepcopy(model.blocks[0]), torch.randn(2, SEQUENCE, WIDTH), []
    x.requires_grad_(True)
    forward, _ = allocator_peak(lambda: kept.append(block(x)), [], torch.device("cpu"))
    blocks = [(name, peak) for name, peak in peaks if name.startswith("blocks.")]
    assert blocks  # the plan recomputes blocks
    for name, peak in blocks:  # the RNG state a recomputation forks (5,056 bytes) apart
        assert peak <= forward + RECOMPUTATION_SLACK, (name, peak, forward)
    for (name, ours), theirs in zip(got.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)


def _least_plain(model: nn.Module, prof) -> int:
    with pytest.raises(InputError, match="the least memory that fits is") as caught:
        enable(copy.deepcopy(model), "0.01MB", example_input=_batch(0)[0], profile=prof, **NAMED)
    found = re.search(r"fits is [\d.]+ [KMG]?B \((\d+) bytes\)", str(caught.value))
    assert found, str(caught.value)
    return int(found.group(1))
