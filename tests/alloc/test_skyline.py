"""The skyline search (src/alloc_skyline.cpp) on instances small enough for CP-SAT: it is chosen
only for large instances (:func:`memplan.alloc.engine.uses_skyline`), so here it is forced, and
its verdicts, least arenas and greedy descents are checked against CP-SAT, the compiled search
and the independent checker."""

from __future__ import annotations

import numpy as np
import pytest

import memplan.alloc.engine as engine_module
from memplan.alloc import Buffers, check_placement, place
from memplan.alloc.engine import PREORDERS, PartSearch
from memplan.alloc.greedy import best_greedy
from memplan.alloc.least import descent_first, first_guess
from memplan.alloc.lifetimes import overlaps
from memplan.alloc.search import search
from tests.alloc.test_core import capacity_between
from tests.alloc.test_search import cpsat_least_arena, perfect_tiling, random_buffers


def positive(b: Buffers) -> Buffers:
    """``b`` without its buffers of size 0 (the engines take positive sizes only)."""
    keep = np.flatnonzero(b.size > 0)
    return Buffers.from_rows(
        [(b.ids[k], int(b.lower[k]), int(b.upper[k]), int(b.size[k])) for k in keep]
    )


def small(seed: int) -> Buffers:
    rng = np.random.default_rng(7000 + seed)
    while True:
        b = positive(random_buffers(rng, int(rng.integers(6, 13)), horizon=14, big=12))
        if len(b):
            return b


@pytest.mark.parametrize("seed", range(30))
def test_skyline_verdict_at_a_capacity_matches_cpsat_and_the_compiled_search(seed: int) -> None:
    b = small(seed)
    capacity = capacity_between(b, np.random.default_rng(seed))
    expected = cpsat_least_arena(b, capacity)
    verdicts = {}
    for skyline in (True, False):
        engine = PartSearch(b.lower, b.upper, b.size, skyline=skyline)
        assert engine.skyline is skyline
        result = search(b.lower, b.upper, b.size, capacity, time_limit=60, engine=engine)
        verdicts[skyline] = result.status
        if expected is None:
            assert result.status == "infeasible", (skyline, result)
        else:
            assert result.status == "placed", (skyline, result)
            assert result.offsets is not None
            check = check_placement(b.lower, b.upper, b.size, result.offsets, capacity)
            assert check.valid, check.violation
    assert verdicts[True] == verdicts[False]


