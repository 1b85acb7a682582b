"""The least memory with which a chain can be trained at all, exact in bytes (``memplan info``).

NOTE [ least memory ]
The least activation memory of any plan of the model (docs/model.md, persistent plans) is bracketed
in O(L), in exact integers (Python ints: no int64 overflow, whatever the sizes), by

* a **lower bound** that every plan pays: with ``x[0]`` held throughout, ``B k`` holds the input of
  stage k (``x[k]`` or ``s[k-1]``, at least ``av[k] = min(x[k], s[k-1])``), ``s[k]``, ``g[k+1]``
  and adds ``g[k]`` and its overhead: ``x[0] + av[k] + own[k]``, ``own[k] = g[k+1] + s[k] + g[k] +
  bo[k]``. ``F_all k`` must run before ``B k``: either while ``g[k+1]`` is held (``x[0] + av[k] +
  g[k+1] + s[k] + fo[k]``), or earlier, while some ``g[c+1]``, ``c > k``, is held, and then ``s[k]``
  stays until ``B k``, so through ``B k+1`` too (the larger of ``x[0] + av[k] + s[k] + fo[k] +
  min_{c>k} g[c+1]`` and ``x[0] + s[k] + own[k+1]``). The bound is the largest of these over k.
* an **upper bound**, the peak of the plan that recomputes everything from ``x[0]``: for each
  ``k = L-1 .. 0``, ``F_ck 0, F_n 1 .. F_n k-1, F_all k, B k``.

When the two meet (every bundled profile, and every random chain of 20 to 120 stages tried; a few
percent of random chains of 2 to 12 stages do not), that is the least memory and the recompute-all
plan reaches it, in O(L) time: ``memplan info`` on 2000 stages takes milliseconds. Otherwise the
least memory is found by the dynamic program of :func:`least_memory_plan`, O(L^3) time and O(L^2)
memory, in int64 when every sum of sizes fits in it and in Python ints otherwise.
"""

from __future__ import annotations

import numpy as np

from memplan.algorithms.base import Sequence
from memplan.algorithms.chain.problem import ChainInstance

_F_ALL = -1
INT64_SAFE = 2**62
"""Sums of sizes below this stay exact in int64 (with room for one more addition)."""


def least_memory_bounds(chain: ChainInstance) -> tuple[int, int]:
    """``(lower, upper)`` bounds of the least activation memory (bytes, ``x[0]`` included).

    ``upper`` is the peak of :func:`recompute_all_sequence`; see NOTE [ least memory ]. Under the
    training loop's terms (weight gradients created by the backwards, frees) the lower bound is
    only ``x[0]``, so that :func:`least_memory_plan` decides.
    """
    x, s, g, fo, bo = (a.tolist() for a in (chain.x, chain.s, chain.g, chain.fo, chain.bo))
    L = chain.length
    x0 = x[0]
    if chain.has_terms:
        upper = chain.peak(recompute_all_sequence(chain))
        assert upper is not None  # the recompute-all plan is valid in every chain
        return x0, upper
    own = [g[k + 1] + s[k] + g[k] + bo[k] for k in range(L)]
    least_later_gradient = [0] * L  # min over c > k of g[c+1] (unused for k = L - 1)
    smallest = g[L]
    for k in range(L - 2, -1, -1):
        smallest = min(smallest, g[k + 2])
        least_later_gradient[k] = smallest
    lower = x0 + g[L]
    upper = x0 + g[L]
    transient = 0  # largest F_ck 0 / F_n i transient (without x[0] and the gradient) before k
    for k in range(L):
        av = min(x[k], s[k - 1]) if k > 0 else 0
        forward_now = x0 + av + g[k + 1] + s[k] + fo[k]
        if k < L - 1:
            earlier = x0 + max(av + s[k] + fo[k] + least_later_gradient[k], s[k] + own[k + 1])
            forward_now = min(forward_now, earlier)
        lower = max(lower, x0 + av + own[k], forward_now)
        held_input = x[k] if k > 0 else 0
        upper = max(
            upper,
            x0 + held_input + g[k + 1] + s[k] + fo[k],
            x0 + held_input + own[k],
            x0 + g[k + 1] + transient if k > 0 else 0,
        )
        transient = max(transient, x[k + 1] + fo[k] + (x[k] if k > 0 else 0))
    return lower, upper


def recompute_all_sequence(chain: ChainInstance) -> Sequence:
    """For each stage from the last: recompute its input from ``x[0]``, then ``F_all k, B k``."""
    sequence: Sequence = []
    for k in reversed(range(chain.length)):
        if k > 0:
            sequence.append(("F_ck", 0))
            sequence += [("F_n", i) for i in range(1, k)]
        sequence += [("F_all", k), ("B", k)]
    return sequence


def chain_min_memory(chain: ChainInstance) -> int:
    """The least activation memory (bytes, ``x[0]`` included) with which any plan exists (exact)."""
    lower, upper = least_memory_bounds(chain)
    if lower == upper:
        return lower
    return least_memory_plan(chain)[0]


