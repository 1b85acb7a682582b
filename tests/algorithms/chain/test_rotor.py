"""Rotor DP: the two modelling pitfalls, discretization guarantees, and agreement with the oracle."""

from __future__ import annotations

import pytest

import memplan
from memplan.algorithms.chain import ChainInstance, chain_min_memory, plan_rotor
from memplan.api import schedule_from_sequence
from memplan.profile.synthetic import random_chain
from tests.oracles.exhaustive import ChainOracle

# Found by searching random 3-stage chains for a case where a DP that checks the forward of
# ``F_all a`` with the gradient g[a+1] (instead of g[b+1], the one really held) goes wrong: at 17
# bytes it claims 7 ms with F_ck 0, F_all 1, F_all 2, B 2, B 1, F_all 0, B 0, but F_all 1 runs
# while g[3] (5 bytes) is held and needs 18 bytes.
PITFALL_GRADIENT = {
    "format": "memplan-profile/1",
    "model": "pitfall-gradient",
    "input_size": 1,
    "stages": [
        {
            "name": "s0",
            "forward_time": 1.0,
            "backward_time": 1.0,
            "output_size": 3,
            "saved_size": 4,
            "forward_overhead": 2,
            "grad_size": 4,
        },
        {
            "name": "s1",
            "forward_time": 1.0,
            "backward_time": 1.0,
            "output_size": 3,
            "saved_size": 4,
            "forward_overhead": 5,
            "grad_size": 2,
        },
        {
            "name": "s2",
            "forward_time": 1.0,
            "backward_time": 1.0,
            "output_size": 1,
            "saved_size": 1,
            "forward_overhead": 3,
            "grad_size": 5,
        },
    ],
}


def test_forward_peak_uses_the_gradient_really_held():
    prof = memplan.load_profile(PITFALL_GRADIENT)
    sched = memplan.solve(prof, "rotor", 17, optimizer="none", slots=1000)
    oracle = ChainOracle(prof, persistent=True).optimal_makespan(17)
    if oracle is None:
        assert not sched.feasible
    else:
        assert sched.feasible and sched.makespan == pytest.approx(oracle[0])
        assert sched.makespan > 7.0  # the wrong DP's value
        assert memplan.simulate(prof, sched).valid


def test_loss_keeps_its_input_until_its_backward():
    """The loss backward needs x[L-1]: a plan may not free it before (docs/model.md)."""
    prof = random_chain(3, seed=4, overheads=False)
    chain = ChainInstance.from_profile(prof)
    # F_n on the loss frees x[L-1] (standalone) before the loss backward: invalid in the model.
    bad = [("F_ck", 0), ("F_ck", 1), ("F_n", 2), ("F_all", 2), ("B", 2)]
    assert chain.peak(bad) is None
    assert not memplan.simulate(prof, schedule_from_sequence(prof, bad, optimizer="none")).valid
    # Rotor's least memory counts x[L-1] during the loss backward.
    x, s, g = chain.x, chain.s, chain.g
    L = chain.length
    assert chain_min_memory(chain) >= x[0] + x[L - 1] + s[L - 1] + g[L] + g[L - 1]


@pytest.mark.parametrize("seed", range(6))
def test_exact_in_bytes_when_slots_cover_the_budget(seed):
    prof = random_chain(5, seed=seed, integer_times=True)
    chain = ChainInstance.from_profile(prof)
    low, high = chain_min_memory(chain), chain.store_all_peak()
    search = ChainOracle(prof, persistent=True)
    for memory in range(low - 1, high + 1):
        plan = plan_rotor(chain, memory, slots=max(2, memory))
        oracle = search.optimal_makespan(memory)
        assert (plan.sequence is None) == (oracle is None), memory
        if oracle is not None:
            assert plan.claimed_makespan == pytest.approx(oracle[0]), memory


@pytest.mark.parametrize("seed", range(4))
def test_coarse_slots_still_fit_and_stay_monotone(seed):
    """With few slots the plan is rounded, yet it fits in bytes and never slows as memory grows."""
    prof = random_chain(12, seed=seed, max_size=1000)
    chain = ChainInstance.from_profile(prof)
    low, high = chain_min_memory(chain), chain.store_all_peak()
    previous = float("inf")
    for memory in range(low, high + 1, max(1, (high - low) // 40)):
        sched = memplan.solve(prof, "rotor", memory, optimizer="none", slots=20)
        assert sched.feasible, memory
        assert sched.peak_memory <= memory
        assert sched.makespan <= previous + 1e-9
        previous = sched.makespan


def test_infeasible_reports_exact_least_memory():
    prof = random_chain(6, seed=11)
    chain = ChainInstance.from_profile(prof)
    low = chain_min_memory(chain)
    below = memplan.solve(prof, "rotor", low - 1, optimizer="none")
    assert not below.feasible and below.min_memory == low
    at = memplan.solve(prof, "rotor", low, optimizer="none")
    assert at.feasible and at.peak_memory <= low


def test_static_memory_counts_against_the_budget():
    prof = random_chain(6, seed=12)
    plain = memplan.solve(prof, "rotor", 10_000, optimizer="none")
    adam = memplan.solve(prof, "rotor", 10_000, optimizer="adam")
    assert adam.static_memory == 4 * prof.weight_size
    assert adam.peak_memory == plain.peak_memory + adam.static_memory


def test_slots_that_would_exhaust_memory_are_refused():
    prof = random_chain(200, seed=1, max_size=10**6)  # 200 x 201 / 2 x 100001 x 4 bytes = 8 GB
    with pytest.raises(
        memplan.InputError, match=r"slots=100000: the rotor table .* use \d+ slots or fewer"
    ):
        memplan.solve(prof, "rotor", "30MB", slots=100_000, optimizer="none")
