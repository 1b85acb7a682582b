"""DYNPROG (Algorithm 1 of papers/004) against exhaustive searches (tests/oracles/offload.py).

* With whole bytes per slot and whole bytes moved per operation, the DP's value is the optimum of
  Problem 2 (interruptible transfers) over every subset of activations: Algorithm 1 is exact.
* Dominance pruning keeps the DP's value (pruned == the paper's plain hash tables).
* The optimistic DP (``relaxation_bound``) never exceeds that optimum, whatever the slot count.
* The no-wait ordered schedule of every subset (Problem 1) agrees with the oracle's, whose gap
  between phases is searched with the independent simulator.
* With coarse slots, the repair loop makes every plan fit in bytes.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memplan
from memplan.algorithms.offload import dynprog
from memplan.algorithms.offload.dynprog import (
    auto_grids,
    discretize,
    fit_in_bytes,
    relaxation_bound,
    run_dp,
    solve_dynprog,
)
from memplan.algorithms.offload.model import OffloadInstance
from memplan.algorithms.offload.nowait import no_wait_makespan
from memplan.api import auto_budgets
from memplan.profile.model import Profile, Stage
from memplan.profile.synthetic import random_chain
from tests.oracles.offload import best_fluid, best_real, fluid_makespan, real_makespan
from tests.strategies import examples

RATES = (1000.0, 2000.0, 3000.0, 7000.0)  # whole bytes per ms
SETTINGS = settings(
    max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
EXACT = settings(
    max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def integral_chains(draw: st.DrawFn, max_length: int = 8) -> Profile:
    """Chains whose sizes are whole bytes and whose times move whole bytes at RATES."""
    length = draw(st.integers(1, max_length))
    sizes = st.integers(0, 20)
    stages = []
    for k in range(length):
        out = draw(sizes)
        stages.append(
            Stage(
                name=f"s{k}",
                forward_time=float(draw(st.integers(0, 6))),
                backward_time=float(draw(st.integers(0, 6))),
                output_size=out,
                saved_size=out + draw(sizes),
                forward_overhead=draw(st.integers(0, 10)),
                backward_overhead=draw(st.integers(0, 10)),
                grad_size=draw(st.none() | sizes),
            )
        )
    return Profile(model=f"integral-{length}", input_size=draw(sizes), stages=stages)


def dp_value(inst: OffloadInstance, memory: int, pruning: bool = True) -> float | None:
    sl = discretize(inst, memory, 500)
    assert sl.sigma == 1.0  # budgets of at most 500 bytes: one byte per slot
    found = run_dp(sl, pruning=pruning)
    if not found.sets:
        return None
    return inst.compute_time + found.values[0] * sl.sigma / inst.beta


@pytest.mark.parametrize("seed", range(12))
def test_dp_is_exact_on_long_chains(seed):
    """Chains of 7 and 8 stages (hypothesis mostly draws shorter ones), two budgets each."""
    rng = np.random.default_rng(100 + seed)
    length = 7 + seed % 2
    stages = []
    for k in range(length):
        out = int(rng.integers(0, 21))
        stages.append(
            Stage(
                name=f"s{k}",
                forward_time=float(rng.integers(0, 7)),
                backward_time=float(rng.integers(0, 7)),
                output_size=out,
                saved_size=out + int(rng.integers(0, 21)),
                forward_overhead=int(rng.integers(0, 11)),
                backward_overhead=int(rng.integers(0, 11)),
            )
        )
    prof = Profile(model=f"long-{seed}", input_size=int(rng.integers(0, 21)), stages=stages)
    rate = float(rng.choice(RATES))
    inst = OffloadInstance.from_profile(prof, rate)
    low, high = inst.min_memory(), inst.peak()
    for memory in (low + (high - low) // 3, low + 2 * (high - low) // 3):
        value = dp_value(inst, memory)
        oracle = best_fluid(prof, rate, memory)
        assert value is not None and oracle is not None
        assert math.isclose(value, oracle[0], rel_tol=1e-9, abs_tol=1e-5), (value, oracle)


@EXACT
@given(prof=integral_chains(), rate=st.sampled_from(RATES), data=st.data())
def test_dp_is_exact_for_problem_2(prof, rate, data):
    inst = OffloadInstance.from_profile(prof, rate)
    memory = data.draw(st.integers(inst.min_memory(), max(inst.min_memory(), inst.peak())))
    value = dp_value(inst, memory)
    oracle = best_fluid(prof, rate, memory)
    assert (value is None) == (oracle is None)
    if value is not None:
        assert math.isclose(value, oracle[0], rel_tol=1e-9, abs_tol=1e-5), (value, oracle)
        # The DP's own set reaches the optimum in the oracle's model.
        found = run_dp(discretize(inst, memory, 500))
        mine = fluid_makespan(prof, rate, memory, tuple(int(b) for b in found.sets[0]))
        assert math.isclose(mine, oracle[0], rel_tol=1e-9, abs_tol=1e-5)


def test_dp_is_exact_with_a_zero_duration_backward_at_the_peak():
    """Regression (CI counterexample of test_dp_is_exact_for_problem_2): ``B_5`` lasts 0 ms and
    is the peak (80 bytes); at 79 bytes the 1-byte ``a[3]`` must be offloaded (1 ms) before it,
    then prefetched during ``B_4`` (2 ms): makespan 3 ms. The fluid oracle's memory sweep skipped
    operations that start and end at one instant and found 2 ms (tests/oracles/offload.py).
    Every budget of [min_memory, peak] is checked, as the hypothesis test would draw it."""
    zero = dict(forward_time=0.0, backward_time=0.0)
    prof = Profile(
        model="integral-6",
        input_size=0,
        stages=[
            Stage(name="s0", **zero, output_size=0, saved_size=0),
            Stage(name="s1", **zero, output_size=0, saved_size=0),
            Stage(name="s2", **zero, output_size=1, saved_size=1),
            Stage(name="s3", **zero, output_size=7, saved_size=27),
            Stage(name="s4", forward_time=0.0, backward_time=2.0, output_size=17, saved_size=17),
            Stage(name="s5", **zero, output_size=9, saved_size=9),
        ],
    )
    rate = 1000.0
    inst = OffloadInstance.from_profile(prof, rate)
    for memory in range(inst.min_memory(), inst.peak() + 1):
        value = dp_value(inst, memory)
        oracle = best_fluid(prof, rate, memory)
        assert value is not None and oracle is not None
        assert math.isclose(value, oracle[0], rel_tol=1e-9, abs_tol=1e-5), (memory, value, oracle)
    memory = inst.peak() - 1
    assert math.isclose(dp_value(inst, memory), 3.0)
    assert fluid_makespan(prof, rate, memory, (0, 0, 0, 1, 0, 0)) == pytest.approx(3.0, abs=1e-5)


@SETTINGS
@given(prof=integral_chains(6), rate=st.sampled_from(RATES), data=st.data())
def test_pruning_keeps_the_optimum(prof, rate, data):
    inst = OffloadInstance.from_profile(prof, rate)
    memory = data.draw(st.integers(inst.min_memory(), max(inst.min_memory(), inst.peak())))
    assert dp_value(inst, memory, pruning=True) == dp_value(inst, memory, pruning=False)


@SETTINGS
@given(
    prof=integral_chains(6),
    rate=st.sampled_from((1000.0, 2500.0, 7300.0, 31000.0)),
    slots=st.sampled_from((2, 5, 17, 60, 500)),
    data=st.data(),
)
def test_relaxation_bound_is_a_lower_bound(prof, rate, slots, data):
    inst = OffloadInstance.from_profile(prof, rate)
    memory = data.draw(st.integers(inst.min_memory(), max(inst.min_memory(), inst.peak())))
    oracle = best_fluid(prof, rate, memory)
    bound = relaxation_bound(inst, memory, slots)
    assert bound is not None and oracle is not None
    assert bound <= oracle[0] * (1 + 1e-9) + 1e-5
    assert bound >= inst.compute_time - 1e-9


def test_no_wait_schedules_match_the_oracle_on_every_subset():
    """Problem 1: the solver's schedule of each set equals the oracle's (searched) one."""
    rng = np.random.default_rng(7)
    cases = 0
    for seed in range(30):
        length = 1 + seed % 5
        prof = _random(rng, length)
        rate = float(rng.choice([1000.0, 3000.0, 7000.0]))
        inst = OffloadInstance.from_profile(prof, rate)
        low, high = inst.min_memory(), inst.peak()
        for memory in sorted({low, (low + high) // 2, high}):
            for subset in itertools.product((0, 1), repeat=length):
                mine = no_wait_makespan(inst, np.array(subset, dtype=bool), memory)
                theirs = real_makespan(prof, rate, memory, subset)
                assert (mine is None) == (theirs is None), (seed, memory, subset)
                if mine is not None:
                    assert math.isclose(mine, theirs, rel_tol=1e-7, abs_tol=1e-6)
                    cases += 1
    assert cases > 500


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=integral_chains(6), rate=st.sampled_from(RATES), data=st.data())
def test_problem_1_optimum_bounds_every_algorithm(prof, rate, data):
    inst = OffloadInstance.from_profile(prof, rate)
    memory = data.draw(st.integers(inst.min_memory(), max(inst.min_memory(), inst.peak())))
    best = best_real(prof, rate, memory)
    fluid = best_fluid(prof, rate, memory)
    assert best is not None and fluid is not None
    assert fluid[0] <= best[0] + 1e-6  # Problem 2 relaxes Problem 1
    for algo in ("greedy", "dynprog", "dynprog-best", "vdnn"):
        sched = memplan.solve(prof, algo, memory, optimizer="none", bandwidth=rate)
        assert sched.makespan >= best[0] - 1e-6, algo


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prof=integral_chains(8),
    rate=st.sampled_from((1000.0, 2500.0, 7300.0)),
    slots=st.integers(2, 40),
    data=st.data(),
)
def test_coarse_slots_still_fit_after_repair(prof, rate, slots, data):
    inst = OffloadInstance.from_profile(prof, rate)
    memory = data.draw(st.integers(inst.min_memory(), max(inst.min_memory(), inst.peak())))
    plan = solve_dynprog(inst, memory, slots=slots)
    assert plan.ops is not None
    assert inst.feasible(np.isin(np.arange(inst.n), plan.offloaded), memory)
    sched = memplan.solve(prof, "dynprog", memory, slots=slots, optimizer="none", bandwidth=rate)
    assert sched.feasible and sched.peak_memory <= memory


REPAIRED = [
    # (input size, stages as (fwd ms, bwd ms, output, saved, fwd overhead, bwd overhead),
    #  bandwidth, budget, slots): the optimistic rounding of |x| picks a set that overflows.
    (
        8,
        [(7, 4, 6, 16, 0, 1), (6, 7, 6, 7, 1, 4), (1, 7, 9, 15, 1, 3), (5, 5, 5, 10, 1, 3)]
        + [(7, 2, 8, 14, 4, 0), (4, 4, 4, 8, 0, 3), (4, 1, 9, 14, 5, 2), (6, 3, 3, 12, 0, 3)],
        1000.0,
        84,
        25,
    ),
    (
        860,
        [(4, 4, 60, 498, 253, 379), (1, 1, 584, 1051, 69, 255), (6, 2, 287, 487, 424, 213)]
        + [(5, 2, 528, 731, 368, 139), (1, 1, 664, 1495, 89, 213), (4, 6, 736, 1498, 30, 347)],
        1e7,
        5325,
        7,
    ),
]


@pytest.mark.parametrize(("input_size", "stages", "rate", "memory", "slots"), REPAIRED)
def test_repair_loop(input_size, stages, rate, memory, slots):
    """§5.3.2: the first DP set does not fit in bytes; one more slot on an |x| repairs it."""
    prof = Profile(
        model="repair",
        input_size=input_size,
        stages=[
            Stage(
                name=f"s{k}",
                forward_time=float(ft),
                backward_time=float(bt),
                output_size=out,
                saved_size=saved,
                forward_overhead=fo,
                backward_overhead=bo,
            )
            for k, (ft, bt, out, saved, fo, bo) in enumerate(stages)
        ],
    )
    inst = OffloadInstance.from_profile(prof, rate)
    first = run_dp(discretize(inst, memory, slots))
    assert not inst.feasible(first.sets[0], memory)  # what the loop has to repair
    plan = solve_dynprog(inst, memory, slots=slots)
    assert plan.details["dp_runs"] == 2
    sched = memplan.solve(prof, "dynprog", memory, slots=slots, optimizer="none", bandwidth=rate)
    assert sched.feasible and sched.peak_memory <= memory


def test_fallback_to_greedy_when_the_grid_is_too_coarse():
    prof = _random(np.random.default_rng(5), 6, max_size=1000)
    inst = OffloadInstance.from_profile(prof, 1e6)
    plan = solve_dynprog(inst, inst.min_memory(), slots=2)
    assert plan.ops is not None
    if plan.details.get("fallback"):
        assert "GREEDY" in plan.message


def test_candidates_are_never_worse():
    rng = np.random.default_rng(3)
    for _ in range(40):
        prof = _random(rng, int(rng.integers(2, 8)))
        inst = OffloadInstance.from_profile(prof, 2000.0)
        memory = int(rng.integers(inst.min_memory(), inst.peak() + 1))
        plain = solve_dynprog(inst, memory)
        best = solve_dynprog(inst, memory, candidates=8)
        assert best.claimed_makespan <= plain.claimed_makespan + 1e-9


def test_dynprog_on_resnet152_stays_within_its_work_budget():
    """``--slots auto`` on a 53-stage profile: every grid, up to one byte per slot, within the
    work budget (a count of DP states, the same on every machine; no timing here)."""
    prof = memplan.load_profile("resnet152@a100")
    inst = OffloadInstance.from_profile(prof, 12e9)
    low, high = inst.min_memory(), inst.peak()
    for i in range(3):
        memory = low + (high - low) * (2 * i + 1) // 6
        plan = solve_dynprog(inst, memory)
        assert plan.ops is not None
        assert plan.details["dp_work"] <= dynprog.WORK_BUDGET
        assert "stopped" not in plan.details["grids"] and "skipped" not in plan.details["grids"]
        assert plan.details["grids"].endswith(str(memory))  # the one-byte grid ran


def _paper_repair_runs(inst: OffloadInstance, memory: int, slots: int, cap: int = 100) -> int:
    """DP runs of the unbounded loop of §5.3.2: one slot more on one activation per run."""
    bump = np.zeros(inst.n + 1, dtype=np.int64)
    for runs in range(1, cap + 1):
        sl = discretize(inst, memory, slots, bump)
        found = run_dp(sl)
        if inst.feasible(found.sets[0], memory):
            return runs
        deficit = inst.a - sl.a * sl.sigma
        below = np.flatnonzero(deficit > 0)
        bump[below[np.argmin(deficit[below])]] += 1
    return cap


def test_repair_loop_is_bounded():
    """Issue 17 item 12: 60 stages on 20 slots (about half a slot per activation), where the
    paper's one-slot-per-run repair needs 14 runs of the DP; ours stops after
    1 + MAX_REPAIR_RUNS runs and completes the set in bytes, and the plan replays."""
    prof = random_chain(60, seed=24, max_size=1000)
    rate = 1.2e5  # a 1000-byte activation takes 8 ms to move, about two operations
    inst = OffloadInstance.from_profile(prof, rate)
    low, high = inst.min_memory(), inst.peak()
    memory = low + (high - low) // 2
    assert _paper_repair_runs(inst, memory, 20) >= 10
    plan = solve_dynprog(inst, memory, slots=20)
    assert plan.details["dp_runs"] <= 1 + dynprog.MAX_REPAIR_RUNS
    assert inst.feasible(np.isin(np.arange(inst.n), plan.offloaded), memory)
    sched = memplan.solve(prof, "dynprog", memory, slots=20, optimizer="none", bandwidth=rate)
    assert sched.feasible and sched.peak_memory <= memory
    assert memplan.simulate(prof, sched).valid
    auto = solve_dynprog(inst, memory)
    grids = len(auto_grids(memory))
    assert auto.details["dp_runs"] <= grids * (1 + dynprog.MAX_REPAIR_RUNS)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prof=integral_chains(8),
    rate=st.sampled_from((1000.0, 2500.0, 7300.0)),
    slots=st.integers(2, 40),
    data=st.data(),
)
def test_fit_in_bytes(prof, rate, slots, data):
    """The byte-level completion offloads only more, fits, and leaves a fitting set alone."""
    inst = OffloadInstance.from_profile(prof, rate)
    memory = data.draw(st.integers(inst.min_memory(), max(inst.min_memory(), inst.peak())))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=inst.n, max_size=inst.n)))
    fitted = fit_in_bytes(inst, mask, memory)
    assert inst.feasible(fitted, memory)
    assert not (mask & ~fitted).any()
    if inst.feasible(mask, memory):
        assert (fitted == mask).all()
    else:  # each activation it added was needed: without the last one, the set fails
        added = np.flatnonzero(fitted & ~mask)
        assert len(added)
        fewer = fitted.copy()
        fewer[added[-1]] = False
        assert not inst.feasible(fewer, memory)


def _auto_and_default(prof: Profile, rate: float, memory: int) -> tuple[float, float]:
    auto = memplan.solve(prof, "dynprog", memory, optimizer="none", bandwidth=rate)
    grid = memplan.solve(prof, "dynprog", memory, slots=500, optimizer="none", bandwidth=rate)
    greedy = memplan.solve(prof, "greedy", memory, optimizer="none", bandwidth=rate)
    for sched in (auto, grid):
        assert sched.feasible and sched.peak_memory <= memory
        assert memplan.simulate(prof, sched).valid
    assert auto.makespan <= greedy.makespan * (1 + 1e-12)  # GREEDY's set competes in auto
    return auto.makespan, grid.makespan


@pytest.mark.parametrize("seed", range(6))
def test_auto_is_never_worse_than_the_default_grid(seed):
    """Issue 18 item 4: ``--slots auto`` (finer grids, then the fastest real schedule) is never
    slower than the 500-slot grid it starts from, nor than GREEDY, and every plan replays within
    its budget."""
    prof = random_chain(12 + 4 * seed, seed=seed, max_size=10**6)
    rate = 2e8  # a 1 MB activation takes 5 ms to move, about one operation
    inst = OffloadInstance.from_profile(prof, rate)
    low, high = inst.min_memory(), inst.peak()
    for i in range(1, 6):
        auto, grid = _auto_and_default(prof, rate, low + (high - low) * i // 6)
        assert auto <= grid * (1 + 1e-12)


def test_auto_recovers_the_rounding_loss_on_bundled_profiles():
    """On vgg16@a100 at 12 GB/s the 500-slot grid loses 9.85% at one budget (docs/benchmarks.md,
    "dynprog and pofo: rounding"); auto is never slower than the 500-slot grid, nor than the DP
    with one byte per slot (no rounding of sizes), and strictly faster somewhere."""
    prof = memplan.load_profile("vgg16@a100")
    inst = OffloadInstance.from_profile(prof, 12e9)
    gained = 0.0
    for memory in auto_budgets(prof, ["dynprog"], 20, optimizer="none"):
        auto = solve_dynprog(inst, memory)
        if auto.ops is None:
            continue
        grid = solve_dynprog(inst, memory, slots=500)
        exact = solve_dynprog(inst, memory, slots=max(memory, 500))
        assert auto.claimed_makespan <= grid.claimed_makespan * (1 + 1e-12)
        assert auto.claimed_makespan <= exact.claimed_makespan * (1 + 1e-12)
        gained = max(gained, grid.claimed_makespan / auto.claimed_makespan - 1)
    assert gained > 0.05


def test_work_budget_stops_the_finer_grids(monkeypatch):
    """With a small work budget, the finer grids are skipped or stopped (deterministic: states
    are counted, not seconds) and the 500-slot plan is returned."""
    prof = random_chain(120, seed=3, max_size=10**6)
    inst = OffloadInstance.from_profile(prof, 2e8)
    memory = (inst.min_memory() + inst.peak()) // 2
    full = solve_dynprog(inst, memory, slots=500)
    monkeypatch.setattr(dynprog, "WORK_BUDGET", full.details["dp_work"] + 1000)
    plan = solve_dynprog(inst, memory)
    assert "stopped" in plan.details["grids"] or "skipped" in plan.details["grids"]
    assert plan.details["dp_work"] <= dynprog.WORK_BUDGET + plan.details["dp_states"]
    assert plan.claimed_makespan <= full.claimed_makespan * (1 + 1e-12)
    aborted = run_dp(discretize(inst, memory, 5000), work_limit=1000)
    assert aborted.aborted and not aborted.sets and aborted.work > 1000


def _random(rng: np.random.Generator, length: int, max_size: int = 20) -> Profile:
    stages = []
    for k in range(length):
        out = int(rng.integers(1, max_size + 1))
        stages.append(
            Stage(
                name=f"s{k}",
                forward_time=float(rng.integers(1, 8)),
                backward_time=float(rng.integers(1, 8)),
                output_size=out,
                saved_size=out + int(rng.integers(0, max_size + 1)),
                forward_overhead=int(rng.integers(0, max_size // 2 + 1)),
                backward_overhead=int(rng.integers(0, max_size // 2 + 1)),
            )
        )
    return Profile(
        model=f"rand-{length}", input_size=int(rng.integers(1, max_size + 1)), stages=stages
    )


@pytest.mark.parametrize("name", ["resnet50@a100", "resnet101@a100"])
def test_every_algorithm_on_bundled_profiles(name):
    prof = memplan.load_profile(name)
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["offload"], desc["offload_peak"]
    for memory in (low, (low + high) // 2, high - 1):
        for algo in ("greedy", "dynprog", "vdnn"):
            sched = memplan.solve(prof, algo, memory, optimizer="none", bandwidth="12GB/s")
            assert sched.feasible and sched.makespan >= sched.lower_bound - 1e-9
            assert memplan.simulate(prof, sched).valid


def test_slots_option():
    """``slots="auto"`` is dynprog's default and may be given; other strings are input errors."""
    from memplan.errors import InputError

    prof = random_chain(8, seed=1, max_size=1000)
    memory = OffloadInstance.from_profile(prof, 1e6).peak() * 3 // 4
    default = memplan.solve(prof, "dynprog", memory, optimizer="none", bandwidth=1e6)
    auto = memplan.solve(prof, "dynprog", memory, slots="auto", optimizer="none", bandwidth=1e6)
    assert default.makespan == auto.makespan and default.solver.slots == auto.solver.slots
    for bad in ("fine", 1, 100_001):
        with pytest.raises(InputError, match="from 2 to 100000 or .auto."):
            memplan.solve(prof, "dynprog", memory, slots=bad, optimizer="none", bandwidth=1e6)


def test_time_limit_keeps_the_grids_done_and_falls_back_to_greedy():
    """--time-limit: a grid still running when the limit passes is dropped; with none done, the
    plan is GREEDY's set (it fits whenever anything does), and says so."""
    from memplan.algorithms.timeline import Deadline

    prof = random_chain(40, seed=5, max_size=10**6)
    inst = OffloadInstance.from_profile(prof, 1e9)
    memory = (inst.min_memory() + inst.peak()) // 2
    plan = solve_dynprog(inst, memory, deadline=Deadline.after(1e-6))
    assert plan.details["stopped"] == "time limit"
    assert plan.details["fallback"] == "greedy" and "time limit" in plan.message
    sched = memplan.solve(prof, "dynprog", memory, optimizer="none", bandwidth=1e9, time_limit=1e-6)
    assert sched.feasible and memplan.simulate(prof, sched).valid
    assert sched.makespan == pytest.approx(
        memplan.solve(prof, "greedy", memory, optimizer="none", bandwidth=1e9).makespan
    )
