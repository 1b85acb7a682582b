"""The no-wait, ordered schedule of a given set of offloaded activations (Problem 1 of Optimal GPU-CPU Offloading Strategies (Euro-Par 2020)).

Every offloading algorithm (greedy, dynprog, vdnn) chooses *which* activations to offload; this
module turns the choice into a timed schedule with real, non-interruptible transfers (assumptions
A-E of §3.1), as Proposition 1 prescribes: each action as early as possible, transfers ordered
(offloads by increasing index, prefetches by decreasing index, every offload before every prefetch).

NOTE [ offload no-wait schedule ]
---------------------------------
Memory rules (the same in :mod:`memplan.simulator.combined`, written separately):

1. ``F_k`` reserves ``a[k+1] + fo[k]`` at its start and frees ``fo[k]`` at its end (and, under
   the training loop's terms, ``a[k] - ac[k]``: NOTE [ offload loop terms ]); ``B_k`` reserves
   ``g[k] + bo[k]`` at its start and frees ``bo[k]``, ``g[k+1]``, ``a[k+1]`` (and ``a[0]`` for
   ``k = 0``) at its end. ``a[0]`` and ``g[n]`` are held from the start.
2. The offload of ``a[k]`` may start once ``a[k]`` exists (the end of ``F_{k-1}``; time 0 for the
   input). Its memory is released when the transfer has ended *and* ``F_k``, which reads it, has
   ended (assumption E, and the input of a running operation stays where it is).
3. The prefetch of ``a[k]`` reserves its memory when it starts (assumption E) and must end before
   ``B_k`` starts (``B_k`` reads it). It starts after ``a[k]`` has left the GPU.
4. At equal times, frees happen before reservations.

Construction (the paper's own, §5.2: forward as early as possible, backward as late as possible,
joined by the least idle time ``eps_G`` in between):

* forward: ``F_k`` starts at the end of ``F_{k-1}`` if it fits, else at the first release that makes
  it fit (never, if even every release of ``a[0..k-1]`` is not enough: the set is infeasible);
  offloads run back to back in index order as soon as their activation exists;
* backward, built from the end (time 0 = the end of ``B_0``) in the order ``B_0, B_1, ...``: ``B_k``
  ends as late as possible (at the start of ``B_{k-1}``) unless the prefetches of lower activations
  already started by then leave too little room, in which case it ends when the first of them that
  does not fit starts; the prefetch of ``a[k]`` ends at the start of ``B_k`` or at the start of the
  next (lower) prefetch, whichever is first;
* the gap ``G`` between the end of ``F_{n-1}`` and the start of ``B_{n-1}``: the least ``G >= 0``
  such that (i) the last offload ends before the first prefetch starts and every prefetch starts
  after its activation was released, (ii) a backward that starts while offloads are still pending
  fits with the bytes not yet released, (iii) a forward that ends after prefetches have started fits
  with the bytes already reserved. Each condition is monotone in ``G`` and is inverted exactly on
  the step functions of releases and reservations.

Times: the forward phase is timed forward (each time a float sum of earlier ones); the backward
phase, built from its end, and the gap are computed in exact arithmetic (integers counting
``2**-1074`` ms, the spacing of every float) and each time rounded once to the nearest float. In
floats, the backward times relative to the end lose the precision of the largest of them: a
backward of 1e12 ms put the operations before it 1e-4 ms off, out of order or not lasting their
duration at the timing tolerance of the simulator (1e-6 ms).

Cost: ``O(n^2)`` in the worst case (``n`` stages), ``O(n)`` in practice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from memplan.algorithms.base import Transfer
from memplan.algorithms.offload.model import OffloadInstance

_SCALE = 1 << 1074
"""Exact times are integers in units of ``2**-1074`` ms: every finite float is a whole number of
them."""


def _exact(t: float) -> int:
    """``t`` (ms) in units of ``2**-1074`` ms, exactly."""
    num, den = float(t).as_integer_ratio()
    return num * (_SCALE // den)


def _rounded(t: int) -> float:
    """An exact time as the nearest float (Python's integer division is correctly rounded)."""
    return t / _SCALE


@dataclass
class NoWaitSchedule:
    """A timed offloading schedule (ms): compute operations and transfers.

    Attributes
    ----------
    offloaded : ndarray of bool, shape (n,)
        Which activations ``a[0] .. a[n-1]`` are offloaded.
    f_start, f_end, b_start, b_end : list of float
        Start and end of ``F_k`` and ``B_k``.
    offload, prefetch : dict int -> (float, float)
        Start and end of the transfers of each offloaded activation ``a[k]``.
    gap : float
        Idle time between the end of the forward and the start of the backward (``eps_G``).
    """

    offloaded: npt.NDArray[np.bool_]
    f_start: list[float]
    f_end: list[float]
    b_start: list[float]
    b_end: list[float]
    offload: dict[int, tuple[float, float]] = field(default_factory=dict)
    prefetch: dict[int, tuple[float, float]] = field(default_factory=dict)
    gap: float = 0.0

    @property
    def makespan(self) -> float:
        return self.b_end[0]

    def operations(self) -> list[Transfer]:
        """Every operation as ``(op, stage, start, end, stream, tensor)``, in schedule order.

        Transfers name their tensor: ``x[0]`` for the chain input (stage 0), ``s[k]`` for the saved
        data of stage ``k`` (activation ``a[k+1]``, stage ``k``). The order is that of time, and at
        one time that of execution: the computations in the model's order (every ``F_k``, then
        every ``B_k`` from the last), the offload of ``a[k]`` after ``F_k``, which reads it (never
        listed before its reader starts, so that a transfer too short to last an instant does not
        take ``a[k]`` away from it), the prefetch of ``a[k]`` right before ``B_k``. The combined
        simulator replays the operations of one instant in this order.
        """
        n = len(self.f_start)
        keyed: list[tuple[tuple[float, float], Transfer]]
        keyed = [
            ((self.f_start[k], k), ("F_all", k, self.f_start[k], self.f_end[k], "compute", None))
            for k in range(n)
        ]
        keyed += [
            (
                (self.b_start[k], 2 * n - 1 - k),
                ("B", k, self.b_start[k], self.b_end[k], "compute", None),
            )
            for k in range(n)
        ]
        for i, (start, end) in self.offload.items():
            stage, tensor = activation_tensor(i)
            key = (max(start, self.f_start[i]), i + 0.5)
            keyed.append((key, ("offload", stage, start, end, "transfer", tensor)))
        for i, (start, end) in self.prefetch.items():
            stage, tensor = activation_tensor(i)
            key = (start, 2 * n - 1 - i - 0.5)
            keyed.append((key, ("prefetch", stage, start, end, "transfer", tensor)))
        keyed.sort(key=lambda item: item[0])
        return [op for _, op in keyed]


def activation_tensor(i: int) -> tuple[int, str]:
    """Stage and tensor name of activation ``a[i]``: ``(0, "x[0]")`` or ``(i - 1, "s[i-1]")``."""
    return (0, "x[0]") if i == 0 else (i - 1, f"s[{i - 1}]")


def no_wait_schedule(
    inst: OffloadInstance, offloaded: npt.NDArray[np.bool_] | list[bool], memory: int
) -> NoWaitSchedule | None:
    """The no-wait ordered schedule offloading ``offloaded`` within ``memory`` bytes, or None.

    See NOTE [ offload no-wait schedule ]. None means that no schedule offloading exactly this set
    fits (:meth:`OffloadInstance.feasible` is False).
    """
    d = inst.movable(offloaded)
    if not inst.feasible(d, memory):
        return None
    forward = _forward(inst, d, memory)
    if forward is None:  # pragma: no cover - feasible() says a schedule exists
        return None
    f_start, f_end, offload, releases = forward
    backward = _backward(inst, d, memory)
    if backward is None:  # pragma: no cover - idem
        return None
    b_start, b_end, prefetch = backward
    gap = _gap(inst, d, memory, f_end, offload, releases, b_start, prefetch)
    shift = _exact(f_end[-1]) + gap - b_start[-1]  # relative backward times -> real times
    return NoWaitSchedule(
        offloaded=d,
        f_start=f_start,
        f_end=f_end,
        b_start=[_rounded(t + shift) for t in b_start],
        b_end=[_rounded(t + shift) for t in b_end],
        offload=offload,
        prefetch={i: (_rounded(s + shift), _rounded(e + shift)) for i, (s, e) in prefetch.items()},
        gap=_rounded(gap),
    )


_Forward = tuple[list[float], list[float], dict[int, tuple[float, float]], dict[int, float]]
"""``f_start``, ``f_end``, the offloads ``(start, end)`` and the release times, by activation."""

_Backward = tuple[list[int], list[int], dict[int, tuple[int, int]]]
"""``b_start``, ``b_end`` and the prefetches ``(start, end)``, in exact times (:func:`_exact`)."""


def _forward(inst: OffloadInstance, d: npt.NDArray[np.bool_], memory: int) -> _Forward | None:
    """Forward phase as early as possible; releases are ``max(offload end, end of F_k)``."""
    n, beta = inst.n, inst.beta
    a, fo, uf = inst.a.tolist(), inst.fo.tolist(), inst.uf.tolist()
    cut = (inst.a - inst.ac).tolist()  # what autograd frees of a[k] at the end of F_k
    held = int(inst.g[n]) + a[0]
    channel = 0.0
    pending: deque[tuple[float, int]] = deque()  # (release time, bytes), times non-decreasing
    f_start, f_end = [0.0] * n, [0.0] * n
    offload: dict[int, tuple[float, float]] = {}
    releases: dict[int, float] = {}
    produced = 0.0
    for k in range(n):
        if d[k]:
            start = max(channel, produced)
            channel = start + a[k] / beta
            offload[k] = (start, channel)
        need = held + a[k + 1] + fo[k] - memory
        start = produced
        while need > 0:
            if not pending:
                return None
            when, size = pending.popleft()
            held -= size
            need -= size
            start = max(start, when)
        while pending and pending[0][0] <= start:
            held -= pending.popleft()[1]
        f_start[k], f_end[k] = start, start + uf[k]
        held += a[k + 1] - cut[k]
        if d[k]:
            releases[k] = max(offload[k][1], f_end[k])
            pending.append((releases[k], a[k]))
        produced = f_end[k]
        while pending and pending[0][0] <= produced:
            held -= pending.popleft()[1]
    return f_start, f_end, offload, releases


def _backward(inst: OffloadInstance, d: npt.NDArray[np.bool_], memory: int) -> _Backward | None:
    """Backward phase as late as possible, in exact times (:func:`_exact`) relative to the end of
    ``B_0`` (time 0).
    """
    n, beta = inst.n, inst.beta
    a, ac, g, bo = inst.a.tolist(), inst.ac.tolist(), inst.g.tolist(), inst.bo.tolist()
    ub = [_exact(t) for t in inst.ub.tolist()]
    kept = inst.kept_prefix(d).tolist()
    b_start, b_end = [0] * n, [0] * n
    prefetch: dict[int, tuple[int, int]] = {}
    early: list[tuple[int, int]] = []  # prefetches of lower activations, latest index first
    upper = 0
    for k in range(n):
        slack = memory - (kept[k] + ac[k] + ac[k + 1] + g[k + 1] + g[k] + bo[k])
        if slack < 0:
            return None
        end, reserved = upper, 0
        for when, size in early:  # by increasing start time
            if when >= end:
                break
            if reserved + size > slack:
                end = when
                break
            reserved += size
        b_end[k], b_start[k] = end, end - ub[k]
        upper = b_start[k]
        if d[k]:
            finish = min(b_start[k], early[0][0]) if early else b_start[k]
            start = finish - _exact(a[k] / beta)
            prefetch[k] = (start, finish)
            early.insert(0, (start, a[k]))
    return b_start, b_end, prefetch


def _gap(
    inst: OffloadInstance,
    d: npt.NDArray[np.bool_],
    memory: int,
    f_end: list[float],
    offload: dict[int, tuple[float, float]],
    releases: dict[int, float],
    b_start: list[int],
    prefetch: dict[int, tuple[int, int]],
) -> int:
    """The least idle time between the phases (see NOTE [ offload no-wait schedule ]), exact: the
    real (forward) times are floats, the backward ones exact (:func:`_backward`).
    """
    n = inst.n
    a, g, fo, bo = inst.a.tolist(), inst.g.tolist(), inst.fo.tolist(), inst.bo.tolist()
    ac = inst.ac.tolist()
    kept = inst.kept_prefix(d).tolist()
    end_forward, start_backward = _exact(f_end[-1]), b_start[-1]

    def gap_for(real: float, relative: int) -> int:
        """The gap that puts backward-relative time ``relative`` at real time ``real``."""
        return _exact(real) - end_forward - (relative - start_backward)

    bounds = [0]
    if not offload:
        return 0
    last_offload_end = max(end for _, end in offload.values())
    first_prefetch = min(start for start, _ in prefetch.values())
    bounds.append(gap_for(last_offload_end, first_prefetch))  # (i) one channel, offloads first
    for i, (start, _) in prefetch.items():  # (i) a prefetch starts after the release
        bounds.append(gap_for(releases[i], start))
    # (ii) backwards that start while offloaded bytes are still on the GPU.
    late = sorted((when, a[i]) for i, when in releases.items() if when > f_end[-1])
    total = sum(size for _, size in late)
    if total > 0:
        for j in range(n):
            slack = memory - (kept[j] + ac[j] + ac[j + 1] + g[j + 1] + g[j] + bo[j])
            if total <= slack:
                continue
            left = total
            for when, size in late:
                left -= size
                if left <= slack:
                    bounds.append(gap_for(when, b_start[j]))
                    break
    # (iii) forwards that end after prefetches have started.
    early = sorted((start, a[i]) for i, (start, _) in prefetch.items())
    gn = g[n]
    for j in range(n):
        slack = memory - (gn + kept[j] + a[j] + a[j + 1] + fo[j])
        reserved = 0
        for start, size in early:
            if reserved + size > slack:
                bounds.append(gap_for(f_end[j], start))
                break
            reserved += size
    return max(bounds)


def no_wait_makespan(
    inst: OffloadInstance, offloaded: npt.NDArray[np.bool_] | list[bool], memory: int
) -> float | None:
    """Makespan (ms) of :func:`no_wait_schedule`, or None when the set does not fit."""
    schedule = no_wait_schedule(inst, offloaded, memory)
    return None if schedule is None else schedule.makespan
