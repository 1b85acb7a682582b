"""Reading and writing profiles: paths, ``-`` (stdin), bundled names, dicts and YAML text.

Every failure becomes one :class:`~memplan.errors.InputError` line naming the source, the field
path (``stages[3].output_size``) and what was expected.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memplan.documents.io import dump_yaml, parse_text, read_document, validation_message
from memplan.errors import InputError, did_you_mean, empty_input
from memplan.files import write_atomic
from memplan.profile.model import PROFILE_FORMAT, Profile

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "profiles"
PROFILE_SUFFIXES = (".yaml", ".yml", ".json")


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
        return profile_from_dict(parse_text(text, "<text>"), "<text>")
    path = Path(text)
    if path.exists():
        data, name = read_document(path)
        return profile_from_dict(data, name)
    if os.sep in text or text.endswith(PROFILE_SUFFIXES):
        raise InputError(f"{text}: no such file")
    bundled = resolve_bundled(text)
    data, _ = read_document(bundled)
    return profile_from_dict(data, bundled.name)


def save_profile(profile: Profile, path: str | os.PathLike[str] | None = None) -> str:
    """Serialize a profile to YAML; write it atomically to ``path`` when given. Returns the text."""
    text = dump_yaml(profile.to_dict())
    if path is not None:
        write_atomic(path, text)
    return text
