"""The allocation search and first fit of the compiled core (src/alloc.cpp) against their Python
references (tests/oracles/alloc.py), node for node and placement for placement; exact against
CP-SAT on small instances, run by run, with a lossy failed-state table; stopped by its deadline and
by Ctrl-C; and it places all eleven of MiniMalloc's challenging instances."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memplan.alloc.engine as engine_module
from memplan.alloc import Buffers, check_placement, place, read_buffers_csv
from memplan.alloc.engine import compiled_search, static_parts
from memplan.alloc.greedy import best_greedy, first_fit
from memplan.alloc.instance import Instance
from memplan.alloc.lifetimes import overlaps
from memplan.alloc.search import search
from tests.alloc.test_search import cpsat_least_arena, perfect_tiling, random_buffers
from tests.oracles import alloc as oracle
from tests.paths import MINIMALLOC, ROOT
from tests.strategies import examples


def capacity_between(b: Buffers, rng: np.random.Generator) -> int:
    peak = b.peak_live_load()
    greedy = int((best_greedy(b.lower, b.upper, b.size) + b.size).max())
    return int(rng.integers(peak, greedy + 1))


def positive(b: Buffers) -> Instance:
    keep = b.size > 0
    return Instance(b.lower[keep], b.upper[keep], b.size[keep])


def reference(b: Buffers) -> oracle.Tables:
    """The reference's own tables of the buffers of positive size."""
    keep = b.size > 0
    return oracle.Tables(b.lower[keep], b.upper[keep], b.size[keep])


# -- the core against its reference ---------------------------------------------------------------


TABLES = (
    "first",
    "end",
    "sec_start",
    "sec_buf",
    "section_total",
    "buffer_total",
    "cuts",
    "ov_start",
    "ov_buf",
    "tw_start",
    "tw_buf",
)


@pytest.mark.parametrize("seed", range(20))
def test_the_instance_tables_are_the_references(seed: int) -> None:
    """memplan/alloc/instance.py builds, with numpy, the tables the reference builds with loops:
    entry for entry, in the same order (the search's nodes depend on it), and the same
    preorders."""
    rng = np.random.default_rng(2000 + seed)
    b = random_buffers(rng, int(rng.integers(1, 30)), horizon=12, big=12)
    inst, ref = positive(b), reference(b)
    assert inst.sections == ref.sections
    for name in TABLES:
        assert getattr(inst, name).tolist() == getattr(ref, name).tolist(), name
    for heuristic, _, _ in oracle.COMPILED_RUNS:
        assert inst.preorder(heuristic).tolist() == ref.preorder(heuristic).tolist()


@pytest.mark.parametrize("seed", range(30))
def test_each_part_is_searched_as_the_reference_searches_it(seed: int) -> None:
    """The round robin of NOTE [ compiled restarts ] at a capacity between the peak and the greedy
    arena, tight first or not, under a node budget or not: the same status, the same nodes
    counted, the same offsets."""
    rng = np.random.default_rng(3000 + seed)
    b = random_buffers(rng, int(rng.integers(6, 16)), horizon=14, big=12)
    inst = positive(b)
    if inst.n == 0:
        return
    capacity = capacity_between(b, rng)
    budget = None if seed % 3 else int(rng.integers(5, 200))
    tight = bool(seed % 2)
    core = compiled_search(inst)
    memo = oracle.memo_table(2**20 if inst.n >= 64 else 2**12)
    nodes, stats = 0, {} if budget is None else {"budget": budget}
    for part, lo, hi in static_parts(inst):
        status, nodes, offsets = core.solve_part(
            part, lo, hi, capacity, -1 if budget is None else budget, nodes, tight, -1.0
        )
        expected, solution = oracle.solve_part(
            reference(b), capacity, part, lo, hi, memo, None, stats, tight
        )
        assert (status, nodes) == (expected, stats.get("nodes", 0)), (seed, part)
        if status == oracle.FOUND:
            assert solution is not None
            assert offsets[part].tolist() == solution[part].tolist()
        else:
            break


