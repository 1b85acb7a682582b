"""``-o`` and the other outputs (issue 17 item 7): NOTE [ safe writes ] in memplan/files.py.

Symlinks are written through, a replaced file keeps its mode, what the user may not write or what
the command reads is refused (exit 2) and left as it was.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import memplan
from memplan import files
from memplan.cli.app import app
from memplan.files import write_atomic

runner = CliRunner()
SOLVE = ["solve", "resnet18", "--algo", "rotor", "--mem", "1GB"]


def _solve_to(target, *args: str):
    return runner.invoke(app, [*SOLVE, *args, "-o", str(target)])


def test_a_symlink_is_written_through(tmp_path):
    real = tmp_path / "plans" / "plan.json"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    result = _solve_to(link)
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert memplan.load_schedule(str(real)).algorithm == "rotor"
    assert sorted(p.name for p in real.parent.iterdir()) == ["plan.json"]  # no temporary left


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "plan.json"
    link.symlink_to(tmp_path / "made.json")
    assert _solve_to(link).exit_code == 0
    assert link.is_symlink() and (tmp_path / "made.json").is_file()


def test_a_replaced_file_keeps_its_mode(tmp_path):
    private = tmp_path / "plan.json"
    private.write_text("old\n")
    private.chmod(0o600)
    assert _solve_to(private).exit_code == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("{")


def test_a_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        target = tmp_path / "new.json"
        assert _solve_to(target).exit_code == 0
        assert stat.S_IMODE(target.stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_a_read_only_file_is_refused_and_left_alone(tmp_path):
    """Refused even for root: a file without any write permission bit is not replaced."""
    kept = tmp_path / "plan.json"
    kept.write_text("keep me\n")
    kept.chmod(0o444)
    result = _solve_to(kept)
    assert result.exit_code == 2
    assert (
        result.stderr.strip()
        == f"memplan: error: {kept}: cannot write: the file is read-only (left as it is)"
    )
    assert kept.read_text() == "keep me\n" and stat.S_IMODE(kept.stat().st_mode) == 0o444


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="acting as another user needs root (the read-only test covers the owner's case)",
)
def test_another_users_file_in_a_world_writable_directory_is_refused():
    """The issue's case: a rename only needs the directory's write permission, so a file owned by
    root (0644) in a world-writable directory without the sticky bit was replaced by another
    user's ``-o``. A forked child becomes that user (uid 65534, nobody) and writes."""
    with tempfile.TemporaryDirectory() as top:  # in the system's temporary directory
        os.chmod(top, 0o755)  # which nobody can search, unlike pytest's
        _refused_to_nobody(Path(top))


def _refused_to_nobody(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    theirs = shared / "plan.json"
    theirs.write_text("root's\n")
    theirs.chmod(0o644)
    report = shared / "report.txt"  # nobody may write here
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                write_atomic(theirs, "nobody's\n")
                code = 0
            except memplan.InputError as error:
                message = str(error)
                code = 2
                fd = os.open(report, os.O_WRONLY | os.O_CREAT, 0o666)
                os.write(fd, message.encode())
                os.close(fd)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 2
    assert report.read_text() == f"{theirs}: cannot write: permission denied (left as it is)"
    assert theirs.read_text() == "root's\n" and theirs.stat().st_uid == 0


@pytest.mark.parametrize("through_link", [False, True])
def test_an_input_is_not_overwritten(tmp_path, through_link):
    prof = tmp_path / "prof.yaml"
    shutil.copy(memplan.profile.bundled_profiles()["resnet18"], prof)
    before = prof.read_bytes()
    source = prof
    if through_link:
        source = tmp_path / "link.yaml"
        source.symlink_to(prof)
    result = runner.invoke(
        app, ["solve", str(source), "-a", "rotor", "-m", "1GB", "-f", "yaml", "-o", str(prof)]
    )
    assert result.exit_code == 2
    assert f"{prof}: is an input of this command" in result.stderr
    assert prof.read_bytes() == before


def test_the_buffer_csv_of_alloc_is_not_overwritten(tmp_path):
    csv = tmp_path / "buffers.csv"
    csv.write_text("id,lower,upper,size\na,0,2,4\n")
    result = runner.invoke(app, ["alloc", str(csv), "-o", str(csv)])
    assert result.exit_code == 2 and "is an input of this command" in result.stderr
    assert csv.read_text() == "id,lower,upper,size\na,0,2,4\n"


def test_a_directory_is_refused(tmp_path):
    target = tmp_path / "out.json"
    target.mkdir()
    result = _solve_to(target)
    assert result.exit_code == 2 and "is a directory" in result.stderr


def test_a_character_device_is_written_into_not_replaced():
    null = "/dev/null"
    if not os.path.exists(null) or not stat.S_ISCHR(os.stat(null).st_mode):
        pytest.skip("no /dev/null character device here")
    result = runner.invoke(app, [*SOLVE, "-f", "json", "-o", null])
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISCHR(os.stat(null).st_mode)


def test_the_library_may_save_where_it_loaded(tmp_path):
    """Only the command line tracks inputs: a notebook may load a file and save it back."""
    path = tmp_path / "prof.yaml"
    shutil.copy(memplan.profile.bundled_profiles()["resnet18"], path)
    prof = memplan.load_profile(str(path))
    memplan.profile.save_profile(prof, path)
    assert memplan.load_profile(str(path)) == prof


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("old\n")

    def boom(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_an_interrupt_while_the_temporary_file_is_made_leaves_nothing(tmp_path, monkeypatch):
    """The window of a Ctrl-C that arrives after mkstemp created the file and before its name is
    returned: the signal is held until the name is known (NOTE [ safe writes ])."""
    target = tmp_path / "plan.json"
    made = tempfile.mkstemp

    def make_then_interrupt(*args, **kwargs):
        result = made(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # Python raises KeyboardInterrupt at once, unless held
        return result

    monkeypatch.setattr(tempfile, "mkstemp", make_then_interrupt)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "new\n")
    assert list(tmp_path.iterdir()) == []


def test_held_writes_are_renamed_together_or_not_at_all(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    second.write_text("old\n")
    files.hold_writes()
    try:
        write_atomic(first, "1\n")
        write_atomic(second, "2\n")
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
            "b.json"
        ]
        assert second.read_text() == "old\n"
    finally:
        files.commit_writes()
    assert first.read_text() == "1\n" and second.read_text() == "2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]

    files.hold_writes()
    try:
        write_atomic(first, "3\n")
        write_atomic(second, "4\n")
    finally:
        assert files.discard_writes() == [str(first), str(second)]
    assert first.read_text() == "1\n" and second.read_text() == "2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]
    write_atomic(first, "5\n")  # no longer held: renamed at once
    assert first.read_text() == "5\n"


def test_a_failed_command_writes_none_of_its_files(tmp_path):
    """``--trace`` is written first, then ``-o`` is refused: neither is written (exit 2)."""
    readonly = tmp_path / "plan.json"
    readonly.write_text("old\n")
    readonly.chmod(0o444)
    trace = tmp_path / "trace.json"
    result = _solve_to(readonly, "--trace", str(trace))
    assert result.exit_code == 2, result.stderr
    assert not trace.exists() and readonly.read_text() == "old\n"
    assert f"not written, left as they were: {trace}" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
