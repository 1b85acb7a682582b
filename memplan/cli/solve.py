"""``memplan solve`` and ``memplan simulate``: plan a chain within a budget, replay a plan."""

import enum
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memplan.cli import common
from memplan.cli.common import (
    EXIT_INFEASIBLE,
    err_console,
    guard,
    print_table,
    profile_source,
    resolve_format,
    size_text,
    write_output,
)
from memplan.cli.options import family_options
from memplan.errors import InputError
from memplan.loop import AUTO, GRADIENTS, check_gradients

if TYPE_CHECKING:
    from rich.table import Table


class SolveFormat(str, enum.Enum):
    table = "table"
    json = "json"
    yaml = "yaml"
    torch_csv = "torch-csv"


class SimulateFormat(str, enum.Enum):
    table = "table"
    json = "json"


PROFILE_HELP = (
    "Profile: a YAML/JSON file, '-' for stdin, or a bundled name (resnet50). "
    "Left out, it is read from stdin when stdin is a pipe."
)
MEM_HELP = (
    "Memory budget for the whole iteration, static memory included: 8GB, 8GiB, 512MiB, bytes; "
    "gpu (the profile's GPU memory less 512 MiB for the CUDA context and the allocator) or 90% "
    "of that."
)
OPTIMIZER_HELP = (
    "The optimizer counted in the budget: none (activations alone), sgd, momentum, adam, adamw; "
    "optionally with its step: adamw:fused, adam:foreach, sgd:for-loop (default: PyTorch's on "
    "the profile's device). Its state is static (momentum 1x, adam 2x the gradients), its "
    "step's temporaries count after the backward (docs/model.md)."
)
OPTIMIZER_METAVAR = "NAME[:STEP]"
GRADIENTS_METAVAR = "|".join((AUTO, *GRADIENTS))
"""``--gradients``' choices: the names of memplan/loop.py (checked there, naming the flag)."""
GRADIENTS_HELP = (
    "The training loop a plan is made for (graph and pipeline plans keep the gradients): "
    "at-backward (zero_grad(set_to_none=True), "
    "PyTorch's default: each stage's weight gradients appear at its backward), kept "
    "(zero_grad(set_to_none=False), gradient accumulation: counted for the whole step), "
    "step-in-backward (the optimizer steps each parameter as its gradient is made); auto: "
    "at-backward on a profile measured with weight_grad_size, else kept."
)
SHARDS_HELP = (
    "Plan one of N GPUs training the model sharded with FSDP2 (fully_shard per block and on the "
    "root), from the profile of the whole model: --mem is one GPU's budget (docs/sharding.md)."
)
TRACE_OPTION = typer.Option(
    "--trace",
    metavar="FILE.json",
    help="Also write the plan as Chrome trace-event JSON (Perfetto, chrome://tracing): one track "
    "per stream and the simulated memory as a counter.",
)
OUTPUT_HELP = "Write the document to FILE atomically instead of stdout (format from its suffix)."


def _spinner(text: str) -> AbstractContextManager[object]:
    console = err_console()
    if console.is_terminal:
        return console.status(text, spinner="dots")
    return nullcontext()


