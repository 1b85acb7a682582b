"""Every model a user brings: each causal-LM, masked-LM and image-classification type of the
installed transformers, trained plainly and under ``memplan.torch.enable``.

Usage::

    nice -n 10 python benchmarks/sweep_models.py                      # every type, ~1.5 h
    nice -n 10 python benchmarks/sweep_models.py --tasks causal-lm --types gpt2 falcon
    python benchmarks/sweep_models.py --table sweep.json              # docs/models.md's table
    python benchmarks/sweep_models.py --merge a.json b.json --out sweep.json  # runs side by side

For each type (:data:`memplan.torch.models.tiny.TASK_MAPPINGS`), in a worker process that one
type cannot take the sweep down with (a crash or ``--timeout`` seconds end the process, not the
sweep; :class:`Worker`): a tiny model from the type's own
config class (:func:`memplan.torch.models.tiny.tiny_model`: 2 layers, 64 wide, a vocabulary of
1,000, random weights) trains ``--steps`` AdamW steps on different batches plainly, and a copy
trains the same steps with the same random draws (AdamW's ``eps`` :data:`ADAM_EPS`) under
``memplan.torch.enable`` at
``--fraction`` of plain training's measured peak, told the loop it runs (``optimizer=
"adamw:fused"``, ``output_held=False``: the loop keeps the loss only). The peaks are the
allocator's own count (:func:`memplan.torch.measure.allocator_peak.allocator_peak`), apart from
memplan's bookkeeping. The verdict of each type (:func:`check_type`):

* ``trains``: the losses and the parameters after the steps are plain training's, and every
  step measured within the budget;
* ``refused``: ``enable`` raised an :class:`memplan.InputError`: the reason is in the message;
* ``not-plain``: no tiny model of that type builds or trains plainly (not memplan's);
* ``failed``: anything else: an internal error, parameters that differ, a step over the budget.

A type refused for lack of a plan is enabled again as the refusal advises, as a user following
the message would (:data:`ADVICE`: ``loss_chunks="auto"`` where it names the chunked loss,
``sub_blocks="auto"`` where it names the blocks cut into sub-blocks), and where no plan fits
``--fraction`` of plain training's peak with them, at ``--fallback`` of it, plainly first (its
verdict names the budget it was given and the options it needed, ``options``). With the chunked
loss the model returns no logits while training: the check compares the losses and the
parameters, as for every type.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import queue
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TRAINS, REFUSED, NOT_PLAIN, FAILED = "trains", "refused", "not-plain", "failed"
VERDICTS = (TRAINS, REFUSED, NOT_PLAIN, FAILED)
TASKS = ("causal-lm", "masked-lm", "image-classification")
LEARNING_RATE = 1e-3
ADAM_EPS = 1e-4
"""AdamW's epsilon, plain and planned alike. At PyTorch's 1e-8, Adam's first steps turn a
gradient's float noise into a whole step of the learning rate where the gradient is near zero (a
key bias's, 1e-15, which the chunked loss sums in another order): parameters 3e-5 apart after
three steps whose first gradients agree to 1e-6 of each tensor's largest (MobileBERT)."""
LOSS_RTOL = 1e-4
"""Losses of the planned steps against plain training's, relative."""
PARAM_RTOL, PARAM_ATOL = 1e-4, 1e-5
"""Parameters after the steps against plain training's (assert_close)."""


@dataclass
class Verdict:
    """What one type did (see the module docstring)."""

    model_type: str
    task: str
    verdict: str
    reason: str = ""
    params: int | None = None
    plain_peak: int | None = None
    budget: int | None = None
    fraction: float | None = None
    planned_peak: int | None = None
    measured_peak: int | None = None
    stages: int | None = None
    recomputed: int | None = None
    seconds: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """The options of ``enable`` the type needed: those its refusals advised (:data:`ADVICE`)."""
    extra: dict[str, Any] = field(default_factory=dict)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:400]


def _optimizer(model: Any) -> Any:
    """The loop's optimizer: fused AdamW (its step holds no temporaries)."""
    import torch

    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, eps=ADAM_EPS, fused=True)


