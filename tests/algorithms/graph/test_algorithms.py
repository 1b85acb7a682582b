"""The graph family's algorithms: exhaustive checks on small DAGs, validity of every placement,
reordering never worse than the framework order (papers/002)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import memplan
from memplan.algorithms.graph.olla import early_update_edges
from memplan.algorithms.graph.problem import GraphProblem
from memplan.cli.app import app
from tests.oracles.graph import best_order, graph_profile, overlaps, peak_resident, random_dag

ALGOS = ["framework", "greedy-by-size", "olla-order", "olla-address", "olla"]
BIG = 10**12


def _check_placement(prof, sched):
    """Independent of memplan.simulator: every tensor placed, no overlap, inside the arena."""
    assert sched.feasible and sched.order is not None and sched.addresses is not None
    sizes = {t.name: t.size for t in prof.graph.tensors}
    assert set(sched.addresses) == {n for n, s in sizes.items() if s > 0}
    assert overlaps(prof, sched.order, sched.addresses) == []
    arena = max((sched.addresses[n] + sizes[n] for n in sched.addresses), default=0)
    assert sched.arena == arena == sched.peak_memory
    assert all(v >= 0 for v in sched.addresses.values())
    assert sched.peak_resident == peak_resident(prof, sched.order) <= arena
    if arena:
        assert sched.fragmentation == pytest.approx((arena - sched.peak_resident) / arena)


@pytest.mark.parametrize("seed", range(12))
def test_cp_sat_order_equals_exhaustive_search(seed):
    prof = random_dag(seed, 6 + seed % 2, weights=seed % 2)
    best, _ = best_order(prof)
    sched = memplan.solve(prof, algo="olla-order", memory=BIG, time_limit=20)
    assert sched.solver.status == "optimal"
    assert sched.peak_resident == best
    _check_placement(prof, sched)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("algo", ALGOS)
def test_every_placement_is_valid(seed, algo):
    prof = random_dag(100 + seed, 14, weights=3)
    sched = memplan.solve(prof, algo=algo, memory=BIG, time_limit=10)
    _check_placement(prof, sched)
    assert memplan.simulate(prof, sched).valid


@pytest.mark.parametrize("seed", range(6))
def test_reordering_never_increases_peak_resident(seed):
    prof = random_dag(200 + seed, 16, weights=2)
    framework = memplan.solve(prof, algo="framework", memory=BIG)
    for algo in ("olla-order", "olla"):
        sched = memplan.solve(prof, algo=algo, memory=BIG, time_limit=10)
        assert sched.peak_resident <= framework.peak_resident
    address = memplan.solve(prof, algo="olla-address", memory=BIG, time_limit=10)
    assert address.order == framework.order  # placement only
    assert address.arena <= framework.arena


def _fragmenting():
    # A [0,1], B [0,3], C [2,3] (sizes 1024, 1024, 2048): first-fit puts C on top (4096),
    # the least arena is the peak resident 3072 (B low, A and C above it)
    return graph_profile(
        [("n0", "forward"), ("n1", "forward"), ("n2", "forward"), ("n3", "backward")],
        [
            ("A", 1024, "n0", ["n1"]),
            ("B", 1024, "n0", ["n3"]),
            ("ctl", 0, "n1", ["n2"]),
            ("C", 2048, "n2", ["n3"]),
        ],
    )


def test_olla_address_removes_fragmentation():
    prof = _fragmenting()
    framework = memplan.solve(prof, algo="framework", memory=BIG)
    assert framework.arena == 4096 and framework.peak_resident == 3072
    assert framework.fragmentation == pytest.approx(0.25)
    sched = memplan.solve(prof, algo="olla-address", memory=BIG, time_limit=10)
    assert sched.arena == 3072 and sched.fragmentation == 0.0
    assert sched.solver.status == "optimal"


def _training_graph(layers: int = 3):
    """A small training step: weights, a forward chain, a loss, a backward chain producing
    weight gradients, one SGD update per weight (all at the end, as PyTorch runs them)."""
    nodes = [(f"w{k}", "weight") for k in range(layers)] + [("x", "input")]
    nodes += [(f"f{k}", "forward") for k in range(layers)] + [("loss", "forward")]
    nodes += [(f"b{k}", "backward") for k in reversed(range(layers))]
    nodes += [(f"u{k}", "optimizer") for k in reversed(range(layers))]
    tensors = [(f"W{k}", 400, f"w{k}", [f"f{k}", f"b{k}", f"u{k}"]) for k in range(layers)]
    tensors.append(("x0", 100, "x", ["f0", "b0"]))
    for k in range(layers):
        nxt = f"f{k + 1}" if k + 1 < layers else "loss"
        tensors.append((f"a{k}", 100, f"f{k}", [nxt, *([f"b{k + 1}"] if k + 1 < layers else [])]))
    tensors.append(("l", 4, "loss", [f"b{layers - 1}"]))
    for k in reversed(range(layers)):
        if k > 0:
            tensors.append((f"g{k}", 100, f"b{k}", [f"b{k - 1}"]))
        tensors.append((f"dW{k}", 400, f"b{k}", [f"u{k}"]))
        # the update writes W in place: after every reader of W (the backward reads it)
    return graph_profile(nodes, tensors, model="training")


def test_early_weight_updates_free_the_gradients_sooner():
    prof = _training_graph(3)
    problem = GraphProblem.from_profile(prof)
    edges = early_update_edges(problem)
    names = problem.names
    assert edges, "every update has an anchor"
    for update, anchor in edges:
        assert names[update].startswith("u") and names[anchor].startswith(("b", "u"))
    assert problem.is_topological(problem.topological_order(extra=edges), edges)
    framework = memplan.solve(prof, algo="framework", memory=BIG)
    sched = memplan.solve(prof, algo="olla", memory=BIG, time_limit=10)
    best, _ = best_order(prof, weights_first=True)  # where a weight node runs changes nothing
    assert sched.peak_resident == best < framework.peak_resident
    _check_placement(prof, sched)


def test_progress_lines_and_status():
    lines: list[str] = []
    prof = random_dag(7, 30, weights=3)
    sched = memplan.solve(prof, algo="olla", memory=BIG, time_limit=2, progress=lines.append)
    assert sched.solver.status in ("optimal", "feasible")
    assert "order" in sched.solver.message and "gap" in sched.solver.message
    assert all("gap" in line and "bound" in line for line in lines)


def test_infeasible_budget_reports_the_arena():
    prof = _fragmenting()
    sched = memplan.solve(prof, algo="olla-address", memory=3071, time_limit=5)
    assert not sched.feasible and sched.min_memory == 3072
    fits = memplan.solve(prof, algo="olla-address", memory=3072, time_limit=5)
    assert fits.feasible


def test_cli_solve_json_then_simulate(tmp_path):
    import yaml

    prof = _training_graph(3)
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(prof.to_dict()))
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "solve",
            str(path),
            "--algo",
            "olla",
            "--mem",
            "1MB",
            "--time-limit",
            "5",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["family"] == "graph" and len(doc["order"]) == len(prof.graph.nodes)
    assert doc["fragmentation"] == 0.0 and doc["arena"] == doc["peak_resident"]
    sched = tmp_path / "s.json"
    sched.write_text(result.stdout)
    check = runner.invoke(app, ["simulate", str(path), str(sched)])
    assert check.exit_code == 0, check.output
    table = runner.invoke(app, ["solve", str(path), "--algo", "framework", "--mem", "1MB"])
    assert table.exit_code == 0 and "fragmentation" in table.output
    low = runner.invoke(app, ["solve", str(path), "--algo", "framework", "--mem", "100"])
    assert low.exit_code == 1 and "least memory that fits" in low.output
