"""At 80 columns no table cell is cut (issue 14 item 4; NOTE [ table width ] in cli/common.py).

Every table of ``info``, ``solve``, ``simulate``, ``compare`` and ``algos`` is printed at
COLUMNS=80 and at 400 columns; the words of the two outputs must be the same (text may wrap at
spaces, nothing may be cut, folded or replaced by an ellipsis). Off a terminal (CliRunner, as in a
CI log) the commands run end to end; on a terminal the renderables are printed by the same
``print_table`` on a console that says it is one.
"""

from __future__ import annotations

import io
import re
from collections import Counter

import pytest
from rich.console import Console
from typer.testing import CliRunner

import memplan
from memplan.algorithms import algorithm_details, list_algorithms
from memplan.cli import render
from memplan.cli.app import app
from memplan.cli.common import print_table
from memplan.cli.render import short_size
from memplan.describe import describe

runner = CliRunner()
WORD = re.compile(r"[^\s\u2500-\u257f]+")  # box-drawing characters separate words too

COMMANDS = [
    ("info", "resnet50"),
    ("info", "resnet50@a100"),
    ("info", "resnet18-graph-b1"),
    ("info", "siamese-resnet18"),
    ("solve", "resnet50", "--algo", "rotor", "--mem", "1GB"),
    ("solve", "resnet50", "--algo", "rotor", "--mem", "300MB"),
    ("solve", "resnet50@a100", "--algo", "dynprog", "--mem", "4GB"),
    ("solve", "resnet18@a100", "--algo", "pipedream", "--gpus", "4", "--mem", "3GB"),
    ("solve", "cross-modal-resnet18", "--algo", "join", "--mem", "400MB", "--optimizer", "none"),
    ("solve", "resnet18-graph-b1", "--algo", "framework", "--mem", "1GB"),
    (
        "compare",
        "resnet50@a100",
        "--algos",
        "store-all,periodic,revolve,rotor,greedy,dynprog,dynprog-best,vdnn",
        "--mem",
        "auto:3",
    ),
    ("compare", "resnet50", "--mem", "0.6GB:1.7GB:3"),
    ("algos",),
    ("algos", "pofo"),
    ("algos", "pipeline-ilp"),
]


SECONDS = re.compile(r"\b\d+\.\d+ s\b")  # solver times differ from run to run


def words(text: str) -> Counter:
    return Counter(WORD.findall(SECONDS.sub("T s", text)))


def stderr_at(columns: int, args: tuple[str, ...]) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert result.exit_code in (0, 1), result.stderr
    return result.stderr


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_no_cell_is_cut_at_80_columns_off_a_terminal(args):
    narrow, wide = stderr_at(80, args), stderr_at(400, args)
    assert "…" not in narrow
    assert words(narrow) == words(wide)


def test_info_keeps_every_size_of_the_stage_table():
    """The case of the issue: a weight of 300K was shown as 300 at 80 columns."""
    text = stderr_at(80, ("info", "resnet50@a100"))
    table = describe("resnet50@a100")["stage_table"]
    found = words(text)
    for stage in table:
        for key in ("output_size", "saved_size", "weight_size"):
            assert found[short_size(stage.get(key, 0))] >= 1, (stage["name"], key)
    assert "300K" in found


def terminal_output(renderable, columns: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=columns, force_terminal=True, color_system=None)
    print_table(renderable, console)
    return out.getvalue()


def renderables():
    """What the commands draw, built from the library (the terminal path)."""
    yield "info resnet50@a100", render.info_tables(describe("resnet50@a100"))
    yield "info resnet18-graph-b1", render.info_tables(describe("resnet18-graph-b1"))
    for name, algo, mem, options in (
        ("resnet50", "rotor", "1GB", {}),
        ("resnet50@a100", "dynprog", "4GB", {}),
        ("cross-modal-resnet18", "join", "400MB", {"optimizer": "none"}),
        ("resnet18@a100", "pipedream", "3GB", {"gpus": 4}),
    ):
        prof = memplan.load_profile(name)
        sched = memplan.solve(prof, algo, mem, **options)
        yield f"solve {name} {algo} summary", render.schedule_summary(sched, prof.length)
        if sched.ops:
            yield f"solve {name} {algo} ops", render.ops_table(sched, render.stage_names(prof))
        if sched.pattern:
            names = [s.name for s in prof.all_stages()]
            yield f"solve {name} {algo} pattern", render.pattern_table(sched, names)
    algos = ["store-all", "periodic", "revolve", "rotor", "greedy", "dynprog", "vdnn"]
    budgets = [2_500_000_000, 4_000_000_000, 6_000_000_000]
    rows = memplan.compare("resnet50@a100", algos, budgets)
    yield "compare", render.compare_table(rows, algos, budgets, "resnet50@a100")
    yield "algos", render.algos_table(list_algorithms())
    yield "algos pofo", render.algorithm_tables(algorithm_details("pofo"))


def test_no_number_is_cut_at_80_columns_on_a_terminal():
    for label, renderable in renderables():
        narrow, wide = terminal_output(renderable, 80), terminal_output(renderable, 400)
        assert "…" not in narrow, label
        assert words(narrow) == words(wide), label


def test_algos_lists_every_short_summary_whole_within_80_columns():
    text = stderr_at(80, ("algos",))
    for entry in list_algorithms():
        assert entry["short"] in text, entry["name"]
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines())
