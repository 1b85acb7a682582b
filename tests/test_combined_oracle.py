"""The combined oracle (tests/oracles/combined.py) against the chain oracle and the simulator.

* With a negligible bandwidth no transfer can help: its optimum is the persistent chain optimum.
* Every schedule it returns replays valid, within budget, with the same makespan, in the combined
  simulator (an independent check of both).
* With transfers it is never slower than without, and reaches the lower bound with enough memory.
"""

from __future__ import annotations

import random

import pytest

from memplan.profile.model import Profile, Stage
from memplan.simulator import simulate_combined
from tests.oracles.combined import CombinedOracle
from tests.oracles.exhaustive import ChainOracle

RATE = 1000.0  # one byte per ms


def tiny(seed: int, length: int = 3) -> Profile:
    rng = random.Random(seed)
    stages = []
    for k in range(length):
        out = rng.randint(1, 4)
        stages.append(
            Stage(
                name=f"s{k}",
                forward_time=float(rng.randint(1, 4)),
                backward_time=float(rng.randint(1, 6)),
                output_size=out,
                saved_size=out + rng.randint(0, 4),
                forward_overhead=rng.randint(0, 1),
                backward_overhead=rng.randint(0, 1),
            )
        )
    return Profile(model="tiny", input_size=rng.randint(1, 3), stages=stages)


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
