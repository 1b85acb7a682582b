"""Blocks that share keys and values through a mapping (Gemma-4's ``KVSharingDict``): a block
stores the keys and values it computed into a mapping the model passes to every block, a later
block reads them from it instead of computing its own. ``enable`` follows the model's own
forward: the first forward writes into the model's mapping; the runtime holds, for a block's
recomputation, a copy of the mapping as the block saw it, and the recomputation writes into a
copy of that copy (NOTE [ A mapping the blocks share ] in :mod:`memplan.torch.split.repeated`).

Before, a recomputation wrote its keys and values into the model's mapping, which the runtime
held to the step's end: through their autograd graph every tensor that recomputation saved
stayed alive too (Gemma-4's tiny model measured 16% over its budget). Here a later block stores
again under the same key: a recomputation of the block between them must read the first one's
keys, not the ones the mapping holds when the forward has ended.

The peaks are the allocator's own count (:func:`memplan.torch.measure.allocator_peak.loop_peaks`),
apart from memplan's runtime and planner; budgets come from the model's own profile.
"""

from __future__ import annotations

import copy
import functools
from collections import UserDict
from collections.abc import Iterator, MutableMapping

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from memplan.api import describe  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import enable, planned, profile_model  # noqa: E402
from tests.torch.test_enable_budget import (  # noqa: E402
    assert_rows_hold,
    assert_same_parameters,
    budget_between,
    train_measured,
    trained_plainly,
)

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

VOCAB, DIM, HEADS, SEQ, BATCH = 200, 32, 4, 32, 4
STEPS = 3
MODES = ("store", "reuse", "store", "reuse")
"""Per block: compute keys and values and store them, or read the stored ones."""


class Shared(UserDict):
    """The mapping the blocks share (a ``UserDict``, as Gemma-4's, which pytree does not open)."""


class SharedDict(dict):
    """A ``dict`` subclass, which pytree does not open either."""


class SharingBlock(nn.Module):
    """Attention whose keys and values are its own (stored for later blocks) or an earlier
    block's (read from the mapping), then an MLP."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.norm = nn.LayerNorm(DIM)
        self.q = nn.Linear(DIM, DIM)
        self.kv = nn.Linear(DIM, 2 * DIM) if mode == "store" else None
        self.out = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, h: torch.Tensor, shared: MutableMapping) -> torch.Tensor:
        b, t, _ = h.shape
        x = self.norm(h)
        q = self.q(x).view(b, t, HEADS, -1).transpose(1, 2)
        if self.kv is not None:
            k, v = (z.view(b, t, HEADS, -1).transpose(1, 2) for z in self.kv(x).chunk(2, -1))
            shared["kv"] = (k, v)
        else:
            k, v = shared["kv"]
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.out(attended.transpose(1, 2).reshape(b, t, DIM))
        return h + self.mlp(h)


class SharingLM(nn.Module):
    """Gemma-4's structure: a mapping made in the model's forward, passed to every block."""

    mapping: type = Shared

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(SharingBlock(mode) for mode in MODES)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, shared = self.embed(ids), self.mapping()
        for block in self.blocks:
            h = block(h, shared=shared)
        return self.head(self.norm(h))


class Opaque(MutableMapping):
    """A mutable mapping of one's own (not a dict or a UserDict): memplan cannot copy it."""

    def __init__(self) -> None:
        self._items: dict = {}

    def __getitem__(self, key):
        return self._items[key]

    def __setitem__(self, key, value) -> None:
        self._items[key] = value

    def __delitem__(self, key) -> None:
        del self._items[key]

    def __iter__(self) -> Iterator:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class DictLM(SharingLM):
    mapping = SharedDict


class OpaqueLM(SharingLM):
    mapping = Opaque


MODELS = {"user-dict": SharingLM, "dict": DictLM}


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = _ids(seed)
    return ids, ids


def _loss(m, b, kept):
    return F.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten())


def _adamw(params):
    # eps 1e-4: Adam amplifies float noise where a gradient is near eps (other kernels, threads)
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-4, fused=True)


@functools.cache
def _profile(kind: str = "user-dict"):
    return profile_model(MODELS[kind](), example_input=_ids(0), repeats=1, name=kind)


