"""``memplan run``: train a model for a few steps under a plan and compare with the prediction."""

import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memplan.cli import common
from memplan.cli.common import EXIT_INFEASIBLE, err_console, guard
from memplan.cli.model_options import (
    JOIN_NAMES,
    LOSS_CHUNKS_HELP,
    TORCH_HINT,
    BatchSizeOption,
    ConfigOption,
    DeviceChoice,
    DType,
    InputShapeOption,
    ProfilerRepeatsOption,
    TrainingDeviceOption,
    TrainingOptimizerOption,
    check_counts,
    has_torch,
    parse_config_option,
    parse_shape,
)
from memplan.cli.options import family_options
from memplan.cli.solve import GRADIENTS_HELP, GRADIENTS_METAVAR, MEM_HELP
from memplan.errors import InputError

if TYPE_CHECKING:
    from memplan.budget import MemoryBudget
    from memplan.loop import Optimizer


class RunFormat(str, enum.Enum):
    table = "table"
    json = "json"


# The options of memplan run (those of every command that builds a model: model_options.py).
ModelName = Annotated[str, typer.Argument(help="A model name, e.g. resnet18, gpt-tiny.")]
AlgoOption = Annotated[
    str, typer.Option("--algo", "-a", metavar="ALGO", help="Algorithm (see `memplan algos`).")
]
MemOption = Annotated[
    str | None, typer.Option("--mem", "-m", metavar="SIZE", help=MEM_HELP + " [required]")
]
StepsOption = Annotated[
    int,
    typer.Option(
        metavar="N",
        help="Training steps, each measured (from the 2nd on, the gradients and the "
        "optimizer state are allocated for the whole step).",
    ),
]
GivenProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-p",
        metavar="FILE",
        help="Use this profile of the same model and input instead of profiling it.",
    ),
]
DataTypeOption = Annotated[
    DType | None,
    typer.Option(
        help="Data type of the weights and activations, profiled and trained in.  "
        "[default: the profile's with --profile, else float32]"
    ),
]
LearningRateOption = Annotated[float, typer.Option(metavar="RATE", help="Learning rate.")]
TrainingGradientsOption = Annotated[
    str,
    typer.Option(
        metavar=GRADIENTS_METAVAR,
        help=GRADIENTS_HELP + " The steps train in that loop (auto: PyTorch's, the profile "
        "memplan run measures has weight_grad_size).",
    ),
]
FormatOption = Annotated[
    RunFormat | None,
    typer.Option("--format", "-f", help="table (stderr) or a json document on stdout."),
]
TraceOption = Annotated[
    Path | None,
    typer.Option("--trace", metavar="FILE.json", help="Also write the plan's trace."),
]
LossChunksOption = Annotated[
    int | None,
    typer.Option(
        "--loss-chunks",
        metavar="N",
        help=LOSS_CHUNKS_HELP + "  [default: the profile's with --profile, else none]",
    ),
]


@family_options("run")
def run(
    model: ModelName,
    algo: AlgoOption = "rotor",
    mem: MemOption = None,
    steps: StepsOption = 2,
    batch_size: BatchSizeOption = None,
    input_shape: InputShapeOption = None,
    profile: GivenProfileOption = None,
    device: TrainingDeviceOption = DeviceChoice.auto,
    dtype: DataTypeOption = None,
    config: ConfigOption = None,
    lr: LearningRateOption = 0.01,
    family_options: dict[str, Any] | None = None,
    optimizer: TrainingOptimizerOption = "sgd",
    gradients: TrainingGradientsOption = "auto",
    repeats: ProfilerRepeatsOption = 3,
    fmt: FormatOption = None,
    trace: TraceOption = None,
    loss_chunks: LossChunksOption = None,
) -> None:
    """Profile a model, solve, and train N steps under the plan, measuring each step.

    Prints the budget, the plan's peak and the measured peak of the whole step (the allocator's:
    weights, gradients, optimizer state, activations, temporaries, input and loss; CUDA:
    torch.cuda.max_memory_allocated, CPU: the allocator's events, docs/runtime.md), their ratio,
    and the forward computations per stage, measured and planned. Exit 0 when the measured peak
    is within the budget, 1 when it exceeds it or when no plan fits, 2 on bad input.

    Example: `memplan run resnet18 --algo rotor --mem 200MB --steps 2 -b 4 --input-shape 3,64,64`;
    `memplan run hf:gpt2 --config n_layer=2,n_embd=64,n_head=2,vocab_size=1000 -b 2
    --input-shape 32 --mem 40MB --dtype bfloat16`;
    `memplan run gpt-tiny --algo pofo --mem 1.2MB --bandwidth 30MB/s --slots 500` (pofo, dynprog
    and the other offloading algorithms need a bandwidth: --bandwidth or the profile's).
    """
    from memplan.algorithms import options_for
    from memplan.budget import check_memory
    from memplan.loop import check_gradients, parse_optimizer

    with guard():
        if mem is None:
            raise InputError("--mem: a memory budget is required, e.g. --mem 8GB")
        check_counts(
            ("--steps", steps), ("--batch-size", batch_size), ("--loss-chunks", loss_chunks)
        )
        # checked once, typed; gpu and 90% take the GPU from the profile made below
        budget = check_memory(mem)
        chosen = parse_optimizer(optimizer)
        gradients = check_gradients(gradients)
        config_values = parse_config_option(model, config)
        _refuse_join_network(model)
        options = family_options or {}
        options_for(algo, options)  # bad options fail before the model is built and profiled
        shape = None if input_shape is None else parse_shape(input_shape)
        if not has_torch():
            raise InputError(f"memplan run {TORCH_HINT}")
        doc = _train(
            model, algo, budget, steps, batch_size, shape, profile, device.value, lr, options,
            chosen, repeats, trace, None if dtype is None else dtype.value,
            config_values, gradients, loss_chunks,
        )  # fmt: skip
        if doc is None:
            raise typer.Exit(EXIT_INFEASIBLE)
        if fmt == RunFormat.json:
            common.write_output(json.dumps(doc, indent=2), None)
        else:
            _render(doc)
        if not doc["within_budget"]:
            common.echo_err(over_budget_line(doc, mem))
            raise typer.Exit(EXIT_INFEASIBLE)


