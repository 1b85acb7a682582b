"""What the compiled allocation search (:mod:`memplan.alloc.kernel`) and its callers share, without
numba: the arrays of one search (:class:`Ctx`), the statuses and counters, the size of the work
stack, and the C signatures of the native entry points (:mod:`memplan.alloc.kernel_cfuncs`,
loaded by :mod:`memplan.native`).

NOTE [ kernel work stack ]
The native kernel must not allocate (NOTE [ native kernels do not allocate ] in
memplan/native.py), so the arrays a node of the search needs (its open buffers, its candidates,
the buffers of a part split off, the ranks a residual preorder replaces, and the scratch of the
in-place sorts) are taken from one int64 work stack ``Ctx.ws`` (top in ``count[TOP]``) and one
float64 scratch ``Ctx.fws`` (the keys of one re-ranking at a time), handed in by the caller. A
node with k open buffers keeps at most 5k entries while its subtree runs (open buffers, candidates,
and for a part split off its buffers, their given order and old ranks, each at most k) and needs
at most 4k more for a moment (sorts, re-ranking); the open buffers of a child are fewer than its
parent's, so a part of p buffers never needs more than 5p(p+1)/2 + 5p + 1 entries
(:func:`stack_size`). The caller sizes the stack from that bound (np.empty: pages are touched only
when the search goes that deep), capped at :data:`STACK_CAP`; should a search still run out, it
returns :data:`OVERFLOW` and the caller runs it again with a stack twice as large.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np

FOUND, NOT_FOUND, ABORTED, TIMEOUT, OVERFLOW = 1, 0, -1, -2, -3
INF = 2**62
# Counters in Ctx.count: nodes, node limit, trail top, section stamp, work-stack top and the
# highest it reached.
NODES, LIMIT, TRAIL, STAMP, TOP, PEAK = 0, 1, 2, 3, 4, 5
COUNTERS = 6
STACK_CAP = 2**25
"""Entries of the work stack a search starts with at most (256 MiB of address space; only the
part the search reaches is ever touched): beyond, it grows on :data:`OVERFLOW`."""


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


FLOAT_FIELDS = frozenset({"width", "area", "fsize", "fws"})
UINT_FIELDS = frozenset({"memo1", "memo2"})
ARRAY_FIELDS = Ctx._fields[:-3]
"""The array fields of :class:`Ctx`, in order: the native ``run_part`` takes them as (address,
length) pairs in one int64 descriptor, then the part's pair."""


def dtype_of(field: str) -> type[np.generic]:
    """The dtype of an array field of :class:`Ctx`."""
    if field in FLOAT_FIELDS:
        return np.float64
    if field in UINT_FIELDS:
        return np.uint64
    return np.int64


def stack_size(part: int) -> int:
    """NOTE [ kernel work stack ]: entries a search of a part of ``part`` buffers may use."""
    return 5 * part * (part + 1) // 2 + 5 * part + 1


def first_fit_scratch(n: int, most_overlaps: int) -> int:
    """Entries of the work array of ``first_fit``: the tops of ``n`` buffers, then the starts,
    ends and merge scratch of one buffer's ``most_overlaps`` placed neighbours."""
    return n + 4 * most_overlaps + 1


_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
RUN_PART = (_I64, (_PTR, _I64, _I64, _I64, _I64, _I64))
"""``run_part(descriptor, capacity, residual, run, lo, hi)``: the descriptor holds (address,
length) of every array of :data:`ARRAY_FIELDS`, then of the part."""
FIRST_FIT = (_I64, (_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64))
"""``first_fit(size, order, ov_start, ov_buf, offsets, stop, work, n, n_order, n_ov_buf, n_work,
limit)``: ``size`` and ``offsets`` have ``n`` entries, ``ov_start`` ``n + 1``."""
SCRATCH_SHORT = -(2**62)
"""What ``first_fit`` returns when its work array is smaller than :func:`first_fit_scratch`."""
