"""Rotor is optimal in memplan's model (persistent plans): it matches the exhaustive-search oracle.

With ``optimizer="none"`` (no static memory) and ``slots = memory - input_size`` the rotor
discretization unit is one byte (docs/model.md, "Memory discretization"), so rotor is exact. It
must then

* find the least makespan of the oracle in memplan's model (persistent plans, see docs/model.md and
  tests/oracles/exhaustive.py: a checkpoint, once kept, stays until its backward) at every budget;
* never beat the oracle of the relaxed model without the persistency rule, which can be strictly
  faster at small budgets (test_oracle.py::test_a_non_persistent_plan_is_faster);
* be infeasible exactly where the oracle is, and then report the oracle's least feasible memory.

No other chain algorithm may beat rotor, nor the unrestricted oracle.
"""

from __future__ import annotations

import functools
import math

import pytest

import memplan
from memplan.profile.model import Profile
from memplan.profile.synthetic import random_chain
from memplan.simulator import simulate_chain
from tests.oracles.exhaustive import ChainOracle, makespan_at, optimal_makespan

OTHERS = ("store-all", "periodic", "revolve")

CASES = (
    [(length, seed, overheads) for length in (1, 2, 3) for seed in range(8) for overheads in (0, 1)]
    + [(4, seed, overheads) for seed in range(8) for overheads in (0, 1)]
    + [(5, seed, overheads) for seed in range(4) for overheads in (0, 1)]
    + [pytest.param(6, seed, seed % 2, marks=pytest.mark.slow) for seed in range(3)]
)


Steps = list[tuple[int, float]]


@functools.cache
def case(length: int, seed: int, overheads: int) -> tuple[Profile, Steps, Steps, int]:
    """The chain, the oracles' staircases budget -> least makespan (all plans, persistent plans)
    and the store-all peak."""
    prof = random_chain(
        length, seed=100 * length + seed, overheads=bool(overheads), integer_times=True
    )
    store_all = [("F_all", k) for k in range(length)] + [("B", k) for k in reversed(range(length))]
    peak = simulate_chain(prof, store_all).peak_memory
    steps = ChainOracle(prof, persistent=False).makespan_steps()
    persistent = ChainOracle(prof, persistent=True).makespan_steps()
    return prof, steps, persistent, peak


def budgets(steps: Steps, persistent: Steps, store_all_peak: int, every: bool) -> list[int]:
    """Below the least feasible budget, both sides of every step, the store-all peak and above.

    With ``every``, all the budgets from below the least feasible one to the store-all peak.
    """
    least = steps[0][0]
    chosen = {least - 3, least - 2, least - 1, store_all_peak, store_all_peak + 7}
    if every:
        chosen |= set(range(least, store_all_peak))
    for budget, _ in steps + persistent:
        chosen |= {budget - 1, budget, budget + 1}
    return sorted(b for b in chosen if b >= 0)


def solve(prof: Profile, algo: str, memory: int) -> memplan.Schedule:
    slots = max(2, memory - prof.input_size)
    return memplan.solve(prof, algo, memory, slots=slots, optimizer="none")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize(("length", "seed", "overheads"), CASES)
def test_rotor_matches_oracle(length, seed, overheads):
    prof, steps, persistent, store_all_peak = case(length, seed, overheads)
    least = steps[0][0]
    for memory in budgets(steps, persistent, store_all_peak, every=length <= 3):
        best = makespan_at(steps, memory)
        best_persistent = makespan_at(persistent, memory)
        sched = solve(prof, "rotor", memory)
        where = (
            f"{prof.model} at {memory} bytes (oracle: {best}, persistent plans: "
            f"{best_persistent}, least memory {least})"
        )
        if best is None:
            assert not sched.feasible, where
            assert sched.min_memory == least, where
        else:
            assert sched.feasible, where
            assert close(sched.makespan, best_persistent), f"{where}: rotor {sched.makespan}"
            assert sched.makespan >= best - 1e-9, f"{where}: rotor {sched.makespan}"
            assert sched.peak_memory <= memory, where


@pytest.mark.parametrize(("length", "seed", "overheads"), CASES)
def test_rotor_never_worse_than_the_others(length, seed, overheads):
    prof, steps, persistent, store_all_peak = case(length, seed, overheads)
    least = steps[0][0]
    for memory in budgets(steps, persistent, store_all_peak, every=length <= 3):
        best = makespan_at(steps, memory)
        rotor = solve(prof, "rotor", memory)
        for algo in OTHERS:
            other = solve(prof, algo, memory)
            where = f"{algo} on {prof.model} at {memory} bytes"
            if other.feasible:
                # Nothing beats the oracle; rotor is at least as good as anything feasible.
                assert best is not None and other.makespan >= best - 1e-9, where
                assert rotor.feasible, where
                assert rotor.makespan <= other.makespan + 1e-9, f"{where}: rotor {rotor.makespan}"
            elif other.min_memory is not None:
                assert other.min_memory >= least, where


def test_store_all_needs_its_peak():
    """Store-all is feasible exactly from the store-all peak on, at the lower-bound makespan."""
    for length, seed, overheads in CASES[::7]:
        prof, steps, _, store_all_peak = case(length, seed, overheads)
        assert steps[-1] == (steps[-1][0], prof.lower_bound)
        assert not solve(prof, "store-all", store_all_peak - 1).feasible
        sched = solve(prof, "store-all", store_all_peak)
        assert sched.feasible and close(sched.makespan, prof.lower_bound)


def test_rotor_reaches_the_persistent_optimum_below_the_relaxed_one():
    """Where the relaxed model (no persistency rule) is faster, rotor matches memplan's model.

    The chain of test_oracle.py::test_a_non_persistent_plan_is_faster: the relaxed optimum (89)
    consumes a stored checkpoint with F_n, which docs/model.md forbids; the model's optimum is 96.
    """
    prof = random_chain(5, seed=500, overheads=False, integer_times=True)
    assert optimal_makespan(prof, 48, persistent=False)[0] == 89
    assert ChainOracle(prof, persistent=True).optimal_makespan(48)[0] == 96
    assert solve(prof, "rotor", 48).makespan == 96