@family_options("solve")
def solve(
    profile: Annotated[
        str | None, typer.Argument(metavar="PROFILE", help=PROFILE_HELP, show_default=False)
    ] = None,
    algo: Annotated[
        str | None,
        typer.Option(
            "--algo", "-a", metavar="ALGO", help="Algorithm (see `memplan algos`). [required]"
        ),
    ] = None,
    mem: Annotated[
        str | None, typer.Option("--mem", "-m", metavar="SIZE", help=MEM_HELP + " [required]")
    ] = None,
    family_options: dict[str, Any] | None = None,
    micro_batches: Annotated[
        int | None,
        typer.Option(
            "--micro-batches",
            metavar="M",
            help="--format torch-csv: mini-batches (torch micro-batches) of the exported step.  "
            "[default: 2 x the GPUs used]",
        ),
    ] = None,
    optimizer: Annotated[str, typer.Option(metavar=OPTIMIZER_METAVAR, help=OPTIMIZER_HELP)] = "sgd",
    gradients: Annotated[str, typer.Option(metavar=GRADIENTS_METAVAR, help=GRADIENTS_HELP)] = AUTO,
    shards: Annotated[int | None, typer.Option("--shards", metavar="N", help=SHARDS_HELP)] = None,
    fmt: Annotated[
        SolveFormat | None,
        typer.Option(
            "--format", "-f", help="table (stderr) or one json/yaml document.  [default: table]"
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help=OUTPUT_HELP)
    ] = None,
    trace: Annotated[Path | None, TRACE_OPTION] = None,
) -> None:
    """Find a training schedule that fits a memory budget.

    Exit 0 when a plan fits, 1 when the algorithm finds none (the message says the least memory
    that fits, when known), 2 on bad input.

    Example: `memplan solve resnet50 --algo rotor --mem 8GB --format json`
    \f
    Long because: its options are spelled out in its signature (39 lines); the shared ones
    become memplan/cli/plan_options.py's aliases once the rework of this file on a parallel
    branch lands (issue 39 item 5 leaves it there).
    """  # noqa: D301 - the form feed ends the help typer shows (click's convention)
    import memplan
    from memplan.api import list_algorithms, solve_arguments

    with guard():
        form = resolve_format(fmt, output, ("table", "json", "yaml", "torch-csv"))
        if algo is None:
            names = ", ".join(a["name"] for a in list_algorithms())
            raise InputError(f"--algo: an algorithm is required, one of: {names}")
        # the arguments are checked once, into typed values, before the profile is read
        options = family_options or {}
        arguments = solve_arguments(
            algo, mem, optimizer=optimizer, gradients=gradients, shards=shards, **options
        )
        common.check_positive("--micro-batches", micro_batches)
        prof = memplan.load_profile(profile_source(profile))
        with _spinner(f"solving with {algo}"):
            schedule = memplan.solve(
                prof,
                algo,
                arguments.memory,
                optimizer=arguments.optimizer,
                gradients=arguments.gradients,
                progress=_print_progress,
                shards=arguments.shards,
                **options,
            )
        if trace is not None and schedule.feasible:
            write_trace_file(trace, schedule, prof)
        if form == "table":
            print_table(_render_summary(schedule, prof))
            if schedule.feasible and schedule.ops:
                from memplan.cli.render import ops_table, stage_names

                print_table(ops_table(schedule, stage_names(prof)))
            if schedule.feasible and schedule.pattern:
                from memplan.cli.render import pattern_table

                print_table(pattern_table(schedule, [s.name for s in prof.all_stages()]))
        else:
            if form == "torch-csv":
                if schedule.feasible:
                    from memplan.export.torch_csv import torch_csv

                    count = micro_batches or 2 * len(set(schedule.assignment or [0]))
                    write_output(torch_csv(schedule, count), output)
            else:
                write_output(schedule.to_json() if form == "json" else schedule.to_yaml(), output)
            if output is not None:  # the document went to a file: the summary to stderr
                print_table(_render_summary(schedule, prof))
        if not schedule.feasible:
            common.echo_err(infeasible_line(schedule, mem))
            raise typer.Exit(EXIT_INFEASIBLE)


def _print_progress(line: str) -> None:
    """Live progress of long solvers (CP-SAT objective, bound, gap): one line on stderr."""
    err_console().print(line, highlight=False, markup=False)


def _render_summary(schedule: Any, prof: Any) -> "Table":
    from memplan.cli.render import schedule_summary

    return schedule_summary(schedule, prof.length)


def infeasible_line(schedule: Any, typed: str | None = None) -> str:
    """One line: which budget failed and, when known, the least memory that fits, in the units of
    the budget as the user typed it (``typed``; the least memory rounded up, so that it fits
    when typed back).
    """
    line = (
        f"memplan: infeasible: no {schedule.algorithm} plan fits in "
        f"{size_text(schedule.budget.memory, typed)}"
    )
    message = " ".join((schedule.solver.message or "").split())
    if schedule.min_memory is not None:
        least = size_text(schedule.min_memory, typed, up=True)
        line += f"; the least memory that fits is {least}"
        if schedule.family == "join" and message:
            line += f" ({message})"
    else:
        if message:
            line += f"; {message}"
        line += "; the least memory that fits is not known for this algorithm"
    return line