@pytest.mark.parametrize("seed", range(12))
def test_skyline_least_arena_matches_cpsat(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ least arena ] driven by the skyline search (first guess from its descents)."""
    monkeypatch.setattr(engine_module, "uses_skyline", lambda lower, upper, least=False: True)
    b = small(100 + seed)
    result = place(b, time_limit=60)
    assert result.status == "optimal", result.message
    assert result.arena == cpsat_least_arena(b)


@pytest.mark.parametrize("seed", range(4))
def test_skyline_places_zero_waste_tilings_at_the_peak(seed: int) -> None:
    rng = np.random.default_rng(300 + seed)
    b = positive(perfect_tiling(rng, capacity=64, horizon=30, cuts=60))
    engine = PartSearch(b.lower, b.upper, b.size, skyline=True)
    result = search(b.lower, b.upper, b.size, 64, time_limit=60, engine=engine)
    assert result.offsets is not None, result
    assert check_placement(b.lower, b.upper, b.size, result.offsets, 64).valid


@pytest.mark.parametrize("preorder", range(len(PREORDERS)))
def test_each_descent_places_every_buffer_validly(preorder: int) -> None:
    """A descent is a greedy placement with no capacity: every buffer of every part placed,
    no two live at once overlapping, the arena at least the peak live load."""
    rng = np.random.default_rng(11 + preorder)
    b = positive(random_buffers(rng, 3000, horizon=400, big=1000))
    engine = PartSearch(b.lower, b.upper, b.size, skyline=True)
    offsets = np.zeros(len(b), dtype=np.int64)
    for part in engine.parts:
        placed = engine.descend(part, preorder)
        assert placed is not None
        assert len(placed) == len(part.buffers)
        offsets[part.buffers] = placed
    check = check_placement(b.lower, b.upper, b.size, offsets, None)
    assert check.valid, check.violation
    assert check.arena >= b.peak_live_load()


def test_the_least_arena_keeps_the_compiled_search_where_its_lists_fit() -> None:
    """Many buffers with few overlaps: the skyline search at a capacity, the compiled one (whose
    probes prove least arenas) without one."""
    rng = np.random.default_rng(5)
    lower = rng.integers(0, 3000, 3000)
    upper = lower + rng.integers(1, 6, 3000)
    size = rng.integers(1, 50, 3000)
    b = Buffers.from_rows(
        [(f"b{k}", int(lower[k]), int(upper[k]), int(size[k])) for k in range(3000)]
    )
    assert engine_module.uses_skyline(b.lower, b.upper)
    assert not engine_module.uses_skyline(b.lower, b.upper, least=True)


def test_the_first_guess_is_never_worse_than_the_greedy_first_fit() -> None:
    rng = np.random.default_rng(6)
    b = positive(random_buffers(rng, 2500, horizon=300, big=1000))
    engine = PartSearch(b.lower, b.upper, b.size, skyline=True)
    guess = first_guess(engine, b.lower, b.upper, b.size, None, None)
    assert guess is not None
    check = check_placement(b.lower, b.upper, b.size, guess, None)
    assert check.valid, check.violation
    greedy = best_greedy(b.lower, b.upper, b.size)
    assert check.arena <= int((greedy + b.size).max())


def nested(n: int) -> Buffers:
    """Training-like lifetimes: buffer k lives from step k to step 2n - k (all nested)."""
    return Buffers.from_rows([(f"b{k}", k, 2 * n - k, 1 + (k * 7) % 13) for k in range(n)])


def test_the_first_fit_goes_first_where_a_descent_costs_more() -> None:
    """Without the list of overlaps the first fit scans n^2 / 2 pairs, a descent refreshes the
    section incidences: nested lifetimes (n^2 incidences) put the first fit first, short-lived
    buffers (a few incidences each) the descent; with the list the descent is always first."""
    b = nested(400)
    assert not descent_first(b.lower, b.upper, None)
    assert descent_first(b.lower, b.upper, overlaps(b.lower, b.upper))
    rng = np.random.default_rng(5)
    lower = rng.integers(0, 3000, 3000)
    upper = lower + rng.integers(1, 6, 3000)
    assert descent_first(lower, upper, None)


def test_the_first_guess_with_the_first_fit_first_is_valid_and_no_worse() -> None:
    b = nested(400)
    engine = PartSearch(b.lower, b.upper, b.size, skyline=True)
    guess = first_guess(engine, b.lower, b.upper, b.size, None, None)
    assert guess is not None
    check = check_placement(b.lower, b.upper, b.size, guess, None)
    assert check.valid, check.violation
    greedy = best_greedy(b.lower, b.upper, b.size, None, None)
    assert check.arena <= int((greedy + b.size).max())


@pytest.mark.parametrize("skyline", [False, True])
def test_every_probe_of_the_least_arena_has_nodes_of_its_own(
    skyline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The core caps the nodes counted since the least arena began: each probe's budget is
    given on top of them (a budget below them would end every later probe at once)."""
    budgets: list[int] = []
    solve = PartSearch.solve

    def recording(self, part, capacity, node_budget=None, nodes=0, *args, **kwargs):
        budgets.append(node_budget - nodes)
        return solve(self, part, capacity, node_budget, nodes, *args, **kwargs)

    monkeypatch.setattr(PartSearch, "solve", recording)
    monkeypatch.setattr(engine_module, "uses_skyline", lambda *args, **kwargs: skyline)
    for seed in range(6):
        b = positive(random_buffers(np.random.default_rng(900 + seed), 60, horizon=30, big=50))
        result = place(b, None, None)
        assert result.status == "optimal"
    assert len(budgets) > 6
    assert min(budgets) > 0
