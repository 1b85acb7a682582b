"""``memplan algos``: every algorithm, one line each, or one algorithm's details and options.

It reads the registry (:mod:`memplan.algorithms`: each family's declaration) and nothing else of
memplan's: no solver, no profile model, neither numpy nor pydantic, so that it answers in a tenth
of a second (tests/cli/test_startup.py keeps it so; the figures are in docs/benchmarks.md).
"""

from __future__ import annotations

import enum
import json
from typing import Annotated

import typer

from memplan.cli.common import guard, print_table, write_output


class AlgosFormat(str, enum.Enum):
    table = "table"
    json = "json"


def algos(
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="[NAME]", help="One algorithm: its details and options.", show_default=False
        ),
    ] = None,
    fmt: Annotated[
        AlgosFormat | None,
        typer.Option("--format", "-f", help="table (stderr) or json.  [default: table]"),
    ] = None,
) -> None:
    """List every algorithm (one line each), or show one: what it needs, its options.

    Example: `memplan algos rotor`
    """
    from memplan.algorithms import algorithm_details, list_algorithms

    with guard():
        json_out = fmt is not None and fmt.value == "json"
        if name is not None:
            details = algorithm_details(name)
            if json_out:
                write_output(json.dumps(details, indent=2), None)
            else:
                from memplan.cli.render import algorithm_tables

                print_table(algorithm_tables(details))
            return
        entries = list_algorithms()
        if json_out:
            write_output(json.dumps(entries, indent=2), None)
        else:
            from memplan.cli.render import algos_table

            print_table(algos_table(entries))
