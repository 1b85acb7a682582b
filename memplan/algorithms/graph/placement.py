"""Tensor address assignment for a fixed order: two baselines and OLLA's eq. 15 (OLLA, Steiner et al. 2022).

Every function takes the lifetimes ``start[i] .. end[i]`` (steps, both included) and ``sizes`` of
the tensors and returns their byte offsets; two tensors live at a common step must not overlap.

- :func:`first_fit`: an online allocator in the spirit of PyTorch's caching allocator: sizes
  rounded up to 512 bytes, the lowest free block that fits, freed blocks coalesced, the arena grown
  at the top when nothing fits. This is the ``framework`` placement.
- :func:`greedy_by_size`: TFLite's / XLA's offline "greedy by size" planner: tensors by decreasing
  size, each in the smallest gap between the tensors already placed that it overlaps in time, else
  on top of them.
- :func:`preplace`: Function 5 (section 4.5): the long-lived tensors stacked as a pyramid.
- :func:`solve_placement`: eq. 15 with CP-SAT: one address variable per tensor, a ``NoOverlap2D``
  over the (lifetime x address) rectangles (constraints 6, 7a, 7b: only tensors whose lifetimes
  intersect are kept apart, which is the exact form of the pruning of section 4.2 once the order
  is fixed), and ``arena >= offset + size`` (eq. 8), minimized. Persistent tensors are fixed at
  the bottom, the pyramid of :func:`preplace` above them; the rest is left to the solver, warm
  started from the best heuristic placement (greedy by size or by lifetime x size, first-fit).
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memplan import interrupt

ROUND = 512
"""The caching allocator's rounding of every request (bytes), used by :func:`first_fit`."""


