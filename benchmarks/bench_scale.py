"""Scale: time and peak memory of ``memplan solve`` on long chains and large joins, per command.

Every command runs as its own process (``memplan solve ... --format json``), timed with its own
resource usage (``os.wait4``: CPU seconds user + system, peak RSS) and the wall clock, on seeded
synthetic profiles (:func:`memplan.profile.synthetic.random_chain` / ``random_join``: sizes up to
100 MB, times 0.1-10 ms, 12 GB/s), so that every figure can be reproduced:

* ``pofo`` (with ``rotor`` and ``dynprog`` alone beside it) on chains of 50 to 1000 stages at
  10% of the way from rotor's least memory to the store-all need (where recomputing and
  offloading both matter);
* ``dynprog`` on 100 to 2000 stages at the same budget;
* ``rotor-half``, ``dynprog-half`` and ``pofo-half``: each on 100 to 2000 stages of the
  synthetic default sizes (1 to 10 bytes), half-way from rotor's least memory to the store-all
  need at 1 GB/s, where dynprog's plan reaches the lower bound (issue 40: pofo then stops, at
  about dynprog's time);
* ``join`` on two branches of 50 to 500 stages (100 to 1000 in all), half-way between its least
  memory and store-all;
* ``periodic`` against ``store-all`` on 1,000 and 10,000 stages.

With ``--baseline PYTHON`` (another memplan's interpreter, e.g. ``/work/main/.venv/bin/python``:
an editable install imports its own checkout whatever the import path), each command also runs
with that memplan, alternated with this one, so that both columns come from the same run on the
same machine. A command stopped by ``--timeout`` (default 600 s of CPU; ``--baseline-timeout``
for the baseline's) or ``--memory-cap`` (default 6 GB of address space: the machine is shared)
shows as such.

It prints two tables, a row per command and a column per size (stages in all): CPU seconds and
peak RSS (then the baseline's), and the makespans. Usage: ``python benchmarks/bench_scale.py
[--baseline PYTHON] [--only pofo,join] [--sizes 50,100]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _common import machine

import memplan
import memplan.api
from memplan.profile.synthetic import random_chain, random_join

RATE = "12GB/s"
SLOW = "1GB/s"
"""The bandwidth of the half-way cases (issue 40: pofo where dynprog reaches the lower bound)."""
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    cpu: float
    wall: float
    rss_mb: float
    outcome: str  # "ok", "exit N", "timeout", "killed"
    makespan: float | None


def _limits(cap: int, cpu: float):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        seconds = int(cpu) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))

    return limit


def run_command(args: list[str], python: str | None, timeout: float, cap: int) -> Run:
    """``memplan`` with ``args`` in a child process (``python``: another memplan's interpreter;
    None: this one's)."""
    env = dict(os.environ)
    if python is None:
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    code = "import sys; from memplan.cli.app import main; sys.argv[0] = 'memplan'; main()"
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            [python or sys.executable, "-c", code, *args],
            stdout=out,
            stderr=err,
            env=env,
            cwd=tempfile.gettempdir(),  # not a checkout: a baseline imports its own memplan
            preexec_fn=_limits(cap, timeout),
        )
        deadline = started + 20 * timeout  # a safety net: the limit is on CPU time (shared machine)
        status, usage = 0, None
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                child.send_signal(signal.SIGKILL)
                _, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - started
        out.seek(0)
        text = out.read().decode()
        err.seek(0)
        errors = err.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    timed_out = wall > 20 * timeout or cpu >= timeout or code in (-signal.SIGXCPU, -signal.SIGKILL)
    makespan = None
    if code == 0 and not timed_out:
        with contextlib.suppress(json.JSONDecodeError):
            makespan = json.loads(text).get("makespan")
    outcome = "timeout" if timed_out else ("ok" if code == 0 else f"exit {code}")
    if code < 0 and not timed_out:
        outcome = "killed"
    if timed_out and code not in (-signal.SIGXCPU, -signal.SIGKILL) and cpu < timeout:
        outcome = "timeout"
    if "MemoryError" in errors or "Unable to allocate" in errors:
        outcome = "out of memory"
    return Run(cpu, wall, usage.ru_maxrss / 1024, outcome, makespan)


