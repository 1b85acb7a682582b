"""``memplan info`` (what a profile holds, the memory it needs) and ``memplan show`` (the
profile itself, as a file ``solve`` reads); ``memplan algos`` is :mod:`memplan.cli.algos`.
"""

import enum
import json
from typing import Annotated

import typer

from memplan.cli.common import (
    guard,
    print_table,
    profile_source,
    report_json,
    resolve_format,
    rounded,
    write_output,
)
from memplan.cli.plan_options import DocumentOutputOption, OptimizerOption, ProfileArgument


class InfoFormat(str, enum.Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


class ShowFormat(str, enum.Enum):
    yaml = "yaml"
    json = "json"


def info(
    profile: ProfileArgument = None,
    optimizer: OptimizerOption = "sgd",
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
    profile: ProfileArgument = None,
    fmt: Annotated[
        ShowFormat | None,
        typer.Option("--format", "-f", help="yaml or json.  [default: yaml, or -o FILE's suffix]"),
    ] = None,
    output: DocumentOutputOption = None,
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
