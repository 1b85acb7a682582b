"""The static data of one exact-allocation instance.

:class:`Instance` builds, once per instance and with numpy, what the branch-and-bound of
:mod:`memplan.alloc.search` (its nodes in the compiled core, src/alloc.cpp) reads at every node: the sections (time intervals between consecutive
lifetime endpoints) and the CSR of the (section, buffer) incidences, the section totals, the
buffers crossing each section boundary (NOTE [ decomposition ] in memplan/alloc/search.py), the
overlap graph, the stacked twins (NOTE [ stacked twins ]) and MiniMalloc's static preorders
(W, A, T keys, NOTE [ restarts ]). :func:`count_incidences` counts the incidences before any of
it is built, so that an instance too large for the exact search is turned down cheaply.
"""

from __future__ import annotations

import numpy as np

from memplan.alloc.lifetimes import overlaps

__all__ = ["Instance", "count_incidences"]


class Instance:
    """The static data of one instance (buffers of positive size only), built with numpy in
    O(n log n + P + Q) for P (section, buffer) incidences and Q pairs of buffers live at the same
    time (both are counted first: :func:`count_incidences`,
    :func:`memplan.alloc.lifetimes.count_overlaps`).
    """

    def __init__(
        self,
        lower: np.ndarray,
        upper: np.ndarray,
        size: np.ndarray,
        graph: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.n = n = len(size)
        self.lower, self.upper, self.size = lower, upper, size
        points = _distinct(np.concatenate([lower, upper]))
        self.first = np.searchsorted(points, lower).astype(np.int64)  # first section
        self.end = np.searchsorted(points, upper).astype(np.int64)  # one past the last section
        self.sections = S = max(len(points) - 1, 0)
        # CSR of the (section, buffer) incidences: the buffers live in section s are
        # sec_buf[sec_start[s]:sec_start[s + 1]], in order of first section, then index.
        span = self.end - self.first
        by_first = np.argsort(self.first, kind="stable")
        rep = np.repeat(by_first, span[by_first])
        base = np.repeat(np.cumsum(span[by_first]) - span[by_first], span[by_first])
        secs = self.first[rep] + np.arange(len(rep), dtype=np.int64) - base
        order = np.argsort(secs, kind="stable")
        self.sec_buf = rep[order].astype(np.int64)
        self.sec_start = np.searchsorted(secs[order], np.arange(S + 1)).astype(np.int64)
        delta = np.zeros(S + 1, dtype=np.int64)
        np.add.at(delta, self.first, size)
        np.add.at(delta, self.end, -size)
        self.section_total = np.cumsum(delta)[:S]
        # The largest section total over each buffer's lifetime (the preorders' key T).
        self.buffer_total = np.zeros(n, dtype=np.int64)
        if n:
            heads = np.cumsum(span[by_first]) - span[by_first]
            self.buffer_total[by_first] = np.maximum.reduceat(self.section_total[secs], heads)
        # Buffers crossing the boundary between sections s and s + 1.
        cuts = np.zeros(S + 1, dtype=np.int64)
        np.add.at(cuts, self.first, 1)
        np.add.at(cuts, self.end - 1, -1)
        self.cuts = np.cumsum(cuts)[: max(S - 1, 0)]
        self.ov_start, self.ov_buf = graph if graph is not None else overlaps(lower, upper)
        # CSR of the buffers with the same lifetime (NOTE [ stacked twins ]).
        order = np.lexsort((np.arange(n), upper, lower))
        same = np.ones(n, dtype=bool)
        if n:
            same[1:] = (lower[order][1:] != lower[order][:-1]) | (
                upper[order][1:] != upper[order][:-1]
            )
        heads = np.flatnonzero(same)
        group_size = np.diff(np.append(heads, n))
        twin_lists: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * n
        for g in np.flatnonzero(group_size > 1).tolist():
            members = order[heads[g] : heads[g] + group_size[g]]
            for k, m in enumerate(members.tolist()):
                twin_lists[m] = np.delete(members, k)
        lengths = np.array([len(t) for t in twin_lists], dtype=np.int64)
        self.tw_start = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.tw_buf = (
            np.concatenate(twin_lists).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
        )

    def preorder(self, heuristic: str) -> np.ndarray:
        """Ranks of the buffers under a static preorder (MiniMalloc's W, A, T keys, descending)."""
        width = self.upper - self.lower
        keys = {
            "W": width,
            "A": width * self.size,
            "T": self.buffer_total,
            "Z": self.size,
        }
        # np.lexsort sorts by the last key first; negate for descending, index breaks ties.
        tie = np.arange(self.n)
        if heuristic[-1].isdigit():  # e.g. "T3": a seeded random order behind the keys
            tie = np.random.default_rng(int(heuristic[-1])).permutation(self.n)
            heuristic = heuristic[:-1]
        order = np.lexsort((tie,) + tuple(-keys[c] for c in reversed(heuristic)))
        rank = np.empty(self.n, dtype=np.int64)
        rank[order] = np.arange(self.n)
        return rank


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted: ``np.unique(values)`` for an int64 array, without the
    import of ``numpy.ma`` that np.unique's first call costs (a hundredth of a second).
    """
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def count_incidences(lower: np.ndarray, upper: np.ndarray) -> int:
    """How many (section, buffer) incidences the instance has (its size P)."""
    points = _distinct(np.concatenate([lower, upper]))
    return int((np.searchsorted(points, upper) - np.searchsorted(points, lower)).sum())


def largest_section_total(lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Per buffer the largest total size of the buffers live in one of its sections (MiniMalloc's
    key T), in O(n log n).
    """
    if len(size) == 0:
        return np.zeros(0, dtype=np.int64)
    points = _distinct(np.concatenate([lower, upper]))
    first = np.searchsorted(points, lower).astype(np.int64)
    end = np.searchsorted(points, upper).astype(np.int64)
    delta = np.zeros(len(points), dtype=np.int64)
    np.add.at(delta, first, size)
    np.add.at(delta, end, -size)
    return _range_max(np.cumsum(delta)[: len(points) - 1], first, end)


class SkylineTables:
    """The static data of the skyline search (src/alloc_skyline.cpp, NOTE [ skyline search ]):
    per buffer its sections and size, per section its total, per boundary the buffers crossing
    it, the stacked twins and the ranks of the preorders TWA, TAW and WAT (the same ranks as
    :meth:`Instance.preorder`). No pairs or incidences are listed: O(n log n + S log S) time and
    O(n + S log S) memory for S sections, however many buffers live at the same time.
    """

    def __init__(self, lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> None:
        self.n = len(size)
        self.lower, self.upper, self.size = lower, upper, size
        points = _distinct(np.concatenate([lower, upper]))
        self.first = np.searchsorted(points, lower).astype(np.int64)
        self.end = np.searchsorted(points, upper).astype(np.int64)
        self.sections = S = max(len(points) - 1, 0)
        delta = np.zeros(S + 1, dtype=np.int64)
        np.add.at(delta, self.first, size)
        np.add.at(delta, self.end, -size)
        self.section_total = np.cumsum(delta)[:S]
        cuts = np.zeros(S + 1, dtype=np.int64)
        np.add.at(cuts, self.first, 1)
        np.add.at(cuts, self.end - 1, -1)
        self.cuts = np.cumsum(cuts)[: max(S - 1, 0)]
        self.buffer_total = _range_max(self.section_total, self.first, self.end)
        self.tw_start, self.tw_buf = _twins(lower, upper)

    def preorder(self, heuristic: str) -> np.ndarray:
        """Ranks under MiniMalloc's W, A, T keys, descending, the index breaking ties."""
        width = self.upper - self.lower
        keys = {"W": width, "A": width * self.size, "T": self.buffer_total}
        order = np.lexsort((np.arange(self.n),) + tuple(-keys[c] for c in reversed(heuristic)))
        rank = np.empty(self.n, dtype=np.int64)
        rank[order] = np.arange(self.n)
        return rank


def _range_max(values: np.ndarray, first: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``values[first[b]:end[b]].max()`` for every b (ranges not empty), by a sparse table."""
    if len(first) == 0:
        return np.zeros(0, dtype=np.int64)
    span = end - first
    level = np.floor(np.log2(span)).astype(np.int64)
    out = np.empty(len(first), dtype=np.int64)
    table = values
    for k in range(int(level.max()) + 1):
        if k:
            table = np.maximum(table[: -(1 << (k - 1))], table[1 << (k - 1) :])
        at = np.flatnonzero(level == k)
        if at.size:
            out[at] = np.maximum(table[first[at]], table[end[at] - (1 << k)])
    return out


TWIN_WINDOW = 32
"""Each buffer lists as its stacked twins the buffers of the same lifetime at most this many
places from it in their group (by index): all of them in a group of up to 33. A compiler
trace has groups of thousands (a 62,185-buffer one: its full lists took 10 s to build); the
rule of NOTE [ stacked twins ] only prunes, so that it checks fewer twins keeps it sound."""


def _twins(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the stacked twins of each buffer (NOTE [ stacked twins ]): the buffers with the
    same lifetime within ``TWIN_WINDOW`` places of it in their group, in the group's order.
    """
    n = len(lower)
    order = np.lexsort((np.arange(n), upper, lower))
    lo, up = lower[order], upper[order]
    pairs = []  # (position, position of a twin) in ``order``
    for d in range(1, min(TWIN_WINDOW, max(n - 1, 0)) + 1):
        same = np.flatnonzero((lo[d:] == lo[:-d]) & (up[d:] == up[:-d]))
        if not same.size:
            break  # no twins d places apart: none further apart either
        pairs += [np.stack([same, same + d]), np.stack([same + d, same])]
    if not pairs:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    at, twin = np.concatenate(pairs, axis=1)
    owner = order[at]
    by = np.lexsort((twin, owner))  # grouped by buffer, its twins in the group's order
    count = np.bincount(owner, minlength=n)
    tw_start = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    return tw_start, order[twin[by]].astype(np.int64)
