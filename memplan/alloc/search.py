"""Exact offline memory allocation: a branch-and-bound over canonical placements.

The search follows the ideas of Moffitt, *MiniMalloc: A Lightweight Memory Allocator for
Hardware-Accelerated Machine Learning* (ASPLOS 2023), written anew in Python + numpy here and for
numba in memplan/alloc/kernel.py (:func:`search` picks the engine):

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
does, the search runs round-robin over six preorders (by width, area and section total, in three
orders, and three seeded random tie-breaks) with a node budget that doubles every round, so one
unlucky order does not stall it. A complete run (no budget hit) that finds nothing proves the
capacity infeasible.

NOTE [ residual preorders ]
As MiniMalloc does when it solves a sub-partition, a part that dynamic decomposition splits off is
searched under its own preorder: the same keys, with T taken from the sections' *unplaced* totals
at the split (its buffers keep their set of rank values, so the failed-state memo stays sound: its
key holds the part in rank order and the tie rule as a position in it). The ranks come back when
the part is done. Each preorder of the round robin runs twice, plain and then so re-ranked (each
with its own memo): the plain order places F and G of MiniMalloc's challenging set quickly, the
re-ranked one places I (tens of thousands of nodes, where 3.4 million plain ones did not).

NOTE [ failed states ]
The subtree below a node depends only on the unplaced buffers of its part, their minimum offsets,
the last offset and rank (which matter only when some minimum offset is at or below the last
offset). A subtree searched to the end without success records that key; meeting it again (from
another order of earlier placements, or in a later round of the same preorder) prunes at once.

NOTE [ stacked twins ]
Two buffers with the same lifetime, one right on top of the other, can swap places without
touching anything else; only the order with the buffer earlier in the preorder below is searched.

NOTE [ compiled restarts ]
The compiled engine (memplan/alloc/kernel.py) runs nodes 50-200 times faster, so it drops the
pinned cores and runs a round robin of six: MiniMalloc's three preorders TWA, TAW, WAT, each
once plain with the stacked-twin rule and once with residual preorders (MiniMalloc's SubSolve)
without it. The twin rule is sound but changes which of two mirrored placements is met first:
on MiniMalloc's instance H it turns 1,290 nodes into more than 60,000, on B and C it saves 60%.
The node limit doubles every round, from twice the part's size. When the capacity has slack over
the part's peak live load, the round robin first runs at the peak, for at most 8 nodes per
buffer: a tight problem prunes far more (instance C: 1,017 nodes at its peak, 24,583 at 1 MiB),
and a placement within the peak fits the capacity.

NOTE [ pinned cores ]
Before the restarts, the buffers of the tightest sections (a small problem) are placed alone and
pinned; the whole part is then searched around the pins. A pinned buffer takes its pinned offset
when the floor reaches it, may float there (the canonical argument still holds for the free
buffers: a buffer that cannot drop to its minimum offset is blocked by an earlier one), prunes a
branch that raises its minimum offset above the pin, and does not count as crossing a section
boundary, so the part splits around the core into independent pieces. See _progressive.

Complexity: exponential in the worst case (the decision problem is strongly NP-complete); each
node costs O(n + P) numpy work for n buffers and P (section, buffer) incidences here, and O(n)
plus the sections touched by the placement in the compiled kernel (memplan/alloc/kernel.py, the
same rules plus MiniMalloc's hatless pruning; NOTE [ compiled restarts ]).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from memplan.alloc.buffers import MAX_ARENA
from memplan.alloc.instance import Instance, count_incidences
from memplan.alloc.lifetimes import SEARCH_PAIRS, count_overlaps

if TYPE_CHECKING:
    from memplan.alloc.compiled import Kernel

_INF = np.int64(2**62)
ENGINES = ("auto", "compiled", "numpy")
FOUND, NOT_FOUND, ABORTED, TIMEOUT = 1, 0, -1, -2
PREORDERS = ("WAT", "TAW", "TWA", "T1", "T2", "T3")
"""Static preorders tried round-robin (NOTE [ restarts ]): keys W lifetime width, A area, T largest
section total (descending); a trailing digit breaks ties by a seeded random permutation."""
RESIDUAL = True
"""NOTE [ residual preorders ] on or off."""
GUIDES = ("TWA", "TAW", "WAT")
COMPILED_RUNS = (
    ("TWA", False, True),
    ("TWA", True, False),
    ("TAW", False, True),
    ("TAW", True, False),
    ("WAT", False, True),
    ("WAT", True, False),
)
"""The round robin of the compiled engine (NOTE [ compiled restarts ]): (preorder, residual
preorders, stacked twins)."""
"""Preorders of the pinned-core attempts (NOTE [ pinned cores ])."""


@dataclass
class SearchResult:
    """Outcome of one feasibility search at a fixed capacity."""

    status: str
    """``placed``, ``infeasible`` (proven) or ``gave-up`` (time limit)."""
    offsets: np.ndarray | None
    nodes: int
    seconds: float
    note: str = ""
    """Why the search gave up without searching, when it did (an instance too large)."""


class _Search:
    """One depth-first search at a fixed capacity (see the NOTEs of this module).

    ``pins`` (offset per buffer, -1 when free) fixes some buffers: a pinned buffer is placed at
    its pin when the monotone floor reaches it, may float there (NOTE [ pinned cores ]), prunes
    any branch that raises its minimum offset above the pin, and crosses section boundaries
    without coupling the two sides (so decomposition ignores it).
    """

    def __init__(
        self,
        inst: Instance,
        capacity: int,
        rank: np.ndarray,
        deadline: float | None,
        failed: set[tuple[object, ...]],
        pins: np.ndarray | None = None,
        on_leaf: Callable[[np.ndarray], int] | None = None,
    ) -> None:
        self.inst = inst
        self.capacity = int(capacity)
        self.rank = rank.copy()
        # NOTE [ residual preorders ]: the preorder's keys, to re-rank each dynamic sub-part.
        self.heuristic: str | None = None
        self.deadline = deadline
        self.failed = failed
        # With on_leaf, each full placement is offered to it (FOUND accepts, NOT_FOUND asks for
        # the next one, ABORTED stops); the search then neither splits nor memoizes, as the
        # verdict depends on the whole placement.
        self.on_leaf = on_leaf
        n = inst.n
        self.pin = np.full(n, -1, dtype=np.int64) if pins is None else pins.astype(np.int64)
        self.free = self.pin < 0
        # mu[b]: minimum offset of an unplaced buffer (its pin when pinned), +inf once placed;
        # index n is a dummy that stands for "no buffer" in the section incidences.
        self.mu = np.concatenate([np.maximum(self.pin, 0), [_INF]])
        # maxm[b]: the largest minimum offset b may reach (capacity - size, or its pin).
        self.maxm = np.concatenate([np.where(self.free, capacity - inst.size, self.pin), [_INF]])
        self.offset = np.full(n, -1, dtype=np.int64)
        self.solution = np.full(n, -1, dtype=np.int64)
        self.total = inst.section_total.copy()
        cuts = np.zeros(inst.sections + 1, dtype=np.int64)
        np.add.at(cuts, inst.first[self.free], 1)
        np.add.at(cuts, inst.end[self.free] - 1, -1)
        self.cuts = np.cumsum(cuts)[: max(inst.sections - 1, 0)]
        self.nodes = 0
        self.node_limit = 0
        # Python lists are faster than numpy arrays to index one item at a time.
        self.size_l = inst.size.tolist()
        self.first_l = inst.first.tolist()
        self.end_l = inst.end.tolist()
        self.rank_l = rank.tolist()
        self.free_l = self.free.tolist()
        self.twins = [[u for u in inst.twins[b] if self.free_l[u]] for b in range(n)]

    def parts(self) -> list[tuple[np.ndarray, int, int]]:
        """Static decomposition: buffers (by rank) and section range of each independent part."""
        zero = np.flatnonzero(self.cuts == 0)
        bounds = [0, *(zero + 1).tolist(), self.inst.sections]
        everyone = np.argsort(self.rank, kind="stable")
        return [
            (sub, lo, hi)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=False)
            if (sub := self._within(everyone, lo, hi)).size
        ]

    def _within(self, buffers: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """The buffers of a part over sections [lo, hi): free ones starting there, pinned ones
        overlapping it."""
        first = self.inst.first[buffers]
        inside = (first >= lo) & (first < hi)
        pinned = ~self.free[buffers]
        if pinned.any():
            inside |= pinned & (first < hi) & (self.inst.end[buffers] > lo)
        return buffers[inside]

    # -- the search ---------------------------------------------------------------------------

    def solve_part(self, buffers: np.ndarray, lo: int, hi: int) -> int:
        """Search the part made of ``buffers`` (sorted by rank) over sections ``[lo, hi)``,
        split first where no free buffer crosses a boundary."""
        zero = np.flatnonzero(self.cuts[lo : max(hi - 1, lo)] == 0) + lo + 1
        if self.on_leaf is not None:
            zero = zero[:0]
        bounds = [lo, *zero.tolist(), hi]
        for slo, shi in zip(bounds[:-1], bounds[1:], strict=False):
            sub = self._within(buffers, slo, shi)
            if sub.size:
                status = self._node(sub, slo, shi, -1, -1)
                if status != FOUND:
                    return status
        return FOUND

    def _node(self, part: np.ndarray, lo: int, hi: int, o: int, last_rank: int) -> int:
        self.nodes += 1
        if self.nodes > self.node_limit:
            return ABORTED
        if (
            self.deadline is not None
            and (self.nodes & 31) == 0
            and time.perf_counter() > self.deadline
        ):
            return TIMEOUT
        m = self.mu[part]
        open_ = m < _INF
        if not open_.any():
            if self.on_leaf is not None:
                verdict = self.on_leaf(self.offset.copy())
                if verdict != FOUND:
                    return verdict
            self._record()
            return FOUND
        part = part[open_]
        m = m[open_]
        # The search below depends on nothing else (NOTE [ failed states ]); o and last_rank
        # matter only through the buffers at or below o.
        if int(m.min()) > o:
            o, last_rank = -1, -1
        # part is in rank order: the tie rule keeps the buffers from a position on.
        tie = int(np.count_nonzero(self.rank[part] <= last_rank)) if o >= 0 else -1
        key = (lo, hi, o, tie, part.tobytes(), m.tobytes())
        if key in self.failed:
            return NOT_FOUND
        status = self._branch(part, m, lo, hi, o, last_rank)
        if status == NOT_FOUND and self.on_leaf is None:
            self.failed.add(key)
        return status

    def _branch(
        self, part: np.ndarray, m: np.ndarray, lo: int, hi: int, o: int, last_rank: int
    ) -> int:
        inst = self.inst
        mu = self.mu
        capacity = self.capacity
        total = self.total
        size = inst.size[part]
        free = self.free[part]
        min_height = int((m + size)[free].min()) if free.any() else int(_INF)
        rank = self.rank[part]
        # Every section still needs its whole unplaced total above the new monotone floor.
        peak = int(total[lo:hi].max())
        ok = (
            (m < min_height)
            & (m + peak <= capacity)
            & (m <= self.maxm[part])
            & ((m > o) | ((m == o) & (rank > last_rank)))
        )
        if not ok.any():
            return NOT_FOUND
        cands = part[ok]
        cands = cands[np.argsort(m[ok], kind="stable")].tolist()
        p0, p1 = int(inst.start[lo]), int(inst.start[hi])
        seg = inst.start[lo:hi] - p0
        inc_part = inst.incidence[p0:p1]
        overlaps = inst.overlaps
        offset = self.offset
        size_l, rank_l, twins = self.size_l, self.rank_l, self.twins
        for b in cands:
            off = int(mu[b])
            sz = size_l[b]
            # NOTE [ stacked twins ]: b resting right on a twin of higher rank is the mirror of
            # a placement where the two swap, which the search reaches with b first.
            if twins[b] and any(
                offset[u] >= 0 and offset[u] + size_l[u] == off and rank_l[u] > rank_l[b]
                for u in twins[b]
            ):
                continue
            top = off + sz
            a, e = self.first_l[b], self.end_l[b]
            offset[b] = off
            mu[b] = _INF
            ov = overlaps[b]
            raised = ov[mu[ov] < top]
            old = mu[raised]
            mu[raised] = top
            total[a:e] -= sz
            status = NOT_FOUND
            if not (old.size and self._overflows(raised, top, lo, hi)):
                floor = np.minimum.reduceat(mu[inc_part], seg)
                np.maximum(floor, off, out=floor)
                tot = total[lo:hi]
                if not ((floor + tot > capacity) & (tot > 0)).any():
                    status = self._after(b, part, lo, hi, off, a, e)
            total[a:e] += sz
            mu[raised] = old
            mu[b] = off
            offset[b] = -1
            if status != NOT_FOUND:
                return status
        return NOT_FOUND

    def _rerank(
        self, sub: np.ndarray, lo: int, hi: int
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """NOTE [ residual preorders ]: sort a dynamic sub-part by the preorder's keys with T
        taken from the unplaced totals; its buffers keep their set of rank values."""
        if self.heuristic is None or sub.size < 2:
            return sub, None
        inst = self.inst
        first = np.maximum(inst.first[sub], lo)
        end = np.minimum(inst.end[sub], hi)
        total = self.total
        residual = np.array(
            [int(total[a:e].max()) for a, e in zip(first.tolist(), end.tolist(), strict=True)],
            dtype=np.int64,
        )
        width = inst.upper[sub] - inst.lower[sub]
        keys = {"W": width, "A": width * inst.size[sub], "T": residual, "Z": inst.size[sub]}
        letters = self.heuristic.rstrip("0123456789")
        old = self.rank[sub]
        order = np.lexsort((old,) + tuple(-keys[c] for c in reversed(letters)))
        new_sub = sub[order]
        values = np.sort(old)
        self.rank[new_sub] = values
        for b, v in zip(new_sub.tolist(), values.tolist(), strict=True):
            self.rank_l[b] = v
        return new_sub, (sub, old)

    def _restore(self, old: tuple[np.ndarray, np.ndarray]) -> None:
        sub, ranks = old
        self.rank[sub] = ranks
        for b, v in zip(sub.tolist(), ranks.tolist(), strict=True):
            self.rank_l[b] = v

    def _overflows(self, raised: np.ndarray, top: int, lo: int, hi: int) -> bool:
        """Whether a buffer of this part was raised beyond its largest minimum offset."""
        over = raised[top > self.maxm[raised]]
        if over.size == 0:
            return False
        # Buffers of other parts (after a split) are raised too, harmlessly: ignore them.
        return bool(((self.inst.first[over] < hi) & (self.inst.end[over] > lo)).any())

    def _record(self) -> None:
        placed = self.offset >= 0
        self.solution[placed] = self.offset[placed]

    def _after(self, b: int, part: np.ndarray, lo: int, hi: int, off: int, a: int, e: int) -> int:
        """Recurse after placing ``b``, splitting the rest where no unplaced buffer crosses."""
        if e - a <= 1 or not self.free_l[b] or self.on_leaf is not None:
            return self._node(part, lo, hi, off, self.rank_l[b])
        window = self.cuts[a : e - 1]
        window -= 1
        try:
            zero = np.flatnonzero(window == 0)
            if zero.size == 0:
                return self._node(part, lo, hi, off, self.rank_l[b])
            bounds = sorted({lo, hi, *(a + zero + 1).tolist()})
            rest = part[self.mu[part] < _INF]
            if rest.size == 0:
                self._record()
                return FOUND
            for slo, shi in zip(bounds[:-1], bounds[1:], strict=False):
                if slo < lo or shi > hi:
                    continue
                sub = self._within(rest, slo, shi)
                if sub.size == 0:
                    continue
                sub, old = self._rerank(sub, slo, shi)
                try:
                    status = self._node(sub, slo, shi, -1, -1)
                finally:
                    if old is not None:
                        self._restore(old)
                if status != FOUND:
                    return status
            return FOUND
        finally:
            window += 1


def _core(inst: Instance, buffers: np.ndarray, lo: int, hi: int, slack: int) -> np.ndarray:
    """The buffers of a part live in its tightest sections (total within ``slack`` of the max)."""
    totals = inst.section_total[lo:hi]
    tight = np.zeros(inst.sections + 1, dtype=np.int64)
    tight[lo:hi] = totals >= totals.max() - slack
    prefix = np.concatenate([[0], np.cumsum(tight)])
    hits = prefix[inst.end[buffers]] - prefix[inst.first[buffers]]
    return buffers[hits > 0]


class _Timeout(Exception):
    """The deadline passed inside a nested pinned-core search."""


def _progressive(
    inst: Instance,
    capacity: int,
    buffers: np.ndarray,
    lo: int,
    hi: int,
    rank: np.ndarray,
    deadline: float | None,
    stats: dict[str, int],
) -> tuple[int, np.ndarray | None]:
    """NOTE [ pinned cores ]: place the buffers of the tightest sections first, pin them.

    A core is the set of buffers live in sections within some slack of the part's peak (slacks
    growing from capacity/4096 until a core holds 90% of the part). Each core is placed alone (a
    small problem); each of its first ``_LEAVES`` placements is pinned and extended to the whole
    part, which then splits into independent pieces around the pins (NOTE [ decomposition ]).
    Every search runs under a node budget of ``_BUDGET`` per buffer. ``ABORTED`` when no core
    extends: pins need not extend to a full placement, so this proves nothing.
    """
    levels: list[np.ndarray] = []
    for slack in [
        capacity * k // 4096
        for k in (1, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048)
    ]:
        core = _core(inst, buffers, lo, hi, slack)
        if core.size > len(buffers) * 9 // 10:
            break
        if not levels or core.size > levels[-1].size:
            levels.append(core)
    levels.append(buffers)
    found: list[np.ndarray] = []
    order = np.argsort(rank[buffers], kind="stable")

    def extend(core: np.ndarray, solution: np.ndarray) -> int:
        """Pin ``core`` at ``solution`` and search the whole part (it splits around the pins)."""
        pins = np.full(inst.n, -1, dtype=np.int64)
        pins[core] = solution
        run = _Search(inst, capacity, rank, deadline, set(), pins)
        run.node_limit = _BUDGET * len(buffers)
        status = run.solve_part(buffers[order], lo, hi)
        stats["nodes"] = stats.get("nodes", 0) + run.nodes
        if status == FOUND:
            found.append(run.solution)
        return status

    for core in levels[:-1]:
        sub = Instance(inst.lower[core], inst.upper[core], inst.size[core])
        leaves = [0]

        def on_leaf(
            solution: np.ndarray, core: np.ndarray = core, leaves: list[int] = leaves
        ) -> int:
            leaves[0] += 1
            status = extend(core, solution)
            if status == TIMEOUT:
                raise _Timeout
            if status == FOUND:
                return FOUND
            return ABORTED if leaves[0] >= _LEAVES else NOT_FOUND

        run = _Search(sub, capacity, rank[core], deadline, set(), None, on_leaf)
        run.node_limit = _BUDGET * core.size
        try:
            status = run.solve_part(np.argsort(rank[core], kind="stable"), 0, sub.sections)
        except _Timeout:
            return TIMEOUT, None
        stats["nodes"] = stats.get("nodes", 0) + run.nodes
        if status == FOUND and found:
            return FOUND, found[-1]
        if status == TIMEOUT:
            return TIMEOUT, None
    return ABORTED, None


_LEAVES = 8
"""Placements of one core tried (pinned, extended to the whole part) before the next core."""
_BUDGET = 20
"""Node budget of each pinned-core search, per buffer."""


def _solve_part(
    inst: Instance,
    capacity: int,
    buffers: np.ndarray,
    lo: int,
    hi: int,
    ranks: list[np.ndarray],
    memos: list[set[tuple[object, ...]]],
    deadline: float | None,
    guide: bool,
    stats: dict[str, int],
    names: list[str | None] | None = None,
) -> tuple[int, np.ndarray | None]:
    """Solve one static part: NOTE [ pinned cores ] first, then NOTE [ restarts ]."""
    n = len(buffers)
    limit = max(n, 16)
    guided = not (guide and n >= 40)
    while True:
        limit *= 2
        if not guided and limit >= 16 * n:
            # After a few cheap rounds, NOTE [ pinned cores ]; then the rounds go on.
            guided = True
            for name in GUIDES:
                status, solution = _progressive(
                    inst, capacity, buffers, lo, hi, inst.preorder(name), deadline, stats
                )
                if status == FOUND:
                    return FOUND, solution
                if status == TIMEOUT:
                    return TIMEOUT, None
        for rank, memo, name in zip(ranks, memos, names or [None] * len(ranks), strict=True):
            run = _Search(inst, capacity, rank, deadline, memo)
            run.heuristic = name
            run.node_limit = limit
            status = run.solve_part(buffers[np.argsort(rank[buffers], kind="stable")], lo, hi)
            stats["nodes"] = stats.get("nodes", 0) + run.nodes
            if status == FOUND:
                return FOUND, run.solution
            if status in (NOT_FOUND, TIMEOUT):
                return status, None
            if stats.get("budget") is not None and stats["nodes"] > stats["budget"]:
                return ABORTED, None


def _solve_part_compiled(
    kernel: Kernel,
    inst: Instance,
    capacity: int,
    buffers: np.ndarray,
    lo: int,
    hi: int,
    memo: tuple[np.ndarray, np.ndarray],
    deadline: float | None,
    stats: dict[str, int],
    tight: bool = True,
) -> tuple[int, np.ndarray | None]:
    """Solve one static part with the compiled kernel (NOTE [ compiled restarts ]): with
    ``tight``, at the part's peak live load first, with a small node budget, when the capacity
    has slack; then at the capacity."""
    part_peak = int(inst.section_total[lo:hi].max()) if hi > lo else 0
    if tight and part_peak < capacity:
        tight = dict(stats, budget=stats.get("nodes", 0) + _TIGHT_BUDGET * len(buffers))
        if stats.get("budget") is not None:
            tight["budget"] = min(tight["budget"], stats["budget"])
        status, solution = _rotate(
            kernel, inst, part_peak, buffers, lo, hi, memo, deadline, tight, 1
        )
        stats["nodes"] = tight.get("nodes", 0)
        if status in (FOUND, TIMEOUT):
            return status, solution
    return _rotate(kernel, inst, capacity, buffers, lo, hi, memo, deadline, stats, 0)


_TIGHT_BUDGET = 8
"""Nodes per buffer of the search at the peak live load before the one at the capacity."""


def _rotate(
    kernel: Kernel,
    inst: Instance,
    capacity: int,
    buffers: np.ndarray,
    lo: int,
    hi: int,
    memo: tuple[np.ndarray, np.ndarray],
    deadline: float | None,
    stats: dict[str, int],
    salt: int,
) -> tuple[int, np.ndarray | None]:
    """The round robin of :data:`COMPILED_RUNS` at one capacity, the node limit doubling every
    round; ``salt`` keeps the memo's keys of different capacities apart."""
    from memplan.alloc import compiled

    runs = COMPILED_RUNS
    ranks = [inst.preorder(heuristic) for heuristic, _, _ in runs]
    scratch = compiled.Scratch.for_part(len(buffers), inst.n)
    limit = max(len(buffers), 16)
    while True:
        limit *= 2
        for index, ((heuristic, residual, twins), rank) in enumerate(zip(runs, ranks, strict=True)):
            budget = stats.get("budget")
            run_limit = limit
            if budget is not None:
                run_limit = min(limit, budget - stats.get("nodes", 0))
                if run_limit <= 0:
                    return ABORTED, None
            part = buffers[np.argsort(rank[buffers], kind="stable")]
            while True:
                ctx = compiled.make_ctx(
                    inst,
                    capacity,
                    rank,
                    heuristic,
                    residual,
                    2 * index + salt,
                    run_limit,
                    memo,
                    twins,
                    scratch,
                )
                status = compiled.call(kernel.run_part, (ctx, part, lo, hi), ctx, deadline)
                if status != compiled.OVERFLOW:
                    break
                scratch.grow()  # NOTE [ kernel work stack ]: run again with room to go deeper
            stats["nodes"] = stats.get("nodes", 0) + min(int(ctx.count[0]), run_limit)
            if status == FOUND:
                return FOUND, ctx.solution
            if status in (NOT_FOUND, TIMEOUT):
                return status, None


