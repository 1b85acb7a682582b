"""An independent checker of placements: it imports nothing from the solver.

A placement is valid when every offset is a non-negative integer, every buffer ends within the
capacity (when one is given), and no two buffers of positive size whose half-open lifetimes
``[lower, upper)`` intersect share an address of ``[offset, offset + size)``. It shares no code
with the solver (memplan/alloc/search.py, greedy.py, src/alloc.cpp).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Check:
    """The verdict: ``valid``, the arena (highest ``offset + size``) and the first violation."""

    valid: bool
    arena: int
    violation: str | None = None
    pair: tuple[int, int] | None = None
    """Row indices of the first overlapping pair (rows in input order), when that is the fault."""
    beyond: int | None = None
    """Row index of the first buffer beyond the capacity, when that is the fault."""


def check_placement(
    lower: Sequence[int] | np.ndarray,
    upper: Sequence[int] | np.ndarray,
    size: Sequence[int] | np.ndarray,
    offset: Sequence[int] | np.ndarray,
    capacity: int | None = None,
    ids: Sequence[str] | None = None,
) -> Check:
    """Check a placement; the first violation in row order is reported (a buffer beyond the
    capacity, or the overlapping pair whose first row is earliest, then whose second is).

    Two buffers clash when they overlap both in time and in addresses. Listed by start time, the
    buffers that start while ``b`` is live are a contiguous run after ``b`` (and every pair that
    overlaps in time is such a run of one of its two buffers); the same holds with addresses in
    place of times. The candidates are taken along the axis with fewer of them and checked on
    the other, in vectorized blocks: O(n log n + min(Q_time, Q_address)) for Q pairs that overlap
    along each axis, exact for any integers (Python integers when a top could pass 2^62).
    """
    exact = _exact(size, offset)
    dtype = object if exact else np.int64
    lo = np.asarray(lower, dtype=np.int64)
    up = np.asarray(upper, dtype=np.int64)
    sz = np.asarray(size, dtype=np.int64)
    off = np.asarray(offset, dtype=dtype)
    n = len(sz)
    names = list(ids) if ids is not None else [str(k) for k in range(n)]
    top = off + np.asarray(size, dtype=dtype)
    arena = int(top.max()) if n else 0
    negative = np.flatnonzero(off < 0)
    if negative.size:
        k = int(negative[0])
        return Check(False, arena, f"buffer {names[k]!r}: negative offset {int(off[k])}", beyond=k)
    bad_cap = n
    if capacity is not None:
        over = np.flatnonzero(top > capacity)
        if over.size:
            bad_cap = int(over[0])
    pair = _first_clash(lo, up, off, top, sz > 0)
    if pair is not None and pair[0] < bad_cap:
        i, j = pair
        t0, t1 = max(int(lo[i]), int(lo[j])), min(int(up[i]), int(up[j]))
        a0, a1 = max(int(off[i]), int(off[j])), min(int(top[i]), int(top[j]))
        return Check(
            False,
            arena,
            f"buffers {names[i]!r} and {names[j]!r} overlap: both live in [{t0}, {t1}) "
            f"and both use addresses [{a0}, {a1})",
            pair=(i, j),
        )
    if bad_cap < n:
        k = bad_cap
        return Check(
            False,
            arena,
            f"buffer {names[k]!r} ends at {int(top[k])} (offset {int(off[k])} + size "
            f"{int(sz[k])}), beyond the capacity {capacity}",
            beyond=k,
        )
    return Check(True, arena)


def _exact(size: Sequence[int] | np.ndarray, offset: Sequence[int] | np.ndarray) -> bool:
    """Whether ``offset + size`` could pass 2^62 (or the values do not fit int64)."""
    try:
        values = [np.asarray(size, dtype=np.int64), np.asarray(offset, dtype=np.int64)]
    except OverflowError:
        return True
    if any(len(v) == 0 for v in values):
        return False
    return int(values[0].max()) + int(values[1].max()) >= 2**62 or int(values[1].min()) < -(2**62)


_BLOCK = 1 << 22
"""Candidate pairs checked per vectorized block."""


def _first_clash(
    lo: np.ndarray, up: np.ndarray, off: np.ndarray, top: np.ndarray, keep: np.ndarray
) -> tuple[int, int] | None:
    """The clashing pair (i < j by row) with the least i, then the least j, or None."""
    rows = np.flatnonzero(keep)
    if rows.size < 2:
        return None
    t0, t1, a0, a1 = lo[rows], up[rows], off[rows], top[rows]
    # Take the candidates along the axis with fewer of them; check the other axis. (Few along
    # the addresses, at most one per buffer, is as good as it gets: the other is not counted.)
    by_address = _candidates(a0, a1)
    by_time = by_address if int(by_address[2].sum()) <= len(rows) else _candidates(t0, t1)
    if by_time is not by_address and int(by_time[2].sum()) <= int(by_address[2].sum()):
        order, pos, count = by_time
        s0, s1 = a0, a1
    else:
        order, pos, count = by_address
        s0, s1 = t0, t1
    best: tuple[int, int] | None = None
    cum = np.cumsum(count)
    first = 0
    while first < len(count):
        last = int(np.searchsorted(cum, (cum[first - 1] if first else 0) + _BLOCK, "right"))
        last = max(last, first + 1)
        block = np.arange(first, last)
        reps = count[block]
        left = np.repeat(block, reps)
        step = np.arange(len(left)) - np.repeat(np.cumsum(reps) - reps, reps)
        right = order[np.repeat(pos[block], reps) + 1 + step]
        clash = (s0[right] < s1[left]) & (s0[left] < s1[right])
        hit = np.flatnonzero(clash)
        if hit.size:
            i = rows[np.minimum(left[hit], right[hit])]
            j = rows[np.maximum(left[hit], right[hit])]
            k = int(np.lexsort((j, i))[0])
            found = (int(i[k]), int(j[k]))
            best = found if best is None else min(best, found)
        first = last
    return best


def _candidates(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals by start, the position of each in that order, and how many start after it (later
    in the order) before it ends: the intervals it overlaps that it is listed before.
    """
    order = np.argsort(start, kind="stable")
    pos = np.empty(len(start), dtype=np.int64)
    pos[order] = np.arange(len(start))
    by_end = np.argsort(end, kind="stable")  # sorted keys: a much faster searchsorted
    reach = np.empty(len(end), dtype=np.int64)
    reach[by_end] = np.searchsorted(start[order], end[by_end], side="left")
    return order, pos, np.maximum(reach - pos - 1, 0)
