"""Join networks with heterogeneous stages: the canonical-form DP of Optimal Memory-aware Backpropagation of Deep Join Networks (Phil. Trans. R. Soc. A 2020) on docs/model.md.

The generalization the paper points to (footnote 1, Section 5): branches whose stages have their
own times and sizes, memory in bytes. Every branch follows the chain model of docs/model.md
(``F_all``/``F_ck``/``F_n``/``B``, saved tensors, memory persistency); the turn is the loss stage
joining the branches (forward and backward in one ``turn`` operation). ``Opt_0`` (Revolve) is
replaced by the heterogeneous chain DP (rotor, :mod:`memplan.algorithms.chain.rotor`), whose
table ``opt[a][b][m]`` is exactly the cost of backpropagating a segment ``a..b`` of a branch from
its checkpoint ``x[a]``.

NOTE [ heterogeneous join recurrences ]
``V(p, m)``: least time from the state where branch ``j`` starts at ``x[j][p_j]`` (available,
counted by the caller), the loss gradient ``gT`` is held (counted here) and the turn has not run, to
the state holding ``g[j][p_j]`` for every ``j`` (counted here), within ``m`` slots. With
``G(p) = sum_j g[j][p_j]`` and ``G_j = G(p) - g[j][p_j]``:

* all ``p_j = l_j``: the turn, if ``m >= gT + sT + max(foT, sum_j g[j][l_j] + boT)``;
* ``F_all p_j`` on branch ``j``, the rest with ``m - s[j][p_j]``, then ``B p_j``::

      ft + V(p + e_j, m - s) + bt    if m >= gT + s + fo and m >= s + G_j + g[j][p_j+1] + g[j][p_j] + bo

* ``F_ck p_j, F_n ..`` up to a checkpoint ``x[j][q]`` (``p_j < q <= l_j``), the rest with
  ``m - x[j][q]``, then the segment ``p_j..q-1`` of branch ``j`` by rotor with ``m - G_j``::

      sum ft[p_j..q-1] + V(p[j <- q], m - x[q]) + opt_j[p_j][q-1][m - G_j]
      if m >= gT + max(x[p_j+1] + fo[p_j], max_{p_j<r<q} x[r] + x[r+1] + fo[r])

This is Theorem 3 with the segment of the canonical form solved by rotor and, in addition, the
``F_all`` step of rotor lifted to the join (without it, store-all would not be a canonical plan in
this model). It is exact over canonical plans in the slot discretization of docs/model.md; the
paper proves canonical plans optimal in its pebble model only. The gap to an exhaustive search
of the chain model is measured in tests/algorithms/join/test_hetero.py and docs/benchmarks.md.

NOTE [ join loop terms ]
Under the training loop's terms (docs/model.md, "The training loop"; the solvers' figures from
memplan/profile/memory.py) the DPs plan on a net that folds them in, as pofo's (NOTE [ pofo loop
terms ]): the gradient ``g[j][i]`` a state holds for branch ``j`` counts the weight gradients of
its stages ``i..`` too, branch 0's also the turn's (created by the turn, held to the end), so that
every ``G(p)`` holds the weight gradients of every backward that has run; ``B``'s overhead is the
loop's less the weight gradients held already (``B i`` needs exactly the loop's), never below
``-g[j][i]`` (the moment before a backward that frees more than it makes); the turn's forward
overhead and backward overhead are its loop's and its weight gradients count in the gradient of
branch 0's output; a branch stage's forward takes the larger of ``forward_overhead`` and
``forward_overhead_all``; autograd's frees are not counted (they only lower the memory); the step
in the backward (``step-in-backward``) comes folded into the stages' terms (``StageTerms`` in
memplan/profile/memory.py). Every plan therefore fits in the loop's accounting (the simulator's,
:mod:`memplan.simulator.join`); the optimizer's step after the backward bounds the schedule
(``step_bound`` in memplan/algorithms/timeline.py).

Complexity: ``O(prod(l + 1) * sum(l) * S)`` for the join part (numpy over the slots), plus the
rotor tables ``O(l_j^3 S)`` of each branch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from memplan.algorithms.chain import rotor
from memplan.algorithms.chain.least_memory import least_memory_sequence, least_memory_tables
from memplan.algorithms.chain.problem import ChainInstance
from memplan.algorithms.join.pebble import JoinOp
from memplan.algorithms.timeline import Deadline, TimeLimitReached
from memplan.core import kernels
from memplan.errors import InputError
from memplan.loop import TrainingLoop
from memplan.profile.memory import stage_terms
from memplan.profile.model import Profile

INF = math.inf
_TURN, _NONE = -2, -1
_LEAST_TURN, _LEAST_F_ALL = 1, 2
"""Decisions of the least-memory DP (``kind``): the turn, ``F_all``; 3 is a checkpointed segment."""

_Task = (
    tuple[Literal["op"], JoinOp]
    | tuple[Literal["segment"], int, int, int, int]
    | tuple[Literal["solve"], tuple[int, ...], tuple[int, ...], int]
)
"""What :meth:`HeteroJoin.sequence` has left to do: one operation, a rotor segment of a branch
(branch, first and last stage, slots), or a sub-join (positions, standalone-start flags, slots)."""


_LeastTask = (
    tuple[Literal["ops"], list[JoinOp]] | tuple[Literal["solve"], tuple[int, ...], tuple[int, ...]]
)
"""What :func:`least_memory_plan` has left to do: operations to append, or a sub-join."""


@dataclass
class JoinNet:
    """Sizes (bytes or slots) and times of every branch and of the turn (docs/join.md, chain model)."""

    chains: list[ChainInstance]
    s_turn: int
    fo_turn: int
    bo_turn: int
    g_turn: int
    t_turn: float

    @classmethod
    def from_profile(cls, profile: Profile, loop: TrainingLoop | None = None) -> JoinNet:
        """The net of a join profile, under the training loop ``loop`` (NOTE [ join loop
        terms ]; None, or a loop without ``gradients``: the model before the loop's terms).
        """
        assert profile.branches is not None and profile.turn is not None
        chains = [ChainInstance.from_stages(b.input_size, b.stages) for b in profile.branches]
        t = profile.turn
        net = cls(
            chains,
            t.saved_size,
            t.forward_overhead,
            t.backward_overhead,
            t.gradient_size,
            t.forward_time + t.backward_time,
        )
        return net if loop is None or loop.gradients is None else net.folded(profile, loop)

    def folded(self, profile: Profile, loop: TrainingLoop) -> JoinNet:
        """The net with the training loop's terms folded in (NOTE [ join loop terms ])."""
        assert profile.branches is not None and profile.turn is not None
        turn = stage_terms([profile.turn], loop)
        extra = turn.weight_grads[0]  # the turn's weight gradients, held from the turn on
        chains = []
        for j, (branch, c) in enumerate(zip(profile.branches, self.chains, strict=True)):
            terms = stage_terms(branch.stages, loop)
            created = np.array(terms.weight_grads, dtype=np.int64)
            held = np.append(np.cumsum(created[::-1])[::-1], 0) + (extra if j == 0 else 0)
            g = c.g + held
            fall = np.array(terms.forward_all, dtype=np.int64)
            bo = np.array(terms.backward, dtype=np.int64) - held[1:]
            chains.append(
                ChainInstance(
                    c.x, c.s, g, np.maximum(c.fo, fall), np.maximum(bo, -g[:-1]), c.ft, c.bt,
                    c.names,
                )
            )  # fmt: skip
        return JoinNet(
            chains,
            self.s_turn,
            turn.forward_all[0],
            turn.backward[0],
            self.g_turn,
            self.t_turn,
        )

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(c.length for c in self.chains)

    @property
    def lower_bound(self) -> float:
        return sum(c.lower_bound for c in self.chains) + self.t_turn

    def rounded(self, budget: int, slots: int) -> tuple[int, JoinNet]:
        """The net with every size in slots of ``max(1, budget / slots)`` bytes, rounded up.

        The discretization of docs/model.md (the one rotor uses): a plan that fits in slots fits
        in bytes. Returns the budget in slots and the rounded net.
        """
        if budget <= slots:
            num, den, capacity = 1, 1, budget
        else:
            num, den, capacity = budget, slots, slots

        def up(values: np.ndarray) -> np.ndarray:
            return np.array([-(-int(v) * den // num) for v in values], dtype=np.int64)

        chains = [
            ChainInstance(up(c.x), up(c.s), up(c.g), up(c.fo), up(c.bo), c.ft, c.bt, c.names)
            for c in self.chains
        ]
        turn = up(np.array([self.s_turn, self.fo_turn, self.bo_turn, self.g_turn]))
        s_turn, fo_turn, bo_turn, g_turn = (int(v) for v in turn)
        return capacity, JoinNet(chains, s_turn, fo_turn, bo_turn, g_turn, self.t_turn)

    def turn_need(self) -> int:
        grads = sum(int(c.g[c.length]) for c in self.chains)
        return self.g_turn + self.s_turn + max(self.fo_turn, grads + self.bo_turn)

    def forward_need(self, j: int, p: int, q: int) -> int:
        """Peak (besides the caller's tensors and gT) of ``F_ck p, F_n p+1 .. q-1`` on branch j."""
        c = self.chains[j]
        need = int(c.x[p + 1] + c.fo[p])
        for r in range(p + 1, q):
            need = max(need, int(c.x[r] + c.x[r + 1] + c.fo[r]))
        return need

    def forward_needs(self, j: int, dtype: npt.DTypeLike = np.int64) -> npt.NDArray[Any]:
        """``[p, q]``: :meth:`forward_need` of branch ``j`` for every ``p < q <= l_j`` (0 below),
        by running maxima: ``O(l^2)`` instead of ``O(l)`` per pair.
        """
        c = self.chains[j]
        length = c.length
        x, fo = c.x.tolist(), c.fo.tolist()
        table = np.zeros((length + 1, length + 1), dtype=dtype)
        for p in range(length):
            need = x[p + 1] + fo[p]
            row = [need]
            for r in range(p + 1, length):
                need = max(need, x[r] + x[r + 1] + fo[r])
                row.append(need)
            table[p, p + 1 :] = row
        return table

    def exact_int64(self) -> bool:
        """Whether every sum of this net's sizes stays exact in int64."""
        total = sum(c.total_bytes for c in self.chains)
        return total + self.s_turn + self.fo_turn + self.bo_turn + self.g_turn < 2**62

    # ------------------------------------------------------------------ plans
    def store_all(self) -> list[JoinOp]:
        plan: list[JoinOp] = []
        for j, c in enumerate(self.chains):
            plan += [("F_all", j, i) for i in range(c.length)]
        plan.append(("turn", None, 0))
        for j, c in reversed(list(enumerate(self.chains))):
            plan += [("B", j, i) for i in reversed(range(c.length))]
        return plan

    def makespan(self, plan: list[JoinOp]) -> float:
        total = 0.0
        for op, j, i in plan:
            if op == "turn":
                total += self.t_turn
            else:
                assert j is not None, "only the turn has no branch"
                c = self.chains[j]
                total += float(c.bt[i] if op == "B" else c.ft[i])
        return total

    def peak(self, plan: list[JoinOp]) -> int:
        """Peak activation bytes of a valid plan (the solver's own accounting, docs/join.md)."""
        k = len(self.chains)
        xs = [{0} for _ in range(k)]
        ss: list[set[int]] = [set() for _ in range(k)]
        held = sum(int(c.x[0]) for c in self.chains) + self.g_turn
        peak = held
        for op, j, i in plan:
            if op == "turn":
                grads = sum(int(c.g[c.length]) for c in self.chains)
                peak = max(peak, held + self.s_turn + max(self.fo_turn, grads + self.bo_turn))
                held += grads - self.g_turn
                for b, c in enumerate(self.chains):
                    if c.length in xs[b]:
                        xs[b].discard(c.length)
                        held -= int(c.x[c.length])
                continue
            assert j is not None, "only the turn has no branch"
            c = self.chains[j]
            if op == "F_all":
                peak = max(peak, held + int(c.s[i] + c.fo[i]))
                held += int(c.s[i])
                ss[j].add(i)
                continue
            if op == "B":
                peak = max(peak, held + int(c.g[i] + c.bo[i]))
                held += int(c.g[i] - c.g[i + 1] - c.s[i])
                ss[j].discard(i)
            else:
                peak = max(peak, held + int(c.x[i + 1] + c.fo[i]))
                held += int(c.x[i + 1])
                xs[j].add(i + 1)
                if op == "F_ck":
                    continue
            if i in xs[j]:
                xs[j].discard(i)
                held -= int(c.x[i])
        return peak


def join_states(shape: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every ``(p, flags)``, sub-states first: ``p`` in decreasing lexicographic order."""
    k = len(shape)
    found = []
    for p in reversed(list(itertools.product(*(range(n) for n in shape)))):
        for flags in itertools.product((0, 1), repeat=k):
            if any(p[j] == 0 and not flags[j] for j in range(k)):
                continue  # a branch input is always a standalone tensor
            found.append((p, flags))
    return found


class StateIndex:
    """Dense ids of the states ``(p, flags)``: ``(sum_j p_j stride_j) << k`` plus the flag bits
    (bit ``j`` for branch ``j``), so that the states that move branch ``j`` to ``q = a+1 .. l_j``
    have ids in an arithmetic progression (gathered at once).
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.k = len(shape)
        self.strides = [math.prod(shape[j + 1 :]) for j in range(self.k)]
        self.size = math.prod(shape) << self.k

    def id(self, p: tuple[int, ...], flags: tuple[int, ...]) -> int:
        position = sum(pj * stride for pj, stride in zip(p, self.strides, strict=True))
        return (position << self.k) | sum(f << j for j, f in enumerate(flags))

    def moved(
        self, p: tuple[int, ...], flags: tuple[int, ...], j: int, targets: np.ndarray, flag: int
    ) -> np.ndarray:
        """Ids of ``(p[j <- q], flags[j <- flag])`` for every ``q`` of ``targets``."""
        base = self.id(p[:j] + (0,) + p[j + 1 :], flags[:j] + (flag,) + flags[j + 1 :])
        return base + ((targets * self.strides[j]) << self.k)


class HeteroJoin:
    """The DP of NOTE [ heterogeneous join recurrences ] on a (rounded) join net.

    A state is ``(p, flags)``: ``flags[j]`` says whether the start ``x[j][p_j]`` is a standalone
    checkpoint (counted in the state's budget, freed by ``B p_j``) or inside ``s[j][p_j - 1]``
    (counted by the caller), so that memory freed by finished branches is available to the
    segments run after them.
    """

    def __init__(self, net: JoinNet, capacity: int, deadline: Deadline | None = None) -> None:
        self.net = net
        self.capacity = capacity
        self.k = len(net.chains)
        self.shape = tuple(length + 1 for length in net.lengths)
        width = capacity + 1
        self.tables = [
            rotor.dense_table(c, capacity, c.x, c.s, c.g, c.fo, c.bo) for c in net.chains
        ]
        self.fneeds = [net.forward_needs(j) for j in range(self.k)]
        self.ids = StateIndex(self.shape)
        deadline = deadline or Deadline()
        deadline.check()
        left = deadline.left()
        chains = net.chains
        done, self.row, self.value, self.branch, self.target = kernels.join_fill(
            [np.ascontiguousarray(c.x, dtype=np.int64) for c in chains],
            [np.ascontiguousarray(c.s, dtype=np.int64) for c in chains],
            [np.ascontiguousarray(c.g, dtype=np.int64) for c in chains],
            [np.ascontiguousarray(c.fo, dtype=np.int64) for c in chains],
            [np.ascontiguousarray(c.bo, dtype=np.int64) for c in chains],
            [np.ascontiguousarray(c.ft, dtype=np.float64) for c in chains],
            [np.ascontiguousarray(c.bt, dtype=np.float64) for c in chains],
            [np.ascontiguousarray(t.opt, dtype=np.float64) for t in self.tables],
            [np.ascontiguousarray(f, dtype=np.int64) for f in self.fneeds],
            g_turn=int(net.g_turn),
            turn_need=int(net.turn_need()),
            t_turn=float(net.t_turn),
            width=width,
            time_limit=-1.0 if left is None else left,
        )
        if not done:
            raise TimeLimitReached

    def _index(self, p: tuple[int, ...], flags: tuple[int, ...]) -> int:
        return int(self.row[self.ids.id(p, flags)])

    def opt(self, m: int) -> float:
        """Least time of the whole join within ``m`` slots (the branch inputs included)."""
        top = self._index((0,) * self.k, (1,) * self.k)
        return float(self.value[top, m]) if 0 <= m <= self.capacity else INF

    def sequence(self, m: int) -> list[JoinOp]:
        """The plan of :meth:`opt` (forward segments, the turn, backward segments)."""
        net = self.net
        plan: list[JoinOp] = []
        stack: list[_Task] = [("solve", (0,) * self.k, (1,) * self.k, m)]
        while stack:
            item = stack.pop()
            if item[0] == "op":
                plan.append(item[1])
                continue
            if item[0] == "segment":
                _, j, a, b, budget = item
                plan += [(op, j, k) for op, k in self.tables[j].plan(a, b, budget)]
                continue
            _, p, flags, budget = item
            idx = self._index(p, flags)
            j = int(self.branch[idx, budget])
            if j == _TURN:
                plan.append(("turn", None, 0))
                continue
            if j < 0:  # pragma: no cover - the caller checked feasibility
                raise AssertionError(f"join DP: no choice at {p}, {budget} slots")
            c = net.chains[j]
            a, q = p[j], int(self.target[idx, budget])
            mine = int(c.x[a]) * flags[j]
            others = sum(int(cc.g[p[b]]) for b, cc in enumerate(net.chains)) - int(c.g[a])
            if q == 0:
                plan.append(("F_all", j, a))
                stack.append(("op", ("B", j, a)))
                sub = (p[:j] + (a + 1,) + p[j + 1 :], flags[:j] + (0,) + flags[j + 1 :])
                stack.append(("solve", *sub, budget - mine - int(c.s[a])))
            else:
                plan.append(("F_ck", j, a))
                plan += [("F_n", j, r) for r in range(a + 1, q)]
                stack.append(("segment", j, a, q - 1, budget - mine - others))
                sub = (p[:j] + (q,) + p[j + 1 :], flags[:j] + (1,) + flags[j + 1 :])
                stack.append(("solve", *sub, budget - mine))
        return plan


_LEAST: dict[tuple[object, ...], tuple[int, list[JoinOp]]] = {}


def min_memory_plan(net: JoinNet, deadline: Deadline | None = None) -> tuple[int, list[JoinOp]]:
    """:func:`least_memory_plan`, remembered for the last few nets (info and solve share it)."""
    key = tuple(
        tuple(np.concatenate([c.x, c.s, c.g, c.fo, c.bo]).tolist())
        + tuple(np.concatenate([c.ft, c.bt]).tolist())
        for c in net.chains
    ) + (net.s_turn, net.fo_turn, net.bo_turn, net.g_turn, net.t_turn)
    if key not in _LEAST:
        if len(_LEAST) >= 8:
            _LEAST.pop(next(iter(_LEAST)))
        _LEAST[key] = least_memory_plan(net, deadline)
    return _LEAST[key]


def least_memory_plan(net: JoinNet, deadline: Deadline | None = None) -> tuple[int, list[JoinOp]]:
    """Least activation bytes of a canonical plan (exact, no slots), and that plan.

    The recurrences of :class:`HeteroJoin` with max/min instead of sum/min, the segments solved
    by the chain's own least-memory plan (one table per branch for all its segments,
    :func:`least_memory_tables`), the checkpoints of one branch compared in order (the first of
    equals). The states are filled by the compiled core (src/join_fill.cpp; its numpy reference
    is tests/oracles/join_table.py), in int64: a net whose sizes add up beyond it is refused.

    Raises
    ------
    InputError
        When the sizes of the net add up beyond what int64 holds exactly.
    """
    if not net.exact_int64():
        raise InputError(
            "join: the sizes of the branches add up beyond 2**62 bytes; "
            "the join DP counts memory in int64"
        )
    k = len(net.chains)
    shape = tuple(c.length + 1 for c in net.chains)
    tables = [least_memory_tables(c) for c in net.chains]  # need[a, b] beyond x[a], pick[a, b]
    ids = StateIndex(shape)
    deadline = deadline or Deadline()
    deadline.check()
    left = deadline.left()
    chains = net.chains
    done, need, kind, branch, target = kernels.join_least(
        [np.ascontiguousarray(c.x, dtype=np.int64) for c in chains],
        [np.ascontiguousarray(c.s, dtype=np.int64) for c in chains],
        [np.ascontiguousarray(c.g, dtype=np.int64) for c in chains],
        [np.ascontiguousarray(c.fo, dtype=np.int64) for c in chains],
        [np.ascontiguousarray(c.bo, dtype=np.int64) for c in chains],
        [net.forward_needs(j) for j in range(k)],
        [np.ascontiguousarray(t[0], dtype=np.int64) for t in tables],
        g_turn=int(net.g_turn),
        turn_need=int(net.turn_need()),
        time_limit=-1.0 if left is None else left,
    )
    if not done:
        raise TimeLimitReached
    plan: list[JoinOp] = []
    stack: list[_LeastTask] = [("solve", (0,) * k, (1,) * k)]
    while stack:
        item = stack.pop()
        if item[0] == "ops":
            plan += item[1]
            continue
        _, p, flags = item
        here = ids.id(p, flags)
        how = int(kind[here])
        if how == _LEAST_TURN:
            plan.append(("turn", None, 0))
            continue
        j = int(branch[here])
        a = p[j]
        if how == _LEAST_F_ALL:
            plan.append(("F_all", j, a))
            backward: list[JoinOp] = [("B", j, a)]
            stack.append(("ops", backward))
            stack.append(
                ("solve", p[:j] + (a + 1,) + p[j + 1 :], flags[:j] + (0,) + flags[j + 1 :])
            )
        else:
            q = int(target[here])
            plan.append(("F_ck", j, a))
            plan += [("F_n", j, r) for r in range(a + 1, q)]
            segment = least_memory_sequence(tables[j][1], a, q - 1)
            ops: list[JoinOp] = [(op, j, st) for op, st in segment]
            stack.append(("ops", ops))
            stack.append(("solve", p[:j] + (q,) + p[j + 1 :], flags[:j] + (1,) + flags[j + 1 :]))
    return int(need[ids.id((0,) * k, (1,) * k)]), plan
