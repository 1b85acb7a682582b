"""Time a combined plan with whole-tensor transfers (docs/algorithms.md, "pofo", realization).

The fractional DP (:mod:`memplan.algorithms.combined.fractional`) decides *what* runs: the
computations in order, which tensors are offloaded (from the start of the first computation that
reads them) and when each is needed again. This module decides *when*, in the whole-tensor model of
docs/combined.md, so that the schedule replays valid and within budget:

* one channel, first every offload in the order of its trigger, then every prefetch in the order of
  need (offloads in the forward phase, prefetches after the last offload, as Efficient Combination of Rematerialization and Offloading (NeurIPS 2021) §3.2);
* an offload starts at ``max(start of its trigger, channel free)``; its GPU copy is freed at its
  end, or at the end of the trigger if that is later (rule T2);
* a computation starts when the one before it has ended, its prefetched inputs have arrived and
  the memory fits; in the forward phase it waits for offloads to free memory when it does not;
* a prefetch reserves its tensor from its start; it starts before computation ``i`` (at the end of
  computation ``i - 1`` or when the channel frees, whichever is later) only when every computation
  from ``i`` to its need still fits with it and the prefetches already started (peaks computed
  once, with each prefetched tensor counted from its need and each offloaded one gone after its
  trigger); otherwise it waits for a later computation.

The result is valid by construction; :func:`memplan.solve` replays it anyway.
"""

from __future__ import annotations

from memplan.algorithms.base import Sequence, Transfer
from memplan.algorithms.chain.problem import ChainInstance

_TOL = 1e-9


def _size(chain: ChainInstance, name: str) -> int:
    k = int(name[2:-1])
    return int(chain.x[k] if name[0] == "x" else chain.s[k])


def _stage(chain: ChainInstance, name: str) -> int:
    return min(int(name[2:-1]), chain.length - 1)


def _peaks(
    chain: ChainInstance,
    sequence: Sequence,
    offloaded_after: dict[int, list[str]],
    fetched_before: dict[int, list[str]],
) -> list[int] | None:
    """Memory (bytes) during each computation, prefetches just in time, offloads gone at once."""
    x, s, g, fo, bo = (v.tolist() for v in (chain.x, chain.s, chain.g, chain.fo, chain.bo))
    fa = chain.fall.tolist()  # F_all's own overhead under the training loop (else fo)
    L = chain.length
    on = {"x[0]"}
    held = x[0] + g[L]
    fresh = -1
    peaks = []
    for i, (name, k) in enumerate(sequence):
        for t in fetched_before.get(i, ()):
            on.add(t)
            held += _size(chain, t)
        if name == "B":
            peaks.append(held + g[k] + bo[k])
            held += g[k] - g[k + 1]
            for t in (f"s[{k}]", f"x[{k}]"):
                if t in on:
                    on.discard(t)
                    held -= _size(chain, t)
            fresh = -1
        else:
            out = f"s[{k}]" if name == "F_all" else f"x[{k + 1}]"
            size = _size(chain, out)
            peaks.append(held + size + (fa[k] if name == "F_all" else fo[k]))
            held += size
            on.add(out)
            if name == "F_n" and fresh == k and f"x[{k}]" in on:
                on.discard(f"x[{k}]")
                held -= x[k]
            fresh = -1 if name == "F_all" else k + 1
        for t in offloaded_after.get(i, ()):
            if t not in on:  # pragma: no cover - the DP offloads what the segment holds
                return None
            on.discard(t)
            held -= _size(chain, t)
    return peaks


def plan_peak(
    chain: ChainInstance,
    sequence: Sequence,
    offloads: list[tuple[str, int]],
    prefetches: list[tuple[str, int]],
) -> int | None:
    """The least memory (bytes) the plan needs: its computations with just-in-time prefetches."""
    _, _, peaks = _plan_peaks(chain, sequence, offloads, prefetches)
    return None if peaks is None else max(peaks, default=0)


