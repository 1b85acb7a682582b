"""What every command shares: consoles, the error guard, PROFILE and option parsing, output.

NOTE [ CLI output and exit codes ]
Human output (tables, progress, the summary) goes to stderr through ``err_console()``; a machine
format (``--format json|yaml|csv``) writes exactly one document to stdout or, with ``-o FILE``,
atomically to the file. Exit codes: 0 done (a plan that fits, a valid schedule); 1 infeasible or
an invalid / over-budget schedule; 2 bad usage or bad input (``memplan.InputError``, typer usage
errors); 66 (EX_NOINPUT, sysexits.h) nothing came through the pipe on stdin
(``memplan.errors.EmptyPipe``: the command before the pipe wrote nothing, most often because it
failed); 70 (EX_SOFTWARE) a bug in memplan: ``InternalError`` or any unexpected exception; 130,
143, 129 stopped by SIGINT (Ctrl-C), SIGTERM or SIGHUP in any phase, CP-SAT searches included, with
nothing written (NOTE [ interrupts ] in memplan/interrupt.py; :func:`guard` renames a command's
files into place at its end, or removes them); 141 the reader of stdout went away (``| head``). Errors are one line ``memplan: error: ...`` on stderr; ``--debug`` (or
``MEMPLAN_DEBUG=1``) adds the traceback without changing the exit code.
"""

from __future__ import annotations

import enum
import functools
import math
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import typer

from memplan.errors import (
    BUG_NOTE,
    ArgumentError,
    BudgetWarning,
    EmptyPipe,
    InputError,
    InternalError,
    MemplanWarning,
)

FLAGS = {
    "memory": "--mem",
    "optimizer": "--optimizer",
    "gradients": "--gradients",
    "loss_chunks": "--loss-chunks",
}
"""The library's parameters the commands take as flags of other names: an
:class:`~memplan.errors.ArgumentError` names the flag on the command line."""

if TYPE_CHECKING:  # rich is imported when a console is made: `memplan alloc` prints none
    from rich.console import Console, RenderableType

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_USAGE = 2
EXIT_NO_INPUT = 66  # EX_NOINPUT (sysexits.h): nothing came through the pipe on stdin
EXIT_INTERNAL = 70
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a process killed by the signal

PIPE_EXAMPLE = "memplan profile resnet18 | memplan solve --algo rotor --mem 2GB"


class State:
    """Global options of one invocation (set by the app callback)."""

    debug: bool = False


state = State()


def debug_enabled() -> bool:
    return state.debug or os.environ.get("MEMPLAN_DEBUG", "").strip() not in ("", "0")


# NOTE [ control characters ]
# Names come from files (a profile's model and stages, a CSV's ids, a schedule's algorithm) and may
# hold escape sequences that set the terminal's title, clear the screen or add hyperlinks. Every
# character a terminal would act on (C0 but tab and newline, DEL, C1, and the bidirectional
# overrides that reorder text) is printed as a visible escape (``\x1b``, ``\u202e``) by the three
# ways memplan prints: ``err_console()`` (tables, summaries, progress; markup and emoji codes are
# off, so ``[link=...]`` in a name is text), ``echo_err()`` (one line: newlines escaped too) and
# ``write_output()`` when stdout is a terminal (JSON and YAML escape by themselves; a CSV does not).
# A document written to a pipe or a file is data and stays byte for byte.

_CONTROLS = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[{_CONTROLS}]")
_CONTROL_OR_NEWLINE = re.compile(f"[\\n{_CONTROLS}]")


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char in "\n\r":
        return "\\n" if char == "\n" else "\\r"
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_control(text: str, *, newlines: bool = False) -> str:
    r"""``text`` with the characters a terminal acts on shown as ``\\x1b``-style escapes.

    Tab and newline stay, unless ``newlines`` (then newline is escaped too: one line stays one).
    See NOTE [ control characters ].
    """
    pattern = _CONTROL_OR_NEWLINE if newlines else _CONTROL
    return pattern.sub(_visible, text) if pattern.search(text) else text


@functools.cache
def escaping_console_class() -> type[Console]:
    """A rich console class that escapes control characters in the text it renders (not in its
    own cursor and style codes): see NOTE [ control characters ]. Made on first use, so that a
    command that prints no rich output does not import rich.
    """
    from rich.console import Console
    from rich.segment import Segment

    class _EscapingConsole(Console):
        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            return super()._render_buffer(
                Segment(escape_control(seg.text), seg.style, seg.control)
                if seg.control is None and _CONTROL.search(seg.text)
                else seg
                for seg in buffer
            )

    return _EscapingConsole


