"""Time ``memplan alloc`` on MiniMalloc's eleven challenging instances (docs/benchmarks.md).

Usage: ``python benchmarks/bench_alloc.py [--dir ../shared/benchmarks/minimalloc] [--time-limit 120]
[--only A,B]``

Each instance ``X.1048576.csv`` is placed at capacity 1048576 by :func:`memplan.alloc.place` (the
library call behind ``memplan alloc X.csv --capacity 1048576``); every placement is re-checked by
the independent :func:`memplan.alloc.check_placement`. Prints one Markdown table row per instance.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _common import machine

from memplan.alloc import check_placement, place, read_buffers_csv

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE.parent.parent / "shared" / "benchmarks" / "minimalloc"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--only", default="", help="comma-separated instance letters")
    args = parser.parse_args()
    files = sorted(args.dir.glob("*.csv"))
    if args.only:
        wanted = set(args.only.split(","))
        files = [f for f in files if f.name.split(".")[0] in wanted]
    if not files:
        sys.exit(f"no instances in {args.dir}")
    print(f"machine: {machine()}")
    print(f"time limit: {args.time_limit:g} s per instance")
    print("| instance | buffers | peak live load | capacity | status | arena | seconds | nodes |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for path in files:
        capacity = int(path.name.split(".")[1])
        buffers = read_buffers_csv(path).buffers
        started = time.perf_counter()
        result = place(buffers, capacity=capacity, time_limit=args.time_limit)
        seconds = time.perf_counter() - started
        if result.offsets is not None:
            check = check_placement(
                buffers.lower, buffers.upper, buffers.size, result.offsets, capacity
            )
            status = result.status if check.valid else f"INVALID: {check.violation}"
        else:
            status = result.status
        print(
            f"| {path.name.split('.')[0]} | {len(buffers)} | {buffers.peak_live_load()} | "
            f"{capacity} | {status} | {result.arena if result.arena is not None else '-'} | "
            f"{seconds:.2f} | {result.nodes} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
