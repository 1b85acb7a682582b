"""Tensor address assignment for a fixed order: two baselines and eq. 15 of OLLA (Steiner et al.),
on memplan's one placement engine, :mod:`memplan.alloc` (fixed lifetimes packed into one arena).

Every function takes the lifetimes ``start[i] .. end[i]`` (steps, both included: the half-open
``[start, end + 1)`` of :mod:`memplan.alloc`) and ``sizes`` of the tensors and returns their byte
offsets; two tensors live at a common step must not overlap.

- :func:`first_fit`: an online allocator in the spirit of PyTorch's caching allocator: sizes
  rounded up to 512 bytes, the lowest free block that fits, freed blocks coalesced, the arena grown
  at the top when nothing fits. This is the ``framework`` placement, computed by
  :mod:`memplan.alloc`'s first fit in execution order (NOTE [ online first fit ]).
- :func:`greedy_by_size`: TFLite's / XLA's offline "greedy by size" planner: tensors by decreasing
  size, each in the smallest gap between the tensors already placed that it overlaps in time, else
  on top of them (:mod:`memplan.alloc`'s greedy with ``best_fit``).
- :func:`preplace`: Function 5 (section 4.5): the long-lived tensors stacked as a pyramid.
- :func:`solve_placement`: the least arena. :func:`memplan.alloc.place` searches it (MiniMalloc's
  branch-and-bound and its bounds) above the persistent tensors, then, unless that is proven
  least, eq. 15 with CP-SAT: one address variable per tensor, a ``NoOverlap2D`` over the
  (lifetime x address) rectangles (constraints 6, 7a, 7b: only tensors whose lifetimes intersect
  are kept apart, which is the exact form of the pruning of section 4.2 once the order is fixed),
  and ``arena >= offset + size`` (eq. 8), minimized, the persistent tensors fixed at the bottom and
  the pyramid of :func:`preplace` above them, warm started from the best heuristic placement.

NOTE [ online first fit ]
An online first fit that allocates the tensors in execution order (by first step, then index),
frees each after its last step, coalesces the free blocks and grows the arena at the top when no
free block fits gives each tensor the lowest address where it meets none of the tensors live at
that moment (the free blocks are the gaps between them; the block grown at the top starts at the
highest of their tops). The tensors live then are exactly those allocated before it whose
lifetimes meet its own: they start no later, and one that has not ended by its first step is
live. An offline first fit in the same order, each tensor at the lowest address where it meets
none of the tensors placed before it that are live at the same time, therefore gives the same
addresses (tests/algorithms/graph/test_placement.py runs the online allocator beside it).

NOTE [ persistent tensors at the bottom ]
A persistent tensor is live at every step, so every other tensor lies wholly below or wholly
above it: moving it to address 0 and the tensors below it up by its size keeps a placement valid
with the same arena. Stacking the persistent tensors from address 0 and placing the others above
them therefore loses nothing: the least arena is their total plus the least arena of the others,
which is what :func:`memplan.alloc.place` searches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memplan import interrupt
from memplan.alloc import Buffers, place
from memplan.alloc.greedy import first_fit as greedy_fit
from memplan.schedule import Status

ROUND = 512
"""The caching allocator's rounding of every request (bytes), used by :func:`first_fit`."""

ENGINE_SHARE = 0.5
"""The share of :func:`solve_placement`'s time limit that :func:`memplan.alloc.place` may take
(it returns as soon as its arena is proven least); CP-SAT has the rest."""


