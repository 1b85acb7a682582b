"""``memplan run``: train a model for a few steps under a plan and compare with the prediction."""

import enum
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from memplan.cli import common
from memplan.cli.common import EXIT_INFEASIBLE, err_console, guard
from memplan.cli.options import family_options
from memplan.cli.profile import TORCH_HINT, Device, has_torch, parse_shape
from memplan.cli.solve import MEM_HELP, Optimizer, infeasible_line
from memplan.errors import InputError


class RunFormat(str, enum.Enum):
    table = "table"
    json = "json"


@family_options("run")
def run(
    model: Annotated[str, typer.Argument(help="A model name, e.g. resnet18, gpt-tiny.")],
    algo: Annotated[
        str, typer.Option("--algo", "-a", metavar="ALGO", help="Algorithm (see `memplan algos`).")
    ] = "rotor",
    mem: Annotated[
        str | None, typer.Option("--mem", "-m", metavar="SIZE", help=MEM_HELP + " [required]")
    ] = None,
    steps: Annotated[int, typer.Option(metavar="N", help="SGD steps to train.")] = 1,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", "-b", metavar="N", help="Batch size.  [default: the model's]"),
    ] = None,
    input_shape: Annotated[
        str | None,
        typer.Option(metavar="C,H,W", help="Shape of one sample.  [default: the model's]"),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            "-p",
            metavar="FILE",
            help="Use this profile of the same model and input instead of profiling it.",
        ),
    ] = None,
    device: Annotated[Device, typer.Option(help="Where to train.")] = Device.auto,
    lr: Annotated[float, typer.Option(metavar="RATE", help="SGD learning rate.")] = 0.01,
    family_options: dict[str, Any] | None = None,
    optimizer: Annotated[
        Optimizer, typer.Option(help="Static memory counted in the budget (the run uses SGD).")
    ] = Optimizer.sgd,
    repeats: Annotated[int, typer.Option(metavar="N", help="Profiler repetitions.")] = 2,
    fmt: Annotated[
        RunFormat | None,
        typer.Option("--format", "-f", help="table (stderr) or a json document on stdout."),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", metavar="FILE.json", help="Also write the plan's trace."),
    ] = None,
) -> None:
    """Profile a model, solve, and train N SGD steps under the plan.

    Prints the measured peak activation memory next to the plan's prediction (CUDA: from
    torch.cuda.max_memory_allocated; CPU: the bytes of the activations the plan holds, docs/
    runtime.md) and the forward computations per stage, measured and planned. Exit 0 when done,
    1 when no plan fits, 2 on bad input.

    Example: `memplan run resnet18 --algo rotor --mem 200MB --steps 2 -b 4 --input-shape 3,64,64`;
    `memplan run gpt-tiny --algo pofo --mem 1.2MB --bandwidth 30MB/s --slots 500` (pofo, dynprog
    and the other offloading algorithms need a bandwidth: --bandwidth or the profile's).
    """
    from memplan.algorithms import options_for

    with guard():
        if mem is None:
            raise InputError("--mem: a memory budget is required, e.g. --mem 8GB")
        for option, value in (("--steps", steps), ("--batch-size", batch_size)):
            if value is not None and value < 1:
                raise InputError(f"{option} {value}: expected a positive integer")
        memory = common.option_size("--mem", mem)
        options = family_options or {}
        options_for(algo, options)  # bad options fail before the model is built and profiled
        shape = None if input_shape is None else parse_shape(input_shape)
        if not has_torch():
            raise InputError(f"memplan run {TORCH_HINT}")
        doc = _train(
            model, algo, memory, steps, batch_size, shape, profile, device.value, lr, options,
            optimizer.value, repeats, trace,
        )  # fmt: skip
        if doc is None:
            raise typer.Exit(EXIT_INFEASIBLE)
        if fmt == RunFormat.json:
            common.write_output(json.dumps(doc, indent=2), None)
        else:
            _render(doc)