def _train(
    model: Any, batches: list[dict[str, Any]], opt: Any = None
) -> tuple[list[float], list[int]]:
    """AdamW steps, one per batch, with the same seed per step; the losses and measured peaks.

    ``opt``: the loop's optimizer (:func:`_optimizer`, made here if not given).
    """
    import numpy as np
    import torch

    from memplan.torch.measure.allocator_peak import allocator_peak, profiled_copy

    opt = opt if opt is not None else _optimizer(model)
    losses, peaks = [], []
    for i, batch in enumerate(batches):
        batch = {k: profiled_copy(v) for k, v in batch.items()}
        opt.zero_grad(set_to_none=True)

        def step(batch: dict[str, Any] = batch, i: int = i) -> float:
            torch.manual_seed(100 + i)
            np.random.seed(100 + i)  # BigBird draws its random attention blocks from numpy
            random.seed(100 + i)
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            return float(loss.detach())

        held = [
            *model.parameters(),
            *model.buffers(),
            *batch.values(),
            *(t for state in opt.state.values() for t in state.values()),
        ]
        peak, loss = allocator_peak(step, held, torch.device("cpu"))
        losses.append(loss)
        peaks.append(peak)
    return losses, peaks


def _differs(ref: Any, got: Any) -> str | None:
    """The first parameter or buffer that differs from plain training's (None: all equal)."""
    import torch

    pairs = [
        *zip(ref.named_parameters(), got.named_parameters(), strict=True),
        *zip(ref.named_buffers(), got.named_buffers(), strict=True),
    ]
    for (name, a), (_, b) in pairs:
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{name} is {b.dtype} {tuple(b.shape)}, not {a.dtype} {tuple(a.shape)}"
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return f"{name} differs"
            continue
        if not torch.allclose(b, a, rtol=PARAM_RTOL, atol=PARAM_ATOL, equal_nan=True):
            diff = float((b.double() - a.double()).abs().max())
            return f"{name} differs from plain training by {diff:.3g}"
    return None


ADVICE = (
    ("loss_chunks='auto'", "loss_chunks", "auto"),
    ("sub_blocks=True", "sub_blocks", "auto"),
    ("gradients='step-in-backward'", "gradients", "step-in-backward"),
)
"""What a refusal for lack of a plan may advise (the text ending its message), and the option the
sweep then gives ``enable``, as a user following the message would: the loss in chunks of tokens,
the blocks cut into sub-blocks where no plan of whole blocks fits, the optimizer stepped in the
backward (the loop's optimizer given, as the message asks; the loop clips, scales and accumulates
nothing)."""


def _enable(
    model: Any, batch: dict[str, Any], budget: int, options: dict[str, Any], opt: Any
) -> Any:
    from memplan.torch import enable

    # the loop _train runs: fused AdamW (no step temporaries), the loss kept, not the output;
    # the optimizer itself where it steps in the backward
    optimizer = opt if options.get("gradients") == "step-in-backward" else "adamw:fused"
    return enable(
        model, budget, example_input=batch, optimizer=optimizer, output_held=False,
        repeats=1, **options,
    )  # fmt: skip


def _no_plan(message: str) -> bool:
    return message.startswith("no ") and "plan fits" in message


def advised(message: str, taken: dict[str, Any]) -> dict[str, Any]:
    """The options a refusal for lack of a plan advises that are not ``taken`` yet (:data:`ADVICE`;
    none for any other refusal).
    """
    if not _no_plan(message):
        return {}
    return {
        option: value
        for text, option, value in ADVICE
        if option not in taken and text in message.split(" plan fits", 1)[1]
    }


