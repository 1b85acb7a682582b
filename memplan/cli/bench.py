"""``memplan bench``: train a model every way there is to save memory, and measure each way."""

import csv
import enum
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memplan.cli.common import (
    echo_err,
    err_console,
    guard,
    print_table,
    resolve_format,
    write_output,
)
from memplan.cli.model_options import (
    LOSS_CHUNKS_HELP,
    TORCH_HINT,
    BatchSizeOption,
    ConfigOption,
    DeviceChoice,
    InputShapeOption,
    ModelArgument,
    ProfilerRepeatsOption,
    TrainingDeviceOption,
    TrainingOptimizerOption,
    check_counts,
    has_torch,
    parse_config_option,
    parse_shape,
)
from memplan.errors import InputError
from memplan.loop import parse_optimizer

if TYPE_CHECKING:
    from rich.console import JustifyMethod

CSV_FIELDS = (
    "name",
    "family",
    "setting",
    "peak",
    "peak_ratio",
    "time_ratio",
    "grads",
    "grad_error",
    "planned_peak",
    "budget",
    "skipped",
    "versus",
    "versus_time",
    "versus_peak",
)


class BenchFormat(str, enum.Enum):
    table = "table"
    json = "json"
    csv = "csv"


def _numbers(option: str, text: str | None, kind: type) -> list[Any] | None:
    """``2,4,8`` -> ``[2, 4, 8]``; ``none`` -> ``[]``; None -> None (the default)."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        example = "2,4,8" if kind is int else "0.2,0.5"
        raise InputError(
            f"{option} {text!r}: expected numbers separated by commas, e.g. {example}"
        ) from None
    if not values:
        raise InputError(f"{option} {text!r}: expected at least one number (or none)")
    return values


# The options of memplan bench (those of every command that builds a model: model_options.py).
ThreadsOption = Annotated[
    int,
    typer.Option(metavar="N", help="torch's intra-op threads (the profile's too)."),
]
RoundsOption = Annotated[
    int,
    typer.Option(
        metavar="N", help="Timed rounds: every way once per round, time as a ratio to plain."
    ),
]
SegmentsOption = Annotated[
    str | None,
    typer.Option(
        metavar="K,...",
        help="checkpoint_sequential segment counts (none: skip).  [default: 2, 4, about the "
        "square root of the stages, one per stage]",
    ),
]
CompileBudgetsOption = Annotated[
    str,
    typer.Option(
        "--compile-budgets",
        metavar="B,...",
        help="torch.compile's activation_memory_budget values (none: skip compiling).",
    ),
]
AlgosOption = Annotated[
    str,
    typer.Option(
        metavar="A,...",
        help="memplan's algorithms: store-all and rotor (at its least memory, and at each "
        "other way's measured peak).",
    ),
]
GivenProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-p",
        metavar="FILE",
        help="A profile of this model and batch instead of profiling it here.",
    ),
]
SelectiveOption = Annotated[
    bool,
    typer.Option(
        "--selective",
        help="Profile the stages' selective checkpointing options too and add rotor+sac: "
        'rotor choosing them (docs/model.md, "Options of a stage").',
    ),
]
LossChunksOption = Annotated[
    int | None,
    typer.Option(
        "--loss-chunks",
        metavar="N",
        help=LOSS_CHUNKS_HELP + " Adds memplan's plans installed by enable(..., "
        "loss_chunks=N); the hand-written chunked loss alternative takes N chunks too "
        "(8 without).",
    ),
]
FormatOption = Annotated[
    BenchFormat | None,
    typer.Option("--format", "-f", help="table (stderr), json or csv.  [default: table]"),
]
OutputOption = Annotated[
    Path | None,
    typer.Option("--output", "-o", metavar="FILE", help="Write the json or csv to FILE."),
]


def bench(
    model: ModelArgument,
    batch_size: BatchSizeOption = None,
    input_shape: InputShapeOption = None,
    config: ConfigOption = None,
    device: TrainingDeviceOption = DeviceChoice.auto,
    threads: ThreadsOption = 1,
    rounds: RoundsOption = 5,
    segments: SegmentsOption = None,
    compile_budgets: CompileBudgetsOption = "0.2",
    algos: AlgosOption = "store-all,rotor",
    profile: GivenProfileOption = None,
    repeats: ProfilerRepeatsOption = 3,
    optimizer: TrainingOptimizerOption = "sgd",
    selective: SelectiveOption = False,
    loss_chunks: LossChunksOption = None,
    fmt: FormatOption = None,
    output: OutputOption = None,
) -> None:
    """Train MODEL every way: plainly, with Hugging Face checkpointing (with the model's loss or
    a loss in chunks of tokens), checkpoint_sequential, torch.compile's memory budget and
    memplan's plans (installed by memplan.torch.enable); measure each.

    For each way: the measured peak of a training step (the allocator's own count), the step
    time as a ratio to plain training's in the same round (median over --rounds), and whether
    the gradients equal plain training's; for each memplan plan, its time and peak against the
    alternative at equal memory (at an alternative's peak: that one; else the fastest that fits
    in the plan's measured peak). Example:
    `memplan bench hf:gpt2 --config n_layer=4,n_embd=256,n_head=4 -b 4 --input-shape 256`
    """
    with guard():
        form = resolve_format(fmt, output, ("table", "json", "csv"))
        check_counts(
            ("--batch-size", batch_size),
            ("--threads", threads),
            ("--rounds", rounds),
            ("--repeats", repeats),
            ("--loss-chunks", loss_chunks),
        )
        shape = None if input_shape is None else parse_shape(input_shape)
        config_values = parse_config_option(model, config)
        ks = _numbers("--segments", segments, int)
        budgets = _compile_budgets(compile_budgets)
        names = _bench_algos(algos)
        parse_optimizer(optimizer)  # a bad name fails before the model is built
        if not has_torch():
            raise InputError(f"memplan bench {TORCH_HINT}")
        from memplan.torch.compare.training import compare_training

        console = err_console()

        def note(line: str) -> None:
            echo_err(f"memplan: {line}")

        result = compare_training(
            model, batch_size=batch_size, input_shape=shape, config=config_values,
            device=device.value, threads=threads, rounds=rounds, segments=ks,
            compile_budgets=budgets, algos=names, profile=profile, repeats=repeats,
            optimizer=optimizer, progress=note, selective=selective,
            loss_chunks=loss_chunks,
        )  # fmt: skip
        doc = result.to_dict()
        if form == "json":
            write_output(json.dumps(doc, indent=2), output)
        elif form == "csv":
            write_output(rows_to_csv(doc["rows"]), output)
        else:
            print_table(bench_table(doc), console)


def _compile_budgets(text: str) -> list[float]:
    """``--compile-budgets 0.2,0.5``: fractions from 0 to 1 (``none``: no compiling)."""
    budgets = _numbers("--compile-budgets", text, float) or []
    for b in budgets:
        if not 0.0 <= b <= 1.0:
            raise InputError(f"--compile-budgets {b:g}: expected fractions from 0 to 1")
    return budgets


def _bench_algos(text: str) -> list[str]:
    """``--algos store-all,rotor``: the algorithms whose plans ``bench`` measures."""
    from memplan.algorithms import REGISTRY

    names = [a.strip() for a in text.split(",") if a.strip()]
    for name in names:
        if name not in ("store-all", "rotor"):
            known = "" if name in REGISTRY else " (unknown algorithm)"
            raise InputError(
                f"--algos {name!r}{known}: memplan bench runs store-all and rotor plans"
            )
    return names


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.1f}"


def _chunks_note(doc: dict[str, Any]) -> str:
    chunks = doc.get("loss_chunks")
    if not chunks:
        return ""
    return f"; loss_chunks={chunks}: enable's plans with the head and loss in {chunks} chunks"


def _versus(row: dict[str, Any]) -> str:
    """``hf checkpointing: time 0.95, peak 0.99`` (a memplan row against its alternative)."""
    if row.get("versus") is None or row.get("versus_time") is None:
        return ""
    return f"{row['versus']}: time {row['versus_time']:.2f}, peak {row['versus_peak']:.3f}"


def bench_table(doc: dict[str, Any]) -> Any:
    """The rich table of a ``memplan-bench/1`` document."""
    from rich.table import Table

    shape = "x".join(str(d) for d in doc["input_shape"])
    table = Table(
        title=f"{doc['model']}, batch {doc['batch_size']} x {shape}, {doc['device']}, "
        f"{doc['threads']} thread(s), time: median of {doc['rounds']} paired rounds"
        + _chunks_note(doc)
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("way", "left"),
        ("peak MB", "right"),
        ("/ plain", "right"),
        ("time / plain", "right"),
        ("gradients", "left"),
        ("planned MB", "right"),
        ("vs alternative at equal memory", "left"),
        ("note", "left"),
    )
    for column, justify in columns:
        wraps = ("way", "note", "vs alternative at equal memory")
        table.add_column(column, justify=justify, no_wrap=column not in wraps)
    for row in doc["rows"]:
        ratio = "-" if row["peak_ratio"] is None else f"{row['peak_ratio']:.3f}"
        time_ratio = "-" if row["time_ratio"] is None else f"{row['time_ratio']:.2f}"
        grads = row["grads"]
        if grads == "close" and row["grad_error"] is not None:
            grads = f"close ({row['grad_error']:.1e})"
        note = row["skipped"] or ""
        if row["budget"] is not None and row["family"] == "memplan" and not row["skipped"]:
            note = f"budget {_mb(row['budget'])} MB"
            if row["setting"] == "no recomputation":
                note += " (its own need)"
        table.add_row(
            row["name"], _mb(row["peak"]), ratio, time_ratio,
            grads if row["peak"] is not None else "-", _mb(row["planned_peak"]), _versus(row),
            note,
        )  # fmt: skip
    return table


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    """One line per way; empty cells where there is nothing; ratios to 4 digits."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for row in rows:
        cells = []
        for key in CSV_FIELDS:
            value = row.get(key)
            if isinstance(value, float):
                value = f"{value:.4g}"
            cells.append("" if value is None else value)
        writer.writerow(cells)
    return buffer.getvalue()
