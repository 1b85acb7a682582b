"""Feasibility first (NOTE [ pipeline feasibility first ]): plans below PipeDream's least memory.

Stashes (activations) of ``(2, 4, 2)`` kB on 2 GPUs: every contiguous allocation puts the 4 kB
stash with a 2 kB one, a GPU holding ``{0, 2}`` and one holding ``{1}`` needs less: the
activation analogue of Lemma 2 (whose weights test is in test_pipeline.py).
"""

from __future__ import annotations

import itertools

import pytest

import memplan
from memplan.algorithms.pipeline.feasible import least_memory_plan, one_in_flight
from memplan.algorithms.pipeline.model import PipelineInstance
from memplan.algorithms.pipeline.pipedream import solve_pipedream
from memplan.algorithms.pipeline.plan import evaluate

KB = 1000


def stash_chain(saved, out=100, work=(1.0, 1.0, 1.0)) -> dict:
    return {
        "format": "memplan-profile/1",
        "model": "toy-stash",
        "batch_size": 1,
        "input_size": 0,
        "stages": [
            {
                "name": f"s{k}",
                "forward_time": w / 2,
                "backward_time": w / 2,
                "output_size": out,
                "saved_size": s,
                "weight_size": 0,
            }
            for k, (s, w) in enumerate(zip(saved, work, strict=True))
        ],
    }


def test_one_in_flight_runs_the_chain_in_sequence():
    """All shifts 0 on a non-contiguous allocation: the period is the whole chain plus transfers."""
    prof = memplan.load_profile(stash_chain([2 * KB, 4 * KB, 2 * KB]))
    inst = PipelineInstance.from_profile(prof, 2, 1e6)  # 1 MB/s: 100 bytes take 0.1 ms
    plan = one_in_flight(inst, [0, 1, 0])
    assert plan is not None
    transfers = 4 * 0.1  # x[1], x[2], g[2], g[1]
    assert plan.period == pytest.approx(3.0 + transfers)
    result = evaluate(prof, inst, plan)
    assert result.valid, result.violation


def test_feasibility_first_fits_where_pipedream_has_none():
    prof = memplan.load_profile(stash_chain([2 * KB, 4 * KB, 2 * KB]))
    inst = PipelineInstance.from_profile(prof, 2, None)
    plan, peaks, least = least_memory_plan(prof, inst, None)
    assert plan is not None and least == max(peaks)
    assert plan.assignment in ([0, 1, 0], [1, 0, 1])
    # brute force over every allocation's one-in-flight plan: none needs less
    every = []
    for assignment in itertools.product(range(2), repeat=3):
        other = one_in_flight(inst, list(assignment))
        assert other is not None
        every.append(evaluate(prof, inst, other).peak_memory)
    assert least == min(every)
    # PipeDream's least simulated peak (every candidate) is above it: it has no plan there
    _, _, pd_least = solve_pipedream(prof, inst, least)
    assert pd_least > least
    assert not memplan.solve(prof, "pipedream", least, gpus=2).feasible
    ilp = memplan.solve(prof, "pipeline-ilp", least, gpus=2, time_limit=5)
    assert ilp.feasible  # replayed by memplan.solve's simulator within the budget
    assert ilp.peak_memory <= least
    assert ilp.assignment in ([0, 1, 0], [1, 0, 1])
    check = memplan.simulate(prof, ilp)
    assert check.valid and check.peak_memory == ilp.peak_memory
