"""A memory budget as it comes through the door: checked once, its text kept for messages.

:func:`check_memory` turns what a caller gave (``"8GB"``, ``8_000_000_000``, ``"gpu"``,
``"90%"``) into a :class:`MemoryBudget`: the bytes (or a share of the profile's GPU, resolved when
the profile is read) and the text as typed. Messages then give sizes in the units the user typed
(:meth:`MemoryBudget.size`, :func:`memplan.units.format_size_like`, the one helper the command
line's messages use too).
"""

from __future__ import annotations

from dataclasses import dataclass

from memplan.errors import ArgumentError, InputError
from memplan.units import DeviceShare, format_size_like, parse_budget


@dataclass(frozen=True)
class MemoryBudget:
    """A budget checked at the door.

    ``value`` in bytes or a :class:`~memplan.units.DeviceShare`; ``text``, the budget as given.
    """

    value: int | DeviceShare
    text: str

    @property
    def named(self) -> str:
        """The budget as typed, a number of bytes saying so (``1000000 bytes``)."""
        return f"{self.text} bytes" if self.text.replace("_", "").isdigit() else self.text

    def size(self, nbytes: int, *, up: bool = False) -> str:
        """``nbytes`` in the unit the budget was typed in.

        The exact bytes beside when the short form is not exact
        (:func:`memplan.units.format_size_like`; ``up``: rounded up, for a least memory that fits
        when typed back): ``--mem 24.6MB`` is answered in MB, a budget given in bytes in bytes.
        """
        return format_size_like(nbytes, self.text, up=up)


def check_memory(value: object, parameter: str = "memory") -> MemoryBudget:
    """A :class:`MemoryBudget`, before any profile is read.

    From a size (``8GB``, bytes) or a share of the GPU (``gpu``, ``90%``).

    Raises
    ------
    ArgumentError
        Naming ``parameter``: no budget, or one that is not a size or a share.
    """
    if isinstance(value, MemoryBudget):
        return value
    if value is None:
        raise ArgumentError(parameter, "a memory budget is required, e.g. 8GB", None)
    if not isinstance(value, (str, int, float)):
        raise ArgumentError(parameter, "expected a size (8GB, bytes), gpu or 90%", value)
    try:
        parsed = parse_budget(value)
    except InputError as exc:
        raise ArgumentError(parameter, str(exc)) from None
    return MemoryBudget(parsed, str(value).strip())
