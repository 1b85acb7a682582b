r"""memplan against what users already have, on real training steps: ``memplan bench`` per model,
and issue 35's goal checked on it.

Usage::

    nice -n 10 python benchmarks/bench_alternatives.py                 # GPT-2 and Llama (hours)
    nice -n 10 python benchmarks/bench_alternatives.py --small --rounds 3   # the check, minutes
    python benchmarks/bench_alternatives.py --models gpt2 llama bert vit resnet50 --out r.json
    python benchmarks/bench_alternatives.py --report results.json      # the markdown tables
    nice -n 10 python benchmarks/bench_alternatives.py --models gpt2 llama --selective
    nice -n 10 python benchmarks/bench_alternatives.py --segments '' --compile-budgets '' \
        --rounds 50 --round-seconds 420 --clock cpu --control   # issue 35's run, 25 minutes

For each model of ``MODELS`` (the sizes of the issue that asked for the comparison: language
models at batch 4 x 256 tokens, ViT and ResNet-50 at batch 8 x 3x96x96; ``--small``: the same
architectures at a few layers, 64 wide, a 2,000-token vocabulary, batch 2 x 64) it runs
:func:`memplan.torch.compare.training.compare_training` on one thread: plain training, Hugging Face
checkpointing, HF checkpointing with a loss computed in chunks of tokens as a user writes it
(``--loss-chunks``, 8 by default), ``checkpoint_sequential(k)`` over memplan's chain,
``torch.compile`` with ``activation_memory_budget`` 0.2 (where it compiles, ``--compile-budgets``)
and memplan's plans installed by ``memplan.torch.enable`` (store-all, rotor at its least memory
and at each other way's measured peak), and, for the language models, the same plans installed by
``enable(..., loss_chunks=N)`` (the head and loss in N chunks of tokens inside the model's own
forward; rows ``memplan ..., loss_chunks=N``). Every way trains with ``--optimizer`` (SGD by
default, as issue 35's table). The peaks are the allocator's own count of each measured step
(``memplan.torch.measure.allocator_peak``), times paired ratios in the same round (median of
``--rounds``), gradients compared with plain training's. The machine, the torch and transformers
versions, the thread count, the command, the load (``uptime``) at the start and the end and the
wall time are printed with the tables.

After each table, issue 35's goal through ``enable`` (with or without ``loss_chunks``): the least
memory at most 0.75x HF checkpointing + chunked loss's measured peak; at every alternative's
measured peak, a plan of memplan measures no more and runs no slower (paired median <= 1.00); the
measured peak within the budget at every point.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from _common import machine

MODELS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "model": "hf:gpt2",
        "config": "n_layer=8,n_embd=256,n_head=4,n_positions=256,attn_pdrop=0.0",
        "batch_size": 4,
        "input_shape": (256,),
        "about": "GPT-2 (8 layers, 256 wide, 4 heads, 50,257 tokens)",
    },
    "llama": {
        "model": "hf:llama",
        "config": "hidden_size=256,intermediate_size=768,num_hidden_layers=6,num_attention_heads=4",
        "batch_size": 4,
        "input_shape": (256,),
        "about": "Llama (6 layers, 256 wide, MLP 768, 4 heads, 32,000 tokens)",
    },
    "bert": {
        "model": "hf:bert",
        "config": "hidden_size=256,intermediate_size=1024,num_hidden_layers=6,"
        "num_attention_heads=4,max_position_embeddings=256,attention_probs_dropout_prob=0.0",
        "batch_size": 4,
        "input_shape": (256,),
        "about": "BERT, masked LM (6 layers, 256 wide, MLP 1024, 4 heads, 30,522 tokens)",
    },
    "vit": {
        "model": "hf:vit",
        "config": "hidden_size=256,intermediate_size=1024,num_hidden_layers=6,"
        "num_attention_heads=4,image_size=96,patch_size=8",
        "batch_size": 8,
        "input_shape": (3, 96, 96),
        "about": "ViT (6 layers, 256 wide, MLP 1024, 4 heads, 8x8 patches: 144 + 1 tokens)",
    },
    "resnet50": {
        "model": "resnet50",
        "config": None,
        "batch_size": 8,
        "input_shape": (3, 96, 96),
        "about": "ResNet-50 (torchvision's, 1000 classes)",
    },
}
"""The benchmark's models: attention dropout off (on a CPU, scaled-dot-product attention with
dropout runs the math kernel, which saves the attention weights; GPUs' flash kernels do not)."""
LANGUAGE_MODELS = ("gpt2", "llama", "bert")
"""The models whose loss ``--loss-chunks`` computes in chunks."""
SMALL = {
    "gpt2": "n_layer=3,n_embd=64,n_head=2,n_positions=64,attn_pdrop=0.0,vocab_size=2000",
    "llama": "hidden_size=64,intermediate_size=192,num_hidden_layers=3,num_attention_heads=2,"
    "vocab_size=2000",
    "bert": "hidden_size=64,intermediate_size=256,num_hidden_layers=3,num_attention_heads=2,"
    "max_position_embeddings=64,attention_probs_dropout_prob=0.0,vocab_size=2000",
}
"""``--small``: the language models at a size that runs in minutes (batch 2 x 64)."""
LEAST_GOAL = 0.75
"""Issue 35: memplan's least memory over HF checkpointing + chunked loss's measured peak."""


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min)"


