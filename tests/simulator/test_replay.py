"""The family -> replay table (memplan/simulator/replay.py) and the family rules of the
chain-model simulator (memplan/simulator/combined.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import memplan
from memplan.algorithms import FAMILIES
from memplan.schedule import Op
from memplan.simulator.combined import simulate_ops
from memplan.simulator.operations import COMBINED, OFFLOAD
from memplan.simulator.replay import REPLAYS, replay
from tests.paths import ROOT

RATE = 1000.0  # one byte per ms


def test_every_family_has_a_replay():
    assert set(REPLAYS) == set(FAMILIES)


def test_an_unknown_family_is_bad_input(chain):
    sched = memplan.solve(chain, "rotor", 60, optimizer="none")
    with pytest.raises(memplan.InputError, match="schedule family 'nope' cannot be simulated"):
        replay(chain, sched.model_copy(update={"family": "nope"}), None)


def test_the_simulator_imports_no_solver():
    """The replays are independent of the solvers: nothing in memplan/simulator/ imports
    memplan.algorithms (at the top or in a function)."""
    for path in sorted((ROOT / "memplan" / "simulator").glob("*.py")):
        tree = ast.parse(Path(path).read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.startswith("memplan.algorithms")], path


def _store_all(chain) -> list[Op]:
    ops, clock = [], 0.0
    for k in range(4):
        ops.append(Op(op="F_all", stage=k, start=clock, end=clock + 2))
        clock += 2
    for k in reversed(range(4)):
        ops.append(Op(op="B", stage=k, start=clock, end=clock + 3))
        clock += 3
    return ops


def test_the_offload_rules_refuse_recomputation(chain):
    ops = _store_all(chain)
    ops[1] = ops[1].model_copy(update={"op": "F_ck"})
    offload = simulate_ops(chain, ops, rules=OFFLOAD, bandwidth=RATE)
    assert offload.violation == (
        "ops[1] F_ck stage 1: F_ck is not an operation of the offloading model "
        "(F_all, B, offload, prefetch)"
    )
    # the same plan is a combined schedule (F_ck 1 keeps x[2]; F_all 2 reads it)
    assert not simulate_ops(chain, ops, rules=COMBINED, bandwidth=RATE).violation.startswith(
        "ops[1] F_ck stage 1: F_ck is not"
    )


def test_a_prefetch_without_offload_is_named_before_the_budget(chain):
    """A whole-plan problem (a prefetch nothing offloaded) comes before a budget exceeded
    earlier in time: the plan cannot be replayed as written."""
    ops = _store_all(chain)
    ops.append(Op(op="prefetch", stage=1, start=8.0, end=16.0, stream="transfer"))
    result = simulate_ops(chain, ops, rules=OFFLOAD, memory=10, bandwidth=RATE)
    assert result.violation == "ops[8] prefetch s[1]: s[1] is prefetched but never offloaded"
    assert result.violation_index == 8


def test_a_late_prefetch_names_its_arrival(chain):
    """s[0] (8 bytes, 8 ms) goes to the host during F_all 1..3 and comes back too late for B 1
    (14..17), which reads it."""
    ops = _store_all(chain)
    ops.append(Op(op="offload", stage=0, start=2.0, end=10.0, stream="transfer"))
    ops.append(Op(op="prefetch", stage=0, start=10.0, end=18.0, stream="transfer"))
    result = simulate_ops(chain, ops, rules=OFFLOAD, bandwidth=RATE)
    assert result.violation == (
        "ops[6] B stage 1: s[0] is not on the GPU: its prefetch ops[9] arrives at 18.0, after "
        "B stage 1 starts (14.0)"
    )
    # not started yet when B 1 starts: s[0] is on the host
    ops[9] = ops[9].model_copy(update={"start": 15.0, "end": 23.0})
    result = simulate_ops(chain, ops, rules=OFFLOAD, bandwidth=RATE)
    assert result.violation == (
        "ops[6] B stage 1: s[0] is not on the GPU: ops[8] offloaded it by 10.0 and its prefetch "
        "ops[9] arrives at 23.0, after B stage 1 starts (14.0)"
    )
    result = simulate_ops(chain, ops[:9], rules=OFFLOAD, bandwidth=RATE)
    assert result.violation == (
        "ops[6] B stage 1: s[0] is not on the GPU: ops[8] offloaded it by 10.0 and it is never "
        "prefetched"
    )


def test_transfers_count_in_the_operation_peaks(chain):
    """At 4 bytes/ms: s[0] leaves at the end of F_all 1 (which reads it, T2) and comes back
    during B 3; counted by hand (x[0] 5, g[4] 4, each s[k] 8, overheads 1 and 2)."""
    ops = _store_all(chain)
    ops.append(Op(op="offload", stage=0, start=2.0, end=4.0, stream="transfer"))
    ops.append(Op(op="prefetch", stage=0, start=10.0, end=12.0, stream="transfer"))
    result = simulate_ops(chain, ops, rules=OFFLOAD, bandwidth=4 * RATE)
    assert result.valid, result.violation
    # F_all 0..3, B 3..0, offload, prefetch
    assert result.op_peaks == [18, 26, 26, 34, 47, 39, 31, 19, 26, 47]
    assert result.peak_memory == 47 and result.memory_curve[-1] == (20.0, 0)


def test_computations_run_in_time_order(chain):
    """The schedule's list order does not matter: the replay runs the operations in time."""
    ops = _store_all(chain)
    shuffled = ops[4:] + ops[:4]
    for rules in (OFFLOAD, COMBINED):
        ordered = simulate_ops(chain, ops, rules=rules, bandwidth=RATE)
        result = simulate_ops(chain, shuffled, rules=rules, bandwidth=RATE)
        assert result.valid and ordered.valid
        assert (result.makespan, result.peak_memory) == (ordered.makespan, ordered.peak_memory)


def test_the_curve_starts_with_what_is_held_at_time_0(chain):
    result = simulate_ops(chain, _store_all(chain), rules=COMBINED, bandwidth=RATE)
    # x[0] 5 bytes and the loss gradient g[4] 4 bytes
    assert result.memory_curve[0] == (0.0, 9)
    assert len(result.memory_curve) == 1 + 2 * 8
