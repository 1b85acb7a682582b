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
or on Ctrl-C, from another thread: the kernel runs without the GIL).

Nothing here allocates (NOTE [ native kernels do not allocate ] in memplan/native.py): every array
is handed in, the per-node ones on the work stack of NOTE [ kernel work stack ]
(memplan/alloc/kernel_layout.py), and the sorts are in place (a stable merge sort gives the same
order as the stable mergesorts of numpy that the numpy search uses). These functions are compiled
into the native entry points of :mod:`memplan.alloc.kernel_cfuncs`, once per installation
(:mod:`memplan.native`); this module is imported only to build them (it needs numba).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from memplan.alloc.kernel_layout import (
    ABORTED,
    FOUND,
    INF,
    LIMIT,
    NODES,
    NOT_FOUND,
    OVERFLOW,
    PEAK,
    SCRATCH_SHORT,
    STAMP,
    TIMEOUT,
    TOP,
    TRAIL,
    Ctx,
)

__all__ = ["Ctx", "first_fit", "run_part"]

_RUN = 16
"""Runs this short are sorted by insertion before the merges."""


@njit(nogil=True, error_model="numpy")
def _push(c: Ctx, k: int) -> int:
    """The base of ``k`` fresh entries of the work stack (NOTE [ kernel work stack ]), or -1 when
    it is full (the caller then returns OVERFLOW). The caller pops by restoring the top to it."""
    base = c.count[TOP]
    if base + k > c.ws.shape[0]:
        return -1
    c.count[TOP] = base + k
    if base + k > c.count[PEAK]:
        c.count[PEAK] = base + k
    return base


@njit(nogil=True, error_model="numpy")
def _sort_by_key(a: np.ndarray, key: np.ndarray, tmp: np.ndarray) -> None:
    """Sort the indices ``a`` in place by ``key[a[i]]``, stably (ties keep their order): the
    order of ``a[np.argsort(key[a], kind="stable")]``. ``tmp`` holds at least ``len(a)``."""
    n = a.shape[0]
    for lo in range(0, n, _RUN):
        hi = min(lo + _RUN, n)
        for i in range(lo + 1, hi):
            x = a[i]
            kx = key[x]
            j = i - 1
            while j >= lo and key[a[j]] > kx:
                a[j + 1] = a[j]
                j -= 1
            a[j + 1] = x
    width = _RUN
    in_tmp = False
    while width < n:
        src = tmp if in_tmp else a
        dst = a if in_tmp else tmp
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j = lo, mid
            for k in range(lo, hi):
                if j < hi and (i >= mid or key[src[j]] < key[src[i]]):
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
        in_tmp = not in_tmp
        width *= 2
    if in_tmp:
        for k in range(n):
            a[k] = tmp[k]


@njit(nogil=True, error_model="numpy")
def _lex_less(keys: np.ndarray, stride: int, nkeys: int, p: int, q: int) -> bool:
    """Whether position ``p`` comes strictly before ``q`` by the keys ``keys[l * stride + .]``,
    ``l = 0 .. nkeys - 1``, the first most significant."""
    for li in range(nkeys):
        x = keys[li * stride + p]
        y = keys[li * stride + q]
        if x < y:
            return True
        if y < x:
            return False
    return False


@njit(nogil=True, error_model="numpy")
def _sort_lex(a: np.ndarray, keys: np.ndarray, nkeys: int, tmp: np.ndarray) -> None:
    """Sort the positions ``a`` (0 .. len(a) - 1) in place by the keys of :func:`_lex_less`,
    stably: the order that one stable sort per key, least significant first, gives."""
    n = a.shape[0]
    for lo in range(0, n, _RUN):
        hi = min(lo + _RUN, n)
        for i in range(lo + 1, hi):
            x = a[i]
            j = i - 1
            while j >= lo and _lex_less(keys, n, nkeys, x, a[j]):
                a[j + 1] = a[j]
                j -= 1
            a[j + 1] = x
    width = _RUN
    in_tmp = False
    while width < n:
        src = tmp if in_tmp else a
        dst = a if in_tmp else tmp
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j = lo, mid
            for k in range(lo, hi):
                if j < hi and (i >= mid or _lex_less(keys, n, nkeys, src[j], src[i])):
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
        in_tmp = not in_tmp
        width *= 2
    if in_tmp:
        for k in range(n):
            a[k] = tmp[k]