def chain_case(
    directory: Path, length: int, fraction: float, max_size: int = 10**8
) -> tuple[str, int, int]:
    """The profile's path, the budget ``fraction`` of the way from rotor's least memory to the
    store-all need, and that need (sizes up to ``max_size`` bytes)."""
    prof = random_chain(length, seed=0, max_size=max_size)
    path = directory / f"chain-{length}-{max_size}.json"
    if not path.exists():
        path.write_text(prof.model_dump_json())
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["chain"], desc["store_all_memory"]
    return str(path), round(low + (high - low) * fraction), high


def join_case(directory: Path, lengths: tuple[int, ...]) -> tuple[str, int]:
    prof = random_join(list(lengths), seed=0, max_size=10**6)
    path = directory / f"join-{'-'.join(map(str, lengths))}.json"
    path.write_text(prof.model_dump_json())
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["join"], desc["store_all_memory"]
    return str(path), (low + high) // 2


def cases(directory: Path, only: set[str], sizes: set[str]) -> list[tuple[str, str, list[str]]]:
    """``(command, size, memplan arguments)``: the commands in ``only`` and the sizes in ``sizes``
    (``"100"``, ``"50+50"``; empty: all)."""
    found: list[tuple[str, str, list[str]]] = []

    def add(name: str, size: str, args: list[str]) -> None:
        if (not only or name in only) and (not sizes or size.split()[0] in sizes):
            found.append((name, size, args))

    for length in (50, 100, 200, 500, 1000):
        path, memory, _ = chain_case(directory, length, 0.1)
        common = ["solve", path, "--mem", str(memory), "--optimizer", "none", "--format", "json"]
        add("rotor", f"{length} stages", common + ["--algo", "rotor"])
        add("pofo", f"{length} stages", common + ["--algo", "pofo", "--bandwidth", RATE])
    for length in (100, 500, 1000, 2000):
        path, memory, _ = chain_case(directory, length, 0.1)
        common = ["solve", path, "--mem", str(memory), "--optimizer", "none", "--format", "json"]
        add("dynprog", f"{length} stages", common + ["--algo", "dynprog", "--bandwidth", RATE])
    for length in (100, 500, 1000, 2000):  # issue 40 item 6: where a candidate reaches the bound
        path, memory, _ = chain_case(directory, length, 0.5, max_size=10)
        common = ["solve", path, "--mem", str(memory), "--optimizer", "none", "--format", "json"]
        for algo in ("rotor", "dynprog", "pofo"):
            args = common + ["--algo", algo] + ([] if algo == "rotor" else ["--bandwidth", SLOW])
            add(f"{algo}-half", f"{length} stages", args)
    for lengths in ((50, 50), (100, 100), (250, 250), (500, 500)):
        path, memory = join_case(directory, lengths)
        args = ["solve", path, "--algo", "join", "--mem", str(memory), "--optimizer", "none"]
        add("join", "+".join(map(str, lengths)) + " stages", args + ["--format", "json"])
    for length in (1000, 10_000):
        path, memory, store_all = chain_case(directory, length, 0.1)
        common = ["solve", path, "--optimizer", "none", "--format", "json"]
        add(
            "store-all",
            f"{length} stages",
            common + ["--algo", "store-all", "--mem", str(store_all)],
        )
        add("periodic", f"{length} stages", common + ["--algo", "periodic", "--mem", str(memory)])
    return found


