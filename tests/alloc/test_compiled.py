"""The compiled search (memplan.alloc.kernel, the ``fast`` extra: numba): exact against CP-SAT on
small instances, run by run, with a lossy failed-state table; stopped by its deadline and by
Ctrl-C; and it places all eleven of MiniMalloc's challenging instances."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("numba", reason="the compiled engine needs the fast extra (numba)")

import memplan.alloc.search as search_module  # noqa: E402
from memplan.alloc import Buffers, check_placement, place, read_buffers_csv  # noqa: E402
from memplan.alloc.greedy import best_greedy  # noqa: E402
from memplan.alloc.search import COMPILED_RUNS, search  # noqa: E402
from tests.alloc.test_search import cpsat_least_arena, perfect_tiling, random_buffers  # noqa: E402
from tests.paths import MINIMALLOC, ROOT


def capacity_between(b: Buffers, rng: np.random.Generator) -> int:
    peak = b.peak_live_load()
    greedy = int((best_greedy(b.lower, b.upper, b.size) + b.size).max())
    return int(rng.integers(peak, greedy + 1))


def verdict_matches_cpsat(b: Buffers, capacity: int) -> None:
    result = search(b.lower, b.upper, b.size, capacity, time_limit=60, engine="compiled")
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


@pytest.mark.parametrize("run", COMPILED_RUNS, ids=lambda r: f"{r[0]}-{r[1]}-{r[2]}")
@pytest.mark.parametrize("seed", range(12))
def test_each_run_of_the_round_robin_alone_is_exact(
    run: tuple[str, bool, bool], seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hatless pruning, stacked twins and residual preorders are sound in every combination of
    the round robin (NOTE [ compiled restarts ])."""
    monkeypatch.setattr(search_module, "COMPILED_RUNS", (run,))
    rng = np.random.default_rng(8000 + seed)
    b = random_buffers(rng, int(rng.integers(6, 14)), horizon=14, big=12)
    verdict_matches_cpsat(b, capacity_between(b, rng))


@pytest.mark.parametrize("seed", range(12))
def test_a_four_slot_memo_keeps_the_verdict(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ compiled failed-state memo ]: a table that forgets almost everything costs nodes,
    never the answer."""
    from memplan.alloc import compiled

    monkeypatch.setattr(search_module, "compiled_memo", lambda n: compiled.memo_table(4))
    rng = np.random.default_rng(9000 + seed)
    b = random_buffers(rng, int(rng.integers(8, 14)), horizon=14, big=12)
    verdict_matches_cpsat(b, capacity_between(b, rng))


@pytest.mark.parametrize("seed", range(15))
def test_least_arena_matches_cpsat(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = random_buffers(rng, int(rng.integers(3, 11)))
    result = place(b, time_limit=30, engine="compiled")
    assert result.status == "optimal"
    assert result.arena == cpsat_least_arena(b)


@pytest.mark.parametrize("seed", range(6))
def test_zero_waste_tilings_are_placed_at_the_peak(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = perfect_tiling(rng, capacity=64, horizon=30, cuts=60)
    result = place(b, capacity=64, time_limit=60, engine="compiled")
    assert result.offsets is not None, result.message
    assert check_placement(b.lower, b.upper, b.size, result.offsets, 64).valid


@pytest.mark.skipif(not MINIMALLOC.is_dir(), reason="the shared MiniMalloc benchmarks are absent")
@pytest.mark.parametrize("name", list("ABCDEFGHIJK"))
def test_minimalloc_challenging_instances_at_full_capacity(name: str) -> None:
    """All eleven, each within 1 MiB (eight at zero waste): benchmarks/bench_alloc.py times them
    against MiniMalloc itself."""
    b = read_buffers_csv(MINIMALLOC / f"{name}.1048576.csv").buffers
    result = place(b, capacity=1048576, time_limit=300, engine="compiled")
    assert result.offsets is not None, result.message
    assert check_placement(b.lower, b.upper, b.size, result.offsets, 1048576).valid


def hard_instance() -> Buffers:
    """MiniMalloc's D at its own peak live load: no placement is found for a long while."""
    if MINIMALLOC.is_dir():
        return read_buffers_csv(MINIMALLOC / "D.1048576.csv").buffers
    rng = np.random.default_rng(11)
    return perfect_tiling(rng, capacity=1 << 20, horizon=400, cuts=900)


def test_the_deadline_stops_the_kernel() -> None:
    b = hard_instance()
    peak = b.peak_live_load()
    started = time.perf_counter()
    result = search(b.lower, b.upper, b.size, peak, time_limit=0.3, engine="compiled")
    if result.status == "placed":  # the stand-in instance may be easy: nothing to check then
        return
    assert result.status == "gave-up"
    assert time.perf_counter() - started < 60  # generous: the deadline is checked in the kernel


_INTERRUPTED = """
import sys, time
import numpy as np
from memplan.alloc.search import search
from tests.alloc.test_compiled import hard_instance
b = hard_instance()
search(b.lower[:8], b.upper[:8], b.size[:8], 1 << 30, engine="compiled")  # load the kernel
print("searching", flush=True)
started = time.perf_counter()
try:
    search(b.lower, b.upper, b.size, b.peak_live_load(), time_limit=120, engine="compiled")
except KeyboardInterrupt:
    print(f"interrupted after {time.perf_counter() - started:.2f} s", flush=True)
    sys.exit(42)
sys.exit(0)
"""


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT")
def test_ctrl_c_stops_the_kernel_and_is_not_swallowed() -> None:
    """The kernel runs in a worker thread; Ctrl-C reaches the waiting main thread, which sets the
    kernel's stop flag and re-raises KeyboardInterrupt (issue 17 item 8: the CLI maps it to exit
    130). In a process of its own: after a CP-SAT solve, OR-Tools' own SIGINT handler stays
    installed and would end this test process instead."""
    import subprocess
    import sys

    root = ROOT
    child = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "searching"
    time.sleep(0.3)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=120)
    if child.returncode == 0:  # the stand-in instance may be placed before the signal
        assert not MINIMALLOC.is_dir()
        return
    assert child.returncode == 42, out
    assert "interrupted after" in out
