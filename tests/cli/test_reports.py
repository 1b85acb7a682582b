"""Reports print what was measured, not float noise; schedules keep every bit.

NOTE [ report precision ] in memplan/cli/common.py: compare's CSV and JSON, simulate's and info's
JSON round their floats to 6 decimals (ms to 1 ns, the profiler's resolution); a schedule written
by ``solve -f json`` is replayed by the simulator and stays exact.
"""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from typer.testing import CliRunner

import memplan
from memplan.api import budgets_from_range
from memplan.cli.app import app
from memplan.cli.common import REPORT_DECIMALS, csv_number, rounded

runner = CliRunner()
NOISY = "resnet50"
"""A bundled profile whose sums of times carry float noise (revolve: 6224.829060000001 ms)."""
ALGOS = "store-all,periodic,revolve,rotor"
MEM = "2GB:8GB:3"


def run(*args: str, input: str | None = None):
    result = runner.invoke(app, [str(a) for a in args], input=input)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def _decimals(text: str) -> int:
    return len(text.partition(".")[2])


def _floats(doc) -> list[float]:
    if isinstance(doc, float):
        return [doc]
    if isinstance(doc, dict):
        return [f for value in doc.values() for f in _floats(value)]
    if isinstance(doc, list):
        return [f for value in doc for f in _floats(value)]
    return []


def _library_rows() -> list[dict]:
    prof = memplan.load_profile(NOISY)
    budgets = budgets_from_range(MEM)
    return [row.to_dict() for row in memplan.compare(prof, ALGOS.split(","), budgets)]


def test_the_library_has_the_noise_that_reports_leave_out():
    """The premise: without rounding, these rows would print 16-digit tails."""
    noisy = [v for row in _library_rows() for v in (row["makespan"], row["ratio"]) if v]
    assert any(round(v, REPORT_DECIMALS) != v for v in noisy)


def test_compare_csv_rounds_times_and_ratios():
    rows = list(csv.DictReader(io.StringIO(run("compare", NOISY, "--algos", ALGOS, "--mem", MEM,
                                                "-f", "csv"))))  # fmt: skip
    library = _library_rows()
    assert len(rows) == len(library)
    for row, exact in zip(rows, library, strict=True):
        for key in ("makespan", "ratio", "seconds"):
            cell = row[key]
            assert re.fullmatch(r"-?[0-9]+\.[0-9]+", cell), (key, cell)  # no exponent
            assert _decimals(cell) <= REPORT_DECIMALS, (key, cell)
        for key in ("makespan", "ratio"):
            assert float(row[key]) == round(exact[key], REPORT_DECIMALS)
        assert row["peak_memory"] == str(exact["peak_memory"])  # sizes: integers
        assert row["memory"] == str(exact["memory"])


def test_compare_json_rounds_every_float():
    doc = json.loads(run("compare", NOISY, "--algos", ALGOS, "--mem", MEM, "-f", "json"))
    assert all(round(f, REPORT_DECIMALS) == f for f in _floats(doc))
    library = _library_rows()
    assert [r["makespan"] for r in doc["rows"]] == [
        round(r["makespan"], REPORT_DECIMALS) for r in library
    ]
    assert doc["lower_bound"] == round(memplan.load_profile(NOISY).lower_bound, REPORT_DECIMALS)
    assert all(isinstance(r["peak_memory"], int) for r in doc["rows"])


def test_a_schedule_stays_exact_and_simulate_reports_it_rounded():
    exact = memplan.solve(NOISY, algo="revolve", memory="2GB").makespan
    assert round(exact, REPORT_DECIMALS) != exact  # noise the simulator needs: kept
    plan = run("solve", NOISY, "--algo", "revolve", "--mem", "2GB", "-f", "json")
    assert json.loads(plan)["makespan"] == exact
    report = json.loads(run("simulate", NOISY, "-", "-f", "json", input=plan))
    assert report["makespan"] == report["claimed_makespan"] == round(exact, REPORT_DECIMALS)
    assert all(round(f, REPORT_DECIMALS) == f for f in _floats(report))


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_info_rounds_its_floats(fmt):
    import yaml

    text = run("info", "resnet50@a100", "-f", fmt)
    doc = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    assert doc["lower_bound"] == round(memplan.load_profile("resnet50@a100").lower_bound, 6)
    assert all(round(f, REPORT_DECIMALS) == f for f in _floats(doc))


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        (5285.043142000001, "5285.043142"),
        (0.9999999999999996, "1.0"),
        (4.8741999989943e-05, "0.000049"),
        (1e20, "100000000000000000000.0"),
        (0.0, "0.0"),
        (float("inf"), "inf"),
    ],
)
def test_csv_numbers(value, cell):
    assert csv_number(value) == cell


def test_rounded_keeps_what_is_not_a_float():
    doc = {"a": [1, True, None, "x", 0.1 + 0.2], "b": (2.5000000000000004,), "c": float("nan")}
    out = rounded(doc)
    assert out["a"] == [1, True, None, "x", 0.3] and out["b"] == [2.5]
    assert out["c"] != out["c"]  # nan stays nan
