"""A tensor computed from parameters before the blocks and read by every block, whose gradient
flows back through every block (a learned relative position bias: CPM-Ant, MPNet), one a
block computes and hands to the next besides its hidden state (ZAYA's router states), or an
earlier block's activation the head reads (XLM, CvT):
``enable`` follows the model's own forward, so every block reads the step's own and autograd
sums its gradient from every block's backward; the profile counts the tensor, its summed
gradient and one block's share of it (NOTE [ A side input with a gradient ] in
:mod:`memplan.torch.split.repeated`). The chain API, whose stages hold what was traced, refuses
to train it.

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
from memplan.errors import InputError  # noqa: E402
from memplan.torch import checkpointed, enable, linearize, planned, profile_model  # noqa: E402
from tests.torch.test_enable_budget import (  # noqa: E402
    assert_rows_hold,
    budget_between,
    train_measured,
    trained_plainly,
)

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

VOCAB, DIM, HEADS, SEQ, BATCH = 200, 32, 4, 32, 4
STEPS = 3


class BiasedBlock(nn.Module):
    """Attention whose scores add a position bias the model computed before the blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.norm = nn.LayerNorm(DIM)

    def forward(self, h: torch.Tensor, position_bias: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = self.qkv(self.norm(h)).view(b, t, 3, HEADS, DIM // HEADS).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / (DIM // HEADS) ** 0.5 + position_bias
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, DIM)
        h = h + self.out(attended)
        return h + self.mlp(h)


class BiasedLM(nn.Module):
    """MPNet's structure: a learned relative position bias (a bucket embedding, computed once
    before the blocks, batch x heads x seq x seq) read by every block."""

    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.buckets = nn.Embedding(2 * SEQ, HEADS)
        self.blocks = nn.ModuleList(BiasedBlock() for _ in range(blocks))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        position = torch.arange(t, device=ids.device)
        relative = position[None, :] - position[:, None] + SEQ
        bias = self.buckets(relative).permute(2, 0, 1).unsqueeze(0).expand(b, -1, -1, -1)
        bias = bias.contiguous()
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h, bias)
        return self.head(self.norm(h))


