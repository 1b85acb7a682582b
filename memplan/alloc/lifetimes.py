"""Which buffers are live at the same time: the pairs the greedy and the search work on.

Two buffers with half-open lifetimes overlap when each starts before the other ends. Listed by
start time, the buffers a buffer ``b`` meets *later* are the ones that start in
``[lower[b], upper[b])``: a contiguous run of that list, so the pairs come out of one
``searchsorted`` and a ``repeat``, in O(n log n + Q) for Q pairs, and can be counted first in
O(n log n) (:func:`count_overlaps`) before anything that large is built.
"""

from __future__ import annotations

import numpy as np

MAX_PAIRS = 20_000_000
"""Most ordered pairs of overlapping buffers the greedy and the search build a list of (about
320 MB); beyond, the greedy falls back to a scan per buffer and the exact search is not run."""


def _runs(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Buffers by start time, the position of each in that list, and how many start after it
    (later in the list) before it ends."""
    by_lower = np.argsort(lower, kind="stable")
    pos = np.empty(len(lower), dtype=np.int64)
    pos[by_lower] = np.arange(len(lower))
    reach = np.searchsorted(lower[by_lower], upper, side="left")
    return by_lower, pos, np.maximum(reach - pos - 1, 0)


def count_overlaps(lower: np.ndarray, upper: np.ndarray) -> int:
    """The number of ordered pairs ``(b, u)``, ``b != u``, of buffers live at the same time."""
    if len(lower) == 0:
        return 0
    return 2 * int(_runs(lower, upper)[2].sum())


def overlaps(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the buffers live at the same time as each buffer: those of ``b`` are
    ``buf[start[b]:start[b + 1]]``, in increasing index order."""
    n = len(lower)
    by_lower, pos, count = _runs(lower, upper)
    left = np.repeat(np.arange(n, dtype=np.int64), count)
    step = np.arange(len(left), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    right = by_lower[np.repeat(pos, count) + 1 + step]
    a = np.concatenate([left, right])
    b = np.concatenate([right, left])
    order = np.lexsort((b, a))
    buf = b[order].astype(np.int64)
    start = np.searchsorted(a[order], np.arange(n + 1)).astype(np.int64)
    return start, buf
