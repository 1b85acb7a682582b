"""Models memplan cuts without a memplan_stages(): repeated blocks (memplan.torch.split.repeated),
DenseNet per dense layer, and timm / torchvision models where those packages load.

Which combination runs here: torch 2.13.0 (CPU build) without torchvision and timm. torchvision's
PyPI wheels (0.28.0 pairs with torch 2.13.0) are built for torch's CUDA build and fail to load
their operators beside the CPU build ("operator torchvision::nms does not exist"), and timm
imports torchvision, so the timm and torchvision tests below are skipped with that reason here and
run wherever the packages load.
"""

from __future__ import annotations

import copy
import importlib

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import memplan  # noqa: E402
from memplan.api import describe  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import build_model, checkpointed, linearize, profile_model  # noqa: E402
from memplan.torch.runtime.plan import planned_forward_counts  # noqa: E402
from memplan.torch.split.linearize import DenseLayerStage, NextTokenLoss  # noqa: E402
from memplan.torch.split.repeated import find_repeated_blocks  # noqa: E402
from memplan.torch.split.wrappers import BlockCall, PrefixStage  # noqa: E402
from memplan.torch.zoo.densenet import DenseNet  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB, DIM, SEQ = 40, 16, 8


class Block(nn.Module):
    """A pre-norm transformer-like block: attention under a causal mask, then an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        scores = (q @ k.transpose(1, 2)).masked_fill(mask, float("-inf")) / DIM**0.5
        x = x + self.drop(scores.softmax(-1) @ v)
        return x + self.mlp(x)


class TinyLM(nn.Module):
    """Embedding, an nn.ModuleList of blocks, final norm and head; no memplan_stages()."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)  # used directly by forward
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=ids.device).triu(1)  # from the shape
        x = self.embed(ids) + self.pos[:seq]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def _tiny_lm() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(5)
    return TinyLM(), torch.randint(0, VOCAB, (3, SEQ))


def test_repeated_blocks_are_found_and_wrapped():
    model, x = _tiny_lm()
    found = find_repeated_blocks(model, x)
    assert [name for name, _ in found.stages] == [
        "embedding", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head",
    ]  # fmt: skip
    assert found.blocks == [f"blocks.{i}" for i in range(4)] and found.head_by == "calls"
    prefix = found.stages[0][1]
    assert isinstance(prefix, PrefixStage)
    # The prefix owns the embedding and the position parameter the forward uses directly.
    assert {id(p) for p in prefix.parameters()} == {id(model.embed.weight), id(model.pos)}
    block = found.stages[1][1]
    assert isinstance(block, BlockCall) and block.block is model.blocks[0]
    (mask,) = list(block.buffers())  # the causal mask, held as a buffer (static memory)
    assert mask.dtype == torch.bool and mask.shape == (SEQ, SEQ)
    chain = linearize(model, x)
    assert isinstance(chain.modules[-1], NextTokenLoss)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(chain.logits(x), model(x))
    with pytest.raises(RuntimeError, match="traced for hidden states of shape"):
        block(torch.zeros(1, SEQ, DIM))


def _recomputing_budget(prof) -> int:
    desc = describe(prof)
    least, store_all = desc["min_memory"]["chain"], desc["store_all_memory"]
    return least + (store_all - least) // 3


def _assert_same_grads(ref: nn.Module, got: nn.Module) -> None:
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m, n=name: f"{n}: {m}")


def _train_under(model, x, prof, sched, reference_loss) -> None:
    """One iteration under ``sched`` against plain training of the model itself."""
    ref, got = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    torch.manual_seed(11)
    expected = reference_loss(ref, x)
    expected.backward()
    wrapped = checkpointed(linearize(got, x), sched, profile=prof, tally=True)
    torch.manual_seed(11)
    loss = wrapped(x)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    _assert_same_grads(ref, got)
    counts = [wrapped.counters.forward_count(k) for k in range(prof.length)]
    assert counts == planned_forward_counts(sched, prof.length)
    assert wrapped.counters.saved_bytes == [s.saved_size for s in prof.stages]


