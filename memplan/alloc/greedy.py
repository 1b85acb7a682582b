"""Greedy placements: an upper bound on the arena and a quick answer when it fits.

Each buffer, in a fixed order (largest first, the usual "greedy by size" of TFLite and OLLA's
baseline, and three more: :func:`best_greedy`), goes at the lowest address where it meets none of the buffers already placed that are
live at the same time (first fit). The first fit is *anytime*: at its deadline the buffers not
yet placed are stacked above everything placed so far (a valid placement, only a worse one), so
it always returns within its time limit.
"""

from __future__ import annotations

import time

import numpy as np

from memplan.alloc.buffers import MAX_ARENA
from memplan.alloc.instance import largest_section_total
from memplan.alloc.lifetimes import overlaps_in_time
from memplan.core import kernels

__all__ = ["ArenaTooLarge", "best_greedy", "first_fit"]


class ArenaTooLarge(ValueError):
    """A greedy placement would need an arena above ``MAX_ARENA`` (2^61 bytes)."""


def first_fit(
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    order: np.ndarray,
    deadline: float | None = None,
    graph: tuple[np.ndarray, np.ndarray] | None = None,
    fixed: np.ndarray | None = None,
    best_fit: bool = False,
) -> np.ndarray:
    """Offsets from placing the buffers in ``order``, each at its lowest free address (with
    ``best_fit``: in the smallest gap that fits, the lowest of equal ones, as TFLite's greedy by
    size does; on top when none does).

    ``fixed`` holds the offsets of buffers placed beforehand (-1 for the others): the others go
    around them, and those of ``order`` are skipped. Run by the compiled core (src/alloc.cpp):
    O(Q log Q) for Q pairs of buffers live at the same time with ``graph`` (the CSR of
    :func:`memplan.alloc.lifetimes.overlaps`); without it the core finds them in an index of the
    lifetimes by length class (src/alloc_repair.hpp), about as fast. At ``deadline`` the rest
    are stacked above the arena. Raises :class:`ArenaTooLarge` when the arena would pass
    ``MAX_ARENA``.
    """
    left = -1.0 if deadline is None else max(deadline - time.perf_counter(), 0.0)
    starts, buf = graph if graph is not None else (None, None)
    done, offsets = kernels.alloc_first_fit(
        np.ascontiguousarray(lower, dtype=np.int64),
        np.ascontiguousarray(upper, dtype=np.int64),
        np.ascontiguousarray(size, dtype=np.int64),
        np.ascontiguousarray(order, dtype=np.int64),
        starts,
        buf,
        MAX_ARENA,
        left,
        None if fixed is None else np.ascontiguousarray(fixed, dtype=np.int64),
        best_fit,
    )
    if done < 0:
        raise ArenaTooLarge(MAX_ARENA + 1)
    rest = order[done:]
    rest = rest[(size[rest] > 0) & (offsets[rest] < 0)]
    if rest.size:  # stopped at the deadline: the rest stacked above everything placed
        placed = offsets >= 0
        arena = int((offsets[placed] + size[placed]).max(initial=0))
        tops = arena + np.cumsum(size[rest])
        if int(tops[-1]) > MAX_ARENA:
            raise ArenaTooLarge(int(tops[-1]))
        offsets[rest] = tops - size[rest]
    offsets[offsets < 0] = 0
    return offsets


def best_greedy(
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    deadline: float | None = None,
    graph: tuple[np.ndarray, np.ndarray] | None | bool = True,
    floor: int = 0,
) -> np.ndarray:
    """The best of first fits in four orders, descending: by size (then lifetime); by the
    largest section total, lifetime and area (MiniMalloc's preorder TWA); by section total, area
    and lifetime (TAW); by area (size x lifetime). After the first, an order runs only when it
    is expected to end before ``deadline`` (it takes as long as the last one did) and the best
    arena is above ``floor`` (a lower bound, or a capacity met). ``graph`` is the CSR of
    :func:`memplan.alloc.lifetimes.overlaps`, None for none, True (the default) to build it when
    time allows.

    No order is best everywhere (as omnimalloc's portfolio of first fits shows): 10,000 random
    buffers, by size +6.48% over the peak live load, TAW +3.55%; 100,000, by size +7.95%, TWA
    +7.55%; a 28,526-buffer compiler trace (IOPDDL's S_1), by size +2.93%, TAW +35.8%.
    """
    keep = size > 0
    if deadline is not None and time.perf_counter() >= deadline:
        return np.where(keep, np.cumsum(size) - size, 0)  # no time: everything stacked
    if graph is True:
        graph = overlaps_in_time(lower, upper, deadline)
    assert graph is None or isinstance(graph, tuple)
    width = upper - lower
    index = np.arange(len(size))
    area = width.astype(np.float64) * size.astype(np.float64)
    total = largest_section_total(lower, upper, size)
    orders = (
        (index, -width, -size),
        (index, -area, -width, -total),
        (index, -width, -area, -total),
        (index, -size, -area),
    )
    best: np.ndarray | None = None
    top = 0
    for keys in orders:
        started = time.perf_counter()
        offsets = first_fit(lower, upper, size, np.lexsort(keys), deadline, graph)
        offsets[~keep] = 0
        arena = int((offsets + size).max(initial=0))
        if best is None or arena < top:
            best, top = offsets, arena
        took = time.perf_counter() - started
        if top <= floor or (deadline is not None and time.perf_counter() + took > deadline):
            break
    assert best is not None
    return best