def first_fit(
    sizes: np.ndarray, start: np.ndarray, end: np.ndarray, order_rank: np.ndarray | None = None
) -> np.ndarray:
    """Online first-fit allocation in execution order (the ``framework`` baseline).

    At each step the tensors created at that step are allocated (in ``order_rank`` order, default
    their index), then the tensors whose last step it is are freed. Requests are rounded up to
    :data:`ROUND` bytes. O(n * free blocks).
    """
    n = len(sizes)
    offsets = np.zeros(n, dtype=np.int64)
    rank = np.arange(n) if order_rank is None else order_rank
    by_start = sorted(range(n), key=lambda i: (int(start[i]), int(rank[i])))
    by_end: dict[int, list[int]] = {}
    for i in range(n):
        by_end.setdefault(int(end[i]), []).append(i)
    free_addr: list[int] = []  # sorted start addresses of the free blocks
    free_size: dict[int, int] = {}
    top = 0
    k = 0
    steps = int(max(end.max(initial=-1), start.max(initial=-1))) + 1
    for step in range(steps):
        while k < n and start[by_start[k]] == step:
            i = by_start[k]
            k += 1
            need = -(-int(sizes[i]) // ROUND) * ROUND
            if need == 0:
                continue
            where = None
            for addr in free_addr:
                if free_size[addr] >= need:
                    where = addr
                    break
            if where is None:
                if free_addr and free_addr[-1] + free_size[free_addr[-1]] == top:
                    where = free_addr[-1]  # grow the last free block at the top
                    top = where + need
                    free_addr.pop()
                    del free_size[where]
                else:
                    where = top
                    top += need
            else:
                rest = free_size.pop(where) - need
                free_addr.remove(where)
                if rest:
                    bisect.insort(free_addr, where + need)
                    free_size[where + need] = rest
            offsets[i] = where
        for i in by_end.get(step, []):
            need = -(-int(sizes[i]) // ROUND) * ROUND
            if need == 0:
                continue
            addr, size = int(offsets[i]), need
            pos = bisect.bisect_left(free_addr, addr)
            if pos < len(free_addr) and free_addr[pos] == addr + size:  # merge with the next
                size += free_size.pop(free_addr.pop(pos))
            if pos > 0 and free_addr[pos - 1] + free_size[free_addr[pos - 1]] == addr:
                prev = free_addr[pos - 1]
                free_size[prev] += size
            else:
                free_addr.insert(pos, addr)
                free_size[addr] = size
    return offsets


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
    (default: decreasing size). O(n^2) with numpy inner loops.
    """
    n = len(sizes)
    offsets = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    for i, off in (fixed or {}).items():
        offsets[i], placed[i] = off, True
    ranking = np.argsort(-sizes, kind="stable") if key is None else key
    todo = [i for i in ranking.tolist() if not placed[i]]
    for i in todo:
        if sizes[i] == 0:
            placed[i] = True
            continue
        near = placed & (start <= end[i]) & (start[i] <= end) & (sizes > 0)
        idx = np.flatnonzero(near)
        if len(idx) == 0:
            offsets[i], placed[i] = 0, True
            continue
        lo = offsets[idx]
        srt = np.argsort(lo, kind="stable")
        lo = lo[srt]
        hi = np.maximum.accumulate((offsets[idx] + sizes[idx])[srt])
        gaps_start = np.concatenate([[0], hi[:-1]])
        gaps = lo - gaps_start
        ok = np.flatnonzero(gaps >= sizes[i])
        if len(ok):
            best = ok[np.argmin(gaps[ok])]
            offsets[i] = gaps_start[best]
        else:
            offsets[i] = hi[-1]
        placed[i] = True
    return offsets


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
    """Function 5 of OLLA (Steiner et al. 2022) (section 4.5): stack long-lived tensors as a pyramid.

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
    """Offsets found by :func:`solve_placement` and what the solver proved."""

    offsets: np.ndarray
    arena: int
    bound: int
    status: str
    seconds: float
    message: str


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
    """Eq. 15 of OLLA (Steiner et al. 2022) with CP-SAT, for fixed lifetimes (see the module docstring).

    Parameters
    ----------
    sizes, start, end : arrays
        Tensor sizes (bytes) and lifetimes (steps, both included).
    persistent : bool array
        Tensors resident during the whole step: fixed at the bottom of the arena.
    lower_bound : int
        The peak resident memory of the order (no placement can do better); the solver stops
        as soon as it reaches it.
    time_limit : float
        Seconds (CP-SAT's ``max_time_in_seconds``).
    progress : callable, optional
        Receives one line per improving solution: arena, bound, gap.
    pyramid : bool
        Pre-place the long-lived tensors with :func:`preplace` (section 4.5).

    Returns
    -------
    PlacementResult
        Never worse than the best heuristic (first-fit or greedy-by-size), which warm-starts
        the solver and is returned when the solver finds nothing better in time.
    """
    began = time.perf_counter()
    base_fixed = stack_persistent(sizes, persistent)
    area = np.argsort(-(sizes * (end - start + 1)), kind="stable")
    candidates = [
        greedy_by_size(sizes, start, end, fixed=base_fixed),
        greedy_by_size(sizes, start, end, fixed=base_fixed, key=area),
        first_fit(sizes, start, end),
    ]
    skip = persistent | (sizes == 0)
    base = int(sizes[persistent].sum())
    fixed = dict(base_fixed)
    if pyramid:
        fixed.update(preplace(sizes, start, end, base, skip))
        candidates.append(greedy_by_size(sizes, start, end, fixed=fixed))
    arenas = [arena_of(sizes, c) for c in candidates]
    best = int(np.argmin(arenas))
    heuristic, upper = candidates[best], arenas[best]
    if upper <= lower_bound:
        seconds = time.perf_counter() - began
        return PlacementResult(heuristic, upper, lower_bound, "optimal", seconds, "heuristic")

    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    free = [i for i in range(len(sizes)) if sizes[i] > 0 and i not in fixed]
    hint = candidates[-1] if pyramid else heuristic  # the hint must respect the fixed tensors
    hint_arena = arena_of(sizes, hint)
    top = max(upper, hint_arena)
    x_intervals, y_intervals, address = [], [], {}
    arena = model.new_int_var(max(lower_bound, base), top, "arena")
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
    solver.parameters.num_workers = _workers()
    callback = _Progress(label, progress, began)
    status = interrupt.solve(solver, model, callback)
    seconds = time.perf_counter() - began
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        found = hint.copy()
        for i in free:
            found[i] = solver.value(address[i])
        for i, off in fixed.items():
            found[i] = off
        bound = max(lower_bound, int(solver.best_objective_bound))
        offsets = found if arena_of(sizes, found) <= upper else heuristic
        value = arena_of(sizes, offsets)
        state = "optimal" if status == cp_model.OPTIMAL or value <= bound else "feasible"
        gap = (value - bound) / value if value else 0.0
        return PlacementResult(offsets, value, bound, state, seconds, f"gap {gap:.2%}")
    bound = lower_bound
    gap = (upper - bound) / upper if upper else 0.0
    return PlacementResult(
        heuristic, upper, bound, "feasible", seconds, f"no CP-SAT solution in time, gap {gap:.2%}"
    )


def _workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _progress_class():
    from ortools.sat.python import cp_model

    class Progress(cp_model.CpSolverSolutionCallback):
        """Reports each improving solution (objective, bound, gap) to a ``progress`` callable."""

        def __init__(self, label: str, sink: Callable[[str], None] | None, began: float):
            super().__init__()
            self._label, self._sink, self._began = label, sink, began
            self.solutions = 0

        def on_solution_callback(self) -> None:
            self.solutions += 1
            if self._sink is None:
                return
            value, bound = self.objective_value, self.best_objective_bound
            gap = (value - bound) / value if value else 0.0
            self._sink(
                f"{self._label}: {time.perf_counter() - self._began:6.1f} s  "
                f"objective {value / 1e6:,.3f} MB  bound {bound / 1e6:,.3f} MB  gap {gap:.2%}"
            )

    return Progress


def _Progress(label: str, sink: Callable[[str], None] | None, began: float):  # noqa: N802
    return _progress_class()(label, sink, began)