def simulate(
    profile: Annotated[
        str, typer.Argument(help="The profile the schedule was made for ('-': stdin).")
    ],
    schedule: Annotated[
        str, typer.Argument(help="A memplan-schedule/1 file, JSON or YAML ('-': stdin).")
    ],
    mem: Annotated[
        str | None,
        typer.Option(
            "--mem",
            "-m",
            metavar="SIZE",
            help="Budget to check against: a size (8GB), gpu or 90%.  [default: the schedule's]",
        ),
    ] = None,
    gradients: Annotated[
        str | None,
        typer.Option(
            metavar=GRADIENTS_METAVAR,
            help="Replay a plan for this training loop (see solve --gradients).  "
            "[default: the schedule's budget.gradients]",
        ),
    ] = None,
    fmt: Annotated[
        SimulateFormat | None,
        typer.Option("--format", "-f", help="table (stderr) or a json document.  [default: table]"),
    ] = None,
    trace: Annotated[Path | None, TRACE_OPTION] = None,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Times that differ from the profile's (a profile measured again) are an error "
            "(exit 1), not a note.",
        ),
    ] = False,
) -> None:
    """Replay a schedule with the independent simulator and check it against a budget.

    Exit 0 when the schedule is valid, fits the budget and matches its own claims; 1 otherwise,
    with one line naming the first violation; 2 on bad input. Times that differ from the
    profile's (the same model profiled again: every size the same) are a note, and the plan is
    checked with the schedule's own times; with --strict they are a violation.

    Example: `memplan solve net.yaml --algo rotor --mem 2GB -f json | memplan simulate net.yaml -`
    """
    import memplan
    from memplan.api import memory_budget
    from memplan.budget import check_memory

    with guard():
        form = resolve_format(fmt, None, ("table", "json"))
        if profile == "-" and schedule == "-":
            raise InputError("PROFILE and SCHEDULE cannot both be '-' (stdin)")
        given = None if mem is None else check_memory(mem)  # before the files are read
        sched = memplan.load_schedule(schedule)
        prof = memplan.load_profile(profile)
        if sched.budget.shards is not None:  # one FSDP2 rank's plan: that rank's profile
            from memplan.profile.sharding import for_ranks

            prof = for_ranks(prof, sched.budget.shards, sched.budget.gradients)
        if gradients is not None:
            from memplan.api import with_gradients

            sched = with_gradients(prof, sched, check_gradients(gradients))
        budget = sched.budget.memory if given is None else memory_budget(prof, given)
        doc = _replayed(prof, sched, budget, mem, strict, trace)
        if sched.profile.sha256 and sched.profile.sha256 != prof.sha256():
            common.echo_err(
                f"memplan: warning: the schedule was made for a profile with sha256 "
                f"{sched.profile.sha256[:12]}..., this one has {prof.sha256()[:12]}..."
            )
        if form == "json":
            write_output(common.report_json(doc), None)  # NOTE [ report precision ]
        else:
            from memplan.cli.render import simulation_summary

            print_table(simulation_summary(doc))
        if doc["time_note"]:
            common.echo_err(f"memplan: note: {doc['time_note']}")
        if not _passed(doc):
            common.echo_err(f"memplan: invalid: {doc['violation']}")
            raise typer.Exit(EXIT_INFEASIBLE)


def _replayed(
    prof: Any, sched: Any, budget: int | None, typed: str | None, strict: bool, trace: Path | None
) -> dict[str, Any]:
    """The document of ``simulate``: the replay of ``sched`` on ``prof`` against ``budget``
    (``typed``: ``--mem`` as given, for messages), the trace written when asked.
    """
    import memplan

    if not sched.feasible:
        doc = _simulation_doc(sched, prof, budget, None, typed)
        doc["violation"] = "the schedule is marked infeasible (feasible: false): no plan to replay"
        doc["times_match"] = None
        return doc
    result = memplan.simulate(prof, sched, memory=budget)
    doc = _simulation_doc(sched, prof, budget, result, typed)
    if not _passed(doc):  # NOTE [ re-measured profiles ] (memplan/simulator/retime.py)
        result, doc = _with_schedule_times(prof, sched, budget, typed, strict, result, doc)
    if trace is not None:
        write_trace_file(trace, sched, prof, result.memory_curve)
    return doc


def _passed(doc: dict[str, Any]) -> bool:
    return bool(doc["valid"] and doc["fits"])


