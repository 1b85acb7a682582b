"""docs/cli.md's synopsis, generated from the typer app so that it cannot drift.

:func:`synopsis` writes one entry per command of :data:`memplan.cli.app.COMMANDS`: its arguments
and every option with its metavar or choices (``[--format table|json|yaml|torch-csv]``), required
ones without brackets. tests/cli/test_docs.py keeps the block between ``<!-- synopsis -->`` and
``<!-- /synopsis -->`` of docs/cli.md equal to it; ``python -m memplan.cli.synopsis docs/cli.md``
rewrites the block.
"""

from __future__ import annotations

import enum
import re
import sys
from pathlib import Path
from typing import Any

WIDTH = 100
"""Lines of the synopsis wrap before this many characters."""

_BLOCK = re.compile(r"(<!-- synopsis -->\n```\n)(?P<body>.*?)(```\n<!-- /synopsis -->)", re.DOTALL)


def _choices(param: Any) -> list[str] | None:
    """An option's choices (typer's enum options; click's Choice on older typer)."""
    for holder in (getattr(param, "type_descriptor", None), getattr(param, "type", None)):
        choices = getattr(holder, "choices", None)
        if choices:
            return [c.value if isinstance(c, enum.Enum) else str(c) for c in choices]
    return None


def _required(param: Any) -> bool:
    """Required by click, or by the command itself (its help ends with ``[required]``)."""
    return bool(param.required) or "[required]" in (getattr(param, "help", None) or "")


def _piece(param: Any) -> str | None:
    """``MODEL``, ``[PROFILE]``, ``--algo ALGO``, ``[--graph]``, ``[--device auto|cpu|cuda]``."""
    if getattr(param, "hidden", False):
        return None
    if not param.opts[0].startswith("-"):  # an argument
        name = (param.metavar or param.name.upper()).strip("[]")
        return name if _required(param) else f"[{name}]"
    if param.name == "help":
        return None
    flag = param.opts[0]
    if getattr(param, "is_flag", False):
        text = flag
    else:
        choices = _choices(param)
        value = "|".join(choices) if choices else (param.metavar or param.name.upper())
        text = f"{flag} {value}"
    return text if _required(param) else f"[{text}]"


def command_synopsis(name: str, command: Any, indent: int) -> str:
    """One command's entry, wrapped at :data:`WIDTH` under its first argument."""
    pieces = [p for p in (_piece(param) for param in command.params) if p is not None]
    head = f"memplan {name.ljust(indent)} "
    lines = [head]
    for piece in pieces:  # a piece (``[--dtype float32|bfloat16]``) never splits
        if len(lines[-1]) > len(head) and len(lines[-1]) + 1 + len(piece) > WIDTH:
            lines.append(" " * len(head))
        lines[-1] += ("" if len(lines[-1]) == len(head) else " ") + piece
    return "\n".join(line.rstrip() for line in lines)


def synopsis() -> str:
    """The synopsis of every command, as docs/cli.md shows it."""
    import typer

    from memplan.cli.app import COMMANDS, app

    group = typer.main.get_command(app)
    indent = max(len(name) for name in COMMANDS)
    entries = ["memplan [--debug] [--version] COMMAND [ARGS]...", ""]
    entries += [command_synopsis(name, group.commands[name], indent) for name in COMMANDS]
    return "\n".join(entries) + "\n"


def documented_synopsis(text: str) -> str | None:
    """The synopsis block of a markdown text (None when it has none)."""
    match = _BLOCK.search(text)
    return None if match is None else match["body"]


def rewrite_synopsis(text: str) -> str:
    """``text`` with its synopsis block regenerated."""
    return _BLOCK.sub(lambda m: m[1] + synopsis() + m[3], text)


def main(argv: list[str]) -> int:
    """``python -m memplan.cli.synopsis FILE.md``: regenerate the synopsis in place."""
    for name in argv:
        path = Path(name)
        path.write_text(rewrite_synopsis(path.read_text()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
