"""memplan.views: Chrome trace-event JSON (solve/simulate --trace) and the plan figure (plot)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import memplan
from memplan.cli.app import app
from memplan.views.trace import STREAM_TIDS, trace_document
from tests.paths import ROOT

runner = CliRunner()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_trace_schema(doc: dict) -> list[dict]:
    """The JSON Object Format of the Trace Event Format, for the event types memplan writes."""
    assert set(doc) >= {"traceEvents", "displayTimeUnit"}
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    for event in events:
        assert isinstance(event["name"], str) and event["name"]
        assert isinstance(event["pid"], int)
        ph = event["ph"]
        assert ph in ("X", "C", "M"), ph
        if ph == "X":  # complete event: ts and dur in microseconds, on a thread
            assert isinstance(event["tid"], int)
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0
        elif ph == "C":  # counter: numeric series in args
            assert isinstance(event["ts"], (int, float))
            assert event["args"] and all(
                isinstance(v, (int, float)) for v in event["args"].values()
            )
        else:  # metadata: process_name / thread_name with args.name
            assert event["name"] in ("process_name", "thread_name")
            assert isinstance(event["args"]["name"], str)
    return events


def test_solve_trace_of_a_bundled_profile(tmp_path):
    path = tmp_path / "t.json"
    result = runner.invoke(
        app, ["solve", "resnet50", "--algo", "rotor", "--mem", "1GB", "--trace", str(path)]
    )
    assert result.exit_code == 0, result.stderr
    assert f"wrote {path}" in result.stderr
    events = check_trace_schema(json.loads(path.read_text()))
    prof = memplan.load_profile("resnet50")
    sched = memplan.solve(prof, "rotor", "1GB")
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(sched.ops)
    assert {e["tid"] for e in complete} == {STREAM_TIDS["compute"]}
    assert complete[0]["name"] == f"{sched.ops[0].op} stem"
    assert any(e["name"] == "F_all layer1.0" for e in complete)
    last = sched.ops[-1]
    assert complete[-1]["ts"] + complete[-1]["dur"] == pytest.approx(last.end * 1000, abs=0.01)
    counters = [e for e in events if e["ph"] == "C"]
    curve = memplan.simulate(prof, sched).memory_curve
    assert [c["args"]["bytes"] for c in counters] == [b for _, b in curve]
    assert max(c["args"]["bytes"] for c in counters) == sched.peak_memory
    assert all(c["args"]["budget"] == 10**9 for c in counters)
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert "compute" in names


def test_simulate_trace_of_an_offload_plan(tmp_path):
    plan, path = tmp_path / "plan.json", tmp_path / "trace.json"
    solved = runner.invoke(
        app, ["solve", "resnet50@a100", "-a", "dynprog", "-m", "4GB", "-o", str(plan)]
    )
    assert solved.exit_code == 0, solved.stderr
    result = runner.invoke(app, ["simulate", "resnet50@a100", str(plan), "--trace", str(path)])
    assert result.exit_code == 0, result.stderr
    events = check_trace_schema(json.loads(path.read_text()))
    tids = {e["tid"] for e in events if e["ph"] == "X"}
    assert tids == {STREAM_TIDS["compute"], STREAM_TIDS["transfer"]}
    transfers = [e["name"] for e in events if e["ph"] == "X" and e["tid"] == 2]
    assert transfers and all(n.split()[0] in ("offload", "prefetch") for n in transfers)
    assert all(n.split()[1].startswith(("s[", "x[0]")) for n in transfers)


POFO_ARGS = ["-a", "pofo", "-m", "2.1GB", "--bandwidth", "12GB/s"]


def test_trace_and_plot_of_a_pofo_plan(tmp_path):
    """A combined plan (recomputation and offloading): compute and transfer tracks, the
    transfers named by tensor (x[k] or s[k]), the memory counter the combined simulator's."""
    plan, path = tmp_path / "pofo.json", tmp_path / "pofo.trace.json"
    args = ["solve", "resnet50@a100", *POFO_ARGS, "-o", str(plan), "--trace", str(path)]
    solved = runner.invoke(app, args)
    assert solved.exit_code == 0, solved.stderr
    sched = memplan.load_schedule(plan)
    assert sched.family == "combined" and sched.count("offload") and sched.count("F_ck")
    events = check_trace_schema(json.loads(path.read_text()))
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(sched.ops)
    compute = [e for e in complete if e["tid"] == STREAM_TIDS["compute"]]
    transfer = [e for e in complete if e["tid"] == STREAM_TIDS["transfer"]]
    assert [e["name"].split()[0] for e in compute] == [
        op.op for op in sched.ops if op.stream == "compute"
    ]
    assert [(e["name"].split()[0], e["args"]["tensor"]) for e in transfer] == [
        (op.op, op.tensor) for op in sched.ops if op.stream == "transfer"
    ]
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} >= {"compute", "transfer"}
    prof = memplan.load_profile("resnet50@a100")
    curve = memplan.simulate(prof, sched).memory_curve
    counters = [e["args"]["bytes"] for e in events if e["ph"] == "C"]
    assert counters == [b for _, b in curve] and max(counters) == sched.peak_memory
    pytest.importorskip("matplotlib")
    png = tmp_path / "pofo.png"
    result = runner.invoke(app, ["plot", str(plan), "-p", "resnet50@a100", "-o", str(png)])
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    other = tmp_path / "other.png"  # another GPU's profile: other durations, nothing drawn
    warned = runner.invoke(app, ["plot", str(plan), "-p", "resnet50@v100", "-o", str(other)])
    assert warned.exit_code == 1 and "sha256" in warned.stderr, warned.stderr
    assert "invalid: ops[0].end" in warned.stderr and not other.exists()


