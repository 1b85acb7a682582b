"""One Ctrl-C (or SIGTERM, SIGHUP) stops the long searches at once: exit 128 + the signal,
nothing written.

NOTE [ interrupts ] in memplan/interrupt.py. Each test runs ``python -m memplan`` in a subprocess
with a time limit far beyond the test's patience and sends one signal once the work is under way
(after the first live-progress line of a CP-SAT search, or a few seconds into ``alloc``). The
instances are built here (seeded) or bundled, and are far from solved when the signal comes.
tests/cli/test_signals.py sends them at exact points of every command instead.
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import memplan
from memplan.profile.synthetic import random_chain
from tests.oracles.graph import random_dag

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

PATIENCE = 120.0
"""Seconds a run may take to stop after the signal before the test fails (the limit is 600)."""


def _interrupted(
    args: list[str],
    out: Path,
    marker: str | None,
    wait: float = 0.0,
    signum: signal.Signals = signal.SIGINT,
):
    """Run memplan, send ``signum`` after the first stderr line holding ``marker`` (or after
    ``wait`` seconds), and return (exit code, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "memplan", *args, "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    if marker is None:
        time.sleep(wait)
    else:
        while True:
            try:
                line = lines.get(timeout=PATIENCE)
            except queue.Empty:
                proc.kill()
                pytest.fail(f"no {marker!r} line within {PATIENCE} s: {''.join(seen)}")
            if line is None:
                pytest.fail(f"memplan ended before the signal: {''.join(seen)}")
            seen.append(line)
            if marker in line:
                break
    assert proc.poll() is None, f"memplan ended before the signal: {''.join(seen)}"
    proc.send_signal(signum)
    try:
        code = proc.wait(timeout=PATIENCE)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"one {signum.name} did not stop memplan within {PATIENCE} s")
    while (line := lines.get(timeout=10)) is not None:
        seen.append(line)
    return code, "".join(seen)


def _check_stopped(
    code: int, stderr: str, out: Path, signum: signal.Signals = signal.SIGINT
) -> None:
    assert code == 128 + signum, stderr
    last = "interrupted" if signum == signal.SIGINT else f"stopped by {signum.name}"
    assert stderr.rstrip().endswith(f"memplan: {last}"), stderr
    assert "Traceback" not in stderr
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)]
)  # SIGTERM by default: test_signals.py
def test_pipeline_ilp_stops_at_once(tmp_path, signum):
    """The issue's case: resnet50 on 4 GPUs at 2 GB, far from CP-SAT's bound for minutes."""
    out = tmp_path / "plan.json"
    args = ["solve", "resnet50", "--algo", "pipeline-ilp", "--gpus", "4", "--mem", "2GB"]
    code, stderr = _interrupted([*args, "--time-limit", "600"], out, "pipeline-ilp (", 0, signum)
    _check_stopped(code, stderr, out, signum)


@pytest.mark.parametrize(
    ("algo", "nodes", "marker"),
    [
        ("olla-order", 30, "olla-order:"),
        ("olla", 30, "olla-order:"),
    ],
)  # olla-address places with memplan.alloc, which reaches the bound at once on these DAGs
# (its search stopping: test_alloc_stops_at_once; a signal while it writes: test_signals.py)
def test_graph_searches_stop_at_once(tmp_path, algo, nodes, marker):
    """Random DAGs (tests/oracles/graph.py) whose first solutions are far from the bound."""
    prof = tmp_path / "dag.yaml"
    memplan.profile.save_profile(random_dag(7, nodes, weights=5), prof)
    out = tmp_path / "plan.json"
    args = ["solve", str(prof), "--algo", algo, "--mem", "1TB", "--time-limit", "600"]
    code, stderr = _interrupted(args, out, marker)
    _check_stopped(code, stderr, out)


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)]
)  # SIGHUP by default: test_signals.py
def test_alloc_stops_at_once(tmp_path, signum):
    """400 random buffers: the exact search does not prove its arena least within minutes."""
    rng = np.random.default_rng(5)
    lower = rng.integers(0, 1000, 400)
    upper = lower + rng.integers(1, 200, 400)
    size = rng.integers(1, 1000, 400)
    csv = tmp_path / "buffers.csv"
    csv.write_text(
        "id,lower,upper,size\n"
        + "".join(f"b{i},{lower[i]},{upper[i]},{size[i]}\n" for i in range(400))
    )
    out = tmp_path / "placed.csv"
    args = ["alloc", str(csv), "--time-limit", "600"]
    code, stderr = _interrupted(args, out, None, wait=4.0, signum=signum)
    _check_stopped(code, stderr, out, signum)


def test_rotor_stops_at_once(tmp_path):
    """A rotor grid of 300 stages at 3000 slots: seconds of work in the compiled core, which
    polls for the signal (NOTE [ stopping a kernel ] in src/stop.hpp)."""
    chain = random_chain(300, seed=2, max_size=10**6)
    prof = tmp_path / "chain.yaml"
    memplan.profile.save_profile(chain, prof)
    out = tmp_path / "plan.json"
    args = ["solve", str(prof), "--algo", "rotor", "--mem", "103003910", "--optimizer", "none"]
    code, stderr = _interrupted([*args, "--slots", "3000"], out, None, wait=2.5)
    _check_stopped(code, stderr, out)


def test_every_cp_sat_solve_goes_through_the_interrupt_relay():
    """A new CP-SAT call site that calls ``solver.solve`` directly would swallow Ctrl-C again."""
    root = Path(memplan.__file__).parent
    users = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "CpSolver()" not in text:
            continue
        users.append(path.name)
        direct = re.findall(r"\bsolver\.solve\(", text)
        assert not direct, f"{path}: call memplan.interrupt.solve(solver, model, callback)"
        assert "interrupt.solve(" in text, path
    assert {"olla.py", "placement.py", "joint.py", "ilp.py", "feasible.py"} <= set(users)


def test_an_interrupt_wrapped_by_python_is_still_an_interrupt():
    """Python 3.11 wraps what ``__set_name__`` raises in a RuntimeError: a signal that lands while
    a class body runs (a lazy import inside the profiler) must stop memplan, not be reported as
    the model's error (exit 2)."""
    from memplan.interrupt import Terminated, interrupt_within

    def wrapped() -> RuntimeError:
        try:
            raise Terminated(15)
        except Terminated as stop:
            try:
                raise RuntimeError("Error calling __set_name__ on ...") from stop
            except RuntimeError as exc:
                return exc

    exc = wrapped()
    assert isinstance(interrupt_within(exc), Terminated)
    assert interrupt_within(RuntimeError("the model's own")) is None
