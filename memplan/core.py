"""The compiled core, :mod:`memplan._core` (C++17 in src/, built with nanobind by scikit-build-core).

It holds the hot loops: rotor's dynamic programs (the slot grid, the DP in bytes, the dense table
that pofo and join read) and the allocation search with its greedy first fit. Each kernel takes
numpy arrays, releases the GIL while it works and stops within a second on Ctrl-C or at its time
limit (NOTE [ stopping a kernel ] in src/stop.hpp). It is the only implementation used; the Python
references it is tested against are in tests/oracles/.

Import the kernels as ``from memplan.core import kernels``. A missing core is a broken installation: importing this module then fails with a one-line message
saying how to reinstall.
"""

from __future__ import annotations

try:
    from memplan import _core as kernels
except ImportError as exc:  # a source tree never built, or a wheel for another platform
    raise ImportError(
        f"memplan's compiled core (memplan._core) does not load ({exc}): reinstall memplan "
        "(pip install --force-reinstall memplan; in a source tree: make, or pip install -e .)"
    ) from None

__all__ = ["build_line", "kernels"]


def build_line() -> str:
    """``core 0.1.0 (GNU 12.2.0, Release, nanobind 2.9.2)``: what ``memplan --version`` prints."""
    info = kernels.build_info()
    return (
        f"core {info['version']} ({info['compiler']}, {info['build_type']}, "
        f"nanobind {info['nanobind']})"
    )
