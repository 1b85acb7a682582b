"""The budget holds in real training: the allocator-measured peak of real steps under every plan.

Usage::

    python benchmarks/bench_measure.py                         # every model, CPU (hours on 2 cores)
    python benchmarks/bench_measure.py --models gpt-tiny --out results.json
    python benchmarks/bench_measure.py --report a.json b.json  # the markdown tables of results
    python benchmarks/bench_measure.py --device cuda --out gpu.json    # on a GPU (make gpu-check)

For each model (small inputs, short sequences: ``MODELS``) the model is profiled once on the device
(``memplan.torch.profile_model``, one timed repetition) and, for each optimizer, ``--budgets``
budgets are spread evenly from the least memory of the chain and offloading families (``memplan
info``'s least memory, static memory of the optimizer included) to the store-all need. At every
(optimizer, budget, algorithm) point the algorithm solves (``memplan.solve``; the offloading and
combined ones at ``--bandwidth``) and, when a plan fits, a fresh copy of the model trains
``--steps`` steps under it exactly as ``memplan run`` does
(:func:`memplan.torch.measure.step.train_under_plan`: ``checkpointed``, the optimizer of
``--optimizer``, each step measured by :func:`memplan.torch.measure_step`; offloading plans run
real copies, to numpy-allocated host buffers on CPU, pinned ones on a side stream on CUDA).
Reported per point: the plan's peak, the measured peak (the largest over the steps), measured /
budget and measured / plan. The goal (docs/runtime.md): measured <= budget at every point, and
within 5% of the plan's peak.

Every point is reported, the misses too. Timings are not asserted anywhere; the wall time of the
whole run is printed with the machine and its load.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _common import machine

import memplan
from memplan.api import describe
from memplan.units import format_size, parse_rate

MODELS: dict[str, dict[str, Any]] = {
    "resnet18": {"batch_size": 32, "input_shape": (3, 96, 96)},
    "resnet50": {"batch_size": 8, "input_shape": (3, 64, 64)},
    "mobilenet_v2": {"batch_size": 16, "input_shape": (3, 96, 96)},
    "gpt-tiny": {"batch_size": 4, "input_shape": (32,)},
    "gpt-small": {"batch_size": 2, "input_shape": (64,)},
}
"""The benchmark's models and inputs (small inputs, short sequences)."""

ALGOS = ("rotor", "revolve", "periodic", "dynprog", "pofo")
OPTIMIZERS = ("sgd", "momentum", "adam")
GOAL = 0.05  # measured within 5% of the plan's peak


