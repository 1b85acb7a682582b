"""rotor's compiled tables (memplan._core, src/rotor_*.cpp) against their Python references
(tests/oracles/rotor.py), value for value and plan for plan.

* the slot grid restricted to the asked budgets: the same budgets asked of every sub-chain, the
  same values, bit for bit, wherever the top problem reads them, the same plans (NOTE [ rotor grid
  layout ] in src/rotor_grid.cpp), in both precisions and with tightening's extra budgets;
* the dense table of pofo and join: every value and every choice;
* the DP in bytes: the same plan, and the same verdict on its work limit;
* the chain's least-memory bounds and store-all peak, computed with ``--slots N``;
* Ctrl-C stops a long table within a second (NOTE [ stopping a kernel ] in src/stop.hpp).

The golden fixtures (tests/golden/test_golden.py) pin the plans of the bundled profiles.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memplan.algorithms.chain import ChainInstance, chain_min_memory, plan_rotor, rotor
from memplan.algorithms.chain.least_memory import least_memory_bounds
from memplan.algorithms.chain.rotor import slot_sizes
from memplan.core import kernels
from memplan.profile.synthetic import random_chain
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
from tests.strategies import chains, examples


def same(a: float, b: float) -> bool:
    """Bit-identical floats (infinities included)."""
    return a == b or (math.isinf(a) and math.isinf(b) and (a > 0) == (b > 0))


def arrays(chain: ChainInstance, sizes=None) -> tuple[np.ndarray, ...]:
    return rotor._chain_arrays(chain, sizes)


def sequence(codes: np.ndarray | None, length: int):
    return None if codes is None else rotor._sequence(codes, length)


def reference_grid(chain: ChainInstance, budget: int, slots: int, extra: int, dtype: type):
    capacity, r = slot_sizes(chain, budget, slots)
    sizes = [r[k] for k in ("x", "s", "g", "fo", "bo")]
    table = grid_table(
        chain, capacity + extra, *sizes, dtype=dtype, asked_from=capacity if extra else None
    )
    return table, sizes, capacity


def check_grid(chain: ChainInstance, budget: int, slots: int, extra: int, dtype: type) -> None:
    L = chain.length
    table, sizes, capacity = reference_grid(chain, budget, slots, extra, dtype)
    grid = kernels.rotor_grid(
        *arrays(chain), budget, slots, extra=extra, single=dtype is np.float32, trace=False
    )
    assert grid.capacity == capacity and grid.status == kernels.ROTOR_OK
    where = f"{L} stages, budget {budget}, {slots} slots, extra {extra}, {dtype.__name__}"
    x, s = sizes[0], sizes[1]
    lo, hi = sub_chain_bounds(L, *sizes)
    first, last = reachable_ranges(L, capacity + extra, x, s, lo, hi, capacity)
    for a in range(L):
        for b in range(a, L):
            asked = grid.asked(a, b)
            if asked:
                assert (asked[0], asked[-1]) == (first[a, b], last[a, b]), (where, a, b)
            else:
                assert first[a, b] > last[a, b], (where, a, b)
            row = table.row(a, b)
            for m in asked:
                assert same(grid.value(a, b, m), float(row[m])), (where, a, b, m)
    top = table.row(0, L - 1)[capacity:].tolist()
    found = grid.top_values()
    assert len(found) == extra + 1
    assert all(same(u, v) for u, v in zip(found, top, strict=True)), where
    for c in range(capacity, capacity + extra + 1):
        plan = sequence(grid.trace(c), L)
        if math.isfinite(top[c - capacity]):
            assert plan == grid_backtrack(chain, table, *sizes, c), (where, c)
        else:
            assert plan is None, (where, c)


def budgets_of(chain: ChainInstance, fractions: list[float]) -> list[int]:
    low, high = chain_min_memory(chain), chain.store_all_peak()
    return [low + int((high - low) * f) - int(chain.x[0]) for f in fractions]


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prof=chains(max_size=40, max_extra=30),
    fraction=st.floats(0.0, 1.2),
    slots=st.integers(2, 200),
    extra=st.sampled_from([0, 0, 3, 17]),
    single=st.booleans(),
)
def test_small_grids_match_the_reference(prof, fraction, slots, extra, single):
    chain = ChainInstance.from_profile(prof)
    budget = max(0, budgets_of(chain, [fraction])[0])
    check_grid(chain, budget, slots, extra, np.float32 if single else np.float64)


@pytest.mark.parametrize("length", [2, 5, 10, 20, 31])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_grids_match_the_reference(length, seed):
    """Up to 31 stages at 500 slots, where the reference switches to its reachable budgets, in
    both precisions and with tightening's extra budgets."""
    chain = ChainInstance.from_profile(random_chain(length, seed=seed, max_size=1000))
    for budget in budgets_of(chain, [0.05, 0.3, 0.6, 0.9]):
        for slots, extra, dtype in (
            (500, 0, np.float64),
            (500, 10, np.float32),
            (97, 2, np.float64),
        ):
            check_grid(chain, budget, slots, extra, dtype)