def _versions() -> str:
    import torch

    try:
        import transformers

        hf = f", transformers {transformers.__version__}"
    except ImportError:
        hf = ""
    return f"torch {torch.__version__}{hf}"


def run(args: argparse.Namespace) -> None:
    from memplan.torch.compare.training import compare_training

    found: dict[str, Any] = {}
    if args.out.exists():
        found = json.loads(args.out.read_text())
    command = shlex.join(["python", *sys.argv])
    print(
        f"# {machine()}; {_versions()}; one thread; {args.optimizer}; {args.clock} clock; "
        f"{_load()} at the start\n# {command}",
        flush=True,
    )
    for key in args.models:
        spec = dict(MODELS[key])
        if args.small:
            if key not in SMALL:
                raise SystemExit(f"--small: no small size of {key} (only {', '.join(SMALL)})")
            spec.update(config=SMALL[key], batch_size=2, input_shape=(64,))
            spec["about"] += ", small: " + SMALL[key]
        start = time.perf_counter()

        def note(line: str, start: float = start, key: str = key) -> None:
            print(f"  [{time.perf_counter() - start:7.1f} s] {key}: {line}", flush=True)

        result = compare_training(
            spec["model"],
            config=spec["config"],
            batch_size=spec["batch_size"],
            input_shape=spec["input_shape"],
            threads=1,
            rounds=args.rounds,
            round_seconds=args.round_seconds,
            segments=args.segments,
            clock=args.clock,
            compile_budgets=args.compile_budgets,
            progress=note,
            selective=args.selective,
            fractions=args.fractions,
            profile=_profile(args.profile_dir, key),
            loss_chunks=(args.loss_chunks or None) if key in LANGUAGE_MODELS else None,
            optimizer=args.optimizer,
            control=args.control,
        )
        doc = result.to_dict()
        doc["about"] = spec["about"]
        doc["command"] = command
        doc["versions"] = _versions()
        doc["wall_s"] = round(time.perf_counter() - start, 1)
        doc["load_end"] = _load()
        found[key] = doc
        args.out.write_text(json.dumps(found, indent=1))
        print(table(doc), flush=True)
        print(goal(doc), flush=True)
    print(f"# {_load()} at the end", flush=True)


def _profile(folder: Path | None, key: str) -> Path | None:
    """``folder/KEY.yaml`` when it exists (a profile of the model at the benchmark's sizes)."""
    path = None if folder is None else folder / f"{key}.yaml"
    return path if path is not None and path.exists() else None


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.1f}"


def _front(row: dict[str, Any]) -> str:
    """``, loss_chunks=N`` for the rows installed with ``enable(..., loss_chunks=N)``, else
    empty (the model's own loss).
    """
    chunks = row.get("loss_chunks")
    return "" if chunks is None else f", loss_chunks={chunks}"


