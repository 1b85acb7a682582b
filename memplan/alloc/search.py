"""Exact offline memory allocation: a branch-and-bound over canonical placements.

The search follows the ideas of Moffitt, *MiniMalloc: A Lightweight Memory Allocator for
Hardware-Accelerated Machine Learning* (ASPLOS 2023), written anew in Python + numpy:

NOTE [ canonical placements ]
Push every buffer of a valid placement down as far as it goes ("gravity"): each buffer then rests
on address 0 or on the top of a buffer live at the same time, every offset stays at most what it
was, so the arena does not grow. List the buffers by (offset, preorder rank): each one's offset is
then the highest top among the earlier buffers that overlap it in time, its *minimum offset*
``m[b]``. The search therefore only chooses *which* buffer comes next; its offset is ``m[b]``, and
the pair (offset, rank) must not decrease along a branch (MiniMalloc §4.1, canonical solutions).

NOTE [ inference and dominance ]
Sections are the time intervals between consecutive lifetime endpoints. Every buffer still to
place goes at or above both the offset ``o`` of the last placement (monotone floor) and its own
``m[b]``; so in each section ``s`` the unplaced buffers need ``max(o, min m[b]) + sum size[b]``
bytes at most ``capacity`` (section inference, §4.2, with the unallocated floor). A candidate
whose offset is at or above ``min(m[u] + size[u])`` over the unplaced ``u`` is skipped: ``u``
would fit in the gap it leaves under it, a placement found on another branch (dominance, §4.3).

NOTE [ decomposition ]
Where no buffer crosses a section boundary the problem splits into independent parts (static
decomposition); after each placement the count of *unplaced* buffers crossing each boundary is
updated, and a boundary at zero splits the rest of the search the same way (dynamic
decomposition, §4.4). Each part is searched from a fresh monotone floor.

NOTE [ restarts ]
The static preorder (ties of the dynamic order by minimum offset) matters a lot; as MiniMalloc
does, the search runs round-robin over three preorders (by width, area and section total, in
three orders) with a node budget that doubles every round, so one unlucky order does not stall it.
A complete run (no budget hit) that finds nothing proves the capacity infeasible.

Complexity: exponential in the worst case (the decision problem is strongly NP-complete); each
node costs O(n + P) numpy work for n buffers and P (section, buffer) incidences.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_INF = np.int64(2**62)
import os
RELEASE = bool(int(os.environ.get('RELEASE', '0')))
TWINS = bool(int(os.environ.get('TWINS', '1')))
FOUND, NOT_FOUND, ABORTED, TIMEOUT = 1, 0, -1, -2
PREORDERS = ("WAT", "TAW", "TWA")
"""Static preorders tried round-robin: W lifetime width, A area, T largest section total."""


@dataclass
class SearchResult:
    """Outcome of one feasibility search at a fixed capacity."""

    status: str
    """``placed``, ``infeasible`` (proven) or ``gave-up`` (time limit)."""
    offsets: np.ndarray | None
    nodes: int
    seconds: float


class _Instance:
    """The static data of one instance (buffers of positive size only)."""

    def __init__(self, lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> None:
        self.n = n = len(size)
        self.lower, self.upper, self.size = lower, upper, size
        points = np.unique(np.concatenate([lower, upper]))
        self.first = np.searchsorted(points, lower).astype(np.int64)  # first section
        self.end = np.searchsorted(points, upper).astype(np.int64)  # one past the last section
        self.sections = S = max(len(points) - 1, 0)
        # (section, buffer) incidences, grouped by section; an empty section gets the dummy
        # buffer n (always "placed", minimum offset +inf) so that reduceat never sees an empty
        # segment.
        counts = np.zeros(S + 1, dtype=np.int64)
        np.add.at(counts, self.first, 1)
        np.add.at(counts, self.end, -1)
        live = np.cumsum(counts)[:S]
        per = np.maximum(live, 1)
        self.start = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
        inc = np.full(int(self.start[-1]), n, dtype=np.int64)
        fill = self.start[:-1].copy()
        for b in np.argsort(self.first, kind="stable").tolist():
            for s in range(int(self.first[b]), int(self.end[b])):
                inc[fill[s]] = b
                fill[s] += 1
        self.incidence = inc
        self.section_of = np.repeat(np.arange(S, dtype=np.int64), per)
        self.size_ext = np.concatenate([size, [0]]).astype(np.int64)
        totals = np.zeros(S, dtype=np.int64)
        for b in range(n):
            totals[self.first[b] : self.end[b]] += size[b]
        self.section_total = totals
        # Buffers crossing the boundary between sections s and s + 1.
        cuts = np.zeros(S + 1, dtype=np.int64)
        np.add.at(cuts, self.first, 1)
        np.add.at(cuts, self.end - 1, -1)
        self.cuts = np.cumsum(cuts)[: max(S - 1, 0)]
        groups: dict[tuple[int, int], list[int]] = {}
        for b in range(n):
            groups.setdefault((int(lower[b]), int(upper[b])), []).append(b)
        self.twins = [[u for u in groups[(int(lower[b]), int(upper[b]))] if u != b] for b in range(n)]
        self.overlaps = [
            np.flatnonzero((lower < upper[b]) & (lower[b] < upper) & (np.arange(n) != b))
            for b in range(n)
        ]

    def preorder(self, heuristic: str) -> np.ndarray:
        """Ranks of the buffers under a static preorder (MiniMalloc's W, A, T keys, descending)."""
        width = self.upper - self.lower
        keys = {
            "W": width,
            "A": width * self.size,
            "T": np.array(
                [
                    self.section_total[self.first[b] : self.end[b]].max() if self.n else 0
                    for b in range(self.n)
                ],
                dtype=np.int64,
            ),
            "Z": self.size,
        }
        # np.lexsort sorts by the last key first; negate for descending, index breaks ties.
        order = np.lexsort((np.arange(self.n),) + tuple(-keys[c] for c in reversed(heuristic)))
        rank = np.empty(self.n, dtype=np.int64)
        rank[order] = np.arange(self.n)
        return rank


class _Search:
    """One depth-first search at a fixed capacity (see the NOTEs of this module)."""

    def __init__(
        self, inst: _Instance, capacity: int, rank: np.ndarray, deadline: float | None
    ) -> None:
        self.inst = inst
        self.capacity = int(capacity)
        self.rank = rank
        self.deadline = deadline
        n = inst.n
        # mu[b]: minimum offset of an unplaced buffer, +inf once placed (index n is a dummy).
        self.mu = np.zeros(n + 1, dtype=np.int64)
        self.mu[n] = _INF
        self.offset = np.full(n, -1, dtype=np.int64)
        self.solution = np.full(n, -1, dtype=np.int64)
        self.total = inst.section_total.copy()
        self.cuts = inst.cuts.copy()
        self.nodes = 0
        self.tries = 0
        self.node_limit = 0
        # Python lists are faster to index one at a time than numpy arrays.
        self.size_l = inst.size.tolist()
        self.first_l = inst.first.tolist()
        self.end_l = inst.end.tolist()
        self.rank_l = rank.tolist()
        self.failed: set[tuple] = set()
        self.twins = inst.twins

    # -- the search ---------------------------------------------------------------------------

    def solve_part(self, buffers: np.ndarray, lo: int, hi: int) -> int:
        """Search the part made of ``buffers`` (sorted by rank) over sections ``[lo, hi)``."""
        return self._node(buffers, lo, hi, -1, -1)

    def _node(self, part: np.ndarray, lo: int, hi: int, o: int, last_rank: int) -> int:
        self.nodes += 1
        if self.nodes > self.node_limit:
            return ABORTED
        if self.deadline is not None and (self.nodes & 63) == 0:
            if time.perf_counter() > self.deadline:
                return TIMEOUT
        mu = self.mu
        m = mu[part]
        open_ = m < _INF
        if not open_.any():
            self._record()
            return FOUND
        part = part[open_]
        m = m[open_]
        key = (lo, hi, o, last_rank, part.tobytes(), m.tobytes())
        if key in self.failed:
            return NOT_FOUND
        status = self._branch(part, m, lo, hi, o, last_rank)
        if status == NOT_FOUND:
            self.failed.add(key)
        return status

    def _branch(self, part: np.ndarray, m: np.ndarray, lo: int, hi: int, o: int, last_rank: int) -> int:
        mu = self.mu
        size = self.inst.size[part]
        min_height = int((m + size).min())
        rank = self.rank[part]
        # Every section still needs its whole unplaced total above the new monotone floor.
        peak = int(self.total[lo:hi].max())
        ok = (
            (m < min_height)
            & (m + peak <= self.capacity)
            & ((m > o) | ((m == o) & (rank > last_rank)))
        )
        cands = part[ok]
        if cands.size == 0:
            return NOT_FOUND
        cands = cands[np.argsort(m[ok], kind="stable")].tolist()
        inst = self.inst
        capacity = self.capacity
        total = self.total
        cuts = self.cuts
        inc = inst.incidence
        p0, p1 = int(inst.start[lo]), int(inst.start[hi])
        seg = inst.start[lo:hi] - p0
        inc_part = inc[p0:p1]
        size_ext = inst.size_ext
        sec_rel = inst.section_of[p0:p1] - lo
        sec_key = sec_rel * (capacity + 3)
        twins = self.twins
        offset = self.offset
        rank_l = self.rank_l
        for b in cands:
            off = int(mu[b])
            sz = self.size_l[b]
            top = off + sz
            if TWINS and twins[b] and any(
                offset[u] >= 0 and offset[u] + self.size_l[u] == off and rank_l[u] > rank_l[b]
                for u in twins[b]
            ):
                continue
            a, e = self.first_l[b], self.end_l[b]
            # Place b.
            self.offset[b] = off
            mu[b] = _INF
            ov = inst.overlaps[b]
            mov = mu[ov]
            raised = ov[mov < top]
            old = mu[raised]
            mu[raised] = top
            total[a:e] -= sz
            status = NOT_FOUND
            self.tries += 1
            if not (old.size and (top + inst.size[raised] > capacity).any()):
                if RELEASE:
                    r = mu[inc_part]
                    live = r < _INF
                    r = np.where(live, np.maximum(r, off), -1)
                    w = np.where(live, size_ext[inc_part], 0)
                    order = np.argsort(sec_key + (capacity + 1 - r))
                    cs = np.cumsum(w[order])
                    excl = np.concatenate(([0], cs))[seg]
                    bound = r[order] + cs - excl[sec_rel]
                    if np.maximum.reduceat(bound, seg).max() <= capacity:
                        status = self._after(b, part, lo, hi, off, a, e)
                else:
                  floor = np.minimum.reduceat(mu[inc_part], seg)
                  np.maximum(floor, off, out=floor)
                  tot = total[lo:hi]
                  if not ((floor + tot > capacity) & (tot > 0)).any():
                    status = self._after(b, part, lo, hi, off, a, e)
            # Undo.
            total[a:e] += sz
            mu[raised] = old
            mu[b] = off
            self.offset[b] = -1
            if status != NOT_FOUND:
                return status
        return NOT_FOUND

    def _record(self) -> None:
        placed = self.offset >= 0
        self.solution[placed] = self.offset[placed]

    def _after(self, b: int, part: np.ndarray, lo: int, hi: int, off: int, a: int, e: int) -> int:
        """Recurse after placing ``b``, splitting the rest where no unplaced buffer crosses."""
        cuts = self.cuts
        if e - a <= 1:
            return self._node(part, lo, hi, off, self.rank_l[b])
        window = cuts[a : e - 1]
        window -= 1
        zero = np.flatnonzero(window == 0)
        try:
            if zero.size == 0:
                return self._node(part, lo, hi, off, self.rank_l[b])
            bounds = [lo, *(a + zero + 1).tolist(), hi]
            bounds = sorted(set(x for x in bounds if lo <= x <= hi))
            rest = part[self.mu[part] < _INF]
            if rest.size == 0:
                self._record()
                return FOUND
            first = self.inst.first[rest]
            for k in range(len(bounds) - 1):
                slo, shi = bounds[k], bounds[k + 1]
                sub = rest[(first >= slo) & (first < shi)]
                if sub.size == 0:
                    continue
                status = self._node(sub, slo, shi, -1, -1)
                if status != FOUND:
                    return status
            return FOUND
        finally:
            window += 1


def _parts(inst: _Instance) -> list[tuple[np.ndarray, int, int]]:
    """Static decomposition: the buffers and section range of each independent part."""
    zero = np.flatnonzero(inst.cuts == 0)
    bounds = [0, *(zero + 1).tolist(), inst.sections]
    parts = []
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        sub = np.flatnonzero((inst.first >= lo) & (inst.first < hi))
        if sub.size:
            parts.append((sub, lo, hi))
    return parts


def search(
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    capacity: int,
    time_limit: float | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """Find offsets with every buffer inside ``[0, capacity)``, or prove there are none.

    Buffers of size 0 get offset 0. ``time_limit`` (seconds) bounds the whole search; when it is
    hit the status is ``gave-up``. See the module's NOTEs for the algorithm.
    """
    started = time.perf_counter()
    deadline = None if time_limit is None else started + float(time_limit)
    lower = np.asarray(lower, dtype=np.int64)
    upper = np.asarray(upper, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    offsets = np.zeros(len(size), dtype=np.int64)
    keep = np.flatnonzero(size > 0)
    if keep.size and int(size[keep].max()) > capacity:
        return SearchResult("infeasible", None, 0, time.perf_counter() - started)
    inst = _Instance(lower[keep], upper[keep], size[keep])
    if inst.n and int(inst.section_total.max()) > capacity:
        return SearchResult("infeasible", None, 0, time.perf_counter() - started)
    ranks = [inst.preorder(h) for h in PREORDERS]
    memos: list[set[tuple]] = [set() for _ in PREORDERS]
    global self_tries
    self_tries = []
    nodes = 0
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 4 * inst.n + 1000))
    try:
        for part, lo, hi in _parts(inst):
            limit = max(len(part), 16)
            solved = False
            while not solved:
                limit *= 2
                for rank, memo in zip(ranks, memos):
                    order = part[np.argsort(rank[part], kind="stable")]
                    run = _Search(inst, capacity, rank, deadline)
                    run.failed = memo
                    run.node_limit = limit
                    status = run.solve_part(order, lo, hi)
                    nodes += run.nodes; self_tries.append(run.tries)
                    if status == FOUND:
                        offsets[keep[part]] = run.solution[part]
                        solved = True
                        break
                    if status == NOT_FOUND:
                        return SearchResult("infeasible", None, nodes, time.perf_counter() - started)
                    if status == TIMEOUT:
                        return SearchResult("gave-up", None, nodes, time.perf_counter() - started)
                if on_progress is not None and not solved:
                    on_progress(f"node budget {limit} exhausted by every preorder; doubling")
    finally:
        sys.setrecursionlimit(old_limit)
    return SearchResult("placed", offsets, nodes, time.perf_counter() - started)
