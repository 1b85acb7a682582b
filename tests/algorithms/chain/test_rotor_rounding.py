"""Rotor without rounding loss (issue 18): the byte-level DP, the reachable grid, the tightening.

* With default settings rotor equals the exhaustive byte-level optimum (tests/oracles/exhaustive.py,
  persistent plans: memplan's model) on random chains of up to 6 stages with realistic, all
  different sizes, on both sides of every step of the optimum and between them.
* The byte-level DP equals the slot DP at one byte per slot, budget by budget, and the grid DP on
  reachable budgets only equals the dense table, its float32 tables giving plans that fit and are
  as fast up to float32 rounding: checked on the Python references (tests/oracles/rotor.py), which
  the compiled core equals plan for plan (test_rotor_core.py).
* Tightening a grid never makes the plan slower than the grid's own, never beats the optimum, and
  the plan always fits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import memplan
from memplan.algorithms.chain import ChainInstance, chain_min_memory, plan_rotor, rotor
from memplan.algorithms.chain.rotor import slot_sizes
from memplan.profile.synthetic import random_chain
from tests.oracles.exhaustive import ChainOracle, makespan_at
from tests.oracles.rotor import (
    WorkLimit,
    dense_table,
    exact_backtrack,
    exact_frontiers,
    grid_backtrack,
    grid_table,
    reachable_ranges,
    sub_chain_bounds,
)

# A 6-stage chain at 6998 bytes (--optimizer none), found by searching random 6-stage chains for a
# budget where the 500-slot grid of memplan <= 0.x loses what issue 18 measured (4.2%): the optimal
# plan needs 503 of the grid's 500 slots once every size is rounded up, so the grid returns a plan
# 4.2% slower. The default now solves it in bytes.
CASE_4_2 = {"length": 6, "seed": 148, "max_size": 1000, "memory": 6998}


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def test_the_four_percent_case_is_solved_in_bytes():
    prof = random_chain(CASE_4_2["length"], seed=CASE_4_2["seed"], max_size=CASE_4_2["max_size"])
    memory = CASE_4_2["memory"]
    best = ChainOracle(prof, persistent=True).optimal_makespan(memory)
    assert best is not None
    default = memplan.solve(prof, "rotor", memory, optimizer="none")
    assert default.solver.status == "optimal" and default.solver.slots is None
    assert close(default.makespan, best[0])
    coarse = memplan.solve(prof, "rotor", memory, optimizer="none", slots=500)
    assert coarse.makespan > best[0] * 1.04  # what the 500-slot grid gives (the old default)
    assert memplan.simulate(prof, default).valid


@pytest.mark.parametrize("length", [*range(1, 6), pytest.param(6, marks=pytest.mark.slow)])
@pytest.mark.parametrize("seed", range(3))
def test_default_equals_the_exhaustive_byte_optimum(length, seed):
    """Every budget on both sides of every step of the optimum, and halfway between steps."""
    prof = random_chain(length, seed=1000 + 10 * length + seed, max_size=1000)
    oracle = ChainOracle(prof, persistent=True)
    steps = oracle.makespan_steps()
    budgets = {steps[0][0] - 1}
    ends = steps[1:] + [(steps[-1][0] + 50, 0)]
    for (budget, _), (following, _) in zip(steps, ends, strict=True):
        budgets |= {budget - 1, budget, budget + 1, (budget + following) // 2}
    for memory in sorted(b for b in budgets if b >= 0):
        best = makespan_at(steps, memory)
        sched = memplan.solve(prof, "rotor", memory, optimizer="none")
        where = f"{prof.model} at {memory} bytes: oracle {best}"
        if best is None:
            assert not sched.feasible and sched.min_memory == steps[0][0], where
        else:
            assert sched.feasible and close(sched.makespan, best), (
                f"{where}, rotor {sched.makespan}"
            )
            assert sched.peak_memory <= memory, where


@pytest.mark.parametrize("seed", range(8))
def test_byte_dp_equals_the_one_byte_grid(seed):
    prof = random_chain(2 + seed % 6, seed=seed, max_size=10)
    chain = ChainInstance.from_profile(prof)
    x0 = int(chain.x[0])
    for memory in range(chain_min_memory(chain) - 2, chain.store_all_peak() + 3):
        budget = memory - x0
        if budget < 0:
            continue
        capacity, r = slot_sizes(chain, budget, max(2, budget))
        table = grid_table(chain, capacity, r["x"], r["s"], r["g"], r["fo"], r["bo"])
        grid = float(table.row(0, chain.length - 1)[capacity])
        frontiers = exact_frontiers(chain, budget)
        top = frontiers[0][chain.length - 1]
        step = top.at(budget)
        exact = float(top.time[step]) if step >= 0 else math.inf
        assert exact == pytest.approx(grid), memory
        if step >= 0:
            plan = exact_backtrack(chain, frontiers, budget)
            assert chain.peak(plan) <= memory
            assert chain.makespan(plan) == pytest.approx(exact)


@pytest.mark.parametrize("seed", range(6))
def test_reachable_grid_equals_the_dense_table(seed):
    prof = random_chain(3 + 3 * seed, seed=seed, max_size=1000)
    chain = ChainInstance.from_profile(prof)
    low, high = chain_min_memory(chain), chain.store_all_peak()
    for fraction in (0.0, 0.2, 0.5, 0.9):
        memory = low + int((high - low) * fraction)
        for slots in (20, 300):
            capacity, r = slot_sizes(chain, memory - int(chain.x[0]), slots)
            sizes = [r[k] for k in ("x", "s", "g", "fo", "bo")]
            dense, _ = dense_table(chain, capacity, *sizes)
            expected = float(dense[0, chain.length - 1, capacity])
            table = grid_table(chain, capacity, *sizes)
            assert float(table.row(0, chain.length - 1)[capacity]) == pytest.approx(expected)
            single = grid_table(chain, capacity, *sizes, dtype=np.float32)
            if math.isfinite(expected):
                for found in (table, single):
                    plan = grid_backtrack(chain, found, *sizes, capacity)
                    assert chain.peak(plan) <= memory
                    assert chain.makespan(plan) == pytest.approx(expected, rel=1e-6)
            else:
                assert not math.isfinite(float(single.row(0, chain.length - 1)[capacity]))


def _asked_by_brute_force(chain: ChainInstance, capacity: int, x, s, lo, hi) -> dict:
    """Every (a, b) -> budgets asked, by walking the recurrences from the top."""
    asked: dict[tuple[int, int], set[int]] = {}
    stack = [(0, chain.length - 1, capacity)]
    while stack:
        a, b, m = stack.pop()
        if m < lo[a, b] or m >= hi[a, b] or m in asked.setdefault((a, b), set()):
            continue
        asked[(a, b)].add(m)
        if a == b:
            continue
        if m - s[a] >= 0:
            stack.append((a + 1, b, m - int(s[a])))
        for j in range(a + 1, b + 1):
            if m - x[j] >= 0:
                stack += [(j, b, m - int(x[j])), (a, j - 1, m)]
    return asked


@pytest.mark.parametrize("seed", range(6))
def test_reachable_ranges_are_those_of_the_recursion(seed):
    chain = ChainInstance.from_profile(random_chain(2 + seed, seed=seed, max_size=30))
    budget = (chain.store_all_peak() - int(chain.x[0])) // 2
    capacity, r = slot_sizes(chain, budget, 60)
    x, s = r["x"], r["s"]
    lo, hi = sub_chain_bounds(chain.length, x, s, r["g"], r["fo"], r["bo"])
    first, last = reachable_ranges(chain.length, capacity, x, s, lo, hi)
    asked = _asked_by_brute_force(chain, capacity, x, s, lo, hi)
    for a in range(chain.length):
        for b in range(a, chain.length):
            found = asked.get((a, b), set())
            if found:
                assert (first[a, b], last[a, b]) == (min(found), max(found)), (a, b)
            else:
                assert first[a, b] > last[a, b], (a, b)


@pytest.mark.parametrize("seed", range(4))
def test_tightening_fits_and_never_loses(seed):
    """The grid tightened in bytes: no slower than the grid's own plan, never below the optimum."""
    chain = ChainInstance.from_profile(random_chain(14, seed=seed, max_size=1000))
    low, high = chain_min_memory(chain), chain.store_all_peak()
    for fraction in (0.1, 0.4, 0.7):
        memory = low + int((high - low) * fraction)
        budget = memory - int(chain.x[0])
        frontiers = exact_frontiers(chain, budget)
        top = frontiers[0][chain.length - 1]
        optimum = float(top.time[top.at(budget)])
        plain = rotor._on_grid(chain, memory, budget, 100, tighten=False)
        tight = rotor._on_grid(chain, memory, budget, 100, tighten=True)
        if plain is None:
            continue
        assert tight is not None
        assert chain.peak(tight[0]) <= memory
        assert optimum - 1e-9 <= chain.makespan(tight[0]) <= chain.makespan(plain[0]) + 1e-9


