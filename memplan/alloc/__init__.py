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

# NOTE [ capacity at scale ]
# With a capacity, an instance for the skyline search (more than SKYLINE_BUFFERS buffers) that
# the greedy first fit does not place goes first to the least arena's first guess (the skyline
# search's descents, memplan.alloc.least.first_guess; they place compiler traces at their peak)
# for at most a FIRST_SHARE of the time left, then to the repair (memplan.alloc.repair) from the
# better of it and the first fit, for a REPAIR_SHARE of what is left (it stops once the arena
# is within the capacity; without a time limit, REPAIR_MOVES moves per buffer), then to the
# search with the rest (it alone proves a capacity infeasible).
FIRST_SHARE = 0.25
REPAIR_SHARE = 0.5
REPAIR_MOVES = 50
"""Without a time limit the repair makes this many moves per buffer (it cannot prove anything)."""
FIRST_GUESS_SHARE = 0.5
"""Without a capacity: the share of the time left that the first guess of an instance for the
skyline search may take."""

_VALIDATE_RESERVE = 0.05
"""Seconds kept at the end of the time limit for the final check, on top of twice what
the peak live load took to compute (the sorts of the check cost about that)."""


def place(  # noqa: C901 - checks, greedy, search or least arena, in order
    buffers: Buffers,
    capacity: int | None = None,
    time_limit: float | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> Placement:
    """Place ``buffers`` within ``capacity`` bytes, or, without one, in the least arena.

    With a capacity: a greedy first fit is tried first; when it does not fit, the exact search
    (:func:`memplan.alloc.search.search`) finds a placement or proves there is none. Without one:
    the arena is minimized between the peak live load (a lower bound) and the greedy arena by
    rounds of bisection, each probe a search under a node budget that grows every round
    (:func:`_least_arena`). ``time_limit`` (seconds, None for no limit) bounds the whole call,
    the final check included; a search cut short reports ``gave-up`` (with a capacity) or the
    best arena found (without one). Every placement returned has been checked by the independent
    :func:`memplan.alloc.validate.check_placement`.

    Raises :class:`memplan.InputError` for a capacity that is not a non-negative integer, a time
    limit that is not a finite number >= 0, or a peak live load above 2^61 bytes (NOTE [ exact
    arithmetic ]).
    """
    from memplan.alloc.engine import PartSearch, uses_skyline
    from memplan.alloc.least import first_guess, least_arena
    from memplan.alloc.lifetimes import overlaps_in_time
    from memplan.alloc.repair import Repair
    from memplan.alloc.search import search

    started = time.perf_counter()
    if time_limit is not None and (
        isinstance(time_limit, bool) or not math.isfinite(time_limit) or time_limit < 0
    ):
        raise InputError(f"time limit {time_limit!r}: expected a finite number of seconds >= 0")
    if capacity is not None and (
        isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 0
    ):
        raise InputError(f"capacity {capacity!r}: expected a whole number of bytes >= 0")
    capacity = None if capacity is None else int(capacity)
    lower, upper, size = buffers.lower, buffers.upper, buffers.size
    peak = peak_live_load(lower, upper, size)
    # The final check sorts like the sweep of the peak, about twice over: keep twice that (the
    # load of the machine varies).
    reserve = _VALIDATE_RESERVE + 4 * (time.perf_counter() - started)
    deadline = None if time_limit is None else started + max(float(time_limit) - reserve, 0.0)
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
    if peak > MAX_ARENA:
        raise InputError(
            f"{buffers.source}: size: the peak live load is {peak} bytes, more than 2^61: too "
            f"large to place exactly"
        )
    # Buffers of size 0 take no address: offset 0, left out of the greedy and the search.
    keep = np.flatnonzero(size > 0)
    lower_k, upper_k, size_k = lower[keep], upper[keep], size[keep]

    def spread(offsets_k: np.ndarray) -> np.ndarray:
        offsets = np.zeros(len(size), dtype=np.int64)
        offsets[keep] = offsets_k
        return offsets

    if capacity is not None:
        large = uses_skyline(lower_k, upper_k)
        # A greedy first fit, then the search (NOTE [ compiled restarts ]). On instances for the
        # skyline search the greedy has half the time left (anytime: what it has not
        # placed then is stacked on top), the search's own descents being its other greedy: they
        # place compiler traces near their peak, but take 100 s on 50,000 nested lifetimes,
        # which the first fit places within 1.02x their peak in about 5 s of CPU.
        graph = overlaps_in_time(lower_k, upper_k, deadline)
        share = deadline
        if large and deadline is not None:
            share = time.perf_counter() + max(deadline - time.perf_counter(), 0.0) / 2
        greedy = _greedy(buffers.source, lower_k, upper_k, size_k, share, graph, capacity)
        greedy_arena = _arena(greedy, size_k)
        if greedy_arena <= capacity:
            status = "optimal" if greedy_arena == peak else "placed"
            return done(status, spread(greedy), peak, "placed by greedy first fit")
        greedy_note = f", greedy first fit needs {greedy_arena}"
        engine = PartSearch(lower_k, upper_k, size_k, graph, skyline=large)
        if large:
            # NOTE [ capacity at scale ]: the descents, the repair, then the search.
            remaining = left()
            share = None if remaining is None else time.perf_counter() + FIRST_SHARE * remaining
            start = first_guess(engine, lower_k, upper_k, size_k, share, graph, greedy)
            if start is None or _arena(start, size_k) > greedy_arena:
                start = greedy
            elif _arena(start, size_k) <= capacity:
                return done("placed", spread(start), peak, "placed by a descent of the search")
            step = math.gcd(*size_k.tolist())
            repair = Repair(lower_k, upper_k, size_k, start, step)
            seconds = _share(left(), REPAIR_SHARE)
            moves = None if seconds is not None else REPAIR_MOVES * len(size_k)
            if repair.run(capacity, seconds, moves) <= capacity:
                return done(
                    "placed",
                    spread(repair.best()),
                    peak,
                    f"placed by ruin and recreate from the greedy first fit ({repair.moves} moves)",
                )
            greedy_note += f", ruin and recreate {repair.best_arena}"
        result = search(
            lower_k,
            upper_k,
            size_k,
            capacity,
            left(),
            on_progress,
            tight=not large,
            engine=engine,
        )
        nodes += result.nodes
        if result.status == "placed":
            assert result.offsets is not None
            return done(
                "placed", spread(result.offsets), peak, f"placed by search ({result.nodes} nodes)"
            )
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
            f"infeasible; peak live load {peak}{greedy_note})",
        )
    # The list of buffers live at the same time, when small enough to build in time: the compiled
    # search reads it, and the greedy first fit (a first guess on large instances too) takes
    # O(pairs) with it instead of O(n^2) (main's first fit placed 10,000 short-lived buffers at
    # their peak in 2 s of CPU; without the list it did not finish within its share of 20 s).
    graph = overlaps_in_time(lower_k, upper_k, deadline)
    large = uses_skyline(lower_k, upper_k, least=True)
    greedy_first: np.ndarray | None = None
    if large:
        # The first fit first, with the whole time (anytime; without the list of overlaps the
        # core finds the buffers live at the same time in an index of the lifetimes: 50,000
        # random buffers in 1.5 s of CPU for both orders), before the skyline search's tables
        # are built (memplan.alloc.least.first_guess): a placement whatever the time allows.
        greedy_first = _greedy(buffers.source, lower_k, upper_k, size_k, deadline, graph, peak)
    # Then the descents, for a share of the time left: the rest goes to improving the best guess
    # (memplan.alloc.least.least_arena), where the repair gains more per second than further
    # descents (50,000 random buffers: the first guess took all of 30 s and came within 2.75%
    # of the peak; the repair took that to +2.38% in 2 s).
    remaining = left()
    guess_deadline = (
        None if remaining is None else time.perf_counter() + FIRST_GUESS_SHARE * remaining
    )
    engine = PartSearch(lower_k, upper_k, size_k, graph, skyline=large)
    first = first_guess(engine, lower_k, upper_k, size_k, guess_deadline, graph, greedy_first)
    if first is None:
        first = _greedy(buffers.source, lower_k, upper_k, size_k, deadline, graph)
    best, lo, hi, nodes = least_arena(
        engine, lower_k, upper_k, size_k, first, peak, left, on_progress, started
    )
    if lo >= hi:
        return done("optimal", spread(best), hi, f"least arena {hi} (peak live load {peak})")
    return done(
        "placed",
        spread(best),
        lo,
        f"arena {hi} found; least arena not proven (at least {lo}) within the time limit",
    )


def _share(seconds: float | None, share: float) -> float | None:
    return None if seconds is None else share * seconds


def _greedy(
    source: str,
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    deadline: float | None,
    graph: tuple[np.ndarray, np.ndarray] | None,
    floor: int = 0,
) -> np.ndarray:
    """:func:`memplan.alloc.greedy.best_greedy`; an arena above 2^61 is bad input."""
    from memplan.alloc.greedy import ArenaTooLarge, best_greedy

    try:
        return best_greedy(lower, upper, size, deadline, graph, floor)
    except ArenaTooLarge:
        raise InputError(
            f"{source}: size: a placement would need an arena above 2^61 bytes: too large to "
            f"place exactly"
        ) from None


def _arena(offsets: np.ndarray, size: np.ndarray) -> int:
    return int((offsets + size).max(initial=0))
