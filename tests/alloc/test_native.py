"""The native allocation kernel (memplan.alloc.kernel built by memplan.native, run through
memplan.alloc.compiled): it allocates nothing (its in-place sorts give numpy's stable order, its
work stack stays within NOTE [ kernel work stack ]'s bound and grows when it must), its greedy
is the numpy one, and once built it runs in a process without numba; a build cut short by the
deadline, or MEMPLAN_NATIVE=0, leaves the numpy search."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba", reason="the native kernel is built with the fast extra (numba)")

import memplan.alloc.search as search_module  # noqa: E402
from memplan.alloc import compiled, place  # noqa: E402
from memplan.alloc.greedy import first_fit  # noqa: E402
from memplan.alloc.instance import Instance  # noqa: E402
from memplan.alloc.kernel_layout import NODES, OVERFLOW, PEAK, stack_size  # noqa: E402
from memplan.alloc.lifetimes import overlaps  # noqa: E402
from memplan.alloc.search import COMPILED_RUNS  # noqa: E402
from tests.alloc.test_compiled import capacity_between, verdict_matches_cpsat  # noqa: E402
from tests.alloc.test_search import random_buffers  # noqa: E402
from tests.paths import ROOT


@pytest.fixture(scope="module")
def kernel() -> compiled.Kernel:
    loaded = compiled.load(None)  # built here the first time (seconds), then from the cache
    assert loaded is not None, compiled.load_error()
    return loaded


@pytest.mark.parametrize("n", [0, 1, 2, 15, 16, 17, 33, 64, 100, 257])
def test_the_in_place_sorts_give_numpys_stable_order(n: int) -> None:
    from memplan.alloc import kernel as njit_kernel  # plain @njit: called with numpy arrays

    rng = np.random.default_rng(n)
    key = rng.integers(0, max(n // 4, 1), 2 * n + 1)  # many ties
    a = rng.permutation(2 * n + 1)[:n].astype(np.int64)
    expected = a[np.argsort(key[a], kind="stable")]
    njit_kernel._sort_by_key(a, key, np.empty(n, dtype=np.int64))
    assert a.tolist() == expected.tolist()
    for nkeys in (1, 2, 3):
        keys = rng.integers(-2, 3, (nkeys, n)).astype(np.float64)
        keys[keys == 0] = rng.choice([0.0, -0.0], int((keys == 0).sum()))
        # What the residual preorders did before: one stable numpy sort per key, least first.
        order = np.arange(n)
        for li in range(nkeys - 1, -1, -1):
            order = order[np.argsort(keys[li][order], kind="mergesort")]
        positions = np.arange(n, dtype=np.int64)
        njit_kernel._sort_lex(positions, keys.ravel(), nkeys, np.empty(n, dtype=np.int64))
        assert positions.tolist() == order.tolist()


@pytest.mark.parametrize("seed", range(8))
def test_the_native_first_fit_is_the_numpy_one(kernel: compiled.Kernel, seed: int) -> None:
    rng = np.random.default_rng(600 + seed)
    b = random_buffers(rng, int(rng.integers(1, 300)), horizon=60, big=1000)
    keep = b.size > 0
    lower, upper, size = b.lower[keep], b.upper[keep], b.size[keep]
    graph = overlaps(lower, upper)
    for order in (np.lexsort((-size, -(upper - lower))), rng.permutation(len(size))):
        expected = first_fit(lower, upper, size, order, None, graph)
        offsets = np.full(len(size), -1, dtype=np.int64)
        stop = np.zeros(1, dtype=np.int64)
        done = kernel.first_fit(size, order.astype(np.int64), *graph, offsets, 2**61, stop)
        assert done == len(size)
        assert offsets.tolist() == expected.tolist()


def _deep_case(seed: int) -> tuple[Instance, int]:
    rng = np.random.default_rng(300 + seed)
    b = random_buffers(rng, int(rng.integers(10, 40)), horizon=30, big=40)
    keep = b.size > 0
    inst = Instance(b.lower[keep], b.upper[keep], b.size[keep])
    return inst, capacity_between(b, rng)


def _run_once(
    kernel: compiled.Kernel, inst: Instance, capacity: int, index: int, entries: int | None
) -> tuple[int, np.ndarray]:
    """Run ``index`` of the compiled round robin on the whole instance, with a work stack of
    ``entries`` (the default size when None): its status and counters."""
    heuristic, residual, twins = COMPILED_RUNS[index]
    rank = inst.preorder(heuristic)
    part = np.argsort(rank, kind="stable").astype(np.int64)
    scratch = compiled.Scratch.for_part(inst.n, inst.n)
    if entries is not None:
        scratch.ws = np.empty(entries, dtype=np.int64)
    ctx = compiled.make_ctx(
        inst, capacity, rank, heuristic, residual, index, 10**6, None, twins, scratch
    )
    return kernel.run_part(ctx, part, 0, inst.sections), ctx.count


@pytest.mark.parametrize("seed", range(10))
def test_the_work_stack_stays_within_its_bound_and_its_overflow_is_exact(
    kernel: compiled.Kernel, seed: int
) -> None:
    """NOTE [ kernel work stack ]: the deepest a search goes is within 5p(p+1)/2 + 5p + 1 for a
    part of p buffers; a stack of exactly that depth gives the same search, one entry less
    returns OVERFLOW."""
    inst, capacity = _deep_case(seed)
    for index in range(len(COMPILED_RUNS)):
        status, count = _run_once(kernel, inst, capacity, index, None)
        peak = int(count[PEAK])
        assert status != OVERFLOW
        assert 0 < peak <= stack_size(inst.n)
        exact_status, exact = _run_once(kernel, inst, capacity, index, peak)
        assert (exact_status, int(exact[NODES])) == (status, int(count[NODES]))
        assert _run_once(kernel, inst, capacity, index, peak - 1)[0] == OVERFLOW


@pytest.mark.parametrize("seed", range(8))
def test_a_stack_too_small_grows_and_keeps_the_verdict(
    kernel: compiled.Kernel, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    grown = []
    tiny = compiled.Scratch(np.empty(1, dtype=np.int64), np.empty(0, dtype=np.float64))
    monkeypatch.setattr(
        compiled.Scratch, "for_part", classmethod(lambda cls, buffers, n: cls(tiny.ws, tiny.fws))
    )
    real_grow = compiled.Scratch.grow
    monkeypatch.setattr(compiled.Scratch, "grow", lambda self: grown.append(1) or real_grow(self))
    rng = np.random.default_rng(8000 + seed)
    b = random_buffers(rng, int(rng.integers(6, 14)), horizon=14, big=12)
    verdict_matches_cpsat(b, capacity_between(b, rng))
    assert grown, "the stack never ran out: the test did not test the growth"


_WITHOUT_NUMBA = """
import sys
sys.modules["numba"] = None  # importing numba now fails
import numpy as np
from memplan.alloc import read_buffers_csv, place
from memplan.alloc.search import search
from tests.alloc.test_search import random_buffers
b = random_buffers(np.random.default_rng(5), 40, horizon=30, big=40)
greedy = place(b, time_limit=60, engine="compiled")
result = search(b.lower, b.upper, b.size, greedy.peak + 6, time_limit=60, engine="compiled")
print(greedy.status, result.status, result.nodes > 0, "numba" in sys.modules and sys.modules["numba"] is not None)
"""


def test_once_built_the_kernel_runs_without_numba(kernel: compiled.Kernel) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NUMBA],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    greedy_status, search_status, searched, numba_loaded = done.stdout.split()
    assert greedy_status in ("optimal", "placed")
    assert search_status in ("placed", "infeasible")
    assert searched == "True" and numba_loaded == "False"


_CUT_SHORT = """
import threading
import time
import numpy as np
from memplan import native
from memplan.alloc import compiled, place
from tests.alloc.test_search import random_buffers
gate = threading.Event()
def fake_slow_build(*args, **kwargs):  # a build that cannot finish before place() returns
    gate.wait()
    raise native.NativeUnavailable("fake build: never finished")
