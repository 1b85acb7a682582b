"""The least arena: the best placement found within the time limit, improved while time remains.

NOTE [ least arena ]
Without a capacity the arena is searched between the proven lower bound ``lo`` (first the peak
live load) and the best arena ``hi`` (first the best of the first guesses), by rounds of
bisection in steps of the sizes' greatest common divisor (every arena of a placement pushed down
is a sum of sizes: a multiple of it). Each probe at a capacity C searches, part by part (the
static parts of NOTE [ decomposition ] are independent: the arena is the largest of theirs), the
parts whose best arena is above C, each under a node budget; a part placed keeps its better
placement, a part proven infeasible proves C + 1 a lower bound, and one that gives up sends the
bisection up without proving anything. The budget per buffer grows fourfold every round, so the
least arena is found (and proven) when time allows, and every round ends with the best placement
any probe found. The rounds take turns with the repair (:mod:`memplan.alloc.repair`, NOTE
[ ruin and recreate ] in src/alloc_repair.cpp), which improves the whole placement at once; see
``TURN_SHARE`` for the shares of time. It runs until the bounds meet or the time is up
(anytime), saying each new bound through ``on_progress``.

NOTE [ least arena with a goal ]
With a capacity C as its goal (NOTE [ one search for both questions ], memplan/alloc/pipeline.py)
the search is the same, with three changes. It stops once the best arena is at most C (placed)
or the lower bound passes C (proven infeasible). A probe never goes above C (rounded down to a
multiple of the sizes' greatest common divisor): a placement there answers nothing, and the
probe at C itself is the exact search at the capacity, the only one that can prove it
infeasible; so after the first round's probe at the lower bound, each round probes at C, and
keeps the failed-state memo of the rounds before (sound: they searched the same capacity). The
repair aims at C instead of the lower bound. On up to ``SKYLINE_BUFFERS`` (2,000) buffers the
slices of time start at ``FIRST_TURN`` rather than a share of the time left: there the exact
search answers a capacity in its first rounds (MiniMalloc's challenging instances, in
milliseconds), which would otherwise wait for repair turns sized for the whole time limit (0.6 s
each at 60 s: 3 to 20 times the search's time). Above, where the repair is what reaches a
capacity near the peak, the turns are those of the least arena.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from memplan.alloc.engine import (
    FOUND,
    NOT_FOUND,
    PREORDERS,
    SKYLINE_BUFFERS,
    TIMEOUT,
    PartSearch,
)
from memplan.alloc.greedy import ArenaTooLarge, best_greedy
from memplan.alloc.instance import count_incidences
from memplan.alloc.repair import Repair

__all__ = ["descent_first", "first_guess", "least_arena"]

PROBE_BUDGET = 10
TURN_SHARE = 0.05
"""The bisection's rounds and the repair's turns (NOTE [ ruin and recreate ]) alternate in
slices of time, the first ``TURN_SHARE`` of the time left (at least ``FIRST_TURN`` seconds),
each next one twice as long; a round of the skyline search stops at its share of the slice (the
next one goes on from its probe, with the same node budget), one of the compiled search runs to
its end. The shares start equal (the repair's a quarter of
the bisection's with the compiled search); the repair's doubles when it lowered the arena and
the round did not move a bound, and halves when it did not (within ``MOST_RATIO`` times either
way).
Without a time limit a round runs to its end and the repair's turns are counted in moves (the
same placement on every machine): ``REPAIR_MOVES`` per buffer, twice more every turn."""
FIRST_TURN = 0.2
MOST_RATIO = 16.0
REPAIR_MOVES = 2
"""Nodes per buffer of a part in each probe of the first round (x4 every round)."""

DESCENT_COST = 100
"""Without the list of overlaps the greedy first fit scans the buffers placed for each buffer
(about n^2 / 2 steps) and a descent refreshes the minimum offsets of each buffer's sections
(about P steps for P section incidences); a descent step costs about 50 to 90 times a scan's.
Measured in CPU seconds, one at a time (load 7): 50,000 random buffers (P = 0.0043 n^2) a
descent 3.4 s, the first fit 8.6 s; 50,000 short-lived ones (P = 0.0005 n^2) 0.7 s and 7.6 s;
50,000 nested training lifetimes (P = 0.063 n^2) a descent more than 28 s, the first fit 14 s.
So the descent is expected the quicker when ``DESCENT_COST * P <= n^2``. (Measured when the first
fit scanned every buffer; it now reads an index of the lifetimes, and :func:`memplan.alloc.place`
runs it first on every large instance, passing its placement to :func:`first_guess`.)"""


def least_arena(
    engine: PartSearch,
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    first_guess: np.ndarray,
    peak: int,
    left: Callable[[], float | None],
    on_progress: Callable[[str], None] | None = None,
    started: float | None = None,
    goal: int | None = None,
) -> tuple[np.ndarray, int, int, int]:
    """NOTE [ least arena ]: the best placement found (offsets of the buffers of ``engine``, of
    lifetimes ``lower``, ``upper`` and sizes ``size``), a proven lower bound, its arena, and the
    nodes searched. ``first_guess`` is a placement of all of them; ``left()`` the seconds left
    (None: no limit); ``started``, the ``time.perf_counter()`` the progress counts from (None:
    now). With a ``goal`` (a capacity), NOTE [ least arena with a goal ]: it stops once the
    arena is at most ``goal`` or the lower bound above it. The rounds of probes and the repair's
    turns share the bounds and the best placements (:class:`_LeastArena`); here, the slices of
    time they take turns in (``TURN_SHARE``).
    """
    search = _LeastArena(engine, lower, upper, size, first_guess, peak, on_progress, started, goal)
    search.report()
    remaining = left()
    turn = None if remaining is None else max(TURN_SHARE * remaining, FIRST_TURN)
    if turn is not None and search.ceiling is not None and len(size) <= SKYLINE_BUFFERS:
        turn = FIRST_TURN  # NOTE [ least arena with a goal ]: the exact search answers first
    moves = REPAIR_MOVES * len(size)  # without a time limit: the repair's turns in moves
    # The repair's time over the bisection's: equal with the skyline search, a quarter with the
    # compiled search (its probes prove least arenas on hundreds to thousands of buffers).
    ratio = 1.0 if engine.skyline else 0.25
    while search.open_question():
        round_started = time.perf_counter()
        # A round of the compiled search runs to its end: a probe cut short starts over from an
        # empty memo (10,000 short-lived buffers: the probe at the peak places them after 2 s of
        # CPU, and never did in slices of 0.4 s, 0.8 s, ...).
        until = None
        if turn is not None and engine.skyline:
            until = round_started + turn / (1 + ratio)
        before_round = (search.lo, search.hi)
        if not search.round(left, until):
            break  # the time is up
        searched = (search.lo, search.hi) != before_round
        remaining = left()
        if turn is None:
            repaired = search.improve(None, moves)
            moves *= 2
        else:
            assert remaining is not None
            repaired = search.improve(min(turn * ratio / (1 + ratio), remaining), None)
            turn *= 2
        if repaired and not searched:
            ratio = min(ratio * 2, MOST_RATIO)
        elif not repaired:
            ratio = max(ratio / 2, 1 / MOST_RATIO)
    return search.result()


class _LeastArena:
    """What NOTE [ least arena ]'s rounds of probes and the repair's turns share: the bounds
    ``lo`` and ``hi``, the best placement and arena of each part, the nodes searched, and where
    the bisection stands (the next ``probe``, the lowest capacity not yet tried in this round,
    ``floor``, and whether the last round was ``cut`` short by its slice of time).
    """

    def __init__(
        self,
        engine: PartSearch,
        lower: np.ndarray,
        upper: np.ndarray,
        size: np.ndarray,
        first_guess: np.ndarray,
        peak: int,
        on_progress: Callable[[str], None] | None,
        started: float | None,
        goal: int | None,
    ) -> None:
        self.started = time.perf_counter() if started is None else started
        self.engine, self.size, self.peak, self.on_progress = engine, size, peak, on_progress
        parts = engine.parts
        self.best = [first_guess[p.buffers].copy() for p in parts]
        self.arena = [_arena(self.best[k], size[p.buffers]) for k, p in enumerate(parts)]
        self.hi = max(self.arena, default=0)
        self.lo = max(peak, engine.section_peak)
        self.step = math.gcd(*size.tolist()) if len(size) else 1
        # The highest probe: a placement within the goal has an arena that is a multiple of step.
        self.ceiling = None if goal is None else goal // self.step * self.step
        self.nodes = 0
        self.factor = PROBE_BUDGET
        self.repair = Repair(lower, upper, size, first_guess, self.step)
        self.probe = self.lo  # the first probe is at the lower bound, every later round bisects
        self.floor = self.lo  # lowest capacity not yet tried in this round
        self.cut = False

    def result(self) -> tuple[np.ndarray, int, int, int]:
        """The best placement, the lower bound, its arena and the nodes searched."""
        return _gather(self.engine, self.best, len(self.size)), self.lo, self.hi, self.nodes

    def open_question(self) -> bool:
        """Whether the bounds have not answered yet: the least arena, or the goal."""
        lo, hi, ceiling = self.lo, self.hi, self.ceiling
        return lo < hi and (ceiling is None or lo <= ceiling < hi)

    def report(self) -> None:
        if self.on_progress is not None:
            hi, lo, peak = self.hi, self.lo, self.peak
            over = 100.0 * (hi - peak) / peak if peak else 0.0
            self.on_progress(
                f"arena {hi} (+{over:.2f}% over the peak live load {peak}; at least {lo}) after "
                f"{time.perf_counter() - self.started:.1f} s"
            )

    def improve(self, seconds: float | None, moves: int | None) -> bool:
        """The repair's turn (NOTE [ ruin and recreate ]): what it finds, part by part; whether
        the arena fell.
        """
        if not self.open_question() or (seconds is not None and seconds <= 0):
            return False
        size, parts = self.size, self.engine.parts
        self.repair.offer(_gather(self.engine, self.best, len(size)))
        aim = self.lo if self.ceiling is None else max(self.lo, self.ceiling)
        if self.repair.run(aim, seconds, moves) >= self.hi:
            return False
        placed = self.repair.best()
        for k, part in enumerate(parts):
            top = _arena(placed[part.buffers], size[part.buffers])
            if top < self.arena[k]:
                self.best[k], self.arena[k] = placed[part.buffers], top
        self.hi = max(self.arena)
        self.report()
        return True

    def round(self, left: Callable[[], float | None], until: float | None) -> bool:
        """A round of bisection: probes from ``floor`` up until the bounds meet or a probe is
        cut short at ``until``; the next round's node budget four times this one's (unless cut
        short: the next goes on at the probe it stopped at). False when the time is up.
        """
        step, ceiling = self.step, self.ceiling
        if self.cut:  # the round cut short goes on at the probe it stopped at
            self.floor = max(self.floor, self.lo)
            if self.probe >= self.hi or self.probe < self.floor:
                self.probe = _bisect(self.floor, self.hi, step)
        else:
            self.floor = self.lo
        self.cut = False
        while self.floor < self.hi and (ceiling is None or self.floor <= ceiling):
            if ceiling is not None:
                self.probe = min(self.probe, ceiling)  # above the goal a probe cannot answer
            outcome = self._probe(left, until)
            if outcome is None:
                return False
            if self.cut:
                break
            placed, proven = outcome
            before = (self.lo, self.hi)
            if placed:
                self.hi = max(self.arena)
            elif proven:
                self.lo = self.floor = _round_up(self.probe + 1, step)
            else:
                self.floor = _round_up(self.probe + 1, step)
            if (self.lo, self.hi) != before:
                self.report()
            self.probe = _bisect(self.floor, self.hi, step)
            if not self.open_question():
                break
        if not self.cut:
            self.factor *= 4
            self.probe = _bisect(self.lo, self.hi, step)
        return True

    def _probe(
        self, left: Callable[[], float | None], until: float | None
    ) -> tuple[bool, bool] | None:
        """The parts whose best arena is above ``probe`` searched at it, each under its node
        budget: (all placed, one proven infeasible); ``cut`` set when one ran out of its slice;
        None when the time is up.
        """
        probe, size = self.probe, self.size
        for k, part in enumerate(self.engine.parts):
            if self.arena[k] <= probe:
                continue
            remaining = left()
            if remaining is not None and remaining <= 0:
                return None
            if until is not None and remaining is not None:
                remaining = min(remaining, until - time.perf_counter())
            status, self.nodes, offsets = self.engine.solve(
                part,
                probe,
                self.nodes + self.factor * len(part.buffers),  # the core caps the nodes counted
                self.nodes,
                tight=False,  # the lower bound is the first probe
                time_limit=remaining,
                fresh=probe != self.ceiling,  # at the goal the memo of the probes before holds
            )
            if status == FOUND:
                assert offsets is not None
                self.best[k] = offsets
                self.arena[k] = _arena(offsets, size[part.buffers])
                continue
            self.cut = status == TIMEOUT
            return False, status == NOT_FOUND
        return True, False


def first_guess(  # noqa: C901 - one schedule of the time over closures sharing the best
    engine: PartSearch,
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    deadline: float | None,
    graph: tuple[np.ndarray, np.ndarray] | None,
    greedy: np.ndarray | None = None,
) -> np.ndarray | None:
    """The first placement of the skyline search (None with the compiled search: the caller's
    greedy first fit is its first guess): per part the best of the descents of the three
    preorders (:meth:`PartSearch.descend`) and of the greedy first fits by size and by area
    (:func:`memplan.alloc.greedy.best_greedy`, anytime) that end in time. A descent stopped by
    its time gives nothing, a first fit stopped stacks the buffers it has not placed above the
    others, so whichever :func:`descent_first` expects to be the quicker goes first. The descent
    first: it has the time to ``deadline`` (the caller gives the first guess a share of its
    time; a descent is what the repair improves best, from the first fit it gains little:
    10,000 random buffers +6.48% to +6.37% in 12 s of CPU, from the descent +2.16% to +1.25% in
    1.2 s), the first fit half of what is then left, the other descents the rest. The first fit first (nested training lifetimes: a descent takes minutes): it has the
    whole time, as when no descent ran, the descents what it leaves; ``greedy``, when given, is
    its placement (the caller ran it first). The descents place
    MiniMalloc's kind of instances near their peak (a 62,185-buffer compiler trace at it); the
    first fits do better where sizes vary a lot.
    """
    if not engine.skyline:
        return None
    parts = engine.parts
    best: list[np.ndarray | None] = [None] * len(parts)
    arena = [0] * len(parts)

    def keep(k: int, offsets: np.ndarray) -> None:
        top = _arena(offsets, size[parts[k].buffers])
        if best[k] is None or top < arena[k]:
            best[k], arena[k] = offsets, top

    def share(fraction: float) -> float | None:
        """The deadline ``fraction`` of the time left from now."""
        if deadline is None:
            return None
        return time.perf_counter() + fraction * max(deadline - time.perf_counter(), 0.0)

    def descend(preorder: int, until: float | None) -> None:
        for k, part in enumerate(parts):
            if best[k] is not None and arena[k] <= part.peak:
                continue  # at its peak: nothing to improve
            remaining = None if until is None else until - time.perf_counter()
            if remaining is not None and remaining <= 0:
                return
            offsets = engine.descend(part, preorder, remaining)
            if offsets is not None:
                keep(k, offsets)

    def first_fit(until: float | None) -> None:
        if until is not None and time.perf_counter() >= until:
            return
        try:
            greedy = best_greedy(lower, upper, size, until, graph if graph else None)
        except ArenaTooLarge:
            return
        for k, part in enumerate(parts):
            keep(k, greedy[part.buffers])

    if greedy is not None:
        for k, part in enumerate(parts):
            keep(k, greedy[part.buffers])
        descend(0, deadline)
    elif descent_first(lower, upper, graph):
        descend(0, deadline)
        first_fit(share(0.5))
    else:
        first_fit(deadline)
        descend(0, deadline)
    for preorder in range(1, len(PREORDERS)):
        descend(preorder, deadline)
    found = [placed for placed in best if placed is not None]
    if len(found) < len(best):
        return None
    return _gather(engine, found, len(size))


def descent_first(
    lower: np.ndarray, upper: np.ndarray, graph: tuple[np.ndarray, np.ndarray] | None
) -> bool:
    """Whether the first descent is expected to end before the greedy first fit: always with the
    list of overlaps ``graph`` (the first fit then takes O(pairs log pairs)), without it when
    ``DESCENT_COST`` times the section incidences is at most n^2 (n buffers).
    """
    if graph is not None:
        return True
    n = len(lower)
    return DESCENT_COST * count_incidences(lower, upper) <= n * n


def _gather(engine: PartSearch, best: list[np.ndarray], n: int) -> np.ndarray:
    offsets = np.zeros(n, dtype=np.int64)
    for part, placed in zip(engine.parts, best, strict=True):
        offsets[part.buffers] = placed
    return offsets


def _arena(offsets: np.ndarray, size: np.ndarray) -> int:
    return int((offsets + size).max(initial=0))


def _bisect(floor: int, hi: int, step: int) -> int:
    """The next probe in [floor, hi): the midpoint rounded up to a multiple of ``step``."""
    probe = _round_up(floor + (hi - floor) // 2, step)
    return probe if probe < hi else floor


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step
