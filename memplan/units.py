"""Human sizes and rates: ``8GB`` (10^9), ``8GiB`` (2^30), ``512MiB``, ``12.2GB/s``.

A bare ``8G`` is ambiguous (decimal or binary?) and is rejected with a suggestion.
"""

from __future__ import annotations

import math
import re

from memplan.errors import InputError

_DECIMAL = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BINARY = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_UNITS = {**_DECIMAL, **_BINARY}
_AMBIGUOUS = {"K", "M", "G", "T"}
MAX_SIZE = 2**60
"""The largest size accepted (1 EiB): every sum of sizes stays exact in int64."""
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def _parse(text: str, what: str, example: str) -> float:
    match = _PATTERN.match(text)
    if not match:
        raise InputError(f"{what} {text!r}: expected a number with a unit, e.g. {example}")
    number, unit = float(match.group(1)), match.group(2).upper()
    if unit in _AMBIGUOUS:
        raise InputError(
            f"{what} {text!r}: {match.group(2)!r} is ambiguous; "
            f"write {match.group(1)}{unit}B (10^n) or {match.group(1)}{unit}iB (2^n)"
        )
    if unit not in _UNITS:
        raise InputError(f"{what} {text!r}: unknown unit {match.group(2)!r}, e.g. {example}")
    return number * _UNITS[unit]


def parse_size(value: str | int | float) -> int:
    """Parse a memory size into bytes (rounded down to a whole byte).

    >>> parse_size("8GB"), parse_size("1.5GiB"), parse_size(1024)
    (8000000000, 1610612736, 1024)
    """
    if isinstance(value, bool):
        raise InputError(f"size {value!r}: expected bytes, e.g. 8GB or 8GiB")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        number = _parse(str(value), "size", "8GB, 8GiB, 512MiB or 1000000")
    if not math.isfinite(number) or number < 0:
        raise InputError(f"size {value!r}: expected a non-negative size, e.g. 8GB")
    if number > MAX_SIZE:
        raise InputError(f"size {value!r}: too large (more than 1 EiB), e.g. 8GB")
    return int(number)


def parse_rate(value: str | int | float) -> float:
    """Parse a bandwidth into bytes per second: ``12.2GB/s``, ``16GiB/s`` or a plain number.

    A unit without ``/s`` (``12GB``) is a size, not a rate, and is refused.
    """
    if isinstance(value, bool):
        raise InputError(f"rate {value!r}: expected bytes/s, e.g. 12.2GB/s")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        text = str(value).strip()
        if text.startswith("-"):
            raise InputError(f"rate {value!r}: expected a positive rate, e.g. 12.2GB/s")
        if text.lower().endswith("/s"):
            text = text[:-2]
        elif _size_unit(text):  # 12GB is a size, not a rate
            raise InputError(
                f"rate {value!r}: a rate needs /s: write {text.replace(' ', '')}/s "
                "(bytes per second)"
            )
        number = _parse(text, "rate", "12.2GB/s or 16GiB/s")
    if not math.isfinite(number) or number <= 0:
        raise InputError(f"rate {value!r}: expected a positive rate, e.g. 12.2GB/s")
    return number


def _size_unit(text: str) -> bool:
    """Whether ``text`` is a number with a size unit (``12GB``, ``16GiB``, ``8B``)."""
    match = _PATTERN.match(text)
    return bool(match and match.group(2) and match.group(2).upper() in _UNITS)


def format_size(nbytes: float | int | None) -> str:
    """Format bytes for people: ``1.23 GB`` (decimal units, as the budgets are usually given)."""
    if nbytes is None:
        return "-"
    value = float(nbytes)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")
