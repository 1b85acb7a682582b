"""The chunked loss through ``memplan.torch.enable``: a language model's measured peak with and
without ``loss_chunks``, each at the least memory ``enable`` states.

Usage::

    nice -n 10 python benchmarks/enable_chunked_loss.py [--models gpt2 llama] [--chunks auto 8]

Per model (issue 35's tiny GPT-2 and Llama: 6 layers, 128 wide, a vocabulary of 8,000, batch
4 x 128 tokens), one thread, the loop a user writes: ``torch.optim.AdamW(fused=True)``,
``optimizer.zero_grad()``, ``loss = model(**batch).loss``, ``loss.backward()``,
``optimizer.step()``. Plain training, then ``model = enable(model, least, example_input=batch,
loss_chunks=...)`` with ``enable``'s defaults (``optimizer="auto"``: AdamW with the step of the
larger temporaries until the loop's optimizer is seen; the output counted as held until seen),
without chunks and with each chunk count, ``least`` the least memory ``enable`` states for it
(its refusal of a one-byte budget, on the same profile). Each way trains ``STEPS`` steps on
different batches, each step's peak the allocator's own count
(:func:`memplan.torch.measure.allocator_peak.loop_peaks`, apart from memplan's runtime), then
``TIMED`` more steps timed apart (wall clock, no profiler). Printed per way: the budget, the
plan of the first step and the plan after the last (re-solved for the loop seen), the first
step's peak and the largest of the later ones, the median step time; with the machine, the load
before and after, the thread count and the torch and transformers versions.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

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
VOCAB, BATCH, SEQ, STEPS, TIMED = 8000, 4, 128, 3, 3


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


def _loss(model: Any, batch: dict[str, Any], kept: dict[str, Any]) -> Any:
    return model(**batch).loss  # the output is not kept


def _train(model: Any) -> dict[str, Any]:
    """``STEPS`` measured steps, then ``TIMED`` timed ones, in the user's loop."""
    import torch

    from memplan.torch.measure.allocator_peak import loop_peaks

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    peaks = loop_peaks(model, opt, [_batch(i) for i in range(STEPS)], _loss)
    times = []
    for i in range(STEPS, STEPS + TIMED):
        batch = _batch(i)
        start = time.perf_counter()
        opt.zero_grad()
        _loss(model, batch, {}).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return {
        "first": peaks[0][0], "peak": max(p for p, _ in peaks[1:]),
        "all": [p for p, _ in peaks], "seconds": statistics.median(times),
    }  # fmt: skip


def stated_least(model: Any, chunks: Any, prof: Any) -> int:
    """The least memory ``enable`` states when refusing a one-byte budget."""
    from memplan.errors import InputError
    from memplan.torch import enable

    try:
        enable(copy.deepcopy(model), 1, example_input=_batch(0), loss_chunks=chunks, profile=prof)
    except InputError as exc:
        found = re.search(r"the least memory that fits is (\d+) bytes", str(exc))
        if found is None:
            raise
        return int(found.group(1))
    raise AssertionError("a plan fits in one byte")


def measure(key: str, chunk_counts: list[str]) -> list[dict[str, Any]]:
    from memplan.torch import enable, planned

    model = _model(key)
    plain = copy.deepcopy(model)
    plain.config.use_cache = False
    rows = [{"model": key, "way": "plain training", **_train(plain)}]
    for given in [None, *chunk_counts]:
        chunks = None if given is None else (given if given == "auto" else int(given))
        m = enable(copy.deepcopy(model), "1TB", example_input=_batch(0), loss_chunks=chunks,
                   repeats=1)  # fmt: skip
        prof = planned(m).profile  # profiled once: the same profile for both calls
        least = stated_least(model, chunks, prof)
        m = enable(m, least, example_input=_batch(0), loss_chunks=chunks, profile=prof)
        first_plan = planned(m).schedule.peak_memory
        found = _train(m)
        last = planned(m).schedule
        way = "`enable`, no chunks" if chunks is None else f"`enable`, `loss_chunks={chunks!r}`"
        rows.append({
            "model": key, "way": way.replace("'", '"'), "budget": least,
            "planned_first": first_plan, "planned": last.peak_memory,
            "counted": last.budget.loop.optimizer.text,
            "chunks": prof.measured.extra.get("loss_chunks"), **found,
        })  # fmt: skip
    return rows


def _mb(nbytes: int | None) -> str:
    return "" if nbytes is None else f"{nbytes / 1e6:.1f}"


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
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# {machine()}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{torch.get_num_threads()} thread; load average {load} before")  # fmt: skip
    print(f"# {shlex.join(['python', *sys.argv])}")
    print(
        "| model | way | chunks | budget MB | planned MB: first step, then | measured MB: first "
        "step, then | within budget | step s |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|")
    within = True
    for key in args.models:
        for row in measure(key, args.chunks):
            budget = row.get("budget")
            ok = "" if budget is None else ("yes" if max(row["all"]) <= budget else "NO")
            within = within and ok != "NO"
            planned = (
                "" if budget is None else f"{_mb(row['planned_first'])}, {_mb(row['planned'])}"
            )
            print(
                f"| {row['model']} | {row['way']} | {row.get('chunks') or ''} | {_mb(budget)} "
                f"| {planned} | {_mb(row['first'])}, {_mb(row['peak'])} | {ok} "
                f"| {row['seconds']:.3f} |",
                flush=True,
            )
            if row.get("counted"):
                print(f"#   {row['way']}: the plan after the last step counts {row['counted']}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# load average {load} after")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
