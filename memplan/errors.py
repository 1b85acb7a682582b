"""Exception types: bad input raises, infeasibility does not (it is a schedule status)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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


class MemplanWarning(UserWarning):
    """Base class of the warnings memplan issues on purpose (``warnings.warn``): the command line
    prints each as one line ``memplan: warning: ...`` on stderr."""


class BudgetWarning(MemplanWarning):
    """A memory budget larger than the profile's GPU can give a plan (docs/cli.md, "Budgets")."""


STDIN = "<stdin>"
"""How messages name standard input."""


def empty_input(source: str, expected: str) -> InputError:
    """The error for an empty document: on stdin, most often the command before the pipe failed.

    ``expected`` says what the document should have been (``a memplan-profile/1 document``).
    """
    if source == STDIN:
        return InputError(
            f"{STDIN}: empty: nothing came through the pipe, expected {expected}; the command "
            "before the pipe may have failed (its error is above; `set -o pipefail` makes the "
            "pipeline exit with it)"
        )
    return InputError(f"{source}: empty: expected {expected}")


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
    """``" (did you mean 'rotor'?)"`` for the closest of ``choices`` (difflib), or ``""``.

    Case is ignored, so ``resnet50@A100`` suggests ``resnet50@a100``.
    """
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(choice.lower(), choice)
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(f"'{by_lower[c]}'" for c in close) + "?)"