def cell(run: Run | None) -> str:
    if run is None:
        return "-"
    if run.outcome == "timeout":
        return f"> {run.cpu:.0f} s CPU (stopped)"
    if run.outcome in ("killed", "out of memory"):
        return f"{run.outcome} at {run.rss_mb / 1024:.1f} GB ({run.cpu:.1f} s)"
    text = f"{run.cpu:.2f} s / {run.wall:.2f} s / {run.rss_mb:.0f} MB"
    return text if run.outcome == "ok" else f"{text} ({run.outcome})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="another memplan's Python, run beside this one")
    parser.add_argument("--only", default="", help="commands to run, e.g. pofo,join")
    parser.add_argument("--sizes", default="", help="sizes to run, e.g. 50,100,50+50,10000")
    parser.add_argument("--timeout", type=float, default=600.0, help="CPU seconds per command")
    parser.add_argument(
        "--baseline-timeout",
        type=float,
        help="CPU seconds per baseline command (default: --timeout)",
    )
    parser.add_argument("--memory-cap", type=float, default=6.0, help="GB of address space")
    args = parser.parse_args()
    only = {name for name in args.only.split(",") if name}
    sizes = {size for size in args.sizes.split(",") if size}
    cap = int(args.memory_cap * 2**30)
    base_timeout = args.timeout if args.baseline_timeout is None else args.baseline_timeout
    print(f"{machine()}; load {os.getloadavg()[0]:.1f} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name, size, command in cases(Path(tmp), only, sizes):
            base = None
            if args.baseline and len(rows) % 2:  # alternated: every other row the baseline first
                base = run_command(command, args.baseline, base_timeout, cap)
            mine = run_command(command, None, args.timeout, cap)
            if args.baseline and base is None:
                base = run_command(command, args.baseline, base_timeout, cap)
            rows.append((name, size, mine, base))
            print(f"{name} {size}: {cell(mine)} | baseline {cell(base)}", file=sys.stderr)
    print(f"load {os.getloadavg()[0]:.1f} at the end\n")
    print("\n".join(pivot(rows, args.baseline is not None)))


def stages(size: str) -> int:
    """Stages in all: ``"100 stages"`` is 100, ``"50+50 stages"`` 100."""
    return sum(int(part) for part in size.split()[0].split("+"))


def pivot(rows: list[tuple[str, str, Run, Run | None]], baseline: bool) -> list[str]:
    """Two markdown tables, a row per command and a column per size (stages in all): CPU seconds
    and peak RSS (then the baseline's), and the makespans (the baseline's where it differs)."""
    columns = sorted({stages(size) for _, size, _, _ in rows})
    names = list(dict.fromkeys(name for name, _, _, _ in rows))
    found = {(name, stages(size)): (mine, base) for name, size, mine, base in rows}
    head = "| command | " + " | ".join(f"{n:,}" for n in columns) + " |"
    rule = "|---" * (len(columns) + 1) + "|"

    def short(run: Run | None) -> str:
        if run is None:
            return "-"
        if run.outcome == "timeout":
            return f"> {run.cpu:.0f} s (stopped)"
        if run.outcome != "ok":
            return f"{run.outcome} ({run.cpu:.1f} s, {run.rss_mb:.0f} MB)"
        return f"{run.cpu:.2f} s, {run.rss_mb:.0f} MB"

    def timing(name: str, n: int) -> str:
        if (name, n) not in found:
            return ""
        mine, base = found[(name, n)]
        return short(mine) + (f"; {short(base)}" if baseline else "")

    def makespan(name: str, n: int) -> str:
        if (name, n) not in found:
            return ""
        mine, base = found[(name, n)]
        text = "-" if mine.makespan is None else f"{mine.makespan:.1f}"
        other = None if base is None else base.makespan
        if other is not None and (mine.makespan is None or abs(other - mine.makespan) > 0.05):
            text += f" ({other:.1f})"
        return text

    lines = [head, rule]
    lines += [
        f"| `{name}` | " + " | ".join(timing(name, n) for n in columns) + " |" for name in names
    ]
    lines += [
        "",
        "Makespans (ms)"
        + (", the baseline's in parentheses where it differs:" if baseline else ":"),
        "",
    ]
    lines += [head, rule]
    lines += [
        f"| `{name}` | " + " | ".join(makespan(name, n) for n in columns) + " |" for name in names
    ]
    return lines


if __name__ == "__main__":
    main()
