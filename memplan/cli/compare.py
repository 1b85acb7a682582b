"""``memplan compare``: sweep algorithms over a range of budgets; table, CSV, JSON and a plot.

The table says what it compares: its header names the accounting every family plans in (the
optimizer and its static memory, the training loop of ``--gradients``: docs/model.md), a line
under it each family's least memory in that accounting. A sweep in which no plan fits any budget
says so and names the least memory, and exits 1 (infeasible, as ``solve``), after writing the
CSV or JSON document as usual.
"""

import csv
import enum
import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memplan.cli.common import (
    EXIT_INFEASIBLE,
    csv_number,
    echo_err,
    guard,
    print_table,
    profile_source,
    report_json,
    resolve_format,
    size_text,
    write_output,
)
from memplan.cli.options import family_options
from memplan.cli.plan_options import (
    DocumentOutputOption,
    GradientsOption,
    OptimizerOption,
    ProfileArgument,
)
from memplan.errors import InputError

if TYPE_CHECKING:
    from memplan.api import CompareRow

DEFAULT_ALGOS = "store-all,periodic,revolve,rotor"
CSV_FIELDS = ("memory", "algorithm", "feasible", "makespan", "ratio", "peak_memory", "seconds")
SWEEP_LINE_SECONDS = 10.0
"""Off a terminal, a long sweep writes a progress line on stderr at most this often."""


class CompareFormat(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"


# The options of memplan compare (those of every command that reads a profile: plan_options.py).
AlgosOption = Annotated[
    str, typer.Option("--algos", metavar="A,B,...", help="Comma-separated algorithm names.")
]
BudgetRangeOption = Annotated[
    str | None,
    typer.Option(
        "--mem",
        "-m",
        metavar="START:STOP[:STEPS]",
        help="Budgets, evenly spaced (STEPS default 10): 2GB:8GB:13; auto[:STEPS] goes from "
        "the least memory of the algorithms to the store-all need (M_peak).  [required]",
    ),
]
FormatOption = Annotated[
    CompareFormat | None,
    typer.Option("--format", "-f", help="table (stderr), csv or json.  [default: table]"),
]
PlotOption = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE", help="Also draw makespan / lower bound vs budget (.png, .svg, .pdf)."
    ),
]


@family_options("compare")
def compare(
    profile: ProfileArgument = None,
    algos: AlgosOption = DEFAULT_ALGOS,
    mem: BudgetRangeOption = None,
    family_options: dict[str, Any] | None = None,
    optimizer: OptimizerOption = "sgd",
    gradients: GradientsOption = "auto",
    fmt: FormatOption = None,
    output: DocumentOutputOption = None,
    plot: PlotOption = None,
) -> None:
    """Compare algorithms over a range of memory budgets (makespan / lower bound).

    Example: `memplan compare resnet50 --mem 1GB:8GB:15 --plot sweep.png`
    """
    import memplan
    from memplan.algorithms import family_of, options_for, parsed_option
    from memplan.api import budgets_from_range

    with guard():
        form = resolve_format(fmt, output, ("table", "csv", "json"))
        if mem is None:
            raise InputError("--mem: a budget range is required, e.g. --mem 2GB:8GB:10")
        names = _algorithm_names(algos)
        auto_steps = _auto_steps(mem)
        budgets = [] if auto_steps is not None else budgets_from_range(mem)
        options = family_options or {}
        for name in names:  # bad options fail before the profile is read and the sweep starts
            options_for(name, options)
        rate = parsed_option("bandwidth", options.get("bandwidth"))
        if plot is not None:
            from memplan.cli.plot import check_plot_target

            check_plot_target(plot)  # before the sweep: fail fast without matplotlib
        prof = memplan.load_profile(profile_source(profile))
        offloading = [n for n in names if _takes(family_of(n), "bandwidth")]
        if offloading:  # one clear line before the sweep when no bandwidth is known
            from memplan.algorithms.options import resolve_bandwidth

            rate = resolve_bandwidth(prof, offloading[0], rate)
        sweep = _Accounting.of(prof, names, optimizer, gradients)
        if auto_steps is not None:
            from memplan.api import auto_budgets

            budgets = auto_budgets(prof, names, auto_steps, optimizer, gradients)
        rows = _sweep(
            memplan.compare,
            prof,
            names,
            budgets,
            optimizer=optimizer,
            gradients=gradients,
            **options,
        )
        if form == "table":
            _print_table(prof, rows, names, budgets, sweep, rate)
        elif form == "csv":
            write_output(rows_to_csv(rows), output)
        else:
            doc = {
                "format": "memplan-compare/1",
                "profile": {"model": prof.model, "sha256": prof.sha256(), "stages": prof.length},
                "lower_bound": prof.lower_bound,
                "optimizer": optimizer,
                "gradients": gradients,
                "accounting": sweep.to_dict(),
                "least_memory": sweep.least,
                "slots": options.get("slots", "auto"),
                "bandwidth": rate,
                "algorithms": names,
                "budgets": budgets,
                "rows": [row.to_dict() for row in rows],
            }
            write_output(report_json(doc), output)  # NOTE [ report precision ]
        feasible = any(row.feasible for row in rows)
        if plot is not None and feasible:
            _plot(plot, prof, rows, names, rate if offloading else None)
        if not feasible:
            echo_err(sweep.nothing_fits(budgets))
            raise typer.Exit(EXIT_INFEASIBLE)


