"""pofo's Theorem 1 DP in the compiled core (src/pofo_fractional.cpp) against its numpy references
(tests/oracles/pofo_forward.py), with and without a bound, a window and a bandwidth: the same
backward tables and choices, entry for entry; the same states for every segment and input kind,
the same decision for every state and the same value, bit for bit; and a time limit stops it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import memplan.api
from memplan.algorithms.chain import ChainInstance
from memplan.algorithms.combined.fractional import FractionalDP
from memplan.algorithms.timeline import Deadline, TimeLimitReached
from memplan.profile.synthetic import random_chain
from tests.oracles.pofo_forward import ForwardReference


def _budget(prof, fraction: float) -> int:
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["chain"], desc["store_all_memory"]
    return round(low + (high - low) * fraction)


def _compare(dp: FractionalDP) -> float:
    """Run both DPs on ``dp``; assert that they agree entry for entry and state for state."""
    reference = ForwardReference(dp)
    reference._backward_tables()
    dp._backward_tables()
    for name in ("near", "near_choice", "last", "last_choice"):
        np.testing.assert_array_equal(getattr(dp, name), getattr(reference, name), err_msg=name)
    reference._forward_tables()
    dp._forward_tables()
    assert dp.value == reference.value
    assert dp.evaluated == reference.evaluated
    for a in range(dp.L):
        for kind in (0, 1):
            mine, theirs = dp.states[a][kind], reference.states[a][kind]
            assert (mine is None) == (theirs is None), (a, kind)
            if mine is None:
                continue
            np.testing.assert_array_equal(mine, theirs)
            np.testing.assert_array_equal(dp.choice[a][kind], reference.choice[a][kind])
    return dp.value


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fraction", [0.05, 0.3])
@pytest.mark.parametrize("rate", [0.0, 1.2e9, 12e9])
def test_every_state_and_decision_as_the_reference(seed, fraction, rate):
    prof = random_chain(8 + 3 * seed, seed=seed, max_size=10**8)
    chain = ChainInstance.from_profile(prof)
    memory = _budget(prof, fraction)
    for window in (None, 3):
        for nearest in (False, True):
            dp = FractionalDP(
                chain, memory, rate, 24 + 8 * seed, nearest=nearest, margin=1, window=window
            )
            _compare(dp)


@pytest.mark.parametrize(
    "seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3]
)
def test_bounded_search_as_the_reference(seed):
    """NOTE [ pofo pruning ]: the states within a bound (after the beam search) and their
    decisions are the reference's, and the value too (inf when the bound is below it)."""
    prof = random_chain(20 + 5 * seed, seed=seed, max_size=10**8)
    chain = ChainInstance.from_profile(prof)
    memory = _budget(prof, 0.1)
    full = FractionalDP(chain, memory, 12e9, 50, nearest=True, margin=1, window=6).solve()
    assert full < math.inf
    for bound in (full * 1.05, full * (1 + 1e-4), full * 0.99):
        dp = FractionalDP(chain, memory, 12e9, 50, nearest=True, margin=1, window=6, bound=bound)
        value = _compare(dp)
        if bound >= full:
            assert value == pytest.approx(full, rel=1e-6)


def test_a_passed_deadline_stops_the_forward_phase():
    prof = random_chain(30, seed=1, max_size=10**8)
    chain = ChainInstance.from_profile(prof)
    dp = FractionalDP(chain, _budget(prof, 0.1), 12e9, 50)
    dp._backward_tables()
    dp.deadline = Deadline.after(0.0)
    with pytest.raises(TimeLimitReached):
        dp._forward_tables()
