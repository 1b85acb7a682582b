"""One FSDP2 rank's profile (memplan/profile/sharding.py, NOTE [ FSDP2 memory terms ]) and
``--shards``: the terms on a hand-counted chain, plans that replay on the one-GPU profile, the
errors. The terms against what FSDP2 allocates: tests/torch/test_fsdp.py (two gloo ranks).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import memplan
from memplan.api import schedule_from_sequence
from memplan.errors import InputError
from memplan.loop import TrainingLoop, parse_optimizer
from memplan.profile.memory import static_bytes
from memplan.profile.model import Profile, Stage, StageOption
from memplan.profile.sharding import (
    ShardLayout,
    StageShard,
    default_layout,
    for_ranks,
    shard_profile,
    sharded_ranks,
)
from tests.oracles.exhaustive import ChainOracle


def run(*args: str, stdin: str | None = None):
    from memplan.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args], input=stdin)


def _chain() -> Profile:
    """Embedding, three blocks of 1000 bytes of parameters, head, loss (sizes in bytes)."""

    def stage(name: str, weight: int, **kw: int) -> Stage:
        fields = {"output_size": 100, "saved_size": 300, "forward_overhead": 50}
        fields |= {"backward_overhead": 40, "weight_grad_size": weight}
        return Stage(
            name=name, forward_time=1.0, backward_time=2.0, weight_size=weight, **(fields | kw)
        )

    stages = [
        stage("embedding", 800),
        *(stage(f"block{i}", 1000, backward_overhead_fresh=-20) for i in range(3)),
        stage("head", 400, output_size=500, saved_size=600),
        stage("loss", 0, output_size=4, saved_size=500),
    ]
    return Profile(model="chain", input_size=64, stages=stages)


def test_one_shard_is_the_whole_model():
    prof = _chain()
    assert shard_profile(prof, default_layout(prof, 1)) is prof
    assert for_ranks(prof, 1, "at-backward") is prof
    assert sharded_ranks(prof) is None


def test_the_terms_of_a_hand_counted_chain():
    """Two ranks, gloo (one copy): each field as NOTE [ FSDP2 memory terms ] counts it."""
    prof = _chain()
    layout = default_layout(prof, 2, copies=1)
    assert [s.unit for s in layout.stages] == ["root", "block", "block", "block", "root", "root"]
    assert [s.shard for s in layout.stages] == [400, 500, 500, 500, 200, 0]
    rank = shard_profile(prof, layout, "at-backward")
    assert sharded_ranks(rank) == 2
    g, g_root = 1000, 800 + 400  # a block's gathered parameters, the root's
    # static: the shards, and the root's gathered parameters all step long
    assert [st.weight_size for st in rank.stages] == [400, 500, 500, 500, 200, 0]
    assert rank.workspace_size == g_root
    # forward of a block: its all-gather output and parameters; before the first, the root's
    # all-gather output (1200 > 50 + 100) is still held
    first, second = rank.stages[1], rank.stages[2]
    assert first.forward_overhead == 2 * g + max(50, g_root - 100)
    assert second.forward_overhead == 2 * g + max(50, g - 100)
    assert second.forward_overhead_all == 2 * g + max(50, g - 300)
    assert rank.stages[0].forward_overhead == 50 + g_root  # the root's all-gather output
    assert rank.stages[4].forward_overhead == 50 + g  # the last block's
    # windows: g[k] carries the reduce-scatter input of the block after stage k-1 (the first
    # block's to the end); the loss's gradient nothing (it exists from the start)
    assert [st.grad_size for st in rank.stages] == [100 + g, 100 + g, 100 + g, 100, 500, 4]
    # a block keeps its shard of the gradients, the root its whole ones
    assert [st.weight_grad_size for st in rank.stages] == [800, 500, 500, 500, 400, 0]
    # B of the middle block: held C[3] (block3's reduce-scatter input); beyond it, its own
    # parameters, block1's prefetch, its computation; with gloo, the buffers gloo's worker may
    # release late (block3's reduce-scatter copy, the prefetched output block2 was copied out
    # of), until the next collective. The chain counts g[2] with C[2] and the shard.
    done = 100 - 300 - 100  # g[2] made, s[2] and g[3] freed
    peak = max(
        g + g + 100 + 1000 - 20,  # computing: its parameters, block1's prefetch, g[2], gradients
        2 * g + g,  # copied out of the prefetched output, the late reduce-scatter copy
        2 * g + g + 2 * g,  # its parameters, the two late buffers, block1's prefetch and copy
        done + g + 1000 - g,  # the reduce-scatter input (block3's freed)
        done + g - g + 500 + g,  # its output and copy
    )
    assert rank.stages[2].backward_overhead_fresh == peak - 100 - g - 500


def test_the_terms_without_the_backward_prefetch():
    """NOTE [ Without the backward prefetch ]: the hand-counted chain's middle block holds no
    prefetch of block1 (its pre-backward all-gathers itself: its output, its copy-out, gloo's
    late copy of block3's reduce-scatter), the head and the loss hold no prefetch of the last
    block; the forwards and the windows are as with it, and no field grows."""
    prof = _chain()
    layout = default_layout(prof, 2, copies=1)
    on = shard_profile(prof, layout, "at-backward")
    off = shard_profile(prof, replace(layout, prefetch=False), "at-backward")
    g = 1000
    peak = max(
        g + 100 + 1000 - 20,  # computing: its parameters, g[2], its unsharded gradients
        2 * g + g,  # its all-gather output and copy-out, block3's late reduce-scatter copy
        -300 + 1000 - g,  # the reduce-scatter input (block3's freed)
        -300 - g + 500 + g,  # its output and copy
    )
    assert off.stages[2].backward_overhead_fresh == peak - 100 - g - 500
    assert on.stages[2].backward_overhead_fresh - off.stages[2].backward_overhead_fresh == 2 * g
    for k in (4, 5):  # the root's prefetch of the last block, from the loss to B block2
        assert on.stages[k].backward_overhead_fresh - off.stages[k].backward_overhead_fresh >= g
    for a, b in zip(on.stages, off.stages, strict=True):
        assert a.forward_overhead == b.forward_overhead and a.grad_size == b.grad_size
        assert b.backward_overhead_fresh <= a.backward_overhead_fresh
    assert off.workspace_size == on.workspace_size


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("spanning", [False, True])
def test_rotor_matches_the_oracle_on_a_ranks_profile(prefetch, spanning):
    """One rank's profile is a chain profile: rotor's makespan is the exhaustive search's
    (tests/oracles/exhaustive.py) at each step of its staircase, with the backward prefetch and
    without, whole blocks and a unit spanning two stages; the plans replay within their budget,
    and without the prefetch the least memory is lower."""
    prof = _chain()
    layout = _spanning(prof) if spanning else default_layout(prof, 2, copies=1)
    rank = shard_profile(prof, replace(layout, prefetch=prefetch), "at-backward")
    loop = TrainingLoop(parse_optimizer("sgd"), "at-backward")
    search = ChainOracle(rank, static_bytes(rank, loop), gradients="at-backward")
    least = search.min_feasible_memory()
    assert memplan.solve(rank, "rotor", least - 1, optimizer="sgd").min_memory == least
    for memory, makespan in search.makespan_steps():
        found = memplan.solve(rank, "rotor", memory, optimizer="sgd")
        assert found.feasible and math.isclose(found.makespan, makespan), (memory, makespan)
        assert memplan.simulate(rank, found).valid
    if prefetch:
        without = shard_profile(prof, replace(layout, prefetch=False), "at-backward")
        assert memplan.solve(without, "rotor", 10**5, optimizer="sgd").min_memory < least


def _spanning(prof: Profile) -> ShardLayout:
    """Blocks 0 and 1 (stages 1, 2) one unit, block 2 a unit of its own: two ranks, gloo."""
    layout = default_layout(prof, 2, copies=1)
    stages = list(layout.stages)
    for k in (1, 2):
        stages[k] = StageShard(1000, 500, 1000, "block", 1)
    return ShardLayout(2, tuple(stages), 1)


def test_a_unit_spanning_two_stages():
    """A block cut into sub-blocks, one ``fully_shard`` unit over two stages (NOTE [ A unit
    spanning stages ]): gathered whole while either computes, through both backwards; its
    second stage's unsharded gradients held beyond their shard until the unit's reduce-scatter,
    after its first stage's backward."""
    prof = _chain()
    rank = shard_profile(prof, _spanning(prof), "at-backward")
    unit, g, g_root = 2000, 1000, 800 + 400
    # forwards: the unit's all-gather output and parameters in both of its stages; before its
    # first, the root's all-gather output, or with gloo the largest unit's late copy; the block
    # after it finds the unit's all-gather output (2000 > 50 + 100)
    assert rank.stages[1].forward_overhead == 2 * unit + max(50, max(g_root, unit) - 100)
    assert rank.stages[2].forward_overhead == 2 * unit + max(50, unit - 100)
    assert rank.stages[3].forward_overhead == 2 * g + max(50, unit - 100)
    # the window between the unit's stages: its parameters, the reduce-scatter input of block
    # 2, stage 2's unsharded gradients beyond their shard, gloo's late copy of that
    # reduce-scatter (no unit before it to prefetch: no collective since)
    inside = unit + g + (1000 - 500) + g
    assert [st.grad_size for st in rank.stages] == [
        100 + unit, 100 + inside, 100 + g, 100, 500, 4
    ]  # fmt: skip
    assert [st.weight_grad_size for st in rank.stages] == [800, 500, 500, 500, 400, 0]
    # a store-all plan and rotor's plans replay within what they claim
    length = len(rank.stages)
    ops = [("F_all", k) for k in range(length)] + [("B", k) for k in reversed(range(length))]
    plan = schedule_from_sequence(rank, ops, optimizer="sgd", gradients="at-backward")
    assert memplan.simulate(rank, plan, check_claims=False).valid
    least = memplan.solve(rank, "rotor", 10**5).min_memory
    sched = memplan.solve(rank, "rotor", least)
    assert sched.feasible and memplan.simulate(rank, sched).valid


def test_a_unit_of_one_stage_is_a_block_of_its_own():
    prof = _chain()
    layout = default_layout(prof, 2, copies=1)
    stages = list(layout.stages)
    stages[2] = StageShard(1000, 500, 1000, "block", 2)
    alone = ShardLayout(2, tuple(stages), 1)
    assert shard_profile(prof, alone).stages == shard_profile(prof, layout).stages
    stages[1] = StageShard(1000, 500, 1000, "block", 2)  # a unit beginning after its stage
    with pytest.raises(InputError, match="a unit is one run of block stages"):
        shard_profile(prof, ShardLayout(2, tuple(stages), 1))


def test_a_root_stage_keeps_the_gradients_its_backward_makes():
    """A language model's head tied to its embedding makes the embedding's gradient at its own
    backward (the one-GPU profile measures it there, ``weight_grad_size``): FSDP2 keeps the root's
    gradients whole, so the rank's profile counts it from the head's backward on, not from the
    embedding's; the root's reduce-scatter after ``B 0`` holds what it held untied."""

    def store_all_peaks(prof: Profile) -> list[int]:
        rank = shard_profile(prof, default_layout(prof, 2, copies=1), "at-backward")
        length = len(rank.stages)
        ops = [("F_all", k) for k in range(length)] + [("B", k) for k in reversed(range(length))]
        plan = schedule_from_sequence(rank, ops, optimizer="sgd", gradients="at-backward")
        return memplan.simulate(rank, plan, check_claims=False).op_peaks

    untied = _chain()
    stages = list(untied.chain_stages)
    stages[0] = stages[0].model_copy(update={"weight_grad_size": 0})  # made by the head's
    stages[4] = stages[4].model_copy(update={"weight_grad_size": 400 + 800})
    tied = untied.model_copy(update={"stages": stages})
    rank = shard_profile(tied, default_layout(tied, 2, copies=1), "at-backward")
    assert [st.weight_grad_size for st in rank.stages] == [0, 500, 500, 500, 1200, 0]
    gained = [b - a for a, b in zip(store_all_peaks(untied), store_all_peaks(tied), strict=True)]
    # forwards, B loss unchanged; B head to B block0 hold the embedding's 800 bytes more; B 0 not
    assert gained == [0] * 7 + [800] * 4 + [0]


def test_a_selective_option_holds_what_its_stage_does():
    """An option's F_all gathers the block as the stage's forward does; its backward gets what the
    stage's gets (docs/model.md, "Options of a stage")."""
    prof = _chain()
    option = StageOption(
        name="save-matmuls", saved_size=200, forward_overhead=30, backward_overhead=60,
        backward_time=3.0,
    )  # fmt: skip
    stages = list(prof.chain_stages)
    stages[2] = stages[2].model_copy(update={"options": [option]})
    prof = prof.model_copy(update={"stages": stages})
    rank = shard_profile(prof, default_layout(prof, 2, copies=1), "at-backward")
    got = (rank.stages[2].options or [])[0]
    g = 1000
    assert got.forward_overhead == 2 * g + max(30, g - 200)
    added = rank.stages[2].backward_overhead_fresh - (-20)  # what the stage's backward gained
    assert got.backward_overhead == 60 + added
    sched = memplan.solve(rank, "rotor", 10**5)
    assert sched.feasible and memplan.simulate(rank, sched).valid


def test_sharded_plans_replay_on_the_whole_models_profile():
    plain = memplan.solve("llama-1b@h100", "rotor", "8GB")
    sharded = memplan.solve("llama-1b@h100", "rotor", "8GB", shards=8)
    assert sharded.feasible and sharded.budget.shards == 8 and plain.budget.shards is None
    assert sharded.static_memory < plain.static_memory
    replay = memplan.simulate("llama-1b@h100", sharded)  # replays one rank's profile
    assert replay.valid and replay.peak_memory == sharded.peak_memory <= 8 * 10**9
    rank = for_ranks(memplan.load_profile("llama-1b@h100"), 8, sharded.budget.gradients)
    assert sharded.profile.sha256 == rank.sha256()


def test_more_ranks_need_less_memory_each():
    least = []
    for ranks in (1, 2, 4, 8):
        found = memplan.solve("llama-1b@h100", "rotor", "80GB", shards=ranks)
        least.append(found.min_memory)
    assert all(a > b for a, b in zip(least, least[1:], strict=False)), least


def test_what_cannot_be_sharded():
    with pytest.raises(InputError, match="shards=0: expected a number of ranks"):
        memplan.solve("llama-1b@h100", "rotor", "8GB", shards=0)
    with pytest.raises(InputError, match="pipeline"):
        memplan.solve("resnet50@a100", "pipeline-ilp", "8GB", gpus=2, shards=2)
    with pytest.raises(InputError, match="join profile"):
        memplan.solve("siamese-resnet18", "join", "8GB", shards=2)
    prof = _chain()
    split = ShardLayout(2, tuple(StageShard(0, 0, 0, u) for u in ("root", "block") * 3))
    with pytest.raises(InputError, match="one run of stages"):
        shard_profile(prof, split)
    with pytest.raises(InputError, match="has 6"):
        shard_profile(prof, ShardLayout(2, split.stages[:2]))


def test_solve_shards_on_the_command_line():
    done = run("solve", "llama-1b@h100", "-a", "rotor", "-m", "8GB", "--shards", "8", "-f", "json")
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["budget"]["shards"] == 8
    replayed = run("simulate", "llama-1b@h100", "-", stdin=done.stdout)
    assert replayed.exit_code == 0, replayed.stderr
    assert "sha256" not in replayed.stderr  # the rank's profile, as planned
    tight = run("solve", "llama-1b@h100", "-a", "rotor", "-m", "4GB", "--shards", "8")
    assert tight.exit_code == 1 and "least memory that fits" in tight.stderr
    bad = run("solve", "llama-1b@h100", "-a", "rotor", "-m", "8GB", "--shards", "-2")
    assert bad.exit_code == 2 and "--shards -2" in bad.stderr
