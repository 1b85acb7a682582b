"""The offloading model of papers/004 on hand-computed chains: M_peak, LB, least memory, GREEDY.

The two-stage chain used here (bandwidth 1000 bytes/s, i.e. 1 byte/ms)::

    input 4 | stage 0: saved 6, output 3, fo 1, bo 2, 1 ms / 2 ms
            | stage 1 (loss): saved 5, output 1, fo 0, bo 3, 1 ms / 1 ms

gives a = [4, 6, 5], g = [0, 3, 1], eF = fo + g[2] = [2, 1] and
m_F = [4+6+2, 4+6+5+1] = [12, 16], m_B = [4+6+0+3+2, 15+3+1+3] = [15, 22].
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import memplan
import memplan.api
from memplan.algorithms.chain import ChainInstance
from memplan.algorithms.offload.greedy import greedy_set, solve_greedy
from memplan.algorithms.offload.lower_bound import lower_bound, peak_memory
from memplan.algorithms.offload.model import OffloadInstance, offload_mask
from memplan.algorithms.offload.nowait import no_wait_schedule
from memplan.profile.model import Profile, Stage
from memplan.profile.synthetic import random_chain

BYTE_PER_MS = 1000.0


@pytest.fixture
def tiny() -> Profile:
    return Profile(
        model="tiny",
        input_size=4,
        stages=[
            Stage(
                name="s0",
                forward_time=1.0,
                backward_time=2.0,
                output_size=3,
                saved_size=6,
                forward_overhead=1,
                backward_overhead=2,
            ),
            Stage(
                name="loss",
                forward_time=1.0,
                backward_time=1.0,
                output_size=1,
                saved_size=5,
                forward_overhead=0,
                backward_overhead=3,
            ),
        ],
    )


def test_mapping_from_the_profile(tiny):
    inst = OffloadInstance.from_profile(tiny, BYTE_PER_MS)
    assert inst.a.tolist() == [4, 6, 5]
    assert inst.g.tolist() == [0, 3, 1]
    assert inst.ef.tolist() == [2, 1]
    assert inst.beta == 1.0
    assert inst.compute_time == 5.0


def test_peak_and_needs_by_hand(tiny):
    inst = OffloadInstance.from_profile(tiny, BYTE_PER_MS)
    assert inst.forward_needs().tolist() == [12, 16]
    assert inst.backward_needs().tolist() == [15, 22]
    assert peak_memory(inst) == 22
    # F_1 needs a[1] + a[2] + eF[1] = 12, B_1 needs a[1] + a[2] + g[1] + g[2] + eB[1] = 18.
    assert inst.min_memory() == 18


def test_lower_bound_by_hand(tiny):
    inst = OffloadInstance.from_profile(tiny, BYTE_PER_MS)
    assert lower_bound(inst, 22) == 5.0  # nothing to offload: the compute time
    assert lower_bound(inst, 30) == 5.0
    assert lower_bound(inst, 20) == 5.0  # 2 * (22 - 20) / 1 = 4 < 5
    assert lower_bound(inst, 18) == 8.0  # 2 * (22 - 18) / 1
    fast = OffloadInstance.from_profile(tiny, 4 * BYTE_PER_MS)
    assert lower_bound(fast, 18) == 5.0  # 2 * 4 / 4 = 2 < 5


def test_peak_is_the_store_all_peak_of_the_chain_model():
    for seed in range(30):
        prof = random_chain(1 + seed % 7, seed=seed, max_size=50)
        inst = OffloadInstance.from_profile(prof, 1e9)
        assert peak_memory(inst) == ChainInstance.from_profile(prof).store_all_peak()


def test_greedy_set_is_the_smallest_covering_prefix(tiny):
    inst = OffloadInstance.from_profile(tiny, BYTE_PER_MS)
    assert greedy_set(inst, 22).tolist() == [False, False]  # fits without offloading
    assert greedy_set(inst, 20).tolist() == [True, False]  # excess 2 <= a[0] = 4
    assert greedy_set(inst, 18).tolist() == [True, False]  # excess 4 <= a[0]
    assert greedy_set(inst, 17).tolist() == [True, True]  # excess 5 > 4: a[0] and a[1]


def test_greedy_prefix_on_random_chains():
    for seed in range(40):
        prof = random_chain(2 + seed % 7, seed=seed, max_size=30)
        inst = OffloadInstance.from_profile(prof, 5000.0)
        low, high = inst.min_memory(), inst.peak()
        for memory in range(low, high + 1, max(1, (high - low) // 5)):
            mask = greedy_set(inst, memory)
            k = int(mask.sum())
            assert mask.tolist() == [True] * k + [False] * (inst.n - k)
            excess = high - memory
            covered = int(inst.a[:k].sum())
            if excess <= 0:
                assert k == 0
            elif covered >= excess:
                assert int(inst.a[: k - 1].sum()) < excess  # the smallest such prefix
            else:
                assert k == inst.n  # nothing covers: everything offloadable
            plan = solve_greedy(inst, memory)
            assert plan.offloaded == list(range(k))
            assert plan.ops is not None  # greedy runs whenever full offloading does


def test_no_wait_schedule_by_hand(tiny):
    """GREEDY at 20 bytes: offload a[0] during the forward, prefetch it at the end.

    Forward: offload x[0] over [0, 4]; F_0 [0, 1]; F_1 [1, 2] (16 bytes). Backward, as late as
    possible: B_1 needs 18 bytes, so the prefetch of x[0] (4 bytes) cannot overlap it (22 > 20);
    B_1 starts when x[0] has left the GPU (time 4, 2 ms of idle time), runs [4, 5], then the
    prefetch [5, 9], then B_0 [9, 11].
    """
    inst = OffloadInstance.from_profile(tiny, BYTE_PER_MS)
    schedule = no_wait_schedule(inst, offload_mask(2, [0]), 20)
    assert schedule is not None
    assert schedule.f_start == [0.0, 1.0] and schedule.f_end == [1.0, 2.0]
    assert schedule.offload == {0: (0.0, 4.0)}
    assert schedule.b_start == pytest.approx([9.0, 4.0])
    assert schedule.b_end == pytest.approx([11.0, 5.0])
    assert schedule.prefetch[0] == pytest.approx((5.0, 9.0))
    assert schedule.gap == pytest.approx(2.0)
    assert schedule.makespan == pytest.approx(11.0)
    ops = schedule.operations()
    assert ("offload", 0, 0.0, 4.0, "transfer", "x[0]") in ops


def test_no_wait_schedule_of_a_set_that_does_not_fit(tiny):
    inst = OffloadInstance.from_profile(tiny, BYTE_PER_MS)
    assert not inst.feasible(offload_mask(2, []), 21)
    assert no_wait_schedule(inst, offload_mask(2, []), 21) is None
    assert no_wait_schedule(inst, offload_mask(2, [0, 1]), 17) is None  # below the least memory


def test_solve_reports_lb_and_the_least_memory(tiny):
    sched = memplan.solve(tiny, "greedy", 20, optimizer="none", bandwidth=BYTE_PER_MS)
    assert sched.family == "offload"
    assert sched.feasible and sched.lower_bound == 5.0
    assert sched.makespan == pytest.approx(11.0)
    assert sched.overhead == pytest.approx(11.0 / 5.0)
    assert sched.budget.bandwidth == BYTE_PER_MS
    assert sched.min_memory == 18
    # F_1: 1 + 4 + 6 + 5 = 16; B_1 (x[0] away): 1 + 6 + 5 + 3 + 3 = 18; B_0: 6 + 3 + 4 + 2 = 15.
    assert sched.peak_memory == 18
    assert sched.count("offload") == sched.count("prefetch") == 1
    check = memplan.simulate(tiny, sched)
    assert check.valid and check.idle_time == pytest.approx(6.0)
    low = memplan.solve(tiny, "dynprog", 17, optimizer="none", bandwidth="1KB/s")
    assert not low.feasible and low.min_memory == 18
    assert low.lower_bound == 10.0  # 2 * (22 - 17) / 1


def test_static_memory_is_counted_in_the_budget(tiny):
    static = memplan.api.describe(tiny, "adam")["static_memory"]
    assert static == 0  # no weights in the tiny chain
    prof = random_chain(5, seed=3, max_size=40)
    static = memplan.api.describe(prof, "sgd")["static_memory"]
    inst = OffloadInstance.from_profile(prof, 2000.0)
    memory = static + inst.min_memory()
    sched = memplan.solve(prof, "dynprog", memory, bandwidth=2000.0)
    assert sched.feasible and sched.static_memory == static
    assert sched.peak_memory <= memory
    assert not memplan.solve(prof, "dynprog", memory - 1, bandwidth=2000.0).feasible
    assert memplan.api.describe(prof)["min_memory"]["offload"] == memory


def test_offload_peak_in_describe():
    prof = memplan.load_profile("resnet50@a100")
    desc = memplan.api.describe(prof, "none")
    inst = OffloadInstance.from_profile(prof, prof.bandwidth)
    assert desc["offload_peak"] == inst.peak() == desc["store_all_memory"]
    assert desc["min_memory"]["offload"] == inst.min_memory()


def test_lower_bound_holds_for_every_set():
    for seed in range(25):
        prof = random_chain(1 + seed % 5, seed=seed, max_size=20)
        inst = OffloadInstance.from_profile(prof, 3000.0)
        low, high = inst.min_memory(), inst.peak()
        for memory in {low, (low + high) // 2, high}:
            bound = lower_bound(inst, memory)
            for bits in range(1 << inst.n):
                mask = np.array([bits >> i & 1 for i in range(inst.n)], dtype=bool)
                schedule = no_wait_schedule(inst, mask, memory)
                if schedule is not None:
                    assert schedule.makespan >= bound - 1e-9
                    moved = 2 * int(inst.a[: inst.n][mask].sum()) / inst.beta
                    assert math.isclose(
                        sum(e - s for s, e in schedule.offload.values())
                        + sum(e - s for s, e in schedule.prefetch.values()),
                        moved,
                    )
