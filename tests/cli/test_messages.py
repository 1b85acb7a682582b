"""Numbers a person reads (issue 40 item 3): sizes in messages in the units typed, bytes beside
them when the short form is not exact; `--mem 1.5` refused; a quoted `"8 GB"` taken."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memplan.api import describe
from memplan.cli.app import app
from memplan.cli.run import over_budget_line
from memplan.units import format_size_like, parse_size

runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def last_line(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and "Traceback" not in result.stderr
    if code == 2:
        assert len(lines) == 1 and result.stdout == ""
    return lines[-1]


@pytest.mark.parametrize("mem", ["1.5", "0.5"])
@pytest.mark.parametrize("command", ["solve", "compare"])
def test_a_fraction_of_a_byte_is_refused_naming_the_unit(net, command, mem):
    """`--mem 1.5` was 1 byte, `--mem 0.5` 0 bytes: surely a missing unit."""
    args = ["--algo", "rotor"] if command == "solve" else ["--algos", "rotor"]
    typed = mem if command == "solve" else f"{mem}:2KB:3"  # compare: a sweep
    line = last_line(run(command, net, *args, "--mem", typed), 2)
    assert line.startswith("memplan: error: ") and f"size '{mem}'" in line, line
    assert "whole number of bytes" in line and f"{mem}GB" in line
    if command == "solve":
        assert line.startswith("memplan: error: --mem: ")


def test_alloc_capacity_refuses_a_fraction_of_a_byte_naming_the_option():
    result = runner.invoke(app, ["alloc", "-", "--capacity", "1.5"], input="id,lower,upper,size\n")
    line = last_line(result, 2)
    assert line.startswith("memplan: error: --capacity 1.5: ") and "1.5GB" in line, line


def test_a_quoted_size_with_a_space_is_the_size(net):
    """docs/cli.md, "Sizes": `--mem "8 GB"` is one argument, 8GB; `--mem 8 GB` is two: refused."""
    spaced = run("solve", net, "--algo", "rotor", "--mem", "1 MB", "-f", "json")
    plain = run("solve", net, "--algo", "rotor", "--mem", "1MB", "-f", "json")
    assert spaced.exit_code == plain.exit_code == 0, spaced.stderr
    assert json.loads(spaced.stdout)["budget"] == json.loads(plain.stdout)["budget"]
    split = runner.invoke(app, ["solve", str(net), "--algo", "rotor", "--mem", "1", "MB"])
    assert "write 1MB" in last_line(split, 2)


@pytest.mark.parametrize(
    ("mem", "unit"), [("10KB", "KB"), ("9.5KiB", "KiB"), ("10000", "bytes"), ("0.00001GB", "KB")]
)
def test_infeasible_says_the_least_memory_in_the_units_typed(net, mem, unit):
    least = describe(str(net))["min_memory"]["chain"]
    assert least > parse_size(mem)
    line = last_line(run("solve", net, "--algo", "rotor", "--mem", mem), 1)
    budget, _, rest = line.partition("; the least memory that fits is ")
    assert (
        budget
        == f"memplan: infeasible: no rotor plan fits in {format_size_like(parse_size(mem), mem)}"
    )
    assert rest == format_size_like(least, mem, up=True) and f" {unit}" in rest, line
    shown = rest.split(" (")[0]
    assert parse_size(shown) >= least  # typed back, it fits
    if parse_size(shown) != least:
        assert rest.endswith(f"({least} bytes)")


def test_run_over_budget_line_in_the_units_of_mem():
    doc = {"measured_peak_memory": 1_100_000_000, "budget_measured": 2**30}
    doc["measured_over_budget"] = doc["measured_peak_memory"] / doc["budget_measured"]
    line = over_budget_line(doc, "1GiB")
    assert line == (
        "memplan: the measured peak 1.02 GiB (1100000000 bytes) exceeds the budget 1 GiB "
        "(1.024 x the budget)"
    )
    assert "1.1 GB exceeds the budget 1.07 GB (1073741824 bytes)" in over_budget_line(doc, "1GB")
