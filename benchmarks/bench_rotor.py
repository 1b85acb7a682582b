"""Rotor's time and quality: chain lengths x budgets, the C ports side by side, the rounding loss.

Usage::

    python benchmarks/bench_rotor.py [--lengths 10,50,100,200,500] [--budgets 40,60,80]
                                     [--repeats 3] [--against DIR] [--memory]
    python benchmarks/bench_rotor.py --bundled          # default vs 500 slots vs 20000 slots
    python benchmarks/bench_rotor.py --rounding         # <= 20 stages against the exact optimum
    python benchmarks/bench_rotor.py --scale            # info and rotor at 250..2000 stages
    python benchmarks/bench_rotor.py --native-cost      # building and loading the kernel

Chains are ``random_chain(L, seed=L, max_size=1000)``, budgets a percentage of the store-all peak
(activations, ``--optimizer none``). Times are seconds of :func:`memplan.algorithms.chain.
solve_rotor` (least memory, DP, backtracking), wall clock and CPU, median of ``--repeats``; the
plan of every run is checked against the budget (``Chain.peak``, exact in bytes).

``--against DIR`` runs, in the same process and alternating with memplan, the C ports of the rotor
DP built in DIR by ``python benchmarks/rotor_ports.py build SRC DIR`` (their code is never part of
this tree: see rotor_ports.py), on memplan's 500-slot grid, next to memplan at 500 slots (the same
grid, so the same optimum up to the small model differences rotor_ports.py lists) and memplan with
its default. The authors' code and ColossalAI's return their whole table as Python dictionaries
and are skipped beyond ``--dict-limit`` stages (default 100: at 200 stages that is 20 million
entries, gigabytes of Python objects).

``--memory`` adds memplan's peak traced memory (tracemalloc, numpy included) in a separate run.

memplan's grid runs compiled (rotor_native.py) when its kernel is available: it is loaded before
the first timing, as the C ports are (the head says which path runs; ``MEMPLAN_NATIVE=0`` times
the numpy path). ``--native-cost`` measures, in fresh processes with an empty object cache, the
first use after an install (compiling the kernel with numba, once) and then the load of the
cached object (``python -m memplan.algorithms.chain.rotor_native`` each time, median of
``--repeats`` loads, and the whole process's wall time).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import tracemalloc
from functools import partial
from pathlib import Path

import numpy as np
from _common import machine

import memplan
from memplan.algorithms.chain import Chain, chain_min_memory, rotor_native, solve_rotor
from memplan.algorithms.chain.rotor import slot_sizes
from memplan.profile import bundled_profiles
from memplan.profile.synthetic import random_chain


def timed(function, repeats: int):
    """(median wall s, median CPU s, last result)."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = function()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def traced_peak(function) -> int:
    tracemalloc.start()
    function()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def seconds(measured) -> str:
    """``wall / CPU`` of a :func:`timed` result, four significant digits."""
    return f"{measured[0]:.4g} / {measured[1]:.4g}"


def grid_label(plan) -> str:
    return "bytes" if plan.slots is None else str(plan.slots)


def kernel_line() -> str:
    """Load memplan's compiled grid kernel now (not in the first timing) and say so."""
    started = time.perf_counter()
    if not rotor_native.available():
        return f"memplan grid: numpy ({rotor_native.load_error() or 'MEMPLAN_NATIVE=0'})"
    return f"memplan grid: compiled kernel (loaded in {time.perf_counter() - started:.3f} s)"