def err_console() -> Console:
    """The console for human output: stderr, colour only on a terminal, honours NO_COLOR.

    Control characters in what it prints are escaped; markup and emoji codes are off (names
    such as ``layer[3]`` or ``[link=...]`` print as they are): NOTE [ control characters ].
    """
    return escaping_console_class()(
        stderr=True, highlight=False, soft_wrap=False, markup=False, emoji=False
    )


def echo_err(message: str) -> None:
    """One plain line on stderr, control characters escaped (NOTE [ control characters ])."""
    sys.stderr.write(escape_control(message.rstrip("\n"), newlines=True) + "\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- errors


@contextmanager
def guard() -> Iterator[None]:
    """Run a command: map exceptions to the exit codes of the SPEC (NOTE [ CLI output and exit
    codes ]), the library's warnings to lines ``memplan: warning: ...`` on stderr, and write its
    files all together at the end, or none of them.

    The files the command writes (``-o``, ``--trace``, ``--plot``) are held (NOTE [ safe writes ]
    in memplan/files.py) and renamed into place when it ends with 0 or 1; with any other exit
    (bad input, a bug, an interrupt) they are removed, and the targets stay as they were.
    """
    from memplan import files, interrupt

    interrupt.begin()
    files.hold_writes()
    try:
        with warnings.catch_warnings():
            shown = warnings.showwarning
            warnings.simplefilter("always", MemplanWarning)
            warnings.showwarning = functools.partial(_show_warning, shown)
            yield
    except (typer.Exit, typer.Abort) as exc:
        _settle(isinstance(exc, typer.Exit) and exc.exit_code in (EXIT_OK, EXIT_INFEASIBLE))
        raise
    except KeyboardInterrupt as exc:  # one signal, whatever the phase (NOTE [ interrupts ])
        _exit_stopped(exc)
    except EmptyPipe as exc:  # the command before the pipe failed: not bad input
        _settle(False)
        _fail(exc, f"memplan: error: {_one_line(exc)}", EXIT_NO_INPUT)
    except ArgumentError as exc:  # the library names its parameter, the command line its flag
        _settle(False)
        flag = FLAGS.get(exc.parameter, "--" + exc.parameter.replace("_", "-"))
        _fail(exc, f"memplan: error: {' '.join(exc.for_flag(flag).split())}", EXIT_USAGE)
    except InputError as exc:
        _settle(False)
        _fail(exc, f"memplan: error: {_one_line(exc)}", EXIT_USAGE)
    except InternalError as exc:  # its message says BUG_NOTE
        _stopped_by(exc)
        _settle(False)
        _fail(exc, f"memplan: internal error: {_one_line(exc)}", EXIT_INTERNAL)
    except BrokenPipeError:
        # `memplan ... | head`: the reader went away; nothing useful left to say.
        _silence_stdout()
        _settle(False, quiet=True)
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    except Exception as exc:
        _stopped_by(exc)
        _settle(False)
        line = f"memplan: internal error: {type(exc).__name__}: {_one_line(exc)} ({BUG_NOTE})"
        _fail(exc, line, EXIT_INTERNAL)
    except BaseException:  # SystemExit from a library, GeneratorExit: no half-written command
        _settle(False, quiet=True)
        raise
    else:
        _settle(True)


def _stopped_by(exc: BaseException) -> None:
    """Exit as for the signal when a stop signal is behind ``exc`` (a library wrapped it:
    :func:`memplan.interrupt.stopped_by`), not with an internal error.
    """
    from memplan import interrupt

    stop = interrupt.stopped_by(exc)
    if stop is not None:
        _exit_stopped(stop)


def _exit_stopped(stop: KeyboardInterrupt) -> NoReturn:
    """End the command stopped by ``stop``: nothing written, its line, exit 128 + the signal."""
    from memplan import interrupt

    _settle(False)
    echo_err(stopped_line(stop))
    raise typer.Exit(interrupt.exit_status(stop)) from None


def stopped_line(exc: KeyboardInterrupt) -> str:
    """``memplan: interrupted`` (Ctrl-C), ``memplan: stopped by SIGTERM`` (or SIGHUP)."""
    if getattr(exc, "signum", None) is None:  # Python's own KeyboardInterrupt: SIGINT
        return "memplan: interrupted"
    return f"memplan: stopped by {exc}"  # interrupt.Terminated: str() is the signal's name


def _settle(keep: bool, quiet: bool = False) -> None:
    """Rename the command's held files into place (``keep``) or remove them; see :func:`guard`.

    Once renamed, the command is done: a signal from then on ends nothing (NOTE [ interrupts ]).
    """
    from memplan import files, interrupt

    if not keep:
        names = files.discard_writes()
        if names and not quiet:
            echo_err(f"memplan: not written, left as they were: {', '.join(names)}")
        return
    try:
        with interrupt.deferred():
            files.commit_writes()
            interrupt.finish()
    except OSError as exc:
        name = exc.filename or "output"
        echo_err(f"memplan: error: {name}: cannot write: {exc.strerror or exc}")
        raise typer.Exit(EXIT_USAGE) from None


def _show_warning(shown, message, category, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
    """A :class:`memplan.errors.MemplanWarning` as one line; other warnings as Python shows them."""
    if isinstance(message, BudgetWarning):  # the library names its parameter, we our flag
        echo_err(f"memplan: warning: {message.for_flag(FLAGS[message.parameter])}")
    elif issubclass(category, MemplanWarning):
        echo_err(f"memplan: warning: {_one_line(message)}")
    else:
        shown(message, category, *args, **kwargs)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _fail(exc: BaseException, line: str, code: int) -> None:
    if debug_enabled():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    elif code == EXIT_INTERNAL:
        line += "; --debug shows the traceback"
    echo_err(line)
    raise typer.Exit(code) from None


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# --------------------------------------------------------------------------- inputs


def stdin_is_terminal() -> bool:
    """True when nothing is piped in (a terminal, or no stdin at all)."""
    stream = sys.stdin
    if stream is None:
        return True
    try:
        return stream.isatty()
    except (ValueError, AttributeError):
        return True


def profile_source(profile: str | None) -> str:
    """PROFILE as given, or ``-`` when it is left out and stdin is a pipe (SPEC: PROFILE)."""
    if profile is not None:
        return profile
    if stdin_is_terminal():
        raise InputError(
            "missing PROFILE: give a file, a bundled name or '-', or pipe a profile in, "
            f"e.g. {PIPE_EXAMPLE}"
        )
    return "-"


def _reword(option: str, exc: InputError, value: str) -> InputError:
    """``--capacity 1.5: ...`` from the parser's ``size '1.5': ...``: the option as typed."""
    text = str(exc)
    for what in ("size", "rate"):
        prefix = f"{what} {value!r}: "
        if text.startswith(prefix):
            return InputError(f"{option} {value}: {text[len(prefix) :]}")
    return InputError(f"{option}: {text}")


def option_size(option: str, value: str | None) -> int | None:
    """Parse a size option (``8GB``, ``8GiB``, bytes); the message names the option."""
    from memplan.units import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except InputError as exc:
        raise _reword(option, exc, value) from None


def option_rate(option: str, value: str | None) -> float | None:
    """Parse a rate option (``12.2GB/s``, ``16GiB/s``); the message names the option."""
    from memplan.units import parse_rate

    if value is None:
        return None
    try:
        return parse_rate(value)
    except InputError as exc:
        raise _reword(option, exc, value) from None


def check_positive(option: str, value: float | int | None) -> None:
    """A usage error unless ``value`` is None or a finite number > 0 (``nan`` and ``inf`` too)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InputError(f"{option} {value}: expected a finite positive number")


# --------------------------------------------------------------------------- formats and output


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    yaml = "yaml"
    csv = "csv"


SUFFIX_FORMATS = {
    ".json": Format.json,
    ".yaml": Format.yaml,
    ".yml": Format.yaml,
    ".csv": Format.csv,
}


def resolve_format(fmt: enum.Enum | None, output: Path | None, allowed: tuple[str, ...]) -> str:
    """The output format: ``--format``, else the ``-o`` file's suffix, else ``table``."""
    machine = [f for f in allowed if f != "table"]
    if fmt is not None:
        name = str(fmt.value)
        if name not in allowed:  # pragma: no cover - typer's choices prevent it
            raise InputError(f"--format {name}: expected one of {'|'.join(allowed)}")
        if name == "table" and output is not None:
            raise InputError(
                f"-o {output}: tables go to the terminal; write a file with "
                f"--format {'|'.join(machine)}"
            )
        return name
    if output is None:
        return "table"
    guess = SUFFIX_FORMATS.get(output.suffix.lower())
    if guess is None or guess.value not in allowed:
        raise InputError(
            f"-o {output}: cannot tell the format from the file name; "
            f"add --format {'|'.join(machine)}"
        )
    return guess.value


def write_output(text: str, output: Path | None) -> None:
    """One document to stdout, or atomically to ``output`` (then one 'wrote' line on stderr)."""
    from memplan.files import write_atomic  # not memplan.profile: no yaml, no pydantic

    if not text.endswith("\n"):
        text += "\n"
    if output is None:
        if _is_terminal(sys.stdout):  # a person reads it: NOTE [ control characters ]
            text = escape_control(text)
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        write_atomic(output, text)
    except OSError as exc:
        raise InputError(f"{output}: cannot write: {exc.strerror or exc}") from None
    echo_err(f"memplan: wrote {output}")


# NOTE [ report precision ]
# A report (``compare`` CSV and JSON, ``simulate --format json``, ``info --format json|yaml``) prints
# what was measured, not the noise of float sums: a makespan sums measured times (5285.043142000001
# is 5285.043142 ms plus the last bit of a double). Every float of a report is rounded to
# REPORT_DECIMALS decimals: times in ms to 1 ns (the profiler's resolution: it writes times in ms
# with 6 decimals), solver seconds to 1 us, ratios to 1e-6; sizes are integers. A CSV cell is
# written with fixed decimals (``0.000049``, never ``4.9e-05``), trailing zeros dropped. Schedules
# (``solve -f json|yaml``) are not reports: they keep every bit, which the simulator replays.

REPORT_DECIMALS = 6
"""Decimals of the floats of a report (NOTE [ report precision ])."""


def rounded(value: Any) -> Any:
    """``value`` with every finite float rounded to :data:`REPORT_DECIMALS` decimals, through
    dicts, lists and tuples (ints, booleans, strings, None and non-finite floats as they are).
    """
    if isinstance(value, float):
        return round(value, REPORT_DECIMALS) if math.isfinite(value) else value
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(item) for item in value]
    return value


def report_json(doc: Any) -> str:
    """A report as JSON, its floats :func:`rounded` (NOTE [ report precision ])."""
    import json

    return json.dumps(rounded(doc), indent=2)


def csv_number(value: float) -> str:
    """A float for a CSV cell: fixed decimals, no exponent, trailing zeros dropped (``1.0``)."""
    if not math.isfinite(value):
        return str(value)
    text = f"{value:.{REPORT_DECIMALS}f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (ValueError, AttributeError):
        return False


def size_text(nbytes: int | float | None, typed: str | None = None, *, up: bool = False) -> str:
    """``2.53 GB (2534567890 bytes)``: in the units of the size the user typed (``typed``, e.g.
    ``--mem 2GiB``: ``2.36 GiB (2534567890 bytes)``), the exact bytes beside when the short form
    is not exact (:func:`memplan.units.format_size_like`; ``up``: rounded up, for a least memory).
    """
    from memplan.units import format_size_like

    if nbytes is None:
        return "-"
    return format_size_like(int(nbytes), typed, up=up)


# --------------------------------------------------------------------------- tables

# NOTE [ table width ]
# A table never drops characters of a cell (at 80 columns rich cut a weight of ``300K``
# to ``300``). Number columns do not wrap; text columns wrap at spaces. When stderr is not a
# terminal (a CI log, ``2> log``) a table that does not fit is printed at its full width, every
# cell on one line, and no line carries trailing blanks (a key-value table with one long value
# pads none of its other rows to that width); on a terminal it gets at least the width of its
# longest words, so text wraps and nothing is cut (a terminal narrower than that wraps the lines
# itself).
# tests/cli/test_width.py checks every table of info, solve, simulate, compare and algos at
# COLUMNS=80, both ways.

_UNBOUNDED = 100_000


def table_width(console: Console, renderable: RenderableType) -> int:
    """The width ``renderable`` is printed at on ``console`` (NOTE [ table width ])."""
    from rich.measure import Measurement

    options = console.options.update_width(_UNBOUNDED)
    _pin_unwrapped_columns(console, renderable)
    needed = Measurement.get(console, options, renderable)
    wanted = needed.minimum if console.is_terminal else needed.maximum
    return max(console.width, min(wanted, _UNBOUNDED))


def _pin_unwrapped_columns(console: Console, renderable: object) -> None:
    """Give every ``no_wrap`` column of the tables in ``renderable`` its widest cell as minimum.

    rich measures a column's minimum as its longest word, wrapping or not, and narrows the
    columns that wrap below their longest word when the sum is too wide; with the widest cell of
    the others as their minimum, the measured minimum is what the table needs uncut.
    """
    from rich.console import Group
    from rich.measure import Measurement
    from rich.table import Table

    if isinstance(renderable, Group):
        for part in renderable.renderables:
            _pin_unwrapped_columns(console, part)
        return
    if not isinstance(renderable, Table):
        return
    options = console.options.update_width(_UNBOUNDED)
    for column in renderable.columns:
        if column.no_wrap:
            cells = [column.header, *column.cells]
            widest = max((Measurement.get(console, options, c).maximum for c in cells), default=0)
            column.min_width = max(column.min_width or 0, widest)


def print_table(renderable: RenderableType, console: Console | None = None) -> None:
    """Print a table (or a group of them) on stderr without cutting any cell.

    Not on a terminal (a CI log), the lines carry no trailing blanks: a table as wide as its
    longest row pads none of the others to that width (NOTE [ table width ]).
    """
    console = err_console() if console is None else console
    width = table_width(console, renderable)
    if width > console.width:
        console.width = width
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    lines = captured.get().split("\n")
    console.file.write("\n".join(line.rstrip() for line in lines))
    console.file.flush()
