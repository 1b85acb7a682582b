"""The compiled rotor grid DP (rotor_kernel.py through memplan.native) against the numpy path.

The kernel must give the plans of rotor_grid.py: the same values, bit for bit, wherever the top
problem reads them (NOTE [ rotor kernel layout ]), the same sequences, the same budgets asked of
every sub-chain, and through :func:`solve_rotor` the same ChainPlan, whether the kernel runs in
this process, is turned off (``MEMPLAN_NATIVE=0``, in-process and in a fresh process) or cannot
round or bound in int64 (sizes near 2**60). The golden fixtures (tests/golden/test_golden.py) run through
the kernel wherever it is available.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memplan import native
from memplan.algorithms.chain import Chain, chain_min_memory, rotor, rotor_native, solve_rotor
from memplan.algorithms.chain import rotor_layout as layout
from memplan.algorithms.chain.least_memory import least_memory_bounds
from memplan.algorithms.chain.rotor import slot_sizes
from memplan.algorithms.chain.rotor_grid import (
    grid_backtrack,
    grid_table,
    reachable_ranges,
    sub_chain_bounds,
)
from memplan.profile.synthetic import random_chain
from tests.paths import ROOT
from tests.strategies import chains

pytestmark = pytest.mark.skipif(
    not rotor_native.available(),
    reason=f"the compiled rotor kernel is unavailable: {rotor_native.load_error()}",
)


def same(a: float, b: float) -> bool:
    """Bit-identical floats (infinities included)."""
    return a == b or (math.isinf(a) and math.isinf(b) and (a > 0) == (b > 0))


def numpy_grid(chain: Chain, budget: int, slots: int, extra: int, dtype: type):
    """rotor.py's numpy path: the table, the rounded sizes and the budget in slots."""
    capacity, r = slot_sizes(chain, budget, slots)
    sizes = [r[k] for k in ("x", "s", "g", "fo", "bo")]
    table = grid_table(
        chain, capacity + extra, *sizes, dtype=dtype, asked_from=capacity if extra else None
    )
    return table, sizes, capacity


def check_against_numpy(chain: Chain, budget: int, slots: int, extra: int, dtype: type) -> None:
    L = chain.length
    table, sizes, capacity = numpy_grid(chain, budget, slots, extra, dtype)
    compiled = rotor_native.solve_grid(chain, budget, slots, extra=extra, dtype=dtype)
    assert compiled.capacity == capacity and compiled.status in (layout.OK, layout.INFEASIBLE)
    where = f"{L} stages, budget {budget}, {slots} slots, extra {extra}, {dtype.__name__}"
    # The budgets asked of each sub-chain: those of reachable_ranges (the numpy propagation).
    x, s = sizes[0], sizes[1]
    lo, hi = sub_chain_bounds(L, *sizes)
    first, last = reachable_ranges(L, capacity + extra, x, s, lo, hi, capacity)
    for a in range(L):
        for b in range(a, L):
            asked = compiled.asked(a, b)
            if asked:
                assert (asked[0], asked[-1]) == (first[a, b], last[a, b]), (where, a, b)
            else:
                assert first[a, b] > last[a, b], (where, a, b)
            # Every value read at an asked budget is the numpy path's, bit for bit.
            row = table.row(a, b)
            for m in asked:
                assert same(compiled.value(a, b, m), float(row[m])), (where, a, b, m)
    top = table.row(0, L - 1)[capacity:].tolist()
    found = compiled.top_values()
    assert len(found) == extra + 1
    assert all(same(u, v) for u, v in zip(found, top, strict=True)), where
    for c in range(capacity, capacity + extra + 1):
        plan = compiled.backtrack(c)
        if math.isfinite(top[c - capacity]):
            assert plan == grid_backtrack(chain, table, *sizes, c), (where, c)
        else:
            assert plan is None, (where, c)


