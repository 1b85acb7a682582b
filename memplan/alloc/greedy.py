"""Greedy placements: an upper bound on the arena and a quick answer when it fits.

Each buffer, in a fixed order (largest first, the usual "greedy by size" of TFLite and OLLA's
baseline), goes at the lowest address where it meets none of the buffers already placed that are
live at the same time (first fit). The first fit is *anytime*: at its deadline the buffers not
yet placed are stacked above everything placed so far (a valid placement, only a worse one), so
it always returns within its time limit.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from memplan.alloc.buffers import MAX_ARENA
from memplan.alloc.lifetimes import overlaps_in_time

if TYPE_CHECKING:
    from memplan.alloc.compiled import Kernel


class ArenaTooLarge(ValueError):
    """A greedy placement would need an arena above ``MAX_ARENA`` (2^61 bytes)."""


def first_fit(
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    order: np.ndarray,
    deadline: float | None = None,
    graph: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Offsets from placing the buffers in ``order``, each at its lowest free address.

    O(Q log Q) for Q pairs of buffers live at the same time, with ``graph`` (the CSR of
    :func:`memplan.alloc.lifetimes.overlaps`); without it, O(n) numpy work per buffer. At
    ``deadline`` the rest are stacked above the arena. Raises :class:`ArenaTooLarge` when the
    arena would pass ``MAX_ARENA``.
    """
    n = len(size)
    offsets = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    # Python lists: a few dozen neighbours per buffer are faster to scan than to hand to numpy.
    off_l = [0] * n
    top_l = [-1] * n  # -1 until placed (a placed buffer of size > 0 has top >= 1)
    size_l = size.tolist()
    arena = 0
    todo = order.tolist()
    if graph is not None:
        start_l = graph[0].tolist()
        buf = graph[1]
    for k, b in enumerate(todo):
        if deadline is not None and (k & 63) == 0 and time.perf_counter() > deadline:
            rest = order[k:]
            rest = rest[size[rest] > 0]
            if rest.size:
                tops = arena + np.cumsum(size[rest])
                if int(tops[-1]) > MAX_ARENA:
                    raise ArenaTooLarge(int(tops[-1]))
                offsets[rest] = tops - size[rest]
            break
        sz = size_l[b]
        if sz <= 0:
            continue
        if graph is not None:
            near = buf[start_l[b] : start_l[b + 1]].tolist()
            spans = sorted((off_l[u], top_l[u]) for u in near if top_l[u] >= 0)
        else:
            others = np.flatnonzero(placed & (lower < upper[b]) & (lower[b] < upper)).tolist()
            spans = sorted((off_l[u], top_l[u]) for u in others)
        x = 0
        for s0, e0 in spans:
            if s0 >= x + sz:
                break
            if e0 > x:
                x = e0
        if x + sz > MAX_ARENA:
            raise ArenaTooLarge(x + sz)
        off_l[b] = x
        top_l[b] = x + sz
        placed[b] = True
        arena = max(arena, x + sz)
    done = np.array(top_l) >= 0
    offsets[done] = np.array(off_l, dtype=np.int64)[done]
    return offsets


def _first_fit_compiled(
    kernel: Kernel,
    size: np.ndarray,
    order: np.ndarray,
    deadline: float | None,
    graph: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """:func:`first_fit` by :func:`memplan.alloc.kernel.first_fit` (same placement)."""
    from memplan.alloc.compiled import call_stoppable

    offsets = np.full(len(size), -1, dtype=np.int64)
    stop = np.zeros(1, dtype=np.int64)
    done = call_stoppable(
        kernel.first_fit,
        (size, order, graph[0], graph[1], offsets, MAX_ARENA, stop),
        stop,
        deadline,
    )
    if done < -1:  # -2: the call was left behind at the deadline
        done = 0
        offsets[:] = -1
    elif done < 0 and stop[0] == 0:
        raise ArenaTooLarge(MAX_ARENA + 1)
    rest = order[max(done, 0) :]
    rest = rest[size[rest] > 0]
    if rest.size:
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
    kernel: Kernel | None = None,
    graph: tuple[np.ndarray, np.ndarray] | None | bool = True,
) -> np.ndarray:
    """The best of first fit by size (then lifetime) and by area (size x lifetime), descending;
    the second only when the first finished before ``deadline``. ``kernel`` (the compiled
    module, :mod:`memplan.alloc.kernel`) runs the first fits compiled; ``graph`` is the CSR of
    :func:`memplan.alloc.lifetimes.overlaps`, None for none, True (the default) to build it when
    time allows."""
    keep = size > 0
    if deadline is not None and time.perf_counter() >= deadline:
        return np.where(keep, np.cumsum(size) - size, 0)  # no time: everything stacked
    if graph is True:
        graph = overlaps_in_time(lower, upper, deadline)
    assert graph is None or isinstance(graph, tuple)
    width = upper - lower
    index = np.arange(len(size))
    best: np.ndarray | None = None
    area = width.astype(np.float64) * size.astype(np.float64)
    for keys in ((index, -width, -size), (index, -size, -area)):
        if best is not None and deadline is not None and time.perf_counter() > deadline:
            break
        order = np.lexsort(keys)
        if kernel is not None and graph is not None:
            offsets = _first_fit_compiled(kernel, size, order, deadline, graph)
        else:
            offsets = first_fit(lower, upper, size, order, deadline, graph)
        offsets[~keep] = 0
        if best is None or int((offsets + size).max(initial=0)) < int((best + size).max(initial=0)):
            best = offsets
    assert best is not None
    return best
