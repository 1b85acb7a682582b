"""The join family through the command line: exit codes 0/1/2, the paper's slots, info, simulate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memplan.algorithms.join.pebble import opt_join
from memplan.cli.app import app
from memplan.documents.io import dump_yaml
from memplan.profile.synthetic import homogeneous_join, random_join

runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def snn(tmp_path: Path) -> Path:
    """The paper's SNN with L = 2: three branches of 4, every size 1 KiB, unit costs."""
    path = tmp_path / "snn.yaml"
    path.write_text(dump_yaml(homogeneous_join([4, 4, 4], size=1024, model="snn-L2").to_dict()))
    return path


def test_mem_c_times_s_is_the_papers_c_slots(snn: Path) -> None:
    for c in (7, 9, 12, 15):
        result = run("solve", snn, "--algo", "join", "--mem", c * 1024, "--optimizer", "none",
                     "--format", "json")  # fmt: skip
        assert result.exit_code == 0, result.stderr
        doc = json.loads(result.stdout)
        assert doc["makespan"] == opt_join([4, 4, 4], c)
        assert doc["join_model"] == "pebble" and doc["join_slots"] == c
        assert doc["peak_memory"] <= c * 1024
        assert {op["op"] for op in doc["ops"]} <= {"F_ck", "F_n", "B", "turn"}
        assert all("branch" in op for op in doc["ops"] if op["op"] != "turn")
    store_all = run("solve", snn, "-a", "join", "-m", 15 * 1024, "--optimizer", "none",
                    "-f", "json")  # fmt: skip
    assert json.loads(store_all.stdout)["makespan"] == 12 * 2 + 1


def test_below_c_min_exits_1_and_says_c_min(snn: Path) -> None:
    result = run("solve", snn, "--algo", "join", "--mem", 6 * 1024, "--optimizer", "none")
    assert result.exit_code == 1
    assert "c_min = 7" in result.stderr
    assert "least memory that fits is" in result.stderr


def test_wrong_family_is_a_usage_error_naming_the_family(snn: Path) -> None:
    chain_on_join = run("solve", snn, "--algo", "rotor", "--mem", "1MB")
    assert chain_on_join.exit_code == 2
    assert "join family" in chain_on_join.stderr
    assert "Traceback" not in chain_on_join.stderr
    join_on_chain = run("solve", "resnet18", "--algo", "join", "--mem", "8GB")
    assert join_on_chain.exit_code == 2
    assert "chain" in join_on_chain.stderr and "join profile" in join_on_chain.stderr
    equiv_on_chain = run("solve", "resnet18", "--algo", "equiv-chain", "--mem", "8GB")
    assert equiv_on_chain.exit_code == 2


def test_info_shows_c_min_and_least_memory(snn: Path) -> None:
    result = run("info", snn, "--optimizer", "none", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["c_min"] == 7 and doc["slot_size"] == 1024
    assert doc["min_memory"]["join"] == 7 * 1024
    assert doc["store_all_memory"] == 15 * 1024
    table = run("info", snn)
    assert table.exit_code == 0 and "c_min" in table.stderr


def test_table_output_and_simulate_round_trip(tmp_path: Path, snn: Path) -> None:
    out = tmp_path / "plan.json"
    table = run("solve", snn, "-a", "equiv-chain", "-m", 9 * 1024, "--optimizer", "none")
    assert table.exit_code == 0, table.stderr
    assert "branch" in table.stderr and "turn" in table.stderr
    solved = run("solve", snn, "-a", "join", "-m", 8 * 1024, "--optimizer", "none", "-f", "json",
                 "-o", out)  # fmt: skip
    assert solved.exit_code == 0, solved.stderr
    assert run("simulate", snn, out).exit_code == 0
    over = run("simulate", snn, out, "--mem", 7 * 1024)
    assert over.exit_code == 1


def test_heterogeneous_join_through_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "net.yaml"
    path.write_text(dump_yaml(random_join([3, 5], seed=2, max_size=1000).to_dict()))
    info = json.loads(run("info", path, "--optimizer", "none", "-f", "json").stdout)
    least, top = info["min_memory"]["join"], info["store_all_memory"]
    for memory in (least, (least + top) // 2, top):
        result = run("solve", path, "-a", "join", "-m", memory, "--optimizer", "none", "-f", "json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["join_model"] == "chain"
    assert run("solve", path, "-a", "join", "-m", least - 1, "--optimizer", "none").exit_code == 1
