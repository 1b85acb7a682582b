"""Running the compiled search (:mod:`memplan.alloc.kernel`) from Python: loading its native
entry points, and one call in a worker thread that the caller can stop.

The search is compiled once per installation (numba, the ``fast`` extra) into machine code that
:mod:`memplan.native` keeps in a cache directory and loads later without importing numba
(:mod:`memplan.alloc.kernel_cfuncs`); :func:`load` returns None when that is not possible
(numba and the cache both missing, ``MEMPLAN_NATIVE=0``, a failed build), and the numpy search of
:mod:`memplan.alloc.search` runs instead. The kernel runs in its own thread (a ctypes call
releases the GIL), with a stack sized for its recursion (one frame per placed buffer and split),
while the calling thread waits: at the deadline, or on Ctrl-C (KeyboardInterrupt, which reaches
only the main thread), it sets the kernel's stop flag, and the kernel returns within 256 nodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from memplan.alloc.kernel_layout import (
    ABORTED,
    ARRAY_FIELDS,
    COUNTERS,
    FIRST_FIT,
    FOUND,
    LIMIT,
    NOT_FOUND,
    OVERFLOW,
    RUN_PART,
    SCRATCH_SHORT,
    STACK_CAP,
    TIMEOUT,
    Ctx,
    dtype_of,
    first_fit_scratch,
    stack_size,
)

__all__ = [
    "ABORTED",
    "FOUND",
    "NOT_FOUND",
    "OVERFLOW",
    "TIMEOUT",
    "Kernel",
    "Scratch",
    "available",
    "call",
    "call_stoppable",
    "load",
    "load_error",
    "loaded",
    "make_ctx",
    "memo_table",
]

_STATE: dict[str, Any] = {}
_MIN_WAIT = 0.25
"""Seconds of time left below which the kernel is not even started loading."""
_GRACE = 1.0
"""Seconds a stopped kernel call may take to return before it is left behind (only a first
build, which cannot be interrupted, takes that long)."""
CFUNCS = "memplan.alloc.kernel_cfuncs"
SOURCES = ("memplan.alloc.kernel", "memplan.alloc.kernel_layout")
"""The modules compiled into the native entry points (their sources are part of the cache key)."""


class Kernel:
    """The native entry points of the search, called with numpy arrays (see
    :mod:`memplan.alloc.kernel` for what they do)."""

    def __init__(self, functions: dict[str, Callable[..., int]]) -> None:
        self._run_part = functions["run_part"]
        self._first_fit = functions["first_fit"]

    def run_part(self, ctx: Ctx, part: np.ndarray, lo: int, hi: int) -> int:
        """:func:`memplan.alloc.kernel.run_part`: FOUND, NOT_FOUND, ABORTED, TIMEOUT or
        OVERFLOW."""
        arrays = [*ctx[: len(ARRAY_FIELDS)], part]
        for name, array in zip((*ARRAY_FIELDS, "part"), arrays, strict=True):
            want = dtype_of(name) if name != "part" else np.int64
            if array.dtype != want or array.ndim != 1 or not array.flags.c_contiguous:
                raise TypeError(f"Ctx.{name}: expected a contiguous 1-d {np.dtype(want)} array")
        descriptor = np.array(
            [x for array in arrays for x in (array.ctypes.data, array.shape[0])], dtype=np.int64
        )
        return int(
            self._run_part(descriptor.ctypes.data, ctx.capacity, int(ctx.residual), ctx.run, lo, hi)
        )

    def first_fit(
        self,
        size: np.ndarray,
        order: np.ndarray,
        ov_start: np.ndarray,
        ov_buf: np.ndarray,
        offsets: np.ndarray,
        limit: int,
        stop: np.ndarray,
    ) -> int:
        """:func:`memplan.alloc.kernel.first_fit` (its work array allocated here)."""
        arrays = (size, order, ov_start, ov_buf, offsets, stop)
        for array in arrays:
            if array.dtype != np.int64 or array.ndim != 1 or not array.flags.c_contiguous:
                raise TypeError("first_fit: expected contiguous 1-d int64 arrays")
        n = len(size)
        if len(offsets) != n or len(ov_start) != n + 1 or len(stop) < 1:
            raise ValueError("first_fit: size, offsets and ov_start do not match")
        most = int(np.diff(ov_start).max(initial=0))
        work = np.empty(first_fit_scratch(n, most), dtype=np.int64)
        done = int(
            self._first_fit(
                *(array.ctypes.data for array in arrays),
                work.ctypes.data,
                n,
                len(order),
                len(ov_buf),
                len(work),
                limit,
            )
        )
        if done == SCRATCH_SHORT:
            raise RuntimeError("first_fit: the work array is too small (a bug)")
        return done


def available() -> bool:
    """Whether the native kernel may load: not turned off, llvmlite installed (checked without
    importing anything)."""
    import importlib.util

    from memplan import native

    return not native.disabled() and importlib.util.find_spec("llvmlite") is not None


def load(deadline: float | None = None) -> Kernel | None:
    """The native kernel, loaded (built first, the first time) and run once on a tiny instance;
    None when it is not available (:func:`load_error` says why), or when that does not finish by
    ``deadline``. Building takes seconds, once per installation (:mod:`memplan.native` keeps it
    on disk); it runs in a background thread that a later call waits for again, so a run cut
    short by its deadline does not start a second build."""
    if "kernel" in _STATE:
        return _STATE["kernel"]
    if "error" in _STATE or not available():
        return None
    worker = _STATE.get("warming")
    if worker is None and deadline is not None and deadline < time.perf_counter() + _MIN_WAIT:
        return None  # no time to load it: do not start
    if worker is None:
        worker = threading.Thread(target=_warm_up, name="memplan-alloc-load", daemon=True)
        _STATE["warming"] = worker
        worker.start()
    while worker.is_alive():
        wait = 0.05 if deadline is None else min(deadline - time.perf_counter(), 0.05)
        if wait <= 0:
            return None
        worker.join(wait)
    return _STATE.get("kernel")


def loaded() -> bool:
    """Whether the kernel is loaded already (no waiting)."""
    return "kernel" in _STATE


def load_error() -> BaseException | None:
    """Why the kernel is not available, if it failed to load."""
    if "error" not in _STATE and not available():
        from memplan import native

        if native.disabled():
            return native.NativeUnavailable("native kernels are turned off (MEMPLAN_NATIVE=0)")
        return native.NativeUnavailable("llvmlite is not installed (pip install memplan[fast])")
    return _STATE.get("error")


def _warm_up() -> None:
    try:
        from memplan import native
        from memplan.alloc.instance import Instance

        prototypes = {
            "run_part": native.Prototype(*RUN_PART),
            "first_fit": native.Prototype(*FIRST_FIT),
        }
        kernel = Kernel(native.load(CFUNCS, prototypes, SOURCES))
        lower = np.array([0, 0, 1, 2], dtype=np.int64)
        upper = np.array([2, 3, 3, 4], dtype=np.int64)
        size = np.array([2, 1, 1, 2], dtype=np.int64)
        inst = Instance(lower, upper, size)
        rank = np.arange(4, dtype=np.int64)
        ctx = make_ctx(inst, 4, rank, "WAT", True, 0, 1000)
        status = kernel.run_part(ctx, rank, 0, inst.sections)
        offsets = np.full(4, -1, dtype=np.int64)
        kernel.first_fit(size, rank, inst.ov_start, inst.ov_buf, offsets, 2**61, ctx.stop)
        if status != FOUND or offsets.min() < 0:
            raise RuntimeError(f"the compiled kernel failed its warm-up (status {status})")
        _STATE["kernel"] = kernel
    except Exception as exc:  # no numba to build, a failed build: use the numpy search
        _STATE["error"] = exc


@dataclass
class Scratch:
    """The work stack of NOTE [ kernel work stack ] (memplan/alloc/kernel_layout.py) and the
    float scratch of the re-rankings, kept across the kernel calls of one search."""

    ws: np.ndarray
    fws: np.ndarray

    @classmethod
    def for_part(cls, buffers: int, n: int) -> Scratch:
        """Room for a search of ``buffers`` buffers of an instance of ``n`` (np.empty: only the
        pages the search reaches are touched)."""
        entries = min(stack_size(buffers), STACK_CAP)
        return cls(np.empty(entries, dtype=np.int64), np.empty(4 * n, dtype=np.float64))

    def grow(self) -> None:
        """Twice the work stack (after a search returned OVERFLOW)."""
        self.ws = np.empty(2 * len(self.ws) + 1, dtype=np.int64)


def memo_table(slots: int) -> tuple[np.ndarray, np.ndarray]:
    """An empty failed-state table of ``slots`` entries (a power of two, at least 4)."""
    return np.zeros(slots, dtype=np.uint64), np.zeros(slots, dtype=np.uint64)


def make_ctx(
    inst: Any,
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
    """A fresh :class:`memplan.alloc.kernel_layout.Ctx` for one run (nothing placed yet); without
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