def _lm_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return NextTokenLoss(x)(model(x))  # the model's own forward, not the chain


def test_a_model_with_a_module_list_of_blocks_is_profiled_and_trained_under_plans():
    model, x = _tiny_lm()
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="tinylm")
    assert [s.name for s in prof.stages] == [
        "embedding", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head", "loss",
    ]  # fmt: skip
    # the token and position embeddings, and 4 bytes each for Adam's step count (docs/runtime.md)
    assert prof.stages[0].weight_size == (VOCAB * DIM + SEQ * DIM) * 4 + 2 * 4
    assert all(s.saved_size >= s.output_size > 0 for s in prof.stages)
    sched = memplan.solve(prof, "rotor", _recomputing_budget(prof))
    assert sched.feasible and sum(planned_forward_counts(sched, prof.length)) > prof.length
    _train_under(model, x, prof, sched, _lm_loss)
    # An offloading plan moves the prefix's and the blocks' tensors too.
    data = prof.model_dump(exclude_none=True)
    data["bandwidth"] = 1e9
    with_bw = memplan.load_profile(data)
    desc = describe(with_bw)
    least, peak = desc["min_memory"]["offload"], desc["offload_peak"]
    offload = memplan.solve(with_bw, "dynprog", least + (peak - least) // 3)
    assert offload.feasible and offload.count("offload") >= 1
    _train_under(model, x, with_bw, offload, _lm_loss)


class PooledNet(nn.Module):
    """Stem, blocks in an nn.Sequential, then a functional mean over tokens: the head is the
    tape of its operations."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, DIM)
        self.blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(3))
        )
        self.fc = nn.Linear(DIM, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(dim=1))


def test_a_functional_head_is_cut_on_a_tape():
    torch.manual_seed(0)
    model, x = PooledNet(), torch.randn(4, 7, 6)
    found = find_repeated_blocks(model, x)
    # The finest run: the Linear and Tanh of every block, across the blocks.
    assert [n for n, _ in found.stages][:3] == ["stem", "0.0", "0.1"]
    assert len(found.stages) == 1 + 6 + 1 and found.head_by == "tape"
    assert found.head_operations == 2  # mean, then the classifier's linear
    head = found.stages[-1][1]
    assert {id(p) for p in head.parameters()} == {id(model.fc.weight), id(model.fc.bias)}
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="pooled")
    sched = memplan.solve(prof, "rotor", _recomputing_budget(prof))

    def loss(m, x):
        return linearize(copy.deepcopy(m), x).modules[-1](m(x))  # the same fixed targets

    _train_under(model, x, prof, sched, loss)


class ClassToken(nn.Module):
    """ViT-like: patch projection, a class token concatenated, blocks, then ``x[:, 0]``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(12, DIM)
        self.cls = nn.Parameter(torch.randn(1, 1, DIM))
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, DIM)) for _ in range(3)
        )
        self.norm = nn.LayerNorm(DIM)
        self.classifier = nn.Linear(DIM, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        for layer in self.layers:
            x = layer(x)
        return self.classifier(self.norm(x)[:, 0])


def test_a_view_between_head_modules_is_redone():
    torch.manual_seed(1)
    model, x = ClassToken(), torch.randn(3, 5, 12)
    found = find_repeated_blocks(model, x)
    names = [n for n, _ in found.stages]
    assert names[0] == "stem" and names[-1] == "head" and found.head_by == "calls"
    assert id(model.cls) in {id(p) for p in found.stages[0][1].parameters()}
    head_types = [type(m).__name__ for m in found.stages[-1][1]]
    assert head_types == ["BlockCall", "ViewStage", "BlockCall"]  # norm, x[:, 0], classifier
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="cls")
    sched = memplan.solve(prof, "rotor", _recomputing_budget(prof))

    def loss(m, x):
        return linearize(copy.deepcopy(m), x).modules[-1](m(x))

    _train_under(model, x, prof, sched, loss)


class ConvBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.pw = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pw(F.gelu(self.dw(x)))


