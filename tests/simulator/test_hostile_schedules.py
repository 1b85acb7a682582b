"""Tampered schedules (issue 17 items 2 and 6): nothing unrolls without bound, nothing lies.

``memplan simulate`` recomputes the static memory from the profile and ``budget.optimizer`` and
checks every claim it can recompute (NOTE [ schedule claims ] in memplan/simulator/claims.py);
the pipeline replay bounds shifts, periods and GPU ids before it unrolls anything.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import memplan
from memplan.cli.app import app
from memplan.simulator.pipeline import MAX_UNROLLED

runner = CliRunner()


def _simulate(tmp_path, profile: str, doc: dict, *extra: str):
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    result = runner.invoke(app, ["simulate", profile, str(path), *extra])
    assert "Traceback" not in result.stderr
    return result


def _last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def chain_doc() -> dict:
    return memplan.solve("resnet18", "rotor", "800MB").to_dict()


@pytest.fixture(scope="module")
def pipeline_doc() -> dict:
    return memplan.solve("resnet18", "pipedream", "4GB", gpus=2).to_dict()


# --------------------------------------------------------------------------- item 6


def test_static_memory_is_recomputed_not_trusted(tmp_path, chain_doc):
    """The issue's tamper: static memory 0, the peak lowered by as much, a budget the real plan
    does not fit. The replay counts the real static memory and fails the budget."""
    doc = json.loads(json.dumps(chain_doc))
    static = doc["static_memory"]
    assert static > 0
    doc["static_memory"] = 0
    doc["peak_memory"] -= static
    doc["budget"]["memory"] = doc["peak_memory"] + static // 2  # fits only without the weights
    result = _simulate(tmp_path, "resnet18", doc, "--format", "json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["static_memory"] == static  # the profile's, not the schedule's 0
    assert not report["valid"] and "budget" in report["violation"]
    check = memplan.simulate("resnet18", doc, check_claims=False)
    assert check.static_memory == static and check.peak_memory == chain_doc["peak_memory"]


def test_a_wrong_static_memory_claim_is_a_violation(tmp_path, chain_doc):
    doc = json.loads(json.dumps(chain_doc))
    doc["static_memory"] = 0
    doc["peak_memory"] -= chain_doc["static_memory"]
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 1
    assert _last_line(result) == (
        "memplan: invalid: static_memory: schedule says 0, the profile's weights with optimizer "
        f"sgd give {chain_doc['static_memory']}"
    )


def test_negative_static_memory_and_unknown_optimizer_are_bad_input(tmp_path, chain_doc):
    doc = json.loads(json.dumps(chain_doc))
    doc["static_memory"] = -(10**9)
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 2 and "static_memory: Input should be greater than" in result.stderr
    doc = json.loads(json.dumps(chain_doc))
    doc["budget"]["optimizer"] = "lion"
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 2
    assert (
        "budget.optimizer: Input should be 'none', 'sgd', 'momentum', 'adam' or 'adamw'"
        in result.stderr
    )


def test_the_optimizer_decides_the_static_memory(tmp_path, chain_doc):
    doc = json.loads(json.dumps(chain_doc))
    doc["budget"]["optimizer"] = "adam"  # 4 W instead of sgd's 2 W: the claims no longer hold
    result = _simulate(tmp_path, "resnet18", doc, "--mem", "100GB")
    assert result.exit_code == 1 and "optimizer adam give" in _last_line(result)


def test_a_gap_on_the_compute_stream_is_a_violation(tmp_path, chain_doc):
    doc = json.loads(json.dumps(chain_doc))
    for op in doc["ops"][3:]:
        op["start"] += 1.0
        op["end"] += 1.0
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 1
    assert "ops[3].start" in _last_line(result) and "leaves a gap" in _last_line(result)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda d: d["ops"][0].__setitem__("branch", 0), "ops[0].branch: a field of join"),
        (lambda d: d["ops"][0].__setitem__("tensor", "s[0]"), "ops[0].tensor: only the transfers"),
        (lambda d: d.__setitem__("pattern", []), "pattern: a field of pipeline schedules"),
        (lambda d: d.__setitem__("order", ["a"]), "order: a field of graph schedules"),
    ],
)
def test_fields_of_another_family_are_bad_input(tmp_path, chain_doc, edit, words):
    doc = json.loads(json.dumps(chain_doc))
    edit(doc)
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 2 and words in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda d: d["gpu_memory"].__setitem__(0, 1), "gpu_memory[0]: schedule says 1"),
        (lambda d: d.__setitem__("throughput", 1e6), "throughput: schedule says 1000000.0"),
        (lambda d: d.__setitem__("static_memory", 0), "static_memory: schedule says 0"),
        (lambda d: d.__setitem__("makespan", 1.0), "makespan: schedule says 1.0"),
    ],
)
def test_pipeline_claims_are_checked(tmp_path, pipeline_doc, edit, words):
    assert _simulate(tmp_path, "resnet18", pipeline_doc).exit_code == 0
    doc = json.loads(json.dumps(pipeline_doc))
    edit(doc)
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 1 and words in _last_line(result), result.stderr


def test_plot_of_an_invalid_schedule_fails_and_draws_nothing(tmp_path, chain_doc):
    pytest.importorskip("matplotlib")
    doc = json.loads(json.dumps(chain_doc))
    doc["ops"][5]["end"] += 1.0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    png = tmp_path / "bad.png"
    result = runner.invoke(app, ["plot", str(path), "-p", "resnet18", "-o", str(png)])
    assert result.exit_code == 1 and "invalid: ops[5].end" in result.stderr
    assert not png.exists()


# --------------------------------------------------------------------------- item 2


def _pattern_op(doc: dict) -> dict:
    return doc["pattern"][0]["ops"][0]


def test_a_huge_shift_is_refused_before_unrolling(tmp_path, pipeline_doc):
    """``shift: 100000000`` grew to 15 GB: the replay now refuses what would unroll more than
    MAX_UNROLLED operations, naming the operation."""
    doc = json.loads(json.dumps(pipeline_doc))
    op = _pattern_op(doc)
    op["shift"] = 100_000_000
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 1
    line = _last_line(result)
    assert f"{op['op']} stage {op['stage']}: shift 100000000" in line
    assert f"more than {MAX_UNROLLED} operations" in line


def test_a_shift_beyond_the_schema_is_bad_input(tmp_path, pipeline_doc):
    doc = json.loads(json.dumps(pipeline_doc))
    _pattern_op(doc)["shift"] = 10**12
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 2 and "pattern[0].ops[0].shift" in result.stderr


def test_a_tiny_period_is_refused_before_unrolling(tmp_path, pipeline_doc):
    doc = json.loads(json.dumps(pipeline_doc))
    doc["period"] = doc["makespan"] = 1e-300
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 1
    assert "more than the period 1e-300 ms" in _last_line(result)


@pytest.mark.parametrize("gpus", [2, None])
def test_a_huge_gpu_index_is_refused(tmp_path, pipeline_doc, gpus):
    doc = json.loads(json.dumps(pipeline_doc))
    doc["budget"]["gpus"] = gpus
    doc["assignment"][0] = 10**12
    result = _simulate(tmp_path, "resnet18", doc)
    assert result.exit_code == 1 and "assignment uses GPU 1000000000000" in _last_line(result)


@pytest.mark.parametrize("period", [float("inf"), float("nan")])
def test_non_finite_figures_are_bad_input(period, pipeline_doc):
    doc = json.loads(json.dumps(pipeline_doc))
    doc["period"] = period
    with pytest.raises(memplan.InputError, match="period: Input should be a finite number"):
        memplan.load_schedule(doc)
