"""Who is to blame: memplan's bugs (exit 70, said once), the user's model (exit 2, naming it), and
an empty pipe (the command before it failed: not bad input).

Through typer's CliRunner, and real bash pipelines in subprocesses for the pipe's exit statuses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import memplan
from memplan.cli.app import app
from memplan.errors import BUG_NOTE, InternalError
from memplan.profile.synthetic import random_chain

runner = CliRunner()


def run(*args: str, input: str | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch):
    monkeypatch.delenv("MEMPLAN_DEBUG", raising=False)


@pytest.fixture
def net(tmp_path) -> Path:
    path = tmp_path / "net.yaml"
    memplan.save_profile(random_chain(6, seed=3, max_size=1000), path)
    return path


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
    """The real path of a solver bug: memplan.solve replays the plan and the replay fails."""
    monkeypatch.setattr("memplan.api.simulate", lambda *args, **kwargs: _Rejected())
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

    monkeypatch.setattr(memplan, "solve", broken)
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
