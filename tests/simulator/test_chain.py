"""The chain simulator against hand-counted plans (docs/model.md is the reference)."""

from __future__ import annotations

import pytest

import memplan
from memplan.api import timed_ops
from memplan.profile.model import Profile, Stage
from memplan.profile.synthetic import homogeneous_chain, random_chain
from memplan.schedule import Op
from memplan.simulator import SimulationResult, simulate_chain


def three_stages() -> Profile:
    """x0 = 2 bytes; every size, time and overhead distinct enough to count by hand.

    ======  ==  ==  ======  =====  ==  ==  ====================
    stage   ft  bt  x[k+1]  s[k]   fo  bo  g[k+1] (= x[k+1])
    ======  ==  ==  ======  =====  ==  ==  ====================
    0       1   2   3       5      1   2   3
    1       3   4   4       7      0   1   4
    2       5   6   1       2      2   0   1 (the loss)
    ======  ==  ==  ======  =====  ==  ==  ====================
    """
    rows = [(1, 2, 3, 5, 1, 2), (3, 4, 4, 7, 0, 1), (5, 6, 1, 2, 2, 0)]
    stages = [
        Stage(
            name=f"st{k}",
            forward_time=ft,
            backward_time=bt,
            output_size=out,
            saved_size=saved,
            forward_overhead=fo,
            backward_overhead=bo,
        )
        for k, (ft, bt, out, saved, fo, bo) in enumerate(rows)
    ]
    return Profile(model="three", input_size=2, stages=stages)


STORE_ALL = [("F_all", 0), ("F_all", 1), ("F_all", 2), ("B", 2), ("B", 1), ("B", 0)]
# held before -> peak during -> held after (static excluded), starting from x0 + g3 = 2 + 1 = 3:
#   F_all 0: 3 + s0 5 + fo 1 = 9          -> 3 + 5 = 8
#   F_all 1: 8 + s1 7 + fo 0 = 15         -> 15
#   F_all 2: 15 + s2 2 + fo 2 = 19        -> 17
#   B 2:     17 + g2 4 + bo 0 = 21        -> 17 + g2 4 - g3 1 - s2 2 = 18  (x0, s0, s1, g2)
#   B 1:     18 + g1 3 + bo 1 = 22        -> 18 + 3 - 4 - 7 = 10           (x0, s0, g1)
#   B 0:     10 + g0 0 + bo 2 = 12        -> 10 - g1 3 - s0 5 - x0 2 = 0
STORE_ALL_PEAKS = [9, 15, 19, 21, 22, 12]
STORE_ALL_AFTER = [8, 15, 17, 18, 10, 0]
STORE_ALL_MAKESPAN = 1 + 3 + 5 + 6 + 4 + 2

CHECKPOINTED = [
    ("F_ck", 0),
    ("F_n", 1),
    ("F_all", 2),
    ("B", 2),
    ("F_ck", 0),
    ("F_all", 1),
    ("B", 1),
    ("F_all", 0),
    ("B", 0),
]
# from held 3 (x0 2, g3 1):
#   F_ck 0:  3 + x1 3 + fo 1 = 7          -> 6  (x0, x1, g3)
#   F_n 1:   6 + x2 4 + fo 0 = 10         -> 6 + 4 - x1 3 = 7  (x0, x2, g3)
#   F_all 2: 7 + s2 2 + fo 2 = 11         -> 9
#   B 2:     9 + g2 4 = 13                -> 9 + 4 - g3 1 - s2 2 - x2 4 = 6  (x0, g2)
#   F_ck 0:  6 + x1 3 + fo 1 = 10         -> 9  (x0, x1, g2)
#   F_all 1: 9 + s1 7 = 16                -> 16
#   B 1:     16 + g1 3 + bo 1 = 20        -> 16 + 3 - g2 4 - s1 7 - x1 3 = 5  (x0, g1)
#   F_all 0: 5 + s0 5 + fo 1 = 11         -> 10
#   B 0:     10 + 0 + bo 2 = 12           -> 0
CHECKPOINTED_PEAKS = [7, 10, 11, 13, 10, 16, 20, 11, 12]
CHECKPOINTED_AFTER = [6, 7, 9, 6, 9, 16, 5, 10, 0]
CHECKPOINTED_MAKESPAN = 1 + 3 + 5 + 6 + 1 + 3 + 4 + 1 + 2