def budgets_of(chain: Chain, fractions: list[float]) -> list[int]:
    low, high = chain_min_memory(chain), chain.store_all_peak()
    return [low + int((high - low) * f) - int(chain.x[0]) for f in fractions]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prof=chains(max_size=40, max_extra=30),
    fraction=st.floats(0.0, 1.2),
    slots=st.integers(2, 200),
    extra=st.sampled_from([0, 0, 3, 17]),
    single=st.booleans(),
)
def test_small_chains_match_numpy(prof, fraction, slots, extra, single):
    chain = Chain.from_profile(prof)
    budget = max(0, budgets_of(chain, [fraction])[0])
    check_against_numpy(chain, budget, slots, extra, np.float32 if single else np.float64)


@settings(max_examples=80, deadline=None)
@given(prof=chains(max_size=60, max_extra=40), fraction=st.floats(-0.2, 1.2))
def test_chain_bounds_match_python(prof, fraction):
    """The kernel's least-memory bounds and store-all peak (``--slots N`` computes them in the
    same call) are least_memory_bounds' and Chain.store_all_peak's, and the grid is skipped
    exactly when the memory is below the lower bound or store-all fits."""
    chain = Chain.from_profile(prof)
    lower, upper = least_memory_bounds(chain)
    store_all = chain.store_all_peak()
    memory = max(0, lower + int((store_all - lower) * fraction))
    fused = rotor_native.solve_grid(chain, memory - int(chain.x[0]), 50, memory=memory)
    assert fused.bounds == (lower, upper, store_all)
    skipped = memory < lower or store_all <= memory
    assert (fused.status == layout.SKIPPED) == skipped


@pytest.mark.parametrize("length", [2, 5, 10, 20, 31])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_chains_match_numpy(length, seed):
    """Up to 31 stages at 500 slots, where the numpy path switches to its reachable budgets
    (rotor_grid._REACH_CELLS), in both precisions and with tightening's extra budgets."""
    chain = Chain.from_profile(random_chain(length, seed=seed, max_size=1000))
    for budget in budgets_of(chain, [0.05, 0.3, 0.6, 0.9]):
        for slots, extra, dtype in (
            (500, 0, np.float64),
            (500, 10, np.float32),
            (97, 2, np.float64),
        ):
            check_against_numpy(chain, budget, slots, extra, dtype)


@pytest.mark.parametrize("seed", range(4))
def test_every_window_budget_matches_the_numpy_small_mode(seed):
    """With ``reach=False`` the kernel fills whole windows, as numpy does below _REACH_CELLS:
    then every cell of every window is the numpy path's, whether anybody asks for it or not."""
    chain = Chain.from_profile(random_chain(3 + 2 * seed, seed=seed, max_size=300))
    L = chain.length
    for budget in budgets_of(chain, [0.2, 0.7]):
        table, sizes, capacity = numpy_grid(chain, budget, 150, 0, np.float64)
        compiled = rotor_native.solve_grid(chain, budget, 150, reach=False)
        lo, hi = sub_chain_bounds(L, *sizes)
        for a in range(L):
            for b in range(a, L):
                row = table.row(a, b)
                for m in range(capacity + 1):
                    assert same(compiled.value(a, b, m), float(row[m])), (a, b, m)
        assert compiled.sequence == grid_backtrack(chain, table, *sizes, capacity)


def plan_digest(chain: Chain, memory: int, slots: int | str) -> list:
    plan = solve_rotor(chain, memory, slots=slots)
    return [
        plan.status,
        plan.claimed_makespan,
        plan.min_memory,
        plan.slots,
        plan.message,
        plan.sequence,
    ]


def cases() -> list[tuple[int, int, int]]:
    """(length, seed, memory) from below the least memory to above store-all."""
    found = []
    for length, seed in ((1, 0), (3, 1), (7, 2), (12, 3), (25, 4), (60, 5)):
        chain = Chain.from_profile(random_chain(length, seed=seed, max_size=1000))
        low, high = chain_min_memory(chain), chain.store_all_peak()
        for f in (-0.1, 0.0, 0.15, 0.5, 0.85, 1.0):
            found.append((length, seed, max(0, low + int((high - low) * f))))
    return found


def digests(slots_list: tuple) -> list:
    out = []
    for length, seed, memory in cases():
        chain = Chain.from_profile(random_chain(length, seed=seed, max_size=1000))
        for slots in slots_list:
            out.append(plan_digest(chain, memory, slots))
    return out


