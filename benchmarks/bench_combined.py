"""pofo (recomputation + offloading) against rotor and dynprog alone (issue #5, papers/000).

For each profile, 20 budgets from the least memory of rotor (recomputing everything) to the
store-all need, at 12 GB/s and ``--optimizer none`` (activations only, as in the papers). Prints a
markdown table per profile: makespans (ms) of rotor and pofo at 50 and 500 slots, dynprog (500),
which candidate pofo returned (its DP, rotor or dynprog) and pofo's gain over ``min(rotor,
dynprog)`` at the same slots (positive: pofo is faster). Every plan comes from :func:`memplan.solve`, so it has been replayed
by the simulator of its family.

Usage: ``python benchmarks/bench_combined.py [--plot docs/combined_resnet50_a100.png]``
"""

from __future__ import annotations

import argparse
import time

import memplan
from memplan.api import describe

PROFILES = ["resnet50@a100", "resnet101@a100", "densenet121@a100"]
BANDWIDTH = 12e9
STEPS = 20
LABELS = {
    "rotor": "rotor (50 slots)",
    "pofo": "pofo (50 slots)",
    "rotor500": "rotor (500 slots)",
    "dynprog": "dynprog (500 slots)",
    "pofo500": "pofo (500 slots)",
}


def sweep(name: str) -> list[dict]:
    prof = memplan.load_profile(name)
    desc = describe(prof, "none")
    lo, hi = desc["min_memory"]["chain"], desc["store_all_memory"]
    rows = []
    for i in range(STEPS):
        memory = round(lo + (hi - lo) * i / (STEPS - 1))
        row: dict = {"memory": memory}
        for algo, slots in (
            ("rotor", 50),
            ("rotor500", 500),
            ("dynprog", 500),
            ("pofo", 50),
            ("pofo500", 500),
        ):
            started = time.perf_counter()
            kwargs = {"bandwidth": BANDWIDTH} if not algo.startswith("rotor") else {}
            sched = memplan.solve(
                prof, algo.removesuffix("500"), memory, optimizer="none", slots=slots, **kwargs
            )
            row[algo] = sched.makespan if sched.feasible else None
            row[algo + "_s"] = time.perf_counter() - started
            if algo.startswith("pofo"):
                row[algo + "_from"] = (sched.solver.message or "").rsplit(": ", 1)[-1]
        rows.append(row)
    return rows


def table(name: str, rows: list[dict]) -> str:
    lines = [
        f"### {name} at 12 GB/s",
        "",
        "| budget (GB) | rotor (50) | pofo (50) | from | gain (50) | rotor (500) | dynprog (500) "
        "| pofo (500) | from | gain (500) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(v):
        return "-" if v is None else f"{v:.2f}"

    def gain(r, rotor, pofo):
        alone = [v for v in (r[rotor], r["dynprog"]) if v is not None]
        if not alone or r[pofo] is None:
            return "-"
        return f"{100 * (1 - r[pofo] / min(alone)):+.2f}%"

    for r in rows:
        lines.append(
            f"| {r['memory'] / 1e9:.3f} | {fmt(r['rotor'])} | {fmt(r['pofo'])} | {r['pofo_from']} "
            f"| {gain(r, 'rotor', 'pofo')} | {fmt(r['rotor500'])} | {fmt(r['dynprog'])} | "
            f"{fmt(r['pofo500'])} | {r['pofo500_from']} | {gain(r, 'rotor500', 'pofo500')} |"
        )
    return "\n".join(lines)


def plot(name: str, rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    mem = [r["memory"] / 1e9 for r in rows]
    for algo, style in (
        ("rotor", "o--"),
        ("pofo", "^--"),
        ("rotor500", "o-"),
        ("dynprog", "s-"),
        ("pofo500", "^-"),
    ):
        ax.plot(
            mem,
            [r[algo] if r[algo] is not None else float("nan") for r in rows],
            style,
            label=LABELS.get(algo, algo),
        )
    ax.set_xlabel("activation budget (GB)")
    ax.set_ylabel("makespan (ms)")
    ax.set_title(f"{name}, 12 GB/s: recomputation, offloading, both")
    ax.set_ylim(top=min(3 * min(r["pofo"] for r in rows if r["pofo"]), ax.get_ylim()[1]))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", help="write the resnet50@a100 figure here")
    parser.add_argument("--profiles", default=",".join(PROFILES))
    args = parser.parse_args()
    for name in args.profiles.split(","):
        rows = sweep(name)
        print(table(name, rows))
        print()
        if args.plot and name == "resnet50@a100":
            plot(name, rows, args.plot)


if __name__ == "__main__":
    main()
