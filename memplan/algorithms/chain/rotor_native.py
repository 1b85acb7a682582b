"""Running the compiled rotor grid DP (rotor_kernel.py) through :mod:`memplan.native`.

:func:`solve_grid` is the compiled counterpart of rotor_grid.py's ``grid_table`` followed by
``grid_backtrack``: the same values where they are read and the same plans
(NOTE [ rotor kernel layout ], rotor_kernel.py), in one call without numpy's per-sub-chain
overhead. It needs the ``fast`` extra (numba) once, to build the object code; later processes load
it without importing numba. Without it, or with ``MEMPLAN_NATIVE=0``, :func:`available` is False
and rotor.py runs the numpy path unchanged.

``python -m memplan.native`` builds (and caches) the object code now.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
import weakref
from typing import Any

import numpy as np

from memplan import native
from memplan.algorithms.base import Sequence
from memplan.algorithms.chain.problem import Chain
from memplan.algorithms.chain.rotor_layout import (
    H_CAPACITY,
    H_EXTRA,
    H_LOWER,
    H_OPS,
    H_ROUNDED,
    H_STATUS,
    H_STOP,
    H_STORE_ALL,
    H_TRACE,
    H_UPPER,
    HEADER,
    INFEASIBLE,
    NO_OPTION,
    OK,
    OPERATIONS,
    OVERFLOW,
    SKIPPED,
    STOPPED,
    UNBOUNDED,
    Layout,
)

KERNEL = "memplan.algorithms.chain.rotor_cfuncs"
SOURCES = ("memplan.algorithms.chain.rotor_kernel", "memplan.algorithms.chain.rotor_layout")
_BUFFERS = native.Prototype(
    ctypes.c_int64,
    (
        ctypes.c_void_p,  # int64 words
        ctypes.c_int64,
        ctypes.c_void_p,  # float64 words
        ctypes.c_int64,
        ctypes.c_void_p,  # uint64 bit sets
        ctypes.c_int64,
        ctypes.c_void_p,  # table cells
        ctypes.c_int64,
    ),
)
PROTOTYPES = {name: _BUFFERS for name in ("grid_f64", "grid_f32", "trace_f64", "trace_f32")}
"""Entry name -> C signature of rotor_cfuncs.py's cfuncs (each: the four buffers and lengths)."""

STOPPABLE_CELLS = 20_000_000
"""Grids of more than about this many cells (``L^3 W / 6``, some 10 ms of work) run in a worker
thread that Ctrl-C stops (NOTE [ interrupts ], memplan/interrupt.py); smaller ones run in the
calling thread (a thread costs some 100 us)."""

_GRACE = 5.0
"""Seconds an interrupted kernel may take to return (one row of its table: milliseconds)."""

KEEP_BYTES = 8 * 2**20
"""Buffers up to this size are kept for the thread's next call (sparing small solves the
allocation); larger ones are freed after it (8 MB: 60 stages at 500 slots)."""

_STATE: dict[str, Any] = {}
_LOCK = threading.Lock()
_LOCAL = threading.local()


def load() -> dict[str, Any] | None:
    """The kernel's entry points (built on the first use after an install, then loaded from the
    cache), or None when native kernels are unavailable here (:func:`load_error` says why)."""
    entries = _STATE.get("entries")
    if entries is not None or "error" in _STATE:
        return entries
    with _LOCK:
        if "entries" not in _STATE and "error" not in _STATE:
            try:
                _STATE["entries"] = native.load(KERNEL, PROTOTYPES, sources=SOURCES)
            except native.NativeUnavailable as exc:
                _STATE["error"] = exc
    return _STATE.get("entries")


def available() -> bool:
    """Whether the compiled grid DP runs here (loading it if needed)."""
    if "MEMPLAN_NATIVE" in os.environ and native.disabled():
        return False
    return load() is not None


def load_error() -> BaseException | None:
    """Why the kernel is unavailable, if it is."""
    return _STATE.get("error")


