"""Exhaustive-search oracle for the chain model of docs/model.md (written from that document only).

Search space
------------
Every sequence of the operations ``F_all``, ``F_ck``, ``F_n`` (on any stage ``k`` in ``0..L-1``)
and ``B`` that obeys the rules of the model's operation table, starting from ``held = {x[0], g[L]}``
and ending when ``B`` has run on every stage (in the order ``L-1 .. 0``, once each), and whose peak
during every operation (``|held| + produced + overhead + static``) is at most the budget. No
operation is pruned as useless: a forward on a stage whose backward already ran, a second copy of a
checkpoint inside ``s[k]``, a forward of the loss output ``x[L]`` are all searched.

A state is ``(b, X, S)``: ``b`` the stage of the next backward (``-1`` when all have run), ``X`` the
set of ``k`` whose standalone ``x[k]`` is held (``0 <= k <= L``), ``S`` the set of ``k`` whose
``s[k]`` is held. The held gradient is implied: ``g[b+1]``. The bytes held are therefore a function
of the state, so the feasibility of an operation from a state does not depend on the path, and
Dijkstra's algorithm (costs: the profile durations, all >= 0) finds a least-makespan sequence.

The state space has at most ``(L+1) * 2**(L+1) * 2**L`` states: use it on chains of up to about 6
stages (a 6-stage search takes a few tenths of a second).

Persistent plans (``persistent=True``, the default: memplan's model)
--------------------------------------------------------------------
The search is restricted to *persistent* plans, where a standalone checkpoint, once kept, stays
until its backward: ``F_n`` on stage ``k`` may free a held standalone ``x[k]`` only when the
operation just before produced it (``F_ck`` or ``F_n`` on stage ``k-1``: a transient value in a
chain of forwards). Every other rule is the same; the state then also records which ``x[k+1]`` (if
any) the last operation produced. This is the memory persistency rule of docs/model.md and the class of
plans the rotor dynamic program builds (a checkpoint stored by a sub-problem is kept through the
sub-problems after it, and freed by its backward). The relaxed search (``persistent=False``) can be strictly faster:
a non-persistent plan may use a checkpoint ``x[k]`` for one more sub-chain and free it with
``F_n k``, recomputing ``x[k]`` from an earlier checkpoint when its own backward comes.

The training loop's terms (``gradients="at-backward"`` or ``"kept"``)
-------------------------------------------------------------------
Written from docs/model.md ("The training loop"): ``B k`` also creates stage ``k``'s weight
gradients (``weight_grad_size``, else ``weight_size``; under ``at-backward`` with an optimizer),
which stay; its temporaries are ``backward_overhead_fresh`` under ``at-backward`` (when given);
``F_all k`` adds ``forward_overhead_all`` (when given) and, when stage ``k-1`` does not keep its
output nor stage ``k`` its input, frees the standalone ``x[k]`` and ``s[k-1]``'s copy of it at its
end (``s[k-1]`` then holds ``x[k]`` less until its backward); ``B k`` does not read ``x[k]`` then.
The state then also records the set ``C`` of ``k`` whose ``s[k]`` lost its ``x[k+1]``. When
stage ``k`` does not keep its output but stage ``k+1`` keeps it as its input, ``B k+1`` frees it:
``B k`` runs without ``x[k+1]`` (its temporaries that much lower).

Under ``gradients="step-in-backward"`` (the optimizer step in the backward), ``B k`` creates its
gradients as under ``at-backward``, holds the step's temporaries during it
(``step_temporaries(size)`` of its largest stepped gradient, ``largest_grad_size``) and frees, at
its end, the gradients of the parameters stage ``k`` uses first (``first_use_grad_size``, else
the gradients it created).

Functions
---------
optimal_makespan
    Dijkstra on the makespan, moves over the budget left out.
min_feasible_memory
    Dijkstra on the bottleneck (a path costs its largest peak): the least budget of any plan.
makespan_steps, makespan_at
    The whole staircase "budget -> least makespan", from repeated :func:`optimal_makespan`.
ChainOracle
    The same searches on one profile, sharing the moves computed (faster for many budgets),
    over all plans or over persistent plans only.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from memplan.profile.model import Profile

State = tuple[int, int, int, int, int]
"""``(b, X, S, fresh, C)``, the sets ``X``, ``S`` and ``C`` as bit masks (bit ``k`` set: ``k`` in
the set); ``fresh`` is the ``k`` of the standalone ``x[k]`` the last operation produced, in a
persistent search only (always -1 otherwise, so that the state space is as described); ``C`` the
``k`` whose ``s[k]`` is held without ``x[k+1]`` (always empty without the loop's terms)."""
Step = tuple[str, int]


class _Chain:
    """The sizes, overheads and times of a profile, indexed as in docs/model.md, and the moves."""

    def __init__(
        self,
        profile: Profile,
        persistent: bool = True,
        gradients: str | None = None,
        optimizer: str = "sgd",
        step_temporaries: Callable[[int], int] = lambda _size: 0,
    ) -> None:
        self.persistent = persistent
        stages = profile.stages
        self.length = length = len(stages)
        self.x = [profile.input_size] + [st.output_size for st in stages]  # x[0..L]
        self.s = [st.saved_size for st in stages]  # s[0..L-1]
        self.g = [0] + [st.gradient_size for st in stages]  # g[0..L], g[0] = 0
        self.fo = [st.forward_overhead for st in stages]
        self.bo = [st.backward_overhead for st in stages]
        self.fa = list(self.fo)  # what F_all adds beyond s[k]
        self.wg = [0] * length  # weight gradients B k creates
        self.frees = [False] * length  # F_all k frees x[k]
        self.step = [0] * length  # step in the backward: its temporaries during B k
        self.stepped = [0] * length  # and the gradients it frees at the end of B k
        if gradients is not None:
            fresh = gradients in ("at-backward", "step-in-backward")
            for k, st in enumerate(stages):
                if st.forward_overhead_all is not None:
                    self.fa[k] = st.forward_overhead_all
                if fresh and st.backward_overhead_fresh is not None:
                    self.bo[k] = st.backward_overhead_fresh
                if fresh and optimizer != "none":
                    self.wg[k] = (
                        st.weight_size if st.weight_grad_size is None else st.weight_grad_size
                    )
                if k > 0:
                    self.frees[k] = stages[k - 1].output_saved is False and st.input_saved is False
                if k + 1 < length and st.output_saved is False and stages[k + 1].input_saved:
                    self.bo[k] -= st.output_size  # B k+1 let x[k+1] go: B k runs without it
        if gradients == "step-in-backward" and optimizer != "none":
            for k, st in enumerate(stages):
                self.stepped[k] = (
                    self.wg[k] if st.first_use_grad_size is None else st.first_use_grad_size
                )
                one = self.stepped[k] if st.largest_grad_size is None else st.largest_grad_size
                self.step[k] = step_temporaries(one)
        # weight gradients held once B k has run: those created by stages k..L-1, less those
        # stepped (and freed) at the end of their backward
        self.wh = [sum(self.wg[k:]) - sum(self.stepped[k:]) for k in range(length + 1)]
        self.ft = [st.forward_time for st in stages]
        self.bt = [st.backward_time for st in stages]
        # Bytes of every set of standalone x's and of every set of s's, by bit mask.
        self.x_bytes = [_mask_sum(self.x, mask) for mask in range(1 << (length + 1))]
        self.s_bytes = [_mask_sum(self.s, mask) for mask in range(1 << length)]
        self._moves: dict[State, list[tuple[Step, float, int, State]]] = {}

    def start(self) -> State:
        return (self.length - 1, 1, 0, -1, 0)  # X = {0}, S = {}, C = {}

    def held(self, state: State) -> int:
        b, xs, ss, _, cut = state
        lost = sum(self.x[k + 1] for k in range(self.length) if cut >> k & 1)
        return self.x_bytes[xs] + self.s_bytes[ss] - lost + self.g[b + 1] + self.wh[b + 1]

    def moves(self, state: State) -> list[tuple[Step, float, int, State]]:
        """Every valid operation from ``state``: (op, duration, peak without static, next state).

        The moves do not depend on the budget: they are computed once per state and kept.
        """
        found = self._moves.get(state)
        if found is None:
            found = self._moves[state] = list(self._valid_moves(state))
        return found

    def _valid_moves(self, state: State) -> Iterator[tuple[Step, float, int, State]]:
        b, xs, ss, fresh, cut = state
        if b < 0:
            return
        held = self.held(state)
        persistent = self.persistent

        def available(k: int) -> bool:  # standalone x[k] held, or s[k-1] held with x[k]
            return bool(xs >> k & 1) or (
                k > 0 and bool(ss >> (k - 1) & 1) and not cut >> (k - 1) & 1
            )

        for k in range(self.length):
            if not available(k):
                continue
            if not ss >> k & 1:
                peak = held + self.s[k] + self.fa[k]
                after_x, after_cut = xs, cut
                if self.frees[k]:  # autograd frees x[k] at the end of F_all k
                    after_x &= ~(1 << k)
                    if ss >> (k - 1) & 1:
                        after_cut |= 1 << (k - 1)
                yield ("F_all", k), self.ft[k], peak, (b, after_x, ss | 1 << k, -1, after_cut)
            if not xs >> (k + 1) & 1:
                peak = held + self.x[k + 1] + self.fo[k]
                produced = xs | 1 << (k + 1)
                new_fresh = k + 1 if persistent else -1
                yield ("F_ck", k), self.ft[k], peak, (b, produced, ss, new_fresh, cut)
                # A persistent plan frees a standalone x[k] only right after producing it.
                if not persistent or not xs >> k & 1 or fresh == k:
                    after = (b, produced & ~(1 << k), ss, new_fresh, cut)
                    yield ("F_n", k), self.ft[k], peak, after
        if ss >> b & 1 and (available(b) or self.frees[b]):
            peak = held + self.g[b] + self.wg[b] + self.bo[b] + self.step[b]
            after = (b - 1, xs & ~(1 << b), ss & ~(1 << b), -1, cut & ~(1 << b))
            yield ("B", b), self.bt[b], peak, after


def _mask_sum(sizes: list[int], mask: int) -> int:
    return sum(size for k, size in enumerate(sizes) if mask >> k & 1)


def _search(
    chain: _Chain, combine: Callable[[float, float, int], float], limit: float
) -> tuple[float, list[Step]] | None:
    """Dijkstra from the start state to any state with every backward done.

    ``combine(cost, duration, peak)`` gives the cost of a path extended by one operation (it must
    never decrease); a move is allowed when its peak is at most ``limit``.
    """
    start = chain.start()
    best: dict[State, float] = {start: 0.0}
    parent: dict[State, tuple[State, Step]] = {}
    tie = itertools.count()
    heap: list[tuple[float, int, State]] = [(0.0, next(tie), start)]
    while heap:
        cost, _, state = heapq.heappop(heap)
        if cost > best[state]:
            continue
        if state[0] < 0:
            steps: list[Step] = []
            while state != start:
                state, step = parent[state]
                steps.append(step)
            return cost, steps[::-1]
        for step, duration, peak, nxt in chain.moves(state):
            if peak > limit:
                continue
            new = combine(cost, duration, peak)
            if nxt not in best or new < best[nxt]:
                best[nxt] = new
                parent[nxt] = (state, step)
                heapq.heappush(heap, (new, next(tie), nxt))
    return None


def _add(cost: float, duration: float, peak: int) -> float:
    return cost + duration


def _bottleneck(cost: float, duration: float, peak: int) -> float:
    return max(cost, peak)


class ChainOracle:
    """The searches on one profile, sharing the moves of every state already visited.

    Parameters
    ----------
    profile : Profile
        A small chain (up to about 6 stages).
    static_memory : int
        Bytes present all the time, counted in every budget.
    persistent : bool
        Search persistent plans only (memplan's model, docs/model.md; the default), or, with
        False, every plan of the relaxed model without the persistency rule.
    """

    def __init__(
        self,
        profile: Profile,
        static_memory: int = 0,
        persistent: bool = True,
        gradients: str | None = None,
        optimizer: str = "sgd",
        step_temporaries: Callable[[int], int] = lambda _size: 0,
    ) -> None:
        self.chain = _Chain(profile, persistent, gradients, optimizer, step_temporaries)
        self.static_memory = static_memory

    def optimal_makespan(self, memory: int) -> tuple[float, list[Step]] | None:
        """Least makespan within ``memory`` (static included): :func:`optimal_makespan`."""
        return _search(self.chain, _add, memory - self.static_memory)

    def min_feasible_memory(self) -> int:
        """Least budget (static included) with a plan; see :func:`min_feasible_memory`."""
        result = _search(self.chain, _bottleneck, float("inf"))
        assert result is not None, "the store-all plan always exists"
        # The empty path costs 0; a complete plan has at least one operation, so costs its peak.
        return int(result[0]) + self.static_memory

    def makespan_steps(self) -> list[tuple[int, float]]:
        """The staircase budget -> least makespan; see :func:`makespan_steps`."""
        chain = self.chain
        budget = _store_all_peak(chain)
        steps: list[tuple[int, float]] = []
        while True:
            found = _search(chain, _add, budget)
            if found is None:
                break
            makespan, plan = found
            peak = _peak(chain, plan)
            if steps and steps[-1][1] == makespan:
                steps[-1] = (peak + self.static_memory, makespan)
            else:
                steps.append((peak + self.static_memory, makespan))
            budget = peak - 1
        return steps[::-1]


def optimal_makespan(
    profile: Profile, memory: int, static_memory: int = 0, persistent: bool = True
) -> tuple[float, list[Step]] | None:
    """Least makespan of any plan of the model within ``memory`` bytes (static included).

    Parameters
    ----------
    profile : Profile
        A small chain (up to about 6 stages).
    memory : int
        Budget, static memory included.
    static_memory : int
        Bytes present all the time.

    Returns
    -------
    (float, list of (str, int)) or None
        The least makespan and one operation sequence achieving it; None when no plan fits.
    """
    return ChainOracle(profile, static_memory, persistent).optimal_makespan(memory)


def min_feasible_memory(profile: Profile, static_memory: int = 0, persistent: bool = True) -> int:
    """Least budget (static included) for which :func:`optimal_makespan` finds a plan.

    A bottleneck-path search: Dijkstra where a path costs the largest peak along it, so the
    least-cost complete path is a plan whose peak is the least possible.
    """
    return ChainOracle(profile, static_memory, persistent).min_feasible_memory()


def makespan_steps(
    profile: Profile, static_memory: int = 0, persistent: bool = True
) -> list[tuple[int, float]]:
    """The least makespan as a function of the budget, as a staircase.

    Returns
    -------
    list of (int, float)
        ``(budget, makespan)`` pairs by increasing budget and decreasing makespan: for a budget
        ``M``, the least makespan is that of the last pair whose budget is ``<= M`` (no plan fits
        below the first budget, :func:`min_feasible_memory`; the last pair holds from there on).

    Notes
    -----
    The least makespan ``T(M)`` does not increase with ``M``. A search at budget ``M`` returns
    ``T(M)`` and a plan whose peak ``P <= M``; that plan fits every budget in ``[P, M]``, so
    ``T = T(M)`` on all of it. Searching again at ``P - 1`` and so on down to an infeasible budget
    covers every budget with as many searches as the staircase has steps (or a few more).
    """
    return ChainOracle(profile, static_memory, persistent).makespan_steps()


def makespan_at(steps: list[tuple[int, float]], memory: int) -> float | None:
    """Read the least makespan at budget ``memory`` off a :func:`makespan_steps` staircase."""
    found = None
    for budget, makespan in steps:
        if budget > memory:
            break
        found = makespan
    return found


def _peak(chain: _Chain, plan: list[Step]) -> int:
    """Largest peak (static excluded) along a valid plan, replayed with :meth:`_Chain.moves`."""
    state, peak = chain.start(), 0
    for step in plan:
        state, peak = next((nxt, max(peak, p)) for s, _, p, nxt in chain.moves(state) if s == step)
    return peak


def _store_all_peak(chain: _Chain) -> int:
    """Peak (static excluded) of ``F_all 0 .. L-1`` then ``B L-1 .. 0``, which always exists."""
    plan = [("F_all", k) for k in range(chain.length)]
    plan += [("B", k) for k in reversed(range(chain.length))]
    return _peak(chain, plan)
