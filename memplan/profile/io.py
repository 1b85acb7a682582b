"""Reading and writing profiles: paths, ``-`` (stdin), bundled names, dicts and YAML text.

Every failure becomes one :class:`~memplan.errors.InputError` line naming the source, the field
path (``stages[3].output_size``) and what was expected.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import yaml
from pydantic import ValidationError

from memplan.errors import InputError, did_you_mean, empty_input
from memplan.files import note_input, write_atomic
from memplan.profile.model import PROFILE_FORMAT, Profile
from memplan.profile.parse import max_input_bytes, parse_document

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "profiles"
PROFILE_SUFFIXES = (".yaml", ".yml", ".json")


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


def bundled_profiles() -> dict[str, Path]:
    """Name -> path of every profile shipped with the package (``resnet50``, ``resnet50@a100``)."""
    if not BUNDLED_DIR.is_dir():
        return {}
    return {
        p.name.rsplit(".", 1)[0]: p
        for p in sorted(BUNDLED_DIR.iterdir())
        if p.suffix in PROFILE_SUFFIXES
    }


def resolve_bundled(name: str) -> Path:
    """Find a bundled profile by name.

    An exact name wins, then one that differs in case only (``resnet50@A100``), then a unique
    prefix (case ignored).

    An unknown name is an InputError suggesting the closest names (difflib), then listing all.
    """
    profiles = bundled_profiles()
    if name in profiles:
        return profiles[name]
    folded = {n.lower(): n for n in profiles}
    if name.lower() in folded:
        return profiles[folded[name.lower()]]
    candidates = [n for n in profiles if n.lower().startswith(name.lower())]
    if len(candidates) == 1:
        return profiles[candidates[0]]
    if candidates:
        raise InputError(
            f"{name}: ambiguous profile name, candidates: {', '.join(sorted(candidates))}"
        )
    known = ", ".join(profiles) or "(none)"
    raise InputError(
        f"{name}: no such file or bundled profile{did_you_mean(name, profiles)} (bundled: {known})"
    )


def _parse_text(text: str, source: str) -> Any:
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

    Inputs larger than :func:`~memplan.profile.parse.max_input_bytes` (256 MiB unless
    ``MEMPLAN_MAX_INPUT`` says otherwise) are refused before they are parsed; see NOTE
    [ document parsing ] in :mod:`memplan.profile.parse` for the other limits.
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


def profile_from_dict(data: Any, source: str = "<profile>") -> Profile:
    """Validate a parsed document as a profile (raises InputError with the field path)."""
    if data is None:
        raise empty_input(source, f"a profile with 'format: {PROFILE_FORMAT}'")
    if not isinstance(data, Mapping):
        raise InputError(f"{source}: expected a mapping with 'format: {PROFILE_FORMAT}'")
    fmt = data.get("format")
    if fmt is None:
        raise InputError(f"{source}: format: missing required field (expected {PROFILE_FORMAT})")
    if fmt != PROFILE_FORMAT:
        raise InputError(f"{source}: format: expected {PROFILE_FORMAT!r}, got {fmt!r}")
    try:
        return Profile.model_validate(data, strict=True)
    except ValidationError as exc:
        raise InputError(validation_message(source, exc)) from None


def load_profile(source: Profile | Mapping[str, Any] | str | os.PathLike[str]) -> Profile:
    """Load a profile from a :class:`Profile`, a dict, a path, ``-``, a bundled name or YAML text.

    Examples
    --------
    >>> prof = load_profile("resnet50")          # bundled, measured on CPU  # doctest: +SKIP
    >>> prof = load_profile("net.yaml")          # a file                   # doctest: +SKIP
    """
    if isinstance(source, Profile):
        return source
    if isinstance(source, Mapping):
        return profile_from_dict(source)
    text = str(source)
    if text == "-":
        data, name = read_document("-")
        return profile_from_dict(data, name)
    if "\n" in text or text.lstrip().startswith(("{", "format:")):
        return profile_from_dict(_parse_text(text, "<text>"), "<text>")
    path = Path(text)
    if path.exists():
        data, name = read_document(path)
        return profile_from_dict(data, name)
    if os.sep in text or text.endswith(PROFILE_SUFFIXES):
        raise InputError(f"{text}: no such file")
    bundled = resolve_bundled(text)
    data, _ = read_document(bundled)
    return profile_from_dict(data, bundled.name)


def dump_yaml(data: Any) -> str:
    """``data`` as YAML, by libyaml's emitter where PyYAML has it.

    It is 4x faster than the pure-Python one, with the same text (the representer is the same
    Python code).
    """
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=None, width=100)


def save_profile(profile: Profile, path: str | os.PathLike[str] | None = None) -> str:
    """Serialize a profile to YAML; write it atomically to ``path`` when given. Returns the text."""
    text = dump_yaml(profile.to_dict())
    if path is not None:
        write_atomic(path, text)
    return text
