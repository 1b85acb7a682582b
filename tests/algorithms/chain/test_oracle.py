"""The exhaustive-search oracle against hand-counted optima, and against the simulator."""

from __future__ import annotations

import math

import pytest

from memplan.profile.model import Profile, Stage
from memplan.profile.synthetic import homogeneous_chain, random_chain
from memplan.simulator import simulate_chain
from tests.oracles.exhaustive import (
    ChainOracle,
    makespan_at,
    makespan_steps,
    min_feasible_memory,
    optimal_makespan,
)


def two_stages() -> Profile:
    """x0 = 1; stage 0: x1 = 1, s0 = 5 (a big saved tensor); the loss: x2 = 1, s1 = 1; times 1."""
    stages = [
        Stage(name="big", forward_time=1, backward_time=1, output_size=1, saved_size=5),
        Stage(name="loss", forward_time=1, backward_time=1, output_size=1, saved_size=1),
    ]
    return Profile(model="two", input_size=1, stages=stages)


def test_single_stage():
    prof = random_chain(1, seed=2)
    st = prof.stages[0]
    store_all = simulate_chain(prof, [("F_all", 0), ("B", 0)]).peak_memory
    # F_all then B is the only plan (F_ck/F_n produce nothing B can use).
    assert min_feasible_memory(prof) == store_all
    assert optimal_makespan(prof, store_all - 1) is None
    makespan, plan = optimal_makespan(prof, store_all)
    assert makespan == st.forward_time + st.backward_time
    assert plan == [("F_all", 0), ("B", 0)]


def test_two_stages_hand_counted():
    """Store-all: F_all 0 -> 2 + 5 = 7, F_all 1 -> 8, B 1 -> 8 + g1 = 9: peak 9, makespan 4.

    Checkpointing x1: F_ck 0 -> 3, F_all 1 -> 4, B 1 -> 5 (then x0, g1 = 2 held), F_all 0 -> 7,
    B 0 -> 7: peak 7, makespan 5. Nothing needs less: B 0 needs x0 + s0 + g1 = 7 held.
    """
    prof = two_stages()
    assert min_feasible_memory(prof) == 7
    assert optimal_makespan(prof, 6) is None
    assert optimal_makespan(prof, 7)[0] == 5
    assert optimal_makespan(prof, 8)[0] == 5
    assert optimal_makespan(prof, 9) == (4, [("F_all", 0), ("F_all", 1), ("B", 1), ("B", 0)])
    assert optimal_makespan(prof, 10**6)[0] == 4
    assert makespan_steps(prof) == [(7, 5), (9, 4)]


def test_two_stages_static_memory():
    prof = two_stages()
    assert min_feasible_memory(prof, static_memory=10) == 17
    assert optimal_makespan(prof, 16, static_memory=10) is None
    assert optimal_makespan(prof, 17, static_memory=10)[0] == 5
    assert optimal_makespan(prof, 19, static_memory=10)[0] == 4
    assert makespan_steps(prof, static_memory=10) == [(17, 5), (19, 4)]


def test_three_unit_stages_hand_counted():
    """Unit sizes and times. Store-all peaks at 6 (B 2: x0, s0, s1, s2, g3 + g2): makespan 6.

    B 2 needs x0, x2 (standalone or in s1), s2, g3 held and makes g2: at least 5. With 5, nothing
    else is held at B 2, so stage 0 runs again after it (x1 and s0 are gone). Stage 1 runs twice:
    an F_all 1 before B 2 kept until B 1 needs x1 when it runs, standalone (freed only by F_n 1 or
    B 1) or inside s0 (freed only by B 0), which would still be held at B 2. So at least 5 forwards
    + 3 backwards = 8, reached by F_ck 0, F_n 1, F_all 2, B 2, F_all 0, F_all 1, B 1, B 0.
    """
    prof = homogeneous_chain(3)
    assert min_feasible_memory(prof) == 5
    assert optimal_makespan(prof, 4) is None
    makespan, plan = optimal_makespan(prof, 5)
    assert makespan == 8
    assert simulate_chain(prof, plan, memory=5).valid
    assert optimal_makespan(prof, 6)[0] == 6
    assert makespan_steps(prof) == [(5, 8), (6, 6)]


CHAINS = [
    (length, seed, overheads)
    for length in range(1, 6)
    for seed in range(3)
    for overheads in (True, False)
]


@pytest.mark.parametrize(("length", "seed", "overheads"), CHAINS)
def test_oracle_plans_replay(length, seed, overheads):
    """Every plan the oracle returns is valid in the simulator, with its makespan, in its budget."""
    prof = random_chain(length, seed=seed, overheads=overheads, integer_times=True)
    oracle = ChainOracle(prof)
    steps = oracle.makespan_steps()
    least = oracle.min_feasible_memory()
    assert steps[0][0] == least
    assert oracle.optimal_makespan(least - 1) is None
    # With all the memory it wants, nothing is recomputed.
    assert steps[-1][1] == prof.lower_bound
    for budget, makespan in steps:
        assert makespan_at(steps, budget) == makespan
        # Each step starts exactly at its budget: one byte less, the optimum is slower.
        below = oracle.optimal_makespan(budget - 1)
        assert below is None or below[0] > makespan
        found = oracle.optimal_makespan(budget)
        assert found is not None and found[0] == makespan
        result = simulate_chain(prof, found[1], memory=budget)
        assert result.valid, result.violation
        assert result.makespan == makespan
        assert result.peak_memory <= budget


