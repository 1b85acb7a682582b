"""SIGINT, SIGTERM and SIGHUP in every phase of every command: exit 128 + the signal, nothing
written, no temporary file left; a signal after the outputs are in place ends nothing (exit 0).

NOTE [ interrupts ] in memplan/interrupt.py, NOTE [ safe writes ] in memplan/files.py. Each case
runs ``memplan`` in a subprocess whose chosen function sends the signal to its own process just
before or just after it runs, so that every phase is hit exactly, whatever the machine's speed:
reading the input, solving, creating the temporary file, flushing it, between two outputs,
renaming them, and outside a command (while typer parses the command line).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import memplan

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

TERMINAL = textwrap.dedent(
    """
    import signal

    for stop in ("SIGTERM", "SIGHUP"):  # as in a terminal, whatever this test runs under
        signal.signal(getattr(signal, stop), signal.SIG_DFL)  # (nohup ignores SIGHUP)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background shell, SIGINT)
    """
)
"""The signals' dispositions of a command started in a terminal."""
HOOKED = textwrap.dedent(
    """
    import importlib, os, signal, sys

    where, when, name = sys.argv[1:4]
    sys.argv = ["memplan", *sys.argv[4:]]
    module_name, _, attr = where.partition(":")
    module = importlib.import_module(module_name)
    original = getattr(module, attr)
    fired = []

    def hooked(*args, **kwargs):
        if when == "before" and not fired:
            fired.append(True)
            os.kill(os.getpid(), getattr(signal, name))
        result = original(*args, **kwargs)
        if when == "after" and not fired:
            fired.append(True)
            os.kill(os.getpid(), getattr(signal, name))
        return result

    setattr(module, attr, hooked)
    import atexit
    atexit.register(lambda: fired or os._exit(99))  # the hook was never reached: a stale test
    from memplan.cli.app import main

    main()
    """
)
DRIVER = TERMINAL + HOOKED
EXIT = {"SIGINT": 130, "SIGHUP": 129, "SIGTERM": 143}
LAST_LINE = {
    "SIGINT": "memplan: interrupted",
    "SIGHUP": "memplan: stopped by SIGHUP",
    "SIGTERM": "memplan: stopped by SIGTERM",
}


def _signalled(tmp_path: Path, where: str, when: str, name: str, *args: str):
    """Run ``memplan ARGS`` in ``tmp_path`` with ``name`` sent at ``where`` (``when``)."""
    env = {k: v for k, v in os.environ.items() if k != "MEMPLAN_DEBUG"}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, where, when, name, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _stopped(result, name: str, tmp_path: Path, before: set[str]) -> None:
    """Stopped by ``name``: its exit code and last line, no traceback, nothing new in the
    directory (no output, no temporary file)."""
    assert result.returncode == EXIT[name], result.stderr
    assert result.stderr.strip().splitlines()[-1] == LAST_LINE[name], result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    assert result.stdout == ""
    assert {p.name for p in tmp_path.iterdir()} == before


SOLVE = ["solve", "resnet18", "--algo", "rotor", "--mem", "2GB", "-o", "plan.json"]
SOLVE_TRACE = [*SOLVE, "--trace", "trace.json"]


@pytest.mark.parametrize(
    ("where", "when", "name"),
    [
        ("memplan.cli.common:guard", "before", "SIGTERM"),  # typer has parsed the command line
        ("memplan:load_profile", "after", "SIGINT"),  # reading the input
        ("memplan.api:_solve", "after", "SIGTERM"),  # solving
        ("memplan.api:_solve", "after", "SIGHUP"),
        ("tempfile:mkstemp", "after", "SIGINT"),  # the temporary file exists, its name unknown
        ("tempfile:mkstemp", "after", "SIGTERM"),
        ("os:fsync", "after", "SIGINT"),  # the temporary file is complete
        ("memplan.cli.common:write_output", "after", "SIGTERM"),  # both outputs held
    ],
)
def test_solve_stops_in_every_phase(tmp_path, where, when, name):
    before = {p.name for p in tmp_path.iterdir()}
    _stopped(_signalled(tmp_path, where, when, name, *SOLVE_TRACE), name, tmp_path, before)


def test_a_stopped_command_says_which_outputs_it_did_not_write(tmp_path):
    result = _signalled(
        tmp_path, "memplan.cli.common:write_output", "after", "SIGHUP", *SOLVE_TRACE
    )
    _stopped(result, "SIGHUP", tmp_path, set())
    assert "memplan: not written, left as they were: trace.json, plan.json" in result.stderr


def test_a_replaced_file_is_left_as_it_was(tmp_path):
    (tmp_path / "plan.json").write_text("old\n")
    result = _signalled(tmp_path, "tempfile:mkstemp", "after", "SIGTERM", *SOLVE)
    _stopped(result, "SIGTERM", tmp_path, {"plan.json"})
    assert (tmp_path / "plan.json").read_text() == "old\n"


