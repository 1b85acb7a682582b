"""``periodic``: equal segments, as ``torch.utils.checkpoint.checkpoint_sequential`` does.

Chen et al. (2016), *Training deep nets with sublinear memory cost*: cut the chain into ``k``
segments; the forward keeps only each segment's input (``F_ck`` on its first stage, ``F_n`` on the
others) except for the last segment, which runs with ``F_all``; the backward recomputes one
segment at a time with ``F_all`` and runs its backwards. Segments are cut as
``checkpoint_sequential`` cuts them: ``len // k`` stages each, the last one taking the rest.
Every ``k`` from 1 (store-all) to L is tried and the fastest plan that fits is returned.
"""

from __future__ import annotations

from memplan.algorithms.base import ChainPlan, Sequence
from memplan.algorithms.chain.problem import Chain, fastest_fitting


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


def solve_periodic(chain: Chain, memory: int) -> ChainPlan:
    """Fastest equal-segment plan within ``memory`` activation bytes."""
    L = chain.length
    candidates = ((k, periodic_sequence(L, k)) for k in range(1, L + 1))
    plan, segments = fastest_fitting(chain, memory, candidates, "periodic")
    plan.message = "no segment count fits" if segments is None else f"{segments} segments"
    return plan
