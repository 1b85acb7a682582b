"""The families' declared options as command-line options (``solve``, ``compare``, ``run``).

Each family declares its options once (:mod:`memplan.algorithms.options`); here the declarations
of the same name are merged into one command-line option per flag, and :func:`family_options`
adds them to a command's signature in place of its ``family_options`` parameter, which receives
the values given (``{"slots": 300}``; options left out are absent). The tables of docs/cli.md are
:func:`markdown_table`'s output, kept equal by tests/cli/test_options.py
(``python -m memplan.cli.options docs/cli.md`` rewrites them).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from memplan.algorithms.options import Option


@dataclass(frozen=True)
class CliOption:
    """One command-line option: the declarations of every family that has it, merged."""

    name: str
    flag: str
    metavar: str
    cli_type: type
    help: str
    declarations: tuple[Option, ...]

    @property
    def help_text(self) -> str:
        """The help line: the shared sentence, then the accepted values and defaults by family."""
        groups: dict[tuple[str, str], list[str]] = {}
        for spec in self.declarations:
            groups.setdefault((spec.accepts, spec.default_text), []).append(spec.family)
        if len(groups) == 1:
            [(accepts, default)] = groups
            return f"{self.help}  [{accepts}; default: {default}]"
        parts = [
            f"{', '.join(families)}: {accepts}, default {default}"
            for (accepts, default), families in groups.items()
        ]
        return f"{self.help}  [{'; '.join(parts)}]"


def cli_options(command: str) -> list[CliOption]:
    """The family options ``command`` shows, one per flag, in the families' order."""
    from memplan.algorithms import all_options

    merged: dict[str, list[Option]] = {}
    for spec in all_options():
        if command in spec.commands:
            merged.setdefault(spec.name, []).append(spec)
    found = []
    for name, specs in merged.items():
        first = specs[0]
        for spec in specs[1:]:
            same = (spec.flag, spec.metavar, spec.cli_type, spec.help)
            if same != (first.flag, first.metavar, first.cli_type, first.help):
                raise AssertionError(
                    f"option {name!r}: families {first.family} and {spec.family} declare "
                    "different flags, metavars, types or help"
                )
        found.append(
            CliOption(name, first.flag, first.metavar, first.cli_type, first.help, tuple(specs))
        )
    return found


def family_options(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a typer command the family options of ``command`` in place of ``family_options``."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(func)
        options = cli_options(command)
        names = [o.name for o in options]
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name != "family_options":
                params.append(param)
                continue
            for o in options:
                annotation = Annotated[
                    Optional[o.cli_type],  # type: ignore[name-defined]  # noqa: UP045 - built at runtime for typer
                    typer.Option(o.flag, metavar=o.metavar, help=o.help_text, show_default=False),
                ]
                params.append(
                    inspect.Parameter(
                        o.name, param.POSITIONAL_OR_KEYWORD, default=None, annotation=annotation
                    )
                )

        @functools.wraps(func)
        def command_with_options(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in names if name in kwargs}
            given = {name: value for name, value in given.items() if value is not None}
            return func(*args, family_options=given, **kwargs)

        command_with_options.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return command_with_options

    return decorate


# --------------------------------------------------------------------------- docs/cli.md

_BLOCK = re.compile(
    r"(<!-- family options: (?P<command>\w+) -->\n)(?P<body>.*?)(<!-- /family options -->)",
    re.DOTALL,
)


def markdown_table(command: str) -> str:
    """docs/cli.md's table of the family options of ``command``, one row per family."""
    lines = [
        "| option | family | accepts | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for o in cli_options(command):
        for i, spec in enumerate(o.declarations):
            first = f"`{o.flag} {o.metavar}`" if i == 0 else ""
            meaning = o.help if i == 0 else ""
            lines.append(
                f"| {first} | {spec.family} | {spec.accepts} | {spec.default_text} | {meaning} |"
            )
    return "\n".join(lines) + "\n"


def documented_tables(text: str) -> dict[str, str]:
    """The family-option tables a markdown text holds, by command."""
    return {m["command"]: m["body"] for m in _BLOCK.finditer(text)}


def rewrite_tables(text: str) -> str:
    """``text`` with every family-option table regenerated from the declarations."""
    return _BLOCK.sub(lambda m: m[1] + markdown_table(m["command"]) + m[4], text)


def main(argv: list[str]) -> int:
    """``python -m memplan.cli.options FILE.md``: regenerate the tables in place."""
    for name in argv:
        path = Path(name)
        path.write_text(rewrite_tables(path.read_text()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
