"""Compiled kernels without numba at run time: numba ``cfunc``s built once to machine code, kept in
a cache directory, and loaded afterwards with llvmlite alone.

Why: importing numba and loading a kernel from numba's own cache costs about 0.35 s of every
process that uses one (measured for ``memplan alloc``: 0.16-0.19 s for ``import numba``, as much
again for the cached kernel), more than the work itself on most inputs. numba is the ``fast``
extra; llvmlite comes with it.

How: a kernel module (imported only to build) defines each entry point as a numba ``cfunc`` (a
function with a C signature). :func:`load` takes the final LLVM IR of each (``cfunc.inspect_llvm``),
compiles it to an object file for this machine with llvmlite's public binding API, and stores it
in ``<cache>/native/<module>-<key>/``, the key hashing the sources, the llvmlite and Python
versions and the host CPU. Later processes add the object files to an llvmlite MCJIT engine (a
few hundredths of a second) and call the entry points through ctypes, which releases the GIL.

NOTE [ native kernels do not allocate ]
Without numba loaded, numba's runtime (its allocator, its exception helpers) does not exist in the
process. A kernel therefore must not allocate: every array it uses is handed in by the caller
(``carray`` views of the pointers, and slices of them, carry no reference count), and it must not
raise. :func:`load` refuses an object whose IR calls any numba runtime function other than those on
the error and release paths of a ``cfunc`` wrapper (:data:`_RUNTIME_ON_ERROR_PATHS`); those are
bound, when numba is absent, to a trap that stops the process with a message: reaching one means a
kernel raised, which a kernel written to these rules does not.

``python -m memplan.native`` builds every kernel of :data:`KERNELS` now (``make`` runs it), so
that no command pays a build. ``MEMPLAN_NATIVE=0`` turns the native kernels off (:func:`load` raises
:class:`NativeUnavailable`); the callers then use their numpy code. The cache directory is
``$MEMPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/memplan``, else ``~/.cache/memplan`` (else, if
that cannot be written, ``memplan-cache-UID`` in the temporary directory).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1
"""Version of the cache layout and of the build recipe (part of the key)."""

_RUNTIME_ON_ERROR_PATHS = frozenset(
    {
        "NRT_MemInfo_call_dtor",  # the release of an array's last reference (none: carray views)
        "NRT_Free",
        "numba_gil_ensure",  # a cfunc reporting an exception
        "numba_gil_release",
        "numba_unpickle",
        "numba_runtime_build_excinfo_struct",
        "numba_do_raise",
    }
)
"""numba runtime functions a ``cfunc`` wrapper references on its error and release paths only."""

_NAME = re.compile(r'@"?([A-Za-z_.$][\w.$]*)"?')


class NativeUnavailable(RuntimeError):
    """A native kernel cannot be used here (the message says why); callers fall back to numpy."""


@dataclass(frozen=True)
class Prototype:
    """The C signature of an entry point, as ctypes types."""

    restype: Any
    argtypes: tuple[Any, ...]


KERNELS = {
    "alloc's search": "memplan.alloc.compiled",
    "rotor's grid DP": "memplan.algorithms.chain.rotor_native",
}
"""Every native kernel of memplan: what it is, and the module whose ``load()`` builds it (``None``
when unavailable, with ``load_error()`` saying why)."""

_LOCK = threading.Lock()
_LOADED: dict[str, dict[str, Callable[..., Any]]] = {}
_KEEP: list[Any] = []
"""Engines and trap callbacks: the machine code lives as long as they do (the process)."""


def disabled() -> bool:
    """Whether ``MEMPLAN_NATIVE=0`` (or ``false``, ``no``, ``off``) turns native kernels off."""
    return os.environ.get("MEMPLAN_NATIVE", "").strip().lower() in {"0", "false", "no", "off"}


def cache_root() -> Path:
    """Where compiled objects are kept (see the module docstring); when the user's cache
    directory cannot be created or written (a read-only home on a CI machine), a directory of
    this user's under the system's temporary directory, so that one build still serves every
    later process."""
    explicit = os.environ.get("MEMPLAN_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    try:
        home = Path(xdg) if xdg else Path.home() / ".cache"
        root = home / "memplan"
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except (OSError, RuntimeError):  # RuntimeError: Path.home() without a home
        pass
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"memplan-cache-{uid}"


def load(
    module: str, entries: Mapping[str, Prototype], sources: Sequence[str] = ()
) -> dict[str, Callable[..., Any]]:
    """The entry points of kernel ``module`` as ctypes functions, built on first use.

    Parameters
    ----------
    module : str
        Importable name of the module that defines each entry of ``entries`` as a numba
        ``cfunc``; imported only when its object code is not cached yet.
    entries : mapping of str to Prototype
        Entry name (an attribute of ``module``) to its C signature.
    sources : sequence of str
        Other modules whose code the cfuncs compile in (the ``@njit`` kernels they call): their
        sources are part of the cache key, so an edit rebuilds.

    Raises
    ------
    NativeUnavailable
        ``MEMPLAN_NATIVE=0``, llvmlite or numba missing (numba only to build), a kernel breaking
        NOTE [ native kernels do not allocate ], or a failed build or load.
    """
    if disabled():
        raise NativeUnavailable("native kernels are turned off (MEMPLAN_NATIVE=0)")
    with _LOCK:
        found = _LOADED.get(module)
        if found is None:
            try:
                found = _load(module, entries, sources)
            except NativeUnavailable:
                raise
            except Exception as exc:  # llvmlite or numba refusing: the caller uses numpy
                raise NativeUnavailable(f"{module}: {type(exc).__name__}: {exc}") from exc
            _LOADED[module] = found
        return found


def _binding() -> Any:
    try:
        import llvmlite.binding as ll
    except ImportError as exc:
        raise NativeUnavailable("llvmlite is not installed (pip install memplan[fast])") from exc
    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    return ll


def _target_machine(ll: Any) -> Any:
    """The same machine settings to build and to load: this host's CPU, JIT code model."""
    target = ll.Target.from_triple(ll.get_process_triple())
    return target.create_target_machine(
        cpu=ll.get_host_cpu_name(),
        features=ll.get_host_cpu_features().flatten(),
        opt=3,
        reloc="default",
        codemodel="jitdefault",
    )