def call(fn: Callable[..., int], args: tuple[Any, ...], ctx: Ctx, deadline: float | None) -> int:
    """``fn(*args)`` for a search context ``ctx``: see :func:`call_stoppable`."""
    depth = len(ctx.mu) + len(ctx.total)
    return call_stoppable(fn, args, ctx.stop, deadline, 64 * 2**20 + 4096 * depth)


def call_stoppable(
    fn: Callable[..., int],
    args: tuple[Any, ...],
    stop: np.ndarray,
    deadline: float | None,
    stack: int = 64 * 2**20,
) -> int:
    """``fn(*args)`` in a worker thread with a ``stack``-byte stack; sets ``stop[0]`` at
    ``deadline`` or on KeyboardInterrupt (re-raised once the kernel has returned). Returns the
    kernel's result, or -2 (TIMEOUT) when a stopped call did not return within a grace period."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(fn(*args))
        except BaseException as exc:  # handed back to the calling thread
            box.append(exc)

    old = threading.stack_size()
    threading.stack_size(min(stack, 2**30))
    try:
        worker = threading.Thread(target=target, name="memplan-alloc-kernel", daemon=True)
        worker.start()
    finally:
        threading.stack_size(old)
    stopped_at: float | None = None
    try:
        while worker.is_alive():
            now = time.perf_counter()
            if stopped_at is None and deadline is not None and now >= deadline:
                stop[0] = 1
                stopped_at = now
            if stopped_at is not None and now > stopped_at + _GRACE:
                return -2
            wait = 0.05 if deadline is None or stopped_at is not None else deadline - now
            worker.join(min(max(wait, 0.0), 0.05))
    except BaseException:
        stop[0] = 1
        worker.join(_GRACE)
        raise
    result = box[0]
    if isinstance(result, BaseException):
        raise result
    return int(result)


if __name__ == "__main__":  # python -m memplan.alloc.compiled: build (and cache) the kernel now
    import sys

    started = time.perf_counter()
    if load(None) is None:
        sys.exit(f"memplan: the compiled kernel is not available: {load_error()}")
    print(
        f"memplan: the compiled allocation kernel is ready ({time.perf_counter() - started:.1f} s)"
    )