def test_store_all_hand_counted():
    result = simulate_chain(three_stages(), STORE_ALL)
    assert isinstance(result, SimulationResult)
    assert result.valid and result.violation is None and result.violation_index is None
    assert result.op_peaks == STORE_ALL_PEAKS
    assert result.peak_memory == 22
    assert result.makespan == STORE_ALL_MAKESPAN == three_stages().lower_bound
    assert result.fits and result.budget is None


def test_store_all_with_static_memory_and_budget():
    result = simulate_chain(three_stages(), STORE_ALL, static_memory=100, memory=122)
    assert result.valid and result.fits
    assert result.static_memory == 100 and result.budget == 122
    assert result.peak_memory == 122
    assert result.op_peaks == [100 + p for p in STORE_ALL_PEAKS]


def test_memory_curve():
    result = simulate_chain(three_stages(), STORE_ALL, static_memory=10)
    times = [0, 1, 4, 9, 15, 19, 21]
    expected = [(0, 10 + 3)]  # x0 and g3 held at the start
    for k, (peak, after) in enumerate(zip(STORE_ALL_PEAKS, STORE_ALL_AFTER, strict=True)):
        expected += [(times[k], 10 + peak), (times[k + 1], 10 + after)]
    assert result.memory_curve == expected


def test_checkpointing_hand_counted():
    result = simulate_chain(three_stages(), CHECKPOINTED)
    assert result.valid, result.violation
    assert result.op_peaks == CHECKPOINTED_PEAKS
    assert [m for _, m in result.memory_curve[2::2]] == CHECKPOINTED_AFTER
    assert result.peak_memory == 20
    assert result.makespan == CHECKPOINTED_MAKESPAN


def test_timed_ops_are_accepted():
    prof = three_stages()
    result = simulate_chain(prof, timed_ops(prof, CHECKPOINTED), memory=20)
    assert result.valid and result.fits
    assert result.makespan == CHECKPOINTED_MAKESPAN
    assert result.memory_curve[-1] == (CHECKPOINTED_MAKESPAN, 0)


def test_store_all_solver_replays():
    prof = random_chain(5, seed=4)
    sched = memplan.solve(prof, "store-all", 10**6, optimizer="sgd")
    result = memplan.simulate(prof, sched)
    assert result.valid, result.violation
    assert result.peak_memory == sched.peak_memory
    assert result.static_memory == 2 * prof.weight_size
    assert result.makespan == pytest.approx(prof.lower_bound)


# ---- violations: the first problem, naming the op index, the op and the stage ----------------


def violation(ops, **kwargs) -> SimulationResult:
    result = simulate_chain(three_stages(), ops, **kwargs)
    assert not result.valid
    return result


def test_missing_input():
    result = violation([("F_all", 1)])
    assert result.violation.startswith("ops[0] F_all stage 1: x[1] is not in memory")
    assert result.violation_index == 0


def test_f_n_may_not_consume_a_stored_checkpoint():
    # Memory persistency: F_n 0 would free the chain input x[0], which no op just produced.
    result = violation([("F_n", 0), ("F_all", 0)])
    assert result.violation.startswith("ops[0] F_n stage 0: would free the stored checkpoint x[0]")
    # ... while passing a fresh activation along a forward sweep is allowed.
    sweep = simulate_chain(three_stages(), [("F_ck", 0), ("F_n", 1), ("F_all", 2), ("B", 2)])
    assert sweep.violation.startswith("incomplete")


def test_input_missing_after_b_frees_it():
    result = violation(STORE_ALL + [("F_all", 0)])
    assert result.violation.startswith("ops[6] F_all stage 0: x[0] is not in memory")


