"""``memplan info`` (what a profile holds, the memory it needs), ``memplan show`` (the profile
itself, as a file ``solve`` reads) and ``memplan algos``.
"""

import enum
import json
from pathlib import Path
from typing import Annotated

import typer

from memplan.cli.common import (
    err_console,
    guard,
    print_table,
    profile_source,
    report_json,
    resolve_format,
    rounded,
    write_output,
)
from memplan.cli.solve import OPTIMIZER_HELP, OPTIMIZER_METAVAR, OUTPUT_HELP, PROFILE_HELP


class InfoFormat(str, enum.Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


class ShowFormat(str, enum.Enum):
    yaml = "yaml"
    json = "json"


class AlgosFormat(str, enum.Enum):
    table = "table"
    json = "json"


def info(
    profile: Annotated[
        str | None, typer.Argument(metavar="PROFILE", help=PROFILE_HELP, show_default=False)
    ] = None,
    optimizer: Annotated[str, typer.Option(metavar=OPTIMIZER_METAVAR, help=OPTIMIZER_HELP)] = "sgd",
    fmt: Annotated[
        InfoFormat | None,
        typer.Option("--format", "-f", help="table (stderr), json or yaml.  [default: table]"),
    ] = None,
) -> None:
    """Show what a profile holds: stages, totals, store-all peak, least memory per family.

    Example: `memplan info resnet50 --optimizer adam`
    """
    from memplan.describe import describe

    with guard():
        desc = describe(profile_source(profile), optimizer)
        form = "table" if fmt is None else fmt.value
        if form == "json":  # floats rounded: NOTE [ report precision ] in common.py
            write_output(report_json(desc), None)
        elif form == "yaml":
            from memplan.documents.io import dump_yaml

            write_output(dump_yaml(rounded(desc)), None)
        else:
            from memplan.cli.render import info_tables

            print_table(info_tables(desc))


def show(
    profile: Annotated[
        str | None, typer.Argument(metavar="PROFILE", help=PROFILE_HELP, show_default=False)
    ] = None,
    fmt: Annotated[
        ShowFormat | None,
        typer.Option("--format", "-f", help="yaml or json.  [default: yaml, or -o FILE's suffix]"),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help=OUTPUT_HELP)
    ] = None,
) -> None:
    """Print a profile itself (a memplan-profile/1 document) as solve reads it: edit it, pipe it.

    Bundled profiles become files this way. The document is the profile as memplan validated it
    (the same sha256 as the original), YAML by default.

    Example: `memplan show resnet50@a100 > net.yaml`; `memplan show resnet50 | memplan solve
    --algo rotor --mem 1GB`
    """
    import memplan

    with guard():
        form = "yaml" if fmt is None and output is None else None
        if form is None:
            form = resolve_format(fmt, output, ("yaml", "json"))
        prof = memplan.load_profile(profile_source(profile))
        if form == "json":
            text = json.dumps(prof.to_dict(), indent=2)
        else:
            text = memplan.save_profile(prof)
        write_output(text, output)


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
    from memplan.api import algorithm_details, list_algorithms

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

            err_console().print(algos_table(entries))
