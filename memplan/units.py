"""Values typed by people: sizes, rates, budgets, time limits and ``NAME=VALUE`` lists.

Sizes and rates: ``8GB`` (10^9), ``8GiB`` (2^30), ``512MiB``, ``12.2GB/s``; budgets as a share of
the GPU (``gpu``, ``90%``); ``NAME=VALUE`` lists: ``--config n_layer=24,n_embd=1024``.

A bare ``8G`` is ambiguous (decimal or binary?) and is rejected with a suggestion; so is a number
without a unit that is not a whole number of bytes (``1.5``: surely a missing unit). A space between
the number and its unit is accepted in one argument (``"8 GB"``, as memplan prints sizes; ``--mem 8
GB``, two arguments, is refused by the command line). Nothing here imports more than the standard
library: the command line checks its options before torch or numpy.

Sizes in messages: :func:`format_size_like` writes bytes in the units the person typed (``2GiB``:
binary units, ``1.5GB``: decimal, ``1000000``: bytes), with the exact bytes beside when the short
form is not exact.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from memplan.errors import InputError

_DECIMAL = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BYTES = {"", "B", "BYTE", "BYTES"}  # a number of bytes: memplan writes "1023 bytes"
_BINARY = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_UNITS = {**_DECIMAL, **_BINARY, "BYTE": 1, "BYTES": 1}
_AMBIGUOUS = {"K", "M", "G", "T"}
MAX_SIZE = 2**60
"""The largest size accepted (1 EiB): every sum of sizes stays exact in int64."""
MIN_RATE = 1e-3
"""The slowest bandwidth accepted, bytes/s: every transfer time stays a finite float (ms)."""
MAX_RATE = 1e15
"""The fastest bandwidth accepted, bytes/s (1 PB/s, some 300x an HBM3 stack)."""
MAX_TIME_LIMIT = 7 * 24 * 3600.0
"""The longest time limit accepted, seconds (a week): a limit is always finite."""
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
    """Parse a memory size into bytes (rounded down to a whole byte when a unit is given).

    A number without a unit (or in ``B``) is bytes and must be whole: ``1.5`` or ``0.5`` is
    refused, naming ``1.5GB`` (a fraction of a byte is surely a missing unit); ``1.5KiB`` is
    1536 bytes and ``0.3KiB`` 307 (rounded down).

    >>> parse_size("8GB"), parse_size("1.5GiB"), parse_size(1024), parse_size("8 GB")
    (8000000000, 1610612736, 1024, 8000000000)
    """
    if isinstance(value, bool):
        raise InputError(f"size {value!r}: expected bytes, e.g. 8GB or 8GiB")
    if isinstance(value, (int, float)):
        number, in_bytes = float(value), True
    else:
        number = _parse(str(value), "size", "8GB, 8GiB, 512MiB or 1000000")
        in_bytes = size_unit(str(value)) == "B"
    if not math.isfinite(number) or number < 0:
        raise InputError(f"size {value!r}: expected a non-negative size, e.g. 8GB")
    if number > MAX_SIZE:
        raise InputError(f"size {value!r}: too large (more than 1 EiB), e.g. 8GB")
    if in_bytes and not number.is_integer():
        text = str(value).strip()
        digits = _PATTERN.match(text)
        written = digits.group(1) if digits else text
        raise InputError(
            f"size {value!r}: {written} bytes is not a whole number of bytes (a number without "
            f"a unit is bytes); did you mean {written}GB (10^9) or {written}GiB (2^30)?"
        )
    return int(number)


def size_unit(text: str | int | float | None) -> str | None:
    """The unit a size was typed in, as memplan writes it (``GB``, ``GiB``, ``B``: bytes).

    None when ``text`` is not a size (None, ``gpu``, ``90%``, a bad form).

    >>> size_unit("1.5gb"), size_unit("512MiB"), size_unit("1000000"), size_unit("gpu")
    ('GB', 'MiB', 'B', None)
    """
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, (int, float)):
        return "B"
    match = _PATTERN.match(text)
    if match is None:
        return None
    unit = match.group(2).upper()
    if unit in _BYTES:
        return "B"
    if unit in _DECIMAL:
        return unit
    if unit in _BINARY:
        return unit[:-2] + "iB"
    return None


def exact_bytes(text: str) -> Decimal:
    """The exact number of bytes a size written as ``text`` stands for, fractions kept.

    ``1.5KiB`` -> 1536, ``0.1KB`` -> 100, ``1.5`` -> 1.5 (for options that need whole bytes:
    ``alloc --capacity``). ``text`` is checked as :func:`parse_size` checks it.
    """
    parse_size(text)  # the format, the unit, the range
    match = _PATTERN.match(text)
    assert match is not None  # parse_size accepted it
    return Decimal(match.group(1)) * _UNITS[match.group(2).upper()]


DEVICE_RESERVE = 512 * 2**20
"""Bytes of a GPU's memory that no plan can have (512 MiB): ``--mem gpu`` is the device's memory
less this. The CUDA context of a PyTorch process takes 287 MB with lazy module loading, PyTorch's
default since 1.13 (287,047,680 bytes against 666,632,192 eagerly, measured in pytorch/pytorch
pull request 86509); the rest covers the cuBLAS and cuDNN handles and workspaces loaded on first
use and the caching allocator's rounding (docs/cli.md, "Budgets")."""

MAX_PERCENT = 1000.0
"""The largest share of the GPU a budget may name (``1000%``)."""


@dataclass(frozen=True)
class DeviceShare:
    """A budget given as a share of the GPU's memory: ``gpu`` (100%) or ``90%``.

    The bytes depend on the profile's device (:meth:`of`); ``text`` is the budget as given.
    """

    percent: float
    text: str

    def of(self, device_memory: int) -> int:
        """The budget in bytes on a GPU of ``device_memory`` bytes (:func:`usable_memory`)."""
        return int(usable_memory(device_memory) * self.percent / 100.0)