native._build = fake_slow_build
b = random_buffers(np.random.default_rng(3), 12, horizon=14, big=12)
started = time.perf_counter()
result = place(b, time_limit=1.0)  # the build does not finish: the numpy search runs
loaded = compiled.loaded()
gate.set()
print(result.status, loaded, time.perf_counter() - started < 30)
"""


def test_a_build_that_does_not_finish_by_the_deadline_leaves_the_numpy_search(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "MEMPLAN_CACHE_DIR": str(tmp_path / "empty-cache")}
    done = subprocess.run(
        [sys.executable, "-c", _CUT_SHORT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    status, loaded, in_time = done.stdout.split()
    assert status in ("optimal", "placed") and loaded == "False" and in_time == "True"


_TURNED_OFF = """
import numpy as np
from memplan.alloc import compiled, place
from memplan.alloc.search import search
from tests.alloc.test_search import random_buffers
b = random_buffers(np.random.default_rng(4), 12, horizon=14, big=12)
print(place(b, time_limit=30).status, compiled.available(), compiled.load(None))
try:
    search(b.lower, b.upper, b.size, 10**6, engine="compiled")
except RuntimeError as exc:
    print(exc)
"""


def test_memplan_native_0_runs_the_numpy_search() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _TURNED_OFF],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MEMPLAN_NATIVE": "0"},
    )
    assert done.returncode == 0, done.stderr
    first, why = done.stdout.splitlines()
    assert first == "optimal False None"
    assert "not available" in why and "MEMPLAN_NATIVE=0" in why


def test_the_compiled_round_robin_uses_the_native_kernel(
    kernel: compiled.Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``search(engine="compiled")`` calls the native run_part (not a Python fallback)."""
    calls = []
    real = compiled.Kernel.run_part
    monkeypatch.setattr(
        compiled.Kernel, "run_part", lambda self, *args: calls.append(1) or real(self, *args)
    )
    rng = np.random.default_rng(11)
    b = random_buffers(rng, 12, horizon=14, big=12)
    result = search_module.search(
        b.lower, b.upper, b.size, b.peak_live_load() + 3, engine="compiled"
    )
    assert result.status in ("placed", "infeasible") and calls
    assert place(b, time_limit=30, engine="compiled").status == "optimal"
