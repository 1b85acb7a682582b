"""Time ``memplan alloc`` on MiniMalloc's eleven challenging instances, alone or side by side with
MiniMalloc itself (docs/benchmarks.md#memplan-alloc).

Usage: ``python benchmarks/bench_alloc.py [--against PATH/TO/minimalloc] [--repeat 3]
[--dir ../shared/benchmarks/minimalloc] [--time-limit 120] [--only A,B] [--engine auto]``

Each instance ``X.1048576.csv`` is placed at capacity 1048576 (what ``memplan alloc X.csv
--capacity 1048576`` does); every placement is re-checked by the independent
:func:`memplan.alloc.check_placement`. Two memplan times are taken: ``place``, the library call
:func:`memplan.alloc.place` in this process (the CSV read, the compiled kernel already loaded),
and ``command``, the command line ``memplan alloc X.csv --capacity 1048576 -o OUT`` in a fresh
process (Python's start-up, the imports and the kernel's load included).

With ``--against``, MiniMalloc's command line (google/minimalloc, built separately: its code is
not part of memplan) runs on the same file, ``minimalloc --capacity=1048576 --input=X.csv
--output=OUT``, alternating with memplan's runs; its output is checked by the same checker. The
table gives the median of ``--repeat`` runs of each and the ratios memplan / MiniMalloc (below 1:
memplan is faster), of wall time and of CPU time (user + system of the command's process, from
``getrusage(RUSAGE_CHILDREN)``: on a shared machine the CPU time varies less with the load).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine

from memplan.alloc import check_placement, parse_buffers_csv, place, read_buffers_csv

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE.parent.parent / "shared" / "benchmarks" / "minimalloc"
CAPACITY = 1048576


def checked(path: Path, out: Path, capacity: int) -> str:
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


def run_place(path: Path, capacity: int, time_limit: float, engine: str) -> tuple[float, str, int]:
    """Seconds of :func:`place` (CSV read included), its verdict, its nodes."""
    started = time.perf_counter()
    buffers = read_buffers_csv(path).buffers
    result = place(buffers, capacity=capacity, time_limit=time_limit, engine=engine)
    seconds = time.perf_counter() - started
    if result.offsets is None:
        return seconds, result.status, result.nodes
    check = check_placement(buffers.lower, buffers.upper, buffers.size, result.offsets, capacity)
    return seconds, "valid" if check.valid else f"INVALID: {check.violation}", result.nodes


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_command(
    argv: list[str], path: Path, out: Path, capacity: int
) -> tuple[float, float, str, str]:
    """Wall and CPU seconds of a command line, the check of what it wrote, and its stderr."""
    if out.exists():
        out.unlink()
    cpu = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    cpu = _children_cpu() - cpu
    verdict = checked(path, out, capacity) if done.returncode == 0 else f"exit {done.returncode}"
    return seconds, cpu, verdict, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--against", type=Path, help="MiniMalloc's executable (built separately)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--only", default="", help="comma-separated instance letters")
    parser.add_argument("--engine", default="auto", choices=("auto", "compiled", "numpy"))
    args = parser.parse_args()
    files = sorted(args.dir.glob("*.csv"))
    if args.only:
        wanted = set(args.only.split(","))
        files = [f for f in files if f.name.split(".")[0] in wanted]
    if not files:
        sys.exit(f"no instances in {args.dir}")
    if args.against is not None and not os.access(args.against, os.X_OK):
        sys.exit(f"--against {args.against}: not an executable")
    memplan_cli = [sys.executable, "-m", "memplan"]
    print(f"machine: {machine()}")
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(
        f"time limit {args.time_limit:g} s per run; median of {args.repeat} runs; engine {args.engine}"
    )
    # The first call loads (and, once per installation, compiles) the kernel: not an instance's.
    started = time.perf_counter()
    run_place(files[0], CAPACITY, args.time_limit, args.engine)
    print(f"kernel load (first call in this process): {time.perf_counter() - started:.2f} s")
    head = "| instance | buffers | peak | place s | nodes | command s | command CPU s |"
    rule = "|---|---:|---:|---:|---:|---:|---:|"
    if args.against is not None:
        head += (
            " MiniMalloc s | MiniMalloc CPU s | MiniMalloc solve s | place / MiniMalloc |"
            " command / MiniMalloc | command / MiniMalloc, CPU |"
        )
        rule += "---:|---:|---:|---:|---:|---:|"
    print(head)
    print(rule)
    worst = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        out_memplan = Path(scratch) / "memplan.csv"
        out_theirs = Path(scratch) / "minimalloc.csv"
        for path in files:
            capacity = int(path.name.split(".")[1])
            buffers = read_buffers_csv(path).buffers
            ours, ours_cli, theirs, theirs_solve = [], [], [], []
            ours_cpu, theirs_cpu = [], []
            verdicts: set[str] = set()
            nodes = 0
            for repeat in range(args.repeat):
                # Alternate which tool goes first, so neither always meets the same load.
                turns = ["memplan", "minimalloc"] if repeat % 2 == 0 else ["minimalloc", "memplan"]
                for turn in turns:
                    if turn == "memplan":
                        seconds, verdict, nodes = run_place(
                            path, capacity, args.time_limit, args.engine
                        )
                        ours.append(seconds)
                        verdicts.add(f"place {verdict}")
                        seconds, cpu, verdict, _ = run_command(
                            [
                                *memplan_cli,
                                "alloc",
                                str(path),
                                "--capacity",
                                str(capacity),
                                "--time-limit",
                                f"{args.time_limit:g}",
                                "-o",
                                str(out_memplan),
                            ],
                            path,
                            out_memplan,
                            capacity,
                        )
                        ours_cli.append(seconds)
                        ours_cpu.append(cpu)
                        verdicts.add(f"command {verdict}")
                    elif args.against is not None:
                        seconds, cpu, verdict, log = run_command(
                            [
                                str(args.against),
                                f"--capacity={capacity}",
                                f"--input={path}",
                                f"--output={out_theirs}",
                                f"--timeout={args.time_limit:g}s",
                            ],
                            path,
                            out_theirs,
                            capacity,
                        )
                        theirs.append(seconds)
                        theirs_cpu.append(cpu)
                        verdicts.add(f"MiniMalloc {verdict}")
                        solve = re.search(r"Elapsed time ([0-9.]+)s", log)
                        if solve:
                            theirs_solve.append(float(solve.group(1)))
            row = (
                f"| {path.name.split('.')[0]} | {len(buffers)} | {buffers.peak_live_load()} | "
                f"{statistics.median(ours):.2f} | {nodes} | {statistics.median(ours_cli):.2f} | "
                f"{statistics.median(ours_cpu):.2f} |"
            )
            if args.against is not None:
                mm = statistics.median(theirs)
                mm_solve = statistics.median(theirs_solve) if theirs_solve else float("nan")
                ratio = statistics.median(ours) / mm
                ratio_cli = statistics.median(ours_cli) / mm
                worst = max(worst, ratio)
                mm_cpu = statistics.median(theirs_cpu)
                ratio_cpu = statistics.median(ours_cpu) / mm_cpu
                row += (
                    f" {mm:.2f} | {mm_cpu:.2f} | {mm_solve:.2f} | {ratio:.2f} | {ratio_cli:.2f} |"
                    f" {ratio_cpu:.2f} |"
                )
            bad = sorted(v for v in verdicts if not v.endswith("valid"))
            if bad:
                row += " " + "; ".join(bad)
            print(row, flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.against is not None:
        print(f"largest place / MiniMalloc ratio: {worst:.2f}")


if __name__ == "__main__":
    main()