@pytest.mark.parametrize("run", range(6))
@pytest.mark.parametrize("seed", range(8))
def test_each_run_alone_is_the_references(run: int, seed: int) -> None:
    """One run of the round robin (plain with stacked twins, or residual preorders), under a node
    limit that cuts some runs short: the same status, nodes and placement."""
    rng = np.random.default_rng(4000 + seed)
    b = random_buffers(rng, int(rng.integers(8, 18)), horizon=16, big=12)
    inst = positive(b)
    if inst.n == 0:
        return
    capacity = capacity_between(b, rng)
    limit = int(rng.integers(20, 400))
    heuristic, residual, twins = oracle.COMPILED_RUNS[run]
    rank = inst.preorder(heuristic)
    part = np.argsort(rank, kind="stable")
    core = compiled_search(inst)
    status, nodes, offsets = core.run_once(part, 0, inst.sections, capacity, run, 0, limit)
    memo = oracle.memo_table(2**12)
    ctx = oracle.make_ctx(
        reference(b), capacity, rank, heuristic, residual, 2 * run, limit, memo, twins
    )
    expected = oracle.run_part(ctx, part, 0, inst.sections)
    assert (status, nodes) == (expected, min(int(ctx.count[oracle.NODES]), limit))
    if status == oracle.FOUND:
        assert offsets.tolist() == ctx.solution.tolist()


def test_a_work_stack_too_small_grows_and_keeps_the_result() -> None:
    """NOTE [ kernel work stack ]: a run that overflows its stack runs again with more room."""
    rng = np.random.default_rng(12)
    b = random_buffers(rng, 14, horizon=16, big=12)
    inst = positive(b)
    capacity = capacity_between(b, rng)
    part = np.argsort(inst.preorder("TWA"), kind="stable")
    roomy = compiled_search(inst).run_once(part, 0, inst.sections, capacity, 1, 0, 10**6)
    tight = compiled_search(inst).run_once(part, 0, inst.sections, capacity, 1, 0, 10**6, 3)
    assert roomy[0] == tight[0]
    assert roomy[2].tolist() == tight[2].tolist()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 12), st.integers(0, 40)),
        min_size=0,
        max_size=40,
    ),
    by_area=st.booleans(),
    with_graph=st.booleans(),
)
def test_first_fit_is_the_references(rows, by_area: bool, with_graph: bool) -> None:
    """With the overlap lists or by a scan of every buffer: the reference's offsets."""
    lower = np.array([r[0] for r in rows], dtype=np.int64)
    upper = lower + np.array([r[1] for r in rows], dtype=np.int64)
    size = np.array([r[2] for r in rows], dtype=np.int64)
    width = upper - lower
    keys = (
        (np.arange(len(size)), -size, -(width * size))
        if by_area
        else (
            np.arange(len(size)),
            -width,
            -size,
        )
    )
    order = np.lexsort(keys)
    graph = overlaps(lower, upper) if with_graph else None
    found = first_fit(lower, upper, size, order, None, graph)
    expected = oracle.first_fit(lower, upper, size, order, None, graph)
    assert found.tolist() == expected.tolist()


# -- exact against CP-SAT -------------------------------------------------------------------------


def verdict_matches_cpsat(b: Buffers, capacity: int) -> None:
    result = search(b.lower, b.upper, b.size, capacity, time_limit=60)
    expected = cpsat_least_arena(b, capacity)
    if expected is None:
        assert result.status == "infeasible"
    else:
        assert result.status == "placed", result
        assert result.offsets is not None
        check = check_placement(b.lower, b.upper, b.size, result.offsets, capacity)
        assert check.valid, check.violation


@pytest.mark.parametrize("seed", range(40))
def test_feasibility_at_a_capacity_matches_cpsat(seed: int) -> None:
    rng = np.random.default_rng(7000 + seed)
    b = random_buffers(rng, int(rng.integers(5, 14)), horizon=12, big=12)
    verdict_matches_cpsat(b, capacity_between(b, rng))


@pytest.mark.parametrize("run", range(6))
@pytest.mark.parametrize("seed", range(12))
def test_each_run_of_the_round_robin_alone_is_exact(run: int, seed: int) -> None:
    """Hatless pruning, stacked twins and residual preorders are sound in every combination of
    the round robin (NOTE [ compiled restarts ]): a run without a node limit proves or places."""
    rng = np.random.default_rng(8000 + seed)
    b = random_buffers(rng, int(rng.integers(6, 14)), horizon=14, big=12)
    inst = positive(b)
    if inst.n == 0:
        return
    capacity = capacity_between(b, rng)
    part = np.argsort(inst.preorder(oracle.COMPILED_RUNS[run][0]), kind="stable")
    status, _, offsets = compiled_search(inst).run_once(
        part, 0, inst.sections, capacity, run, 0, 10**9
    )
    expected = cpsat_least_arena(b, capacity)
    if expected is None:
        assert status == oracle.NOT_FOUND
    else:
        assert status == oracle.FOUND
        keep = b.size > 0
        placed = np.zeros(len(b), dtype=np.int64)
        placed[keep] = offsets
        assert check_placement(b.lower, b.upper, b.size, placed, capacity).valid


