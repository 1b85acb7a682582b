"""``periodic``: equal segments, as ``torch.utils.checkpoint.checkpoint_sequential`` does.

Chen et al. (2016), *Training deep nets with sublinear memory cost*: cut the chain into ``k``
segments; the forward keeps only each segment's input (``F_ck`` on its first stage, ``F_n`` on the
others) except for the last segment, which runs with ``F_all``; the backward recomputes one
segment at a time with ``F_all`` and runs its backwards. Segments are cut as
``checkpoint_sequential`` cuts them: ``len // k`` stages each, the last one taking the rest.
Every ``k`` from 1 (store-all) to L is tried and the fastest plan that fits is returned.

NOTE [ periodic in closed form ]
--------------------------------
The makespan and the peak of the plan with ``k`` segments are read from prefix sums and range
maxima instead of laying out and replaying its ``O(L)`` operations for each ``k`` (``O(L^2)``:
minutes at 10,000 stages). With ``S[j] = s[0] + .. + s[j-1]`` and, for segment ``i`` over stages
``f_i .. l_i`` with ``X_i = x[0] + x[f_1] + .. + x[f_i]`` (the checkpoints held when it starts):

* makespan: every forward once, every backward once, and the forwards of the first ``k - 1``
  segments again: ``sum ft + sum bt + (ft[0] + .. + ft[f_{k-1} - 1])``;
* the forward of segment ``i < k - 1`` (``F_ck f``, ``F_n f+1 .. l``, each ``F_n`` freeing the
  activation before it): ``X_i + g[L] + max(x[f+1] + fo[f], max_{f<j<=l} x[j] + x[j+1] + fo[j])``;
* ``F_all j`` of segment ``i``, run with ``s[f..j-1]`` and the gradient ``G`` (``g[L]`` for the
  last segment, ``g[l+1]`` for the others) held: ``X_i + G - S[f] + max_{f<=j<=l} S[j+1] + fo[j]``;
* ``B j`` of segment ``i``, with ``s[f..j]`` and ``g[j+1]`` held:
  ``X_i - S[f] + max_{f<=j<=l} S[j+1] + g[j+1] + g[j] + bo[j]``;

and ``x[0] + g[L]`` before anything runs (under the training loop's terms, NOTE [ training-loop
memory terms ], each plan is laid out and replayed by :meth:`ChainInstance.peak` instead). These are
:meth:`ChainInstance.peak`'s rules (the tests compare
every ``k`` with it). Every ``k`` with the same ``size = L // k`` cuts the same leading segments, so
their figures are computed once per size (``O(sqrt(L))`` sizes, ``L / size`` segments each, range
maxima from sparse tables) and each ``k`` takes a prefix maximum of them and its last segment, a
suffix: ``O(L log L)`` in all (20 ms at 10,000 stages, against 248 s of CPU for laying out every
plan). Sums are int64 when the chain's bytes add up below ``2**62``, Python integers otherwise.
Candidates whose makespans are within a relative 1e-9 of the best are laid out and timed as
before (the same floating-point sum in the plan's order), so the plan chosen is the one the
layout-and-replay search chose.
"""

from __future__ import annotations

import numpy as np

from memplan.algorithms.base import ChainPlan, Sequence
from memplan.algorithms.chain.problem import ChainInstance

INT64_SAFE = 2**62
_NEAR = 1e-9


def segment_bounds(length: int, segments: int) -> list[tuple[int, int]]:
    """``[(first, last), ...]`` stage ranges as ``checkpoint_sequential`` cuts them."""
    size = length // segments
    bounds = [(i * size, (i + 1) * size - 1) for i in range(segments - 1)]
    bounds.append(((segments - 1) * size, length - 1))
    return bounds


def periodic_sequence(length: int, segments: int) -> Sequence:
    """The plan with ``segments`` equal segments (1 = store-all)."""
    if not 1 <= segments <= length:
        raise ValueError(f"segments must be in 1..{length}")
    bounds = segment_bounds(length, segments)
    sequence: Sequence = []
    for first, last in bounds[:-1]:
        sequence.append(("F_ck", first))
        sequence += [("F_n", k) for k in range(first + 1, last + 1)]
    first, last = bounds[-1]
    sequence += [("F_all", k) for k in range(first, last + 1)]
    sequence += [("B", k) for k in range(last, first - 1, -1)]
    for first, last in reversed(bounds[:-1]):
        sequence += [("F_all", k) for k in range(first, last + 1)]
        sequence += [("B", k) for k in range(last, first - 1, -1)]
    return sequence


class _RangeMax:
    """Maxima of ``values`` over index ranges ``[lo, lo + width - 1]`` (a sparse table)."""

    def __init__(self, values: np.ndarray) -> None:
        self.levels = [values]
        width = 1
        while 2 * width <= len(values):
            last = self.levels[-1]
            self.levels.append(np.maximum(last[:-width], last[width:]))
            width *= 2

    def windows(self, lo: np.ndarray, width: int) -> np.ndarray:
        """``max(values[lo[i] .. lo[i] + width - 1])`` for each ``i``."""
        level = width.bit_length() - 1
        table = self.levels[level]
        out: np.ndarray = np.maximum(table[lo], table[lo + width - (1 << level)])
        return out


