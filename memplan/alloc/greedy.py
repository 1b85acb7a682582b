"""Greedy placements: an upper bound on the arena and a quick answer when it fits.

Each buffer, in a fixed order (largest first, the usual "greedy by size" of TFLite and OLLA's
baseline), goes at the lowest address where it meets none of the buffers already placed that are
live at the same time (first fit).
"""

from __future__ import annotations

import numpy as np


def first_fit(
    lower: np.ndarray, upper: np.ndarray, size: np.ndarray, order: np.ndarray
) -> np.ndarray:
    """Offsets from placing the buffers in ``order``, each at its lowest free address.

    O(n^2 log n) for n buffers.
    """
    n = len(size)
    offsets = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    for b in order.tolist():
        sz = int(size[b])
        if sz > 0:
            mask = placed & (lower < upper[b]) & (lower[b] < upper) & (size > 0)
            others = np.flatnonzero(mask)
            x = 0
            if others.size:
                starts = offsets[others]
                ends = starts + size[others]
                sort = np.argsort(starts, kind="stable")
                for s0, e0 in zip(starts[sort].tolist(), ends[sort].tolist(), strict=True):
                    if s0 >= x + sz:
                        break
                    x = max(x, e0)
            offsets[b] = x
        placed[b] = True
    return offsets


def best_greedy(lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The best of first fit by size (then lifetime) and by area (size x lifetime), descending."""
    width = upper - lower
    index = np.arange(len(size))
    best: np.ndarray | None = None
    for keys in ((index, -width, -size), (index, -size, -(width * size))):
        offsets = first_fit(lower, upper, size, np.lexsort(keys))
        if best is None or int((offsets + size).max(initial=0)) < int((best + size).max(initial=0)):
            best = offsets
    assert best is not None
    return best
