"""The paper's exact model (papers/003): c_min (Theorem 2), Opt_join (Theorem 3), schedules."""

from __future__ import annotations

import itertools
import math
from math import comb

import pytest

import memplan
from memplan.algorithms.join.pebble import (
    JoinTable,
    c_min,
    equiv_chain_plans,
    opt_join,
    plan_cost,
    plan_peak,
    segment_table,
)
from memplan.profile.synthetic import homogeneous_join
from tests.oracles.join import pebble_min_slots, pebble_optimum


def theorem2(lengths: tuple[int, ...]) -> int:
    """Equation (3.1), written out again from the paper."""
    k = len(lengths)
    if not any(lengths):
        return k
    nonzero = sum(1 for length in lengths if length)
    return k + nonzero + (0 if 1 in lengths else 1)


def vectors(k: int, longest: int):
    """Length vectors up to order (the problem is symmetric in the branches)."""
    return (v for v in itertools.product(range(longest + 1), repeat=k) if list(v) == sorted(v))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_c_min_is_theorem_2_and_the_least_feasible_memory(k: int) -> None:
    """k <= 3 branches of lengths <= 6: formula, exhaustive pebble search and DP agree."""
    for lengths in itertools.product(range(7), repeat=k):
        expected = theorem2(lengths)
        assert c_min(lengths) == expected, lengths
        table = JoinTable(lengths, expected)
        assert math.isinf(table.opt(expected - 1)), lengths
        assert math.isfinite(table.opt(expected)), lengths
    for lengths in vectors(k, 6):
        assert pebble_min_slots(lengths) == theorem2(lengths), lengths


@pytest.mark.parametrize(
    ("k", "longest", "costs"),
    [
        (1, 7, (1, 1, 1)),
        (2, 4, (1, 1, 1)),
        (2, 4, (2, 3, 1.5)),
        (3, 3, (1, 1, 1)),
        (3, 2, (3, 1, 2)),
    ],
)
def test_opt_join_equals_exhaustive_search(k: int, longest: int, costs) -> None:
    """Theorem 3 against a Dijkstra search over every valid pebble-game sequence."""
    uf, ub, ut = costs
    for lengths in vectors(k, longest):
        top = sum(lengths) + k + 1
        table = JoinTable(lengths, top, uf, ub, ut)
        for c in range(k, top + 1):
            assert table.opt(c) == pebble_optimum(lengths, c, uf, ub, ut), (lengths, c)


def revolve_closed_form(steps: int, checkpoints: int) -> int:
    """Griewank's extra forward count t(l, c) = r l - C(c + r, c + 1), r least with C(c+r, c) >= l."""
    r = 0
    while comb(checkpoints + r, checkpoints) < steps:
        r += 1
    return r * steps - comb(checkpoints + r, checkpoints + 1)


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 20, 40])
def test_segments_are_revolve(steps: int) -> None:
    """Opt_0 of Theorem 3 is Revolve: Griewank's closed form with c - 2 checkpoints."""
    table = segment_table(steps, steps + 3, 1.5, 2.0)
    for c in range(2, steps + 4):
        if steps == 1:
            assert table[1, c] == 2.0
        elif c == 2:
            assert math.isinf(table[steps, c])
        else:
            assert table[steps, c] == 1.5 * revolve_closed_form(steps, c - 2) + steps * 2.0


@pytest.mark.parametrize("length", [1, 2, 5, 12, 30])
def test_one_branch_is_revolve_rooted_at_the_turn(length: int) -> None:
    """k = 1: the adjoint chain of Revolve whose seed appears at the turn (docs/join.md).

    Opt_join((l), c) follows Revolve's recursion with the turn as its base case; it lies between
    Revolve on l + 1 steps with the seed's slot held throughout (c slots) and with one slot more,
    and equals the exhaustive search (test above) on small chains.
    """
    uf, ub = 1.0, 2.0
    table = JoinTable([length], length + 2, uf, ub, ub)
    segments = segment_table(length + 1, length + 4, uf, ub)
    for c in range(3, length + 3):
        got = table.opt(c)
        recursion = min(
            i * uf + table.opt(c - 1, [length - i]) + segments[i, c] for i in range(1, length + 1)
        )
        assert got == recursion
        assert segments[length + 1, c + 1] <= got <= segments[length + 1, c]
    assert table.opt(length + 1) == length * (uf + ub) + ub  # store-all: l + 1 slots


