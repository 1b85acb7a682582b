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
"""Most ordered pairs of overlapping buffers the greedy builds a list of (about 320 MB, a few
seconds); beyond, it scans the placed buffers for each buffer instead."""
SEARCH_PAIRS = 2_000_000
"""Most ordered pairs of overlapping buffers (or section incidences) of an instance the exact
search is run on: beyond, each node would cost milliseconds and the greedy answer stands."""
PAIR_SECONDS = 3e-7
"""About what building the list costs per pair (2-core machine): the greedy builds it only when
the time left allows."""


def _runs(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Buffers by start time, the position of each in that list, and how many start after it
    (later in the list) before it ends.
    """
    by_lower = np.argsort(lower, kind="stable")
    pos = np.empty(len(lower), dtype=np.int64)
    pos[by_lower] = np.arange(len(lower))
    # searchsorted is much faster on sorted keys: sort them, then put the answers back.
    by_upper = np.argsort(upper, kind="stable")
    reach = np.empty(len(upper), dtype=np.int64)
    reach[by_upper] = np.searchsorted(lower[by_lower], upper[by_upper], side="left")
    return by_lower, pos, np.maximum(reach - pos - 1, 0)


def count_overlaps(lower: np.ndarray, upper: np.ndarray) -> int:
    """The number of ordered pairs ``(b, u)``, ``b != u``, of buffers live at the same time."""
    if len(lower) == 0:
        return 0
    return 2 * int(_runs(lower, upper)[2].sum())


def overlaps(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the buffers live at the same time as each buffer: those of ``b`` are
    ``buf[start[b]:start[b + 1]]``, first the ones starting after it, then the others.
    O(n log n + Q log Q).
    """
    n = len(lower)
    by_lower, pos, later = _runs(lower, upper)
    # Pairs (b, u) with u starting after b, grouped by b (np.repeat keeps b in order) ...
    left = np.repeat(np.arange(n, dtype=np.int64), later)
    step = np.arange(len(left), dtype=np.int64) - np.repeat(np.cumsum(later) - later, later)
    right = by_lower[np.repeat(pos, later) + 1 + step]
    # ... and the same pairs seen from u, grouped by u with one sort of half the pairs.
    by_right = np.argsort(right, kind="stable")
    earlier = np.bincount(right, minlength=n).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(later + earlier)]).astype(np.int64)
    buf = np.empty(int(start[-1]), dtype=np.int64)
    buf[start[left] + step] = right
    rank = np.arange(len(right), dtype=np.int64) - np.repeat(np.cumsum(earlier) - earlier, earlier)
    mirrored = right[by_right]
    buf[start[mirrored] + later[mirrored] + rank] = left[by_right]
    return start, buf


def overlaps_in_time(
    lower: np.ndarray, upper: np.ndarray, deadline: float | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`overlaps` when there are at most ``MAX_PAIRS`` pairs and building the list should
    end well before ``deadline``; None otherwise.
    """
    import time

    if deadline is not None and time.perf_counter() >= deadline:
        return None
    pairs = count_overlaps(lower, upper)
    if pairs > MAX_PAIRS:
        return None
    if deadline is not None and time.perf_counter() + 2 * PAIR_SECONDS * pairs > deadline:
        return None
    return overlaps(lower, upper)
