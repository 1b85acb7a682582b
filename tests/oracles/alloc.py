"""Python references of the allocation search and the greedy first fit, which the compiled core
(src/alloc.cpp) is tested against node for node and placement for placement
(tests/alloc/test_core.py).

This is the search of memplan/alloc/search.py's NOTEs as memplan ran it compiled before the core
(numba, then one C++ function per run): one depth-first search of one part at one capacity under
one preorder and a node limit (:func:`run_part`, with :class:`Ctx` its state and work stack), the
round robin of NOTE [ compiled restarts ] (:func:`solve_part`), and the first fit
(:func:`first_fit`). It is slow (a Python loop per node): the tests run it on small instances.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

MAX_ARENA = 2**61
"""The largest arena placed exactly (docs/alloc.md, *Exact arithmetic*)."""


class ArenaTooLarge(ValueError):
    """A greedy placement would need an arena above :data:`MAX_ARENA`."""


class Tables:
    """The static data of an instance (buffers of positive size) that the search reads, built here
    with plain loops from the lifetimes ``[lower, upper)`` and the sizes: the sections (time
    between consecutive endpoints), the buffers live in each (by first section, then index) and
    their totals, the buffers crossing each boundary between sections, the buffers live at the
    same time as each (those starting after it in (start, index) order first, then the others by
    index), the stacked twins (the other buffers of the same lifetime, by index) and MiniMalloc's
    preorders. memplan builds the same tables with numpy (memplan/alloc/instance.py); the tests
    compare them entry for entry.
    """

    def __init__(self, lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> None:
        low, up, sz = [int(x) for x in lower], [int(x) for x in upper], [int(x) for x in size]
        self.n = n = len(sz)
        self.lower = np.array(low, dtype=np.int64)
        self.upper = np.array(up, dtype=np.int64)
        self.size = np.array(sz, dtype=np.int64)
        points = sorted(set(low) | set(up))
        where = {p: k for k, p in enumerate(points)}
        first = [where[x] for x in low]
        end = [where[x] for x in up]
        self.sections = sections = max(len(points) - 1, 0)
        self.first = np.array(first, dtype=np.int64)
        self.end = np.array(end, dtype=np.int64)
        live: list[list[int]] = [[] for _ in range(sections)]
        for b in sorted(range(n), key=lambda b: (first[b], b)):
            for s in range(first[b], end[b]):
                live[s].append(b)
        self.sec_start, self.sec_buf = _csr(live)
        total = [sum(sz[b] for b in bufs) for bufs in live]
        self.section_total = np.array(total, dtype=np.int64)
        self.buffer_total = np.array(
            [max(total[first[b] : end[b]]) for b in range(n)], dtype=np.int64
        )
        self.cuts = np.array(
            [sum(1 for b in live[s] if end[b] > s + 1) for s in range(sections - 1)],
            dtype=np.int64,
        )
        by_start = sorted(range(n), key=lambda b: (low[b], b))
        position = {b: k for k, b in enumerate(by_start)}
        meets: list[list[int]] = []
        for b in range(n):
            others = [u for u in range(n) if u != b and low[u] < up[b] and low[b] < up[u]]
            later = sorted((u for u in others if position[u] > position[b]), key=position.get)
            meets.append(later + [u for u in others if position[u] < position[b]])
        self.ov_start, self.ov_buf = _csr(meets)
        twins = [
            [u for u in range(n) if u != b and (low[u], up[u]) == (low[b], up[b])] for b in range(n)
        ]
        self.tw_start, self.tw_buf = _csr(twins)

    def preorder(self, heuristic: str) -> np.ndarray:
        """Ranks of the buffers under MiniMalloc's keys (W lifetime, A area, T largest section
        total, Z size), descending in the order of ``heuristic``, the index breaking ties."""
        width = (self.upper - self.lower).tolist()
        keys = {
            "W": width,
            "A": [w * int(s) for w, s in zip(width, self.size.tolist(), strict=True)],
            "T": self.buffer_total.tolist(),
            "Z": self.size.tolist(),
        }
        order = sorted(range(self.n), key=lambda b: (*(-keys[c][b] for c in heuristic), b))
        rank = np.empty(self.n, dtype=np.int64)
        rank[order] = np.arange(self.n)
        return rank


def _csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    start = np.zeros(len(lists) + 1, dtype=np.int64)
    start[1:] = np.cumsum([len(x) for x in lists])
    flat = [u for x in lists for u in x]
    return start, np.array(flat, dtype=np.int64)


FOUND, NOT_FOUND, ABORTED, TIMEOUT, OVERFLOW = 1, 0, -1, -2, -3
INF = 2**62
NODES, LIMIT, TRAIL, STAMP, TOP, PEAK = 0, 1, 2, 3, 4, 5
COUNTERS = 6
STACK_CAP = 2**25
_MASK = 2**64 - 1
COMPILED_RUNS = (
    ("TWA", False, True),
    ("TWA", True, False),
    ("TAW", False, True),
    ("TAW", True, False),
    ("WAT", False, True),
    ("WAT", True, False),
)
_TIGHT_BUDGET = 8


def stack_size(part: int) -> int:
    """NOTE [ kernel work stack ] (src/alloc.cpp): entries a search of ``part`` buffers may use."""
    return 5 * part * (part + 1) // 2 + 5 * part + 1


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
    memo1: np.ndarray  # NOTE [ compiled failed-state memo ] (memplan/alloc/kernel.py)
    memo2: np.ndarray
    count: np.ndarray  # nodes, node limit, trail top, stamp, work-stack top, its peak
    stop: np.ndarray  # set by the caller: stop within 256 nodes
    ws: np.ndarray  # NOTE [ kernel work stack ]: int64 entries
    fws: np.ndarray  # float64 scratch: len(letters) keys per buffer
    capacity: int
    residual: bool
    run: int


@dataclass
class Scratch:
    """The work stack and the float scratch of the re-rankings, kept across the runs."""

    ws: np.ndarray
    fws: np.ndarray

    @classmethod
    def for_part(cls, buffers: int, n: int) -> Scratch:
        entries = min(stack_size(buffers), STACK_CAP)
        return cls(np.empty(entries, dtype=np.int64), np.empty(4 * n, dtype=np.float64))

    def grow(self) -> None:
        self.ws = np.empty(2 * len(self.ws) + 1, dtype=np.int64)


def memo_table(slots: int) -> tuple[np.ndarray, np.ndarray]:
    """An empty failed-state table of ``slots`` entries (a power of two, at least 4)."""
    return np.zeros(slots, dtype=np.uint64), np.zeros(slots, dtype=np.uint64)


def make_ctx(
    inst: Tables,
    capacity: int,
    rank: np.ndarray,
    heuristic: str | None,
    residual: bool,
    run: int,
    node_limit: int,
    memo: tuple[np.ndarray, np.ndarray] | None = None,
    twins: bool = True,
    scratch: Scratch | None = None,
) -> Ctx:
    """A fresh :class:`Ctx` for one run (nothing placed yet); without
    ``twins`` the stacked-twin rule is off (empty twin lists). ``scratch`` is the work stack
    (one for the whole instance when None)."""
    n, sections = inst.n, inst.sections
    letters = {"W": 0, "A": 1, "T": 2, "Z": 3}
    keys = (heuristic or "T").rstrip("0123456789")
    memo1, memo2 = memo if memo is not None else memo_table(1024)
    size = inst.size.astype(np.int64)
    width = (inst.upper - inst.lower).astype(np.float64)
    if scratch is None:
        scratch = Scratch.for_part(n, n)
    if len(scratch.fws) < len(keys) * n:
        scratch.fws = np.empty(len(keys) * n, dtype=np.float64)
    count = np.zeros(COUNTERS, dtype=np.int64)
    count[LIMIT] = node_limit
    return Ctx(
        first=inst.first,
        end=inst.end,
        size=size,
        maxm=np.int64(capacity) - size,
        sec_start=inst.sec_start,
        sec_buf=inst.sec_buf,
        ov_start=inst.ov_start,
        ov_buf=inst.ov_buf,
        tw_start=inst.tw_start if twins else np.zeros(n + 1, dtype=np.int64),
        tw_buf=inst.tw_buf if twins else np.zeros(0, dtype=np.int64),
        width=width,
        area=width * size.astype(np.float64),
        fsize=size.astype(np.float64),
        letters=np.array([letters[c] for c in keys], dtype=np.int64),
        mu=np.zeros(n, dtype=np.int64),
        offset=np.full(n, -1, dtype=np.int64),
        solution=np.full(n, -1, dtype=np.int64),
        total=inst.section_total.copy(),
        cuts=inst.cuts.copy(),
        rank=rank.astype(np.int64).copy(),
        trail_buf=np.zeros(len(inst.ov_buf) + 1, dtype=np.int64),
        trail_old=np.zeros(len(inst.ov_buf) + 1, dtype=np.int64),
        sec_stamp=np.zeros(sections, dtype=np.int64),
        memo1=memo1,
        memo2=memo2,
        count=count,
        stop=np.zeros(1, dtype=np.int64),
        ws=scratch.ws,
        fws=scratch.fws,
        capacity=int(capacity),
        residual=bool(residual),
        run=int(run),
    )


_RUN = 16
"""Runs this short are sorted by insertion before the merges."""


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


def _mix(h: int, x: int) -> int:
    """One step of a 64-bit hash (splitmix64's finalizer over ``h ^ x``, ``x >= 0``)."""
    z = ((int(h) ^ int(x)) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _memo_find(c: Ctx, h1: np.uint64, h2: np.uint64) -> bool:
    mask = c.memo1.shape[0] - 4
    base = int(h1 & mask)
    return any(c.memo1[base + k] == h1 and c.memo2[base + k] == h2 for k in range(4))


def _memo_add(c: Ctx, h1: np.uint64, h2: np.uint64) -> None:
    mask = c.memo1.shape[0] - 4
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


def _record(c: Ctx) -> None:
    for b in range(c.offset.shape[0]):
        if c.offset[b] >= 0:
            c.solution[b] = c.offset[b]


def _section_fits(c: Ctx, s: int) -> bool:
    """Section inference: some unplaced buffer of section ``s`` can start low enough for all its
    unplaced bytes to fit above it (the least minimum offset is the section's floor). The floor
    set by the last placement (its offset) is checked once per node, against the largest total.
    """
    tot = c.total[s]
    if tot <= 0:
        return True
    threshold = c.capacity - tot
    return any(c.mu[c.sec_buf[i]] <= threshold for i in range(c.sec_start[s], c.sec_start[s + 1]))


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
    h1 = _mix(0x243F6A8885A308D3, c.run)
    h2 = _mix(0x13198A2E03707344, c.run)
    for x in (lo, hi, o + 1, tie + 1):  # all >= 0
        h1 = _mix(h1, x)
        h2 = _mix(h2, x)
    for b in opn:
        h1 = _mix(_mix(h1, b), mu[b])
        h2 = _mix(_mix(h2, mu[b]), b)
    if h1 == 0:
        h1 = 1
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


def solve_part(
    inst: Tables,
    capacity: int,
    buffers: np.ndarray,
    lo: int,
    hi: int,
    memo: tuple[np.ndarray, np.ndarray],
    deadline: float | None,
    stats: dict[str, int],
    tight: bool = True,
) -> tuple[int, np.ndarray | None]:
    """Solve one static part with the compiled kernel (NOTE [ compiled restarts ]): with
    ``tight``, at the part's peak live load first, with a small node budget, when the capacity
    has slack; then at the capacity."""
    part_peak = int(inst.section_total[lo:hi].max()) if hi > lo else 0
    if tight and part_peak < capacity:
        tight = dict(stats, budget=stats.get("nodes", 0) + _TIGHT_BUDGET * len(buffers))
        if stats.get("budget") is not None:
            tight["budget"] = min(tight["budget"], stats["budget"])
        status, solution = _rotate(inst, part_peak, buffers, lo, hi, memo, deadline, tight, 1)
        stats["nodes"] = tight.get("nodes", 0)
        if status in (FOUND, TIMEOUT):
            return status, solution
    return _rotate(inst, capacity, buffers, lo, hi, memo, deadline, stats, 0)


_TIGHT_BUDGET = 8
"""Nodes per buffer of the search at the peak live load before the one at the capacity."""


def _rotate(
    inst: Tables,
    capacity: int,
    buffers: np.ndarray,
    lo: int,
    hi: int,
    memo: tuple[np.ndarray, np.ndarray],
    deadline: float | None,
    stats: dict[str, int],
    salt: int,
) -> tuple[int, np.ndarray | None]:
    """The round robin of :data:`COMPILED_RUNS` at one capacity, the node limit doubling every
    round; ``salt`` keeps the memo's keys of different capacities apart."""
    runs = COMPILED_RUNS
    ranks = [inst.preorder(heuristic) for heuristic, _, _ in runs]
    scratch = Scratch.for_part(len(buffers), inst.n)
    limit = max(len(buffers), 16)
    while True:
        limit *= 2
        for index, ((heuristic, residual, twins), rank) in enumerate(zip(runs, ranks, strict=True)):
            budget = stats.get("budget")
            run_limit = limit
            if budget is not None:
                run_limit = min(limit, budget - stats.get("nodes", 0))
                if run_limit <= 0:
                    return ABORTED, None
            part = buffers[np.argsort(rank[buffers], kind="stable")]
            while True:
                ctx = make_ctx(
                    inst,
                    capacity,
                    rank,
                    heuristic,
                    residual,
                    2 * index + salt,
                    run_limit,
                    memo,
                    twins,
                    scratch,
                )
                status = run_part(ctx, part, lo, hi)
                if status != OVERFLOW:
                    break
                scratch.grow()  # NOTE [ kernel work stack ]: run again with room to go deeper
            stats["nodes"] = stats.get("nodes", 0) + min(int(ctx.count[0]), run_limit)
            if status == FOUND:
                return FOUND, ctx.solution
            if status in (NOT_FOUND, TIMEOUT):
                return status, None


def first_fit(
    lower: np.ndarray,
    upper: np.ndarray,
    size: np.ndarray,
    order: np.ndarray,
    deadline: float | None = None,
    graph: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Offsets from placing the buffers in ``order``, each at its lowest free address.

    O(Q log Q) for Q pairs of buffers live at the same time, with ``graph`` (the CSR of
    :func:`memplan.alloc.lifetimes.overlaps`); without it, O(n) numpy work per buffer. At
    ``deadline`` the rest are stacked above the arena. Raises :class:`ArenaTooLarge` when the
    arena would pass ``MAX_ARENA``.
    """
    n = len(size)
    offsets = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    # Python lists: a few dozen neighbours per buffer are faster to scan than to hand to numpy.
    off_l = [0] * n
    top_l = [-1] * n  # -1 until placed (a placed buffer of size > 0 has top >= 1)
    size_l = size.tolist()
    arena = 0
    todo = order.tolist()
    if graph is not None:
        start_l = graph[0].tolist()
        buf = graph[1]
    for k, b in enumerate(todo):
        if deadline is not None and (k & 63) == 0 and time.perf_counter() > deadline:
            rest = order[k:]
            rest = rest[size[rest] > 0]
            if rest.size:
                tops = arena + np.cumsum(size[rest])
                if int(tops[-1]) > MAX_ARENA:
                    raise ArenaTooLarge(int(tops[-1]))
                offsets[rest] = tops - size[rest]
            break
        sz = size_l[b]
        if sz <= 0:
            continue
        if graph is not None:
            near = buf[start_l[b] : start_l[b + 1]].tolist()
            spans = sorted((off_l[u], top_l[u]) for u in near if top_l[u] >= 0)
        else:
            others = np.flatnonzero(placed & (lower < upper[b]) & (lower[b] < upper)).tolist()
            spans = sorted((off_l[u], top_l[u]) for u in others)
        x = 0
        for s0, e0 in spans:
            if s0 >= x + sz:
                break
            if e0 > x:
                x = e0
        if x + sz > MAX_ARENA:
            raise ArenaTooLarge(x + sz)
        off_l[b] = x
        top_l[b] = x + sz
        placed[b] = True
        arena = max(arena, x + sz)
    done = np.array(top_l) >= 0
    offsets[done] = np.array(off_l, dtype=np.int64)[done]
    return offsets
