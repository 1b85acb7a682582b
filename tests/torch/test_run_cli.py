"""``memplan run`` takes what ``memplan profile`` takes: ``--config`` for hf: models, ``--dtype``
(the plan profiled and trained in it), and names the join networks it does not train."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from memplan.cli.app import app  # noqa: E402

pytestmark = pytest.mark.torch

TINY = "n_layer=2,n_embd=32,n_head=2,vocab_size=100,n_positions=32"
ARGS = ["run", "hf:gpt2", "--config", TINY, "-b", "2", "--input-shape", "16", "--mem", "1GB"]
ARGS += ["--steps", "1", "--repeats", "1", "--format", "json"]


def test_run_hf_with_config_and_dtype(tmp_path):
    docs = {}
    for dtype in ("float32", "bfloat16"):
        result = CliRunner().invoke(app, [*ARGS, "--dtype", dtype])
        assert result.exit_code == 0, result.stderr
        docs[dtype] = json.loads(result.stdout)
    assert docs["float32"]["model"] == f"hf:gpt2[{TINY}]"
    assert all(doc["within_budget"] for doc in docs.values())
    # half the bytes per element: the step measures less in bfloat16
    assert docs["bfloat16"]["measured_peak_memory"] < docs["float32"]["measured_peak_memory"]


def test_run_refuses_what_it_cannot_train(tmp_path):
    runner = CliRunner()
    join = runner.invoke(app, ["run", "siamese-resnet18", "--mem", "1GB"])
    assert join.exit_code == 2 and "join network" in join.stderr
    config = runner.invoke(app, ["run", "resnet18", "--config", "n_layer=2", "--mem", "1GB"])
    assert config.exit_code == 2 and "--config" in config.stderr
    profile = tmp_path / "p.json"
    made = runner.invoke(
        app,
        ["profile", "hf:gpt2", "--config", TINY, "-b", "2", "--input-shape", "16",
         "--repeats", "1", "-o", str(profile)],
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    other = runner.invoke(app, [*ARGS, "--profile", str(profile), "--dtype", "bfloat16"])
    assert other.exit_code == 2 and "float32" in other.stderr