@pytest.mark.parametrize(
    ("where", "when"),
    [
        ("os:replace", "after"),  # renaming the outputs into place: signals held
        ("memplan.files:commit_writes", "after"),  # both in place: the command is done
    ],
)
def test_a_signal_once_the_outputs_are_in_place_ends_nothing(tmp_path, where, when):
    """Exit 0 means every output is written; a signal in the last milliseconds cannot undo it."""
    result = _signalled(tmp_path, where, when, "SIGINT", *SOLVE_TRACE)
    assert result.returncode == 0, result.stderr
    assert memplan.load_schedule(str(tmp_path / "plan.json")).algorithm == "rotor"
    assert json.loads((tmp_path / "trace.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "trace.json"]


@pytest.fixture
def buffers(tmp_path) -> Path:
    path = tmp_path / "buffers.csv"
    path.write_text("id,lower,upper,size\na,0,2,8\nb,1,3,8\nc,2,4,8\n")
    return path


@pytest.mark.parametrize(
    ("args", "where", "name"),
    [
        (
            ["compare", "resnet18", "--mem", "1GB:2GB:3", "-o", "sweep.csv"],
            "memplan:compare",
            "SIGINT",
        ),  # fmt: skip
        (
            ["simulate", "resnet18", "plan.json", "--trace", "t.json"],
            "memplan:simulate",
            "SIGHUP",
        ),  # fmt: skip
        (["alloc", "buffers.csv", "-o", "placed.csv"], "memplan.alloc:place", "SIGTERM"),
        (
            ["alloc", "buffers.csv", "-o", "placed.csv"],
            "memplan.alloc:read_buffers_csv",
            "SIGINT",
        ),  # fmt: skip
    ],
)
def test_the_other_commands_stop_too(tmp_path, buffers, args, where, name):
    if args[0] == "simulate":
        plan = memplan.solve("resnet18", algo="rotor", memory="2GB").to_json()
        (tmp_path / "plan.json").write_text(plan)
    before = {p.name for p in tmp_path.iterdir()}
    _stopped(_signalled(tmp_path, where, "after", name, *args), name, tmp_path, before)


FACTORY = """
import torch
from torch import nn


def tiny():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)), torch.randn(4, 8)
"""


@pytest.mark.torch
@pytest.mark.parametrize(
    ("args", "where", "when", "name"),
    [
        (
            ["profile", "tinyfactory:tiny", "--repeats", "1", "-o", "p.yaml"],
            "memplan.torch.profiler.chain:measure_stage",
            "before",
            "SIGINT",
        ),  # fmt: skip
        pytest.param(
            ["profile", "tinyfactory:tiny", "--repeats", "1", "-o", "p.yaml"],
            "memplan.torch.profiler.model:profile_model",
            "after",
            "SIGTERM",
            marks=pytest.mark.slow,  # profile's SIGTERM: test_the_issues_timeout_pipe, by default
        ),  # fmt: skip
        (
            ["run", "tinyfactory:tiny", "--mem", "1GB", "--steps", "1", "--trace", "t.json"],
            "memplan.torch.measure.step:train_under_plan",
            "after",
            "SIGINT",
        ),  # fmt: skip
    ],
)
def test_profile_and_run_stop_too(tmp_path, args, where, when, name):
    pytest.importorskip("torch")
    (tmp_path / "tinyfactory.py").write_text(FACTORY)
    before = {p.name for p in tmp_path.iterdir()}
    _stopped(_signalled(tmp_path, where, when, name, *args), name, tmp_path, before)


def test_an_ignored_sighup_stays_ignored(tmp_path):
    """Under ``nohup`` SIGHUP is ignored when memplan starts: it must stay so."""
    script = "import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN)\n" + HOOKED
    result = subprocess.run(
        [sys.executable, "-c", script, "memplan.api:_solve", "after", "SIGHUP", *SOLVE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert memplan.load_schedule(str(tmp_path / "plan.json")).algorithm == "rotor"


def test_a_signal_a_library_reports_as_its_own_error_still_stops():
    """pydantic reports a ``KeyboardInterrupt`` raised in a serializer as its own error, without
    chaining it (seen when a signal landed while ``solve`` wrote its plan): the command still
    stops as for the signal, not with an internal error."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        import typer
        from memplan import interrupt
        from memplan.cli.common import guard

        interrupt.install()
        try:
            with guard():
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    signal.pause()
                except KeyboardInterrupt:
                    raise RuntimeError("Error calling function `f`: KeyboardInterrupt") from None
        except typer.Exit as exc:
            sys.exit(exc.exit_code)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 143, result.stderr
    assert result.stderr.rstrip().endswith("memplan: stopped by SIGTERM"), result.stderr
    assert "internal error" not in result.stderr


def test_the_handlers_leave_a_library_process_alone():
    """Only the command line's entry point installs handlers: importing memplan, or running a
    command through typer's CliRunner, changes no signal's handler."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    from typer.testing import CliRunner

    from memplan.cli.app import app

    assert CliRunner().invoke(app, ["algos"]).exit_code == 0
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.torch
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="needs bash and timeout")  # fmt: skip
def test_the_issues_timeout_pipe(tmp_path):
    """``timeout N memplan profile ... -o FILE`` and ``timeout N memplan profile ... | memplan
    solve``: profiling resnet50 at its default sizes takes minutes, so the timeout's SIGTERM
    comes while it profiles; nothing is left behind, and the solve after the pipe says that
    nothing came through (docs/cli.md, "Empty pipes")."""
    pytest.importorskip("torch")
    memplan_cmd = f'"{sys.executable}" -m memplan'  # timeout runs a program, not a function
    script = textwrap.dedent(
        f"""
        timeout 4 {memplan_cmd} profile resnet50 -o p.yaml; echo "alone=$?"
        timeout 4 {memplan_cmd} profile resnet50 | {memplan_cmd} solve --algo rotor --mem 2GB
        echo "piped=${{PIPESTATUS[*]}}"
        """
    )
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.stdout.splitlines() == ["alone=124", "piped=124 66"], result.stderr
    assert result.stderr.count("memplan: stopped by SIGTERM") == 2, result.stderr
    assert "nothing came through the pipe" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
