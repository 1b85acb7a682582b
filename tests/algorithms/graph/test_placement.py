"""The graph family's placements on memplan.alloc's engine: the two baselines offset for offset as
their step-by-step references (tests/oracles/graph_placement.py), and the least arena of
``olla-address`` exact against CP-SAT on small lifetimes."""

from __future__ import annotations

import numpy as np
import pytest

from memplan.algorithms.graph import placement
from memplan.alloc import Buffers, check_placement
from tests.alloc.test_search import cpsat_least_arena
from tests.oracles import graph_placement as reference


def random_lifetimes(
    rng: np.random.Generator, n: int, steps: int = 12, big: int = 3000
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` tensors: first step, last step (both included) and a size (0 to ``big`` bytes, not
    multiples of 512)."""
    start = rng.integers(0, steps, n)
    end = np.minimum(start + rng.integers(0, steps // 2, n), steps - 1)
    return rng.integers(0, big, n), start, end


def is_valid(sizes: np.ndarray, start: np.ndarray, end: np.ndarray, offsets: np.ndarray) -> bool:
    return check_placement(start, end + 1, sizes, offsets, None).valid


@pytest.mark.parametrize("seed", range(40))
def test_framework_first_fit_is_the_online_allocator(seed: int) -> None:
    """NOTE [ online first fit ]: memplan.alloc's first fit in execution order gives the offsets
    of the caching allocator run step by step (512-byte rounding, coalesced free blocks)."""
    rng = np.random.default_rng(seed)
    sizes, start, end = random_lifetimes(rng, int(rng.integers(1, 40)))
    found = placement.first_fit(sizes, start, end)
    assert found.tolist() == reference.online_first_fit(sizes, start, end).tolist()
    assert is_valid(sizes, start, end, found)


@pytest.mark.parametrize("seed", range(40))
def test_greedy_by_size_is_tflites_best_fit(seed: int) -> None:
    """Best fit by decreasing size (or another order), around tensors placed beforehand."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 40))
    sizes, start, end = random_lifetimes(rng, n, big=rng.choice([8, 3000]))
    fixed: dict[int, int] = {}
    if seed % 2:
        # a pyramid placed beforehand, as olla-address does (section 4.5)
        skip = np.zeros(n, dtype=bool)
        fixed = placement.preplace(sizes, start, end, 0, skip)
    key = None if seed % 3 else np.argsort(-(sizes * (end - start + 1)), kind="stable")
    found = placement.greedy_by_size(sizes, start, end, fixed=fixed, key=key)
    expected = reference.greedy_by_size(sizes, start, end, fixed=fixed, key=key)
    assert found.tolist() == expected.tolist()
    assert is_valid(sizes, start, end, found)
    assert all(found[i] == off for i, off in fixed.items())


@pytest.mark.parametrize("seed", range(12))
def test_least_arena_is_cpsats(seed: int) -> None:
    """``olla-address``'s placement (memplan.alloc, then CP-SAT) reaches the least arena over
    every placement, with the persistent tensors at the bottom (NOTE [ persistent tensors at the
    bottom ]), and says it is optimal."""
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(3, 11))
    sizes, start, end = random_lifetimes(rng, n, steps=8, big=9)
    persistent = np.zeros(n, dtype=bool)
    persistent[: seed % 3] = True
    start[persistent], end[persistent] = 0, 7
    peak = max(int(sizes[(start <= t) & (t <= end)].sum()) for t in range(8))
    found = placement.solve_placement(sizes, start, end, persistent, peak, time_limit=20)
    assert is_valid(sizes, start, end, found.offsets)
    assert found.arena == placement.arena_of(sizes, found.offsets)
    rows = [(str(i), int(start[i]), int(end[i]) + 1, int(sizes[i])) for i in range(n)]
    least = cpsat_least_arena(Buffers.from_rows(rows))
    assert found.arena == least
    assert found.status == "optimal" and found.bound == least
    heuristics = (
        placement.first_fit(sizes, start, end),
        placement.greedy_by_size(sizes, start, end),
    )
    assert all(found.arena <= placement.arena_of(sizes, h) for h in heuristics)
