"""Whose error is it: an exception raised by the user's model is bad input, not a bug in memplan.

NOTE [ whose error ]
Building a model (a ``package.module:factory`` of the user's, a Hugging Face config class with
the user's ``--config``, a timm or torchvision constructor) and running it on its example input
the first time (while the chain is cut and checked) run the user's code: a ``ValueError`` of a
factory, ``padding_idx must be within num_embeddings`` of a config that the model rejects, a
``KeyError`` in a ``forward`` are the user's input, reported as :class:`~memplan.errors.InputError`
(exit 2) with one line that names the model and the cause. Everything after that first forward
(profiling, solving, training under a plan) is memplan's work, and an unexpected exception there
stays a bug (exit 70).

Inside those two phases, memplan's own code runs too (parsing the config, cutting the chain), so
the traceback decides: the error is the model's when it was raised below the innermost frame of
memplan's code, i.e. in code memplan called, and, for the first forward, when that code was
entered through a module call (``nn.Module.__call__``, the model or one of its layers). An
exception raised by a line of memplan's own is a bug whatever the phase.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from memplan.errors import InputError, MemplanError
from memplan.interrupt import interrupt_within

BUILDING = "cannot be built"
"""The phase that builds the model (factory, config class, constructor, example input)."""
FIRST_FORWARD = "fails on its example input"
"""The phase that runs the model the first time (cutting and checking its chain)."""

_MEMPLAN = Path(__file__).resolve().parents[2]  # memplan/, above torch/base/
_MODULE_CALL = ("torch", "nn", "modules", "module.py")
_LIBRARIES = tuple(
    {
        str(Path(path).resolve())
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)


@contextmanager
def model_errors(model: str, phase: str, given: str = "") -> Iterator[None]:
    """Turn an exception that the model raises during ``phase`` into an :class:`InputError`.

    Parameters
    ----------
    model : str
        How the message names the model (``badfac:make``, ``hf:phi3``).
    phase : str
        :data:`BUILDING` or :data:`FIRST_FORWARD` (see NOTE [ whose error ]).
    given : str
        What the user gave besides the name, after it: `` with --config vocab_size=1000``.

    Raises
    ------
    InputError
        ``model 'NAME' cannot be built: ValueError: ... (factory.py, line 3, in make)``; the
        original exception is its ``__cause__`` (``--debug`` shows its traceback).
    """
    try:
        yield
    except MemplanError:
        raise
    except Exception as exc:
        stop = interrupt_within(exc)
        if stop is not None:
            raise stop from None
        if not raised_by_model(exc, through_module_call=phase == FIRST_FORWARD):
            raise
        raise InputError(f"model {model!r}{given} {phase}: {describe(exc)}") from exc


def raised_by_model(exc: BaseException, *, through_module_call: bool) -> bool:
    """Whether ``exc`` came from code that memplan called rather than from memplan's own lines
    (and, with ``through_module_call``, from code entered through ``nn.Module.__call__``).
    """
    files = [_file(tb) for tb in _frames(exc.__traceback__)]
    ours = [i for i, name in enumerate(files) if _is_memplan(name)]
    below = files[ours[-1] + 1 :] if ours else files
    if not below:
        return False
    if through_module_call:
        return any(Path(name).parts[-4:] == _MODULE_CALL for name in below)
    return True


def describe(exc: BaseException) -> str:
    """``KeyError: 'x' (model.py, line 10, in forward)``: the type, the first line of the message
    and the innermost line of the user's own code (not of an installed library), when there is
    one.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    for tb in reversed(list(_frames(exc.__traceback__))):
        name = _file(tb)
        if not _is_memplan(name) and not _in_library(name) and not name.startswith("<"):
            return f"{text} ({_shown(name)}, line {tb.tb_lineno}, in {tb.tb_frame.f_code.co_name})"
    return text


def _frames(tb: TracebackType | None) -> Iterator[TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _file(tb: TracebackType) -> str:
    return tb.tb_frame.f_code.co_filename


def _is_memplan(name: str) -> bool:
    return not name.startswith("<") and Path(name).resolve().is_relative_to(_MEMPLAN)


def _in_library(name: str) -> bool:
    resolved = str(Path(name).resolve())
    return any(resolved.startswith(root + os.sep) for root in _LIBRARIES)


def _shown(name: str) -> str:
    """A file name as the user would type it: relative to the current directory when inside."""
    path = Path(name).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


__all__ = ["BUILDING", "FIRST_FORWARD", "describe", "model_errors", "raised_by_model"]
