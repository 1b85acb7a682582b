"""The paper's exact model of join networks: unit-size data, uniform costs, ``c`` memory slots.

Beaumont, Herrmann, Pallez, Shilova, *Optimal Memory-aware Backpropagation of Deep Join Networks*
(Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans. R. Soc. A 2020): ``c_min`` of Theorem 2, ``Opt_join`` of Theorem 3 built on ``Opt_0`` = Revolve, the
canonical schedule it implies, and the EQUIV-CHAIN baseline of Section 4.

NOTE [ join pebble model ]
The pebble game of Section 2 (docs/join.md): every forward value ``x_i^(j)`` and backward value
``xbar_i^(j)`` takes one slot. Branch ``j`` has ``l_j`` forward steps ``F_i^(j): x_i -> x_{i+1}``;
the turn replaces ``x_{l_j}^(j)`` of every branch by ``xbar_{l_j}^(j)`` in place; the backward step
``Fbar_i^(j)(x_i, xbar_{i+1}) = xbar_i`` writes its output in place of its inputs. A forward step
either keeps its input (``F_ck``, one more slot) or overwrites it (``F_n``, the "working" slot of
Revolve). Start: ``{x_0^(j)}``; end: ``{xbar_0^(j)}``.

NOTE [ reading Theorem 3 ]
The extracted formula reads ``Opt_join(l, c) = min_{m, 0 < i <= l_m} i u_f +
Opt_join(l[l_m <- l_m - i], c - 1) + Opt_0(i - 1, c - (k - 1))``: advance ``i`` steps on branch
``m`` from its input (kept), store the result, solve the rest of the join with one slot less, then
backpropagate the ``i`` steps of branch ``m`` while the ``k - 1`` other branches hold their final
``xbar_0``. We read ``Opt_0(i - 1, c')`` as the time of Revolve on a segment of ``i`` backward steps
(``i - 1`` forward steps, in the AC notation of Griewank-Walther where ``Opt_0(l, .)`` has ``l``
forward and ``l + 1`` backward steps) *with ``c'`` slots of this pebble game*: the segment input,
the backward value and the working value included. In Griewank's own convention (checkpoints
only), that is Revolve with ``c' - 2`` checkpoints::

    R(i, c') = u_f * T(i, c' - 2) + i * u_b,    R(1, c') = u_b for c' >= 2,

with ``T`` the extra forward steps of :func:`memplan.algorithms.chain.revolve.extra_forwards`.
This reading is checked against an exhaustive search of the pebble game (tests/algorithms/join/test_pebble.py):
the recursion then needs no explicit ``c_min`` guard, and ``c_min`` of Theorem 2 is exactly the
least ``c`` for which it is finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from memplan.algorithms.chain.revolve import extra_forwards, revolve_sequence

JoinOp = tuple[str, int | None, int]
"""``(op, branch, stage)``: ``F_ck``/``F_n``/``B`` on a branch's stage, or ``("turn", None, 0)``."""

INF = math.inf


def c_min(lengths: Sequence[int]) -> int:
    """Least number of slots with which the join of branch ``lengths`` can be run (Theorem 2).

    ``k`` if every branch is empty; ``k + #{l_i != 0}`` if some branch has length 1; one more
    otherwise (the back and forth between a branch input and its working value after the turn).
    """
    k = len(lengths)
    nonzero = sum(1 for length in lengths if length != 0)
    if nonzero == 0:
        return k
    if any(length == 1 for length in lengths):
        return k + nonzero
    return k + nonzero + 1


def segment_table(longest: int, slots: int, uf: float, ub: float) -> np.ndarray:
    """``R[i, c]``: time to backpropagate ``i`` steps of one branch with ``c`` slots (``Opt_0``).

    The segment input ``x_0`` and the backward value ``xbar_i`` are in memory (and count among the
    ``c`` slots); at the end only ``xbar_0`` remains. See NOTE [ reading Theorem 3 ].
    """
    table = np.full((longest + 1, slots + 1), INF)
    for i in range(1, longest + 1):
        for c in range(2, slots + 1):
            if i == 1:
                table[i, c] = ub
            elif c >= 3:
                table[i, c] = uf * extra_forwards(i, min(c - 2, i)) + i * ub
    return table


def segment_sequence(branch: int, start: int, steps: int, slots: int) -> list[JoinOp]:
    """The Revolve plan behind ``R[steps, slots]`` on stages ``start .. start+steps-1`` of a branch.

    Revolve's ``F_all a, B a`` pairs (the chain model re-runs a stage's forward before its
    backward) are the pebble game's single backward step ``Fbar_a``, which reads ``x_a``.
    """
    if steps == 1:
        return [("B", branch, start)]
    plan: list[JoinOp] = []
    for op, stage in revolve_sequence(steps, min(slots - 2, steps)):
        if op != "F_all":
            plan.append((op, branch, start + stage))
    return plan