def _plain(model: nn.Module, batches) -> nn.Module:
    return trained_plainly(model, batches, _loss, _adamw)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_blocks_sharing_keys_in_a_mapping_train_as_plain_training_within_the_budget(kind, share):
    """At the least memory, between it and store-all's, and at store-all's: every step within
    the budget, the parameters after three AdamW steps on different batches plain training's."""
    model, prof = MODELS[kind](), _profile(kind)
    assert prof.side_gradient_size, "the keys a later block reads count as a side input"
    named = {"optimizer": "adamw:fused", "output_held": False}
    budget = budget_between(prof, share)
    got = enable(copy.deepcopy(model), budget, example_input=_ids(0), profile=prof, **named)
    counts = planned(got).planned_forward_counts()
    if share == 0.0:
        assert sum(counts) > len(counts), "the budget forces recomputation"
        assert all(c > 1 for c in counts[1:5]), f"every block recomputed: {counts}"
    batches = [_batch(10 + s) for s in range(STEPS)]
    rows = train_measured(got, _adamw(got.parameters()), batches, _loss)
    assert_rows_hold(rows, budget, None)
    ref = _plain(model, batches)
    for (name, a), (_, b) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_a_recomputation_reads_what_the_block_read_and_writes_into_a_copy():
    """Recomputed, block 1 reads block 0's keys (the model's mapping holds block 2's by then);
    the model's mapping is not held after the step, nor written by a recomputation."""
    seen: list[Shared] = []

    class Watched(SharingLM):
        def forward(self, ids):
            h, shared = self.embed(ids), Shared()
            seen.append(shared)
            for block in self.blocks:
                h = block(h, shared=shared)
            return self.head(self.norm(h))

    model, prof = Watched(), _profile()
    desc = describe(prof, optimizer="adamw:fused", gradients="at-backward")
    got = enable(
        copy.deepcopy(model), desc["min_memory"]["chain"], example_input=_ids(0), profile=prof,
        optimizer="adamw:fused", output_held=False,
    )  # fmt: skip
    seen.clear()
    ids = _ids(3)
    loss = _loss(got, (ids, ids), None)
    (step,) = seen
    stored = step["kv"]
    loss.backward()
    assert step["kv"] is stored, "a recomputation wrote into the model's mapping"
    ref = copy.deepcopy(model)
    _loss(ref, (ids, ids), None).backward()
    for (name, a), (_, b) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        tol = 1e-5 * float(a.grad.abs().max())  # float noise relative to the tensor's largest
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=tol, msg=lambda m, n=name: n)


def test_a_mapping_memplan_cannot_copy_is_refused():
    with pytest.raises(
        InputError,
        match=r"blocks.1 \(SharingBlock\) .* a mapping, a Opaque, that memplan cannot copy",
    ):
        enable(OpaqueLM(), "100MB", example_input=_ids(0), optimizer="adamw:fused")


def _gemma4_text():
    """A tiny Gemma-4 text model whose last two layers reuse the keys and values of the first
    two (``num_kv_shared_layers=2``: its ``KVSharingDict``), per-layer inputs included."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma4TextConfig(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=2 * DIM, num_hidden_layers=4,
        num_attention_heads=HEADS, num_key_value_heads=2, head_dim=8, global_head_dim=8,
        max_position_embeddings=2 * SEQ, sliding_window=8, num_kv_shared_layers=2,
        layer_types=["sliding_attention", "full_attention"] * 2,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
        use_cache=False, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    assert config.kv_sharing_modes == ["store", "store", "reuse", "reuse"]
    torch.manual_seed(0)
    return transformers.Gemma4ForCausalLM(config)


def _hf_loss(m, b, kept):
    return m(input_ids=b[0], labels=b[1]).loss


def test_a_tiny_gemma4_whose_layers_reuse_keys_trains_as_plain_training():
    """At the least memory: every step within the budget, the parameters after three AdamW
    steps on different batches plain training's."""
    model = _gemma4_text()
    example = {"input_ids": _ids(0), "labels": _ids(0)}
    prof = profile_model(copy.deepcopy(model), example_input=example, repeats=1, name="gemma4")
    assert prof.side_gradient_size, "the keys the later layers read count as a side input"
    desc = describe(prof, optimizer="adamw:fused", gradients="at-backward")
    budget = desc["min_memory"]["chain"]
    got = enable(
        copy.deepcopy(model), budget, example_input=example, profile=prof,
        optimizer="adamw:fused", output_held=False,
    )  # fmt: skip
    counts = planned(got).planned_forward_counts()
    assert sum(counts) > len(counts), "the budget forces recomputation"
    batches = [_batch(10 + s) for s in range(STEPS)]
    rows = train_measured(got, _adamw(got.parameters()), batches, _hf_loss)
    assert_rows_hold(rows, budget, None)
    assert_same_parameters(trained_plainly(model, batches, _hf_loss, _adamw), got)
