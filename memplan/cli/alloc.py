"""``memplan alloc``: place a MiniMalloc buffer list (CSV) in memory, or validate a placement."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from memplan.cli.common import (
    EXIT_INFEASIBLE,
    echo_err,
    guard,
    option_size,
    stdin_is_terminal,
    write_output,
)
from memplan.errors import InputError

EXAMPLE = "memplan alloc buffers.csv --capacity 1MiB -o placed.csv"


def alloc(
    buffers: Annotated[
        str | None,
        typer.Argument(
            metavar="BUFFERS.csv",
            help="CSV with header id,lower,upper,size (lifetimes [lower, upper)); '-' for stdin.",
            show_default=False,
        ),
    ] = None,
    capacity: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="Memory to place the buffers in: 1048576, 1MiB, 8GB.  [default: none: "
            "find the least arena]",
        ),
    ] = None,
    time_limit: Annotated[
        float | None,
        typer.Option(
            "--time-limit", metavar="SECONDS", help="Time limit of the search.  [default: 60]"
        ),
    ] = None,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate", help="Check the offsets of an already placed CSV instead of placing."
        ),
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write the CSV here (atomically)."),
    ] = None,
) -> None:
    """Place buffers in memory: give each an offset so that buffers live at the same time never
    overlap (exact search after MiniMalloc, Moffitt, ASPLOS 2023).

    Writes the CSV with an `offset` column to stdout or `-o FILE`; a one-line summary goes to
    stderr, after a line every few seconds on a long run (the best arena so far). Exit 0 placed (or valid), 1 no placement fits the capacity (proven, or not found in
    the time limit: the message says which, with the peak live load) or the placement is invalid,
    2 bad input.

    Example: `memplan alloc buffers.csv --capacity 1MiB -o placed.csv`
    """
    _one_blas_thread()
    from memplan.alloc import check_placement, format_buffers_csv, place, read_buffers_csv
    from memplan.units import check_time_limit

    with guard():
        cap = _capacity(capacity)
        check_time_limit(time_limit, "--time-limit")  # finite, above 0, at most a week
        if buffers is None:
            if stdin_is_terminal():
                raise InputError(f"missing BUFFERS.csv: give a file or '-', e.g. {EXAMPLE}")
            buffers = "-"
        table = read_buffers_csv(buffers, need_offsets=validate)
        bufs = table.buffers
        if validate:
            if output is not None:
                raise InputError("-o: --validate writes nothing; leave -o out")
            assert bufs.offset is not None
            check = check_placement(bufs.lower, bufs.upper, bufs.size, bufs.offset, cap, bufs.ids)
            if not check.valid:
                echo_err(f"memplan: invalid placement: {check.violation}")
                raise typer.Exit(EXIT_INFEASIBLE)
            within = f" within the capacity {cap}" if cap is not None else ""
            echo_err(
                f"memplan: valid placement of {len(bufs)} buffers{within}: arena {check.arena} "
                f"(peak live load {bufs.peak_live_load()})"
            )
            return
        limit = 60.0 if time_limit is None else time_limit
        result = place(bufs, capacity=cap, time_limit=limit, on_progress=_progress_lines())
        if result.offsets is None:
            word = "infeasible" if result.status == "infeasible" else "gave up"
            echo_err(f"memplan: {word}: {result.message}")
            raise typer.Exit(EXIT_INFEASIBLE)
        write_output(format_buffers_csv(table, result.offsets), output)
        target = f"capacity {cap}" if cap is not None else "no capacity"
        proof = {
            "optimal": "least possible",
            "placed": "fits" if cap is not None else "not proven least",
        }[result.status]
        echo_err(
            f"memplan: placed {len(bufs)} buffers: arena {result.arena} ({proof}; {target}; "
            f"peak live load {result.peak}) in {result.seconds:.2f} s"
        )


PROGRESS_EVERY = 2.0
"""Seconds between two progress lines at least (the best arena so far, on stderr): a run shorter
than that prints none."""


def _progress_lines() -> Callable[[str], None]:
    """What :func:`memplan.alloc.place` says about its progress, as ``memplan: alloc: ...``
    lines on stderr, at most one every ``PROGRESS_EVERY`` seconds.
    """
    last = time.monotonic()

    def say(message: str) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY:
            last = now
            echo_err(f"memplan: alloc: {message}")

    return say


def _one_blas_thread() -> None:
    """Numpy's OpenBLAS starts a thread per core when numpy is imported (0.05-0.1 s of CPU on 2
    cores) and placing buffers never calls BLAS: one thread, unless the user chose otherwise or
    numpy is imported already.
    """
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _capacity(text: str | None) -> int | None:
    """``--capacity`` in whole bytes, exactly: ``1MiB``, ``1048576``, ``1.5KiB`` (1536); a
    fractional byte count (``1.5``, ``0.1KB``) is refused, not rounded.
    """
    from memplan.units import exact_bytes

    size = option_size("--capacity", text)  # the format, the unit, the range
    if text is None or size is None:
        return None
    exact = exact_bytes(text)
    if exact != exact.to_integral_value():
        raise InputError(
            f"--capacity {text}: expected a whole number of bytes, got {exact.normalize()} bytes"
        )
    return int(exact)
