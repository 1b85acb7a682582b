"""``memplan.torch.enable`` on a model sharded with FSDP2 (``fully_shard``), CPU and gloo.

Two ranks train a GPT-style model, and Hugging Face language models with their loss in chunks
of tokens, under plans that recompute, next to plain FSDP2 training (tests/torch/fsdp_worker.py):
the same parameters, each rank's measured peak (the allocator's count) within its budget, the
plan's peak within 2% of it, FSDP2's collectives and hooks as in plain training. One process
(a process group of one rank) checks the order of ``enable`` and ``fully_shard`` (docs/runtime.md,
"FSDP2"), the layout of a model's shards and what a step takes for parameters.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torch import nn  # noqa: E402

from memplan.api import describe  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.profile.sharding import shard_profile  # noqa: E402
from memplan.torch import enable, linearize, planned, profile_model  # noqa: E402
from memplan.torch.runtime.fsdp import model_layout  # noqa: E402
from memplan.torch.runtime.iteration import static_pointers  # noqa: E402
from memplan.torch.split.chunked_loss import CHUNKED_STAGE  # noqa: E402
from memplan.torch.zoo.gpt import GPT, GPTConfig  # noqa: E402
from tests.torch.ranks import free_port, run_ranks  # noqa: E402

pytestmark = pytest.mark.torch

HERE = Path(__file__).parent
PLANNED = 0.02
"""A plan's per-rank peak against the allocator's count, in both directions."""


def _two_ranks(tmp_path: Path, case: str) -> list[dict]:
    port = free_port()
    outs = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    run_ranks(HERE / "fsdp_worker.py", 2, lambda rank: ["2", port, outs[rank], case])
    return [json.loads(out.read_text()) for out in outs]


def _check_as_plain(name: str, run: dict, plain: dict) -> None:
    """A plan's steps against plain FSDP2's (tests/torch/fsdp_worker.py's figures): the measured
    peak within the budget and the plan's peak within 2% of it, give or take one block's gathered
    parameters (``block_bytes``): gloo's worker thread may release a collective's buffers after
    FSDP2 drops them, which the terms count for the rank's previous collective only
    (docs/sharding.md). In full test runs one step of a rank measured that much above the plan
    now and then: the zoo GPT 199,720 bytes (2.2%) above at a fifth of the way from its least
    memory, GPT-2 with its loss in chunks 24,336 above its budget at its least (3 of 6 runs).
    """
    assert run["shards"] == 2
    assert run["forwards"] > run["stages"], "the plan recomputes"
    assert sum(run["counted"]) == run["forwards"], "the runtime ran the plan's forwards"
    assert run["diff"] < 1e-5, (name, run["diff"])
    measured, late = max(run["peaks"]), run["block_bytes"]
    assert measured <= run["budget"] + late, (name, run["peaks"], run["budget"])
    assert run["planned"] <= run["budget"]
    assert abs(run["planned"] - measured) <= PLANNED * measured + late, (name, run)
    pairs = zip(run["collectives"], plain["collectives"], strict=True)
    for step, (got, ref) in enumerate(pairs):
        assert got["reduce_scatter"] == ref["reduce_scatter"], (name, step)
        assert got["all_gather"] >= ref["all_gather"], (name, step)
        assert got["pre_backward"] == ref["pre_backward"], (name, step)  # once per block
    assert not any(run["gathered"]) and not any(plain["gathered"])


def test_two_ranks_train_as_plain_fsdp2_within_their_budget(tmp_path):
    """``enable`` before ``fully_shard`` on two gloo ranks: plans for one rank of two (from the
    process group), recomputes, trains as plain FSDP2, measures within the budget and within 2%
    of the plan; FSDP2 reduce-scatters once per unit, runs each block's pre-backward hook once
    and leaves no block gathered."""
    for rank in _two_ranks(tmp_path, "gpt"):
        for name in ("least", "fifth"):
            _check_as_plain(name, rank[name], rank["plain"])


def test_two_ranks_train_a_language_model_with_its_loss_in_chunks(tmp_path):
    """``enable(..., loss_chunks=N)`` before ``fully_shard`` on Hugging Face causal LMs: the
    model's forward is cut at its last block after FSDP2's post-forward hook, the head+loss
    stage runs in the root's forward on the root's gathered parameters, and the plan at the least
    per-rank memory trains as plain FSDP2 with the model's own loss over the whole logits, within
    its budget and within 2% of the plan: GPT-2 (its head tied to its embedding, dropout on) and
    Llama (untied, rotary embeddings: the side inputs every block reads counted once; the static
    storages taken while a block computes; a block's output gone at its backward)."""
    for rank in _two_ranks(tmp_path, "hf-chunked"):
        for kind in ("gpt2", "llama"):
            run, plain = rank[kind]["least"], rank[kind]["plain"]
            assert run["names"][-1] == CHUNKED_STAGE
            assert max(run["peaks"]) < min(plain["peaks"]) / 2  # no logits, blocks recomputed
            _check_as_plain(kind, run, plain)


def test_stages_of_half_blocks_go_below_one_blocks_backward(tmp_path):
    """A model of one's own whose chain has a stage per half block (the zoo GPT's attention and
    MLP, each with its residual: ``memplan_stages``), each half a ``fully_shard`` unit: its least
    per-rank memory is below that of whole-block stages, which one block's backward sets, and
    a plan between the two trains as plain FSDP2 of the same units, within its budget and 2% of
    it (not at the half-block least: tests/torch/fsdp_worker.py's ``_run_halves``)."""
    for rank in _two_ranks(tmp_path, "halves"):
        run = rank["between"]
        _check_as_plain("halves", run, rank["plain"])
        assert rank["budgets"]["least"] < rank["whole_least"]
        assert max(run["peaks"]) < rank["whole_least"], (run["peaks"], rank["whole_least"])


def test_blocks_cut_into_sub_blocks_train_as_plain_fsdp2(tmp_path):
    """``enable(..., sub_blocks=True, loss_chunks=4)`` on tiny Llama and GPT-2 (dropout on),
    each whole block a ``fully_shard`` unit spanning its two sub-block stages (NOTE [ A unit
    spanning stages ]): the cut chain's least per-rank memory is below the whole-block chain's,
    and halfway between them (not at the least: tests/torch/fsdp_worker.py's
    ``_run_hf_sub_blocks``) a rank trains as plain FSDP2 with the model's own loss, within its
    budget and 2% of the plan, below the whole-block least; a recomputed part gathers its block
    (more all-gathers), FSDP2's reduce-scatters and pre-backward hooks as in plain training."""
    for rank in _two_ranks(tmp_path, "hf-sub-blocks"):
        for kind in ("llama", "gpt2"):
            run, whole = rank[kind]["between"], rank[kind]["whole_least"]
            _check_as_plain(kind, run, rank[kind]["plain"])
            assert run["stages"] == 2 + 2 * 4  # embedding, 4 blocks in two parts, head+loss
            assert rank[kind]["least"] < whole
            assert max(run["peaks"]) < whole, (kind, run["peaks"], whole)


def test_below_the_least_with_the_backward_prefetch_it_is_turned_off(tmp_path):
    """``enable(..., sub_blocks=True, loss_chunks=4)`` on tiny Llama at the least per-rank memory
    of its plans without FSDP2's backward prefetch (NOTE [ Without the backward prefetch ]),
    below the least of those with it: the plan is made without it, the first sharded step tells
    every unit to prefetch itself alone (no prefetch), the rank trains as plain FSDP2 (which
    prefetches) with the model's own loss, measures within its budget and within 2% of the plan,
    below the least with the prefetch; ``disable`` gives the units their own lists back. With
    ``sub_blocks="auto"`` at a budget whole blocks meet only without the prefetch, the blocks
    are cut instead (the prefetch is the last thing given up)."""
    for rank in _two_ranks(tmp_path, "hf-no-prefetch"):
        run, least = rank["without"], rank["least"]
        assert least["without"] < least["with"]
        assert run["prefetch"] is False and run["units"] == 4 + 1  # the blocks and the root
        assert run["each_itself"] and run["restored"]
        _check_as_plain("no-prefetch", run, rank["plain"])
        assert max(run["peaks"]) < least["with"], (run["peaks"], least)
        # sub_blocks="auto" between whole blocks' least without the prefetch and with it: the
        # blocks cut, the prefetch kept (turned off only where no plan with it fits)
        auto = rank["auto"]
        without, with_ = auto["whole_least"]
        assert without < auto["budget"] < with_ and least["with"] < auto["budget"]
        assert auto["stages"] == 2 + 2 * 4 and auto["prefetch"] is True


# ------------------------------------------------------------------------------------------------
# One process: the order of enable and fully_shard
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A gloo process group of one rank in this process (FSDP2 shards over it)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _gpt() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, seq_len=16, n_layer=3, n_head=2, d_model=16))
    return model.train(), torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))


