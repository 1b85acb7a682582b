"""Revolve against Griewank & Walther's closed form, and periodic against checkpoint_sequential."""

from __future__ import annotations

from math import comb

import pytest

import memplan
from memplan.algorithms.chain import (
    ChainInstance,
    extra_forwards,
    periodic_sequence,
    revolve_sequence,
)
from memplan.algorithms.chain.periodic import segment_bounds
from memplan.api import schedule_from_sequence
from memplan.profile.synthetic import homogeneous_chain


def closed_form(l: int, c: int) -> int:
    """t(l, c) = r*l - C(c+r, c+1), r the least integer with C(c+r, c) >= l."""
    r = 0
    while comb(c + r, c) < l:
        r += 1
    return r * l - comb(c + r, c + 1)


@pytest.mark.parametrize("c", range(1, 6))
@pytest.mark.parametrize("l", range(1, 31))
def test_extra_forwards_match_closed_form(l, c):
    assert extra_forwards(l, c) == closed_form(l, c)
    sequence = revolve_sequence(l, c)
    forwards = sum(1 for op, _ in sequence if op != "B")
    assert forwards - l == closed_form(l, c)


@pytest.mark.parametrize(("l", "c"), [(10, 1), (10, 3), (30, 4), (64, 2)])
def test_revolve_plan_replays_and_uses_c_slots(l, c):
    """On a unit chain the plan is valid and holds at most c checkpoints (x[0] included)."""
    prof = homogeneous_chain(l)
    sequence = revolve_sequence(l, c)
    result = memplan.simulate(prof, schedule_from_sequence(prof, sequence, optimizer="none"))
    assert result.valid, result.violation
    assert result.makespan == pytest.approx(2 * l + closed_form(l, c))
    # Unit sizes: checkpoints (c) + working activation + s + two gradients during a backward.
    assert result.peak_memory <= c + 4


def test_revolve_through_solve_picks_more_slots_with_more_memory():
    prof = homogeneous_chain(20)
    times = [memplan.solve(prof, "revolve", m, optimizer="none").makespan for m in range(6, 26)]
    assert times == sorted(times, reverse=True)
    assert times[-1] == pytest.approx(2 * 20 + closed_form(20, 20))


@pytest.mark.parametrize(("length", "segments"), [(10, 3), (7, 7), (5, 1), (12, 5)])
def test_periodic_cuts_like_checkpoint_sequential(length, segments):
    bounds = segment_bounds(length, segments)
    size = length // segments
    assert [b - a + 1 for a, b in bounds[:-1]] == [size] * (segments - 1)
    assert bounds[-1] == ((segments - 1) * size, length - 1)
    sequence = periodic_sequence(length, segments)
    chain = ChainInstance.from_profile(homogeneous_chain(length))
    assert chain.peak(sequence) is not None
    # Every segment but the last is run twice.
    assert sum(op != "B" for op, _ in sequence) == length + sum(b - a + 1 for a, b in bounds[:-1])
