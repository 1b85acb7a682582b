"""Control characters are escaped in everything printed (issue 17 item 9); limits are finite
(item 10, but ``alloc``'s own time limit, which is memplan/alloc's).
"""

from __future__ import annotations

import io
import json

import pytest
import yaml
from rich.table import Table
from typer.testing import CliRunner

import memplan
from memplan.cli import common
from memplan.cli.app import app
from memplan.cli.common import escape_control
from memplan.profile.synthetic import random_chain

runner = CliRunner()

TITLE = "\x1b]0;PWNED\x07"  # sets the terminal's title
CLEAR = "\x1b[2J\x1b[H"  # clears the screen
LINK = "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"  # a hyperlink
REORDER = "\u202egnp.exe"  # right-to-left override
C1 = "\x9b31m"  # CSI as one C1 byte
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def _hostile_profile(tmp_path):
    data = random_chain(3, seed=2).to_dict()
    data["model"] = f"net{TITLE}{CLEAR}"
    data["stages"][0]["name"] = f"stem{LINK}{REORDER}"
    data["stages"][1]["name"] = f"mid{C1}[link=https://evil.example]x[/link]"
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _clean(text: str) -> None:
    for char in RAW:
        assert char not in text, repr(text)


# --------------------------------------------------------------------------- item 9


def test_escape_control_shows_what_a_terminal_would_act_on():
    assert escape_control("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert escape_control("x\u202ey\x9bz\x7f") == "x\\u202ey\\x9bz\\x7f"
    assert escape_control("tab\tand\nnewline") == "tab\tand\nnewline"
    assert escape_control("one\nline\r", newlines=True) == "one\\nline\\r"
    assert escape_control("plain: stages[3] é ü 中") == "plain: stages[3] é ü 中"


@pytest.mark.parametrize(
    "args",
    [
        ["info", "{p}"],
        ["solve", "{p}", "--algo", "rotor", "--mem", "1GB"],
        ["solve", "{p}", "--algo", "rotor", "--mem", "1"],
        ["compare", "{p}", "--algos", "rotor,revolve", "--mem", "100:2000:3"],
        ["solve", "{p}", "--algo", "dynprog", "--mem", "1GB", "--bandwidth", "1GB/s"],
    ],
)
def test_names_from_a_profile_are_escaped_in_every_command(tmp_path, args):
    path = _hostile_profile(tmp_path)
    result = runner.invoke(app, [a.replace("{p}", str(path)) for a in args])
    assert result.exit_code in (0, 1), result.stderr
    _clean(result.stderr)
    _clean(result.stdout)


def test_the_simulate_table_and_messages_are_escaped(tmp_path):
    path = _hostile_profile(tmp_path)
    sched = memplan.solve(str(path), "rotor", "1GB")
    plan = tmp_path / "plan.json"
    doc = sched.to_dict()
    doc["algorithm"] = f"rotor{CLEAR}"
    plan.write_text(json.dumps(doc), encoding="utf-8")
    result = runner.invoke(app, ["simulate", str(path), str(plan), "--mem", "1"])
    assert result.exit_code == 1
    _clean(result.stderr)
    assert "rotor\\x1b[2J" in result.stderr  # shown, not acted on


def test_the_console_escapes_but_keeps_its_own_styles():
    buffer = io.StringIO()
    console = common.escaping_console_class()(
        file=buffer,
        force_terminal=True,
        color_system="standard",
        markup=False,
        emoji=False,
        highlight=False,
        width=80,
    )
    table = Table("name")
    table.add_row(f"a{TITLE}b")
    console.print(table, style="bold")
    console.print(f"[link=https://evil.example]x[/link] {CLEAR}")
    text = buffer.getvalue()
    assert "\x1b[1m" in text  # the console's own bold
    assert "\x1b]0;" not in text and "\x1b[2J" not in text and "\x1b]8;" not in text
    assert "a\\x1b]0;PWNED" in text and "[link=https://evil.example]" in text


def test_a_csv_printed_to_a_terminal_is_escaped_and_a_piped_one_is_not(tmp_path, monkeypatch):
    csv = tmp_path / "b.csv"
    csv.write_text(f'id,lower,upper,size\n"x{CLEAR}",0,2,4\n', encoding="utf-8")
    piped = runner.invoke(app, ["alloc", str(csv)])
    assert piped.exit_code == 0 and f"x{CLEAR}" in piped.stdout  # data, byte for byte
    monkeypatch.setattr(common, "_is_terminal", lambda stream: True)
    shown = runner.invoke(app, ["alloc", str(csv)])
    assert shown.exit_code == 0 and "x\\x1b[2J" in shown.stdout
    _clean(shown.stdout)


def test_one_line_errors_stay_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    data = random_chain(2, seed=1).to_dict()
    data["stages"][0]["output_size"] = f"1\n{CLEAR}memplan: all good"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    _clean(result.stderr)


# --------------------------------------------------------------------------- item 10


@pytest.mark.parametrize("limit", ["nan", "inf", "-inf", "0", "-1", "1e9"])
@pytest.mark.parametrize("command", ["solve", "compare"])
def test_time_limits_are_finite(limit, command):
    args = [command, "resnet18", "--algo" if command == "solve" else "--algos", "pipeline-ilp"]
    args += ["--gpus", "2", "--mem", "1GB" if command == "solve" else "1GB:2GB:2"]
    result = runner.invoke(app, [*args, "--time-limit", limit])
    assert result.exit_code == 2, result.stderr
    assert "--time-limit" in result.stderr and "a week" in result.stderr
    assert "e.g. 60" in result.stderr  # an accepted value


def test_the_library_refuses_infinite_time_limits_too():
    for limit in (float("nan"), float("inf"), 0, True):
        with pytest.raises(memplan.InputError, match="time.limit"):
            memplan.solve("resnet18", "pipeline-ilp", "1GB", gpus=2, time_limit=limit)


@pytest.mark.parametrize("mem", ["1GB:2GB:1000000", "auto:1000000", "1GB:2GB:0"])
def test_compare_sweeps_are_capped(mem):
    result = runner.invoke(app, ["compare", "resnet18", "--algos", "rotor", "--mem", mem])
    assert result.exit_code == 2 and "1000" in result.stderr, result.stderr


def test_torch_csv_micro_batches_are_capped():
    args = ["solve", "resnet18", "-a", "pipedream", "--gpus", "2", "-m", "2GB", "-f", "torch-csv"]
    result = runner.invoke(app, [*args, "--micro-batches", "100000000"])
    assert result.exit_code == 2 and "from 1 to 10000" in result.stderr


def test_pipeline_ilp_returns_a_plan_when_its_limit_leaves_no_time_for_cp_sat():
    """A limit too short for any CP-SAT phase: the PipeDream warm start is the answer, replayed
    and checked, with CP-SAT's status unknown."""
    sched = memplan.solve("resnet18", "pipeline-ilp", "4GB", gpus=2, time_limit=1e-9)
    assert sched.feasible and "CP-SAT unknown" in sched.solver.message
    assert memplan.simulate("resnet18", sched).valid
