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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memplan.algorithms.chain.problem import Chain
from memplan.algorithms.chain.rotor import slot_sizes

INF = np.inf
MAX_SLOTS = 64
"""Slots of the fractional DP at most (its forward table has L * 2 * (C + 1)^3 values)."""
_MAX_WIDTH = 72  # capacity + x[0] credit + 1, at most
_EPS = 1e-9
_F_ALL = -1
_NONE = -3
_TAIL = -2


def _ceil(values: np.ndarray) -> np.ndarray:
    """Slots still to move: ``ceil(max(0, v))`` (a hair of tolerance; -inf is 0), as int64."""
    out = np.ceil(values - _EPS)
    np.clip(out, 0, 2**30, out=out)
    return out.astype(np.int64)


@dataclass
class FractionalPlan:
    """The decisions of the DP, ready to be timed with whole tensors.

    ``sequence``: the computations in order; ``offloads``: ``(tensor, trigger)`` (offloaded from
    the start of computation ``trigger``, the first one that reads it); ``prefetches``:
    ``(tensor, need)`` (needed by computation ``need``), in the order of ``need``.
    """

    sequence: list[tuple[str, int]] = field(default_factory=list)
    offloads: list[tuple[str, int]] = field(default_factory=list)
    prefetches: list[tuple[str, int]] = field(default_factory=list)


