"""Exhaustive-search oracles for join networks (written from docs/join.md and papers/003 only).

Pebble game (the paper's model, Section 2)
------------------------------------------
Every forward value ``x_i^(j)`` (``0 <= i <= l_j``) and backward value ``xbar_i^(j)`` takes one
slot; at most ``c`` are held at any time. The moves:

* ``F(j, i)``: ``x_i^(j)`` held, ``x_{i+1}^(j)`` not held; either keep ``x_i`` (one slot more) or
  overwrite it (the output takes its slot);
* ``free(j, i)``: drop a held forward value (no cost);
* ``turn``: every ``x_{l_j}^(j)`` held; each is replaced by ``xbar_{l_j}^(j)`` in its slot;
* ``Fbar(j, i)``: ``x_i^(j)`` and ``xbar_{i+1}^(j)`` held; both are replaced by ``xbar_i^(j)``.

Start ``{x_0^(j)}``, goal ``{xbar_0^(j)}`` (every backward run). A state records, per branch, the
set of forward values held and the index of its backward value (after the turn). Forward values
that can no longer be used (``x_i`` with ``i >= `` the index of the branch's backward value) are
dropped as soon as they appear, which loses no plan. Dijkstra's algorithm (costs ``u_f``, ``u_b``,
``u_t``, 0 for ``free``) gives the least makespan; a breadth-first search gives feasibility.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence

State = tuple[bool, tuple[int, ...], tuple[int, ...]]


def _normalize(turned: bool, held: list[int], grad: list[int]) -> State:
    if turned:
        held = [mask & ((1 << g) - 1) for mask, g in zip(held, grad, strict=True)]
    return (turned, tuple(held), tuple(grad))


def _moves(
    lengths: Sequence[int], c: int, state: State, uf: float, ub: float, ut: float
) -> Iterator[tuple[float, State]]:
    turned, held, grad = state
    k = len(lengths)
    count = sum(bin(mask).count("1") for mask in held) + (k if turned else 0)
    if not turned and all(held[j] >> lengths[j] & 1 for j in range(k)):
        new = [held[j] & ~(1 << lengths[j]) for j in range(k)]
        yield ut, _normalize(True, new, list(lengths))
    for j in range(k):
        mask = held[j]
        top = grad[j] - 1 if turned else lengths[j]  # x_{i+1} must be of use: i + 1 <= top
        for i in range(lengths[j] + 1):
            if not mask >> i & 1:
                continue
            if i >= 1:  # dropping x_0 loses the branch input for good: never useful
                new = list(held)
                new[j] = mask & ~(1 << i)
                yield 0.0, (turned, tuple(new), grad)
            if i + 1 <= top and not mask >> (i + 1) & 1:
                new = list(held)
                new[j] = (mask | 1 << (i + 1)) & ~(1 << i)
                if i >= 1:
                    yield uf, _normalize(turned, new, list(grad))
                if count + 1 <= c:
                    new = list(held)
                    new[j] = mask | 1 << (i + 1)
                    yield uf, _normalize(turned, new, list(grad))
            if turned and grad[j] == i + 1:
                new, ng = list(held), list(grad)
                new[j] = mask & ~(1 << i)
                ng[j] = i
                yield ub, _normalize(True, new, ng)


def _start(lengths: Sequence[int]) -> State:
    return (False, tuple(1 for _ in lengths), tuple(0 for _ in lengths))


def _done(state: State) -> bool:
    return state[0] and not any(state[2])


def pebble_optimum(
    lengths: Sequence[int], c: int, uf: float = 1.0, ub: float = 1.0, ut: float = 1.0
) -> float:
    """Least makespan of the pebble game with ``c`` slots (``inf`` when no plan exists)."""
    if c < len(lengths):
        return math.inf
    start = _start(lengths)
    best = {start: 0.0}
    heap = [(0.0, 0, start)]
    tie = 0
    while heap:
        cost, _, state = heapq.heappop(heap)
        if cost > best.get(state, math.inf):
            continue
        if _done(state):
            return cost
        for step, nxt in _moves(lengths, c, state, uf, ub, ut):
            new = cost + step
            if new < best.get(nxt, math.inf):
                best[nxt] = new
                tie += 1
                heapq.heappush(heap, (new, tie, nxt))
    return math.inf


def pebble_feasible(lengths: Sequence[int], c: int) -> bool:
    """Whether any plan of the pebble game fits in ``c`` slots (breadth-first search)."""
    if c < len(lengths):
        return False
    start = _start(lengths)
    seen = {start}
    todo = [start]
    while todo:
        state = todo.pop()
        if _done(state):
            return True
        for _, nxt in _moves(lengths, c, state, 1.0, 1.0, 1.0):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def pebble_min_slots(lengths: Sequence[int]) -> int:
    """The least ``c`` with a plan, by :func:`pebble_feasible` from ``c = k`` upwards."""
    c = len(lengths)
    while not pebble_feasible(lengths, c):
        c += 1
    return c


# ---------------------------------------------------------------------------- chain model


def _chain_net(profile):
    """Plain lists of sizes and times of a join profile in the chain model of docs/join.md."""
    br = profile.branches
    t = profile.turn
    return {
        "L": [len(b.stages) for b in br],
        "x": [[b.input_size] + [s.output_size for s in b.stages] for b in br],
        "s": [[s.saved_size for s in b.stages] for b in br],
        "g": [[0] + [s.gradient_size for s in b.stages] for b in br],
        "fo": [[s.forward_overhead for s in b.stages] for b in br],
        "bo": [[s.backward_overhead for s in b.stages] for b in br],
        "ft": [[s.forward_time for s in b.stages] for b in br],
        "bt": [[s.backward_time for s in b.stages] for b in br],
        "sT": t.saved_size,
        "foT": t.forward_overhead,
        "boT": t.backward_overhead,
        "gT": t.gradient_size,
        "tT": t.forward_time + t.backward_time,
    }


def chain_model_optimum(profile, memory: int) -> float:
    """Least makespan of any plan of the join chain model within ``memory`` activation bytes.

    State: the turn flag and, per branch, the standalone ``x`` held (bit mask), the ``s`` held
    (bit mask), the index of the branch's gradient (``l_j`` before the turn) and the ``x`` the last
    operation on the branch produced (for persistency). Forwards whose result can never be used
    again (on a stage at or after the branch's next backward, once the turn has run) are left out.
    """
    n = _chain_net(profile)
    k = len(n["L"])

    def held(turned, xs, ss, gs):
        total = 0 if turned else n["gT"]
        for j in range(k):
            total += sum(n["x"][j][i] for i in range(n["L"][j] + 1) if xs[j] >> i & 1)
            total += sum(n["s"][j][i] for i in range(n["L"][j]) if ss[j] >> i & 1)
            if turned:
                total += n["g"][j][gs[j]]
        return total

    def avail(xs, ss, j, i):
        return bool(xs[j] >> i & 1) or (i > 0 and bool(ss[j] >> (i - 1) & 1))

    start = (False, tuple([1] * k), tuple([0] * k), tuple(n["L"]), tuple([-1] * k))
    best = {start: 0.0}
    heap = [(0.0, 0, start)]
    tie = 0
    while heap:
        cost, _, state = heapq.heappop(heap)
        if cost > best.get(state, math.inf):
            continue
        turned, xs, ss, gs, fresh = state
        if turned and not any(gs):
            return cost
        now = held(turned, xs, ss, gs)
        moves = []
        if not turned and all(avail(xs, ss, j, n["L"][j]) for j in range(k)):
            grads = sum(n["g"][j][n["L"][j]] for j in range(k))
            peak = now + n["sT"] + max(n["foT"], grads + n["boT"])
            nx = tuple(xs[j] & ~(1 << n["L"][j]) for j in range(k))
            moves.append((peak, n["tT"], (True, nx, ss, gs, tuple([-1] * k))))
        for j in range(k):
            top = gs[j] - 1 if turned else n["L"][j] - 1  # last stage worth a forward
            for i in range(n["L"][j]):
                if turned and gs[j] == i + 1 and ss[j] >> i & 1 and avail(xs, ss, j, i):
                    peak = now + n["g"][j][i] + n["bo"][j][i]
                    nx, ns, ng, nf = list(xs), list(ss), list(gs), list(fresh)
                    nx[j] &= ~(1 << i)
                    ns[j] &= ~(1 << i)
                    ng[j] = i
                    nf[j] = -1
                    moves.append(
                        (peak, n["bt"][j][i], (True, tuple(nx), tuple(ns), tuple(ng), tuple(nf)))
                    )
                if i > top or not avail(xs, ss, j, i):
                    continue
                if not ss[j] >> i & 1:
                    ns, nf = list(ss), list(fresh)
                    ns[j] |= 1 << i
                    nf[j] = -1
                    peak = now + n["s"][j][i] + n["fo"][j][i]
                    moves.append((peak, n["ft"][j][i], (turned, xs, tuple(ns), gs, tuple(nf))))
                if not xs[j] >> (i + 1) & 1:
                    peak = now + n["x"][j][i + 1] + n["fo"][j][i]
                    nf = list(fresh)
                    nf[j] = i + 1
                    nx = list(xs)
                    nx[j] |= 1 << (i + 1)
                    moves.append((peak, n["ft"][j][i], (turned, tuple(nx), ss, gs, tuple(nf))))
                    if xs[j] >> i & 1 and fresh[j] == i:
                        nx2 = list(nx)
                        nx2[j] &= ~(1 << i)
                        moves.append((peak, n["ft"][j][i], (turned, tuple(nx2), ss, gs, tuple(nf))))
                    elif not xs[j] >> i & 1:  # F_n reading x[i] inside s[i-1] frees nothing
                        pass
        for peak, step, nxt in moves:
            if peak > memory:
                continue
            new = cost + step
            if new < best.get(nxt, math.inf):
                best[nxt] = new
                tie += 1
                heapq.heappush(heap, (new, tie, nxt))
    return math.inf