def test_solve_rotor_is_the_same_with_the_kernel_turned_off(monkeypatch):
    slots = (500, 64, 7)
    with_kernel = digests(slots)
    monkeypatch.setenv("MEMPLAN_NATIVE", "0")
    assert not rotor_native.available()
    assert digests(slots) == with_kernel


def test_tightened_grid_is_the_same_with_the_kernel_turned_off(monkeypatch):
    """``--slots auto`` past the byte-level DP's work limit: the grid with its extra budgets,
    traced from the top, replayed in bytes."""
    monkeypatch.setattr(rotor, "EXACT_WORK", 10)
    with_kernel = digests(("auto",))
    monkeypatch.setenv("MEMPLAN_NATIVE", "0")
    assert digests(("auto",)) == with_kernel


OFF_SCRIPT = """
import json, sys
from memplan.algorithms.chain import rotor_native
from tests.algorithms.chain.test_rotor_native import digests
print(json.dumps({"available": rotor_native.available(),
                  "kernel_imported": "memplan.algorithms.chain.rotor_cfuncs" in sys.modules,
                  "numba_imported": "numba" in sys.modules,
                  "digests": digests((500, 64))}))
"""


def run_fresh(env_extra: dict[str, str]) -> dict:
    env = {**os.environ, **env_extra}
    root = str(ROOT)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", OFF_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_memplan_native_0_in_a_fresh_process_gives_the_same_plans():
    expected = json.loads(json.dumps(digests((500, 64))))  # tuples as JSON lists
    off = run_fresh({"MEMPLAN_NATIVE": "0"})
    assert off["available"] is False and off["kernel_imported"] is False
    assert off["digests"] == expected


def test_a_fresh_process_loads_the_cached_kernel_without_numba():
    """The object built in this process (or by ``make``) is loaded, not rebuilt, elsewhere."""
    stored = native.cache_root() / "native"
    if not any(stored.glob(f"{rotor_native.KERNEL}-*/manifest.json")):
        pytest.skip(f"the object cache {stored} is not writable here")
    on = run_fresh({})
    assert on["available"] is True
    assert on["numba_imported"] is False and on["kernel_imported"] is False
    assert on["digests"] == json.loads(json.dumps(digests((500, 64))))


