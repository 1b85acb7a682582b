"""Layers kept as parallel module lists, the i-th of each called in a loop (XLM, FlauBERT: NOTE
[ Parallel lists as blocks ] in :mod:`memplan.torch.split.groups`), or called through
``layer.forward(...)``, which runs no module hooks (SqueezeBERT): each call group is a block,
its stage its operations on a tape, the loop's own code (residual additions, functional dropout,
a padding mask applied in place) included; a recomputation replays the step's own operations.

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

from memplan.errors import InputError  # noqa: E402
from memplan.torch import enable, planned, profile_model  # noqa: E402
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
STEPS, PAD = 3, 0


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, HEADS, DIM // HEADS).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / (DIM // HEADS) ** 0.5
        scores = scores.masked_fill(~keep[:, None, None, :], torch.finfo(scores.dtype).min)
        weights = F.dropout(scores.softmax(-1), p=0.1, training=self.training)
        return self.out((weights @ v).transpose(1, 2).reshape(b, t, DIM))


class ParallelListsLM(nn.Module):
    """XLM's layers: ``attentions[i]``, ``norm1[i]``, ``ffns[i]``, ``norm2[i]`` in a loop, the
    padding mask (computed from the token ids) applied in place after each layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.attentions = nn.ModuleList(Attention() for _ in range(LAYERS))
        self.norm1 = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(LAYERS))
        self.ffns = nn.ModuleList(
            nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
            for _ in range(LAYERS)
        )
        self.norm2 = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != PAD
        mask = keep.unsqueeze(-1).to(torch.float32)
        h = self.embed(ids)
        h *= mask
        for i in range(LAYERS):
            attended = F.dropout(self.attentions[i](h, keep), p=0.1, training=self.training)
            h = self.norm1[i](h + attended)
            h = h + self.ffns[i](h)
            h = self.norm2[i](h)
            h *= mask
        return self.head(h)


class Layer(nn.Module):
    """A layer whose ``forward`` adds its residuals between its modules' calls."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = Attention()
        self.norm = nn.LayerNorm(DIM)
        self.ffn = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = h + F.dropout(self.attention(self.norm(h), keep), p=0.1, training=self.training)
        return h + self.ffn(h)


class HooklessLM(nn.Module):
    """SqueezeBERT's loop: ``layer.forward(...)``, which runs no module hooks; the residual
    after the last module call of each layer, in the layer's code."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != PAD
        h = self.embed(ids)
        for layer in self.layers:
            h = layer.forward(h, keep)
        return self.head(self.norm(h))


MODELS = {"lists": ParallelListsLM, "hookless": HooklessLM}
STAGES = {
    "lists": [f"attentions.{i}..norm2.{i}" for i in range(LAYERS)],
    "hookless": [f"layers.{i}" for i in range(LAYERS)],
}


class ReadsAnEarlierGroup(ParallelListsLM):
    """Each layer also reads the first layer's output: not a chain of the groups."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != PAD
        h = self.embed(ids)
        first = None
        for i in range(LAYERS):
            h = self.norm1[i](h + self.attentions[i](h, keep))
            h = self.norm2[i](h + self.ffns[i](h) + (0 if first is None else first))
            first = h if first is None else first
        return self.head(h)


def _ids(seed: int) -> torch.Tensor:
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))
    ids[0, -3:] = PAD  # padding: the mask differs from batch to batch
    ids[1, -(seed % 5) :] = PAD
    return ids


def _loss(m, b, kept):
    return F.cross_entropy(m(b[0]).flatten(0, 1), b[0].flatten())


@functools.cache
def _profile(kind: str):
    return profile_model(MODELS[kind](), example_input=_ids(0), repeats=1, name=kind)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_each_call_group_is_a_block(kind):
    model = MODELS[kind]()
    found = find_repeated_blocks(model, _ids(0))
    assert [name for name, _ in found.stages] == ["embedding", *STAGES[kind], "head"]
    assert found.head_by == "tape" and len(found.groups) == LAYERS
    # the next call after the last group (the head's first module) ends it
    first = model.head if kind == "lists" else model.norm
    assert found.group_end is not None and found.group_end[0] is first


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_call_groups_train_as_plain_training_within_the_budget(kind, share):
    """At the least memory, between it and store-all's, and at store-all's: every step within
    the budget, the parameters after three AdamW steps on different batches (each its own
    padding) plain training's, the same dropout draws."""
    model, prof = MODELS[kind](), _profile(kind)
    named = {"optimizer": "adamw:fused", "output_held": False}
    budget = budget_between(prof, share)
    got = enable(copy.deepcopy(model), budget, example_input=_ids(0), profile=prof, **named)
    if share == 0.0:
        counts = planned(got).planned_forward_counts()
        assert max(counts[1 : 1 + LAYERS]) > 1, "the budget forces a group's recomputation"
    optimizer = torch.optim.AdamW(got.parameters(), lr=1e-3, eps=1e-4, fused=True)
    batches = [(_ids(10 + s),) for s in range(STEPS)]
    torch.manual_seed(1)
    rows = train_measured(got, optimizer, batches, _loss)
    assert_rows_hold(rows, budget, None)
    torch.manual_seed(1)  # the same dropout draws
    ref = trained_plainly(
        model, batches, _loss, lambda p: torch.optim.AdamW(p, lr=1e-3, eps=1e-4, fused=True)
    )
    assert_same_parameters(ref, got, rtol=1e-5, atol=1e-6)


def test_a_group_reading_an_earlier_groups_activation_is_refused():
    with pytest.raises(InputError, match="call group of attentions.2 also reads a tensor"):
        find_repeated_blocks(ReadsAnEarlierGroup(), _ids(0))


def test_xlm_trains_and_its_own_loss_is_not_chunked():
    """XLM (transformers' parallel lists) is cut into its call groups; its head
    scores every position against the labels unshifted, which the chunked loss (the per-token
    cross-entropy of a causal language model) is not: ``loss_chunks`` is refused."""
    pytest.importorskip("transformers")
    from memplan.torch.models.tiny import tiny_batch, tiny_model

    model = tiny_model("xlm", "masked-lm")
    batches = [tiny_batch(model, "masked-lm", seq=SEQ, seed=s) for s in range(STEPS)]
    with pytest.raises(InputError, match="not XLM's, which scores every position unshifted"):
        enable(copy.deepcopy(model), "1GB", example_input=batches[0], loss_chunks=2)
    got = enable(copy.deepcopy(model), "1GB", example_input=batches[0], optimizer="adamw")
    groups = [f"attentions.{i}..layer_norm2.{i}" for i in range(model.config.n_layers)]
    assert planned(got).names == ["embedding", *groups, "head", "loss"]
    ref = copy.deepcopy(model)
    for m in (ref, got):
        optimizer = torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-4)
        for b in batches:
            torch.manual_seed(1)
            optimizer.zero_grad(set_to_none=True)
            m(**b).loss.backward()
            optimizer.step()
    assert_same_parameters(ref, got, rtol=1e-5, atol=1e-6)
