"""Graph family (OLLA, Steiner et al. 2022) on the bundled training graphs.

Two commands:

``python benchmarks/bench_graph.py capture``
    (Re)writes the bundled graph profiles ``memplan/profiles/MODEL-graph-bB.yaml`` with
    ``memplan.torch.profiler.graph.profile_graph`` (fake tensors on the CPU).

``python benchmarks/bench_graph.py run [--time-limit 60] [--json FILE]``
    For every bundled graph profile: the framework order's peak resident memory and
    fragmentation (first-fit placement), greedy-by-size's fragmentation, ``olla-order``'s peak
    resident memory (the reduction of section 5.3), ``olla-address``'s fragmentation for the
    framework order (section 5.4) and ``olla`` (both), with the solve times (sections 5.5-5.6).
    Prints a markdown table (docs/benchmarks.md).

``python benchmarks/bench_graph.py compare BEFORE.json AFTER.json``
    The arena of every algorithm on every profile in two ``run --json`` files (e.g. before and
    after a change of the placement engine), side by side, and ``olla-address``'s solve time
    (docs/graph.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine  # noqa: E402

MODELS = ["alexnet", "resnet18", "resnet50", "mobilenet_v2", "vgg16", "gpt-small"]
BATCHES = [1, 32]
PROFILES = Path(__file__).resolve().parent.parent / "memplan" / "profiles"


def capture() -> None:
    from memplan.profile import save_profile
    from memplan.torch.profiler.graph import profile_graph

    for model in MODELS:
        for batch in BATCHES:
            began = time.perf_counter()
            prof = profile_graph(model, batch_size=batch)
            path = PROFILES / f"{model}-graph-b{batch}.yaml"
            text = save_profile(prof, path)
            print(
                f"{path.name}: {len(prof.graph.nodes)} nodes, {len(prof.graph.tensors)} tensors, "
                f"{len(text) / 1e3:.0f} kB, {time.perf_counter() - began:.1f} s",
                flush=True,
            )


def run(time_limit: float, out: str | None, only: list[str] | None) -> None:
    import memplan

    print(f"# machine: {machine()}; CP-SAT time limit {time_limit} s per solve", flush=True)
    rows = []
    for model in MODELS:
        for batch in BATCHES:
            name = f"{model}-graph-b{batch}"
            if only and not any(o in name for o in only):
                continue
            prof = memplan.load_profile(name)
            row = {"profile": name, "nodes": len(prof.graph.nodes)}
            for algo in ("framework", "greedy-by-size", "olla-order", "olla-address", "olla"):
                began = time.perf_counter()
                sched = memplan.solve(prof, algo, 10**15, time_limit=time_limit)
                row[algo] = {
                    "peak_resident": sched.peak_resident,
                    "arena": sched.arena,
                    "fragmentation": sched.fragmentation,
                    "status": sched.solver.status,
                    "seconds": time.perf_counter() - began,
                    "message": sched.solver.message,
                }
                print(name, algo, json.dumps(row[algo]), flush=True)
            rows.append(row)
    if out:
        Path(out).write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))
    print(table(rows, time_limit))


def table(rows: list[dict], time_limit: float) -> str:
    mb = 1e6
    lines = [
        "| profile | nodes | framework peak resident | olla-order peak resident | reduction | "
        "order s (status) | framework frag. | greedy-by-size frag. | olla-address frag. | "
        "address s (status) | olla arena vs framework arena |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        fw, order, addr, olla = r["framework"], r["olla-order"], r["olla-address"], r["olla"]
        red = 1 - order["peak_resident"] / fw["peak_resident"]
        total = 1 - olla["arena"] / fw["arena"]
        lines.append(
            f"| {r['profile']} | {r['nodes']} | {fw['peak_resident'] / mb:,.1f} MB | "
            f"{order['peak_resident'] / mb:,.1f} MB | {red:.1%} | "
            f"{order['seconds']:.1f} ({order['status']}) | {fw['fragmentation']:.2%} | "
            f"{r['greedy-by-size']['fragmentation']:.2%} | {addr['fragmentation']:.2%} | "
            f"{addr['seconds']:.1f} ({addr['status']}) | -{total:.1%} "
            f"(frag. {olla['fragmentation']:.2%}) |"
        )
    for batch in BATCHES:
        sel = [r for r in rows if r["profile"].endswith(f"-b{batch}")]
        if not sel:
            continue
        red = [1 - r["olla-order"]["peak_resident"] / r["framework"]["peak_resident"] for r in sel]
        frag = [r["framework"]["fragmentation"] for r in sel]
        lines.append(
            f"\nbatch {batch}: olla-order reduces the peak resident memory by "
            f"{statistics.mean(red):.1%} on average (paper: "
            f"{'22.5' if batch == 1 else '10.1'}%); framework fragmentation "
            f"{statistics.mean(frag):.2%} on average; olla-address "
            f"{statistics.mean(r['olla-address']['fragmentation'] for r in sel):.2%}."
        )
    order_s = [r["olla-order"]["seconds"] for r in rows]
    addr_s = [r["olla-address"]["seconds"] for r in rows]
    if rows:
        lines.append(
            f"\nmedian solve time: olla-order {statistics.median(order_s):.1f} s, olla-address "
            f"{statistics.median(addr_s):.1f} s (time limit {time_limit} s per solve)."
        )
    return "\n".join(lines)


ALGOS = ("framework", "greedy-by-size", "olla-order", "olla-address", "olla")


def compare(before_path: str, after_path: str) -> None:
    """Print the arenas of two ``run --json`` files side by side (MB, before / after)."""
    before = {r["profile"]: r for r in json.loads(Path(before_path).read_text())["rows"]}
    after = json.loads(Path(after_path).read_text())
    print(f"# before: {before_path}; after: {after_path} ({after['machine']})")
    lines = [
        "| profile | " + " | ".join(f"{a} arena (MB)" for a in ALGOS) + " | olla-address s |",
        "|---|" + "---:|" * (len(ALGOS) + 1),
    ]
    worse = []
    for row in after["rows"]:
        old = before.get(row["profile"])
        if old is None:
            continue
        cells = []
        for algo in ALGOS:
            was, now = old[algo]["arena"], row[algo]["arena"]
            same = now == was
            cells.append(
                f"{now / 1e6:,.3f} (same)" if same else f"{was / 1e6:,.3f} → {now / 1e6:,.3f}"
            )
            if now > was:
                worse.append(f"{row['profile']} {algo}")
        seconds = f"{old['olla-address']['seconds']:.1f} → {row['olla-address']['seconds']:.1f}"
        lines.append(f"| {row['profile']} | " + " | ".join(cells) + f" | {seconds} |")
    print("\n".join(lines))
    print(f"\nlarger arenas after: {', '.join(worse) if worse else 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("capture")
    bench = sub.add_parser("run")
    bench.add_argument("--time-limit", type=float, default=60.0)
    bench.add_argument("--json", default=None)
    bench.add_argument("--only", nargs="*", default=None)
    both = sub.add_parser("compare")
    both.add_argument("before")
    both.add_argument("after")
    args = parser.parse_args()
    if args.command == "capture":
        capture()
    elif args.command == "compare":
        compare(args.before, args.after)
    else:
        run(args.time_limit, args.json, args.only)


if __name__ == "__main__":
    main()
