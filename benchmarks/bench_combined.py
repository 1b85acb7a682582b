"""pofo (recomputation + offloading) against rotor and dynprog alone (Efficient Combination of Rematerialization and Offloading (NeurIPS 2021)).

For each profile, 20 budgets from the least memory of rotor (recomputing everything) to the
store-all need, at 12 GB/s and ``--optimizer none`` (activations only, as in the papers), every
algorithm at its defaults (rotor and dynprog 500 slots; pofo 50 slots for its DPs as in Efficient Combination of Rematerialization and Offloading (NeurIPS 2021),
its rotor candidate at rotor's 500). Prints a markdown table per profile: makespans (ms) of rotor,
dynprog and pofo, the candidate pofo returned, the value of the Theorem 1 DP (fractional transfers)
next to the simulated makespan of the whole-tensor schedule realizing it, the window DP's value,
pofo's gain over ``min(rotor, dynprog)`` (positive: pofo is faster) and pofo's solve time. Every
plan comes from :func:`memplan.solve`, so it has been replayed by the simulator of its family.

Usage: ``python benchmarks/bench_combined.py [--plot-dir docs]`` (one PNG per profile).
"""

from __future__ import annotations

import argparse
import re
import time

from _common import machine

import memplan
from memplan.api import describe

PROFILES = ["resnet50@a100", "resnet101@a100", "densenet121@a100"]
BANDWIDTH = 12e9
STEPS = 20


def _value(message: str, label: str) -> float | None:
    found = re.search(re.escape(label) + r" ([\d.]+) ms", message)
    return float(found.group(1)) if found else None


def sweep(name: str) -> list[dict]:
    prof = memplan.load_profile(name)
    desc = describe(prof, "none")
    lo, hi = desc["min_memory"]["chain"], desc["store_all_memory"]
    rows = []
    for i in range(STEPS):
        memory = round(lo + (hi - lo) * i / (STEPS - 1))
        row: dict = {"memory": memory}
        for algo in ("rotor", "dynprog", "pofo"):
            kwargs = {} if algo == "rotor" else {"bandwidth": BANDWIDTH}
            started = time.perf_counter()
            cpu = time.process_time()
            sched = memplan.solve(prof, algo, memory, optimizer="none", **kwargs)
            row[algo + "_s"] = time.perf_counter() - started
            row[algo + "_cpu"] = time.process_time() - cpu
            row[algo] = sched.makespan if sched.feasible else None
            if algo == "pofo":
                message = sched.solver.message or ""
                row["from"] = message.split(":", 1)[0]
                row["frac_value"] = _value(message, "Theorem 1 DP")
                row["frac"] = _value(message, "whole-tensor schedule")
                row["window"] = _value(message, "window DP")
        rows.append(row)
    return rows


def table(name: str, rows: list[dict]) -> str:
    lines = [
        f"### {name} at 12 GB/s",
        "",
        "| budget (GB) | rotor | dynprog | pofo | from | Theorem 1 DP value | its schedule "
        "| window DP | gain | pofo time (s, wall / CPU) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(v):
        return "-" if v is None else f"{v:.2f}"

    for r in rows:
        alone = [v for v in (r["rotor"], r["dynprog"]) if v is not None]
        if not alone or r["pofo"] is None:
            gain = "-"
        else:
            value = 100 * (1 - r["pofo"] / min(alone))
            gain = f"{0.0 if abs(value) < 0.005 else value:+.2f}%"
        lines.append(
            f"| {r['memory'] / 1e9:.3f} | {fmt(r['rotor'])} | {fmt(r['dynprog'])} "
            f"| {fmt(r['pofo'])} | {r['from']} | {fmt(r['frac_value'])} | {fmt(r['frac'])} "
            f"| {fmt(r['window'])} | {gain} | {r['pofo_s']:.1f} / {r['pofo_cpu']:.1f} |"
        )
    return "\n".join(lines)


def plot(name: str, rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    mem = [r["memory"] / 1e9 for r in rows]
    for key, style, label in (
        ("rotor", "o-", "rotor (500 slots)"),
        ("dynprog", "s-", "dynprog (500 slots)"),
        ("pofo", "^-", "pofo (best plan, replayed)"),
        ("frac_value", "x:", "Theorem 1 DP value (50 slots)"),
    ):
        ax.plot(
            mem, [r[key] if r[key] is not None else float("nan") for r in rows], style, label=label
        )
    ax.set_xlabel("activation budget (GB)")
    ax.set_ylabel("makespan (ms)")
    ax.set_title(f"{name}, 12 GB/s: recomputation, offloading, both")
    best = min(r["pofo"] for r in rows if r["pofo"])
    ax.set_ylim(bottom=0.95 * best, top=min(2 * best, ax.get_ylim()[1]))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot-dir", help="write combined_<profile>.png here")
    parser.add_argument("--profiles", default=",".join(PROFILES))
    args = parser.parse_args()
    print(f"machine: {machine()}\n")
    for name in args.profiles.split(","):
        rows = sweep(name)
        print(table(name, rows))
        print()
        if args.plot_dir:
            slug = name.replace("@", "_")
            plot(name, rows, f"{args.plot_dir}/combined_{slug}.png")


if __name__ == "__main__":
    main()
