"""``pofo``: rematerialization and offloading together, after Efficient Combination of Rematerialization and Offloading (NeurIPS 2021) (POFO), appendix B.

This is a dynamic program in the structure of Theorem 1 of Efficient Combination of Rematerialization and Offloading (NeurIPS 2021) with a *whole-tensor*
transfer model that every schedule it outputs realizes exactly (docs/combined.md, docs/algorithms.md
"pofo"). It is not the paper's DP verbatim: the paper's Lemma 1 lets the channel's bytes flow
fractionally across operations (state ``Delta_F``, ``Delta_B``), which a schedule of whole tensors
cannot always realize; here each transfer overlaps one window of computations and the compute
stream idles at the window's end if the transfer is longer (Lemma 1 with a single operation).

NOTE [ pofo recurrences ]
The forward phase is a sequence of top-level segments, as in B.1. A segment starts at stage ``a``
with its input ``T`` (``x[0]``, a standalone ``x[a]`` or ``s[a-1]``) on the GPU, ``K`` slots of
earlier top-level tensors kept on the GPU and ``P`` the earlier tensor to prefetch during this
segment's backward (offloaded by the segment before). ``V(a, K, T, P)`` is the least time from the
segment's first forward to the end of its backward (including everything after it in between):

* **tail** (B.2): rotor on stages ``a..L-1``; ``T`` stays (the tail reads it); ``P`` is prefetched
  during the tail: ``opt[a][L-1][C - K - |T| - |P|] + max(0, |P|/beta - that)``.
* **F_all a** (B.1 case 1), ``a < L-1``, new top-level tensor ``s[a]``:
  ``ft[a] + idle_F + V(a+1, K', s[a], P') + bt[a] + idle_B``, with
  ``K + |T| + s[a] + fo[a] + g[L] <= C`` and ``K + |T| + |P| + g[a+1] + s[a] + g[a] + bo[a] <= C``.
* **F_ck a, F_n a+1 .. j-1** (B.1 case 2), ``a < j <= L-1``, new top-level tensor ``x[j]``:
  ``sum ft[a..j-1] + idle_F + V(j, K', x[j], P') + C_A + idle_B`` with ``C_A = opt[a][j-1][C - K -
  |T| - |P|]`` (the recomputation of B.3, rotor with ``g[j]`` held) and the forward need of rotor.

In both cases ``T`` is offloaded (``v = 1`` of Table 2) or kept (``v = 0``): kept, ``K' = K + |T|``,
``P' = none``; offloaded, during this segment's forward (``idle_F = max(0, |T|/beta - window)``),
``K' = K``, ``P' = T``, prefetched during the next segment's backward. ``idle_B = max(0,
|P|/beta - backward time)``: the prefetch of ``P`` starts with this segment's backward (reserving
``|P|``) and must end before the segment before it starts its own (Lemma 1, one window).
The value is ``V(0, 0, x[0], none)``; ``x[0]`` is outside the slot capacity ``C`` as in rotor, and
offloading it credits ``floor(|x[0]| / u)`` slots.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Literal

import numpy as np

from memplan.algorithms.base import Sequence, Transfer
from memplan.algorithms.chain.problem import ChainInstance
from memplan.algorithms.chain.rotor import F_ALL, dense_table, slot_sizes

INF = math.inf


_Decision = tuple[Literal["none", "tail", "all", "ck"], int, bool]
"""How ``V(a, K, T, P)`` is reached: its kind, the checkpoint ``j`` (``ck``) and whether ``T`` is
offloaded."""


@dataclass(frozen=True, eq=False)  # hashed by identity: one object per tensor
class _Tensor:
    name: str  # "x[k]" or "s[k]"
    nbytes: int
    keep: int  # slots while on the GPU (0 for x[0], outside the capacity)
    credit: int  # extra capacity while offloaded: floor(|x[0]| / u) for x[0] (outside it), else 0


class PofoDP:
    """The dynamic program of NOTE [ pofo recurrences ] for one chain, budget and bandwidth.

    Parameters
    ----------
    chain : ChainInstance
    memory : int
        Activation bytes, ``x[0]`` included (budget minus static memory).
    bandwidth : float
        Bytes/s; 0 forbids offloading (the DP is then rotor's).
    slots : int
        Slots of the activation budget ``memory - |x[0]|`` (docs/model.md).
    pinned : ndarray of bool, optional
        ``pinned[a]``: segment ``a``'s input is never offloaded (T6 of docs/combined.md).
    """

    def __init__(
        self,
        chain: ChainInstance,
        memory: int,
        bandwidth: float,
        slots: int,
        *,
        pinned: np.ndarray | None = None,
    ) -> None:
        self.chain = chain
        self.pinned = [False] * chain.length if pinned is None else [bool(p) for p in pinned]
        self.L = chain.length
        budget = memory - int(chain.x[0])
        self.capacity, r = slot_sizes(chain, max(budget, 0), slots)
        self.unit = 1.0 if budget <= slots else budget / slots
        self.r = r
        self.per_ms = bandwidth / 1000.0
        table = dense_table(chain, self.capacity, r["x"], r["s"], r["g"], r["fo"], r["bo"])
        self.opt, self.choice = table.opt, table.choice
        self.fprefix = np.concatenate(([0.0], np.cumsum(chain.ft))).tolist()
        x0 = int(chain.x[0])
        self.x0 = _Tensor("x[0]", x0, 0, int(x0 // self.unit) if budget > 0 else 0)
        self.memo: dict[tuple[int, int, _Tensor, _Tensor | None], tuple[float, _Decision]] = {}
        self._tensors = {"x": [self.x0], "s": []}
        for k in range(self.L):
            if k > 0:
                xs = int(r["x"][k])
                self._tensors["x"].append(_Tensor(f"x[{k}]", int(chain.x[k]), xs, 0))
            ss = int(r["s"][k])
            self._tensors["s"].append(_Tensor(f"s[{k}]", int(chain.s[k]), ss, 0))
        self._x = [int(v) for v in r["x"]]
        self._s = [int(v) for v in r["s"]]
        self._g = [int(v) for v in r["g"]]
        self._fo = [int(v) for v in r["fo"]]
        self._bo = [int(v) for v in r["bo"]]
        self._ft = [float(v) for v in chain.ft]
        self._bt = [float(v) for v in chain.bt]
        self._opt_list = self.opt.tolist()

    def tensor(self, kind: str, k: int) -> _Tensor:
        return self._tensors[kind][k]

    def move(self, t: _Tensor) -> float:
        return INF if self.per_ms <= 0 else t.nbytes / self.per_ms

    def _opt(self, a: int, b: int, m: int) -> float:
        # Beyond the capacity (x[0] offloaded), rotor's plan at the capacity still fits.
        return INF if m < 0 else self._opt_list[a][b][min(m, self.capacity)]

    def value(self, a: int, K: int, T: _Tensor, P: _Tensor | None) -> tuple[float, _Decision]:
        """``V(a, K, T, P)`` and the decision reaching it (``("tail", 0, False)``,
        ``("all", 0, off)``, ``("ck", j, off)``; ``("none", 0, False)`` where nothing fits).
        """
        key = (a, K, T, P)
        found = self.memo.get(key)
        if found is not None:
            return found
        L = self.L
        x, s, g, fo, bo = self._x, self._s, self._g, self._fo, self._bo
        xt, st = self._tensors["x"], self._tensors["s"]
        pslots = 0 if P is None else P.keep + P.credit  # reserved while P is prefetched
        pf_time = 0.0 if P is None else self.move(P)
        room = self.capacity - K - T.keep - pslots  # slots for the backward of this segment
        best: tuple[float, _Decision] = (INF, ("none", 0, False))
        tail = self._opt(a, L - 1, room)
        if tail < INF:
            best = (tail + max(0.0, pf_time - tail), ("tail", 0, False))
        fwd_room = self.capacity - K - T.keep - g[L]
        # Checkpoints x[j] the forward can reach, with rotor's recomputation of a..j-1 (B.3).
        ck: list[tuple[int, float, float]] = []
        need = x[a + 1] + fo[a]
        opt_a = self._opt_list[a]
        back_room = min(room, self.capacity)
        for j in range(a + 1, L):
            if j > a + 1:
                need = max(need, x[j - 1] + x[j] + fo[j - 1])
            if need > fwd_room:
                break
            back = opt_a[j - 1][back_room] if room >= 0 else INF
            if back < INF:
                ck.append((j, self.fprefix[j] - self.fprefix[a], back + max(0.0, pf_time - back)))
        fits_all = a < L - 1 and s[a] + fo[a] <= fwd_room and g[a + 1] + s[a] + g[a] + bo[a] <= room
        for off in (False, True):
            if off and (self.per_ms <= 0 or self.pinned[a]):
                continue
            K2 = K - T.credit if off else K + T.keep
            P2 = T if off else None
            off_time = self.move(T) if off else 0.0
            if fits_all:  # F_all a (B.1 case 1)
                sub = self.value(a + 1, K2, st[a], P2)[0]
                if sub < INF:
                    ft, bt = self._ft[a], self._bt[a]
                    total = ft + max(0.0, off_time - ft) + sub + bt + max(0.0, pf_time - bt)
                    if total < best[0]:
                        best = (total, ("all", 0, off))
            for j, window, back in ck:  # F_ck a, F_n .. j-1 (B.1 case 2)
                sub = self.value(j, K2, xt[j], P2)[0]
                if sub < INF:
                    total = window + (off_time - window if off_time > window else 0.0) + sub + back
                    if total < best[0]:
                        best = (total, ("ck", j, off))
        self.memo[key] = best
        return best

    def solve(self) -> float:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 10 * self.L + 1000))
        try:
            return self.value(0, 0, self.x0, None)[0]
        finally:
            sys.setrecursionlimit(limit)

    def _rotor_ops(self, a: int, b: int, m: int) -> Sequence:
        """Rotor's plan of stages ``a..b`` with ``m`` slots (its table's choices)."""
        seq: Sequence = []
        stack: list[tuple[str, int, int, int]] = [("solve", a, b, m)]
        x, s = self.r["x"], self.r["s"]
        while stack:
            kind, lo, hi, mem = stack.pop()
            if kind == "op":
                seq.append(("B", lo))
            elif lo == hi:
                seq += [("F_all", lo), ("B", lo)]
            else:
                ch = int(self.choice[lo, hi, mem])
                if ch == F_ALL:
                    seq.append(("F_all", lo))
                    stack += [("op", lo, lo, 0), ("solve", lo + 1, hi, mem - int(s[lo]))]
                else:
                    seq.append(("F_ck", lo))
                    seq += [("F_n", k) for k in range(lo + 1, ch)]
                    stack += [("solve", lo, ch - 1, mem), ("solve", ch, hi, mem - int(x[ch]))]
        return seq

    def schedule(self) -> list[Transfer]:
        """The timed operations of ``V(0, 0, x[0], none)`` (NOTE [ pofo recurrences ])."""
        c = self.chain
        ops: list[Transfer] = []
        clock = 0.0

        def run(seq: Sequence) -> None:
            nonlocal clock
            for name, k in seq:
                d = float(c.bt[k] if name == "B" else c.ft[k])
                ops.append((name, k, clock, clock + d, "compute", None))
                clock += d

        def transfer(kind: Literal["offload", "prefetch"], t: _Tensor, start: float) -> float:
            end = start + self.move(t)
            stage = min(int(t.name[2:-1]), self.L - 1)
            ops.append((kind, stage, start, end, "transfer", t.name))
            return end

        # Forward phase: walk the decisions; keep what each segment's backward needs.
        a, K, T, P = 0, 0, self.x0, None
        pending: list[tuple[Sequence, _Tensor | None]] = []
        while True:
            _, decision = self.value(a, K, T, P)
            room = self.capacity - K - T.keep - (0 if P is None else P.keep + P.credit)
            if decision[0] == "tail":
                begin = clock
                end = transfer("prefetch", P, begin) if P is not None else begin
                run(self._rotor_ops(a, self.L - 1, min(room, self.capacity)))
                clock = max(clock, end)
                break
            off = decision[-1]
            begin = clock
            end = transfer("offload", T, begin) if off else begin
            back: Sequence
            if decision[0] == "all":
                run([("F_all", a)])
                back, nxt, new = [("B", a)], a + 1, self.tensor("s", a)
            else:
                j = decision[1]
                forward: Sequence = [("F_ck", a)]
                run(forward + [("F_n", k) for k in range(a + 1, j)])
                back = self._rotor_ops(a, j - 1, min(room, self.capacity))
                nxt, new = j, self.tensor("x", j)
            clock = max(clock, end)
            pending.append((back, P))
            K = K - T.credit if off else K + T.keep
            P = T if off else None
            a, T = nxt, new
        # Backward phase: the segments' backwards in reverse, each prefetching its P.
        for back, prev in reversed(pending):
            begin = clock
            end = transfer("prefetch", prev, begin) if prev is not None else begin
            run(back)
            clock = max(clock, end)
        return ops
