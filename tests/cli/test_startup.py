"""A command imports what it runs (issue 40 item 7): which modules start-up loads, not how long.

`memplan --version` and `memplan algos` (and `--help`) read no profile and run no solver: they load
neither numpy nor pydantic nor any solver module. The times are measured by
benchmarks/bench_startup.py (docs/benchmarks.md, "Start-up"), never here: a test asserts nothing
a machine's speed decides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.paths import ROOT

HEAVY = ("numpy", "pydantic", "yaml", "ortools", "torch", "matplotlib", "memplan._core")
"""Modules none of these commands may load (but --version, which prints the compiled core's build
line, loads memplan._core)."""

MEMPLAN_HEAVY = (
    "memplan.api",
    "memplan.profile",
    "memplan.schedule",
    "memplan.simulator",
    "memplan.algorithms.timeline",
    "memplan.algorithms.chain.rotor",
    "memplan.algorithms.offload.dynprog",
    "memplan.algorithms.pipeline.ilp",
)
"""memplan's own modules that read profiles or solve."""

CODE = """
import json, sys
from memplan.cli.app import main
sys.argv = ['memplan', *json.loads(sys.argv[1])]
code = 0
try:
    main()
except SystemExit as done:
    code = done.code or 0
loaded = sorted(m for m in sys.modules if m in HEAVY or m.startswith(MEMPLAN_HEAVY))
sys.stdout.flush()
print('LOADED', json.dumps([code, loaded]))
"""


def _loaded(code: str, *args: str) -> tuple[int, list[str], str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MEMPLAN_DEBUG", None)
    prelude = f"HEAVY = {HEAVY!r}\nMEMPLAN_HEAVY = {MEMPLAN_HEAVY!r}\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + code, json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out, _, last = done.stdout.rpartition("LOADED ")
    status, loaded = json.loads(last)
    return status, loaded, out + done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--version",),
        ("algos",),
        ("algos", "rotor"),
        ("algos", "--format", "json"),
        ("algos", "nosuch"),
        ("--help",),
        ("algos", "--format", "jsn"),
    ],
    ids=" ".join,
)
def test_light_commands_load_no_solver_nor_profile_model(args):
    status, loaded, output = _loaded(CODE, *args)
    assert status in (0, 2), output
    if args == ("algos", "nosuch"):
        assert status == 2 and "unknown algorithm 'nosuch'" in output
    if args[-1] == "jsn":
        assert status == 2 and "did you mean 'json'" in output
    if args == ("algos",):
        assert "rotor" in output and "pipeline-ilp" in output
    if args == ("--version",):
        assert output.startswith("memplan ") and "\ncore " in output
        assert loaded == ["memplan._core"], loaded
    else:
        assert loaded == [], loaded


def test_list_algorithms_from_python_loads_no_solver():
    code = (
        "import json, sys\nimport memplan\nnames = [a['name'] for a in memplan.list_algorithms()]\n"
        "loaded = sorted(m for m in sys.modules if m in HEAVY or m.startswith(MEMPLAN_HEAVY))\n"
        "print('LOADED', json.dumps([len(names), loaded]))\n"
    )
    count, loaded, _ = _loaded(code)
    assert count >= 19 and loaded == []


def test_solve_still_loads_what_it_runs():
    """The lazy imports are lazy, not missing: a solve loads the solver it runs, and only it."""
    status, loaded, output = _loaded(CODE, "solve", "resnet18", "--algo", "rotor", "--mem", "1GB")
    assert status == 0, output
    assert "memplan.algorithms.chain.rotor" in loaded and "numpy" in loaded
    assert "memplan.algorithms.pipeline.ilp" not in loaded and "torch" not in loaded
