"""The dynamic program of Theorem 1 of papers/000 (POFO), appendix B, with Lemma 1's transfers.

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

    def _forward_tables(self) -> None:
        L, W, D, C = self.L, self.W, self.D, self.C
        beta = self.beta
        ft, bt, s, g, fo = self.ft, self.bt, self.s, self.g, self.fo
        F = np.arange(D, dtype=np.float64)[None, :, None]
        B = np.arange(D, dtype=np.float64)[None, None, :]
        Bi = np.arange(D)
        self.OC = [[None, None] for _ in range(L)]
        self.OCc = [[None, None] for _ in range(L)]
        flats: list[list[np.ndarray | None]] = [[None, None] for _ in range(L)]
        offs = (0, 1) if beta > 0 else (0,)
        for a in range(L - 1, -1, -1):
            for kind in (0, 1) if a > 0 else (0,):
                t = self._t_size(a, kind)
                if a == L - 1:  # the loss, B.2
                    val = np.full((W, D, D), INF, dtype=np.float32)
                    nF = g[L] + s[a] + fo[a]
                    nB = self.own_b[a]
                    kmax = C - t - max(nF, nB)
                    if kmax >= 0:
                        avail = (C - t - np.arange(kmax + 1, dtype=np.float64))[:, None, None]
                        eps_f = self._idle(nF - avail + F)
                        eps_b = self._idle(nB - avail + B)
                        v = ft[a] + bt[a] + eps_f + eps_b
                        if beta > 0:
                            v = (
                                v
                                + (
                                    np.maximum(F - beta * (ft[a] + eps_f), 0.0)
                                    + np.maximum(B - beta * (bt[a] + eps_b), 0.0)
                                )
                                / beta
                            )
                        val[: kmax + 1] = v
                    choice = np.where(np.isfinite(val), _TAIL, _NONE).astype(np.int16)
                else:
                    val, choice = self._segment(a, kind, t, flats, offs, F, B, Bi)
                self.OC[a][kind] = val
                self.OCc[a][kind] = choice
                flats[a][kind] = np.concatenate((val.reshape(-1), np.array([INF], np.float32)))

    def _segment(self, a, kind, t, flats, offs, F, B, Bi):
        """``OC[a][kind]`` for a < L-1: the tail and every (first operation, v) of B.1."""
        L, W, D, C = self.L, self.W, self.D, self.C
        beta, CA = self.beta, self.CA
        ft, bt, s, g, fo = self.ft, self.bt, self.s, self.g, self.fo
        fp = self.fprefix
        sentinel = W * D * D
        options: list[tuple] = []
        for v in offs:
            options.append((a, v))
            options += [(j, v) for j in range(a + 1, L)]
        val = np.full((W, D, D), INF, dtype=np.float32)
        choice = np.full((W, D, D), _NONE, dtype=np.int16)
        avail_all = (C - t - np.arange(W, dtype=np.float64))[:, None, None]
        # Rows K in blocks: a state holds K + t + F <= C (+1 for rounding) and B <= C - K + 1, so
        # each block computes F and B up to its first row's bounds only.
        step = max(4, W // 6)

        def blocks(k: int):
            for k0 in range(0, k, step):
                k1 = min(k, k0 + step)
                yield k0, k1, min(D, max(1, C - t - k0 + 2)), min(D, max(1, C - k0 + 2))

        # tail: the offloads left finish, then CA[a][L-1][avail][B]
        kmax = C - t - int(self.ca_lo[a, L - 1])
        for k0, k1, fe, be in blocks(kmax + 1):
            rows = (C - t - np.arange(k0, k1))[:, None]
            tail = CA[a, L - 1][rows, Bi[None, :be]][:, None, :]
            if beta > 0:
                tail = tail + (F[:, :fe] + np.maximum(B[:, :, :be] - beta * tail, 0.0)) / beta
            else:
                tail = np.broadcast_to(tail, (k1 - k0, fe, be))
            val[k0:k1, :fe, :be] = tail
            choice[k0:k1, :fe, :be][np.isfinite(tail)] = _TAIL
        buf = np.empty((W, D, D), dtype=np.float32)
        for j, v in options:
            if j == a:  # F_all a
                nF = g[L] + s[a] + fo[a]
                nB = self.own_b[a]
                first, rest, lem = nF, nB, float(nF)  # B a needs T back: nB <= avail
                window, nxt, nkind = ft[a], a + 1, 1
            else:
                needs = self._fwd_needs(a, j, g[L])
                first, rest = needs[0], max(needs[1:], default=0)
                lem = max(needs[i] - beta * (fp[a + i] - fp[a]) for i in range(len(needs)))
                window, nxt, nkind = fp[j] - fp[a], j, 0
            nt = self._t_size(nxt, nkind)
            kmax = C - t - max(first, rest) if v == 0 or j == a else min(C - t - first, C - rest)
            kmax = min(kmax, C - nt - (1 - v) * t)
            if j > a:
                kmax = min(kmax, C - t - int(self.ca_lo[a, j - 1]))
            flat = flats[nxt][nkind]
            code = np.int16(2 * j + v)
            for k0, k1, fe, be in blocks(kmax + 1):
                avail = avail_all[k0:k1]
                Fb, Bb = F[:, :fe], B[:, :, :be]
                eps_f = self._idle(lem - avail + Fb)  # (k,fe,1)
                if j == a:
                    back = bt[a] + self._idle(nB - avail + Bb)  # (k,1,be)
                else:
                    rows = (C - t - np.arange(k0, k1))[:, None]
                    back = CA[a, j - 1][rows, Bi[None, :be]][:, None, :]
                cost = buf[: k1 - k0, :fe, :be]
                if beta > 0:
                    F2 = _ceil(Fb + v * t - beta * (window + eps_f))
                    B2 = _ceil(Bb - beta * back) + v * t
                    Kc = np.arange(k0, k1)[:, None, None] + (1 - v) * t
                    kf = ((Kc * D + F2) * D).astype(np.int32)
                    kf[F2 >= D] = sentinel
                    B2 = B2.astype(np.int32)
                    B2[B2 >= D] = sentinel
                    idx = kf + B2
                    np.minimum(idx, sentinel, out=idx)
                    np.take(flat, idx, out=cost)
                else:
                    cost[...] = flat[(np.arange(k0, k1)[:, None, None] + t) * D * D]
                cost += (window + eps_f).astype(np.float32)
                cost += back.astype(np.float32)
                target = val[k0:k1, :fe, :be]
                better = np.less(cost, target)
                np.copyto(target, cost, where=better)
                np.copyto(choice[k0:k1, :fe, :be], code, where=better)
        return val, choice

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
