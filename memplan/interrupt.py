"""One Ctrl-C, SIGTERM or SIGHUP stops every phase, CP-SAT searches included, and leaves nothing.

NOTE [ interrupts ]
Python turns SIGINT into ``KeyboardInterrupt`` between two bytecodes; the command line
(:func:`install`, called by ``memplan``'s entry point) has SIGTERM (``kill``, ``timeout``) and
SIGHUP (a closed terminal) raise :class:`Terminated`, a ``KeyboardInterrupt`` too, so that every
``except KeyboardInterrupt`` and ``finally`` of memplan runs for them as for Ctrl-C. The CLI maps
them to exit 128 + the signal (130, 143, 129: what a shell reports for a process killed by it)
with nothing written: every output file is written to a temporary file and renamed at the very
end (NOTE [ safe writes ] in :mod:`memplan.files`), and the temporaries are removed. A signal
that Python ignored at start (``nohup`` ignores SIGHUP, a shell ignores SIGINT for a background
job) stays ignored.

Two short sections hold the signals (:func:`deferred`): creating a temporary file (so that its
name is known before an interrupt can be raised, and it is always removed) and the final renames
of a command's outputs. Once a command has renamed its outputs into place it is done
(:func:`finish`), and once ``main`` returns the signals are ignored (:func:`ignore`; Python's
shutdown would otherwise put their default action back): a signal arriving in the milliseconds
before the process exits ends nothing, so that exit 0 always means the outputs are written and
128 + n always means none is.

CP-SAT needs more. Left alone, it installs its own SIGINT handler for the duration of
``solve()`` and treats Ctrl-C as a time limit: ``solve()`` returns its incumbent as FEASIBLE,
Python never sees the interrupt, and ``pipeline-ilp`` goes on to its next phase and writes its
``-o`` file. With ``catch_sigint_signal`` off, Python's handler only runs once ``solve()``
returns, at the time limit. So :func:`solve` turns CP-SAT's handler off and, for the duration of
the search, has Python's C-level handler write the signal number to a pipe
(:func:`signal.set_wakeup_fd`): a watcher thread reading the pipe calls ``stop_search()`` on
SIGINT, SIGTERM or SIGHUP, the search ends within milliseconds, and the pending exception is
raised as soon as ``solve()`` returns. Every CP-SAT solve in memplan goes through :func:`solve`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # ortools is imported by the solvers only, when they run
    from ortools.sat.python.cp_model import CpModel, CpSolver, CpSolverSolutionCallback
    from ortools.sat.python.cp_model_helper import CpSolverStatus

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""The signals that stop a command (SIGHUP does not exist on Windows)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Python raises ``KeyboardInterrupt`` for SIGINT."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _State:
    finished = False  # the command has written its outputs: signals end nothing any more
    raised: KeyboardInterrupt | None = None  # the stop signal raised since the command began


_state = _State()


def exit_status(exc: KeyboardInterrupt) -> int:
    """128 + the signal that raised ``exc``: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


def interrupt_within(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or stop signal that ``exc`` wraps, if any.

    Python 3.11 and older wrap what a ``__set_name__`` raises, a signal's exception included, in
    a RuntimeError (an interrupt that lands while a class body runs, as in a lazy import): such an
    error is the interrupt, not the model's or the input's fault.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def stopped_by(exc: BaseException) -> KeyboardInterrupt | None:
    """The stop signal behind ``exc``: one it wraps (:func:`interrupt_within`), or one the CLI's
    handler raised since the command began, which a library turned into an error of its own
    without chaining it (pydantic's serializers report a ``KeyboardInterrupt`` raised in a field
    function as a ``PydanticSerializationError`` naming it).
    """
    return interrupt_within(exc) or _state.raised


def _raise(signum: int, _frame: Any) -> None:
    """The CLI's handler of :data:`STOP_SIGNALS` (NOTE [ interrupts ])."""
    if _state.finished:
        return
    _state.raised = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
    raise _state.raised


def install() -> None:
    """Have SIGINT, SIGTERM and SIGHUP raise in the main thread (the command line's entry point;
    a library never calls it). A signal ignored at start stays ignored.
    """
    _state.finished = False
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _raise)


def begin() -> None:
    """A command starts: signals stop it again (after an earlier :func:`finish`, in tests)."""
    _state.finished = False
    _state.raised = None


def finish() -> None:
    """The command has written its outputs: the CLI's handler ignores signals from now on."""
    _state.finished = True


def ignore() -> None:
    """The process is about to exit with its outcome decided: ignore the stop signals outright
    (Python puts their default action back while it shuts down, and a SIGTERM then would kill
    a process whose outputs are written; the command line's entry point calls it last).
    """
    _state.finished = True
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is _raise:
                signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP for the ``with`` block; the first one that came is handled
    when it ends (by the handler that was in place: it raises, or, after :func:`finish`, not).

    Only signals with a Python handler are held (a default action or an ignored signal is left
    alone), and only in the main thread, the one Python runs handlers in.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[int, Any] = {}
    for signum in STOP_SIGNALS:
        handler = signal.getsignal(signum)
        if callable(handler):
            previous[signum] = handler
            signal.signal(signum, lambda number, _frame: held.append(number))
    try:
        yield
    finally:
        for held_signum, handler in previous.items():
            signal.signal(held_signum, handler)
        if held:
            previous[held[0]](held[0], None)


def solve(
    solver: CpSolver, model: CpModel, callback: CpSolverSolutionCallback | None = None
) -> CpSolverStatus:
    """``solver.solve(model, callback)``, stopped at once by a SIGINT, SIGTERM or SIGHUP (see
    NOTE [ interrupts ]).

    Returns CP-SAT's status; raises ``KeyboardInterrupt`` (:class:`Terminated`) when a signal
    arrived during the search.
    """
    with _stop_on_signals(solver):
        return solver.solve(model, callback) if callback is not None else solver.solve(model)


@contextlib.contextmanager
def _stop_on_signals(solver: CpSolver) -> Iterator[None]:
    """Call ``solver.stop_search()`` from a watcher thread when a stop signal arrives.

    Outside the main thread, or when Python handles none of :data:`STOP_SIGNALS`, CP-SAT keeps
    its own handler (Ctrl-C ends the search as a time limit would): there is no exception to relay.
    """
    stopping = [signum for signum in STOP_SIGNALS if callable(signal.getsignal(signum))]
    if threading.current_thread() is not threading.main_thread() or not stopping:
        yield
        return
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(write_end, False)
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except (OSError, ValueError):  # pragma: no cover - a platform without non-blocking pipes
        os.close(read_end)
        os.close(write_end)
        yield
        return
    solver.parameters.catch_sigint_signal = False
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                data = os.read(read_end, 64)
            except OSError:  # pragma: no cover
                return
            if previous >= 0 and data:  # pass the bytes on to whoever listened before
                with contextlib.suppress(OSError):
                    os.write(previous, data)
            if not done.is_set() and any(signum in data for signum in stopping):
                solver.stop_search()

    watcher = threading.Thread(target=watch, name="memplan-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        with contextlib.suppress(OSError):
            os.write(write_end, b"\0")  # wake the watcher up so that it ends
        watcher.join()
        os.close(read_end)
        os.close(write_end)