class FractionalDP:
    """NOTE [ pofo fractional recurrences ] for one chain, budget and bandwidth.

    Parameters
    ----------
    chain : Chain
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
    """

    def __init__(
        self,
        chain: Chain,
        memory: int,
        bandwidth: float,
        slots: int,
        *,
        nearest: bool = False,
        margin: int = 0,
    ) -> None:
        self.chain = chain
        L = self.L = chain.length
        budget = max(memory - int(chain.x[0]), 0)
        slots = self.slots = max(2, min(slots, MAX_SLOTS))
        cap, r = slot_sizes(chain, budget, slots)
        self.unit = 1.0 if budget <= slots else budget / slots
        if nearest and budget > slots:
            r = {
                name: np.floor(getattr(chain, name) / self.unit + 0.5).astype(np.int64)
                for name in ("x", "s", "g", "fo", "bo")
            }
            cap = max(0, cap - margin)
        c0 = int(int(chain.x[0]) // self.unit) if budget > 0 else 0
        self.c0 = max(0, min(c0, _MAX_WIDTH - 1 - cap))
        self.C = cap + self.c0
        self.W = self.C + 1
        self.beta = bandwidth / 1000.0 / self.unit  # slots per ms
        self.D = self.W if self.beta > 0 else 1
        self.x = [int(v) for v in r["x"]]
        self.x[0] = self.c0
        self.s = [int(v) for v in r["s"]]
        self.g = [int(v) for v in r["g"]]
        self.fo = [int(v) for v in r["fo"]]
        self.bo = [int(v) for v in r["bo"]]
        self.ft = [float(v) for v in chain.ft]
        self.bt = [float(v) for v in chain.bt]
        self.fprefix = np.concatenate(([0.0], np.cumsum(chain.ft)))
        self.own_b = [self.g[k + 1] + self.s[k] + self.g[k] + self.bo[k] for k in range(L)]
        self.CA: np.ndarray | None = None
        self.OC: list[list[np.ndarray | None]] = []

    # -- Lemma 1 ---------------------------------------------------------------------------------
    def _idle(self, excess):
        """``max(0, excess) / beta`` (Lemma 1); with no bandwidth only ``excess <= 0`` is free."""
        if self.beta > 0:
            return np.maximum(excess, 0.0) / self.beta
        return np.where(excess > 0, INF, 0.0)

    def _fwd_needs(self, a: int, j: int, grad: int) -> list[int]:
        """Memory of ``F_ck a, F_n a+1 .. j-1`` (beyond ``x[a]``) with ``grad`` held."""
        x, fo = self.x, self.fo
        return [grad + x[a + 1] + fo[a]] + [grad + x[k] + x[k + 1] + fo[k] for k in range(a + 1, j)]

    # -- B.3 -------------------------------------------------------------------------------------
    def _backward_tables(self) -> None:
        L, W, D = self.L, self.W, self.D
        beta = self.beta
        # CAt[b, a] = CA[a][b]: the sub-chains ending at b are contiguous (flat gathers below).
        CAt = np.full((L, L, W, D), INF)
        ch = np.full((L, L, W, D), _NONE, dtype=np.int16)
        m = np.arange(W, dtype=np.float64)[:, None]
        mint = np.arange(W)[:, None]
        delta = np.arange(D, dtype=np.float64)[None, :]
        over = delta > m  # more to prefetch than the room: infeasible
        ft, bt, s, x, g, fo = self.ft, self.bt, self.s, self.x, self.g, self.fo
        fp = self.fprefix
        plane = W * D
        for b in range(L):
            floor = 0
            for a in range(b, -1, -1):
                nF = g[b + 1] + s[a] + fo[a]
                nB = self.own_b[a]
                floor = max(floor, nB)
                lo = max(floor, g[b + 1] + s[b] + fo[b])  # no plan of a..b below (as rotor)
                if lo >= W:
                    continue
                mm, mi_, ov = m[lo:], mint[lo:], over[lo:]
                if a == b:
                    eps = np.maximum(
                        self._idle(nF - bt[a] * beta - mm + delta), self._idle(nB - mm + delta)
                    )
                    val = ft[a] + bt[a] + eps
                    val[ov] = INF
                    CAt[b, a, lo:] = val
                    ch[b, a, lo:] = np.where(np.isfinite(val), _F_ALL, _NONE)
                    continue
                # F_all a, then a+1..b with m - s[a], then B a.
                eps_b = self._idle(nB - mm + delta)
                if beta > 0:
                    d1 = _ceil(delta - beta * (bt[a] + eps_b))
                else:
                    d1 = np.zeros(mm.shape, np.int64)
                mi = mi_ - s[a]
                ok = (mi >= 0) & (d1 < D)
                flat = CAt[b, a + 1].reshape(-1)
                sub = np.where(ok, flat[np.clip(mi, 0, W - 1) * D + np.minimum(d1, D - 1)], INF)
                d2 = _ceil(d1 - beta * sub) if beta > 0 else d1
                fa = ft[a] + bt[a] + sub + self._idle(nF - mm + d2) + eps_b
                if max(nF, nB) > lo:
                    fa[: max(nF, nB) - lo] = INF
                # F_ck a, F_n .. j-1 keeping x[j], j = a+1..b (rows r = j - a - 1).
                n = b - a
                js = np.arange(a + 1, b + 1)
                t2 = CAt[a:b, a, lo:]  # CA[a][j-1][m][D]
                d1 = _ceil(delta[None] - beta * t2) if beta > 0 else np.zeros(t2.shape, np.int64)
                xj = np.array([x[j] for j in js])[:, None, None]
                mi = mi_[None] - xj
                ok = (mi >= 0) & (d1 < D)
                idx = (
                    np.arange(n)[:, None, None] * plane + np.clip(mi, 0, W - 1) * D
                ) + np.minimum(d1, D - 1)
                t1 = CAt[b, a + 1 : b + 1].reshape(-1)[idx]
                t1[~ok] = INF
                d2 = _ceil(d1 - beta * t1) if beta > 0 else d1
                needs = self._fwd_needs(a, b + 1, g[b + 1])[:n]  # F on stages a..j-1
                # Lemma 1 over the forwards: max_k (n_k + beta fp[k+1]) - beta fp[j]
                lem = np.maximum.accumulate([needs[i] + beta * fp[a + i + 1] for i in range(n)])
                lem = lem - beta * fp[a + 1 : b + 1]
                top = np.maximum.accumulate(needs)
                ck = self._idle(lem[:, None, None] - mm[None] + d2)
                ck += (fp[a + 1 : b + 1] - fp[a])[:, None, None]
                ck += t1
                ck += t2
                ck[mm[None].repeat(n, 0).repeat(D, 2) < top[:, None, None]] = INF
                best = ck.argmin(axis=0)
                bval = np.take_along_axis(ck, best[None], axis=0)[0]
                take_fa = fa <= bval
                val = np.where(take_fa, fa, bval)
                val[ov] = INF
                CAt[b, a, lo:] = val
                ch[b, a, lo:] = np.where(
                    np.isfinite(val), np.where(take_fa, _F_ALL, best + a + 1), _NONE
                )
        self.CA = CAt.transpose(1, 0, 2, 3)
        self.CAc = ch.transpose(1, 0, 2, 3)
        # least m at which CA[a][b][m][0] is finite (W if none): bounds the rows of B.1 below
        finite = np.isfinite(self.CA[:, :, :, 0])
        self.ca_lo = np.where(finite.any(axis=2), finite.argmax(axis=2), W)

    # -- B.1, B.2 --------------------------------------------------------------------------------
    def _t_size(self, a: int, kind: int) -> int:
        return self.x[a] if kind == 0 else self.s[a - 1]

    def _option(self, a: int, t: int, j: int, K, F, B):
        """First operation ``j`` (``j == a``: ``F_all a``; else ``F_ck a .. F_n j-1``) from states
        ``(K, F, B)`` (1-D arrays) of segment ``a``, for the input kept (``v = 0``) and offloaded
        (``v = 1``, when the bandwidth allows).

        Yields ``(v, valid mask, flat index (K' D + F') D + B' of the next state (B.1, Table 2),
        time of this segment: forward, idle times, backward)``.
        """
        L, D, C, beta = self.L, self.D, self.C, self.beta
        avail = C - t - K
        if j == a:  # case 1, F_all a; B a needs T back, kept or prefetched
            nF, nB = self.g[L] + self.s[a] + self.fo[a], self.own_b[a]
            lem, window, nxt, nkind = float(nF), self.ft[a], a + 1, 1
            fits = {0: avail >= max(nF, nB)}
            fits[1] = fits[0]
            back = self.bt[a] + self._idle(nB - avail + B)
        else:  # case 2, F_ck a, F_n a+1 .. j-1, checkpoint x[j]
            needs = self._fwd_needs(a, j, self.g[L])
            first, rest = needs[0], max(needs[1:], default=0)
            fp = self.fprefix
            lem = max(needs[i] - beta * (fp[a + i] - fp[a]) for i in range(len(needs)))
            window, nxt, nkind = fp[j] - fp[a], j, 0
            fits = {0: avail >= max(first, rest), 1: (avail >= first) & (avail + t >= rest)}
            back = self.CA[a, j - 1][np.clip(avail, 0, self.W - 1), B.astype(np.int64)]
        eps_f = self._idle(lem - avail + F)
        cost = window + eps_f + back
        room = np.isfinite(cost)
        nt = self._t_size(nxt, nkind)
        for v in (0, 1) if beta > 0 else (0,):
            K2 = K + (1 - v) * t
            ok = fits[v] & room & (K2 + nt <= C)
            if beta > 0:
                F2 = _ceil(F + v * t - beta * (window + eps_f))
                B2 = _ceil(B - beta * back) + v * t
                ok &= (F2 < D) & (B2 < D)
                yield v, ok, (K2 * D + F2) * D + B2, cost
            else:
                yield v, ok, K2 * D * D, cost

    def _last(self, a: int, t: int, K, F, B):
        """The loss (B.2) at ``a = L - 1``, or the tail ``CA[a][L-1]`` before it: time and mask."""
        L, C, beta = self.L, self.C, self.beta
        avail = C - t - K
        if a == L - 1:
            nF, nB = self.g[L] + self.s[a] + self.fo[a], self.own_b[a]
            eps_f = self._idle(nF - avail + F)
            eps_b = self._idle(nB - avail + B)
            val = self.ft[a] + self.bt[a] + eps_f + eps_b
            if beta > 0:
                val = (
                    val
                    + (
                        np.maximum(F - beta * (self.ft[a] + eps_f), 0.0)
                        + np.maximum(B - beta * (self.bt[a] + eps_b), 0.0)
                    )
                    / beta
                )
            return np.where(avail >= max(nF, nB), val, INF)
        rows = np.clip(avail, 0, self.W - 1)
        tail = np.where(avail >= 0, self.CA[a, L - 1][rows, B.astype(np.int64)], INF)
        if beta > 0:
            tail = tail + (F + np.maximum(B - beta * tail, 0.0)) / beta
        return tail

    def _options(self, a: int):
        """Every first operation of a segment starting at ``a < L - 1``, with the next segment."""
        for j in range(a, self.L):
            yield j, (a + 1, 1) if j == a else (j, 0)

    def _forward_tables(self) -> None:
        """``OC`` on the states reachable from ``OC[0][x[0]][0][0][0]`` only.

        A forward pass collects, stage by stage, the states ``(K, F, B)`` that some choice of the
        segments before reaches (flat indices, one array per input kind); the backward pass then
        evaluates the recurrences of B.1 on those states, vectorized over them, with flat gathers
        into the tables of the next segments (dense, INF where unreachable).
        """
        L, W, D = self.L, self.W, self.D
        size = W * D * D
        reached = [[np.zeros(size, dtype=bool), np.zeros(size, dtype=bool)] for _ in range(L)]
        reached[0][0][0] = True
        states: list[list[np.ndarray | None]] = [[None, None] for _ in range(L)]
        for a in range(L):
            for kind in (0, 1):
                S = np.flatnonzero(reached[a][kind])
                if not len(S):
                    continue
                states[a][kind] = S
                if a == L - 1:
                    continue
                t = self._t_size(a, kind)
                K, F, B = S // (D * D), (S // D) % D, S % D
                for j, (nxt, nkind) in self._options(a):
                    for _, ok, idx, _ in self._option(a, t, j, K, F, B):
                        reached[nxt][nkind][np.broadcast_to(idx, ok.shape)[ok]] = True
        del reached
        self.OC = [[None, None] for _ in range(L)]
        self.OCc = [[None, None] for _ in range(L)]
        flats: list[list[np.ndarray | None]] = [[None, None] for _ in range(L)]
        for a in range(L - 1, -1, -1):
            for kind in (0, 1):
                S = states[a][kind]
                if S is None:
                    continue
                t = self._t_size(a, kind)
                K, F, B = S // (D * D), (S // D) % D, S % D
                Ff, Bf = F.astype(np.float64), B.astype(np.float64)
                best = self._last(a, t, K, Ff, Bf)
                choice = np.where(np.isfinite(best), _TAIL, _NONE).astype(np.int16)
                if a < L - 1:
                    for j, (nxt, nkind) in self._options(a):
                        table = flats[nxt][nkind]
                        if table is None:
                            continue
                        for v, ok, idx, cost in self._option(a, t, j, K, Ff, Bf):
                            total = cost + table[np.where(ok, idx, size)]
                            better = total < best
                            best = np.where(better, total, best)
                            choice[better] = 2 * j + v
                flat = np.full(size + 1, INF, dtype=np.float32)
                flat[S] = best
                dense_choice = np.full(size, _NONE, dtype=np.int16)
                dense_choice[S] = choice
                flats[a][kind] = flat
                self.OC[a][kind] = flat[:size].reshape(W, D, D)
                self.OCc[a][kind] = dense_choice.reshape(W, D, D)

    def solve(self) -> float:
        """The least time ``OC[0][x[0]][0][0][0]`` (inf when nothing fits)."""
        self._backward_tables()
        self._forward_tables()
        return float(self.OC[0][0][0, 0, 0])

    # -- decisions -------------------------------------------------------------------------------
    def _ca_ops(self, a: int, b: int, m: int, d: int, out: list) -> None:
        """Append the computations of ``CA[a][b][m][d]`` (recursively along its choices)."""
        beta = self.beta
        c = int(self.CAc[a, b, m, d])
        if c == _NONE:  # pragma: no cover - the caller reads finite values only
            raise AssertionError(f"pofo: no CA choice for {a}..{b} at {m},{d}")
        if a == b:
            out += [("F_all", a), ("B", a)]
            return
        if c == _F_ALL:
            eps_b = float(self._idle(np.float64(self.own_b[a] - m + d)))
            d1 = int(_ceil(np.array([d - beta * (self.bt[a] + eps_b)]))[0]) if beta > 0 else 0
            out.append(("F_all", a))
            self._ca_ops(a + 1, b, m - self.s[a], d1, out)
            out.append(("B", a))
            return
        j = c
        t2 = float(self.CA[a, j - 1, m, d])
        d1 = int(_ceil(np.array([d - beta * t2]))[0]) if beta > 0 else 0
        out.append(("F_ck", a))
        out += [("F_n", k) for k in range(a + 1, j)]
        self._ca_ops(j, b, m - self.x[j], d1, out)
        self._ca_ops(a, j - 1, m, d, out)

    def plan(self) -> FractionalPlan:
        """The decisions of ``OC[0][x[0]][0][0][0]`` (call after a finite :meth:`solve`)."""
        beta, C, L = self.beta, self.C, self.L
        plan = FractionalPlan()
        a, kind, K, F, B = 0, 0, 0, 0, 0
        backs: list[tuple[list, str | None]] = []  # per segment: its backward ops, prefetched T
        while True:
            c = int(self.OCc[a][kind][K, F, B])
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
                nF = self.g[L] + self.s[a] + self.fo[a]
                eps_f = float(self._idle(np.float64(nF - avail + F)))
                eps_b = float(self._idle(np.float64(self.own_b[a] - avail + B)))
                window, d_back = self.ft[a], self.bt[a] + eps_b
                plan.sequence.append(("F_all", a))
                back = [("B", a)]
                nxt, nkind = a + 1, 1
            else:
                needs = self._fwd_needs(a, j, self.g[L])
                fp = self.fprefix
                lem = max(needs[i] - beta * (fp[a + i] - fp[a]) for i in range(len(needs)))
                eps_f = float(self._idle(np.float64(lem - avail + F)))
                window = fp[j] - fp[a]
                d_back = float(self.CA[a, j - 1, avail, B])
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
