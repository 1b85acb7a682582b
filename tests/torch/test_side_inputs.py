"""What blocks read besides their hidden state, and what memplan makes of it (NOTE [ Stage
wrappers ] in memplan.torch.split.repeated): indices an earlier block computed without a
gradient train under ``enable`` with each step's own; keys and values an earlier layer stores
for a later one in a mapping are refused by the chain API (they train under ``enable``:
tests/torch/test_shared_mapping.py; blocks that share their weights train: test_shared_blocks.py);
a buffer a block reassigns is restored after a recomputation.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import memplan  # noqa: E402
from memplan.api import describe  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import checkpointed, enable, linearize, planned, profile_model  # noqa: E402
from memplan.torch.base.storage import StaticStorages  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB, DIM, SEQ = 40, 16, 8


class TopKBlock(nn.Module):
    """Attends to the keys an index picks; returns its hidden state and the top-k positions of
    its own scores, which the next block reuses (DeepSeek-V3.2's shared indexer)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.score = nn.Linear(DIM, 1)
        self.ff = nn.Linear(DIM, DIM)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, h: torch.Tensor, picked: torch.Tensor | None = None):
        if self.training:
            self.calls = self.calls + 1  # a buffer put in place of the old one, every call
        mine = self.score(self.norm(h)).squeeze(-1).topk(SEQ // 2, dim=-1).indices
        picked = mine if picked is None else picked
        keys = torch.gather(h, 1, picked[..., None].expand(-1, -1, DIM)).mean(1, keepdim=True)
        return h + torch.tanh(self.ff(self.norm(h) + keys)), mine


class TopKNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(TopKBlock() for _ in range(3))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, picked = self.embed(ids), None
        for block in self.blocks:
            h, picked = block(h, picked)
        return self.head(h)


class SharingDict(dict):
    """A dict subclass, which pytree does not open (Gemma-4's KVSharingDict)."""


class StoresKeys(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ff = nn.Linear(DIM, DIM)

    def forward(self, h: torch.Tensor, shared: SharingDict) -> torch.Tensor:
        if "keys" not in shared:
            shared["keys"] = self.ff(h)  # the first layer stores, the later ones reuse
        return h + torch.tanh(shared["keys"])


class SharedKeys(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(StoresKeys() for _ in range(3))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, shared = self.embed(ids), SharingDict()
        for block in self.blocks:
            h = block(h, shared)
        return self.head(h)


def _ids(seed: int, size: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (size, SEQ), generator=torch.Generator().manual_seed(seed))


def test_indices_an_earlier_block_computed_train_under_enable():
    torch.manual_seed(0)
    model, x = TopKNet(), _ids(0)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="topk")
    desc = describe(prof)
    least, store_all = desc["min_memory"]["chain"], desc["store_all_memory"]
    budget = least + (store_all - least) // 3
    with pytest.raises(InputError, match="computed from the parameters"):
        checkpointed(linearize(model, x), memplan.solve(prof, "rotor", budget))
    ref = copy.deepcopy(model).train()
    got = enable(
        copy.deepcopy(model).train(),
        budget,
        example_input=x,
        profile=prof,
        optimizer="sgd",
        output_held=False,
    )  # the loop below; fmt: skip
    counts = planned(got).planned_forward_counts()
    assert sum(counts) > len(counts), "the budget forces recomputation"
    for m in (ref, got):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            batch = _ids(10 + step)
            nn.functional.cross_entropy(m(batch).flatten(0, 1), batch.flatten()).backward()
            opt.step()
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")
    for (name, p), (_, q) in zip(ref.named_buffers(), got.named_buffers(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")  # counted once a step
    assert float(got.blocks[0].calls) == 3


def test_a_replaced_buffer_stops_being_a_weight_when_freed():
    """TopKBlock replaces its ``calls`` buffer at every call: the old storage is freed and the
    allocator may give its address to an activation of the same forward, which a set of
    addresses taken at the step's start would count as a weight (one saved tensor less in the
    forward than in its recomputation, depending on the heap)."""
    block = TopKBlock()
    static = StaticStorages(block.buffers())
    old = block.calls.data_ptr()
    assert old in static and list(static) == [old]
    block.train()(torch.zeros(1, SEQ, DIM))  # self.calls = self.calls + 1: the old one freed
    assert old not in static and len(static) == 0
    kept = torch.zeros(4)
    resized = StaticStorages([kept])
    address = kept.data_ptr()
    kept.untyped_storage().resize_(0)  # as FSDP2 frees an unsharded parameter
    assert address not in resized
    a, b = torch.zeros(4), torch.zeros(4)
    assert set(StaticStorages([a, b]).without([a.data_ptr()])) == {b.data_ptr()}


def test_keys_stored_in_a_mapping_are_refused_by_the_chain_api():
    """Its stage wrappers would hold the traced keys (NOTE [ A side input with a gradient ])."""
    torch.manual_seed(0)
    model = SharedKeys()
    chain = linearize(model, _ids(0))
    prof = profile_model(model, example_input=_ids(0), repeats=1, name="shared-keys")
    assert prof.side_gradient_size
    with pytest.raises(InputError, match="holds what its blocks read besides their hidden"):
        checkpointed(chain, memplan.solve(prof, "store-all", 2**40))