def check_type(
    model_type: str,
    task: str,
    *,
    steps: int = 3,
    fraction: float = 0.8,
    fallback: float = 0.95,
    batch: int | None = None,
    seq: int = 64,
) -> Verdict:
    """Build a tiny model of ``model_type``, train it plainly and under a plan; the verdict.

    Batches of 2 x ``seq`` tokens, or of 8 images (the tiny images' activations are small: with
    2, the weights and AdamW's state leave no plan below plain training's peak).
    """
    import torch

    from memplan.errors import InputError
    from memplan.torch import planned
    from memplan.torch.models.tiny import tiny_batch, tiny_model

    start = time.perf_counter()
    found = Verdict(model_type, task, FAILED)
    if batch is None:
        batch = 8 if task == "image-classification" else 2

    def done(verdict: str, reason: str = "") -> Verdict:
        found.verdict, found.reason = verdict, reason
        found.seconds = round(time.perf_counter() - start, 1)
        return found

    try:
        model = tiny_model(model_type, task)
        batches = [tiny_batch(model, task, batch, seq, seed=i) for i in range(steps)]
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises: not memplan's
        return done(NOT_PLAIN, f"the tiny model does not build: {_one_line(exc)}")
    found.params = sum(p.numel() for p in model.parameters())
    try:  # a first call that sets a model's lazy state (BigBird's) before the copies
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(**batches[0])
    except Exception as exc:  # noqa: BLE001
        return done(NOT_PLAIN, f"it does not run: {_one_line(exc)}")
    ref, got = copy.deepcopy(model), copy.deepcopy(model)
    try:
        ref_losses, ref_peaks = _train(ref, batches)
    except Exception as exc:  # noqa: BLE001
        return done(NOT_PLAIN, f"it does not train plainly: {_one_line(exc)}")
    if not all(math.isfinite(v) for v in ref_losses):
        return done(NOT_PLAIN, f"its plain losses are not finite: {ref_losses}")
    found.plain_peak = max(ref_peaks)
    opt = _optimizer(got)
    refusal = _plan_below(found, got, opt, batches[0], (fraction, fallback))
    if refusal is not None:
        return done(*refusal)
    plan = planned(got)
    assert plan is not None
    found.planned_peak = plan.schedule.peak_memory
    found.stages = len(plan.names)
    counts = plan.planned_forward_counts()
    found.recomputed = sum(counts) - len(counts)
    try:
        losses, peaks = _train(got, batches, opt)
    except InputError as exc:
        return done(REFUSED, f"refused at a step: {' '.join(str(exc).split())}")
    except Exception as exc:  # noqa: BLE001
        return done(FAILED, f"a planned step fails: {_one_line(exc)}")
    found.measured_peak = max(peaks)
    found.extra = {"losses": losses, "plain_losses": ref_losses}
    same = all(
        math.isclose(a, b, rel_tol=LOSS_RTOL, abs_tol=1e-6)
        for a, b in zip(losses, ref_losses, strict=True)
    )
    if not same:
        return done(FAILED, f"losses {losses} differ from plain training's {ref_losses}")
    with torch.no_grad():
        differs = _differs(ref, got)
    if differs is not None:
        return done(FAILED, differs)
    if found.measured_peak > found.budget:
        over = found.measured_peak / found.budget - 1
        return done(FAILED, f"measured {found.measured_peak} bytes, {over:.1%} over the budget")
    return done(TRAINS)


def _plan_below(
    found: Verdict, model: Any, opt: Any, batch: dict[str, Any], shares: tuple[float, ...]
) -> tuple[str, str] | None:
    """``enable`` on ``model`` at the first of ``shares`` of plain training's peak where a plan
    fits: at each budget plainly first, then as each refusal for lack of a plan advises
    (:func:`advised`), as a user would. None once planned (``found`` says the budget and the
    options the plan needed), else the verdict and its reason.
    """
    from memplan.errors import InputError

    for share in shares:
        found.fraction = share
        found.budget = int(share * (found.plain_peak or 0))
        found.options = {}
        while True:
            try:
                _enable(model, batch, found.budget, found.options, opt)
                return None
            except InputError as exc:
                message = " ".join(str(exc).split())
                if "this is a bug" in message:
                    return FAILED, f"internal error: {message}"
                advice = advised(message, found.options)
                if not advice:
                    break
                found.options.update(advice)
            except Exception as exc:  # noqa: BLE001 - an internal error: the sweep's finding
                return FAILED, f"internal error in enable: {_one_line(exc)}"
        if not _no_plan(message):
            return REFUSED, message
    return REFUSED, message


# ------------------------------------------------------------------------------------------------
# The sweep: one process per type
# ------------------------------------------------------------------------------------------------


class Worker:
    """A process that checks types one after the other (``--worker``: a task and a type per
    line in, one JSON verdict per line out): the imports are paid once per :data:`RECYCLE`
    types, and a type that crashes the process or runs past the timeout ends only it (the type
    is ``failed``; a new process takes the next one).
    """

    RECYCLE = 25

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.process: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.done = 0

    def _start(self) -> subprocess.Popen[str]:
        args = self.args
        command = [
            sys.executable, __file__, "--worker", "--steps", str(args.steps),
            "--fraction", str(args.fraction), "--fallback", str(args.fallback),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "KINETO_LOG_LEVEL": "6"}
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=env,
        )  # fmt: skip
        lines: queue.Queue[str | None] = queue.Queue()

        def read(out: Any = process.stdout) -> None:
            for line in out:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        self.process, self.lines, self.done = process, lines, 0
        while (line := lines.get()) is not None and not line.startswith("ready"):
            pass  # the imports: not part of the first type's time
        return process

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def check(self, task: str, model_type: str) -> Verdict:
        if self.process is None or self.done >= self.RECYCLE:
            self.stop()
            self._start()
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(f"{task} {model_type}\n")
        self.process.stdin.flush()
        start = time.perf_counter()
        while True:
            left = self.args.timeout - (time.perf_counter() - start)
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                self.stop()
                return Verdict(model_type, task, FAILED, f"timed out after {self.args.timeout} s")
            if line is None:
                code = self.process.wait()
                self.process = None
                return Verdict(model_type, task, FAILED, f"the process ended (exit {code})")
            if line.startswith("{"):
                self.done += 1
                return Verdict(**json.loads(line))


