"""The ``memplan`` command line: a thin typer layer over :mod:`memplan.api`.

Each command module (``solve``, ``compare``, ``info``, ``profile``) parses options, calls the
library and renders the result; see NOTE [ CLI output and exit codes ] in ``common.py``. Importing
this module stays cheap: torch and matplotlib are imported only by the commands that need them.
"""

from typing import Annotated

import typer

from memplan.cli import common
from memplan.cli.alloc import alloc
from memplan.cli.compare import compare
from memplan.cli.info import algos, info
from memplan.cli.profile import profile
from memplan.cli.run import run
from memplan.cli.show import plot
from memplan.cli.solve import simulate, solve

app = typer.Typer(
    name="memplan",
    help=(
        "Plan GPU memory for DNN training: checkpointing schedules that provably fit a budget.\n\n"
        "Example: memplan profile resnet18 | memplan solve --algo rotor --mem 2GB"
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from memplan import __version__

        typer.echo(f"memplan {__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    debug: Annotated[
        bool,
        typer.Option("--debug", help="Show tracebacks (also MEMPLAN_DEBUG=1)."),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    common.state.debug = debug
    from memplan import files

    files.track_inputs()  # -o never replaces a file this command reads (NOTE [ safe writes ])
    ctx.call_on_close(files.stop_tracking)


app.command("profile")(profile)
app.command("solve")(solve)
app.command("simulate")(simulate)
app.command("compare")(compare)
app.command("info")(info)
app.command("algos")(algos)
app.command("plot")(plot)
app.command("run")(run)
app.command("alloc")(alloc)


def main() -> None:
    """Console-script entry point (``memplan = "memplan.cli.app:main"``)."""
    app(prog_name="memplan")


if __name__ == "__main__":  # pragma: no cover
    main()