class _Buffer:
    """A numpy array and its address (reading ``.ctypes.data`` costs a microsecond)."""

    __slots__ = ("array", "address")

    def __init__(self, size: int, dtype: Any) -> None:
        self.array = np.empty(size, dtype=dtype)
        self.address = self.array.ctypes.data


@functools.lru_cache(maxsize=64)
def _layout(length: int, width: int) -> Layout:
    return Layout(length, width)


def _buffer(name: str, size: int, dtype: Any) -> _Buffer:
    """This thread's buffer ``name`` of at least ``size`` items, kept between calls when small."""
    kept: dict[str, _Buffer] = _LOCAL.__dict__.setdefault("buffers", {})
    found = kept.get(name)
    if found is not None and len(found.array) >= size:
        return found
    made = _Buffer(max(size, 2 * len(found.array)) if found is not None else size, dtype)
    if made.array.nbytes <= KEEP_BYTES:
        kept[name] = made
    return made


class CompiledGrid:
    """A table the kernel filled: its budget in slots, its plan, its top values, more backtracks.

    It lives in this thread's buffers: valid until the thread's next :func:`solve_grid`.
    """

    def __init__(
        self,
        ints: _Buffer,
        floats: _Buffer,
        bits: _Buffer,
        table: _Buffer,
        layout: Layout,
        trace_entry: Any,
        durations: list[float],
    ) -> None:
        self._buffers = (ints, floats, bits, table)
        self._layout = layout
        self._trace = trace_entry
        self._generation = _LOCAL.generation
        self._durations = durations
        header = ints.array[:HEADER].tolist()
        self.capacity: int = header[H_CAPACITY]
        """The budget in slots (as ``slot_sizes``)."""
        self.status: int = header[H_STATUS]
        """``OK``, ``INFEASIBLE`` (no plan at the traced budget), or with ``memory`` ``SKIPPED``
        / ``UNBOUNDED`` (rotor_layout.py)."""
        self.extra: int = header[H_EXTRA]
        self.bounds: tuple[int, int, int] = (header[H_LOWER], header[H_UPPER], header[H_STORE_ALL])
        """With ``memory``: the least-memory bounds and the store-all peak (bytes)."""
        self.sequence: Sequence | None = None
        """The plan at ``capacity`` when traced; None when there is none (or not traced)."""
        self.makespan: float = math.inf
        """``Chain.makespan`` of :attr:`sequence` (the same sum)."""
        if self.status == OK and header[H_OPS] > 0:
            self.sequence, self.makespan = self._plan(header[H_OPS])

    def _plan(self, count: int) -> tuple[Sequence, float]:
        """The ``count`` operations the backtrack wrote, and their total time added up in the
        order of :meth:`Chain.makespan` (hence the same float)."""
        layout = self._layout
        codes = self._buffers[0].array[layout.ops : layout.ops + count].tolist()
        sequence = list(map(_operation_names(layout.length).__getitem__, codes))
        return sequence, float(sum(map(self._durations.__getitem__, codes)))

    def _live(self) -> tuple[np.ndarray, ...]:
        if _LOCAL.generation != self._generation:  # pragma: no cover - a caller's bug
            raise RuntimeError("rotor kernel: this table was overwritten by a later solve_grid")
        return tuple(buffer.array for buffer in self._buffers)

    def top_values(self) -> list[float]:
        """``opt(0, L-1)`` at the budgets ``capacity .. capacity + extra`` (slots)."""
        table = self._live()[3]
        return table[self._layout.t_top : self._layout.t_top + self.extra + 1].tolist()

    def backtrack(self, budget: int) -> Sequence | None:
        """The plan at ``budget`` (``capacity .. capacity + extra``); None if there is none."""
        ints = self._live()[0]
        ints[H_TRACE] = budget - self.capacity
        status = _call(self._trace, *self._buffers)
        if status == INFEASIBLE:
            return None
        _check(status)
        return self._plan(int(ints[H_OPS]))[0]

    def asked(self, a: int, b: int) -> list[int]:
        """The budgets the top problem asks of the sub-chain ``(a, b)`` (for the checks)."""
        bits = self._live()[2]
        layout, length = self._layout, self._layout.length
        words = bits[(a * length + b) * layout.words : (a * length + b + 1) * layout.words]
        return [
            64 * w + i for w, word in enumerate(words.tolist()) for i in range(64) if word >> i & 1
        ]

    def value(self, a: int, b: int, budget: int) -> float:
        """``opt(a, b)(budget)`` as the kernel reads it (NOTE [ rotor kernel layout ])."""
        ints, _, _, table = self._live()
        layout, length = self._layout, self._layout.length
        pair, square = a * length + b, length * length
        start, top, base = (int(ints[layout.pairs + k * square + pair]) for k in (4, 5, 6))
        if budget >= top:
            return float(table[layout.t_tp + pair])
        if budget < start:
            return math.inf
        return float(table[layout.t_rows + base + budget - start])


