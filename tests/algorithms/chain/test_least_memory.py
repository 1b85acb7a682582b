"""The least memory of a chain (NOTE [ least memory ]): its bounds, exactness, and huge sizes."""

from __future__ import annotations

import pytest

import memplan
from memplan.algorithms.chain import ChainInstance, chain_min_memory
from memplan.algorithms.chain.least_memory import (
    least_memory_bounds,
    least_memory_plan,
    recompute_all_sequence,
)
from memplan.algorithms.offload.model import OffloadInstance
from memplan.profile.model import Device, Profile, Stage
from memplan.profile.synthetic import random_chain
from tests.oracles.exhaustive import ChainOracle


@pytest.mark.parametrize("max_size", [3, 10, 1000])
@pytest.mark.parametrize("length", [1, 2, 3, 5, 8, 13, 30])
def test_bounds_bracket_the_least_memory(length, max_size):
    for seed in range(12):
        chain = ChainInstance.from_profile(random_chain(length, seed=seed, max_size=max_size))
        lower, upper = least_memory_bounds(chain)
        least, plan = least_memory_plan(chain)
        assert lower <= least <= upper
        assert chain.peak(plan) == least
        assert chain.peak(recompute_all_sequence(chain)) == upper
        assert chain_min_memory(chain) == least


@pytest.mark.parametrize("seed", range(40))
def test_least_memory_is_the_oracles(seed):
    length = 1 + seed % 5
    prof = random_chain(length, seed=seed, max_size=10 if seed % 2 else 1000)
    assert (
        chain_min_memory(ChainInstance.from_profile(prof))
        == ChainOracle(prof).min_feasible_memory()
    )


def test_a_chain_where_the_bounds_differ():
    """Found by search: the recompute-all plan runs F_all 0 while g[1] (671 bytes) is held; the
    least-memory plan runs it first, while only the loss gradient is held."""
    chain = ChainInstance.from_profile(random_chain(2, seed=5, max_size=1000))
    lower, upper = least_memory_bounds(chain)
    assert lower < upper
    assert chain_min_memory(chain) == lower == least_memory_plan(chain)[0]


def test_long_chains_take_the_linear_path():
    """On 2000 random stages the bounds meet: ``memplan info`` needs no cubic DP."""
    chain = ChainInstance.from_profile(random_chain(2000, seed=1, max_size=1000))
    lower, upper = least_memory_bounds(chain)
    assert lower == upper == chain_min_memory(chain)


def test_9000_stages_of_a_petabyte_stay_exact():
    """Issue 17 item 5: sums of 9000 sizes of 2**50 bytes pass 2**63; Python ints keep them exact."""
    size = 2**50
    stages = [
        Stage(name=f"s{k}", forward_time=1.0, backward_time=1.0, output_size=size, saved_size=size)
        for k in range(9000)
    ]
    prof = Profile(model="huge", device=Device(kind="synthetic"), input_size=size, stages=stages)
    desc = memplan.api.describe(prof, "none")
    # store-all: x[0] and every s held at the last backward, with g[L] and g[L-1]
    assert desc["store_all_memory"] == size + 9000 * size + 2 * size
    # least memory: x[0], x[k] (input of B k), s[k], g[k+1], g[k]
    assert desc["min_memory"]["chain"] == 5 * size
    assert desc["offload_peak"] == OffloadInstance.from_profile(prof, 1.0).peak()
    assert desc["offload_peak"] == size + 9000 * size + 2 * size
    assert desc["store_all_memory"] > 2**63