@pytest.mark.parametrize("L", [1, 2, 3, 5, 10])
def test_store_all_memory_gives_span_star(L: int) -> None:
    """SNN (2L,2L,2L), CM (L,5L), RNN (6L), u = 1: Span* = 12L + 1 from sum(l) + k slots on."""
    for lengths in ((2 * L,) * 3, (L, 5 * L), (6 * L,)):
        top = sum(lengths) + len(lengths)
        table = JoinTable(lengths, top + 2)
        for c in (top, top + 1, top + 2):
            assert table.opt(c) == 12 * L + 1
        assert table.opt(top - 1) > 12 * L + 1  # one slot fewer forces a recomputation


def test_schedules_are_canonical_and_replay() -> None:
    """The schedule of Opt_join: valid, within c slots, as fast as stated, turn once."""
    lengths = (4, 10, 12)  # Figure 5 of the paper
    table = JoinTable(lengths, 14)
    for c in range(c_min(lengths), 15):
        plan = table.sequence(c)
        assert plan_peak(lengths, plan) is not None
        assert plan_peak(lengths, plan) <= c
        assert plan_cost(plan, 1, 1, 1) == table.opt(c)
        turn = plan.index(("turn", None, 0))
        assert all(op in ("F_ck", "F_n") for op, _, _ in plan[:turn])
        assert sum(op == "turn" for op, _, _ in plan) == 1


def test_solve_through_the_api_is_the_paper_in_slots() -> None:
    """--mem c*s with every size s means c slots; the simulator replays the plan."""
    s = 4096
    prof = homogeneous_join([6, 6, 6], size=s)
    for c in range(7, 22):
        sched = memplan.solve(prof, "join", c * s, optimizer="none")
        assert sched.feasible
        assert sched.join_model == "pebble" and sched.join_slots == c
        assert sched.makespan == opt_join([6, 6, 6], c)
        assert sched.peak_memory <= c * s
        check = memplan.simulate(prof, sched)
        assert check.valid and check.makespan == sched.makespan
        assert all(op.branch is not None for op in sched.ops if op.op != "turn")


def test_below_c_min_is_infeasible_with_c_min() -> None:
    prof = homogeneous_join([2, 5], size=10)
    sched = memplan.solve(prof, "join", 4 * 10 + 9, optimizer="none")
    assert not sched.feasible
    assert sched.min_memory == 5 * 10
    assert "c_min = 5" in sched.solver.message
    assert memplan.solve(prof, "join", 50, optimizer="none").feasible
    assert not memplan.solve(
        homogeneous_join([1, 5], size=10), "join", 39, optimizer="none"
    ).feasible
    assert memplan.solve(homogeneous_join([1, 5], size=10), "join", 40, optimizer="none").feasible


def test_equiv_chain_is_never_better_and_matches_at_store_all() -> None:
    lengths = (6, 6, 6)
    table = JoinTable(lengths, 21)
    plans = equiv_chain_plans(lengths)
    for chain_slots, plan in plans:
        peak = plan_peak(lengths, plan)
        assert peak is not None and peak == 3 * chain_slots  # a group slot is k slots
        assert plan_cost(plan, 1, 1, 1) >= table.opt(peak)
    prof = homogeneous_join(list(lengths), size=1)
    for c in (9, 12, 15, 21):
        eq = memplan.solve(prof, "equiv-chain", c, optimizer="none")
        best = memplan.solve(prof, "join", c, optimizer="none")
        assert eq.makespan >= best.makespan
    assert memplan.solve(prof, "equiv-chain", 21, optimizer="none").makespan == 37


def test_equiv_chain_on_unbalanced_branches_replays() -> None:
    prof = homogeneous_join([2, 7], size=1)
    for c in range(5, 12):
        sched = memplan.solve(prof, "equiv-chain", c, optimizer="none")
        if sched.feasible:
            assert sched.makespan >= opt_join([2, 7], c)
        else:
            assert sched.min_memory is not None and sched.min_memory > c
