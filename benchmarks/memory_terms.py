"""Where memplan's planned memory and PyTorch's measured memory differ, term by term.

Usage::

    nice -n 10 python benchmarks/memory_terms.py                 # the models of bench_alternatives
    python benchmarks/memory_terms.py --models gpt2 --out terms.json

For each model of ``bench_alternatives.MODELS`` (one thread): the profile (with the fields of a
measured profile: ``weight_grad_size``, ``backward_overhead_fresh``, ``forward_overhead_all``,
``input_saved``, ``output_saved``), the measured peak of plain training and of memplan's
store-all and rotor (least memory) plans under the runtime
(:func:`memplan.torch.compare.training.compare_training`, PyTorch's default loop:
``zero_grad(set_to_none=True)``, SGD), memplan's planned peaks (docs/model.md, "The training loop": PyTorch's default loop), and the
peaks of :func:`replay_proposed`, the prototype those terms were made from, kept as a second
reading written apart from the simulator (it does not free a standalone checkpoint, which
memplan's model and runtime do):

1. **weight gradients**: static memory is the weights, buffers and optimizer state only; stage
   ``k``'s parameter gradients (``weight_grad_size[k]``) appear at the start of ``B k`` and stay
   to the end of the iteration (the optimizer's step); during ``B k`` the peak is the memory held
   plus ``|g[k]| + weight_grad_size[k] + backward_overhead_fresh[k]``;
2. **what autograd frees after a forward**: after ``F_all k``, the output ``x[k]`` of stage
   ``k-1`` leaves memory when stage ``k-1`` computed it with ``F_all``, does not keep it
   (``output_saved[k-1]`` false) and stage ``k`` does not keep its input (``input_saved[k]``
   false), unless the plan holds it as a standalone checkpoint: the logits after the loss's
   forward on a language model;
3. **an F_all's own temporaries**: ``F_all k`` adds ``saved_size[k] + forward_overhead_all[k]``
   (``forward_overhead``, the larger of the two kinds of forward, stays for ``F_ck``/``F_n``).

``replay_proposed(..., frees_outputs=False)`` is the model of a runtime that keeps the output of
every ``F_all`` to its ``B`` (memplan's runtime until it frees them as autograd does). The
printed table gives every term in MB and planned / measured.
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
from bench_alternatives import MODELS

import memplan

STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}
"""Optimizer state per parameter byte: momentum's buffer, Adam's two moments (its step counts
are in ``weight_size``)."""


def replay_proposed(
    prof: Any, ops: list[Any], *, frees_outputs: bool = True, optimizer: str = "sgd"
) -> int:
    """Peak bytes of a chain plan in the proposed model (module docstring), PyTorch's default
    loop, the optimizer's state held from the start (a loop's steady state: the state appears in
    the first step's ``step()`` and stays). ``ops`` in schedule order (chain plans: ``F_all``,
    ``F_ck``, ``F_n``, ``B``)."""
    stages = prof.stages
    last = len(stages) - 1
    params = sum(s.weight_grad_size or 0 for s in stages)  # a gradient per parameter byte
    static = sum(s.weight_size for s in stages) + STATE_COPIES[optimizer] * params
    held: dict[str, int] = {"x[0]": prof.input_size, f"g[{last + 1}]": stages[-1].gradient_size}
    kind: dict[int, str] = {}  # the kind of forward that produced s[k] / x[k+1] last
    grads = 0
    peak = static + sum(held.values())

    def now() -> int:
        return static + grads + sum(held.values())

    for op in ops:
        k, st = op.stage, stages[op.stage]
        if op.op == "F_all":
            peak = max(peak, now() + st.saved_size + st.forward_overhead_all)
            held[f"s[{k}]"] = st.saved_size
            kind[k] = "F_all"
            before = stages[k - 1] if k > 0 else None
            if (
                frees_outputs
                and before is not None
                and kind.get(k - 1) == "F_all"
                and f"s[{k - 1}]" in held
                and f"x[{k}]" not in held
                and not before.output_saved
                and not st.input_saved
            ):
                held[f"s[{k - 1}]"] -= before.output_size
        elif op.op in ("F_ck", "F_n"):
            peak = max(peak, now() + st.output_size + st.forward_overhead)
            held[f"x[{k + 1}]"] = st.output_size
            kind[k] = op.op
            if op.op == "F_n" and k > 0:
                held.pop(f"x[{k}]", None)
        elif op.op == "B":
            g_in = stages[k - 1].gradient_size if k > 0 else 0
            created = st.weight_grad_size or 0
            peak = max(peak, now() + g_in + created + (st.backward_overhead_fresh or 0))
            grads += created
            held.pop(f"s[{k}]", None)
            held.pop(f"g[{k + 1}]", None)
            if k > 0:
                held.pop(f"x[{k}]", None)
            held[f"g[{k}]"] = g_in
    return max(peak, now())  # the optimizer's step (SGD: in place)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (1 min) / {five:.1f} (5 min)"


def terms(key: str, optimizer: str) -> dict[str, Any]:
    from memplan.torch.compare.training import compare_training

    spec = MODELS[key]
    result = compare_training(
        spec["model"],
        config=spec["config"],
        batch_size=spec["batch_size"],
        input_shape=spec["input_shape"],
        threads=1,
        rounds=1,
        segments=(),
        compile_budgets=(),
        at_alternatives=False,
        optimizer=optimizer,
    )
    prof = result.profile
    rows = {o.name: o for o in result.outcomes}
    store_all = memplan.solve(prof, "store-all", memory=2**50, optimizer=optimizer)
    least = memplan.solve(prof, "rotor", memory=1, optimizer=optimizer).min_memory
    rotor = memplan.solve(prof, "rotor", memory=least, optimizer=optimizer)
    loss, head = prof.stages[-1], prof.stages[-2]
    doc = {
        "model": result.model,
        "optimizer": optimizer,
        "weights": sum(s.weight_size for s in prof.stages),
        "weight_grads": sum(s.weight_grad_size or 0 for s in prof.stages),
        "logits": head.output_size,
        "logits_freed_by_autograd": not head.output_saved and not loss.input_saved,
        "loss_forward_overhead": loss.forward_overhead,
        "loss_forward_overhead_all": loss.forward_overhead_all,
        "plain_measured": rows["plain"].peak,
    }
    for name, sched, row in (
        ("store_all", store_all, rows["memplan store-all"]),
        ("rotor", rotor, rows["memplan rotor (least memory)"]),
    ):
        doc[f"{name}_planned"] = sched.peak_memory
        doc[f"{name}_measured"] = row.peak
        doc[f"{name}_proposed"] = replay_proposed(prof, sched.ops, optimizer=optimizer)
        doc[f"{name}_proposed_runtime_keeps_outputs"] = replay_proposed(
            prof, sched.ops, frees_outputs=False, optimizer=optimizer
        )
    return doc


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def report(found: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| model | W | logits | plain measured | store-all: planned / runtime measured / "
        "proposed (runtime keeps outputs) / proposed (autograd frees) | rotor least: planned / "
        "measured / proposed (keeps) / proposed (frees) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for doc in found.values():
        sa = " / ".join(
            _mb(doc[f"store_all_{k}"])
            for k in ("planned", "measured", "proposed_runtime_keeps_outputs", "proposed")
        )
        ro = " / ".join(
            _mb(doc[f"rotor_{k}"])
            for k in ("planned", "measured", "proposed_runtime_keeps_outputs", "proposed")
        )
        lines.append(
            f"| {doc['model']}, {doc.get('optimizer', 'sgd')} | {_mb(doc['weights'])} "
            f"| {_mb(doc['logits'])} "
            f"| {_mb(doc['plain_measured'])} | {sa} | {ro} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--out", type=Path, default=Path("memory_terms.json"))
    parser.add_argument("--optimizer", choices=list(STATE_COPIES), default="sgd")
    parser.add_argument("--report", type=Path, help="print the table of a result file")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return
    found: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    print(f"# {machine()}; one thread; {_load()} at the start", flush=True)
    for key in args.models:
        start = time.perf_counter()
        label = key if args.optimizer == "sgd" else f"{key}, {args.optimizer}"
        found[label] = terms(key, args.optimizer)
        found[label]["wall_s"] = round(time.perf_counter() - start, 1)
        args.out.write_text(json.dumps(found, indent=1))
        print(json.dumps(found[label]), flush=True)
    print(report(found))
    print(f"# {_load()} at the end", flush=True)


if __name__ == "__main__":
    sys.exit(main())
