"""``memplan alloc`` at scale, side by side with MiniMalloc and omnimalloc's SuperMalloc
(docs/benchmarks.md, the scale table).

Usage::

    python benchmarks/bench_alloc_scale.py --minimalloc PATH --omnimalloc PYTHON
        [--baseline PYTHON] [--sizes 1000,10000,50000,100000] [--shapes random,short,training]
        [--seed 1]
        [--factors 1.02,1.05] [--least] [--time-limit 60] [--traces DIR] [--suite DIR]
        [--repeat 1] [--only NAME,...] [--json OUT]

Instances: the seeded generator of benchmarks/alloc_instances.py (each shape at each size),
the MiniMalloc CSVs of ``--traces`` (real compilers' lists) and of ``--suite`` (MiniMalloc's
eleven challenging instances, at their own capacity 1048576). Modes: each capacity factor times
the peak live load (every tool must place within it), and with ``--least`` the least arena (no
capacity). Every run is a process of its own, under the same wall-clock limit, its CPU time
(user + system) and peak resident memory read from ``wait4``; the order of the tools alternates
from one instance to the next; every placement is checked by memplan's independent
:func:`memplan.alloc.check_placement`. The last lines say, per tool, on how many runs at a
capacity its own least arena came within the capacity, and which of those the capacity mode
missed (docs/alloc.md: it should miss none).

* memplan: ``memplan alloc X.csv [--capacity C] --time-limit T -o OUT``; with ``--baseline``
  the same command by another memplan's Python too (e.g. main's venv), run outside this tree so
  that it imports its own memplan;
* MiniMalloc (google/minimalloc, built apart): ``minimalloc --capacity=C --input=X.csv
  --output=OUT --timeout=Ts`` (capacity modes only: it has no least-arena mode of its own);
* SuperMalloc (``pip install omnimalloc`` in a venv of its own): ``SupermallocAllocator(
  timeout=T)`` on the buffers, in a process that reads the CSV; it minimizes the arena, so in a
  capacity mode it places when its arena fits (with ``--least`` it runs in the least-arena mode
  only: the same run, whose arena says which capacities it fits).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine
from alloc_instances import SHAPES, generate, write_csv

from memplan.alloc import check_placement, parse_buffers_csv, read_buffers_csv

SUPERMALLOC = """
import csv, sys
from omnimalloc import Allocation
from omnimalloc.allocators.supermalloc import SupermallocAllocator
path, out, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(path) as handle:
    rows = list(csv.DictReader(handle))
allocs = tuple(
    Allocation(i, int(r["size"]), int(r["lower"]), int(r["upper"])) for i, r in enumerate(rows)
)
done = SupermallocAllocator(timeout=timeout).solve(allocs)
offset = {a.id: a.offset for a in done.allocations}
with open(out, "w") as handle:
    handle.write("id,lower,upper,size,offset\\n")
    for i, r in enumerate(rows):
        handle.write(f"{r['id']},{r['lower']},{r['upper']},{r['size']},{offset[i]}\\n")
"""


LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_utime + usage.ru_stime, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""
"""Runs a tool and prints its CPU seconds, peak resident KiB and exit status. A child's peak RSS
counts the memory of the process it was forked from (Linux keeps the high-water mark across
exec): forked from this script, which holds the generated instances, every tool would show at
least this script's RSS; forked from this small launcher, it shows its own."""


