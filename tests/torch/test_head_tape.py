"""What a model computes after its last block is its head, module calls or not (NOTE [ The head
on a tape ] in memplan.torch.split.tape): pooling and a norm written as tensor code, a dict
output, Gemma-2's soft-capped logits. Each trains under a plan that recomputes the head, next to
plain training of an identical copy (the same batches, the same random draws), with the same
parameters after the steps; a head that reads an earlier block's activation is refused.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import memplan  # noqa: E402
from memplan.api import schedule_from_sequence  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import checkpointed, linearize, planned, profile_model  # noqa: E402
from memplan.torch.runtime.planned import apply_plan  # noqa: E402
from memplan.torch.split.repeated import find_repeated_blocks  # noqa: E402

pytestmark = pytest.mark.torch

DIM, VOCAB, CLASSES = 16, 50, 5


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.ff = nn.Linear(DIM, DIM)
        self.drop = nn.Dropout(0.2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.drop(torch.tanh(self.ff(self.norm(h))))


class PooledDict(nn.Module):
    """Embedding, blocks, then tensor code: mean pooling, a norm, dropout, a classifier, a dict."""

    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.scale = nn.Parameter(torch.ones(DIM))
        self.cls = nn.Linear(DIM, CLASSES)

    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        pooled = h.mean(1)
        pooled = pooled * torch.rsqrt(pooled.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale
        pooled = nn.functional.dropout(pooled, 0.1, self.training)
        return {"pooled": pooled, "logits": self.cls(pooled)}


class ReadsAnEarlierBlock(PooledDict):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = first = self.blocks[0](self.embed(ids))
        for block in self.blocks[1:]:
            h = block(h)
        return self.cls((h + first).mean(1))


def _head_recomputed(prof) -> memplan.Schedule:
    """Every stage kept but the head, computed once without keeping anything and again at its
    backward."""
    head, loss = prof.length - 2, prof.length - 1
    ops = [("F_all", k) for k in range(head)] + [("F_ck", head), ("F_all", loss), ("B", loss)]
    ops += [("F_all", head), ("B", head)] + [("B", k) for k in reversed(range(head))]
    sched = schedule_from_sequence(prof, ops)
    assert memplan.simulate(prof, sched).valid
    return sched


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    return [
        (
            torch.randint(0, VOCAB, (n, 8), generator=gen),
            torch.randint(0, CLASSES, (n,), generator=gen),
        )
        for n in (4, 4, 3)
    ]


def _assert_same(ref: nn.Module, got: nn.Module) -> None:
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")


def test_a_dict_after_pooling_and_a_norm_in_tensor_code_is_the_head():
    torch.manual_seed(0)
    model = PooledDict()
    ids = torch.randint(0, VOCAB, (4, 8))
    found = find_repeated_blocks(model, ids)
    assert found.head_by == "tape" and [n for n, _ in found.stages][-1] == "head"
    head = found.stages[-1][1]
    assert {id(p) for p in head.parameters()} == {
        id(model.scale), id(model.cls.weight), id(model.cls.bias),
    }  # fmt: skip
    prof = profile_model(copy.deepcopy(model), example_input=ids, repeats=1, name="pooled")
    sched = _head_recomputed(prof)
    ref = copy.deepcopy(model).train()
    got = apply_plan(copy.deepcopy(model).train(), sched, prof, ids)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, got)]
    for i, (x, y) in enumerate(_batches()):
        for m, opt in zip((ref, got), opts, strict=True):
            opt.zero_grad()
            torch.manual_seed(i)  # dropout in the blocks and in the head: the same masks
            out = m(x)
            loss = nn.functional.cross_entropy(out["logits"], y) + out["pooled"].square().mean()
            loss.backward()
            opt.step()
    _assert_same(ref, got)
    counts = planned(got).counters
    assert counts.forward_count(prof.length - 2) == 2  # the head, recomputed


def test_the_chain_api_replays_the_tape():
    torch.manual_seed(1)
    model = PooledDict(blocks=2)
    ids = torch.randint(0, VOCAB, (4, 8))
    prof = profile_model(copy.deepcopy(model), example_input=ids, repeats=1, name="pooled")
    sched = _head_recomputed(prof)
    ref, got = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    chain = linearize(got, ids)
    torch.manual_seed(3)
    expected = chain.modules[-1](ref(ids)["logits"])  # the same fixed targets
    expected.backward()
    wrapped = checkpointed(chain, sched, profile=prof)
    torch.manual_seed(3)
    loss = wrapped(ids)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m, n=name: f"{n}: {m}")


def test_gemma2_soft_capped_logits_are_the_head():
    pytest.importorskip("transformers")
    from memplan.torch.models.tiny import tiny_batch, tiny_model

    model = tiny_model("gemma2", "causal-lm")
    batch = tiny_batch(model, "causal-lm", batch=2, seq=16)
    assert model.config.final_logit_softcapping
    prof = profile_model(
        copy.deepcopy(model), example_input=batch["input_ids"], repeats=1, name="gemma2"
    )
    sched = _head_recomputed(prof)
    ref = copy.deepcopy(model).train()
    got = apply_plan(copy.deepcopy(model).train(), sched, prof, batch)
    assert planned(got).how == "hooks"
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, got)]
    for i in range(2):
        step = tiny_batch(model, "causal-lm", batch=2, seq=16 - 4 * i, seed=i)
        for m, opt in zip((ref, got), opts, strict=True):
            opt.zero_grad()
            torch.manual_seed(i)
            m(**step).loss.backward()
            opt.step()
    _assert_same(ref, got)
    assert planned(got).counters.forward_count(prof.length - 2) == 2


def test_a_head_reading_an_earlier_block_is_cut_but_the_chain_api_refuses_to_train_it():
    """The head reads the first block's output: a side input with a gradient (NOTE [ A side
    input with a gradient ]; ``enable`` trains such a model: tests/torch/test_side_gradients.py).
    The chain's head would replay the traced activation: the chain API refuses to train it."""
    torch.manual_seed(0)
    model, ids = ReadsAnEarlierBlock(), torch.randint(0, VOCAB, (2, 8))
    found = find_repeated_blocks(model, ids)
    assert found.head_by == "tape"
    head = found.stages[-1][1]
    assert head.side_bytes == 2 * ids.numel() * model.embed.embedding_dim * 4  # eval, training
    prof = profile_model(copy.deepcopy(model), example_input=ids, repeats=1, name="reads")
    assert prof.side_gradient_size == head.side_bytes // 2
    with pytest.raises(InputError, match="computed from the parameters"):
        checkpointed(linearize(model, ids), memplan.solve(prof, "store-all", 2**40))


class ScaledWithoutGradients(PooledDict):
    """Tensor code after the last block that computes a scale under ``torch.no_grad()``."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        with torch.no_grad():
            scale = h.abs().mean() + 1.0
        return self.cls(h.mean(1) / scale)


def test_a_head_that_switches_off_autograd_is_refused():
    # a replay of its tape would switch autograd off and leave it off for the rest of the step
    torch.manual_seed(0)
    with pytest.raises(InputError, match="switches autograd's or autocast's mode"):
        find_repeated_blocks(ScaledWithoutGradients(), torch.randint(0, VOCAB, (2, 8)))
    assert torch.is_grad_enabled()
