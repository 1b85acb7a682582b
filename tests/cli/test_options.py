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
        memplan.InputError, match="^slots=20000: expected an integer from 2 to 10000"
    ):
        options_for("pofo", {"slots": 20000})
    assert options_for("rotor", {"slots": 20000}).slots == 20000
    # an option of another family is checked, then ignored
    assert options_for("rotor", {"gpus": 4}) == options_for("rotor", {})
    with pytest.raises(memplan.InputError, match="^gpus=0: expected a positive integer"):
        options_for("rotor", {"gpus": 0})
    with pytest.raises(TypeError, match="unknown option 'slot'"):
        options_for("rotor", {"slot": 3})
    assert options_for("dynprog", {"bandwidth": "16GiB/s"}).bandwidth == 16 * 2**30


def test_the_python_api_takes_the_declared_options(chain):
    sched = memplan.solve(chain, "rotor", 40, slots=7, optimizer="none")  # store-all needs 47
    assert sched.solver.slots == 7
    with pytest.raises(TypeError, match="unknown option"):
        memplan.solve(chain, "rotor", 200, slot=7)
    with pytest.raises(memplan.InputError, match="^bandwidth=.0GB/s.: expected a positive rate"):
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
    assert last_line(result) == "memplan: error: --gpus 0: expected a positive integer"


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


# ---- --mem: a size, or the profile's GPU (docs/cli.md, "Budgets") ------------------------------


def _gpu_memory(name: str) -> int:
    return memplan.load_profile(name).device.memory


def test_mem_gpu_is_the_device_memory_less_the_reserve():
    from memplan.units import DEVICE_RESERVE

    result = run("solve", "resnet18@a100", "--algo", "rotor", "--mem", "gpu", "-f", "json")
    assert result.exit_code == 0, result.stderr
    usable = _gpu_memory("resnet18@a100") - DEVICE_RESERVE
    assert json.loads(result.stdout)["budget"]["memory"] == usable
    assert "warning" not in result.stderr
    half = run("solve", "resnet18@a100", "--algo", "rotor", "--mem", "50%", "-f", "json")
    assert json.loads(half.stdout)["budget"]["memory"] == usable // 2


def test_a_budget_above_the_gpu_is_kept_with_a_warning():
    result = run("solve", "resnet18@a100", "--algo", "rotor", "--mem", "100GB", "-f", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["budget"]["memory"] == 100 * 10**9
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "memplan: warning: --mem 100GB: 100.00 GB is more than the NVIDIA A100-SXM4-40GB can give "
        "a plan (42.41 GB: its 42.95 GB less 536.87 MB for the CUDA context and the allocator, as "
        "a budget of gpu); the plan will not fit on that GPU"
    ]


def test_mem_gpu_on_a_cpu_profile_is_an_input_error():
    result = run("solve", "resnet18", "--algo", "rotor", "--mem", "gpu")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert last_line(result).startswith(
        "memplan: error: --mem gpu: resnet18 was profiled on a CPU ("
    )
    assert "give a size, e.g. 8GB" in last_line(result)
    assert run("solve", "resnet18", "--algo", "rotor", "--mem", "90%").exit_code == 2


@pytest.mark.parametrize(
    ("mem", "words"),
    [
        ("0%", "--mem: budget '0%': expected a share of the GPU's memory above 0%"),
        ("gpus", "or a share of the GPU, e.g. 8GB, 8GiB, 512MiB, 1000000, gpu or 90%"),
        ("8G", "--mem: size '8G': 'G' is ambiguous"),
    ],
)
def test_a_bad_budget_fails_before_the_profile_is_read(mem, words):
    result = run("solve", "no-such-profile.yaml", "--algo", "rotor", "--mem", mem)
    assert result.exit_code == 2 and words in last_line(result), last_line(result)


def test_simulate_takes_the_gpu_budget_too(tmp_path):
    plan = tmp_path / "plan.json"
    made = run("solve", "resnet18@a100", "--algo", "rotor", "--mem", "gpu", "-o", str(plan))
    assert made.exit_code == 0, made.stderr
    result = run("simulate", "resnet18@a100", str(plan), "--mem", "90%", "-f", "json")
    report = json.loads(result.stdout)
    assert report["budget"] == int((_gpu_memory("resnet18@a100") - 512 * 2**20) * 0.9)
    result = run("simulate", "resnet18", str(plan), "--mem", "gpu")
    assert result.exit_code == 2 and "--mem gpu: resnet18 was profiled on a CPU" in last_line(
        result
    )
