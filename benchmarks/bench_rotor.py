"""Rotor's solve time, side by side with a baseline memplan and the three C ports of the rotor DP.

Usage::

    python benchmarks/bench_rotor.py [--lengths 10,50,100,200,500] [--budgets 40,60,80]
        [--repeats 5] [--baseline PYTHON] [--against DIR]
    python benchmarks/bench_rotor.py --bundled [--baseline PYTHON]   # --slots auto, every profile

Chains are ``random_chain(L, seed=L, max_size=1000)``, budgets a percentage of the store-all peak
(activations, ``--optimizer none``). A time is one call of :func:`memplan.algorithms.chain.rotor.
plan_rotor` (least memory, the DP, the backtrack), wall clock and CPU (``time.process_time``, which
varies less on a loaded machine); each plan is checked against the budget (``ChainInstance.peak``, exact in
bytes). Each memplan runs in a worker process of its own (this tree's interpreter, and with
``--baseline`` another memplan's, e.g. ``/work/main/.venv/bin/python``), started once; each cell is
the median of ``--repeats`` rounds, the order of the tools alternating every round, after one
untimed call.

``--against DIR`` adds the C ports built in DIR by ``python benchmarks/rotor_ports.py build SRC
DIR`` (their code is never part of this tree: see rotor_ports.py), run in this process on memplan's
500-slot grid (the same rounded sizes), next to memplan at 500 slots. The authors' code and
ColossalAI's return their whole table as Python dictionaries and are skipped beyond
``--dict-limit`` stages (default 100: at 200 stages that is 20 million entries).

``--bundled``: ``--slots auto`` (the default) on every bundled chain profile at ``--points``
budgets (default 5) from its least memory to just below its store-all peak; the table gives the
slowest budget of each (by CPU time) and whether both memplans' makespans agree at every budget.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from _common import machine

WORKER = r"""
import json, sys, time
import memplan
from memplan.algorithms import chain as chain_package
from memplan.algorithms.chain import ChainInstance, chain_min_memory
from memplan.profile.synthetic import random_chain
plan_rotor = getattr(chain_package, "plan_rotor", None) or chain_package.solve_rotor
chains = {}

def chain_of(task):
    key = (task["length"], task.get("profile"))
    if key not in chains:
        if task.get("profile"):
            chains[key] = ChainInstance.from_profile(memplan.load_profile(task["profile"]))
        else:
            L = task["length"]
            chains[key] = ChainInstance.from_profile(random_chain(L, seed=L, max_size=1000))
    return chains[key]

for line in sys.stdin:
    task = json.loads(line)
    chain = chain_of(task)
    memory = task["memory"]
    slots = task["slots"]
    started, cpu = time.perf_counter(), time.process_time()
    plan = plan_rotor(chain, memory, slots=slots)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert plan.sequence is not None and chain.peak(plan.sequence) <= memory
    print(json.dumps({"wall": wall, "cpu": cpu, "makespan": plan.claimed_makespan}), flush=True)