def _source_file(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise NativeUnavailable(f"kernel module {name} not found")
    return Path(spec.origin)


def _key(ll: Any, module: str, entries: Mapping[str, Prototype], sources: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for part in (
        f"format {FORMAT}",
        module,
        repr(sorted((name, repr(p)) for name, p in entries.items())),
        getattr(sys.modules.get("llvmlite"), "__version__", "?"),
        sys.version,
        platform.machine(),
        ll.get_process_triple(),
        ll.get_host_cpu_name(),
        ll.get_host_cpu_features().flatten(),
    ):
        digest.update(part.encode() + b"\0")
    for name in (module, *sources):
        digest.update(name.encode() + b"\0" + _source_file(name).read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def _load(
    module: str, entries: Mapping[str, Prototype], sources: Sequence[str]
) -> dict[str, Callable[..., Any]]:
    ll = _binding()
    tm = _target_machine(ll)
    directory = cache_root() / "native" / f"{module}-{_key(ll, module, entries, sources)}"
    manifest = _read_manifest(directory, entries)
    if manifest is None:
        manifest = _build(ll, tm, module, entries, directory)
    return _link(ll, tm, module, entries, manifest)


def _read_manifest(directory: Path, entries: Mapping[str, Prototype]) -> dict[str, Any] | None:
    """The cached build in ``directory``, its object files read and checked; None if absent or
    damaged (then it is rebuilt)."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
        for name in entries:
            item = manifest["entries"][name]
            data = (directory / f"{name}.o").read_bytes()
            if hashlib.sha256(data).hexdigest() != item["sha256"]:
                return None
            item["object"] = data
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _build(
    ll: Any, tm: Any, module: str, entries: Mapping[str, Prototype], directory: Path
) -> dict[str, Any]:
    """Compile every entry of ``module`` (this imports numba) and store the objects, atomically;
    returns the manifest with the objects (stored or not: an unwritable cache only costs the build
    in every process)."""
    if importlib.util.find_spec("numba") is None:
        raise NativeUnavailable("numba is not installed (pip install memplan[fast])")
    sys.stderr.write(
        f"memplan: compiling the native kernel {module} for this machine, once (10-20 s; "
        "`python -m memplan.native` does it ahead of time)\n"
    )
    kernels = importlib.import_module(module)
    manifest: dict[str, Any] = {"format": FORMAT, "module": module, "entries": {}}
    for name in entries:
        cfunc = getattr(kernels, name, None)
        if cfunc is None or not hasattr(cfunc, "inspect_llvm"):
            raise NativeUnavailable(f"{module}.{name} is not a numba cfunc")
        ir = cfunc.inspect_llvm()
        llvm_module = ll.parse_assembly(ir)
        llvm_module.verify()
        undefined = sorted(
            {f.name for f in llvm_module.functions if f.is_declaration}
            | {g.name for g in llvm_module.global_variables if g.is_declaration}
        )
        _check_runtime_calls(module, name, ir, undefined)
        data = tm.emit_object(llvm_module)
        manifest["entries"][name] = {
            "symbol": cfunc.native_name,
            "undefined": [u for u in undefined if not u.startswith("llvm.")],
            "sha256": hashlib.sha256(data).hexdigest(),
            "object": data,
        }
    _store(directory, manifest)
    return manifest


def _check_runtime_calls(module: str, name: str, ir: str, undefined: list[str]) -> None:
    """NOTE [ native kernels do not allocate ]: refuse IR using numba's runtime beyond the cfunc
    wrapper's error and release paths."""
    runtime = {u for u in undefined if u.startswith(("NRT_", "numba_"))}
    if not runtime - _RUNTIME_ON_ERROR_PATHS:
        return
    used: set[str] = set()
    for line in ir.splitlines():
        if not line.startswith("declare"):
            used.update(m.group(1) for m in _NAME.finditer(line))
    forbidden = sorted((runtime - _RUNTIME_ON_ERROR_PATHS) & used)
    if forbidden:
        raise NativeUnavailable(
            f"{module}.{name} calls numba's runtime ({', '.join(forbidden)}): a native kernel "
            "must not allocate (NOTE [ native kernels do not allocate ] in memplan/native.py)"
        )


def _store(directory: Path, manifest: dict[str, Any]) -> None:
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=directory.parent))
    except OSError:
        return
    try:
        for name, item in manifest["entries"].items():
            (staging / f"{name}.o").write_bytes(item["object"])
        on_disk = {
            **manifest,
            "entries": {
                name: {k: v for k, v in item.items() if k != "object"}
                for name, item in manifest["entries"].items()
            },
        }
        (staging / "manifest.json").write_text(json.dumps(on_disk, indent=1))
        if directory.exists():  # damaged: replace it
            shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)
    except OSError:  # another process stored it first, or the cache is read-only
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _trap(symbol: str, module: str) -> int:
    """The address of a function that stops the process: bound to the functions of numba's
    runtime (and Python's C API, where the interpreter does not export it) that a cfunc wrapper
    references on its error paths and the process lacks; see the module docstring."""

    def stop() -> None:
        sys.stderr.write(
            f"memplan: the native kernel {module} reached {symbol}, an error path of numba's "
            "runtime (a bug: please report it; MEMPLAN_NATIVE=0 runs without native kernels)\n"
        )
        sys.stderr.flush()
        os.abort()

    callback = ctypes.CFUNCTYPE(None)(stop)
    _KEEP.append(callback)
    return ctypes.cast(callback, ctypes.c_void_p).value or 0