def test_work_limit_hands_over_to_the_grid(monkeypatch):
    prof = random_chain(12, seed=3, max_size=1000)
    chain = ChainInstance.from_profile(prof)
    memory = (chain_min_memory(chain) + chain.store_all_peak()) // 2
    with pytest.raises(WorkLimit):
        exact_frontiers(chain, memory - int(chain.x[0]), work_limit=10)
    exact = plan_rotor(chain, memory)
    assert exact.status == "optimal" and exact.slots is None
    monkeypatch.setattr(rotor, "EXACT_WORK", 10)
    gridded = plan_rotor(chain, memory)
    assert gridded.slots is not None and chain.peak(gridded.sequence) <= memory
    assert gridded.claimed_makespan >= exact.claimed_makespan - 1e-9
    sched = memplan.solve(prof, "rotor", memory, optimizer="none")
    assert sched.solver.slots is not None and memplan.simulate(prof, sched).valid


def test_auto_slots_follow_the_chain_length():
    assert rotor.auto_slots(50) > rotor.auto_slots(100) > rotor.AUTO_SLOTS
    assert rotor.auto_slots(300) == rotor.AUTO_SLOTS
    assert rotor.auto_slots(10) == rotor.MAX_AUTO_SLOTS
    # long chains: the values of the table stay within AUTO_TABLE_BYTES (float32)
    assert rotor.auto_slots(2000) * 2000 * 2001 // 2 * 4 <= rotor.AUTO_TABLE_BYTES


@pytest.mark.parametrize("given", ["auto", None])
def test_slots_auto_through_the_api(given):
    prof = memplan.load_profile("resnet50@a100")
    sched = memplan.solve(prof, "rotor", "3GB", slots=given)
    assert sched.feasible and sched.solver.status == "optimal" and sched.solver.slots is None
    coarse = memplan.solve(prof, "rotor", "3GB", slots=500)
    assert sched.makespan <= coarse.makespan + 1e-9
