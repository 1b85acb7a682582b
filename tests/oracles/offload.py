"""Exhaustive-search oracles for the offloading model (papers/004), written from docs/offload.md.

They share no code with :mod:`memplan.algorithms.offload`: the schedules of a fixed set are built
in explicit time (no ``Delta`` recurrences), and the idle time between the two phases is found by
search (bisection, or trying every event coincidence) against a direct check of the whole memory
curve, instead of the solvers' closed forms.

Search space: every subset of the offloadable activations ``a[0] .. a[n-1]`` (``a[0]`` the chain
input, ``a[k+1]`` the saved data of stage ``k``; ``a[n]`` is never offloaded). Each subset is
scheduled as the ordered schedule of papers/004 §5.2 (offloads by increasing index, prefetches by
decreasing index, every offload before every prefetch): forward phase as early as possible,
backward phase as late as possible, and the least gap between them that makes the whole schedule
valid. Two transfer models:

* ``fluid`` (Problem 2, §5: interruptible transfers): bytes leave the GPU as they are offloaded
  and occupy it as they are prefetched; the offload of ``a[k]`` starts no earlier than ``F_k``
  (which needs all of ``a[k]`` at its start) and its prefetch ends before ``B_k`` starts;
* ``real`` (Problem 1, §3): an offloaded ``a[k]`` leaves the GPU when its transfer has ended and
  ``F_k`` has ended; a prefetch reserves its activation when it starts. The gap is the least one
  for which :func:`memplan.simulator.simulate_offload` (the independent replay) accepts the
  schedule.

Use on chains of up to about 8 stages (``2**n`` subsets).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from memplan.profile.model import Profile
from memplan.schedule import Op
from memplan.simulator import simulate_offload


@dataclass
class _Chain:
    a: list[int]
    g: list[int]
    fo: list[int]
    bo: list[int]
    uf: list[float]
    ub: list[float]
    beta: float  # bytes per ms

    @classmethod
    def of(cls, profile: Profile, bandwidth: float) -> _Chain:
        st = profile.stages
        return cls(
            a=[profile.input_size] + [s.saved_size for s in st],
            g=[0] + [s.gradient_size for s in st],
            fo=[s.forward_overhead for s in st],
            bo=[s.backward_overhead for s in st],
            uf=[s.forward_time for s in st],
            ub=[s.backward_time for s in st],
            beta=bandwidth / 1000.0,
        )

    @property
    def n(self) -> int:
        return len(self.fo)

    def kept(self, subset: tuple[int, ...]) -> list[int]:
        """kept[k]: bytes of a[0..k-1] not offloaded."""
        out = [0]
        for i in range(self.n):
            out.append(out[-1] + (0 if subset[i] else self.a[i]))
        return out


# --------------------------------------------------------------------------- fluid (Problem 2)


def _moved(segments: list[tuple[float, float]], t: float, beta: float) -> float:
    """Bytes moved by time ``t`` by transfers at rate ``beta`` over the given intervals."""
    return beta * sum(min(max(t - t0, 0.0), t1 - t0) for t0, t1 in segments)


def _fluid_phases(c: _Chain, subset: tuple[int, ...], memory: int):
    """Forward (as early as possible) and backward (as late as possible, relative to its end)."""
    n, beta = c.n, c.beta
    kept = c.kept(subset)
    # Forward: F_k starts when the bytes already offloaded leave room for its output and overhead.
    offloads: list[tuple[float, float]] = []
    owners: list[int] = []
    f = []
    now, channel = 0.0, 0.0
    produced = c.g[n] + c.a[0]
    for k in range(n):
        need = produced + c.a[k + 1] + c.fo[k] - memory
        start = now
        if need > _moved(offloads, now, beta) + 1e-9:
            total = _moved(offloads, math.inf, beta)
            if need > total + 1e-9:
                return None
            done = 0.0
            for t0, t1 in offloads:
                size = (t1 - t0) * beta
                if done + size >= need - 1e-9:
                    start = max(now, t0 + (need - done) / beta)
                    break
                done += size
        f.append((start, start + c.uf[k]))
        if subset[k]:
            t0 = max(channel, start)
            channel = t0 + c.a[k] / beta
            offloads.append((t0, channel))
            owners.append(k)
        produced += c.a[k + 1]
        now = start + c.uf[k]
    # Backward, from the end (time 0): B_k ends when the prefetched lower bytes still fit.
    prefetches: list[tuple[float, float]] = []
    b = [(0.0, 0.0)] * n
    upper = 0.0
    for k in range(n):
        slack = memory - (kept[k] + c.a[k] + c.a[k + 1] + c.g[k + 1] + c.g[k] + c.bo[k])
        if slack < 0:
            return None
        end = upper
        if _moved(prefetches, upper, beta) > slack + 1e-9:
            done = 0.0
            for t0, t1 in sorted(prefetches):
                size = (t1 - t0) * beta
                if done + size > slack:
                    end = min(upper, t0 + (slack - done) / beta)
                    break
                done += size
        b[k] = (end - c.ub[k], end)
        if subset[k]:
            finish = min([b[k][0]] + [t0 for t0, _ in prefetches])
            prefetches.append((finish - c.a[k] / beta, finish))
        upper = b[k][0]
    return f, offloads, b, prefetches


def _fluid_ok(c, subset, memory, f, offloads, b, prefetches, gap: float) -> bool:
    """Whether the fluid schedule with this gap is valid: channel order and memory at all times."""
    n, beta = c.n, c.beta
    shift = f[-1][1] + gap - b[n - 1][0]
    bb = [(s + shift, e + shift) for s, e in b]
    pre = [(s + shift, e + shift) for s, e in prefetches]
    if offloads and pre and max(e for _, e in offloads) > min(s for s, _ in pre) + 1e-9:
        return False
    steps: list[tuple[float, float, int]] = [(0.0, bb[0][1], c.a[0]), (0.0, bb[n - 1][1], c.g[n])]
    for k in range(n):
        steps.append((f[k][0], bb[k][1], c.a[k + 1]))
        steps.append((f[k][0], f[k][1], c.fo[k]))
        steps.append((bb[k][0], bb[k][1], c.bo[k]))
        if k > 0:
            steps.append((bb[k][0], bb[k - 1][1], c.g[k]))
    breaks = {t for seg in offloads + pre for t in seg}
    times = sorted({t for s, e, _ in steps for t in (s, e)} | breaks)

    def moving(t: float) -> float:
        return _moved(pre, t, beta) - _moved(offloads, t, beta)

    # Between the compute operations (and inside those that last): the memory just after and just
    # before each event.
    for t in times:
        after = sum(size for s, e, size in steps if s <= t < e) + moving(t)
        before = sum(size for s, e, size in steps if s < t <= e) + moving(t)
        if max(after, before) > memory + 1e-6:
            return False
    # During each compute operation, zero-duration ones included. The sweep above never sees an
    # operation that starts and ends at one instant t: what it frees is gone in ``after``, what it
    # allocates is not there yet in ``before``; a zero-duration F_k or B_k would then skip its
    # peak (eF, eB and its output and inputs at once), unlike the model (m_{F_k}, m_{B_k}, §3.2),
    # the solvers and the simulator (zero-duration operations run in the model's order). So each
    # operation, at sequence place p (F_k at k, B_k at 2n-1-k), holds every tensor whose
    # producer's place <= p <= its last reader's place, plus the transfers' bytes at every time
    # of [start, end] where that piecewise-linear term may peak.
    held = [(0, 2 * n - 1, c.a[0]), (0, n, c.g[n])]
    for k in range(n):
        held.append((k, 2 * n - 1 - k, c.a[k + 1]))
        held.append((k, k, c.fo[k]))
        held.append((2 * n - 1 - k, 2 * n - 1 - k, c.bo[k]))
        if k > 0:
            held.append((2 * n - 1 - k, 2 * n - k, c.g[k]))
    spans = list(f) + bb[::-1]  # in compute order
    for p, (s, e) in enumerate(spans):
        static = sum(size for first, last, size in held if first <= p <= last)
        inside = {s, e} | {t for t in breaks if s < t < e}
        if static + max(moving(t) for t in inside) > memory + 1e-6:
            return False
    return True


def fluid_makespan(
    profile: Profile, bandwidth: float, memory: int, subset: tuple[int, ...]
) -> float | None:
    """Makespan (ms) of the ordered schedule of ``subset`` in the interruptible model, or None."""
    c = _Chain.of(profile, bandwidth)
    phases = _fluid_phases(c, subset, memory)
    if phases is None:
        return None
    return _fluid_finish(c, subset, memory, phases)


def _fluid_finish(c, subset, memory, phases) -> float | None:
    f, offloads, b, prefetches = phases
    span = f[-1][1] - b[-1][0]  # forward end + backward length

    def ok(gap: float) -> bool:
        return _fluid_ok(c, subset, memory, f, offloads, b, prefetches, gap)

    if ok(0.0):
        return span
    hi = 1.0
    while not ok(hi):
        hi *= 2
        if hi > 1e12:
            return None
    lo = 0.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return span + hi


def best_fluid(
    profile: Profile, bandwidth: float, memory: int
) -> tuple[float, tuple[int, ...]] | None:
    """Least makespan over every subset in the interruptible model (Problem 2), and one subset."""
    c = _Chain.of(profile, bandwidth)
    best: tuple[float, tuple[int, ...]] | None = None
    for subset in itertools.product((0, 1), repeat=c.n):
        phases = _fluid_phases(c, subset, memory)
        if phases is None:
            continue
        f, _, b, _ = phases
        if best is not None and f[-1][1] - b[-1][0] >= best[0]:
            continue  # the gap only adds
        value = _fluid_finish(c, subset, memory, phases)
        if value is not None and (best is None or value < best[0] - 1e-12):
            best = (value, subset)
    return best


# --------------------------------------------------------------------------- real (Problem 1)


def _real_phases(c: _Chain, subset: tuple[int, ...], memory: int):
    n, beta = c.n, c.beta
    kept = c.kept(subset)
    f: list[tuple[float, float]] = []
    offloads: dict[int, tuple[float, float]] = {}
    releases: list[tuple[float, int]] = []
    now, channel = 0.0, 0.0
    produced = c.g[n] + c.a[0]
    for k in range(n):
        if subset[k]:
            t0 = max(channel, now)
            channel = t0 + c.a[k] / beta
            offloads[k] = (t0, channel)
        need = produced + c.a[k + 1] + c.fo[k] - memory
        start = None
        for t in sorted({now} | {r for r, _ in releases if r > now}):
            if sum(size for r, size in releases if r <= t) >= need:
                start = t
                break
        if start is None:
            return None
        f.append((start, start + c.uf[k]))
        produced += c.a[k + 1]
        if subset[k]:
            releases.append((max(offloads[k][1], start + c.uf[k]), c.a[k]))
        now = start + c.uf[k]
    prefetches: dict[int, tuple[float, float]] = {}
    b = [(0.0, 0.0)] * n
    upper = 0.0
    for k in range(n):
        slack = memory - (kept[k] + c.a[k] + c.a[k + 1] + c.g[k + 1] + c.g[k] + c.bo[k])
        if slack < 0:
            return None
        starts = [s for s, _ in prefetches.values()]
        for t in sorted({upper} | {s for s in starts if s < upper}, reverse=True):
            if sum(c.a[i] for i, (s, _) in prefetches.items() if s < t) <= slack:
                end = t
                break
        b[k] = (end - c.ub[k], end)
        if subset[k]:
            finish = min([b[k][0]] + starts)
            prefetches[k] = (finish - c.a[k] / beta, finish)
        upper = b[k][0]
    return f, offloads, releases, b, prefetches


def _real_ops(c: _Chain, phases, gap: float) -> list[Op]:
    f, offloads, _, b, prefetches = phases
    n = c.n
    shift = f[-1][1] + gap - b[n - 1][0]
    ops = [Op(op="F_all", stage=k, start=s, end=e) for k, (s, e) in enumerate(f)]
    ops += [Op(op="B", stage=k, start=s + shift, end=e + shift) for k, (s, e) in enumerate(b)]
    for name, table, move in (("offload", offloads, 0.0), ("prefetch", prefetches, shift)):
        for i, (s, e) in table.items():
            stage, tensor = (0, "x[0]") if i == 0 else (i - 1, f"s[{i - 1}]")
            ops.append(
                Op(
                    op=name,
                    stage=stage,
                    start=s + move,
                    end=e + move,
                    stream="transfer",
                    tensor=tensor,
                )
            )
    return ops


def real_makespan(
    profile: Profile, bandwidth: float, memory: int, subset: tuple[int, ...]
) -> float | None:
    """Makespan (ms) of the no-wait ordered schedule of ``subset`` with real transfers, or None.

    The gap between the phases is the least value, among those that make two events coincide
    (a release and a backward start, a forward end and a prefetch start, the last offload end and
    the first prefetch start, ...), for which the independent simulator accepts the schedule.
    """
    c = _Chain.of(profile, bandwidth)
    phases = _real_phases(c, subset, memory)
    if phases is None:
        return None
    f, offloads, releases, b, prefetches = phases
    end_f, start_b = f[-1][1], b[-1][0]

    def ok(gap: float) -> bool:
        ops = _real_ops(c, phases, gap)
        return simulate_offload(profile, ops, memory=memory, bandwidth=bandwidth).valid

    forward_times = [t for s, e in f for t in (s, e)] + [r for r, _ in releases]
    forward_times += [t for s, e in offloads.values() for t in (s, e)]
    backward_times = [t for s, e in b for t in (s, e)] + [s for s, _ in prefetches.values()]
    gaps = sorted(
        {0.0} | {x - end_f - (y - start_b) for x in forward_times for y in backward_times}
    )
    gaps = [g for g in gaps if g >= 0]
    if not ok(gaps[-1]):
        return None
    lo, hi = 0, len(gaps) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(gaps[mid]):
            hi = mid
        else:
            lo = mid + 1
    return end_f + gaps[lo] - start_b


def best_real(
    profile: Profile, bandwidth: float, memory: int
) -> tuple[float, tuple[int, ...]] | None:
    """Least makespan over every subset of no-wait ordered schedules with real transfers."""
    c = _Chain.of(profile, bandwidth)
    best: tuple[float, tuple[int, ...]] | None = None
    for subset in itertools.product((0, 1), repeat=c.n):
        phases = _real_phases(c, subset, memory)
        if phases is None:
            continue
        f, _, _, b, _ = phases
        if best is not None and f[-1][1] - b[-1][0] >= best[0]:
            continue
        value = real_makespan(profile, bandwidth, memory, subset)
        if value is not None and (best is None or value < best[0] - 1e-12):
            best = (value, subset)
    return best
