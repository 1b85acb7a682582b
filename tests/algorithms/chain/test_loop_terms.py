"""The chain model under the training loop's terms (docs/model.md, "The training loop"): weight
gradients created by each backward (``at-backward``), kept for the step (``kept``) or stepped and
freed in the backward (``step-in-backward``, with the step's temporaries), F_all's own overhead,
autograd's free of an input neither side keeps, and the optimizer's step after the backward.

Exact checks on small random chains with measured fields (tests/strategies.py,
``with_loop_terms``), under every loop: rotor (exact in bytes, and on a grid of one byte per slot)
matches the exhaustive-search oracle (tests/oracles/exhaustive.py, written from docs/model.md) at
every budget and in least memory; the solver's own peak of a plan (``ChainInstance.peak``,
``store_all_peak``) is the simulator's; no heuristic beats rotor.
"""

from __future__ import annotations

import functools
import math

import pytest

import memplan
from memplan.algorithms.chain.problem import ChainInstance
from memplan.loop import TrainingLoop, parse_optimizer
from memplan.profile.memory import static_bytes
from memplan.profile.model import Profile
from memplan.profile.synthetic import random_chain
from memplan.schedule import Budget
from memplan.simulator import simulate_chain
from tests.oracles.exhaustive import ChainOracle
from tests.strategies import with_loop_terms

OPTIMIZERS = {"at-backward": "sgd", "kept": "sgd", "step-in-backward": "adam:for-loop"}
"""The optimizer of each loop's cases: the step in the backward with Adam's for-loop step, whose
temporaries are two copies of the largest gradient it steps (docs/model.md)."""
LOOPS = tuple(OPTIMIZERS)


def training_loop(loop: str) -> TrainingLoop:
    return TrainingLoop(parse_optimizer(OPTIMIZERS[loop]), loop)  # type: ignore[arg-type]


CASES = [(length, seed) for length in (1, 2, 3, 4) for seed in range(5)] + [
    (5, seed) for seed in range(2)
]


@functools.cache
def profile(length: int, seed: int) -> Profile:
    base = random_chain(
        length, seed=100 * length + seed, overheads=bool(seed % 2), integer_times=True
    )
    return with_loop_terms(base, seed)


@functools.cache
def oracle(length: int, seed: int, loop: str) -> ChainOracle:
    prof = profile(length, seed)
    static = static_bytes(prof, training_loop(loop))
    return ChainOracle(
        prof,
        static_memory=static,
        gradients=loop,
        optimizer="adam" if loop == "step-in-backward" else "sgd",
        # Adam's for-loop step on one parameter: two buffers of its size and 12 bytes of scalars
        # (docs/model.md, "Static memory and budgets")
        step_temporaries=lambda size: 2 * size + 12,
    )


def test_the_random_profiles_free_and_create_gradients():
    """The cases exercise every term: some stage frees its input, some creates gradients."""
    chains = [
        ChainInstance.from_profile(profile(n, s), training_loop("at-backward")) for n, s in CASES
    ]
    assert any(c.freed.any() for c in chains)
    assert any(c.held_grads[0] > 0 for c in chains)
    assert any((c.fall != c.fo).any() for c in chains)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(("length", "seed"), CASES)
def test_rotor_matches_the_oracle(length, seed, loop):
    prof = profile(length, seed)
    search = oracle(length, seed, loop)
    least = search.min_feasible_memory()
    optimizer = OPTIMIZERS[loop]
    store_all = memplan.solve(prof, "store-all", 2**40, gradients=loop, optimizer=optimizer)
    assert store_all.budget.gradients == loop
    assert store_all.min_memory >= least
    below = memplan.solve(prof, "rotor", least - 1, gradients=loop, optimizer=optimizer)
    assert not below.feasible and below.min_memory == least
    for memory in range(least, store_all.peak_memory + 2):
        best = search.optimal_makespan(memory)
        assert best is not None
        for slots in ("auto", max(2, memory)):  # exact in bytes; a grid of one byte per slot
            found = memplan.solve(
                prof, "rotor", memory, gradients=loop, slots=slots, optimizer=optimizer
            )
            assert found.feasible, (memory, slots)
            assert math.isclose(found.makespan, best[0]), (memory, slots, best)
            assert found.peak_memory <= memory
        for algo in ("periodic", "revolve"):
            other = memplan.solve(prof, algo, memory, gradients=loop, optimizer=optimizer)
            assert not other.feasible or other.makespan >= best[0] - 1e-9


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(("length", "seed"), CASES)
def test_solver_peaks_are_the_simulators(length, seed, loop):
    """``ChainInstance.peak`` and ``store_all_peak`` (the solvers' accounting) against the simulator, on
    the oracle's plans at every step of its staircase and on store-all."""
    prof = profile(length, seed)
    chain = ChainInstance.from_profile(prof, training_loop(loop))
    static = static_bytes(prof, training_loop(loop))
    plans = [chain.store_all_sequence()]
    search = oracle(length, seed, loop)
    for memory, _ in search.makespan_steps():
        found = search.optimal_makespan(memory)
        assert found is not None
        plans.append(found[1])
    budget = Budget.of(None, training_loop(loop))
    for plan in plans:
        replay = simulate_chain(prof, plan, static_memory=static, budget=budget)
        assert replay.valid, replay.violation
        assert chain.peak(plan) + static == replay.peak_memory
    assert (
        chain.store_all_peak() + static
        == simulate_chain(prof, plans[0], static_memory=static, budget=budget).peak_memory
    )


