"""The join family under the training loop's terms (docs/model.md, "The training loop"; NOTE
[ join loop terms ] in memplan/algorithms/join/hetero.py): weight gradients created by every
backward and by the turn (``at-backward``), the loop's overheads, autograd's frees, counted by
the join simulator as the chain family counts them.

On random joins with the fields of a measured profile, under every loop (the optimizer's step
after the backward and in it included): ``join`` plans at the
least memory it states (exact in bytes: a grid of one byte per slot) and not one byte below,
every plan of ``join`` and ``equiv-chain`` replays valid within its budget, and a one-branch join
is no faster than rotor on the chain of its branch and the turn.
"""

from __future__ import annotations

import functools

import pytest

import memplan
import memplan.api
from memplan.errors import ArgumentError
from memplan.profile.model import Branch, Profile, Stage
from memplan.profile.synthetic import random_join
from tests.strategies import LOOP_CASES, join_with_loop_terms

LOOPS = ("at-backward", "kept")
SHAPES = [(1, 2), (2, 2), (1, 1, 2), (3, 1)]


@functools.cache
def measured(lengths: tuple[int, ...], seed: int) -> Profile:
    return join_with_loop_terms(random_join(list(lengths), seed=seed, max_size=10), seed)


@pytest.mark.parametrize(("loop", "optimizer"), LOOP_CASES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lengths", SHAPES)
def test_join_plans_fit_the_loop(lengths, seed, loop, optimizer):
    prof = measured(lengths, seed)
    desc = memplan.api.describe(prof, optimizer, loop)
    least, high = desc["min_memory"]["join"], desc["store_all_memory"]
    named = {"gradients": loop, "optimizer": optimizer}
    below = memplan.solve(prof, "join", least - 1, slots=least, **named)
    assert not below.feasible and below.min_memory == least
    for memory in sorted({least, (least + high) // 2, high}):
        for algo in ("join", "equiv-chain"):
            sched = memplan.solve(prof, algo, memory, slots=max(2, memory), **named)
            assert sched.feasible or algo == "equiv-chain", (algo, memory)
            if sched.feasible:
                assert sched.budget.gradients == loop and sched.join_model == "chain"
                replay = memplan.simulate(prof, sched)
                assert replay.valid and replay.peak_memory <= memory, replay.violation


def test_the_loops_differ_on_a_join():
    """``at-backward``: the gradients are not static (their bytes less), each backward creates
    its own."""
    prof = measured((2, 2), 1)
    kept = memplan.solve(prof, "join", 10**6, gradients="kept")
    fresh = memplan.solve(prof, "join", 10**6, gradients="at-backward")
    grads = sum(
        st.weight_size if st.weight_grad_size is None else st.weight_grad_size
        for st in prof.all_stages()
    )
    assert grads > 0 and fresh.static_memory == kept.static_memory - grads
    assert kept.budget.gradients == "kept" and fresh.budget.gradients == "at-backward"


def test_a_uniform_join_under_at_backward_is_planned_in_the_chain_model():
    """The pebble model has no weight gradients: with weights, ``at-backward`` plans a uniform
    join in the chain model (``kept`` in the paper's pebble model), and both plans replay."""
    stage = Stage(
        name="s", forward_time=1.0, backward_time=1.0, output_size=4, saved_size=4, weight_size=3
    )
    branch = Branch(name="b", input_size=4, stages=[stage, stage.model_copy(update={"name": "t"})])
    turn = stage.model_copy(update={"name": "loss"})
    prof = Profile(model="uniform", branches=[branch, branch.model_copy()], turn=turn)
    models = {}
    for loop in LOOPS:
        sched = memplan.solve(prof, "join", 10**4, gradients=loop)
        assert sched.feasible and memplan.simulate(prof, sched).valid
        models[loop] = sched.join_model
    assert models == {"kept": "pebble", "at-backward": "chain"}


def test_the_optimizers_step_bounds_a_join_as_a_chain():
    """The step after the backward holds the weights, the state, every gradient, the batches of
    every branch and its temporaries: a join's least memory is at least that, as a chain's."""
    prof = measured((2, 2), 1)
    heavy = {"weight_size": 40, "weight_grad_size": 40}
    branches = [
        b.model_copy(update={"stages": [st.model_copy(update=heavy) for st in b.stages]})
        for b in prof.branches or []
    ]
    prof = prof.model_copy(update={"branches": branches})
    desc = memplan.api.describe(prof, "adamw:foreach", "at-backward")
    grads = sum(st.weight_grad_size or st.weight_size for st in prof.all_stages())
    batches = sum(b.input_size for b in branches)
    step = desc["static_memory"] + batches + 2 * grads + 12  # foreach: one copy, and scalars
    assert desc["min_memory"]["join"] == step
    below = memplan.solve(prof, "join", step - 1, optimizer="adamw:foreach")
    assert not below.feasible and "optimizer's step" in (below.solver.message or "")
    sched = memplan.solve(prof, "join", step, optimizer="adamw:foreach")
    assert sched.feasible and memplan.simulate(prof, sched).peak_memory == step


def test_a_join_refuses_a_held_output():
    """The loss joins every branch: which of its inputs a caller keeps is no field of a join."""
    with pytest.raises(ArgumentError, match="output_held"):
        memplan.solve(measured((2, 2), 1), "join", 10**6, output_held=True)