@pytest.mark.parametrize("seed", range(4))
def test_whole_windows_match_the_reference(seed):
    """With ``reach=False`` the core fills whole windows, as the reference does on small tables:
    every cell of every window is the reference's, whether anybody asks for it or not."""
    chain = ChainInstance.from_profile(random_chain(3 + 2 * seed, seed=seed, max_size=300))
    L = chain.length
    for budget in budgets_of(chain, [0.2, 0.7]):
        table, sizes, capacity = reference_grid(chain, budget, 150, 0, np.float64)
        grid = kernels.rotor_grid(*arrays(chain), budget, 150, reach=False)
        for a in range(L):
            for b in range(a, L):
                row = table.row(a, b)
                for m in range(capacity + 1):
                    assert same(grid.value(a, b, m), float(row[m])), (a, b, m)
        assert sequence(grid.ops, L) == grid_backtrack(chain, table, *sizes, capacity)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=chains(max_size=40, max_extra=30), slots=st.integers(1, 80), fraction=st.floats(0, 1))
def test_the_dense_table_is_the_reference(prof, slots, fraction):
    """Every value and every choice, for every sub-chain and budget (what pofo and join read)."""
    chain = ChainInstance.from_profile(prof)
    budget = max(0, budgets_of(chain, [fraction])[0])
    capacity, r = slot_sizes(chain, budget, slots)
    sizes = [r[k] for k in ("x", "s", "g", "fo", "bo")]
    opt, choice = dense_table(chain, capacity, *sizes)
    table = rotor.dense_table(chain, capacity, *sizes)
    assert table.opt.shape == opt.shape and table.choice.shape == choice.shape
    assert np.array_equal(table.opt, opt)
    assert np.array_equal(table.choice, choice.astype(np.int32))


@pytest.mark.parametrize("seed", range(3))
def test_dense_plans_are_the_references(seed):
    chain = ChainInstance.from_profile(random_chain(9, seed=seed, max_size=500))
    capacity, r = slot_sizes(chain, budgets_of(chain, [0.4])[0], 60)
    sizes = [r[k] for k in ("x", "s", "g", "fo", "bo")]
    table = rotor.dense_table(chain, capacity, *sizes)
    for a in range(chain.length):
        for b in range(a, chain.length):
            for m in range(capacity + 1):
                if math.isfinite(table.opt[a, b, m]):
                    plan = table.plan(a, b, m)
                    assert sum(chain.duration(op, k) for op, k in plan) == pytest.approx(
                        table.opt[a, b, m]
                    )
                elif a < b:
                    with pytest.raises(ValueError, match="no plan"):
                        table.plan(a, b, m)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=chains(max_size=200, max_extra=100), fraction=st.floats(0.0, 1.0))
def test_the_dp_in_bytes_is_the_reference(prof, fraction):
    chain = ChainInstance.from_profile(prof)
    budget = max(0, budgets_of(chain, [fraction])[0])
    status, codes, makespan = kernels.rotor_exact(*arrays(chain), budget, math.inf)
    assert status == 0
    frontiers = exact_frontiers(chain, budget)
    top = frontiers[0][chain.length - 1]
    if top.at(budget) < 0:
        assert len(codes) == 0
        return
    plan = exact_backtrack(chain, frontiers, budget)
    assert sequence(codes, chain.length) == plan
    assert makespan == float(top.time[top.at(budget)])


@pytest.mark.parametrize("limit", [10, 1_000, 20_000, 200_000])
@pytest.mark.parametrize("length", [12, 40])
def test_the_work_limit_falls_where_the_references_does(limit, length):
    """--slots auto hands over to the grid exactly where the reference would."""
    chain = ChainInstance.from_profile(random_chain(length, seed=length, max_size=1000))
    for budget in budgets_of(chain, [0.2, 0.6]):
        try:
            exact_frontiers(chain, budget, work_limit=limit)
            expected = 0
        except WorkLimit:
            expected = 1
        assert kernels.rotor_exact(*arrays(chain), budget, float(limit))[0] == expected


