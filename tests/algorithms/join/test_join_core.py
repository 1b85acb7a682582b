"""The chain-model join DPs in the compiled core (src/join_fill.cpp) against their numpy
references (tests/oracles/join_table.py), on one to three branches: the same states, the same
value and the same decision at every state and every budget, bit for bit; the same least memory
and least-memory plan; and a time limit stops the DP.
"""

from __future__ import annotations

import numpy as np
import pytest

import memplan.api
from memplan.algorithms.join.hetero import HeteroJoin, JoinNet, least_memory_plan
from memplan.algorithms.timeline import Deadline, TimeLimitReached
from memplan.profile.synthetic import random_join
from tests.oracles.join_table import ReferenceJoinTables, reference_least_memory


@pytest.mark.parametrize(
    ("lengths", "seed", "slots"),
    [((6,), 0, 40), ((5, 7), 1, 60), ((9, 4), 2, 30), ((3, 4, 2), 3, 25), ((12, 12), 4, 80)],
)
def test_every_value_and_decision_as_the_reference(lengths, seed, slots):
    prof = random_join(list(lengths), seed=seed, max_size=10**6)
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["join"], desc["store_all_memory"]
    for fraction in (0.0, 0.3, 0.7):
        budget = round(low + (high - low) * fraction)
        capacity, rounded = JoinNet.from_profile(prof).rounded(budget, slots)
        mine = HeteroJoin(rounded, capacity)
        theirs = ReferenceJoinTables(rounded, capacity)
        np.testing.assert_array_equal(mine.row, theirs.row)
        np.testing.assert_array_equal(mine.value, theirs.value)
        np.testing.assert_array_equal(mine.branch, theirs.branch)
        np.testing.assert_array_equal(mine.target, theirs.target)


def test_a_passed_deadline_stops_the_join_dp():
    prof = random_join([30, 30], seed=1, max_size=10**6)
    capacity, rounded = JoinNet.from_profile(prof).rounded(10**7, 200)
    with pytest.raises(TimeLimitReached):
        HeteroJoin(rounded, capacity, Deadline.after(0.0))


@pytest.mark.parametrize(
    ("lengths", "seed"), [((6,), 0), ((5, 7), 1), ((9, 4), 2), ((3, 4, 2), 3), ((15, 11), 4)]
)
def test_least_memory_as_the_reference(lengths, seed):
    """The least memory of a canonical plan and the plan reaching it: the reference's."""
    for max_size in (6, 10**6):
        net = JoinNet.from_profile(random_join(list(lengths), seed=seed, max_size=max_size))
        assert least_memory_plan(net) == reference_least_memory(net)