def _serve(args: argparse.Namespace) -> None:
    """``--worker``: check the types given on stdin, one JSON line each on stdout."""
    import warnings

    import torch

    import memplan.torch  # noqa: F401 - the imports, before the first type's clock starts
    from memplan.torch.models.tiny import model_types

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    model_types("causal-lm")  # transformers
    print("ready", flush=True)
    for line in sys.stdin:
        task, model_type = line.split()
        found = check_type(
            model_type, task, steps=args.steps, fraction=args.fraction, fallback=args.fallback
        )
        torch.set_default_dtype(torch.float32)  # whatever a model's code set
        print(json.dumps(asdict(found)), flush=True)


def _types(tasks: list[str], only: list[str] | None) -> list[tuple[str, str]]:
    from memplan.torch.models.tiny import model_types

    return [(task, t) for task in tasks for t in model_types(task) if not only or t in only]


def _summary(results: list[Verdict]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for r in results:
        counts.setdefault(r.task, dict.fromkeys(VERDICTS, 0))[r.verdict] += 1
    return counts


def table(results: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """docs/models.md's table: one row per type, with the sweep's conditions above."""
    lines = [
        f"transformers {header['transformers']}, torch {header['torch']}; {header['machine']}; "
        f"load average {header['load']}; {header['threads']} thread per process",
        "",
        "| task | type | verdict | budget / plain peak | options | measured / budget "
        "| planned / measured | reason |",
        "|---|---|---|---:|---|---:|---:|---|",
    ]
    for r in results:
        share = f"{r['fraction']:.2f}" if r.get("budget") and r["verdict"] != NOT_PLAIN else ""
        measured = r.get("measured_peak")
        ratio = f"{measured / r['budget']:.3f}" if measured and r.get("budget") else ""
        plan = f"{r['planned_peak'] / measured:.4f}" if measured and r.get("planned_peak") else ""
        reason = r["reason"].replace("|", "\\|")
        options = ", ".join(f"{k}={v!r}" for k, v in r.get("options", {}).items())
        lines.append(
            f"| {r['task']} | {r['model_type']} | {r['verdict']} | {share} | {options} | {ratio} "
            f"| {plan} | {reason} |"
        )
    return "\n".join(lines)


def merge(paths: list[Path]) -> dict[str, Any]:
    """One results document from runs over parts of the types (``--types`` run side by side):
    their results in the order given, the first run's header with every run's loads, the counts.
    """
    docs = [json.loads(path.read_text()) for path in paths]
    header = dict(docs[0]["header"])
    for key in ("load", "load_after"):
        header[key] = "; ".join(d["header"][key] for d in docs if key in d["header"])
    results = [r for d in docs for r in d["results"]]
    summary = _summary([Verdict(**r) for r in results])
    return {"header": header, "results": results, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--types", nargs="+", help="only these model types")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.8)
    parser.add_argument("--fallback", type=float, default=0.95)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per type")
    parser.add_argument("--out", type=Path, default=Path("sweep_models.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--table", type=Path, help="print the markdown table of a results file")
    parser.add_argument("--merge", type=Path, nargs="+", help="results files into one (--out)")
    args = parser.parse_args(argv)
    if args.merge is not None:
        args.out.write_text(json.dumps(merge(args.merge), indent=1))
        return 0
    if args.table is not None:
        doc = json.loads(args.table.read_text())
        print(table(doc["results"], doc["header"]))
        return 0
    if args.worker:
        _serve(args)
        return 0
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).parent))
    from _common import machine

    header = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "machine": machine(),
        "threads": 1,
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    print(f"# {header}", flush=True)
    results = []
    worker = Worker(args)
    for task, model_type in _types(args.tasks, args.types):
        found = worker.check(task, model_type)
        results.append(found)
        print(f"{task:22} {model_type:28} {found.verdict:10} {found.reason[:150]}", flush=True)
        doc = {"header": header, "results": [asdict(r) for r in results]}
        args.out.write_text(json.dumps(doc, indent=1))
    worker.stop()
    header["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    doc = {"header": header, "results": [asdict(r) for r in results], "summary": _summary(results)}
    args.out.write_text(json.dumps(doc, indent=1))
    for task, counts in _summary(results).items():
        print(f"# {task}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
