"""Time a pattern whose per-resource cyclic orders and shifts are fixed (PipeDream, GPipe).

NOTE [ periodic timing with fixed orders ]
With the order of the operations on every GPU and link fixed, and the shift of every operation
fixed (operation ``u`` with shift ``s_u`` works on mini-batch ``r i - s_u`` in copy ``i``), a
period ``T`` is feasible iff the difference constraints

* dependency ``u -> v`` (same mini-batch): ``tau_v - tau_u >= d_u - (s_v - s_u) / r * T``,
* consecutive operations ``u, v`` of one resource: ``tau_v - tau_u >= d_u``,
* the wrap of a resource (last ``u``, first ``v``): ``tau_v - tau_u >= d_u - T``

have no positive cycle; every coefficient of ``T`` is <= 0 in our patterns, so feasibility is
monotone in ``T`` and the least period (the maximum cycle ratio, which is the period the eager
1F1B execution settles to) is found by bisection, each test a Bellman-Ford longest-path pass
(vectorized over the edges, O(V E) per test). The start times are the longest-path potentials at
the period found.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class FixedPattern:
    """Nodes (operations) with durations and shifts, dependency edges and resource orders."""

    r: int = 1
    durations: list[float] = field(default_factory=list)
    shifts: list[int] = field(default_factory=list)
    deps: list[tuple[int, int]] = field(default_factory=list)
    orders: list[list[int]] = field(default_factory=list)

    def add(self, duration: float, shift: int) -> int:
        self.durations.append(float(duration))
        self.shifts.append(int(shift))
        return len(self.durations) - 1

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(u, v, a, b)``: ``tau_v - tau_u >= a + b T`` for every constraint."""
        us: list[int] = []
        vs: list[int] = []
        a: list[float] = []
        b: list[float] = []
        d, s = self.durations, self.shifts
        for u, v in self.deps:
            us.append(u)
            vs.append(v)
            a.append(d[u])
            b.append(-(s[v] - s[u]) / self.r)
        for order in self.orders:
            for i, u in enumerate(order):
                us.append(u)
                vs.append(order[(i + 1) % len(order)])
                a.append(d[u])
                b.append(-1.0 if i == len(order) - 1 else 0.0)
        return (
            np.array(us, dtype=np.int64),
            np.array(vs, dtype=np.int64),
            np.array(a, dtype=float),
            np.array(b, dtype=float),
        )


def _longest(
    n: int, edges: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], period: float
) -> np.ndarray | None:
    """Longest-path potentials from a virtual source, or None on a positive cycle."""
    u, v, a, b = edges
    w = a + b * period
    dist = np.zeros(n)
    for _ in range(n + 1):
        cand = np.full(n, -np.inf)
        np.maximum.at(cand, v, dist[u] + w)
        new = np.maximum(dist, cand)
        if np.all(new <= dist + 1e-12 * (1.0 + np.abs(dist))):
            return dist
        dist = new
    return None


def solve_period(
    pattern: FixedPattern, rel: float = 1e-9, grid: float | None = None
) -> tuple[float, np.ndarray] | None:
    """The least feasible period and the start times, or None when no period works.

    With ``grid`` (durations multiples of it), the period is rounded up to the grid, so the start
    times are on the grid too (used to hint the ILP, whose times are integers).
    """
    n = len(pattern.durations)
    edges = pattern.edges()
    loads = [sum(pattern.durations[i] for i in order) for order in pattern.orders]
    lo = max([1e-9, *loads])
    total = sum(pattern.durations) + 1e-9
    hi = max(lo, total)
    if _longest(n, edges, lo) is not None:
        hi = lo
    else:
        while _longest(n, edges, hi) is None:
            hi *= 2
            if hi > 1e3 * total:
                return None
        while hi - lo > rel * hi:
            mid = 0.5 * (lo + hi)
            if _longest(n, edges, mid) is None:
                lo = mid
            else:
                hi = mid
    if grid is not None:
        hi = float(np.ceil(hi / grid - 1e-9) * grid)
        if _longest(n, edges, hi) is None:  # pragma: no cover - float noise at the boundary
            hi += grid
    dist = _longest(n, edges, hi)
    if dist is None:  # pragma: no cover
        return None
    return hi, dist