def _refuse_join_network(model: str) -> None:
    """A join network is a usage error: ``run`` trains chains."""
    if model in {name.strip() for name in JOIN_NAMES.split(",")}:
        raise InputError(
            f"{model} is a join network: memplan run trains chains (its runtime follows "
            "chain, offloading and combined plans); profile, solve and simulate join plans "
            f"with memplan profile {model} | memplan solve --algo join"
        )


def _train(
    name: str,
    algo: str,
    memory: "MemoryBudget",
    steps: int,
    batch_size: int | None,
    shape: tuple[int, ...] | None,
    profile: str | None,
    device: str,
    lr: float,
    options: dict[str, Any],
    optimizer: "Optimizer",
    repeats: int,
    trace: Path | None,
    dtype: str | None,
    config: str | None,
    gradients: str = "auto",
    loss_chunks: int | None = None,
) -> dict[str, Any] | None:
    """Plan, build the model (profiled here without ``profile``), train ``steps`` steps under the
    plan and measure them: ``train_under_plan``'s document, or None when no plan fits (the
    reason on stderr).
    """
    from memplan.profile.memory import loop_on
    from memplan.torch.base.device import resolve_device
    from memplan.torch.measure.conditions import training_as_profiled
    from memplan.torch.measure.step import train_under_plan
    from memplan.torch.planner import PlanSettings, infeasible_message, plan_training

    budget, chosen = memory, optimizer
    settings = PlanSettings(
        algo, options.get("slots"), options.get("bandwidth"), repeats, loss_chunks
    )
    prof, dtype = _given_profile(profile, dtype, loss_chunks)
    dev = resolve_device(device)

    def plan(prof: Any) -> Any:
        """The feasible schedule (NOTE [ one planning path ]), or None with the reason on
        stderr. The steps train as measure_step runs them: the output is not held.
        """
        found = plan_training(prof, budget, loop_on(prof, chosen, gradients), settings)
        if not found.feasible:
            common.echo_err(f"memplan: infeasible: {infeasible_message(found, budget)}")
            return None
        return found

    # a given profile is solved first: no model is built (nor moved to the GPU) for no plan
    sched = None if prof is None else plan(prof)
    if prof is not None and sched is None:
        return None
    module, x, label = _model_on(name, batch_size, shape, config, dev, dtype)
    if prof is None:
        prof = _profile_here(module, x, settings, label, dev)
        sched = plan(prof)
        if sched is None:
            return None
    if trace is not None:
        from memplan.cli.solve import write_trace_file

        write_trace_file(trace, sched, prof)
    try:
        with training_as_profiled(prof, dev, common.echo_err):  # the profile's threads
            return train_under_plan(module, x, prof, sched, steps=steps, lr=lr)
    except InputError as exc:
        where = f"--profile {profile}: " if profile is not None else ""
        raise InputError(f"{where}{exc}") from None


def _given_profile(
    profile: str | None, dtype: str | None, loss_chunks: int | None
) -> tuple[Any, str]:
    """``--profile FILE`` loaded (None without it) and the data type trained in: the profile's,
    which ``--dtype`` may only repeat, else ``--dtype`` or float32.
    """
    import memplan
    from memplan.torch.split.chunked_loss import profile_loss_chunks

    prof = None
    if profile is not None:
        prof = memplan.load_profile(profile)
        if dtype is not None and prof.dtype != dtype:
            raise InputError(
                f"--dtype {dtype}: the profile {profile} was measured in {prof.dtype}; a plan "
                "is for the data type it was profiled in (profile again with --dtype)"
            )
        dtype = prof.dtype
        profile_loss_chunks(prof, loss_chunks)  # the chain is the profile's
    return prof, dtype or "float32"


