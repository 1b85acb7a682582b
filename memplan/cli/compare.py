"""``memplan compare``: sweep algorithms over a range of budgets; table, CSV, JSON and a plot."""

import csv
import enum
import io
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from memplan.cli import common
from memplan.cli.common import (
    echo_err,
    err_console,
    guard,
    option_rate,
    profile_source,
    resolve_format,
    write_output,
)
from memplan.cli.solve import OPTIMIZER_HELP, OUTPUT_HELP, PROFILE_HELP, Optimizer
from memplan.errors import InputError

DEFAULT_ALGOS = "store-all,periodic,revolve,rotor"
CSV_FIELDS = ("memory", "algorithm", "feasible", "makespan", "ratio", "peak_memory", "seconds")


class CompareFormat(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"


def compare(
    profile: Annotated[
        str | None, typer.Argument(metavar="PROFILE", help=PROFILE_HELP, show_default=False)
    ] = None,
    algos: Annotated[
        str, typer.Option("--algos", metavar="A,B,...", help="Comma-separated algorithm names.")
    ] = DEFAULT_ALGOS,
    mem: Annotated[
        str | None,
        typer.Option(
            "--mem",
            "-m",
            metavar="START:STOP[:STEPS]",
            help="Budgets, evenly spaced (STEPS default 10): 2GB:8GB:13; auto[:STEPS] goes from "
            "the least memory of the algorithms to the store-all need (M_peak).  [required]",
        ),
    ] = None,
    bandwidth: Annotated[
        str | None, typer.Option(metavar="RATE", help="Host<->device bandwidth: 12.2GB/s.")
    ] = None,
    slots: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Memory discretization of DP algorithms.  [default: 500; dynprog, pofo: auto]",
        ),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(metavar="N", help="Number of GPUs (pipeline family; --mem is per GPU)."),
    ] = None,
    link_bandwidth: Annotated[
        str | None,
        typer.Option(
            "--link-bandwidth", metavar="RATE", help="GPU-to-GPU link bandwidth (pipeline family)."
        ),
    ] = None,
    time_limit: Annotated[
        float | None,
        typer.Option("--time-limit", metavar="SECONDS", help="Time limit of each CP-SAT solve."),
    ] = None,
    optimizer: Annotated[Optimizer, typer.Option(help=OPTIMIZER_HELP)] = Optimizer.sgd,
    fmt: Annotated[
        CompareFormat | None,
        typer.Option("--format", "-f", help="table (stderr), csv or json.  [default: table]"),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help=OUTPUT_HELP)
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help="Also draw makespan / lower bound vs budget (.png, .svg, .pdf)."
        ),
    ] = None,
) -> None:
    """Compare algorithms over a range of memory budgets (makespan / lower bound).

    Example: `memplan compare resnet50 --mem 1GB:8GB:15 --plot sweep.png`
    """
    import memplan
    from memplan.api import DEFAULT_SLOTS, budgets_from_range

    with guard():
        form = resolve_format(fmt, output, ("table", "csv", "json"))
        if mem is None:
            raise InputError("--mem: a budget range is required, e.g. --mem 2GB:8GB:10")
        names = [a.strip() for a in algos.split(",") if a.strip()]
        if not names:
            raise InputError(f"--algos {algos!r}: expected algorithm names, e.g. {DEFAULT_ALGOS}")
        if len(set(names)) != len(names):
            raise InputError(f"--algos {algos!r}: an algorithm is listed twice")
        auto_steps = _auto_steps(mem)
        budgets = [] if auto_steps is not None else budgets_from_range(mem)
        rate = option_rate("--bandwidth", bandwidth)
        link_rate = option_rate("--link-bandwidth", link_bandwidth)
        common.check_positive("--gpus", gpus)
        common.check_positive("--time-limit", time_limit)
        if plot is not None:
            from memplan.cli.plot import check_plot_target

            check_plot_target(plot)  # before the sweep: fail fast without matplotlib
        prof = memplan.load_profile(profile_source(profile))
        offloading = [n for n in names if _family(n) in ("offload", "combined")]
        if offloading:  # one clear line before the sweep when no bandwidth is known
            from memplan.api import resolve_bandwidth

            rate = resolve_bandwidth(prof, offloading[0], rate)
        if auto_steps is not None:
            from memplan.api import auto_budgets

            budgets = auto_budgets(prof, names, auto_steps, optimizer.value)
        rows = _sweep(
            memplan.compare,
            prof,
            names,
            budgets,
            slots=slots,
            optimizer=optimizer.value,
            bandwidth=rate,
            gpus=gpus,
            link_bandwidth=link_rate,
            time_limit=time_limit,
        )
        if form == "table":
            from memplan.cli.render import compare_table

            title = f"{prof.model}: makespan / lower bound ({prof.lower_bound:.3f} ms)"
            families = {_family(n) for n in names}
            if families == {"offload"}:
                title = _offload_title(prof, rate)
            elif len(families) > 1:
                title = (
                    f"{prof.model}: makespan / compute lower bound ({prof.lower_bound:.3f} ms, "
                    "the same for every family)"
                )
            err_console().print(compare_table(rows, names, budgets, title))
        elif form == "csv":
            write_output(rows_to_csv(rows), output)
        else:
            doc = {
                "format": "memplan-compare/1",
                "profile": {"model": prof.model, "sha256": prof.sha256(), "stages": prof.length},
                "lower_bound": prof.lower_bound,
                "optimizer": optimizer.value,
                "slots": DEFAULT_SLOTS if slots is None else slots,
                "bandwidth": rate,
                "algorithms": names,
                "budgets": budgets,
                "rows": [row.to_dict() for row in rows],
            }
            write_output(json.dumps(doc, indent=2), output)
        if plot is not None:
            from memplan.cli.plot import plot_sweep

            title = _plot_title(prof)
            if offloading:
                from memplan.units import format_size

                title += f", {format_size(rate)}/s"
            plot_sweep(plot, rows, names, title=title)
            echo_err(f"memplan: wrote {plot}")


