"""The buffers of the compiled rotor grid DP: header words, status codes and section offsets
(NOTE [ rotor kernel layout ], rotor_kernel.py), shared by the kernel and its caller
(rotor_native.py) without importing numba."""

from __future__ import annotations

OK = 0
INFEASIBLE = 1
"""The top value at the traced budget is infinite: no plan on this grid."""
OVERFLOW = -1
"""A size times the slot count does not fit in int64: the caller rounds in Python ints instead."""
SMALL_BUFFER = -2
"""A buffer is smaller than the layout needs (a bug of the caller)."""
NO_OPTION = -3
"""The backtrack found no option reaching a stored value (a bug: the numpy path asserts)."""
SKIPPED = 2
"""With ``H_MEMORY``: no grid was needed (the memory is below the least-memory lower bound, or
store-all fits); the chain's bounds are in the header."""
STOPPED = -5
"""The stop word (``H_STOP``) was set during the call: nothing usable was computed."""
UNBOUNDED = -4
"""With ``H_MEMORY``: the sizes add up to ``INT64_SAFE`` or more: the bounds need Python ints."""

F_ALL, F_CK, F_N, B = 0, 1, 2, 3
"""Operation codes: the backtrack writes operation ``code`` on ``stage`` as ``4 * stage + code``."""
OPERATIONS = ("F_all", "F_ck", "F_n", "B")
"""Operation names by code."""

# Header of the int64 buffer: inputs, then outputs, then scratch.
H_LENGTH = 0
H_BUDGET = 1
"""Activation budget in bytes (``x[0]`` excluded), as ``slot_sizes`` takes it."""
H_SLOTS = 2
H_EXTRA = 3
"""The top budgets asked are ``capacity .. capacity + extra``; ``W = capacity + extra + 1``."""
H_TRACE = 4
"""Backtrack at ``capacity + H_TRACE`` (-1: no backtrack)."""
H_REACH = 5
"""1: rows over the asked budgets only; 0: every budget of each window (the numpy small mode)."""
H_ROUNDED = 6
"""1: the rounded sizes are given (the caller rounded them): no rounding."""
H_MEMORY = 7
"""Activation memory in bytes (``x[0]`` included): first compute the chain's least-memory bounds
and store-all peak (:func:`memplan.algorithms.chain.least_memory.least_memory_bounds`,
:meth:`Chain.store_all_peak`) and skip the grid when it is not needed; -1: grid only."""
H_CAPACITY = 8
"""Out: the budget in slots."""
H_STATUS = 9
H_OPS = 10
"""Out: operations written by the backtrack (pairs in the ops section)."""
H_CELLS = 11
"""Out: table cells the rows take."""
H_LOWER = 12
"""Out (with ``H_MEMORY``): the least-memory lower bound, bytes."""
H_UPPER = 13
"""Out: the least-memory upper bound (recompute-all's peak)."""
H_STORE_ALL = 14
"""Out: the store-all peak."""
INT64_SAFE = 2**62
"""The sizes adding up to less than this, every sum of them the bounds form is exact in int64."""
H_STOP = 15
"""Set (by another thread) to stop the call within one row of the table: Ctrl-C."""
H_OFFSETS = 16
"""Scratch: the table's section offsets (six words)."""
HEADER = 24
PAIR_ARRAYS = 7
"""L x L int64 arrays after the sizes: lo, hi, first, last, start, top, base."""


class Layout:
    """Sizes and offsets of the four buffers for ``length`` stages and ``width`` budgets.

    int64: the header, the sizes in bytes (``x, s, g, fo, bo``), the same rounded to slots, the
    pair arrays, the backtrack's stack (``4 L + 8`` entries of 4 words) and its operations (at
    most ``L^2 + L``). float64: ``ft``, ``bt`` and the prefix sums of ``ft + bt``. uint64
    bits: the budgets asked of each pair (``ceil(W / 64)`` words each), of each ``b`` by the rows
    above, two scratch rows. The table (float64 or float32): infinity, ``tp`` (L x L), a scratch
    row, ``fprefix``, ``fa_times``, the top values, then the rows (at most every window).
    """

    def __init__(self, length: int, width: int) -> None:
        L, W = length, width
        self.length, self.width = L, W
        sizes = 5 * L + 2
        self.raw = HEADER
        self.rounded = self.raw + sizes
        self.pairs = self.rounded + sizes
        self.stack = self.pairs + PAIR_ARRAYS * L * L
        self.ops = self.stack + 4 * (4 * L + 8)
        self.ints = self.ops + L * L + L
        self.floats = 3 * L + 1
        self.words = (W + 63) // 64
        self.bits = (L * L + L + 2) * self.words
        self.t_tp = 2
        self.t_found = self.t_tp + L * L
        self.t_fprefix = self.t_found + W
        self.t_fa = self.t_fprefix + L + 1
        self.t_top = self.t_fa + L
        self.t_rows = self.t_top + W
        self.table = self.t_rows + L * (L + 1) // 2 * W
