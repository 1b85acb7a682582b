"""The one path of :func:`memplan.alloc.place` from the lists to an answer, for both of its
questions: the least arena, and a placement within a capacity.

NOTE [ one search for both questions ]
A placement within a capacity C is one whose arena is at most C: whatever the least-arena search
finds at or under C answers the capacity question. So both questions run the same steps, with
the same engine (:func:`memplan.alloc.engine.uses_skyline` with ``least``: the compiled search
wherever its lists fit): the greedy first fit; on instances for the skyline search its descents
(:func:`memplan.alloc.least.first_guess`); then the rounds of bisection and the repair's turns of
:func:`memplan.alloc.least.least_arena`. With a capacity, C is the goal of that search (NOTE
[ least arena with a goal ]): it stops as soon as a placement fits C or a lower bound passes it,
its probes above C are left out (they cannot answer), the probe at C is the exact search at the
capacity (which alone proves a capacity infeasible; its failed-state memo kept from round to
round) and the repair aims at C. One step is the capacity's own: on more than 2,000 buffers for
the compiled search, the skyline search's descents first have a quarter of the time (cheap, they
place short-lived buffers at their peak before the compiled search's lists are built). Before,
the capacity question had a path of its own (from 2,000 buffers on the skyline search's
descents, the repair, then the exact search at C), which missed what the least arena found: on
2,500 short-lived buffers at their peak it gave up after 60 s, where the least arena places them
in 0.4 s of CPU (tests/alloc/test_search.py; docs/alloc.md has more figures).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memplan.alloc import engine  # its names read at each call (a patched uses_skyline holds)
from memplan.alloc.greedy import ArenaTooLarge, best_greedy
from memplan.alloc.least import first_guess, least_arena
from memplan.alloc.lifetimes import overlaps_in_time
from memplan.errors import InputError

__all__ = ["DESCENT_SHARE", "FIRST_GUESS_SHARE", "Found", "search_placement"]

FIRST_GUESS_SHARE = 0.5
"""The share of the time left that the first guess of an instance for the skyline search (its
descents) may take; the rest goes to improving it."""
DESCENT_SHARE = 0.25
"""With a capacity, on an instance of more than ``SKYLINE_BUFFERS`` buffers for the compiled
search: the share of the time left that the skyline search's descents may take first."""


@dataclass(frozen=True)
class Found:
    """What :func:`search_placement` found: a status of :class:`memplan.alloc.Placement`, the
    offsets (None unless placed), the best proven lower bound, the nodes searched, a message.
    """

    status: str
    offsets: np.ndarray | None
    lower_bound: int
    nodes: int
    message: str


def search_placement(
    source: str,
    buffers: tuple[np.ndarray, np.ndarray, np.ndarray],
    peak: int,
    capacity: int | None,
    deadline: float | None,
    on_progress: Callable[[str], None] | None = None,
    started: float | None = None,
) -> Found:
    """NOTE [ one search for both questions ] on ``buffers`` (``lower``, ``upper``, ``size``, all
    of positive size; ``peak`` their peak live load, at most ``capacity``), until ``deadline``
    (a ``time.perf_counter()``, None for none). ``source`` names the input in errors.
    """

    def left() -> float | None:
        return None if deadline is None else max(deadline - time.perf_counter(), 0.0)

    lower, upper, size = buffers
    # The list of buffers live at the same time, when small enough to build in time: the compiled
    # search reads it, and the greedy first fit takes O(pairs) with it instead of O(n^2).
    graph = overlaps_in_time(lower, upper, deadline)
    large = engine.uses_skyline(lower, upper, least=True)
    greedy = None
    if large or capacity is not None:
        # The first fit first, with the whole time (anytime; without the list of overlaps the
        # core finds the buffers live at the same time in an index of the lifetimes: 50,000
        # random buffers in 1.5 s of CPU for both orders), before the skyline search's tables
        # are built: a placement whatever the time allows.
        floor = peak if capacity is None else capacity
        greedy = _greedy(source, lower, upper, size, deadline, graph, floor)
        if capacity is not None and _arena(greedy, size) <= capacity:
            status = "optimal" if _arena(greedy, size) == peak else "placed"
            return Found(status, greedy, peak, 0, "placed by greedy first fit")
    if capacity is not None and not large and len(size) > engine.SKYLINE_BUFFERS:
        # The skyline search's descents before the compiled search's lists are built, for a
        # quarter of the time left: they place short-lived buffers at their peak in as many
        # nodes as buffers (10,000 of them: 0.5 s of CPU and 120 MiB, where the compiled search
        # takes 2.3 s and 490 MiB to place them).
        assert greedy is not None
        remaining = left()
        until = None if remaining is None else time.perf_counter() + DESCENT_SHARE * remaining
        quick = engine.PartSearch(lower, upper, size, skyline=True)
        descended = first_guess(quick, lower, upper, size, until, None, greedy)
        if descended is not None and _arena(descended, size) < _arena(greedy, size):
            greedy = descended
            if _arena(greedy, size) <= capacity:
                return Found("placed", greedy, peak, 0, "placed by a descent of the search")
    # Then the descents, for a share of the time left: the rest goes to improving the best guess,
    # where the repair gains more per second than further descents (50,000 random buffers: the
    # first guess took all of 30 s and came within 2.75% of the peak; the repair took that to
    # +2.38% in 2 s).
    remaining = left()
    until = None if remaining is None else time.perf_counter() + FIRST_GUESS_SHARE * remaining
    search = engine.PartSearch(lower, upper, size, graph, skyline=large)
    first = first_guess(search, lower, upper, size, until, graph, greedy if large else None)
    if first is None:
        first = (
            greedy if greedy is not None else _greedy(source, lower, upper, size, deadline, graph)
        )
    if capacity is not None and _arena(first, size) <= capacity:
        return Found("placed", first, peak, 0, "placed by a descent of the search")
    best, lo, hi, nodes = least_arena(
        search, lower, upper, size, first, peak, left, on_progress, started, goal=capacity
    )
    return _answer(capacity, peak, (best, lo, hi, nodes), _arena(first, size))


def _answer(
    capacity: int | None, peak: int, searched: tuple[np.ndarray, int, int, int], first: int
) -> Found:
    """What the least-arena search found (``searched``: the best placement, the lower bound, its
    arena, the nodes), as the answer to the question asked; ``first``, the first guess's arena.
    """
    best, lo, hi, nodes = searched
    if capacity is None:
        if lo >= hi:
            return Found("optimal", best, hi, nodes, f"least arena {hi} (peak live load {peak})")
        message = f"arena {hi} found; least arena not proven (at least {lo}) within the time limit"
        return Found("placed", best, lo, nodes, message)
    if hi <= capacity:
        return Found("placed", best, lo, nodes, f"placed by the least-arena search ({nodes} nodes)")
    if lo > capacity:
        message = (
            f"no placement fits the capacity {capacity} (proven by exhaustive search; peak live "
            f"load {peak})"
        )
        return Found("infeasible", None, lo, nodes, message)
    message = (
        f"no placement within the capacity {capacity} found in the time limit (not proven "
        f"infeasible; peak live load {peak}, first guess {first}, best arena found {hi})"
    )
    return Found("gave-up", None, lo, nodes, message)


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
    try:
        return best_greedy(lower, upper, size, deadline, graph, floor)
    except ArenaTooLarge:
        raise InputError(
            f"{source}: size: a placement would need an arena above 2^61 bytes: too large to "
            f"place exactly"
        ) from None


def _arena(offsets: np.ndarray, size: np.ndarray) -> int:
    return int((offsets + size).max(initial=0))