def _algorithm_names(algos: str) -> list[str]:
    """``--algos rotor,pofo``: the names, at least one, none twice."""
    names = [a.strip() for a in algos.split(",") if a.strip()]
    if not names:
        raise InputError(f"--algos {algos!r}: expected algorithm names, e.g. {DEFAULT_ALGOS}")
    if len(set(names)) != len(names):
        raise InputError(f"--algos {algos!r}: an algorithm is listed twice")
    return names


def _print_table(
    prof: Any,
    rows: list["CompareRow"],
    names: list[str],
    budgets: list[int],
    sweep: "_Accounting",
    rate: Any,
) -> None:
    """The sweep's table on stderr, titled with what it compares, the least memories under it
    (``rate``: the bandwidth the offloading algorithms plan with, bytes/s).
    """
    from rich.console import Group
    from rich.text import Text

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
    table = compare_table(rows, names, budgets, f"{title}\n{sweep.header()}")
    print_table(Group(table, Text(sweep.least_line(), style="dim")))


def _plot(
    plot: Path, prof: Any, rows: list["CompareRow"], names: list[str], rate: float | None
) -> None:
    """``--plot FILE``: makespan / lower bound against the budget (with the bandwidth of the
    offloading algorithms, ``rate``, in the title).
    """
    from memplan.cli.plot import plot_sweep

    title = _plot_title(prof)
    if rate is not None:
        from memplan.units import format_size

        title += f", {format_size(rate)}/s"
    plot_sweep(plot, rows, names, title=title)
    echo_err(f"memplan: wrote {plot}")


