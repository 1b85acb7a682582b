"""`memplan bench`: usage errors (exit 2) and a small comparison as JSON and CSV."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memplan.cli.app import app

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SMALL = ["gpt-tiny", "-b", "2", "--input-shape", "16", "--rounds", "1", "--repeats", "1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--segments", "two"], "--segments 'two': expected numbers"),
        (["--compile-budgets", "1.5"], "--compile-budgets 1.5: expected fractions"),
        (["--algos", "dynprog"], "memplan bench runs store-all and rotor plans"),
        (["--algos", "nope"], "unknown algorithm"),
        (["--rounds", "0"], "--rounds 0: expected a positive integer"),
        (["--threads", "0"], "--threads 0: expected a positive integer"),
        (["--config", "n_layer=2"], "only hf: models take config values"),
        (["--segments", "9", "--compile-budgets", "none"], "segments 9: expected 1..4"),
        (["--optimizer", "lion"], "--optimizer lion: expected one of none, sgd"),
    ],
)
def test_usage_errors_exit_2(args, message):
    result = CliRunner().invoke(app, ["bench", *SMALL, *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output


def test_a_small_comparison_as_json_and_csv(tmp_path):
    args = ["bench", *SMALL, "--segments", "2", "--compile-budgets", "none"]
    result = CliRunner().invoke(app, [*args, "--algos", "store-all", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == "memplan-bench/1" and doc["model"] == "gpt-tiny"
    names = [row["name"] for row in doc["rows"]]
    assert names == [
        "plain", "hf checkpointing", "hf checkpointing + loss in 8 chunks",
        "checkpoint_sequential(2)", "memplan store-all",
    ]  # fmt: skip
    assert all(row["grads"] == "equal" for row in doc["rows"] if row["peak"] is not None)
    store_all = doc["rows"][-1]
    # the store-all plan's budget is its own need, never a sentinel; compared at equal memory
    assert store_all["budget"] == store_all["planned_peak"] < 2**40
    assert store_all["versus"] in ("plain", "checkpoint_sequential(2)")
    assert store_all["versus_time"] > 0 and store_all["versus_peak"] > 0
    out = tmp_path / "bench.csv"
    again = CliRunner().invoke(app, [*args, "--algos", "store-all", "-o", str(out)])
    assert again.exit_code == 0, again.output
    lines = out.read_text().splitlines()
    assert lines[0].startswith("name,family,setting,peak") and len(lines) == 6
    assert lines[0].endswith("versus,versus_time,versus_peak")


def test_the_table_goes_to_stderr():
    args = ["bench", *SMALL, "--segments", "none", "--compile-budgets", "none"]
    result = CliRunner().invoke(app, [*args, "--algos", "store-all"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "memplan store-all" in result.stderr and "time / plain" in result.stderr


def test_loss_chunks_rows_are_installed_by_enable(monkeypatch):
    """With --loss-chunks, memplan's chunked rows are plans installed by
    ``enable(..., loss_chunks=N)`` as a user writes it (no other planning path), named so, and
    planned at the hand-written chunked loss's peak too."""
    pytest.importorskip("transformers")
    from memplan.torch.compare import ways

    given: list[object] = []
    real = ways.enable

    def spy(model, memory, **kwargs):
        given.append(kwargs.get("loss_chunks"))
        return real(model, memory, **kwargs)

    monkeypatch.setattr(ways, "enable", spy)
    config = "n_layer=2,n_embd=32,n_head=2,vocab_size=500,n_positions=32"
    args = ["bench", "hf:gpt2", "--config", config, "-b", "2", "--input-shape", "32"]
    args += ["--rounds", "1", "--repeats", "1", "--segments", "none", "--compile-budgets", "none"]
    result = CliRunner().invoke(app, [*args, "--loss-chunks", "2", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)["rows"]}
    assert not [name for name in rows if "checkpoint_sequential" in name]  # --segments none
    chunked = {name: row for name, row in rows.items() if row["loss_chunks"] == 2}
    assert all(name.endswith(", loss_chunks=2") or ", loss_chunks=2 (" in name for name in chunked)
    assert {
        "memplan store-all, loss_chunks=2",
        "memplan rotor, loss_chunks=2 (least memory)",
    } <= set(chunked)
    assert given.count(2) == len(chunked) and None in given  # each row one enable call
    alternative = rows["hf checkpointing + loss in 2 chunks"]
    at = chunked[f"memplan rotor, loss_chunks=2 (at {alternative['name']}'s peak)"]
    assert at["budget"] == alternative["peak"]
    if at["skipped"] is None:  # planned there: compared with it, within its budget
        assert at["versus"] == alternative["name"] and at["peak"] <= at["budget"]
    else:
        assert at["skipped"].startswith("no rotor plan fits")
    for row in chunked.values():
        if row["peak"] is not None:
            assert row["grads"] in ("equal", "close"), row
