"""``memplan profile`` end to end with real torch: the user's pipes, CPU bandwidth, progress lines.

The headline of the README, ``memplan profile resnet50 | memplan solve --algo dynprog --mem 8GB``,
is run here on a small model (gpt-tiny, batch 2, 16 tokens): a CPU profile carries the bandwidth
of the runtime's own offload copy, so the offloading and combined algorithms read it from the
pipe, and ``memplan run`` of an offloading plan trains on CPU with it. CliRunner's stderr is not a
terminal: the progress comes as plain lines, one per stage.
"""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

import memplan  # noqa: E402
from memplan.api import describe  # noqa: E402
from memplan.cli.app import app  # noqa: E402
from memplan.cli.progress import Progress  # noqa: E402
from memplan.profile.synthetic import random_chain  # noqa: E402

pytestmark = pytest.mark.torch

TINY = ["gpt-tiny", "-b", "2", "--input-shape", "16"]
STAGES = ["embedding", "block0", "block1", "head", "loss"]


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def piped() -> tuple[str, str]:
    """(stdout, stderr) of ``memplan profile gpt-tiny ...`` on CPU."""
    result = run("profile", *TINY, "--repeats", "1", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    return result.stdout, result.stderr


def test_cpu_profile_carries_the_runtime_copy_bandwidth(piped):
    prof = memplan.load_profile(piped[0])
    assert prof.device.kind == "cpu" and prof.bandwidth is not None and prof.bandwidth > 0
    method = prof.measured.extra["bandwidth"]
    assert "runtime's CPU offload copy" in method and "slower direction" in method


@pytest.mark.parametrize("algo", ["dynprog", "pofo"])
def test_profile_pipes_into_the_offloading_algorithms(piped, algo):
    """`memplan profile MODEL | memplan solve --algo dynprog --mem 8GB`: no --bandwidth needed."""
    result = run("solve", "--algo", algo, "--mem", "8GB", "-f", "json", input=piped[0])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (
        doc["feasible"] and doc["budget"]["bandwidth"] == memplan.load_profile(piped[0]).bandwidth
    )


def test_profile_progress_is_one_line_per_stage_off_a_terminal(piped):
    lines = [line for line in piped[1].splitlines() if line.startswith("memplan: profiling")]
    assert (
        lines[0]
        == "memplan: profiling gpt-tiny: building the model and checking its chain of stages"
    )
    pattern = re.compile(r"^memplan: profiling gpt-tiny: (\d+)/5 (\S+) \(\d+ s\)$")
    steps = [pattern.match(line) for line in lines[1:]]
    assert all(steps), lines
    assert [(int(m[1]), m[2]) for m in steps] == list(enumerate(STAGES, start=1))
    assert piped[1].splitlines()[-1].startswith("memplan: profiled gpt-tiny: 5 stages on cpu")


def test_estimate_progress_is_one_line_per_stage_off_a_terminal():
    result = run("profile", *TINY, "--estimate", "a100")
    assert result.exit_code == 0, result.stderr
    label = "memplan: profiling gpt-tiny (times estimated for a100): "
    steps = [line for line in result.stderr.splitlines() if line.startswith(label)]
    assert len(steps) == 1 + len(STAGES)
    assert memplan.load_profile(result.stdout).measured.estimate["sizes_on"] == "fake"


def test_run_trains_an_offloading_plan_on_cpu_with_the_profile_bandwidth(piped):
    """`memplan run --algo dynprog` without --bandwidth: the profile it measures has one."""
    prof = memplan.load_profile(piped[0])
    need = describe(prof, "none")
    least, peak = need["min_memory"]["offload"], need["offload_peak"]
    budget = least + (peak - least) // 3  # below the store-all need: something is offloaded
    args = ["run", *TINY, "--algo", "dynprog", "--mem", budget, "--optimizer", "none"]
    result = run(*args, "--repeats", "1", "--steps", "2", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["device"] == "cpu" and doc["algorithm"] == "dynprog"
    assert doc["offloaded_bytes"] == doc["offloaded_bytes_planned"] > 0
    assert doc["forwards_measured"] == doc["forwards_planned"]
    assert re.search(r"memplan: profiling gpt-tiny: 5/5 loss", result.stderr)


def test_cpu_bandwidth_is_the_runtime_copy_of_the_largest_tensor():
    from memplan.torch.measure.bandwidth import offload_copy_bytes, profile_bandwidth

    mib = 2**20
    assert [offload_copy_bytes(n) for n in (0, 5 * mib, 10**12)] == [mib, 5 * mib, 64 * mib]
    rate, how = profile_bandwidth(torch.device("cpu"), 2 * mib, repeats=2)
    assert rate > 0
    assert how.startswith("the runtime's CPU offload copy of 2 MiB") and "median of 2" in how


# --------------------------------------------------------------------------- Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_every_step(capsys):
    clock = Clock()
    with Progress("profiling net", terminal=False, clock=clock) as progress:
        progress.note("starting")
        for done, name in enumerate(["a", "b"], start=1):
            clock.now += 2.4
            progress.update(done, 2, name)
    assert capsys.readouterr().err.splitlines() == [
        "memplan: profiling net: starting",
        "memplan: profiling net: 1/2 a (2 s)",
        "memplan: profiling net: 2/2 b (5 s)",
    ]


def test_progress_lines_at_most_every_so_often(capsys):
    clock = Clock()
    with Progress("comparing", every=10.0, terminal=False, clock=clock) as progress:
        for done in range(1, 31):
            clock.now += 1.0
            progress.update(done, 30, "plans")
    assert capsys.readouterr().err.splitlines() == [
        "memplan: comparing: 10/30 plans (10 s)",
        "memplan: comparing: 20/30 plans (20 s)",
        "memplan: comparing: 30/30 plans (30 s)",
    ]


def test_progress_draws_no_lines_on_a_terminal(capsys):
    with Progress("profiling net", terminal=True) as progress:
        progress.note("starting")
        progress.update(1, 2, "a")
    assert "memplan: profiling net" not in capsys.readouterr().err


def test_long_compare_prints_progress_lines(tmp_path, monkeypatch):
    path = tmp_path / "net.yaml"
    memplan.save_profile(random_chain(6, seed=3, max_size=1000), path)
    args = ["compare", path, "--algos", "rotor,revolve", "--mem", "auto:3", "-f", "csv"]
    quick = run(*args)
    assert quick.exit_code == 0, quick.stderr
    assert "memplan: comparing" not in quick.stderr  # a short sweep stays quiet
    monkeypatch.setattr("memplan.cli.compare.SWEEP_LINE_SECONDS", 1e-9)  # every plan is "long"
    slow = run(*args)
    assert slow.exit_code == 0, slow.stderr
    steps = re.findall(r"^memplan: comparing: (\d+)/6 plans \(\d+ s\)$", slow.stderr, re.M)
    assert steps == [str(k) for k in range(1, 7)]
    assert _without_seconds(slow.stdout) == _without_seconds(quick.stdout)  # the same plans


def _without_seconds(text: str) -> list[list[str]]:
    return [line.split(",")[:-1] for line in text.splitlines()]  # seconds: the last column