def _call(entry: Any, ints: _Buffer, floats: _Buffer, bits: _Buffer, table: _Buffer) -> int:
    return entry(
        ints.address,
        len(ints.array),
        floats.address,
        len(floats.array),
        bits.address,
        len(bits.array),
        table.address,
        len(table.array),
    )


def _call_stoppable(
    entry: Any, ints: _Buffer, floats: _Buffer, bits: _Buffer, table: _Buffer
) -> int:
    """:func:`_call` in a worker thread while this one waits: a ``KeyboardInterrupt`` here sets
    the kernel's stop word (``H_STOP``), the kernel returns within one row of its table, and the
    interrupt goes on (NOTE [ interrupts ], memplan/interrupt.py).

    An interrupt may also come while ``start()`` waits for the new thread, which then may or may
    not run: this thread's buffers are dropped (a kernel starting late sees the stop word, but
    must not write into the buffers of a later call) and the wait for it is bounded.
    """
    box: list[int] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(_call(entry, ints, floats, bits, table))
        finally:
            done.set()

    worker = threading.Thread(target=run, name="memplan-rotor-kernel", daemon=True)
    try:
        worker.start()
        while not done.wait(0.05):
            pass
    except BaseException:
        ints.array[H_STOP] = 1
        _LOCAL.__dict__.pop("buffers", None)
        done.wait(_GRACE)
        raise
    return box[0]


def _check(status: int) -> None:
    if status == NO_OPTION:  # pragma: no cover - the table holds one of the options' values
        raise AssertionError("rotor kernel: no option reaches a value of the table")
    if status == STOPPED:  # pragma: no cover - only with a KeyboardInterrupt on its way
        raise KeyboardInterrupt
    if status not in (OK, INFEASIBLE, SKIPPED, UNBOUNDED):  # pragma: no cover - buffers sized
        raise AssertionError(f"rotor kernel: status {status}")


class _ChainData:
    """A chain's sizes and times as the kernel reads them, and the duration of each operation
    code (``4 * stage + code``): this thread's last chain is kept, and so is what it copied into
    the buffers, so that solving the same chain again copies nothing."""

    __slots__ = ("chain", "sizes", "times", "durations")

    def __init__(self, chain: Chain) -> None:
        self.chain = weakref.ref(chain)
        self.sizes = np.concatenate((chain.x, chain.s, chain.g, chain.fo, chain.bo))
        self.times = np.concatenate((chain.ft, chain.bt))
        ft, bt = chain.ft.tolist(), chain.bt.tolist()
        self.durations = [d for f, b in zip(ft, bt, strict=True) for d in (f, f, f, b)]


def _chain_data(chain: Chain) -> _ChainData:
    found: _ChainData | None = getattr(_LOCAL, "chain", None)
    if found is None or found.chain() is not chain:
        found = _LOCAL.chain = _ChainData(chain)
    return found


