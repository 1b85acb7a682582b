"""Exception types: bad input raises, infeasibility does not (it is a schedule status)."""

from __future__ import annotations


class MemplanError(Exception):
    """Base class of every error memplan raises on purpose."""


class InputError(MemplanError, ValueError):
    """Bad usage or bad input: a malformed file, a missing or negative field, an unknown name.

    The message is one line that names the source (file), the field path and what was expected,
    e.g. ``net.yaml: stages[3].output_size: expected bytes >= 0, got -5``. The CLI maps it to exit 2.
    """


class InternalError(MemplanError, RuntimeError):
    """A broken invariant inside memplan (e.g. a solver and the simulator disagree).

    This is always a bug: please report it with the command line and the profile.
    """
