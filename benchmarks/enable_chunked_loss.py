"""The chunked loss through ``memplan.torch.enable``: a language model's measured peak with and
without ``loss_chunks``, at each way's least memory.

Usage::

    nice -n 10 python benchmarks/enable_chunked_loss.py [--models gpt2 llama] [--chunks auto 8]

Per model (issue 35's tiny GPT-2 and Llama: 6 layers, 128 wide, a vocabulary of 8,000, batch
4 x 128 tokens), one thread, AdamW (fused) in the user's own loop, ``zero_grad(set_to_none=True)``:
plain training, then ``enable`` at rotor's least memory without chunks and with each chunk count
(``optimizer="adam"``). Each way trains 3 steps; the peak is the largest of the allocator's own
counts of the steps (:func:`memplan.torch.measure.allocator_peak.allocator_peak`, apart from
memplan's bookkeeping), the time the median step. Printed with the machine, the load and the
torch and transformers versions.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import memplan

MODELS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", {"n_layer": 6, "n_embd": 128, "n_head": 4}),
    "llama": (
        "LlamaForCausalLM",
        "LlamaConfig",
        {
            "num_hidden_layers": 6,
            "hidden_size": 128,
            "intermediate_size": 512,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
        },
    ),  # fmt: skip
}
VOCAB, BATCH, SEQ, STEPS = 8000, 4, 128, 3


def _model(key: str) -> Any:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    model_class, config_class, sizes = MODELS[key]
    config = getattr(transformers, config_class)(vocab_size=VOCAB, **sizes)
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config)


def _batch(seed: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _train(model: Any) -> tuple[int, float]:
    """The largest measured peak of the steps and the median step time (seconds)."""
    import torch

    from memplan.torch.measure.allocator_peak import allocator_peak, profiled_copy

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    peaks, times = [], []
    for i in range(STEPS):
        batch = {k: profiled_copy(v) for k, v in _batch(i).items()}
        opt.zero_grad(set_to_none=True)

        def step(b: dict[str, Any] = batch) -> None:
            model(**b).loss.backward()
            opt.step()

        state = [t for s in opt.state.values() for t in s.values()]
        held = [*model.parameters(), *model.buffers(), *batch.values(), *state]
        start = time.perf_counter()
        peak, _ = allocator_peak(step, held, torch.device("cpu"))
        times.append(time.perf_counter() - start)
        peaks.append(peak)
    return max(peaks), statistics.median(times)


def measure(key: str, chunk_counts: list[str]) -> list[dict[str, Any]]:
    from memplan.torch import enable, planned

    model = _model(key)
    rows = []
    plain = copy.deepcopy(model)
    plain.config.use_cache = False
    peak, seconds = _train(plain)
    rows.append({"model": key, "way": "plain", "peak": peak, "seconds": seconds})
    for given in [None, *chunk_counts]:
        chunks = None if given is None else (given if given == "auto" else int(given))
        m = enable(copy.deepcopy(model), "1TB", example_input=_batch(0), loss_chunks=chunks,
                   optimizer="adam", repeats=1)  # fmt: skip
        prof = planned(m).profile
        least = memplan.solve(prof, "rotor", 1, optimizer="adam").min_memory
        m = enable(m, least, example_input=_batch(0), loss_chunks=chunks, profile=prof,
                   optimizer="adam")  # fmt: skip
        peak, seconds = _train(m)
        rows.append({
            "model": key, "way": f"enable, loss_chunks={given}", "budget": least,
            "planned": planned(m).schedule.peak_memory, "peak": peak, "seconds": seconds,
            "chunks": prof.measured.extra.get("loss_chunks"),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--chunks", nargs="+", default=["auto", "8"])
    args = parser.parse_args(argv)
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).parent))
    from _common import machine

    torch.set_num_threads(1)
    print(f"# {machine()}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"1 thread; load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    print("| model | way | chunks | budget MB | planned MB | measured MB | step s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key in args.models:
        for row in measure(key, args.chunks):
            mb = {k: f"{row[k] / 1e6:.1f}" if row.get(k) else "" for k in ("budget", "planned")}
            print(
                f"| {row['model']} | {row['way']} | {row.get('chunks') or ''} | {mb['budget']} "
                f"| {mb['planned']} | {row['peak'] / 1e6:.1f} | {row['seconds']:.2f} |",
                flush=True,
            )
    print(f"# load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