@pytest.mark.parametrize("seed", range(12))
def test_a_four_slot_memo_keeps_the_verdict(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ compiled failed-state memo ]: a table that forgets almost everything costs nodes,
    never the answer."""
    monkeypatch.setattr(engine_module, "compiled_search", lambda inst: compiled_search(inst, 4))
    rng = np.random.default_rng(9000 + seed)
    b = random_buffers(rng, int(rng.integers(8, 14)), horizon=14, big=12)
    verdict_matches_cpsat(b, capacity_between(b, rng))


@pytest.mark.parametrize("seed", range(15))
def test_least_arena_matches_cpsat(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = random_buffers(rng, int(rng.integers(3, 11)))
    result = place(b, time_limit=30)
    assert result.status == "optimal"
    assert result.arena == cpsat_least_arena(b)


@pytest.mark.parametrize("seed", range(6))
def test_zero_waste_tilings_are_placed_at_the_peak(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = perfect_tiling(rng, capacity=64, horizon=30, cuts=60)
    result = place(b, capacity=64, time_limit=60)
    assert result.offsets is not None, result.message
    assert check_placement(b.lower, b.upper, b.size, result.offsets, 64).valid


@pytest.mark.skipif(not MINIMALLOC.is_dir(), reason="the shared MiniMalloc benchmarks are absent")
@pytest.mark.parametrize("name", list("ABCDEFGHIJK"))
def test_minimalloc_challenging_instances_at_full_capacity(name: str) -> None:
    """All eleven, each within 1 MiB (eight at zero waste): benchmarks/bench_alloc.py times them
    against MiniMalloc itself."""
    b = read_buffers_csv(MINIMALLOC / f"{name}.1048576.csv").buffers
    result = place(b, capacity=1048576, time_limit=300)
    assert result.offsets is not None, result.message
    assert check_placement(b.lower, b.upper, b.size, result.offsets, 1048576).valid


# -- stopping ---------------------------------------------------------------------------------------


def hard_instance() -> Buffers:
    """MiniMalloc's D at its own peak live load: no placement is found for a long while."""
    if MINIMALLOC.is_dir():
        return read_buffers_csv(MINIMALLOC / "D.1048576.csv").buffers
    rng = np.random.default_rng(11)
    return perfect_tiling(rng, capacity=1 << 20, horizon=400, cuts=900)


def test_the_deadline_stops_the_search() -> None:
    b = hard_instance()
    started = time.perf_counter()
    result = search(b.lower, b.upper, b.size, b.peak_live_load(), time_limit=0.3)
    if result.status == "placed":  # the stand-in instance may be easy: nothing to check then
        return
    assert result.status == "gave-up"
    assert time.perf_counter() - started < 60  # generous: the deadline is checked in the core


_INTERRUPTED = """
import sys, time
from memplan.alloc.search import search
from tests.alloc.test_core import hard_instance
b = hard_instance()
print("searching", flush=True)
started = time.perf_counter()
try:
    search(b.lower, b.upper, b.size, b.peak_live_load(), time_limit=120)
except KeyboardInterrupt:
    print(f"interrupted after {time.perf_counter() - started:.2f} s", flush=True)
    sys.exit(42)
sys.exit(0)
"""


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT")
def test_ctrl_c_stops_the_search_and_is_not_swallowed() -> None:
    """The search runs on a thread of its own; Ctrl-C reaches the waiting main thread, which stops
    it and raises KeyboardInterrupt once it has returned (the CLI maps it to exit 130). In a
    process of its own: after a CP-SAT solve, OR-Tools' own SIGINT handler stays installed."""
    child = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "searching"
    time.sleep(0.5)
    signalled = time.perf_counter()
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=120)
    if child.returncode == 0:  # the stand-in instance may be placed before the signal
        assert not MINIMALLOC.is_dir()
        return
    assert child.returncode == 42, out
    assert "interrupted after" in out
    assert time.perf_counter() - signalled < 10  # generous: the core stops within 256 nodes