def first_fit(sizes: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Online first-fit allocation in execution order (the ``framework`` baseline).

    At each step the tensors created at that step are allocated (in index order), then the
    tensors whose last step it is are freed; requests are rounded up to :data:`ROUND` bytes.
    Computed as :mod:`memplan.alloc`'s first fit in that order (NOTE [ online first fit ]):
    O(Q log Q) for Q pairs of tensors live at the same time.
    """
    rounded = -(-np.asarray(sizes, dtype=np.int64) // ROUND) * ROUND
    order = np.lexsort((np.arange(len(sizes)), start))
    return greedy_fit(start, end + 1, rounded, order)


def greedy_by_size(
    sizes: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    fixed: dict[int, int] | None = None,
    key: np.ndarray | None = None,
) -> np.ndarray:
    """TFLite's greedy-by-size offsets (best-fit gap among time-overlapping tensors).

    ``fixed`` maps tensor indices to offsets placed beforehand (the pyramid of :func:`preplace`);
    the other tensors are placed around them. ``key`` is the order the tensors are placed in
    (default: decreasing size, then index). :mod:`memplan.alloc`'s greedy with ``best_fit``.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    order = np.argsort(-sizes, kind="stable") if key is None else np.asarray(key)
    placed = np.full(len(sizes), -1, dtype=np.int64)
    for i, off in (fixed or {}).items():
        placed[i] = off
    return greedy_fit(start, end + 1, sizes, order, fixed=placed, best_fit=True)


def arena_of(sizes: np.ndarray, offsets: np.ndarray) -> int:
    """``max(offset + size)`` over the tensors of positive size (eq. 8)."""
    sized = sizes > 0
    return int((offsets[sized] + sizes[sized]).max()) if sized.any() else 0


def stack_persistent(sizes: np.ndarray, persistent: np.ndarray) -> dict[int, int]:
    """Offsets of the persistent tensors, packed from address 0 (they are all live together)."""
    fixed: dict[int, int] = {}
    base = 0
    for i in np.flatnonzero(persistent).tolist():
        fixed[i] = base
        base += int(sizes[i])
    return fixed


def preplace(
    sizes: np.ndarray, start: np.ndarray, end: np.ndarray, base: int, skip: np.ndarray
) -> dict[int, int]:
    """Function 5 of the OLLA paper (section 4.5): stack long-lived tensors as a pyramid.

    Repeatedly take the longest-lived tensor whose lifetime nests in the previous one's and place
    it right above it, from address ``base``. ``skip`` masks tensors not to consider (persistent
    ones, size 0). With the order fixed, the lifetimes stand for the ASAP/ALAP ranges.
    """
    fixed: dict[int, int] = {}
    lo, hi = -1, np.iinfo(np.int64).max
    address = base
    candidates = ~skip & (sizes > 0)
    while True:
        inside = candidates & (start >= lo) & (end <= hi)
        if not inside.any():
            break
        duration = np.where(inside, end - start, -1)
        best = int(np.argmax(duration))
        if duration[best] <= 0:
            break
        fixed[best] = address
        address += int(sizes[best])
        lo, hi = int(start[best]), int(end[best])
        candidates[best] = False
    return fixed


@dataclass
class PlacementResult:
    """Offsets found by :func:`solve_placement` and what was proven."""

    offsets: np.ndarray
    arena: int
    bound: int
    status: Status
    seconds: float
    message: str


@dataclass
class _Engine:
    """What :func:`memplan.alloc.place` found above the persistent tensors."""

    offsets: np.ndarray
    arena: int
    bound: int
    """A lower bound of every placement's arena (when the persistent tensors are live at every
    step, NOTE [ persistent tensors at the bottom ]; else 0)."""


def least_arena(
    sizes: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    persistent: np.ndarray,
    time_limit: float,
) -> _Engine:
    """:func:`memplan.alloc.place`'s least arena of the tensors that are not persistent, above the
    persistent ones stacked from address 0 (NOTE [ persistent tensors at the bottom ]).
    """
    fixed = stack_persistent(sizes, persistent)
    base = int(sizes[persistent].sum())
    rest = np.flatnonzero(~persistent & (sizes > 0))
    buffers = Buffers(tuple(str(i) for i in rest.tolist()), start[rest], end[rest] + 1, sizes[rest])
    found = place(buffers, time_limit=max(float(time_limit), 0.0))
    assert found.offsets is not None  # without a capacity, place() always places
    offsets = np.zeros(len(sizes), dtype=np.int64)
    for i, off in fixed.items():
        offsets[i] = off
    offsets[rest] = base + found.offsets
    everywhere = bool(
        (start[persistent] <= start.min(initial=0)).all()
        and (end[persistent] >= end.max(initial=0)).all()
    )
    bound = base + found.lower_bound if everywhere else 0
    return _Engine(offsets, arena_of(sizes, offsets), bound)


def solve_placement(
    sizes: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    persistent: np.ndarray,
    lower_bound: int,
    *,
    time_limit: float,
    progress: Callable[[str], None] | None = None,
    label: str = "olla-address",
    pyramid: bool = True,
) -> PlacementResult:
    """The least arena for fixed lifetimes ``start .. end`` (steps, both included) of tensors of
    ``sizes`` bytes: :func:`memplan.alloc.place`, then eq. 15 of the OLLA paper with CP-SAT when
    that is not proven least (the module docstring). The ``persistent`` tensors sit at the bottom;
    ``lower_bound`` (the order's peak resident memory) ends the search when reached;
    :data:`ENGINE_SHARE` of ``time_limit`` (seconds) goes to memplan.alloc, the rest to CP-SAT;
    ``progress`` receives one line per improving solution (arena, bound, gap); ``pyramid``
    pre-places the long-lived tensors in the CP-SAT model (:func:`preplace`, section 4.5).

    The result is never worse than the best heuristic (first-fit or greedy-by-size) nor than
    memplan.alloc's arena; its status is ``optimal`` when the arena is proven least over every
    placement: it reaches ``lower_bound``, memplan.alloc proved it, or CP-SAT proved it without
    the pyramid (a restriction of section 4.5).
    """
    began = time.perf_counter()
    base = int(sizes[persistent].sum())
    candidates, fixed = _heuristics(sizes, start, end, persistent, pyramid)
    hint = candidates[-1] if pyramid else None  # the hint must respect the fixed tensors

    def best_of(found: list[np.ndarray]) -> tuple[np.ndarray, int]:
        arenas = [arena_of(sizes, c) for c in found]
        k = int(np.argmin(arenas))
        return found[k], arenas[k]

    def result(offsets: np.ndarray, arena: int, bound: int, note: str) -> PlacementResult:
        state: Status = "optimal" if arena <= bound else "feasible"
        gap = (arena - bound) / arena if arena else 0.0
        seconds = time.perf_counter() - began
        return PlacementResult(
            offsets, arena, min(bound, arena), state, seconds, f"{note}gap {gap:.2%}"
        )

    heuristic, upper = best_of(candidates)
    if upper <= lower_bound:
        return result(heuristic, upper, lower_bound, "heuristic, ")
    engine = least_arena(sizes, start, end, persistent, ENGINE_SHARE * time_limit)
    bound = max(lower_bound, engine.bound)
    candidates.append(engine.offsets)
    best, upper = best_of(candidates)
    if progress is not None:
        progress(_line(f"{label}: {time.perf_counter() - began:6.1f} s", upper, bound))
    if upper <= bound:
        return result(best, upper, bound, "least arena by memplan.alloc, ")
    left = time_limit - (time.perf_counter() - began)
    found, cp_bound = _cp_sat(
        sizes,
        start,
        end,
        fixed,
        (base, max(lower_bound, base), upper),
        best if hint is None else hint,
        left,
        progress,
        label,
        began,
    )
    if found is not None:
        candidates.append(found)
        best, upper = best_of(candidates)
    if cp_bound is not None and not fixed.keys() - set(np.flatnonzero(persistent).tolist()):
        bound = max(bound, cp_bound)  # no pyramid: CP-SAT's bound holds for every placement
    note = "" if found is not None else "no CP-SAT solution in time, "
    return result(best, upper, bound, note)


def _line(head: str, arena: int, bound: int) -> str:
    """A progress line in the graph family's form (memplan/algorithms/graph/cpsat.py)."""
    gap = (arena - bound) / arena if arena else 0.0
    return (
        f"{head}  memplan.alloc: arena {arena / 1e6:,.3f} MB  bound {bound / 1e6:,.3f} MB  "
        f"gap {gap:.2%}"
    )


def _heuristics(
    sizes: np.ndarray, start: np.ndarray, end: np.ndarray, persistent: np.ndarray, pyramid: bool
) -> tuple[list[np.ndarray], dict[int, int]]:
    """The heuristic placements, the persistent tensors at the bottom (greedy by size, by lifetime
    x size, the framework's first fit; with ``pyramid``, greedy by size around the pyramid of
    :func:`preplace`, last), and the offsets the CP-SAT model fixes (the persistent tensors and,
    with ``pyramid``, the pyramid).
    """
    base_fixed = stack_persistent(sizes, persistent)
    area = np.argsort(-(sizes * (end - start + 1)), kind="stable")
    candidates = [
        greedy_by_size(sizes, start, end, fixed=base_fixed),
        greedy_by_size(sizes, start, end, fixed=base_fixed, key=area),
        first_fit(sizes, start, end),
    ]
    fixed = dict(base_fixed)
    if pyramid:
        base = int(sizes[persistent].sum())
        fixed.update(preplace(sizes, start, end, base, persistent | (sizes == 0)))
        candidates.append(greedy_by_size(sizes, start, end, fixed=fixed))
    return candidates, fixed


def _cp_sat(
    sizes: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    fixed: dict[int, int],
    bounds: tuple[int, int, int],
    hint: np.ndarray,
    time_limit: float,
    progress: Callable[[str], None] | None,
    label: str,
    began: float,
) -> tuple[np.ndarray | None, int | None]:
    """Eq. 15 with CP-SAT: the tensors of ``fixed`` at their offsets, the others at ``base`` or
    above, the arena between ``floor`` and ``top`` (``bounds = (base, floor, top)``), warm started
    from ``hint`` (which respects ``fixed``). Returns the offsets of its best solution and its
    proven bound (both None when it found none within ``time_limit`` seconds).
    """
    from ortools.sat.python import cp_model

    from memplan.algorithms.graph.cpsat import ArenaProgress, workers

    base, floor, top = bounds
    top = max(top, arena_of(sizes, hint))
    model = cp_model.CpModel()
    free = [i for i in range(len(sizes)) if sizes[i] > 0 and i not in fixed]
    x_intervals, y_intervals, address = [], [], {}
    arena = model.new_int_var(floor, top, "arena")
    for i, off in fixed.items():
        if sizes[i] == 0:
            continue
        x_intervals.append(
            model.new_fixed_size_interval_var(int(start[i]), int(end[i] - start[i] + 1), f"t_{i}")
        )
        y_intervals.append(model.new_fixed_size_interval_var(off, int(sizes[i]), f"m_{i}"))
        model.add(arena >= off + int(sizes[i]))
    for i in free:
        a = model.new_int_var(base, top - int(sizes[i]), f"address_{i}")
        address[i] = a
        x_intervals.append(
            model.new_fixed_size_interval_var(int(start[i]), int(end[i] - start[i] + 1), f"t_{i}")
        )
        y_intervals.append(model.new_fixed_size_interval_var(a, int(sizes[i]), f"m_{i}"))
        model.add(arena >= a + int(sizes[i]))
        model.add_hint(a, int(hint[i]))
    model.add_no_overlap_2d(x_intervals, y_intervals)
    model.minimize(arena)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, float(time_limit))
    solver.parameters.num_workers = workers()
    status = interrupt.solve(solver, model, ArenaProgress(label, progress, began))
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, None
    found = hint.copy()
    for i in free:
        found[i] = solver.value(address[i])
    for i, off in fixed.items():
        found[i] = off
    return found, int(solver.best_objective_bound)