class BiasAfterLM(BiasedLM):
    """The bias computed after the token embedding: autograd reaches the nodes that computed it
    before the embedding's (it orders ready nodes by creation), so the first stage's
    recomputation must come at whichever it reaches first
    (:meth:`memplan.torch.runtime.iteration.PlannedIteration.reached_through`)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        h = self.embed(ids)
        position = torch.arange(t, device=ids.device)
        relative = position[None, :] - position[:, None] + SEQ
        bias = self.buckets(relative).permute(2, 0, 1).unsqueeze(0).expand(b, -1, -1, -1)
        bias = bias.contiguous()
        for block in self.blocks:
            h = block(h, bias)
        return self.head(self.norm(h))


class HandingBlock(nn.Module):
    """A block that hands a state of its own to the next one (ZAYA's router states)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(DIM, 4 * DIM)
        self.mix = nn.Linear(4 * DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(
        self, h: torch.Tensor, previous: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.router(h)
        if previous is not None:
            state = state + previous
        return h + self.mlp(h) + self.mix(torch.tanh(state)), state


class HandingLM(nn.Module):
    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(HandingBlock() for _ in range(blocks))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, state = self.embed(ids), None
        for block in self.blocks:
            h, state = block(h, state)
        return self.head(h)


class SkipLM(HandingLM):
    """The head reads the first block's output besides the last one's (XLM's and CvT's heads
    read an earlier activation), through tensor code after the last block."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        first = None
        for block in self.blocks:
            h = block(h)[0]
            first = h if first is None else first
        return self.head(h + 0.5 * first)


class ForTheNextBlock(HandingBlock):
    """Returns a state for the next block that its own output does not depend on (ZAYA's
    router states): autograd runs the nodes that made it at the end of the next block's
    backward, where the runtime runs the plan up to this block's backward."""

    def forward(
        self, h: torch.Tensor, previous: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = h + self.mlp(h)
        if previous is not None:
            out = out + self.mix(torch.tanh(previous))
        return out, self.router(h)


class ForTheNextLM(HandingLM):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(ForTheNextBlock() for _ in range(4))


class ForTheOneAfter(ForTheNextLM):
    """Hands each block's state to the block after the next."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, states = self.embed(ids), [None, None]
        for block in self.blocks:
            h, state = block(h, states[-2])
            states.append(state)
        return self.head(h)


class CrossBlock(nn.Module):
    """A decoder block: attends to its hidden state and to the encoder's output."""

    def __init__(self) -> None:
        super().__init__()
        self.own = BiasedBlock()
        self.query = nn.Linear(DIM, DIM)
        self.key_value = nn.Linear(DIM, 2 * DIM)

    def forward(self, h: torch.Tensor, memory: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.own(h, bias)
        k, v = self.key_value(memory).chunk(2, -1)
        scores = self.query(h) @ k.transpose(-1, -2) / DIM**0.5
        return h + scores.softmax(-1) @ v


class EncoderDecoderLM(nn.Module):
    """BART's structure: encoder blocks, then decoder blocks that read the encoder's output
    besides their hidden state (cross-attention), the decoder's input the ids shifted right:
    the encoder is the first stage, its output a side input of every decoder block."""

    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.encoder = nn.ModuleList(BiasedBlock() for _ in range(blocks))
        self.encoder_norm = nn.LayerNorm(DIM)
        self.decoder = nn.ModuleList(CrossBlock() for _ in range(blocks))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        causal = torch.full((t, t), float("-inf"), device=ids.device).triu(1)
        h = self.embed(ids)
        for block in self.encoder:
            h = block(h, torch.zeros_like(causal))
        memory = self.encoder_norm(h)
        shifted = torch.cat([ids.new_zeros(ids.shape[0], 1), ids[:, :-1]], dim=1)
        h = self.embed(shifted)
        for block in self.decoder:
            h = block(h, memory, causal)
        return self.head(h)


class ClassTokenStage(nn.Module):
    """A stage of CvT: the first embeds the input itself, the last prepends a class token and
    returns it apart from the hidden state."""

    def __init__(self, first: bool = False, last: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM) if first else None
        self.token = nn.Parameter(torch.randn(1, 1, DIM) * 0.02) if last else None
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.mix = nn.Linear(DIM, DIM)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.embed is not None:
            h = self.embed(h)
        if self.token is not None:
            h = torch.cat([self.token.expand(h.shape[0], -1, -1), h], dim=1)
        h = h + self.mlp(torch.tanh(h))
        h = h + self.mix(h.mean(1, keepdim=True))  # the token reads every position
        if self.token is None:
            return h, None
        token, h = h.split([1, h.shape[1] - 1], dim=1)
        return h, token


class ClassTokenLM(nn.Module):
    """CvT's structure: nothing before the first stage, and the head reads the class token the
    last stage returns besides its hidden state (not the hidden state)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            [ClassTokenStage(first=True), ClassTokenStage(), ClassTokenStage(last=True)]
        )
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, token = ids, None
        for block in self.blocks:
            h, token = block(h)
        assert token is not None
        return self.head(self.norm(token)).expand(-1, ids.shape[1], -1)


MODELS = {
    "bias": BiasedLM,
    "bias-after": BiasAfterLM,
    "class-token": ClassTokenLM,
    "encoder-decoder": EncoderDecoderLM,
    "handing": HandingLM,
    "for-the-next": ForTheNextLM,
    "skip": SkipLM,
}


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = _ids(seed)
    return ids, ids


def _loss(m, b, kept):
    return F.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten())


@functools.cache
def _profile(kind: str):
    return profile_model(MODELS[kind](), example_input=_ids(0), repeats=1, name=kind)


def _plain(model: nn.Module, batches) -> nn.Module:
    return trained_plainly(
        model, batches, _loss, lambda params: torch.optim.AdamW(params, lr=1e-3, fused=True)
    )


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_tensor_blocks_read_trains_as_plain_training_within_the_budget(kind, share):
    """At the least memory, between it and store-all's, and at store-all's: every step within
    the budget, the parameters after three AdamW steps on different batches plain training's."""
    model, prof = MODELS[kind](), _profile(kind)
    assert prof.side_gradient_size
    named = {"optimizer": "adamw:fused", "output_held": False}
    budget = budget_between(prof, share)
    got = enable(copy.deepcopy(model), budget, example_input=_ids(0), profile=prof, **named)
    if share == 0.0:
        counts = planned(got).planned_forward_counts()
        assert sum(counts) > len(counts), "the budget forces recomputation"
    optimizer = torch.optim.AdamW(got.parameters(), lr=1e-3, fused=True)
    batches = [_batch(10 + s) for s in range(STEPS)]
    rows = train_measured(got, optimizer, batches, _loss)
    assert_rows_hold(rows, budget, None)
    ref = _plain(model, batches)
    for (name, a), (_, b) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert [p.grad is None for p in got.parameters()] == [p.grad is None for p in ref.parameters()]


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_chain_api_refuses_to_train_it(kind):
    model, prof = MODELS[kind](), _profile(kind)
    with pytest.raises(InputError, match="computed from the parameters"):
        checkpointed(linearize(model, _ids(0)), memplan.solve(prof, "store-all", 2**40))


def test_a_state_for_a_block_after_the_next_that_its_maker_does_not_use_is_refused():
    """Autograd would run the nodes that made it two blocks early, before a plan recomputes the
    block that made them ('a tensor stage 1 saved for its backward was not recomputed')."""
    with pytest.raises(InputError, match=r"blocks.0 \(ForTheNextBlock\) returns a tensor a block"):
        enable(ForTheOneAfter(), "100MB", example_input=_ids(0), optimizer="adamw:fused")
