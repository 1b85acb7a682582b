"""The independent checker and the sweeps the allocator builds on, against brute force: the first
violation in row order, the peak live load, the pairs of buffers live at the same time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memplan.alloc import check_placement, peak_live_load
from memplan.alloc.lifetimes import count_overlaps, overlaps
from tests.strategies import examples

rows = st.lists(
    st.tuples(
        st.integers(0, 12),  # lower
        st.integers(1, 5),  # width
        st.integers(0, 5),  # size
        st.integers(0, 14),  # offset
    ),
    max_size=14,
)


def first_violation(lo, up, sz, off, capacity):
    """The checker's contract, pair by pair: a negative offset, else the overlapping pair with
    the least first row (then second) if it comes before the first buffer beyond the capacity,
    else that buffer."""
    n = len(sz)
    top = [off[k] + sz[k] for k in range(n)]
    for k in range(n):
        if off[k] < 0:
            return ("negative", k)
    beyond = next((k for k in range(n) if capacity is not None and top[k] > capacity), n)
    for i in range(min(n, beyond)):
        for j in range(i + 1, n):
            live = sz[i] and sz[j] and lo[j] < up[i] and lo[i] < up[j]
            if live and off[j] < top[i] and off[i] < top[j]:
                return ("pair", (i, j))
    return ("beyond", beyond) if beyond < n else ("valid", None)


@settings(max_examples=examples(400), deadline=None)
@given(rows=rows, capacity=st.one_of(st.none(), st.integers(0, 16)))
def test_check_placement_reports_the_first_violation(rows, capacity) -> None:
    lo = [r[0] for r in rows]
    up = [r[0] + r[1] for r in rows]
    sz = [r[2] for r in rows]
    off = [r[3] for r in rows]
    check = check_placement(lo, up, sz, off, capacity)
    kind, where = first_violation(lo, up, sz, off, capacity)
    assert check.valid == (kind == "valid")
    if kind == "pair":
        assert check.pair == where
    elif kind == "beyond":
        assert check.beyond == where and check.pair is None
    assert check.arena == max((o + s for o, s in zip(off, sz, strict=True)), default=0)


def test_a_clash_is_found_whichever_axis_has_fewer_candidates() -> None:
    """Stacked buffers (few address overlaps) and a long timeline (few time overlaps) both reach
    the one clashing pair."""
    n = 2000
    lower = np.zeros(n, dtype=np.int64)
    upper = np.ones(n, dtype=np.int64)
    size = np.ones(n, dtype=np.int64)
    offset = np.arange(n, dtype=np.int64)
    assert check_placement(lower, upper, size, offset).valid
    offset[1500] = 700
    assert check_placement(lower, upper, size, offset).pair == (700, 1500)
    lower, upper, offset = np.arange(n), np.arange(n) + 1, np.zeros(n, dtype=np.int64)
    assert check_placement(lower, upper, size, offset).valid
    upper[3] = 5
    assert check_placement(lower, upper, size, offset).pair == (3, 4)


@settings(max_examples=examples(300), deadline=None)
@given(rows=rows)
def test_peak_and_overlaps_match_brute_force(rows) -> None:
    lo = np.array([r[0] for r in rows], dtype=np.int64)
    up = np.array([r[0] + r[1] for r in rows], dtype=np.int64)
    sz = np.array([r[2] for r in rows], dtype=np.int64)
    n = len(lo)
    times = sorted(set(lo.tolist()))
    assert peak_live_load(lo, up, sz) == max(
        [0] + [int(sz[(lo <= t) & (t < up)].sum()) for t in times]
    )
    start, buf = overlaps(lo, up)
    pairs = 0
    for b in range(n):
        expected = [u for u in range(n) if u != b and lo[u] < up[b] and lo[b] < up[u]]
        assert sorted(buf[start[b] : start[b + 1]].tolist()) == expected
        pairs += len(expected)
    assert count_overlaps(lo, up) == pairs


@pytest.mark.parametrize("n", [0, 1])
def test_tiny_inputs(n: int) -> None:
    one = np.ones(n, dtype=np.int64)
    assert check_placement(0 * one, one, one, 0 * one).valid
    assert peak_live_load(0 * one, one, one) == n
