"""Progress of long work on stderr: a rich bar on a terminal, plain lines everywhere else.

A CI service kills a job whose log stays silent for about ten minutes, and ``2> log`` should
show how far a run got; a rich bar draws nothing when stderr is not a terminal. So
:class:`Progress` draws the bar on a terminal and otherwise writes one line per step
(``memplan: profiling resnet50: 3/19 layer1.1 (41 s)``), or, with ``every`` seconds, at most one
line per that many seconds (a long ``compare``: a line only when the sweep runs long enough to
need one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from memplan.cli.common import echo_err, err_console

__all__ = ["Progress"]


class Progress:
    """A context manager: ``update(done, total, what)`` after each step of a long run.

    Parameters
    ----------
    label : str
        What runs (``profiling resnet50``), the start of every line.
    every : float
        Off a terminal: seconds between two lines at least (0: one line per step).
    terminal : bool, optional
        Draw the rich bar (default: when stderr is a terminal).
    clock : callable
        Seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        label: str,
        *,
        every: float = 0.0,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.every = every
        self.clock = clock
        console = err_console()
        self.terminal = console.is_terminal if terminal is None else terminal
        self.started = self.last = clock()
        self._bar: Any = None
        self._task: Any = None
        if self.terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn(label.replace("[", r"\[")),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )

    def __enter__(self) -> Progress:
        self.started = self.last = self.clock()
        if self._bar is not None:
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=None)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, value, traceback)

    def note(self, message: str) -> None:
        """One line off a terminal (``memplan: LABEL: message``); nothing on a terminal."""
        if not self.terminal:
            echo_err(f"memplan: {self.label}: {message}")

    def update(self, done: int, total: int, what: str = "") -> None:
        """Step ``done`` of ``total`` finished; ``what`` names it (a stage, ...)."""
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total, description=str(what))
            return
        now = self.clock()
        if self.every > 0 and now - self.last < self.every:
            return
        self.last = now
        step = f"{done}/{total}" + (f" {what}" if what else "")
        echo_err(f"memplan: {self.label}: {step} ({now - self.started:.0f} s)")