def lengths_table(args: argparse.Namespace) -> None:
    print(kernel_line())
    ports = {}
    if args.against:
        sys.path.insert(0, str(Path(__file__).parent))
        from rotor_ports import load_ports

        ports = load_ports(Path(args.against))
        print(f"ports: {', '.join(ports) or 'none found in ' + args.against}")
    head = "| stages | budget | memplan default s (wall / CPU) | grid | makespan "
    head += "| memplan 500 slots s | makespan"
    for name in ports:
        head += f" | {name} s | makespan"
    if args.memory:
        head += " | default MB | 500 slots MB"
    print(head + " |")
    print("|" + "---|" * (head.count("|") - 1))
    for length in (int(v) for v in args.lengths.split(",")):
        chain = Chain.from_profile(random_chain(length, seed=length, max_size=1000))
        store_all = chain.store_all_peak()
        least = chain_min_memory(chain)
        repeats = args.repeats if length < 500 else 1
        for percent in (int(v) for v in args.budgets.split(",")):
            memory = max(least, store_all * percent // 100)
            default = timed(partial(solve_rotor, chain, memory), repeats)
            grid = timed(partial(solve_rotor, chain, memory, slots=500), repeats)
            for _, _, plan in (default, grid):
                assert plan.sequence is not None and chain.peak(plan.sequence) <= memory
            line = (
                f"| {length} | {percent}% | {seconds(default)} | "
                f"{grid_label(default[2])} | {default[2].claimed_makespan:.3f} | "
                f"{seconds(grid)} | {grid[2].claimed_makespan:.3f}"
            )
            capacity, rounded = slot_sizes(chain, memory - int(chain.x[0]), 500)
            ft, bt = chain.ft.tolist(), chain.bt.tolist()
            for name, run in ports.items():
                if name != "rk_rotor" and length > args.dict_limit:
                    line += " | - | -"
                    continue
                port = timed(partial(run, ft, bt, rounded, capacity), repeats)
                line += f" | {seconds(port)} | {port[2]:.3f}"
            if args.memory:
                line += f" | {traced_peak(partial(solve_rotor, chain, memory)) / 1e6:.1f}"
                peak = traced_peak(partial(solve_rotor, chain, memory, slots=500))
                line += f" | {peak / 1e6:.1f}"
            print(line + " |", flush=True)


def bundled_table(args: argparse.Namespace) -> None:
    """Default and 500 slots against 20000 slots, 20 budgets from the least memory to store-all."""
    print(
        "| profile | stages | budgets | default s (max) | default vs 20000 slots (worst) "
        "| 500 slots vs 20000 slots (worst) | 20000 slots s (max) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in bundled_profiles():
        prof = memplan.load_profile(name)
        if prof.stages is None:
            continue
        chain = Chain.from_profile(prof)
        least, store_all = chain_min_memory(chain), chain.store_all_peak()
        worst_default, worst_500, slowest, slowest_ref = -np.inf, -np.inf, 0.0, 0.0
        best_default = np.inf
        for i in range(20):
            memory = least + (store_all - least) * i // 19
            t, _, default = timed(partial(solve_rotor, chain, memory), 1)
            r, _, reference = timed(partial(solve_rotor, chain, memory, slots=20000), 1)
            coarse = solve_rotor(chain, memory, slots=500)
            ref = reference.claimed_makespan
            worst_default = max(worst_default, default.claimed_makespan / ref - 1)
            best_default = min(best_default, default.claimed_makespan / ref - 1)
            worst_500 = max(worst_500, coarse.claimed_makespan / ref - 1)
            slowest, slowest_ref = max(slowest, t), max(slowest_ref, r)
        print(
            f"| {name} | {chain.length} | 20 | {slowest:.3f} | {100 * worst_default:+.3f}% / "
            f"{100 * best_default:+.3f}% | "
            f"{100 * worst_500:+.3f}% | {slowest_ref:.2f} |",
            flush=True,
        )


def rounding_table(args: argparse.Namespace) -> None:
    """Chains of 2..20 stages: how often rotor's plan is the optimum in bytes.

    The reference is the grid DP at one byte per slot (exact, and independent of the byte-level
    DP that the default runs); small sizes (max_size 100) keep it cheap.
    """
    print(
        "| stages | chains x budgets | default = optimum | default worst | 500 slots = optimum "
        "| 500 slots worst |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for length in (2, 4, 6, 8, 10, 12, 15, 20):
        total = equal_default = equal_500 = 0
        worst_default = worst_500 = 0.0
        for seed in range(args.chains):
            chain = Chain.from_profile(random_chain(length, seed=seed, max_size=100))
            least, store_all = chain_min_memory(chain), chain.store_all_peak()
            if store_all <= least:  # no budget where recomputing is needed and possible
                continue
            for i in range(args.points):
                memory = least + (store_all - 1 - least) * i // max(1, args.points - 1)
                exact = solve_rotor(chain, memory, slots=max(2, memory - int(chain.x[0])))
                default = solve_rotor(chain, memory)
                coarse = solve_rotor(chain, memory, slots=500)
                best = exact.claimed_makespan
                total += 1
                gap = default.claimed_makespan / best - 1
                equal_default += gap <= 1e-9
                worst_default = max(worst_default, gap)
                gap = coarse.claimed_makespan / best - 1
                equal_500 += gap <= 1e-9
                worst_500 = max(worst_500, gap)
        print(
            f"| {length} | {total} | {100 * equal_default / total:.1f}% | "
            f"{100 * worst_default:+.2f}% | {100 * equal_500 / total:.1f}% | "
            f"{100 * worst_500:+.2f}% |",
            flush=True,
        )


SCALE_SNIPPET = """
import sys, time, tracemalloc
import memplan
from memplan.algorithms.chain import Chain
from memplan.profile.synthetic import random_chain
length, what, slots = int(sys.argv[1]), sys.argv[2], sys.argv[3]
prof = random_chain(length, seed=length, max_size=1000)
memory = Chain.from_profile(prof).store_all_peak() // 2
tracemalloc.start()
start, cpu = time.perf_counter(), time.process_time()
if what == "info":
    memplan.api.describe(prof, "none")
else:
    sched = memplan.solve(prof, "rotor", memory, optimizer="none",
                          slots=None if slots == "auto" else int(slots))
    assert sched.feasible and sched.peak_memory <= memory
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(f"{seconds:.2f} s ({cpu:.2f} s CPU), {tracemalloc.get_traced_memory()[1] / 1e6:.0f} MB")
"""


def scale_table(args: argparse.Namespace) -> None:
    """Issue 17 item 12: ``memplan info`` and rotor on random chains, half the store-all memory.

    Each cell is a fresh process (``--timeout`` seconds at most): the time of ``describe`` (what
    ``memplan info`` computes) or of ``memplan.solve`` (simulator replay included) and the peak
    traced memory.
    """
    lengths = [int(v) for v in args.scale_lengths.split(",")]
    rows = [("info", "info", "-"), ("rotor --slots 500", "rotor", "500")]
    rows.append(("rotor (default)", "rotor", "auto"))
    print("| command | " + " | ".join(f"{n} stages" for n in lengths) + " |")
    print("|---|" + "---|" * len(lengths))
    for label, what, slots in rows:
        cells = []
        for length in lengths:
            try:
                done = subprocess.run(
                    [sys.executable, "-c", SCALE_SNIPPET, str(length), what, slots],
                    capture_output=True,
                    text=True,
                    timeout=args.timeout,
                )
                last = (done.stdout.strip() or done.stderr.strip()).splitlines()
                cells.append(last[-1] if last else f"exit {done.returncode}")
            except subprocess.TimeoutExpired:
                cells.append(f"> {args.timeout} s")
        print(f"| `{label}` | " + " | ".join(cells) + " |", flush=True)


NATIVE_SNIPPET = """
import sys, time
started = time.perf_counter()
from memplan.algorithms.chain import rotor_native
imported = time.perf_counter()
assert rotor_native.available(), rotor_native.load_error()
print(f"{imported - started:.3f} {time.perf_counter() - imported:.3f} {'numba' in sys.modules}")
"""


def native_cost(args: argparse.Namespace) -> None:
    """First use after an install (the build) and later loads, each in a fresh process."""
    import os
    import tempfile

    def fresh(cache: str) -> tuple[float, float, float, bool]:
        env = {**os.environ, "MEMPLAN_CACHE_DIR": cache}
        env.pop("MEMPLAN_NATIVE", None)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", NATIVE_SNIPPET], capture_output=True, text=True, env=env
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"the kernel did not load: {done.stderr.strip()}")
        imported, loaded, numba = done.stdout.split()
        return wall, float(imported), float(loaded), numba == "True"

    with tempfile.TemporaryDirectory() as cache:
        wall, imported, build, numba = fresh(cache)
        print(
            f"first use (empty cache): {build:.2f} s to build and load the kernel (numba "
            f"imported: {numba}); process {wall:.2f} s, of which importing memplan {imported:.2f} s"
        )
        loads = [fresh(cache) for _ in range(args.repeats)]
        load = statistics.median(row[2] for row in loads)
        wall = statistics.median(row[0] for row in loads)
        imported = statistics.median(row[1] for row in loads)
        numba = any(row[3] for row in loads)
        print(
            f"cached: {load * 1000:.1f} ms to load the kernel (numba imported: {numba}); "
            f"process {wall:.2f} s, of which importing memplan {imported:.2f} s "
            f"(median of {args.repeats})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="10,50,100,200,500")
    parser.add_argument("--budgets", default="40,60,80", help="%% of the store-all peak")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", metavar="DIR", help="C ports built by rotor_ports.py")
    parser.add_argument("--dict-limit", type=int, default=100)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--bundled", action="store_true")
    parser.add_argument("--rounding", action="store_true")
    parser.add_argument("--chains", type=int, default=10, help="--rounding: chains per length")
    parser.add_argument("--points", type=int, default=25, help="--rounding: budgets per chain")
    parser.add_argument("--scale", action="store_true")
    parser.add_argument("--scale-lengths", default="250,500,1000,2000")
    parser.add_argument("--timeout", type=int, default=120)
    parser.add_argument("--native-cost", action="store_true")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    if args.bundled:
        bundled_table(args)
    elif args.rounding:
        rounding_table(args)
    elif args.scale:
        scale_table(args)
    elif args.native_cost:
        native_cost(args)
    else:
        lengths_table(args)


if __name__ == "__main__":
    main()
