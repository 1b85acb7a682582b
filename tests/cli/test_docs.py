"""docs/cli.md and ``--help`` say what the command line does (issue 14 item 6).

The synopsis of docs/cli.md is generated from the typer app (``python -m memplan.cli.synopsis
docs/cli.md``); ``profile --help`` lists the built-in models and shows its defaults, checked
against the modules that define them.
"""

from __future__ import annotations

import inspect

import pytest
from typer.testing import CliRunner

from memplan.cli.app import COMMANDS, app
from memplan.cli.model_options import JOIN_NAMES, MODEL_NAMES
from memplan.cli.profile import DEFAULT_REPEATS
from memplan.cli.synopsis import documented_synopsis, synopsis
from tests.paths import ROOT

runner = CliRunner()


def names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",")]


def test_docs_cli_synopsis_is_generated_from_the_app():
    documented = documented_synopsis((ROOT / "docs" / "cli.md").read_text())
    assert documented == synopsis(), "regenerate: python -m memplan.cli.synopsis docs/cli.md"


def test_synopsis_names_every_command_and_the_options_the_issue_found_missing():
    text = synopsis()
    for name in COMMANDS:
        assert f"memplan {name} " in text, name
    for needle in ("--micro-batches M", "--link-bandwidth RATE", "torch-csv", "memplan plot"):
        assert needle in text, needle


def test_synopsis_keeps_an_option_and_its_value_on_one_line():
    for line in synopsis().splitlines():
        assert line.count("[") == line.count("]"), line
        assert len(line) <= 100, line


def test_every_command_has_help():
    for name in COMMANDS:
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "100"})
        assert result.exit_code == 0, (name, result.output)
        assert "Usage: memplan " + name in result.output


@pytest.mark.torch
def test_profile_help_lists_the_models_and_defaults():
    pytest.importorskip("torch")
    from memplan.torch.models.join import JOIN_MODELS
    from memplan.torch.models.registry import DEFAULT_BATCH_SIZE, MODELS
    from memplan.torch.profiler.model import profile_model

    assert names(MODEL_NAMES) == list(MODELS)
    assert names(JOIN_NAMES) == list(JOIN_MODELS)
    assert inspect.signature(profile_model).parameters["repeats"].default == DEFAULT_REPEATS
    result = runner.invoke(app, ["profile", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for name in [*MODELS, *JOIN_MODELS]:
        assert name in text, name
    assert f"[default: {DEFAULT_BATCH_SIZE} for images" in text
    assert f"[default: {DEFAULT_REPEATS}]" in text
    assert "(torchvision)" not in text
