"""Exact offline memory allocation: a branch-and-bound over canonical placements.

The search follows the ideas of Moffitt, *MiniMalloc: A Lightweight Memory Allocator for
Hardware-Accelerated Machine Learning* (ASPLOS 2023), written anew; its nodes run in the compiled
core (src/alloc.cpp, through :mod:`memplan.core`), one call per independent part, with the GIL
released. This module builds the instance's static data (:class:`memplan.alloc.instance.Instance`),
splits it into parts and reads the results. Its rules:

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
does, the search runs round-robin over several preorders (by width, area and section total, in
three orders; NOTE [ compiled restarts ]) with a node budget that doubles every round, so one
unlucky order does not stall it. A complete run (no budget hit) that finds nothing proves the
capacity infeasible.

NOTE [ residual preorders ]
As MiniMalloc does when it solves a sub-partition, a part that dynamic decomposition splits off is
searched under its own preorder: the same keys, with T taken from the sections' *unplaced* totals
at the split (its buffers keep their set of rank values, so the failed-state memo stays sound: its
key holds the part in rank order and the tie rule as a position in it). The ranks come back when
the part is done.

NOTE [ failed states ]
The subtree below a node depends only on the unplaced buffers of its part, their minimum offsets,
the last offset and rank (which matter only when some minimum offset is at or below the last
offset). A subtree searched to the end without success records that key; meeting it again (from
another order of earlier placements, or in a later round of the same preorder) prunes at once.

NOTE [ stacked twins ]
Two buffers with the same lifetime, one right on top of the other, can swap places without
touching anything else; only the order with the buffer earlier in the preorder below is searched.

NOTE [ compiled restarts ]
The round robin is of six runs: MiniMalloc's three preorders TWA, TAW, WAT, each once plain with
the stacked-twin rule and once with residual preorders (MiniMalloc's SubSolve) without it. The twin rule is sound but changes which of two mirrored placements is met first:
on MiniMalloc's instance H it turns 1,290 nodes into more than 60,000, on B and C it saves 60%.
The node limit doubles every round, from twice the part's size. When the capacity has slack over
the part's peak live load, the round robin first runs at the peak, for at most 8 nodes per
buffer: a tight problem prunes far more (instance C: 1,017 nodes at its peak, 24,583 at 1 MiB),
and a placement within the peak fits the capacity.

The failed states are kept as two 64-bit hashes in a fixed table (NOTE [ compiled failed-state
memo ] in src/alloc.cpp); MiniMalloc's hatless pruning is applied too (src/alloc.cpp).

Complexity: exponential in the worst case (the decision problem is strongly NP-complete); each
node costs O(n) plus the sections touched by the placement, for n buffers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memplan.alloc.buffers import MAX_ARENA
from memplan.alloc.engine import FOUND, NOT_FOUND, PREORDERS, PartSearch

__all__ = ["PREORDERS", "SearchResult", "search"]


@dataclass
class SearchResult:
    """Outcome of one feasibility search at a fixed capacity."""

    status: str
    """``placed``, ``infeasible`` (proven) or ``gave-up`` (time limit or node budget)."""
    offsets: np.ndarray | None
    nodes: int
    seconds: float


def search(
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    capacity: int,
    time_limit: float | None = None,
    on_progress: Callable[[str], None] | None = None,
    node_budget: int | None = None,
    tight: bool = True,
    graph: tuple[np.ndarray, np.ndarray] | None = None,
    engine: PartSearch | None = None,
) -> SearchResult:
    """Find offsets with every buffer inside ``[0, capacity)``, or prove there are none.

    Buffers of size 0 get offset 0. ``time_limit`` (seconds) bounds the whole search; when it is
    hit the status is ``gave-up`` (so is running out of ``node_budget``, a cap on the nodes). Each
    part is first tried at its own peak live load when ``tight`` (NOTE [ compiled restarts ]).
    ``graph``, when every size is positive, is the CSR of :func:`memplan.alloc.lifetimes.overlaps`
    (built here if needed and not given); ``engine``, the :class:`PartSearch` of the buffers of
    positive size, when already built. See the module's NOTEs for the algorithm.
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
    if engine is None:
        engine = PartSearch(
            lower[keep], upper[keep], size[keep], graph if len(keep) == len(size) else None
        )
    if deadline is not None and time.perf_counter() > deadline:
        return result("gave-up", None, 0)
    if engine.section_peak > capacity:
        return result("infeasible", None, 0)
    nodes = 0
    for k, part in enumerate(engine.parts):
        left = None if deadline is None else max(deadline - time.perf_counter(), 0.0)
        status, nodes, solution = engine.solve(part, capacity, node_budget, nodes, tight, left)
        if status == NOT_FOUND:
            return result("infeasible", None, nodes)
        if status != FOUND:
            return result("gave-up", None, nodes)
        assert solution is not None
        offsets[keep[part.buffers]] = solution
        if on_progress is not None and len(engine.parts) > 1:
            on_progress(f"placed part {k + 1} of {len(engine.parts)} ({len(part.buffers)} buffers)")
    return result("placed", offsets, nodes)
