"""Reading the YAML/JSON documents memplan takes (profiles, schedules, GPU specs) and writing YAML.

Below every document type (:mod:`memplan.profile`, :mod:`memplan.schedule`, :mod:`memplan.gpu`),
so that each imports what it reads with from here, at the top, and none imports another: NOTE
[ document parsing ] in :mod:`memplan.documents.parse` says how the text is parsed and limited.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import yaml
from pydantic import ValidationError

from memplan.documents.parse import max_input_bytes, parse_document
from memplan.errors import InputError
from memplan.files import note_input

__all__ = ["dump_yaml", "field_path", "parse_text", "read_document", "validation_message"]


def field_path(loc: Iterable[Any]) -> str:
    """Turn a pydantic location tuple into ``stages[3].output_size``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + str(part)
    return path or "(document)"


def validation_message(source: str, error: ValidationError) -> str:
    """One line for the first error of a pydantic ``ValidationError``."""
    first = error.errors(include_url=False)[0]
    loc = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    kind = first["type"]
    if kind == "extra_forbidden":
        what = "unknown field (put free-form data under 'extra:')"
    elif kind == "missing":
        what = "missing required field"
    else:
        what = first["msg"].removeprefix("Value error, ")
        if "input" in first and not isinstance(first["input"], (dict, list)):
            what += f", got {first['input']!r}"
    if not loc and kind == "value_error":  # a whole-document rule: its message names the fields
        return f"{source}: {what}"
    return f"{source}: {field_path(loc)}: {what}"


def parse_text(text: str, source: str) -> Any:
    """A document given as text (``source`` names it in messages), within the input limit."""
    limit = max_input_bytes()
    if len(text) > limit:
        raise InputError(f"{source}: {_too_large(limit)}")
    return parse_document(text, source)


def _too_large(limit: int) -> str:
    from memplan.units import format_size_like

    typed = os.environ.get("MEMPLAN_MAX_INPUT", "").strip() or "256MiB"  # the limit's units
    return (
        f"larger than {format_size_like(limit, typed)}, the input limit (set MEMPLAN_MAX_INPUT, "
        "e.g. 1GiB, to read it)"
    )


def _read_limited(stream: IO[bytes] | IO[str], name: str) -> str:
    """Read at most the input limit from a binary (or text) stream, as UTF-8 text."""
    limit = max_input_bytes()
    data: bytes | str = stream.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{name}: {_too_large(limit)}")
    if isinstance(data, str):
        return data.removeprefix("\ufeff")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{name}: cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None


def read_document(source: str | os.PathLike[str]) -> tuple[Any, str]:
    """Read a YAML/JSON document from a path or ``-``; return (data, display name).

    Inputs larger than :func:`~memplan.documents.parse.max_input_bytes` (256 MiB unless
    ``MEMPLAN_MAX_INPUT`` says otherwise) are refused before they are parsed; see NOTE
    [ document parsing ] in :mod:`memplan.documents.parse` for the other limits.
    """
    if str(source) == "-":
        stream = getattr(sys.stdin, "buffer", sys.stdin)
        return parse_document(_read_limited(stream, "<stdin>"), "<stdin>"), "<stdin>"
    path = Path(source)
    try:
        with path.open("rb") as handle:
            note_input(path)
            text = _read_limited(handle, str(path))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a YAML or JSON file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_document(text, str(path)), str(path)


def dump_yaml(data: Any) -> str:
    """``data`` as YAML, by libyaml's emitter where PyYAML has it.

    It is 4x faster than the pure-Python one, with the same text (the representer is the same
    Python code).
    """
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=None, width=100)