def _suffix_max(values: np.ndarray) -> np.ndarray:
    """``out[j] = max(values[j:])``."""
    out: np.ndarray = np.maximum.accumulate(values[::-1])[::-1]
    return out


def periodic_figures(chain: ChainInstance) -> tuple[list[float], list[int]]:
    """Makespan (ms, in closed form) and peak (bytes) of the plan with ``k`` segments, for ``k``
    from 1 to L (NOTE [ periodic in closed form ]).
    """
    L = chain.length
    if chain.has_terms:  # the training loop's terms: each plan laid out and replayed (O(L^2))
        sequences = [periodic_sequence(L, k) for k in range(1, L + 1)]
        replayed = [chain.peak(seq) for seq in sequences]
        assert all(p is not None for p in replayed)  # periodic plans are valid
        return [chain.makespan(seq) for seq in sequences], [int(p or 0) for p in replayed]
    exact = chain.total_bytes < INT64_SAFE

    def ints(values: np.ndarray) -> np.ndarray:
        return values.astype(np.int64) if exact else np.array(values.tolist(), dtype=object)

    x, s, g, fo, bo = (ints(v) for v in (chain.x, chain.s, chain.g, chain.fo, chain.bo))
    S = np.concatenate((ints(np.zeros(1, dtype=np.int64)), np.cumsum(s)))  # S[j] = s[0..j-1]
    A = S[1:] + fo  # F_all j: S[j+1] + fo[j]
    C = S[1:] + g[1:] + g[:-1] + bo  # B j: S[j+1] + g[j+1] + g[j] + bo[j]
    P = x[:-1] + x[1:] + fo  # F_n j: x[j] + x[j+1] + fo[j]
    range_a, range_c, range_p = _RangeMax(A), _RangeMax(C), _RangeMax(P)
    last_a, last_c = _suffix_max(A), _suffix_max(C)  # the last segment runs to stage L - 1
    ft_prefix = np.concatenate(([0.0], np.cumsum(chain.ft))).tolist()
    base_time = float(chain.ft.sum() + chain.bt.sum())
    start = int(x[0] + g[L])
    times: list[float] = [0.0] * L
    peaks: list[int] = [0] * L
    low = 1
    while low <= L:
        size = L // low
        top = L // size  # every k from low to top cuts segments of `size` stages
        # The segments that are not the last: i = 0 .. top - 2 (stages i * size .. + size - 1).
        first = np.arange(top, dtype=np.int64) * size
        held = np.cumsum(x[first])  # X_i: x[0] and the checkpoints x[f_1] .. x[f_i]
        whole = first[:-1]
        X = held[:-1]
        head = x[whole + 1] + fo[whole]
        chained = range_p.windows(whole + 1, size - 1) if size > 1 else head
        own = np.maximum.reduce(
            [
                X + g[L] + np.maximum(head, chained),  # F_ck, F_n: the forward
                X + g[whole + size] - S[whole] + range_a.windows(whole, size),  # F_all again
                X - S[whole] + range_c.windows(whole, size),  # the backwards
            ]
        )
        before = np.maximum.accumulate(own).tolist() if len(own) else []
        held_list = held.tolist()
        for k in range(low, top + 1):
            f = (k - 1) * size
            X_last = held_list[k - 1]
            peak = max(
                start,
                int(X_last + g[L] - S[f] + last_a[f]),
                int(X_last - S[f] + last_c[f]),
            )
            if k > 1:
                peak = max(peak, int(before[k - 2]))
            times[k - 1] = base_time + ft_prefix[f]
            peaks[k - 1] = peak
        low = top + 1
    return times, peaks


def solve_periodic(chain: ChainInstance, memory: int) -> ChainPlan:
    """Fastest equal-segment plan within ``memory`` activation bytes."""
    L = chain.length
    times, peaks = periodic_figures(chain)
    least = min(peaks)
    fitting = [k for k in range(1, L + 1) if peaks[k - 1] <= memory]
    if not fitting:
        return ChainPlan(None, "infeasible", min_memory=least, message="no segment count fits")
    fastest = min(times[k - 1] for k in fitting)
    best: tuple[float, int, Sequence] | None = None
    for k in fitting:  # the near-fastest, timed as the plan runs (the first on ties)
        if times[k - 1] <= fastest + _NEAR * max(1.0, abs(fastest)):
            sequence = periodic_sequence(L, k)
            time = chain.makespan(sequence)
            if best is None or time < best[0]:
                best = (time, k, sequence)
    assert best is not None
    time, segments, sequence = best
    return ChainPlan(sequence, "feasible", time, least, message=f"{segments} segments")
