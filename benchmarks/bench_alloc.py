"""Time ``memplan alloc`` on MiniMalloc's eleven challenging instances, side by side with a baseline
memplan, MiniMalloc's own command line and omnimalloc's C++ allocators (docs/benchmarks.md).

Usage::

    python benchmarks/bench_alloc.py [--repeat 5] [--dir ../shared/benchmarks/minimalloc]
        [--baseline PYTHON] [--minimalloc PATH] [--omnimalloc PYTHON] [--only A,B]

Each instance ``X.1048576.csv`` is placed at capacity 1048576. Every tool's output is checked by
memplan's independent :func:`memplan.alloc.check_placement`. For each instance, ``--repeat``
rounds run, in an order that alternates every round, and the table gives medians:

* ``command``: ``memplan alloc X.csv --capacity 1048576 -o OUT`` in a fresh process (Python's
  start-up and the imports included), by this tree's interpreter and, with ``--baseline``, by
  another one (another checkout's venv: ``/work/main/.venv/bin/python``);
* ``place``: the library call :func:`memplan.alloc.place` (CSV read included) in a process that
  has already run it once, for this tree and the baseline;
* ``MiniMalloc``: its command line (google/minimalloc, built separately: its code is not part of
  memplan), ``minimalloc --capacity=1048576 --input=X.csv --output=OUT``, wall time and the solve
  time it prints;
* ``omnimalloc``: with ``--omnimalloc PYTHON`` (a venv where ``pip install omnimalloc`` ran), the
  allocators of :data:`OMNI` on the same buffers in that process (seconds of ``allocate``; the
  arena they reach, which may pass the capacity: they are heuristics without one).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import machine

from memplan.alloc import check_placement, parse_buffers_csv, read_buffers_csv

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE.parent.parent / "shared" / "benchmarks" / "minimalloc"
CAPACITY = 1048576
OMNI = ("omni", "greedy_by_size", "supermalloc")

PLACE_SNIPPET = """
import json, sys, time
from memplan.alloc import place, read_buffers_csv
path, capacity, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
place(read_buffers_csv(path).buffers, capacity=capacity, time_limit=300)  # warm
times, cpus = [], []
for _ in range(repeat):
    started, cpu = time.perf_counter(), time.process_time()
    result = place(read_buffers_csv(path).buffers, capacity=capacity, time_limit=300)
    times.append(time.perf_counter() - started)
    cpus.append(time.process_time() - cpu)
print(json.dumps({"times": times, "cpus": cpus, "status": result.status, "nodes": result.nodes}))
"""

OMNI_SNIPPET = """
import csv, json, sys, time
import omnimalloc
from omnimalloc import Allocation, allocate
path, name = sys.argv[1], sys.argv[2]
with open(path) as handle:
    rows = list(csv.DictReader(handle))