def _least(prof) -> int:
    return describe(prof)["min_memory"]["chain"]


def _shard(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def _train(model: nn.Module, x: torch.Tensor, steps: int = 2) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        logits = model((x + step) % 64)
        nn.functional.cross_entropy(logits.reshape(-1, 64), x.ravel()).backward()
        opt.step()


def test_enable_after_fully_shard_is_refused(one_rank):
    """``enable`` profiles and cuts the whole model: it comes before ``fully_shard``."""
    model, x = _gpt()
    _shard(model)
    with pytest.raises(InputError, match="call memplan.torch.enable before fully_shard"):
        enable(model, "1GB", example_input=x)


def test_enable_before_fully_shard_plans_for_the_mesh(one_rank):
    """The recipe: ``enable`` (the default process group's ranks), then ``fully_shard``; a plan
    that recomputes every block trains as plain FSDP2. A plan made for other ranks
    (``shards=3``) is made again at the first step, for the model's mesh."""
    model, x = _gpt()
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="gpt")
    stages = [m for _, m in linearize(model, x).stages[:-1]]
    three = model_layout([*stages, None], 3, set(range(1, len(stages) - 1)), 1, False)
    # this model is small: three ranks need more memory each than one (the gathered
    # parameters); a budget both fit in, where one rank recomputes
    budget = max(_least(prof), _least(shard_profile(prof, three)))
    assert budget < describe(prof)["store_all_memory"]
    plain = _shard(copy.deepcopy(model))
    under = enable(
        copy.deepcopy(model),
        budget,
        example_input=x,
        profile=prof,
        shards=3,
        optimizer="sgd",
        output_held=False,
    )  # the loop of _train; fmt: skip
    plan = planned(under)
    assert plan is not None and plan.profile.extra["shards"]["ranks"] == 3
    under = _shard(under)
    _train(plain, x)
    _train(under, x)
    # planned again for one rank: the whole model's profile (with the optimizer's parameter
    # order, once its step is seen)
    assert "shards" not in (plan.profile.extra or {})
    assert plan.profile.stages == prof.stages
    assert sum(plan.planned_forward_counts()) > len(plan.names)
    for p, q in zip(plain.parameters(), under.parameters(), strict=True):
        torch.testing.assert_close(q.to_local(), p.to_local())


