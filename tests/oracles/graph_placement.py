"""References of the graph family's two baseline placements, as memplan computed them before they
ran on :mod:`memplan.alloc`'s greedy (tests/algorithms/graph/test_placement.py compares them
offset for offset).

* :func:`online_first_fit`: PyTorch's caching allocator as the paper models it, run step by step:
  every request rounded up to 512 bytes, the lowest free block that fits, freed blocks coalesced,
  the arena grown at the top when nothing fits (the ``framework`` baseline);
* :func:`greedy_by_size`: TFLite's offline planner: tensors by decreasing size (or ``key``),
  each in the smallest gap between the tensors already placed that it overlaps in time, else on
  top of them, around tensors placed beforehand (the ``greedy-by-size`` baseline).

Lifetimes are ``start[i] .. end[i]`` (steps, both included).
"""

from __future__ import annotations

import bisect

import numpy as np

ROUND = 512


def online_first_fit(sizes: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """At each step the tensors created then are allocated (by index), then those whose last step
    it is are freed; a free list of (address, size) blocks, coalesced."""
    n = len(sizes)
    offsets = np.zeros(n, dtype=np.int64)
    by_start = sorted(range(n), key=lambda i: (int(start[i]), i))
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
            where = next((a for a in free_addr if free_size[a] >= need), None)
            if where is None:
                if free_addr and free_addr[-1] + free_size[free_addr[-1]] == top:
                    where = free_addr.pop()  # grow the last free block at the top
                    del free_size[where]
                else:
                    where = top
                top = where + need
            else:
                rest = free_size.pop(where) - need
                free_addr.remove(where)
                if rest:
                    bisect.insort(free_addr, where + need)
                    free_size[where + need] = rest
            offsets[i] = where
        for i in by_end.get(step, []):
            size = -(-int(sizes[i]) // ROUND) * ROUND
            if size == 0:
                continue
            addr = int(offsets[i])
            pos = bisect.bisect_left(free_addr, addr)
            if pos < len(free_addr) and free_addr[pos] == addr + size:  # merge with the next
                size += free_size.pop(free_addr.pop(pos))
            if pos > 0 and free_addr[pos - 1] + free_size[free_addr[pos - 1]] == addr:
                free_size[free_addr[pos - 1]] += size
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
    """Best fit among the time-overlapping tensors placed so far, by decreasing size (stable)."""
    n = len(sizes)
    offsets = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    for i, off in (fixed or {}).items():
        offsets[i], placed[i] = off, True
    ranking = np.argsort(-sizes, kind="stable") if key is None else key
    for i in [i for i in ranking.tolist() if not placed[i]]:
        placed[i] = True
        if sizes[i] == 0:
            continue
        near = np.flatnonzero(placed & (start <= end[i]) & (start[i] <= end) & (sizes > 0))
        near = near[near != i]
        if len(near) == 0:
            continue  # offset 0
        srt = np.argsort(offsets[near], kind="stable")
        lo = offsets[near][srt]
        hi = np.maximum.accumulate((offsets[near] + sizes[near])[srt])
        gaps_start = np.concatenate([[0], hi[:-1]])
        gaps = lo - gaps_start
        ok = np.flatnonzero(gaps >= sizes[i])
        offsets[i] = gaps_start[ok[np.argmin(gaps[ok])]] if len(ok) else hi[-1]
    return offsets
