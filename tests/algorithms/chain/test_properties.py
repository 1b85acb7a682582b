"""Property tests of the chain algorithms on random chains (hypothesis).

* Every plan a chain algorithm returns replays valid in the simulator, fits the budget, and has the
  makespan and peak the schedule states.
* An infeasible answer's ``min_memory`` (when given) is above the budget.
* For each algorithm, the makespan does not increase with the budget (feasible stays feasible).
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memplan
from memplan.profile.model import Profile
from memplan.simulator import simulate_chain
from tests.strategies import chains, examples, extreme_chains

ALGORITHMS = ("store-all", "periodic", "revolve", "rotor")
OPTIMIZERS = ("none", "sgd", "adam")
SETTINGS = settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def store_all_peak(prof: Profile) -> int:
    """Activation peak of the store-all plan (static memory excluded)."""
    plan = [("F_all", k) for k in range(prof.length)]
    plan += [("B", k) for k in reversed(range(prof.length))]
    return simulate_chain(prof, plan).peak_memory


def budget_in(draw: st.DrawFn, prof: Profile, static: int) -> int:
    """A budget from well below anything feasible to above the store-all peak."""
    top = store_all_peak(prof)
    return static + draw(st.integers(prof.input_size, top + top // 4))


@SETTINGS
@given(data=st.data())
def test_plans_replay_valid(data):
    prof = data.draw(chains())
    optimizer = data.draw(st.sampled_from(OPTIMIZERS))
    static = memplan.api.describe(prof, optimizer)["static_memory"]
    memory = budget_in(data.draw, prof, static)
    slots = data.draw(st.sampled_from([2, 7, 50, 500]))
    for algo in ALGORITHMS:
        sched = memplan.solve(prof, algo, memory, slots=slots, optimizer=optimizer)
        where = f"{algo} at {memory} bytes ({optimizer}, {slots} slots)"
        if not sched.feasible:
            assert sched.min_memory is None or sched.min_memory > memory, where
            continue
        result = memplan.simulate(prof, sched)
        assert result.valid, f"{where}: {result.violation}"
        assert result.fits and result.peak_memory <= memory, where
        assert result.peak_memory == sched.peak_memory, where
        assert result.static_memory == static, where
        assert math.isclose(result.makespan, sched.makespan, rel_tol=1e-9, abs_tol=1e-9), where
        assert sched.makespan >= prof.lower_bound - 1e-9, where


@SETTINGS
@given(data=st.data())
def test_makespan_non_increasing_in_budget(data):
    prof = data.draw(chains())
    low = budget_in(data.draw, prof, 0)
    high = low + data.draw(st.integers(1, store_all_peak(prof)))
    slots = data.draw(st.sampled_from([2, 7, 50, 500]))
    for algo in ALGORITHMS:
        small = memplan.solve(prof, algo, low, slots=slots, optimizer="none")
        large = memplan.solve(prof, algo, high, slots=slots, optimizer="none")
        where = f"{algo}: {low} bytes -> {high} bytes ({slots} slots)"
        if small.feasible:
            assert large.feasible, where
            assert large.makespan <= small.makespan + 1e-9, (
                f"{where}: makespan {small.makespan} -> {large.makespan}"
            )


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=extreme_chains(), data=st.data())
def test_extreme_profiles_replay_valid(prof, data):
    """Denormal and zero times, terabyte sizes: every chain algorithm's plan replays valid within
    the budget, with the makespan it states."""
    memory = budget_in(data.draw, prof, 0)
    for algo in ALGORITHMS:
        sched = memplan.solve(prof, algo, memory, optimizer="none")
        if not sched.feasible:
            assert sched.min_memory is None or sched.min_memory > memory, algo
            continue
        result = memplan.simulate(prof, sched)
        assert result.valid and result.peak_memory <= memory, f"{algo}: {result.violation}"
        assert math.isclose(result.makespan, sched.makespan, rel_tol=1e-9, abs_tol=1e-9), algo
