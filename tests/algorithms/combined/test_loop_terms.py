"""Every chain-model family under the training loop's terms (docs/model.md, "The training loop";
issue 37): for one profile and one loop a budget means the same bytes whichever family plans it.

On random chains with the fields of a measured profile (tests/strategies.py,
``with_loop_terms``: weight gradients, F_all's own overhead, backward overheads below 0, autograd's
frees), under every loop (the optimizer's step after the backward and in it included):

* the offloading family's store-all need is the chain family's, its least memory is exact (every
  algorithm plans there, none one byte below) and every plan replays valid in the simulator;
* pofo is never slower than rotor nor dynprog at any budget of a sweep from the least memory of
  any family to the store-all need (a property test), and its plan replays valid;
* ``memplan info``'s least memory of the combined family is the least of the chain's and the
  offloading family's, and ``compare --mem auto`` starts there.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memplan
import memplan.api
from memplan.algorithms.chain.problem import ChainInstance
from memplan.algorithms.offload.model import OffloadInstance
from memplan.loop import TrainingLoop, parse_optimizer
from memplan.profile.model import Profile
from memplan.profile.synthetic import random_chain
from tests.strategies import LOOP_CASES, examples, with_loop_terms

LOOPS = ("at-backward", "kept")
RATES = (1e3, 1e5)  # bytes/s on chains of bytes and milliseconds: slow, and fast transfers


def training(loop: str, optimizer: str) -> TrainingLoop:
    return TrainingLoop(parse_optimizer(optimizer), loop)  # type: ignore[arg-type]


def measured(length: int, seed: int) -> Profile:
    base = random_chain(
        length, seed=31 * seed + length, overheads=bool(seed % 2), integer_times=True
    )
    return with_loop_terms(base, seed)


@pytest.mark.parametrize(("loop", "optimizer"), LOOP_CASES)
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("length", [1, 3, 6])
def test_the_offloading_family_counts_the_loop(length, seed, loop, optimizer):
    prof = measured(length, seed)
    terms = training(loop, optimizer)
    inst = OffloadInstance.from_profile(prof, 1e3, terms)
    assert inst.peak() == ChainInstance.from_profile(prof, terms).store_all_peak()  # one accounting
    desc = memplan.api.describe(prof, optimizer, loop)
    least, high = desc["min_memory"]["offload"], desc["offload_peak"]
    assert high == desc["store_all_memory"]
    named = {"gradients": loop, "optimizer": optimizer, "bandwidth": 1e3}
    for algo in ("greedy", "dynprog", "vdnn"):
        below = memplan.solve(prof, algo, least - 1, **named)
        assert not below.feasible and below.min_memory == least
        for memory in sorted({least, (least + high) // 2, high}):
            sched = memplan.solve(prof, algo, memory, **named)
            assert sched.feasible, (algo, memory)
            assert sched.budget.gradients == loop
            # the step counted: as given, else PyTorch's default off a CPU (foreach)
            assert sched.budget.optimizer_step == (parse_optimizer(optimizer).step or "foreach")
            replay = memplan.simulate(prof, sched)  # the claims too: static memory, peak
            assert replay.valid and replay.peak_memory <= memory, replay.violation


def test_the_random_profiles_pin_and_free():
    """The cases exercise the frees: some activation is pinned (never offloaded) somewhere."""
    pinned = [
        OffloadInstance.from_profile(measured(n, s), 1e3, training("kept", "sgd")).pinned.any()
        for n in (3, 6)
        for s in range(8)
    ]
    assert any(pinned)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    length=st.integers(1, 7),
    seed=st.integers(0, 10_000),
    case=st.sampled_from(LOOP_CASES),
    fraction=st.floats(0.0, 1.0),
    rate=st.sampled_from(RATES),
)
def test_pofo_is_never_slower_than_rotor_nor_dynprog(length, seed, case, fraction, rate):
    """For one profile and one loop, the optimizer's step included (after the backward or in
    it), a budget means the same bytes in every family."""
    loop, optimizer = case
    prof = measured(length, seed)
    desc = memplan.api.describe(prof, optimizer, loop)
    low = min(desc["min_memory"][f] for f in ("chain", "offload", "combined"))
    assert low == desc["min_memory"]["combined"]
    memory = round(low + (desc["store_all_memory"] - low) * fraction)
    found = {}
    for algo in ("rotor", "dynprog", "pofo"):
        sched = memplan.solve(
            prof, algo, memory, gradients=loop, optimizer=optimizer, bandwidth=rate
        )
        found[algo] = sched.makespan if sched.feasible else math.inf
        if sched.feasible:
            assert memplan.simulate(prof, sched).valid
    assert found["pofo"] <= min(found["rotor"], found["dynprog"]) * (1 + 1e-9), found
    assert found["pofo"] < math.inf  # the combined family's least memory is a budget it meets


@pytest.mark.parametrize("loop", LOOPS)
def test_auto_budgets_start_at_every_familys_least_memory(loop):
    prof = measured(6, 3)
    desc = memplan.api.describe(prof, "sgd", loop)
    algos = ["rotor", "dynprog", "pofo"]
    budgets = memplan.api.auto_budgets(prof, algos, 5, gradients=loop)
    assert budgets[0] == min(desc["min_memory"][f] for f in ("chain", "offload", "combined"))
    assert budgets[-1] == desc["store_all_memory"]
    other = "kept" if loop == "at-backward" else "at-backward"
    if memplan.api.describe(prof, "sgd", other)["min_memory"] != desc["min_memory"]:
        assert memplan.api.auto_budgets(prof, algos, 5, gradients=other) != budgets


def _bundled_chains() -> list[str]:
    from memplan.profile.io import bundled_profiles

    return [name for name in bundled_profiles() if memplan.load_profile(name).kind == "chain"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _bundled_chains())
def test_pofo_on_every_bundled_profile_at_every_budget_of_a_sweep(name):
    """The goal of issue 37 on the bundled profiles: at every budget of ``compare --mem auto:6``
    (at the profile's bandwidth, else 12 GB/s), pofo <= min(rotor, dynprog) whenever either fits."""
    prof = memplan.load_profile(name)
    rate = prof.bandwidth or 12e9
    algos = ["rotor", "dynprog", "pofo"]
    budgets = memplan.api.auto_budgets(prof, algos, 6)
    rows = memplan.compare(prof, algos, budgets, bandwidth=rate)
    for memory in budgets:
        found = {r.algorithm: r.makespan for r in rows if r.memory == memory and r.feasible}
        others = [found[a] for a in ("rotor", "dynprog") if a in found]
        if others:
            assert found["pofo"] <= min(others) * (1 + 1e-9), (memory, found)


@pytest.mark.parametrize("seed", range(2, 6))
def test_the_dps_never_offload_a_pinned_segment_input(seed):
    """T6 of docs/combined.md in both DPs (the compiled Theorem 1 DP's ``pinned``, the window
    DP's): a pinned segment input is never offloaded; the others still are where it pays."""
    from memplan.algorithms.combined.fractional import FractionalDP
    from memplan.algorithms.combined.pofo import PofoDP

    chain = ChainInstance.from_profile(random_chain(6, seed=seed, integer_times=True))
    memory = (chain.store_all_peak() + int(chain.x[0])) // 2
    free = FractionalDP(chain, memory, 1e3, 30)
    assert free.solve() < math.inf and free.plan().offloads  # it offloads when it may
    everything = np.ones(chain.length, dtype=bool)
    for pinned in (everything, np.arange(chain.length) % 2 == 1):
        fractional = FractionalDP(chain, memory, 1e3, 30, pinned=pinned)
        if fractional.solve() < math.inf:
            for name, _ in fractional.plan().offloads:
                stage = int(name[2:-1]) + (name[0] == "s")  # the segment it is the input of
                assert not pinned[stage], name
        window = PofoDP(chain, memory, 1e3, 30, pinned=pinned)
        if window.solve() < math.inf:
            moved = [op for op in window.schedule() if op[0] == "offload"]
            assert all(not pinned[int(op[5][2:-1]) + (op[5][0] == "s")] for op in moved)