@njit(nogil=True, error_model="numpy")
def _mix(h: np.uint64, x: np.int64) -> np.uint64:
    """One step of a 64-bit hash (splitmix64's finalizer over ``h ^ x``, ``x >= 0``)."""
    z = (h ^ np.uint64(x)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(nogil=True, error_model="numpy")
def _memo_find(c: Ctx, h1: np.uint64, h2: np.uint64) -> bool:
    mask = np.uint64(c.memo1.shape[0] - 4)
    base = int(h1 & mask)
    for k in range(4):  # noqa: SIM110 (numba compiles no generator expressions)
        if c.memo1[base + k] == h1 and c.memo2[base + k] == h2:
            return True
    return False


@njit(nogil=True, error_model="numpy")
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


@njit(nogil=True, error_model="numpy")
def _record(c: Ctx) -> None:
    for b in range(c.offset.shape[0]):
        if c.offset[b] >= 0:
            c.solution[b] = c.offset[b]


@njit(nogil=True, error_model="numpy")
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


@njit(nogil=True, error_model="numpy")
def _rerank(c: Ctx, sub: np.ndarray, lo: int, hi: int) -> int:
    """NOTE [ residual preorders ]: ``sub`` sorted by the preorder's keys with T from the unplaced
    totals of [lo, hi); its buffers get its old rank values in that order (the caller keeps the
    old ranks to restore). FOUND, or OVERFLOW (nothing changed) when the work stack is full."""
    k = sub.shape[0]
    nkeys = c.letters.shape[0]
    base = _push(c, 4 * k)
    if base < 0:
        return OVERFLOW
    order = c.ws[base : base + k]
    tmp = c.ws[base + k : base + 2 * k]
    values = c.ws[base + 2 * k : base + 3 * k]
    new_sub = c.ws[base + 3 * k : base + 4 * k]
    keys = c.fws[: nkeys * k]
    for j in range(k):
        b = sub[j]
        values[j] = c.rank[b]
        order[j] = j  # sub is in rank order: the tie-break
        for li in range(nkeys):
            letter = c.letters[li]
            if letter == 0:
                key = -c.width[b]
            elif letter == 1:
                key = -c.area[b]
            elif letter == 3:
                key = -c.fsize[b]
            else:
                best = 0
                for s in range(max(c.first[b], lo), min(c.end[b], hi)):
                    best = max(best, c.total[s])
                key = -float(best)
            keys[li * k + j] = key
    _sort_lex(order, keys, nkeys, tmp)
    # The rank values in increasing order (sub is in rank order already: one pass).
    for i in range(1, k):
        x = values[i]
        j = i - 1
        while j >= 0 and values[j] > x:
            values[j + 1] = values[j]
            j -= 1
        values[j + 1] = x
    for j in range(k):
        new_sub[j] = sub[order[j]]
        c.rank[new_sub[j]] = values[j]
    for j in range(k):
        sub[j] = new_sub[j]
    c.count[TOP] = base
    return FOUND


@njit(nogil=True, error_model="numpy")
def _node(c: Ctx, part: np.ndarray, lo: int, hi: int, o: int, last_rank: int) -> int:
    """Search below a node: ``part`` (in rank order) over sections [lo, hi), floor (o, rank).

    One self-recursive function: the node's memo lookup, then the loop over its candidates, each
    placed, checked, recursed into (split where no unplaced buffer crosses, NOTE
    [ decomposition ]) and undone. Its arrays are on the work stack (NOTE [ kernel work stack ]):
    the open buffers and the candidates for the whole node, a part split off while it runs.
    """
    c.count[NODES] += 1
    if c.count[NODES] > c.count[LIMIT]:
        return ABORTED
    if (c.count[NODES] & 255) == 0 and c.stop[0] != 0:
        return TIMEOUT
    mu, size, rank, offset = c.mu, c.size, c.rank, c.offset
    capacity = c.capacity
    _NONE = np.int64(-1)  # not a literal -1: one compiled signature for the recursion
    k = 0
    least = INF
    for b in part:
        if mu[b] < INF:
            k += 1
            least = min(least, mu[b])
    if k == 0:
        _record(c)
        return FOUND
    frame = _push(c, 2 * k)
    if frame < 0:
        return OVERFLOW
    opn = c.ws[frame : frame + k]
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
        c.count[TOP] = frame
        return NOT_FOUND

    # The candidates: NOTE [ canonical placements ] and NOTE [ inference and dominance ].
    min_height = INF
    for b in opn:
        min_height = min(min_height, mu[b] + size[b])
    peak = 0
    for s in range(lo, hi):
        peak = max(peak, c.total[s])
    cands = c.ws[frame + k : frame + 2 * k]
    nc = 0
    for b in opn:
        m = mu[b]
        if m >= min_height or m + peak > capacity or m > c.maxm[b]:
            continue
        if m < o or (m == o and rank[b] <= last_rank):
            continue
        cands[nc] = b
        nc += 1
    scratch = _push(c, nc)
    if scratch < 0:
        c.count[TOP] = frame
        return OVERFLOW
    _sort_by_key(cands[:nc], mu, c.ws[scratch : scratch + nc])  # by minimum offset, then rank
    c.count[TOP] = scratch
    status = NOT_FOUND
    for idx in range(nc):
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
        trail0 = c.count[TRAIL]
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
        c.count[TRAIL] = tp
        for s in range(a, e):
            c.total[s] -= sz
        if not fail:
            # Only the sections of b and of the buffers it raised can have changed.
            c.count[STAMP] += 1
            stamp = c.count[STAMP]
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
                nrest = 0
                for u in opn:
                    if mu[u] < INF:
                        nrest += 1
                if nrest == 0:
                    _record(c)
                slo = lo
                s = a  # the next part ends after the next s in [a, e - 1) that nothing crosses
                for _ in range(nzero + 1 if nrest > 0 else 0):
                    shi = hi
                    while s < e - 1:
                        s += 1
                        if c.cuts[s - 1] == 0:
                            shi = s
                            break
                    cnt = 0
                    for u in opn:
                        if mu[u] < INF and slo <= c.first[u] < shi:
                            cnt += 1
                    if cnt > 0:
                        rerank = c.residual and cnt > 1
                        base = _push(c, 3 * cnt if rerank else cnt)
                        if base < 0:
                            status = OVERFLOW
                            break
                        sub = c.ws[base : base + cnt]
                        j = 0
                        for u in opn:
                            if mu[u] < INF and slo <= c.first[u] < shi:
                                sub[j] = u
                                j += 1
                        if rerank:
                            # NOTE [ residual preorders ]: its own ranks while it runs.
                            given = c.ws[base + cnt : base + 2 * cnt]
                            old = c.ws[base + 2 * cnt : base + 3 * cnt]
                            for q in range(cnt):
                                given[q] = sub[q]
                                old[q] = rank[sub[q]]
                            status = _rerank(c, sub, slo, shi)
                            if status == FOUND:
                                status = _node(c, sub, slo, shi, _NONE, _NONE)
                            for q in range(cnt):
                                rank[given[q]] = old[q]
                        else:
                            status = _node(c, sub, slo, shi, _NONE, _NONE)
                        c.count[TOP] = base
                        if status != FOUND:
                            break
                    slo = shi
            for s in range(a, e - 1):
                c.cuts[s] += 1
        for s in range(a, e):
            c.total[s] += sz
        for t in range(tp - 1, trail0 - 1, -1):
            mu[c.trail_buf[t]] = c.trail_old[t]
        c.count[TRAIL] = trail0
        mu[b] = off
        offset[b] = -1
        if status != NOT_FOUND:
            c.count[TOP] = frame
            return status
        if hatless:
            break  # MiniMalloc's hatless pruning (see the module docstring)
    _memo_add(c, h1, h2)
    c.count[TOP] = frame
    return NOT_FOUND


@njit(nogil=True, error_model="numpy")
def run_part(c: Ctx, part: np.ndarray, lo: int, hi: int) -> int:
    """Search ``part`` (buffer indices in rank order) over sections [lo, hi), split first where no
    unplaced buffer crosses a boundary. Returns FOUND (offsets in ``c.solution``), NOT_FOUND
    (proven), ABORTED (node limit), TIMEOUT (``c.stop`` set) or OVERFLOW (the work stack is too
    small: NOTE [ kernel work stack ])."""
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
                base = _push(c, cnt)
                if base < 0:
                    return OVERFLOW
                sub = c.ws[base : base + cnt]
                j = 0
                for u in part:
                    if start <= c.first[u] <= s:
                        sub[j] = u
                        j += 1
                status = _node(c, sub, start, s + 1, _NONE, _NONE)
                c.count[TOP] = base
                if status != FOUND:
                    return status
            start = s + 1
    return status


@njit(nogil=True, error_model="numpy")
def first_fit(
    size: np.ndarray,
    order: np.ndarray,
    ov_start: np.ndarray,
    ov_buf: np.ndarray,
    offsets: np.ndarray,
    limit: int,
    stop: np.ndarray,
    work: np.ndarray,
) -> int:
    """:func:`memplan.alloc.greedy.first_fit` over the overlap lists, compiled: fills
    ``offsets`` (-1 for buffers not placed) and returns how many of ``order`` it placed (fewer
    when ``stop`` was set, or when an arena would pass ``limit``: then -1 - that count).
    ``work`` holds :func:`memplan.alloc.kernel_layout.first_fit_scratch` entries (else
    SCRATCH_SHORT is returned, nothing placed)."""
    n = size.shape[0]
    most = 0
    for b in range(n):
        most = max(most, ov_start[b + 1] - ov_start[b])
    if work.shape[0] < n + 4 * most:
        return SCRATCH_SHORT
    top = work[:n]
    starts = work[n : n + most]
    ends = work[n + most : n + 2 * most]
    spans = work[n + 2 * most : n + 3 * most]
    tmp = work[n + 3 * most : n + 4 * most]
    for b in range(n):
        top[b] = -1
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
            u = ov_buf[t]
            if top[u] >= 0:
                starts[cnt] = offsets[u]
                ends[cnt] = top[u]
                spans[cnt] = cnt
                cnt += 1
        # By start (the order of equal starts changes nothing below).
        _sort_by_key(spans[:cnt], starts, tmp)
        x = 0
        for i in spans[:cnt]:
            if starts[i] >= x + sz:
                break
            if ends[i] > x:
                x = ends[i]
        if x + sz > limit:
            return -1 - k
        offsets[b] = x
        top[b] = x + sz
    return order.shape[0]
