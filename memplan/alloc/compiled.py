"""Running the compiled search (:mod:`memplan.alloc.kernel`) from Python: loading it, and one
kernel call in a worker thread that the caller can stop.

numba is optional (``pip install memplan[fast]``): :func:`load` returns None without it, and the
numpy search of :mod:`memplan.alloc.search` runs instead. The kernel runs in its own thread (it
releases the GIL), with a stack sized for its recursion (one frame per placed buffer and split),
while the calling thread waits: at the deadline, or on Ctrl-C (KeyboardInterrupt, which reaches
only the main thread), it sets the kernel's stop flag, and the kernel returns within 256 nodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

_STATE: dict[str, Any] = {}
_MIN_WAIT = 0.25
"""Seconds of time left below which the kernel is not even started loading."""
_GRACE = 1.0
"""Seconds a stopped kernel call may take to return before it is left behind (only a first
compilation, which cannot be interrupted, takes that long)."""


def available() -> bool:
    """Whether numba can be imported (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("numba") is not None


def load(deadline: float | None) -> ModuleType | None:
    """The compiled kernel module, compiled (or loaded from numba's cache) and run once on a tiny
    instance; None when numba is missing or the kernel failed to compile, or when that does not
    finish by ``deadline``. Compiling takes seconds, once per installation (numba caches it on
    disk); it runs in a background thread that a later call waits for again, so a run cut short
    by its deadline does not start a second compilation."""
    if "kernel" in _STATE:
        return _STATE["kernel"]
    if "error" in _STATE or not available():
        return None
    worker = _STATE.get("warming")
    if worker is None and deadline is not None and deadline < time.perf_counter() + _MIN_WAIT:
        return None  # no time to load it: do not start
    if worker is None:
        worker = threading.Thread(target=_warm_up, name="memplan-alloc-compile", daemon=True)
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
    """Why the kernel failed to compile, if it did."""
    return _STATE.get("error")


def _warm_up() -> None:
    try:
        import memplan.alloc.kernel as kernel
        from memplan.alloc.instance import Instance

        lower = np.array([0, 0, 1, 2], dtype=np.int64)
        upper = np.array([2, 3, 3, 4], dtype=np.int64)
        size = np.array([2, 1, 1, 2], dtype=np.int64)
        inst = Instance(lower, upper, size)
        rank = np.arange(4, dtype=np.int64)
        ctx = make_ctx(kernel, inst, 4, rank, "WAT", True, 0, 1000)
        status = kernel.run_part(ctx, rank, 0, inst.sections)
        offsets = np.full(4, -1, dtype=np.int64)
        kernel.first_fit(size, rank, inst.ov_start, inst.ov_buf, offsets, 2**61, ctx.stop)
        if status != kernel.FOUND or offsets.min() < 0:
            raise RuntimeError(f"the compiled kernel failed its warm-up (status {status})")
        _STATE["kernel"] = kernel
    except Exception as exc:  # numba missing a feature, a broken cache: use the numpy search
        _STATE["error"] = exc


def memo_table(slots: int) -> tuple[np.ndarray, np.ndarray]:
    """An empty failed-state table of ``slots`` entries (a power of two, at least 4)."""
    return np.zeros(slots, dtype=np.uint64), np.zeros(slots, dtype=np.uint64)


def make_ctx(
    kernel: ModuleType,
    inst: Any,
    capacity: int,
    rank: np.ndarray,
    heuristic: str | None,
    residual: bool,
    run: int,
    node_limit: int,
    memo: tuple[np.ndarray, np.ndarray] | None = None,
    twins: bool = True,
) -> Any:
    """A fresh :class:`memplan.alloc.kernel.Ctx` for one run (nothing placed yet); without
    ``twins`` the stacked-twin rule is off (empty twin lists)."""
    n, sections = inst.n, inst.sections
    letters = {"W": 0, "A": 1, "T": 2, "Z": 3}
    keys = (heuristic or "T").rstrip("0123456789")
    memo1, memo2 = memo if memo is not None else memo_table(1024)
    size = inst.size.astype(np.int64)
    width = (inst.upper - inst.lower).astype(np.float64)
    return kernel.Ctx(
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
        count=np.array([0, node_limit, 0, 0], dtype=np.int64),
        stop=np.zeros(1, dtype=np.int64),
        capacity=int(capacity),
        residual=bool(residual),
        run=int(run),
    )


def call(fn: Callable[..., int], args: tuple[Any, ...], ctx: Any, deadline: float | None) -> int:
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


if __name__ == "__main__":  # python -m memplan.alloc.compiled: compile (and cache) the kernel now
    import sys

    started = time.perf_counter()
    if load(None) is None:
        sys.exit(f"memplan: the compiled kernel is not available: {load_error() or 'no numba'}")
    print(
        f"memplan: the compiled allocation kernel is ready ({time.perf_counter() - started:.1f} s)"
    )