def run(argv: list[str], limit: float, cwd: Path) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds (user + system), peak resident KiB and exit status of one
    process started in ``cwd`` (through :data:`LAUNCHER`), killed past ``limit`` + 60 s (every
    tool is asked to stop at ``limit``; a killed run counts its wall time as CPU time)."""
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
        text=True,
        start_new_session=True,
    )
    try:
        report, _ = child.communicate(timeout=limit + 60)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        wall = time.perf_counter() - started
        return wall, wall, 0, -9
    wall = time.perf_counter() - started
    cpu, kib, code = report.split()
    return wall, float(cpu), int(kib), int(code)


def verdict(path: Path, out: Path, capacity: int | None) -> tuple[str, int | None]:
    """``valid`` (and the arena) or why not, for a placed CSV written by any tool."""
    if not out.is_file() or out.stat().st_size == 0:
        return "none", None
    table = parse_buffers_csv(out.read_text(), str(out), need_offsets=True)
    placed = table.buffers
    assert placed.offset is not None
    original = read_buffers_csv(path).buffers
    if placed.ids != original.ids or (placed.size != original.size).any():
        return "INVALID: the output does not match the input", None
    check = check_placement(placed.lower, placed.upper, placed.size, placed.offset, None)
    if not check.valid:
        return f"INVALID: {check.violation}", None
    if capacity is not None and check.arena > capacity:
        return "over", check.arena
    return "valid", check.arena


def instances(args: argparse.Namespace, scratch: Path) -> list[tuple[str, Path, int | None]]:
    """(name, CSV, the capacity of its own when it has one)."""
    found: list[tuple[str, Path, int | None]] = []
    for shape in args.shapes:
        for n in args.sizes:
            path = scratch / f"{shape}-{n}.csv"
            write_csv(path, *generate(shape, n, args.seed))
            found.append((f"{shape}-{n}", path, None))
    if args.traces:
        for path in sorted(Path(args.traces).glob("*.csv")):
            found.append((path.stem, path, None))
    if args.suite:
        for path in sorted(Path(args.suite).glob("*.csv")):
            found.append((path.name.split(".")[0], path, int(path.name.split(".")[1])))
    if args.only:
        keep = set(args.only.split(","))
        found = [item for item in found if item[0] in keep]
    return found


def parity(records: list[dict]) -> str:
    """Per tool, the runs at a capacity that gave up (or failed) where the same tool's least-arena
    run on that instance found an arena within the capacity (docs/alloc.md: the capacity mode
    places every instance its least-arena mode places under the same capacity)."""
    lines = []
    for tool in dict.fromkeys(r["tool"] for r in records):
        least = {
            r["instance"]: r["arena"]
            for r in records
            if r["tool"] == tool and r["capacity"] is None and r["result"] == "valid"
        }
        runs = [r for r in records if r["tool"] == tool and r["capacity"] is not None]
        checked = [r for r in runs if r["instance"] in least]
        if not checked:
            continue
        within = [r for r in checked if least[r["instance"]] <= r["capacity"]]
        missed = [f"{r['instance']} ({r['mode']})" for r in within if r["result"] != "valid"]
        lines.append(
            f"{tool}: least arena within the capacity on {len(within)} of {len(checked)} runs at "
            f"a capacity; the capacity mode missed {', '.join(missed) if missed else 'none'}"
        )
    return "\n".join(lines)


def summary(records: list[dict]) -> str:
    """The scale tables of docs/benchmarks.md. Per generated shape and size, then per trace:
    the least arena over the peak live load in % (memplan / baseline / SuperMalloc), then after
    ``·`` the CPU seconds of a placement within the first capacity factor (memplan / baseline /
    MiniMalloc; ``-`` when not placed, ``x`` when killed); in the header the peak RSS in MiB
    (memplan / baseline / MiniMalloc / SuperMalloc, the largest of their runs in the column).
    """

    def run(name: str, tool: str, least: bool) -> dict | None:
        for r in records:
            if r["instance"] == name and r["tool"] == tool and (r["capacity"] is None) == least:
                return r
        return None

    def arena(r: dict | None) -> str | None:
        if r is None:
            return None
        if r["result"] != "valid" or r["arena"] is None:
            return "-"
        return f"{100 * (r['arena'] - r['peak']) / r['peak']:+.2f}"

    def cpu(r: dict | None) -> str | None:
        if r is None:
            return None
        return "x" if r["exit"] == -9 else f"{r['cpu']:.1f}" if r["result"] == "valid" else "-"

    def cell(name: str) -> str:
        least = [arena(run(name, t, True)) for t in ("memplan", "baseline", "SuperMalloc")]
        placed = [cpu(run(name, t, False)) for t in ("memplan", "baseline", "MiniMalloc")]
        return " · ".join(
            "/".join(x for x in part if x is not None) for part in (least, placed) if any(part)
        )

    def rss(names: list[str]) -> str:
        most = []
        for tool in ("memplan", "baseline", "MiniMalloc", "SuperMalloc"):
            seen = [r["rss_mib"] for r in records if r["instance"] in names and r["tool"] == tool]
            if seen:
                most.append(f"{max(seen):.0f}")
        return "/".join(most)

    grid: dict[str, dict[int, str]] = {}
    traces = []
    for name in dict.fromkeys(r["instance"] for r in records):
        shape, _, n = name.rpartition("-")
        if shape in SHAPES and n.isdigit():
            grid.setdefault(shape, {})[int(n)] = name
        else:
            traces.append(name)
    lines = []
    if grid:
        sizes = sorted({n for by_size in grid.values() for n in by_size})
        columns = [[by_size[n] for by_size in grid.values() if n in by_size] for n in sizes]
        heads = [f"{n:,} · {rss(c)} MiB" for n, c in zip(sizes, columns, strict=True)]
        lines.append("| buffers · peak RSS | " + " | ".join(heads) + " |")
        lines.append("|---|" + "---|" * len(sizes))
        for shape, by_size in grid.items():
            values = [cell(by_size[n]) if n in by_size else "" for n in sizes]
            lines.append(f"| {shape} | " + " | ".join(values) + " |")
        lines.append("")
    if traces:
        count = {r["instance"]: r["buffers"] for r in records}
        heads = [f"{t} {count[t]:,} · {rss([t])} MiB" for t in traces]
        lines.append("| trace | " + " | ".join(heads) + " |")
        lines.append("|---|" + "---|" * len(traces))
        lines.append("| | " + " | ".join(cell(t) for t in traces) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="another memplan's Python (e.g. main's venv)")
    parser.add_argument("--minimalloc", type=Path, help="MiniMalloc's executable (built apart)")
    parser.add_argument("--omnimalloc", help="a Python with omnimalloc installed")
    parser.add_argument("--sizes", default="1000,10000,50000,100000")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--factors", default="1.02,1.05", help="capacities: x the peak live load")
    parser.add_argument("--least", action="store_true", help="also the least arena (no capacity)")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--traces", help="a folder of MiniMalloc CSVs (real compilers' lists)")
    parser.add_argument("--suite", help="MiniMalloc's challenging instances (X.CAPACITY.csv)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated instance names")
    parser.add_argument("--json", type=Path, help="write every run here too")
    parser.add_argument(
        "--summary", type=Path, help="only print the summary tables of a --json file written before"
    )
    args = parser.parse_args()
    if args.summary:
        records = json.loads(args.summary.read_text())
        print(summary(records))
        print()
        print(parity(records))
        return
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    args.shapes = [x for x in args.shapes.split(",") if x]
    factors = [float(x) for x in args.factors.split(",") if x]
    # memplan's package is imported from this tree's venv; every process starts in the scratch
    # folder, so that a baseline imports its own memplan and not this tree's.
    memplans = {"memplan": [sys.executable, "-m", "memplan", "alloc"]}
    if args.baseline:
        memplans["baseline"] = [args.baseline, "-m", "memplan", "alloc"]
    limit = args.time_limit
    print(f"machine: {machine()}")
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"time limit {limit:g} s per run; medians of {args.repeat} run(s); CPU = user + system")
    print()
    print(
        "| instance | buffers | mode | tool | result | arena over peak | wall s | CPU s | "
        "peak RSS MiB |"
    )
    print("|---|---:|---|---|---|---:|---:|---:|---:|")
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        out = scratch / "out.csv"
        for index, (name, path, own) in enumerate(instances(args, scratch)):
            buffers = read_buffers_csv(path).buffers
            peak = buffers.peak_live_load()
            modes: list[tuple[str, int | None]] = []
            if own is not None:
                modes.append((f"capacity {own}", own))
            else:
                modes += [(f"{f:g}x peak", int(peak * f)) for f in factors]
            if args.least:
                modes.append(("least arena", None))
            for mode, capacity in modes:
                tools = list(memplans)
                if args.minimalloc and capacity is not None:
                    tools.append("MiniMalloc")
                if args.omnimalloc and (capacity is None or not args.least):
                    tools.append("SuperMalloc")  # its least arena says if it fits a capacity
                if index % 2:
                    tools.reverse()
                for tool in tools:
                    walls, cpus, rss, results = [], [], [], []
                    for _ in range(args.repeat):
                        if out.exists():
                            out.unlink()
                        if tool in memplans:
                            argv = [
                                *memplans[tool],
                                str(path),
                                "--time-limit",
                                f"{limit:g}",
                                "-o",
                                str(out),
                            ]
                            if capacity is not None:
                                argv += ["--capacity", str(capacity)]
                        elif tool == "MiniMalloc":
                            argv = [
                                str(args.minimalloc),
                                f"--capacity={capacity}",
                                f"--input={path}",
                                f"--output={out}",
                                f"--timeout={limit:g}s",
                            ]
                        else:
                            argv = [args.omnimalloc, "-c", SUPERMALLOC, str(path), str(out)]
                            argv.append(f"{limit:g}")
                        wall, cpu, kib, code = run(argv, limit, scratch)
                        result, arena = verdict(path, out, capacity)
                        if code != 0 and result == "valid" and tool != "SuperMalloc":
                            result = f"exit {code}"
                        walls.append(wall)
                        cpus.append(cpu)
                        rss.append(kib / 1024)
                        results.append((result, arena))
                        records.append(
                            {
                                "instance": name,
                                "buffers": len(buffers),
                                "peak": peak,
                                "mode": mode,
                                "capacity": capacity,
                                "tool": tool,
                                "result": result,
                                "arena": arena,
                                "wall": wall,
                                "cpu": cpu,
                                "rss_mib": kib / 1024,
                                "exit": code,
                            }
                        )
                    result, arena = results[-1]
                    shown = "placed" if result == "valid" else result
                    over = f"{100 * (arena - peak) / peak:+.2f}%" if arena is not None else "-"
                    print(
                        f"| {name} | {len(buffers)} | {mode} | {tool} | {shown} | {over} | "
                        f"{statistics.median(walls):.2f} | {statistics.median(cpus):.2f} | "
                        f"{statistics.median(rss):.0f} |",
                        flush=True,
                    )
    print()
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    print()
    print(summary(records))
    print()
    print(parity(records))


if __name__ == "__main__":
    main()
