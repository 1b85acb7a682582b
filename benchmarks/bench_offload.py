"""Offloading algorithms on the bundled A100 CNN profiles (Optimal GPU-CPU Offloading Strategies, Euro-Par 2020; Figure 5), and their gap.

Usage::

    python benchmarks/bench_offload.py                      # sweep table (markdown) + timing
    python benchmarks/bench_offload.py --plots docs         # also docs/offload_<profile>.png
    python benchmarks/bench_offload.py --gap 300            # Problem-1 gap on 300 random chains

Sweep: for each profile and bandwidth, ``--points`` budgets evenly spaced from the least memory
of full offloading to M_peak (activations only, ``--optimizer none``, as in the paper's
experiments); every algorithm runs through :func:`memplan.solve` (simulator replay included) and
is reported as makespan / LB (Proposition 3). ``bound`` is :func:`relaxation_bound`, a lower bound
on every ordered schedule (Problem 2 with optimistic rounding, ``--bound-slots`` slots): where
``bound / LB > 1.2`` no offloading schedule reaches 1.2 x LB. ``dynprog 2000 slots`` counts the
budgets where DYNPROG with ``--slots 2000`` is slower than VDNN.

Gap (``--gap N``): on N random chains of 2 to 8 stages (integer sizes and times, whole bytes per
slot, so that the DP is exact for Problem 2), each algorithm's real schedule against the best
no-wait ordered schedule over every subset (Problem 1, ``tests/oracles/offload.py``).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _common import machine

import memplan
from memplan.algorithms.offload.dynprog import relaxation_bound, solve_dynprog
from memplan.algorithms.offload.model import OffloadInstance
from memplan.api import auto_budgets
from memplan.units import format_size, parse_rate

ALGOS = ("dynprog", "dynprog-best", "greedy", "vdnn")
PROFILES = "resnet50@a100,resnet101@a100,resnet152@a100,densenet121@a100"
TARGET = 1.2
FINER_SLOTS = 2000


def sweep(name: str, rate: float, points: int, slots: int, bound_slots: int) -> dict:
    """Ratios to LB of every algorithm (and of the relaxation bound) at every budget."""
    prof = memplan.load_profile(name)
    budgets = auto_budgets(prof, ALGOS, points, optimizer="none")
    inst = OffloadInstance.from_profile(prof, rate)
    rows = []
    for memory in budgets:
        row: dict = {"memory": memory}
        for algo in ALGOS:
            sched = memplan.solve(prof, algo, memory, slots=slots, optimizer="none", bandwidth=rate)
            row[algo] = sched.overhead if sched.feasible else math.nan
            row["lb"] = sched.lower_bound
            row[f"{algo}_s"] = sched.solver.seconds
        finer = solve_dynprog(inst, memory, slots=FINER_SLOTS)
        row["dynprog_fine"] = finer.claimed_makespan / row["lb"] if finer.ops else math.nan
        bound = relaxation_bound(inst, memory, bound_slots)
        row["bound"] = math.nan if bound is None else bound / row["lb"]
        rows.append(row)
    return {"name": name, "rate": rate, "rows": rows}


def summary_table(results: list[dict]) -> str:
    lines = [
        "| profile | bandwidth | budgets | dynprog max | dynprog <= 1.2 | dynprog > vdnn | "
        f"dynprog {FINER_SLOTS} slots > vdnn | dynprog-best max | greedy max | vdnn max | "
        "bound max | bound > 1.2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        rows = res["rows"]

        def worst(key: str, rows=rows) -> float:
            return max(r[key] for r in rows)

        within = sum(r["dynprog"] <= TARGET + 1e-9 for r in rows)
        worse = sum(r["dynprog"] > r["vdnn"] * (1 + 1e-9) for r in rows)
        worse_fine = sum(r["dynprog_fine"] > r["vdnn"] * (1 + 1e-9) for r in rows)
        hard = sum(r["bound"] > TARGET + 1e-9 for r in rows)
        lines.append(
            f"| {res['name']} | {format_size(res['rate'])}/s | "
            f"{format_size(rows[0]['memory'])} .. {format_size(rows[-1]['memory'])} | "
            f"{worst('dynprog'):.3f} | {within}/{len(rows)} | {worse} | {worse_fine} | "
            f"{worst('dynprog-best'):.3f} | {worst('greedy'):.3f} | {worst('vdnn'):.3f} | "
            f"{worst('bound'):.3f} | {hard} |"
        )
    return "\n".join(lines)


def point_table(res: dict) -> str:
    lines = [
        f"**{res['name']} at {format_size(res['rate'])}/s** (makespan / LB)",
        "",
        "| budget | LB ms | bound | dynprog | dynprog-best | greedy | vdnn |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {format_size(r['memory'])} | {r['lb']:.2f} | {r['bound']:.3f} | "
            f"{r['dynprog']:.3f} | {r['dynprog-best']:.3f} | {r['greedy']:.3f} | {r['vdnn']:.3f} |"
        )
    return "\n".join(lines)


def plot(results: list[dict], directory: Path) -> list[Path]:
    """One figure per profile, one panel per bandwidth, in the style of Figure 5 of Optimal GPU-CPU Offloading Strategies (Euro-Par 2020)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    written = []
    names = list(dict.fromkeys(r["name"] for r in results))
    styles = {
        "dynprog": ("s", 2.4),
        "dynprog-best": ("^", 1.4),
        "greedy": ("o", 1.4),
        "vdnn": ("D", 1.2),
    }
    for name in names:
        panels = [r for r in results if r["name"] == name]
        figure = Figure(figsize=(5.2 * len(panels), 4.0), layout="constrained")
        axes_list = figure.subplots(1, len(panels), squeeze=False)[0]
        for axes, res in zip(axes_list, panels, strict=True):
            xs = [r["memory"] / 1e9 for r in res["rows"]]
            for algo in ALGOS:
                marker, width = styles[algo]
                ys = [r[algo] for r in res["rows"]]
                axes.plot(xs, ys, marker=marker, markersize=4, linewidth=width, label=algo)
            axes.plot(
                xs,
                [r["bound"] for r in res["rows"]],
                color="black",
                linestyle=":",
                linewidth=1.2,
                label="relaxation bound",
            )
            axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
            axes.axhline(TARGET, color="grey", linewidth=0.6, linestyle="-.")
            axes.set_xlabel("Memory budget for activations (GB)")
            axes.set_ylabel("Makespan / LB")
            axes.set_title(f"{name}, {format_size(res['rate'])}/s")
            axes.grid(True, linewidth=0.4, alpha=0.6)
            axes.legend(frameon=False, fontsize=8)
        path = directory / f"offload_{name.replace('@', '_')}.png"
        figure.savefig(path, dpi=120)
        written.append(path)
    return written