def test_the_loops_differ_by_the_gradients_not_yet_created():
    """Store-all: under ``kept`` the gradients are static for the whole step; under
    ``at-backward`` stage k's appear at its backward. The peak can only be lower, by at most the
    gradients of every stage."""
    for length, seed in CASES:
        prof = profile(length, seed)
        kept = memplan.solve(prof, "store-all", 2**40, gradients="kept")
        fresh = memplan.solve(prof, "store-all", 2**40, gradients="at-backward")
        grads = sum(st.weight_grad_size for st in prof.stages)
        grads_static = sum(st.weight_grad_size for st in prof.stages)
        assert fresh.static_memory == kept.static_memory - grads_static
        # backward_overhead_fresh may exceed backward_overhead by the random draw (or be below 0)
        extra = sum(max(0, st.backward_overhead_fresh) for st in prof.stages)
        assert fresh.peak_memory <= kept.peak_memory + extra + grads


def test_a_freed_input_is_not_read_again():
    """After ``F_all k`` frees ``x[k]``, a forward of stage k cannot read it; the backward does
    not need it."""
    prof = profile(3, 0)
    chain = ChainInstance.from_profile(prof, training_loop("kept"))
    k = next(k for k in range(1, 3) if chain.freed[k])
    before = [("F_all", j) for j in range(k + 1)]
    again = [*before, ("F_ck", k)]
    replay = simulate_chain(prof, again, gradients="kept")
    assert not replay.valid and f"x[{k}] is not in memory" in replay.violation
    assert chain.peak(again) is None
    # the model before the loop's terms keeps x[k] inside s[k-1]: the same F_ck is then valid
    assert "not in memory" not in (simulate_chain(prof, again).violation or "")


def _heavier(prof: Profile, scale: int) -> Profile:
    """``prof`` with weights (and gradients) ``scale`` times larger, plus ``scale``."""
    fields = ("weight_size", "weight_grad_size", "first_use_grad_size", "largest_grad_size")
    stages = [
        st.model_copy(update={name: getattr(st, name) * scale + scale for name in fields})
        for st in prof.stages
    ]
    return prof.model_copy(update={"stages": stages})


@pytest.mark.parametrize("scale", (0, 12))
@pytest.mark.parametrize("loop", ("at-backward", "kept"))
@pytest.mark.parametrize(("length", "seed"), CASES[::3])
def test_the_optimizer_step_after_the_backward(length, seed, loop, scale):
    """Adam's foreach step holds one more copy of every gradient after the backward, with the
    weights, the state, ``x[0]`` and (``at-backward``) the gradients: the least memory is the
    larger of the oracle's and that, and the simulator replays the step (heavier weights make
    the step set the least memory)."""
    prof = profile(length, seed) if scale == 0 else _heavier(profile(length, seed), scale)
    grads = sum(st.weight_grad_size for st in prof.stages)
    training = TrainingLoop(parse_optimizer("adam:foreach"), loop)
    static = static_bytes(prof, training)
    # foreach: one copy of the gradients of the (one) group, and 12 bytes of scalars
    step = static + prof.input_size + (grads if loop == "at-backward" else 0) + grads + 12
    search = ChainOracle(prof, static_memory=static, gradients=loop, optimizer="adam")
    least = max(search.min_feasible_memory(), step)
    below = memplan.solve(prof, "rotor", least - 1, gradients=loop, optimizer="adam:foreach")
    assert not below.feasible and below.min_memory == least
    found = memplan.solve(prof, "rotor", least, gradients=loop, optimizer="adam:foreach")
    assert found.feasible and found.budget.optimizer_step == "foreach"
    assert step <= found.peak_memory <= least
    replay = memplan.simulate(prof, found)
    assert replay.valid and replay.peak_memory == found.peak_memory
    if step == least:  # the step sets the least memory: one byte less, and the replay says so
        over = memplan.simulate(prof, found, memory=least - 1)
        assert not over.valid and "optimizer's step" in over.violation
