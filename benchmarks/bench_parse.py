"""Time parsing large profiles and schedules (docs/benchmarks.md).

Usage: ``python benchmarks/bench_parse.py [--sizes 1,5,50] [--skip-pure-above 6]``

Writes graph profiles of about 1, 5 and 50 MB (the YAML ``memplan profile --graph`` writes:
flow-style nodes and tensors) and a long chain schedule (revolve, 2000 stages, JSON), then times, for each file, in one
process: ``memplan.documents.parse.parse_document`` (JSON parser, or YAML from libyaml's events),
``yaml.load`` with ``CSafeLoader`` (skipped above ``--skip-c-above`` MB) and with the pure-Python
``SafeLoader`` (skipped above ``--skip-pure-above`` MB: about 10 s per MB), and ``memplan.load_profile`` / ``load_schedule``
(parse plus validation). Each figure is the best of ``--repeats`` runs. Prints Markdown rows.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml
from _common import machine

import memplan
from memplan.documents.io import dump_yaml
from memplan.documents.parse import parse_document
from memplan.profile.synthetic import random_chain


def graph_profile_text(nodes: int) -> str:
    """A graph profile of ``nodes`` nodes and as many tensors, each read by the next two nodes."""
    doc = {
        "format": "memplan-profile/1",
        "model": f"synthetic-graph-{nodes}",
        "graph": {
            "nodes": [
                {"name": f"n{i}", "op": "aten.convolution", "kind": "forward", "time": 0.123456}
                for i in range(nodes)
            ],
            "tensors": [
                {
                    "name": f"t{i}",
                    "size": 1234567,
                    "producer": f"n{i}",
                    "consumers": [f"n{j}" for j in (i + 1, i + 2) if j < nodes],
                }
                for i in range(nodes)
            ],
        },
    }
    return dump_yaml(doc)


def best(seconds: list[float]) -> str:
    return f"{min(seconds):.2f}"


def timed(call, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,5,50", help="approximate MB of the graph profiles")
    parser.add_argument("--skip-pure-above", type=float, default=6.0)
    parser.add_argument("--skip-c-above", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {machine()}; PyYAML {yaml.__version__}, libyaml: {yaml.__with_libyaml__}")
    print("| file | MB | parse_document s | CSafeLoader s | SafeLoader s | load s |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for mb in (float(x) for x in args.sizes.split(",")):
            nodes = int(mb * 6400)  # about 160 bytes per node and tensor
            path = Path(tmp) / f"graph-{mb:g}MB.yaml"
            path.write_text(graph_profile_text(nodes), encoding="utf-8")
            text = path.read_text(encoding="utf-8")
            size = len(text.encode()) / 1e6
            ours = timed(lambda t=text: parse_document(t, "bench"), args.repeats)
            if size <= args.skip_c_above:
                c_loader = best(timed(lambda t=text: yaml.load(t, Loader=yaml.CSafeLoader), 1))
            else:
                c_loader = "skipped"
            if size <= args.skip_pure_above:
                pure = best(timed(lambda t=text: yaml.load(t, Loader=yaml.SafeLoader), 1))
            else:
                pure = "skipped"
            load = timed(lambda p=path: memplan.load_profile(str(p)), 1)
            print(
                f"| graph profile, {nodes} nodes (YAML) | {size:.1f} | {best(ours)} | "
                f"{c_loader} | {pure} | {best(load)} |",
                flush=True,
            )
        chain = random_chain(2000, seed=1)
        budget = memplan.api.describe(chain)["store_all_memory"] // 2
        sched = memplan.solve(chain, "revolve", budget)
        path = Path(tmp) / "schedule.json"
        path.write_text(sched.to_json(), encoding="utf-8")
        text = path.read_text(encoding="utf-8")
        ours = timed(lambda t=text: parse_document(t, "bench"), args.repeats)
        c_loader = timed(lambda t=text: yaml.load(t, Loader=yaml.CSafeLoader), 1)
        pure = timed(lambda t=text: yaml.load(t, Loader=yaml.SafeLoader), 1)
        load = timed(lambda p=path: memplan.load_schedule(str(p)), 1)
        print(
            f"| revolve schedule, 2000 stages, {len(sched.ops)} ops (JSON) | "
            f"{len(text.encode()) / 1e6:.1f} | {best(ours)} | {best(c_loader)} | {best(pure)} | "
            f"{best(load)} |"
        )


if __name__ == "__main__":
    main()