@settings(max_examples=examples(80), deadline=None)
@given(prof=chains(max_size=60, max_extra=40), fraction=st.floats(-0.2, 1.2))
def test_chain_bounds_are_pythons(prof, fraction):
    """The least-memory bounds and store-all peak that ``--slots N`` computes with its grid are
    least_memory_bounds' and ChainInstance.store_all_peak's; the grid is skipped exactly when the memory
    is below the lower bound or store-all fits."""
    chain = ChainInstance.from_profile(prof)
    lower, upper = least_memory_bounds(chain)
    store_all = chain.store_all_peak()
    memory = max(0, lower + int((store_all - lower) * fraction))
    fused = kernels.rotor_grid(*arrays(chain), memory - int(chain.x[0]), 50, memory=memory)
    assert fused.bounds == (lower, upper, store_all)
    assert (fused.status == kernels.ROTOR_SKIPPED) == (memory < lower or store_all <= memory)


def huge_chain(size: int, length: int = 4) -> ChainInstance:
    """Sizes about ``size`` bytes (built directly: profiles stop at 2**50 bytes a size)."""
    k = np.arange(length, dtype=np.int64)
    return ChainInstance(
        x=np.concatenate(([size // 2], size + 3 * k)).astype(np.int64),
        s=(size + 5 * k + 1).astype(np.int64),
        g=np.concatenate(([0], size + 3 * k)).astype(np.int64),
        fo=k.copy(),
        bo=2 * k,
        ft=1.0 + k,
        bt=2.0 + k % 3,
    )


@pytest.mark.parametrize(("size", "slots"), [(2**50, 20000), (2**60, 500)])
def test_sizes_near_int64_are_rounded_exactly(size, slots):
    """2**50 bytes times 20000 slots passes int64: the core rounds in 128 bits, as slot_sizes
    does in Python ints; 2**60-byte sizes add up beyond 2**62: the bounds are Python's."""
    chain = huge_chain(size)
    low, high = chain_min_memory(chain), chain.store_all_peak()
    for memory in (low + (high - low) // 3, high - 1):
        budget = memory - int(chain.x[0])
        capacity, r = slot_sizes(chain, budget, slots)
        sizes = [r[k] for k in ("x", "s", "g", "fo", "bo")]
        table = grid_table(chain, capacity, *sizes)
        grid = kernels.rotor_grid(*arrays(chain), budget, slots)
        assert same(grid.top_values()[0], float(table.row(0, chain.length - 1)[capacity]))
        plan = plan_rotor(chain, memory, slots=slots)
        assert plan.sequence is not None and chain.peak(plan.sequence) <= memory
    statuses = [plan_rotor(chain, m, slots=slots).status for m in (low - 1, low, high)]
    assert statuses == ["infeasible", "feasible", "optimal"]


def test_wrong_arrays_are_refused():
    chain = ChainInstance.from_profile(random_chain(4, seed=0, max_size=100))
    x, s, g, fo, bo, ft, bt = arrays(chain)
    with pytest.raises(ValueError, match="L \\+ 1 entries"):
        kernels.rotor_grid(x[:-1], s, g, fo, bo, ft, bt, 100, 10)
    with pytest.raises(TypeError):
        kernels.rotor_dense(x.reshape(1, -1), s, g, fo, bo, ft, bt, 10)


INTERRUPT_SCRIPT = """
import math, os, signal, threading, time
from memplan.algorithms.chain import ChainInstance, rotor
from memplan.core import kernels
from memplan.profile.synthetic import random_chain

chain = ChainInstance.from_profile(random_chain(200, seed=1, max_size=1000))
budget = (chain.store_all_peak() - int(chain.x[0])) // 3
sent = []

def interrupt():
    time.sleep(1.0)
    sent.append(time.perf_counter())
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
started = time.perf_counter()
try:
    kernels.rotor_exact(*rotor._chain_arrays(chain), budget, math.inf)
    print("finished", time.perf_counter() - started)
except KeyboardInterrupt:
    print("interrupted", round(time.perf_counter() - sent[0], 3))
"""


def test_ctrl_c_stops_a_long_table_within_a_second():
    """The DP in bytes on 200 stages without a work limit (minutes of work): one SIGINT, and the
    core returns within a second, raising KeyboardInterrupt in the main thread."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT_SCRIPT], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    word, seconds = done.stdout.split()
    assert word == "interrupted", done.stdout
    assert float(seconds) < 1.0
