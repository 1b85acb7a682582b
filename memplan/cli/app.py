"""The ``memplan`` command line: a thin typer layer over :mod:`memplan.api`.

Each command module (``solve``, ``compare``, ``info``, ``profile``) parses options, calls the
library and renders the result; see NOTE [ CLI output and exit codes ] in ``common.py``.

NOTE [ lazy commands ]
A command's module is imported only when that command runs (or when ``memplan --help`` lists
them all): :data:`COMMANDS` names where each one lives, and :class:`LazyGroup` builds the click
command on first use. So ``memplan --version`` imports typer and nothing of memplan's,
``memplan algos`` the registry and no solver (neither numpy nor pydantic: NOTE [ plain
parameters ] below), and ``memplan solve`` neither torch, matplotlib nor ``memplan compare``'s
sweep machinery (tests/cli/test_startup.py; the start-up figures are in docs/benchmarks.md).
"""

from __future__ import annotations

import difflib
import enum
import functools
import importlib
import re
from collections.abc import Iterator, MutableMapping
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

COMMANDS: dict[str, str] = {
    "profile": "memplan.cli.profile:profile",
    "solve": "memplan.cli.solve:solve",
    "simulate": "memplan.cli.solve:simulate",
    "compare": "memplan.cli.compare:compare",
    "info": "memplan.cli.info:info",
    "show": "memplan.cli.info:show",
    "algos": "memplan.cli.algos:algos",
    "plot": "memplan.cli.show:plot",
    "run": "memplan.cli.run:run",
    "bench": "memplan.cli.bench:bench",
    "alloc": "memplan.cli.alloc:alloc",
}
"""Every command, in the order ``memplan --help`` lists them: ``module:function``."""

SIZE_OPTIONS = ("--mem", "-m", "--capacity", "--bandwidth", "--link-bandwidth")
"""Options whose value is a size or a rate: ``--mem 8 GB`` is refused with ``write 8GB``."""
_NUMBER = re.compile(r"[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?")
_UNIT = re.compile(r"(?i)(?:[kmgtp]i?)?b(?:/s)?|[kmgtp]|bytes?(?:/s)?")
_NOT_ONE_OF = re.compile(r"^(?:Value error, )?(?P<value>'.*') is not one of (?P<choices>.*?)\.?$")


def split_size_error(args: list[str]) -> str | None:
    """The message for a size written with a space (``--mem 8 GB``), or None when there is none."""
    for i, token in enumerate(args):
        if token == "--":
            return None
        option, eq, value = token.partition("=")
        if option not in SIZE_OPTIONS:
            continue
        if eq:
            rest = args[i + 1 : i + 2]
        else:
            value, rest = (args[i + 1], args[i + 2 : i + 3]) if i + 1 < len(args) else ("", [])
        if rest and _NUMBER.fullmatch(value) and _UNIT.fullmatch(rest[0]):
            return (
                f"{option} '{value} {rest[0]}': write {value}{rest[0]} "
                "(no space between the number and its unit)"
            )
    return None


