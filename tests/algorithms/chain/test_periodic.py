"""``periodic`` in closed form (NOTE [ periodic in closed form ]) against laying out every plan.

* For every segment count ``k``, the closed-form peak is :meth:`ChainInstance.peak` of the plan laid out by
  :func:`periodic_sequence` and the closed-form makespan its :meth:`ChainInstance.makespan`, on random
  chains, with int64 sums and with Python integers (sizes adding up beyond ``2**62``).
* :func:`solve_periodic` returns the plan that the search over every laid-out plan returns (the
  fastest that fits, the fewest segments on ties), at budgets across the range.
"""

from __future__ import annotations

import pytest

from memplan.algorithms.chain import ChainInstance
from memplan.algorithms.chain import periodic as periodic_module
from memplan.algorithms.chain.periodic import periodic_figures, periodic_sequence, solve_periodic
from memplan.algorithms.chain.problem import fastest_fitting
from memplan.profile.synthetic import random_chain
from tests.strategies import integer_chain


def sample_chain(seed: int) -> ChainInstance:
    length = 1 + seed % 23
    if seed % 2:
        return ChainInstance.from_profile(random_chain(length, seed=seed, max_size=50))
    prof = integer_chain(seed, length, max_output=9, max_extra=9, max_input=9, model="periodic")
    return ChainInstance.from_profile(prof)


@pytest.mark.parametrize("python_ints", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_closed_form_is_the_laid_out_plan(seed, python_ints, monkeypatch):
    if python_ints:
        monkeypatch.setattr(periodic_module, "INT64_SAFE", 0)
    chain = sample_chain(seed)
    times, peaks = periodic_figures(chain)
    for k in range(1, chain.length + 1):
        sequence = periodic_sequence(chain.length, k)
        assert peaks[k - 1] == chain.peak(sequence), k
        assert times[k - 1] == pytest.approx(chain.makespan(sequence), rel=1e-12), k


@pytest.mark.parametrize("seed", range(40))
def test_same_plan_as_the_layout_search(seed):
    chain = sample_chain(seed)
    L = chain.length
    low, high = chain.store_all_peak() // 3, chain.store_all_peak() + 1
    for memory in range(low, high + 1, max(1, (high - low) // 9)):
        candidates = ((k, periodic_sequence(L, k)) for k in range(1, L + 1))
        expected, _ = fastest_fitting(chain, memory, candidates, "periodic")
        got = solve_periodic(chain, memory)
        assert got.sequence == expected.sequence, memory
        assert got.min_memory == expected.min_memory
        assert got.claimed_makespan == expected.claimed_makespan