def least_memory_plan(chain: ChainInstance) -> tuple[int, Sequence]:
    """The exact least memory and a plan reaching it, the fastest such plan of the recurrences.

    ``need[a][b]`` is the least memory (beyond ``x[a]``) to run stages ``a..b`` with ``g[b+1]``
    held, by the recurrences of NOTE [ rotor recurrences ] (rotor.py) with memory in place of
    time; ties are broken by time. Sub-chains of equal length are independent: one diagonal at a
    time, vectorized. O(L^3) time, O(L^2) memory.
    """
    need, pick = least_memory_tables(chain)
    return int(chain.x[0]) + int(need[0, chain.length - 1]), least_memory_sequence(
        pick, 0, chain.length - 1
    )


def least_memory_tables(chain: ChainInstance) -> tuple[np.ndarray, np.ndarray]:
    """``need[a, b]`` of :func:`least_memory_plan` for every sub-chain ``a..b`` (beyond ``x[a]``,
    ``g[b+1]`` held), and the choice reaching it, ``pick[a, b]`` (for
    :func:`least_memory_sequence`): the least memory of stages ``a..b`` alone is ``x[a] +
    need[a, b]``, with the plan of the sub-chain.
    """
    L = chain.length
    exact_int64 = chain.total_bytes < INT64_SAFE
    dtype = np.int64 if exact_int64 else object
    x, s, g, fo, bo = (a.astype(dtype) for a in (chain.x, chain.s, chain.g, chain.fo, chain.bo))
    fa, wh, fr = (a.astype(dtype) for a in (chain.fall, chain.held_grads, chain.freed))
    pair = x[:-1] + x[1:] + fo
    # The rules of the DPs (ChainRules, src/rotor.hpp): the gradients held during a sub-chain
    # ending at b, what B a needs besides x[a], what F_all a takes from the rest.
    held_grads = g[1:] + wh[1:]
    own_backward = g[1:] + s + g[:-1] + bo + wh[:-1] - fr
    held_after = s - fr
    fprefix = np.concatenate(([0.0], np.cumsum(chain.ft)))
    need = np.zeros((L, L), dtype=dtype)
    cost = np.zeros((L, L))
    pick = np.full((L, L), _F_ALL, dtype=np.int64)
    for d in range(L):
        a = np.arange(L - d)
        b = a + d
        # B a after F_all a+1 freed x[a+1] from s[a] (when a < b: ChainRules::backward_need)
        backward = own_backward[a] - (fr[np.minimum(a + 1, L - 1)] if d > 0 else 0)
        need_fa = np.maximum(held_grads[b] + s[a] + fa[a], backward)
        if d == 0:
            need[a, b], cost[a, b] = need_fa, chain.ft[a] + chain.bt[a]
            continue
        fa_need = np.maximum(need_fa, held_after[a] + need[a + 1, b])
        fa_cost = chain.ft[a] + chain.bt[a] + cost[a + 1, b]
        A, R = a[:, None], np.arange(d)[None, :]
        J, Bm = A + 1 + R, b[:, None]
        steps = pair[np.minimum(A + R, L - 1)]  # pair[a+r] for r >= 1
        steps[:, 0] = x[a + 1] + fo[a]
        fwd_need = held_grads[b][:, None] + np.maximum.accumulate(steps, axis=1)
        needs = np.maximum(np.maximum(fwd_need, x[J] + need[J, Bm]), need[A, J - 1])
        costs = fprefix[J] - fprefix[A] + cost[J, Bm] + cost[A, J - 1]
        low = needs.min(axis=1)
        r = np.where(needs == low[:, None], costs, np.inf).argmin(axis=1)
        ck_cost = costs[a, r]
        take = (low < fa_need) | ((low == fa_need) & (ck_cost < fa_cost))
        need[a, b] = np.where(take, low, fa_need)
        cost[a, b] = np.where(take, ck_cost, fa_cost)
        pick[a, b] = np.where(take, a + 1 + r, _F_ALL)
    return need, pick


def least_memory_sequence(pick: np.ndarray, first: int, last: int) -> Sequence:
    """The least-memory plan of stages ``first..last`` from :func:`least_memory_tables`'s
    choices (stage numbers of the whole chain).
    """
    sequence: Sequence = []
    stack: list[tuple[str, int, int]] = [("solve", first, last)]
    while stack:
        kind, a, b = stack.pop()
        if kind == "op":
            sequence.append(("B", a))
        elif a == b:
            sequence += [("F_all", a), ("B", a)]
        elif pick[a, b] == _F_ALL:
            sequence.append(("F_all", a))
            stack += [("op", a, a), ("solve", a + 1, b)]
        else:
            j = int(pick[a, b])
            sequence.append(("F_ck", a))
            sequence += [("F_n", k) for k in range(a + 1, j)]
            stack += [("solve", a, j - 1), ("solve", j, b)]
    return sequence