def budgets_of(prof: memplan.Profile, optimizer: str, count: int) -> list[int]:
    """``count`` budgets from the least memory (chain or offloading) to the store-all need."""
    desc = describe(prof, optimizer)
    least = min(desc["min_memory"].values())
    most = desc["store_all_memory"]
    if count == 1:
        return [most]
    return [least + (most - least) * i // (count - 1) for i in range(count)]


def run_model(
    name: str,
    *,
    device: str,
    algos: list[str],
    optimizers: list[str],
    count: int,
    steps: int,
    bandwidth: float,
    profile_dir: Path | None,
    log: Any,
) -> dict[str, Any]:
    """Profile one model and measure every point; returns the model's results."""
    import torch

    from memplan.torch import build_model, profile_model
    from memplan.torch.base.device import resolve_device
    from memplan.torch.measure.step import train_under_plan

    torch.set_num_threads(1) if device == "cpu" else None
    dev = resolve_device(device)
    config = MODELS[name]
    module, x, _ = build_model(name, **config)  # kept on the CPU: each point trains a copy on
    x = x.to(dev)  # the device, where the allocator counts every tensor (an idle original too)
    started = time.perf_counter()
    measured_prof = profile_model(
        copy.deepcopy(module).to(dev), example_input=x, device=str(dev), repeats=1, name=name
    )
    profile_seconds = time.perf_counter() - started
    data = measured_prof.model_dump(exclude_none=True)
    if data.get("bandwidth") is None:  # CPU: no host link to measure, the benchmark's own
        data["bandwidth"] = bandwidth
    prof = memplan.load_profile(data)
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        memplan.save_profile(prof, profile_dir / f"{name}.yaml")
    points = []
    for optimizer in optimizers:
        for budget in budgets_of(prof, optimizer, count):
            for algo in algos:
                point: dict[str, Any] = {
                    "model": name,
                    "optimizer": optimizer,
                    "algorithm": algo,
                    "budget": budget,
                }
                sched = memplan.solve(prof, algo, budget, optimizer=optimizer)
                point["feasible"] = sched.feasible
                if sched.feasible:
                    trained = copy.deepcopy(module).to(dev)
                    doc = train_under_plan(trained, x, prof, sched, steps=steps)
                    del trained
                    point.update(
                        planned=sched.peak_memory,
                        measured=doc["measured_peak_memory"],
                        step_peaks=doc["measured_step_peaks"],
                        over_budget=doc["measured_over_budget"],
                        over_plan=doc["measured_over_planned"],
                        recomputed=sum(doc["forwards_planned"]) - len(doc["stages"]),
                        offloaded=doc["offloaded_bytes"],
                        forwards_match=doc["forwards_planned"] == doc["forwards_measured"],
                        step_ms=doc["step_ms"],
                    )
                points.append(point)
                print(_line(point), file=log, flush=True)
    return {
        "model": name,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
        "device": dev.type,
        "device_name": prof.device.name if prof.device else None,
        "bandwidth": prof.bandwidth,
        "profile_seconds": profile_seconds,
        "points": points,
    }


def _line(p: dict[str, Any]) -> str:
    head = (
        f"{p['model']:12s} {p['optimizer']:8s} {p['algorithm']:8s} {format_size(p['budget']):>10s}"
    )
    if not p["feasible"]:
        return f"{head}  no plan"
    flag = "  OVER BUDGET" if p["measured"] > p["budget"] else ""
    return (
        f"{head}  plan {format_size(p['planned']):>10s}  measured {format_size(p['measured']):>10s}"
        f"  m/b {p['over_budget']:.4f}  m/plan {p['over_plan']:.4f}{flag}"
    )


def report(results: list[dict[str, Any]]) -> str:
    """Markdown: a summary table, then every point per model and optimizer."""
    out = []
    points = [p for r in results for p in r["points"] if p["feasible"]]
    total = [p for r in results for p in r["points"]]
    within = sum(p["measured"] <= p["budget"] for p in points)
    close = sum(abs(p["measured"] - p["planned"]) <= GOAL * p["planned"] for p in points)
    out.append(
        f"{len(total)} points, {len(points)} with a plan: measured <= budget at {within} "
        f"({100 * within / max(1, len(points)):.1f}%), measured within 5% of the plan's peak at "
        f"{close} ({100 * close / max(1, len(points)):.1f}%)."
    )
    out.append("")
    out.append(
        "| model | optimizer | algorithm | points with a plan | measured <= budget | max measured / budget | min measured / plan | max measured / plan |"
    )
    out.append("|---|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        for optimizer in dict.fromkeys(p["optimizer"] for p in r["points"]):
            for algo in dict.fromkeys(p["algorithm"] for p in r["points"]):
                cell = [
                    p
                    for p in r["points"]
                    if p["optimizer"] == optimizer and p["algorithm"] == algo and p["feasible"]
                ]
                if not cell:
                    out.append(f"| {r['model']} | {optimizer} | {algo} | 0 | - | - | - | - |")
                    continue
                ok = sum(p["measured"] <= p["budget"] for p in cell)
                out.append(
                    f"| {r['model']} | {optimizer} | {algo} | {len(cell)} | {ok} | "
                    f"{max(p['over_budget'] for p in cell):.4f} | "
                    f"{min(p['over_plan'] for p in cell):.4f} | "
                    f"{max(p['over_plan'] for p in cell):.4f} |"
                )
    for r in results:
        config = r["config"]
        shape = "x".join(str(d) for d in config["input_shape"])
        out.append("")
        out.append(
            f"#### {r['model']} (batch {config['batch_size']}, input {shape}, {r['device']}, "
            f"offloading at {format_size(r['bandwidth'])}/s)"
        )
        for optimizer in dict.fromkeys(p["optimizer"] for p in r["points"]):
            algos = list(dict.fromkeys(p["algorithm"] for p in r["points"]))
            out.append("")
            out.append(
                f"{optimizer}: per algorithm, plan's peak / measured peak (MB) and measured / "
                "budget; `-`: no plan at this budget; **bold**: over the budget."
            )
            out.append("")
            out.append("| budget (MB) | " + " | ".join(algos) + " |")
            out.append("|---:|" + "---:|" * len(algos))
            budgets = dict.fromkeys(p["budget"] for p in r["points"] if p["optimizer"] == optimizer)
            for budget in budgets:
                cells = []
                for algo in algos:
                    p = next(
                        q
                        for q in r["points"]
                        if q["optimizer"] == optimizer
                        and q["algorithm"] == algo
                        and q["budget"] == budget
                    )
                    if not p["feasible"]:
                        cells.append("-")
                        continue
                    ratio = f"{p['over_budget']:.3f}"
                    if p["measured"] > p["budget"]:
                        ratio = f"**{ratio}**"
                    cells.append(f"{p['planned'] / 1e6:.2f} / {p['measured'] / 1e6:.2f} ({ratio})")
                out.append(f"| {budget / 1e6:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--algos", default=",".join(ALGOS))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--budgets", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--bandwidth",
        default="1GB/s",
        help="offloading bandwidth where the profile has none (CPU)",
    )
    parser.add_argument("--out", type=Path, help="write the results (JSON) here")
    parser.add_argument("--profiles", type=Path, help="save the measured profiles here")
    parser.add_argument("--report", nargs="*", type=Path, help="print the tables of results")
    args = parser.parse_args()
    if args.report:
        results = [r for path in args.report for r in json.loads(path.read_text())["results"]]
        print(report(results))
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    started = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {machine()}; load average at the start {load:.1f}", flush=True)
    results = []
    for name in models:
        results.append(
            run_model(
                name,
                device=args.device,
                algos=args.algos.split(","),
                optimizers=args.optimizers.split(","),
                count=args.budgets,
                steps=args.steps,
                bandwidth=parse_rate(args.bandwidth),
                profile_dir=args.profiles,
                log=sys.stdout,
            )
        )
        if args.out is not None:
            _write(args.out, results, started, load)
    seconds = time.perf_counter() - started
    end_load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# wall time {seconds:.0f} s; load average at the end {end_load:.1f}")
    if args.out is not None:
        _write(args.out, results, started, load)
    print(report(results))
    points = [p for r in results for p in r["points"] if p["feasible"]]
    return 0 if all(p["measured"] <= p["budget"] for p in points) else 1


def _write(path: Path, results: list[dict[str, Any]], started: float, load: float) -> None:
    doc = {
        "machine": machine(),
        "load_at_start": load,
        "seconds": time.perf_counter() - started,
        "results": results,
    }
    path.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    sys.exit(main())