def _auto_steps(mem: str) -> int | None:
    """STEPS of ``--mem auto[:STEPS]`` (default 10), or None for a START:STOP range."""
    head, _, tail = mem.partition(":")
    if head.strip().lower() != "auto":
        return None
    try:
        return int(tail) if tail else 10
    except ValueError:
        raise InputError(f"--mem {mem!r}: STEPS must be an integer, e.g. auto:20") from None


def _family(name: str) -> str | None:
    from memplan.algorithms import REGISTRY

    info = REGISTRY.get(name)
    return None if info is None else info.family


def _offload_title(prof: Any, rate: float) -> str:
    from memplan.units import format_size

    what = f"LB of Proposition 3 at each budget, {format_size(rate)}/s"
    return f"{prof.model}: makespan / lower bound ({what})"


def _plot_title(prof: Any) -> str:
    title = prof.model
    if prof.batch_size:
        title += f", batch size {prof.batch_size}"
    if prof.input_shape:
        title += f", input {'x'.join(str(d) for d in prof.input_shape)}"
    return title


def _sweep(compare_fn: Any, prof: Any, names: list[str], budgets: list[int], **kwargs: Any):
    """Run the library's sweep with a progress bar on stderr (only on a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = err_console()
    progress = Progress(
        TextColumn("comparing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    with progress:
        task = progress.add_task("compare", total=len(names) * len(budgets))

        def on_progress(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return compare_fn(prof, names, budgets, on_progress=on_progress, **kwargs)


def rows_to_csv(rows: list[Any]) -> str:
    """Long format: one line per (budget, algorithm); empty cells where there is no plan."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for row in rows:
        data = row.to_dict()
        writer.writerow(["" if data.get(k) is None else data.get(k) for k in CSV_FIELDS])
    return buffer.getvalue()
