"""Slot rounding of dynprog and pofo, and dynprog on long chains.

Usage::

    python benchmarks/bench_offload_slots.py dynprog   # rounding loss, 500 slots vs --slots auto
    python benchmarks/bench_offload_slots.py pofo      # the same for pofo (its candidates)
    python benchmarks/bench_offload_slots.py scale     # `memplan solve --algo dynprog`, long chains

``dynprog``: on the bundled @a100 profiles at 12 and 25 GB/s and 20 budgets each (activations only,
``--optimizer none``, from the least memory of full offloading to M_peak), the makespan of the plan
with 500 slots (before) and with ``--slots auto`` (after), both through :func:`memplan.solve`
(replayed by the simulator), against the best of the finer fixed grids 2000, 20000, 100000 and one
byte per slot (the DP with no rounding of sizes). The loss is ``makespan / reference - 1`` (negative
where the plan beats every finer grid); "> 0.5%" counts the budgets above 0.5%. ``vs bytes`` is the
loss against the one-byte grid alone.

``pofo``: the same budgets as benchmarks/bench_combined.py (rotor's least memory to the store-all
need, 20 budgets), 12 and 25 GB/s: pofo before (its DPs at 50 slots, its dynprog candidate at 500),
pofo now (``--slots auto``: 50, and 64 for the Theorem 1 DP on chains of at most 24 stages or when
50 gives no schedule; dynprog candidate at ``auto``), and pofo with its DPs at 57 and at 64 slots
(the Theorem 1 DP's most; dynprog at ``auto``); the loss is against the best of the four. Rotor's
candidate stays at 500 slots in all four (rotor's own rounding is measured by bench_rotor.py).

``scale``: random chains ``random_chain(L, seed=L, max_size=10**8)`` (sizes up to 100 MB, times
0.1-10 ms), written to a YAML file and solved by the command a user types, ``memplan solve FILE
--algo dynprog --mem M --bandwidth 12GB/s --optimizer none -f json``, at half the store-all memory
(the issue's setting) and at 9 budgets from the least memory to the peak (``--budgets``): wall and
CPU time of the whole command (start-up, parsing and the simulator's replay included); the DP runs,
work and grids come from the same solve run again in this process.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine

import memplan
from memplan.algorithms.chain.problem import ChainInstance
from memplan.algorithms.combined.solve import solve_pofo
from memplan.algorithms.offload.dynprog import solve_dynprog
from memplan.algorithms.offload.model import OffloadInstance
from memplan.api import auto_budgets, describe
from memplan.profile.io import save_profile
from memplan.profile.synthetic import random_chain
from memplan.units import format_size

PROFILES = (
    "resnet18@a100,resnet34@a100,resnet50@a100,resnet101@a100,resnet152@a100,densenet121@a100,"
    "vgg16@a100,inception_v3@a100,gpt-small@a100"
)
RATES = (12e9, 25e9)
FINER = (2000, 20000, 100000, "bytes")
THRESHOLD = 0.005


def _loss(values: list[float], refs: list[float]) -> list[float]:
    """``value / reference - 1`` per budget (0 where no reference fits, inf where only it does)."""
    return [
        0.0 if not math.isfinite(r) else (v / r - 1 if math.isfinite(v) else math.inf)
        for v, r in zip(values, refs, strict=True)
    ]


def _cells(loss: list[float]) -> str:
    worst = max(loss)
    above = sum(x > THRESHOLD for x in loss)
    return f"{100 * worst:+.2f}% | {above}"


def dynprog_rows(name: str, rate: float, points: int) -> dict:
    prof = memplan.load_profile(name)
    inst = OffloadInstance.from_profile(prof, rate)
    budgets = auto_budgets(prof, ["dynprog"], points, optimizer="none")
    out: dict = {"before": [], "after": [], "ref": [], "bytes": [], "t_before": [], "t_after": []}
    for memory in budgets:
        finer = {}
        for grid in FINER:
            plan = solve_dynprog(inst, memory, slots=max(memory, 500) if grid == "bytes" else grid)
            finer[grid] = plan.claimed_makespan if plan.ops is not None else math.inf
        out["ref"].append(min(finer.values()))
        out["bytes"].append(finer["bytes"])
        for key, slots in (("before", 500), ("after", None)):
            started = time.perf_counter()
            sched = memplan.solve(
                prof, "dynprog", memory, slots=slots, optimizer="none", bandwidth=rate
            )
            out["t_" + key].append(time.perf_counter() - started)
            out[key].append(sched.makespan if sched.feasible else math.inf)
    return out


def dynprog_table(names: list[str], points: int) -> None:
    print(
        "| profile | bandwidth | stages | before: max loss | > 0.5% | vs bytes | "
        "after (auto): max loss | > 0.5% | vs bytes | time before / after (s, worst) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        for rate in RATES:
            r = dynprog_rows(name, rate, points)
            stages = memplan.load_profile(name).length
            before, after = _loss(r["before"], r["ref"]), _loss(r["after"], r["ref"])
            vs_bytes_b = max(_loss(r["before"], r["bytes"]))
            vs_bytes_a = max(_loss(r["after"], r["bytes"]))
            print(
                f"| {name} | {format_size(rate)}/s | {stages} | {_cells(before)} | "
                f"{100 * vs_bytes_b:+.2f}% | {_cells(after)} | {100 * vs_bytes_a:+.2f}% | "
                f"{max(r['t_before']):.2f} / {max(r['t_after']):.2f} |",
                flush=True,
            )


POFO_CONFIGS = {
    "before": {"slots": 50, "dynprog_slots": 500},
    "now": {},  # slots="auto"
    "57": {"slots": 57},
    "64": {"slots": 64},
}


def pofo_table(names: list[str], points: int) -> None:
    print(
        "| profile | stages | bandwidth | before (50): max loss | > 0.5% | now (auto): max loss | "
        "> 0.5% | 57 slots | > 0.5% | 64 slots | > 0.5% | winners (now) | "
        "time before / now (s, worst) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        prof = memplan.load_profile(name)
        chain = ChainInstance.from_profile(prof)
        desc = describe(prof, "none")
        low, high = desc["min_memory"]["chain"], desc["store_all_memory"]
        budgets = [round(low + (high - low) * i / (points - 1)) for i in range(points)]
        for rate in RATES:
            inst = OffloadInstance.from_profile(prof, rate)
            found = {key: [] for key in POFO_CONFIGS}
            seconds = {key: 0.0 for key in POFO_CONFIGS}
            winners: dict[str, int] = {}
            for memory in budgets:
                for key, options in POFO_CONFIGS.items():
                    started = time.perf_counter()
                    plan = solve_pofo(
                        chain,
                        memory,
                        bandwidth=rate,
                        rotor_slots=500,
                        offload_instance=inst,
                        **options,
                    )
                    seconds[key] = max(seconds[key], time.perf_counter() - started)
                    found[key].append(plan.claimed_makespan if plan.ops is not None else math.inf)
                    if key == "now" and plan.ops is not None:
                        source = plan.details["source"]
                        winners[source] = winners.get(source, 0) + 1
            refs = [min(values) for values in zip(*found.values(), strict=True)]
            cells = " | ".join(_cells(_loss(found[key], refs)) for key in POFO_CONFIGS)
            won = ", ".join(f"{k} {v}" for k, v in sorted(winners.items()))
            print(
                f"| {name} | {chain.length} | {format_size(rate)}/s | {cells} | {won} | "
                f"{seconds['before']:.1f} / {seconds['now']:.1f} |",
                flush=True,
            )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def scale_table(lengths: list[int], budgets: int) -> None:
    print(
        "| stages | store-all | budget | wall / CPU (s) | DP runs | DP work (states) | grids | "
        "makespan (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for length in lengths:
            prof = random_chain(length, seed=length, max_size=10**8)
            path = Path(tmp) / f"random-{length}.yaml"
            save_profile(prof, path)
            desc = describe(prof, "none")
            low, high = desc["min_memory"]["offload"], desc["offload_peak"]
            store_all = desc["store_all_memory"]
            points = [store_all // 2] + [
                low + (high - low) * i // (budgets + 1) for i in range(1, budgets + 1)
            ]
            for memory in points:
                started, cpu = time.perf_counter(), _children_cpu()
                done = subprocess.run(
                    [sys.executable, "-m", "memplan", "solve", str(path), "--algo", "dynprog"]
                    + ["--mem", str(memory), "--bandwidth", "12GB/s", "--optimizer", "none"]
                    + ["-f", "json"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                wall = time.perf_counter() - started
                wall = f"{wall:.1f} / {_children_cpu() - cpu:.1f}"
                if done.returncode != 0:
                    print(
                        f"| {length} | | {format_size(memory)} | {wall} | exit "
                        f"{done.returncode} | | | |",
                        flush=True,
                    )
                    continue
                doc = json.loads(done.stdout)
                plan = solve_dynprog(
                    OffloadInstance.from_profile(prof, 12e9), memory - doc["static_memory"]
                )
                print(
                    f"| {length} | {format_size(store_all)} | {format_size(memory)} | {wall} | "
                    f"{plan.details.get('dp_runs', 0)} | {plan.details.get('dp_work', 0)} | "
                    f"{plan.details.get('grids', '-')} | {doc['makespan']:.1f} |",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("dynprog", "pofo", "scale"))
    parser.add_argument("--profiles", default=PROFILES)
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--lengths", default="250,500,1000,2000")
    parser.add_argument("--budgets", type=int, default=9, help="scale: budgets besides half")
    args = parser.parse_args()
    print(f"{machine()}\n")
    names = [n for n in args.profiles.split(",") if n]
    if args.what == "dynprog":
        dynprog_table(names, args.points)
    elif args.what == "pofo":
        pofo_table(names, args.points)
    else:
        scale_table([int(v) for v in args.lengths.split(",")], args.budgets)


if __name__ == "__main__":
    main()
