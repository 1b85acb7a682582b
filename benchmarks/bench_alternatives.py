"""memplan against what users already have, on real training steps: ``memplan bench`` per model.

Usage::

    nice -n 10 python benchmarks/bench_alternatives.py                 # every model (hours)
    python benchmarks/bench_alternatives.py --models gpt2 llama --out results.json
    python benchmarks/bench_alternatives.py --report results.json      # the markdown tables
    nice -n 10 python benchmarks/bench_alternatives.py --models gpt2 llama --selective
    nice -n 10 python benchmarks/bench_alternatives.py --models gpt2 llama bert --loss-chunks 8

For each model of ``MODELS`` (the sizes of the issue that asked for the comparison: language
models at batch 4 x 256 tokens, ViT and ResNet-50 at batch 8 x 3x96x96) it runs
:func:`memplan.torch.compare.training.compare_training` on one thread: plain training, Hugging Face
checkpointing, ``checkpoint_sequential(k)`` over memplan's chain, ``torch.compile`` with
``activation_memory_budget`` 0.2 (where it compiles) and memplan's store-all and rotor plans (at
rotor's least memory and at each other way's measured peak). The peaks are the allocator's own
count of each measured step (``memplan.torch.measure.allocator_peak``), times paired ratios to plain
training in the same round (median of ``--rounds``), gradients compared with plain training's.
The machine, its load at the start and the end, and the wall time are printed with the tables.
With ``--loss-chunks N`` memplan's plans compute the language model's head and loss in ``N``
chunks of tokens (``memplan.torch.split.chunked_loss``); every other way keeps the model's own loss,
which is what users have.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (1 min) / {five:.1f} (5 min)"


def run(args: argparse.Namespace) -> None:
    from memplan.torch.compare.training import compare_training

    found: dict[str, Any] = {}
    if args.out.exists():
        found = json.loads(args.out.read_text())
    print(f"# {machine()}; one thread; {_load()} at the start", flush=True)
    for key in args.models:
        spec = MODELS[key]
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
            compile_budgets=args.compile_budgets,
            progress=note,
            selective=args.selective,
            fractions=args.fractions,
            profile=_profile(args.profile_dir, key),
            loss_chunks=args.loss_chunks if key in LANGUAGE_MODELS else None,
        )
        doc = result.to_dict()
        doc["about"] = spec["about"]
        doc["wall_s"] = round(time.perf_counter() - start, 1)
        doc["load_end"] = _load()
        found[key] = doc
        args.out.write_text(json.dumps(found, indent=1))
        print(table(doc), flush=True)
    print(f"# {_load()} at the end", flush=True)


def _profile(folder: Path | None, key: str) -> Path | None:
    """``folder/KEY.yaml`` when it exists (a profile of the model at the benchmark's sizes)."""
    path = None if folder is None else folder / f"{key}.yaml"
    return path if path is not None and path.exists() else None


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.1f}"


def table(doc: dict[str, Any]) -> str:
    """One model's markdown table."""
    shape = "x".join(str(d) for d in doc["input_shape"])
    lines = [
        f"#### {doc['about']}, batch {doc['batch_size']} x {shape}",
        "",
        "| way | measured peak MB | / plain | time / plain (median of "
        f"{doc['rounds']}) | gradients | memplan's plan MB |",
        "|---|---:|---:|---:|---|---:|",
    ]
    infeasible = []  # rotor at another way's peak, below its least memory: one line for all
    for row in doc["rows"]:
        if row["skipped"] and row["skipped"].startswith("no rotor plan fits"):
            infeasible.append(row)
            continue
        if row["skipped"]:
            lines.append(f"| {row['name']} | - | - | - | {row['skipped']} | - |")
            continue
        grads = row["grads"]
        if grads == "close" and row["grad_error"] is not None:
            grads = f"close ({row['grad_error']:.1e})"
        ratio = "-" if row["time_ratio"] is None else f"{row['time_ratio']:.2f}"
        lines.append(
            f"| {row['name']} | {_mb(row['peak'])} | {row['peak_ratio']:.3f} | {ratio} "
            f"| {grads} | {_mb(row['planned_peak'])} |"
        )
    if infeasible:
        least = infeasible[0]["skipped"].rsplit("least memory ", 1)[-1].split()[0]
        at = ", ".join(
            row["setting"].removeprefix("at ").removesuffix("'s peak") for row in infeasible
        )
        lines.append(
            f"| memplan rotor at the peak of: {at} | - | - | - | no plan: below rotor's least "
            f"memory ({int(least) / 1e6:.1f} MB planned) | - |"
        )
    lines.append("")
    chunks = doc.get("loss_chunks")
    if chunks:
        lines.append(
            f"memplan's plans compute the head and loss in {chunks} chunks of tokens; the other "
            "ways keep the model's own loss (what users have)."
        )
    lines.append(f"(wall {doc['wall_s']:.0f} s; {doc.get('load_end', '')} at the end)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--selective",
        action="store_true",
        help="profile the stages' selective checkpointing options and add memplan rotor+sac",
    )
    parser.add_argument(
        "--compile-budgets", type=lambda t: [float(v) for v in t.split(",") if v], default=[0.2]
    )
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
        help="memplan's plans compute the language models' head and loss in N chunks of tokens",
    )
    parser.add_argument("--profile-dir", type=Path, help="reuse KEY.yaml profiles found there")
    parser.add_argument("--out", type=Path, default=Path("alternatives.json"))
    parser.add_argument("--report", type=Path, nargs="*", help="print the tables of result files")
    args = parser.parse_args()
    if args.report:
        for path in args.report:
            for doc in json.loads(path.read_text()).values():
                print(table(doc))
        return
    run(args)


if __name__ == "__main__":
    sys.exit(main())
