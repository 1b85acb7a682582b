"""docs/reference.md, the users' reference of the contract, names only what exists (issue 39 item 6).

Every command and option it names is one of the command line's (options attributed to the command
they follow), its synopsis is generated from the app, its algorithms are the registry's, its exit
codes the command line's, its file fields the models', its Python names and keywords the
library's, its environment variables the code's; README.md points to it.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from functools import cache

import pytest
import typer

import memplan
from memplan.cli import common
from memplan.cli.app import COMMANDS, app
from memplan.cli.synopsis import documented_synopsis, synopsis
from memplan.profile.graph import Graph
from memplan.profile.model import Branch, Device, Measured, Profile, Stage, StageOption
from memplan.schedule import Budget, Op, ProfileRef, Schedule, SolverInfo
from memplan.units import parse_size
from tests.paths import ROOT

TEXT = (ROOT / "docs" / "reference.md").read_text()
GLOBAL = {"--debug", "--version", "--help", "-h"}


def section(title: str) -> str:
    """The text of the ``## title`` section."""
    start = TEXT.index(f"\n## {title}\n")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start : end if end > 0 else None]


@cache
def options() -> dict[str, set[str]]:
    """Every command's option names (``--mem``, ``-m``), from the app."""
    group = typer.main.get_command(app)
    found = {}
    for name in COMMANDS:
        command = group.commands[name]  # type: ignore[attr-defined]
        found[name] = {opt for param in command.params for opt in param.opts + param.secondary_opts}
        found[name] |= {"--help", "-h"}
    return found


def test_synopsis_is_generated_from_the_app():
    assert documented_synopsis(TEXT) == synopsis(), (
        "regenerate: python -m memplan.cli.synopsis docs/reference.md"
    )


def test_every_command_named_exists_and_every_command_is_named():
    named = set(re.findall(r"`memplan ([a-z][a-z-]*)\b", TEXT))
    named |= {line.split()[1] for line in TEXT.splitlines() if line.startswith("memplan ")}
    assert named - set(COMMANDS) - {"[--debug]"} == set()
    table = section("Commands")
    for name in COMMANDS:
        assert f"| `memplan {name}` |" in table, name


def test_every_option_named_is_an_option_of_its_command():
    every = set().union(*options().values()) | GLOBAL
    for flag in set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", TEXT)):
        assert flag in every, flag
    # in a command line (`memplan CMD ... --opt`), the option is that command's
    lines = re.findall(r"`(memplan [a-z][^`]*)`", TEXT)
    block = documented_synopsis(TEXT) or ""
    lines += re.sub(r"\n +", " ", block).splitlines()  # one line per command
    spans = [part.strip() for line in lines for part in line.split(" | ")]  # a pipeline: each
    checked = 0
    for span in (span for span in spans if span.startswith("memplan ")):
        words = span.split()
        command = words[1]
        if command not in COMMANDS:
            continue
        for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", span):
            assert flag in options()[command] | GLOBAL, (flag, span)
            checked += 1
    assert checked > 50  # the synopsis and the examples


def test_the_algorithms_table_is_the_registry():
    rows = [line for line in section("Algorithms").splitlines() if line.startswith("| ")][1:]
    listed: dict[str, str] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        family = cells[0].split()[0]
        for name in re.findall(r"`([a-z-]+)`", cells[1]):
            listed[name] = family
    registry = {entry["name"]: entry["family"] for entry in memplan.list_algorithms()}
    assert listed == registry


def test_exit_codes_are_the_command_lines():
    table = section("Exit codes")
    codes = {
        int(c) for cell in re.findall(r"^\| ([0-9, ]+) \|", table, re.M) for c in cell.split(",")
    }
    constants = {value for name, value in vars(common).items() if name.startswith("EXIT_")}
    assert constants <= codes
    assert codes - constants == {130, 143, 129}  # 128 + the signal (memplan/interrupt.py)


def test_units_named_are_parsed():
    line = next(line for line in section("Units").splitlines() if "units `" in line)
    units = re.search(r"units `([^`]+)`", line)
    assert units is not None
    for unit in units[1].split():
        assert parse_size(f"2{unit}") == parse_size(f"2 {unit.lower()}") > 0, unit
    for example in ("8GB", "8GiB", "512MiB", "1.5GB", "1000000", "1000000 bytes", "8 GB"):
        assert f"`{example}`" in section("Units") or f'"{example}"' in section("Units")
        assert parse_size(example) > 0


def test_file_fields_named_are_the_models_fields():
    models = (Profile, Stage, StageOption, Device, Measured, Branch, Graph)
    models += (Schedule, Op, Budget, SolverInfo, ProfileRef)
    fields = {name for model in models for name in model.model_fields}
    values = {"F_all", "F_ck", "F_n", "B", "offload", "prefetch", "turn", "compute", "transfer"}
    files = section("Files")
    named = set(re.findall(r"`([A-Za-z_]+)`", files))
    assert named - fields - values == set()
    for name in ("forward_time", "saved_size", "weight_size", "makespan", "peak_memory", "ops"):
        assert name in named


def _arguments(text: str) -> list[tuple[str, str | None]]:
    """``profile, algo="rotor", *, optimizer="sgd", **options`` -> [(name, default text)]."""
    found = []
    for part in (p.strip() for p in text.split(",")):
        if part in ("*", "") or part.startswith("**"):
            continue
        name, eq, default = part.partition("=")
        found.append((name.strip(), default.strip() if eq else None))
    return found


def test_python_names_and_signatures_are_the_librarys():
    rows = re.findall(r"^\| `(memplan\.[^|]*?)` \|", section("Python API"), re.M)
    assert len(rows) >= 10
    for cell in rows:
        for call in re.split(r"`, `", cell):
            name, _, rest = call.partition("(")
            target = memplan
            for part in name.split(".")[1:]:
                target = getattr(target, part)
            if not rest:
                continue
            signature = inspect.signature(target)
            for argument, default in _arguments(rest.rstrip(")")):
                assert argument in signature.parameters, (name, argument)
                if default is not None:
                    expected = signature.parameters[argument].default
                    assert ast.literal_eval(default) == expected, (name, argument, default)


@pytest.mark.torch
def test_torch_keywords_named_are_enables():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    import memplan.torch

    paragraph = section("Python API").split("**PyTorch**", 1)[1]
    keywords = re.search(r"Keywords: (.*?)\. The budget", paragraph, re.S)
    assert keywords is not None
    parameters = inspect.signature(memplan.torch.enable).parameters
    for word in re.findall(r"`([a-z_]+)`", keywords[1]):
        if word in ("rotor",):  # a value, not a keyword
            continue
        assert word in parameters, word
    for name in re.findall(r"`memplan\.torch\.([a-z_]+)\(", paragraph):
        assert callable(getattr(memplan.torch, name)), name


def test_environment_variables_named_are_read():
    sources = "\n".join(path.read_text() for path in (ROOT / "memplan").rglob("*.py"))
    for variable in re.findall(r"`(MEMPLAN_[A-Z_]+)", TEXT):
        assert f'"{variable}"' in sources, variable


def test_readme_points_to_the_reference():
    readme = (ROOT / "README.md").read_text()
    assert "docs/reference.md" in readme
    assert "SPEC.md" not in readme  # a file the repository does not have
