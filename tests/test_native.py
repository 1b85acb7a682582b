"""memplan.native: numba cfuncs built once to object code, loaded later without numba.

Each test writes its own small kernel module into a temporary directory (on sys.path) and keeps
the object cache there (MEMPLAN_CACHE_DIR), so nothing depends on an earlier run.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from memplan import native

pytest.importorskip("numba", reason="the fast extra (numba) builds native kernels")

PROTOTYPE = native.Prototype(ctypes.c_int64, (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64))

DOUBLE_SUM = """
import numpy as np
from numba import carray, cfunc, njit, types

@njit(nogil=True, error_model="numpy")
def double_sum(a, out):
    total = 0
    for i in range(a.shape[0]):
        out[i] = FACTOR * a[i]
        total += out[i] // 3
    return total

@cfunc(types.int64(types.voidptr, types.voidptr, types.int64), nopython=True, error_model="numpy")
def entry(a, out, n):
    return double_sum(carray(a, (n,), np.int64), carray(out, (n,), np.int64))
"""

ALLOCATES = """
import numpy as np
from numba import carray, cfunc, njit, types

@njit(nogil=True, error_model="numpy")
def with_scratch(a, out):
    scratch = np.empty(a.shape[0], dtype=np.int64)
    for i in range(a.shape[0]):
        scratch[i] = a[i]
        out[i] = scratch[i]
    return 0

@cfunc(types.int64(types.voidptr, types.voidptr, types.int64), nopython=True, error_model="numpy")
def entry(a, out, n):
    return with_scratch(carray(a, (n,), np.int64), carray(out, (n,), np.int64))
"""

RAISES = """
import numpy as np
from numba import carray, cfunc, njit, types

@njit(nogil=True, error_model="numpy")
def checked(a, out):
    if a.shape[0] > 3:
        raise ValueError("too long")
    return 0

@cfunc(types.int64(types.voidptr, types.voidptr, types.int64), nopython=True, error_model="numpy")
def entry(a, out, n):
    return checked(carray(a, (n,), np.int64), carray(out, (n,), np.int64))
"""

CALL = """
import ctypes, sys
import numpy as np
if "--no-numba" in sys.argv:
    sys.modules["numba"] = None  # importing numba now fails
from memplan import native
lib = native.load({module!r}, {{"entry": native.Prototype(ctypes.c_int64,
    (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64))}})
a = np.arange({n}, dtype=np.int64)
out = np.zeros({n}, dtype=np.int64)
print(lib["entry"](a.ctypes.data, out.ctypes.data, {n}), out.tolist())
"""


@pytest.fixture
def kernel_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MEMPLAN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MEMPLAN_NATIVE", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(native, "_LOADED", {})
    return tmp_path


def write_kernel(directory: Path, name: str, source: str, factor: int = 2) -> str:
    (directory / f"{name}.py").write_text(textwrap.dedent(source).replace("FACTOR", str(factor)))
    return name


def run_call(directory: Path, module: str, n: int, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{directory}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    script = CALL.format(module=module, n=n)
    return subprocess.run(
        [sys.executable, "-c", script, *flags], capture_output=True, text=True, env=env, timeout=300
    )


def test_built_once_then_loaded_without_numba(kernel_dir: Path) -> None:
    module = write_kernel(kernel_dir, "nk_double", DOUBLE_SUM)
    lib = native.load(module, {"entry": PROTOTYPE})
    a = np.arange(10, dtype=np.int64)
    out = np.zeros(10, dtype=np.int64)
    assert lib["entry"](a.ctypes.data, out.ctypes.data, 10) == sum(2 * i // 3 for i in range(10))
    assert out.tolist() == [2 * i for i in range(10)]
    stored = list((kernel_dir / "cache" / "native").iterdir())
    assert len(stored) == 1 and (stored[0] / "entry.o").is_file()
    # A fresh process where numba cannot be imported loads the stored object.
    done = run_call(kernel_dir, module, 7, "--no-numba")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 1)[0] == str(sum(2 * i // 3 for i in range(7)))


def test_numba_compiled_later_in_the_same_process_still_works(kernel_dir: Path) -> None:
    """The symbols bound for a native kernel stay bound process-wide: numba's own code compiled
    afterwards (its wrappers call Python's C API) must not reach a trap."""
    module = write_kernel(kernel_dir, "nk_then_numba", DOUBLE_SUM)
    native.load(module, {"entry": PROTOTYPE})  # stored
    later = (
        "\nimport numba\n"
        "@numba.njit\n"
        "def fails(x):\n"
        "    raise ValueError('from numba')\n"
        "try:\n"
        "    fails(1)\n"
        "except ValueError as exc:\n"
        "    print('caught', exc)\n"
        "print(numba.njit(lambda v: (v, str(v)))(3))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{kernel_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    script = CALL.format(module=module, n=3) + later
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "caught from numba" in done.stdout and "(3, '3')" in done.stdout


def test_source_edit_rebuilds_and_damage_is_repaired(kernel_dir: Path) -> None:
    module = write_kernel(kernel_dir, "nk_edit", DOUBLE_SUM)
    native.load(module, {"entry": PROTOTYPE})
    write_kernel(kernel_dir, "nk_edit", DOUBLE_SUM, factor=3)  # a new key: built again
    done = run_call(kernel_dir, module, 4)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("[0, 3, 6, 9]")
    assert len(list((kernel_dir / "cache" / "native").iterdir())) == 2
    for obj in (kernel_dir / "cache" / "native").glob("*/entry.o"):
        obj.write_bytes(obj.read_bytes()[:100])  # truncated: fails its checksum, rebuilt
    done = run_call(kernel_dir, module, 4)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("[0, 3, 6, 9]")


def test_a_kernel_that_allocates_is_refused(kernel_dir: Path) -> None:
    module = write_kernel(kernel_dir, "nk_alloc", ALLOCATES)
    with pytest.raises(native.NativeUnavailable, match="must not allocate"):
        native.load(module, {"entry": PROTOTYPE})


def test_an_error_path_stops_the_process_with_a_message(kernel_dir: Path) -> None:
    module = write_kernel(kernel_dir, "nk_raise", RAISES)
    native.load(module, {"entry": PROTOTYPE})  # built (and fine on short input)
    assert run_call(kernel_dir, module, 2, "--no-numba").returncode == 0
    done = run_call(kernel_dir, module, 5, "--no-numba")
    assert done.returncode != 0
    assert "reached" in done.stderr and "MEMPLAN_NATIVE=0" in done.stderr


def test_turned_off_by_the_environment(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = write_kernel(kernel_dir, "nk_off", DOUBLE_SUM)
    monkeypatch.setenv("MEMPLAN_NATIVE", "0")
    with pytest.raises(native.NativeUnavailable, match="MEMPLAN_NATIVE=0"):
        native.load(module, {"entry": PROTOTYPE})
    assert not (kernel_dir / "cache").exists()


def test_an_unwritable_cache_home_falls_back_to_the_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache home should be")
    monkeypatch.delenv("MEMPLAN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = native.cache_root()
    assert root.parent == tmp_path / "tmp" and root.name.startswith("memplan-cache-")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert native.cache_root() == tmp_path / "xdg" / "memplan"


def test_missing_module_is_unavailable(kernel_dir: Path) -> None:
    with pytest.raises(native.NativeUnavailable, match="not found"):
        native.load("nk_no_such_module", {"entry": PROTOTYPE})
