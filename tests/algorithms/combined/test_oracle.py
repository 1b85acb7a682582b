"""The combined oracle (tests/oracles/combined.py) against the chain oracle and the simulator.

* With a negligible bandwidth no transfer can help: its optimum is the persistent chain optimum.
* Every schedule it returns replays valid, within budget, with the same makespan, in the combined
  simulator (an independent check of both).
* With transfers it is never slower than without, and reaches the lower bound with enough memory.
"""

from __future__ import annotations

import pytest

from memplan.profile.model import Profile
from memplan.simulator import simulate_combined
from tests.oracles.combined import CombinedOracle
from tests.oracles.exhaustive import ChainOracle
from tests.strategies import integer_chain

RATE = 1000.0  # one byte per ms


def tiny(seed: int, length: int = 3) -> Profile:
    return integer_chain(seed, length, max_output=4, max_extra=4, max_input=3, model="tiny")


@pytest.mark.parametrize("seed", range(6))
def test_no_bandwidth_is_the_chain_optimum(seed):
    prof = tiny(seed)
    chain = ChainOracle(prof)
    least = chain.min_feasible_memory()
    slow = CombinedOracle(prof, bandwidth=1e-6)
    for memory in range(least - 1, least + 8):
        ref = chain.optimal_makespan(memory)
        got = slow.solve(memory)
        if ref is None:  # only a (very slow) transfer can make it fit
            assert got is None or got[0] > 1e6
        else:
            assert got is not None and got[0] == pytest.approx(ref[0])


@pytest.mark.parametrize("seed", range(4))
def test_oracle_schedules_replay(seed):
    prof = tiny(seed)
    oracle = CombinedOracle(prof, RATE)
    chain = ChainOracle(prof)
    least = chain.min_feasible_memory()
    lower = sum(st.forward_time + st.backward_time for st in prof.stages)
    for memory in range(least - 3, least + 6, 2):
        got = oracle.solve(memory)
        ref = chain.optimal_makespan(memory)
        if ref is not None:
            assert got is not None and got[0] <= ref[0] + 1e-9
        if got is None:
            continue
        value, ops = got
        assert value >= lower - 1e-9
        result = simulate_combined(prof, ops, memory=memory, bandwidth=RATE)
        assert result.valid, (result.violation, ops)
        assert result.makespan == pytest.approx(value)
        assert result.peak_memory <= memory
