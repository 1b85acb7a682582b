"""The graph simulator against hand counts on small graphs (papers/002, eqs. 6-8 and 13)."""

from __future__ import annotations

import pytest

import memplan
from memplan.schedule import Budget, ProfileRef, Schedule
from memplan.simulator.graph import simulate_graph
from tests.oracles.graph import graph_profile, peak_resident, random_dag

# w -> W(7) -> b;  a -> t1(10) -> b, c;  b -> t2(20) -> d;  c -> t3(5) -> d;  d -> t4(1)
NODES = [("w", "weight"), ("a", "input"), ("b", "forward"), ("c", "forward"), ("d", "backward")]
TENSORS = [
    ("W", 7, "w", ["b"]),
    ("t1", 10, "a", ["b", "c"]),
    ("t2", 20, "b", ["d"]),
    ("t3", 5, "c", ["d"]),
    ("t4", 1, "d", []),
    ("ctl", 0, "a", ["d"]),
]
PROFILE = graph_profile(NODES, TENSORS)
# steps 0..4 = w a b c d. resident: 7, 17, 37, 42, 33 (hand count) -> peak 42
GOOD = {"W": 0, "t1": 7, "t2": 17, "t3": 37, "t4": 7}


def _schedule(order, addresses, **claims):
    return Schedule(
        family="graph",
        algorithm="custom",
        profile=ProfileRef(model="toy", sha256="-"),
        budget=Budget(),
        feasible=True,
        lower_bound=0.0,
        order=order,
        addresses=addresses,
        **claims,
    )


def test_hand_count():
    result = simulate_graph(PROFILE, _schedule(list("wabcd"), GOOD), memory=None)
    assert result.valid, result.violation
    assert result.op_peaks == [7, 17, 37, 42, 33]
    assert result.peak_memory == 42  # the arena: t3 ends at 37 + 5
    assert result.makespan == pytest.approx(5.0)  # five nodes of 1 ms


def test_claims_are_checked():
    ok = _schedule(list("wabcd"), GOOD, arena=42, peak_resident=42, fragmentation=0.0)
    assert simulate_graph(PROFILE, ok).valid
    wrong = _schedule(list("wabcd"), GOOD, arena=42, peak_resident=41)
    result = simulate_graph(PROFILE, wrong)
    assert not result.valid and "peak_resident" in result.violation


def test_a_second_order_hand_count():
    # w a c b d: t1 lives 1..3, t3 2..4, t2 3..4 -> 7, 17, 22, 42, 33
    addresses = {"W": 0, "t1": 7, "t2": 22, "t3": 17, "t4": 7}
    result = simulate_graph(PROFILE, _schedule(list("wacbd"), addresses))
    assert result.valid, result.violation
    assert result.op_peaks == [7, 17, 22, 42, 33]
    assert result.peak_memory == 42


@pytest.mark.parametrize(
    ("order", "addresses", "needle"),
    [
        (list("wbacd"), GOOD, "order[1] b: reads tensor 't1' before its producer 'a'"),
        (list("wabdc"), GOOD, "order[3] d: reads tensor 't3' before its producer 'c'"),
        (list("wabc"), GOOD, "never run"),
        (list("wabcdd"), GOOD, "runs twice"),
        (list("wabcx"), GOOD, "unknown node 'x'"),
        (list("wabcd"), {**GOOD, "t4": 17}, "'t2' [17, 37) and 't4' [17, 18)"),
        (list("wabcd"), {**GOOD, "t1": 6}, "overlap in memory"),
        (list("wabcd"), {k: v for k, v in GOOD.items() if k != "t2"}, "'t2' (20 bytes) has no"),
        (list("wabcd"), {**GOOD, "zz": 1}, "unknown tensor 'zz'"),
        (list("wabcd"), {**GOOD, "t4": -1}, "expected a byte offset >= 0"),
    ],
)
def test_violations_name_the_problem(order, addresses, needle):
    result = simulate_graph(PROFILE, _schedule(order, addresses))
    assert not result.valid
    assert needle in result.violation


def test_control_edges_order_but_hold_no_memory():
    # a -> d through the size-0 tensor: d before a is rejected, and 'ctl' needs no address
    result = simulate_graph(PROFILE, _schedule(list("wabcd"), GOOD))
    assert result.valid
    tiny = graph_profile([("a", "forward"), ("b", "forward")], [("c", 0, "a", ["b"])])
    assert not simulate_graph(tiny, _schedule(["b", "a"], {})).valid
    assert simulate_graph(tiny, _schedule(["a", "b"], {})).peak_memory == 0


def test_budget():
    result = simulate_graph(PROFILE, _schedule(list("wabcd"), GOOD), memory=41)
    assert not result.valid and "arena: needs" in result.violation
    assert simulate_graph(PROFILE, _schedule(list("wabcd"), GOOD), memory=42).valid


@pytest.mark.parametrize("seed", range(8))
def test_peak_resident_agrees_with_the_oracle_count(seed):
    prof = random_dag(seed, 9, weights=2)
    order = [node.name for node in prof.graph.nodes]
    # stack every tensor at its own offset: always valid, arena = sum of sizes
    addresses, top = {}, 0
    for t in prof.graph.tensors:
        addresses[t.name] = top
        top += t.size
    sched = memplan.solve(prof, algo="framework", memory=10**9)
    check = simulate_graph(prof, _schedule(order, addresses))
    assert check.valid
    assert max(check.op_peaks) == peak_resident(prof, order) == sched.peak_resident
