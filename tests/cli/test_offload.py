"""The offloading family on the command line (CliRunner; stderr is checked separately).

Bad input, one clear line each: a profile without ``bandwidth`` and no ``--bandwidth`` (exit 2),
a zero or negative rate (exit 2), a budget below what full offloading needs (exit 1, with the
least memory that fits).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import memplan
from memplan.algorithms.offload.dynprog import auto_grids
from memplan.api import describe
from memplan.cli.app import app

runner = CliRunner()


def run(*args: str, input: str | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def last_error_line(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and "Traceback" not in result.stderr
    if code == 2:
        assert len(lines) == 1 and result.stdout == ""
    assert lines[-1].startswith("memplan: ")
    return lines[-1]


def test_no_bandwidth_anywhere_is_a_usage_error(net):
    line = last_error_line(run("solve", net, "--algo", "dynprog", "--mem", "1MB"), 2)
    assert "algorithm dynprog needs a bandwidth" in line
    assert "--bandwidth 12GB/s" in line and "resnet50@a100" in line
    line = last_error_line(run("compare", net, "--algos", "greedy,vdnn", "--mem", "auto"), 2)
    assert "needs a bandwidth" in line


@pytest.mark.parametrize("rate", ["0GB/s", "0", "-12GB/s", "-1"])
def test_zero_or_negative_rate_is_a_usage_error(net, rate):
    line = last_error_line(
        run("solve", net, "--algo", "greedy", "--mem", "1MB", "--bandwidth", rate), 2
    )
    assert "--bandwidth" in line and "expected a positive rate" in line


def test_budget_below_full_offloading_is_infeasible(net):
    least = describe(str(net))["min_memory"]["offload"]
    result = run("solve", net, "--algo", "dynprog", "--mem", least - 1, "--bandwidth", "1MB/s")
    line = last_error_line(result, 1)
    assert "infeasible: no dynprog plan fits" in line
    # --mem in bytes: the sizes of the message in bytes too
    assert f"fits in {least - 1} bytes; the least memory that fits is {least} bytes" in line
    ok = run("solve", net, "--algo", "dynprog", "--mem", least, "--bandwidth", "1MB/s")
    assert ok.exit_code == 0, ok.stderr


def test_solve_json_then_simulate(net, tmp_path):
    least = describe(str(net))["min_memory"]["offload"]
    plan = tmp_path / "plan.json"
    result = run(
        "solve",
        net,
        "--algo",
        "greedy",
        "--mem",
        least + 500,
        "--bandwidth",
        "2MB/s",
        "-o",
        plan,
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(plan.read_text())
    assert doc["family"] == "offload" and doc["budget"]["bandwidth"] == 2e6
    assert any(op["op"] == "offload" and op["stream"] == "transfer" for op in doc["ops"])
    assert run("simulate", net, plan).exit_code == 0
    check = run("simulate", net, plan, "--format", "json")
    assert json.loads(check.stdout)["valid"] is True
    over = run("simulate", net, plan, "--mem", least - 1)
    assert "needs" in last_error_line(over, 1)


def test_bundled_profile_bandwidth_is_the_default():
    result = run("solve", "resnet50@a100", "--algo", "dynprog", "--mem", "4GB", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["budget"]["bandwidth"] == memplan.load_profile("resnet50@a100").bandwidth
    # --slots auto: the grid whose set won (500, 5000, 50000 or one byte per slot)
    activations = doc["budget"]["memory"] - doc["static_memory"]
    assert doc["solver"]["slots"] in auto_grids(activations)
    assert doc["overhead"] == pytest.approx(doc["makespan"] / doc["lower_bound"])


def test_table_names_the_moved_tensors():
    result = run("solve", "resnet50@a100", "--algo", "greedy", "--mem", "3GB")
    assert result.exit_code == 0
    assert "x[0]" in result.stderr and "s[0]" in result.stderr  # the columns may wrap
    assert "transfer" in result.stderr


def test_compare_auto_range_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    figure = tmp_path / "fig5.png"
    result = run(
        "compare",
        "resnet18@a100",
        "--algos",
        "greedy,dynprog,vdnn",
        "--mem",
        "auto:5",
        "--bandwidth",
        "12GB/s",
        "--format",
        "json",
        "--plot",
        figure,
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    desc = describe("resnet18@a100")
    assert doc["budgets"][0] == desc["min_memory"]["offload"]
    assert doc["budgets"][-1] == desc["offload_peak"]
    assert doc["bandwidth"] == 12e9
    assert all(row["feasible"] for row in doc["rows"])
    assert all(row["ratio"] >= 1 - 1e-9 for row in doc["rows"])
    assert figure.stat().st_size > 0


def test_compare_bad_auto_steps():
    line = last_error_line(
        run("compare", "resnet18@a100", "--algos", "greedy", "--mem", "auto:x"), 2
    )
    assert "auto:20" in line


def test_algos_lists_the_family():
    result = run("algos", "--format", "json")
    entries = {e["name"]: e for e in json.loads(result.stdout)}
    for name in ("greedy", "dynprog", "dynprog-best", "vdnn"):
        assert entries[name]["family"] == "offload" and not entries[name]["exact"]
        assert "--bandwidth" in entries[name]["needs"]


def test_info_shows_the_offload_needs():
    result = run("info", "resnet50@a100", "--format", "json")
    doc = json.loads(result.stdout)
    assert doc["min_memory"]["offload"] < doc["offload_peak"] == doc["store_all_memory"]
