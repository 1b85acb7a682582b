"""Exception types: bad input raises, infeasibility does not (it is a schedule status)."""

from __future__ import annotations

import difflib
import os
import stat
import sys
from collections.abc import Iterable


class MemplanError(Exception):
    """Base class of every error memplan raises on purpose."""


class InputError(MemplanError, ValueError):
    """Bad usage or bad input: a malformed file, a missing or negative field, an unknown name.

    The message is one line that names the source (file), the field path and what was expected,
    e.g. ``net.yaml: stages[3].output_size: expected bytes >= 0, got -5``. The CLI maps it to exit 2.
    """


_UNSET = object()


class ArgumentError(InputError):
    """A bad argument of a library call, naming its Python parameter.

    ``str()`` is the library's line (``memory='8G': ...``); the command line, which takes the
    argument as a flag, writes :meth:`for_flag` instead (``--mem 8G: ...``).
    """

    def __init__(self, parameter: str, detail: str, given: object = _UNSET) -> None:
        self.parameter = parameter
        self.detail = detail
        self.given = given
        named = parameter if given is _UNSET else f"{parameter}={given!r}"
        super().__init__(f"{named}: {detail}")

    def for_flag(self, flag: str) -> str:
        """The line as the command line says it: ``--mem 8G: ...``."""
        if self.given is _UNSET or self.given is None:
            return f"{flag}: {self.detail}"
        return f"{flag} {self.given}: {self.detail}"


BUG_NOTE = "this is a bug in memplan; please report it"
"""The one phrase that says an error is memplan's own: :class:`InternalError` adds it to its
message, the command line to any unexpected exception's line (never twice)."""


class InternalError(MemplanError, RuntimeError):
    """A broken invariant inside memplan (e.g. a solver and the simulator disagree).

    This is always a bug. Raise it with what broke (``pofo produced a plan the simulator rejects:
    ...``); ``str()`` adds :data:`BUG_NOTE` in parentheses, so the message says it once.
    """

    def __str__(self) -> str:
        return f"{super().__str__()} ({BUG_NOTE})"


class MemplanWarning(UserWarning):
    """Base class of the warnings memplan issues on purpose (``warnings.warn``).

    The command line prints each as one line ``memplan: warning: ...`` on stderr.
    """


class BudgetWarning(MemplanWarning):
    """A memory budget larger than the profile's GPU can give a plan (docs/cli.md, "Budgets").

    Named as :class:`ArgumentError` names its parameter (``memory='200GB': ...``); the command line
    writes :meth:`for_flag`.
    """

    def __init__(self, detail: str, given: object, parameter: str = "memory") -> None:
        self.parameter = parameter
        self.detail = detail
        self.given = given
        super().__init__(f"{parameter}={given!r}: {detail}")

    def for_flag(self, flag: str) -> str:
        """The line as the command line says it: ``--mem 200GB: ...``."""
        return f"{flag} {self.given}: {self.detail}"


STDIN = "<stdin>"
"""How messages name standard input."""


class EmptyPipe(InputError):
    """Nothing came through the pipe on standard input.

    Not bad input: the command before the pipe wrote nothing, most often because it failed (its
    own error is above on stderr). The CLI exits 66 (``EX_NOINPUT`` of sysexits.h), not 2, and
    the message does not blame the input. An empty file, or ``< /dev/null``, is a plain
    :class:`InputError` (the document is empty).
    """


def empty_input(source: str, expected: str) -> InputError:
    """The error for an empty document; :class:`EmptyPipe` when it came through a pipe.

    ``expected`` says what the document should have been (``a profile with 'format: ...'``).
    """
    if source == STDIN and stdin_is_pipe():
        return EmptyPipe(
            f"{STDIN}: nothing came through the pipe (expected {expected}): the command before "
            "the pipe wrote nothing; its own error, if it failed, is above"
        )
    return InputError(f"{source}: empty: expected {expected}")


def stdin_is_pipe() -> bool:
    """Whether standard input is a pipe or a socket (not a terminal, a file or ``/dev/null``)."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no stdin, or a stream without a descriptor
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


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
