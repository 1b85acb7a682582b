"""The offloading simulator (memplan/simulator/offload.py) catches and names every violation.

Each test takes a valid schedule made by a solver and breaks one rule of the model of
docs/offload.md; the replay must reject it and name the operation at fault.
"""

from __future__ import annotations

import pytest

import memplan
from memplan.schedule import Op
from memplan.simulator import simulate_offload

RATE = 1000.0  # one byte per ms


@pytest.fixture
def schedule(chain):
    sched = memplan.solve(chain, "greedy", 30, optimizer="none", bandwidth=RATE)
    assert sched.feasible and sched.count("offload") >= 1
    return sched


def replay(chain, ops, memory=30):
    return simulate_offload(chain, ops, memory=memory, bandwidth=RATE)


def first(ops, name, **fields):
    return next(
        i
        for i, op in enumerate(ops)
        if op.op == name and all(getattr(op, k) == v for k, v in fields.items())
    )


def test_the_solver_schedule_is_valid(chain, schedule):
    result = replay(chain, schedule.ops)
    assert result.valid and result.violation is None
    assert result.makespan == pytest.approx(schedule.makespan)
    assert result.peak_memory == schedule.peak_memory <= 30
    assert len(result.op_peaks) == len(schedule.ops)
    assert result.memory_curve[0][0] == 0.0


def test_over_budget_names_the_operation(chain, schedule):
    result = replay(chain, schedule.ops, memory=schedule.peak_memory - 1)
    assert not result.valid
    assert "needs" in result.violation and f"budget {schedule.peak_memory - 1}" in result.violation
    assert result.makespan == pytest.approx(schedule.makespan)  # the replay went on


def test_prefetch_too_late(chain, schedule):
    ops = list(schedule.ops)
    i = first(ops, "prefetch")
    late = ops[i].model_copy(update={"start": ops[i].start + 1000, "end": ops[i].end + 1000})
    ops[i] = late
    result = replay(chain, ops)
    assert (
        not result.valid and "arrives" in result.violation and "after B stage" in result.violation
    )


def test_transfer_with_the_wrong_duration(chain, schedule):
    ops = list(schedule.ops)
    i = first(ops, "offload")
    ops[i] = ops[i].model_copy(update={"end": ops[i].end - 0.5})
    result = replay(chain, ops)
    assert not result.valid and result.violation.startswith(f"ops[{i}].end")


def test_two_transfers_at_once(chain):
    sched = memplan.solve(chain, "greedy", 26, optimizer="none", bandwidth=RATE)
    offloads = [i for i, op in enumerate(sched.ops) if op.op == "offload"]
    assert len(offloads) >= 2
    ops = list(sched.ops)
    a, b = ops[offloads[0]], ops[offloads[1]]
    shift = b.start - a.start - 0.5
    ops[offloads[1]] = b.model_copy(update={"start": b.start - shift, "end": b.end - shift})
    result = replay(chain, ops)
    assert not result.valid and "one transfer at a time" in result.violation


def test_offload_before_the_tensor_exists(chain):
    prof = chain
    ops = [Op(op="F_all", stage=k, start=2.0 * k, end=2.0 * k + 2) for k in range(4)]
    ops += [Op(op="B", stage=k, start=8 + 3.0 * (3 - k), end=11 + 3.0 * (3 - k)) for k in range(4)]
    ops.append(Op(op="offload", stage=1, start=0.0, end=8.0, stream="transfer", tensor="s[1]"))
    ops.append(Op(op="prefetch", stage=1, start=8.0, end=16.0, stream="transfer"))
    result = replay(prof, ops, memory=None)
    assert not result.valid and "s[1] does not exist yet" in result.violation


def test_prefetch_without_offload(chain, schedule):
    ops = [op for op in schedule.ops if op.op != "offload"]
    result = replay(chain, ops)
    assert not result.valid and "never offloaded" in result.violation


def test_offload_without_prefetch(chain, schedule):
    ops = [op for op in schedule.ops if op.op != "prefetch"]
    result = replay(chain, ops)
    assert not result.valid and "never prefetched" in result.violation


def test_model_violations(chain, schedule):
    ops = list(schedule.ops)
    i = first(ops, "F_all", stage=1)
    bad = replay(chain, ops[:i] + [ops[i].model_copy(update={"op": "F_ck"})] + ops[i + 1 :])
    assert "not an operation of the offloading model" in bad.violation
    bad = replay(chain, ops[:i] + [ops[i].model_copy(update={"stream": "transfer"})] + ops[i + 1 :])
    assert "expected 'compute'" in bad.violation
    j = first(ops, "offload")
    bad = replay(chain, ops[:j] + [ops[j].model_copy(update={"tensor": "s[3]"})] + ops[j + 1 :])
    assert "tensor 's[3]'" in bad.violation
    bad = replay(chain, [op for op in ops if not (op.op == "B" and op.stage == 0)])
    assert bad.violation == "incomplete: B stage 0 never ran"
    swapped = [
        op.model_copy(update={"start": op.start + 100, "end": op.end + 100})
        if op.op == "F_all" and op.stage == 0
        else op
        for op in ops
    ]
    assert "expected F_all stage 0" in replay(chain, swapped).violation


def test_simulate_needs_the_bandwidth(chain, schedule):
    doc = schedule.to_dict()
    doc["budget"]["bandwidth"] = None
    with pytest.raises(memplan.InputError, match="budget.bandwidth"):
        memplan.simulate(chain, doc)


def test_simulate_checks_the_claims(chain, schedule):
    doc = schedule.to_dict()
    doc["makespan"] = schedule.makespan - 1
    result = memplan.simulate(chain, doc)
    assert not result.valid and result.violation.startswith("makespan: schedule says")


def test_chain_schedules_still_go_to_the_chain_simulator(chain):
    sched = memplan.solve(chain, "rotor", 60, optimizer="none")
    assert sched.family == "chain" and memplan.simulate(chain, sched).valid
    assert all("tensor" not in op for op in sched.to_dict()["ops"])
