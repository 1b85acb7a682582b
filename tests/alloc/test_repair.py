"""Ruin and recreate (src/alloc_repair.cpp, :mod:`memplan.alloc.repair`): every placement it keeps
is valid (the independent checker), never worse than where it started, the same for the same
moves, and it stops at its goal; and :func:`memplan.alloc.place` uses it at scale, with and
without a capacity."""

from __future__ import annotations

import math

import numpy as np
import pytest

import memplan.alloc.engine as engine_module
from memplan.alloc import Buffers, check_placement, place
from memplan.alloc.greedy import best_greedy, first_fit
from memplan.alloc.instance import SkylineTables
from memplan.alloc.repair import Repair


def instance(seed: int, n: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random lifetimes over n / 4 steps, sizes 1..1000 (all positive)."""
    rng = np.random.default_rng(9100 + seed)
    lower = rng.integers(0, max(n // 4, 1), n)
    upper = lower + rng.integers(1, 30, n)
    size = rng.integers(1, 1001, n)
    return lower, upper, size


def arena(offsets: np.ndarray, size: np.ndarray) -> int:
    return int((offsets + size).max(initial=0))


def as_buffers(lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> Buffers:
    rows = zip(lower.tolist(), upper.tolist(), size.tolist(), strict=True)
    return Buffers.from_rows([(f"b{k}", a, e, s) for k, (a, e, s) in enumerate(rows)])


def poor_start(seed: int, lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> np.ndarray:
    """First fit in a random order."""
    return first_fit(lower, upper, size, np.random.default_rng(seed).permutation(len(size)))


@pytest.mark.parametrize("seed", range(12))
def test_repair_keeps_a_valid_placement_never_above_its_start(seed: int) -> None:
    lower, upper, size = instance(seed, n=40 + 40 * seed)
    start = poor_start(seed, lower, upper, size)
    repair = Repair(lower, upper, size, start, math.gcd(*size.tolist()))
    peak = as_buffers(lower, upper, size).peak_live_load()
    for _ in range(5):
        found = repair.run(peak, None, moves=400)
        best = repair.best()
        check = check_placement(lower, upper, size, best, None)
        assert check.valid, check.violation
        assert check.arena == found == repair.best_arena
        assert peak <= found <= arena(start, size)


def test_repair_improves_a_random_first_fit() -> None:
    lower, upper, size = instance(3, n=400)
    start = poor_start(3, lower, upper, size)
    repair = Repair(lower, upper, size, start)
    assert repair.run(0, None, moves=20_000) < arena(start, size)


def test_repair_is_the_same_for_the_same_moves() -> None:
    lower, upper, size = instance(5)
    start = best_greedy(lower, upper, size)
    placements = []
    for _ in range(2):
        repair = Repair(lower, upper, size, start)
        repair.run(0, None, moves=3000)
        placements.append(repair.best())
        assert repair.moves == 3000
    assert np.array_equal(placements[0], placements[1])


def test_repair_stops_at_its_goal_and_goes_on_from_a_better_placement_offered() -> None:
    lower, upper, size = instance(7)
    start = poor_start(7, lower, upper, size)
    top = arena(start, size)
    repair = Repair(lower, upper, size, start)
    assert repair.run(top, None, moves=1000) == top and repair.moves == 0  # at its goal already
    repair.offer(np.cumsum(size) - size)  # valid (stacked), and far worse: not taken
    assert np.array_equal(repair.best(), start)
    other = Repair(lower, upper, size, start)
    better = other.run(0, None, moves=20_000)
    assert better < top
    repair.offer(other.best())
    assert repair.best_arena == better
    assert np.array_equal(repair.best(), other.best())
    assert repair.run(0, None, moves=500) <= better


@pytest.mark.parametrize(
    "offsets, message", [(np.array([0, 0, -1]), "offset"), (np.array([0, 0]), "lengths")]
)
def test_repair_refuses_bad_arrays(offsets: np.ndarray, message: str) -> None:
    lower, upper, size = np.array([0, 1, 2]), np.array([1, 2, 3]), np.array([1, 1, 1])
    with pytest.raises(ValueError, match=message):
        Repair(lower, upper, size, offsets)


@pytest.mark.parametrize("seed", range(6))
def test_stacked_twins_are_the_same_lifetimes_within_the_window(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 120))
    lower = rng.integers(0, 3, n)
    upper = lower + rng.integers(1, 3, n)
    tables = SkylineTables(lower, upper, np.ones(n, dtype=np.int64))
    start, buf = tables.tw_start, tables.tw_buf
    for b in range(n):
        group = [k for k in range(n) if lower[k] == lower[b] and upper[k] == upper[b]]
        at = group.index(b)
        expected = [k for i, k in enumerate(group) if k != b and abs(i - at) <= 32]
        assert sorted(buf[start[b] : start[b + 1]].tolist()) == expected


def scale_instance(seed: int, n: int) -> Buffers:
    """Random buffers of a few steps each (the benchmarks' ``short`` shape, smaller)."""
    rng = np.random.default_rng(seed)
    lower = rng.integers(0, n, n)
    upper = lower + rng.integers(1, 60, n)
    return as_buffers(lower, upper, rng.integers(1, 1 << 20, n))


def test_place_at_a_capacity_on_the_skyline_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capacity the greedy first fit misses, on an instance for the skyline search (as when
    its lists are too long for the compiled search): placed, and checked by place()."""
    monkeypatch.setattr(engine_module, "SEARCH_PAIRS", 100)
    b = scale_instance(11, 600)
    greedy = best_greedy(b.lower, b.upper, b.size)
    capacity = (arena(greedy, b.size) + b.peak_live_load()) // 2
    result = place(b, capacity=capacity, time_limit=60)
    assert result.status == "placed", result.message
    assert result.arena is not None and result.arena <= capacity < arena(greedy, b.size)
    assert "descent" in result.message or "search" in result.message


def test_least_arena_without_a_time_limit_is_the_same_placement_every_time() -> None:
    b = scale_instance(12, 200)
    first, second = place(b), place(b)
    assert first.status == second.status == "optimal"
    assert first.offsets is not None and second.offsets is not None
    assert np.array_equal(first.offsets, second.offsets)