def table(doc: dict[str, Any]) -> str:
    """One model's markdown table."""
    shape = "x".join(str(d) for d in doc["input_shape"])
    lines = [
        f"#### {doc['about']}, batch {doc['batch_size']} x {shape}",
        "",
        "| way | measured peak MB | / plain | time / plain (median of "
        f"{doc['rounds']}, {doc.get('clock', 'wall')} clock) | gradients | memplan's plan MB | vs alternative at equal memory "
        "(time, peak) |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    infeasible = []  # rotor at another way's peak, below its least memory: one line for all
    for row in doc["rows"]:
        if row["skipped"] and row["skipped"].startswith("no rotor plan fits"):
            infeasible.append(row)
            continue
        if row["skipped"]:
            lines.append(f"| {row['name']} | - | - | - | {row['skipped']} | - | - |")
            continue
        grads = row["grads"]
        if grads == "close" and row["grad_error"] is not None:
            grads = f"close ({row['grad_error']:.1e})"
        ratio = "-" if row["time_ratio"] is None else f"{row['time_ratio']:.2f}"
        versus = "-"
        if row.get("versus") and row.get("versus_time") is not None:
            versus = f"{row['versus']}: {row['versus_time']:.2f}, {row['versus_peak']:.3f}"
        lines.append(
            f"| {row['name']} | {_mb(row['peak'])} | {row['peak_ratio']:.3f} | {ratio} "
            f"| {grads} | {_mb(row['planned_peak'])} | {versus} |"
        )
    for front in sorted({_front(row) for row in infeasible}):
        rows = [row for row in infeasible if _front(row) == front]
        found = re.search(r"least memory that fits is (\d+) bytes", rows[0]["skipped"])
        least = "" if found is None else f" ({int(found.group(1)) / 1e6:.1f} MB planned)"
        at = ", ".join(row["setting"].removeprefix("at ").removesuffix("'s peak") for row in rows)
        lines.append(
            f"| memplan rotor{front} at the peak of: {at} | - | - | - | no plan: below rotor's "
            f"least memory{least} | - | - |"
        )
    lines.append("")
    chunks = doc.get("loss_chunks")
    if chunks:
        lines.append(
            f"`memplan ..., loss_chunks={chunks}`: installed by `enable(model, memory, "
            f"example_input=batch, loss_chunks={chunks})`, the head and loss in {chunks} chunks "
            "of tokens inside the model's forward; the other memplan rows by `enable` with the "
            "model's own loss."
        )
    lines.append(
        f"({doc.get('versions', 'torch ' + doc['torch'])}, {doc['threads']} thread(s), "
        f"{doc.get('optimizer', 'sgd')}; wall {doc['wall_s']:.0f} s; "
        f"{doc.get('load_end', '')} at the end)"
    )
    return "\n".join(lines) + "\n"


def goal(doc: dict[str, Any]) -> str:
    """Issue 35's goal on one model's results, through ``enable`` (with or without
    ``loss_chunks``): the least memory, each alternative's peak, measured <= budget.
    """
    rows = [r for r in doc["rows"] if r["family"] == "memplan" and r["peak"] is not None]
    if not rows:
        return "Goal: no memplan plan measured.\n"
    said = [_least_memory(doc, rows)] if _chunked_alternative(doc) else []
    for alternative in doc["rows"]:
        if alternative["family"] in ("memplan", "control") or alternative["peak"] is None:
            continue
        said.append(_at_peak(doc, alternative))
    over = [r["name"] for r in rows if r["budget"] is not None and r["peak"] > r["budget"]]
    said.append(
        "measured <= budget at every point: "
        + ("yes" if not over else "NO (" + ", ".join(over) + ")")
    )
    return "Goal through `enable`:\n" + "".join(f"- {line}\n" for line in said)


def _chunked_alternative(doc: dict[str, Any]) -> dict[str, Any] | None:
    found = next((r for r in doc["rows"] if r["family"] == "hf-chunked"), None)
    return found if found is not None and found["peak"] else None


def _least_memory(doc: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """memplan's least measured peak over HF checkpointing + chunked loss's (goal <= 0.75x),
    with and without ``loss_chunks``.
    """
    chunked = _chunked_alternative(doc)
    assert chunked is not None
    parts, best = [], min(r["peak"] for r in rows)
    for front in sorted({_front(r) for r in rows}, key=len, reverse=True):
        least = min(r["peak"] for r in rows if _front(r) == front)
        parts.append(
            f"{least / 1e6:.1f} MB{front or ' (the model' + chr(39) + 's own loss)'} = "
            f"{least / chunked['peak']:.3f}x"
        )
    mark = "yes" if best <= LEAST_GOAL * chunked["peak"] else "NO"
    return (
        f"least memory against {chunked['name']}'s {chunked['peak'] / 1e6:.1f} MB (goal <= "
        f"{LEAST_GOAL}x): " + "; ".join(parts) + f" ({mark})"
    )


def _at_peak(doc: dict[str, Any], alternative: dict[str, Any]) -> str:
    """memplan's plans at one alternative's measured peak: met when one of them measures no
    more and runs no slower (paired median) than the alternative.
    """
    setting = f"at {alternative['name']}'s peak"
    at = [r for r in doc["rows"] if r["family"] == "memplan" and r["setting"] == setting]
    parts, met = [], False
    for r in at:
        if r["peak"] is None:
            parts.append(f"rotor{_front(r)}: no plan")
            continue
        ok = r["peak"] <= alternative["peak"] and (r["versus_time"] or 0.0) <= 1.0
        met = met or ok
        parts.append(
            f"rotor{_front(r)}: {r['versus_peak']:.3f}x its memory, {r['versus_time']:.2f}x "
            f"its time"
        )
    return f"{setting}: " + ("; ".join(parts) or "not planned") + (" (yes)" if met else " (NO)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["gpt2", "llama"])
    parser.add_argument(
        "--small", action="store_true", help="the language models at a small size (a check)"
    )
    parser.add_argument(
        "--segments",
        type=lambda t: [int(v) for v in t.split(",") if v],
        default=None,
        help="checkpoint_sequential segment counts (default: 2, 4, about the square root, all; "
        "'': none)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--round-seconds",
        type=float,
        default=None,
        help="per model, time as many of --rounds as fit in this many seconds (one at least)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="time plain training twice: 'plain (again)' shows the protocol's noise",
    )
    parser.add_argument(
        "--optimizer",
        default="sgd",
        help="the optimizer every way trains with and memplan plans for: sgd (issue 35's "
        "table), momentum, adam, adamw, with a step as in adamw:fused",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: time.process_time, which a shared machine's load adds little to",
    )
    parser.add_argument(
        "--selective",
        action="store_true",
        help="profile the stages' selective checkpointing options and add memplan rotor+sac",
    )
    parser.add_argument(
        "--compile-budgets", type=lambda t: [float(v) for v in t.split(",") if v], default=[0.2]
    )  # "" to skip compiling
    parser.add_argument(
        "--fractions",
        type=lambda t: [float(v) for v in t.split(",") if v],
        default=[],
        help="rotor (and rotor+sac) also at these fractions of the way from rotor's least "
        "planned memory to store-all's, e.g. 0.25,0.5,0.75",
    )
    parser.add_argument(
        "--loss-chunks",
        type=int,
        default=8,
        help="the hand-written chunked loss in N chunks, and memplan's rows installed by "
        "enable(..., loss_chunks=N) (0: none of those rows)",
    )
    parser.add_argument("--profile-dir", type=Path, help="reuse KEY.yaml profiles found there")
    parser.add_argument("--out", type=Path, default=Path("alternatives.json"))
    parser.add_argument("--report", type=Path, nargs="*", help="print the tables of result files")
    args = parser.parse_args()
    if args.report:
        for path in args.report:
            for doc in json.loads(path.read_text()).values():
                print(table(doc))
                print(goal(doc))
        return
    run(args)


if __name__ == "__main__":
    sys.exit(main())
