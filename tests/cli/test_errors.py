"""Who is to blame: memplan's bugs (exit 70, said once), the user's model (exit 2, naming it), and
an empty pipe (the command before it failed: not bad input).

Through typer's CliRunner, and real bash pipelines in subprocesses for the pipe's exit statuses.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import memplan
from memplan.cli.app import app
from memplan.errors import BUG_NOTE, InternalError

runner = CliRunner()


def run(*args: str, input: str | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input)


# --------------------------------------------------------------------------- memplan's bugs


def test_an_internal_error_says_it_is_a_bug_once():
    assert str(InternalError("x broke")) == f"x broke ({BUG_NOTE})"


class _Rejected:
    """What the simulator answers for a plan it rejects."""

    valid = False
    violation = "ops[26] F_all stage 19: starts at 3588.98, before the previous end"
    makespan = 0.0
    peak_memory = 0


@pytest.mark.parametrize("debug", [False, True])
def test_a_plan_the_simulator_rejects_is_reported_once(net, monkeypatch, debug):
    """The real path of a solver bug: the API replays the plan and the replay fails."""
    monkeypatch.setattr("memplan.api.replay", lambda *args, **kwargs: _Rejected())
    result = run(*(["--debug"] if debug else []), "solve", net, "--algo", "rotor", "--mem", "1GB")
    assert result.exit_code == 70
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("memplan: internal error: rotor produced a plan the simulator rejects")
    assert last.count("bug in memplan") == 1, last
    if not debug:
        assert result.stderr.count("bug in memplan") == 1, result.stderr
    assert ("Traceback" in result.stderr) == debug
    assert ("--debug shows the traceback" in last) != debug


def test_an_unexpected_exception_is_reported_as_a_bug_once(net, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("memplan.api._solve", broken)
    result = run("solve", net, "--algo", "rotor", "--mem", "1GB")
    assert result.exit_code == 70
    assert result.stderr.strip() == (
        f"memplan: internal error: ZeroDivisionError: division by zero ({BUG_NOTE}); "
        "--debug shows the traceback"
    )


def test_only_errors_py_words_the_bug_note():
    """A message that adds the phrase itself would print it twice (InternalError adds it)."""
    root = Path(memplan.__file__).parent
    wording = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "this is a bug in memplan" in path.read_text(encoding="utf-8")
    ]
    assert wording == ["errors.py"]


# --------------------------------------------------------------------------- empty pipes

BASH = shutil.which("bash")


def _bash(script: str, cwd: Path, pipefail: bool) -> tuple[str, str]:
    """Run ``script`` in bash with ``memplan`` this Python's; (stdout, stderr)."""
    prelude = f'memplan() {{ "{sys.executable}" -m memplan "$@"; }}\n'
    if pipefail:
        prelude += "set -o pipefail\n"
    result = subprocess.run(
        [BASH, "-c", prelude + script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


STATUS = '; echo "status=$? pipestatus=${PIPESTATUS[*]}"'


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("pipefail", [False, True])
@pytest.mark.parametrize(
    ("pipeline", "pipestatus", "status"),
    [
        ("memplan show resnet18 | memplan solve --algo rotor --mem 2GB", "0 0", "0"),
        ("timeout 0.5 sleep 10 | memplan solve --algo rotor --mem 2GB", "124 66", "66"),
        ("memplan show nosuch | memplan info", "2 66", "66"),
        ("false | memplan alloc --capacity 1MiB", "1 66", "66"),
    ],
)
def test_what_a_shell_reports_for_a_pipe(tmp_path, pipeline, pipestatus, status, pipefail):
    """The table of docs/cli.md, "Empty pipes": memplan after a failed command exits 66 and
    does not call the input bad, with or without pipefail."""
    out, err = _bash(pipeline + STATUS, tmp_path, pipefail)
    assert out.strip().splitlines()[-1] == f"status={status} pipestatus={pipestatus}", err
    if status == "66":
        last = err.strip().splitlines()[-1]
        assert last.startswith("memplan: error: <stdin>: nothing came through the pipe"), last
        assert "empty" not in last and "bug" not in last


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_pipefail_matters_when_the_last_command_accepts_nothing(tmp_path):
    """The last row of that table: a filter that exits 0 on an empty input (``cat`` for jq)."""
    pipeline = "memplan solve nosuch --algo rotor --mem 2GB -f json | cat" + STATUS
    assert _bash(pipeline, tmp_path, False)[0].strip() == "status=0 pipestatus=2 0"
    assert _bash(pipeline, tmp_path, True)[0].strip() == "status=2 pipestatus=2 0"


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("redirect", ["< /dev/null", "< empty.yaml", "- < empty.yaml"])
def test_an_empty_stdin_that_is_no_pipe_is_bad_input(tmp_path, redirect):
    (tmp_path / "empty.yaml").write_text("")
    out, err = _bash(f"memplan info {redirect}" + STATUS, tmp_path, True)
    assert out.strip() == "status=2 pipestatus=2", err
    last = err.strip().splitlines()[-1]
    assert last == (
        "memplan: error: <stdin>: empty: expected a profile with 'format: memplan-profile/1'"
    )


def test_an_empty_input_through_the_cli_runner_is_not_a_pipe():
    result = run("info", "-", input="")
    assert result.exit_code == 2
    assert "<stdin>: empty" in result.stderr and "pipe" not in result.stderr
