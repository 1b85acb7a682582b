"""Options declared once per family (issue 16): the commands, the API, `memplan algos`, the docs."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import typer
from typer.testing import CliRunner

import memplan
from memplan.algorithms import FAMILIES, REGISTRY, all_options, options_for
from memplan.algorithms.options import declared
from memplan.cli.app import app
from memplan.cli.options import cli_options, documented_tables, markdown_table
from tests.paths import ROOT

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_docs_cli_tables_are_the_declarations():
    """docs/cli.md's family-option tables are generated (python -m memplan.cli.options)."""
    tables = documented_tables((ROOT / "docs" / "cli.md").read_text())
    assert set(tables) == {"solve", "compare", "run"}
    for command, body in tables.items():
        assert body == markdown_table(command), f"regenerate docs/cli.md ({command})"


@pytest.mark.parametrize("command", ["solve", "compare", "run"])
def test_each_command_shows_the_options_declared_for_it(command):
    click_command = typer.main.get_command(app).commands[command]
    flags = {flag for param in click_command.params for flag in param.opts}
    wanted = {spec.flag for spec in all_options() if command in spec.commands}
    hidden = {spec.flag for spec in all_options()} - wanted
    assert wanted <= flags
    assert not hidden & flags


def test_one_flag_one_metavar_type_and_help_across_families():
    for option in cli_options("solve"):
        for spec in option.declarations:
            assert (spec.flag, spec.metavar, spec.cli_type, spec.help) == (
                option.flag,
                option.metavar,
                option.cli_type,
                option.help,
            )


def test_every_family_declares_a_typed_options_object_with_defaults():
    for family in FAMILIES.values():
        assert dataclasses.is_dataclass(family.options)
        defaults = family.options()
        for spec in declared(family.options, family.name):
            assert getattr(defaults, spec.name) == spec.default
            assert spec.default_text


def test_options_reach_the_solver_and_are_checked_by_the_family():
    rotor = options_for("rotor", {"slots": 300})
    assert rotor.slots == 300
    pofo = options_for("pofo", {})
    assert pofo.slots == "auto"  # 50 (and 64 on short chains), its candidates at their defaults
    assert options_for("dynprog", {"slots": "AUTO"}).slots == "auto"
    assert options_for("dynprog", {}).slots == "auto"
    with pytest.raises(
        memplan.InputError, match="--slots 20000: expected an integer from 2 to 10000"
    ):
        options_for("pofo", {"slots": 20000})
    assert options_for("rotor", {"slots": 20000}).slots == 20000
    # an option of another family is checked, then ignored
    assert options_for("rotor", {"gpus": 4}) == options_for("rotor", {})
    with pytest.raises(memplan.InputError, match="--gpus 0: expected a positive number"):
        options_for("rotor", {"gpus": 0})
    with pytest.raises(TypeError, match="unknown option 'slot'"):
        options_for("rotor", {"slot": 3})
    assert options_for("dynprog", {"bandwidth": "16GiB/s"}).bandwidth == 16 * 2**30


def test_the_python_api_takes_the_declared_options(chain):
    sched = memplan.solve(chain, "rotor", 40, slots=7, optimizer="none")  # store-all needs 47
    assert sched.solver.slots == 7
    with pytest.raises(TypeError, match="unknown option"):
        memplan.solve(chain, "rotor", 200, slot=7)
    with pytest.raises(memplan.InputError, match="--bandwidth: rate"):
        memplan.solve(chain, "greedy", 200, bandwidth="0GB/s", optimizer="none")


def test_a_bad_option_fails_before_the_profile_is_read():
    result = run("solve", "no-such-profile.yaml", "--algo", "rotor", "--mem", "1GB", "--slots", "1")
    assert result.exit_code == 2
    assert (
        last_line(result)
        == "memplan: error: --slots 1: expected an integer from 2 to 100000 or 'auto'"
    )
    result = run(
        "compare", "no-such-profile.yaml", "--algos", "rotor", "--mem", "1GB:2GB", "--gpus", "0"
    )
    assert result.exit_code == 2
    assert last_line(result) == "memplan: error: --gpus 0: expected a positive number"


def test_algos_is_one_line_per_algorithm_within_80_columns():
    result = run("algos")
    assert result.exit_code == 0
    lines = result.stderr.rstrip("\n").splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines)
    for name in REGISTRY:
        assert sum(1 for line in lines if line.split()[:1] == [name]) == 1, name


def test_algos_name_shows_the_family_options():
    result = run("algos", "pofo")
    assert result.exit_code == 0
    assert "--slots" in result.stderr and "--bandwidth" in result.stderr
    assert "auto: 50 slots, and 64 on" in result.stderr
    doc = json.loads(run("algos", "pipeline-ilp", "-f", "json").stdout)
    assert doc["name"] == "pipeline-ilp" and doc["family"] == "pipeline"
    assert [o["option"] for o in doc["options"]] == ["--gpus", "--link-bandwidth", "--time-limit"]
    assert {o["keyword"] for o in doc["options"]} == {"gpus", "link_bandwidth", "time_limit"}
    result = run("algos", "nope")
    assert result.exit_code == 2
    assert "unknown algorithm 'nope'; choose one of: store-all" in last_line(result)


def test_api_has_no_family_dispatch():
    """Issue 16's check: no family name in memplan/api.py (each family declares itself)."""
    text = (ROOT / "memplan" / "api.py").read_text()
    names = "|".join(re.escape(f'"{family}"') for family in FAMILIES)
    assert re.findall(names, text) == []
