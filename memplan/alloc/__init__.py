"""Offline memory allocation: give each buffer an offset so that buffers live at the same time
never share an address (``memplan alloc``; docs/alloc.md).

>>> from memplan.alloc import Buffers, place
>>> bufs = Buffers.from_rows([("a", 0, 2, 4), ("b", 1, 3, 4), ("c", 2, 4, 4)])
>>> p = place(bufs)
>>> p.status, p.arena, p.offsets.tolist()
('optimal', 8, [0, 4, 0])

The exact search (:mod:`memplan.alloc.search`) follows Moffitt's MiniMalloc (ASPLOS 2023); the
checker (:mod:`memplan.alloc.validate`) is independent of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memplan.alloc.buffers import (
    Buffers,
    BufferTable,
    format_buffers_csv,
    parse_buffers_csv,
    peak_live_load,
    read_buffers_csv,
)
from memplan.alloc.validate import Check, check_placement
from memplan.errors import InternalError

__all__ = [
    "BufferTable",
    "Buffers",
    "Check",
    "Placement",
    "check_placement",
    "format_buffers_csv",
    "parse_buffers_csv",
    "peak_live_load",
    "place",
    "read_buffers_csv",
]


@dataclass(frozen=True)
class Placement:
    """What :func:`place` found.

    ``status`` is ``optimal`` (the arena is the least possible: without a capacity, proven
    minimal), ``placed`` (every buffer fits: within the capacity, or without one an arena not
    proven minimal), ``infeasible`` (proven: no placement fits the capacity) or ``gave-up`` (the
    time limit ran out before a placement within the capacity was found). ``offsets`` is None
    unless placed; ``arena`` is the highest ``offset + size`` of the offsets; ``peak`` the peak
    live load (a lower bound on every arena); ``lower_bound`` the best proven lower bound.
    """

    status: str
    offsets: np.ndarray | None
    arena: int | None
    peak: int
    lower_bound: int
    capacity: int | None
    seconds: float
    nodes: int
    message: str

    @property
    def placed(self) -> bool:
        return self.offsets is not None


def _arena(offsets: np.ndarray, size: np.ndarray) -> int:
    return int((offsets + size).max(initial=0))


def place(
    buffers: Buffers,
    capacity: int | None = None,
    time_limit: float | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> Placement:
    """Place ``buffers`` within ``capacity`` bytes, or, without one, in the least arena.

    With a capacity: a greedy first fit is tried first; when it does not fit, the exact search
    (:func:`memplan.alloc.search.search`) finds a placement or proves there is none. Without one:
    the arena is minimized between the peak live load (a lower bound) and the greedy arena, by the
    exact search at the lower bound and then by bisection. ``time_limit`` (seconds, None for no
    limit) bounds the whole call; a search cut short reports ``gave-up`` (with a capacity) or the
    best arena found (without one). Every placement returned has been checked by the independent
    :func:`memplan.alloc.validate.check_placement`.
    """
    from memplan.alloc.greedy import best_greedy
    from memplan.alloc.search import search

    started = time.perf_counter()
    deadline = None if time_limit is None else started + float(time_limit)
    lower, upper, size = buffers.lower, buffers.upper, buffers.size
    peak = peak_live_load(lower, upper, size)
    nodes = 0

    def left() -> float | None:
        return None if deadline is None else max(deadline - time.perf_counter(), 0.0)

    def done(status: str, offsets: np.ndarray | None, lower_bound: int, message: str) -> Placement:
        arena = None
        if offsets is not None:
            check = check_placement(lower, upper, size, offsets, capacity, buffers.ids)
            if not check.valid:
                raise InternalError(f"alloc: the placement found is invalid: {check.violation}")
            arena = check.arena
        return Placement(
            status,
            offsets,
            arena,
            peak,
            lower_bound,
            capacity,
            time.perf_counter() - started,
            nodes,
            message,
        )

    if len(buffers) == 0:
        return done("optimal", np.zeros(0, dtype=np.int64), 0, "no buffers")
    if capacity is not None and peak > capacity:
        return done(
            "infeasible",
            None,
            peak,
            f"the capacity {capacity} is below the peak live load {peak}",
        )
    greedy = best_greedy(lower, upper, size)
    greedy_arena = _arena(greedy, size)
    if capacity is not None:
        if greedy_arena <= capacity:
            status = "optimal" if greedy_arena == peak else "placed"
            return done(status, greedy, peak, "placed by greedy first fit")
        result = search(lower, upper, size, capacity, left(), on_progress)
        nodes += result.nodes
        if result.status == "placed":
            assert result.offsets is not None
            return done("placed", result.offsets, peak, f"placed by search ({result.nodes} nodes)")
        if result.status == "infeasible":
            return done(
                "infeasible",
                None,
                capacity + 1,
                f"no placement fits the capacity {capacity} (proven by exhaustive search; "
                f"peak live load {peak})",
            )
        return done(
            "gave-up",
            None,
            peak,
            f"no placement within the capacity {capacity} found in the time limit (not proven "
            f"infeasible; peak live load {peak}, greedy first fit needs {greedy_arena})",
        )
    # Minimize the arena: lo is a proven lower bound, best the best placement found.
    best, lo, hi = greedy, peak, greedy_arena
    probe = peak
    while lo < hi:
        result = search(lower, upper, size, probe, left(), on_progress)
        nodes += result.nodes
        if result.status == "placed":
            assert result.offsets is not None
            best, hi = result.offsets, _arena(result.offsets, size)
        elif result.status == "infeasible":
            lo = probe + 1
        else:
            break
        if on_progress is not None:
            on_progress(f"arena between {lo} and {hi}")
        probe = (lo + hi) // 2
    if lo >= hi:
        return done("optimal", best, hi, f"least arena {hi} (peak live load {peak})")
    return done(
        "placed",
        best,
        lo,
        f"arena {hi} found; least arena not proven (at least {lo}) within the time limit",
    )
