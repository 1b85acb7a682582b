"""Stages finer than a block on one process: ``enable(..., sub_blocks=True)`` against whole blocks.

Usage::

    nice -n 10 python benchmarks/bench_sub_blocks.py                 # bench-size Llama and GPT-2
    nice -n 10 python benchmarks/bench_sub_blocks.py --size tiny --rounds 3

For each Hugging Face model (built from its config class, random weights; ``--size bench`` is
``bench_fsdp.py``'s: 12 blocks 128 wide, 4 heads, vocabulary 2048, batch 4 x 256; ``tiny``: 2
blocks 64 wide, vocabulary 64, batch 2 x 128) and each loss (the model's own, and in chunks of
tokens, ``loss_chunks="auto"``), the least memory ``enable`` states (its refusal of 0.01 MB,
SGD, the output not held) with whole blocks and with each block cut into its sub-blocks. Then both
train at their own least memory, paired, one step each per round: the allocator's peak of each
step after the first (its running total, every thread counted), the plan's stated peak, and the
median of the step times' ratio (sub-blocks over whole blocks). The machine, its load
(``uptime``) at the start and the end and the threads are printed with the table.
"""

from __future__ import annotations

import argparse
import copy
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("bench", "tiny"), default="bench")
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _model(kind: str, size: str) -> tuple[Any, dict[str, Any]]:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    width, layers, heads, vocab, batch, seq = (
        (128, 12, 4, 2048, 4, 256) if size == "bench" else (64, 2, 2, 64, 2, 128)
    )
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=seq,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            hidden_size=width, intermediate_size=4 * width, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab,
            max_position_embeddings=seq, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(1, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids.clone()}


NAMED = {"optimizer": "sgd", "output_held": False, "repeats": 1}


def _least(model: Any, batch: dict[str, Any], **kwargs: Any) -> int:
    from memplan.errors import InputError
    from memplan.torch import enable

    try:
        enable(copy.deepcopy(model), "0.01MB", example_input=batch, **NAMED, **kwargs)
    except InputError as exc:
        found = re.search(r"fits is [\d.]+ \w+ \((\d+) bytes\)", str(exc))
        if found:
            return int(found.group(1))
        raise
    raise RuntimeError("0.01 MB fitted")


def _train(models: dict[str, Any], batch: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Paired steps of each planned model; per way the last peak, the plan's, the times."""
    import torch

    from memplan.torch import planned
    from memplan.torch.measure.allocator_peak import loop_peaks

    optimizers = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
    rows: dict[str, Any] = {k: {"times": []} for k in models}
    for _ in range(rounds + 1):
        for key, model in models.items():
            start = time.perf_counter()
            peaks = loop_peaks(
                model, optimizers[key], [batch], lambda m, b, kept: m(**b).loss,
                after=lambda m=model: planned(m).schedule.peak_memory,
            )  # fmt: skip
            rows[key]["times"].append(time.perf_counter() - start)
            rows[key]["measured"], rows[key]["planned"] = peaks[0]
    for row in rows.values():
        row["times"] = row["times"][1:]
    return rows


def main() -> None:
    options = _options()
    import torch

    from memplan.torch import enable

    torch.set_num_threads(options.threads)
    print(f"# {machine()}; torch {torch.__version__}; {options.threads} thread(s)")
    print(f"# load at start: {_uptime()}")
    began = time.perf_counter()
    print("| model | loss | least, whole blocks | least, sub-blocks | ratio | measured / planned "
          "(sub-blocks) | step time, sub / whole |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for kind in options.models.split(","):
        model, batch = _model(kind, options.size)
        for chunks in (None, "auto"):
            whole = _least(model, batch, loss_chunks=chunks)
            cut = _least(model, batch, loss_chunks=chunks, sub_blocks=True)
            models = {
                "whole": enable(copy.deepcopy(model), whole, example_input=batch,
                                loss_chunks=chunks, **NAMED),
                "sub": enable(copy.deepcopy(model), cut, example_input=batch,
                              loss_chunks=chunks, sub_blocks=True, **NAMED),
            }  # fmt: skip
            rows = _train(models, batch, options.rounds)
            ratios = [
                s / w for s, w in zip(rows["sub"]["times"], rows["whole"]["times"], strict=True)
            ]
            sub = rows["sub"]
            print(
                f"| {kind} | {'chunks' if chunks else 'own'} | {whole / 1e6:.2f} MB "
                f"| {cut / 1e6:.2f} MB | {cut / whole:.3f} "
                f"| {sub['measured'] / 1e6:.3f} / {sub['planned'] / 1e6:.3f} MB "
                f"| {statistics.median(ratios):.3f} |",
                flush=True,
            )
    print(f"# load at end: {_uptime()}; {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