"""


class Worker:
    """A memplan in a process of its own, answering one timed solve per task."""

    def __init__(self, python: str) -> None:
        self.process = subprocess.Popen(
            [python, "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),  # not this tree: a baseline imports its own memplan
        )

    def run(self, task: dict) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(task) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the worker ended on {task}")
        return json.loads(answer)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def rounds(workers: dict[str, Worker], task: dict, repeats: int, extra=None) -> dict:
    """Medians of ``repeats`` alternated rounds of each worker (and ``extra``: name -> callable
    returning (wall, cpu, makespan)), after one untimed call each."""
    runners = {name: partial(w.run, task) for name, w in workers.items()}
    for name, run in (extra or {}).items():
        runners[name] = run
    for run in runners.values():
        run()
    found: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in runners}
    makespan: dict[str, float] = {}
    order = list(runners)
    for r in range(repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            got = runners[name]()
            found[name]["wall"].append(got["wall"])
            found[name]["cpu"].append(got["cpu"])
            makespan[name] = got["makespan"]
    return {
        n: {
            "wall": statistics.median(v["wall"]),
            "cpu": statistics.median(v["cpu"]),
            "makespan": makespan[n],
        }
        for n, v in found.items()
    }


def cell(found: dict) -> str:
    return f"{found['wall']:.4f} ({found['cpu']:.4f})"


def port_runner(run, ft, bt, rounded, capacity):
    def go() -> dict:
        started, cpu = time.perf_counter(), time.process_time()
        makespan = run(ft, bt, rounded, capacity)
        return {
            "wall": time.perf_counter() - started,
            "cpu": time.process_time() - cpu,
            "makespan": makespan,
        }

    return go


def lengths_table(args: argparse.Namespace, workers: dict[str, Worker]) -> None:
    from memplan.algorithms.chain import ChainInstance, chain_min_memory
    from memplan.algorithms.chain.rotor import slot_sizes
    from memplan.profile.synthetic import random_chain

    ports = {}
    if args.against:
        sys.path.insert(0, str(Path(__file__).parent))
        from rotor_ports import load_ports

        ports = load_ports(Path(args.against))
        print(f"ports: {', '.join(ports) or 'none found in ' + args.against}")
    names = list(workers)
    head = "| stages | budget |"
    head += "".join(f" {n} default s (CPU) |" for n in names)
    head += "".join(f" {n} 500 slots s (CPU) |" for n in names)
    head += "".join(f" {p} s (CPU) |" for p in ports)
    if "baseline" in workers:
        head += " default this / baseline, CPU | 500 slots this / baseline, CPU |"
    if ports:
        head += " 500 slots: makespans (memplan; ports) |"
    print(head)
    print("|---|---|" + "---:|" * (head.count("|") - 3))
    for length in (int(v) for v in args.lengths.split(",")):
        chain = ChainInstance.from_profile(random_chain(length, seed=length, max_size=1000))
        store_all, least = chain.store_all_peak(), chain_min_memory(chain)
        for percent in (int(v) for v in args.budgets.split(",")):
            memory = max(least, store_all * percent // 100)
            task = {"length": length, "memory": memory}
            default = rounds(workers, {**task, "slots": "auto"}, args.repeats)
            capacity, rounded = slot_sizes(chain, memory - int(chain.x[0]), 500)
            ft, bt = chain.ft.tolist(), chain.bt.tolist()
            extra = {
                p: port_runner(run, ft, bt, rounded, capacity)
                for p, run in ports.items()
                if p == "rk_rotor" or length <= args.dict_limit
            }
            grid = rounds(workers, {**task, "slots": 500}, args.repeats, extra)
            line = f"| {length} | {percent}% |"
            line += "".join(f" {cell(default[n])} |" for n in names)
            line += "".join(f" {cell(grid[n])} |" for n in names)
            line += "".join(f" {cell(grid[p])} |" if p in grid else " - |" for p in ports)
            if "baseline" in workers:
                d, g = default, grid
                line += (
                    f" {d['this']['wall'] / d['baseline']['wall']:.2f}, "
                    f"{d['this']['cpu'] / d['baseline']['cpu']:.2f} |"
                    f" {g['this']['wall'] / g['baseline']['wall']:.2f}, "
                    f"{g['this']['cpu'] / g['baseline']['cpu']:.2f} |"
                )
            if ports:
                spans = ", ".join(f"{grid[p]['makespan']:.2f}" for p in ports if p in grid)
                line += f" {grid['this']['makespan']:.2f}; {spans} |"
            print(line, flush=True)


def bundled_table(args: argparse.Namespace, workers: dict[str, Worker]) -> None:
    import memplan
    from memplan.algorithms.chain import ChainInstance, chain_min_memory
    from memplan.profile import bundled_profiles

    names = list(workers)
    head = "| profile | stages |" + "".join(f" {n} slowest s (CPU) |" for n in names)
    if "baseline" in workers:
        head += " this / baseline, CPU (slowest budget) | same makespans |"
    print(head)
    print("|---|---:|" + "---:|" * (head.count("|") - 3))
    for name in bundled_profiles():
        prof = memplan.load_profile(name)
        if prof.stages is None:
            continue
        chain = ChainInstance.from_profile(prof)
        least, store_all = chain_min_memory(chain), chain.store_all_peak()
        slowest: dict[str, dict] = {}
        same = True
        for i in range(args.points):
            memory = least + (store_all - 1 - least) * i // max(args.points - 1, 1)
            task = {"length": chain.length, "profile": name, "memory": memory, "slots": "auto"}
            found = rounds(workers, task, args.repeats)
            for n in names:
                if n not in slowest or found[n]["cpu"] > slowest[n]["cpu"]:
                    slowest[n] = found[n]
            spans = {found[n]["makespan"] for n in names}
            same = same and len(spans) == 1
        line = f"| {name} | {chain.length} |" + "".join(f" {cell(slowest[n])} |" for n in names)
        if "baseline" in workers:
            line += (
                f" {slowest['this']['wall'] / slowest['baseline']['wall']:.2f}, "
                f"{slowest['this']['cpu'] / slowest['baseline']['cpu']:.2f} | {same} |"
            )
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="10,50,100,200,500")
    parser.add_argument("--budgets", default="40,60,80", help="%% of the store-all peak")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", help="another memplan's Python (e.g. main's venv)")
    parser.add_argument("--against", metavar="DIR", help="C ports built by rotor_ports.py")
    parser.add_argument("--dict-limit", type=int, default=100)
    parser.add_argument("--bundled", action="store_true")
    parser.add_argument("--points", type=int, default=5, help="--bundled: budgets per profile")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    workers = {"this": Worker(sys.executable)}
    if args.baseline:
        workers["baseline"] = Worker(args.baseline)
    try:
        if args.bundled:
            bundled_table(args, workers)
        else:
            lengths_table(args, workers)
    finally:
        for worker in workers.values():
            worker.close()
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
