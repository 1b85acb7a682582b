"""Issue 35's least-memory goal: ``enable(..., loss_chunks=N)``'s least memory, in PyTorch's loop
and with the optimizer step in the backward, against Hugging Face checkpointing + a chunked loss.

Usage::

    nice -n 10 python benchmarks/bench_least_chunked.py [--models gpt2 llama] [--small]
        [--loss-chunks 8]

Per model (``bench_alternatives.py``'s GPT-2 8 x 256 and Llama 6 x 256, batch 4 x 256 tokens;
``--small``: its small sizes), one thread, SGD: :func:`memplan.torch.compare.training.
compare_training` without the rows at the alternatives' peaks, no ``checkpoint_sequential``, no
``torch.compile``, one timed round (the times are not the point here), which measures plain
training, Hugging Face checkpointing, HF checkpointing + the loss in N chunks written by hand,
and ``enable(model, least, example_input=batch, loss_chunks=N)`` in PyTorch's loop
(``loss.backward(); optimizer.step()``); then, on the same chunked profile, ``enable(...,
optimizer=opt, gradients="step-in-backward")`` at the least memory it states (its refusal of a
10 kB budget), one warm-up and one measured step (the allocator's own count,
:func:`memplan.torch.measure.allocator_peak.allocator_peak`), then a third step whose gradients,
taken as autograd hands them to each parameter (before the step in the backward frees them),
are compared with plain training's (``equal``/``close``/``differ`` as the other rows':
:func:`memplan.torch.compare.training.gradient_agreement`). Printed per model: each row's measured and planned peak and its ratio to
HF + chunked's measured peak, against the goal (<= 0.75x); with the machine, the load at the
start and the end, the thread count and the versions.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402
from bench_alternatives import LEAST_GOAL, MODELS, SMALL  # noqa: E402


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min)"


def _step_in_backward(result: Any, model: Any, x: Any, labels: Any, chunks: int) -> dict[str, Any]:
    """The least memory of ``enable(..., gradients="step-in-backward", loss_chunks=chunks)`` on
    the comparison's chunked profile: stated, planned, measured, and the update checked."""
    import torch

    from memplan.errors import InputError
    from memplan.torch import enable
    from memplan.torch.compare.training import gradient_agreement
    from memplan.torch.measure.allocator_peak import allocator_peak, profiled_copy
    from memplan.torch.runtime.planned import planned

    initial = copy.deepcopy(model)
    got = copy.deepcopy(model)
    opt = torch.optim.SGD(got.parameters(), lr=0.01)
    batch = {"input_ids": x, "labels": labels}
    kw: dict[str, Any] = dict(
        example_input=batch, profile=result.chunked_profile, optimizer=opt,
        gradients="step-in-backward", output_held=False, loss_chunks=chunks,
    )  # fmt: skip
    try:
        enable(copy.deepcopy(got), "0.01MB", **kw)
        raise SystemExit("a 10 kB budget was not refused")
    except InputError as exc:
        stated = re.search(r"\((\d+) bytes\)", str(exc))
        assert stated is not None, str(exc)
        least = int(stated.group(1))
    grads: dict[int, Any] = {}
    capturing: list[bool] = []
    for j, p in enumerate(got.parameters()):  # before enable's: they run first
        p.register_post_accumulate_grad_hook(lambda p, j=j: _keep(grads, j, p, capturing))
    enable(got, least, **kw)

    def step(batch_x: Any) -> None:
        got(input_ids=batch_x, labels=labels).loss.backward()
        opt.step()  # nothing left to do: each parameter was stepped in the backward
        opt.zero_grad(set_to_none=True)

    def reset() -> None:  # the initial weights and random state
        with torch.no_grad():
            for p, q in zip(got.parameters(), initial.parameters(), strict=True):
                p.copy_(q)
        torch.manual_seed(0)

    peaks = []
    for _ in range(2):  # a warm-up, then the measured step (the same from the first on)
        reset()
        batch_x = profiled_copy(x)
        held = [*got.parameters(), *got.buffers(), batch_x, labels]
        peaks.append(allocator_peak(lambda b=batch_x: step(b), held, x.device)[0])
    capturing.append(True)  # a third step, not measured: each gradient once complete
    reset()
    step(x)
    ref = copy.deepcopy(initial)
    torch.manual_seed(0)
    ref(input_ids=x, labels=labels).loss.backward()
    expected = [p.grad for p in ref.parameters()]
    made = [grads.get(j) for j in range(len(expected))]
    found_plan = planned(got)
    assert found_plan is not None
    agreement, error = gradient_agreement(made, expected)
    return {
        "name": f"memplan rotor, loss_chunks={chunks}, step-in-backward (least memory)",
        "peak": peaks[-1],
        "planned_peak": found_plan.schedule.peak_memory,
        "budget": least,
        "grads": agreement,
        "grad_error": error,
    }