def timing(name: str, rate: float, slots: int, points: int) -> str:
    """dynprog (the library call, no simulator) at ``points`` budgets: median and worst seconds."""
    prof = memplan.load_profile(name)
    inst = OffloadInstance.from_profile(prof, rate)
    seconds = []
    for memory in auto_budgets(prof, ["dynprog"], points, optimizer="none"):
        started = time.perf_counter()
        solve_dynprog(inst, memory, slots=slots)
        seconds.append(time.perf_counter() - started)
    return (
        f"dynprog, {slots} slots, {name} ({prof.length} stages) at {format_size(rate)}/s over "
        f"{points} budgets: median {statistics.median(seconds):.3f} s, worst {max(seconds):.3f} s"
    )


def gap(cases: int, seed: int) -> str:
    """Problem-1 gap of each algorithm against the exhaustive search over subsets."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from oracles.offload import best_real

    from memplan.profile.model import Profile, Stage

    rnd = random.Random(seed)
    gaps: dict[str, list[float]] = {algo: [] for algo in ALGOS}
    chains = 0
    while chains < cases:
        n = rnd.randint(2, 8)
        stages = []
        for k in range(n):
            out = rnd.randint(1, 20)
            stages.append(
                Stage(
                    name=f"s{k}",
                    forward_time=float(rnd.randint(1, 10)),
                    backward_time=float(rnd.randint(1, 10)),
                    output_size=out,
                    saved_size=out + rnd.randint(0, 20),
                    forward_overhead=rnd.randint(0, 10),
                    backward_overhead=rnd.randint(0, 10),
                )
            )
        prof = Profile(model=f"gap-{chains}", input_size=rnd.randint(1, 20), stages=stages)
        rate = rnd.choice([1000.0, 2000.0, 3000.0, 5000.0, 10000.0])
        inst = OffloadInstance.from_profile(prof, rate)
        low, high = inst.min_memory(), inst.peak()
        if high <= low:
            continue
        chains += 1
        memory = rnd.randint(low, high - 1)
        best = best_real(prof, rate, memory)
        for algo in ALGOS:
            sched = memplan.solve(prof, algo, memory, optimizer="none", bandwidth=rate)
            gaps[algo].append(sched.makespan / best[0] - 1)
    lines = [
        f"Problem-1 gap on {cases} random chains (2-8 stages, one budget each), makespan / best "
        "no-wait ordered schedule over every subset - 1:",
        "",
        "| algorithm | optimal | < 1% | < 5% | mean | 90th pct | 99th pct | worst |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for algo, values in gaps.items():
        v = np.array(values)
        lines.append(
            f"| {algo} | {np.mean(v < 1e-9):.1%} | {np.mean(v < 0.01):.1%} | "
            f"{np.mean(v < 0.05):.1%} | {v.mean():.2%} | {np.quantile(v, 0.9):.2%} | "
            f"{np.quantile(v, 0.99):.2%} | {v.max():.2%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default=PROFILES)
    parser.add_argument("--bandwidths", default="12GB/s,25GB/s")
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--slots", type=int, default=500)
    parser.add_argument("--bound-slots", type=int, default=32000)
    parser.add_argument("--plots", type=Path, default=None, help="directory for the figures")
    parser.add_argument("--full", action="store_true", help="also print every point")
    parser.add_argument("--gap", type=int, default=0, help="random chains for the Problem-1 gap")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"machine: {machine()}\n")
    if args.gap:
        print(gap(args.gap, args.seed))
        return
    rates = [parse_rate(r) for r in args.bandwidths.split(",")]
    results = [
        sweep(name, rate, args.points, args.slots, args.bound_slots)
        for name in args.profiles.split(",")
        for rate in rates
    ]
    print(summary_table(results))
    if args.full:
        for res in results:
            print()
            print(point_table(res))
    if args.plots is not None:
        for path in plot(results, args.plots):
            print(f"\nwrote {path}")
    print()
    print(timing("resnet152@a100", rates[0], args.slots, args.points))


if __name__ == "__main__":
    main()