def search(
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    capacity: int,
    time_limit: float | None = None,
    on_progress: Callable[[str], None] | None = None,
    guide: bool = True,
    node_budget: int | None = None,
    preorders: tuple[str, ...] = PREORDERS,
    engine: str = "auto",
    tight: bool = True,
    graph: tuple[np.ndarray, np.ndarray] | None = None,
) -> SearchResult:
    """Find offsets with every buffer inside ``[0, capacity)``, or prove there are none.

    Buffers of size 0 get offset 0. ``time_limit`` (seconds) bounds the whole search; when it is
    hit the status is ``gave-up`` (so is running out of ``node_budget``, a cap on the nodes).
    ``engine`` is ``compiled`` (:mod:`memplan.alloc.kernel`, the native kernel of
    :mod:`memplan.alloc.compiled`), ``numpy`` (this module) or ``auto`` (compiled when the kernel
    is available and loads, or is built, in time); the
    compiled engine first tries each part at its own peak live load (``tight``, NOTE [ compiled
    restarts ]). ``graph``, when every size is positive, is the CSR of
    :func:`memplan.alloc.lifetimes.overlaps` (built here if not given). See the module's NOTEs
    for the algorithm.
    """
    started = time.perf_counter()
    deadline = None if time_limit is None else started + float(time_limit)
    lower = np.asarray(lower, dtype=np.int64)
    upper = np.asarray(upper, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    offsets = np.zeros(len(size), dtype=np.int64)
    keep = np.flatnonzero(size > 0)

    def result(status: str, placed: np.ndarray | None, nodes: int) -> SearchResult:
        return SearchResult(status, placed, nodes, time.perf_counter() - started)

    if keep.size and int(size[keep].max()) > capacity:
        return result("infeasible", None, 0)
    # Stacking every buffer always fits their total: a larger capacity changes nothing, and
    # keeps the sums of NOTE [ exact arithmetic ] (memplan/alloc/__init__.py) below 2^62.
    capacity = min(int(capacity), sum(size[keep].tolist()))
    if capacity > MAX_ARENA:
        raise ValueError(f"capacity {capacity}: above 2^61 bytes, too large to search exactly")
    pairs = count_overlaps(lower[keep], upper[keep])
    if pairs > SEARCH_PAIRS or count_incidences(lower[keep], upper[keep]) > SEARCH_PAIRS:
        return SearchResult(
            "gave-up",
            None,
            0,
            time.perf_counter() - started,
            f"found: too large for the exact search ({pairs} pairs of buffers live at the same "
            f"time)",
        )
    if len(keep) < len(size):
        graph = None
    inst = Instance(lower[keep], upper[keep], size[keep], graph)
    if deadline is not None and time.perf_counter() > deadline:
        return result("gave-up", None, 0)
    if inst.n and int(inst.section_total.max()) > capacity:
        return result("infeasible", None, 0)
    stats: dict[str, int] = {"budget": node_budget} if node_budget is not None else {}
    kernel = _engine(engine, deadline)
    if kernel is not None:
        memo = compiled_memo(inst.n)
        parts = _Search(inst, capacity, inst.preorder(preorders[0]), deadline, set()).parts()
        for k, (part, lo, hi) in enumerate(parts):
            status, solution = _solve_part_compiled(
                kernel, inst, capacity, part, lo, hi, memo, deadline, stats, tight
            )
            nodes = stats.get("nodes", 0)
            if status == NOT_FOUND:
                return result("infeasible", None, nodes)
            if status in (TIMEOUT, ABORTED) or solution is None:
                return result("gave-up", None, nodes)
            offsets[keep[part]] = solution[part]
            if on_progress is not None:
                on_progress(f"placed part {k + 1} of {len(parts)} ({len(part)} buffers)")
        return result("placed", offsets, stats.get("nodes", 0))
    # Each preorder twice in the round robin: plain, then with NOTE [ residual preorders ].
    runs = [(h, r) for h in preorders for r in ((None, h) if RESIDUAL else (None,))]
    names = [r for _, r in runs]
    ranks = [inst.preorder(h) for h, _ in runs]
    memos: list[set[tuple[object, ...]]] = [set() for _ in names]
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 6 * inst.n + 1000))
    try:
        parts = _Search(inst, capacity, ranks[0], deadline, set()).parts()
        for k, (part, lo, hi) in enumerate(parts):
            status, solution = _solve_part(
                inst, capacity, part, lo, hi, ranks, memos, deadline, guide, stats, names
            )
            nodes = stats.get("nodes", 0)
            if status == NOT_FOUND:
                return result("infeasible", None, nodes)
            if status in (TIMEOUT, ABORTED) or solution is None:
                return result("gave-up", None, nodes)
            offsets[keep[part]] = solution[part]
            if on_progress is not None:
                on_progress(f"placed part {k + 1} of {len(parts)} ({len(part)} buffers)")
    finally:
        sys.setrecursionlimit(old_limit)
    return result("placed", offsets, stats.get("nodes", 0))


def _engine(engine: str, deadline: float | None) -> Kernel | None:
    """The compiled kernel for ``engine``, or None for the numpy search."""
    from memplan.alloc import compiled

    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if engine == "numpy":
        return None
    if engine == "auto" and deadline is not None:
        now = time.perf_counter()
        deadline = now + (deadline - now) / 2  # half the time at most, as place() does
    kernel = compiled.load(None if engine == "compiled" else deadline)
    if kernel is None and engine == "compiled":
        why = compiled.load_error() or "it did not load"
        raise RuntimeError(f"the compiled allocation engine is not available: {why}")
    return kernel


def compiled_memo(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The failed-state table of one compiled search (NOTE [ compiled failed-state memo ])."""
    from memplan.alloc import compiled

    return compiled.memo_table(2**20 if n >= 64 else 2**12)
