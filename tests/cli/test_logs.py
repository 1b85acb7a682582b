"""Output read in a CI log (issue 40 item 2): no table padded to its widest row, one line per
step (or a summary) from `memplan run`, and the planned against the measured iteration explained.

CliRunner's stderr is not a terminal; the subprocess tests run `python -m memplan` with stdout
and stderr pipes, as a CI job's log captures them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import memplan
from memplan.cli.app import app
from memplan.cli.run import STEP_LINES, iteration_notes, step_lines
from tests.paths import ROOT

runner = CliRunner()
SIZE = re.compile(r"\d (?:bytes|[KMGT]i?B)\b")


def _conditioned(tmp_path: Path) -> Path:
    """A profile with measured conditions and noise, as `memplan profile` writes (a long row)."""
    prof = memplan.load_profile("resnet18")
    measured = memplan.profile.model.Measured(
        tool="memplan 0.1.0",
        torch="2.13.0+cpu",
        date="2026-11-21T23:52:13Z",
        repeats=3,
        conditions={
            "threads": 1,
            "cpu": "AMD EPYC 7B13 64-Core Processor",
            "cpu_capability": "AVX2",
            "kernels": {"DNNL_MAX_CPU_ISA": "AVX2"},
        },
        noise={"spread": 0.021, "outliers": 2, "flagged": ["layer1.0", "fc"]},
    )
    path = tmp_path / "conditioned.yaml"
    memplan.save_profile(prof.model_copy(update={"measured": measured}), path)
    return path


def _table_block(text: str, title: str) -> list[str]:
    """The lines of the table titled ``title``, up to the next blank line."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.strip() == title)
    end = next((k for k in range(start, len(lines)) if not lines[k].strip()), len(lines))
    return lines[start:end]


def _assert_no_padding(text: str) -> None:
    trailing = [line for line in text.splitlines() if line != line.rstrip()]
    assert not trailing, trailing[:3]


def test_info_first_table_is_not_padded_to_its_widest_row(tmp_path):
    result = runner.invoke(app, ["info", str(_conditioned(tmp_path))])
    assert result.exit_code == 0, result.stderr
    _assert_no_padding(result.stderr)
    header = _table_block(result.stderr, "Profile")
    rows = {line.split()[0]: line for line in header[1:]}
    assert {"measured", "conditions", "noise"} <= set(rows)
    assert "{" not in result.stderr and "threads 1, cpu AMD EPYC" in rows["conditions"]
    assert len(rows["model"]) < 40  # its value's width, not the conditions row's
    assert max(len(line) for line in header) == len(rows["conditions"])


@pytest.mark.parametrize(
    "args",
    [
        ("solve", "resnet50", "--algo", "rotor", "--mem", "1GB"),
        ("algos",),
        ("algos", "pofo"),
        ("compare", "resnet50", "--mem", "0.6GB:1.7GB:3"),
    ],
    ids=" ".join,
)
def test_tables_carry_no_trailing_blanks(args):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip()
    _assert_no_padding(result.stderr)


def test_simulate_table_carries_no_trailing_blanks(net, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(
        runner.invoke(app, ["solve", str(net), "-a", "rotor", "-m", "1MB", "-f", "json"]).stdout
    )
    result = runner.invoke(app, ["simulate", str(net), str(plan)])
    assert result.exit_code == 0, result.stderr
    _assert_no_padding(result.stderr)


def _memplan(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("MEMPLAN_DEBUG", "COLUMNS", "FORCE_COLOR", "TERM"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "memplan", *args],
        capture_output=True,  # stdout and stderr are pipes, as in a CI log
        text=True,
        env=env,
        timeout=300,
    )


def test_info_through_pipes_is_plain_and_narrow(tmp_path):
    done = _memplan("info", str(_conditioned(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # the tables go to stderr
    _assert_no_padding(done.stderr)
    assert "\x1b[" not in done.stderr  # no colour codes in a log
    header = _table_block(done.stderr, "Profile")
    widths = sorted(len(line) for line in header[1:])
    assert widths[len(widths) // 2] < 60, header  # most rows as wide as their own text


# ---- memplan run ---------------------------------------------------------------------------


def _doc(steps: int) -> dict:
    peaks = [900_000 + (5_000 if k == 3 else 0) for k in range(steps)]
    return {
        "steps": steps,
        "device": "cpu",
        "torch_optimizer": "SGD",
        "measured_what": "torch.profiler allocator events over the bytes allocated before",
        "measured_step_peaks": peaks,
        "losses": [5.0 - 0.01 * k for k in range(steps)],
        "step_ms": [30.0 + k % 7 for k in range(steps)],
    }


@pytest.mark.parametrize("steps", [1, 3, STEP_LINES, STEP_LINES + 1, 50])
def test_run_prints_one_line_per_step_or_a_summary(steps):
    lines = step_lines(_doc(steps))
    assert lines[0].startswith(f"memplan: trained {steps} step")
    if steps <= STEP_LINES:
        assert len(lines) == 1 + steps
        assert lines[1].startswith("memplan: step 1: peak 900.00 KB, loss 5.0000")
    else:
        assert len(lines) == 2
        assert "peak 900.00 KB to 905.00 KB (at step 4)" in lines[1]
        assert f"{5.0 - 0.01 * (steps - 1):.4f} at step {steps}" in lines[1]
    assert all(len(SIZE.findall(line)) <= 2 for line in lines), lines  # never 50 peaks


def test_run_explains_the_planned_and_the_measured_iteration():
    cpu = " ".join(iteration_notes(_doc(2)))
    assert "the profile's forward and backward times" in cpu and "optimizer.step()" in cpu
    assert "torch.profiler recording every allocator event" in cpu
    cuda = " ".join(iteration_notes({**_doc(2), "device": "cuda"}))
    assert "synchronizations" in cuda and "torch.profiler" not in cuda


RUN = ["run", "gpt-tiny", "-b", "2", "--input-shape", "16", "--mem", "1GB", "--repeats", "1"]


@pytest.mark.torch
def test_run_steps_in_a_log_with_clirunner():
    pytest.importorskip("torch")
    result = runner.invoke(app, [*RUN, "--steps", str(STEP_LINES + 2)])
    assert result.exit_code == 0, result.stderr
    _assert_no_padding(result.stderr)
    lines = result.stderr.splitlines()
    assert any(line.startswith("memplan: iteration, measured: the whole step") for line in lines)
    summary = [line for line in lines if line.startswith("memplan: steps 1 to ")]
    assert len(summary) == 1 and not any(line.startswith("memplan: step ") for line in lines)
    assert all(len(SIZE.findall(line)) <= 2 for line in lines if line.startswith("memplan:"))


@pytest.mark.torch
def test_run_steps_through_pipes():
    pytest.importorskip("torch")
    done = _memplan(*RUN, "--steps", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    _assert_no_padding(done.stderr)
    steps = [line for line in done.stderr.splitlines() if line.startswith("memplan: step ")]
    assert [line.split(":")[1] for line in steps] == [" step 1", " step 2", " step 3"]