def test_trace_document_without_profile():
    sched = memplan.solve("resnet18", "revolve", "1GB")
    doc = json.loads(json.dumps(trace_document(sched)))
    events = check_trace_schema(doc)
    assert not [e for e in events if e["ph"] == "C"]
    assert [e["name"] for e in events if e["ph"] == "X"][0] == f"{sched.ops[0].op} 0"


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    plan, png = tmp_path / "plan.json", tmp_path / "plan.png"
    runner.invoke(app, ["solve", "resnet50", "-a", "rotor", "-m", "1GB", "-o", str(plan)])
    result = runner.invoke(app, ["plot", str(plan), "--profile", "resnet50", "-o", str(png)])
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    offload = tmp_path / "off.json"
    runner.invoke(app, ["solve", "resnet50@a100", "-a", "greedy", "-m", "4GB", "-o", str(offload)])
    svg = tmp_path / "off.svg"
    result = runner.invoke(app, ["plot", str(offload), "-p", "resnet50@a100", "-o", str(svg)])
    assert result.exit_code == 0, result.stderr
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_plot_errors(tmp_path):
    plan = tmp_path / "plan.json"
    runner.invoke(app, ["solve", "resnet50", "-a", "rotor", "-m", "1GB", "-o", str(plan)])
    bad = runner.invoke(app, ["plot", str(plan), "-p", "resnet50", "-o", str(tmp_path / "x.gif")])
    assert bad.exit_code == 2 and ".png" in bad.stderr
    other = runner.invoke(app, ["plot", str(plan), "-p", "resnet18", "-o", str(tmp_path / "a.png")])
    assert other.exit_code == 2 and "stages" in other.stderr
    infeasible = tmp_path / "no.json"
    runner.invoke(app, ["solve", "resnet50", "-a", "rotor", "-m", "300MB", "-o", str(infeasible)])
    none = runner.invoke(app, ["plot", str(infeasible), "-p", "resnet50", "-o", str(plan) + ".png"])
    assert none.exit_code == 1


def test_import_memplan_loads_neither_torch_nor_matplotlib():
    code = (
        "import sys, memplan, memplan.views, memplan.cli.app; "
        "print(any(m in sys.modules for m in ('torch', 'matplotlib')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["plan_rotor_resnet50.png", "plan_pofo_resnet50.png"])
def test_readme_figure_is_bundled(name):
    figure = ROOT / "docs" / name
    assert figure.read_bytes()[:8] == PNG_SIGNATURE


def test_trace_of_a_pipeline_plan_has_one_track_per_gpu_and_link(tmp_path):
    """Pipeline schedules: the pattern unrolled from mini-batch 0, GPU and link tracks named, each
    GPU's operations those of its pattern (every stage's F and B appear on its GPU)."""
    path = tmp_path / "pipe.trace.json"
    args = ["solve", "resnet18@a100", "-a", "pipedream", "-m", "4GB", "--gpus", "4"]
    solved = runner.invoke(app, [*args, "--link-bandwidth", "10GB/s", "--trace", str(path)])
    assert solved.exit_code == 0, solved.stderr
    sched = memplan.solve("resnet18@a100", "pipedream", "4GB", gpus=4, link_bandwidth="10GB/s")
    events = check_trace_schema(json.loads(path.read_text()))
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["tid"]}
    gpus = sorted(set(sched.assignment))
    assert [names[10 + g] for g in gpus] == [f"GPU {g}" for g in gpus]
    assert any(name.startswith("link ") for name in names.values()) == bool(sched.transfers)
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all(e["args"].get("batch", 0) >= 0 for e in complete)
    for stage, gpu in enumerate(sched.assignment):
        on_gpu = {(e["args"]["op"], e["args"]["stage"]) for e in complete if e["tid"] == 10 + gpu}
        assert {("F", stage), ("B", stage)} <= on_gpu
