"""memplan under FSDP2 (``fully_shard``) against what FSDP2 users have, on N ranks.

Usage::

    nice -n 10 python benchmarks/bench_fsdp.py                     # two ranks, CPU (gloo)
    nice -n 10 python benchmarks/bench_fsdp.py --rounds 7 --json fsdp.json
    python benchmarks/bench_fsdp.py --device cuda --out gpu-check  # one rank per GPU (NCCL)

Every rank builds the same GPT-style model (memplan's zoo GPT, ``--layers`` blocks; the caller
computes the loss), shards it with FSDP2 (``fully_shard`` per block and on the root) and trains
it with SGD in four ways, in turn, one step each per round (paired: each way's step time is
divided by FSDP2 + per-block checkpointing's in the same round, the median of ``--rounds``):

* **FSDP2**: plain training;
* **FSDP2 + checkpoint**: ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)``
  around every block, what FSDP2's recipes (and Hugging Face's one-line switch) do;
* **memplan at their peak**: ``memplan.torch.enable(model, budget, example_input=x)`` before
  ``fully_shard``, the budget being the per-rank peak FSDP2 + checkpoint measured (the largest
  over the ranks);
* **memplan, least memory**: the same at the least per-rank memory memplan plans for.

Each way's peak is the allocator's count of one measured step after the first (on CPU, c10's
running total with every thread counted: ``allocator_peak.count_every_thread``; on CUDA,
``torch.cuda.max_memory_allocated``), the largest over the ranks. memplan's plans state their
peak (planned); for plain FSDP2 the script gives the per-rank peak NOTE [ FSDP2 memory terms ]
models for a plan that stores everything (modelled): the two columns check the terms against
what FSDP2 allocates. Gradients are not compared here (tests/torch/test_fsdp.py does).
The machine, its load (``uptime``) at the start and the end, the threads and the wall time are
printed with the table; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import machine

WAYS = ("fsdp2", "checkpoint", "memplan", "memplan-least")
LABELS = {
    "fsdp2": "FSDP2",
    "checkpoint": "FSDP2 + checkpoint per block",
    "memplan": "memplan at their peak",
    "memplan-least": "memplan, least memory",
}


def _options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=None, help="default: 2 on CPU, every GPU")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4, help="per rank")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (CPU)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="a folder for fsdp.json / .md")
    parser.add_argument(
        "--worker", nargs=3, metavar=("RANK", "PORT", "FILE"), help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


# ------------------------------------------------------------------------------------------------
# One rank
# ------------------------------------------------------------------------------------------------


def _checkpointed(model: Any) -> Any:
    """The model with ``checkpoint(block, x)`` around every block (its class' own forward)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def forward(idx: torch.Tensor) -> torch.Tensor:
        x = model.embed(idx)
        for block in model.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return model.lm_head(model.ln_f(x))

    object.__setattr__(model, "forward", forward)
    return model


def _shard(model: Any) -> Any:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def _modelled_store_all(prof: Any, model: Any, x: Any, world: int) -> tuple[int, int]:
    """(store-all peak, least memory) of one rank, as the terms model them."""
    from memplan.api import describe, schedule_from_sequence, simulate
    from memplan.profile.sharding import shard_profile
    from memplan.torch import linearize
    from memplan.torch.runtime.fsdp import collective_copies, model_layout

    stages = [m for _, m in linearize(model, x).stages[:-1]]
    layout = model_layout(
        [*stages, None], world, set(range(1, len(stages) - 1)), collective_copies(), False
    )
    rank = shard_profile(prof, layout)
    length = len(rank.stages or [])
    ops = [("F_all", k) for k in range(length)] + [("B", k) for k in reversed(range(length))]
    plan = schedule_from_sequence(rank, ops, optimizer="sgd", gradients="at-backward")  # type: ignore[arg-type]
    return simulate(rank, plan, check_claims=False).peak_memory, describe(rank, "sgd")[
        "min_memory"
    ]["chain"]


def _largest(value: int) -> int:
    """The largest ``value`` over the ranks."""
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    found = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return int(found.item())


def _rank(rank: int, world: int, options: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn

    from memplan.errors import InputError
    from memplan.torch import enable, planned, profile_model
    from memplan.torch.measure.allocator_peak import allocator_peak
    from memplan.torch.zoo.gpt import GPT, GPTConfig

    device = torch.device("cuda", rank) if options.device == "cuda" else torch.device("cpu")
    config = GPTConfig(
        vocab_size=options.vocab, seq_len=options.seq, n_layer=options.layers,
        n_head=options.heads, d_model=options.width,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT(config).to(device).train()
    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randint(0, options.vocab, (options.batch, options.seq), generator=gen).to(device)
    y = torch.randint(0, options.vocab, (options.batch, options.seq), generator=gen).to(device)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=3, name="gpt-fsdp")
    modelled, least = _modelled_store_all(prof, model, x, world)
    models: dict[str, Any] = {
        "fsdp2": _shard(copy.deepcopy(model)),
        "checkpoint": _shard(_checkpointed(copy.deepcopy(model))),
    }
    opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in models.items()}
    found: dict[str, Any] = {name: {"seconds": []} for name in WAYS}

    def step(name: str) -> None:  # the gradients were freed before it (zero_grad)
        logits = models[name](x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.ravel())
        del logits
        loss.backward()
        opts[name].step()

    def measure(name: str) -> None:
        step(name)  # FSDP2's lazy initialization, the first step's allocations: not measured
        opts[name].zero_grad()
        tensors = [*models[name].parameters(), *models[name].buffers(), x, y]
        held = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
        dist.barrier()
        peak, _ = allocator_peak(lambda: step(name), held, device)
        found[name]["peak"] = _largest(peak)
        found[name]["rank_peak"] = peak

    for name in ("fsdp2", "checkpoint"):
        measure(name)
    found["fsdp2"]["modelled"] = modelled
    budgets = {"memplan": found["checkpoint"]["peak"], "memplan-least": least}
    for name, budget in budgets.items():
        try:
            under = enable(copy.deepcopy(model), budget, example_input=x, profile=prof)
        except InputError as exc:  # no plan fits: said in the table
            found[name].update(budget=budget, peak=None, error=str(exc))
            continue
        models[name] = _shard(under)
        opts[name] = torch.optim.SGD(under.parameters(), lr=1e-3)
        measure(name)
        plan = planned(under)
        assert plan is not None
        found[name].update(
            budget=budget,
            planned=plan.schedule.peak_memory,
            forwards=sum(plan.planned_forward_counts()),
            stages=len(plan.names),
        )
    for _ in range(options.rounds):  # paired: every way once per round
        for name in [n for n in WAYS if n in models]:
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            opts[name].zero_grad()
            start = time.perf_counter()
            step(name)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            found[name]["seconds"].append(time.perf_counter() - start)
    return found


def _worker(options: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    rank, port, out = int(options.worker[0]), options.worker[1], options.worker[2]
    world = int(os.environ["FSDP_WORLD"])
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    torch.set_num_threads(options.threads)
    backend = "nccl" if options.device == "cuda" else "gloo"
    if options.device == "cuda":
        torch.cuda.set_device(rank)
    else:
        from memplan.torch.measure.allocator_peak import count_every_thread

        count_every_thread()
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        found = _rank(rank, world, options)
    finally:
        dist.destroy_process_group()
    Path(out).write_text(json.dumps(found))


# ------------------------------------------------------------------------------------------------
# The run and its table
# ------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(options: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Start the ranks (this script with ``argv``, which ``options`` were parsed from), wait for
    them, and gather rank 0's figures with the run's conditions."""
    import tempfile

    import torch

    world = options.ranks or (torch.cuda.device_count() if options.device == "cuda" else 2)
    if options.device == "cuda" and not torch.cuda.is_available():
        print("bench_fsdp: --device cuda needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    port = str(_free_port())
    began, load = time.time(), _uptime()
    with tempfile.TemporaryDirectory() as folder:
        outs = [Path(folder) / f"rank{rank}.json" for rank in range(world)]
        env = {**os.environ, "FSDP_WORLD": str(world), "OMP_NUM_THREADS": str(options.threads)}
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *argv, "--worker", str(rank), port, str(out)], env=env
            )
            for rank, out in enumerate(outs)
        ]
        codes = [proc.wait() for proc in procs]
        if any(codes):
            print(f"bench_fsdp: a rank failed (exit codes {codes})", file=sys.stderr)
            raise SystemExit(1)
        ranks = [json.loads(out.read_text()) for out in outs]
    return {
        "machine": machine(),
        "device": options.device,
        "ranks": world,
        "threads": options.threads,
        "load_start": load,
        "load_end": _uptime(),
        "wall_seconds": round(time.time() - began, 1),
        "model": {
            "layers": options.layers,
            "width": options.width,
            "heads": options.heads,
            "vocab": options.vocab,
            "seq": options.seq,
            "batch_per_rank": options.batch,
        },  # fmt: skip
        "ways": ranks[0],
    }


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.2f}"


def report(doc: dict[str, Any]) -> str:
    """The markdown table of a run: per-rank peaks and paired step-time ratios."""
    ways = doc["ways"]
    anchor = ways["checkpoint"]
    lines = [
        "| way | per-rank peak MB | / checkpoint | planned or modelled MB | step ms "
        "| time / checkpoint (paired median) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in WAYS:
        way = ways[name]
        if way.get("peak") is None:  # no plan fitted its budget
            lines.append(f"| {LABELS[name]} | no plan: {way['error']} | | | | |")
            continue
        ratios = [a / b for a, b in zip(way["seconds"], anchor["seconds"], strict=True)]
        model = way.get("planned", way.get("modelled"))
        lines.append(
            f"| {LABELS[name]} | {_mb(way['peak'])} | {way['peak'] / anchor['peak']:.3f} | "
            f"{_mb(model)} | {1000 * statistics.median(way['seconds']):.0f} | "
            f"{statistics.median(ratios):.3f} |"
        )
    m = doc["model"]
    lines += [
        "",
        f"GPT (memplan's zoo), {m['layers']} blocks x {m['width']} wide, {m['heads']} heads, "
        f"{m['vocab']} tokens, batch {m['batch_per_rank']} x {m['seq']} per rank; SGD; "
        f"{doc['ranks']} ranks ({doc['device']}), {doc['threads']} thread(s) each. "
        f"{doc['machine']}. Load at start: {doc['load_start']}; at the end: {doc['load_end']}; "
        f"{doc['wall_seconds']} s.",
    ]
    for name, where in (("memplan", "at their peak"), ("memplan-least", "at its least")):
        if "forwards" in ways[name]:
            lines[-1] += f" memplan recomputes {ways[name]['forwards'] - ways[name]['stages']}"
            lines[-1] += f" forwards {where}."
    return "\n".join(lines)


def check(argv: list[str]) -> int:
    """Run the benchmark with ``argv`` (its command line), print and write its table; 1 when a
    plan measured above its budget."""
    options = _options(argv)
    doc = run(options, argv)
    text = report(doc)
    print(text)
    if options.json is not None:
        options.json.write_text(json.dumps(doc, indent=1))
    if options.out is not None:
        options.out.mkdir(parents=True, exist_ok=True)
        (options.out / "fsdp.json").write_text(json.dumps(doc, indent=1))
        (options.out / "fsdp.md").write_text(text + "\n")
    ways = doc["ways"]
    over = [
        n
        for n in ("memplan", "memplan-least")
        if ways[n].get("peak") is not None and ways[n]["peak"] > ways[n]["budget"]
    ]
    if over:
        print(f"bench_fsdp: measured above the budget: {', '.join(over)}", file=sys.stderr)
    return 1 if over else 0


def main() -> None:
    options = _options()
    if options.worker:
        _worker(options)
        return
    raise SystemExit(check(sys.argv[1:]))


if __name__ == "__main__":
    main()
