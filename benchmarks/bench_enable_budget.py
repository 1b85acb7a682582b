"""The budget through ``memplan.torch.enable`` in a user's loop: budget, planned and measured peaks.

For each model (tiny GPT-2, Llama, BERT from transformers configs with random weights; memplan's
zoo ResNet-18) and each optimizer (AdamW with PyTorch's default step, foreach, fused; SGD), at the
least memory ``enable`` states (``optimizer="auto"``: the first step planned for AdamW until the
optimizer is seen) and halfway to store-all: ``enable`` installs the plan, the loop trains
``--steps`` steps as users write it (``loss = model(**batch).loss``; the ResNet's caller keeps its
output, ``out = model(x)``), and every step is measured by the allocator's own count
(:func:`memplan.torch.measure.allocator_peak.allocator_peak`, apart from memplan's runtime).
Printed per point: the budget, the plan of the last step and its measured peak (the largest over
the steps after the first), the first step's measured peak, the replans.

    python benchmarks/bench_enable_budget.py                 # the table of the report (minutes)
    python benchmarks/bench_enable_budget.py --models gpt2 --optimizers adamw-fused --steps 3

One thread (``torch.set_num_threads(1)``); the machine's load is printed with the table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
import time

import torch
from torch.nn import functional as F

import memplan
import memplan.torch as mt
from memplan.errors import InputError
from memplan.torch.measure.allocator_peak import loop_peaks

OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "adamw-foreach": lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
    "adamw-fused": lambda params: torch.optim.AdamW(params, lr=1e-3, fused=True),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2),
}


def _hf(kind: str, layers: int, width: int, vocab: int, batch: int, seq: int):
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    common = dict(num_hidden_layers=layers, hidden_size=width, vocab_size=vocab)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=layers, n_embd=width, n_head=4, vocab_size=vocab, n_positions=seq,
            bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    elif kind == "llama":
        config = transformers.LlamaConfig(
            **common, intermediate_size=4 * width, num_attention_heads=4, num_key_value_heads=4,
            bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.BertConfig(
            **common, intermediate_size=4 * width, num_attention_heads=4,
            max_position_embeddings=seq, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        model = transformers.BertForMaskedLM(config)

    def batch_of(seed: int):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(1, vocab, (batch, seq), generator=gen)
        labels = ids.clone()
        if kind == "bert":
            labels[torch.rand(ids.shape, generator=gen) > 0.15] = -100
        return {"input_ids": ids, "labels": labels}

    def loss(m, b, kept):
        return m(**b).loss

    return model, batch_of, loss


def _resnet(batch: int):
    from memplan.torch.models.registry import build_model

    model, _, _ = build_model("resnet18", batch_size=batch, input_shape=(3, 32, 32))

    def batch_of(seed: int):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, 3, 32, 32, generator=gen)
        return (x, torch.randint(0, 1000, (batch,), generator=gen))

    def loss(m, b, kept):
        kept["out"] = m(b[0])
        return F.cross_entropy(kept["out"], b[1])

    return model, batch_of, loss


def train(model, optimizer, batches, loss):
    """The user's loop; each step measured: ``[(planned, measured)]``."""
    rows = loop_peaks(
        model, optimizer, batches, loss, after=lambda: mt.planned(model).schedule.peak_memory
    )
    return [(plan, measured) for measured, plan in rows]


def stated_least(model, example, prof) -> int:
    try:
        mt.enable(copy.deepcopy(model), "0.01MB", example_input=example, profile=prof)
    except InputError as exc:
        return int(re.search(r"\((\d+) bytes\)", str(exc)).group(1))
    raise AssertionError("0.01MB fits")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,llama,bert,resnet18")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(
        f"# torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"load {os.getloadavg()[0]:.2f}, cpus {os.cpu_count()}",
        file=sys.stderr,
    )
    rows = []
    for kind in args.models.split(","):
        if kind == "resnet18":
            model, batch_of, loss = _resnet(args.batch * 2)
        else:
            size = (args.layers, args.width, args.vocab, args.batch, args.seq)
            model, batch_of, loss = _hf(kind, *size)
        example = batch_of(0)
        first = example if isinstance(example, dict) else example[0]
        prof = mt.profile_model(copy.deepcopy(model), example_input=first, repeats=1, name=kind)
        least = stated_least(model, first, prof)
        top = memplan.solve(
            prof, "store-all", 2**50, optimizer="adamw:foreach", output_held=True
        ).peak_memory
        for opt_name in args.optimizers.split(","):
            for label, budget in (("least", least), ("half", (least + max(least, top)) // 2)):
                started = time.perf_counter()
                got = mt.enable(copy.deepcopy(model), budget, example_input=first, profile=prof)
                optimizer = OPTIMIZERS[opt_name](got.parameters())
                measured = train(got, optimizer, [batch_of(s) for s in range(args.steps)], loss)
                plan = mt.planned(got).schedule
                steady = max(m for _, m in measured[1:])
                row = {
                    "model": kind, "optimizer": opt_name, "budget_at": label, "budget": budget,
                    "planned": measured[-1][0], "measured": steady,
                    "first_step": measured[0][1], "within": all(m <= budget for _, m in measured),
                    "planned_over_measured": measured[-1][0] / steady,
                    "counted": plan.budget.loop.optimizer.text, "seconds": time.perf_counter() - started,
                }  # fmt: skip
                rows.append(row)
                print(
                    f"{kind:9s} {opt_name:14s} {label:5s} budget {budget / 1e6:8.2f} MB  "
                    f"planned {row['planned'] / 1e6:8.2f}  measured {steady / 1e6:8.2f}  "
                    f"first {row['first_step'] / 1e6:8.2f}  ratio {row['planned_over_measured']:.4f}  "
                    f"within {row['within']}  ({row['counted']})",
                    flush=True,
                )  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