allocs = [Allocation(i, int(r["size"]), int(r["lower"]), int(r["upper"])) for i, r in enumerate(rows)]
allocate(allocs[:4], allocator=name)  # warm
started = time.perf_counter()
done = allocate(allocs, allocator=name)
seconds = time.perf_counter() - started
by_id = {a.id: a for a in done}
print(json.dumps({"seconds": seconds, "offsets": [by_id[i].offset for i in range(len(rows))]}))
"""


def checked(path: Path, out: Path, capacity: int | None) -> str:
    """``valid`` or why not, for a placed CSV written by either tool."""
    if not out.is_file():
        return "no output"
    table = parse_buffers_csv(out.read_text(), str(out), need_offsets=True)
    b = table.buffers
    assert b.offset is not None
    original = read_buffers_csv(path).buffers
    if b.ids != original.ids or (b.size != original.size).any():
        return "output does not match the input"
    check = check_placement(b.lower, b.upper, b.size, b.offset, capacity, b.ids)
    return "valid" if check.valid else f"INVALID: {check.violation}"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_command(argv: list[str], path: Path, out: Path) -> tuple[float, float, str, str]:
    """Wall and CPU seconds of a command line (CPU: user + system of its process, which varies
    less than wall time on a loaded machine), the check of what it wrote, and its stderr."""
    if out.exists():
        out.unlink()
    cpu = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=out.parent)
    seconds = time.perf_counter() - started
    cpu = _children_cpu() - cpu
    verdict = checked(path, out, CAPACITY) if done.returncode == 0 else f"exit {done.returncode}"
    return seconds, cpu, verdict, done.stderr


def memplan_place(python: str, path: Path, repeat: int) -> dict:
    done = subprocess.run(
        [python, "-c", PLACE_SNIPPET, str(path), str(CAPACITY), str(repeat)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),  # not this tree: the baseline imports its own memplan
    )
    return json.loads(done.stdout)


def omni_run(python: str, path: Path, name: str) -> tuple[float, int, bool]:
    """Seconds of omnimalloc's ``allocate``, the arena, and whether the placement is valid."""
    done = subprocess.run(
        [python, "-c", OMNI_SNIPPET, str(path), name],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    )
    found = json.loads(done.stdout)
    b = read_buffers_csv(path).buffers
    offsets = np.array(found["offsets"], dtype=np.int64)
    check = check_placement(b.lower, b.upper, b.size, offsets, None, b.ids)
    return found["seconds"], int((offsets + b.size).max()), check.valid


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--minimalloc-repeat", type=int, help="runs of MiniMalloc (default: --repeat)"
    )
    parser.add_argument("--baseline", help="another memplan's Python (e.g. main's venv)")
    parser.add_argument("--minimalloc", type=Path, help="MiniMalloc's executable (built apart)")
    parser.add_argument("--omnimalloc", help="a Python with omnimalloc installed")
    parser.add_argument("--only", default="", help="comma-separated instance letters")
    args = parser.parse_args()
    files = sorted(args.dir.glob("*.csv"))
    if args.only:
        files = [f for f in files if f.name.split(".")[0] in set(args.only.split(","))]
    if not files:
        sys.exit(f"no instances in {args.dir}")
    print(f"machine: {machine()}")
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"median of {args.repeat} rounds, the order of the tools alternating every round")
    tools = {"this": sys.executable}
    if args.baseline:
        tools["baseline"] = args.baseline
    head = "| instance | buffers | nodes |"
    for name in tools:
        head += f" {name} command s (CPU) | {name} place s (CPU) |"
    if args.minimalloc:
        head += " MiniMalloc command s (CPU) | MiniMalloc solve s |"
    if args.baseline:
        head += " command this / baseline, CPU | place this / baseline, CPU |"
    if args.minimalloc:
        head += " command this / MiniMalloc, CPU |"
    print(head)
    print("|---|" + "---:|" * (head.count("|") - 2))
    omni_rows = []
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "out.csv"
        for path in files:
            n = len(read_buffers_csv(path).buffers)
            command: dict[str, list[float]] = {name: [] for name in tools}
            command_cpu: dict[str, list[float]] = {name: [] for name in tools}
            placed: dict[str, dict] = {}
            mm_wall: list[float] = []
            mm_cpu: list[float] = []
            mm_solve: list[float] = []
            bad: set[str] = set()
            order = [*tools, *(["minimalloc"] if args.minimalloc else [])]
            mm_rounds = args.repeat if args.minimalloc_repeat is None else args.minimalloc_repeat
            for round_ in range(args.repeat):
                for who in order if round_ % 2 == 0 else order[::-1]:
                    if who == "minimalloc" and round_ >= mm_rounds:
                        continue
                    if who == "minimalloc":
                        argv = [
                            str(args.minimalloc),
                            f"--capacity={CAPACITY}",
                            f"--input={path}",
                            f"--output={out}",
                        ]
                        seconds, cpu, verdict, log = run_command(argv, path, out)
                        mm_wall.append(seconds)
                        mm_cpu.append(cpu)
                        solve = re.search(r"Elapsed time ([0-9.]+)s", log)
                        if solve:
                            mm_solve.append(float(solve.group(1)))
                    else:
                        argv = [tools[who], "-m", "memplan", "alloc", str(path)]
                        argv += ["--capacity", str(CAPACITY), "-o", str(out)]
                        seconds, cpu, verdict, _ = run_command(argv, path, out)
                        command[who].append(seconds)
                        command_cpu[who].append(cpu)
                    if verdict != "valid":
                        bad.add(f"{who}: {verdict}")
            for who in tools:  # in-process: one process per tool
                placed[who] = memplan_place(tools[who], path, args.repeat)
            row = f"| {path.name.split('.')[0]} | {n} | {placed['this']['nodes']} |"
            for who in tools:
                row += f" {median(command[who])} ({median(command_cpu[who])}) |"
                row += f" {median(placed[who]['times'])} ({median(placed[who]['cpus'])}) |"
            if args.minimalloc:
                row += f" {median(mm_wall)} ({median(mm_cpu)}) | {median(mm_solve)} |"

            def ratio(a: list[float], b: list[float]) -> float:
                return statistics.median(a) / statistics.median(b)

            if args.baseline:
                row += (
                    f" {ratio(command['this'], command['baseline']):.2f}, "
                    f"{ratio(command_cpu['this'], command_cpu['baseline']):.2f} |"
                    f" {ratio(placed['this']['times'], placed['baseline']['times']):.2f}, "
                    f"{ratio(placed['this']['cpus'], placed['baseline']['cpus']):.2f} |"
                )
            if args.minimalloc:
                row += (
                    f" {ratio(command['this'], mm_wall):.2f}, "
                    f"{ratio(command_cpu['this'], mm_cpu):.2f} |"
                )
            if bad:
                row += " " + "; ".join(sorted(bad))
            print(row, flush=True)
            if args.omnimalloc:
                cells = []
                for name in OMNI:
                    try:
                        seconds, arena, valid = omni_run(args.omnimalloc, path, name)
                        fits = "fits" if arena <= CAPACITY else "over"
                        cells.append(
                            f"{seconds:.3f} s, {arena} ({fits}{'' if valid else ', INVALID'})"
                        )
                    except subprocess.CalledProcessError as exc:
                        cells.append(f"failed ({exc.returncode})")
                omni_rows.append(f"| {path.name.split('.')[0]} | " + " | ".join(cells) + " |")
    if omni_rows:
        print()
        print("| instance | " + " | ".join(f"omnimalloc {name}" for name in OMNI) + " |")
        print("|---|" + "---|" * len(OMNI))
        print("\n".join(omni_rows))
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
