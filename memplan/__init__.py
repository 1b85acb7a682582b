"""memplan: plan GPU memory for deep-neural-network training.

>>> import memplan
>>> prof = memplan.load_profile("resnet50")                              # doctest: +SKIP
>>> sched = memplan.solve(prof, algo="rotor", memory="2GB")              # doctest: +SKIP
>>> memplan.simulate(prof, sched).valid                                  # doctest: +SKIP
True

Importing memplan loads neither torch, matplotlib nor ortools.

NOTE [ lazy package ]
The names below are imported when first used (PEP 562), so that ``import memplan.cli.app`` (every
``memplan`` command starts there) costs nothing it does not need: ``memplan --version`` loads
neither numpy nor pydantic (tests/cli/test_app.py::test_version_imports_neither_numpy_nor_pydantic). The subpackage ``memplan.algorithms`` and the
function :func:`memplan.algorithms` share a name: importing the subpackage sets the attribute on
this module, which :class:`_Package` refuses, so ``memplan.algorithms()`` stays the function
whatever was imported before; the function (:class:`_FunctionOverPackage`) hands the subpackage's
attributes on, so ``import memplan.algorithms.chain.rotor as rotor`` and
``memplan.algorithms.chain`` work too (tests/test_api.py checks both). Any other subpackage or
module reached as an attribute (``memplan.api.describe``, ``memplan.profile``) is imported on that
first access, so it works whether or not something imported it before.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
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
    "algorithms": "memplan.api",
    "compare": "memplan.api",
    "simulate": "memplan.api",
    "solve": "memplan.api",
    "static_memory": "memplan.api",
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
    "algorithms",
    "compare",
    "load_profile",
    "load_schedule",
    "parse_rate",
    "parse_size",
    "save_profile",
    "simulate",
    "solve",
    "static_memory",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from memplan.api import algorithms, compare, simulate, solve, static_memory
    from memplan.errors import InputError, InternalError, MemplanError
    from memplan.profile import Profile, Stage, load_profile, save_profile
    from memplan.schedule import Schedule, load_schedule
    from memplan.units import parse_rate, parse_size


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        return _submodule(name)
    value = getattr(importlib.import_module(module), name)
    if name == "algorithms":
        value = _FunctionOverPackage(value, "memplan.algorithms")
    object.__setattr__(sys.modules[__name__], name, value)  # the next access is a plain lookup
    return value


def _submodule(name: str) -> types.ModuleType:
    """``memplan.api``, ``memplan.profile``, ...: a subpackage or module reached as an attribute
    is imported then, whatever was imported before (NOTE [ lazy package ])."""
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # which sets the attribute
    raise AttributeError(f"module 'memplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _FunctionOverPackage:
    """A function that also reaches the attributes of the package of the same name (NOTE [ lazy
    package ]): ``memplan.algorithms()`` calls it, ``memplan.algorithms.chain`` is the
    subpackage's."""

    def __init__(self, function: Any, package: str) -> None:
        functools.update_wrapper(self, function)
        self._package = package

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__wrapped__(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module(self._package), name)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


class _Package(types.ModuleType):
    """This module: importing ``memplan.algorithms`` never hides the function of that name."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "algorithms" and isinstance(value, types.ModuleType):
            return  # the subpackage stays reachable as sys.modules["memplan.algorithms"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