@functools.lru_cache(maxsize=32)
def _operation_names(length: int) -> list[tuple[str, int]]:
    """The operation ``4 * stage + code`` of the kernel as ``(name, stage)``."""
    return [(name, stage) for stage in range(length) for name in OPERATIONS]


def solve_grid(
    chain: Chain,
    budget: int,
    slots: int,
    *,
    extra: int = 0,
    dtype: Any = np.float64,
    trace: bool = True,
    reach: bool = True,
    memory: int | None = None,
) -> CompiledGrid:
    """Round the sizes to ``slots`` slots of the activation ``budget`` (bytes, as
    :func:`memplan.algorithms.chain.rotor.slot_sizes`), fill the table for the top budgets
    ``capacity .. capacity + extra`` and, with ``trace``, backtrack at ``capacity``.

    With ``memory`` (activation bytes, ``x[0]`` included; ``budget = memory - x[0]``), the
    chain's least-memory bounds and store-all peak come first (:attr:`CompiledGrid.bounds`), and
    the grid is skipped (status ``SKIPPED``) when the memory is below the lower bound or
    store-all fits; status ``UNBOUNDED`` when the sizes are too large for exact int64 bounds
    (nothing done). ``reach=False`` fills every budget of each sub-chain's window (the numpy
    path's small mode; for the tests). Raises :class:`memplan.native.NativeUnavailable` when
    the kernel is unavailable (check :func:`available` first).
    """
    entries = load()
    if entries is None:
        raise native.NativeUnavailable(str(load_error()))
    _LOCAL.generation = getattr(_LOCAL, "generation", 0) + 1
    f32 = dtype is np.float32 or (dtype is not np.float64 and np.dtype(dtype) == np.float32)
    L = chain.length
    capacity = max(0, budget if budget <= slots else slots)
    layout = _layout(L, capacity + extra + 1)
    ints = _buffer("ints", layout.ints, np.int64)
    floats = _buffer("floats", layout.floats, np.float64)
    bits = _buffer("bits", layout.bits, np.uint64)
    table = _buffer(
        "table32" if f32 else "table64", layout.table, np.float32 if f32 else np.float64
    )
    words = ints.array
    header = (L, budget, slots, extra, 0 if trace else -1, 1 if reach else 0, 0)
    words[:8] = (*header, -1 if memory is None else memory)
    words[H_STOP] = 0
    data = _chain_data(chain)
    copied = _LOCAL.__dict__.get("copied")
    if copied is None or copied[0] is not data or copied[1] is not ints or copied[2] is not floats:
        words[layout.raw : layout.rounded] = data.sizes
        floats.array[: 2 * L] = data.times
        kept = _LOCAL.buffers
        # remembered only for kept buffers (a large one must be freed after the call)
        reused = kept.get("ints") is ints and kept.get("floats") is floats
        _LOCAL.copied = (data, ints, floats) if reused else None
    grid_entry = entries["grid_f32" if f32 else "grid_f64"]
    big = L**3 * layout.width > 6 * STOPPABLE_CELLS
    run = (
        _call_stoppable if big and threading.current_thread() is threading.main_thread() else _call
    )
    status = run(grid_entry, ints, floats, bits, table)
    if status == OVERFLOW:  # sizes too large to round in int64: round in Python ints
        from memplan.algorithms.chain.rotor import slot_sizes

        rounded = slot_sizes(chain, budget, slots)[1]
        sizes = np.concatenate([rounded[k] for k in ("x", "s", "g", "fo", "bo")])
        words[layout.rounded : layout.rounded + 5 * L + 2] = sizes
        words[H_ROUNDED] = 1
        status = run(grid_entry, ints, floats, bits, table)
    _check(status)
    return CompiledGrid(
        ints,
        floats,
        bits,
        table,
        layout,
        entries["trace_f32" if f32 else "trace_f64"],
        data.durations,
    )
