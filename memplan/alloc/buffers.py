"""Buffer lists for offline memory allocation: the MiniMalloc CSV format and its checks.

A buffer is live during the half-open interval ``[lower, upper)`` and needs ``size`` bytes; a
placement gives each buffer an ``offset`` such that two buffers live at the same time never share
an address of ``[offset, offset + size)``. The CSV (header ``id,lower,upper,size``, optionally
``offset``) is the format of Moffitt's MiniMalloc (ASPLOS 2023) and of its benchmark instances; see
docs/alloc.md and docs/formats.md.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memplan.errors import InputError, empty_input
from memplan.files import note_input

COLUMNS = ("id", "lower", "upper", "size")
"""The columns every buffer CSV has, in the order memplan writes them."""
OFFSET = "offset"
MAX_VALUE = 2**60
"""Largest time, size or offset accepted in a CSV."""
MAX_ARENA = 2**61
"""Largest peak live load (and arena) placed: every sum of two offsets or sizes the solver forms
stays below 2^62, exact in int64 (NOTE [ exact arithmetic ] in memplan/alloc/__init__.py)."""


@dataclass(frozen=True)
class Buffers:
    """A list of buffers as parallel numpy arrays (int64), optionally with offsets.

    ``ids`` are strings (the CSV's ``id`` column, unique). ``lower < upper`` and ``size >= 0`` are
    checked on construction; :func:`from_rows` builds one from ``(id, lower, upper, size)`` tuples,
    e.g. the graph family's tensors (id = tensor name, lifetime = [first step, last step + 1)).
    """

    ids: tuple[str, ...]
    lower: np.ndarray
    upper: np.ndarray
    size: np.ndarray
    offset: np.ndarray | None = None
    source: str = field(default="buffers", compare=False)

    def __post_init__(self) -> None:
        n = len(self.ids)
        for name in ("lower", "upper", "size"):
            array = np.asarray(getattr(self, name), dtype=np.int64)
            if array.shape != (n,):
                raise InputError(f"{self.source}: {name}: expected {n} values, got {array.shape}")
            object.__setattr__(self, name, array)
        if self.offset is not None:
            off = np.asarray(self.offset, dtype=np.int64)
            if off.shape != (n,):
                raise InputError(f"{self.source}: offset: expected {n} values, got {off.shape}")
            object.__setattr__(self, "offset", off)
        seen: dict[str, int] = {}
        for k, ident in enumerate(self.ids):
            if ident in seen:
                raise InputError(
                    f"{self.source}: id {ident!r}: duplicate (buffers {seen[ident]} and {k})"
                )
            seen[ident] = k
        bad = np.flatnonzero(self.size < 0)
        if bad.size:
            k = int(bad[0])
            raise InputError(
                f"{self.source}: buffer {self.ids[k]!r}: size: expected bytes >= 0, "
                f"got {int(self.size[k])}"
            )
        bad = np.flatnonzero(self.upper <= self.lower)
        if bad.size:
            k = int(bad[0])
            raise InputError(
                f"{self.source}: buffer {self.ids[k]!r}: upper: expected upper > lower "
                f"(half-open lifetime [lower, upper)), got lower={int(self.lower[k])} "
                f"upper={int(self.upper[k])}"
            )
        if self.offset is not None:
            bad = np.flatnonzero(self.offset < 0)
            if bad.size:
                k = int(bad[0])
                raise InputError(
                    f"{self.source}: buffer {self.ids[k]!r}: offset: expected bytes >= 0, "
                    f"got {int(self.offset[k])}"
                )

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_rows(
        cls, rows: Sequence[tuple[Any, int, int, int]], source: str = "buffers"
    ) -> Buffers:
        """Buffers from ``(id, lower, upper, size)`` tuples (ids are turned into strings)."""
        ids = tuple(str(row[0]) for row in rows)
        values = np.array([[row[1], row[2], row[3]] for row in rows], dtype=np.int64).reshape(-1, 3)
        return cls(ids, values[:, 0], values[:, 1], values[:, 2], source=source)

    def with_offsets(self, offsets: np.ndarray) -> Buffers:
        """The same buffers with the given offsets."""
        return Buffers(self.ids, self.lower, self.upper, self.size, offsets, self.source)

    def peak_live_load(self) -> int:
        """The most bytes live at any one time: a lower bound on every placement's arena."""
        return peak_live_load(self.lower, self.upper, self.size)


def peak_live_load(lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> int:
    """Max over time of the total size of the buffers live then.

    The load is highest just after some buffer starts: there it is the sizes of the buffers
    started so far (ties included) minus those ended by then (lifetimes are half-open). Two
    sorts and a merge, O(n log n); exact for any sizes (Python integers when the sizes add up
    to 2^62 or more, where int64 could overflow).
    """
    if len(size) == 0:
        return 0
    lower, upper = np.asarray(lower), np.asarray(upper)
    size = np.asarray(size)
    by_lower = np.argsort(lower, kind="stable")
    by_upper = np.argsort(upper, kind="stable")
    starts, ends = lower[by_lower], upper[by_upper]
    exact = sum(size.tolist()) >= 2**62
    dtype = object if exact else np.int64
    started = np.cumsum(np.asarray(size[by_lower].tolist() if exact else size[by_lower], dtype))
    ended = np.concatenate(
        [[0], np.cumsum(np.asarray(size[by_upper].tolist() if exact else size[by_upper], dtype))]
    )
    # At each start time: everything started at or before it, minus everything ended by then.
    last_start = np.searchsorted(starts, starts, side="right") - 1
    ended_by = np.searchsorted(ends, starts, side="right")
    return int(max(0, (started[last_start] - ended[ended_by]).max()))


# --------------------------------------------------------------------------- CSV


@dataclass(frozen=True)
class BufferTable:
    """A CSV as read: the buffers, plus the header and raw rows to write back unchanged."""

    buffers: Buffers
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


_INTEGER = re.compile(r"[-+]?[0-9]+\Z")
"""A decimal integer in ASCII digits (``int()`` would also take ``1_000`` and other scripts' digits)."""


def _parse_int(text: str, where: str, what: str, minimum: int | None = None) -> int:
    value = text.strip()
    if not _INTEGER.match(value):
        raise InputError(f"{where}: {what}: expected an integer, got {text!r}")
    number = int(value, 10)
    if abs(number) > MAX_VALUE:
        raise InputError(f"{where}: {what}: {number} is too large (more than 2^60)")
    if minimum is not None and number < minimum:
        raise InputError(f"{where}: {what}: expected an integer >= {minimum}, got {number}")
    return number


def parse_buffers_csv(
    text: str, source: str = "buffers.csv", need_offsets: bool = False
) -> BufferTable:
    """Read a MiniMalloc CSV (``id,lower,upper,size[,offset]``), checking every field.

    Raises :class:`memplan.InputError` with one line naming the file, the line and the column for
    a missing column, an unknown column, a non-integer field, a negative size or offset, an empty
    lifetime (``upper <= lower``) or a duplicate id.
    """
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")))  # a UTF-8 BOM (Excel) is no data
    try:
        header_row = next(reader)
    except StopIteration:
        raise empty_input(source, f"a CSV with a header {','.join(COLUMNS)}") from None
    except csv.Error as exc:
        raise InputError(f"{source}: line 1: not CSV ({exc})") from None
    header = tuple(name.strip().lower() for name in header_row)
    missing = [name for name in COLUMNS if name not in header]
    if missing:
        raise InputError(
            f"{source}: missing column(s) {', '.join(missing)}: expected a header "
            f"{','.join(COLUMNS)}[,offset], got {','.join(header_row)}"
        )
    unknown = [name for name in header if name not in (*COLUMNS, OFFSET)]
    if unknown:
        raise InputError(
            f"{source}: unknown column {unknown[0]!r}: expected {','.join(COLUMNS)}[,offset]"
        )
    dup = [name for name in header if header.count(name) > 1]
    if dup:
        raise InputError(f"{source}: column {dup[0]!r} appears twice in the header")
    if need_offsets and OFFSET not in header:
        raise InputError(f"{source}: missing column offset: --validate needs a placed CSV")
    col = {name: header.index(name) for name in header}
    ids: list[str] = []
    values: list[tuple[int, int, int, int]] = []
    rows: list[tuple[str, ...]] = []
    has_offset = OFFSET in header
    lines: dict[str, int] = {}
    try:
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            where = f"{source}: line {line}"
            if len(row) != len(header):
                raise InputError(
                    f"{where}: expected {len(header)} fields ({','.join(header)}), got {len(row)}"
                )
            ident = row[col["id"]].strip()
            if not ident:
                raise InputError(f"{where}: id: expected a non-empty id")
            if ident in lines:
                raise InputError(f"{where}: id {ident!r}: duplicate (also on line {lines[ident]})")
            lines[ident] = line
            lower = _parse_int(row[col["lower"]], where, "lower")
            upper = _parse_int(row[col["upper"]], where, "upper")
            size = _parse_int(row[col["size"]], where, "size", minimum=0)
            if upper <= lower:
                raise InputError(
                    f"{where}: upper: expected upper > lower (half-open lifetime [lower, upper)), "
                    f"got lower={lower} upper={upper}"
                )
            offset = _parse_int(row[col[OFFSET]], where, OFFSET, minimum=0) if has_offset else 0
            ids.append(ident)
            values.append((lower, upper, size, offset))
            rows.append(tuple(cell.strip() for cell in row))
    except csv.Error as exc:
        raise InputError(f"{source}: line {reader.line_num}: not CSV ({exc})") from None
    array = np.array(values, dtype=np.int64).reshape(-1, 4)
    buffers = Buffers(
        tuple(ids),
        array[:, 0],
        array[:, 1],
        array[:, 2],
        array[:, 3] if has_offset else None,
        source=source,
    )
    return BufferTable(buffers, header, tuple(rows))


def read_buffers_csv(path: str | os.PathLike[str], need_offsets: bool = False) -> BufferTable:
    """Read a buffer CSV from a path (``-`` for standard input); see :func:`parse_buffers_csv`."""
    import sys

    name = str(path)
    if name == "-":
        return parse_buffers_csv(sys.stdin.read(), "<stdin>", need_offsets)
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            note_input(path)
            text = handle.read()
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a directory, expected a CSV file") from None
    except UnicodeDecodeError:
        raise InputError(f"{name}: not a text file (expected UTF-8 CSV)") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read ({exc.strerror})") from None
    return parse_buffers_csv(text, name, need_offsets)


def format_buffers_csv(table: BufferTable | Buffers, offsets: np.ndarray) -> str:
    """The CSV with an ``offset`` column (replaced when the input had one), rows in input order."""
    if isinstance(table, Buffers):
        b = table
        header: tuple[str, ...] = COLUMNS
        rows: tuple[tuple[str, ...], ...] = tuple(
            (b.ids[k], str(int(b.lower[k])), str(int(b.upper[k])), str(int(b.size[k])))
            for k in range(len(b))
        )
    else:
        header, rows = table.header, table.rows
    keep = [k for k, name in enumerate(header) if name != OFFSET]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([header[k] for k in keep] + [OFFSET])
    for row, off in zip(rows, offsets.tolist(), strict=True):
        writer.writerow([row[k] for k in keep] + [int(off)])
    return out.getvalue()