def _model_on(
    name: str,
    batch_size: int | None,
    shape: tuple[int, ...] | None,
    config: str | None,
    dev: Any,
    dtype: str,
) -> tuple[Any, Any, str]:
    """The model and its example input built and moved to ``dev`` in ``dtype``, and its label."""
    from memplan.torch.measure.runner import DTYPES
    from memplan.torch.models.registry import build_model

    module, x, label = build_model(name, batch_size=batch_size, input_shape=shape, config=config)
    module.to(device=dev, dtype=DTYPES[dtype])
    x = x.to(device=dev, dtype=DTYPES[dtype]) if x.is_floating_point() else x.to(dev)
    return module, x, label


def _profile_here(module: Any, x: Any, settings: Any, label: str, dev: Any) -> Any:
    """The model profiled for training on the threads it trains on, with progress on stderr."""
    from memplan.cli.profile import run_with_progress
    from memplan.torch.planner import profile_for_training
    from memplan.torch.profiler.model import CPU_THREADS

    common.echo_err(f"memplan: profiling {label} on {dev.type} ...")
    threads = CPU_THREADS if dev.type == "cpu" else None  # the threads it trains on
    kwargs = {"x": x, "settings": settings, "name": label, "threads": threads}
    return run_with_progress(profile_for_training, module, kwargs, f"profiling {label}")


def over_budget_line(doc: dict[str, Any], typed: str) -> str:
    """The last line when the measured peak exceeds the budget, in the units of ``--mem``."""
    measured = common.size_text(doc["measured_peak_memory"], typed)
    budget = common.size_text(doc["budget_measured"], typed)
    return (
        f"memplan: the measured peak {measured} exceeds the budget {budget} "
        f"({doc['measured_over_budget']:.3f} x the budget)"
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
    budget = doc["budget_measured"]
    if budget != doc["budget"]:  # --optimizer none: the budget leaves the weights out
        summary.add_row("budget (activations)", _size(doc["budget"]), "")
        summary.add_row("budget + weights and gradients", "", _size(budget))
    else:
        summary.add_row("budget", _size(budget), _size(budget))
    summary.add_row(
        "peak memory of the step",
        _size(doc["planned_peak_memory"]),
        _size(doc["measured_peak_memory"]),
    )
    ratio = doc["measured_over_budget"]
    planned_ratio = None if not budget else doc["planned_peak_memory"] / budget
    summary.add_row(
        "peak / budget",
        "-" if planned_ratio is None else f"{planned_ratio:.3f}",
        "-" if ratio is None else f"{ratio:.3f}",
    )
    summary.add_row(
        "activations held",
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
    for line in iteration_notes(doc):
        common.echo_err(line)
    for line in step_lines(doc):
        common.echo_err(line)
    if planned != measured:
        common.echo_err("memplan: warning: the forward counts differ from the plan's")


STEP_LINES = 10
"""Up to this many steps, ``run`` prints one line per step; beyond, a summary of them."""


def step_lines(doc: dict[str, Any]) -> list[str]:
    """The steps trained: one line each (at most :data:`STEP_LINES`), else one summary line,
    never one line of N values (a CI log of ``--steps 50``); ``--format json`` has every value.
    """
    steps, peaks = doc["steps"], doc["measured_step_peaks"]
    losses, times = doc["losses"], doc["step_ms"]
    lines = [
        f"memplan: trained {steps} step{'s' if steps != 1 else ''} with "
        f"{doc['torch_optimizer']} (peaks: {doc['measured_what']})"
    ]
    if steps <= STEP_LINES:
        lines += [
            f"memplan: step {k + 1}: peak {_size(peaks[k])}, loss {losses[k]:.4f}, "
            f"{times[k]:.2f} ms"
            for k in range(steps)
        ]
        return lines
    largest = max(range(steps), key=lambda k: peaks[k])
    peak = f"peak {_size(peaks[largest])} every step"
    if min(peaks) != peaks[largest]:
        peak = f"peak {_size(min(peaks))} to {_size(peaks[largest])} (at step {largest + 1})"
    ordered = sorted(times)
    lines.append(
        f"memplan: steps 1 to {steps}: {peak}, loss {losses[0]:.4f} at step 1, "
        f"{losses[-1]:.4f} at step {steps} (least {min(losses):.4f}), "
        f"{ordered[len(ordered) // 2]:.2f} ms a step (median; {ordered[0]:.2f} to "
        f"{ordered[-1]:.2f})"
    )
    return lines


def iteration_notes(doc: dict[str, Any]) -> list[str]:
    """Why the plan's iteration and the measured step differ (docs/cli.md, ``memplan run``)."""
    what = (
        "torch.cuda's synchronizations and peak statistics"
        if doc["device"] == "cuda"
        else "torch.profiler recording every allocator event, then their replay"
    )
    return [
        "memplan: iteration, plan: the profile's forward and backward times of the operations "
        "the plan runs, summed (each stage timed alone)",
        "memplan: iteration, measured: the whole step, also what the profile does not time: "
        "optimizer.step(), the runtime between stages (hooks, recomputation and transfer "
        f"bookkeeping) and the memory measurement ({what})",
    ]
