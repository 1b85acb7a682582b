"""The exact search of one instance, part by part, in the compiled core.

Two implementations of the same branch-and-bound (NOTEs of :mod:`memplan.alloc.search`) run
there. The *compiled search* (src/alloc.cpp) reads the lists of buffers live at the same time and
of section incidences; a node costs O(n). It has every rule (residual preorders, the least-offset
section inference) and is what places MiniMalloc's challenging instances. The *skyline search*
(src/alloc_skyline.cpp, NOTE [ skyline search ]) lists nothing: its state is three trees over the
sections and the buffers, a node costs O(log n) plus the minimum offsets it refreshes, its memory
is O(n + sections); it is what places 10,000 to 100,000 buffers, or dense instances whose lists
would take gigabytes. :class:`PartSearch` picks one (:func:`uses_skyline`), splits the instance
into its static parts and searches one part at a capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from memplan.alloc.buffers import MAX_ARENA
from memplan.alloc.instance import Instance, SkylineTables, count_incidences
from memplan.alloc.lifetimes import SEARCH_PAIRS, count_overlaps
from memplan.core import kernels

__all__ = [
    "ABORTED",
    "FOUND",
    "NOT_FOUND",
    "PREORDERS",
    "SKYLINE_BUFFERS",
    "TIMEOUT",
    "Part",
    "PartSearch",
    "compiled_search",
    "skyline_search",
    "static_parts",
    "uses_skyline",
]

FOUND, NOT_FOUND, ABORTED, TIMEOUT = (
    kernels.ALLOC_FOUND,
    kernels.ALLOC_NOT_FOUND,
    kernels.ALLOC_ABORTED,
    kernels.ALLOC_TIMEOUT,
)
PREORDERS = ("TWA", "TAW", "WAT")
"""MiniMalloc's static preorders of the round robin (NOTE [ compiled restarts ]): keys W lifetime
width, A area, T largest section total, descending, the index breaking ties."""
SKYLINE_BUFFERS = 2000
"""The exact search at a capacity alone (:func:`memplan.alloc.search.search`) runs the skyline
search on instances of more buffers (of positive size) than this; every search runs it on those
with more than ``SEARCH_PAIRS`` pairs of buffers live at the same time or section incidences
(memplan/alloc/lifetimes.py)."""

TIGHT_SLACK = 64
"""The round robin runs first at a part's own peak when the capacity is at most 1/64 (1.6%) above
it (NOTE [ compiled restarts ]): with more slack that run fails on instances near the peak
(8,000 nodes wasted on 1,000 random buffers at 1.02x their peak, placed in 1,000 at it), and
of MiniMalloc's eleven only C (0.9% of slack: 1,015 nodes instead of 24,563) gains from it."""