class MemplanCommand(TyperCommand):
    """A typer command with memplan's messages for two usage mistakes.

    ``--mem 8 GB`` (a size split in two words) is one line ``write 8GB`` instead of typer's
    "unexpected extra argument (GB)"; a value outside an option's choices (``--optimizer adamw``)
    loses pydantic's "Value error," prefix and gains the closest choice.
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        plain_coercion(self, ctx)
        message = split_size_error(args)
        if message is not None:
            from memplan.cli import common

            common.echo_err(f"memplan: error: {message}")
            ctx.exit(common.EXIT_USAGE)
        try:
            return super().parse_args(ctx, args)
        except typer.BadParameter as exc:
            exc.message = _clean_choice_message(exc.message)
            raise


# NOTE [ plain parameters ]
# typer (0.2x) checks every parameter's value with a pydantic TypeAdapter, built when the value
# is parsed: importing pydantic and building the adapters takes longer than all the rest of
# `memplan algos` (docs/benchmarks.md, "Start-up"). A text, a choice (an Enum) or a flag needs
# none of it: plain_coercion gives those parameters typer's own checks without pydantic (typer's
# choice coercion, coerce_cli_choice, is plain Python). Any other parameter (numbers, paths, a
# parser) keeps typer's adapter; where typer's internals are not as expected (another typer
# version), every parameter keeps typer's coercion.


@functools.cache
def _plain_param() -> Any:
    """The coercion of text, choice and flag parameters (a typer ``RuntimeParam``), or None
    where this typer has no such internals (NOTE [ plain parameters ]).
    """
    try:
        from typer._coercion import RuntimeParam
        from typer._param_types import coerce_cli_choice
    except ImportError:  # pragma: no cover - another typer: its own coercion
        return None

    class PlainParam(RuntimeParam):  # a frozen dataclass: (parameter_info, annotation)
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if self.annotation is str:
                return value if isinstance(value, str) else str(value)
            if self.annotation is bool:  # a flag: click gives it a bool
                if isinstance(value, bool):
                    return value
                raise typer.BadParameter(f"{value!r} is not a valid boolean", ctx=ctx, param=param)
            try:
                return coerce_cli_choice(
                    value,
                    choices=list(self.annotation),
                    case_sensitive=self.parameter_info.case_sensitive,
                    ctx=ctx,
                )
            except ValueError as exc:
                raise typer.BadParameter(str(exc), ctx=ctx, param=param) from None

    return PlainParam


def plain_coercion(command: Any, ctx: Any) -> None:
    """Check ``command``'s text, choice and flag parameters without pydantic (NOTE [ plain
    parameters ]).
    """
    plain_param = _plain_param()
    if plain_param is None:  # pragma: no cover - another typer
        return
    for param in command.get_params(ctx):  # --help too
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", 0) is not None:
            continue
        annotation = descriptor.annotation
        choice = isinstance(annotation, type) and issubclass(annotation, enum.Enum)
        flag = annotation is bool and getattr(param, "is_flag", False)
        custom = descriptor.parameter_info.parser is not None or descriptor.file_annotation
        if (annotation is str or choice or flag) and not custom:
            param._runtime_param = plain_param(descriptor.parameter_info, annotation)


def _clean_choice_message(message: str) -> str:
    """``'adamw' is not one of 'none', 'sgd', 'momentum', 'adam'; did you mean 'adam'?``."""
    match = _NOT_ONE_OF.match(message)
    if match is None:
        return message.removeprefix("Value error, ")
    value = match["value"].strip("'")
    choices = re.findall(r"'([^']*)'", match["choices"])
    text = f"{match['value']} is not one of {match['choices']}"
    close = difflib.get_close_matches(value.lower(), choices, n=1, cutoff=0.6)
    return text + (f"; did you mean '{close[0]}'?" if close else ".")


class _LazyCommands(MutableMapping[str, Any]):
    """The group's commands: each built from :data:`COMMANDS` when first looked up."""

    def __init__(self, group: LazyGroup) -> None:
        self._group = group
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = _build(name, COMMANDS[name], self._group.rich_markup_mode)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:  # pragma: no cover - click never removes commands
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._built if name not in COMMANDS)

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._built))

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self._built


def _build(name: str, where: str, markup: Any) -> Any:
    module, _, function = where.partition(":")
    callback = getattr(importlib.import_module(module), function)
    info = typer.models.CommandInfo(name=name, callback=callback, cls=MemplanCommand)
    return typer.main.get_command_from_info(
        info, pretty_exceptions_short=True, rich_markup_mode=markup
    )


class LazyGroup(TyperGroup):
    """The ``memplan`` group: commands imported when used (NOTE [ lazy commands ])."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _LazyCommands(self)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        plain_coercion(self, ctx)  # --debug, --version, --help (NOTE [ plain parameters ])
        return super().parse_args(ctx, args)


app = typer.Typer(
    name="memplan",
    cls=LazyGroup,
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
        from memplan.core import build_line

        typer.echo(f"memplan {__version__}")
        typer.echo(build_line())
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
    from memplan.cli import common  # here, not at the top: `memplan --version` stays light

    common.state.debug = debug
    from memplan import files

    files.track_inputs()  # -o never replaces a file this command reads (NOTE [ safe writes ])
    ctx.call_on_close(files.stop_tracking)


def main() -> None:
    """Console-script entry point (``memplan = "memplan.cli.app:main"``).

    SIGINT, SIGTERM and SIGHUP stop any phase with exit 128 + the signal and nothing written
    (NOTE [ interrupts ] in memplan/interrupt.py). Inside a command, its guard reports them
    (``common.guard``); here, those that came before or after it: typer turns a
    ``KeyboardInterrupt`` into exit 130 whatever the signal, and says nothing.
    """
    from memplan import interrupt

    interrupt.install()
    try:
        app(prog_name="memplan")
    except SystemExit as exc:
        interrupt.ignore()  # the command's outcome is decided: later signals change nothing
        stopped = _stopped_by(exc)
        if stopped is None:
            raise
        _report_stopped(stopped)
        raise SystemExit(interrupt.exit_status(stopped)) from None
    except KeyboardInterrupt as exc:  # while typer reported an error: nothing was written
        interrupt.ignore()
        _report_stopped(exc)
        raise SystemExit(interrupt.exit_status(exc)) from None
    finally:
        interrupt.ignore()


def _stopped_by(exc: SystemExit) -> KeyboardInterrupt | None:
    """The signal typer turned into this exit (``raise Exit(130) from KeyboardInterrupt``)."""
    cause = getattr(exc.__context__, "__cause__", None)
    return cause if isinstance(cause, KeyboardInterrupt) else None


def _report_stopped(exc: KeyboardInterrupt) -> None:
    from memplan.cli import common

    common.echo_err(common.stopped_line(exc))


if __name__ == "__main__":  # pragma: no cover
    main()