def _keep(found: dict[int, Any], key: int, param: Any, capturing: list[bool]) -> None:
    """Keep a copy of ``param``'s complete gradient when ``capturing`` (not in a measured step)."""
    if capturing:
        found[key] = param.grad.detach().clone()


def measure(key: str, small: bool, chunks: int) -> list[dict[str, Any]]:
    """The rows of one model (see the module's docstring)."""
    from memplan.torch import build_model
    from memplan.torch.compare.training import compare_training
    from memplan.torch.split.hf import default_labels

    spec = dict(MODELS[key])
    if small:
        spec.update(config=SMALL[key], batch_size=2, input_shape=(64,))
    common = dict(config=spec["config"], batch_size=spec["batch_size"])
    result = compare_training(
        spec["model"], input_shape=spec["input_shape"], threads=1, rounds=1, segments=(),
        compile_budgets=(), at_alternatives=False, loss_chunks=chunks, clock="cpu", **common,
    )  # fmt: skip
    wanted = ("hf checkpointing", "least memory")
    rows = [o.to_dict() for o in result.outcomes if any(w in o.name for w in wanted)]
    model, x, _ = build_model(spec["model"], input_shape=spec["input_shape"], **common)
    model.train()
    labels = default_labels(model, x)
    rows.append(_step_in_backward(result, model, x, labels, chunks))
    return rows


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.1f}"


def table(key: str, rows: list[dict[str, Any]], chunks: int) -> str:
    anchor = next(r for r in rows if r["name"] == f"hf checkpointing + loss in {chunks} chunks")
    lines = [
        f"#### {key}",
        "",
        "| way | measured MB | planned MB | / HF + chunked | gradients |",
        "|---|---:|---:|---:|---|",
    ]
    for row in rows:
        grads = row["grads"]
        if row.get("grad_error"):
            grads += f" ({row['grad_error']:.1e})"
        lines.append(
            f"| {row['name']} | {_mb(row['peak'])} | {_mb(row.get('planned_peak'))} "
            f"| {row['peak'] / anchor['peak']:.3f} | {grads} |"
        )
    least = min((r for r in rows if f"loss_chunks={chunks}" in r["name"]), key=lambda r: r["peak"])
    ratio = least["peak"] / anchor["peak"]
    verdict = "met" if ratio <= LEAST_GOAL else "not met"
    lines += [
        "",
        f"least memory through enable: {_mb(least['peak'])} MB ({least['name']}), "
        f"{ratio:.3f}x HF + chunked loss's {_mb(anchor['peak'])} MB: goal <= {LEAST_GOAL}x "
        f"{verdict}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=["gpt2", "llama"], default=["gpt2", "llama"])
    parser.add_argument("--small", action="store_true", help="the small sizes (a check)")
    parser.add_argument("--loss-chunks", type=int, default=8)
    args = parser.parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(1)
    command = "python benchmarks/bench_least_chunked.py " + shlex.join(sys.argv[1:])
    print(
        f"# {machine()}; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"{torch.get_num_threads()} thread; sgd; {_load()} at the start\n# {command}",
        flush=True,
    )
    for key in args.models:
        rows = measure(key, args.small, args.loss_chunks)
        print(table(key, rows, args.loss_chunks), flush=True)
    print(f"# {_load()} at the end", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
