"""An independent checker of placements: it imports nothing from the solver.

A placement is valid when every offset is a non-negative integer, every buffer ends within the
capacity (when one is given), and no two buffers of positive size whose half-open lifetimes
``[lower, upper)`` intersect share an address of ``[offset, offset + size)``.
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

    O(n^2) time in blocks of rows, O(n) memory per row.
    """
    lo = np.asarray(lower, dtype=np.int64)
    up = np.asarray(upper, dtype=np.int64)
    sz = np.asarray(size, dtype=np.int64)
    off = np.asarray(offset, dtype=np.int64)
    n = len(sz)
    names = list(ids) if ids is not None else [str(k) for k in range(n)]
    top = off + sz
    arena = int(top.max()) if n else 0
    bad_cap = n
    negative = np.flatnonzero(off < 0)
    if negative.size:
        k = int(negative[0])
        return Check(False, arena, f"buffer {names[k]!r}: negative offset {int(off[k])}", beyond=k)
    if capacity is not None:
        over = np.flatnonzero(top > capacity)
        if over.size:
            bad_cap = int(over[0])
    for i in range(min(n, bad_cap)):
        if sz[i] == 0:
            continue
        j0 = i + 1
        clash = (
            (lo[j0:] < up[i])
            & (lo[i] < up[j0:])
            & (off[j0:] < top[i])
            & (off[i] < top[j0:])
            & (sz[j0:] > 0)
        )
        hit = np.flatnonzero(clash)
        if hit.size:
            j = int(hit[0]) + j0
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