def _with_schedule_times(
    prof: Any,
    sched: Any,
    budget: int | None,
    typed: str | None,
    strict: bool,
    result: Any,
    doc: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """The verdict on a schedule the strict replay rejected, when the profile's times differ.

    The schedule is replayed against the profile timed as its own operations (NOTE [ re-measured
    profiles ] in memplan/simulator/retime.py): without ``strict``, that replay decides (exit 0
    when only the times differ), with ``strict`` the first replay does; either way the document
    says how the times differ (``times_match``, ``time_note``).
    """
    import memplan
    from memplan.simulator.retime import timed_as_schedule

    retimed = timed_as_schedule(prof, sched)
    if retimed is None:  # the schedule's own times contradict each other: no such profile
        doc["times_match"] = None
        return result, doc
    if not retimed.differences:
        return result, doc
    relaxed = memplan.simulate(retimed.profile, retimed.schedule, memory=budget)
    if not strict:
        result, doc = relaxed, _simulation_doc(sched, prof, budget, relaxed, typed)
    doc["times_match"] = False
    doc["time_note"] = _time_note(retimed, relaxed.valid and relaxed.fits, strict)
    return result, doc


def _time_note(retimed: Any, holds: bool, strict: bool) -> str:
    """One line: how the profile's times differ from the schedule's, and what that decided."""
    diffs = retimed.differences
    changes = [d.profile / d.schedule - 1.0 for d in diffs if d.schedule > 0]
    spread = f", from {min(changes):+.1%} to {max(changes):+.1%}" if changes else ""
    total = ""
    if retimed.schedule_ms > 0:
        total = f" ({retimed.profile_ms / retimed.schedule_ms - 1.0:+.1%})"
    which = f"{len(diffs)} of the {retimed.fields} stage times the schedule gives"
    if [d.where for d in diffs] == ["graph"]:
        which = "the time of the graph's nodes"
    line = (
        f"the profile's times differ from the schedule's in {which}{spread} (the same model "
        f"profiled again?); the plan's computations take {retimed.profile_ms:.3f} ms with the "
        f"profile's times, {retimed.schedule_ms:.3f} ms in the schedule{total}"
    )
    if strict:
        return line + "; --strict: a time that differs is a violation"
    if holds:
        return line + "; replayed with the schedule's times, it is valid and fits the budget"
    return line + "; replayed with the schedule's times, it still fails (below)"


def _simulation_doc(
    sched: Any, prof: Any, budget: int | None, result: Any, typed: str | None = None
) -> dict[str, Any]:
    """What ``simulate --format json`` prints (documented in docs/cli.md); sizes in messages in
    the units of ``--mem`` as typed (``typed``).
    """
    valid = bool(result is not None and result.valid)
    makespan = getattr(result, "makespan", None)
    peak = getattr(result, "peak_memory", None)
    violation = getattr(result, "violation", None)
    fits = valid and (budget is None or peak is None or peak <= budget)
    if valid and not fits and not violation:
        violation = (
            f"peak memory {size_text(peak, typed)} exceeds the budget {size_text(budget, typed)}"
        )
    if not valid and not violation:
        violation = "the replay rejected the schedule"
    return {
        "valid": valid,
        "fits": fits,
        "makespan": makespan,
        "peak_memory": peak,
        "budget": budget,
        "violation": None if (valid and fits) else violation,
        "violation_index": None if (valid and fits) else getattr(result, "violation_index", None),
        "static_memory": sched.static_memory if result is None else result.static_memory,
        "algorithm": sched.algorithm,
        "model": prof.model,
        "claimed_makespan": sched.makespan,
        "claimed_peak_memory": sched.peak_memory,
        "claimed_static_memory": sched.static_memory,
        "times_match": True,
        "time_note": None,
    }


def write_trace_file(path: Path, schedule: Any, prof: Any, curve: Any = None) -> None:
    """Write the trace of a schedule (the simulator's memory curve when ``curve`` is None)."""
    import memplan
    from memplan.views.trace import write_trace

    if curve is None:
        curve = memplan.simulate(prof, schedule, check_claims=False).memory_curve
    try:
        write_trace(path, schedule, prof, curve)
    except OSError as exc:
        raise InputError(f"--trace {path}: cannot write: {exc.strerror or exc}") from None
    common.echo_err(f"memplan: wrote {path}")
