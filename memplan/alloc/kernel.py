"""The exact search of :mod:`memplan.alloc.search`, compiled with numba (the ``fast`` extra).

One call of :func:`run_part` is one depth-first search of one part at one capacity under one
preorder and a node limit: the loop of NOTE [ restarts ] stays in Python (a few hundred calls at
most), the nodes run here, 50-200 times faster than the numpy search of ``search.py``. The rules
are those of ``search.py`` (its NOTEs: canonical placements, inference and dominance, dynamic
decomposition, residual preorders, failed states, stacked twins) plus MiniMalloc's *hatless
pruning* (Moffitt, ASPLOS 2023): when the buffer just tried has no unplaced buffer live at the
same time, it sits at its minimum offset in some form of every completion, whose canonical order
then starts with a candidate at or before it; once it has failed, the later candidates are not
tried.

NOTE [ compiled failed-state memo ]
The memo of failed states keys a node by (run, part range, floor, tie position, the unplaced
buffers of the part in rank order and their minimum offsets) as in ``search.py``, but stores two
independent 64-bit hashes of the key in a fixed-size table instead of the key itself: a wrong
prune would need both hashes of two different keys to agree (probability about 2^-128 per pair
of states). The table is lossy (a full bucket overwrites its oldest slot), which only costs
nodes, never soundness.

The search stops within 256 nodes when ``stop[0]`` is set (by the Python caller at its deadline
or on Ctrl-C, from another thread: the kernel releases the GIL).

Every function here is compiled on first use and cached on disk (numba's ``cache=True``); this
module is imported only when numba is installed (:func:`memplan.alloc.compiled.load`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

FOUND, NOT_FOUND, ABORTED, TIMEOUT = 1, 0, -1, -2
INF = 2**62
# Counters in Ctx.count: nodes, node limit, trail top, section stamp.
_NODES, _LIMIT, _TRAIL, _STAMP = 0, 1, 2, 3


class Ctx(NamedTuple):
    """The arrays of one search (static data first, then the state it changes and restores)."""

    first: np.ndarray  # first section of each buffer
    end: np.ndarray  # one past its last section
    size: np.ndarray
    maxm: np.ndarray  # capacity - size: the largest minimum offset a buffer may reach
    sec_start: np.ndarray  # CSR: buffers live in each section
    sec_buf: np.ndarray
    ov_start: np.ndarray  # CSR: buffers live at the same time as each buffer
    ov_buf: np.ndarray
    tw_start: np.ndarray  # CSR: buffers with the same lifetime (NOTE [ stacked twins ])
    tw_buf: np.ndarray
    width: np.ndarray  # float64 keys of the residual preorders: W, A, Z
    area: np.ndarray
    fsize: np.ndarray
    letters: np.ndarray  # the preorder's keys, most significant first: 0 W, 1 A, 2 T, 3 Z
    mu: np.ndarray  # minimum offset of each unplaced buffer, INF once placed
    offset: np.ndarray  # -1 unless placed
    solution: np.ndarray
    total: np.ndarray  # unplaced bytes live in each section
    cuts: np.ndarray  # unplaced buffers crossing each boundary between sections
    rank: np.ndarray
    trail_buf: np.ndarray  # minimum offsets raised along the current branch, to restore
    trail_old: np.ndarray
    sec_stamp: np.ndarray
    memo1: np.ndarray  # NOTE [ compiled failed-state memo ]
    memo2: np.ndarray
    count: np.ndarray  # nodes, node limit, trail top, stamp
    stop: np.ndarray  # set by the caller: stop within 256 nodes
    capacity: int
    residual: bool
    run: int


@njit(cache=True, nogil=True)
def _mix(h: np.uint64, x: np.int64) -> np.uint64:
    """One step of a 64-bit hash (splitmix64's finalizer over ``h ^ x``, ``x >= 0``)."""
    z = (h ^ np.uint64(x)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def _memo_find(c: Ctx, h1: np.uint64, h2: np.uint64) -> bool:
    mask = np.uint64(c.memo1.shape[0] - 4)
    base = int(h1 & mask)
    for k in range(4):  # noqa: SIM110 (numba compiles no generator expressions)
        if c.memo1[base + k] == h1 and c.memo2[base + k] == h2:
            return True
    return False


@njit(cache=True, nogil=True)
def _memo_add(c: Ctx, h1: np.uint64, h2: np.uint64) -> None:
    mask = np.uint64(c.memo1.shape[0] - 4)
    base = int(h1 & mask)
    for k in range(4):
        if c.memo1[base + k] == 0:
            c.memo1[base + k] = h1
            c.memo2[base + k] = h2
            return
    # Full bucket: shift it and put the new state first (the oldest one is forgotten).
    for k in range(3, 0, -1):
        c.memo1[base + k] = c.memo1[base + k - 1]
        c.memo2[base + k] = c.memo2[base + k - 1]
    c.memo1[base] = h1
    c.memo2[base] = h2


@njit(cache=True, nogil=True)
def _record(c: Ctx) -> None:
    for b in range(c.offset.shape[0]):
        if c.offset[b] >= 0:
            c.solution[b] = c.offset[b]


@njit(cache=True, nogil=True)
def _section_fits(c: Ctx, s: int) -> bool:
    """Section inference: some unplaced buffer of section ``s`` can start low enough for all its
    unplaced bytes to fit above it (the least minimum offset is the section's floor). The floor
    set by the last placement (its offset) is checked once per node, against the largest total.
    """
    tot = c.total[s]
    if tot <= 0:
        return True
    threshold = c.capacity - tot
    for i in range(c.sec_start[s], c.sec_start[s + 1]):  # noqa: SIM110 (see _memo_find)
        if c.mu[c.sec_buf[i]] <= threshold:
            return True
    return False


@njit(cache=True, nogil=True)
def _rerank(c: Ctx, sub: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """NOTE [ residual preorders ]: ``sub`` sorted by the preorder's keys with T from the unplaced
    totals of [lo, hi); its buffers get its old rank values in that order. Returns the old ranks
    (in the order of ``sub`` as given) for :func:`_restore`."""
    k = sub.shape[0]
    old = np.empty(k, dtype=np.int64)
    for j in range(k):
        old[j] = c.rank[sub[j]]
    order = np.arange(k)  # sub is in rank order: the tie-break
    key = np.empty(k, dtype=np.float64)
    for li in range(c.letters.shape[0] - 1, -1, -1):
        letter = c.letters[li]
        for j in range(k):
            b = sub[order[j]]
            if letter == 0:
                key[j] = -c.width[b]
            elif letter == 1:
                key[j] = -c.area[b]
            elif letter == 3:
                key[j] = -c.fsize[b]
            else:
                best = 0
                for s in range(max(c.first[b], lo), min(c.end[b], hi)):
                    best = max(best, c.total[s])
                key[j] = -float(best)
        perm = np.argsort(key, kind="mergesort")
        order = order[perm]
    values = np.sort(old)
    new_sub = np.empty(k, dtype=np.int64)
    for j in range(k):
        new_sub[j] = sub[order[j]]
        c.rank[new_sub[j]] = values[j]
    for j in range(k):
        sub[j] = new_sub[j]
    return old


@njit(cache=True, nogil=True)
def _node(c: Ctx, part: np.ndarray, lo: int, hi: int, o: int, last_rank: int) -> int:
    """Search below a node: ``part`` (in rank order) over sections [lo, hi), floor (o, rank).

    One self-recursive function (numba's cache does not support mutual recursion): the node's
    memo lookup, then the loop over its candidates, each placed, checked, recursed into (split
    where no unplaced buffer crosses, NOTE [ decomposition ]) and undone.
    """
    c.count[_NODES] += 1
    if c.count[_NODES] > c.count[_LIMIT]:
        return ABORTED
    if (c.count[_NODES] & 255) == 0 and c.stop[0] != 0:
        return TIMEOUT
    mu, size, rank, offset = c.mu, c.size, c.rank, c.offset
    capacity = c.capacity
    _NONE = np.int64(-1)  # not a literal -1: one compiled signature (numba's cache needs it)
    k = 0
    least = INF
    for b in part:
        if mu[b] < INF:
            k += 1
            least = min(least, mu[b])
    if k == 0:
        _record(c)
        return FOUND
    opn = np.empty(k, dtype=np.int64)
    j = 0
    for b in part:
        if mu[b] < INF:
            opn[j] = b
            j += 1
    # NOTE [ failed states ]: o and last_rank matter only through the buffers at or below o.
    if least > o:
        o = -1
        last_rank = -1
    tie = -1
    if o >= 0:
        tie = 0
        for b in opn:
            if rank[b] <= last_rank:
                tie += 1
    h1 = _mix(np.uint64(0x243F6A8885A308D3), c.run)
    h2 = _mix(np.uint64(0x13198A2E03707344), c.run)
    for x in (lo, hi, o + 1, tie + 1):  # all >= 0
        h1 = _mix(h1, x)
        h2 = _mix(h2, x)
    for b in opn:
        h1 = _mix(_mix(h1, b), mu[b])
        h2 = _mix(_mix(h2, mu[b]), b)
    if h1 == 0:
        h1 = np.uint64(1)
    if _memo_find(c, h1, h2):
        return NOT_FOUND

    # The candidates: NOTE [ canonical placements ] and NOTE [ inference and dominance ].
    min_height = INF
    for b in opn:
        min_height = min(min_height, mu[b] + size[b])
    peak = 0
    for s in range(lo, hi):
        peak = max(peak, c.total[s])
    keys = np.empty(k, dtype=np.int64)
    cands = np.empty(k, dtype=np.int64)
    nc = 0
    for b in opn:
        m = mu[b]
        if m >= min_height or m + peak > capacity or m > c.maxm[b]:
            continue
        if m < o or (m == o and rank[b] <= last_rank):
            continue
        cands[nc] = b
        keys[nc] = m
        nc += 1
    order = np.argsort(keys[:nc], kind="mergesort")  # by minimum offset, then rank
    status = NOT_FOUND
    for idx in order:
        b = cands[idx]
        off = mu[b]
        sz = size[b]
        # NOTE [ stacked twins ]
        mirrored = False
        for t in range(c.tw_start[b], c.tw_start[b + 1]):
            u = c.tw_buf[t]
            if offset[u] >= 0 and offset[u] + size[u] == off and rank[u] > rank[b]:
                mirrored = True
                break
        if mirrored:
            continue
        top = off + sz
        a, e = c.first[b], c.end[b]
        offset[b] = off
        mu[b] = INF
        trail0 = c.count[_TRAIL]
        tp = trail0
        hatless = True
        fail = False
        for t in range(c.ov_start[b], c.ov_start[b + 1]):
            u = c.ov_buf[t]
            m = mu[u]
            if m < INF:
                hatless = False
                if m < top:
                    c.trail_buf[tp] = u
                    c.trail_old[tp] = m
                    tp += 1
                    mu[u] = top
                    if top > c.maxm[u] and c.first[u] < hi and c.end[u] > lo:
                        fail = True
        c.count[_TRAIL] = tp
        for s in range(a, e):
            c.total[s] -= sz
        if not fail:
            # Only the sections of b and of the buffers it raised can have changed.
            c.count[_STAMP] += 1
            stamp = c.count[_STAMP]
            for s in range(max(a, lo), min(e, hi)):
                c.sec_stamp[s] = stamp
                if not _section_fits(c, s):
                    fail = True
                    break
            t = trail0
            while not fail and t < tp:
                u = c.trail_buf[t]
                t += 1
                for s in range(max(c.first[u], lo), min(c.end[u], hi)):
                    if c.sec_stamp[s] != stamp:
                        c.sec_stamp[s] = stamp
                        # u (minimum offset now top) is live in s: the floor is at most top.
                        if top + c.total[s] > capacity and not _section_fits(c, s):
                            fail = True
                            break
        status = NOT_FOUND
        if not fail:
            # Recurse, split where no unplaced buffer crosses any more.
            nzero = 0
            for s in range(a, e - 1):
                c.cuts[s] -= 1
                if c.cuts[s] == 0:
                    nzero += 1
            if nzero == 0:
                status = _node(c, opn, lo, hi, off, rank[b])
            else:
                status = FOUND
                bounds = np.empty(nzero + 2, dtype=np.int64)
                bounds[0] = lo
                j = 1
                for s in range(a, e - 1):
                    if c.cuts[s] == 0:
                        bounds[j] = s + 1
                        j += 1
                bounds[j] = hi
                nrest = 0
                for u in opn:
                    if mu[u] < INF:
                        nrest += 1
                if nrest == 0:
                    _record(c)
                else:
                    for p in range(nzero + 1):
                        slo, shi = bounds[p], bounds[p + 1]
                        cnt = 0
                        for u in opn:
                            if mu[u] < INF and slo <= c.first[u] < shi:
                                cnt += 1
                        if cnt == 0:
                            continue
                        sub = np.empty(cnt, dtype=np.int64)
                        j = 0
                        for u in opn:
                            if mu[u] < INF and slo <= c.first[u] < shi:
                                sub[j] = u
                                j += 1
                        if c.residual and cnt > 1:
                            given = sub.copy()
                            old = _rerank(c, sub, slo, shi)
                            status = _node(c, sub, slo, shi, _NONE, _NONE)
                            for q in range(cnt):
                                rank[given[q]] = old[q]
                        else:
                            status = _node(c, sub, slo, shi, _NONE, _NONE)
                        if status != FOUND:
                            break
            for s in range(a, e - 1):
                c.cuts[s] += 1
        for s in range(a, e):
            c.total[s] += sz
        for t in range(tp - 1, trail0 - 1, -1):
            mu[c.trail_buf[t]] = c.trail_old[t]
        c.count[_TRAIL] = trail0
        mu[b] = off
        offset[b] = -1
        if status != NOT_FOUND:
            return status
        if hatless:
            break  # MiniMalloc's hatless pruning (see the module docstring)
    _memo_add(c, h1, h2)
    return NOT_FOUND


@njit(cache=True, nogil=True)
def run_part(c: Ctx, part: np.ndarray, lo: int, hi: int) -> int:
    """Search ``part`` (buffer indices in rank order) over sections [lo, hi), split first where no
    unplaced buffer crosses a boundary. Returns FOUND (offsets in ``c.solution``), NOT_FOUND
    (proven), ABORTED (node limit) or TIMEOUT (``c.stop`` set)."""
    status = FOUND
    start = lo
    _NONE = np.int64(-1)  # see _node
    for s in range(lo, hi):
        if s == hi - 1 or c.cuts[s] == 0:
            cnt = 0
            for u in part:
                if start <= c.first[u] <= s:
                    cnt += 1
            if cnt > 0:
                sub = np.empty(cnt, dtype=np.int64)
                j = 0
                for u in part:
                    if start <= c.first[u] <= s:
                        sub[j] = u
                        j += 1
                status = _node(c, sub, start, s + 1, _NONE, _NONE)
                if status != FOUND:
                    return status
            start = s + 1
    return status


@njit(cache=True, nogil=True)
def first_fit(
    size: np.ndarray,
    order: np.ndarray,
    ov_start: np.ndarray,
    ov_buf: np.ndarray,
    offsets: np.ndarray,
    limit: int,
    stop: np.ndarray,
) -> int:
    """:func:`memplan.alloc.greedy.first_fit` over the overlap lists, compiled: fills
    ``offsets`` (-1 for buffers not placed) and returns how many of ``order`` it placed (fewer
    when ``stop`` was set, or when an arena would pass ``limit``: then -1 - that count)."""
    n = size.shape[0]
    top = np.full(n, -1, dtype=np.int64)
    for k in range(order.shape[0]):
        if (k & 1023) == 0 and stop[0] != 0:
            return k
        b = order[k]
        sz = size[b]
        if sz <= 0:
            offsets[b] = 0
            continue
        cnt = 0
        for t in range(ov_start[b], ov_start[b + 1]):
            if top[ov_buf[t]] >= 0:
                cnt += 1
        starts = np.empty(cnt, dtype=np.int64)
        ends = np.empty(cnt, dtype=np.int64)
        j = 0
        for t in range(ov_start[b], ov_start[b + 1]):
            u = ov_buf[t]
            if top[u] >= 0:
                starts[j] = offsets[u]
                ends[j] = top[u]
                j += 1
        sort = np.argsort(starts)
        x = 0
        for i in sort:
            if starts[i] >= x + sz:
                break
            if ends[i] > x:
                x = ends[i]
        if x + sz > limit:
            return -1 - k
        offsets[b] = x
        top[b] = x + sz
    return order.shape[0]
