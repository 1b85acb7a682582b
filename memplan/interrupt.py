"""One Ctrl-C stops every phase, CP-SAT searches included.

NOTE [ interrupts ]
Python turns SIGINT into ``KeyboardInterrupt`` between two bytecodes; the CLI maps it to exit 130
(128 + SIGINT, what a shell reports) with nothing written (files are written last, atomically,
NOTE [ safe writes ] in :mod:`memplan.files`). Pure-Python and numpy phases (parsing, the DPs,
``memplan alloc``'s search, the simulators) stop at once.

CP-SAT needs more. Left alone, it installs its own SIGINT handler for the duration of
``solve()`` and treats Ctrl-C as a time limit: ``solve()`` returns its incumbent as FEASIBLE,
Python never sees the interrupt, and ``pipeline-ilp`` goes on to its next phase and writes its
``-o`` file. With ``catch_sigint_signal`` off, Python's handler only runs once ``solve()``
returns, at the time limit. So :func:`solve` turns CP-SAT's handler off and, for the duration of
the search, has Python's C-level handler write the signal number to a pipe
(:func:`signal.set_wakeup_fd`): a watcher thread reading the pipe calls ``stop_search()``, the
search ends within milliseconds, and the pending ``KeyboardInterrupt`` is raised as soon as
``solve()`` returns. Every CP-SAT solve in memplan goes through :func:`solve`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any


def solve(solver: Any, model: Any, callback: Any = None) -> Any:
    """``solver.solve(model, callback)``, stopped at once by a SIGINT (see NOTE [ interrupts ]).

    Returns CP-SAT's status; raises ``KeyboardInterrupt`` when a SIGINT arrived during the search.
    """
    with _stop_on_sigint(solver):
        return solver.solve(model, callback) if callback is not None else solver.solve(model)


@contextlib.contextmanager
def _stop_on_sigint(solver: Any):
    """Call ``solver.stop_search()`` from a watcher thread when SIGINT arrives.

    Outside the main thread, or when Python does not handle SIGINT, CP-SAT keeps its own handler
    (Ctrl-C ends the search as a time limit would): there is no ``KeyboardInterrupt`` to relay.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(
        signal.SIGINT
    ) in (signal.SIG_IGN, signal.SIG_DFL, None):
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
            if not done.is_set() and signal.SIGINT in data:
                solver.stop_search()

    watcher = threading.Thread(target=watch, name="memplan-sigint", daemon=True)
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