def test_a_gathered_block_is_never_taken_for_a_parameter(one_rank):
    """The storages a step treats as parameters are taken at its first saved tensor, maybe while
    a block is gathered: FSDP2 frees the block's unsharded parameters at its reshard and the
    allocator hands their addresses to activations, which must not be taken for parameters (a
    recomputation would then save fewer tensors than its first forward: seen on Llama)."""
    model, x = _gpt()
    under = _shard(enable(model, "1GB", example_input=x, optimizer="sgd", output_held=False))
    _train(under, x, steps=1)  # the first step finds the blocks
    steps = planned(under).sharding
    block = under.blocks[1]
    block.unshard()
    gathered = {p.untyped_storage().data_ptr() for p in block.parameters()}
    pointers = set(static_pointers(under.modules()))
    assert gathered and gathered <= pointers  # the block's parameters while gathered
    static = steps.static(static_pointers(under.modules()))
    block.reshard()
    assert not any(ptr in static for ptr in gathered)
    assert all(ptr in static for ptr in pointers - gathered)


def test_a_tied_head_is_known_when_fully_shard_registers_other_parameters():
    """``fully_shard`` registers other tensors in the places of the parameters at every step:
    the chunked loss knows the head's weight tied to the embedding by its name, and writes its
    gradient into that tensor's ``.grad`` for the token lookup to add its rows into (NOTE [ The
    tied gradient summed in place ]), not returned as its saved sum scaled in place, which
    autograd would then add the embedding's gradient to out of place."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids}
    enable(model, "1GB", example_input=batch, loss_chunks=2, optimizer="sgd", output_held=False)
    stage = planned(model).sharding.modules[-1]
    assert stage.shared  # the head's weight, by its name in the head
    weight = nn.Parameter(model.lm_head.weight.detach().clone())  # as fully_shard registers
    model.lm_head.weight = model.transformer.wte.weight = weight
    written = stage.tied_into_grad
    stage(torch.randn(2, 16, 16, requires_grad=True), ids).backward()
    assert weight.grad is not None and weight.grad.layout == torch.strided
    assert stage.tied_into_grad == written + 1 and stage.tied_returned == 0


def test_the_layout_pads_every_parameter_as_fsdp2_does():
    """FSDP2 keeps ``ceil(rows / N)`` rows of each parameter on every rank."""
    first, second = nn.Linear(3, 5), nn.Linear(5, 4, bias=False)  # weights 5 x 3 and 4 x 5
    layout = model_layout([first, second, None], 2, {1})
    assert [s.unit for s in layout.stages] == ["root", "block", "root"]
    assert layout.stages[0].params == (15 + 5) * 4
    assert layout.stages[0].shard == (3 * 3 + 3) * 4  # ceil(5 / 2) = 3 rows of each
    assert layout.stages[1].shard == 2 * 5 * 4 and layout.stages[1].gathered == 4 * 5 * 4
    assert layout.stages[2].params == 0


def test_a_cut_block_sharded_inside_is_refused(one_rank):
    """A block cut into sub-blocks whose MLP is a ``fully_shard`` unit of its own: its parts
    would gather apart, which the plan does not count; the first step says so."""
    from torch.distributed.fsdp import fully_shard

    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids.clone()}
    enable(model, "1GB", example_input=batch, sub_blocks=True, optimizer="sgd")
    for layer in model.model.layers:
        fully_shard(layer.mlp)
        fully_shard(layer)
    fully_shard(model)
    with pytest.raises(InputError, match=r"\(LlamaDecoderLayer\) has fully_shard units inside"):
        model(**batch).loss.backward()