class JoinTable:
    """``Opt_join(r, c)`` for every remaining-length vector ``r <= lengths`` and ``c <= slots``.

    Parameters
    ----------
    lengths : sequence of int
        Forward steps of each branch (``l`` of Problem 1).
    slots : int
        The largest ``c`` wanted; every smaller one is computed on the way (:meth:`grow` adds
        more later).
    uf, ub, ut : float
        Costs of a forward step, a backward step and the turn.
    convention : {"slots", "checkpoints"}
        How ``Opt_0(i - 1, c - (k - 1))`` of Theorem 3 counts memory: ``slots`` (default, NOTE
        [ reading Theorem 3 ]: every value of the pebble game, exact against the exhaustive
        search) or ``checkpoints`` (Griewank's convention, the working and backward values of
        the segment not counted: two slots more per segment than the game allows; kept to
        compare with the paper's figures, docs/join.md).

    Notes
    -----
    The recursion of Theorem 3 is filled one ``c`` at a time, each level vectorized over every
    remaining-length vector with numpy: for each branch ``m`` and advance ``i`` one array
    operation. Time ``O(c k max(l) prod(l + 1))``, the complexity the paper states, memory
    ``O(c prod(l + 1))``.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        slots: int,
        uf: float = 1.0,
        ub: float = 1.0,
        ut: float = 1.0,
        convention: str = "slots",
    ) -> None:
        if convention not in ("slots", "checkpoints"):
            raise ValueError(f"convention {convention!r}: expected 'slots' or 'checkpoints'")
        self.lengths = tuple(int(length) for length in lengths)
        self.k = len(self.lengths)
        self.uf, self.ub, self.ut = float(uf), float(ub), float(ut)
        self.extra = 0 if convention == "slots" else 2
        self.shape = tuple(length + 1 for length in self.lengths)
        self._stride = max(self.lengths, default=0) + 1
        self.segment = np.zeros((0, 0))
        self.value = np.zeros((0, *self.shape))
        self.choice = np.zeros((0, *self.shape), dtype=np.int32)
        self.slots = -1
        self.grow(int(slots))

    def grow(self, slots: int) -> None:
        """Extend the table to ``slots`` (a sweep over ``c`` reuses the levels already built)."""
        if slots <= self.slots:
            return
        longest = max(max(self.lengths, default=0), 1)
        self.segment = segment_table(longest, max(slots + self.extra, 2), self.uf, self.ub)
        old = self.slots + 1
        value = np.full((slots + 1, *self.shape), INF)
        choice = np.full((slots + 1, *self.shape), -1, dtype=np.int32)
        value[:old], choice[:old] = self.value, self.choice
        self.value, self.choice, self.slots = value, choice, slots
        zero = (0,) * self.k
        for c in range(max(old, self.k), slots + 1):
            self.value[(c, *zero)] = self.ut
        for c in range(max(old, 1), slots + 1):
            self._fill(c)

    def _fill(self, c: int) -> None:
        prev, cur, choice = self.value[c - 1], self.value[c], self.choice[c]
        seg_slots = c - self.k + 1 + self.extra
        if c - self.k + 1 < 2:
            return
        for m, length in enumerate(self.lengths):
            for i in range(1, length + 1):
                rest = self.segment[i, seg_slots]
                if not math.isfinite(rest):
                    continue
                dst = [slice(None)] * self.k
                src = [slice(None)] * self.k
                dst[m], src[m] = slice(i, None), slice(0, length + 1 - i)
                cand = prev[tuple(src)] + (i * self.uf + rest)
                here = cur[tuple(dst)]
                better = cand < here
                if better.any():
                    here[better] = cand[better]
                    choice[tuple(dst)][better] = m * self._stride + i

    def opt(self, c: int, remaining: Sequence[int] | None = None) -> float:
        """``Opt_join(remaining, c)`` (the whole join by default); ``inf`` when infeasible."""
        r = self.lengths if remaining is None else tuple(remaining)
        if c < 0:
            return INF
        self.grow(c)
        return float(self.value[(c, *r)])

    def sequence(self, c: int) -> list[JoinOp]:
        """The canonical schedule of ``Opt_join(lengths, c)``: forward segments, turn, backward."""
        if not math.isfinite(self.opt(c)):
            raise ValueError(f"no schedule with {c} slots (c_min is {c_min(self.lengths)})")
        plan: list[JoinOp] = []
        stack: list[tuple] = [("solve", self.lengths, c)]
        while stack:
            item = stack.pop()
            if item[0] == "segment":
                plan += segment_sequence(*item[1:])
                continue
            _, r, slots = item
            if not any(r):
                plan.append(("turn", None, 0))
                continue
            code = int(self.choice[(slots, *r)])
            m, i = divmod(code, self._stride)
            start = self.lengths[m] - r[m]
            plan.append(("F_ck", m, start))
            plan += [("F_n", m, stage) for stage in range(start + 1, start + i)]
            sub = list(r)
            sub[m] -= i
            stack.append(("segment", m, start, i, slots - self.k + 1 + self.extra))
            stack.append(("solve", tuple(sub), slots - 1))
        return plan


_CACHE: dict[tuple, JoinTable] = {}
_CACHE_SIZE = 4


def cached_table(lengths: Sequence[int], uf: float, ub: float, ut: float) -> JoinTable:
    """A :class:`JoinTable` kept between calls (a budget sweep reuses and grows one table)."""
    key = (tuple(lengths), float(uf), float(ub), float(ut))
    table = _CACHE.pop(key, None)
    if table is None:
        table = JoinTable(lengths, len(lengths), uf, ub, ut)
    _CACHE[key] = table
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    return table


def opt_join(
    lengths: Sequence[int], c: int, uf: float = 1.0, ub: float = 1.0, ut: float = 1.0
) -> float:
    """``Opt_join(lengths, c)`` of Theorem 3 (``inf`` below ``c_min``)."""
    if c < c_min(lengths):
        return INF
    return JoinTable(lengths, c, uf, ub, ut).opt(c)


def plan_cost(plan: Sequence[JoinOp], uf: float, ub: float, ut: float) -> float:
    """Sum of the durations of a pebble plan."""
    cost = {"F_ck": uf, "F_n": uf, "B": ub, "turn": ut}
    return float(sum(cost[op] for op, _, _ in plan))


def plan_peak(lengths: Sequence[int], plan: Sequence[JoinOp]) -> int | None:
    """Peak slots of a pebble plan, or None when the plan breaks the game's rules.

    The solvers' own accounting (EQUIV-CHAIN picks the fastest plan that fits with it); every
    plan is replayed again by :mod:`memplan.simulator.join`, written independently.
    """
    k = len(lengths)
    held = [{0} for _ in range(k)]
    grad = [None] * k  # index of the backward value of each branch, after the turn
    turned = False
    count = peak = k
    for op, j, i in plan:
        if op == "turn":
            if turned or any(lengths[b] not in held[b] for b in range(k)):
                return None
            for b in range(k):
                held[b].discard(lengths[b])
                grad[b] = lengths[b]
            turned = True
            continue
        if op in ("F_ck", "F_n"):
            if i not in held[j] or i + 1 in held[j] or i >= lengths[j]:
                return None
            held[j].add(i + 1)
            if op == "F_n":
                held[j].discard(i)
            else:
                count += 1
        elif op == "B":
            if not turned or grad[j] != i + 1 or i not in held[j]:
                return None
            held[j].discard(i)
            grad[j] = i
            count -= 1
        else:
            return None
        peak = max(peak, count)
    if not turned or any(g != 0 for g in grad):
        return None
    return peak


def equiv_chain_plans(lengths: Sequence[int]) -> list[tuple[int, list[JoinOp]]]:
    """EQUIV-CHAIN (Section 4, Figure 9a): group the steps at equal distance from the turn.

    The join becomes one chain of ``n = max(lengths)`` levels; level ``d`` holds the steps of the
    branches that reach it (a branch of length ``l`` starts at level ``n - l``). For every slot
    count ``c'`` of that chain, the optimal single-chain plan (Revolve, the best algorithm for a
    homogeneous chain) is expanded back to the branches, each level operation becoming one
    operation per branch present. The inputs of the shorter branches are never overwritten.
    Returns ``(c', plan)`` for every ``c'`` from the chain's ``c_min`` to store-all.
    """
    n = max(lengths)
    k = len(lengths)
    if n == 0:
        return [(k, [("turn", None, 0)])]
    starts = [n - length for length in lengths]
    top = n + 1
    table = JoinTable([n], top)
    plans = []
    for c in range(c_min([n]), top + 1):
        chain_plan = table.sequence(c)
        plan: list[JoinOp] = []
        for op, _, level in chain_plan:
            if op == "turn":
                plan.append(("turn", None, 0))
                continue
            members = range(k) if op != "B" else reversed(range(k))
            for j in members:
                if level < starts[j]:
                    continue
                stage = level - starts[j]
                name = "F_ck" if op == "F_n" and stage == 0 else op
                plan.append((name, j, stage))
        plans.append((c, plan))
    return plans