def _preorders(
    tables: Instance | SkylineTables,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The ranks of the buffers under each of :data:`PREORDERS`, in its order."""
    twa, taw, wat = (tables.preorder(name) for name in PREORDERS)
    return twa, taw, wat


def compiled_search(inst: Instance, memo_slots: int = 0) -> kernels.AllocSearch:
    """The core's search of ``inst``: its static data and preorders, and a fresh failed-state
    memo of ``memo_slots`` entries (0: the core's default; NOTE [ compiled failed-state memo ],
    src/alloc.cpp). Its memo holds for one capacity.
    """
    return kernels.AllocSearch(
        inst.sections,
        inst.first,
        inst.end,
        np.ascontiguousarray(inst.size, dtype=np.int64),
        inst.sec_start,
        inst.sec_buf,
        np.ascontiguousarray(inst.ov_start, dtype=np.int64),
        np.ascontiguousarray(inst.ov_buf, dtype=np.int64),
        inst.tw_start,
        inst.tw_buf,
        np.ascontiguousarray(inst.section_total, dtype=np.int64),
        np.ascontiguousarray(inst.cuts, dtype=np.int64),
        (inst.upper - inst.lower).astype(np.float64),
        *_preorders(inst),
        memo_slots,
    )


def skyline_search(tables: SkylineTables, memo_slots: int = 0) -> kernels.AllocSkyline:
    """The core's skyline search of ``tables`` (its memo keys the capacity: it holds across
    capacities).
    """
    return kernels.AllocSkyline(
        tables.sections,
        tables.first,
        tables.end,
        np.ascontiguousarray(tables.size, dtype=np.int64),
        np.ascontiguousarray(tables.section_total, dtype=np.int64),
        np.ascontiguousarray(tables.cuts, dtype=np.int64),
        tables.tw_start,
        tables.tw_buf,
        *_preorders(tables),
        memo_slots,
    )


def static_parts(inst: Instance) -> list[tuple[np.ndarray, int, int]]:
    """Static decomposition (NOTE [ decomposition ]): the buffers and section range of each
    independent part, split where no buffer crosses a section boundary.
    """
    zero = np.flatnonzero(inst.cuts == 0)
    bounds = [0, *(zero + 1).tolist(), inst.sections]
    by_first = np.argsort(inst.first, kind="stable")
    first = inst.first[by_first]
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=False):
        sub = by_first[(first >= lo) & (first < hi)]
        if sub.size:
            parts.append((sub, lo, hi))
    return parts


def uses_skyline(lower: np.ndarray, upper: np.ndarray, least: bool = False) -> bool:
    """Whether an instance (buffers of positive size) is searched by the skyline search: when
    its lists are too large for the compiled search and, for the exact search at a capacity
    alone, when it has more than ``SKYLINE_BUFFERS`` buffers. The least-arena search (``least``,
    which :func:`memplan.alloc.place` runs with or without a capacity) keeps the compiled search
    wherever its lists fit: its probes below the first guess need the stronger rules (residual
    preorders, least-offset inference); on 10,000 short-lived random buffers (590,000 pairs) it
    proved the peak least in 2 s of CPU where the skyline search ended 0.52% above it after 9 s.
    """
    return (
        (not least and len(lower) > SKYLINE_BUFFERS)
        or count_overlaps(lower, upper) > SEARCH_PAIRS
        or count_incidences(lower, upper) > SEARCH_PAIRS
    )


@dataclass(frozen=True)
class Part:
    """One static part: its buffers (indices of the instance, in the order of the offsets that
    :meth:`PartSearch.solve` returns), its sections [lo, hi) and its peak live load.
    """

    buffers: np.ndarray
    lo: int
    hi: int
    peak: int


class PartSearch:
    """The exact search of one instance (buffers of positive size), part by part: the skyline
    search when ``skyline`` (None: :func:`uses_skyline` decides), else the compiled search.
    ``graph`` is the CSR of :func:`memplan.alloc.lifetimes.overlaps`, when already built.
    """

    def __init__(
        self,
        lower: np.ndarray,
        upper: np.ndarray,
        size: np.ndarray,
        graph: tuple[np.ndarray, np.ndarray] | None = None,
        skyline: bool | None = None,
    ) -> None:
        self.n = len(size)
        self._size = size
        self.skyline = uses_skyline(lower, upper) if skyline is None else skyline
        self._compiled: tuple[int, kernels.AllocSearch] | None = None
        if self.skyline:
            tables = SkylineTables(lower, upper, size)
            self._sky = skyline_search(tables)
            total = tables.section_total
            self.parts = [
                Part(self._sky.part_buffers(lo, hi), lo, hi, int(total[lo:hi].max()))
                for lo, hi in self._sky.parts()
            ]
            self.section_peak = int(total.max(initial=0))
        else:
            self._inst = Instance(lower, upper, size, graph)
            total = self._inst.section_total
            self.parts = [
                Part(buffers, lo, hi, int(total[lo:hi].max()))
                for buffers, lo, hi in static_parts(self._inst)
            ]
            self.section_peak = int(total.max(initial=0))

    def solve(
        self,
        part: Part,
        capacity: int,
        node_budget: int | None = None,
        nodes: int = 0,
        tight: bool = True,
        time_limit: float | None = None,
        fresh: bool = False,
    ) -> tuple[int, int, np.ndarray | None]:
        """The round robin on ``part`` at ``capacity`` (first at the part's peak when ``tight``
        and the capacity is within 1/``TIGHT_SLACK`` of it, NOTE [ compiled restarts ]):
        (status, nodes counted so far, offsets of ``part.buffers`` when FOUND). ``fresh``: the
        compiled search starts from an empty failed-state memo (the skyline search keeps its
        memo: its keys hold the capacity).
        """
        left = -1.0 if time_limit is None else max(float(time_limit), 0.0)
        budget = -1 if node_budget is None else int(node_budget)
        tight = tight and capacity - part.peak <= part.peak // TIGHT_SLACK
        if self.skyline:
            status, nodes, offsets = self._sky.solve_part(
                part.lo, part.hi, capacity, budget, nodes, tight, left
            )
            return status, nodes, offsets if status == FOUND else None
        if fresh:
            self._compiled = None
        status, nodes, solution = self._core(capacity).solve_part(
            part.buffers, part.lo, part.hi, capacity, budget, nodes, tight, left
        )
        return status, nodes, solution[part.buffers] if status == FOUND else None

    def descend(
        self, part: Part, preorder: int, time_limit: float | None = None
    ) -> np.ndarray | None:
        """One descent of the skyline search on ``part`` under ``PREORDERS[preorder]`` with no
        capacity: every buffer in turn at the least minimum offset (the preorder breaking ties),
        a greedy placement in as many nodes as buffers. None when stopped by ``time_limit``.
        """
        assert self.skyline
        left = -1.0 if time_limit is None else max(float(time_limit), 0.0)
        roomy = min(int(self._size[part.buffers].sum()), MAX_ARENA)
        status, _, offsets = self._sky.run_once(
            part.lo, part.hi, roomy, preorder, True, 8, 4 * len(part.buffers) + 64, left
        )
        return offsets if status == FOUND else None

    def _core(self, capacity: int) -> kernels.AllocSearch:
        if self._compiled is None or self._compiled[0] != capacity:
            self._compiled = (capacity, compiled_search(self._inst))
        return self._compiled[1]
