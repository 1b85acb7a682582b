"""Property tests of the offloading family on random chains (hypothesis).

* Every schedule of every offloading algorithm replays valid in the independent simulator, fits
  the budget, and has the makespan and peak it states; its makespan is at least LB
  (Proposition 3) and at least the compute time.
* A budget is infeasible exactly when it is below the least memory of full offloading, which the
  infeasible answer states.
* Schedules survive a JSON round trip and still replay valid.
"""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memplan
from memplan.algorithms.offload.model import OffloadInstance
from memplan.simulator import simulate_combined, terms
from tests.strategies import chains, examples, extreme_bandwidths, extreme_chains

ALGORITHMS = ("greedy", "dynprog", "dynprog-best", "vdnn")
OPTIMIZERS = ("none", "sgd", "adam")
SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


rates = st.sampled_from([500.0, 1000.0, 3000.0, 12345.6, 1e6])


@SETTINGS
@given(prof=chains(), rate=rates, data=st.data())
def test_every_schedule_replays_valid_within_budget(prof, rate, data):
    optimizer = data.draw(st.sampled_from(OPTIMIZERS))
    static = memplan.api.describe(prof, optimizer)["static_memory"]
    inst = OffloadInstance.from_profile(prof, rate)
    least, peak = static + inst.min_memory(), static + inst.peak()
    # the optimizer's step after the backward (the batch and its temporaries: Adam's scalars)
    # bounds every plan too, as the simulator counts it
    loop = memplan.solve(prof, "greedy", 2**40, optimizer=optimizer, bandwidth=rate).budget
    step = terms.step_temporaries(prof, loop)
    if step is not None:
        least = max(least, static + (prof.input_size or 0) + step)
        peak = max(peak, least)
    memory = data.draw(st.integers(max(0, least - 5), peak + 5))
    slots = data.draw(st.sampled_from([2, 7, 50, 500]))
    for algo in ALGORITHMS:
        sched = memplan.solve(prof, algo, memory, slots=slots, optimizer=optimizer, bandwidth=rate)
        where = f"{algo} at {memory} bytes ({optimizer}, {slots} slots, {rate} B/s)"
        assert sched.budget.bandwidth == rate
        assert sched.lower_bound >= inst.compute_time - 1e-9
        if memory < least:
            assert not sched.feasible and sched.min_memory == least, where
            continue
        assert sched.feasible, where
        result = memplan.simulate(prof, sched)
        assert result.valid, f"{where}: {result.violation}"
        assert result.fits and result.peak_memory <= memory, where
        assert result.peak_memory == sched.peak_memory, where
        assert math.isclose(result.makespan, sched.makespan, rel_tol=1e-9, abs_tol=1e-9), where
        assert sched.makespan >= sched.lower_bound * (1 - 1e-9) - 1e-9, where
        assert sched.makespan >= inst.compute_time - 1e-9, where
        assert math.isclose(
            result.idle_time, sched.makespan - inst.compute_time, rel_tol=1e-9, abs_tol=1e-6
        ), where
        if memory >= peak:
            assert sched.count("offload") == 0, where
            assert math.isclose(sched.overhead, 1.0, rel_tol=1e-9), where


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=chains(), rate=rates, data=st.data())
def test_json_round_trip(prof, rate, data):
    inst = OffloadInstance.from_profile(prof, rate)
    memory = data.draw(st.integers(inst.min_memory(), max(inst.min_memory(), inst.peak())))
    sched = memplan.solve(prof, "dynprog", memory, optimizer="none", bandwidth=rate)
    again = memplan.load_schedule(json.loads(sched.to_json()))
    assert again == sched
    assert memplan.simulate(prof, again).valid
    assert all(("tensor" in op) == (op["stream"] == "transfer") for op in sched.to_dict()["ops"])


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=extreme_chains(), rate=extreme_bandwidths(), data=st.data())
def test_extreme_profiles_replay_valid(prof, rate, data):
    """Denormal and zero times, terabyte sizes, 1e3..1e14 B/s: every schedule replays valid within
    the budget in the offloading simulator and in the combined one (which pofo's candidates meet).
    A backward of 1e12 ms put the no-wait backward times 1e-4 ms off (out of order, or not lasting
    their duration), and a channel capacity of 1e23 bytes per operation overflowed dynprog's
    slots."""
    inst = OffloadInstance.from_profile(prof, rate)
    least, peak = inst.min_memory(), inst.peak()
    memory = data.draw(st.integers(max(0, least - 1), peak + 1))
    for algo in ALGORITHMS:
        sched = memplan.solve(prof, algo, memory, optimizer="none", bandwidth=rate)
        assert sched.feasible == (memory >= least), algo
        if not sched.feasible:
            continue
        result = memplan.simulate(prof, sched)
        assert result.valid and result.peak_memory <= memory, f"{algo}: {result.violation}"
        ops = sched.ops
        combined = simulate_combined(prof, ops, memory=memory, bandwidth=rate)
        assert combined.valid, f"{algo}: {combined.violation}"
