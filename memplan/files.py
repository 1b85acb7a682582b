"""Writing output files safely: atomically, through symlinks, never over what must not be replaced.

NOTE [ safe writes ]
Every file memplan writes (``-o``, ``--trace``, ``--plot``, ``plot -o``, ``save_profile``) goes
through :func:`write_atomic`:

1. **Atomic.** The bytes go to a temporary file in the target's directory, are flushed to disk,
   and the temporary file is renamed over the target: an interrupted run (Ctrl-C, SIGTERM, a full
   disk) never leaves a truncated file, and nothing is left behind. The temporary file is created
   with the stop signals held (:func:`memplan.interrupt.deferred`), so that its name is known
   before any interrupt can be raised and it is always removed.
   The command line goes further (:func:`hold_writes`): a command's files are renamed into place
   together when it ends, so that an interrupt or an error at any point before leaves every
   target as it was (exit 0 or 1: all written; any other exit: none; NOTE [ interrupts ]).
2. **Symlinks are written through.** A link to a file keeps being a link: the file it points to
   is replaced (a dangling link creates its target).
3. **A replaced file keeps its permissions** (a 0600 file stays 0600) and, where the system
   allows it, its owner and group. A new file gets the umask's mode (0644 under umask 022).
4. **What must not be replaced is refused** (:class:`~memplan.errors.InputError`, exit 2): a file
   the user may not write (renaming over it only needs the directory's permission: another user's
   file in a world-writable directory is refused here), a file with no write permission bit at
   all (even for root), a directory. A device or a FIFO (``-o /dev/null``) is written to
   directly, as a shell redirection would: renaming a regular file over it would replace it.
5. **Inputs are not outputs.** The command line notes every file a command reads
   (:func:`track_inputs`, :func:`note_input`); writing over one of them
   (``memplan solve prof.yaml ... -o prof.yaml``) is refused. The library does not track: a
   notebook may save a profile where it loaded it from.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from memplan import interrupt
from memplan.errors import InputError

_inputs: dict[tuple[int, int], str] | None = None
"""(device, inode) -> name of the files read by this command; None: not tracking (library)."""
_held: list[tuple[str, Path, str]] | None = None
"""(temporary, target, name as given) of the files written and not yet renamed, while a command
holds its writes; None: each write renames at once (library)."""


def track_inputs() -> None:
    """Start noting the files read (the CLI calls it once per command)."""
    global _inputs
    _inputs = {}


def stop_tracking() -> None:
    """Stop noting the files read (the end of a command)."""
    global _inputs
    _inputs = None


def note_input(path: str | os.PathLike[str]) -> None:
    """Remember that ``path`` was read, when tracking (a no-op for library calls)."""
    if _inputs is None:
        return
    with contextlib.suppress(OSError):
        info = os.stat(path)
        _inputs.setdefault((info.st_dev, info.st_ino), str(path))


def hold_writes() -> None:
    """From now on, :func:`write_atomic` leaves its temporary file for :func:`commit_writes` or
    :func:`discard_writes` (a command starts).
    """
    global _held
    _held = []


def commit_writes() -> None:
    """Rename every held temporary file over its target, in the order written, signals held; stop
    holding. An error renaming one removes the temporary files not renamed yet and is raised.
    """
    global _held
    held, _held = _held or [], None
    with interrupt.deferred():
        for index, (tmp, target, _name) in enumerate(held):
            try:
                os.replace(tmp, target)
            except BaseException:
                for rest, _target, _rest_name in held[index:]:
                    Path(rest).unlink(missing_ok=True)
                raise


def discard_writes() -> list[str]:
    """Remove every held temporary file, stop holding; the names of the files not written."""
    global _held
    held, _held = _held or [], None
    with interrupt.deferred():
        for tmp, _target, _name in held:
            Path(tmp).unlink(missing_ok=True)
    return list(dict.fromkeys(name for _tmp, _target, name in held))


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` as NOTE [ safe writes ] says; while the command
    line holds writes (:func:`hold_writes`), the rename waits for :func:`commit_writes`.

    Raises
    ------
    InputError
        The target must not be replaced (read-only, not the user's to write, a directory, an
        input of this command).
    OSError
        The write itself failed (no such directory, disk full, ...).
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    target = Path(os.path.realpath(path))  # through symlinks: the link stays a link
    try:
        info = target.stat()
    except FileNotFoundError:
        info = None
    if info is not None:
        _check_replaceable(path, target, info)
        if not stat.S_ISREG(info.st_mode):  # a device or a FIFO: write into it
            with open(target, "wb") as handle:
                handle.write(payload)
            return
    tmp = None
    try:
        with interrupt.deferred():  # no interrupt between creating the file and knowing its name
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            handle = os.fdopen(fd, "wb")
        with handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if info is None:
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; give it a normal file's
        else:
            os.chmod(tmp, stat.S_IMODE(info.st_mode))
            with contextlib.suppress(OSError):  # allowed to root, or to change the group only
                os.chown(tmp, info.st_uid, info.st_gid)
        if _held is None:
            os.replace(tmp, target)
        else:
            _held.append((tmp, target, str(path)))
    except BaseException:
        if tmp is not None:
            with interrupt.deferred():
                Path(tmp).unlink(missing_ok=True)
        raise


def _check_replaceable(path: str | os.PathLike[str], target: Path, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{path}: is a directory, expected a file name")
    if _inputs is not None and (info.st_dev, info.st_ino) in _inputs:
        read = _inputs[(info.st_dev, info.st_ino)]
        also = "" if read == str(path) else f" (read as {read})"
        raise InputError(
            f"{path}: is an input of this command{also}; write the output to another file"
        )
    if not stat.S_ISREG(info.st_mode):
        return
    if not info.st_mode & 0o222:
        raise InputError(f"{path}: cannot write: the file is read-only (left as it is)")
    if not os.access(target, os.W_OK):
        raise InputError(f"{path}: cannot write: permission denied (left as it is)")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
