"""Python references of pofo's Theorem 1 DP, which the compiled core (src/pofo_fractional.cpp) is
tested against entry for entry, state for state and decision for decision
(tests/algorithms/combined/test_pofo_core.py).

:class:`ForwardReference` takes the problem of a
:class:`~memplan.algorithms.combined.fractional.FractionalDP` (the chain in slots, the bandwidth in
slots per ms, the window, the bound: its input, read once) and runs NOTE [ pofo fractional
recurrences ] and NOTE [ pofo pruning ] (memplan/algorithms/combined/fractional.py) in numpy with
helpers of its own (Lemma 1's idle time, the forward needs, the relaxed bound of the pruning):
``_backward_tables`` sets ``near``, ``last`` and their choices (vectorized over the budgets, the
backlogs and the checkpoints); ``_forward_tables``, on those tables, sets ``states``, ``choice``,
``value`` and ``evaluated`` (vectorized over the states and the options). This was memplan's
implementation before the compiled core; nothing of the DP under test runs here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

INF = np.inf
_F_ALL = -1
_NONE = -3
_TAIL = -2
_PRUNE_TOLERANCE = 1e-6
_BEAM = 1024
_BLOCK = 1 << 14
_Option = tuple[int, tuple[int, int], np.ndarray, np.ndarray, np.ndarray]
_States = list[list[np.ndarray | None]]

PROBLEM = ("L", "C", "W", "D", "window", "beta", "bound", "x", "s", "g", "fo", "bo", "ft", "bt")
"""What the reference reads of the DP it checks: the problem, in slots and ms."""


def _ceil(values: np.ndarray) -> np.ndarray:
    """Slots still to move: ``ceil(max(0, v))`` (a hair of tolerance; -inf is 0), as int64."""
    out = np.ceil(values - 1e-9)
    np.clip(out, 0, 2**30, out=out)
    return out.astype(np.int64)


class ForwardReference:
    """The tables of the problem of ``dp`` (see :data:`PROBLEM`), in numpy; ``dp.deadline`` (an
    object with ``check()``) stops it."""

    def __init__(self, dp: Any) -> None:
        for name in PROBLEM:
            value = getattr(dp, name)
            setattr(self, name, list(value) if isinstance(value, list) else value)
        self.deadline = dp.deadline
        L = self.L
        self.own_b = [self.g[k + 1] + self.s[k] + self.g[k] + self.bo[k] for k in range(L)]
        self.fprefix = np.concatenate(([0.0], np.cumsum(self.ft)))
        self.evaluated = 0
        self.value = INF

    def _idle(self, excess: np.ndarray) -> np.ndarray:
        """Lemma 1: the idle time ``max(0, excess) / beta``; with no bandwidth, 0 where the excess
        is at most 0 and infinite elsewhere."""
        excess = np.asarray(excess, dtype=np.float64)
        if self.beta > 0:
            return np.where(excess > 0, excess, 0.0) / self.beta
        return np.where(excess > 0, INF, 0.0)

    def _fwd_needs(self, a: int, j: int, grad: int) -> list[int]:
        """Memory of ``F_ck a`` then ``F_n a+1 .. j-1`` beyond ``x[a]``, ``grad`` held."""
        needs = [grad + self.x[a + 1] + self.fo[a]]
        for k in range(a + 1, j):
            needs.append(grad + self.x[k] + self.x[k + 1] + self.fo[k])
        return needs

    def _ca(self, a: int, b: int) -> np.ndarray:
        """``CA[a][b]`` of this reference's backward tables."""
        table: np.ndarray = self.last[a] if b == self.L - 1 else self.near[a, b - a]
        return table

    def _t_size(self, a: int, kind: int) -> int:
        """The size of segment ``a``'s input: ``x[a]`` kept alone (kind 0), or inside
        ``s[a - 1]`` (kind 1)."""
        return self.x[a] if kind == 0 else self.s[a - 1]

    def _relaxed(self) -> np.ndarray:
        """``R[a][m]`` of NOTE [ pofo pruning ]: the least time from segment ``a`` to the end with
        ``m`` slots for every later computation, transfers free: per segment the best of its
        tail, of ``F_all a`` then ``R[a + 1]``, and of each checkpoint ``j`` in the window (the
        forwards, the least ``CA[a][j-1]`` within ``m``, then ``R[j]``), each table read at its
        least over every ``m' <= m`` and backlog. One ``m`` at a time."""
        L, W, w = self.L, self.W, self.window
        fp = self.fprefix.tolist()

        def least_within(table: np.ndarray) -> list[float]:
            out, low = [], INF
            for m in range(W):
                low = min(low, float(table[m].min()))
                out.append(low)
            return out

        relaxed = [[INF] * W for _ in range(L + 1)]
        for a in range(L - 1, -1, -1):
            tail = least_within(self.last[a])
            later = []
            if a < L - 1:
                for j in range(a + 1, min(L - 1, a + w) + 1):
                    later.append((j, fp[j] - fp[a], least_within(self.near[a, j - 1 - a])))
            for m in range(W):
                best = tail[m]
                if a < L - 1:
                    best = min(best, self.ft[a] + self.bt[a] + relaxed[a + 1][m])
                    for j, forward, segment in later:
                        best = min(best, forward + segment[m] + relaxed[j][m])
                relaxed[a][m] = best
        return np.array(relaxed)

    def _backward_tables(self) -> None:
        """``CA[a][b]`` for ``b - a < window`` (``near[a, b - a]``) and ``CA[a][L-1]`` for every
        ``a`` (``last[a]``), split at ``j <= a + window`` (NOTE [ pofo window ]), on this wrapper.
        """
        L, W, D, w = self.L, self.W, self.D, self.window
        beta = self.beta
        # near[a, r] = CA[a][a + r] (b < L - 1): the splits of a..b are contiguous, CA[j][b] is
        # gathered from the flat table.
        self.near = np.full((max(L - 1, 0), w, W, D), INF)
        self.near_choice = np.full(self.near.shape, _NONE, dtype=np.int16)
        self.last = np.full((L, W, D), INF)
        self.last_choice = np.full((L, W, D), _NONE, dtype=np.int16)
        near_flat, last_flat = self.near.reshape(-1), self.last.reshape(-1)
        m = np.arange(W, dtype=np.float64)[:, None]
        mint = np.arange(W)[:, None]
        delta = np.arange(D, dtype=np.float64)[None, :]
        over = delta > m  # more to prefetch than the room: infeasible
        ft, bt, s, x, g, fo = self.ft, self.bt, self.s, self.x, self.g, self.fo
        fp = self.fprefix
        plane = W * D
        for b in range(L):
            self.deadline.check()
            floor = 0
            tail = b == L - 1
            for a in range(b, -1 if tail else max(-1, b - w), -1):
                values, choices = (
                    (self.last[a], self.last_choice[a])
                    if tail
                    else (self.near[a, b - a], self.near_choice[a, b - a])
                )
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
                    values[lo:] = val
                    choices[lo:] = np.where(np.isfinite(val), _F_ALL, _NONE)
                    continue
                # F_all a, then a+1..b with m - s[a], then B a.
                eps_b = self._idle(nB - mm + delta)
                if beta > 0:
                    d1 = _ceil(delta - beta * (bt[a] + eps_b))
                else:
                    d1 = np.zeros(mm.shape, np.int64)
                mi = mi_ - s[a]
                ok = (mi >= 0) & (d1 < D)
                flat = self._ca(a + 1, b).reshape(-1)
                sub = np.where(ok, flat[np.clip(mi, 0, W - 1) * D + np.minimum(d1, D - 1)], INF)
                d2 = _ceil(d1 - beta * sub) if beta > 0 else d1
                fa = ft[a] + bt[a] + sub + self._idle(nF - mm + d2) + eps_b
                if max(nF, nB) > lo:
                    fa[: max(nF, nB) - lo] = INF
                # F_ck a, F_n .. j-1 keeping x[j], j = a+1..a+n (rows r = j - a - 1).
                n = min(b, a + w) - a
                js = np.arange(a + 1, a + n + 1)
                t2 = self.near[a, :n, lo:]  # CA[a][j-1][m][D]
                d1 = _ceil(delta[None] - beta * t2) if beta > 0 else np.zeros(t2.shape, np.int64)
                xj = np.array([x[j] for j in js])[:, None, None]
                mi = mi_[None] - xj
                ok = (mi >= 0) & (d1 < D)
                if tail:  # CA[j][L-1] = last[j]
                    rows, table = js, last_flat
                else:  # CA[j][b] = near[j, b - j]
                    rows, table = js * w + (b - js), near_flat
                idx = (rows[:, None, None] * plane + np.clip(mi, 0, W - 1) * D) + np.minimum(
                    d1, D - 1
                )
                t1 = table[idx]
                t1[~ok] = INF
                d2 = _ceil(d1 - beta * t1) if beta > 0 else d1
                needs = self._fwd_needs(a, a + n + 1, g[b + 1])[:n]  # F on stages a..j-1
                # Lemma 1 over the forwards: max_k (n_k + beta fp[k+1]) - beta fp[j]
                lem = np.maximum.accumulate([needs[i] + beta * fp[a + i + 1] for i in range(n)])
                lem = lem - beta * fp[a + 1 : a + n + 1]
                top = np.maximum.accumulate(needs)
                ck = self._idle(lem[:, None, None] - mm[None] + d2)
                ck += (fp[a + 1 : a + n + 1] - fp[a])[:, None, None]
                ck += t1
                ck += t2
                ck[np.broadcast_to(mm[None] < top[:, None, None], ck.shape)] = INF
                best = ck.argmin(axis=0)
                bval = np.take_along_axis(ck, best[None], axis=0)[0]
                take_fa = fa <= bval
                val = np.where(take_fa, fa, bval)
                val[ov] = INF
                values[lo:] = val
                choices[lo:] = np.where(
                    np.isfinite(val), np.where(take_fa, _F_ALL, best + a + 1), _NONE
                )

    def _options(
        self, a: int, t: int, K: np.ndarray, F: np.ndarray, B: np.ndarray
    ) -> Iterator[_Option]:
        """Every first operation of segment ``a < L - 1`` from states ``(K, F, B)`` (1-D arrays),
        in the order ``F_all a``, then ``F_ck a .. F_n j-1`` for ``j = a+1 .. a + window``, each
        with the input kept (``v = 0``) and offloaded (``v = 1``, when the bandwidth allows).

        Yields ``(choice 2 j + v, next state (j', kind'), valid mask, flat index (K' D + F') D +
        B' of the next state (B.1, Table 2), time of this segment: forward, idle times,
        backward)``, the last three over the states. The arithmetic is that of one option at a
        time, vectorized over blocks of options.
        """
        L, D, C, beta, W = self.L, self.D, self.C, self.beta, self.W
        avail = C - t - K
        versions = 2 if beta > 0 else 1
        # case 1, F_all a; B a needs T back, kept or prefetched
        nF, nB = self.g[L] + self.s[a] + self.fo[a], self.own_b[a]
        fits = avail >= max(nF, nB)
        back = self.bt[a] + self._idle(nB - avail + B)
        yield from self._versions(
            [a], [(a + 1, 1)], t, K, F, B, [float(nF)], [self.ft[a]], [fits], [fits], back[None]
        )
        # case 2, F_ck a, F_n a+1 .. j-1, checkpoint x[j]
        top = min(L - 1, a + self.window)
        if top <= a:
            return
        fp = self.fprefix
        needs = self._fwd_needs(a, top, self.g[L])
        rows = np.clip(avail, 0, W - 1) * D + B.astype(np.int64)
        per_block = max(1, _BLOCK // max(1, len(K) * versions))
        for low in range(a + 1, top + 1, per_block):
            js = list(range(low, min(top, low + per_block - 1) + 1))
            lems, windows, fit0, fit1 = [], [], [], []
            for j in js:
                own = needs[: j - a]
                first, rest = own[0], max(own[1:], default=0)
                lems.append(max(own[i] - beta * (fp[a + i] - fp[a]) for i in range(len(own))))
                windows.append(fp[j] - fp[a])
                fit0.append(avail >= max(first, rest))
                fit1.append((avail >= first) & (avail + t >= rest))
            # CA[a][j-1] for these j: rows j - 1 - a of near[a], gathered at once
            backs = self.near[a, js[0] - 1 - a : js[-1] - a].reshape(len(js), -1)[:, rows]
            yield from self._versions(
                js, [(j, 0) for j in js], t, K, F, B, lems, windows, fit0, fit1, backs
            )

    def _versions(
        self,
        js: list[int],
        nexts: list[tuple[int, int]],
        t: int,
        K: np.ndarray,
        F: np.ndarray,
        B: np.ndarray,
        lems: list[float],
        windows: list[float],
        fit0: list[np.ndarray],
        fit1: list[np.ndarray],
        back: np.ndarray,
    ) -> Iterator[_Option]:
        """:meth:`_options` for the options ``js`` (``back``: one row per option), in the order
        ``js[0]`` kept, ``js[0]`` offloaded, ``js[1]`` kept...
        """
        D, C, beta = self.D, self.C, self.beta
        avail = C - t - K
        lem = np.array(lems)[:, None]
        window = np.array(windows)[:, None]
        eps_f = self._idle(lem - avail + F)
        cost = window + eps_f + back
        room = np.isfinite(cost)
        nt = np.array([self._t_size(j, kind) for j, kind in nexts])[:, None]
        fits = (np.array(fit0), np.array(fit1))
        versions = (0, 1) if beta > 0 else (0,)
        if beta > 0:
            moved_f = beta * (window + eps_f)
            moved_b = _ceil(B - beta * back)
        oks, indices = [], []
        for v in versions:
            K2 = K + (1 - v) * t
            ok = fits[v] & room & (K2 + nt <= C)
            if beta > 0:
                F2 = _ceil(F + v * t - moved_f)
                B2 = moved_b + v * t
                ok &= (F2 < D) & (B2 < D)
                indices.append((K2 * D + F2) * D + B2)
            else:
                indices.append(np.broadcast_to(K2 * D * D, ok.shape))
            oks.append(ok)
        for row, (j, nxt) in enumerate(zip(js, nexts, strict=True)):
            for v in versions:
                yield 2 * j + v, nxt, oks[v][row], indices[v][row], cost[row]

    def _last(self, a: int, t: int, K: np.ndarray, F: np.ndarray, B: np.ndarray) -> np.ndarray:
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
        tail = np.where(avail >= 0, self.last[a][rows, B.astype(np.int64)], INF)
        if beta > 0:
            tail = tail + (F + np.maximum(B - beta * tail, 0.0)) / beta
        return tail

    def _reach(self, limit: float, beam: int | None) -> tuple[_States, float]:
        """The forward pass: the states that some choice of the segments before reaches, in time
        at most ``limit`` with the lower bound :meth:`_relaxed` of the time after them (the others
        are on no plan within ``limit``); with ``beam``, only the ``beam`` most promising states of
        each segment (time so far plus the bound) are expanded. Returns the states (sorted flat
        indices, per segment and input kind) and the least time of a plan found on the way (its
        tail or loss from a state reached).
        """
        L, W, D, C = self.L, self.W, self.D, self.C
        size = W * D * D
        if limit == INF and beam is None:
            return self._reachable(), INF
        relaxed = self._relaxed_bound
        best = INF
        reach: dict[tuple[int, int], np.ndarray] = {(0, 0): np.full(size, INF)}
        reach[(0, 0)][0] = 0.0
        states: _States = [[None, None] for _ in range(L)]
        for a in range(L):
            self.deadline.check()
            for kind in (0, 1):
                so_far = reach.pop((a, kind), None)
                if so_far is None:
                    continue
                S = np.flatnonzero(np.isfinite(so_far))
                promise = so_far[S] + relaxed[a][C - S // (D * D)]
                S = S[(promise <= limit) & (promise < INF)]
                if beam is not None and len(S) > beam:
                    order = np.argpartition(so_far[S] + relaxed[a][C - S // (D * D)], beam)
                    S = np.sort(S[order[:beam]])
                if not len(S):
                    continue
                states[a][kind] = S
                before = so_far[S]
                del so_far
                t = self._t_size(a, kind)
                K, F, B = S // (D * D), (S // D) % D, S % D
                if beam is not None:
                    ends = before + self._last(a, t, K, F.astype(float), B.astype(float))
                    best = min(best, float(ends.min()))
                if a == L - 1:
                    continue
                for _, nxt, ok, index, cost in self._options(a, t, K, F.astype(float), B):
                    total = before + cost
                    if nxt not in reach:
                        reach[nxt] = np.full(size, INF)
                    kept = np.clip(index // (D * D), 0, C)
                    promise = total + relaxed[nxt[0]][C - kept]
                    keep = ok & (promise <= limit) & (promise < INF)
                    np.minimum.at(reach[nxt], index[keep], total[keep])
        return states, best

    def _reachable(self) -> _States:
        """Every state that some choice of the segments before reaches (sorted flat indices, per
        segment and input kind): :meth:`_reach` without a bound, with boolean marks.
        """
        L, W, D = self.L, self.W, self.D
        size = W * D * D
        reached: dict[tuple[int, int], np.ndarray] = {(0, 0): np.zeros(size, dtype=bool)}
        reached[(0, 0)][0] = True
        states: _States = [[None, None] for _ in range(L)]
        for a in range(L):
            self.deadline.check()
            for kind in (0, 1):
                marks = reached.pop((a, kind), None)
                if marks is None:
                    continue
                S = np.flatnonzero(marks)
                del marks
                if not len(S):
                    continue
                states[a][kind] = S
                if a == L - 1:
                    continue
                t = self._t_size(a, kind)
                K, F, B = S // (D * D), (S // D) % D, S % D
                for _, nxt, ok, index, _ in self._options(a, t, K, F.astype(float), B):
                    if nxt not in reached:
                        reached[nxt] = np.zeros(size, dtype=bool)
                    reached[nxt][index[ok]] = True
        return states

    def _forward_tables(self) -> None:
        """``OC`` on the states that may lie on an optimal plan only (NOTE [ pofo pruning ]).

        A forward pass collects, stage by stage, the states ``(K, F, B)`` that some choice of the
        segments before reaches (flat indices, one array per input kind) and, with a ``bound``,
        only within it and the time of a plan that a beam search finds first; the backward pass
        evaluates the
        recurrences of B.1 on those states, vectorized over them and over the options, with flat
        gathers into the tables of the next segments (dense, INF where unreachable; only those
        within the window are kept). Each state's decision is kept (``choice[a][kind]``, beside
        its index in ``states[a][kind]``) for :meth:`plan`.
        """
        L, W, D = self.L, self.W, self.D
        size = W * D * D
        if self.bound == INF:  # every reachable state (the bounds prune little by themselves)
            self.states, _ = self._reach(INF, None)
        else:
            self._relaxed_bound = self._relaxed()
            slack = 1 + _PRUNE_TOLERANCE
            limit = self.bound * slack + _PRUNE_TOLERANCE
            _, found = self._reach(limit, _BEAM)
            limit = min(limit, found * slack + _PRUNE_TOLERANCE)
            self.states, _ = self._reach(limit, None)
        self.choice: list[list[np.ndarray | None]] = [[None, None] for _ in range(L)]
        flats: dict[tuple[int, int], np.ndarray] = {}
        for a in range(L - 1, -1, -1):
            self.deadline.check()
            for kind in (0, 1):
                S = self.states[a][kind]
                if S is None:
                    continue
                self.evaluated += len(S)
                t = self._t_size(a, kind)
                K, F, B = S // (D * D), (S // D) % D, S % D
                Ff, Bf = F.astype(np.float64), B.astype(np.float64)
                best = self._last(a, t, K, Ff, Bf)
                choice = np.where(np.isfinite(best), _TAIL, _NONE).astype(np.int16)
                if a < L - 1:
                    for code, nxt, ok, index, cost in self._options(a, t, K, Ff, Bf):
                        table = flats.get(nxt)
                        if table is None:
                            continue
                        total = cost + table[np.where(ok, index, size)]
                        better = total < best
                        best = np.where(better, total, best)
                        choice[better] = code
                flat = np.full(size + 1, INF, dtype=np.float32)
                flat[S] = best
                flats[(a, kind)] = flat
                self.choice[a][kind] = choice
                if a == 0 and kind == 0:
                    self.value = float(flat[0])
            for key in [key for key in flats if key[0] >= a + self.window]:
                del flats[key]  # no segment before a reaches it
