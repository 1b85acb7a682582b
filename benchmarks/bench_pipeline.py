"""Pipeline family on the bundled ResNet A100 profiles: pipeline-ilp vs pipedream vs gpipe.

The experiment of Pipelined Model Parallelism (Euro-Par 2021) §7 (Figures 11-16): for ResNet-18/34/50 on 4 and 8 GPUs and a range
of per-GPU memory limits, the period found by ``pipeline-ilp`` within ``--time-limit`` seconds
(CP-SAT's own plan and the plan returned, the better of it and PipeDream's), the best valid
PipeDream plan (all candidates replayed by the simulator, NOAM swept) and GPipe's.

The limits are fractions of the least simulated per-GPU peak of any PipeDream candidate on that
many GPUs (``--fractions``), so that the low ones sit where PipeDream has no valid plan.

Usage: ``python benchmarks/bench_pipeline.py [--time-limit 60] [--link-bandwidth 100GB/s]
[--out docs/pipeline_bench.json] [--plots docs]`` (about 6 x len(fractions) x time-limit seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memplan  # noqa: E402
from benchmarks._common import machine  # noqa: E402
from memplan.algorithms.pipeline.ilp import solve_ilp  # noqa: E402
from memplan.algorithms.pipeline.model import PipelineInstance  # noqa: E402
from memplan.algorithms.pipeline.pipedream import candidates  # noqa: E402
from memplan.units import parse_rate  # noqa: E402

MODELS = ("resnet18@a100", "resnet34@a100", "resnet50@a100")
GPUS = (4, 8)


def run(args) -> dict:
    rate = parse_rate(args.link_bandwidth)
    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    scatter = {}
    for name in MODELS:
        prof = memplan.load_profile(name)
        for gpus in GPUS:
            if args.configs and f"{name}/{gpus}" not in args.configs.split(","):
                continue
            inst = PipelineInstance.from_profile(prof, gpus, rate, "sgd")
            cands = candidates(prof, inst, None, "sgd")
            pts = [(r.peak_memory, p.period) for p, r in cands if r.valid]
            scatter[f"{name}/{gpus}"] = pts
            least = min(m for m, _ in pts)
            for frac in fractions:
                memory = int(least * frac)
                row = {"model": name, "gpus": gpus, "memory": memory, "fraction": frac}
                pd = memplan.solve(prof, "pipedream", memory, gpus=gpus, link_bandwidth=rate)
                row["pipedream"] = pd.makespan if pd.feasible else None
                row["pipedream_peak"] = pd.peak_memory
                gp = memplan.solve(prof, "gpipe", memory, gpus=gpus, link_bandwidth=rate)
                row["gpipe_per_batch"] = (
                    gp.makespan / gp.batches_per_period if gp.feasible else None
                )
                started = time.perf_counter()
                out = solve_ilp(prof, inst, memory, args.time_limit)
                row["ilp_seconds"] = time.perf_counter() - started
                row["ilp_own"] = None if out.ilp_plan is None else out.ilp_plan.period
                row["ilp_own_peak"] = None if out.ilp_peaks is None else max(out.ilp_peaks)
                row["first"] = None if out.first_plan is None else out.first_plan.period
                row["first_peak"] = None if out.first_peaks is None else max(out.first_peaks)
                row["ilp_status"] = out.status
                row["ilp_bound"] = out.bound
                best = [
                    p for p in (row["ilp_own"], row["pipedream"], row["first"]) if p is not None
                ]
                row["ilp_returned"] = min(best) if best else None
                row["ilp_assignment"] = None if out.ilp_plan is None else out.ilp_plan.assignment
                row["pipedream_least"] = least
                row["contiguous"] = (
                    None if out.ilp_plan is None else _contiguous(out.ilp_plan.assignment)
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
    return {
        "machine": machine(),
        "time_limit": args.time_limit,
        "link_bandwidth": rate,
        "rows": rows,
        "scatter": scatter,
    }


def _contiguous(assignment: list[int]) -> bool:
    seen = set()
    for k, g in enumerate(assignment):
        if g in seen and assignment[k - 1] != g:
            return False
        seen.add(g)
    return True


def markdown(doc: dict) -> str:
    lines = []
    for key in sorted({(r["model"], r["gpus"]) for r in doc["rows"]}):
        lines.append(f"\n#### {key[0]}, {key[1]} GPUs\n")
        lines.append(
            "| memory per GPU (GB) | pipedream period (ms) | feasibility-first (ms) "
            "| pipeline-ilp: CP-SAT plan (ms) "
            "| returned (ms) | CP-SAT status, bound (ms) | contiguous? | gpipe ms per mini-batch |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for r in doc["rows"]:
            if (r["model"], r["gpus"]) != key:
                continue

            def f(x):
                return "-" if x is None else f"{x:.3f}"

            bound = "-" if r["ilp_bound"] is None else f"{r['ilp_bound']:.3f}"
            cont = "-" if r["contiguous"] is None else ("yes" if r["contiguous"] else "no")
            lines.append(
                f"| {r['memory'] / 1e9:.3f} | {f(r['pipedream'])} | {f(r.get('first'))} | "
                f"{f(r['ilp_own'])} | "
                f"{f(r['ilp_returned'])} | {r['ilp_status']}, {bound} | {cont} | "
                f"{f(r['gpipe_per_batch'])} |"
            )
    return "\n".join(lines) + "\n"


def plots(doc: dict, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for model in MODELS:
        fig, axes = plt.subplots(1, len(GPUS), figsize=(10, 4))
        for ax, gpus in zip(axes, GPUS, strict=True):
            pts = doc["scatter"].get(f"{model}/{gpus}", [])
            ax.scatter(
                [m / 1e9 for m, _ in pts],
                [p for _, p in pts],
                s=10,
                c="tab:blue",
                label="pipedream candidates (simulated)",
            )
            rows = [r for r in doc["rows"] if r["model"] == model and r["gpus"] == gpus]
            own = [(r["ilp_own_peak"], r["ilp_own"]) for r in rows if r["ilp_own"] is not None]
            ax.scatter(
                [m / 1e9 for m, _ in own],
                [p for _, p in own],
                s=30,
                c="tab:red",
                marker="x",
                label="pipeline-ilp (CP-SAT plan)",
            )
            for r in rows:
                ax.axvline(r["memory"] / 1e9, color="grey", lw=0.5, ls=":")
            ax.set_title(f"{model}, {gpus} GPUs")
            ax.set_xlabel("per-GPU peak memory (GB)")
            ax.set_ylabel("period (ms)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = folder / f"pipeline_{model.replace('@', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--link-bandwidth", default="100GB/s")
    parser.add_argument("--fractions", default="0.6,0.8,1.0,1.5,2.5,4.0")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/pipeline_results.json"))
    parser.add_argument("--plots", type=Path, default=None)
    parser.add_argument("--configs", default="", help="e.g. resnet50@a100/4,resnet34@a100/4")
    args = parser.parse_args()
    print(machine(), flush=True)
    doc = run(args)
    args.out.write_text(json.dumps(doc, indent=1))
    print(markdown(doc))
    if args.plots is not None:
        for path in plots(doc, args.plots):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