class _Accounting:
    """What a sweep compares: the optimizer, the training loop, the static memory and each
    family's least memory in that accounting (docs/model.md), for the header and the line under
    the table.
    """

    def __init__(
        self,
        optimizer: str,
        loop: str | None,
        static: int,
        least: dict[str, int],
        graph: bool = False,
    ) -> None:
        self.optimizer = optimizer
        self.loop = loop
        self.static = static
        self.least = least
        self.graph = graph

    @classmethod
    def of(cls, prof: Any, names: list[str], optimizer: str, gradients: str) -> "_Accounting":
        """The accounting of sweeping ``names`` on ``prof``."""
        from memplan.algorithms import family_of
        from memplan.algorithms.timeline import static_memory
        from memplan.describe import describe
        from memplan.loop import parse_optimizer
        from memplan.profile.memory import loop_on

        families = [family_of(n) for n in names]
        looped = any(f.loop_terms for f in families) and prof.kind != "graph"
        chosen = parse_optimizer(optimizer)
        loop = loop_on(prof, chosen, gradients, terms=looped)
        desc = describe(prof, chosen, gradients)
        found = desc.get("min_memory", {})
        least = {f.name: int(found[f.name]) for f in families if f.name in found}
        static = static_memory(prof, loop)
        return cls(chosen.text, loop.gradients, static, least, graph=prof.kind == "graph")

    def header(self) -> str:
        """``static memory 102.44 MB (optimizer sgd: weights); --gradients at-backward: ...``."""
        from memplan.units import format_size

        if self.graph:  # a graph holds its own weights, gradients and state (docs/graph.md)
            return f"static memory {format_size(self.static)} (the graph's weight tensors)"
        table = {
            "none": "none: the budgets are for activations alone",
            "sgd": "sgd: weights",
            "momentum": "momentum: weights, one momentum buffer",
            "adam": "adam: weights, two moment buffers",
            "adamw": "adamw: weights, two moment buffers",
        }
        name, _, step = self.optimizer.partition(":")
        held = table.get(name, name) + (f", its {step} step after the backward" if step else "")
        if self.optimizer != "none" and self.loop not in ("at-backward", "step-in-backward"):
            held += ", their gradients"
        line = f"static memory {format_size(self.static)} (optimizer {held})"
        if self.loop is None:
            return line
        how = {
            "at-backward": "each stage's weight gradients from its backward on",
            "step-in-backward": "each stage's weight gradients stepped and freed in its backward",
        }.get(self.loop, "weight gradients static for the whole step")
        return f"{line}; --gradients {self.loop}: {how}"

    def least_line(self) -> str:
        """``least memory: chain 211.2 MB, offload 239.5 MB, combined 211.2 MB``."""
        from memplan.units import format_size

        if not self.least:
            return "least memory: not known for these families"
        found = ", ".join(f"{f} {format_size(m)}" for f, m in self.least.items())
        return f"least memory (the same accounting): {found}"

    def nothing_fits(self, budgets: list[int]) -> str:
        """The line of a sweep in which no plan fits any budget."""
        span = f"{size_text(min(budgets))} to {size_text(max(budgets))}" if budgets else "-"
        line = f"memplan: infeasible: no plan fits any budget of the sweep ({span})"
        if self.least:
            family, least = min(self.least.items(), key=lambda item: item[1])
            line += f"; the least memory that fits is {size_text(least)} ({family} family)"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "gradients": self.loop, "static_memory": self.static}


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


def _takes(family: Any, option: str) -> bool:
    """Whether a family declares ``option`` (the offloading and combined ones: ``bandwidth``)."""
    from memplan.algorithms.options import declared

    return any(spec.name == option for spec in declared(family.options))


def _offload_title(prof: Any, rate: float) -> str:
    from memplan.units import format_size

    what = f"LB of Proposition 3 at each budget, {format_size(rate)}/s"
    return f"{prof.model}: makespan / lower bound ({what})"


def _plot_title(prof: Any) -> str:
    title = str(prof.model)
    if prof.batch_size:
        title += f", batch size {prof.batch_size}"
    if prof.input_shape:
        title += f", input {'x'.join(str(d) for d in prof.input_shape)}"
    return title


def _sweep(
    compare_fn: Callable[..., "list[CompareRow]"],
    prof: Any,
    names: list[str],
    budgets: list[int],
    **kwargs: Any,
) -> "list[CompareRow]":
    """Run the library's sweep with a bar on a terminal, a line every 10 s otherwise."""
    from memplan.cli.progress import Progress

    with Progress("comparing", every=SWEEP_LINE_SECONDS) as progress:

        def on_progress(done: int, total: int) -> None:
            progress.update(done, total, "plans")

        return compare_fn(prof, names, budgets, on_progress=on_progress, **kwargs)


def rows_to_csv(rows: list[Any]) -> str:
    """Long format: one line per (budget, algorithm); empty cells where there is no plan."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for row in rows:
        data = row.to_dict()
        writer.writerow([_csv_cell(data.get(k)) for k in CSV_FIELDS])
    return buffer.getvalue()


def _csv_cell(value: Any) -> Any:
    """A CSV cell: empty for None, ``true``/``false`` for booleans (as JSON writes them), floats
    to the report's precision (NOTE [ report precision ] in common.py).
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return csv_number(value)
    return value
