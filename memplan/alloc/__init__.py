"""Offline memory allocation: give each buffer an offset so that buffers live at the same time
never share an address (``memplan alloc``; docs/alloc.md).

>>> from memplan.alloc import Buffers, place
>>> bufs = Buffers.from_rows([("a", 0, 2, 4), ("b", 1, 3, 4), ("c", 2, 4, 4)])
>>> p = place(bufs)
>>> p.status, p.arena, p.offsets.tolist()
('optimal', 8, [0, 4, 0])

The exact search (:mod:`memplan.alloc.search`) follows Moffitt's MiniMalloc (ASPLOS 2023); its
nodes, and the greedy first fit (:mod:`memplan.alloc.greedy`, an upper bound and a quick answer),
run in the compiled core (:mod:`memplan.core`, src/alloc.cpp). The checker
(:mod:`memplan.alloc.validate`) is independent of both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memplan.alloc.buffers import (
    MAX_ARENA,
    Buffers,
    BufferTable,
    format_buffers_csv,
    parse_buffers_csv,
    peak_live_load,
    read_buffers_csv,
)
from memplan.alloc.validate import Check, check_placement
from memplan.errors import InputError, InternalError

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


# NOTE [ exact arithmetic ]
# Sizes, times and offsets are int64. A CSV value is at most 2^60 (buffers.MAX_VALUE); place()
# computes the peak live load exactly (Python integers when the sizes add up to 2^62 or more)
# and refuses, as bad input, a peak above MAX_ARENA = 2^61: the arena would not fit in int64
# sums. Every capacity the search is given is then at most 2^61 (a larger one is lowered to
# the greedy arena, which the greedy keeps below 2^61 too), so every sum the solver forms (an
# offset plus a size, a minimum offset plus a section total) stays below 2^62: exact.

_VALIDATE_RESERVE = 0.05
"""Seconds kept at the end of the time limit for the final check, on top of twice what
the peak live load took to compute (the sorts of the check cost about that)."""


def place(
    buffers: Buffers,
    capacity: int | None = None,
    time_limit: float | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> Placement:
    """Place ``buffers`` within ``capacity`` bytes, or, without one, in the least arena.

    Both run the same search (NOTE [ one search for both questions ] in
    memplan/alloc/pipeline.py): a greedy first fit, then the arena is minimized between the peak
    live load (a lower bound) and the best guess by rounds of bisection, each probe a search under
    a node budget that grows every round, taking turns with a local repair
    (:func:`memplan.alloc.least.least_arena`); with a capacity it stops once a placement fits it
    or the search proves that none does. ``time_limit`` (seconds, None for no limit) bounds the
    whole call, the final check included; a search cut short reports ``gave-up`` (with a
    capacity) or the best arena found (without one). Every placement returned has been checked
    by the independent :func:`memplan.alloc.validate.check_placement`.

    Raises :class:`memplan.InputError` for a capacity that is not a non-negative integer, a time
    limit that is not a finite number >= 0, or a peak live load above 2^61 bytes (NOTE [ exact
    arithmetic ]).
    """
    from memplan.alloc.pipeline import search_placement

    started = time.perf_counter()
    capacity = _checked(capacity, time_limit)
    lower, upper, size = buffers.lower, buffers.upper, buffers.size
    peak = peak_live_load(lower, upper, size)
    # The final check sorts like the sweep of the peak, about twice over: keep twice that (the
    # load of the machine varies).
    reserve = _VALIDATE_RESERVE + 4 * (time.perf_counter() - started)
    deadline = None if time_limit is None else started + max(float(time_limit) - reserve, 0.0)

    def done(
        status: str, offsets: np.ndarray | None, lower_bound: int, message: str, nodes: int = 0
    ) -> Placement:
        arena = None
        if offsets is not None:
            check = check_placement(lower, upper, size, offsets, capacity, buffers.ids)
            if not check.valid:
                raise InternalError(f"alloc: the placement found is invalid: {check.violation}")
            arena = check.arena
        seconds = time.perf_counter() - started
        return Placement(
            status, offsets, arena, peak, lower_bound, capacity, seconds, nodes, message
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
    if peak > MAX_ARENA:
        raise InputError(
            f"{buffers.source}: size: the peak live load is {peak} bytes, more than 2^61: too "
            f"large to place exactly"
        )
    # Buffers of size 0 take no address: offset 0, left out of the greedy and the search.
    keep = np.flatnonzero(size > 0)
    found = search_placement(
        buffers.source,
        (lower[keep], upper[keep], size[keep]),
        peak,
        capacity,
        deadline,
        on_progress,
        started,
    )
    offsets = None
    if found.offsets is not None:
        offsets = np.zeros(len(size), dtype=np.int64)
        offsets[keep] = found.offsets
    return done(found.status, offsets, found.lower_bound, found.message, found.nodes)


def _checked(capacity: int | None, time_limit: float | None) -> int | None:
    """``capacity`` as an int (or None); :class:`memplan.InputError` for a capacity that is not a
    whole number of bytes >= 0 or a time limit that is not a finite number of seconds >= 0.
    """
    if time_limit is not None and (
        isinstance(time_limit, bool) or not math.isfinite(time_limit) or time_limit < 0
    ):
        raise InputError(f"time limit {time_limit!r}: expected a finite number of seconds >= 0")
    if capacity is not None and (
        isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 0
    ):
        raise InputError(f"capacity {capacity!r}: expected a whole number of bytes >= 0")
    return None if capacity is None else int(capacity)