def _train(
    name: str,
    algo: str,
    memory: int,
    steps: int,
    batch_size: int | None,
    shape: tuple[int, ...] | None,
    profile: str | None,
    device: str,
    lr: float,
    options: dict[str, Any],
    optimizer: str,
    repeats: int,
    trace: Path | None,
) -> dict[str, Any] | None:
    import torch

    import memplan
    from memplan.torch.linearize import linearize
    from memplan.torch.models import build_model
    from memplan.torch.profiler import _resolve_device, profile_model
    from memplan.torch.runtime import checkpointed, planned_activation_peak

    dev = _resolve_device(device)
    module, x, label = build_model(name, batch_size=batch_size, input_shape=shape)
    module.to(dev)
    x = x.to(dev)
    if profile is None:
        common.echo_err(f"memplan: profiling {label} on {dev.type} ...")
        prof = profile_model(module, example_input=x, device=str(dev), repeats=repeats, name=label)
    else:
        prof = memplan.load_profile(profile)
    sched = memplan.solve(prof, algo, memory, optimizer=optimizer, **options)
    if not sched.feasible:
        common.echo_err(infeasible_line(sched))
        return None
    if trace is not None:
        from memplan.cli.solve import write_trace_file

        write_trace_file(trace, sched, prof)
    module.train()
    chain = linearize(module, x)
    try:
        wrapped = checkpointed(chain, sched, profile=prof)
    except InputError as exc:
        where = f"--profile {profile}: " if profile is not None else ""
        raise InputError(f"{where}{exc}") from None
    sgd = torch.optim.SGD(module.parameters(), lr=lr)
    cuda = dev.type == "cuda"
    losses, seconds, measured = [], [], 0
    for _ in range(steps):
        sgd.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(dev)
            base = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        started = time.perf_counter()
        loss = wrapped(x)
        loss.backward()
        if cuda:
            torch.cuda.synchronize(dev)
            # Activations and gradients above what was allocated before the step (the weights
            # and, from the second step on, nothing else: the gradients were set to None).
            measured = max(measured, torch.cuda.max_memory_allocated(dev) - base)
        seconds.append((time.perf_counter() - started) * 1000.0)
        sgd.step()
        losses.append(float(loss.detach()))
    counters = wrapped.counters
    if not cuda:
        measured = counters.peak_live_bytes
    planned_counts = wrapped.planned_forward_counts()
    predicted = planned_activation_peak(prof, sched)
    return {
        "model": label,
        "algorithm": sched.algorithm,
        "device": dev.type,
        "steps": steps,
        "budget": sched.budget.memory,
        "planned_peak_memory": sched.peak_memory,
        "static_memory": sched.static_memory,
        "planned_activation_peak": predicted,
        "measured_activation_peak": measured,
        "measured_what": "cuda max_memory_allocated above the weights"
        if cuda
        else "bytes of the activations held (x, s[k]), docs/runtime.md",
        "planned_makespan_ms": sched.makespan,
        "step_ms": seconds,
        "losses": losses,
        "stages": wrapped.names,
        "forwards_planned": planned_counts,
        "forwards_measured": [counters.forward_count(k) for k in range(len(wrapped.names))],
        "offloaded_bytes": counters.offloaded_bytes,
        "prefetched_bytes": counters.prefetched_bytes,
        "offloaded_bytes_planned": _planned_offload_bytes(prof, sched),
    }


def _planned_offload_bytes(prof: Any, sched: Any) -> int:
    """Bytes the plan's offloads move, by the profile's tensor sizes (docs/combined.md)."""
    sizes = {"x[0]": prof.input_size}
    for k, stage in enumerate(prof.stages):
        sizes[f"x[{k + 1}]"] = stage.output_size
        sizes[f"s[{k}]"] = stage.saved_size
    return sum(
        sizes.get(op.tensor or f"s[{op.stage}]", 0) for op in sched.ops if op.op == "offload"
    )


def _size(nbytes: int | None) -> str:
    from memplan.units import format_size

    return "-" if nbytes is None else format_size(nbytes)


def _render(doc: dict[str, Any]) -> None:
    from rich.table import Table

    console = err_console()
    summary = Table(title=f"{doc['algorithm']} plan of {doc['model']} on {doc['device']}")
    summary.add_column("", overflow="fold")
    summary.add_column("plan", justify="right", no_wrap=True)
    summary.add_column("measured", justify="right", no_wrap=True)
    summary.add_row(
        f"peak memory (budget {_size(doc['budget'])})", _size(doc["planned_peak_memory"]), ""
    )
    summary.add_row(
        "peak activations",
        _size(doc["planned_activation_peak"]),
        _size(doc["measured_activation_peak"]),
    )
    if doc["offloaded_bytes_planned"] or doc["offloaded_bytes"]:
        summary.add_row(
            "offloaded to host memory",
            _size(doc["offloaded_bytes_planned"]),
            _size(doc["offloaded_bytes"]),
        )
    planned, measured = doc["forwards_planned"], doc["forwards_measured"]
    summary.add_row("forward computations", str(sum(planned)), str(sum(measured)))
    summary.add_row(
        "iteration (ms)",
        f"{doc['planned_makespan_ms']:.2f}" if doc["planned_makespan_ms"] else "-",
        f"{doc['step_ms'][-1]:.2f}",
    )
    common.print_table(summary, console)
    stages = Table(title="forward computations per stage (recomputed stages)")
    for column in ("stage", "name", "plan", "measured"):
        stages.add_column(
            column, justify="right" if column != "name" else "left", no_wrap=column != "name"
        )
    for k, stage in enumerate(doc["stages"]):
        if planned[k] != 1 or measured[k] != 1:
            stages.add_row(str(k), stage, str(planned[k]), str(measured[k]))
    if stages.row_count:
        common.print_table(stages, console)
    losses = ", ".join(f"{value:.4f}" for value in doc["losses"])
    common.echo_err(f"memplan: trained {doc['steps']} step(s), loss {losses}")
    if planned != measured:
        common.echo_err("memplan: warning: the forward counts differ from the plan's")
