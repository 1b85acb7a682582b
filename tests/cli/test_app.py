"""The command line, through typer's CliRunner (and a few real subprocess pipes).

Every exit code of the SPEC is produced here: 0 (a plan that fits, a valid schedule), 1 (infeasible,
an invalid or over-budget schedule), 2 (bad usage or input), plus 70 for memplan's own bugs.
Errors must be one clean line on stderr, without a traceback unless ``--debug``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import types

import pytest
import yaml
from typer.testing import CliRunner

import memplan
import memplan.core
from memplan.api import describe
from memplan.cli import common
from memplan.cli.app import app
from memplan.profile.synthetic import homogeneous_chain, random_chain
from tests.paths import ROOT

runner = CliRunner()


def run(*args: str, input: str | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def assert_one_error_line(result, code: int = 2, *needles: str) -> str:
    """The command failed with ``code`` and one clean ``memplan: ...`` line on stderr."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, "no message on stderr"
    assert "Traceback" not in result.stderr
    assert "Traceback" not in result.stdout
    last = lines[-1]
    assert last.startswith("memplan: "), last
    for needle in needles:
        assert needle in last, (needle, last)
    if code == 2:
        assert len(lines) == 1, lines
        assert result.stdout == ""
    return last


@pytest.fixture
def needs(net) -> dict:
    return describe(str(net))


# --------------------------------------------------------------------------- exit 0


def test_version_and_help():
    result = run("--version")
    assert result.exit_code == 0
    first, core = result.stdout.strip().splitlines()
    assert first == f"memplan {memplan.__version__}"
    info = memplan.core.kernels.build_info()
    assert (
        core
        == f"core {info['version']} ({info['compiler']}, {info['build_type']}, nanobind {info['nanobind']})"
    )
    for command in ("profile", "solve", "simulate", "compare", "info", "algos"):
        assert run(command, "--help").exit_code == 0, command