def _plan_peaks(
    chain: ChainInstance,
    sequence: Sequence,
    offloads: list[tuple[str, int]],
    prefetches: list[tuple[str, int]],
) -> tuple[dict[int, list[str]], dict[int, list[str]], list[int] | None]:
    """The transfers grouped by the computation that triggers (offloads) or needs (prefetches)
    them, and the peak of every computation with just-in-time prefetches (None: impossible).
    """
    offloaded_after: dict[int, list[str]] = {}
    for t, i in offloads:
        offloaded_after.setdefault(i, []).append(t)
    fetched_before: dict[int, list[str]] = {}
    for t, i in prefetches:
        fetched_before.setdefault(i, []).append(t)
    return offloaded_after, fetched_before, _peaks(chain, sequence, offloaded_after, fetched_before)


def realize(
    chain: ChainInstance,
    sequence: Sequence,
    offloads: list[tuple[str, int]],
    prefetches: list[tuple[str, int]],
    memory: int,
    bandwidth: float,
) -> list[Transfer] | None:
    """Timed operations of the plan (module docstring), or None if the timing rules deadlock.

    Parameters
    ----------
    chain : ChainInstance
    sequence : list of (op, stage)
        Computations in order.
    offloads : list of (tensor, trigger)
        Tensors offloaded from the start of computation ``trigger`` (which reads them).
    prefetches : list of (tensor, need)
        Tensors brought back before computation ``need``, in the order of ``need``.
    memory : int
        Activation bytes (``x[0]`` included).
    bandwidth : float
        Bytes/s.
    """
    per_ms = bandwidth / 1000.0
    if (offloads or prefetches) and per_ms <= 0:
        return None
    offloaded_after, fetched_before, peaks = _plan_peaks(chain, sequence, offloads, prefetches)
    if peaks is None or max(peaks, default=0) > memory:
        return None
    n = len(sequence)
    early = [0] * (n + 1)  # bytes of prefetches started before computation i and needed later
    last_trigger = max((i for _, i in offloads), default=-1)
    ops: list[Transfer] = []
    channel = 0.0
    prev_end = 0.0
    frees: list[tuple[float, int]] = []  # (time, bytes) of offloaded copies not yet freed
    held_extra = 0  # bytes of offloaded copies still on the GPU (beyond the just-in-time peaks)
    arrival: dict[str, float] = {}
    queue = list(prefetches)
    for i, (name, k) in enumerate(sequence):
        # Prefetches that may start before computation i.
        while queue and i > last_trigger:
            t, need = queue[0]
            size = _size(chain, t)
            if any(peaks[c] + early[c] + size > memory for c in range(i, need)):
                break
            queue.pop(0)
            start = max(channel, prev_end)
            end = start + size / per_ms
            ops.append(("prefetch", _stage(chain, t), start, end, "transfer", t))
            channel = end
            arrival[t] = end
            for c in range(i, need):
                early[c] += size
        start = prev_end
        for t in fetched_before.get(i, ()):
            if t not in arrival:  # pragma: no cover - the queue reaches need at the latest
                return None
            start = max(start, arrival[t])
        # Forward phase: wait for offloaded copies to leave until the computation fits.
        frees.sort()
        while frees and frees[0][0] <= start + _TOL:
            held_extra -= frees.pop(0)[1]
        while peaks[i] + early[i] + held_extra > memory:
            if not frees:
                return None
            when, size = frees.pop(0)
            start = max(start, when)
            held_extra -= size
            while frees and frees[0][0] <= start + _TOL:
                held_extra -= frees.pop(0)[1]
        duration = float(chain.bt[k] if name == "B" else chain.ft[k])
        end = start + duration
        ops.append((name, k, start, end, "compute", None))
        prev_end = end
        for t in offloaded_after.get(i, ()):
            size = _size(chain, t)
            o_start = max(start, channel)
            o_end = o_start + size / per_ms
            ops.append(("offload", _stage(chain, t), o_start, o_end, "transfer", t))
            channel = o_end
            frees.append((max(o_end, end), size))
            held_extra += size
    if queue:  # pragma: no cover - every prefetch is due by its need
        return None
    return ops