def test_backward_out_of_order():
    result = violation([("F_all", 0), ("F_all", 1), ("F_all", 2), ("B", 1)])
    assert result.violation.startswith("ops[3] B stage 1: backward out of order")
    assert result.violation_index == 3


def test_backward_twice():
    result = violation(STORE_ALL + [("B", 0)])
    assert result.violation == "ops[6] B stage 0: every backward has already run"


def test_missing_saved_tensor():
    ops = [("F_ck", 0), ("F_ck", 1), ("F_all", 2), ("B", 2), ("B", 1)]
    result = violation(ops)
    assert result.violation == "ops[4] B stage 1: s[1] is not in memory"
    assert result.violation_index == 4


def test_double_production():
    result = violation([("F_all", 0), ("F_all", 0)])
    assert result.violation == "ops[1] F_all stage 0: s[0] is already in memory"
    result = violation([("F_ck", 0), ("F_n", 0)])
    assert result.violation == "ops[1] F_n stage 0: x[1] is already in memory"


def test_over_budget_names_the_first_op():
    result = violation(STORE_ALL, memory=20)
    assert result.violation == "ops[3] B stage 2: needs 21 bytes, budget 20 bytes"
    assert result.violation_index == 3
    # The replay goes on after a memory violation: the figures are the whole plan's.
    assert result.peak_memory == 22 and not result.fits
    assert result.makespan == STORE_ALL_MAKESPAN


def test_over_budget_counts_static_memory():
    result = violation(CHECKPOINTED, static_memory=5, memory=24)
    assert result.violation == "ops[6] B stage 1: needs 25 bytes, budget 24 bytes"


def test_incomplete():
    result = violation(STORE_ALL[:-1])
    assert result.violation == "incomplete: B stage 0 never ran"
    assert result.violation_index is None
    assert violation([]).violation == "incomplete: B stage 2 never ran"


def test_unknown_stage():
    result = violation([("F_all", 3)])
    assert result.violation.startswith("ops[0] F_all stage 3: no such stage")
    result = violation([("F_all", -1)])
    assert result.violation.startswith("ops[0] F_all stage -1: no such stage")
    ops = [Op(op="F_all", stage=7, start=0.0, end=1.0)]
    assert violation(ops).violation.startswith("ops[0] F_all stage 7: no such stage")


def test_unknown_operation():
    assert violation([("F_x", 0)]).violation.startswith("ops[0] F_x stage 0: unknown operation")


def test_bad_end_time():
    prof = three_stages()
    ops = timed_ops(prof, STORE_ALL)
    ops[3] = ops[3].model_copy(update={"end": ops[3].end + 0.5})
    result = simulate_chain(prof, ops)
    assert not result.valid and result.violation_index == 3
    assert result.violation.startswith("ops[3].end: ")


def test_overlapping_start_time():
    prof = three_stages()
    ops = timed_ops(prof, STORE_ALL)
    ops[2] = ops[2].model_copy(update={"start": ops[2].start - 1, "end": ops[2].end - 1})
    result = simulate_chain(prof, ops)
    assert result.violation.startswith("ops[2].start: ")


def test_timing_within_tolerance():
    prof = three_stages()
    ops = [
        o.model_copy(update={"start": o.start * (1 + 1e-9), "end": o.end * (1 + 1e-9)})
        for o in timed_ops(prof, STORE_ALL)
    ]
    assert simulate_chain(prof, ops).valid


def test_transfers_are_not_operations_of_chain_schedules():
    prof = three_stages()
    ops = timed_ops(prof, STORE_ALL)
    ops.insert(1, Op(op="offload", stage=0, start=1.0, end=2.0, stream="transfer"))
    result = simulate_chain(prof, ops)
    assert result.violation == (
        "ops[1] offload stage 0: offload is not an operation of the chain model "
        "(F_all, F_ck, F_n, B)"
    )
    ops[1] = Op(op="F_all", stage=1, start=1.0, end=4.0, stream="transfer")
    result = simulate_chain(prof, ops)
    assert result.violation == (
        "ops[1] F_all stage 1: runs on stream 'transfer', expected 'compute'"
    )


