"""memplan: plan GPU memory for deep-neural-network training.

>>> import memplan
>>> prof = memplan.load_profile("resnet50")                              # doctest: +SKIP
>>> sched = memplan.solve(prof, algo="rotor", memory="2GB")              # doctest: +SKIP
>>> memplan.simulate(prof, sched).valid                                  # doctest: +SKIP
True

Importing memplan loads neither torch, matplotlib nor ortools.

NOTE [ lazy package ]
The names below are imported when first used (PEP 562), so that ``import memplan.cli.app`` (every
``memplan`` command starts there) costs nothing it does not need: ``memplan --version``,
``memplan algos`` and :func:`memplan.list_algorithms` load neither numpy nor pydantic
(tests/cli/test_startup.py).
``memplan.algorithms`` is the subpackage of the algorithms, a plain module; the list of them is
:func:`memplan.list_algorithms`.
Any other subpackage or module reached as an attribute (``memplan.api.describe``,
``memplan.profile``) is imported on that first access, so it works whether or not something
imported it before.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "InputError": "memplan.errors",
    "InternalError": "memplan.errors",
    "MemplanError": "memplan.errors",
    "Profile": "memplan.profile",
    "Stage": "memplan.profile",
    "load_profile": "memplan.profile",
    "save_profile": "memplan.profile",
    "Schedule": "memplan.schedule",
    "load_schedule": "memplan.schedule",
    "parse_rate": "memplan.units",
    "parse_size": "memplan.units",
    "compare": "memplan.api",
    "list_algorithms": "memplan.algorithms",
    "simulate": "memplan.api",
    "solve": "memplan.api",
}
"""Public name -> the module that defines it (imported on first use)."""

__all__ = [
    "InputError",
    "InternalError",
    "MemplanError",
    "Profile",
    "Schedule",
    "Stage",
    "__version__",
    "compare",
    "list_algorithms",
    "load_profile",
    "load_schedule",
    "parse_rate",
    "parse_size",
    "save_profile",
    "simulate",
    "solve",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from memplan.algorithms import list_algorithms
    from memplan.api import compare, simulate, solve
    from memplan.errors import InputError, InternalError, MemplanError
    from memplan.profile import Profile, Stage, load_profile, save_profile
    from memplan.schedule import Schedule, load_schedule
    from memplan.units import parse_rate, parse_size


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        return _submodule(name)
    value = getattr(importlib.import_module(module), name)
    setattr(sys.modules[__name__], name, value)  # the next access is a plain lookup
    return value


def _submodule(name: str) -> Any:
    """Import a subpackage or module reached as an attribute (``memplan.api``).

    It is imported then, whatever was imported before (NOTE [ lazy package ]).
    """
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # which sets the attribute
    raise AttributeError(f"module 'memplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
