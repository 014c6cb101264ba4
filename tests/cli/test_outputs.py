"""aiayn.cli.outputs: the checks before any work (existing outputs, --force, writability) and the
atomic writes (a failure — a full disk simulated — leaves the old output whole and no temporary
behind; new files get the umask's mode), and ``aiayn experiment`` using them."""

from __future__ import annotations

import errno
import os
import secrets
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiayn.cli import outputs
from aiayn.cli.main import describe_os_error, main, one_line
from aiayn.errors import UserError

NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*"))


def _full_disk(*args: Any) -> None:
    raise NO_SPACE


# -- atomic_file / write_text ------------------------------------------------------------------


def test_write_text_creates_with_the_umask_and_replaces_keeping_the_mode(
    tmp_path: Path, umask_027: None
) -> None:
    new = outputs.write_text(tmp_path / "a" / "b.txt", "héllo\n")
    assert new.read_bytes() == "héllo\n".encode()
    assert new.stat().st_mode & 0o777 == 0o640  # 0o666 & ~0o027, not mkstemp's 0o600
    new.chmod(0o604)
    outputs.write_text(new, "second\n")
    assert new.read_text() == "second\n" and new.stat().st_mode & 0o777 == 0o604
    assert _hidden(tmp_path) == []


def test_a_full_disk_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    monkeypatch.setattr("aiayn.cli.outputs.os.fsync", _full_disk)  # as a delayed ENOSPC does
    with pytest.raises(UserError, match=f"^cannot write {target}: No space left on device$"):
        outputs.write_text(target, "new\n" * 1000)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_failure_in_the_writer_is_not_disguised_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "new" / "deeper" / "x.npy"
    with pytest.raises(RuntimeError, match="boom"), outputs.atomic_file(target, "wb") as handle:
        handle.write(b"half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []  # the folders made for it are gone too


def test_a_read_error_inside_the_block_keeps_its_own_path(tmp_path: Path) -> None:
    missing = tmp_path / "input.txt"
    with pytest.raises(FileNotFoundError) as info, outputs.atomic_file(tmp_path / "o.txt"):
        missing.read_text()
    assert info.value.filename == str(missing)
    assert list(tmp_path.iterdir()) == []


# -- staged_files / staged_tree ------------------------------------------------------------------


def test_staged_files_appear_together_and_leave_other_files(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    (tmp_path / "a.png").write_text("old")
    with outputs.staged_files(tmp_path) as stage:
        (stage / "a.png").write_text("new")
        (stage / "b.html").write_text("page")
        assert not (tmp_path / "b.html").exists()
    assert (tmp_path / "a.png").read_text() == "new" and (tmp_path / "b.html").is_file()
    assert (tmp_path / "keep.txt").read_text() == "mine" and _hidden(tmp_path) == []


def test_staged_files_on_a_full_disk_change_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_text("old")
    with pytest.raises(UserError, match=f"cannot write {tmp_path}: No space left"):  # noqa: SIM117
        with outputs.staged_files(tmp_path) as stage:
            (stage / "a.png").write_text("new")
            raise OSError(errno.ENOSPC, "No space left on device", str(stage / "b.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]
    assert (tmp_path / "a.png").read_text() == "old"
    fresh = tmp_path / "made" / "for" / "it"
    with pytest.raises(UserError), outputs.staged_files(fresh):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert not (tmp_path / "made").exists()


def test_staged_tree_replaces_a_folder_only_when_complete(tmp_path: Path) -> None:
    old = tmp_path / "ckpt"
    old.mkdir()
    (old / "state.json").write_text("old")
    with pytest.raises(UserError, match="No space left"), outputs.staged_tree(old) as new:
        new.mkdir()
        (new / "state.json").write_text("half")
        raise NO_SPACE
    assert (old / "state.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    with outputs.staged_tree(old) as new:
        new.mkdir()
        (new / "state.json").write_text("new")
        assert (old / "state.json").read_text() == "old"
    assert sorted(p.name for p in old.iterdir()) == ["state.json"]
    assert (old / "state.json").read_text() == "new" and _hidden(tmp_path) == []


def _dead_pid() -> int:
    """The pid of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def _stage(parent: Path, name: str, pid: int, host: str | None = None) -> Path:
    """A staging folder as :func:`outputs.make_stage` names them, holding a half-written
    ``name``."""
    stage = parent / f".{name}.{pid}-{host or outputs._host()}-{secrets.token_hex(4)}.tmp"
    (stage / name).mkdir(parents=True)
    (stage / name / "model.bin").write_bytes(b"half")
    return stage


_STAGED_WRITE = """
import sys, time
from pathlib import Path
from aiayn.cli.outputs import staged_tree
with staged_tree(Path(sys.argv[1])) as new:
    new.mkdir()
    (new / "model.bin").write_bytes(b"half")
    print("writing", flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_stage_left_by_kill_9_goes_with_the_next_write_beside_it(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _STAGED_WRITE, str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "writing\n"
    child.kill()  # SIGKILL: no clean-up runs
    child.wait()
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(f".out.{child.pid}-") and (left / "out" / "model.bin").is_file()
    with outputs.staged_tree(tmp_path / "again") as new:
        new.mkdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]


def test_the_sweep_takes_only_stale_stages_named_as_aiayn_names_them(tmp_path: Path) -> None:
    gone = [_stage(tmp_path, "out", _dead_pid()), _stage(tmp_path, "ckpt", _dead_pid())]
    host = "000000" if outputs._host() != "000000" else "111111"  # another machine
    week_old = _stage(tmp_path, "out", _dead_pid(), host)
    os.utime(week_old, (time.time() - 7 * 86400,) * 2)
    kept = [_stage(tmp_path, "out", os.getppid()), _stage(tmp_path, "out", os.getpid())]
    kept.append(_stage(tmp_path, "out", _dead_pid(), host))  # its process cannot be probed
    for name in (".out.abcdefgh.tmp", ".out.1-abc.tmp", "out.1-abcdef-01234567.tmp"):
        (tmp_path / name).mkdir()  # not aiayn's name for a stage
        kept.append(tmp_path / name)
    file_named_so = tmp_path / f".out.{_dead_pid()}-{outputs._host()}-0123abcd.tmp"
    file_named_so.write_text("a file")
    link_named_so = tmp_path / f".out.{_dead_pid()}-{outputs._host()}-4567abcd.tmp"
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "keep").write_text("x")
    link_named_so.symlink_to(tmp_path / "target", target_is_directory=True)
    kept += [file_named_so, link_named_so, tmp_path / "target"]
    with outputs.staged_tree(tmp_path / "out") as new:
        new.mkdir()
        (new / "model.bin").write_bytes(b"whole")
    assert sorted(tmp_path.iterdir()) == sorted([*kept, tmp_path / "out"])
    assert not any(p.exists() for p in [*gone, week_old])
    assert (tmp_path / "target" / "keep").read_text() == "x"
    assert (tmp_path / "out" / "model.bin").read_bytes() == b"whole"


def test_staged_files_sweep_their_own_stale_stages_in_the_folder(tmp_path: Path) -> None:
    gone = _stage(tmp_path, "aiayn", _dead_pid())
    (tmp_path / "keep.png").write_text("mine")
    with outputs.staged_files(tmp_path) as stage:
        (stage / "a.png").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "keep.png"]
    assert not gone.exists()


# -- the checks ----------------------------------------------------------------------------------


def test_check_file(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    assert outputs.check_file(tmp_path / "new" / "g.txt", force=False, flag="-o")
    assert outputs.check_file(tmp_path / "f.txt", force=True, flag="-o")
    with pytest.raises(UserError, match=r"f\.txt exists: pass --force to replace it$"):
        outputs.check_file(tmp_path / "f.txt", force=False, flag="-o")
    with pytest.raises(UserError, match="is a folder: give a file name"):
        outputs.check_file(tmp_path, force=True, flag="-o")
    with pytest.raises(UserError, match=r"f\.txt is not a folder"):
        outputs.check_file(tmp_path / "f.txt" / "g.txt", force=True, flag="-o")
    assert list(tmp_path.iterdir()) == [tmp_path / "f.txt"]  # checking writes nothing


def test_a_read_only_folder_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aiayn.cli.outputs.os.access", lambda *args, **kwargs: False)
    with pytest.raises(UserError, match=f"-o {tmp_path}/a/b.txt: cannot write in {tmp_path} "):
        outputs.check_file(tmp_path / "a" / "b.txt", force=False, flag="-o")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes regardless of permissions")
def test_a_read_only_folder_for_real(tmp_path: Path) -> None:
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(UserError, match=r"cannot write in .* \(permission denied\)"):
            outputs.check_folder(tmp_path / "maps", force=False, flag="--out")
    finally:
        tmp_path.chmod(0o755)


def test_check_folder_refuses_only_the_files_it_would_write(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    kwargs: dict[str, Any] = {"flag": "--out", "names": ["a.html"], "patterns": ["x_*.png"]}
    assert outputs.check_folder(tmp_path, force=False, **kwargs) == tmp_path
    (tmp_path / "x_1.png").write_text("")
    with pytest.raises(UserError, match=r"already holds x_1\.png: pass --force"):
        outputs.check_folder(tmp_path, force=False, **kwargs)
    assert outputs.check_folder(tmp_path, force=True, **kwargs) == tmp_path
    (tmp_path / "a.html").mkdir()
    with pytest.raises(UserError, match="is a folder where a file goes"):
        outputs.check_folder(tmp_path, force=True, **kwargs)
    with pytest.raises(UserError, match="exists and is not a folder"):
        outputs.check_folder(tmp_path / "notes.txt", force=True, **kwargs)


def test_force_replaces_a_checkpoint_or_an_empty_folder_never_another(tmp_path: Path) -> None:
    def check(path: Path, force: bool = True) -> Path:
        return outputs.check_checkpoint_out(path, force=force, flag="--out")

    ckpt, empty, other = tmp_path / "ckpt", tmp_path / "empty", tmp_path / "home"
    for folder in (ckpt, empty, other):
        folder.mkdir()
    (ckpt / "state.json").write_text("{}")
    (other / "thesis.tex").write_text("years of work")
    assert check(ckpt) == ckpt and check(empty) == empty and check(tmp_path / "new", False)
    with pytest.raises(UserError, match="is a folder that is not an aiayn checkpoint"):
        check(other)
    with pytest.raises(UserError, match="is a file, not an aiayn checkpoint"):
        check(other / "thesis.tex")
    with pytest.raises(UserError, match=r"ckpt exists: pass --force"):
        check(ckpt, force=False)
    run = tmp_path / "run" / "checkpoints"
    for name in ("step_00000100", "best", "averaged"):
        with pytest.raises(UserError, match="training gives its own checkpoints"):
            check(run / name, force=False)
        assert check(run / name) == run / name
    assert check(run / "mine", force=False) == run / "mine"


# -- the main entry's messages -------------------------------------------------------------------


def test_messages_of_the_main_entry() -> None:
    assert one_line("a\n  b:\n   ^\n\nc") == "a b: c"
    assert describe_os_error(PermissionError(errno.EACCES, "Permission denied", "x")) == (
        "x: Permission denied"
    )
    rename = OSError(errno.EXDEV, "Invalid cross-device link", "a", None, "b")
    assert describe_os_error(rename) == "a -> b: Invalid cross-device link"
    assert describe_os_error(OSError(errno.EROFS, "Read-only file system")) == (
        "Read-only file system"
    )
    assert describe_os_error(OSError(errno.EBADF, "Bad file descriptor")) is None


# -- aiayn experiment ----------------------------------------------------------------------------


def test_experiment_refuses_its_own_files_without_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["experiment", "positional", "--quick", "--out", str(tmp_path)]
    (tmp_path / "positional.csv").write_text("mine")
    (tmp_path / "scaling.md").write_text("another experiment's")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"aiayn experiment: error: --out {tmp_path} already holds positional.csv: pass --force "
        "to replace them, or choose another folder\n"
    )
    assert (tmp_path / "positional.csv").read_text() == "mine"
    monkeypatch.setattr("aiayn.cli.outputs.os.replace", _full_disk)
    assert main([*argv, "--force"]) == 2
    assert capsys.readouterr().err == (
        f"aiayn experiment: error: cannot write {tmp_path}: No space left on device\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["positional.csv", "scaling.md"]
    monkeypatch.undo()
    assert main([*argv, "--force"]) == 0
    assert f"plot: {tmp_path / 'positional.png'}" in capsys.readouterr().out
    assert (tmp_path / "positional.csv").read_text().startswith("distance,")
    assert (tmp_path / "scaling.md").read_text() == "another experiment's"
    assert _hidden(tmp_path) == []


# -- special files and links: written through, or refused; never replaced ------------------------


def test_a_link_to_a_regular_file_replaces_that_file_and_stays_a_link(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text("old\n")
    (tmp_path / "link.txt").symlink_to("real.txt")
    with pytest.raises(UserError, match=r"link\.txt exists: pass --force"):
        outputs.check_file(tmp_path / "link.txt", force=False, flag="-o")
    outputs.check_file(tmp_path / "link.txt", force=True, flag="-o")
    outputs.write_text(tmp_path / "link.txt", "new\n")
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "new\n"
    assert _hidden(tmp_path) == []


def test_a_fifo_is_written_through_without_force(tmp_path: Path) -> None:
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert outputs.write_target(fifo).kind == "stream"
    outputs.check_file(fifo, force=False, flag="-o")  # nothing stored is replaced
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    outputs.write_text(fifo, "through\n")
    reader.join(timeout=10)
    assert received == [b"through\n"] and fifo.is_fifo() and _hidden(tmp_path) == []


def test_the_process_own_descriptors_are_written_to_not_replaced(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    try:
        link = tmp_path / "out"
        link.symlink_to(f"/proc/self/fd/{write_end}")
        for path in (link, Path(f"/dev/fd/{write_end}")):
            target = outputs.write_target(path)
            assert (target.kind, target.fd) == ("descriptor", write_end)
            outputs.write_text(path, "to the pipe\n")
            assert os.read(read_end, 100) == b"to the pipe\n"
        assert link.is_symlink() and os.fstat(write_end)  # the descriptor stays open
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full")
def test_a_full_device_is_one_error_and_stays_a_device(tmp_path: Path) -> None:
    full = tmp_path / "full"  # a node like /dev/full (as root), else a link to it: never /dev/full
    try:
        os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        full.symlink_to("/dev/full")
    assert outputs.write_target(full).kind == "stream"
    with (
        pytest.raises(UserError, match=rf"^cannot write {full}: "),
        outputs.atomic_file(full, "wb") as handle,
    ):
        handle.write(b"x" * 10000)
    assert full.is_symlink() or full.is_char_device()
    assert _hidden(tmp_path) == []


def test_what_is_not_written_through_is_refused(tmp_path: Path) -> None:
    import socket

    (tmp_path / "dangling").symlink_to("nowhere")
    with pytest.raises(UserError, match=r"-o .*dangling is a symbolic link to nothing"):
        outputs.check_file(tmp_path / "dangling", force=True, flag="-o")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
    with pytest.raises(UserError, match=r"sock is a socket: aiayn writes regular files"):
        outputs.check_file(tmp_path / "sock", force=True, flag="-o")
    with pytest.raises(UserError, match=r"sock is a socket"):
        outputs.write_text(tmp_path / "sock", "x")
    assert (tmp_path / "dangling").is_symlink() and (tmp_path / "sock").is_socket()


def test_force_never_replaces_a_link_among_a_folders_files_or_for_a_whole_folder(
    tmp_path: Path,
) -> None:
    maps = tmp_path / "maps"
    maps.mkdir()
    (tmp_path / "mine.txt").write_text("mine")
    (maps / "a.html").symlink_to("../mine.txt")
    with pytest.raises(UserError, match=r"a\.html is a symbolic link: --force replaces only"):
        outputs.check_folder(maps, force=True, flag="--out", names=["a.html"])
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "state.json").write_text("{}")
    (tmp_path / "link").symlink_to("ckpt")
    with pytest.raises(UserError, match=r"link is a symbolic link: --force replaces only"):
        outputs.check_checkpoint_out(tmp_path / "link", force=True, flag="--out")
    assert (maps / "a.html").is_symlink() and (tmp_path / "link").is_symlink()


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["average", "a", "b", "--out", ""], "--out is empty: give a folder for the checkpoint"),
        (["export", "--checkpoint", "ckpt", "--to", "ct2", ""], "OUT is empty: give the folder"),
        (["attention", "--checkpoint", ".", "--src", "hi", "--out", ""], "--out is empty"),
    ],
)
def test_an_empty_output_path_is_refused_naming_its_flag(
    argv: list[str],
    refusal: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """An empty path is not ``.``: each command refuses it in one line, exit status 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"aiayn {argv[0]}: error: {refusal}") and err.count("\n") == 1
    for check in (outputs.check_file, outputs.check_folder, outputs.check_checkpoint_out):
        with pytest.raises(UserError, match=r"^--out is empty: give "):
            check("", force=True, flag="--out")