def usable_memory(device_memory: int) -> int:
    """What a GPU of ``device_memory`` bytes can give a plan: less :data:`DEVICE_RESERVE`."""
    return max(0, device_memory - DEVICE_RESERVE)


def parse_budget(value: str | int | float) -> int | DeviceShare:
    """A memory budget: a size in bytes (:func:`parse_size`), or a share of the GPU's memory.

    ``gpu`` is all a plan can have (:func:`usable_memory`), ``90%`` that share of it.

    >>> parse_budget("8GB"), parse_budget("gpu").percent, parse_budget("90%").percent
    (8000000000, 100.0, 90.0)
    """
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "gpu":
            return DeviceShare(100.0, text)
        if text.endswith("%"):
            try:
                percent = float(text[:-1])
            except ValueError:
                percent = math.nan
            if not (math.isfinite(percent) and 0 < percent <= MAX_PERCENT):
                raise InputError(
                    f"budget {value!r}: expected a share of the GPU's memory above 0% and at most "
                    f"{MAX_PERCENT:g}%, e.g. 90%"
                )
            return DeviceShare(percent, text)
        if not _PATTERN.match(text):
            raise InputError(
                f"size {value!r}: expected a number with a unit or a share of the GPU, e.g. 8GB, "
                "8GiB, 512MiB, 1000000, gpu or 90%"
            )
    return parse_size(value)


def parse_rate(value: str | int | float) -> float:
    """Parse a bandwidth into bytes per second: ``12.2GB/s``, ``16GiB/s`` or a plain number.

    Rates outside :data:`MIN_RATE` .. :data:`MAX_RATE` (0.001 B/s to 1 PB/s) are refused: a transfer
    at 1e-300 bytes/s lasts forever, one at 1e300 bytes/s underflows the slot arithmetic.
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
    if not MIN_RATE <= number <= MAX_RATE:
        raise InputError(
            f"rate {value!r}: expected 0.001 to 1e15 bytes/s (up to 1PB/s), e.g. 12.2GB/s"
        )
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


_SCALES = {
    "decimal": (("KB", 10**3), ("MB", 10**6), ("GB", 10**9), ("TB", 10**12)),
    "binary": (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40)),
}


def format_size_like(
    nbytes: int, typed: str | int | float | None = None, *, up: bool = False
) -> str:
    """``nbytes`` for a message, in the units of the size a person typed (``typed``).

    ``typed`` in binary units (``2GiB``, ``512MiB``) gives binary units, in decimal units (``8GB``)
    or anything else (None, ``gpu``, ``90%``) decimal units, each scaled to ``nbytes`` (``2.36
    GiB``, ``27.82 MB``), at most two decimals; the exact bytes follow in parentheses when the
    short form is not exact. A plain number of bytes typed (``1000000``) gives bytes alone.
    ``up`` rounds the short form up, not to the nearest: for a least memory that fits, so that
    the figure shown, typed back, fits.

    >>> format_size_like(2_534_567_890, "2GB"), format_size_like(2**31, "2GiB")
    ('2.53 GB (2534567890 bytes)', '2 GiB')
    >>> format_size_like(27_814_536, "24.6MB", up=True), format_size_like(999, "1000")
    ('27.82 MB (27814536 bytes)', '999 bytes')
    """
    nbytes = int(nbytes)
    unit = size_unit(typed)
    if unit == "B":
        return f"{nbytes} bytes"
    scale = _SCALES["binary" if unit is not None and unit.endswith("iB") else "decimal"]
    fitting = [(name, size) for name, size in scale if nbytes >= size]
    if not fitting:
        return f"{nbytes} bytes"
    name, factor = fitting[-1]
    # hundredths of the unit, in integers: exact at any size
    rounded = -(-nbytes * 100 // factor) if up else (nbytes * 200 + factor) // (2 * factor)
    step = scale[1][1] // scale[0][1]  # 1000 or 1024
    if rounded >= step * 100 and len(fitting) < len(scale):  # 999.996 MB: 1 GB
        name, factor = scale[len(fitting)]
        rounded = -(-nbytes * 100 // factor) if up else (nbytes * 200 + factor) // (2 * factor)
    short = f"{rounded / 100:.2f}".rstrip("0").rstrip(".")
    exact = rounded * factor == nbytes * 100
    return f"{short} {name}" if exact else f"{short} {name} ({nbytes} bytes)"


def check_time_limit(value: float | None, what: str = "time_limit") -> float | None:
    """A time limit in seconds: None (the algorithm's default), or finite, > 0 and at most a week.

    ``nan`` and ``inf`` are refused: a limit the solver cannot reach is no limit.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{what} {value!r}: expected a number of seconds, e.g. 60")
    if not (math.isfinite(value) and 0 < value <= MAX_TIME_LIMIT):
        raise InputError(
            f"{what} {value!r}: expected a finite number of seconds above 0 and at most "
            f"{MAX_TIME_LIMIT:.0f} (a week), e.g. 60"
        )
    return float(value)


def _value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def parse_config(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """``"n_layer=24,n_embd=1024"`` -> ``{"n_layer": 24, "n_embd": 1024}``.

    Values are ints, floats, true/false, none, else strings; a mapping is returned as a dict.

    Raises
    ------
    InputError
        An item without ``=`` or with an empty name.
    """
    if text is None:
        return {}
    if isinstance(text, Mapping):
        return dict(text)
    values: dict[str, Any] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--config {text!r}: expected NAME=VALUE[,NAME=VALUE...]")
        values[key.strip()] = _value(value)
    return values