class ConvStage(nn.Module):
    def __init__(self, cin: int, cout: int, depth: int) -> None:
        super().__init__()
        self.downsample = (
            nn.Identity()
            if cin == cout
            else nn.Sequential(nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 2, stride=2))
        )
        self.blocks = nn.Sequential(*(ConvBlock(cout) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class ConvNeXtLike(nn.Module):
    """timm's ConvNeXt layout: stem, stages (downsample + blocks), head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.BatchNorm2d(8))
        self.stages = nn.Sequential(ConvStage(8, 8, 2), ConvStage(8, 16, 2))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def test_a_run_crosses_containers():
    torch.manual_seed(4)
    model, x = ConvNeXtLike(), torch.randn(4, 3, 32, 32)
    found = find_repeated_blocks(model, x)
    assert found.blocks == [
        "stem.0", "stem.1", "stages.0.blocks.0", "stages.0.blocks.1", "stages.1.downsample.0",
        "stages.1.downsample.1", "stages.1.blocks.0", "stages.1.blocks.1", "head.0", "head.1",
        "head.2",
    ]  # fmt: skip
    assert found.head_by == "none" and len(found.stages) == 11  # no prefix, no head left
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="convnext")
    sched = memplan.solve(prof, "rotor", _recomputing_budget(prof))

    def loss(m, x):
        return linearize(copy.deepcopy(m), x).modules[-1](m(x))

    _train_under(model, x, prof, sched, loss)  # batch-norm statistics updated once


class TokenLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TokenStage(nn.Module):
    """CvT's stage: a strided convolution embeds the image, its layers run on the tokens, the
    tokens go back to an image."""

    def __init__(self, cin: int, dim: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Conv2d(cin, dim, 2, stride=2)
        self.layers = nn.Sequential(*(TokenLayer(dim) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        b, c, hh, ww = h.shape
        tokens = self.layers(h.flatten(2).transpose(1, 2))
        return tokens.transpose(1, 2).reshape(b, c, hh, ww)


class CvTLike(nn.Module):
    """Stages of token layers, the last holding most of the weights: its layers are the chain."""

    def __init__(self, last: int = 4) -> None:
        super().__init__()
        self.stages = nn.ModuleList([TokenStage(3, 8, 1), TokenStage(8, 32, last)])
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return self.head(x.mean((2, 3)))


def test_the_layers_of_a_stage_holding_most_weights_are_the_chain():
    """A run inside one block that is not all the block does is the chain where it holds most of
    the model's parameters (CvT's last stage); else the blocks around it are (their layers a
    part of each)."""
    from memplan.torch import enable

    torch.manual_seed(5)
    model, x = CvTLike(), torch.randn(4, 3, 16, 16)
    found = find_repeated_blocks(model, x)
    assert found.blocks == [f"stages.1.layers.{i}" for i in range(4)]
    assert found.prefix and found.head_by == "tape"
    assert find_repeated_blocks(CvTLike(last=1), x).blocks == ["stages.0", "stages.1"]
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="cvt-like")
    ref = copy.deepcopy(model)
    got = enable(copy.deepcopy(model), _recomputing_budget(prof), example_input=x, profile=prof,
                 optimizer="sgd", output_held=False)  # fmt: skip
    gen = torch.Generator().manual_seed(6)
    for m in (ref, got):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            batch = torch.randn(4, 3, 16, 16, generator=gen.manual_seed(step))
            F.cross_entropy(m(batch), torch.arange(4)).backward()
            opt.step()
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")


class ReadsAParameter(TinyLM):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, self.pos[: ids.shape[1], :1] > 0)  # computed from a parameter
        return self.head(self.norm(x))


class ReadsTheEmbedding(TinyLM):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x0 = x = self.embed(ids)
        for block in self.blocks:
            x = block(x, torch.zeros(1, dtype=torch.bool)) + x0  # a skip from the embedding
        return self.head(self.norm(x))


class ReadsTheInputValues(TinyLM):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids == 0)[:, None, :]  # a padding mask: it depends on the values
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (ReadsTheEmbedding, "cannot linearize ReadsTheEmbedding"),
    ],
)
def test_models_that_are_not_chains_are_input_errors(cls, match):
    torch.manual_seed(0)
    with pytest.raises(InputError, match=match) as info:
        linearize(cls(), torch.randint(0, VOCAB, (2, SEQ)))
    assert "\n" not in str(info.value)


def test_a_chain_whose_blocks_read_a_parameter_measures_and_does_not_train():
    """A mask computed from a parameter (no gradient) changes as the parameter trains: the chain
    API holds the traced one, so it is profiled (the batch it was cut for) and refuses to train
    (``enable`` passes each step's own)."""
    torch.manual_seed(0)
    model, x = ReadsAParameter(), torch.randint(0, VOCAB, (2, SEQ))
    chain = linearize(model, x)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="reads")
    sched = memplan.solve(prof, "rotor", _recomputing_budget(prof))
    with pytest.raises(InputError, match="computed from the parameters.*memplan.torch.enable"):
        checkpointed(chain, sched)


def test_blocks_reading_the_input_values_train_under_enable_on_every_batch():
    """A padding mask computed from the token ids: the chain API computes the model on the batch
    it was cut for only (another batch is an input error), while ``enable`` passes each batch's
    own mask to the blocks and trains as plain training does."""
    from memplan.torch import enable, planned

    torch.manual_seed(0)
    model, ids = ReadsTheInputValues(layers=3), torch.randint(1, VOCAB, (3, SEQ))
    ids[0, :2] = 0
    chain = linearize(model, ids)
    other = torch.randint(1, VOCAB, (3, SEQ))
    with torch.no_grad():
        chain.stages[0][1](ids)
        with pytest.raises(InputError, match="computed from the values of that batch"):
            chain.stages[0][1](other)
    prof = profile_model(copy.deepcopy(model), example_input=ids, repeats=1, name="padded")
    ref = copy.deepcopy(model).train()
    got = enable(
        copy.deepcopy(model).train(),
        _recomputing_budget(prof),
        example_input=ids,
        profile=prof,
        optimizer="sgd",
        output_held=False,
    )  # the loop below; fmt: skip
    counts = planned(got).planned_forward_counts()
    assert sum(counts) > len(counts), "the budget forces recomputation"
    gen = torch.Generator().manual_seed(2)
    batches = [torch.randint(1, VOCAB, (3, SEQ), generator=gen) for _ in range(3)]
    for step, batch in enumerate(batches):
        batch[step, : step + 1] = 0  # padding at another place in every batch
    for m in (ref, got):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step, batch in enumerate(batches):
            opt.zero_grad()
            torch.manual_seed(step)
            F.cross_entropy(m(batch).flatten(0, 1), batch.flatten()).backward()
            opt.step()
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")


class RescalesItsBlocks(TinyLM):
    """RWKV's habit: when its training flag flips, the forward rescales its blocks' output
    weights in place (without gradients) before running them."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__(layers)
        self.rescaled = False

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.training == self.rescaled:
            with torch.no_grad():
                for block in self.blocks:
                    out = block.mlp[2].weight
                    out.mul_(2.0) if self.training else out.div_(2.0)
            self.rescaled = not self.training
        return super().forward(ids)


def test_block_weights_the_forward_touches_before_the_blocks_stay_the_blocks():
    # The embedding stage owns the embedding and the position table, not the blocks' weights
    # its forward rescales before them (else FSDP2's layout counts them twice and enable refused
    # the model: "--shards: stages[0] (embedding) has ... bytes of parameters, more than its
    # weight_size"); the model trains under a recomputing plan as plainly, within the budget.
    from memplan.torch import enable, planned
    from memplan.torch.measure.allocator_peak import allocator_peak

    torch.manual_seed(0)
    model, ids = RescalesItsBlocks(layers=3), torch.randint(0, VOCAB, (3, SEQ))
    found = find_repeated_blocks(model, ids)
    stem = found.stages[0][1]
    assert isinstance(stem, PrefixStage)
    assert {id(p) for p in stem.parameters()} == {id(model.embed.weight), id(model.pos)}
    prof = profile_model(copy.deepcopy(model).train(), example_input=ids, repeats=1, name="rwkv")
    budget = _recomputing_budget(prof)
    ref = copy.deepcopy(model).train()
    got = enable(
        copy.deepcopy(model).train(), budget, example_input=ids, profile=prof, optimizer="sgd",
        output_held=False,
    )  # fmt: skip
    counts = planned(got).planned_forward_counts()
    assert sum(counts) > len(counts), "the budget forces recomputation"
    gen = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, VOCAB, (3, SEQ), generator=gen) for _ in range(3)]
    for m in (ref, got):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step, batch in enumerate(batches):
            opt.zero_grad()

            def train(m=m, batch=batch, step=step, opt=opt) -> None:
                torch.manual_seed(step)
                F.cross_entropy(m(batch).flatten(0, 1), batch.flatten()).backward()
                opt.step()

            held = [*m.parameters(), batch]
            peak, _ = allocator_peak(train, held, torch.device("cpu"))
            if m is got:
                assert peak <= budget, (step, peak, budget)
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")


def test_no_repeated_blocks_is_an_input_error():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.b(F.relu(self.a(x)))

    with pytest.raises(InputError, match="no run of repeated blocks"):
        linearize(Two(), torch.randn(2, 4))


class CallsForward(TinyLM):
    """Calls its blocks as ``block.forward(...)`` (SqueezeBERT's encoder): no module hooks run."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=ids.device).triu(1)
        x = self.embed(ids) + self.pos[:seq]
        for block in self.blocks:
            x = block.forward(x, mask)
        return self.head(self.norm(x))


class CallsForwardReadingTheFirst(TinyLM):
    """Calls its blocks as ``block.forward(...)``, each after the second also reading the first
    block's output: no chain of its blocks."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=ids.device).triu(1)
        x = self.embed(ids) + self.pos[:seq]
        first = None
        for block in self.blocks:
            x = block.forward(x if first is None else x + first, mask)
            first = x if first is None else first
        return self.head(self.norm(x))


def test_blocks_called_through_forward_are_call_groups():
    # block.forward(...) runs no module hooks: the modules each block calls are its call group
    # (NOTE [ Parallel lists as blocks ]), the group's stage its operations on a tape
    torch.manual_seed(5)
    found = find_repeated_blocks(CallsForward(), torch.randint(0, VOCAB, (3, SEQ)))
    assert [name for name, _ in found.stages] == [
        "embedding", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head",
    ]  # fmt: skip
    assert [len(group) for group in found.groups] == [4] * 4  # norm, qkv, drop, mlp


def test_blocks_called_through_forward_that_are_no_chain_are_refused_naming_the_call():
    # the refusal says what stops memplan (not "no run of repeated blocks") and names the blocks
    torch.manual_seed(5)
    with pytest.raises(
        InputError, match=r"blocks blocks\.0, blocks\.1\.\.\. are not called as modules"
    ):
        linearize(CallsForwardReadingTheFirst(), torch.randint(0, VOCAB, (3, SEQ)))


# ------------------------------------------------------------------------------------------------
# DenseNet: one stage per dense layer
# ------------------------------------------------------------------------------------------------


def _small_densenet() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(2)
    model = DenseNet(growth_rate=4, block_config=(3, 2), num_init_features=8, bn_size=2,
                     num_classes=5)  # fmt: skip
    return model, torch.randn(4, 3, 32, 32)


def test_densenet_is_cut_per_dense_layer_and_carries_the_concatenation():
    model, x = _small_densenet()
    chain = linearize(model, x)
    assert chain.names == [
        "stem", "denseblock1.denselayer1", "denseblock1.denselayer2", "denseblock1.denselayer3",
        "transition1", "denseblock2.denselayer1", "denseblock2.denselayer2", "head", "loss",
    ]  # fmt: skip
    model.eval()
    with torch.no_grad():
        h = chain.modules[0](x)
        for k in (1, 2, 3):
            stage = chain.modules[k]
            assert isinstance(stage, DenseLayerStage)
            out = stage(h)
            assert out.shape[1] == h.shape[1] + 4  # the state grows by the growth rate
            torch.testing.assert_close(out[:, : h.shape[1]], h)  # ... and starts with the input
            h = out


def test_densenet_trains_per_layer_under_a_plan():
    model, x = _small_densenet()
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="densenet")
    sizes = [s.output_size for s in prof.stages[1:4]]
    assert sizes[0] < sizes[1] < sizes[2]
    sched = memplan.solve(prof, "rotor", _recomputing_budget(prof))
    assert sum(planned_forward_counts(sched, prof.length)) > prof.length

    def loss(m, x):
        return linearize(copy.deepcopy(m), x).modules[-1](m(x))

    _train_under(model, x, prof, sched, loss)


def test_dense_layer_with_dropout_matches_torchvision_semantics():
    layer = DenseNet(4, (2,), 8, 2).features.denseblock1.denselayer1
    layer.drop_rate = 0.5  # torchvision's _DenseLayer attribute
    stage = DenseLayerStage(layer).train()
    x = torch.randn(2, 8, 6, 6)
    torch.manual_seed(0)
    out = stage(x)
    torch.manual_seed(0)
    new = layer.conv2(layer.relu2(layer.norm2(layer.conv1(layer.relu1(layer.norm1(x))))))
    expected = torch.cat([x, F.dropout(new, 0.5, training=True)], 1)
    torch.testing.assert_close(out, expected)


# ------------------------------------------------------------------------------------------------
# timm and torchvision, where they load
# ------------------------------------------------------------------------------------------------


def _loads(name: str) -> str | None:
    """None when the package imports; else why not (ImportError, or torchvision's operators)."""
    try:
        importlib.import_module(name)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"{name} does not load beside torch {torch.__version__}: {first}"
    return None


TIMM_MISSING = _loads("timm")
TORCHVISION_MISSING = _loads("torchvision.models")


@pytest.mark.skipif(TIMM_MISSING is None, reason="timm loads here")
def test_timm_spec_without_timm_is_an_input_error():
    with pytest.raises(InputError, match="needs timm"):
        build_model("timm:resnet18")


@pytest.mark.skipif(TIMM_MISSING is not None, reason=str(TIMM_MISSING))
@pytest.mark.parametrize(
    ("name", "shape", "blocks"),
    [
        ("vit_tiny_patch16_224", (3, 224, 224), 12),
        ("resnet18", (3, 64, 64), 8),
        ("convnext_atto", (3, 64, 64), 2 + 2 + 6 + 2),
    ],
)
def test_timm_models_are_cut_into_their_blocks(name, shape, blocks):
    model, x, label = build_model(f"timm:{name}", batch_size=2, input_shape=shape)
    assert label == f"timm:{name}"
    chain = linearize(model, x)
    assert chain.names[0] == "stem" and chain.names[-2:] == ["head", "loss"]
    assert len(chain) >= blocks + 3
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(chain.logits(x), model(x))


@pytest.mark.skipif(TORCHVISION_MISSING is not None, reason=str(TORCHVISION_MISSING))
@pytest.mark.parametrize(
    ("name", "shape", "first"),
    [("resnet18", (3, 32, 32), "stem"), ("vit_b_16", (3, 224, 224), "stem"),
     ("mobilenet_v3_small", (3, 64, 64), "features.0")],
)  # fmt: skip
def test_torchvision_models_by_their_names(name, shape, first):
    tv = importlib.import_module("torchvision.models")
    model = tv.get_model(name, weights=None)
    if name not in memplan.torch.MODELS:
        model, x, label = build_model(name, batch_size=2, input_shape=shape)
        assert label == name
    x = torch.randn(2, *shape)
    chain = linearize(model, x)
    assert chain.names[0] == first
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(chain.logits(x), model(x))