def _python_api(symbol: str) -> int | None:
    """The address of a function or variable of Python's C API, None if the interpreter has no
    such symbol."""
    if not symbol.startswith(("Py", "_Py")):
        return None
    try:
        return ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, symbol))
    except ValueError:
        return None


def _link(
    ll: Any, tm: Any, module: str, entries: Mapping[str, Prototype], manifest: dict[str, Any]
) -> dict[str, Callable[..., Any]]:
    functions: dict[str, Callable[..., Any]] = {}
    for name, prototype in entries.items():
        item = manifest["entries"][name]
        # One engine per entry: each cfunc carries its own copy of the functions it calls.
        # Created before the symbols are looked up: creating the first engine makes the process's
        # own symbols visible to LLVM. The symbols stay bound process-wide, numba's own code
        # compiled later in the process included, so Python's C API must never get the trap:
        # where LLVM does not see it (a shared libpython), the interpreter's own address is used.
        engine = ll.create_mcjit_compiler(ll.parse_assembly(""), tm)
        for symbol in item["undefined"]:
            if not ll.address_of_symbol(symbol):
                if not symbol.startswith(("NRT_", "numba_", "Py", "_Py")):
                    raise NativeUnavailable(f"{module}.{name} needs {symbol}, absent here")
                ll.add_symbol(symbol, _python_api(symbol) or _trap(symbol, module))
        engine.add_object_file(ll.ObjectFileRef.from_data(item["object"]))
        engine.finalize_object()
        address = engine.get_function_address(item["symbol"])
        if not address:
            raise NativeUnavailable(f"{module}.{name}: symbol {item['symbol']} not in its object")
        _KEEP.append(engine)
        functions[name] = ctypes.CFUNCTYPE(prototype.restype, *prototype.argtypes)(address)
    return functions


def prebuild() -> int:
    """Build (or load) every kernel of :data:`KERNELS`, one line each; 1 if any is unavailable."""
    import time

    failed = 0
    for what, name in KERNELS.items():
        started = time.perf_counter()
        kernel = importlib.import_module(name)
        if kernel.load() is None:
            print(f"memplan: {what} has no native kernel here: {kernel.load_error()}")
            failed = 1
        else:
            print(f"memplan: {what}: native kernel ready ({time.perf_counter() - started:.1f} s)")
    return failed


if __name__ == "__main__":  # python -m memplan.native
    sys.exit(prebuild())