def test_fail_keeps_the_first_violation():
    result = SimulationResult()
    assert result.valid
    result.fail("first", 1)
    result.fail("second", 2)
    assert not result.valid
    assert (result.violation, result.violation_index) == ("first", 1)


# ---- the two conventions of docs/model.md ----------------------------------------------------


def test_loss_backward_needs_its_input():
    """Convention 2: the loss backward needs x[L-1]; a plan that passes it on with F_n loses it."""
    prof = three_stages()
    ops = [("F_ck", 0), ("F_n", 1), ("F_n", 2), ("F_all", 2), ("B", 2)]
    result = simulate_chain(prof, ops)
    assert result.violation.startswith("ops[3] F_all stage 2: x[2] is not in memory")
    # With x[2] kept, it is counted during the loss backward.
    kept = simulate_chain(prof, [("F_ck", 0), ("F_n", 1), ("F_all", 2), ("B", 2)])
    x2 = prof.stages[1].output_size
    assert kept.op_peaks[3] >= prof.input_size + x2 + prof.stages[2].saved_size
    # Keeping x[2] (no F_n on the loss) is fine.
    assert simulate_chain(prof, CHECKPOINTED).valid


def test_gradient_held_during_forwards():
    """Convention 1: during forwards the held gradient is g[t+1] of the pending sub-chain.

    Gradients are sized apart: g1 = 1, g2 = 9, g3 (the loss output) = 6. x0 = 1, every x[k+1] = 1,
    every s[k] = 2, no overheads.
    """
    grads = [1, 9, 6]
    stages = [
        Stage(
            name=f"st{k}",
            forward_time=1.0,
            backward_time=1.0,
            output_size=1,
            saved_size=2,
            grad_size=grads[k],
        )
        for k in range(3)
    ]
    prof = Profile(model="grads", input_size=1, stages=stages)
    ops = [("F_ck", 0), ("F_n", 1), ("F_all", 2), ("B", 2), ("F_all", 0), ("F_all", 1)]
    ops += [("B", 1), ("B", 0)]
    # x0 1 + g3 6 = 7 held at the start: the loss gradient exists during the first forwards.
    #   F_ck 0:  7 + 1 = 8      -> 8   (x0, x1, g3)
    #   F_n 1:   8 + 1 = 9      -> 8   (x0, x2, g3)
    #   F_all 2: 8 + 2 = 10     -> 10
    #   B 2:     10 + g2 9 = 19 -> 10 + 9 - 6 - 2 - 1 = 10  (x0, g2)
    # The forwards of the sub-chain 0..1 run while g2 (9 bytes), not g1, is held:
    #   F_all 0: 10 + 2 = 12    -> 12  (counting g1 instead would say 4)
    #   F_all 1: 12 + 2 = 14    -> 14  (counting g1 instead would say 6)
    #   B 1:     14 + g1 1 = 15 -> 14 + 1 - 9 - 2 = 4  (x0, s0, g1)
    #   B 0:     4 + 0 = 4
    result = simulate_chain(prof, ops)
    assert result.valid, result.violation
    assert result.op_peaks == [8, 9, 10, 19, 12, 14, 15, 4]
    assert result.peak_memory == 19


# ---- speed --------------------------------------------------------------------------------------


def test_long_plan_replays():
    """A quadratic plan (recompute from x0 for every backward) on 200 stages: ~20k ops (its
    replay time is benchmarks/bench_scale.py's to measure, not a test's)."""
    length = 200
    ops: list[tuple[str, int]] = []
    for t in reversed(range(length)):
        if t > 0:
            ops.append(("F_ck", 0))
            ops += [("F_n", k) for k in range(1, t)]
        ops += [("F_all", t), ("B", t)]
    result = simulate_chain(homogeneous_chain(length), ops)
    assert result.valid, result.violation
    # x0, x[t], s[t], g[t+1], g[t] during B t
    assert result.peak_memory == 5
    assert result.makespan == length * (length + 1) / 2 + length