def huge_chain(size: int, length: int = 4) -> Chain:
    """Sizes about ``size`` bytes (built directly: profiles stop at 2**50 bytes a size)."""
    k = np.arange(length, dtype=np.int64)
    return Chain(
        x=np.concatenate(([size // 2], size + 3 * k)).astype(np.int64),
        s=(size + 5 * k + 1).astype(np.int64),
        g=np.concatenate(([0], size + 3 * k)).astype(np.int64),
        fo=k.copy(),
        bo=2 * k,
        ft=1.0 + k,
        bt=2.0 + k % 3,
    )


@pytest.mark.parametrize(("size", "slots"), [(2**50, 20000), (2**60, 500)])
def test_sizes_beyond_int64_fall_back_to_python_ints(size, slots, monkeypatch):
    """2**50 bytes (the largest a profile takes) times 20000 slots overflows int64: the kernel
    rounds in Python ints instead; 2**60-byte sizes also add up beyond INT64_SAFE: the bounds
    are computed in Python ints. Either way the plans are the numpy path's."""
    chain = huge_chain(size)
    low, high = chain_min_memory(chain), chain.store_all_peak()
    memories = [low - 1, low, (low + high) // 2, high - 1, high]
    with_kernel = [plan_digest(chain, m, slots) for m in memories]
    assert [d[0] for d in with_kernel] == [
        "infeasible",
        "feasible",
        "feasible",
        "feasible",
        "optimal",
    ]
    monkeypatch.setenv("MEMPLAN_NATIVE", "0")
    assert [plan_digest(chain, m, slots) for m in memories] == with_kernel


def test_layout_matches_the_kernel():
    """The Python layout (rotor_layout.Layout) and the kernel's own offsets agree."""
    kernel = pytest.importorskip("memplan.algorithms.chain.rotor_kernel")
    for length, width in ((1, 2), (7, 65), (30, 501)):
        lay = layout.Layout(length, width)
        raw, rounded, pairs, stack, ops, end = kernel._sections(length)
        assert (raw, rounded, pairs, stack, ops, end) == (
            lay.raw,
            lay.rounded,
            lay.pairs,
            lay.stack,
            lay.ops,
            lay.ints,
        )
        t = np.zeros(6, dtype=np.int64)
        kernel._table_offsets(t, length, width)
        assert t.tolist() == [lay.t_tp, lay.t_found, lay.t_fprefix, lay.t_fa, lay.t_rows, lay.t_top]


def test_prebuild_command_reports_ready():
    """The Makefile's ``python -m memplan.native`` builds (or loads) every native kernel, with
    nothing on stderr (no runpy warning)."""
    done = subprocess.run(
        [sys.executable, "-m", "memplan.native"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "rotor's grid DP: native kernel ready" in done.stdout
    assert "alloc's search: native kernel ready" in done.stdout


NUMBA_AFTER = """
from memplan.algorithms.chain import rotor_native
assert rotor_native.available()
import numba, numpy as np

@numba.njit
def allocates_and_raises(n):
    values = np.zeros(n)
    if n > 10:
        raise ValueError("too long")
    return values.sum() + n

assert allocates_and_raises(3) == 3.0
try:
    allocates_and_raises(11)
except ValueError:
    print("ok")
"""


def test_numba_still_works_after_the_kernel_loaded_without_it():
    """Regression: memplan.native bound Python's C API (Py_DecRef, ...) to its trap when it
    loaded a kernel before any LLVM engine existed, and every numba function compiled later in
    the same process (memplan alloc's kernel) then aborted the process."""
    pytest.importorskip("numba")
    done = subprocess.run(
        [sys.executable, "-c", NUMBA_AFTER], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_stop_word_stops_the_kernel():
    """Ctrl-C's path into the kernel (NOTE [ interrupts ]): with ``H_STOP`` set it returns
    STOPPED before filling its table, and fills it again once cleared."""
    chain = Chain.from_profile(random_chain(12, seed=2, max_size=1000))
    budget = budgets_of(chain, [0.5])[0]
    compiled = rotor_native.solve_grid(chain, budget, 300)
    entry = rotor_native.load()["grid_f64"]
    ints = compiled._buffers[0].array
    ints[layout.H_STOP] = 1
    assert rotor_native._call(entry, *compiled._buffers) == layout.STOPPED
    ints[layout.H_STOP] = 0
    assert rotor_native._call(entry, *compiled._buffers) == layout.OK


INTERRUPT_SCRIPT = """
import os, signal, threading, time
from memplan.algorithms.chain import Chain, rotor_native
from memplan.algorithms.chain.rotor_layout import H_STOP, STOPPED
from memplan.profile.synthetic import random_chain

seen = []
running = threading.Event()

def kernel(entry, ints, floats, bits, table):  # stands for a long kernel call
    seen.append(threading.current_thread() is not threading.main_thread())
    running.set()
    while ints.array[H_STOP] == 0:
        time.sleep(0.001)
    seen.append("stopped")
    return STOPPED

def interrupt():
    running.wait()
    os.kill(os.getpid(), signal.SIGINT)

rotor_native.load()
rotor_native._call = kernel
rotor_native.STOPPABLE_CELLS = 0  # every grid in a worker thread
chain = Chain.from_profile(random_chain(6, seed=1, max_size=1000))
threading.Thread(target=interrupt, daemon=True).start()
try:
    rotor_native.solve_grid(chain, chain.store_all_peak() // 2, 100)
except KeyboardInterrupt:
    print("interrupted", *seen)
"""


def test_ctrl_c_reaches_a_long_kernel_call():
    """A grid in a worker thread (long ones): SIGINT in the main thread sets the stop word, the
    kernel returns, the KeyboardInterrupt goes on (a stand-in kernel waits for the word)."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT_SCRIPT], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted True stopped", done.stderr
