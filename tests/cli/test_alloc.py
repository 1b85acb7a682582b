"""``memplan alloc`` through typer's CliRunner: exit codes 0/1/2, the CSV written, --validate, and
one clean error line for each kind of bad input."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memplan.alloc import check_placement, parse_buffers_csv
from memplan.cli.app import app

runner = CliRunner()
GOOD = "id,lower,upper,size\na,0,2,4\nb,1,3,4\nc,2,4,4\n"


def run(*args: str, input: str | None = None):
    return runner.invoke(app, ["alloc", *[str(a) for a in args]], input=input)


def one_error(result, code: int, *needles: str) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def valid(text: str, capacity: int | None = None) -> int:
    buffers = parse_buffers_csv(text, need_offsets=True).buffers
    assert buffers.offset is not None
    check = check_placement(
        buffers.lower, buffers.upper, buffers.size, buffers.offset, capacity, buffers.ids
    )
    assert check.valid, check.violation
    return check.arena


def test_places_from_stdin_with_the_least_arena() -> None:
    result = run("-", input=GOOD)
    assert result.exit_code == 0, result.stderr
    out = rows(result.stdout)
    assert [r["id"] for r in out] == ["a", "b", "c"]
    assert list(out[0]) == ["id", "lower", "upper", "size", "offset"]
    assert valid(result.stdout) == 8
    assert "arena 8" in result.stderr and "least possible" in result.stderr


def test_capacity_in_human_units_and_output_file(tmp_path: Path) -> None:
    source = tmp_path / "buffers.csv"
    source.write_text(GOOD)
    target = tmp_path / "placed.csv"
    result = run(source, "--capacity", "1KiB", "-o", target)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert valid(target.read_text(), 1024) == 8
    assert {p.name for p in tmp_path.iterdir()} == {"buffers.csv", "placed.csv"}  # no temp file


def test_extra_offset_column_is_replaced_and_columns_keep_their_order() -> None:
    text = "size,id,offset,upper,lower\n4,a,99,2,0\n4,b,99,3,1\n"
    result = run("-", input=text)
    assert result.exit_code == 0, result.stderr
    out = rows(result.stdout)
    assert list(out[0]) == ["size", "id", "upper", "lower", "offset"]
    assert sorted(int(r["offset"]) for r in out) == [0, 4]


def test_capacity_below_the_peak_exits_1_naming_the_peak() -> None:
    one_error(run("-", "--capacity", "7", input=GOOD), 1, "infeasible", "peak live load 8")


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("id,lower,size\na,0,2\n", ("missing column", "upper")),
        ("id,lower,upper,size\na,0,2,x\n", ("line 2", "size", "integer")),
        ("id,lower,upper,size\na,0,2,1.5\n", ("line 2", "size", "integer")),
        ("id,lower,upper,size\na,0,2,-4\n", ("line 2", "size", ">= 0")),
        ("id,lower,upper,size\na,2,2,1\n", ("line 2", "upper > lower")),
        ("id,lower,upper,size\na,3,2,1\n", ("line 2", "upper > lower")),
        ("id,lower,upper,size\na,0,2,1\nb,0,1,1\na,1,3,1\n", ("line 4", "duplicate", "line 2")),
        ("id,lower,upper,size,alignment\na,0,2,1,8\n", ("unknown column", "alignment")),
        ("id,lower,upper,size\na,0,2\n", ("line 2", "expected 4 fields")),
        ("", ("empty", "expected a CSV")),
        ("id,lower,upper,size\n,0,2,1\n", ("line 2", "id")),
    ],
)
def test_bad_csv_is_one_line_exit_2(text: str, needles: tuple[str, ...]) -> None:
    one_error(run("-", input=text), 2, "<stdin>", *needles)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--capacity", "8G"), ("--capacity", "8GB", "8GiB")),
        (("--capacity", "lots"), ("--capacity",)),
        (("--capacity", "1.5"), ("--capacity 1.5", "whole number of bytes")),
        (("--capacity", "1.0001KiB"), ("--capacity", "whole number of bytes")),
        (("--time-limit", "0"), ("--time-limit", "e.g. 60")),
        (("--time-limit", "nan"), ("--time-limit nan", "finite", "e.g. 60")),
        (("--time-limit", "inf"), ("--time-limit inf", "finite", "e.g. 60")),
        (("--time-limit", "-1"), ("--time-limit -1", "e.g. 60")),
        (("--time-limit", "604801"), ("--time-limit 604801", "a week", "e.g. 60")),
        (("--time-limit", "1e9"), ("--time-limit 1000000000", "a week", "e.g. 60")),
    ],
)
def test_bad_options_exit_2(args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    one_error(run("-", *args, input=GOOD), 2, *needles)


def test_fractional_capacity_is_refused_not_truncated_issue_18() -> None:
    """``--capacity 1.5`` used to become 1 byte silently; whole byte counts are exact."""
    one_error(run("-", "--capacity", "1.5", input=GOOD), 2, "--capacity 1.5", "1.5 bytes")
    result = run("-", "--capacity", "0.0078125KiB", input=GOOD)  # exactly 8 bytes
    assert result.exit_code == 0, result.stderr
    assert valid(result.stdout, 8) == 8
    big = 2**60 - 1  # a float would round this to 2^60
    result = run("-", "--capacity", str(big), input=GOOD)
    assert result.exit_code == 0 and f"capacity {big}" in result.stderr


def test_sizes_whose_sum_overflows_int64_never_exit_0_with_an_overlap_issue_17() -> None:
    """Issue 17 item 5: 16 buffers of 2^60 bytes live at once used to exit 0 with nine of them at
    the same offset. Their peak (2^64) is above what is placed exactly: exit 2, naming it; with
    a capacity, the exact peak makes it infeasible (exit 1)."""
    text = "id,lower,upper,size\n" + "".join(f"b{k},0,1,{2**60}\n" for k in range(16))
    line = one_error(run("-", input=text), 2, "<stdin>", "peak live load", str(2**64))
    assert "2^61" in line
    one_error(run("-", "--capacity", str(2**60), input=text), 1, "infeasible", str(2**64))
    # Two of them fit exactly (2^61 bytes): placed, and the offsets validate.
    two = "id,lower,upper,size\n" + "".join(f"b{k},0,1,{2**60}\n" for k in range(2))
    result = run("-", input=two)
    assert result.exit_code == 0, result.stderr
    assert valid(result.stdout) == 2**61


def test_missing_file_exit_2(tmp_path: Path) -> None:
    one_error(run(tmp_path / "nope.csv"), 2, "nope.csv", "no such file")


def test_validate_valid_invalid_and_beyond_capacity() -> None:
    good = "id,lower,upper,size,offset\na,0,2,4,0\nb,1,3,4,4\nc,2,4,4,0\n"
    result = run("-", "--validate", input=good)
    assert result.exit_code == 0, result.stderr
    assert "valid" in result.stderr and "arena 8" in result.stderr
    assert result.stdout == ""
    clash = "id,lower,upper,size,offset\na,0,2,4,0\nb,1,3,4,2\nc,2,4,4,0\n"
    one_error(run("-", "--validate", input=clash), 1, "'a'", "'b'", "overlap")
    one_error(run("-", "--validate", "--capacity", "6", input=good), 1, "'b'", "capacity 6")
    # Half-open lifetimes: a ends when c starts, so they may share addresses.
    assert run("-", "--validate", "--capacity", "8", input=good).exit_code == 0


def test_validate_needs_offsets_and_rejects_negative_ones() -> None:
    one_error(run("-", "--validate", input=GOOD), 2, "offset")
    one_error(run("-", "--validate", input="id,lower,upper,size,offset\na,0,1,1,-1\n"), 2, "offset")


def test_output_of_alloc_validates_through_the_cli(tmp_path: Path) -> None:
    text = "id,lower,upper,size\n" + "".join(
        f"t{k},{k % 7},{k % 7 + 1 + k % 3},{(k * 37) % 50 + 1}\n" for k in range(40)
    )
    target = tmp_path / "placed.csv"
    assert run("-", "-o", target, input=text).exit_code == 0
    result = run(target, "--validate")
    assert result.exit_code == 0, result.stderr