def test_oracle_with_float_times_and_static_memory():
    prof = random_chain(4, seed=9)
    static = 2 * prof.weight_size
    least = min_feasible_memory(prof, static_memory=static)
    assert optimal_makespan(prof, least - 1, static_memory=static) is None
    for budget in range(least, least + 30, 3):
        makespan, plan = optimal_makespan(prof, budget, static_memory=static)
        result = simulate_chain(prof, plan, static_memory=static, memory=budget)
        assert result.valid, result.violation
        assert math.isclose(result.makespan, makespan, rel_tol=1e-9)


@pytest.mark.parametrize(("length", "seed"), [(3, 0), (4, 1), (5, 2)])
def test_persistent_plans_are_never_faster(length, seed):
    """The persistent search is a restriction: never faster, and its plans are valid plans."""
    prof = random_chain(length, seed=seed, integer_times=True)
    full, persistent = ChainOracle(prof, persistent=False), ChainOracle(prof)
    assert persistent.min_feasible_memory() == full.min_feasible_memory()
    full_steps = full.makespan_steps()
    for budget, makespan in persistent.makespan_steps():
        assert makespan >= makespan_at(full_steps, budget)
        found = persistent.optimal_makespan(budget)
        result = simulate_chain(prof, found[1], memory=budget)
        assert result.valid and result.makespan == makespan == found[0]


def non_persistent_case() -> Profile:
    """A 5-stage chain (no overheads) where at 48 bytes no persistent plan is optimal.

    ======  ==  ==  ======  ====
    stage   ft  bt  x[k+1]  s[k]
    ======  ==  ==  ======  ====
    0       6   5   7       16
    1       1   5   7       8
    2       9   1   10      13
    3       8   5   8       9
    4       5   4   5       14
    ======  ==  ==  ======  ====
    """
    rows = [(6, 5, 7, 16), (1, 5, 7, 8), (9, 1, 10, 13), (8, 5, 8, 9), (5, 4, 5, 14)]
    stages = [
        Stage(name=f"s{k}", forward_time=ft, backward_time=bt, output_size=out, saved_size=saved)
        for k, (ft, bt, out, saved) in enumerate(rows)
    ]
    return Profile(model="non-persistent", input_size=6, stages=stages)


def test_a_non_persistent_plan_is_faster():
    """Keeping x2 for the sub-chain 2..3, then freeing it with F_n 2, beats every persistent plan.

    Hand-counted (x0 = 6 bytes, g5 = 5 at the start), peaks:
    F_ck 0: 18, F_n 1: 25, F_ck 2: 28, F_n 3: 36 (x0, x2, x4, g5 = 26 held), F_all 4: 40,
    B 4: 48 (then x0, x2, g4 = 21), F_n 2: 31 (x2 freed: x0, x3, g4 = 24), F_all 3: 33, B 3: 43
    (x0, g3 = 16), F_ck 0: 23, F_n 1: 30, F_all 2: 36, B 2: 43, F_all 0: 29, F_all 1: 37, B 1: 44,
    B 0: 29; makespan 89. A persistent plan would keep x2 until B 2, so that B 3 would need
    x0, x2, x3, s3, g4 + g3 = 50 bytes: the best one recomputes stages 0..2 for B 3 instead (96).
    """
    prof = non_persistent_case()
    plan = [("F_ck", 0), ("F_n", 1), ("F_ck", 2), ("F_n", 3), ("F_all", 4), ("B", 4)]
    plan += [("F_n", 2), ("F_all", 3), ("B", 3), ("F_ck", 0), ("F_n", 1), ("F_all", 2), ("B", 2)]
    plan += [("F_all", 0), ("F_all", 1), ("B", 1), ("B", 0)]
    forwards = (6 + 1 + 9 + 8 + 5) + (9 + 8) + (6 + 1 + 9) + (6 + 1)
    backwards = 4 + 5 + 1 + 5 + 5
    assert forwards + backwards == 89
    assert optimal_makespan(prof, 48, persistent=False) == (
        89,
        plan,
    )  # the relaxed model (persistent=False)
    # memplan's model (docs/model.md, memory persistency) forbids it: F_n 2 consumes the stored x2.
    result = simulate_chain(prof, plan, memory=48)
    assert not result.valid and result.violation_index == 6
    assert "persistency" in result.violation
    assert result.op_peaks == [18, 25, 28, 36, 40, 48]
    assert ChainOracle(prof, persistent=True).optimal_makespan(48)[0] == 96
