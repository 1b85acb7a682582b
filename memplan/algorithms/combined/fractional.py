"""The dynamic program of Theorem 1 of Efficient Combination of Rematerialization and Offloading (NeurIPS 2021) (POFO), appendix B, with Lemma 1's transfers.

Transfers are *fractional* here, as in the paper: the channel moves ``beta`` bytes per ms, the bytes
of an offload free GPU memory as they leave and those of a prefetch take GPU memory as they arrive,
and the backlogs ``Delta_F`` (bytes still to offload) and ``Delta_B`` (bytes still to prefetch) are
state variables. The value is the paper's (a relaxation of whole-tensor transfers); the schedule
that memplan outputs realizes the DP's decisions with whole tensors
(:mod:`memplan.algorithms.combined.realize`) and states its own simulated makespan.
docs/algorithms.md ("pofo") gives our reading of every recurrence; in short, in slots
(``u = (budget - |x[0]|) / N`` bytes, sizes rounded up, ``beta`` in slots per ms):

NOTE [ pofo fractional recurrences ]
Lemma 1 (A): a sequence ``S`` run while ``D`` slots are prefetched by its end (resp. offloaded
from its start) with ``m`` slots otherwise free needs the idle time
``eps = max(0, max_o (M_o - beta d_o) - (m - D)) / beta`` where ``d_o`` is the compute time after
``o`` (resp. before ``o``).

``CA[a][b][m][D]`` (B.3, backward phase): least time for stages ``a..b`` by rotor's operations, with
``x[a]`` on the GPU (not counted), ``g[b+1]`` held and counted in ``m`` free slots, while ``D``
slots are prefetched by its end. Reading its sequences backwards, each part prefetches during its
own time what it can and leaves the rest to the part before it (``D' = ceil(max(0, D - beta T))``):

* one stage: ``ft + bt + eps`` over ``[F_all a (d = bt), B a (d = 0)]``;
* ``F_all a``: ``eps_B = max(0, nB - m + D) / beta``, ``D1 = D - beta (bt + eps_B)``,
  ``T1 = CA[a+1][b][m - s[a]][D1]``, ``D2 = D1 - beta T1``, ``eps_F = max(0, nF - m + D2) / beta``;
  value ``ft + bt + T1 + eps_F + eps_B``;
* ``F_ck a, F_n a+1..j-1``: ``T2 = CA[a][j-1][m][D]``, ``D1 = D - beta T2``,
  ``T1 = CA[j][b][m - x[j]][D1]``, ``D2 = D1 - beta T1``, Lemma 1 over the forwards with ``D2``;
  value ``sum ft[a..j-1] + T1 + T2 + eps``.

``OC[a][T][K][F][B]`` (B.1, forward phase): least time from the first forward of the top-level
segment starting at stage ``a`` to the end of its backward, its input ``T`` (``x[a]`` or ``s[a-1]``,
``t`` slots) on the GPU, ``K`` slots kept by earlier segments, ``F`` slots of earlier offloads still
on the GPU and leaving at ``beta`` from now on, ``B`` slots to prefetch by the end of this segment
(for the segments before it). ``avail = C - K - t``. The input is offloaded (``v = 1``) or kept
(``v = 0``), Table 2: ``K' = K + (1 - v) t``, ``F' = max(0, F + v t - D_F)``,
``B' = max(0, B - D_B) + v t``, with ``D_F = beta (forward time + eps_F)`` and ``D_B = beta
(backward time + eps_B)``.

* ``F_all a`` (case 1): ``eps_F = max(0, nF - avail + F) / beta``, ``eps_B = max(0, nB - avail +
  B) / beta``; value ``ft + bt + eps_F + eps_B + OC[a+1][s[a]][K'][F'][B']``;
* ``F_ck a, F_n .. j-1`` (case 2): Lemma 1 over the forwards (``d_o`` from the start, ``F`` pending),
  the recomputation ``T2 = CA[a][j-1][avail][B]`` prefetching ``B`` (``D_B = beta T2``); value
  ``sum ft + eps_F + T2 + OC[j][x[j]][K'][F'][B']``;
* the loss (B.2), stage ``L-1``: ``F_all``, the offloads left finish, the prefetches left start,
  ``B``: ``ft + bt + eps_F + eps_B + (max(0, F - beta (ft + eps_F)) + max(0, B - beta (bt +
  eps_B))) / beta``;
* a *tail* (our addition, so that every rotor plan is a plan of the DP): the offloads left finish,
  then ``CA[a][L-1][avail][B]``.

``x[0]`` is outside the capacity, as in rotor; offloading it adds ``c0 = floor(|x[0]| / u)`` slots
(capped so that the tables stay small), modelled as a capacity ``C + c0`` with ``x[0]`` taking
``c0`` slots. The value is ``OC[0][x[0]][0][0][0]``.

NOTE [ pofo window ]
--------------------
The backward tables have ``L^2 / 2`` pairs of ``(C + 1)^2`` entries, each a minimum over up to
``L`` splits (``O(L^3 C^2)``, the complexity of its Appendix B.4): 10 s and 0.5 GB at 100 stages,
hours and tens of GB at 1000. With a ``window`` ``w``, every recomputed segment has at most ``w``
stages except the tail: ``CA[a][b]`` is kept for ``b - a < w`` and for ``b = L - 1``, split at
``j <= a + w`` only (the tail's first checkpoint within ``w`` stages, the rest a tail again), and
the forward phase's segments ``F_ck a .. F_n j-1`` have ``j - a <= w``: ``O(L w^2 C^2)`` time and
``O(L w C^2)`` memory. It is a restriction of the plans, not an approximation of their times:
every plan of the windowed DP is a plan of the full one, timed the same way, and ``w >= L`` is the
full DP. On 100-stage random chains, windows of 4, 8 and 17 stages gave plans within 0.3% of each
other; pofo sizes the window by the work it allows (``memplan.algorithms.combined``).

NOTE [ pofo pruning ]
---------------------
The forward phase evaluates only the states that may lie on an optimal plan: a state of segment
``a`` reached in time ``g`` (the least, over the choices before it) whose ``g + R[a][C - K]``
exceeds the time of a plan already known is on no plan faster than that one and is skipped.
``R`` (:meth:`FractionalDP._relaxed`) is a lower bound of the time after the state: the
recurrences of B.1 with transfers free, each segment at its least time over every ``m' <= C - K``
and every prefetch (so it holds whatever the tables' roundings). The plan known is the fastest of
a beam search over the same forward phase (the 1024 most promising states of each segment) and
the bound that pofo gives (the fastest candidate so far on long chains: the DP then only looks for
faster plans, and its value is inf when there is none). Without a bound the DP evaluates every
reachable state: the lower bound is weak alone (with free transfers nothing needs recomputing
when memory allows an offload), and on a 50-stage chain the two bounded passes cost more than
they saved. Every state of an optimal plan is kept and evaluated exactly as without pruning, so
the value and the plan are the same (the tests compare them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from memplan.algorithms.base import Sequence
from memplan.algorithms.chain.problem import ChainInstance
from memplan.algorithms.chain.rotor import slot_sizes
from memplan.algorithms.timeline import Deadline, TimeLimitReached
from memplan.core import kernels
from memplan.schedule import OpName

INF = np.inf
MAX_SLOTS = 64
"""Slots of the fractional DP at most (its forward states are (C + 1)^3 per stage)."""
_KernelChain = tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
]
"""``x, s, g, fo, own_b, ft, bt, fprefix`` of :meth:`FractionalDP._kernel_chain`."""
_States = list[list[np.ndarray | None]]
"""Per segment and input kind: the flat indices of its states reached (None: none)."""
_MAX_WIDTH = 72  # capacity + x[0] credit + 1, at most
_EPS = 1e-9
_F_ALL = -1
_NONE = -3
_TAIL = -2
_PRUNE_TOLERANCE = 1e-6
"""Relative (and absolute, ms) slack of the pruning bound (float32 tables, sums in other orders)."""
_BEAM = 1024
"""States kept per segment by the beam search of the forward phase (NOTE [ pofo pruning ])."""


def _ceil(values: np.ndarray) -> np.ndarray:
    """Slots still to move: ``ceil(max(0, v))`` (a hair of tolerance; -inf is 0), as int64."""
    out = np.ceil(values - _EPS)
    np.clip(out, 0, 2**30, out=out)
    return out.astype(np.int64)


def table_bytes(length: int, window: int, width: int) -> int:
    """Bytes of the backward tables of :class:`FractionalDP` (values and choices): ``CA[a][b]``
    for every pair ``b - a < window`` and every ``b = L - 1``, ``width^2`` entries each.
    """
    pairs = length * min(window, length) + length
    return pairs * width * width * (8 + 2)


@dataclass
class FractionalPlan:
    """The decisions of the DP, ready to be timed with whole tensors.

    ``sequence``: the computations in order; ``offloads``: ``(tensor, trigger)`` (offloaded from
    the start of computation ``trigger``, the first one that reads it); ``prefetches``:
    ``(tensor, need)`` (needed by computation ``need``), in the order of ``need``.
    """

    sequence: Sequence = field(default_factory=list)
    offloads: list[tuple[str, int]] = field(default_factory=list)
    prefetches: list[tuple[str, int]] = field(default_factory=list)


class FractionalDP:
    """NOTE [ pofo fractional recurrences ] for one chain, budget and bandwidth.

    Parameters
    ----------
    chain : ChainInstance
    memory : int
        Activation bytes, ``x[0]`` included.
    bandwidth : float
        Bytes/s (> 0).
    slots : int
        Slots of ``memory - |x[0]|`` (at most :data:`MAX_SLOTS`).
    nearest : bool
        Round sizes to the nearest slot instead of up, and keep ``margin`` slots aside: the plan may
        then not fit in bytes (the realization checks it exactly), but it loses less to rounding.
    margin : int
        Slots kept aside (with ``nearest``).
    window : int, optional
        Stages of a recomputed segment at most, the tail aside (NOTE [ pofo window ]); None or
        at least the chain's length: every segment (the DP of Theorem 1).
    bound : float
        Look only for plans of time at most ``bound`` (ms): the DP's value is inf when none is
        (NOTE [ pofo pruning ]).
    deadline : Deadline, optional
        :meth:`solve` raises :class:`memplan.algorithms.timeline.TimeLimitReached` once it passes.
    pinned : ndarray of bool, optional
        ``pinned[a]``: segment ``a``'s input (``x[a]`` or ``s[a-1]``) is never offloaded
        (autograd frees it after ``F_all a``: T6 of docs/combined.md).
    """

    def __init__(
        self,
        chain: ChainInstance,
        memory: int,
        bandwidth: float,
        slots: int,
        *,
        nearest: bool = False,
        margin: int = 0,
        window: int | None = None,
        bound: float = INF,
        deadline: Deadline | None = None,
        pinned: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        self.chain = chain
        self.pinned = (
            None if pinned is None or not pinned.any() else np.asarray(pinned, dtype=np.int64)
        )
        L = self.L = chain.length
        budget = max(memory - int(chain.x[0]), 0)
        slots = self.slots = max(2, min(slots, MAX_SLOTS))
        cap, r = slot_sizes(chain, budget, slots)
        self.unit = 1.0 if budget <= slots else budget / slots
        # F_all's own overhead (the training loop's: NOTE [ pofo loop terms ]), as fo is rounded
        fall = chain.fall if budget <= slots else -(-chain.fall.astype(object) * slots // budget)
        r["fa"] = np.asarray(fall, dtype=np.int64)
        if nearest and budget > slots:
            r = {
                name: np.floor(getattr(chain, attr) / self.unit + 0.5).astype(np.int64)
                for name, attr in (("x", "x"), ("s", "s"), ("g", "g"), ("fo", "fo"))
                + (("bo", "bo"), ("fa", "fall"))
            }
            cap = max(0, cap - margin)
        c0 = int(int(chain.x[0]) // self.unit) if budget > 0 else 0
        self.c0 = max(0, min(c0, _MAX_WIDTH - 1 - cap))
        self.C = cap + self.c0
        self.W = self.C + 1
        self.beta = bandwidth / 1000.0 / self.unit  # slots per ms
        self.D = self.W if self.beta > 0 else 1
        self.window = L if window is None else max(1, min(int(window), L))
        self.deadline = deadline or Deadline(None)
        self.bound = float(bound)
        self.x = [int(v) for v in r["x"]]
        self.x[0] = self.c0
        self.s = [int(v) for v in r["s"]]
        self.g = [int(v) for v in r["g"]]
        self.fo = [int(v) for v in r["fo"]]
        self.fa = [int(v) for v in r["fa"]]
        self.bo = [int(v) for v in r["bo"]]
        self.own_fa = None if chain.fa is None else np.array(self.fa, dtype=np.int64)
        self.ft = [float(v) for v in chain.ft]
        self.bt = [float(v) for v in chain.bt]
        self.fprefix = np.concatenate(([0.0], np.cumsum(chain.ft)))
        self.own_b = [self.g[k + 1] + self.s[k] + self.g[k] + self.bo[k] for k in range(L)]
        self.value = INF
        self.evaluated = 0  # forward states evaluated (the reachable ones)

    # -- Lemma 1 ---------------------------------------------------------------------------------
    def _idle(self, excess: np.ndarray) -> np.ndarray:
        """``max(0, excess) / beta`` (Lemma 1); with no bandwidth only ``excess <= 0`` is free."""
        if self.beta > 0:
            idle: np.ndarray = np.maximum(excess, 0.0) / self.beta
            return idle
        return np.where(excess > 0, INF, 0.0)

    def _idle_one(self, excess: float) -> float:
        """:meth:`_idle` of one excess."""
        return float(self._idle(np.asarray(excess, dtype=np.float64)))

    def _fwd_needs(self, a: int, j: int, grad: int) -> list[int]:
        """Memory of ``F_ck a, F_n a+1 .. j-1`` (beyond ``x[a]``) with ``grad`` held."""
        x, fo = self.x, self.fo
        return [grad + x[a + 1] + fo[a]] + [grad + x[k] + x[k + 1] + fo[k] for k in range(a + 1, j)]

    # -- B.3 -------------------------------------------------------------------------------------
    def _ca(self, a: int, b: int) -> np.ndarray:
        """``CA[a][b]`` (``(W, D)``: every ``m`` and ``D``), for ``b - a < window`` or ``b = L-1``."""
        table: np.ndarray = self.last[a] if b == self.L - 1 else self.near[a, b - a]
        return table

    def _ca_choice(self, a: int, b: int) -> np.ndarray:
        table: np.ndarray = self.last_choice[a] if b == self.L - 1 else self.near_choice[a, b - a]
        return table

    def _backward_tables(self) -> None:
        """``CA[a][b]`` for ``b - a < window`` (``near[a, b - a]``) and ``CA[a][L-1]`` for every
        ``a`` (``last[a]``), split at ``j <= a + window`` (NOTE [ pofo window ]), by the compiled
        core (src/pofo_fractional.cpp; its numpy reference is tests/oracles/pofo_forward.py).
        """
        L, W, D, w = self.L, self.W, self.D, self.window
        left = self.deadline.left()
        done, near, near_choice, last, last_choice = kernels.pofo_backward(
            *self._kernel_chain(),
            capacity=self.C,
            depth=D,
            window=w,
            beta=self.beta,
            time_limit=-1.0 if left is None else left,
            fa=self.own_fa,
        )
        if not done:
            raise TimeLimitReached
        shape = (max(L - 1, 0), w, W, D)
        self.near, self.near_choice = near.reshape(shape), near_choice.reshape(shape)
        self.last, self.last_choice = last.reshape(L, W, D), last_choice.reshape(L, W, D)

    def _kernel_chain(self) -> _KernelChain:
        """``x, s, g, fo, own_b, ft, bt, fprefix`` as the core's kernels take them."""

        def ints(values: list[int]) -> npt.NDArray[np.int64]:
            return np.array(values, dtype=np.int64)

        def floats(values: list[float] | np.ndarray) -> npt.NDArray[np.float64]:
            return np.ascontiguousarray(values, dtype=np.float64)

        return (
            ints(self.x),
            ints(self.s),
            ints(self.g),
            ints(self.fo),
            ints(self.own_b),
            floats(self.ft),
            floats(self.bt),
            floats(self.fprefix),
        )

    # -- B.1, B.2 --------------------------------------------------------------------------------
    def _t_size(self, a: int, kind: int) -> int:
        return self.x[a] if kind == 0 else self.s[a - 1]

    def _relaxed(self) -> np.ndarray:
        """``R[a][m]``: a lower bound of the time from the start of segment ``a`` to the end when
        every later computation has at most ``m`` slots (NOTE [ pofo pruning ]): the recurrences
        of B.1 with transfers free and instant, and each segment's recomputation at its least
        time with at most ``m`` slots and any prefetch, in the same window. Non-increasing in ``m``;
        a plan from a state of segment ``a`` that keeps ``K`` slots takes at least ``R[a][C - K]``.
        """
        L, W, w = self.L, self.W, self.window
        fp = self.fprefix

        def least(table: np.ndarray) -> np.ndarray:  # min over m' <= m and every D
            return np.minimum.accumulate(table.min(axis=-1), axis=-1)

        relaxed = np.full((L + 1, W), INF)
        for a in range(L - 1, -1, -1):
            best = least(self.last[a])  # the tail (the loss when a = L - 1)
            if a < L - 1:
                best = np.minimum(best, self.ft[a] + self.bt[a] + relaxed[a + 1])
                top = min(L - 1, a + w)
                segments = least(self.near[a, : top - a])  # CA[a][j-1], j = a+1 .. top
                for j in range(a + 1, top + 1):
                    best = np.minimum(best, (fp[j] - fp[a]) + segments[j - 1 - a] + relaxed[j])
            relaxed[a] = best
        return relaxed

    def _forward_tables(self) -> None:
        """``OC`` on the states that may lie on an optimal plan only (NOTE [ pofo pruning ]), by
        the compiled core (src/pofo_fractional.cpp; its numpy reference is
        tests/oracles/pofo_forward.py).

        A forward pass collects, stage by stage, the states ``(K, F, B)`` that some choice of the
        segments before reaches and, with a ``bound``, only within it and the time of a plan that
        a beam search finds first; the backward pass evaluates the recurrences of B.1 on those
        states (float32 tables, INF where unreachable; only those within the window are kept).
        Each state's decision is kept (``choice[a][kind]``, beside its index in
        ``states[a][kind]``) for :meth:`plan`.
        """
        L = self.L
        relaxed = None
        if self.bound != INF:
            relaxed = np.ascontiguousarray(self._relaxed(), dtype=np.float64)
        left = self.deadline.left()
        stopped, value, evaluated, states, choices = kernels.pofo_forward(
            *self._kernel_chain(),
            self.near,
            self.last,
            relaxed,
            capacity=self.C,
            depth=self.D,
            window=self.window,
            beta=self.beta,
            bound=self.bound,
            beam=_BEAM,
            tolerance=_PRUNE_TOLERANCE,
            time_limit=-1.0 if left is None else left,
            pinned=self.pinned,
            fa=self.own_fa,
        )
        if stopped:
            raise TimeLimitReached
        self.value = float(value)
        self.evaluated = int(evaluated)
        self.states: _States = [[states[2 * a], states[2 * a + 1]] for a in range(L)]
        self.choice: list[list[np.ndarray | None]] = [
            [choices[2 * a], choices[2 * a + 1]] for a in range(L)
        ]

    def solve(self) -> float:
        """The least time ``OC[0][x[0]][0][0][0]`` (inf when nothing fits)."""
        self._backward_tables()
        self._forward_tables()
        if self.value > self.bound * (1 + _PRUNE_TOLERANCE) + _PRUNE_TOLERANCE:
            self.value = INF  # only plans within the bound were looked for
        return self.value

    # -- decisions -------------------------------------------------------------------------------
    def _ca_ops(self, a: int, b: int, m: int, d: int, out: Sequence) -> None:
        """Append the computations of ``CA[a][b][m][d]`` (along its choices)."""
        beta = self.beta
        stack: list[tuple[int, int, int, int] | tuple[OpName, int]] = [(a, b, m, d)]
        while stack:
            item = stack.pop()
            if len(item) == 2:  # an operation
                out.append(item)
                continue
            a, b, m, d = item
            c = int(self._ca_choice(a, b)[m, d])
            if c == _NONE:  # pragma: no cover - the caller reads finite values only
                raise AssertionError(f"pofo: no CA choice for {a}..{b} at {m},{d}")
            if a == b:
                out += [("F_all", a), ("B", a)]
                continue
            if c == _F_ALL:
                eps_b = self._idle_one(self.own_b[a] - m + d)
                d1 = int(_ceil(np.array([d - beta * (self.bt[a] + eps_b)]))[0]) if beta > 0 else 0
                out.append(("F_all", a))
                stack += [("B", a), (a + 1, b, m - self.s[a], d1)]
                continue
            j = c
            t2 = float(self._ca(a, j - 1)[m, d])
            d1 = int(_ceil(np.array([d - beta * t2]))[0]) if beta > 0 else 0
            out.append(("F_ck", a))
            out += [("F_n", k) for k in range(a + 1, j)]
            stack += [(a, j - 1, m, d), (j, b, m - self.x[j], d1)]

    def _choice_at(self, a: int, kind: int, state: int) -> int:
        """The decision kept for a forward state (``_NONE`` if it was not reached)."""
        S = self.states[a][kind]
        if S is None:
            return _NONE
        at = int(np.searchsorted(S, state))
        if at == len(S) or S[at] != state:
            return _NONE
        chosen = self.choice[a][kind]
        assert chosen is not None  # kept beside its states
        return int(chosen[at])

    def plan(self) -> FractionalPlan:
        """The decisions of ``OC[0][x[0]][0][0][0]`` (call after a finite :meth:`solve`)."""
        beta, C, L, D = self.beta, self.C, self.L, self.D
        plan = FractionalPlan()
        a, kind, K, F, B = 0, 0, 0, 0, 0
        backs: list[tuple[Sequence, str | None]] = []  # per segment: its backward ops, prefetched T
        while True:
            c = self._choice_at(a, kind, (K * D + F) * D + B)
            if c == _NONE:  # pragma: no cover - the forward pass reached every state visited here
                raise AssertionError(f"pofo: no OC choice at stage {a}, state {(K, F, B)}")
            t = self._t_size(a, kind)
            name = f"x[{a}]" if kind == 0 else f"s[{a - 1}]"
            avail = C - K - t
            if c == _TAIL:
                if a == L - 1:
                    plan.sequence += [("F_all", a), ("B", a)]
                else:
                    self._ca_ops(a, L - 1, avail, B, plan.sequence)
                break
            j, v = divmod(c, 2)
            first = len(plan.sequence)
            if v:
                plan.offloads.append((name, first))
            if j == a:  # F_all a
                nF = self.g[L] + self.s[a] + self.fa[a]
                eps_f = self._idle_one(nF - avail + F)
                eps_b = self._idle_one(self.own_b[a] - avail + B)
                window, d_back = self.ft[a], self.bt[a] + eps_b
                plan.sequence.append(("F_all", a))
                back: Sequence = [("B", a)]
                nxt, nkind = a + 1, 1
            else:
                needs = self._fwd_needs(a, j, self.g[L])
                fp = self.fprefix
                lem = max(needs[i] - beta * (fp[a + i] - fp[a]) for i in range(len(needs)))
                eps_f = self._idle_one(lem - avail + F)
                window = fp[j] - fp[a]
                d_back = float(self._ca(a, j - 1)[avail, B])
                plan.sequence.append(("F_ck", a))
                plan.sequence += [("F_n", k) for k in range(a + 1, j)]
                back = []
                self._ca_ops(a, j - 1, avail, B, back)
                nxt, nkind = j, 0
            backs.append((back, name if v else None))
            if beta > 0:
                F = int(_ceil(np.array([F + v * t - beta * (window + eps_f)]))[0])
                B = int(_ceil(np.array([B - beta * d_back]))[0]) + v * t
            K = K + (1 - v) * t
            a, kind = nxt, nkind
        for back, fetched in reversed(backs):
            if fetched is not None:
                plan.prefetches.append((fetched, len(plan.sequence)))
            plan.sequence += back
        return plan
