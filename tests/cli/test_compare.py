"""``memplan compare`` says what it compares (issue 37): the accounting in its header (the
optimizer's static memory, the training loop), each family's least memory under the table, and a
sweep in which nothing fits says so, names the least memory and exits 1."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

import memplan
import memplan.api
from memplan.cli.app import app
from memplan.profile.synthetic import random_chain
from memplan.units import format_size, format_size_like
from tests.strategies import with_loop_terms

ALGOS = "rotor,dynprog,pofo"


def run(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def measured(tmp_path) -> tuple[str, memplan.Profile]:
    """A chain with the fields of a measured profile (PyTorch's loop by default)."""
    prof = with_loop_terms(random_chain(5, seed=3, max_size=50, overheads=True), 3)
    prof = prof.model_copy(update={"bandwidth": 1e6})
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(prof.model_dump(mode="json", exclude_none=True)))
    return str(path), prof


def test_the_header_names_the_accounting_and_the_least_memory_follows(tmp_path):
    path, prof = measured(tmp_path)
    for loop in ("at-backward", "kept"):
        desc = memplan.api.describe(prof, "sgd", loop)
        result = run("compare", path, "--algos", ALGOS, "--mem", "auto:3", "--gradients", loop)
        assert result.exit_code == 0, result.stderr
        text = " ".join(result.stderr.split())
        static = desc["static_memory"]
        assert f"static memory {format_size(static)} (optimizer sgd" in text
        assert f"--gradients {loop}" in text
        for family in ("chain", "offload", "combined"):
            assert f"{family} {format_size(desc['min_memory'][family])}" in text


def test_the_json_document_states_the_accounting(tmp_path):
    path, prof = measured(tmp_path)
    result = run("compare", path, "--algos", ALGOS, "--mem", "auto:2", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    desc = memplan.api.describe(prof, "sgd", "auto")
    assert doc["accounting"] == {
        "optimizer": "sgd",
        "gradients": "at-backward",
        "static_memory": desc["static_memory"],
    }
    assert doc["least_memory"] == {
        f: desc["min_memory"][f] for f in ("chain", "offload", "combined")
    }
    assert doc["budgets"][0] == min(doc["least_memory"].values())


def test_a_sweep_where_nothing_fits_says_so_and_exits_1(tmp_path):
    path, prof = measured(tmp_path)
    least = memplan.api.describe(prof, "sgd", "auto")["min_memory"]["chain"]
    span = f"{least // 4}:{least // 2}:3"
    result = run("compare", path, "--algos", "rotor,dynprog", "--mem", span)
    assert result.exit_code == 1
    assert "infeasible: no plan fits any budget of the sweep" in result.stderr
    said = " ".join(result.stderr.split())  # in the units typed: bytes here
    assert f"the least memory that fits is {format_size_like(least, span, up=True)}" in said
    csv_run = run("compare", path, "--algos", "rotor", "--mem", span, "-f", "csv")
    assert csv_run.exit_code == 1  # the document still written, as solve's
    assert csv_run.stdout.startswith("memory,algorithm,feasible")