def test_solve_table_goes_to_stderr(net, needs):
    result = run("solve", net, "--algo", "store-all", "--mem", needs["store_all_memory"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "store-all" in result.stderr
    assert "Operations" in result.stderr
    assert "6 F_all, 6 B; 0 forwards recomputed" in result.stderr
    assert "\x1b[" not in result.stderr  # no colour codes when not a terminal


def test_solve_json_is_one_document(net, needs):
    result = run("solve", net, "--algo", "store-all", "--mem", "1GB", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    doc = json.loads(result.stdout)
    assert doc["format"] == "memplan-schedule/1"
    assert doc["feasible"] is True
    assert doc["algorithm"] == "store-all"
    assert doc["budget"]["memory"] == 10**9
    assert doc["peak_memory"] == needs["store_all_memory"]
    for field in ("makespan", "lower_bound", "static_memory", "solver", "ops", "profile"):
        assert field in doc
    assert len(doc["ops"]) == 12
    assert doc["makespan"] == pytest.approx(doc["lower_bound"])


def test_solve_yaml(net):
    result = run("solve", net, "--algo", "store-all", "--mem", "1GiB", "-f", "yaml")
    assert result.exit_code == 0, result.stderr
    doc = yaml.safe_load(result.stdout)
    assert doc["feasible"] is True and doc["budget"]["memory"] == 2**30


def test_solve_output_file_is_written_atomically(net, tmp_path):
    target = tmp_path / "plan.json"
    result = run("solve", net, "--algo", "store-all", "--mem", "1GB", "-o", target)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert json.loads(target.read_text())["feasible"] is True  # format from the suffix
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_solve_rotor_recomputes(net, needs):
    budget = (needs["min_memory"]["chain"] + needs["store_all_memory"]) // 2
    result = run("solve", net, "--algo", "rotor", "--mem", budget, "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["peak_memory"] <= budget
    assert doc["makespan"] >= doc["lower_bound"]


def test_solve_rotor_slots_auto(net, needs):
    """``--slots auto`` is the default: exact in bytes on a short chain (no slots reported)."""
    budget = (needs["min_memory"]["chain"] + needs["store_all_memory"]) // 2
    docs = []
    for extra in ([], ["--slots", "auto"], ["--slots", "AUTO"]):
        result = run("solve", net, "--algo", "rotor", "--mem", budget, "-f", "json", *extra)
        assert result.exit_code == 0, result.stderr
        docs.append(json.loads(result.stdout))
    assert all(doc["solver"]["slots"] is None for doc in docs)
    assert len({doc["makespan"] for doc in docs}) == 1
    result = run("solve", net, "--algo", "rotor", "--mem", budget, "-f", "json", "--slots", "50")
    assert json.loads(result.stdout)["solver"]["slots"] <= 50


def test_stdin_dash_and_omitted_profile(net):
    text = net.read_text()
    for args in (["solve", "-"], ["solve"]):
        result = run(*args, "--algo", "store-all", "--mem", "1GB", "-f", "json", input=text)
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["feasible"] is True


def test_simulate_valid(net, tmp_path):
    plan = tmp_path / "plan.json"
    solved = run("solve", net, "--algo", "store-all", "--mem", "1GB", "-f", "json")
    plan.write_text(solved.stdout)
    result = run("simulate", net, plan)
    assert result.exit_code == 0, result.stderr
    assert "valid" in result.stderr

    result = run("simulate", net, plan, "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["valid"] is True and doc["fits"] is True and doc["violation"] is None
    solved_doc = json.loads(solved.stdout)
    assert doc["makespan"] == pytest.approx(solved_doc["makespan"])
    assert doc["peak_memory"] == solved_doc["peak_memory"]
    assert doc["budget"] == 10**9


def test_simulate_reads_the_schedule_from_stdin(net):
    solved = run("solve", net, "--algo", "store-all", "--mem", "1GB", "-f", "json")
    result = run("simulate", net, "-", "-f", "json", input=solved.stdout)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["valid"] is True


def test_info_and_algos(net, needs):
    result = run("info", net)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "random-6-seed3" in result.stderr and "s5" in result.stderr

    result = run("info", net, "--optimizer", "adam", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["optimizer"] == "adam"
    assert doc["static_memory"] == 4 * doc["weight_size"]
    assert len(doc["stage_table"]) == 6

    result = run("algos", "-f", "json")
    assert result.exit_code == 0
    names = {a["name"] for a in json.loads(result.stdout)}
    assert {"store-all", "rotor"} <= names
    result = run("algos")
    assert result.exit_code == 0 and "rotor" in result.stderr


def test_compare_formats(net, needs, tmp_path):
    lo, hi = needs["min_memory"]["chain"], needs["store_all_memory"] + 10
    span = f"{lo}:{hi}:4"
    result = run("compare", net, "--algos", "store-all,rotor", "--mem", span)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "store-all" in result.stderr and "rotor" in result.stderr
    assert " - " in result.stderr  # store-all is infeasible at the smallest budget

    result = run("compare", net, "--algos", "store-all,rotor", "--mem", span, "-f", "csv")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 8
    assert rows[0]["algorithm"] == "store-all" and rows[0]["feasible"] == "false"
    assert rows[0]["ratio"] == ""
    assert float(rows[-1]["ratio"]) == pytest.approx(1.0)

    target = tmp_path / "sweep.json"
    result = run("compare", net, "--algos", "store-all,rotor", "--mem", span, "-o", target)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(target.read_text())
    assert doc["algorithms"] == ["store-all", "rotor"] and len(doc["budgets"]) == 4
    assert len(doc["rows"]) == 8
    assert doc["slots"] == "auto"


def test_compare_plot(net, needs, tmp_path):
    pytest.importorskip("matplotlib")
    span = f"{needs['min_memory']['chain']}:{needs['store_all_memory']}:3"
    for name in ("sweep.png", "sweep.svg"):
        target = tmp_path / name
        result = run("compare", net, "--algos", "store-all,rotor", "--mem", span, "--plot", target)
        assert result.exit_code == 0, result.stderr
        assert target.stat().st_size > 0
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in (tmp_path / "sweep.svg").read_text()


# --------------------------------------------------------------------------- exit 1


def test_solve_infeasible_says_the_least_memory(net, needs):
    least = needs["min_memory"]["chain"]
    result = run("solve", net, "--algo", "rotor", "--mem", least - 1)
    line = assert_one_error_line(result, 1, "infeasible", f"{least} bytes", f"{least - 1} bytes")
    assert "least memory that fits" in line


def test_solve_infeasible_json_still_prints_the_document(net, needs):
    need = needs["store_all_memory"]
    result = run("solve", net, "--algo", "store-all", "--mem", need - 1, "-f", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["feasible"] is False
    assert doc["min_memory"] == need
    assert_one_error_line(result, 1, f"{need} bytes")


def test_simulate_over_budget(net, tmp_path, needs):
    plan = tmp_path / "plan.json"
    plan.write_text(run("solve", net, "--algo", "store-all", "--mem", "1GB", "-f", "json").stdout)
    peak = needs["store_all_memory"]
    assert_one_error_line(run("simulate", net, plan, "--mem", peak - 1), 1, "ops[")
    assert run("simulate", net, plan, "--mem", peak).exit_code == 0

    doc = json.loads(plan.read_text())
    doc["budget"]["memory"] = peak - 1  # the schedule's own budget, edited by hand
    plan.write_text(json.dumps(doc))
    result = run("simulate", net, plan, "-f", "json")
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["valid"] is False or out["fits"] is False
    assert out["violation"]


def test_simulate_hand_corrupted_schedule(net, tmp_path):
    doc = json.loads(run("solve", net, "--algo", "store-all", "--mem", "1GB", "-f", "json").stdout)
    del doc["ops"][2]  # drop F_all on stage 2: stage 3 has no input
    plan = tmp_path / "broken.json"
    plan.write_text(json.dumps(doc))
    assert_one_error_line(run("simulate", net, plan), 1, "invalid", "ops[")

    doc = json.loads(run("solve", net, "--algo", "store-all", "--mem", "1GB", "-f", "json").stdout)
    doc["makespan"] += 1.0  # a claim the replay contradicts
    plan.write_text(json.dumps(doc))
    assert_one_error_line(run("simulate", net, plan), 1, "makespan")


def test_simulate_infeasible_schedule(net, tmp_path):
    doc = run("solve", net, "--algo", "store-all", "--mem", "1", "-f", "json").stdout
    plan = tmp_path / "none.json"
    plan.write_text(doc)
    assert_one_error_line(run("simulate", net, plan), 1, "infeasible")


# --------------------------------------------------------------------------- exit 2


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: memplan-profile/1\nmodel: [unclosed\n")
    assert_one_error_line(run("solve", bad, "--algo", "rotor", "--mem", "1GB"), 2, "bad.yaml")


def test_negative_size_names_the_field(tmp_path):
    data = homogeneous_chain(3, size=8).to_dict()
    data["stages"][0]["output_size"] = -5
    path = tmp_path / "neg.yaml"
    path.write_text(yaml.safe_dump(data))
    result = run("solve", path, "--algo", "rotor", "--mem", "1GB")
    assert_one_error_line(result, 2, "neg.yaml", "stages[0].output_size")


def test_unknown_key_in_profile(tmp_path):
    data = homogeneous_chain(3).to_dict()
    data["colour"] = "red"
    path = tmp_path / "unknown.yaml"
    path.write_text(yaml.safe_dump(data))
    assert_one_error_line(run("info", path), 2, "colour")


def test_missing_file():
    result = run("solve", "no/such/net.yaml", "--algo", "rotor", "--mem", "1GB")
    assert_one_error_line(result, 2, "no/such/net.yaml")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--algo", "nope", "--mem", "1GB"], ["nope", "rotor"]),
        (["--algo", "rotor", "--mem", "8G"], ["--mem", "8GB", "8GiB"]),
        (["--algo", "rotor", "--mem", "lots"], ["--mem", "e.g."]),
        (["--algo", "rotor"], ["--mem", "required"]),
        (["--mem", "1GB"], ["--algo", "required"]),
        (["--algo", "rotor", "--mem", "1GB", "--slots", "1"], ["--slots"]),
        (["--algo", "rotor", "--mem", "1GB", "--slots", "many"], ["--slots", "auto"]),
        (["--algo", "rotor", "--mem", "1GB", "--slots", "-5"], ["--slots", "auto"]),
        (["--algo", "rotor", "--mem", "1GB", "--bandwidth", "12G/s"], ["--bandwidth", "12GB"]),
        (["--algo", "rotor", "--mem", "1GB", "--time-limit", "0"], ["--time-limit"]),
        (["--algo", "rotor", "--mem", "1GB", "-o", "plan.txt"], ["--format"]),
        (["--algo", "rotor", "--mem", "1GB", "-f", "table", "-o", "plan.json"], ["--format"]),
    ],
)
def test_solve_bad_usage(net, args, needles):
    assert_one_error_line(run("solve", net, *args), 2, *needles)


def test_unwritable_output(net, tmp_path):
    target = tmp_path / "missing-dir" / "plan.json"
    result = run("solve", net, "--algo", "store-all", "--mem", "1GB", "-o", target)
    assert_one_error_line(result, 2, "cannot write")


def test_click_usage_errors_exit_2(net):
    assert run("solve", net, "--algo", "rotor", "--mem", "1GB", "--format", "xml").exit_code == 2
    assert run("solve", net, "--no-such-option").exit_code == 2
    assert run("simulate", net).exit_code == 2  # SCHEDULE missing


def test_no_profile_with_a_terminal_on_stdin(monkeypatch):
    monkeypatch.setattr(common, "stdin_is_terminal", lambda: True)
    result = run("solve", "--algo", "rotor", "--mem", "1GB")
    assert_one_error_line(result, 2, "PROFILE", "memplan profile")


def test_ambiguous_bundled_name(monkeypatch, tmp_path):
    import memplan.profile.io as io_module

    for name in ("netA", "netB"):
        memplan.save_profile(homogeneous_chain(3), tmp_path / f"{name}.yaml")
    monkeypatch.setattr(io_module, "BUNDLED_DIR", tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    assert_one_error_line(run("info", "net"), 2, "ambiguous", "netA", "netB")
    assert run("info", "netA", "-f", "json").exit_code == 0  # an exact name wins
    assert_one_error_line(run("info", "nothing-like-it"), 2, "netA")


def test_compare_bad_input(net):
    assert_one_error_line(run("compare", net, "--mem", "1GB"), 2, "START:STOP")
    assert_one_error_line(run("compare", net), 2, "--mem")
    result = run("compare", net, "--mem", "1GB:2GB", "--algos", "rotor,foo")
    assert_one_error_line(result, 2, "foo")
    result = run("compare", net, "--mem", "1GB:2GB", "--plot", "sweep.gif")
    assert_one_error_line(result, 2, ".png")


def test_compare_plot_without_matplotlib(net, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = run("compare", net, "--mem", "1GB:2GB:2", "--plot", tmp_path / "x.png")
    assert_one_error_line(result, 2, "memplan[plot]")
    assert not (tmp_path / "x.png").exists()


def test_simulate_bad_input(net, tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text('{"format": "memplan-schedule/1", "ops": [}')
    assert_one_error_line(run("simulate", net, bad), 2, "plan.json")
    bad.write_text(json.dumps({"format": "something-else"}))
    assert_one_error_line(run("simulate", net, bad), 2, "format")
    assert_one_error_line(run("simulate", "-", "-"), 2, "stdin")


def test_simulate_other_profile(net, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(run("solve", net, "--algo", "store-all", "--mem", "1GB", "-f", "json").stdout)
    other = tmp_path / "other.yaml"
    memplan.save_profile(homogeneous_chain(4), other)
    assert_one_error_line(run("simulate", other, plan), 2, "stages")


# --------------------------------------------------------------------------- profile


def _fake_profiler(monkeypatch, calls: list):
    def profile_model(model, *, progress=None, **kwargs):
        calls.append((model, kwargs))
        prof = random_chain(4, seed=1, max_size=100)
        for done, stage in enumerate(prof.stages, start=1):
            if progress is not None:
                progress(stage.name, done, prof.length)
        return prof.model_copy(update={"model": model})

    module = types.ModuleType("memplan.torch.profiler.model")
    module.profile_model = profile_model
    package = types.ModuleType("memplan.torch")
    package.profiler = module
    monkeypatch.setitem(sys.modules, "memplan.torch", package)
    monkeypatch.setitem(sys.modules, "memplan.torch.profiler.model", module)
    monkeypatch.setattr("memplan.cli.profile.has_torch", lambda: True)


def test_profile_writes_yaml_to_stdout(monkeypatch, tmp_path):
    calls: list = []
    _fake_profiler(monkeypatch, calls)
    result = run(
        "profile", "tinynet", "--batch-size", "8", "--input-shape", "3,32,32", "--device", "cpu"
    )
    assert result.exit_code == 0, result.stderr
    assert calls == [
        (
            "tinynet",
            {"device": "cpu", "dtype": "float32", "batch_size": 8, "input_shape": (3, 32, 32)},
        )
    ]
    prof = memplan.load_profile(result.stdout)
    assert prof.model == "tinynet" and prof.length == 4

    # ... and it composes with solve through a pipe.
    solved = run("solve", "--algo", "store-all", "--mem", "1GB", "-f", "json", input=result.stdout)
    assert solved.exit_code == 0, solved.stderr
    assert json.loads(solved.stdout)["profile"]["model"] == "tinynet"

    target = tmp_path / "tiny.yaml"
    result = run("profile", "tinynet", "-o", target)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert memplan.load_profile(target).model == "tinynet"


def test_profile_without_torch(monkeypatch):
    monkeypatch.setattr("memplan.cli.profile.has_torch", lambda: False)
    assert_one_error_line(run("profile", "resnet18"), 2, "memplan[torch]")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--graph", "--repeats", "3"], "--graph"),
        (["--graph", "--device", "cuda"], "--graph"),
        (["--estimate", "nosuchgpu"], "--estimate"),
        (["--gpu-spec", "gpu.yaml"], "--gpu-spec"),
        (["--input-shape", "3,x,224"], "--input-shape"),
        (["--batch-size", "0"], "--batch-size"),
    ],
)
def test_profile_bad_usage(args, needle):
    assert_one_error_line(run("profile", "resnet18", *args), 2, needle)


# --------------------------------------------------------------------------- bugs: exit 70


def test_internal_error_is_not_an_input_error(net, monkeypatch):
    def broken_solve(*args, **kwargs):
        raise memplan.InternalError("rotor and the simulator disagree")

    monkeypatch.setattr(memplan.api, "_solve", broken_solve)  # what `solve` calls
    result = run("solve", net, "--algo", "rotor", "--mem", "1GB")
    line = assert_one_error_line(result, 70, "internal error", "disagree", "--debug")
    assert len(result.stderr.strip().splitlines()) == 1, line

    result = run("--debug", "solve", net, "--algo", "rotor", "--mem", "1GB")
    assert result.exit_code == 70
    assert "Traceback" in result.stderr


def test_unexpected_exception(net, monkeypatch):
    def broken_solve(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(memplan.api, "_solve", broken_solve)  # what `solve` calls
    assert_one_error_line(
        run("solve", net, "--algo", "rotor", "--mem", "1GB"), 70, "ZeroDivisionError"
    )
    monkeypatch.setenv("MEMPLAN_DEBUG", "1")
    assert "Traceback" in run("solve", net, "--algo", "rotor", "--mem", "1GB").stderr


def test_debug_keeps_the_exit_code_of_input_errors(tmp_path):
    result = run("--debug", "info", tmp_path / "missing.yaml")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr


# --------------------------------------------------------------------------- real processes


def _memplan(*args: str, **kwargs) -> list[str]:
    return [sys.executable, "-m", "memplan", *map(str, args)]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MEMPLAN_DEBUG", None)
    return env


def test_real_pipe_solve_into_simulate(net):
    solve = subprocess.Popen(
        _memplan("solve", net, "--algo", "store-all", "--mem", "1GB", "--format", "json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    simulate = subprocess.run(
        _memplan("simulate", net, "-", "--format", "json"),
        stdin=solve.stdout,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    solve.stdout.close()
    assert solve.wait(timeout=120) == 0
    assert simulate.returncode == 0, simulate.stderr
    assert json.loads(simulate.stdout)["valid"] is True


def test_real_pipe_profile_on_stdin(net):
    with net.open("rb") as stdin:
        done = subprocess.run(
            _memplan("solve", "--algo", "store-all", "--mem", "1GB", "--format", "json"),
            stdin=stdin,
            capture_output=True,
            text=True,
            env=_env(),
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["feasible"] is True


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_real_terminal_stdin_without_profile():
    master, slave = os.openpty()
    try:
        done = subprocess.run(
            _memplan("solve", "--algo", "rotor", "--mem", "1GB"),
            stdin=slave,
            capture_output=True,
            text=True,
            env=_env(),
            timeout=120,
        )
    finally:
        os.close(master)
        os.close(slave)
    assert done.returncode == 2
    assert done.stderr.startswith("memplan: error: missing PROFILE")
    assert len(done.stderr.strip().splitlines()) == 1


def test_cli_import_stays_light():
    code = (
        "import sys, memplan.cli.app; "
        "print(sorted(m for m in ('torch', 'matplotlib', 'ortools') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.torch
@pytest.mark.slow
def test_profile_with_the_real_profiler(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("memplan.torch.profiler.model")
    target = tmp_path / "r18.yaml"
    args = ("profile", "resnet18", "-b", "2", "--input-shape", "3,32,32", "--device", "cpu")
    result = run(*args, "--repeats", "1", "-o", target)
    assert result.exit_code == 0, result.stderr
    prof = memplan.load_profile(target)
    assert prof.length > 1 and prof.batch_size == 2
    solved = run("solve", target, "--algo", "rotor", "--mem", "1TB", "-f", "json")
    assert solved.exit_code == 0, solved.stderr
